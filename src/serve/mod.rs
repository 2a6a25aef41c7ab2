//! `runner serve`: a run that stays open and serves episodes on demand, to RL trainers and
//! other loops, over HTTP/JSON on a TCP port or a Unix socket. Two APIs over one run:
//! episodes (`episodes.rs`: a task and the caller's OpenAI-compatible endpoint in, a typed
//! outcome, reward, scores and trajectory out; batches streamed as they end) and steps
//! (`steps.rs`, `ws.rs`: OpenEnv's reset/step/state, the caller as the policy). Every
//! episode runs through the batch's own episode runner into an ordinary run folder — the
//! event log is the truth, `runner report` reads it — within a bound on episodes at once
//! (429 past it) and a queue that survives a kill (`journal.rs`).

mod episodes;
mod http;
mod journal;
mod routes;
mod steps;
mod trajectory;
mod watch;
mod ws;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::batch::{OnDemand, RunOptions, RunResult};
use crate::log::Subscription;
use crate::log::projection::Projection;
use crate::model::config::ModelConfig;
use crate::model::{Backend, BackendOptions};
use crate::suite::Suite;
use http::ApiError;

pub use journal::FILE as QUEUE_FILE;

/// Where the server listens.
#[derive(Debug, Clone, PartialEq)]
pub enum Listen {
    /// `HOST:PORT` (port 0: one the system gives, said on stdout).
    Tcp(String),
    /// `unix:PATH`.
    Unix(PathBuf),
}

impl Listen {
    pub fn parse(text: &str) -> Result<Listen, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("`unix:` needs a path: --listen unix:/run/runner.sock".into());
            }
            return Ok(Listen::Unix(PathBuf::from(path)));
        }
        match text.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(Listen::Tcp(text.to_owned())),
            _ => Err(format!("`{text}` is neither HOST:PORT (127.0.0.1:8100) nor unix:PATH")),
        }
    }
}

/// How a server is set up.
pub struct ServeOptions {
    pub suites: Vec<Arc<Suite>>,
    /// The run's folder, sandbox, graders and limits, as `runner eval`'s (no models: each
    /// request brings its own).
    pub run: RunOptions,
    pub listen: Listen,
    /// Requests must carry it (`Authorization: Bearer KEY`); none: no key asked.
    pub key: Option<String>,
    /// Episodes and step sessions at once; past it, 429.
    pub jobs: usize,
    /// The providers runner opens named models with (`mock`, `replay:…`, `provider/model`).
    pub config: ModelConfig,
    /// Recording (`--record`) of every model the server lends.
    pub backend_options: BackendOptions,
    /// How long a step session may wait for the caller's next action.
    pub session_idle: Duration,
    /// Retries of a call to a caller's endpoint.
    pub endpoint_retries: u32,
}

/// The server's state, shared by every connection and episode.
pub struct Service {
    run: OnDemand,
    suites: Vec<Arc<Suite>>,
    key: Option<String>,
    bound: Arc<Semaphore>,
    jobs: usize,
    registry: Mutex<episodes::ServedEpisodes>,
    watch: Arc<Mutex<watch::Watch>>,
    journal: journal::Journal,
    backends: Mutex<HashMap<String, Arc<Backend>>>,
    config: ModelConfig,
    backend_options: BackendOptions,
    sessions: Mutex<HashMap<String, Arc<steps::StepSession>>>,
    session_idle: Duration,
    endpoint_retries: u32,
    /// Cancelled when the server stops: WebSocket sessions and batches end.
    closing: CancellationToken,
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Each change under these locks is whole before it is unlocked.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a server that stopped leaves: its run, closed.
pub struct Closed {
    pub run: RunResult,
    pub interrupted: usize,
}

impl Service {
    /// Opens the run (fresh, or the one `options.run.resume` names), its queue, and what
    /// both say was served before.
    pub fn open(options: ServeOptions) -> Result<(Arc<Service>, Listen, usize), String> {
        let ServeOptions { suites, run, listen, key, jobs, config, backend_options, session_idle, endpoint_retries } =
            options;
        let watch = Arc::new(Mutex::new(watch::Watch::default()));
        let subscription = Subscription::all(watch.clone());
        let on_demand = OnDemand::open(&suites, &run, &[subscription]).map_err(|e| e.to_string())?;
        let (journal, restored) = journal::Journal::open(on_demand.dir())?;
        let mut registry = episodes::ServedEpisodes::default();
        let interrupted = restore(&mut registry, &restored, &journal, &on_demand.dir().join("events.jsonl"))?;
        let service = Service {
            run: on_demand,
            suites,
            key,
            bound: Arc::new(Semaphore::new(jobs.max(1))),
            jobs: jobs.max(1),
            registry: Mutex::new(registry),
            watch,
            journal,
            backends: Mutex::default(),
            config,
            backend_options,
            sessions: Mutex::default(),
            session_idle,
            endpoint_retries,
            closing: CancellationToken::new(),
        };
        Ok((Arc::new(service), listen, interrupted))
    }

    pub fn run_dir(&self) -> &std::path::Path {
        self.run.dir()
    }

    /// The suite and task a request names: `task` (an id), and `suite` when several suites
    /// have a task of that id.
    fn find_task(&self, body: &Value, at: &str) -> Result<(usize, usize), ApiError> {
        let field = |name: &str| format!("{at}{name}");
        let task = match body.get("task") {
            Some(Value::String(t)) if !t.is_empty() => t.as_str(),
            None | Some(Value::Null) if self.suites.iter().map(|s| s.tasks.len()).sum::<usize>() == 1 => {
                return Ok((0, 0));
            }
            None | Some(Value::Null) => {
                return Err(ApiError::field(
                    &field("task"),
                    "`task` is missing: a task's id (GET /v1/tasks lists them)",
                ));
            }
            Some(_) => return Err(ApiError::field(&field("task"), "`task` must be a task's id (a string)")),
        };
        let suite = match body.get("suite") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.as_str()),
            Some(_) => return Err(ApiError::field(&field("suite"), "`suite` must be a suite's name (a string)")),
        };
        let mut found = self
            .suites
            .iter()
            .enumerate()
            .filter(|(_, s)| suite.is_none_or(|n| s.name == n))
            .filter_map(|(i, s)| s.tasks.iter().position(|t| t.id == task).map(|j| (i, j)));
        match (found.next(), found.next()) {
            (Some(one), None) => Ok(one),
            (Some(_), Some(_)) => Err(ApiError::field(
                &field("suite"),
                format!("several suites have a task `{task}`: name the one you mean with `suite`"),
            )),
            (None, _) => match suite {
                Some(s) if !self.suites.iter().any(|x| x.name == s) => {
                    Err(ApiError::not_found(&field("suite"), format!("no suite `{s}` is served")))
                }
                _ => Err(ApiError::not_found(
                    &field("task"),
                    format!("no task `{task}` is served (GET /v1/tasks lists them)"),
                )),
            },
        }
    }

    /// The suite index and task index of a task by names.
    fn find(&self, suite: &str, task: &str) -> Option<(usize, usize)> {
        let i = self.suites.iter().position(|s| s.name == suite)?;
        Some((i, self.suites[i].tasks.iter().position(|t| t.id == task)?))
    }

    /// Cancels every episode and session, waits (up to `patience`) for them to end, and
    /// closes the run.
    pub async fn close(self: Arc<Self>, patience: Duration) -> Result<Closed, String> {
        self.closing.cancel();
        self.bound.close();
        let running: Vec<Arc<episodes::Entry>> = {
            let registry = lock(&self.registry);
            registry
                .open()
                .iter()
                .filter(|(_, status)| *status == "running")
                .filter_map(|(id, _)| registry.get(id))
                .collect()
        };
        for entry in &running {
            entry.stop.cancel();
        }
        let interrupted = running.len();
        let deadline = tokio::time::Instant::now() + patience;
        let mut service = self;
        let service = loop {
            match Arc::try_unwrap(service) {
                Ok(service) => break service,
                Err(again) if tokio::time::Instant::now() < deadline => {
                    service = again;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(_) => {
                    return Err("episodes were still running when the server had to stop; the queue says which".into());
                }
            }
        };
        drop(service.sessions);
        let run = service.run.finish(interrupted > 0).map_err(|e| e.to_string())?;
        Ok(Closed { run, interrupted })
    }
}

/// What the run's log and queue say was served before: each epoch counted as served, and
/// each episode admitted and never ended put back as interrupted — unless the log shows it
/// finished after its last start (a kill between the log's line and the queue's), which
/// the queue is then told. The log is the truth the other way too: an episode the queue
/// says ended whose finish never reached the log (a kill after the answer, before the
/// writer wrote its last lines) is interrupted, so that it is neither lost from the run's
/// tables nor counted twice after a retry. How many were interrupted.
fn restore(
    registry: &mut episodes::ServedEpisodes,
    restored: &journal::Restored,
    journal: &journal::Journal,
    events: &std::path::Path,
) -> Result<usize, String> {
    let logged = Projection::from_log(events).map_err(|e| e.to_string())?;
    for row in &logged.episodes {
        registry.served(&row.suite, &row.task_id, &row.model, row.epoch);
    }
    for admitted in restored.admitted.values() {
        registry.served(&admitted.suite, &admitted.task, &episodes::model_name(&admitted.policy), admitted.epoch);
    }
    let mut last: HashMap<String, Option<crate::log::Outcome>> = HashMap::new();
    crate::log::reader::for_each_event_of(events, Some(&["episode_started", "episode_finished"]), |e| {
        let Some(id) = e.episode_id.as_deref().filter(|id| restored.admitted.contains_key(*id)) else { return };
        let outcome = match e.event() {
            Some(crate::log::Event::EpisodeFinished { outcome, .. }) => Some(outcome),
            _ => None,
        };
        last.insert(id.to_owned(), outcome);
    })
    .map_err(|e| e.to_string())?;
    let finished = |id: &str| last.get(id).is_some_and(Option::is_some);
    // The latest answers, known now only by their outcome, for `GET` after the restart.
    for (id, outcome) in &restored.ended {
        if let Some(admitted) = restored.admitted.get(id).filter(|_| finished(id)) {
            let answer = episodes::logged_answer(admitted, outcome);
            registry.insert(admitted.clone(), episodes::Phase::Ended(Arc::new(answer)), CancellationToken::new());
            registry.ended(id);
        }
    }
    let mut interrupted = 0;
    let unlogged =
        restored.admitted.values().filter(|a| restored.ended.contains_key(&a.episode_id) && !finished(&a.episode_id));
    for admitted in restored.interrupted().chain(unlogged) {
        let stop = CancellationToken::new();
        match last.get(&admitted.episode_id).cloned().flatten() {
            Some(outcome) => {
                journal.ended(&admitted.episode_id, &outcome)?;
                let answer = episodes::logged_answer(admitted, &outcome);
                registry.insert(admitted.clone(), episodes::Phase::Ended(Arc::new(answer)), stop);
            }
            None => {
                registry.insert(admitted.clone(), episodes::Phase::Interrupted, stop);
                interrupted += 1;
            }
        }
    }
    Ok(interrupted)
}

/// Serves until `stop`: connections accepted on `listen`, each on a task of its own; the
/// address it listens on is given to `ready` first.
pub async fn serve(
    service: Arc<Service>,
    listen: &Listen,
    stop: CancellationToken,
    ready: impl FnOnce(String),
) -> Result<(), String> {
    match listen {
        Listen::Tcp(address) => {
            let listener = tokio::net::TcpListener::bind(address.as_str())
                .await
                .map_err(|e| format!("failed to listen on {address}: {e}"))?;
            ready(format!("http://{}", listener.local_addr().map_err(|e| e.to_string())?));
            let listener = &listener;
            accept_until(&stop, &service, || async move { listener.accept().await.map(|(stream, _)| stream) }).await;
        }
        Listen::Unix(path) => {
            // A socket left by a server that was killed: nobody listens there any more.
            if std::os::unix::net::UnixStream::connect(path).is_err() {
                let _ = std::fs::remove_file(path);
            }
            let listener = tokio::net::UnixListener::bind(path)
                .map_err(|e| format!("failed to listen on {}: {e}", path.display()))?;
            ready(format!("unix:{}", path.display()));
            let listener = &listener;
            accept_until(&stop, &service, || async move { listener.accept().await.map(|(stream, _)| stream) }).await;
            let _ = std::fs::remove_file(path);
        }
    }
    Ok(())
}

/// Serves each connection `accept` gives on a task of its own, until `stop`; then they go.
async fn accept_until<S, F, A>(stop: &CancellationToken, service: &Arc<Service>, mut accept: F)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    F: FnMut() -> A,
    A: std::future::Future<Output = std::io::Result<S>>,
{
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            accepted = accept() => match accepted {
                Ok(stream) => {
                    connections.spawn(routes::connection(stream, service.clone()));
                }
                // Out of descriptors, say: wait rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
        }
        while connections.try_join_next().is_some() {}
    }
    connections.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_host_and_port_or_a_unix_socket() {
        assert_eq!(Listen::parse("127.0.0.1:0").unwrap(), Listen::Tcp("127.0.0.1:0".into()));
        assert_eq!(Listen::parse("[::1]:8100").unwrap(), Listen::Tcp("[::1]:8100".into()));
        assert_eq!(Listen::parse("unix:/tmp/r.sock").unwrap(), Listen::Unix("/tmp/r.sock".into()));
        for bad in ["8100", "localhost", "unix:", "h:port"] {
            assert!(Listen::parse(bad).is_err(), "{bad}");
        }
    }
}
