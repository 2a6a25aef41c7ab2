//! Batch runs: suites × models × epochs into episodes, run with bounded concurrency as a
//! stream (memory stays flat in the number of episodes), every step logged.

pub mod cast;
mod digests;
mod dispatcher;
mod episode;
mod folder;
pub mod kept_notes;
pub mod merge;
mod on_demand;
pub mod regrade;
pub mod resume;
mod revision;
pub mod select;
mod shard;
pub mod since;

use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::log::event::{LimitOverrides, SuiteInfo};
use crate::log::{Outcome, Subscription, Termination};
use crate::model::Backend;
use crate::sandbox::SandboxMode;
use crate::suite::Suite;

pub use cast::Roster;
use dispatcher::Dispatcher;
pub(crate) use dispatcher::Tally;
pub use episode::{Grounds, run_episode};
use folder::open_run;
pub use folder::{Scratch, lock};
pub(crate) use folder::{StagedRun, write_run_json};
pub use on_demand::OnDemand;
pub use shard::{in_shard, parse_shard};

/// One episode to run: `(task, model, epoch)`, under one of its suite's variants when it
/// has them.
#[derive(Clone)]
pub struct EpisodeSpec {
    pub id: String,
    pub suite: Arc<Suite>,
    pub task: usize,
    pub model: Arc<Backend>,
    pub epoch: u32,
    /// An index into the suite's `variants`; `None` when the suite names none.
    pub variant: Option<usize>,
}

impl EpisodeSpec {
    /// The variant the episode runs under, when its suite has variants.
    pub fn variant(&self) -> Option<&crate::suite::variants::Variant> {
        self.variant.and_then(|i| self.suite.variants.get(i))
    }
}

/// A stable id from the suite, the task's id and content, the model and the epoch (and the
/// variant, only in a suite that has them, so that the ids of the others never change):
/// the same episode gets the same id in every run, so runs can be resumed, sharded and
/// compared.
pub fn episode_id(
    suite: &str,
    task_id: &str,
    task_digest: &str,
    model: &str,
    epoch: u32,
    variant: Option<&str>,
) -> String {
    let mut h = Sha256::new();
    for part in [suite, task_id, task_digest, model] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    h.update(epoch.to_le_bytes());
    if let Some(variant) = variant {
        h.update(b"\0variant\0");
        h.update(variant.as_bytes());
    }
    format!("ep_{}", &hex::encode(h.finalize())[..16])
}

/// Every episode of a run, generated lazily in a stable order.
pub fn episodes(
    suites: &[Arc<Suite>],
    models: &[Arc<Backend>],
    epochs: Option<u32>,
) -> impl Iterator<Item = EpisodeSpec> + Send + 'static {
    let suites = suites.to_vec();
    let models = models.to_vec();
    suites.into_iter().flat_map(move |suite| {
        let models = models.clone();
        (0..suite.tasks.len()).flat_map(move |task| {
            let suite = suite.clone();
            let epochs = task_epochs(&suite, task, epochs);
            models.clone().into_iter().flat_map(move |model| {
                let suite = suite.clone();
                // Without variants, one pass with none.
                let variants: Vec<Option<usize>> = match suite.variants.len() {
                    0 => vec![None],
                    n => (0..n).map(Some).collect(),
                };
                variants.into_iter().flat_map(move |variant| {
                    let suite = suite.clone();
                    let model = model.clone();
                    (1..=epochs).map(move |epoch| {
                        let t = &suite.tasks[task];
                        let name = variant.and_then(|v| suite.variants.get(v)).map(|v| v.name.as_str());
                        let id = episode_id(&suite.name, &t.id, &t.digest, model.name(), epoch, name);
                        EpisodeSpec { id, suite: suite.clone(), task, model: model.clone(), epoch, variant }
                    })
                })
            })
        })
    })
}

/// How many epochs a task runs: `--epochs`, else its `pass_k`'s n, else its suite's `epochs`.
pub fn task_epochs(suite: &Suite, task: usize, command_line: Option<u32>) -> u32 {
    command_line.or_else(|| suite.tasks.get(task).and_then(|t| t.pass_k).map(|p| p.n)).unwrap_or(suite.epochs)
}

/// How many episodes the run will make (its shard's, when it has one; without those a
/// resumed run keeps).
pub fn episode_count(suites: &[Arc<Suite>], options: &RunOptions) -> u64 {
    match (options.shard, &options.resume, &options.chosen, &options.since) {
        (None, None, None, None) => suites
            .iter()
            .map(|s| {
                let epochs: u64 = (0..s.tasks.len()).map(|t| u64::from(task_epochs(s, t, options.epochs))).sum();
                let variants = s.variants.len().max(1) as u64;
                epochs * options.models.len() as u64 * variants
            })
            .sum(),
        _ => episodes(suites, &options.models, options.epochs).filter(|e| options.plans(e)).count() as u64,
    }
}

/// How one episode ended, as the scheduler tallies it.
#[derive(Debug, Clone)]
pub struct EpisodeReport {
    pub id: String,
    pub suite: String,
    pub task_id: String,
    pub model: String,
    /// The variant it ran under, when its suite has variants.
    pub variant: Option<String>,
    pub epoch: u32,
    pub outcome: Outcome,
    pub termination: Termination,
    pub steps: u32,
    pub wall_ms: f64,
}

pub struct RunOptions {
    pub models: Vec<Arc<Backend>>,
    pub epochs: Option<u32>,
    pub jobs: usize,
    /// The run folder is created under this directory.
    pub out_dir: PathBuf,
    pub run_id: Option<String>,
    pub command_line: Vec<String>,
    /// The graders and the simulated users' models.
    pub roster: Arc<Roster>,
    /// `(i, n)`: run only the episodes of shard i (from 1) of n.
    pub shard: Option<(u64, u64)>,
    /// Continue this run instead of starting a new one.
    pub resume: Option<Resume>,
    /// `Off` when the command line turned the sandbox off for every suite.
    /// Whether each episode's world is kept instead of removed (`--keep-worlds`), in
    /// `$TMPDIR/runner-kept-RUN`.
    pub keep_worlds: bool,
    pub sandbox: SandboxMode,
    /// The suites' limits as the command line overrides them.
    pub limits: LimitOverrides,
    /// What a person should know about how the run is set up: printed before it starts,
    /// logged in `run_started`, repeated under the summary.
    pub warnings: Vec<String>,
    /// The command line's choice of tasks, as recorded.
    pub selection: crate::domain::selection::Selection,
    /// The tasks it chose; `None` when every task runs.
    pub chosen: Option<Arc<select::Chosen>>,
    /// The run-wide caps on cost, tokens and model calls.
    pub caps: crate::budget::RunCaps,
    /// `--epochs auto`: epochs up to `epochs` are added until the interval is narrow.
    pub auto_epochs: Option<AutoEpochs>,
    /// `--since RUN`: the episodes carried from RUN instead of run.
    pub since: Option<Arc<since::Since>>,
}

impl RunOptions {
    /// Whether this run makes the episode: of a chosen task, in its shard, and not kept
    /// from before.
    pub fn plans(&self, episode: &EpisodeSpec) -> bool {
        self.chosen.as_ref().is_none_or(|c| c.contains(episode))
            && in_shard(episode, self.shard)
            && self.resume.as_ref().is_none_or(|r| !r.keep.contains(&episode.id))
            && self.since.as_ref().is_none_or(|s| !s.carried.contains_key(&episode.id))
    }
}

/// A run to continue: its log is appended to.
pub struct Resume {
    pub dir: PathBuf,
    pub run_id: String,
    /// The last event's number in the log.
    pub last_seq: u64,
    /// The scored episodes, kept as they are.
    pub keep: std::collections::HashSet<String>,
    /// What each kept episode spent, by its model: the budget is the whole run's.
    pub spent: Vec<(String, crate::budget::Spend)>,
    /// The run folder's lock, taken before the log was read for the plan.
    pub lock: std::fs::File,
}

/// A finished (or interrupted) run.
pub struct RunResult {
    /// Set when the run stopped early because a model is misconfigured.
    pub aborted: Option<String>,
    pub run_id: String,
    pub dir: PathBuf,
    pub events_path: PathBuf,
    pub interrupted: bool,
    /// The log's last lines on their way to the disk: the log may be read meanwhile; wait
    /// for it before saying the run is done. (Before `lock`: dropped, it is waited for
    /// before the lock goes.)
    pub syncing: crate::log::writer::Syncing,
    /// The run folder's lock: keep it until the tables are written.
    pub lock: std::fs::File,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("failed to create the run folder {path}: {source}")]
    Folder { path: String, source: std::io::Error },
    #[error("{0}")]
    Locked(String),
    #[error("the run folder {0} already exists; choose another --run-id")]
    Exists(String),
    #[error("failed to write the event log: {0}")]
    Log(std::io::Error),
}

/// Runs every episode, `jobs` at a time, and logs them to `<out_dir>/<run-id>/events.jsonl`:
/// the run's folder opened (fresh or resumed), then round after round, each episode the
/// plan holds admitted by the run's caps, started, and recorded as it ends. `subscribers`
/// see every event of the episodes as it is emitted; `stop` ends the run early.
pub async fn run(
    suites: &[Arc<Suite>],
    options: &RunOptions,
    stop: CancellationToken,
    subscribers: &[Subscription],
) -> Result<RunResult, RunError> {
    let opened = open_run(suites, options)?;
    let carried = match &options.since {
        Some(since) => since::carry(since, suites, &opened.log, &options.roster.graders).await.map_err(|e| {
            RunError::Log(std::io::Error::other(format!("failed to carry episodes of {}: {e}", since.dir.display())))
        })?,
        None => Tally::default(),
    };
    let mut dispatcher = Dispatcher::new(suites, options, &opened, stop, subscribers)?;
    dispatcher.count_carried(carried);
    while let Some(round) = dispatcher.next_round() {
        let (admitter, starter) = (dispatcher.admitter(), dispatcher.starter());
        let admitted =
            futures::stream::iter(dispatcher.plan(round)).filter_map(move |spec| admitter.clone().admit(spec));
        let mut running = Box::pin(admitted.map(move |spec| starter.start(spec)).buffer_unordered(options.jobs.max(1)));
        while let Some(joined) = running.next().await {
            dispatcher.record(joined);
        }
        drop(running);
        dispatcher.end_round(round);
    }
    dispatcher.finish(opened)
}

/// `--epochs auto`: epochs are added one round at a time until each suite × model cell's
/// pass-rate interval is narrow enough. The rule itself (the interval, the alpha it spends)
/// is the caller's: `decide(epoch, passed, scored)` after each round.
#[derive(Clone)]
pub struct AutoEpochs {
    pub max_epochs: u32,
    pub ci_width: f64,
    pub decide: Arc<dyn Fn(u32, u64, u64) -> EpochLook + Send + Sync>,
}

/// What the rule says of a cell after a round.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpochLook {
    pub low: f64,
    pub high: f64,
    pub level: f64,
    /// `continue`, `stop_narrow` or `stop_max_epochs`.
    pub decision: &'static str,
    pub stop: bool,
}

pub(crate) fn suite_info(suite: &Suite) -> SuiteInfo {
    SuiteInfo {
        name: suite.name.clone(),
        path: suite.path.display().to_string(),
        digest: suite.digest.clone(),
        tasks: suite.tasks.len(),
        environment: suite.environment.name.clone(),
        epochs: suite.epochs,
        reducer: suite.reducer,
        k_of_n: suite.k_of_n,
        pass_k: suite.tasks.iter().filter_map(|t| Some((t.id.clone(), t.pass_k?))).collect(),
        pass_threshold: suite.pass_threshold,
        sandbox: None,
        variants: crate::suite::variants::names(&suite.variants),
    }
}

/// The sandbox of a suite's episodes: off when the command line or the suite says so.
pub fn sandbox_mode(suite: &Suite, command_line: SandboxMode) -> SandboxMode {
    match command_line {
        SandboxMode::Off(by) => SandboxMode::Off(by),
        SandboxMode::On => suite.sandbox,
    }
}

/// A run id given on the command line: the name of one folder under `--out`, so no path.
pub fn parse_run_id(text: &str) -> Result<String, String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if text.is_empty() || text.starts_with('.') || !text.chars().all(allowed) {
        return Err(
            "a run id names one folder under --out: letters, digits, `.`, `_` and `-`, not starting with `.`".into()
        );
    }
    Ok(text.to_owned())
}

/// `20261122T053000Z-1a2b`: sortable by time, unique enough for one machine.
pub fn new_run_id() -> String {
    let now = chrono::Utc::now();
    let mut h = Sha256::new();
    h.update(now.timestamp_nanos_opt().unwrap_or_default().to_le_bytes());
    h.update(std::process::id().to_le_bytes());
    format!("{}-{}", now.format("%Y%m%dT%H%M%SZ"), &hex::encode(h.finalize())[..4])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scratch_folder_is_made_for_the_first_world_that_makes_folders_and_removed_with_the_run() {
        use crate::environment::definition::Definition;
        use crate::environment::kinds;
        let run_dir = tempfile::tempdir().unwrap();
        let scratch = Scratch::at(run_dir.path()).unwrap();
        let kv = Definition::builtin(kinds::find("kv").unwrap());
        let shell = Definition::builtin(kinds::find("shell").unwrap());
        scratch.made_for(&kv).unwrap();
        assert!(!scratch.path().exists(), "a kv world makes no folder");
        scratch.made_for(&shell).unwrap();
        assert!(scratch.path().is_dir(), "a shell world's folder goes in it");
        scratch.made_for(&shell).unwrap();
        let path = scratch.path().to_path_buf();
        drop(scratch);
        assert!(!path.exists(), "removed with the run");
    }

    #[test]
    fn ids_of_suites_without_variants_are_as_they_were_and_a_variant_changes_the_id() {
        // Computed before variants existed: resume and compare of older runs line up.
        assert_eq!(episode_id("s", "t", "d", "mock", 1, None), "ep_77d7dbdc2f9d22c3");
        let terse = episode_id("s", "t", "d", "mock", 1, Some("terse"));
        assert_ne!(terse, episode_id("s", "t", "d", "mock", 1, None));
        assert_ne!(terse, episode_id("s", "t", "d", "mock", 1, Some("careful")));
    }

    #[test]
    fn a_run_id_names_one_folder() {
        for good in ["ci", "2026-11-25_nightly", "v1.2"] {
            assert_eq!(parse_run_id(good).as_deref(), Ok(good));
        }
        for bad in ["../x", "1/2", "a b", "", ".", "..", ".hidden", "x/"] {
            assert!(parse_run_id(bad).unwrap_err().contains("one folder under --out"), "{bad}");
        }
    }
}
