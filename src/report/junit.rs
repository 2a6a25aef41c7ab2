//! JUnit XML for CI systems, from the event log: one test case per episode; a failed
//! episode carries the explanations of its failed scorers, an unscored one is an error
//! (with its cause), a cancelled one is skipped. The latest scoring counts.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;

use super::Summary;
use crate::log::projection::{EpisodeRow, Index};
use crate::log::reader::for_each_event_of;
use crate::log::{Event, Outcome};

/// Writes `out` from the run's log (through its index), one case per row of the episodes table (an
/// episode's latest finish under its latest scoring); `summary` gives the header's totals.
pub fn write(index: &Index, summary: &Summary, out: &Path) -> std::io::Result<()> {
    let events = index.path();
    // Why the episodes that did not pass did not: their failed scorers' explanations under
    // the scoring that counts, or their unscored message. Only those are held.
    let mut explain: HashMap<String, Explanation> = HashMap::new();
    index
        .for_each_row(|row| {
            if row.status() != "passed" {
                explain.insert(row.episode_id.to_string(), Explanation::default());
            }
        })
        .map_err(std::io::Error::other)?;
    let kinds = ["episode_started", "score", "episode_finished", "episode_scored"];
    for_each_event_of(events, Some(&kinds), |logged| {
        let Some(e) = logged.episode_id.as_ref().and_then(|id| explain.get_mut(id)) else { return };
        match logged.event() {
            // The episode ran again: what its earlier try said no longer counts.
            Some(Event::EpisodeStarted { .. }) => *e = Explanation::default(),
            Some(Event::Score { scoring_id, scorer, passed: false, explanation, .. }) => {
                e.reasons.push((scoring_id, format!("{scorer}: {explanation}")));
            }
            Some(Event::EpisodeFinished { outcome: Outcome::Unscored { message, .. }, .. })
            | Some(Event::EpisodeScored { outcome: Outcome::Unscored { message, .. }, .. }) => e.message = message,
            _ => {}
        }
    })
    .map_err(std::io::Error::other)?;

    let total = summary.total();
    let mut file = std::io::BufWriter::new(std::fs::File::create(out)?);
    let name = escape(&summary.run_id);
    write!(
        file,
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"runner {name}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\">\n",
        total.episodes, total.failed, total.unscored, total.cancelled
    )?;
    writeln!(
        file,
        "  <testsuite name=\"{name}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\">",
        total.episodes, total.failed, total.unscored, total.cancelled
    )?;
    let mut result = Ok(());
    index
        .for_each_row(|row| {
            if result.is_err() {
                return;
            }
            let e = explain.remove(&*row.episode_id).unwrap_or_default();
            // The latest scoring that explained anything is the one that counts.
            let latest = e.reasons.last().map(|(id, _)| id.clone());
            let reasons = e.reasons.into_iter().filter(|(id, _)| Some(id) == latest.as_ref()).map(|(_, r)| r).collect();
            let case = Case { row: &row, reasons, message: e.message };
            result = case.write(&mut file);
        })
        .map_err(std::io::Error::other)?;
    result?;
    file.write_all(b"  </testsuite>\n</testsuites>\n")?;
    file.flush()
}

#[derive(Default)]
struct Explanation {
    /// Failed scorers, with the scoring they belong to.
    reasons: Vec<(String, String)>,
    message: String,
}

/// One episode as a test case.
struct Case<'a> {
    row: &'a EpisodeRow,
    reasons: Vec<String>,
    message: String,
}

impl Case<'_> {
    fn write(&self, out: &mut impl Write) -> std::io::Result<()> {
        let r = self.row;
        let name = match &r.variant {
            Some(variant) => format!("{} [{}, variant {variant}, epoch {}]", r.task_id, r.model, r.epoch),
            None => format!("{} [{}, epoch {}]", r.task_id, r.model, r.epoch),
        };
        write!(
            out,
            "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3}\"",
            escape(&r.suite),
            escape(&name),
            r.wall_ms / 1e3
        )?;
        match &r.outcome {
            Outcome::Scored { passed: true, .. } => out.write_all(b"/>\n"),
            Outcome::Scored { score, .. } => {
                let text = if self.reasons.is_empty() { format!("score {score:.3}") } else { self.reasons.join("\n") };
                write!(
                    out,
                    ">\n      <failure message=\"score {score:.3}\" type=\"failed\">{}</failure>\n    </testcase>\n",
                    escape(&text)
                )
            }
            Outcome::Unscored { cause, .. } => write!(
                out,
                ">\n      <error message=\"{}\" type=\"{}\">{}</error>\n    </testcase>\n",
                escape(&format!("unscored: {cause}")),
                escape(cause.as_str()),
                escape(&self.message)
            ),
            Outcome::Cancelled => out.write_all(b">\n      <skipped message=\"cancelled\"/>\n    </testcase>\n"),
        }
    }
}

/// XML text and attribute escaping; characters XML 1.0 cannot hold are dropped.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Kept as characters, not folded into spaces as raw ones in attributes are.
            '\t' => out.push_str("&#9;"),
            '\n' => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            c if (c as u32) < 0x20 => {}
            c => out.push(c),
        }
    }
    out
}

/// The summary as Markdown, for a pull-request comment or a GitHub step summary.
pub fn markdown(summary: &Summary) -> String {
    let mut out = format!("### runner: `{}`\n\n", summary.run_id);
    out.push_str("| suite | model | episodes | passed | failed | unscored | pass rate | coverage | tokens | cost |\n");
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in &summary.rows {
        let rate = r.pass_rate().map_or("-".into(), |p| format!("{:.1}%", p * 100.0));
        let cost = if r.unpriced == r.episodes { "-".into() } else { crate::log::usd(r.cost_usd) };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {rate} | {} | {} | {cost} |",
            r.suite,
            r.label(),
            r.episodes,
            r.passed,
            r.failed,
            r.unscored,
            r.coverage(),
            r.tokens
        );
    }
    let total = summary.total();
    if total.unscored > 0 {
        let causes: Vec<String> = total.unscored_causes.iter().map(|(c, n)| format!("{c}: {n}")).collect();
        let _ = writeln!(out, "\nUnscored (not failures): {}", causes.join(", "));
    }
    if total.not_run > 0 {
        let _ = writeln!(
            out,
            "\nNot run: {} of {} planned episodes, a budget stopped scheduling (incomplete).",
            total.not_run, total.episodes
        );
    }
    for warning in &summary.warnings {
        let _ = writeln!(out, "\n> **Warning:** {warning}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn escapes_what_xml_needs() {
        assert_eq!(escape("a<b & \"c\">'d'\u{1}"), "a&lt;b &amp; &quot;c&quot;&gt;&apos;d&apos;");
        assert_eq!(escape("new\nline\ttab"), "new&#10;line&#9;tab");
    }
}
