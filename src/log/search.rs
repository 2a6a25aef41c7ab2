//! Full-text search over a run: an SQLite FTS5 index of what its episodes said and did
//! (messages, tool calls, observations, answers, errors, score explanations), built from
//! `events.jsonl` into `RUN/search.sqlite`.
//!
//! The index is a projection, never the source of truth: it records the length and
//! modification time of the log it was built from, and is built again, whole, whenever the
//! log no longer matches (a resume or a regrade appended to it) or the index is missing,
//! unreadable or of another layout. It lives low in the layers (here, in `log`) because
//! `runner search` and the agent's `session_search` tool both read it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use rusqlite::{Connection, OptionalExtension as _, params};
use serde::Deserialize;
use serde_json::Value;

use super::event::Event;
use super::reader::{LineHeader, ReadError, for_each_line_of};
use crate::contract::{Actor, FINAL_TOOL};

/// The index's file in the run folder.
pub const INDEX_FILE: &str = "search.sqlite";

/// Bumped when the tables or what goes into them change: an index of another layout is
/// built again.
const LAYOUT: i64 = 1;

/// The most characters of one event's text that are indexed.
const MAX_DOC_CHARS: usize = 32 * 1024;

/// The most bytes and terms a model's full-text query may hold. FTS5's time grows with
/// the square of a query's matching terms, inside one step of SQLite's machine where no
/// progress handler is asked (8,000 repeats of one word over 200 rows took 28 s), so a
/// longer query is refused rather than run.
pub const MAX_QUERY_BYTES: usize = 4096;
pub const MAX_QUERY_TERMS: usize = 256;

/// The most characters of a query that an error or `runner search --json` repeats.
const SHOWN_QUERY_CHARS: usize = 200;

/// A query as it is repeated back: whole when short, else its first characters and how
/// long it was (a query of a million words is not printed back a million words long).
pub fn shown_query(query: &str) -> String {
    match query.char_indices().nth(SHOWN_QUERY_CHARS) {
        None => query.to_owned(),
        Some((at, _)) => format!("{}… ({} bytes in all)", &query[..at], query.len()),
    }
}

/// How many steps of SQLite's machine run between two questions of a progress handler.
const PROGRESS_STEPS: i32 = 1000;

/// Refuses a full-text query a model wrote that is longer than [`MAX_QUERY_BYTES`] or has
/// more than [`MAX_QUERY_TERMS`] terms (runs of letters and digits, FTS5's operators
/// `AND`, `OR`, `NOT`, `NEAR` not counted), saying which.
pub fn check_query(query: &str) -> Result<(), String> {
    if query.len() > MAX_QUERY_BYTES {
        return Err(format!(
            "the query is {} bytes; at most {MAX_QUERY_BYTES} are searched: ask with fewer words",
            query.len()
        ));
    }
    let terms = query
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty() && !["AND", "OR", "NOT", "NEAR"].contains(w))
        .count();
    if terms > MAX_QUERY_TERMS {
        return Err(format!(
            "the query has {terms} terms; at most {MAX_QUERY_TERMS} are searched: ask with fewer words"
        ));
    }
    Ok(())
}

/// Runs `work` on `conn` with a progress handler that interrupts any statement of it once
/// `give_up` says so; the handler is removed after.
pub fn interruptible<T>(
    conn: &mut Connection,
    give_up: impl FnMut() -> bool + Send + 'static,
    work: impl FnOnce(&mut Connection) -> T,
) -> T {
    // A handler that cannot be set leaves the work bounded by the query's own caps.
    let _ = conn.progress_handler(PROGRESS_STEPS, Some(give_up));
    let result = work(conn);
    let _ = conn.progress_handler(0, None::<fn() -> bool>);
    result
}

/// What a piece of indexed text is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DocKind {
    /// A model's text reply, a line of a conversation, a reminder.
    Message,
    /// A tool call: its name and arguments (the world's, a script's, or the agent's own).
    ToolCall,
    /// What a tool call returned, or its error.
    Observation,
    /// The final answer.
    Answer,
    /// A scorer's explanation.
    Score,
    /// A fault of the episode or of the agent.
    Error,
}

impl DocKind {
    pub const ALL: [DocKind; 6] =
        [DocKind::Message, DocKind::ToolCall, DocKind::Observation, DocKind::Answer, DocKind::Score, DocKind::Error];

    pub fn as_str(self) -> &'static str {
        match self {
            DocKind::Message => "message",
            DocKind::ToolCall => "tool_call",
            DocKind::Observation => "observation",
            DocKind::Answer => "answer",
            DocKind::Score => "score",
            DocKind::Error => "error",
        }
    }

    pub fn parse(name: &str) -> Result<DocKind, String> {
        DocKind::ALL.into_iter().find(|k| k.as_str() == name).ok_or_else(|| {
            let names: Vec<&str> = DocKind::ALL.iter().map(|k| k.as_str()).collect();
            format!("unknown type `{name}`, expected one of: {}", names.join(", "))
        })
    }
}

/// The statuses an episode can have in the index: the episodes table's, and `unfinished`
/// for one the log saw start but never finish.
pub const STATUSES: [&str; 5] = ["passed", "failed", "unscored", "cancelled", "unfinished"];

/// Checks an `--outcome`: one of [`STATUSES`], or `scored` (passed or failed).
pub fn parse_outcome(name: &str) -> Result<String, String> {
    if name == "scored" || STATUSES.contains(&name) {
        Ok(name.to_owned())
    } else {
        Err(format!("unknown outcome `{name}`, expected one of: scored, {}", STATUSES.join(", ")))
    }
}

/// Which episodes and texts a search looks at; `None` is any.
#[derive(Debug, Clone, Default)]
pub struct Filters {
    pub suite: Option<String>,
    pub task: Option<String>,
    pub model: Option<String>,
    /// A status of [`STATUSES`], or `scored`.
    pub outcome: Option<String>,
    /// `main`, `main.1`, `user`; a score's actor is `scorer`.
    pub actor: Option<String>,
    pub kind: Option<DocKind>,
    /// Leave out the episodes of this task (the agent's own, for `session_search`).
    pub not_task: Option<String>,
}

/// One match.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Hit {
    pub run_id: String,
    pub episode_id: String,
    pub suite: String,
    pub task_id: String,
    pub model: String,
    pub epoch: u32,
    /// The episode's status under its latest scoring.
    pub outcome: String,
    /// The step of the event; `None` for a score, which comes after the last step.
    pub step: Option<u32>,
    pub actor: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// The tool's name for a call or an observation, the scorer's for a score.
    pub name: Option<String>,
    /// The matching part of the text, the matched terms between `[` and `]`.
    pub snippet: String,
    /// The relevance (BM25, higher is better): comparable within one run's index.
    pub score: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum SearchError {
    #[error(transparent)]
    Log(#[from] ReadError),
    #[error("failed to build or read the search index {path}: {message}")]
    Index { path: String, message: String },
    /// The search was given up (the episode's time ran out, or the run was stopped).
    #[error("the search was stopped before it ended (the time is up, or the run was stopped)")]
    Stopped,
    /// The query (as [`shown_query`] cuts it) is not valid FTS5 syntax.
    #[error(
        "bad query {query:?}: {message} (words match words, \"a phrase\" in double quotes, pre* a prefix, AND, OR, NOT and parentheses; quote a word that is an operator or holds punctuation)"
    )]
    Query { query: String, message: String },
}

/// How the index was had when it was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// It matched the log as it is.
    Current,
    /// There was none: it was built.
    Built,
    /// It no longer matched the log (or was of another layout): it was built again.
    Rebuilt,
}

/// A run's search index, open.
pub struct SearchIndex {
    conn: Connection,
    path: PathBuf,
    pub freshness: Freshness,
    /// The run's id, from its log.
    pub run_id: String,
    /// Set when the run folder could not be written: the index was built in memory.
    pub in_memory: bool,
}

/// What the index records of the log it was built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LogStamp {
    len: i64,
    mtime_ns: i64,
}

impl LogStamp {
    fn of(log: &Path) -> std::io::Result<LogStamp> {
        let meta = std::fs::metadata(log)?;
        let mtime_ns = meta
            .modified()?
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        Ok(LogStamp { len: i64::try_from(meta.len()).unwrap_or(i64::MAX), mtime_ns })
    }
}

impl SearchIndex {
    /// The index of the run whose log is `RUN_DIR/events.jsonl`: the one on disk when it
    /// matches the log, else a new one built from the log (written beside it, renamed into
    /// place whole).
    pub fn open(run_dir: &Path) -> Result<SearchIndex, SearchError> {
        let log = run_dir.join("events.jsonl");
        let path = run_dir.join(INDEX_FILE);
        let failed = |message: String| SearchError::Index { path: path.display().to_string(), message };
        let stamp = LogStamp::of(&log).map_err(|e| ReadError::Io { path: log.display().to_string(), source: e })?;
        let existed = path.exists();
        if existed && let Some((conn, run_id)) = current(&path, stamp) {
            return Ok(SearchIndex { conn, path, freshness: Freshness::Current, run_id, in_memory: false });
        }
        let freshness = if existed { Freshness::Rebuilt } else { Freshness::Built };
        // The mode a plain new file gets (0666 less the umask), as the run's other files.
        let staged = tempfile::Builder::new()
            .prefix(".search.")
            .suffix(".sqlite.tmp")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .tempfile_in(run_dir);
        let Ok(staged) = staged else {
            // A run folder that cannot be written (a baseline checked out read-only): the
            // index lives in memory for this reading.
            let conn = Connection::open_in_memory().map_err(|e| failed(e.to_string()))?;
            let run_id = build(&conn, &log, stamp).map_err(|e| e.into_search(&path))?;
            return Ok(SearchIndex { conn, path, freshness, run_id, in_memory: true });
        };
        let conn = Connection::open(staged.path()).map_err(|e| failed(e.to_string()))?;
        let run_id = build(&conn, &log, stamp).map_err(|e| e.into_search(&path))?;
        drop(conn);
        staged.persist(&path).map_err(|e| failed(e.error.to_string()))?;
        let conn = Connection::open(&path).map_err(|e| failed(e.to_string()))?;
        Ok(SearchIndex { conn, path, freshness, run_id, in_memory: false })
    }

    /// Where the index is (or would be, when it was built in memory).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many episodes and pieces of text the index holds.
    pub fn counts(&self) -> Result<(u64, u64), SearchError> {
        let count = |sql: &str| self.conn.query_row(sql, [], |r| r.get::<_, i64>(0)).map(|n| n.max(0) as u64);
        let failed =
            |e: rusqlite::Error| SearchError::Index { path: self.path.display().to_string(), message: e.to_string() };
        Ok((
            count("SELECT count(*) FROM episodes WHERE latest = 1").map_err(failed)?,
            count("SELECT count(*) FROM docs").map_err(failed)?,
        ))
    }

    /// [`SearchIndex::search`], given up ([`SearchError::Stopped`]) once `give_up` says so:
    /// it is asked every few thousand steps of SQLite's machine.
    pub fn search_until(
        &mut self,
        query: &str,
        filters: &Filters,
        limit: usize,
        mut give_up: impl FnMut() -> bool + Send + 'static,
    ) -> Result<Vec<Hit>, SearchError> {
        if give_up() {
            return Err(SearchError::Stopped);
        }
        let (path, run_id) = (&self.path, &self.run_id);
        interruptible(&mut self.conn, give_up, |conn| matches(conn, (path, run_id), query, filters, limit))
    }

    /// The best `limit` matches of `query` (FTS5 syntax), best first, among the latest
    /// attempt of each episode.
    pub fn search(&self, query: &str, filters: &Filters, limit: usize) -> Result<Vec<Hit>, SearchError> {
        matches(&self.conn, (&self.path, &self.run_id), query, filters, limit)
    }
}

/// The search of [`SearchIndex::search`] on `conn`, the index at `path` of the run `run_id`.
fn matches(
    conn: &Connection,
    (path, run_id): (&Path, &str),
    query: &str,
    filters: &Filters,
    limit: usize,
) -> Result<Vec<Hit>, SearchError> {
    let sql = "SELECT e.episode_id, e.suite, e.task_id, e.model, e.epoch, e.status, \
                          docs.step, docs.actor, docs.kind, docs.name, \
                          snippet(docs, 0, '[', ']', '…', 16), bm25(docs) \
                   FROM docs JOIN episodes e ON e.id = docs.episode \
                   WHERE docs MATCH ?1 AND e.latest = 1 \
                     AND (?2 IS NULL OR e.suite = ?2) AND (?3 IS NULL OR e.task_id = ?3) \
                     AND (?4 IS NULL OR e.model = ?4) \
                     AND (?5 IS NULL OR e.status = ?5 OR (?5 = 'scored' AND e.status IN ('passed', 'failed'))) \
                     AND (?6 IS NULL OR docs.actor = ?6) AND (?7 IS NULL OR docs.kind = ?7) \
                     AND (?8 IS NULL OR e.task_id <> ?8) \
                   ORDER BY bm25(docs) LIMIT ?9";
    let failed = |e: rusqlite::Error| SearchError::Index { path: path.display().to_string(), message: e.to_string() };
    // The statement is fixed: a plain SQL error when it runs is FTS5 refusing the query.
    let bad = |e: rusqlite::Error| match &e {
        rusqlite::Error::SqliteFailure(code, _) if code.code == rusqlite::ErrorCode::OperationInterrupted => {
            SearchError::Stopped
        }
        rusqlite::Error::SqliteFailure(code, Some(message)) if code.code == rusqlite::ErrorCode::Unknown => {
            SearchError::Query { query: shown_query(query), message: message.clone() }
        }
        _ => failed(e),
    };
    let mut statement = conn.prepare_cached(sql).map_err(failed)?;
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = statement
        .query_map(
            params![
                query,
                filters.suite,
                filters.task,
                filters.model,
                filters.outcome,
                filters.actor,
                filters.kind.map(DocKind::as_str),
                filters.not_task,
                limit
            ],
            |r| {
                Ok(Hit {
                    run_id: run_id.to_owned(),
                    episode_id: r.get(0)?,
                    suite: r.get(1)?,
                    task_id: r.get(2)?,
                    model: r.get(3)?,
                    epoch: r.get(4)?,
                    outcome: r.get(5)?,
                    step: r.get(6)?,
                    actor: r.get(7)?,
                    kind: r.get(8)?,
                    name: r.get(9)?,
                    snippet: r.get(10)?,
                    score: -r.get::<_, f64>(11)?,
                })
            },
        )
        .map_err(bad)?;
    rows.collect::<Result<Vec<Hit>, _>>().map_err(bad)
}

/// The index at `path` and the run id it holds, when it can be read, has this layout and
/// was built from the log as it is now.
fn current(path: &Path, stamp: LogStamp) -> Option<(Connection, String)> {
    let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).ok()?;
    let get = |key: &str| -> Option<String> {
        conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get::<_, String>(0)).optional().ok()?
    };
    let same = get("layout")? == LAYOUT.to_string()
        && get("log_len")? == stamp.len.to_string()
        && get("log_mtime_ns")? == stamp.mtime_ns.to_string();
    let run_id = get("run_id")?;
    same.then_some((conn, run_id))
}

/// A failure while building: of the log, or of SQLite.
enum BuildError {
    Log(ReadError),
    Sql(rusqlite::Error),
}

impl From<rusqlite::Error> for BuildError {
    fn from(e: rusqlite::Error) -> Self {
        BuildError::Sql(e)
    }
}

impl BuildError {
    fn into_search(self, path: &Path) -> SearchError {
        match self {
            BuildError::Log(e) => SearchError::Log(e),
            BuildError::Sql(e) => SearchError::Index { path: path.display().to_string(), message: e.to_string() },
        }
    }
}

/// The fields of a `model_call` the index reads: its text, and whose call it was (a
/// grader's replies are not the episode's; its verdict is in the `score`).
#[derive(Deserialize)]
struct ModelCallText {
    step: u32,
    #[serde(default)]
    response: Value,
    #[serde(default)]
    scorer: Option<String>,
    #[serde(default)]
    actor: Actor,
}

/// A piece of text to index: the text, its step, its actor, what it is, and the tool or
/// scorer it belongs to.
struct Doc(String, Option<u32>, String, DocKind, Option<String>);

/// One attempt of an episode while the log is read: its row, and who made each call and
/// of which tool (an observation names only its call).
struct Attempt {
    row: i64,
    callers: HashMap<String, (String, String)>,
    /// The main agent's last text reply: a plain-text answer is indexed once, as a message.
    last_reply: Option<String>,
}

/// The index's tables, created empty, with the transaction the whole build runs in.
const SCHEMA: &str = "PRAGMA journal_mode = OFF; PRAGMA synchronous = OFF;
         CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
         CREATE TABLE episodes (id INTEGER PRIMARY KEY, episode_id TEXT NOT NULL, suite TEXT NOT NULL,
             task_id TEXT NOT NULL, model TEXT NOT NULL, epoch INTEGER NOT NULL, status TEXT NOT NULL,
             latest INTEGER NOT NULL);
         CREATE VIRTUAL TABLE docs USING fts5(text, episode UNINDEXED, step UNINDEXED, actor UNINDEXED,
             kind UNINDEXED, name UNINDEXED, tokenize = 'porter unicode61');
         BEGIN;";

/// The event types the index reads: the reader skips every other line without decoding it.
const INDEXED_KINDS: [&str; 15] = [
    "run_started",
    "episode_started",
    "model_call",
    "action_dispatched",
    "observation",
    "inner_call",
    "agent_action",
    "reminder",
    "said",
    "final",
    "error",
    "agent_error",
    "score",
    "episode_finished",
    "episode_scored",
];

/// Reads the log once into the tables; returns the run's id.
fn build(conn: &Connection, log: &Path, stamp: LogStamp) -> Result<String, BuildError> {
    conn.execute_batch(SCHEMA)?;
    let mut indexer = Indexer::new(conn)?;
    let mut sql_failure: Option<rusqlite::Error> = None;
    let read = for_each_line_of(log, Some(&INDEXED_KINDS), |kind, text, _| {
        let head: LineHeader = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if indexer.run_id.is_empty()
            && let Some(id) = &head.run_id
        {
            indexer.run_id = id.clone();
        }
        let Some(episode_id) = head.episode_id else { return Ok(()) };
        indexer.index_line(kind, text, &episode_id).map_err(|e| {
            let message = e.to_string();
            sql_failure = Some(e);
            message
        })
    });
    if let Some(e) = sql_failure {
        return Err(BuildError::Sql(e));
    }
    read.map_err(BuildError::Log)?;
    let run_id = indexer.finish();
    write_meta(conn, stamp, &run_id)?;
    conn.execute_batch("COMMIT; INSERT INTO docs (docs) VALUES ('optimize');")?;
    Ok(run_id)
}

/// Records what the index was built from, so that a later opening knows whether it is
/// still current.
fn write_meta(conn: &Connection, stamp: LogStamp, run_id: &str) -> rusqlite::Result<()> {
    let meta = [
        ("layout", LAYOUT.to_string()),
        ("log_len", stamp.len.to_string()),
        ("log_mtime_ns", stamp.mtime_ns.to_string()),
        ("run_id", run_id.to_owned()),
    ];
    for (key, value) in meta {
        conn.execute("INSERT INTO meta (key, value) VALUES (?1, ?2)", params![key, value])?;
    }
    Ok(())
}

/// The build's state while the log is read: the statements that fill the tables, and
/// which attempt of each episode is the latest and which are still open (the lines that
/// follow belong to them).
struct Indexer<'c> {
    conn: &'c Connection,
    insert_doc: rusqlite::Statement<'c>,
    insert_episode: rusqlite::Statement<'c>,
    set_status: rusqlite::Statement<'c>,
    retire: rusqlite::Statement<'c>,
    run_id: String,
    /// The row of the latest attempt of each episode seen.
    latest: HashMap<String, i64>,
    /// The attempts not finished yet, with their callers.
    open: HashMap<String, Attempt>,
}

impl<'c> Indexer<'c> {
    fn new(conn: &'c Connection) -> rusqlite::Result<Indexer<'c>> {
        Ok(Indexer {
            conn,
            insert_doc: conn
                .prepare("INSERT INTO docs (text, episode, step, actor, kind, name) VALUES (?1, ?2, ?3, ?4, ?5, ?6)")?,
            insert_episode: conn.prepare(
                "INSERT INTO episodes (episode_id, suite, task_id, model, epoch, status, latest) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 'unfinished', 1)",
            )?,
            set_status: conn.prepare("UPDATE episodes SET status = ?2 WHERE id = ?1")?,
            retire: conn.prepare("UPDATE episodes SET latest = 0 WHERE id = ?1")?,
            run_id: String::new(),
            latest: HashMap::new(),
            open: HashMap::new(),
        })
    }

    /// The run's id; the statements are finalised here, before the build commits.
    fn finish(self) -> String {
        self.run_id
    }

    /// One line of an episode: its texts go to the latest attempt of that episode.
    fn index_line(&mut self, kind: &str, text: &str, episode_id: &str) -> rusqlite::Result<()> {
        let docs = if kind == "model_call" {
            self.model_call_docs(text, episode_id)?
        } else {
            // A type this version cannot decode is skipped, as every fold does.
            let Ok(event) = serde_json::from_str::<Event>(text) else { return Ok(()) };
            self.event_docs(event, episode_id)?
        };
        let Some(row) = self.latest.get(episode_id) else { return Ok(()) };
        for Doc(text, step, actor, kind, name) in docs {
            if text.trim().is_empty() {
                continue;
            }
            self.insert_doc.execute(params![capped(text), row, step, actor, kind.as_str(), name])?;
        }
        Ok(())
    }

    /// A model's text reply, unless a grader gave it; the main agent's is also kept as the
    /// attempt's last reply, so that a plain-text answer is indexed once.
    fn model_call_docs(&mut self, text: &str, episode_id: &str) -> rusqlite::Result<Vec<Doc>> {
        let call: ModelCallText = serde_json::from_str(text).map_err(|e| text_error(e.to_string()))?;
        let reply = call.response.get("text").and_then(Value::as_str).unwrap_or_default();
        if call.scorer.is_some() || reply.trim().is_empty() {
            return Ok(Vec::new());
        }
        if let Some(attempt) = self.open.get_mut(episode_id).filter(|_| call.actor.is_main()) {
            attempt.last_reply = Some(reply.to_owned());
        }
        Ok(vec![Doc(reply.to_owned(), Some(call.step), call.actor.to_string(), DocKind::Message, None)])
    }

    /// The texts of one event, after the attempt bookkeeping the event asks for.
    fn event_docs(&mut self, event: Event, episode_id: &str) -> rusqlite::Result<Vec<Doc>> {
        match event {
            Event::EpisodeStarted { suite, task_id, model, epoch, .. } => {
                if let Some(earlier) = self.latest.get(episode_id) {
                    self.retire.execute([earlier])?;
                }
                self.insert_episode.execute(params![episode_id, suite, task_id, model, epoch])?;
                let row = self.conn.last_insert_rowid();
                self.latest.insert(episode_id.to_owned(), row);
                self.open.insert(episode_id.to_owned(), Attempt { row, callers: HashMap::new(), last_reply: None });
            }
            Event::EpisodeFinished { outcome, .. } => {
                if let Some(attempt) = self.open.remove(episode_id) {
                    self.set_status.execute(params![attempt.row, status(&outcome)])?;
                }
            }
            Event::EpisodeScored { outcome, .. } => {
                if let Some(row) = self.latest.get(episode_id) {
                    self.set_status.execute(params![row, status(&outcome)])?;
                }
            }
            // The final answer is indexed once, from its `final` event.
            Event::ActionDispatched { call, .. } if call.name == FINAL_TOOL => {}
            Event::ActionDispatched { step, call } => {
                let actor = call.actor.to_string();
                if let Some(attempt) = self.open.get_mut(episode_id) {
                    attempt.callers.insert(call.call_id.clone(), (actor.clone(), call.name.clone()));
                }
                let text = format!("{} {}", call.name, value_text(&call.arguments));
                return Ok(vec![Doc(text, Some(step), actor, DocKind::ToolCall, Some(call.name))]);
            }
            Event::Observation { step, observation } => {
                return Ok(self.observation_docs(episode_id, step, &observation));
            }
            Event::Final { step, answer, .. } => {
                let said = self.open.get(episode_id).and_then(|a| a.last_reply.as_deref());
                if said.is_some_and(|said| said.trim() == answer.trim()) {
                    return Ok(Vec::new()); // a plain-text answer: indexed as the message it was
                }
                return Ok(vec![Doc(answer, Some(step), "main".into(), DocKind::Answer, None)]);
            }
            event => return Ok(self_contained_docs(event)),
        }
        Ok(Vec::new())
    }

    /// What a call returned, under the actor and tool that made the call (an observation
    /// names only its call).
    fn observation_docs(&self, episode_id: &str, step: u32, observation: &crate::contract::Observation) -> Vec<Doc> {
        let Some((actor, name)) = self
            .open
            .get(episode_id)
            .zip(observation.call_id.as_deref())
            .map(|(a, id)| a.callers.get(id).cloned())
            .unwrap_or(Some(("main".to_owned(), String::new())))
        else {
            return Vec::new(); // the observation of a final answer
        };
        let name = Some(name).filter(|n| !n.is_empty());
        vec![Doc(observation_text(observation), Some(step), actor, DocKind::Observation, name)]
    }
}

/// The texts of an event that carries all it needs: calls made inside a script or by the
/// agent itself, conversation lines, faults and scorers' explanations.
fn self_contained_docs(event: Event) -> Vec<Doc> {
    match event {
        Event::InnerCall { step, call, observation, .. } => {
            let actor = call.actor.to_string();
            let text = format!("{} {}", call.name, value_text(&call.arguments));
            vec![
                Doc(text, Some(step), actor.clone(), DocKind::ToolCall, Some(call.name.clone())),
                Doc(observation_text(&observation), Some(step), actor, DocKind::Observation, Some(call.name)),
            ]
        }
        Event::AgentAction { step, actor, name, arguments, result, error, .. } => {
            let actor = actor.to_string();
            let call = format!("{name} {}", value_text(&arguments));
            let mut answer = value_text(&result);
            if let Some(error) = error {
                answer = format!("{answer} {}", error.message);
            }
            vec![
                Doc(call, Some(step), actor.clone(), DocKind::ToolCall, Some(name.clone())),
                Doc(answer, Some(step), actor, DocKind::Observation, Some(name)),
            ]
        }
        Event::Reminder { step, actor, text, .. } | Event::Said { step, actor, text } => {
            vec![Doc(text, Some(step), actor.to_string(), DocKind::Message, None)]
        }
        Event::Error { step, cause, message } => {
            vec![Doc(format!("{cause} {message}"), Some(step), "main".into(), DocKind::Error, None)]
        }
        Event::AgentError { step, message } => vec![Doc(message, Some(step), "main".into(), DocKind::Error, None)],
        Event::Score { scorer, explanation, .. } => {
            vec![Doc(explanation, None, "scorer".into(), DocKind::Score, Some(scorer))]
        }
        _ => Vec::new(),
    }
}

/// A line that is not the event it says it is, as an SQLite error so that it stops the
/// build where it was found.
fn text_error(message: String) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(message.into())
}

fn status(outcome: &super::Outcome) -> &'static str {
    match outcome {
        super::Outcome::Scored { passed: true, .. } => "passed",
        super::Outcome::Scored { passed: false, .. } => "failed",
        super::Outcome::Unscored { .. } => "unscored",
        super::Outcome::Cancelled => "cancelled",
    }
}

fn observation_text(observation: &crate::contract::Observation) -> String {
    let mut text = observation.tool_result.as_ref().map(value_text).unwrap_or_default();
    for message in &observation.messages {
        text = format!("{text} {message}");
    }
    if let Some(error) = &observation.error {
        text = format!("{} {} {text}", error.kind.as_str(), error.message);
    }
    text
}

/// The words of a JSON value: strings as they are, numbers and booleans as written, keys
/// before their values.
fn value_text(value: &Value) -> String {
    fn walk(value: &Value, out: &mut String) {
        if out.len() > MAX_DOC_CHARS * 4 {
            return;
        }
        match value {
            Value::Null => {}
            Value::String(s) => {
                out.push_str(s);
                out.push(' ');
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            Value::Object(map) => {
                for (k, v) in map {
                    out.push_str(k);
                    out.push(' ');
                    walk(v, out);
                }
            }
            other => {
                out.push_str(&other.to_string());
                out.push(' ');
            }
        }
    }
    let mut out = String::new();
    walk(value, &mut out);
    out.truncate(out.trim_end().len());
    out
}

/// At most [`MAX_DOC_CHARS`] characters of `text`.
fn capped(text: String) -> String {
    match text.char_indices().nth(MAX_DOC_CHARS) {
        Some((end, _)) => text[..end].to_owned(),
        None => text,
    }
}

#[cfg(test)]
mod tests;
