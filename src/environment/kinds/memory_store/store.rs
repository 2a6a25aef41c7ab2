//! The store behind `memory_store`: vaults, memories, entries and one context document
//! per memory, in one SQLite file, with an FTS5 index over the entries. Every write is one
//! transaction, so a process killed mid-call leaves the store as it was before the call or
//! after it, never between.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use serde_json::Value;

const SCHEMA: &str = "
PRAGMA journal_mode = WAL;
PRAGMA synchronous = NORMAL;
CREATE TABLE IF NOT EXISTS memories (
    vault_id TEXT NOT NULL,
    memory_id TEXT NOT NULL,
    context TEXT NOT NULL DEFAULT '',
    context_time TEXT,
    PRIMARY KEY (vault_id, memory_id)
);
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY,
    vault_id TEXT NOT NULL,
    memory_id TEXT NOT NULL,
    summary TEXT NOT NULL,
    raw_entry TEXT NOT NULL,
    tags TEXT NOT NULL,
    time TEXT NOT NULL,
    key TEXT,
    UNIQUE (vault_id, memory_id, key)
);
CREATE VIRTUAL TABLE IF NOT EXISTS entries_fts USING fts5(summary, raw_entry, tags);
";

/// How many steps of SQLite's machine run between two questions of a progress handler.
const PROGRESS_STEPS: i32 = 1000;

/// One memory of one vault.
#[derive(Debug, Clone, Copy)]
pub struct MemoryRef<'a> {
    pub vault: &'a str,
    pub memory: &'a str,
}

/// An entry as the tools give it back.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    pub entry_id: i64,
    pub summary: String,
    pub raw_entry: String,
    pub tags: Value,
    pub time: String,
    /// The writer's own name for it, when it gave one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// A new entry.
pub struct NewEntry<'a> {
    pub summary: &'a str,
    pub raw_entry: &'a str,
    pub tags: &'a Value,
    pub time: &'a str,
    /// A writer's own name for the entry: an entry whose key is already stored in the
    /// memory is not stored again (a replay resumed after a crash repeats its last call).
    pub key: Option<&'a str>,
}

pub struct Store {
    db: Connection,
}

impl Store {
    /// Opens (or creates) the store in `path`.
    pub fn open(path: &Path) -> Result<Store, String> {
        let db = Connection::open(path).map_err(|e| format!("failed to open {}: {e}", path.display()))?;
        db.execute_batch(SCHEMA).map_err(|e| format!("failed to set up {}: {e}", path.display()))?;
        Ok(Store { db })
    }

    /// Runs `work` on the store with a progress handler that interrupts its statement once
    /// `give_up` says so (every few thousand steps of SQLite's machine); an interrupted
    /// statement fails with `OperationInterrupted`, and its transaction is rolled back.
    pub fn until<T>(
        &mut self,
        give_up: impl FnMut() -> bool + Send + 'static,
        work: impl FnOnce(&mut Store) -> T,
    ) -> T {
        // A handler that cannot be set leaves the work bounded by the queries' own caps.
        let _ = self.db.progress_handler(PROGRESS_STEPS, Some(give_up));
        let result = work(self);
        let _ = self.db.progress_handler(0, None::<fn() -> bool>);
        result
    }

    /// Stores an entry; returns its id and whether it is new (false: its key was stored).
    pub fn add_entry(&mut self, at: MemoryRef<'_>, entry: &NewEntry<'_>) -> rusqlite::Result<(i64, bool)> {
        let tx = self.db.transaction()?;
        ensure_memory(&tx, at)?;
        if let Some(key) = entry.key {
            let known: Option<i64> = tx
                .prepare_cached("SELECT id FROM entries WHERE vault_id = ?1 AND memory_id = ?2 AND key = ?3")?
                .query_row(params![at.vault, at.memory, key], |row| row.get(0))
                .optional()?;
            if let Some(id) = known {
                return Ok((id, false));
            }
        }
        let tags = entry.tags.to_string();
        tx.prepare_cached(
            "INSERT INTO entries (vault_id, memory_id, summary, raw_entry, tags, time, key)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?
        .execute(params![at.vault, at.memory, entry.summary, entry.raw_entry, tags, entry.time, entry.key])?;
        let id = tx.last_insert_rowid();
        tx.prepare_cached("INSERT INTO entries_fts (rowid, summary, raw_entry, tags) VALUES (?1, ?2, ?3, ?4)")?
            .execute(params![id, entry.summary, entry.raw_entry, tags_text(entry.tags)])?;
        tx.commit()?;
        Ok((id, true))
    }

    /// The `limit` latest entries of a memory, newest first.
    pub fn list_entries(&self, at: MemoryRef<'_>, limit: u32) -> rusqlite::Result<Vec<Entry>> {
        let mut statement = self.db.prepare_cached(
            "SELECT id, summary, raw_entry, tags, time, key FROM entries WHERE vault_id = ?1 AND memory_id = ?2
             ORDER BY time DESC, id DESC LIMIT ?3",
        )?;
        let rows = statement.query_map(params![at.vault, at.memory, limit], entry_of)?;
        rows.collect()
    }

    /// The entries of a memory that match `query` (FTS5 syntax), best first by BM25.
    pub fn search(&self, at: MemoryRef<'_>, query: &str, limit: u32) -> rusqlite::Result<Vec<(Entry, f64)>> {
        let mut statement = self.db.prepare_cached(
            "SELECT e.id, e.summary, e.raw_entry, e.tags, e.time, e.key, bm25(entries_fts) AS rank
             FROM entries_fts JOIN entries e ON e.id = entries_fts.rowid
             WHERE entries_fts MATCH ?1 AND e.vault_id = ?2 AND e.memory_id = ?3
             ORDER BY rank, e.id LIMIT ?4",
        )?;
        let rows = statement.query_map(params![query, at.vault, at.memory, limit], |row| {
            // BM25 is lower for better matches; the tools report a score that grows with it.
            Ok((entry_of(row)?, -row.get::<_, f64>(6)?))
        })?;
        rows.collect()
    }

    pub fn context(&self, at: MemoryRef<'_>) -> rusqlite::Result<(String, Option<String>)> {
        let found = self
            .db
            .prepare_cached("SELECT context, context_time FROM memories WHERE vault_id = ?1 AND memory_id = ?2")?
            .query_row(params![at.vault, at.memory], |row| Ok((row.get(0)?, row.get(1)?)))
            .optional()?;
        Ok(found.unwrap_or_default())
    }

    pub fn put_context(&mut self, at: MemoryRef<'_>, content: &str, time: &str) -> rusqlite::Result<()> {
        let tx = self.db.transaction()?;
        ensure_memory(&tx, at)?;
        tx.prepare_cached(
            "UPDATE memories SET context = ?3, context_time = ?4 WHERE vault_id = ?1 AND memory_id = ?2",
        )?
        .execute(params![at.vault, at.memory, content, time])?;
        tx.commit()
    }

    /// How many entries a memory holds.
    pub fn count(&self, at: MemoryRef<'_>) -> rusqlite::Result<i64> {
        self.db
            .prepare_cached("SELECT count(*) FROM entries WHERE vault_id = ?1 AND memory_id = ?2")?
            .query_row(params![at.vault, at.memory], |row| row.get(0))
    }
}

fn ensure_memory(tx: &rusqlite::Transaction<'_>, at: MemoryRef<'_>) -> rusqlite::Result<()> {
    tx.prepare_cached("INSERT OR IGNORE INTO memories (vault_id, memory_id) VALUES (?1, ?2)")?
        .execute(params![at.vault, at.memory])?;
    Ok(())
}

fn entry_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<Entry> {
    let tags: String = row.get(3)?;
    Ok(Entry {
        entry_id: row.get(0)?,
        summary: row.get(1)?,
        raw_entry: row.get(2)?,
        tags: serde_json::from_str(&tags).unwrap_or(Value::String(tags)),
        time: row.get(4)?,
        key: row.get(5)?,
    })
}

/// The words of tags, for the index: an object's keys and values, a list's items.
fn tags_text(tags: &Value) -> String {
    match tags {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Array(items) => items.iter().map(tags_text).collect::<Vec<_>>().join(" "),
        Value::Object(map) => map.iter().map(|(k, v)| format!("{k} {}", tags_text(v))).collect::<Vec<_>>().join(" "),
        other => other.to_string(),
    }
}

/// A question in plain words as an FTS5 query: each word quoted (so that `?`, `'` and
/// FTS5's operators in it are only text), once however often it is asked (a repeated
/// word adds nothing to BM25's order but costs FTS5 time with the square of the repeats),
/// any of them matching, BM25 ranking the rest.
pub fn words_query(text: &str) -> String {
    let mut seen = std::collections::HashSet::new();
    let words: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .filter(|w| seen.insert(w.clone()))
        .map(|w| format!("\"{w}\""))
        .collect();
    words.join(" OR ")
}
