//! Episodes on demand: a run whose episodes are asked for one at a time by someone else
//! (`runner serve`) instead of planned from its suites. The same folder (opened fresh or
//! resumed, staged, locked), log, grounds and episode runner as a planned run's; the one who
//! asks chooses the episodes, their order and how many run at once.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::dispatcher::Tally;
use super::folder::{OpenRun, Scratch, open_run, world_making_folders};
use super::{EpisodeReport, EpisodeSpec, Grounds, Roster, RunError, RunOptions, RunResult, run_episode};
use crate::log::{EventLog, Subscription};
use crate::suite::Suite;

/// A run open for episodes asked one at a time.
pub struct OnDemand {
    log: EventLog,
    roster: Arc<Roster>,
    /// The grounds every episode shares; each runs with its own stop as the run's.
    grounds: Grounds,
    tally: Mutex<Tally>,
    /// The folder, its writer and lock (in a mutex only to be shared: its writer's channel
    /// is not).
    opened: Mutex<OpenRun>,
    run_id: String,
    started: Instant,
}

impl OnDemand {
    /// Opens the run's folder as a planned run would (fresh, or resumed when `options` say
    /// so), `subscribers` seeing every event emitted through it.
    pub fn open(suites: &[Arc<Suite>], options: &RunOptions, subscribers: &[Subscription]) -> Result<Self, RunError> {
        let opened = open_run(suites, options)?;
        let log = opened.log.clone().with_subscribers(subscribers);
        let scratch = Arc::new(Scratch::at(&opened.dir).map_err(RunError::Log)?);
        if let Some(definition) = suites.iter().find_map(|s| world_making_folders(s)) {
            scratch.made_for(definition).map_err(|e| RunError::Log(std::io::Error::other(e)))?;
        }
        let grounds = Grounds {
            scratch,
            run_dir: opened.dir.clone(),
            sandbox: options.sandbox,
            keep_worlds: None,
            run_stop: CancellationToken::new(),
        };
        let run_id = opened.run_id.clone();
        Ok(OnDemand {
            log,
            roster: options.roster.clone(),
            grounds,
            tally: Mutex::new(Tally::default()),
            opened: Mutex::new(opened),
            run_id,
            started: Instant::now(),
        })
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The run's folder.
    pub fn dir(&self) -> &Path {
        &self.grounds.run_dir
    }

    /// The run's log, for events of the run itself.
    pub fn log(&self) -> &EventLog {
        &self.log
    }

    /// Runs one episode to its end, logged as any run's; `stop` cancels it alone (its
    /// termination is then `user_stop`, its outcome cancelled).
    pub async fn run(&self, spec: EpisodeSpec, stop: CancellationToken) -> EpisodeReport {
        let grounds = Grounds { run_stop: stop.clone(), ..self.grounds.clone() };
        let report = run_episode(spec, None, &self.log, &self.roster, &grounds, &stop).await;
        self.tally.lock().unwrap_or_else(PoisonError::into_inner).add(&report.outcome);
        report
    }

    /// Ends the run once every episode has ended: `run_finished`, the log closed.
    pub fn finish(self, interrupted: bool) -> Result<RunResult, RunError> {
        let OnDemand { log, opened, tally, started, grounds, .. } = self;
        let wall_ms = started.elapsed().as_secs_f64() * 1e3;
        log.emit(None, &tally.into_inner().unwrap_or_else(PoisonError::into_inner).finished(interrupted, wall_ms));
        // The scratch folder goes with the grounds: the episodes have all ended.
        drop((log, grounds));
        let OpenRun { run_id, dir, events_path, log, writer, lock } =
            opened.into_inner().unwrap_or_else(PoisonError::into_inner);
        drop(log);
        let syncing = writer.close_written().map_err(RunError::Log)?;
        Ok(RunResult { aborted: None, run_id, dir, events_path, interrupted, syncing, lock })
    }
}
