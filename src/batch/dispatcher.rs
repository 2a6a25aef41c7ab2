//! The run's dispatcher: it owns what the run knows as it goes (the tally, the cells of
//! `--epochs auto`, the rounds left, the run's meter) and answers the run's questions —
//! which round is next, which episodes it plans, whether an episode may start, what a
//! finished one changes — so that `batch::run` reads as the loop it is.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::task::JoinError;
use tokio_util::sync::CancellationToken;

use super::folder::{OpenRun, Scratch, world_making_folders};
use super::kept_notes::KeptNotes;
use super::{EpisodeReport, EpisodeSpec, Grounds, RunError, RunOptions, RunResult, episodes, run_episode};
use crate::budget::{Admission, RunMeter};
use crate::log::{Event, EventLog, Outcome, Subscription, Termination, UnscoredCause};
use crate::model::Backend;
use crate::suite::Suite;

/// A cell of `--epochs auto`: suite × model (× variant, in a suite that has them).
type AutoCell = (String, String, Option<String>);

/// A round of the run: every epoch at once, or (`--epochs auto`) one epoch.
pub(super) type Round = Option<u32>;

/// The run's state as it goes, and the parts every episode it starts shares.
pub(super) struct Dispatcher<'a> {
    suites: &'a [Arc<Suite>],
    options: &'a RunOptions,
    log: EventLog,
    /// The run's stop (Ctrl-C, or a misconfigured model); the episodes' own is its child,
    /// which a hard budget cancels too.
    stop: CancellationToken,
    episodes_stop: CancellationToken,
    admitter: Arc<Admitter>,
    starter: Arc<Starter>,
    tally: Tally,
    /// Per `--epochs auto` cell, its scored and passed episodes so far.
    cells: HashMap<AutoCell, (u64, u64)>,
    /// The cells still adding epochs; all of them before the first look.
    active: Option<HashSet<AutoCell>>,
    rounds: std::vec::IntoIter<Round>,
    /// Set when the run stopped early because a model is misconfigured.
    aborted: Option<String>,
    started: Instant,
}

impl<'a> Dispatcher<'a> {
    /// The dispatcher of a run whose folder is open: the run's meter subscribed to its log
    /// (when it has caps), the scratch folder made when some world will need it (a failure
    /// stops the run, not each episode).
    pub(super) fn new(
        suites: &'a [Arc<Suite>],
        options: &'a RunOptions,
        opened: &OpenRun,
        stop: CancellationToken,
        subscribers: &[Subscription],
    ) -> Result<Self, RunError> {
        let episodes_stop = stop.child_token();
        let meter = Arc::new(Mutex::new(RunMeter::new(options.caps.clone(), episodes_stop.clone())));
        let mut subscribers = subscribers.to_vec();
        let budgeted = !options.caps.is_none();
        if budgeted {
            let mut kept = meter.lock().unwrap_or_else(PoisonError::into_inner);
            for (model, spend) in options.resume.iter().flat_map(|r| &r.spent) {
                kept.kept(model, *spend);
            }
            subscribers.push(Subscription::new(meter.clone(), RunMeter::wants));
        }
        let log = opened.log.clone().with_subscribers(&subscribers);
        let scratch = Arc::new(Scratch::at(&opened.dir).map_err(RunError::Log)?);
        if let Some(definition) = suites.iter().find_map(|s| world_making_folders(s)) {
            scratch.made_for(definition).map_err(|e| RunError::Log(std::io::Error::other(e)))?;
        }
        let grounds = Arc::new(Grounds {
            scratch,
            run_dir: opened.dir.clone(),
            sandbox: options.sandbox,
            keep_worlds: options.keep_worlds.then(|| kept_worlds(&opened.dir)),
            run_stop: stop.clone(),
        });
        let admitter = Arc::new(Admitter { meter, budgeted, log: log.clone(), not_run: AtomicU64::new(0) });
        let starter = Arc::new(Starter {
            task_memory: Mutex::new(KeptNotes::new(&opened.dir)),
            log: log.clone(),
            stop: episodes_stop.clone(),
            roster: options.roster.clone(),
            grounds,
        });
        let rounds: Vec<Round> = match &options.auto_epochs {
            None => vec![None],
            Some(auto) => (1..=auto.max_epochs).map(Some).collect(),
        };
        Ok(Dispatcher {
            suites,
            options,
            log,
            stop,
            episodes_stop,
            admitter,
            starter,
            tally: Tally::default(),
            cells: HashMap::new(),
            active: None,
            rounds: rounds.into_iter(),
            aborted: None,
            started: Instant::now(),
        })
    }

    /// Counts the episodes carried from an earlier run (`--since`) in the run's tally.
    pub(super) fn count_carried(&mut self, carried: Tally) {
        self.tally.absorb(carried);
    }

    /// The next round, while the run goes on.
    pub(super) fn next_round(&mut self) -> Option<Round> {
        if self.stop.is_cancelled() {
            return None;
        }
        self.rounds.next()
    }

    /// The episodes of `round` the run makes, in plan order, until the run is stopped.
    pub(super) fn plan(&self, round: Round) -> impl Iterator<Item = EpisodeSpec> + use<'a> {
        let (options, stop, active) = (self.options, self.stop.clone(), self.active.clone());
        let in_round = move |e: &EpisodeSpec| {
            round.is_none_or(|r| e.epoch == r) && active.as_ref().is_none_or(|a| a.contains(&auto_cell(e)))
        };
        episodes(self.suites, &options.models, options.epochs)
            .filter(in_round)
            .filter(|e| options.plans(e))
            .take_while(move |_| !stop.is_cancelled())
    }

    /// Who decides whether each planned episode may start.
    pub(super) fn admitter(&self) -> Arc<Admitter> {
        self.admitter.clone()
    }

    /// Who starts each admitted episode.
    pub(super) fn starter(&self) -> Arc<Starter> {
        self.starter.clone()
    }

    /// Counts an episode that ended; a model that fails every episode the same way (a bad
    /// key, an unknown model) stops the run instead of burning through the rest.
    pub(super) fn record(&mut self, joined: Result<EpisodeReport, JoinError>) {
        let report = match joined {
            Ok(report) => report,
            // An episode task panicked: a bug in runner, not the agent's doing.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => {
                self.tally.cancelled += 1;
                return;
            }
        };
        self.tally.add(&report.outcome);
        if let Outcome::Scored { passed, .. } = report.outcome {
            let cell = self.cells.entry((report.suite, report.model, report.variant)).or_default();
            cell.0 += 1;
            cell.1 += u64::from(passed);
        }
        if self.aborted.is_none()
            && let Some(reason) = self.options.models.iter().find_map(|m| m.broken())
        {
            self.aborted = Some(reason);
            self.stop.cancel();
        }
    }

    /// After a round of `--epochs auto`, looks at each cell still adding epochs: those
    /// whose interval is narrow enough, or that reached the most epochs, stop. Every round
    /// ends the run when nothing is left, when the run was stopped, or when a budget kept
    /// episodes of the round from starting (the interval would lack the data it needs; a
    /// resume runs the rest).
    pub(super) fn end_round(&mut self, round: Round) {
        let (Some(epoch), Some(auto)) = (round, &self.options.auto_epochs) else { return };
        if self.stop.is_cancelled() || self.episodes_stop.is_cancelled() || self.admitter.not_run() > 0 {
            self.rounds = Vec::new().into_iter();
            return;
        }
        let mut still = HashSet::new();
        for cell in auto_cells(self.suites, &self.options.models, self.active.as_ref()) {
            let (scored, passed) = self.cells.get(&cell).copied().unwrap_or_default();
            let look = (auto.decide)(epoch, passed, scored);
            let (suite, model, variant) = cell.clone();
            self.log.emit(
                None,
                &Event::EpochsDecided {
                    suite,
                    model,
                    variant,
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
            if !look.stop {
                still.insert(cell);
            }
        }
        if still.is_empty() {
            self.rounds = Vec::new().into_iter();
        }
        self.active = Some(still);
    }

    /// Ends the run: the scratch folder goes (its episodes have all ended), the budget's
    /// last events and `run_finished` are logged, and the log closes.
    pub(super) fn finish(self, opened: OpenRun) -> Result<RunResult, RunError> {
        let Dispatcher { log, starter, admitter, mut tally, aborted, stop, started, .. } = self;
        // The scratch folder goes with the starter: the episodes have all ended.
        drop(starter);
        admitter.log_reached();
        let not_run = admitter.not_run();
        tally.episodes += not_run;
        tally.unscored += not_run;
        let interrupted = stop.is_cancelled() && aborted.is_none();
        log.emit(None, &tally.finished(interrupted, started.elapsed().as_secs_f64() * 1e3));
        drop((log, admitter));
        let OpenRun { run_id, dir, events_path, log, writer, lock } = opened;
        drop(log);
        let syncing = writer.close_written().map_err(RunError::Log)?;
        Ok(RunResult { aborted, run_id, dir, events_path, interrupted, syncing, lock })
    }
}

/// Starts the run's episodes, with what every episode shares: the run's log, the
/// episodes' stop, the models beside those under test, the grounds they run on.
pub(super) struct Starter {
    task_memory: Mutex<KeptNotes>,
    log: EventLog,
    stop: CancellationToken,
    roster: Arc<super::Roster>,
    grounds: Arc<Grounds>,
}

impl Starter {
    /// Starts an episode on the runtime. Called in plan order: a task's epochs share its
    /// notes one after another.
    pub(super) fn start(&self, spec: EpisodeSpec) -> tokio::task::JoinHandle<EpisodeReport> {
        let memory = self.task_memory.lock().unwrap_or_else(PoisonError::into_inner).slot(&spec);
        let (log, stop) = (self.log.clone(), self.stop.clone());
        let (roster, grounds) = (self.roster.clone(), self.grounds.clone());
        tokio::spawn(async move { run_episode(spec, memory, &log, &roster, &grounds, &stop).await })
    }
}

/// Decides whether each planned episode may start, as the run's caps allow.
pub(super) struct Admitter {
    meter: Arc<Mutex<RunMeter>>,
    /// Whether the run has caps at all; without, every episode starts.
    budgeted: bool,
    log: EventLog,
    /// Episodes the caps kept from starting.
    not_run: AtomicU64,
}

impl Admitter {
    /// The episode, when it may start: at once, or (under a soft cap) once an episode in
    /// flight has finished and shown what one spends; `None` when a cap keeps it from
    /// starting, and it is logged as not run.
    pub(super) async fn admit(self: Arc<Self>, spec: EpisodeSpec) -> Option<EpisodeSpec> {
        if !self.budgeted {
            return Some(spec);
        }
        loop {
            let finished = self.meter.lock().unwrap_or_else(PoisonError::into_inner).finished();
            // Waiting before asking: an episode that finishes in between is not missed.
            let notified = finished.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let admission =
                self.meter.lock().unwrap_or_else(PoisonError::into_inner).admission(&spec.id, spec.model.name());
            self.log_reached();
            match admission {
                Admission::Start => return Some(spec),
                Admission::Wait => notified.await,
                Admission::Refuse(why) => {
                    log_not_run(&self.log, &spec, &why);
                    self.not_run.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            }
        }
    }

    /// Logs the `budget_reached` events the meter holds.
    fn log_reached(&self) {
        let reached = self.meter.lock().unwrap_or_else(PoisonError::into_inner).take_reached();
        for event in &reached {
            self.log.emit(None, event);
        }
    }

    fn not_run(&self) -> u64 {
        self.not_run.load(Ordering::Relaxed)
    }
}

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
        // Never run: a later `--since` runs it whatever its parts.
        digests: None,
        tags: task.tags.clone(),
        metadata: task.logged_metadata(),
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

/// A run's episodes by outcome, as `run_finished` counts them.
#[derive(Default)]
pub(crate) struct Tally {
    episodes: u64,
    scored: u64,
    passed: u64,
    unscored: u64,
    cancelled: u64,
}

impl Tally {
    pub(crate) fn add(&mut self, outcome: &Outcome) {
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

    /// Adds another tally's counts to this one.
    pub(crate) fn absorb(&mut self, other: Tally) {
        self.episodes += other.episodes;
        self.scored += other.scored;
        self.passed += other.passed;
        self.unscored += other.unscored;
        self.cancelled += other.cancelled;
    }

    /// The `run_finished` event of these episodes.
    pub(crate) fn finished(&self, interrupted: bool, wall_ms: f64) -> Event {
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

/// Where `--keep-worlds` keeps a run's worlds: beside its scratch folder (on the same
/// filesystem, so keeping one is a rename), named after the run, said on stderr.
fn kept_worlds(run_dir: &std::path::Path) -> std::path::PathBuf {
    let name = run_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let dir = std::env::temp_dir().join(format!("runner-kept-{name}"));
    eprintln!("worlds kept in {}", dir.display());
    dir
}
