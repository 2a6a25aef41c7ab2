//! The one fold of a run's log: one row per episode, and what the run as a whole says. The
//! tables, the summary, the comparison and the reports, resume, merge and regrade all read
//! the log through it.
//!
//! An episode's row is its latest finish (a resumed run finishes again the episodes it ran
//! again) under its latest scoring (a regrade appends new outcomes). Rows are sorted by
//! suite, task, model and epoch, so two runs of the same episodes give the same table
//! whatever order the episodes finished in.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::event::{EpisodeFinishedRow, EpisodeStartedKey, ModelCallTiming, SuiteInfo};
use super::reader::{LineHeader, ReadError, for_each_line_of, header_seq, line_at};
use super::{Event, Outcome, Termination, Usage};

/// One episode as the table shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeRow {
    pub episode_id: Box<str>,
    pub suite: Arc<str>,
    pub task_id: Arc<str>,
    pub task_digest: Arc<str>,
    pub model: Arc<str>,
    pub epoch: u32,
    pub outcome: Outcome,
    pub termination: Termination,
    pub steps: u32,
    pub tool_calls: u32,
    pub tool_errors: u32,
    pub usage: Usage,
    pub cost_usd: Option<f64>,
    pub model_calls: u32,
    /// The input tokens of the episode's largest model call.
    pub largest_input: u64,
    /// The sum of the episode's model call latencies.
    pub latency_ms: f64,
    pub wall_ms: f64,
    /// Microseconds since the Unix epoch, UTC.
    pub started_us: i64,
    pub finished_us: i64,
    /// The toolset the episode drew, when its suite names `toolsets:`.
    pub toolset: Option<Arc<str>>,
    /// The variant the episode ran under, when its suite names `variants:`.
    pub variant: Option<Arc<str>>,
    /// Its task's tags (`episode_started.tags`).
    pub tags: Box<[Arc<str>]>,
    /// Its task's scalar metadata as logged, each value as text (`7`, `true`, `hard`).
    pub metadata: Box<[(Arc<str>, Arc<str>)]>,
}

#[cfg(test)]
impl EpisodeRow {
    /// A row of one step's episode, epoch 1, of task `task_id` of suite `s` on `model`: the
    /// shape unit tests of the tables and filters start from.
    pub(crate) fn example(task_id: &str, model: &str, outcome: Outcome) -> EpisodeRow {
        EpisodeRow {
            episode_id: format!("{model}-{task_id}").into(),
            suite: Arc::from("s"),
            task_id: Arc::from(task_id),
            task_digest: Arc::from("d"),
            model: Arc::from(model),
            epoch: 1,
            outcome,
            termination: Termination::FinalAnswer,
            steps: 1,
            tool_calls: 0,
            tool_errors: 0,
            usage: Usage::default(),
            cost_usd: None,
            model_calls: 1,
            largest_input: 0,
            latency_ms: 1.0,
            wall_ms: 1.0,
            started_us: 0,
            finished_us: 0,
            toolset: None,
            variant: None,
            tags: Box::default(),
            metadata: Box::default(),
        }
    }
}

impl EpisodeRow {
    /// `passed`, `failed`, `unscored` or `cancelled`.
    pub fn status(&self) -> &'static str {
        match &self.outcome {
            Outcome::Scored { passed: true, .. } => "passed",
            Outcome::Scored { passed: false, .. } => "failed",
            Outcome::Unscored { .. } => "unscored",
            Outcome::Cancelled => "cancelled",
        }
    }

    pub fn score(&self) -> Option<f64> {
        match self.outcome {
            Outcome::Scored { score, .. } => Some(score),
            _ => None,
        }
    }

    pub fn passed(&self) -> Option<bool> {
        match self.outcome {
            Outcome::Scored { passed, .. } => Some(passed),
            _ => None,
        }
    }

    pub fn unscored_cause(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Unscored { cause, .. } => Some(cause.as_str()),
            _ => None,
        }
    }

    /// What pairs this episode with the same task's epoch in another run or on another model.
    pub fn pair_key(&self) -> (&str, &str, u32) {
        (&self.suite, &self.task_id, self.epoch)
    }

    pub fn started_at(&self) -> String {
        rfc3339(self.started_us)
    }

    pub fn finished_at(&self) -> String {
        rfc3339(self.finished_us)
    }
}

fn rfc3339(us: i64) -> String {
    chrono::DateTime::from_timestamp_micros(us)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true))
        .unwrap_or_default()
}

fn micros(ts: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(ts).map_or(0, |t| t.timestamp_micros())
}

/// The run as a whole, from `run_started`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunHeader {
    pub runner_version: String,
    pub command_line: Vec<String>,
    pub models: Vec<String>,
    pub suites: Vec<SuiteInfo>,
    pub git_revision: Option<String>,
    pub shard: Option<String>,
    /// The suites' limits as the command line overrode them.
    pub limits: crate::log::event::LimitOverrides,
    /// What the run warned about how it was set up.
    pub warnings: Vec<String>,
    /// The tasks the command line chose.
    pub selection: crate::domain::selection::Selection,
}

/// A run's log, projected.
#[derive(Debug, Clone, Default)]
pub struct Projection {
    pub run_id: String,
    pub header: RunHeader,
    /// Sorted by suite, task, model and epoch.
    pub episodes: Vec<EpisodeRow>,
    /// From the latest `run_finished`: whether the run (or its last resumption) was stopped.
    pub interrupted: bool,
    pub finished: bool,
    /// The run's own wall time, summed over its resumptions.
    pub wall_ms: f64,
    /// Episodes started but never finished (the process was killed).
    pub unfinished: u64,
    pub torn_last_line: bool,
    /// The latest regrade, when the run was regraded.
    pub scoring_id: Option<String>,
    /// How many regrades the run had.
    pub scorings: usize,
    /// The highest event number: where an append continues.
    pub last_seq: u64,
}

/// An episode between its start and its finish.
struct Open {
    key: Key,
    started_us: i64,
    model_calls: u32,
    largest_input: u64,
    latency_ms: f64,
    toolset: Option<u32>,
    tags: Box<[u32]>,
    metadata: Box<[(u32, u32)]>,
}

/// Suite, task id, task digest, model and variant (indexes into the index's names), and
/// epoch: what identifies an episode (its id is made from them) and sorts the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    suite: u32,
    task: u32,
    digest: u32,
    model: u32,
    epoch: u32,
    variant: Option<u32>,
}

/// One finish of an episode: where its line is and what the lines before it said.
struct Entry {
    key: Key,
    model_calls: u32,
    largest_input: u64,
    started_us: i64,
    latency_ms: f64,
    offset: u64,
    /// The toolset drawn (an index into the names), when there was one.
    toolset: Option<u32>,
    /// The task's tags and scalar metadata (indexes into the names).
    tags: Box<[u32]>,
    metadata: Box<[(u32, u32)]>,
}

/// A log read once, keeping of each finished episode only what sorts and locates it
/// (about 50 bytes): the rows are then read back one at a time, in table order. This is
/// what keeps writing the tables of a 100,000-episode run within a few megabytes.
pub struct Index {
    path: std::path::PathBuf,
    /// Everything but the rows.
    pub meta: Projection,
    names: Vec<Arc<str>>,
    entries: Vec<Entry>,
    rescored: HashMap<String, Outcome>,
}

impl Index {
    pub fn build(path: &Path) -> Result<Index, ReadError> {
        Index::build_with(path, &[], |_, _| {})
    }

    /// Builds the index and, in the same reading, gives each event whose type is in `also`
    /// to `each` with its episode id, for a reader that needs more of some events than the
    /// index keeps (regrade: trajectories and scores). An event of one of those types that
    /// this version cannot decode is not given.
    pub fn build_with(
        path: &Path,
        also: &[&str],
        mut each: impl FnMut(Option<&str>, Event),
    ) -> Result<Index, ReadError> {
        let mut fold = Fold::default();
        // Every line counts for the last event number (an append continues after it); only
        // the kinds the fold reads are decoded.
        let torn = for_each_line_of(path, None, |kind, text, offset| {
            if also.contains(&kind) {
                let head = LineHeader::of(text).map_err(|e| e.to_string())?;
                if let Ok(event) = serde_json::from_str::<Event>(text) {
                    each(head.episode_id.as_deref(), event);
                }
            }
            fold.line(kind, text, offset)
        })?;
        let Fold { mut p, open, names, mut entries, rescored } = fold;
        p.unfinished = open.len() as u64;
        p.torn_last_line = torn;
        keep_latest_finishes(&mut entries, &names);
        Ok(Index { path: path.to_path_buf(), meta: p, names: names.names, entries, rescored })
    }

    /// The log this index was built from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many episodes (rows) the run has.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Each episode's row, in table order, its finish read back from the log.
    pub fn for_each_row(&self, mut each: impl FnMut(EpisodeRow)) -> Result<(), ReadError> {
        let shown = self.path.display().to_string();
        let file = std::fs::File::open(&self.path).map_err(|source| ReadError::Io { path: shown.clone(), source })?;
        let invalid = |offset: u64, message: String| ReadError::Invalid {
            path: shown.clone(),
            line: crate::log::reader::line_number_at(&self.path, offset),
            message,
        };
        let mut buf = Vec::new();
        let mut causes_seen = std::collections::HashSet::new();
        for e in &self.entries {
            let text =
                line_at(&file, e.offset, &mut buf).map_err(|source| ReadError::Io { path: shown.clone(), source })?;
            let head = LineHeader::of(text).map_err(|err| invalid(e.offset, err.to_string()))?;
            if crate::log::reader::line_kind(text, Some(&["episode_finished"])).ok().flatten().is_none() {
                return Err(invalid(e.offset, "not an episode_finished event".into()));
            }
            let EpisodeFinishedRow { outcome, termination, steps, tool_calls, tool_errors, usage, cost_usd, wall_ms } =
                serde_json::from_str(text).map_err(|err| invalid(e.offset, err.to_string()))?;
            let id = head.episode_id.unwrap_or_default();
            let outcome = self.rescored.get(&id).cloned().unwrap_or(outcome);
            let name = |n: u32| self.names[n as usize].clone();
            each(EpisodeRow {
                episode_id: id.into_boxed_str(),
                suite: name(e.key.suite),
                task_id: name(e.key.task),
                task_digest: name(e.key.digest),
                model: name(e.key.model),
                epoch: e.key.epoch,
                outcome: compact(outcome, &mut causes_seen),
                termination,
                steps,
                tool_calls,
                tool_errors,
                usage,
                cost_usd,
                model_calls: e.model_calls,
                largest_input: e.largest_input,
                latency_ms: e.latency_ms,
                wall_ms,
                started_us: e.started_us,
                finished_us: micros(&head.ts),
                toolset: e.toolset.map(name),
                variant: e.key.variant.map(name),
                tags: e.tags.iter().map(|&t| name(t)).collect(),
                metadata: e.metadata.iter().map(|&(k, v)| (name(k), name(v))).collect(),
            });
        }
        Ok(())
    }
}

impl Projection {
    /// Reads `events.jsonl` and holds every episode's row (about 250 bytes each).
    pub fn from_log(path: &Path) -> Result<Projection, ReadError> {
        Projection::from_index(&Index::build(path)?)
    }

    /// Every row of an index already built.
    pub fn from_index(index: &Index) -> Result<Projection, ReadError> {
        let mut p = index.meta.clone();
        p.episodes.reserve_exact(index.len());
        index.for_each_row(|row| p.episodes.push(row))?;
        Ok(p)
    }

    /// The suite as the run saw it.
    pub fn suite(&self, name: &str) -> Option<&SuiteInfo> {
        self.header.suites.iter().find(|s| s.name == name)
    }
}

/// The table keeps an unscored episode's cause, not its message (the log has it); only the
/// first row of each cause keeps its message, for the summary to show one per cause.
fn compact(outcome: Outcome, causes_seen: &mut std::collections::HashSet<super::UnscoredCause>) -> Outcome {
    match outcome {
        Outcome::Unscored { cause, message } if causes_seen.insert(cause.clone()) => {
            Outcome::Unscored { cause, message }
        }
        Outcome::Unscored { cause, .. } => Outcome::Unscored { cause, message: String::new() },
        other => other,
    }
}

/// The event types the fold decodes; of every other line it reads only the number.
const FOLDED_KINDS: [&str; 9] = [
    "run_started",
    "run_resumed",
    "episode_started",
    "model_call",
    "ingest_resumed",
    "episode_finished",
    "scoring_started",
    "episode_scored",
    "run_finished",
];

/// The strings the rows share (suites, tasks, digests, models, variants, toolsets), each
/// held once and named by its number.
#[derive(Default)]
struct Names {
    names: Vec<Arc<str>>,
    numbers: HashMap<Arc<str>, u32>,
}

impl Names {
    fn intern(&mut self, name: String) -> u32 {
        if let Some(&n) = self.numbers.get(name.as_str()) {
            return n;
        }
        let n = self.names.len() as u32;
        let name: Arc<str> = Arc::from(name);
        self.names.push(name.clone());
        self.numbers.insert(name, n);
        n
    }

    fn name(&self, n: u32) -> &str {
        &self.names[n as usize]
    }
}

/// The index while the log is read: the run's meta, the episodes started and not yet
/// finished, every finish seen, and the regrades' outcomes.
#[derive(Default)]
struct Fold {
    p: Projection,
    open: HashMap<String, Open>,
    names: Names,
    entries: Vec<Entry>,
    rescored: HashMap<String, Outcome>,
}

impl Fold {
    /// One line of the log, at `offset`.
    fn line(&mut self, kind: &str, text: &str, offset: u64) -> Result<(), String> {
        if !FOLDED_KINDS.contains(&kind) {
            let seq = match header_seq(text) {
                Some(seq) => seq,
                None => LineHeader::of(text).map_err(|e| e.to_string())?.seq,
            };
            self.p.last_seq = self.p.last_seq.max(seq);
            return Ok(());
        }
        let mut head = LineHeader::of(text).map_err(|e| e.to_string())?;
        self.p.last_seq = self.p.last_seq.max(head.seq);
        if self.p.run_id.is_empty()
            && let Some(run_id) = head.run_id.take()
        {
            self.p.run_id = run_id;
        }
        match kind {
            "episode_started" => self.episode_started(head, text),
            "model_call" => self.model_call(head, text),
            "ingest_resumed" => self.ingest_resumed(head, text),
            "episode_finished" => {
                self.episode_finished(head, offset);
                Ok(())
            }
            _ => self.run_event(head, text),
        }
    }

    /// Opens the episode under its key, its names interned.
    fn episode_started(&mut self, head: LineHeader, text: &str) -> Result<(), String> {
        let EpisodeStartedKey { suite, task_id, task_digest, model, epoch, toolset, variant, tags, metadata } =
            serde_json::from_str(text).map_err(|e| e.to_string())?;
        if let Some(id) = head.episode_id {
            let names = &mut self.names;
            let key = Key {
                suite: names.intern(suite),
                task: names.intern(task_id),
                digest: names.intern(task_digest),
                model: names.intern(model),
                epoch,
                variant: variant.map(|v| names.intern(v)),
            };
            let toolset = toolset.map(|t| names.intern(t));
            let tags = tags.into_iter().map(|t| names.intern(t)).collect();
            let metadata = metadata
                .into_iter()
                .map(|(k, v)| {
                    let text = match v {
                        serde_json::Value::String(s) => s,
                        other => other.to_string(),
                    };
                    (names.intern(k), names.intern(text))
                })
                .collect();
            let started_us = micros(&head.ts);
            let open =
                Open { key, started_us, model_calls: 0, largest_input: 0, latency_ms: 0.0, toolset, tags, metadata };
            self.open.insert(id, open);
        }
        Ok(())
    }

    /// Counts an agent's model call and its latency (a grader's or the user's are not the
    /// episode's).
    fn model_call(&mut self, head: LineHeader, text: &str) -> Result<(), String> {
        // The view, not the event: a model call's line holds its whole request and
        // response, and there are many per episode.
        let call: ModelCallTiming = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if let Some(o) = head
            .episode_id
            .and_then(|id| self.open.get_mut(&id))
            .filter(|_| call.scorer.is_none() && call.actor != crate::contract::Actor::User)
        {
            o.model_calls += 1;
            o.largest_input = o.largest_input.max(call.usage.input_tokens);
            o.latency_ms += call.latency_ms;
        }
        Ok(())
    }

    /// The model calls of a killed attempt's replay that this one goes on with.
    fn ingest_resumed(&mut self, head: LineHeader, text: &str) -> Result<(), String> {
        #[derive(serde::Deserialize)]
        struct Resumed {
            model_calls: u32,
        }
        let resumed: Resumed = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if let Some(o) = head.episode_id.and_then(|id| self.open.get_mut(&id)) {
            o.model_calls = o.model_calls.saturating_add(resumed.model_calls);
        }
        Ok(())
    }

    /// Closes the episode into an entry that points at its finish.
    fn episode_finished(&mut self, head: LineHeader, offset: u64) {
        let Some(id) = head.episode_id else { return };
        let Some(o) = self.open.remove(&id) else { return };
        // A regrade's outcome of an earlier finish does not carry over to a finish that
        // comes after it: the episode ran again.
        self.rescored.remove(&id);
        self.entries.push(Entry {
            key: o.key,
            model_calls: o.model_calls,
            largest_input: o.largest_input,
            started_us: o.started_us,
            latency_ms: o.latency_ms,
            offset,
            toolset: o.toolset,
            tags: o.tags,
            metadata: o.metadata,
        });
    }

    /// What the run as a whole says: its header, its regrades, its ends and resumptions.
    fn run_event(&mut self, head: LineHeader, text: &str) -> Result<(), String> {
        let p = &mut self.p;
        match serde_json::from_str::<Event>(text).map_err(|e| e.to_string())? {
            // The first header is the run's (a merged run's is the merge's).
            Event::RunStarted {
                runner_version,
                command_line,
                models,
                suites,
                git_revision,
                shard,
                limits,
                warnings,
                selection,
                ..
            } if p.header.suites.is_empty() => {
                p.header = RunHeader {
                    runner_version,
                    command_line,
                    models,
                    suites,
                    git_revision,
                    shard,
                    limits,
                    warnings,
                    selection,
                };
            }
            Event::ScoringStarted { scoring_id, .. } => {
                p.scoring_id = Some(scoring_id);
                p.scorings += 1;
            }
            Event::EpisodeScored { outcome, .. } => {
                if let Some(id) = head.episode_id {
                    self.rescored.insert(id, outcome);
                }
            }
            Event::RunFinished { interrupted, wall_ms, .. } => {
                p.interrupted = interrupted;
                p.finished = true;
                p.wall_ms += wall_ms;
            }
            Event::RunResumed { .. } => p.finished = false,
            _ => {}
        }
        Ok(())
    }
}

/// Sorts the finishes in table order and keeps each episode's latest: sorted, an
/// episode's finishes sit together, the latest first.
fn keep_latest_finishes(entries: &mut Vec<Entry>, names: &Names) {
    let name = |n: u32| names.name(n);
    entries.sort_unstable_by(|a, b| {
        let (x, y) = (&a.key, &b.key);
        let variant = |k: &Key| k.variant.map(name);
        (name(x.suite), name(x.task), name(x.model), variant(x), x.epoch, name(x.digest), std::cmp::Reverse(a.offset))
            .cmp(&(
                name(y.suite),
                name(y.task),
                name(y.model),
                variant(y),
                y.epoch,
                name(y.digest),
                std::cmp::Reverse(b.offset),
            ))
    });
    entries.dedup_by(|later, first| later.key == first.key);
    entries.shrink_to_fit();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::UnscoredCause;
    use crate::log::writer::write_line;

    fn line(out: &mut Vec<u8>, seq: u64, episode_id: Option<&str>, event: &Event) {
        let body = serde_json::to_vec(event).unwrap();
        write_line(out, "\"r\"", seq, "2026-01-01T00:00:00Z", episode_id, &body).unwrap();
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

    fn finished(outcome: Outcome) -> Event {
        Event::EpisodeFinished {
            outcome,
            termination: Termination::FinalAnswer,
            steps: 2,
            tool_calls: 1,
            tool_errors: 0,
            usage: Usage::default(),
            cost_usd: None,
            wall_ms: 5.0,
            loop_ms: None,
            user_usage: None,
            user_cost_usd: None,
            agent_program: None,
        }
    }

    /// Two episodes, the second regraded: what the fold reads rows and the asked events from.
    fn log() -> tempfile::NamedTempFile {
        let mut out = Vec::new();
        line(&mut out, 1, Some("e2"), &started("b"));
        line(&mut out, 2, Some("e2"), &Event::Final { step: 1, call_id: "c".into(), answer: "42".into() });
        line(&mut out, 3, Some("e2"), &finished(Outcome::Scored { score: 1.0, passed: true }));
        line(&mut out, 4, Some("e1"), &started("a"));
        let gone = Outcome::Unscored { cause: UnscoredCause::ProviderError, message: "down".into() };
        line(&mut out, 5, Some("e1"), &finished(gone));
        let scoring = Event::ScoringStarted {
            scoring_id: "regrade-1".into(),
            command_line: Vec::new(),
            grader: None,
            suites: Vec::new(),
        };
        line(&mut out, 6, None, &scoring);
        let failed = Outcome::Scored { score: 0.0, passed: false };
        line(&mut out, 7, Some("e2"), &Event::EpisodeScored { scoring_id: "regrade-1".into(), outcome: failed });
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), out).unwrap();
        file
    }

    #[test]
    fn rows_come_sorted_with_their_latest_scoring() {
        let file = log();
        let p = Projection::from_log(file.path()).unwrap();
        let rows: Vec<(&str, &str, &str)> =
            p.episodes.iter().map(|r| (&*r.episode_id, &*r.task_id, r.status())).collect();
        assert_eq!(rows, [("e1", "a", "unscored"), ("e2", "b", "failed")]);
        assert_eq!(p.episodes[0].unscored_cause(), Some("provider_error"));
        assert_eq!((p.run_id.as_str(), p.last_seq, p.scorings), ("r", 7, 1));
        assert_eq!(p.scoring_id.as_deref(), Some("regrade-1"));
    }

    #[test]
    fn the_fold_also_gives_the_events_asked_for_with_their_episode() {
        let file = log();
        let mut seen = Vec::new();
        let index = Index::build_with(file.path(), &["final", "scoring_started"], |id, event| {
            let kind = match event {
                Event::Final { answer, .. } => answer,
                Event::ScoringStarted { scoring_id, .. } => scoring_id,
                other => panic!("not asked for: {other:?}"),
            };
            seen.push((id.map(str::to_owned), kind));
        })
        .unwrap();
        assert_eq!(seen, [(Some("e2".to_string()), "42".to_string()), (None, "regrade-1".to_string())]);
        assert_eq!(index.len(), 2, "the index is built as without them");
        assert_eq!(index.meta.scorings, 1);
    }
}
