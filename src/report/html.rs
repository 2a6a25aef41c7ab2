//! `runner report RUN --html`: one self-contained file (styles, script and data inline, no
//! network needed) with the summary, per-suite and per-model tables, a chart of pass rates
//! with intervals, a filterable episode list and each episode's trajectory.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde_json::{Value, json};

use super::compare::GroupStats;
use super::table::{EpisodeRow, Projection};
use crate::log::reader::for_each_line_of;

const TEMPLATE: &str = include_str!("report.html");
const PLACEHOLDER: &str = "/*RUN_DATA*/null";

/// The report page for the run logged at `events`. At most `max_trajectories` episodes carry
/// their whole trajectory (failed, unscored and cancelled ones first): the rest are listed
/// with their results, so a run of 100,000 episodes still gives a page a browser opens.
pub fn render(events: &Path, max_trajectories: usize) -> Result<String, String> {
    let p = Projection::from_log(events).map_err(|e| e.to_string())?;
    let chosen = choose(&p.episodes, max_trajectories);
    let trajectories = trajectories(events, &chosen)?;
    let data = data(&p, trajectories, chosen.len());
    Ok(page(&data))
}

/// The template with the data in place of its placeholder.
pub fn page(data: &Value) -> String {
    TEMPLATE.replacen(PLACEHOLDER, &script_safe(&data.to_string()), 1)
}

/// JSON that cannot end the script element it sits in: every `<` is escaped (it only occurs
/// inside strings), and so are the two line separators JavaScript once disallowed.
fn script_safe(json: &str) -> String {
    json.replace('<', "\\u003c").replace('\u{2028}', "\\u2028").replace('\u{2029}', "\\u2029")
}

/// The episodes whose trajectories go in: not passed first, then passed, in table order.
fn choose(rows: &[EpisodeRow], max: usize) -> HashSet<String> {
    let (mut first, mut then): (Vec<&EpisodeRow>, Vec<&EpisodeRow>) = rows.iter().partition(|r| r.status() != "passed");
    first.append(&mut then);
    first.into_iter().take(max).map(|r| String::from(&*r.episode_id)).collect()
}

/// The chosen episodes' events, each episode's from its latest start on.
fn trajectories(events: &Path, chosen: &HashSet<String>) -> Result<HashMap<String, Vec<Value>>, String> {
    let mut out: HashMap<String, Vec<Value>> = HashMap::new();
    if chosen.is_empty() {
        return Ok(out);
    }
    #[derive(serde::Deserialize)]
    struct Id {
        #[serde(default)]
        episode_id: Option<String>,
    }
    for_each_line_of(events, None, |kind, text| {
        let Ok(Id { episode_id: Some(id) }) = serde_json::from_str::<Id>(text) else { return Ok(()) };
        if !chosen.contains(&id) {
            return Ok(());
        }
        let mut event: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if let Some(obj) = event.as_object_mut() {
            for header in ["v", "run_id", "episode_id"] {
                obj.remove(header);
            }
        }
        let list = out.entry(id).or_default();
        if kind == "episode_started" {
            list.clear();
        }
        list.push(event);
        Ok(())
    })
    .map_err(|e| e.to_string())?;
    Ok(out)
}

fn stats(suite: Option<&str>, g: &GroupStats) -> Value {
    json!({
        "suite": suite, "model": g.model, "episodes": g.episodes, "scored": g.scored, "passed": g.passed,
        "failed": g.scored - g.passed, "unscored": g.unscored, "cancelled": g.cancelled, "pass_rate": g.pass_rate,
        "ci_low": g.interval.map(|i| i.0), "ci_high": g.interval.map(|i| i.1), "mean_score": g.mean_score,
        "tokens": g.tokens, "cost_usd": g.cost_usd, "latency_p50_ms": g.latency_p50_ms,
        "latency_p95_ms": g.latency_p95_ms, "mean_steps": g.mean_steps,
    })
}

fn data(p: &Projection, trajectories: HashMap<String, Vec<Value>>, chosen: usize) -> Value {
    let all: Vec<&EpisodeRow> = p.episodes.iter().collect();
    let mut totals = stats(None, &GroupStats::of(String::new(), p.run_id.clone(), String::new(), &all));
    totals["model"] = Value::Null;
    let models: Vec<Value> = super::compare::groups(std::slice::from_ref(p))
        .iter()
        .map(|g| stats(None, &GroupStats::of(g.label.clone(), g.run_id.clone(), g.model.clone(), &g.rows)))
        .collect();
    let mut keys: Vec<(&str, &str)> = Vec::new();
    for e in &p.episodes {
        if !keys.contains(&(&e.suite, &e.model)) {
            keys.push((&e.suite, &e.model));
        }
    }
    let suites: Vec<Value> = keys
        .iter()
        .map(|(suite, model)| {
            let rows: Vec<&EpisodeRow> =
                p.episodes.iter().filter(|e| &*e.suite == *suite && &*e.model == *model).collect();
            stats(Some(suite), &GroupStats::of(String::new(), p.run_id.clone(), model.to_string(), &rows))
        })
        .collect();
    let episodes: Vec<Value> = p
        .episodes
        .iter()
        .map(|e| {
            json!({
                "episode_id": &*e.episode_id, "suite": &*e.suite, "task_id": &*e.task_id, "model": &*e.model,
                "epoch": e.epoch, "outcome": e.status(), "unscored_cause": e.unscored_cause(), "score": e.score(),
                "steps": e.steps, "tool_calls": e.tool_calls, "tool_errors": e.tool_errors,
                "tokens": e.usage.total(), "cost_usd": e.cost_usd, "latency_ms": e.latency_ms, "wall_ms": e.wall_ms,
                "termination": e.termination.as_str(),
            })
        })
        .collect();
    json!({
        "run_id": p.run_id,
        "generated_at": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "runner_version": env!("CARGO_PKG_VERSION"),
        "command_line": p.header.command_line,
        "git_revision": p.header.git_revision,
        "interrupted": p.interrupted || !p.finished,
        "scoring_id": p.scoring_id,
        "totals": totals,
        "models": models,
        "suites": suites,
        "episodes": episodes,
        "trajectories": trajectories,
        "omitted_trajectories": p.episodes.len().saturating_sub(chosen),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
