//! `runner report RUN --html`: one self-contained file (styles, script and data inline, no
//! network needed) with the summary, per-suite and per-model tables, a chart of pass rates
//! with intervals, a filterable episode list and each episode's trajectory.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::Path;

use serde_json::{Value, json};

use super::compare::GroupStats;
use crate::log::projection::{EpisodeRow, Index, Projection};
use crate::log::reader::{LineHeader, for_each_line_of, header_episode_id};

const TEMPLATE: &str = include_str!("report.html");
const PLACEHOLDER: &str = "/*RUN_DATA*/null";
/// The styles and the trajectory view, shared with the viewer (`runner view`), which serves
/// them as files where the report inlines them.
pub const PAGE_CSS: &str = include_str!("page.css");
pub const TRAJECTORY_JS: &str = include_str!("trajectory.js");

/// The report's page with its shared parts inlined, the data's placeholder left in it.
fn template() -> String {
    TEMPLATE.replacen("/*PAGE_CSS*/", PAGE_CSS, 1).replacen("/*TRAJECTORY_JS*/", TRAJECTORY_JS, 1)
}

/// Writes the report page for the run whose log `index` was built from. At most `max_trajectories`
/// episodes carry their whole trajectory (failed, unscored and cancelled ones first): the
/// rest are listed with their results, so a run of 100,000 episodes still gives a page a
/// browser opens. The data streams into the page; no copy of it is held as a whole.
pub fn render(index: &Index, max_trajectories: usize, out: &mut impl Write) -> Result<(), String> {
    let p = Projection::from_index(index).map_err(|e| e.to_string())?;
    let chosen = choose(&p.episodes, max_trajectories);
    let trajectories = trajectories(index.path(), &chosen)?;
    let template = template();
    let (before, after) = template.split_once(PLACEHOLDER).ok_or("the report template has no data placeholder")?;
    let written = (|| -> std::io::Result<()> {
        out.write_all(before.as_bytes())?;
        let mut data = ScriptSafe { out: &mut *out, pending: Vec::new() };
        write_data(&mut data, &p, &trajectories, chosen.len())?;
        data.finish()?;
        out.write_all(after.as_bytes())?;
        out.flush()
    })();
    written.map_err(|e| e.to_string())
}

/// Writes JSON that cannot end the script element it sits in: every `<` is escaped (in JSON
/// it only occurs inside strings), and so are the two line separators JavaScript once
/// disallowed. A character split across writes is held until it is whole.
struct ScriptSafe<W: Write> {
    out: W,
    pending: Vec<u8>,
}

impl<W: Write> ScriptSafe<W> {
    fn finish(&mut self) -> std::io::Result<()> {
        let rest = std::mem::take(&mut self.pending);
        self.out.write_all(&rest)
    }
}

impl<W: Write> Write for ScriptSafe<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut bytes = std::mem::take(&mut self.pending);
        bytes.extend_from_slice(buf);
        // U+2028 and U+2029 are E2 80 A8 and E2 80 A9: keep a tail that may be their start.
        let keep = match bytes.as_slice() {
            [.., 0xE2] => 1,
            [.., 0xE2, 0x80] => 2,
            _ => 0,
        };
        let (ready, tail) = bytes.split_at(bytes.len() - keep);
        let mut start = 0;
        let mut i = 0;
        while i < ready.len() {
            let escaped: Option<(&[u8], usize)> = match ready[i] {
                b'<' => Some((b"\\u003c", 1)),
                0xE2 if ready.get(i + 1) == Some(&0x80) && ready.get(i + 2) == Some(&0xA8) => Some((b"\\u2028", 3)),
                0xE2 if ready.get(i + 1) == Some(&0x80) && ready.get(i + 2) == Some(&0xA9) => Some((b"\\u2029", 3)),
                _ => None,
            };
            match escaped {
                Some((with, len)) => {
                    self.out.write_all(&ready[start..i])?;
                    self.out.write_all(with)?;
                    i += len;
                    start = i;
                }
                None => i += 1,
            }
        }
        self.out.write_all(&ready[start..])?;
        self.pending = tail.to_vec();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// The episodes whose trajectories go in: not passed first, then passed, in table order.
fn choose(rows: &[EpisodeRow], max: usize) -> HashSet<String> {
    let (mut first, mut then): (Vec<&EpisodeRow>, Vec<&EpisodeRow>) = rows.iter().partition(|r| r.status() != "passed");
    first.append(&mut then);
    first.into_iter().take(max).map(|r| String::from(&*r.episode_id)).collect()
}

/// The chosen episodes' events as logged, each episode's from its latest start on. Lines
/// of other episodes are skipped by their header, without being parsed.
fn trajectories(events: &Path, chosen: &HashSet<String>) -> Result<HashMap<String, Vec<String>>, String> {
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    if chosen.is_empty() {
        return Ok(out);
    }
    for_each_line_of(events, None, |kind, text, _| {
        let id = match header_episode_id(text) {
            Some(id) => id.to_owned(),
            None => match serde_json::from_str::<LineHeader>(text) {
                Ok(LineHeader { episode_id: Some(id), .. }) => id,
                _ => return Ok(()),
            },
        };
        if !chosen.contains(&id) {
            return Ok(());
        }
        let list = out.entry(id).or_default();
        if kind == "episode_started" {
            list.clear();
        }
        list.push(text.to_owned());
        Ok(())
    })
    .map_err(|e| e.to_string())?;
    Ok(out)
}

/// One episode in the page's list (the report's and the viewer's).
#[derive(serde::Serialize)]
pub struct Listed<'a> {
    episode_id: &'a str,
    suite: &'a str,
    task_id: &'a str,
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    variant: Option<&'a str>,
    epoch: u32,
    outcome: &'static str,
    unscored_cause: Option<&'a str>,
    score: Option<f64>,
    steps: u32,
    tool_calls: u32,
    tool_errors: u32,
    tokens: u64,
    /// The episode's agents' model calls, their input tokens in all and the largest call's.
    model_calls: u32,
    input_tokens: u64,
    largest_input: u64,
    cost_usd: Option<f64>,
    latency_ms: f64,
    wall_ms: f64,
    termination: &'static str,
}

impl<'a> Listed<'a> {
    pub fn of(e: &'a EpisodeRow) -> Listed<'a> {
        Listed {
            episode_id: &e.episode_id,
            suite: &e.suite,
            task_id: &e.task_id,
            model: &e.model,
            variant: e.variant.as_deref(),
            epoch: e.epoch,
            outcome: e.status(),
            unscored_cause: e.unscored_cause(),
            score: e.score(),
            steps: e.steps,
            tool_calls: e.tool_calls,
            tool_errors: e.tool_errors,
            tokens: e.usage.total(),
            model_calls: e.model_calls,
            input_tokens: e.usage.input_tokens,
            largest_input: e.largest_input,
            cost_usd: e.cost_usd,
            latency_ms: e.latency_ms,
            wall_ms: e.wall_ms,
            termination: e.termination.as_str(),
        }
    }
}

/// A group's line of the tables, as the pages show it.
pub fn stats(suite: Option<&str>, g: &GroupStats) -> Value {
    json!({
        "suite": suite, "model": if g.label.is_empty() { &g.model } else { &g.label }, "episodes": g.episodes, "scored": g.scored, "passed": g.passed,
        "failed": g.scored - g.passed, "unscored": g.unscored, "cancelled": g.cancelled, "pass_rate": g.pass_rate,
        "ci_low": g.interval.map(|i| i.0), "ci_high": g.interval.map(|i| i.1), "mean_score": g.mean_score,
        "tokens": g.tokens, "cost_usd": g.cost_usd, "latency_p50_ms": g.latency_p50_ms,
        "latency_p95_ms": g.latency_p95_ms, "mean_steps": g.mean_steps,
    })
}

/// The epochs table the terminal prints (pass@1, pass@k, pass^k per suite and model), when
/// a suite ran its tasks more than once, and the lines it prints under its tables.
fn epochs_and_notes(p: &Projection) -> (Value, Vec<String>) {
    let mut summary = super::summary::Summary::begin(p);
    p.episodes.iter().for_each(|e| summary.add(e));
    (summary.to_json()["epochs"].take(), summary.notes())
}

/// What the page shows of a run above its episodes: its facts, its warnings and the tables
/// of the terminal's summary (totals, per model, per suite and model, epochs). The viewer
/// (`runner view`) serves the same object.
pub fn head(p: &Projection) -> Value {
    let all: Vec<&EpisodeRow> = p.episodes.iter().collect();
    let mut totals = stats(None, &GroupStats::of(String::new(), p.run_id.clone(), String::new(), &all));
    totals["model"] = Value::Null;
    drop(all);
    let models: Vec<Value> = super::compare::groups(std::slice::from_ref(p))
        .iter()
        .map(|g| stats(None, &GroupStats::of(g.label.clone(), g.run_id.clone(), g.model.clone(), &g.rows)))
        .collect();
    let mut keys: Vec<(&str, &str, Option<&str>)> = Vec::new();
    for e in &p.episodes {
        let key = (&*e.suite, &*e.model, e.variant.as_deref());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let suites: Vec<Value> = keys
        .iter()
        .map(|(suite, model, variant)| {
            let rows: Vec<&EpisodeRow> = p
                .episodes
                .iter()
                .filter(|e| &*e.suite == *suite && &*e.model == *model && e.variant.as_deref() == *variant)
                .collect();
            let label = super::summary::label(model, *variant);
            stats(Some(suite), &GroupStats::of(label, p.run_id.clone(), model.to_string(), &rows))
        })
        .collect();
    let (epochs, notes) = epochs_and_notes(p);
    json!({
        "run_id": p.run_id,
        "generated_at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "runner_version": env!("CARGO_PKG_VERSION"),
        "command_line": p.header.command_line,
        "git_revision": p.header.git_revision,
        "interrupted": p.interrupted || !p.finished,
        // The run's warnings, as the terminal's summary shows them (a re-scoring's are not the run's).
        "warnings": if p.scoring_id.is_none() { p.header.warnings.clone() } else { Vec::new() },
        "scoring_id": p.scoring_id,
        "totals": totals,
        "models": models,
        "suites": suites,
        "epochs": epochs,
        // What the terminal prints under its tables (not run, unscored causes, unpriced, …).
        "notes": notes,
    })
}

/// The page's data: `{…header and tables…, "episodes": […], "trajectories": {…}}`.
fn write_data(
    out: &mut impl Write,
    p: &Projection,
    trajectories: &HashMap<String, Vec<String>>,
    chosen: usize,
) -> std::io::Result<()> {
    let mut head = head(p);
    head["omitted_trajectories"] = json!(p.episodes.len().saturating_sub(chosen));
    // The head object, left open for the two big members.
    let head = head.to_string();
    out.write_all(&head.as_bytes()[..head.len() - 1])?;
    out.write_all(b",\"episodes\":[")?;
    for (i, e) in p.episodes.iter().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        serde_json::to_writer(&mut *out, &Listed::of(e))?;
    }
    out.write_all(b"],\"trajectories\":{")?;
    for (i, (id, lines)) in trajectories.iter().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        serde_json::to_writer(&mut *out, id)?;
        out.write_all(b":[")?;
        for (j, line) in lines.iter().enumerate() {
            if j > 0 {
                out.write_all(b",")?;
            }
            // Each line is one JSON object, as the log holds it.
            out.write_all(line.as_bytes())?;
        }
        out.write_all(b"]")?;
    }
    out.write_all(b"}}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The template with `data` in place of its placeholder, as `render` writes it.
    fn page(data: &Value) -> String {
        let mut safe = ScriptSafe { out: Vec::new(), pending: Vec::new() };
        serde_json::to_writer(&mut safe, data).unwrap();
        safe.finish().unwrap();
        template().replacen(PLACEHOLDER, &String::from_utf8(safe.out).unwrap(), 1)
    }

    #[test]
    fn data_cannot_close_the_script_element() {
        let data = json!({"text": "</script><script>alert(1)</script>\u{2028}"});
        let page = page(&data);
        let start = page.find("const RUN = ").unwrap();
        let script_end = page[start..].find("</script>").unwrap();
        let inline = &page[start..start + script_end];
        assert!(!inline.contains("alert(1)</"), "the data closed the script: {inline}");
        assert!(!inline.contains('\u{2028}'));
        // What the browser reads back is the original text.
        let json_text = inline.trim_start_matches("const RUN = ").trim_end().trim_end_matches(';');
        let back: Value = serde_json::from_str(json_text).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn a_separator_split_across_writes_is_still_escaped() {
        let text = "a\u{2028}b<c\u{2029}é";
        let mut safe = ScriptSafe { out: Vec::new(), pending: Vec::new() };
        for byte in text.as_bytes() {
            safe.write_all(std::slice::from_ref(byte)).unwrap();
        }
        safe.finish().unwrap();
        assert_eq!(String::from_utf8(safe.out).unwrap(), "a\\u2028b\\u003cc\\u2029é");
    }
}
