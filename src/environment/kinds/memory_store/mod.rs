//! `memory_store`: a long-term memory as a world. Vaults hold memories; a memory holds
//! entries (a summary, the raw text, tags, a time) and one context document. Its tools
//! are the memory agent's protocol (seed 002): `add_entry`, `list_entries`, `get_context`,
//! `put_context`, `await_consistency`, and `search_entries`, ranked by SQLite's FTS5.
//!
//! The store is one SQLite file in the run folder (`memory_store/<episode id>.sqlite`),
//! kept after the run: a run killed mid-replay and resumed finds it as the last finished
//! call left it, and a reader can open it to see what an agent stored.

mod store;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};

use super::EnvironmentKind;
use crate::contract::{Actor, ErrorType, ToolAnnotations};
use crate::domain::Task;
use crate::environment::tool::{self, Tool, ToolDecl};
use crate::environment::{Definition, EnvLimits, Over, SetupContext, SetupError, ToolFailure, World, decode_arguments};
use crate::log::search::check_query;
pub use store::{Entry, MemoryRef, NewEntry, Store, words_query};

/// The folder of the run folder that holds the stores.
pub const FOLDER: &str = "memory_store";

/// The vault and memory a call names when it names none.
pub const DEFAULT_ID: &str = "default";

/// The kind `memory_store`.
pub struct MemoryStore;

#[async_trait]
impl EnvironmentKind for MemoryStore {
    fn name(&self) -> &'static str {
        "memory_store"
    }

    fn tools(&self) -> Vec<ToolDecl> {
        tool::offer(TOOLS)
    }

    async fn setup(
        &self,
        definition: &Definition,
        _task: &Task,
        context: &SetupContext<'_>,
    ) -> Result<Box<dyn World>, SetupError> {
        let failed = |message: String| SetupError { name: definition.name.clone(), message };
        let folder = context.run_dir.unwrap_or(context.work_root).join(FOLDER);
        let path = store_path(&folder, context.episode_id);
        std::fs::create_dir_all(&folder).map_err(|e| failed(format!("failed to create {}: {e}", folder.display())))?;
        let store = Store::open(&path).map_err(failed)?;
        Ok(Box::new(MemoryWorld::over(store, definition.limits.tool_timeout_s)))
    }

    fn store_file(&self, run_dir: &Path, episode_id: &str) -> Option<PathBuf> {
        Some(store_path(&run_dir.join(FOLDER), episode_id))
    }
}

/// Where the store of episode `episode_id` is, in `folder`.
pub fn store_path(folder: &Path, episode_id: &str) -> PathBuf {
    let safe: String = episode_id.chars().map(|c| if c.is_alphanumeric() || c == '-' { c } else { '_' }).collect();
    folder.join(format!("{safe}.sqlite"))
}

/// The tools of `memory_store`, in the order models are shown them.
pub const TOOLS: &[&dyn Tool<MemoryWorld>] =
    &[&AddEntry, &ListEntries, &SearchEntries, &GetContext, &PutContext, &AwaitConsistency];

pub struct MemoryWorld {
    store: Mutex<Store>,
    /// The episode's end (its deadline, the run's stop), once the loop has told it.
    over: OnceLock<Over>,
    /// The most one call may take (the definition's `tool_timeout_s`).
    call_limit: Duration,
}

impl MemoryWorld {
    /// A world over the store in `path` (created when missing).
    pub fn open(path: &Path) -> Result<MemoryWorld, String> {
        Ok(MemoryWorld::over(Store::open(path)?, EnvLimits::default().tool_timeout_s))
    }

    fn over(store: Store, call_limit_s: f64) -> MemoryWorld {
        MemoryWorld {
            store: Mutex::new(store),
            over: OnceLock::new(),
            call_limit: Duration::from_secs_f64(call_limit_s),
        }
    }

    /// Runs `f` on the store. The statements run inside the call's poll, where the loop's
    /// deadline cannot reach them: a progress handler interrupts them (and rolls their
    /// transaction back) once the episode is over or the call has taken its limit.
    fn with_store<T>(&self, f: impl FnOnce(&mut Store) -> rusqlite::Result<T>) -> Result<T, ToolFailure> {
        let until = Instant::now() + self.call_limit;
        let over = self.over.get().cloned();
        let give_up = move || Instant::now() >= until || over.as_ref().is_some_and(|over| over());
        // A poisoned lock only means another call panicked; every write is one transaction.
        let mut guard = self.store.lock().unwrap_or_else(|p| p.into_inner());
        guard.until(give_up, f).map_err(|e| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::OperationInterrupted) => ToolFailure::new(
                ErrorType::TimeoutError,
                "the store's work was stopped: the episode's time is up, or the call took its time limit",
            ),
            _ => ToolFailure::new(ErrorType::ExecutionError, format!("the store failed: {e}")),
        })
    }
}

#[async_trait]
impl World for MemoryWorld {
    async fn call(&self, actor: &Actor, name: &str, arguments: Value) -> Result<Value, ToolFailure> {
        tool::call(TOOLS, MemoryStore.name(), self, actor, name, arguments).await
    }

    fn begin(&self, over: Over) {
        let _ = self.over.set(over);
    }
}

/// The `vault_id` and `memory_id` every tool takes, both optional.
struct Ids {
    vault_id: String,
    memory_id: String,
}

impl Ids {
    /// The ids a call's arguments (already checked against the schema) give.
    fn of(arguments: &Value) -> Ids {
        let id = |key: &str| arguments.get(key).and_then(Value::as_str).unwrap_or(DEFAULT_ID).to_owned();
        Ids { vault_id: id("vault_id"), memory_id: id("memory_id") }
    }
}

impl Ids {
    fn at(&self) -> MemoryRef<'_> {
        MemoryRef { vault: &self.vault_id, memory: &self.memory_id }
    }
}

/// The schema of a tool's arguments: the ids, then its own properties.
fn schema(own: Value, required: &[&str]) -> Value {
    let mut properties = json!({
        "vault_id": {"type": "string", "minLength": 1, "description": "The vault (default `default`)."},
        "memory_id": {"type": "string", "minLength": 1, "description": "The memory in the vault (default `default`)."}
    });
    if let (Some(all), Value::Object(own)) = (properties.as_object_mut(), own) {
        all.extend(own);
    }
    json!({"type": "object", "properties": properties, "required": required, "additionalProperties": false})
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

struct AddEntry;

#[derive(Deserialize)]
struct AddArgs {
    summary: String,
    raw_entry: String,
    #[serde(default)]
    tags: Value,
    time: Option<String>,
    key: Option<String>,
}

#[async_trait]
impl Tool<MemoryWorld> for AddEntry {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations { read_only: false, destructive: false })
    }

    fn name(&self) -> &'static str {
        "add_entry"
    }

    fn description(&self) -> &'static str {
        "Record one message of the conversation in the memory: a summary of it, its raw text, and tags."
    }

    fn parameters(&self) -> Value {
        schema(
            json!({
                "summary": {"type": "string", "minLength": 1, "description": "What the message says that is worth remembering."},
                "raw_entry": {"type": "string", "description": "The message's text as it was."},
                "tags": {"type": ["object", "array", "string"], "description": "Metadata: role, topic, …"},
                "time": {"type": "string", "description": "When the message was said (RFC 3339); now when absent."},
                "key": {"type": "string", "minLength": 1, "description": "The writer's name for the entry: an entry with a key already stored is not stored again."}
            }),
            &["summary", "raw_entry"],
        )
    }

    async fn call(&self, world: &MemoryWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let ids = Ids::of(&arguments);
        let args: AddArgs = decode_arguments(arguments)?;
        let time = args.time.clone().unwrap_or_else(now);
        let entry = NewEntry {
            summary: &args.summary,
            raw_entry: &args.raw_entry,
            tags: &args.tags,
            time: &time,
            key: args.key.as_deref(),
        };
        let (id, stored) = world.with_store(|s| s.add_entry(ids.at(), &entry))?;
        Ok(json!({"entry_id": id, "stored": stored}))
    }
}

struct ListEntries;

#[derive(Deserialize)]
struct ListArgs {
    #[serde(default = "ten")]
    limit: u32,
}

fn ten() -> u32 {
    10
}

#[async_trait]
impl Tool<MemoryWorld> for ListEntries {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::READ_ONLY)
    }

    fn name(&self) -> &'static str {
        "list_entries"
    }

    fn description(&self) -> &'static str {
        "The latest entries of the memory, newest first."
    }

    fn parameters(&self) -> Value {
        schema(json!({"limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 10}}), &[])
    }

    async fn call(&self, world: &MemoryWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let ids = Ids::of(&arguments);
        let args: ListArgs = decode_arguments(arguments)?;
        let entries = world.with_store(|s| s.list_entries(ids.at(), args.limit))?;
        Ok(json!({ "entries": entries }))
    }
}

struct SearchEntries;

#[derive(Deserialize)]
struct SearchArgs {
    query: String,
    #[serde(default = "ten")]
    limit: u32,
    #[serde(default)]
    syntax: Syntax,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum Syntax {
    /// Plain words, any of which may match.
    #[default]
    Words,
    /// FTS5's own: phrases, `prefix*`, AND / OR / NOT.
    Fts5,
}

#[async_trait]
impl Tool<MemoryWorld> for SearchEntries {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::READ_ONLY)
    }

    fn name(&self) -> &'static str {
        "search_entries"
    }

    fn description(&self) -> &'static str {
        "Search the memory's entries (summaries, raw text, tags), best matches first."
    }

    fn parameters(&self) -> Value {
        schema(
            json!({
                "query": {"type": "string", "minLength": 1},
                "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 10},
                "syntax": {"type": "string", "enum": ["words", "fts5"], "default": "words",
                           "description": "`words`: any of the words; `fts5`: phrases, prefix*, AND/OR/NOT."}
            }),
            &["query"],
        )
    }

    async fn call(&self, world: &MemoryWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let ids = Ids::of(&arguments);
        let args: SearchArgs = decode_arguments(arguments)?;
        check_query(&args.query).map_err(|e| {
            ToolFailure::new(ErrorType::ValidationError, e).suggest("search for a few distinctive words or a phrase")
        })?;
        let query = match args.syntax {
            Syntax::Words => words_query(&args.query),
            Syntax::Fts5 => args.query.clone(),
        };
        if query.is_empty() {
            return Ok(json!({"entries": []}));
        }
        let found = world.with_store(|s| s.search(ids.at(), &query, args.limit)).map_err(|e| match e.kind {
            ErrorType::ExecutionError => {
                ToolFailure::new(ErrorType::ExecutionError, format!("the query `{}` failed: {}", args.query, e.message))
                    .suggest("use plain words (syntax `words`), or check the FTS5 query's quotes and operators")
            }
            _ => e,
        })?;
        let entries: Vec<Value> = found
            .into_iter()
            .map(|(entry, score)| {
                let mut value = json!(entry);
                if let Some(map) = value.as_object_mut() {
                    map.insert("score".into(), json!((score * 1e4).round() / 1e4));
                }
                value
            })
            .collect();
        Ok(json!({ "entries": entries }))
    }
}

struct GetContext;

#[async_trait]
impl Tool<MemoryWorld> for GetContext {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::READ_ONLY)
    }

    fn name(&self) -> &'static str {
        "get_context"
    }

    fn description(&self) -> &'static str {
        "The memory's context document: what earlier sessions were about, as last written."
    }

    fn parameters(&self) -> Value {
        schema(json!({}), &[])
    }

    async fn call(&self, world: &MemoryWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let ids = Ids::of(&arguments);
        let (context, time) = world.with_store(|s| s.context(ids.at()))?;
        Ok(json!({"context": context, "time": time}))
    }
}

struct PutContext;

#[derive(Deserialize)]
struct PutArgs {
    content: String,
}

#[async_trait]
impl Tool<MemoryWorld> for PutContext {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::DESTRUCTIVE)
    }

    fn name(&self) -> &'static str {
        "put_context"
    }

    fn description(&self) -> &'static str {
        "Replace the memory's context document with a new synthesis of the conversation."
    }

    fn parameters(&self) -> Value {
        schema(json!({"content": {"type": "string"}}), &["content"])
    }

    async fn call(&self, world: &MemoryWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let ids = Ids::of(&arguments);
        let args: PutArgs = decode_arguments(arguments)?;
        world.with_store(|s| s.put_context(ids.at(), &args.content, &now()))?;
        Ok(json!({"updated": true, "chars": args.content.chars().count()}))
    }
}

struct AwaitConsistency;

#[async_trait]
impl Tool<MemoryWorld> for AwaitConsistency {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::READ_ONLY)
    }

    fn name(&self) -> &'static str {
        "await_consistency"
    }

    fn description(&self) -> &'static str {
        "Wait until every entry written so far can be read and searched."
    }

    fn parameters(&self) -> Value {
        schema(json!({}), &[])
    }

    /// Every write is committed before its call returns, so the store is always
    /// consistent: the call reports what it holds.
    async fn call(&self, world: &MemoryWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let ids = Ids::of(&arguments);
        let entries = world.with_store(|s| s.count(ids.at()))?;
        Ok(json!({"consistent": true, "entries": entries}))
    }
}
