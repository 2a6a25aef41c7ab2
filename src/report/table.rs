//! The episodes table: one row per episode, projected from the event log. The summary, the
//! comparison, the HTML report and `episodes.csv`/`episodes.parquet` are all built from it.
//!
//! An episode's row is its latest finish (a resumed run finishes again the episodes it ran
//! again) under its latest scoring (a regrade appends new outcomes). Rows are sorted by
//! suite, task, model and epoch, so two runs of the same episodes give the same table
//! whatever order the episodes finished in.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use crate::log::event::SuiteInfo;
use crate::log::reader::{ReadError, for_each_line_of, header_seq, line_at};
use crate::log::{Event, Outcome, Termination, Usage};

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
    /// The sum of the episode's model call latencies.
    pub latency_ms: f64,
    pub wall_ms: f64,
    /// Microseconds since the Unix epoch, UTC.
    pub started_us: i64,
    pub finished_us: i64,
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
    /// The highest event number: where an append continues.
    pub last_seq: u64,
}

/// What a line's header says of it.
#[derive(Deserialize)]
struct Head {
    seq: u64,
    ts: String,
    #[serde(default)]
    episode_id: Option<String>,
}

#[derive(Deserialize)]
struct Started {
    suite: String,
    task_id: String,
    task_digest: String,
    model: String,
    epoch: u32,
}

#[derive(Deserialize)]
struct ModelCallLatency {
    latency_ms: f64,
    /// Set on a grader's calls, which are not the agent's.
    #[serde(default)]
    scorer: Option<String>,
}

/// The fields of `Event::EpisodeFinished` the table shows, decoded without the enum's
/// buffering: the table reads one per episode.
#[derive(Deserialize)]
struct Finished {
    outcome: Outcome,
    termination: Termination,
    steps: u32,
    tool_calls: u32,
    tool_errors: u32,
    usage: Usage,
    cost_usd: Option<f64>,
    wall_ms: f64,
}

/// An episode between its start and its finish.
struct Open {
    key: Key,
    started_us: i64,
    model_calls: u32,
    latency_ms: f64,
}

/// Suite, task id, task digest and model (indexes into the index's names), and epoch: what
/// identifies an episode (its id is made from them) and sorts the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Key {
    suite: u32,
    task: u32,
    digest: u32,
    model: u32,
    epoch: u32,
}

/// One finish of an episode: where its line is and what the lines before it said.
struct Entry {
    key: Key,
    model_calls: u32,
    started_us: i64,
    latency_ms: f64,
    offset: u64,
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
        let kinds = [
            "run_started",
            "run_resumed",
            "episode_started",
            "model_call",
            "episode_finished",
            "scoring_started",
            "episode_scored",
            "run_finished",
        ];
        let mut p = Projection::default();
        let mut open: HashMap<String, Open> = HashMap::new();
        let mut names: Vec<Arc<str>> = Vec::new();
        let mut numbers: HashMap<Arc<str>, u32> = HashMap::new();
        let mut intern = |name: String| -> u32 {
            if let Some(&n) = numbers.get(name.as_str()) {
                return n;
            }
            let n = names.len() as u32;
            let name: Arc<str> = Arc::from(name);
            names.push(name.clone());
            numbers.insert(name, n);
            n
        };
        let mut entries = Vec::new();
        let mut rescored: HashMap<String, Outcome> = HashMap::new();
        // Every line counts for the last event number (an append continues after it); only
        // these kinds are decoded.
        let torn = for_each_line_of(path, None, |kind, text, offset| {
            if !kinds.contains(&kind) {
                let seq = match header_seq(text) {
                    Some(seq) => seq,
                    None => serde_json::from_str::<Head>(text).map_err(|e| e.to_string())?.seq,
                };
                p.last_seq = p.last_seq.max(seq);
                return Ok(());
            }
            let head: Head = serde_json::from_str(text).map_err(|e| e.to_string())?;
            p.last_seq = p.last_seq.max(head.seq);
            if p.run_id.is_empty()
                && let Ok(id) = serde_json::from_str::<RunId>(text)
            {
                p.run_id = id.run_id;
            }
            match kind {
                "episode_started" => {
                    let s: Started = serde_json::from_str(text).map_err(|e| e.to_string())?;
                    if let Some(id) = head.episode_id {
                        let key = Key {
                            suite: intern(s.suite),
                            task: intern(s.task_id),
                            digest: intern(s.task_digest),
                            model: intern(s.model),
                            epoch: s.epoch,
                        };
                        open.insert(id, Open { key, started_us: micros(&head.ts), model_calls: 0, latency_ms: 0.0 });
                    }
                }
                "model_call" => {
                    let call: ModelCallLatency = serde_json::from_str(text).map_err(|e| e.to_string())?;
                    if let Some(o) = head.episode_id.and_then(|id| open.get_mut(&id)).filter(|_| call.scorer.is_none())
                    {
                        o.model_calls += 1;
                        o.latency_ms += call.latency_ms;
                    }
                }
                "episode_finished" => {
                    let Some(id) = head.episode_id else { return Ok(()) };
                    let Some(o) = open.remove(&id) else { return Ok(()) };
                    // A regrade's outcome of an earlier finish does not carry over to a
                    // finish that comes after it: the episode ran again.
                    rescored.remove(&id);
                    entries.push(Entry {
                        key: o.key,
                        model_calls: o.model_calls,
                        started_us: o.started_us,
                        latency_ms: o.latency_ms,
                        offset,
                    });
                }
                _ => match serde_json::from_str::<Event>(text).map_err(|e| e.to_string())? {
                    // The first header is the run's (a merged run's is the merge's).
                    Event::RunStarted { runner_version, command_line, models, suites, git_revision, shard, .. }
                        if p.header.suites.is_empty() =>
                    {
                        p.header = RunHeader { runner_version, command_line, models, suites, git_revision, shard };
                    }
                    Event::ScoringStarted { scoring_id, .. } => p.scoring_id = Some(scoring_id),
                    Event::EpisodeScored { outcome, .. } => {
                        if let Some(id) = head.episode_id {
                            rescored.insert(id, outcome);
                        }
                    }
                    Event::RunFinished { interrupted, wall_ms, .. } => {
                        p.interrupted = interrupted;
                        p.finished = true;
                        p.wall_ms += wall_ms;
                    }
                    Event::RunResumed { .. } => p.finished = false,
                    _ => {}
                },
            }
            Ok(())
        })?;
        p.unfinished = open.len() as u64;
        p.torn_last_line = torn;
        let name = |n: u32| -> &str { &names[n as usize] };
        // Sorted, an episode's finishes sit together, the latest first: keep that one.
        entries.sort_unstable_by(|a, b| {
            let (x, y) = (&a.key, &b.key);
            (name(x.suite), name(x.task), name(x.model), x.epoch, name(x.digest), std::cmp::Reverse(a.offset)).cmp(&(
                name(y.suite),
                name(y.task),
                name(y.model),
                y.epoch,
                name(y.digest),
                std::cmp::Reverse(b.offset),
            ))
        });
        entries.dedup_by(|later, first| later.key == first.key);
        entries.shrink_to_fit();
        Ok(Index { path: path.to_path_buf(), meta: p, names, entries, rescored })
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
        for e in &self.entries {
            let text =
                line_at(&file, e.offset, &mut buf).map_err(|source| ReadError::Io { path: shown.clone(), source })?;
            let head: Head = serde_json::from_str(text).map_err(|err| invalid(e.offset, err.to_string()))?;
            let f: Finished = serde_json::from_str(text).map_err(|err| invalid(e.offset, err.to_string()))?;
            let id = head.episode_id.unwrap_or_default();
            let outcome = self.rescored.get(&id).cloned().unwrap_or(f.outcome);
            let name = |n: u32| self.names[n as usize].clone();
            each(EpisodeRow {
                episode_id: id.into_boxed_str(),
                suite: name(e.key.suite),
                task_id: name(e.key.task),
                task_digest: name(e.key.digest),
                model: name(e.key.model),
                epoch: e.key.epoch,
                outcome: compact(outcome),
                termination: f.termination,
                steps: f.steps,
                tool_calls: f.tool_calls,
                tool_errors: f.tool_errors,
                usage: f.usage,
                cost_usd: f.cost_usd,
                model_calls: e.model_calls,
                latency_ms: e.latency_ms,
                wall_ms: f.wall_ms,
                started_us: e.started_us,
                finished_us: micros(&head.ts),
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

/// The table keeps an unscored episode's cause, not its message (the log has it).
fn compact(outcome: Outcome) -> Outcome {
    match outcome {
        Outcome::Unscored { cause, .. } => Outcome::Unscored { cause, message: String::new() },
        other => other,
    }
}

#[derive(Deserialize)]
struct RunId {
    run_id: String,
}

/// The columns of `episodes.csv` and `episodes.parquet`, in order.
pub const COLUMNS: [&str; 25] = [
    "episode_id",
    "suite",
    "task_id",
    "task_digest",
    "model",
    "epoch",
    "outcome",
    "unscored_cause",
    "passed",
    "score",
    "steps",
    "tool_calls",
    "tool_errors",
    "model_calls",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "tokens",
    "cost_usd",
    "latency_ms",
    "wall_ms",
    "termination",
    "started_at",
    "finished_at",
    "run_id",
];

/// Rows per batch written: the table is never held whole as a data frame.
const BATCH: usize = 4096;

/// One batch of rows as a polars data frame with [`COLUMNS`].
pub fn frame(run_id: &str, rows: &[EpisodeRow]) -> polars::prelude::PolarsResult<polars::prelude::DataFrame> {
    use polars::prelude::{Column, DataFrame};
    let strs = |f: &dyn Fn(&EpisodeRow) -> &str| rows.iter().map(f).collect::<Vec<&str>>();
    let u32s = |f: &dyn Fn(&EpisodeRow) -> u32| rows.iter().map(f).collect::<Vec<u32>>();
    let u64s = |f: &dyn Fn(&EpisodeRow) -> u64| rows.iter().map(f).collect::<Vec<u64>>();
    let f64s = |f: &dyn Fn(&EpisodeRow) -> f64| rows.iter().map(f).collect::<Vec<f64>>();
    let columns = vec![
        Column::new(COLUMNS[0].into(), strs(&|r| &r.episode_id)),
        Column::new(COLUMNS[1].into(), strs(&|r| &r.suite)),
        Column::new(COLUMNS[2].into(), strs(&|r| &r.task_id)),
        Column::new(COLUMNS[3].into(), strs(&|r| &r.task_digest)),
        Column::new(COLUMNS[4].into(), strs(&|r| &r.model)),
        Column::new(COLUMNS[5].into(), u32s(&|r| r.epoch)),
        Column::new(COLUMNS[6].into(), strs(&|r| r.status())),
        Column::new(COLUMNS[7].into(), rows.iter().map(EpisodeRow::unscored_cause).collect::<Vec<_>>()),
        Column::new(COLUMNS[8].into(), rows.iter().map(EpisodeRow::passed).collect::<Vec<_>>()),
        Column::new(COLUMNS[9].into(), rows.iter().map(EpisodeRow::score).collect::<Vec<_>>()),
        Column::new(COLUMNS[10].into(), u32s(&|r| r.steps)),
        Column::new(COLUMNS[11].into(), u32s(&|r| r.tool_calls)),
        Column::new(COLUMNS[12].into(), u32s(&|r| r.tool_errors)),
        Column::new(COLUMNS[13].into(), u32s(&|r| r.model_calls)),
        Column::new(COLUMNS[14].into(), u64s(&|r| r.usage.input_tokens)),
        Column::new(COLUMNS[15].into(), u64s(&|r| r.usage.output_tokens)),
        Column::new(COLUMNS[16].into(), u64s(&|r| r.usage.cached_tokens)),
        Column::new(COLUMNS[17].into(), u64s(&|r| r.usage.total())),
        Column::new(COLUMNS[18].into(), rows.iter().map(|r| r.cost_usd).collect::<Vec<_>>()),
        Column::new(COLUMNS[19].into(), f64s(&|r| r.latency_ms)),
        Column::new(COLUMNS[20].into(), f64s(&|r| r.wall_ms)),
        Column::new(COLUMNS[21].into(), strs(&|r| r.termination.as_str())),
        Column::new(COLUMNS[22].into(), rows.iter().map(EpisodeRow::started_at).collect::<Vec<_>>()),
        Column::new(COLUMNS[23].into(), rows.iter().map(EpisodeRow::finished_at).collect::<Vec<_>>()),
        Column::new(COLUMNS[24].into(), vec![run_id; rows.len()]),
    ];
    DataFrame::new(rows.len(), columns)
}

/// Writes `episodes.csv` and `episodes.parquet` into `dir`, batch by batch, and gives each
/// row to `each` as it goes. Each file is written beside its final name and renamed into
/// place, so a reader never sees half a table.
pub fn write_tables(index: &Index, dir: &Path, mut each: impl FnMut(&EpisodeRow)) -> Result<(), String> {
    use polars::prelude::{CsvWriter, ParquetWriter, SerWriter};
    let fail = |what: &Path, e: &dyn std::fmt::Display| format!("failed to write {}: {e}", what.display());
    let run_id = &index.meta.run_id;
    let csv_path = dir.join("episodes.csv");
    let parquet_path = dir.join("episodes.parquet");
    // Temporary files of their own: a `runner report` of a live run writes the tables too.
    let csv_tmp = super::temporary_beside(&csv_path).map_err(|e| fail(&csv_path, &e))?;
    let parquet_tmp = super::temporary_beside(&parquet_path).map_err(|e| fail(&parquet_path, &e))?;
    let empty = frame(run_id, &[]).map_err(|e| fail(&csv_path, &e))?;
    let schema = empty.schema().as_ref().clone();
    let csv_file = csv_tmp.reopen().map_err(|e| fail(&csv_path, &e))?;
    let parquet_file = parquet_tmp.reopen().map_err(|e| fail(&parquet_path, &e))?;
    let mut csv = CsvWriter::new(csv_file).batched(&schema).map_err(|e| fail(&csv_path, &e))?;
    let mut parquet =
        ParquetWriter::new(parquet_file).set_parallel(false).batched(&schema).map_err(|e| fail(&parquet_path, &e))?;
    if index.is_empty() {
        // No episodes: the files still have the header and schema.
        csv.write_batch(&empty).map_err(|e| fail(&csv_path, &e))?;
        parquet.write_batch(&empty).map_err(|e| fail(&parquet_path, &e))?;
    }
    let mut batch: Vec<EpisodeRow> = Vec::with_capacity(BATCH.min(index.len()));
    let mut failure = None;
    let mut flush = |batch: &mut Vec<EpisodeRow>| {
        if batch.is_empty() || failure.is_some() {
            return;
        }
        let written = frame(run_id, batch).and_then(|df| {
            csv.write_batch(&df)?;
            parquet.write_batch(&df)
        });
        if let Err(e) = written {
            failure = Some(fail(&csv_path, &e));
        }
        batch.clear();
    };
    index
        .for_each_row(|row| {
            each(&row);
            batch.push(row);
            if batch.len() == BATCH {
                flush(&mut batch);
            }
        })
        .map_err(|e| e.to_string())?;
    flush(&mut batch);
    if let Some(e) = failure {
        return Err(e);
    }
    csv.finish().map_err(|e| fail(&csv_path, &e))?;
    drop(csv);
    parquet.finish().map_err(|e| fail(&parquet_path, &e))?;
    drop(parquet);
    csv_tmp.persist(&csv_path).map_err(|e| fail(&csv_path, &e.error))?;
    parquet_tmp.persist(&parquet_path).map_err(|e| fail(&parquet_path, &e.error))?;
    Ok(())
}
