//! Long-lived workers for code scorers (`python:`, `js:`): processes started once per run
//! per interpreter and scorer file (inline expressions share one per interpreter), kept
//! for every episode after, so that a call costs a line of JSON each way instead of an
//! interpreter's start.
//!
//! A worker serves one episode at a time; a small pool of them ([`POOL`]) serves episodes
//! scored at once. For each call the episode's working directory is moved into the
//! worker's view (`process.rs`) and back. A worker that crashes or overruns its call's
//! time is killed and dropped; the next call starts a new one. A scorer file that fails to
//! load is remembered, and each of its calls answers with what loading raised.

mod process;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::Semaphore;

use crate::domain::scorer::Language;
use process::{Broken, Unstarted, Worker};

/// The most workers of one kind running at once.
pub const POOL: usize = 2;

/// Which worker serves a scorer: its language, interpreter, file and sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WorkerKey {
    pub language: Language,
    pub interpreter: Option<String>,
    /// The scorer's file (absolute); `None` for inline expressions.
    pub file: Option<PathBuf>,
    pub sandboxed: bool,
}

/// What a worker answered, or why it did not.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// What the scorer returned, as JSON.
    Returned(Value),
    /// It returned something JSON cannot hold (the worker's `repr` of it).
    Other(String),
    /// It raised: the traceback's last lines.
    Raised(String),
    /// No answer: the worker could not start, crashed or timed out.
    Failed(String),
}

/// The run's workers, started when a scorer first needs one and stopped when dropped.
#[derive(Default)]
pub struct Workers {
    pools: Mutex<HashMap<WorkerKey, Arc<Pool>>>,
    /// The folder the workers' views are made in, on the file system of the episodes'
    /// folders (a rename moves a working directory into a view).
    views: Mutex<Option<Arc<tempfile::TempDir>>>,
}

struct Pool {
    idle: Mutex<Vec<Worker>>,
    permits: Semaphore,
    /// What loading the scorer's file raised, once it did.
    unloadable: Mutex<Option<String>>,
}

impl Workers {
    /// Asks a worker of `key` to run `request` within `limit`, with `files` (the episode's
    /// working directory, when its world has one) moved into the worker's view.
    pub async fn call(&self, key: &WorkerKey, mut request: Value, files: Option<&Path>, limit: Duration) -> Reply {
        let pool = self.pool(key);
        let Ok(_permit) = pool.permits.acquire().await else {
            return Reply::Failed("the workers were stopped".into());
        };
        if let Some(raised) = pool.unloadable.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            return Reply::Raised(raised);
        }
        let idle = pool.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut worker = match idle {
            Some(worker) => worker,
            None => match self.start(key).await {
                Ok(worker) => worker,
                Err(Unstarted::Raised(raised)) => {
                    *pool.unloadable.lock().unwrap_or_else(|p| p.into_inner()) = Some(raised.clone());
                    return Reply::Raised(raised);
                }
                Err(Unstarted::Failed(why)) => return Reply::Failed(why),
            },
        };
        let mut lent = match files {
            Some(folder) => match Lent::into(folder, worker.view.path()) {
                Ok(lent) => Some(lent),
                Err(e) => {
                    return Reply::Failed(format!("the final world's files could not be lent to the worker: {e}"));
                }
            },
            None => None,
        };
        request["context"]["files"] = lent.as_ref().map_or(Value::Null, |l| Value::from(l.path()));
        let answer = worker.ask(request, limit).await;
        // A view that still holds an episode's files must serve no other: its worker stops.
        let clean = lent.as_mut().is_none_or(Lent::give_back);
        match answer {
            Ok(answer) => {
                if clean {
                    pool.idle.lock().unwrap_or_else(|p| p.into_inner()).push(worker);
                }
                if let Some(raised) = answer.get("error").and_then(Value::as_str) {
                    Reply::Raised(raised.to_owned())
                } else if let Some(other) = answer.get("other").and_then(Value::as_str) {
                    Reply::Other(other.to_owned())
                } else {
                    Reply::Returned(answer.get("result").cloned().unwrap_or(Value::Null))
                }
            }
            Err(Broken::TimedOut) => Reply::Failed(format!(
                "the scorer did not answer within {}s (its worker was stopped; a new one serves the next call)",
                limit.as_secs_f64()
            )),
            Err(Broken::Crashed(why)) => {
                Reply::Failed(format!("the worker crashed: {why} (a new one serves the next call)"))
            }
        }
    }

    fn pool(&self, key: &WorkerKey) -> Arc<Pool> {
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools
            .entry(key.clone())
            .or_insert_with(|| {
                Arc::new(Pool { idle: Mutex::default(), permits: Semaphore::new(POOL), unloadable: Mutex::default() })
            })
            .clone()
    }

    async fn start(&self, key: &WorkerKey) -> Result<Worker, Unstarted> {
        let views = {
            let mut views = self.views.lock().unwrap_or_else(|p| p.into_inner());
            match &*views {
                Some(made) => made.clone(),
                None => {
                    let made = tempfile::Builder::new()
                        .prefix("runner-workers-")
                        .tempdir()
                        .map_err(|e| Unstarted::Failed(format!("failed to make the workers' folder: {e}")))?;
                    views.insert(Arc::new(made)).clone()
                }
            }
        };
        Worker::start(key, views.path()).await
    }
}

/// An episode's working directory moved into a worker's view for one call, and moved back
/// when given back or dropped (however the call ended).
struct Lent {
    home: PathBuf,
    lent: PathBuf,
    returned: bool,
}

impl Lent {
    fn into(folder: &Path, view: &Path) -> std::io::Result<Lent> {
        let lent = view.join("files");
        std::fs::rename(folder, &lent)?;
        Ok(Lent { home: folder.to_path_buf(), lent, returned: false })
    }

    fn path(&self) -> String {
        self.lent.to_string_lossy().into_owned()
    }

    /// Moves the folder back home. When that fails, says so and clears the view, so that
    /// the worker's next call never sees this episode's files; `false` when even that
    /// failed and the worker's view is not clean.
    fn give_back(&mut self) -> bool {
        if std::mem::replace(&mut self.returned, true) {
            return true;
        }
        let Err(e) = std::fs::rename(&self.lent, &self.home) else { return true };
        let cleared = std::fs::remove_dir_all(&self.lent);
        eprintln!(
            "warning: failed to move the episode's files back from {} to {}: {e}; {}",
            self.lent.display(),
            self.home.display(),
            match &cleared {
                Ok(()) => "they were removed from the scorer's worker".to_owned(),
                Err(e) => format!("nor could they be removed ({e}): the worker is stopped"),
            }
        );
        cleared.is_ok() || !self.lent.exists()
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.give_back();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_lent_and_given_back_is_home_again() {
        let dir = tempfile::tempdir().unwrap();
        let (home, view) = (dir.path().join("episode"), dir.path().join("view"));
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&view).unwrap();
        std::fs::write(home.join("a.txt"), "a").unwrap();
        let mut lent = Lent::into(&home, &view).unwrap();
        assert!(!home.exists() && view.join("files/a.txt").is_file());
        assert!(lent.give_back());
        assert_eq!(std::fs::read_to_string(home.join("a.txt")).unwrap(), "a");
        assert!(!view.join("files").exists());
    }

    /// Regression: a failed move back was ignored, and the worker's next call found the
    /// episode's files still in its view (or could not lend its own folder there).
    #[test]
    fn a_failed_move_back_leaves_no_stale_folder_in_the_view() {
        let dir = tempfile::tempdir().unwrap();
        let (home, view) = (dir.path().join("episode"), dir.path().join("view"));
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&view).unwrap();
        std::fs::write(home.join("secret.txt"), "first episode").unwrap();
        let mut lent = Lent::into(&home, &view).unwrap();
        // Something took the folder's place meanwhile: a directory cannot be renamed onto a file.
        std::fs::write(&home, "in the way").unwrap();
        assert!(lent.give_back(), "the view was cleared");
        assert!(!view.join("files").exists(), "no stale folder in the worker's view");
        drop(lent);

        let next = dir.path().join("next");
        std::fs::create_dir_all(&next).unwrap();
        std::fs::write(next.join("mine.txt"), "second episode").unwrap();
        let lent = Lent::into(&next, &view).unwrap();
        assert!(view.join("files/mine.txt").is_file() && !view.join("files/secret.txt").exists());
        drop(lent);
        assert!(next.join("mine.txt").is_file());
    }
}
