//! JUnit XML for CI systems, from the event log: one test case per episode; a failed
//! episode carries the explanations of its failed scorers, an unscored one is an error
//! (with its cause), a cancelled one is skipped. The latest scoring counts.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;

use super::Summary;
use crate::log::reader::for_each_event_of;
use crate::log::{Event, Outcome};

/// Writes `out` from the log at `events`; `summary` gives the totals of the header.
pub fn write(events: &Path, summary: &Summary, out: &Path) -> std::io::Result<()> {
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

    // Failed scorers' explanations are gathered per episode until it finishes. When the run
    // was regraded, cases wait for their latest outcome at the end of the log.
    let mut open: HashMap<String, Case> = HashMap::new();
    let mut waiting: Vec<(String, Case)> = Vec::new();
    let mut rescored: HashMap<String, Outcome> = HashMap::new();
    let mut result = Ok(());
    let kinds = ["episode_started", "score", "episode_finished", "episode_scored"];
    for_each_event_of(events, Some(&kinds), |logged| {
        let Some(id) = logged.episode_id.clone() else { return };
        match logged.event() {
            Some(Event::EpisodeStarted { suite, task_id, model, epoch, .. }) => {
                let case = Case {
                    suite,
                    task: task_id,
                    model,
                    epoch,
                    wall_ms: 0.0,
                    outcome: Outcome::Cancelled,
                    reasons: Vec::new(),
                };
                open.insert(id, case);
            }
            Some(Event::Score { scorer, passed: false, explanation, .. }) => {
                if let Some(case) = open.get_mut(&id) {
                    case.reasons.push(format!("{scorer}: {explanation}"));
                }
            }
            Some(Event::EpisodeFinished { outcome, wall_ms, .. }) => {
                if let Some(mut case) = open.remove(&id) {
                    (case.outcome, case.wall_ms) = (outcome, wall_ms);
                    if summary.scoring_id.is_none() {
                        if let Err(e) = case.write(&mut file) {
                            result = Err(e);
                        }
                    } else {
                        waiting.push((id, case));
                    }
                }
            }
            Some(Event::EpisodeScored { outcome, .. }) => {
                rescored.insert(id, outcome);
            }
            _ => {}
        }
    })
    .map_err(std::io::Error::other)?;
    result?;
    for (id, mut case) in waiting {
        if let Some(outcome) = rescored.remove(&id) {
            case.outcome = outcome;
            case.reasons = vec!["regraded: the log's latest score events explain it".into()];
        }
        case.write(&mut file)?;
    }
    file.write_all(b"  </testsuite>\n</testsuites>\n")?;
    file.flush()
}

/// One episode as a test case.
struct Case {
    suite: String,
    task: String,
    model: String,
    epoch: u32,
    wall_ms: f64,
    outcome: Outcome,
    reasons: Vec<String>,
}

impl Case {
    fn write(&self, out: &mut impl Write) -> std::io::Result<()> {
        let name = format!("{} [{}, epoch {}]", self.task, self.model, self.epoch);
        write!(
            out,
            "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3}\"",
            escape(&self.suite),
            escape(&name),
            self.wall_ms / 1e3
        )?;
        match &self.outcome {
            Outcome::Scored { passed: true, .. } => out.write_all(b"/>\n"),
            Outcome::Scored { score, .. } => {
                let text = if self.reasons.is_empty() { format!("score {score:.3}") } else { self.reasons.join("\n") };
                write!(
                    out,
                    ">\n      <failure message=\"score {score:.3}\" type=\"failed\">{}</failure>\n    </testcase>\n",
                    escape(&text)
                )
            }
            Outcome::Unscored { cause, message } => write!(
                out,
                ">\n      <error message=\"{}\" type=\"{}\">{}</error>\n    </testcase>\n",
                escape(&format!("unscored: {cause}")),
                escape(cause),
                escape(message)
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
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 => {}
            c => out.push(c),
        }
    }
    out
}

/// The summary as Markdown, for a pull-request comment or a GitHub step summary.
pub fn markdown(summary: &Summary) -> String {
    let mut out = format!("### runner: `{}`\n\n", summary.run_id);
    out.push_str("| suite | model | episodes | passed | failed | unscored | pass rate | tokens | cost |\n");
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in &summary.rows {
        let rate = r.pass_rate().map_or("-".into(), |p| format!("{:.1}%", p * 100.0));
        let cost = if r.unpriced == r.episodes { "-".into() } else { format!("${:.4}", r.cost_usd) };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {rate} | {} | {cost} |",
            r.suite, r.model, r.episodes, r.passed, r.failed, r.unscored, r.tokens
        );
    }
    let total = summary.total();
    if total.unscored > 0 {
        let causes: Vec<String> = total.unscored_causes.iter().map(|(c, n)| format!("{c}: {n}")).collect();
        let _ = writeln!(out, "\nUnscored (not failures): {}", causes.join(", "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn escapes_what_xml_needs() {
        assert_eq!(escape("a<b & \"c\">'d'\u{1}"), "a&lt;b &amp; &quot;c&quot;&gt;&apos;d&apos;");
    }
}
