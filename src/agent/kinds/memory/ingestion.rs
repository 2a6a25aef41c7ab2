//! One ingestion serving many episodes. What a replay leaves (the memory store, and the
//! thread's checkpointed state) depends only on the haystack, the model that wrote the
//! entries, the agent's ingest settings (`flush_every`, the storing prompts) and the
//! environment: its [`key`]. The first episode that needs a key replays the haystack and
//! saves the result under `results/<run-id>/ingestions/<key>/`; every later episode with
//! that key (another variant of the answering side, another epoch) restores it and makes
//! no model call to ingest.
//!
//! Two episodes that need one key at once: one holds the key's lock while it replays, the other
//! waits for it, then restores. The locks are this process's: a run folder has one runner
//! writing to it at a time (its `.lock`), and shards write folders of their own, which `merge`
//! joins (`carry`). A folder appears under its key only when it is whole (it is written aside
//! and renamed), so an ingestion killed midway is never reused.
//!
//! A replay killed midway is not lost either: whoever holds a key's lease is named in
//! `ingestions/.<key>.claim`, and the next episode to take the lease (the same one resumed,
//! or another epoch that got there first) takes over that replay where its checkpoint left
//! it, with the store it had filled, instead of starting the haystack again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::OwnedMutexGuard;

use super::checkpoint::ThreadState;
use super::prompts::{MemoryPrompts, Prompts};
use crate::domain::conversation::{ChatMessage, Session};
use crate::log::Usage;

/// The folder of the run folder that holds the finished ingestions.
pub const FOLDER: &str = "ingestions";

const STORE_FILE: &str = "store.sqlite";
const STATE_FILE: &str = "ingestion.json";

/// Who holds, or last held, a key's lease: what the next holder takes over.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    /// The episode whose thread the replay's state is checkpointed under.
    pub episode: String,
    /// The thread the replay's entries are keyed by (the first holder's episode).
    pub key_thread: String,
    /// The store the replay fills, relative to the run folder when it is in it (so that a
    /// run folder moved, or merged into another, still names it).
    pub store: PathBuf,
}

/// A suite's `agent: {kind: memory, ingest: {share: …}}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IngestSettings {
    /// One ingestion per key serves every episode that needs it (the default); `false`
    /// replays the haystack in every episode, each epoch and variant on its own.
    #[serde(default = "yes")]
    pub share: bool,
}

impl Default for IngestSettings {
    fn default() -> Self {
        IngestSettings { share: true }
    }
}

fn yes() -> bool {
    true
}

/// What determines an ingestion, each part as its digest or value; [`key`] hashes it.
pub struct KeyParts<'a> {
    pub sessions: &'a [Session],
    pub flush_every: u32,
    pub prompts: &'a MemoryPrompts,
    /// The model that writes the entries, and the sampling it is sent with.
    pub model: &'a str,
    pub sampling: &'a Map<String, Value>,
    /// The environment, as its kind and name.
    pub environment: &'a str,
}

/// The ingestion's key: the first 32 hex digits of the sha256 of what determines it.
pub fn key(parts: &KeyParts<'_>) -> String {
    let sessions: Vec<Value> =
        parts.sessions.iter().map(|s| json!({"id": s.id, "date": s.date, "messages": s.messages})).collect();
    let haystack = hex::encode(Sha256::digest(serde_json::to_vec(&sessions).unwrap_or_default()));
    let what = json!({
        "haystack": haystack,
        "flush_every": parts.flush_every,
        "prompts": Prompts::resolve(parts.prompts.clone()).ingest_digest(),
        "model": parts.model,
        "sampling": parts.sampling,
        "environment": parts.environment,
    });
    let digest = hex::encode(Sha256::digest(serde_json::to_vec(&what).unwrap_or_default()));
    digest[..32].to_owned()
}

/// A finished ingestion, as saved: the thread's state at the end of the replay (history
/// included), whose thread wrote the entries' keys, and what its model calls spent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ingested {
    pub key: String,
    /// The episode that replayed the haystack; its id is the thread of the entries' keys.
    pub episode: String,
    pub state: ThreadState,
    pub history: Vec<ChatMessage>,
    /// The model calls the replay made (a `mock` script's turns it played).
    pub model_calls: u32,
    pub usage: Usage,
    /// The episode whose attempt finished the replay and saved it. When that episode runs
    /// again (it was killed before it finished), it restores its own work and is charged
    /// for it (the state's `spent`); any other episode restores it for nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved_by: Option<String>,
}

impl Ingested {
    /// Puts the saved store in `store` (the episode's store file), replacing what is there.
    pub fn restore_into(&self, run_dir: &Path, store: &Path) -> Result<(), String> {
        let saved = run_dir.join(FOLDER).join(&self.key).join(STORE_FILE);
        clear_store(store)?;
        std::fs::copy(&saved, store)
            .map(|_| ())
            .map_err(|e| format!("failed to copy the ingestion {} to {}: {e}", saved.display(), store.display()))
    }

    /// The thread state an episode restored from this ingestion starts its answer from.
    pub fn thread_state(&self) -> ThreadState {
        ThreadState { conversation_history: self.history.clone(), ..self.state.clone() }
    }
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// The run's ingestions: the finished ones in the run folder, and a lock per key.
pub struct Ingestions {
    run_dir: PathBuf,
    locks: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// What an episode does about its key: restore a finished ingestion, or replay the
/// haystack holding the key's lock, and save the result.
pub enum Claim {
    Done(Box<Ingested>),
    Todo(Lease),
}

impl Ingestions {
    /// The ingestions of the run in `run_dir`: one table of locks per run folder in this
    /// process, whichever episode asks.
    pub fn of(run_dir: &Path) -> Arc<Ingestions> {
        static RUNS: std::sync::OnceLock<std::sync::Mutex<HashMap<PathBuf, Arc<Ingestions>>>> =
            std::sync::OnceLock::new();
        let mut runs = RUNS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
        runs.entry(run_dir.to_owned())
            .or_insert_with(|| {
                Arc::new(Ingestions { run_dir: run_dir.to_owned(), locks: std::sync::Mutex::new(HashMap::new()) })
            })
            .clone()
    }

    /// Waits while another episode replays the key's haystack, then says what to do.
    pub async fn claim(&self, key: &str, episode: &str, store: &Path) -> Result<Claim, String> {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            locks.entry(key.to_owned()).or_default().clone()
        };
        let guard = lock.lock_owned().await;
        if let Some(ingested) = self.finished(key)? {
            return Ok(Claim::Done(Box::new(ingested)));
        }
        let claim = self.run_dir.join(FOLDER).join(format!(".{key}.claim"));
        let earlier = match std::fs::read(&claim) {
            Ok(text) => serde_json::from_slice::<Holder>(&text).ok(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("failed to read {}: {e}", claim.display())),
        };
        let in_run = store.strip_prefix(&self.run_dir).unwrap_or(store);
        let mut holder =
            Holder { episode: episode.to_owned(), key_thread: episode.to_owned(), store: in_run.to_owned() };
        let taken_over = match earlier {
            Some(earlier) if earlier.episode != episode && self.run_dir.join(&earlier.store).exists() => {
                copy_store(&self.run_dir.join(&earlier.store), store)?;
                holder.key_thread = earlier.key_thread.clone();
                Some(earlier)
            }
            Some(earlier) if earlier.episode == episode => {
                holder.key_thread = earlier.key_thread;
                None
            }
            _ => None,
        };
        let text = serde_json::to_vec(&holder).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(self.run_dir.join(FOLDER))
            .and_then(|()| write_replacing(&claim, &text))
            .map_err(|e| format!("failed to write {}: {e}", claim.display()))?;
        Ok(Claim::Todo(Lease {
            _guard: guard,
            key: key.to_owned(),
            run_dir: self.run_dir.clone(),
            key_thread: holder.key_thread,
            taken_over: taken_over.map(|h| h.episode),
            episode: episode.to_owned(),
            store: store.to_owned(),
        }))
    }

    /// The finished ingestion of `key`, when there is one.
    fn finished(&self, key: &str) -> Result<Option<Ingested>, String> {
        let state = self.run_dir.join(FOLDER).join(key).join(STATE_FILE);
        let text = match std::fs::read_to_string(&state) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("failed to read {}: {e}", state.display())),
        };
        serde_json::from_str(&text).map(Some).map_err(|e| format!("{} cannot be read: {e}", state.display()))
    }
}

/// Carries run `from`'s ingestions into run `to` (a merge of shards): each finished key `to`
/// has not got, and the claim of each replay killed midway that `to` has no word of. A claim
/// names its store within the run folder, where the merge copies the stores.
pub fn carry(from: &Path, to: &Path) -> Result<(), String> {
    let (source, target) = (from.join(FOLDER), to.join(FOLDER));
    let failed = |path: &Path, e: std::io::Error| format!("failed to carry the ingestion {}: {e}", path.display());
    let entries = match std::fs::read_dir(&source) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(failed(&source, e)),
    };
    let mut claims = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| failed(&source, e))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        if let Some(key) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".claim")) {
            claims.push(key.to_owned());
            continue;
        }
        // A partial copy (`.<key>.<pid>.partial`) is nobody's: only whole folders are kept.
        if name.starts_with('.') || !path.join(STATE_FILE).is_file() {
            continue;
        }
        let done = target.join(name);
        if done.exists() {
            continue;
        }
        std::fs::create_dir_all(&done).map_err(|e| failed(&done, e))?;
        for file in [STORE_FILE, STATE_FILE] {
            std::fs::copy(path.join(file), done.join(file)).map_err(|e| failed(&path.join(file), e))?;
        }
    }
    if !claims.is_empty() {
        std::fs::create_dir_all(&target).map_err(|e| failed(&target, e))?;
    }
    for key in claims {
        let claim = format!(".{key}.claim");
        if target.join(&key).exists() || target.join(&claim).exists() {
            continue;
        }
        std::fs::copy(source.join(&claim), target.join(&claim)).map_err(|e| failed(&source.join(&claim), e))?;
    }
    Ok(())
}

/// The right to replay a key's haystack: held from the claim until the result is saved
/// (or the episode ends without it, and the next episode that needs the key replays it).
pub struct Lease {
    _guard: OwnedMutexGuard<()>,
    pub key: String,
    run_dir: PathBuf,
    /// The thread the replay's entries are keyed by: the episode's own, unless it took
    /// over a replay another episode began.
    pub key_thread: String,
    /// The episode whose killed replay this one goes on with: its checkpointed state is
    /// where this replay starts, and its store was copied into this episode's.
    pub taken_over: Option<String>,
    /// The episode that holds the lease.
    episode: String,
    /// The episode's store, which the replay fills.
    store: PathBuf,
}

/// Copies the SQLite store `from` (its log included) to `to`, replacing what is there.
fn copy_store(from: &Path, to: &Path) -> Result<(), String> {
    clear_store(to)?;
    let failed = |e: rusqlite::Error| format!("failed to copy the store {} to {}: {e}", from.display(), to.display());
    let db = rusqlite::Connection::open(from).map_err(failed)?;
    db.execute("VACUUM INTO ?1", [to.to_string_lossy()]).map(|_| ()).map_err(failed)
}

/// Removes the SQLite store `store` and its log files, and makes its folder, so that a copy
/// can take its place.
fn clear_store(store: &Path) -> Result<(), String> {
    for stale in [store.to_owned(), with_suffix(store, "-wal"), with_suffix(store, "-shm")] {
        match std::fs::remove_file(&stale) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("failed to remove {}: {e}", stale.display())),
        }
    }
    if let Some(parent) = store.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("failed to create {}: {e}", parent.display()))?;
    }
    Ok(())
}

/// Writes `path` whole: aside, then renamed over it.
fn write_replacing(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let aside = with_suffix(path, &format!(".{}.tmp", std::process::id()));
    std::fs::write(&aside, bytes)?;
    std::fs::rename(&aside, path)
}

impl Lease {
    /// Saves the replay's result under the key: a copy of the store taken through SQLite
    /// (so that what its log holds is in), and the thread's state, written aside and
    /// renamed into place.
    pub fn save(self, state: &ThreadState) -> Result<(), String> {
        let folder = self.run_dir.join(FOLDER);
        let aside = folder.join(format!(".{}.{}.partial", self.key, std::process::id()));
        let done = folder.join(&self.key);
        let failed =
            |what: &str, e: &dyn std::fmt::Display| format!("failed to save the ingestion {}: {what}: {e}", self.key);
        if aside.exists() {
            std::fs::remove_dir_all(&aside).map_err(|e| failed("a partial copy", &e))?;
        }
        std::fs::create_dir_all(&aside).map_err(|e| failed("its folder", &e))?;
        let db = rusqlite::Connection::open(&self.store).map_err(|e| failed("the store", &e))?;
        let copy = aside.join(STORE_FILE);
        db.execute("VACUUM INTO ?1", [copy.to_string_lossy()]).map_err(|e| failed("the store's copy", &e))?;
        let ingested = Ingested {
            key: self.key.clone(),
            episode: self.key_thread.clone(),
            state: state.clone(),
            history: state.conversation_history.clone(),
            model_calls: state.spent.model_calls,
            usage: state.spent.usage,
            saved_by: Some(self.episode.clone()),
        };
        let text = serde_json::to_vec(&ingested).map_err(|e| failed("its state", &e))?;
        std::fs::write(aside.join(STATE_FILE), text).map_err(|e| failed("its state", &e))?;
        if done.exists() {
            std::fs::remove_dir_all(&done).map_err(|e| failed("an older copy", &e))?;
        }
        std::fs::rename(&aside, &done).map_err(|e| failed("its folder", &e))?;
        // Finished: nobody takes over this replay any more.
        let _ = std::fs::remove_file(folder.join(format!(".{}.claim", self.key)));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_with(path: &Path, rows: &[&str]) {
        let db = rusqlite::Connection::open(path).unwrap();
        db.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE entries (key TEXT)").unwrap();
        for row in rows {
            db.execute("INSERT INTO entries VALUES (?1)", [row]).unwrap();
        }
        // Left open, its log not checkpointed into the file: as a killed process leaves it.
        std::mem::forget(db);
    }

    /// A replay's end state after `calls` model calls.
    fn spent(calls: u32) -> ThreadState {
        let mut state = ThreadState::default();
        for _ in 0..calls {
            state.spent.add(Usage { input_tokens: 10, output_tokens: 2, cached_tokens: 0 }, Some(0.5));
        }
        state
    }

    fn keys(path: &Path) -> Vec<String> {
        let db = rusqlite::Connection::open(path).unwrap();
        let mut statement = db.prepare("SELECT key FROM entries ORDER BY key").unwrap();
        statement.query_map([], |r| r.get(0)).unwrap().collect::<Result<_, _>>().unwrap()
    }

    /// Regression: a replay killed midway was started again from its first message by
    /// whichever episode took the key's lease first after a resume, another epoch's
    /// included, so the resumed run stored everything a second time.
    #[tokio::test]
    async fn the_next_holder_of_a_key_takes_over_the_replay_killed_midway_with_its_store() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        std::fs::create_dir_all(&run).unwrap();
        let ingestions = Ingestions { run_dir: run.clone(), locks: std::sync::Mutex::new(HashMap::new()) };
        let (first, second) = (dir.path().join("ep_1.sqlite"), dir.path().join("ep_2.sqlite"));
        let Claim::Todo(lease) = ingestions.claim("k", "ep_1", &first).await.unwrap() else { panic!("nothing saved") };
        assert_eq!((lease.key_thread.as_str(), lease.taken_over.as_deref()), ("ep_1", None));
        store_with(&first, &["ep_1/s1/1", "ep_1/s1/2"]);
        drop(lease); // killed before the replay ended

        store_with(&second, &["stale"]);
        let Claim::Todo(lease) = ingestions.claim("k", "ep_2", &second).await.unwrap() else { panic!("nothing saved") };
        assert_eq!(lease.taken_over.as_deref(), Some("ep_1"), "the second holder goes on with the first's replay");
        assert_eq!(lease.key_thread, "ep_1", "its entries keep the first thread's keys");
        assert_eq!(keys(&second), ["ep_1/s1/1", "ep_1/s1/2"], "the first holder's store, its log included");
        drop(lease);

        // The first episode, resumed after it, takes over from the second in turn, keys unchanged.
        let Claim::Todo(lease) = ingestions.claim("k", "ep_1", &first).await.unwrap() else { panic!("nothing saved") };
        assert_eq!((lease.key_thread.as_str(), lease.taken_over.as_deref()), ("ep_1", Some("ep_2")));
        lease.save(&spent(3)).unwrap();
        assert!(!run.join(FOLDER).join(".k.claim").exists(), "a finished replay is nobody's to take over");
        let Claim::Done(done) = ingestions.claim("k", "ep_3", &dir.path().join("ep_3.sqlite")).await.unwrap() else {
            panic!("the replay was saved")
        };
        assert_eq!((done.episode.as_str(), done.model_calls), ("ep_1", 3));
        assert_eq!(done.saved_by.as_deref(), Some("ep_1"), "the episode whose attempt saved it");
    }

    /// Regression: a merge of shards left their ingestions behind, so the merged run resumed
    /// replayed every haystack again, and a replay killed in a shard from its first message.
    #[tokio::test]
    async fn a_merge_carries_finished_ingestions_and_replays_killed_midway() {
        let dir = tempfile::tempdir().unwrap();
        let of = |run: &Path| Ingestions { run_dir: run.to_owned(), locks: std::sync::Mutex::new(HashMap::new()) };
        let (a, b, merged) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("merged"));
        for run in [&a, &b, &merged] {
            std::fs::create_dir_all(run.join("memory_store")).unwrap();
        }
        let killed = a.join("memory_store/ep_1.sqlite");
        let Claim::Todo(lease) = of(&a).claim("k1", "ep_1", &killed).await.unwrap() else { panic!("nothing saved") };
        store_with(&killed, &["ep_1/s1/1"]);
        drop(lease);
        let finished = b.join("memory_store/ep_2.sqlite");
        let Claim::Todo(lease) = of(&b).claim("k2", "ep_2", &finished).await.unwrap() else { panic!("nothing saved") };
        store_with(&finished, &["ep_2/s1/1"]);
        lease.save(&spent(2)).unwrap();

        for run in [&a, &b] {
            carry(run, &merged).unwrap();
        }
        // The merge copies the stores, logs included, under their names.
        for name in ["ep_1.sqlite", "ep_1.sqlite-wal", "ep_1.sqlite-shm"] {
            std::fs::copy(a.join("memory_store").join(name), merged.join("memory_store").join(name)).unwrap();
        }
        // The shards are gone once merged: the claim names the merged run's copy of the store.
        std::fs::remove_dir_all(&a).unwrap();
        let resumed = merged.join("memory_store/ep_3.sqlite");
        let Claim::Todo(lease) = of(&merged).claim("k1", "ep_3", &resumed).await.unwrap() else {
            panic!("k1 was never finished")
        };
        assert_eq!(lease.taken_over.as_deref(), Some("ep_1"), "the killed replay goes on in the merged run");
        assert_eq!(keys(&resumed), ["ep_1/s1/1"]);
        drop(lease);
        let Claim::Done(done) =
            of(&merged).claim("k2", "ep_4", &merged.join("memory_store/ep_4.sqlite")).await.unwrap()
        else {
            panic!("k2 was finished in b")
        };
        assert_eq!((done.episode.as_str(), done.model_calls), ("ep_2", 2));
        done.restore_into(&merged, &merged.join("memory_store/ep_4.sqlite")).unwrap();
        assert_eq!(keys(&merged.join("memory_store/ep_4.sqlite")), ["ep_2/s1/1"]);
    }

    fn session(text: &str) -> Session {
        Session {
            id: "s1".into(),
            date: Some("2023-05-20T00:00:00Z".into()),
            messages: vec![ChatMessage { role: "user".into(), content: text.into() }],
        }
    }

    #[test]
    fn the_key_changes_with_each_part_that_decides_the_ingestion_and_only_those() {
        let sessions = [session("my dog is Rex")];
        let prompts = MemoryPrompts::default();
        let sampling = Map::new();
        let base = KeyParts {
            sessions: &sessions,
            flush_every: 6,
            prompts: &prompts,
            model: "openai/m",
            sampling: &sampling,
            environment: "memory_store:memory_store",
        };
        let k = key(&base);
        assert_eq!(k, key(&base), "a key is stable");
        let other_sessions = [session("my dog is Max")];
        assert_ne!(k, key(&KeyParts { sessions: &other_sessions, ..base }));
        assert_ne!(k, key(&KeyParts { flush_every: 5, ..base }));
        assert_ne!(k, key(&KeyParts { model: "openai/other", ..base }));
        assert_ne!(k, key(&KeyParts { environment: "mcp:mem", ..base }));
        let mut hot = Map::new();
        hot.insert("temperature".into(), json!(1.0));
        assert_ne!(k, key(&KeyParts { sampling: &hot, ..base }));
        let capture = MemoryPrompts { entry_capture: Some("Store everything.".into()), ..MemoryPrompts::default() };
        assert_ne!(k, key(&KeyParts { prompts: &capture, ..base }));
        // The answering prompt is not the ingestion's.
        let answer = MemoryPrompts { answer: Some("Answer in one word.".into()), ..MemoryPrompts::default() };
        assert_eq!(k, key(&KeyParts { prompts: &answer, ..base }));
    }
}
