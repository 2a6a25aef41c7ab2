//! Kinds of environment, in one explicit table: [`KINDS`]. A kind is a value that names
//! itself, offers its tools, and sets up a fresh world for each episode. A suite's
//! `environment:` and an environment file's `kind:` are looked up here, and nowhere else.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::Value;

use super::definition::Definition;
use super::kv::Kv;
use super::mcp::Mcp;
use super::python::Python;
use super::sandbox::SandboxMode;
use super::shell::Shell;
use super::tool::ToolDecl;
use super::web::Web;
use super::writing::Writing;
use super::{SetupError, World};
use crate::domain::Task;
use crate::model::Backend;

/// Every kind of environment there is. Adding a kind is adding it here.
pub const KINDS: &[&dyn EnvironmentKind] = &[&Shell, &Kv, &Python, &Web, &Writing, &Mcp];

/// The kind named `name`.
pub fn find(name: &str) -> Option<&'static dyn EnvironmentKind> {
    KINDS.iter().copied().find(|k| k.name() == name)
}

/// The names of all kinds, for messages that list them.
pub fn names() -> Vec<&'static str> {
    KINDS.iter().map(|k| k.name()).collect()
}

/// A kind of environment: its name, its tools, and how a world of it starts.
#[async_trait]
pub trait EnvironmentKind: Send + Sync {
    /// The name suites and environment files use (`shell`).
    fn name(&self) -> &'static str;

    /// Every tool the kind can offer, `final_answer` included, in the order shown to models.
    fn tools(&self) -> Vec<ToolDecl>;

    /// A fresh world for one episode of `task`. A failure makes the episode unscored
    /// (`environment_error`).
    async fn setup(
        &self,
        definition: &Definition,
        task: &Task,
        context: &SetupContext<'_>,
    ) -> Result<Box<dyn World>, SetupError>;

    /// Open files one running tool call may hold, so that `-j` can be fitted to the
    /// process's limit. Zero for worlds that open none.
    fn open_files_per_call(&self) -> u64 {
        0
    }

    /// Tools known only once a world runs (MCP servers' tools): started once when the run
    /// starts, the tools to expose (`final_answer` included) and text for the agent's
    /// system prompt. `None` for a kind whose tools are `tools()`.
    async fn discover(
        &self,
        _definition: &Definition,
        _sandbox: SandboxMode,
    ) -> Result<Option<(Vec<ToolDecl>, String)>, String> {
        Ok(None)
    }

    /// Whether its worlds start processes, which then run in the sandbox (`sandbox.rs`).
    fn sandboxed(&self) -> bool {
        false
    }
}

/// What a kind may use to set up a world, besides its definition and the task.
pub struct SetupContext<'a> {
    /// The run's scratch folder, removed with the run: a world that needs a folder makes
    /// it in here.
    pub work_root: &'a Path,
    pub episode_id: &'a str,
    /// Model backends the world may call (to play a simulated user, say).
    pub models: Vec<Arc<Backend>>,
    /// State shared by the run's episodes (a memory kept across them, say).
    pub run_store: Option<Arc<RunStore>>,
    /// Whether the processes a world starts run in the sandbox: off only when the suite or
    /// the command line says so.
    pub sandbox: SandboxMode,
    /// The model that plays the task's simulated user, already lent to this episode.
    pub user_model: Option<Arc<dyn crate::model::LanguageModel>>,
    /// The run folder (`results/<run-id>`), kept after the run: for what every episode of
    /// the run, and the run resumed, must see the same (the `web` kind's page cache).
    /// `None` outside a run.
    pub run_dir: Option<&'a Path>,
}

impl<'a> SetupContext<'a> {
    /// A context with no models and no run-wide state.
    pub fn new(work_root: &'a Path, episode_id: &'a str) -> Self {
        SetupContext {
            work_root,
            episode_id,
            models: Vec::new(),
            run_store: None,
            sandbox: SandboxMode::On,
            user_model: None,
            run_dir: None,
        }
    }
}

/// Values that outlive one episode, by key, shared by the episodes of a run.
#[derive(Debug, Default)]
pub struct RunStore {
    values: Mutex<BTreeMap<String, Value>>,
}

impl RunStore {
    pub fn get(&self, key: &str) -> Option<Value> {
        self.with_values(|values| values.get(key).cloned())
    }

    /// Replaces the value under `key` with what `change` makes of the old one, at once for
    /// all episodes; returns the new value.
    pub fn update(&self, key: &str, change: impl FnOnce(Option<&Value>) -> Value) -> Value {
        self.with_values(|values| {
            let new = change(values.get(key));
            values.insert(key.to_owned(), new.clone());
            new
        })
    }

    fn with_values<T>(&self, f: impl FnOnce(&mut BTreeMap<String, Value>) -> T) -> T {
        // A poisoned lock only means another episode panicked; the map itself is intact.
        let mut guard = self.values.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }
}

#[cfg(test)]
#[path = "kind_tests.rs"]
mod tests;
