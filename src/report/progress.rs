//! Progress while a run goes: a bar on a terminal, one plain line per episode otherwise.

use std::io::{IsTerminal, Write};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::batch::EpisodeReport;
use crate::log::Outcome;

pub struct Progress {
    total: u64,
    done: u64,
    passed: u64,
    failed: u64,
    unscored: u64,
    bar: Option<ProgressBar>,
    quiet: bool,
}

impl Progress {
    pub fn new(total: u64, quiet: bool) -> Self {
        let bar = (!quiet && std::io::stdout().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template("{bar:30.cyan/blue} {pos}/{len} episodes  {msg}  ETA {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar
        });
        Progress { total, done: 0, passed: 0, failed: 0, unscored: 0, bar, quiet }
    }

    pub fn finished(&mut self, report: &EpisodeReport) {
        self.done += 1;
        let verdict = match &report.outcome {
            Outcome::Scored { passed: true, .. } => {
                self.passed += 1;
                "PASS".to_owned()
            }
            Outcome::Scored { passed: false, .. } => {
                self.failed += 1;
                "FAIL".to_owned()
            }
            Outcome::Unscored { cause, .. } => {
                self.unscored += 1;
                format!("UNSCORED ({cause})")
            }
            Outcome::Cancelled => "CANCELLED".to_owned(),
        };
        match &self.bar {
            Some(bar) => {
                bar.set_message(format!("passed {}  failed {}  unscored {}", self.passed, self.failed, self.unscored));
                bar.inc(1);
            }
            None if self.quiet => {}
            None => {
                let width = self.total.to_string().len();
                let line = format!(
                    "[{:>width$}/{}] {verdict} {}/{} ({}, epoch {}) {} steps, {}, {:.0} ms\n",
                    self.done,
                    self.total,
                    report.suite,
                    report.task_id,
                    report.model,
                    report.epoch,
                    report.steps,
                    report.termination.as_str(),
                    report.wall_ms,
                );
                let _ = std::io::stdout().lock().write_all(line.as_bytes());
            }
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
