//! Re-scoring a finished run from its event log, with new or changed scorers or another
//! grader; no agent model is called. The new scores are appended to the same log under a
//! new scoring id, and the summary follows the latest scoring.
//!
//! World-state scorers (`file_exists`, `file_contains`, `document`, `check`, any with `from:`) need the episode's final
//! world, which is gone: their latest earlier verdict is carried over, and an episode with
//! a world-state scorer that was never scored before is unscored (`world_gone`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use crate::agent::Done;
use crate::contract::{ErrorType, ToolCall};
use crate::environment::{CallError, Ending, ToolFailure, Trajectory, World};
use crate::log::event::SuiteInfo;
use crate::log::projection::Index;
use crate::log::reader::ReadError;
use crate::log::{Event, EventLog, Outcome, Recorder, Termination, UnscoredCause, Usage};
use crate::scoring::{self, Finished, Graders, Score, ScoringFault, aggregate, log_scores};
use crate::suite::Suite;

/// What the log says about one episode, enough to score it again.
#[derive(Default)]
struct Record {
    suite: String,
    /// The model under test, as `episode_started` names it.
    model: String,
    task_id: String,
    task_digest: String,
    calls: Vec<ToolCall>,
    errors: Vec<CallError>,
    final_answer: Option<String>,
    /// In a conversation, what the agent said to the user.
    told_user: Vec<String>,
    /// The calls and failed calls of a killed attempt this one went on from.
    carried: Done,
    /// How the episode ended, from `episode_finished`.
    finished: Option<Closing>,
    /// Scores by scoring id, in the order they were given.
    scores: Vec<(String, Score)>,
}

struct Closing {
    termination: Termination,
    steps: u32,
    usage: Usage,
    cost_usd: Option<f64>,
    wall_ms: f64,
    outcome: Outcome,
}

/// The run as the log holds it.
pub struct LoggedRun {
    pub run_id: String,
    pub events_path: PathBuf,
    pub suites: Vec<SuiteInfo>,
    /// The limit flags the run was made under: its episodes' time limit was the suites' so scaled.
    pub limits: crate::log::event::LimitOverrides,
    last_seq: u64,
    /// How many regrades the run had.
    scorings: usize,
    order: Vec<String>,
    episodes: HashMap<String, Record>,
}

impl LoggedRun {
    /// Reads a run: its folder or its `events.jsonl`. The run as a whole comes from the
    /// log's fold ([`Index`]); each episode's trajectory and scores, which the fold does
    /// not keep, are gathered in the same reading.
    pub fn read(run: &Path) -> Result<Self, ReadError> {
        let events_path = if run.is_dir() { run.join("events.jsonl") } else { run.to_owned() };
        let mut order = Vec::new();
        let mut episodes: HashMap<String, Record> = HashMap::new();
        let trajectory = [
            "episode_started",
            "action_dispatched",
            "observation",
            "said",
            "final",
            "score",
            "ingest_resumed",
            "episode_finished",
        ];
        let index = Index::build_with(&events_path, &trajectory, |episode_id, event| {
            let Some(id) = episode_id else { return };
            if !episodes.contains_key(id) {
                order.push(id.to_owned());
            }
            let record = episodes.entry(id.to_owned()).or_default();
            match event {
                // What came before is an earlier attempt's, killed before it finished.
                Event::EpisodeStarted { suite, task_id, task_digest, model, .. } => {
                    *record = Record { suite, model, task_id, task_digest, ..Record::default() };
                }
                Event::IngestResumed { tool_calls, tool_errors, .. } => {
                    record.carried.tool_calls = record.carried.tool_calls.saturating_add(tool_calls);
                    record.carried.tool_errors = record.carried.tool_errors.saturating_add(tool_errors);
                }
                Event::ActionDispatched { call, .. } => record.calls.push(call),
                Event::Observation { observation, .. } => {
                    let cancelled = observation.error.as_ref().is_some_and(|e| e.kind == ErrorType::Cancelled);
                    if let (Some(error), Some(call_id), false) = (&observation.error, &observation.call_id, cancelled) {
                        record.errors.push(CallError { call_id: call_id.clone(), error: error.clone() });
                    }
                }
                Event::Final { answer, .. } => record.final_answer = Some(answer),
                // The agent's last words to the user are a conversation's answer.
                Event::Said { actor: crate::contract::Actor::Main, text, .. } => {
                    record.final_answer = Some(text.clone());
                    record.told_user.push(text);
                }
                Event::Score { scoring_id, scorer, value, passed, weight, explanation, grader, check } => {
                    record
                        .scores
                        .push((scoring_id, Score { scorer, value, passed, explanation, weight, grader, check }));
                }
                Event::EpisodeFinished { outcome, termination, steps, usage, cost_usd, wall_ms, loop_ms, .. } => {
                    let wall_ms = loop_ms.unwrap_or(wall_ms);
                    record.finished = Some(Closing { termination, steps, usage, cost_usd, wall_ms, outcome });
                }
                _ => {}
            }
        })?;
        let meta = &index.meta;
        Ok(LoggedRun {
            run_id: meta.run_id.clone(),
            events_path,
            suites: meta.header.suites.clone(),
            limits: meta.header.limits,
            last_seq: meta.last_seq,
            scorings: meta.scorings,
            order,
            episodes,
        })
    }

    /// The next scoring id: `regrade-1`, `regrade-2`, …
    pub fn next_scoring_id(&self) -> String {
        format!("regrade-{}", self.scorings + 1)
    }
}

/// Counts of a regrade.
#[derive(Debug, Default, Clone, Copy)]
pub struct Regraded {
    pub episodes: u64,
    pub scored: u64,
    pub passed: u64,
    pub unscored: u64,
    /// Episodes whose task changed since the run (a different content digest).
    pub changed_tasks: u64,
    /// Episodes that could not be re-scored (their task is gone, or they never answered).
    pub skipped: u64,
}

/// The world of a finished episode, which no longer exists.
struct Gone;

#[async_trait]
impl World for Gone {
    async fn call(&self, _: &crate::contract::Actor, _: &str, _: Value) -> Result<Value, ToolFailure> {
        Err(ToolFailure::new(ErrorType::ExecutionError, "the episode's world is gone"))
    }
}

/// Re-scores every episode that was scored (or that a grader failed on), appending the
/// new scores to the run's log.
pub async fn regrade(
    run: &LoggedRun,
    suites: &[Arc<Suite>],
    graders: &Graders,
    command_line: Vec<String>,
) -> Result<(String, Regraded), std::io::Error> {
    let scoring_id = run.next_scoring_id();
    let (log, writer) = EventLog::append(&run.events_path, &run.run_id, run.last_seq)?;
    log.emit(
        None,
        &Event::ScoringStarted {
            scoring_id: scoring_id.clone(),
            command_line,
            grader: graders.forced.clone(),
            suites: suites.iter().map(|s| super::suite_info(s)).collect(),
        },
    );
    let mut counts = Regraded::default();
    for id in &run.order {
        let Some(record) = run.episodes.get(id) else { continue };
        let recorder = log.recorder(id);
        let logged = Logged { recorder: &recorder, scoring_id: &scoring_id, recalled: None };
        let Some((outcome, changed_task)) = score_episode_again(id, record, suites, graders, logged).await else {
            counts.skipped += 1;
            continue;
        };
        recorder.emit(&Event::EpisodeScored { scoring_id: scoring_id.clone(), outcome: outcome.clone() });
        counts.changed_tasks += u64::from(changed_task);
        counts.episodes += 1;
        match &outcome {
            Outcome::Scored { passed, .. } => {
                counts.scored += 1;
                counts.passed += u64::from(*passed);
            }
            _ => counts.unscored += 1,
        }
    }
    log.emit(
        None,
        &Event::ScoringFinished {
            scoring_id: scoring_id.clone(),
            episodes: counts.episodes,
            scored: counts.scored,
            passed: counts.passed,
            unscored: counts.unscored,
        },
    );
    drop(log);
    writer.close()?;
    Ok((scoring_id, counts))
}

impl LoggedRun {
    /// Scores the logged episode `from` again from its trajectory as the episode `id` of
    /// another run, its scores logged through `recorder` under the scoring `scoring_id`:
    /// its new outcome, `None` when it cannot be (as for a regrade).
    pub(crate) async fn score_as(
        &self,
        (from, id): (&str, &str),
        suites: &[Arc<Suite>],
        graders: &Graders,
        (recorder, scoring_id): (&Recorder, &str),
        recalled: Option<&Arc<crate::model::recalled::Recalled>>,
    ) -> Option<Outcome> {
        let record = self.episodes.get(from)?;
        let logged = Logged { recorder, scoring_id, recalled: recalled.map(|r| (r, from)) };
        score_episode_again(id, record, suites, graders, logged).await.map(|(outcome, _)| outcome)
    }
}

/// Where an episode scored again logs its scores, and the grader answers it may recall.
struct Logged<'a> {
    recorder: &'a Recorder,
    scoring_id: &'a str,
    recalled: Option<(&'a Arc<crate::model::recalled::Recalled>, &'a str)>,
}

/// Scores a logged episode again from its trajectory, under the scoring `scoring_id`, and
/// logs its scores: its new outcome, and whether its task changed since it ran; `None` when it is not regraded
/// (it did not finish, was cancelled or unscored for a cause a regrade cannot mend, or its
/// suite or task is gone).
async fn score_episode_again(
    id: &str,
    record: &Record,
    suites: &[Arc<Suite>],
    graders: &Graders,
    Logged { recorder, scoring_id, recalled }: Logged<'_>,
) -> Option<(Outcome, bool)> {
    let finished = record.finished.as_ref()?;
    let regradable = match &finished.outcome {
        Outcome::Scored { .. } => true,
        Outcome::Unscored { cause, .. } => matches!(cause, UnscoredCause::GraderError | UnscoredCause::WorldGone),
        Outcome::Cancelled => false,
    };
    let (suite, task) = suites
        .iter()
        .find(|s| s.name == record.suite)
        .and_then(|s| Some((s, s.tasks.iter().find(|t| t.id == record.task_id)?)))
        .filter(|_| regradable)?;
    let ending = Ending {
        termination: finished.termination,
        final_answer: record.final_answer.clone(),
        steps: finished.steps,
        usage: finished.usage,
        cost_usd: finished.cost_usd,
        fault: None,
        trajectory: Trajectory {
            calls: record.calls.clone(),
            errors: record.errors.clone(),
            told_user: record.told_user.clone(),
            carried_calls: record.carried.tool_calls,
            carried_errors: record.carried.tool_errors,
        },
    };
    if suite.agent.kind.logs_stages() {
        recorder.emit(&Event::Stage { stage: crate::log::event::Stage::Judge, ingestion: None });
    }
    let episode = Finished {
        task,
        episode_id: id,
        under_test: None,
        model: &record.model,
        recorder: Some(recorder),
        ending: &ending,
        wall_s: finished.wall_ms / 1e3,
        suite_grader: suite.grader.as_ref().map(|g| g.model.as_str()),
        suite_template: suite.grader.as_ref().and_then(|g| g.template.as_deref()),
        world_limit: suite.limits.time,
        sandbox: suite.sandbox,
        recalled,
    };
    let outcome = match score_again(record, suite, &episode, graders).await {
        Ok(scores) => {
            log_scores(recorder, scoring_id, &scores);
            let (score, passed) = aggregate(&scores, suite.pass_score);
            Outcome::Scored { score, passed }
        }
        Err(fault) => {
            log_scores(recorder, scoring_id, &fault.scores);
            match fault.settled(suite.pass_score) {
                Some((score, passed)) => Outcome::Scored { score, passed },
                None => Outcome::Unscored { cause: fault.cause, message: fault.message },
            }
        }
    };
    Some((outcome, task.digest != record.task_digest))
}

/// Scores an episode again; world-state scorers carry over the latest earlier verdict of
/// the very same check.
async fn score_again(
    record: &Record,
    suite: &Suite,
    episode: &Finished<'_>,
    graders: &Graders,
) -> Result<Vec<Score>, ScoringFault> {
    let mut used = vec![false; record.scores.len()];
    let mut scores = Vec::new();
    for spec in suite.scorers.iter().chain(&episode.task.scorers) {
        if spec.reads_world() {
            let check = spec.check_value();
            let earlier = (0..record.scores.len()).rev().find(|&i| !used[i] && record.scores[i].1.check == check);
            let Some(i) = earlier else {
                let message =
                    format!("`{}` looks at the episode's final world, which is gone, and never checked it", spec.name);
                return Err(ScoringFault { scores, ..ScoringFault::new(UnscoredCause::WorldGone, message) });
            };
            used[i] = true;
            let mut carried = record.scores[i].1.clone();
            carried.weight = spec.weight;
            carried.explanation = format!("{} (carried over: the world is gone)", carried.explanation);
            scores.push(carried);
        } else {
            // The scorers after a fault are not tried: what they would say is unknown.
            match scoring::score(std::slice::from_ref(spec), &[], episode, &Gone, graders).await {
                Ok(verdicts) => scores.extend(verdicts),
                Err(fault) => {
                    scores.extend(fault.scores);
                    return Err(ScoringFault { scores, missing_weight: f64::INFINITY, ..fault });
                }
            }
        }
    }
    Ok(scores)
}
