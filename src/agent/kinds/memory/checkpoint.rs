//! The memory agent's state per thread, checkpointed to SQLite after every invocation
//! (`results/<run-id>/memory_agent.sqlite`). A run killed mid-conversation and resumed
//! starts each thread at the invocation after its last checkpoint; that invocation's
//! writes may have reached the store before the kill, and its `add_entry` key keeps them
//! from being stored twice.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use crate::agent::episode::Done;
use crate::domain::conversation::ChatMessage;
use crate::log::Usage;

/// The file of the run folder that holds the checkpoints.
pub const FILE: &str = "memory_agent.sqlite";

/// What a thread keeps between invocations. `to_process` and `tool_history` (seed 002)
/// live only for one invocation and are not kept. The history is stored a message a row,
/// appended, so that a checkpoint costs the same at the thousandth message as at the first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadState {
    /// The index of the next invocation of the replay.
    pub next: usize,
    /// Every message processed and every retrieved context, in order.
    #[serde(skip)]
    pub conversation_history: Vec<ChatMessage>,
    /// Where in the history the current session began (its `start_session` context).
    pub session_start: usize,
    /// Invocations that ended without the call the model was asked for.
    pub errors: u32,
    /// Entries the model wrote, and per session id.
    pub entries: u32,
    pub entries_by_session: Vec<(String, u32)>,
    /// What the replay's model calls spent up to here, whichever attempt made them: an
    /// attempt that goes on from this state is charged for them.
    #[serde(default)]
    pub spent: ReplaySpent,
}

/// The model calls of a replay and what they used, and what its episode had done.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplaySpent {
    pub model_calls: u32,
    pub usage: Usage,
    /// Their cost, unless a call's was unknown.
    #[serde(default)]
    pub cost_usd: f64,
    #[serde(default)]
    pub cost_unknown: bool,
    /// The episode's steps, calls and failed calls up to here.
    #[serde(default)]
    pub done: Done,
}

impl ReplaySpent {
    pub fn add(&mut self, usage: Usage, cost_usd: Option<f64>) {
        self.model_calls = self.model_calls.saturating_add(1);
        self.usage.add(usage);
        match cost_usd {
            Some(cost) => self.cost_usd = crate::log::add_cost(self.cost_usd, cost),
            None => self.cost_unknown = true,
        }
    }

    pub fn cost(&self) -> Option<f64> {
        (!self.cost_unknown).then_some(self.cost_usd)
    }
}

pub struct ReplayCheckpoints {
    db: Connection,
    /// How many messages of the history are stored.
    stored: usize,
}

impl ReplayCheckpoints {
    pub fn open(path: &Path) -> Result<ReplayCheckpoints, String> {
        let db = Connection::open(path).map_err(|e| format!("failed to open {}: {e}", path.display()))?;
        // Two episodes setting up a new file at once: one's switch to WAL meets the other's
        // lock, and SQLite answers it `database is locked` without waiting, whatever the
        // busy timeout. A run folder has one runner, so one set-up at a time in it is enough.
        static SETTING_UP: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = SETTING_UP.lock().unwrap_or_else(|p| p.into_inner());
        db.busy_timeout(std::time::Duration::from_secs(30))
            .and_then(|_| {
                db.execute_batch(
                    // A process killed outright loses nothing the OS was handed; only a power
                    // loss could take the last commits, which the store's keys make harmless.
                    "PRAGMA journal_mode = WAL;
                     PRAGMA synchronous = NORMAL;
                     CREATE TABLE IF NOT EXISTS threads (thread_id TEXT PRIMARY KEY, state TEXT NOT NULL);
                     CREATE TABLE IF NOT EXISTS history (
                         thread_id TEXT NOT NULL, seq INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
                         PRIMARY KEY (thread_id, seq));",
                )
            })
            .map_err(|e| format!("failed to set up {}: {e}", path.display()))?;
        Ok(ReplayCheckpoints { db, stored: 0 })
    }

    /// Takes in the threads of the checkpoints in `other` (another shard's) that these have
    /// not got, histories included.
    pub fn absorb(&mut self, other: &Path) -> Result<(), String> {
        let failed = |e: rusqlite::Error| format!("failed to read the checkpoints {}: {e}", other.display());
        self.db.execute("ATTACH DATABASE ?1 AS other", [other.to_string_lossy()]).map_err(failed)?;
        let copied = self.db.execute_batch(
            "BEGIN;
             INSERT INTO history SELECT h.thread_id, h.seq, h.role, h.content FROM other.history h
                 WHERE h.thread_id NOT IN (SELECT thread_id FROM main.threads);
             INSERT INTO threads SELECT t.thread_id, t.state FROM other.threads t
                 WHERE t.thread_id NOT IN (SELECT thread_id FROM main.threads);
             COMMIT;",
        );
        if copied.is_err() {
            let _ = self.db.execute_batch("ROLLBACK");
        }
        let detached = self.db.execute_batch("DETACH DATABASE other");
        copied.and(detached).map_err(failed)
    }

    /// The thread's last checkpoint, its history included; a fresh state when it has none.
    pub fn load(&mut self, thread: &str) -> Result<ThreadState, String> {
        let failed = |e: rusqlite::Error| format!("failed to read the checkpoint of `{thread}`: {e}");
        let text: Option<String> = self
            .db
            .query_row("SELECT state FROM threads WHERE thread_id = ?1", params![thread], |row| row.get(0))
            .optional()
            .map_err(failed)?;
        let Some(text) = text else { return Ok(ThreadState::default()) };
        let mut state: ThreadState =
            serde_json::from_str(&text).map_err(|e| format!("the checkpoint of `{thread}` cannot be read: {e}"))?;
        let mut statement =
            self.db.prepare("SELECT role, content FROM history WHERE thread_id = ?1 ORDER BY seq").map_err(failed)?;
        let rows = statement
            .query_map(params![thread], |row| Ok(ChatMessage { role: row.get(0)?, content: row.get(1)? }))
            .map_err(failed)?;
        state.conversation_history = rows.collect::<Result<_, _>>().map_err(failed)?;
        drop(statement);
        self.stored = state.conversation_history.len();
        Ok(state)
    }

    /// Stores the thread's state and the messages its history gained since the last
    /// checkpoint, in one transaction.
    pub fn save(&mut self, thread: &str, state: &ThreadState) -> Result<(), String> {
        let failed = |e: rusqlite::Error| format!("failed to checkpoint `{thread}`: {e}");
        let text = serde_json::to_string(state).map_err(|e| e.to_string())?;
        let tx = self.db.transaction().map_err(failed)?;
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO history (thread_id, seq, role, content) VALUES (?1, ?2, ?3, ?4)",
                )
                .map_err(failed)?;
            for (seq, message) in state.conversation_history.iter().enumerate().skip(self.stored) {
                insert.execute(params![thread, seq as i64, message.role, message.content]).map_err(failed)?;
            }
        }
        tx.prepare_cached("INSERT OR REPLACE INTO threads (thread_id, state) VALUES (?1, ?2)")
            .and_then(|mut statement| statement.execute(params![thread, text]))
            .map_err(failed)?;
        tx.commit().map_err(failed)?;
        self.stored = state.conversation_history.len();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: episodes opening a run's new checkpoint file at once failed now and then
    /// with `database is locked` (the switch to WAL does not wait), unscoring an episode.
    #[test]
    fn episodes_opening_a_new_checkpoint_file_at_once_all_open_it() {
        for round in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(FILE);
            let opened: Vec<Result<(), String>> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..8)
                    .map(|i| {
                        let path = &path;
                        s.spawn(move || {
                            let mut checkpoints = ReplayCheckpoints::open(path)?;
                            checkpoints.save(&format!("ep_{i}"), &state(1, &["hello"]))
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(opened.iter().all(Result::is_ok), "round {round}: {opened:?}");
        }
    }

    fn state(next: usize, messages: &[&str]) -> ThreadState {
        ThreadState {
            next,
            conversation_history: messages
                .iter()
                .map(|m| ChatMessage { role: "user".into(), content: (*m).into() })
                .collect(),
            ..ThreadState::default()
        }
    }

    #[test]
    fn absorbing_another_runs_checkpoints_takes_the_threads_it_lacks_with_their_histories() {
        let dir = tempfile::tempdir().unwrap();
        let (mine, theirs) = (dir.path().join("mine.sqlite"), dir.path().join("theirs.sqlite"));
        let mut other = ReplayCheckpoints::open(&theirs).unwrap();
        other.save("ep_2", &state(2, &["a", "b"])).unwrap();
        other.save("ep_1", &state(7, &["stale"])).unwrap();
        drop(other);
        let mut checkpoints = ReplayCheckpoints::open(&mine).unwrap();
        checkpoints.save("ep_1", &state(1, &["x"])).unwrap();

        checkpoints.absorb(&theirs).unwrap();
        assert_eq!(checkpoints.load("ep_2").unwrap(), state(2, &["a", "b"]));
        assert_eq!(checkpoints.load("ep_1").unwrap(), state(1, &["x"]), "a thread it has is kept as it is");
        // Detached again: a second absorb works the same.
        checkpoints.absorb(&theirs).unwrap();
        assert_eq!(checkpoints.load("ep_2").unwrap(), state(2, &["a", "b"]));
    }
}
