//! Batch runs: suites × models × epochs into episodes, run with bounded concurrency as a
//! stream (memory stays flat in the number of episodes), every step logged.

pub mod cast;
mod episode;
pub mod memory;
pub mod merge;
pub mod regrade;
pub mod resume;
mod revision;
pub mod select;
mod shard;

use crate::sandbox::SandboxMode;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::os::unix::fs::DirBuilderExt as _;

use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::log::event::{LimitOverrides, SuiteInfo};
use crate::log::{Event, EventLog, Outcome, Subscription, Termination, UnscoredCause};
use crate::model::Backend;
use crate::suite::Suite;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

pub use cast::Roster;
pub use episode::{Grounds, run_episode};
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
    match (options.shard, &options.resume, &options.chosen) {
        (None, None, None) => suites
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
}

impl RunOptions {
    /// Whether this run makes the episode: of a chosen task, in its shard, and not kept
    /// from before.
    pub fn plans(&self, episode: &EpisodeSpec) -> bool {
        self.chosen.as_ref().is_none_or(|c| c.contains(episode))
            && in_shard(episode, self.shard)
            && self.resume.as_ref().is_none_or(|r| !r.keep.contains(&episode.id))
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

/// Runs every episode, `jobs` at a time, and logs them to `<out_dir>/<run-id>/events.jsonl`.
/// `subscribers` see every event of the episodes as it is emitted; `stop` ends the run early.
pub async fn run(
    suites: &[Arc<Suite>],
    options: &RunOptions,
    stop: CancellationToken,
    subscribers: &[Subscription],
) -> Result<RunResult, RunError> {
    let total = episode_count(suites, options);
    let (run_id, dir, events_path, log, writer, lock) = match &options.resume {
        Some(resume) => {
            // The lock was taken before the plan was made from the log.
            let held = resume.lock.try_clone().map_err(RunError::Log)?;
            let events_path = resume.dir.join("events.jsonl");
            let (log, writer) =
                EventLog::append(&events_path, &resume.run_id, resume.last_seq).map_err(RunError::Log)?;
            log.emit(
                None,
                &Event::RunResumed {
                    runner_version: env!("CARGO_PKG_VERSION").into(),
                    command_line: options.command_line.clone(),
                    episodes: total,
                    kept: resume.keep.len() as u64,
                },
            );
            (resume.run_id.clone(), resume.dir.clone(), events_path, log, writer, held)
        }
        None => {
            let run_id = options.run_id.clone().unwrap_or_else(new_run_id);
            let staged = StagedRun::new(&options.out_dir, &run_id)?;
            let held = lock(staged.path()).map_err(RunError::Locked)?;
            let started_event = Event::RunStarted {
                runner_version: env!("CARGO_PKG_VERSION").into(),
                command_line: options.command_line.clone(),
                models: options.models.iter().map(|m| m.name().to_owned()).collect(),
                suites: suites
                    .iter()
                    .map(|s| SuiteInfo {
                        epochs: options.epochs.unwrap_or(s.epochs),
                        sandbox: s.environment.sandbox_check(sandbox_mode(s, options.sandbox)).ok().flatten(),
                        ..suite_info(s)
                    })
                    .collect(),
                episodes: total,
                jobs: options.jobs,
                git_revision: revision::git_revision(suites.first().map(|s| s.path.as_path())),
                shard: options.shard.map(|(i, n)| format!("{i}/{n}")),
                merged_from: Vec::new(),
                limits: options.limits,
                warnings: options.warnings.clone(),
                selection: options.selection.clone(),
            };
            // The folder appears with its first event in place, or not at all: a kill at any
            // moment leaves a run that resumes, or none.
            write_run_json(staged.path(), &run_id, &started_event).map_err(RunError::Log)?;
            let first = std::fs::File::create_new(staged.path().join("events.jsonl")).map_err(RunError::Log)?;
            let mut line = Vec::new();
            crate::log::writer::write_event(&mut line, &run_id, 1, &started_event).map_err(RunError::Log)?;
            std::io::Write::write_all(&mut &first, &line).map_err(RunError::Log)?;
            first.sync_data().map_err(RunError::Log)?;
            let dir = staged.publish()?;
            let events_path = dir.join("events.jsonl");
            let (log, writer) = EventLog::append(&events_path, &run_id, 1).map_err(RunError::Log)?;
            (run_id, dir, events_path, log, writer, held)
        }
    };
    // The episodes' own stop: the run's, or a hard budget's.
    let episodes_stop = stop.child_token();
    let meter = Arc::new(Mutex::new(crate::budget::RunMeter::new(options.caps.clone(), episodes_stop.clone())));
    let mut subscribers = subscribers.to_vec();
    if !options.caps.is_none() {
        let mut kept = meter.lock().unwrap_or_else(PoisonError::into_inner);
        for (model, spend) in options.resume.iter().flat_map(|r| &r.spent) {
            kept.kept(model, *spend);
        }
        subscribers.push(Subscription::new(meter.clone(), crate::budget::RunMeter::wants));
    }
    let log = log.with_subscribers(&subscribers);
    let started = std::time::Instant::now();
    let scratch = Arc::new(Scratch::at(&dir).map_err(RunError::Log)?);
    // Made now when some world will need it: a failure stops the run, not each episode.
    if let Some(definition) = suites.iter().find_map(|s| world_making_folders(s)) {
        scratch.made_for(definition).map_err(|e| RunError::Log(std::io::Error::other(e)))?;
    }
    let grounds = Arc::new(Grounds { scratch: scratch.clone(), run_dir: dir.to_path_buf(), sandbox: options.sandbox });

    let mut tally = Tally::default();
    let mut aborted = None;
    let not_run = Arc::new(AtomicU64::new(0));
    // One round of every epoch; with `--epochs auto`, one round per epoch, each of the
    // suite × model (× variant) cells that have not stopped.
    let rounds: Vec<Option<u32>> = match &options.auto_epochs {
        None => vec![None],
        Some(auto) => (1..=auto.max_epochs).map(Some).collect(),
    };
    let mut active: Option<HashSet<AutoCell>> = None;
    let mut cells: HashMap<AutoCell, (u64, u64)> = HashMap::new();
    let mut task_memory = memory::TaskMemory::new(&dir);
    for round in rounds {
        let not_stopped = stop.clone();
        let budgeted = !options.caps.is_none();
        // Asked as each episode is taken from the plan; under a soft cap it waits (the
        // stream pauses, episodes in flight go on) until what one episode spends is known.
        let admit = |spec: EpisodeSpec| {
            let (meter, log, not_run) = (meter.clone(), log.clone(), not_run.clone());
            async move {
                if !budgeted {
                    return Some(spec);
                }
                loop {
                    let (admission, reached) = {
                        let mut held = meter.lock().unwrap_or_else(PoisonError::into_inner);
                        (held.admission(&spec.id, spec.model.name()), held.take_reached())
                    };
                    for event in &reached {
                        log.emit(None, event);
                    }
                    match admission {
                        crate::budget::Admission::Start => return Some(spec),
                        crate::budget::Admission::Wait => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
                        crate::budget::Admission::Refuse(why) => {
                            log_not_run(&log, &spec, &why);
                            not_run.fetch_add(1, Ordering::Relaxed);
                            return None;
                        }
                    }
                }
            }
        };
        let in_round = |e: &EpisodeSpec| {
            round.is_none_or(|r| e.epoch == r) && active.as_ref().is_none_or(|a| a.contains(&auto_cell(e)))
        };
        let plan = episodes(suites, &options.models, options.epochs)
            .filter(in_round)
            .filter(|e| options.plans(e))
            .take_while(move |_| !not_stopped.is_cancelled());
        let mut running = Box::pin(
            futures::stream::iter(plan)
                .filter_map(admit)
                .map(|spec| {
                    // Taken here, in plan order: a task's epochs share its memory one after another.
                    let memory = task_memory.slot(&spec);
                    let log = log.clone();
                    let stop = episodes_stop.clone();
                    let roster = options.roster.clone();
                    let grounds = grounds.clone();
                    tokio::spawn(async move { run_episode(spec, memory, &log, &roster, &grounds, &stop).await })
                })
                .buffer_unordered(options.jobs.max(1)),
        );
        while let Some(joined) = running.next().await {
            match joined {
                Ok(report) => {
                    tally.add(&report.outcome);
                    if let Outcome::Scored { passed, .. } = report.outcome {
                        let key = (report.suite.clone(), report.model.clone(), report.variant.clone());
                        let cell = cells.entry(key).or_default();
                        cell.0 += 1;
                        cell.1 += u64::from(passed);
                    }
                    // A misconfigured model (bad key, unknown model) would fail every
                    // episode the same way: stop instead of burning through them.
                    if aborted.is_none()
                        && let Some(reason) = options.models.iter().find_map(|m| m.broken())
                    {
                        aborted = Some(reason);
                        stop.cancel();
                    }
                }
                // An episode task panicked: a bug in runner, not the agent's doing.
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => tally.cancelled += 1,
            }
        }
        drop(running);
        let (Some(epoch), Some(auto)) = (round, &options.auto_epochs) else { continue };
        // A budget that kept episodes of this epoch from starting leaves the interval
        // without the data it needs: no later epoch is planned (a resume runs the rest).
        if stop.is_cancelled() || episodes_stop.is_cancelled() || not_run.load(Ordering::Relaxed) > 0 {
            break;
        }
        let still: HashSet<AutoCell> = auto_cells(suites, &options.models, active.as_ref())
            .into_iter()
            .filter(|cell| {
                let (scored, passed) = cells.get(cell).copied().unwrap_or_default();
                let (suite, model, variant) = cell;
                let look = (auto.decide)(epoch, passed, scored);
                log.emit(
                    None,
                    &Event::EpochsDecided {
                        suite: suite.clone(),
                        model: model.clone(),
                        variant: variant.clone(),
                        epoch,
                        scored,
                        passed,
                        low: look.low,
                        high: look.high,
                        level: look.level,
                        ci_width: auto.ci_width,
                        decision: look.decision.to_owned(),
                    },
                );
                !look.stop
            })
            .collect();
        if still.is_empty() {
            break;
        }
        active = Some(still);
    }

    // The scratch folder goes with its last holder: the episodes have all ended.
    drop((grounds, scratch));
    for event in meter.lock().unwrap_or_else(PoisonError::into_inner).take_reached() {
        log.emit(None, &event);
    }
    let not_run = not_run.load(Ordering::Relaxed);
    tally.episodes += not_run;
    tally.unscored += not_run;
    let interrupted = stop.is_cancelled() && aborted.is_none();
    log.emit(None, &tally.finished(interrupted, started.elapsed().as_secs_f64() * 1e3));
    drop(log);
    let syncing = writer.close_written().map_err(RunError::Log)?;
    Ok(RunResult { aborted, run_id, dir, events_path, interrupted, syncing, lock })
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

/// A cell of `--epochs auto`: suite × model (× variant, in a suite that has them).
type AutoCell = (String, String, Option<String>);

fn auto_cell(e: &EpisodeSpec) -> AutoCell {
    (e.suite.name.clone(), e.model.name().to_owned(), e.variant().map(|v| v.name.clone()))
}

/// The cells of a run still adding epochs (all of them before the first look).
fn auto_cells(suites: &[Arc<Suite>], models: &[Arc<Backend>], active: Option<&HashSet<AutoCell>>) -> Vec<AutoCell> {
    let mut all = Vec::new();
    for suite in suites {
        let variants: Vec<Option<String>> = match suite.variants.is_empty() {
            true => vec![None],
            false => suite.variants.iter().map(|v| Some(v.name.clone())).collect(),
        };
        for model in models {
            for variant in &variants {
                all.push((suite.name.clone(), model.name().to_owned(), variant.clone()));
            }
        }
    }
    all.retain(|cell| active.is_none_or(|a| a.contains(cell)));
    all
}

/// Logs an episode the budget kept from starting: started and finished at once, unscored
/// with cause `budget`, so that tables count it as planned and `--resume` runs it.
fn log_not_run(log: &EventLog, spec: &EpisodeSpec, why: &str) {
    let task = &spec.suite.tasks[spec.task];
    let recorder = log.recorder(&spec.id);
    recorder.emit(&Event::EpisodeStarted {
        suite: spec.suite.name.clone(),
        task_id: task.id.clone(),
        task_digest: task.digest.clone(),
        model: spec.model.name().to_owned(),
        epoch: spec.epoch,
        environment: spec.suite.environment.name.clone(),
        toolset: spec.suite.toolset_for(&spec.id).map(|t| t.name.clone()),
        variant: spec.variant().map(|v| v.name.clone()),
        sampling: spec.variant().map_or(&spec.suite.agent.sampling, |v| &v.agent.sampling).clone(),
    });
    recorder.emit(&Event::EpisodeFinished {
        outcome: Outcome::Unscored { cause: UnscoredCause::Budget, message: format!("not run: {why}") },
        termination: Termination::NotRun,
        steps: 0,
        tool_calls: 0,
        tool_errors: 0,
        usage: Default::default(),
        cost_usd: Some(0.0),
        wall_ms: 0.0,
        loop_ms: None,
        user_usage: None,
        user_cost_usd: None,
        agent_program: None,
    });
}

/// Takes the run folder's lock, held while the returned file is open: one process at a
/// time appends to a run's log (a run, its resumption, a regrade).
pub fn lock(dir: &Path) -> Result<std::fs::File, String> {
    use std::os::fd::AsRawFd as _;
    let path = dir.join(".lock");
    let file = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("failed to open {}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor we own; it is released when the file closes.
    let taken = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if taken != 0 {
        return Err(format!("another runner is writing to {} (its .lock is held); wait for it to end", dir.display()));
    }
    Ok(file)
}

/// The first of the worlds a suite's episodes can have (its own, its toolsets', its
/// variants') that makes folders in the scratch folder.
fn world_making_folders(suite: &Suite) -> Option<&Arc<crate::environment::definition::Definition>> {
    let variants = suite.variants.iter().filter_map(|v| v.environment.as_ref());
    std::iter::once(&suite.environment)
        .chain(suite.toolsets.iter().map(|t| &t.environment))
        .chain(variants)
        .find(|d| d.makes_folders())
}

/// The run's scratch folder, where episodes make their working directories:
/// `$TMPDIR/runner-<run id>-<hash of the run folder>`, made when the first world that makes
/// folders is set up (a run of in-memory worlds makes none). A run killed outright leaves it
/// behind; its resumption, which holds the run's lock, removes it before starting. Removed
/// when dropped.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
    /// Whether it was made, or why it could not be.
    made: std::sync::OnceLock<Result<(), String>>,
}

impl Scratch {
    pub fn at(run_dir: &Path) -> std::io::Result<Scratch> {
        let canonical = run_dir.canonicalize()?;
        let name = canonical.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let name: String =
            name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
        let hash = hex::encode(Sha256::digest(canonical.as_os_str().as_encoded_bytes()));
        let path = std::env::temp_dir().join(format!("runner-{name}-{}", &hash[..12]));
        match crate::environment::remove_tree(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(std::io::Error::other(format!(
                    "failed to remove the scratch folder of an earlier run {}: {e}",
                    path.display()
                )));
            }
        }
        Ok(Scratch { path, made: std::sync::OnceLock::new() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes the folder, once, when a world of `definition` makes folders in it.
    pub fn made_for(&self, definition: &crate::environment::definition::Definition) -> Result<(), String> {
        if !definition.makes_folders() {
            return Ok(());
        }
        let made = self.made.get_or_init(|| {
            // Its name can be guessed: a folder someone else made there meanwhile is
            // refused, not used, and ours is private.
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&self.path)
                .map_err(|e| format!("failed to create the scratch folder {}: {e}", self.path.display()))
        });
        made.clone()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.made.get().is_some_and(Result::is_ok) {
            let _ = crate::environment::remove_tree(&self.path);
        }
    }
}

/// A run folder being filled under a hidden name beside its final one
/// (`<out_dir>/.<run-id>.XXXXXX`), removed if dropped; [`StagedRun::publish`] renames it to
/// `<out_dir>/<run-id>` in one step, so that a run folder never exists half made.
pub(crate) struct StagedRun {
    staged: tempfile::TempDir,
    dir: PathBuf,
}

impl StagedRun {
    /// Refuses a run id whose folder exists.
    pub(crate) fn new(out_dir: &Path, run_id: &str) -> Result<StagedRun, RunError> {
        let dir = out_dir.join(run_id);
        if dir.exists() {
            return Err(RunError::Exists(dir.display().to_string()));
        }
        let folder = |source| RunError::Folder { path: dir.display().to_string(), source };
        std::fs::create_dir_all(out_dir).map_err(folder)?;
        // The mode a plain folder gets (0777 less the umask), not a temporary one's 0700:
        // others (a merge job, a web server) may read runs.
        let staged = tempfile::Builder::new()
            .prefix(&format!(".{run_id}."))
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .tempdir_in(out_dir)
            .map_err(folder)?;
        Ok(StagedRun { staged, dir })
    }

    pub(crate) fn path(&self) -> &Path {
        self.staged.path()
    }

    /// Renames the folder to its final name; refuses to replace one made meanwhile.
    pub(crate) fn publish(self) -> Result<PathBuf, RunError> {
        let StagedRun { staged, dir } = self;
        let folder = |source| RunError::Folder { path: dir.display().to_string(), source };
        rename_no_replace(staged.path(), &dir).map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::DirectoryNotEmpty => {
                RunError::Exists(dir.display().to_string())
            }
            _ => folder(e),
        })?;
        // Renamed: nothing is left at the staged path to remove.
        let _ = staged.keep();
        Ok(dir)
    }
}

/// `rename(2)` that fails when `to` exists (a plain rename would replace an empty folder).
fn rename_no_replace(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(|_| std::io::Error::other("a NUL byte in a path"))
    };
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: two NUL-terminated paths that outlive the call.
    let done =
        unsafe { libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::RENAME_NOREPLACE) };
    if done == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// run.json: the resolved configuration, for people and tools that do not read logs.
pub(crate) fn write_run_json(dir: &Path, run_id: &str, started: &Event) -> std::io::Result<()> {
    let mut run_json = serde_json::to_value(started).unwrap_or_default();
    if let Some(obj) = run_json.as_object_mut() {
        obj.remove("type");
        obj.insert("run_id".into(), serde_json::Value::String(run_id.into()));
        obj.insert("started_at".into(), serde_json::Value::String(chrono::Utc::now().to_rfc3339()));
    }
    let bytes = serde_json::to_vec_pretty(&run_json).unwrap_or_default();
    std::fs::write(dir.join("run.json"), crate::log::secrets::scrub_bytes(&bytes))
}

#[derive(Default)]
struct Tally {
    episodes: u64,
    scored: u64,
    passed: u64,
    unscored: u64,
    cancelled: u64,
}

impl Tally {
    fn add(&mut self, outcome: &Outcome) {
        self.episodes += 1;
        match outcome {
            Outcome::Scored { passed, .. } => {
                self.scored += 1;
                self.passed += u64::from(*passed);
            }
            Outcome::Unscored { .. } => self.unscored += 1,
            Outcome::Cancelled => self.cancelled += 1,
        }
    }

    /// The `run_finished` event of these episodes.
    fn finished(&self, interrupted: bool, wall_ms: f64) -> Event {
        Event::RunFinished {
            episodes: self.episodes,
            scored: self.scored,
            passed: self.passed,
            unscored: self.unscored,
            cancelled: self.cancelled,
            interrupted,
            wall_ms,
        }
    }
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
