//! Progress while a run goes: a bar on a terminal, one plain line per episode otherwise. It
//! is a subscriber of the run's events, like the log file: it sees each episode start and
//! finish.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::log::{Event, Outcome, Subscriber, Termination};

/// An episode between its start and its finish: what its line names.
struct Running {
    suite: String,
    task_id: String,
    model: String,
    epoch: u32,
    /// Its model calls so far, their input tokens, and the largest one's: a program agent's
    /// prompts can be far larger than its task (Claude Code's first is ~17,000 tokens).
    calls: u32,
    input_tokens: u64,
    largest_input: u64,
}

pub struct Progress {
    /// Only the episodes in flight.
    running: HashMap<String, Running>,
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
        Progress { running: HashMap::new(), total, done: 0, passed: 0, failed: 0, unscored: 0, bar, quiet }
    }

    fn finished(&mut self, episode: &Running, outcome: &Outcome, termination: Termination, steps: u32, wall_ms: f64) {
        self.done += 1;
        let verdict = match outcome {
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
                let calls = match episode.calls {
                    0 => String::new(),
                    n => format!(
                        ", {n} model call{}, {} input tokens (largest call {})",
                        if n == 1 { "" } else { "s" },
                        episode.input_tokens,
                        episode.largest_input
                    ),
                };
                let line = format!(
                    "[{:>width$}/{}] {verdict} {}/{} ({}, epoch {}) {} steps, {}, {:.0} ms{calls}\n",
                    self.done,
                    self.total,
                    episode.suite,
                    episode.task_id,
                    episode.model,
                    episode.epoch,
                    steps,
                    termination.as_str(),
                    wall_ms,
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

impl Progress {
    /// The events the display counts by.
    pub fn wants(event: &Event) -> bool {
        matches!(event, Event::EpisodeStarted { .. } | Event::EpisodeFinished { .. } | Event::ModelCall { .. })
    }
}

impl Subscriber for Progress {
    fn event(&mut self, episode_id: Option<&str>, event: &Event) {
        let Some(id) = episode_id else { return };
        match event {
            Event::EpisodeStarted { suite, task_id, model, epoch, variant, .. } => {
                // Under a variant, the line names it with the model: `(echo [terse], epoch 1)`.
                let model = super::summary::label(model, variant.as_deref());
                let running = Running {
                    suite: suite.clone(),
                    task_id: task_id.clone(),
                    model,
                    epoch: *epoch,
                    calls: 0,
                    input_tokens: 0,
                    largest_input: 0,
                };
                self.running.insert(id.to_owned(), running);
            }
            // The episode's own calls, not a grader's.
            Event::ModelCall { usage, scorer: None, .. } => {
                if let Some(episode) = self.running.get_mut(id) {
                    episode.calls += 1;
                    episode.input_tokens += usage.input_tokens;
                    episode.largest_input = episode.largest_input.max(usage.input_tokens);
                }
            }
            Event::EpisodeFinished { outcome, termination, steps, wall_ms, .. } => {
                if let Some(episode) = self.running.remove(id) {
                    self.finished(&episode, outcome, *termination, *steps, *wall_ms);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{UnscoredCause, Usage};

    fn finished(outcome: Outcome) -> Event {
        Event::EpisodeFinished {
            outcome,
            termination: Termination::FinalAnswer,
            steps: 1,
            tool_calls: 0,
            tool_errors: 0,
            usage: Usage::default(),
            cost_usd: None,
            wall_ms: 1.0,
            loop_ms: None,
            user_usage: None,
            user_cost_usd: None,
            agent_program: None,
        }
    }

    fn started(task: &str) -> Event {
        Event::EpisodeStarted {
            suite: "s".into(),
            task_id: task.into(),
            task_digest: "d".into(),
            model: "mock".into(),
            epoch: 1,
            environment: "kv".into(),
            toolset: None,
            variant: None,
            sampling: Default::default(),
            digests: None,
            tags: Vec::new(),
            metadata: Default::default(),
        }
    }

    #[test]
    fn episodes_are_counted_from_their_finish_events_and_forgotten_after() {
        let mut p = Progress::new(3, true);
        p.event(Some("e1"), &started("a"));
        p.event(Some("e2"), &started("b"));
        p.event(Some("e1"), &finished(Outcome::Scored { score: 1.0, passed: true }));
        let gone = Outcome::Unscored { cause: UnscoredCause::ProviderError, message: String::new() };
        p.event(Some("e2"), &finished(gone));
        p.event(Some("e3"), &finished(Outcome::Cancelled));
        p.event(None, &finished(Outcome::Cancelled));
        assert_eq!((p.done, p.passed, p.failed, p.unscored), (2, 1, 0, 1), "a finish never started is not counted");
        assert!(p.running.is_empty());
    }
}
