//! The memory agent's state per thread, checkpointed to SQLite after every invocation
//! (`results/<run-id>/memory_agent.sqlite`). A run killed mid-conversation and resumed
//! starts each thread at the invocation after its last checkpoint; that invocation's
//! writes may have reached the store before the kill, and its `add_entry` key keeps them
//! from being stored twice.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};

use super::conversation::ChatMessage;

/// The file of the run folder that holds the checkpoints.
pub const FILE: &str = "memory_agent.sqlite";

/// What a thread keeps between invocations. `to_process` and `tool_history` (seed 002)
/// live only for one invocation and are not kept.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ThreadState {
    /// The index of the next invocation of the replay.
    pub next: usize,
    /// Every message processed and every retrieved context, in order.
    pub conversation_history: Vec<ChatMessage>,
    /// Where in the history the current session began (its `start_session` context).
    pub session_start: usize,
    /// Invocations that ended without the call the model was asked for.
    pub errors: u32,
    /// Entries the model wrote, and per session id.
    pub entries: u32,
    pub entries_by_session: Vec<(String, u32)>,
}

pub struct Checkpoints {
    db: Connection,
}

impl Checkpoints {
    pub fn open(path: &Path) -> Result<Checkpoints, String> {
        let db = Connection::open(path).map_err(|e| format!("failed to open {}: {e}", path.display()))?;
        db.busy_timeout(std::time::Duration::from_secs(30))
            .and_then(|_| {
                db.execute_batch(
                    "PRAGMA journal_mode = WAL;
                     CREATE TABLE IF NOT EXISTS threads (thread_id TEXT PRIMARY KEY, state TEXT NOT NULL);",
                )
            })
            .map_err(|e| format!("failed to set up {}: {e}", path.display()))?;
        Ok(Checkpoints { db })
    }

    /// The thread's last checkpoint; a fresh state when it has none.
    pub fn load(&self, thread: &str) -> Result<ThreadState, String> {
        let text: Option<String> = self
            .db
            .query_row("SELECT state FROM threads WHERE thread_id = ?1", params![thread], |row| row.get(0))
            .optional()
            .map_err(|e| format!("failed to read the checkpoint of `{thread}`: {e}"))?;
        match text {
            None => Ok(ThreadState::default()),
            Some(text) => {
                serde_json::from_str(&text).map_err(|e| format!("the checkpoint of `{thread}` cannot be read: {e}"))
            }
        }
    }

    pub fn save(&self, thread: &str, state: &ThreadState) -> Result<(), String> {
        let text = serde_json::to_string(state).map_err(|e| e.to_string())?;
        self.db
            .execute("INSERT OR REPLACE INTO threads (thread_id, state) VALUES (?1, ?2)", params![thread, text])
            .map_err(|e| format!("failed to checkpoint `{thread}`: {e}"))?;
        Ok(())
    }
}
