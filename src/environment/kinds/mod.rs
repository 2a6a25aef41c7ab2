//! The kinds of environment, each in its own file or folder, beside one explicit list:
//! [`KINDS`]. A kind is a value that names itself, offers its tools, decodes its own keys
//! of an environment file into [`KindSettings`], and sets up a fresh world for each
//! episode. A suite's `environment:` and an environment file's `kind:` are looked up here,
//! and nowhere else; the environment's core names no kind.

pub mod kv;
pub mod mcp;
pub mod memory_store;
pub mod python;
pub mod shell;
pub mod web;
pub mod writing;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;

use super::kind::SetupContext;
use super::tool::ToolDecl;
use super::{Definition, SetupError, World};
use crate::config::decode::ConfigError;
use crate::domain::Task;
use crate::sandbox::SandboxMode;
use kv::Kv;
use mcp::{Mcp, McpSpec};
use memory_store::MemoryStore;
use python::Python;
use shell::Shell;
use web::{Web, WebSetup};
use writing::{Style, Writing};

/// Every kind of environment there is. Adding a kind is adding it here.
pub const KINDS: &[&dyn EnvironmentKind] = &[&Shell, &Kv, &Python, &Web, &Writing, &Mcp, &MemoryStore];

/// The kind named `name`.
pub fn find(name: &str) -> Option<&'static dyn EnvironmentKind> {
    KINDS.iter().copied().find(|k| k.name() == name)
}

/// The names of all kinds, for messages that list them.
pub fn names() -> Vec<&'static str> {
    KINDS.iter().map(|k| k.name()).collect()
}

/// A kind of environment: its name, its tools, its own keys, and how a world of it starts.
#[async_trait]
pub trait EnvironmentKind: Send + Sync {
    /// The name suites and environment files use (`shell`).
    fn name(&self) -> &'static str;

    /// Every tool the kind can offer, `final_answer` included, in the order shown to models.
    fn tools(&self) -> Vec<ToolDecl>;

    /// The keys of an environment file that this kind takes beside the common ones
    /// (`definition.rs`); a file of another kind that gives one is refused.
    fn keys(&self) -> &'static [&'static str] {
        &[]
    }

    /// Decodes this kind's own keys of an environment file (those it declared in `keys`,
    /// as far as the file gives them) into its settings.
    fn decode_settings(&self, _keys: &KindKeys<'_>) -> Result<KindSettings, ConfigError> {
        Ok(KindSettings::Plain)
    }

    /// The settings of the kind named as a built-in, with no environment file.
    fn builtin_settings(&self) -> KindSettings {
        KindSettings::Plain
    }

    /// Whether its worlds make folders in the run's scratch folder
    /// ([`SetupContext::work_root`]); a run whose worlds make none makes no scratch folder.
    fn makes_folders(&self) -> bool {
        true
    }

    /// Why a suite cannot name this kind without an environment file of its own, named
    /// `name`; `None` when it can.
    fn needs_a_file(&self, _name: &str) -> Option<String> {
        None
    }

    /// What a file of kind `other` is told when it gives `key`, one of this kind's keys.
    fn refuse_key(&self, key: &str, other: &str) -> String {
        format!("only the `{}` kind takes `{key}:`; kind `{other}` takes no `{key}:`", self.name())
    }

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

    /// The file of an episode's store in the run folder `run_dir`, for a kind whose world
    /// keeps one the runner can fill before the world opens it (an agent restores a shared
    /// ingestion into it); `None` for the others.
    fn store_file(&self, _run_dir: &std::path::Path, _episode_id: &str) -> Option<PathBuf> {
        None
    }

    /// Whether its worlds start processes, which then run in the sandbox (`crates/sandbox/`).
    fn sandboxed(&self) -> bool {
        false
    }

    /// Whether its tools are known only once a world runs (`discover`): a file's `tools:`
    /// then names what discovery keeps, and it offers no `execute_code`.
    fn discovers_tools(&self) -> bool {
        false
    }
}

/// What a definition holds of its kind's own keys: one variant per kind that has any.
#[derive(Debug, Clone)]
pub enum KindSettings {
    /// A kind with no keys of its own (`shell`, `kv`), or a world written in code.
    Plain,
    /// `python:`: the interpreter its worlds run, when the file names one; a relative path
    /// already resolved against the file's folder.
    Python { interpreter: Option<PathBuf> },
    /// `web:`: what its worlds browse, read (and a corpus indexed) once; `None` until a
    /// file says.
    Web(Option<Arc<WebSetup>>),
    /// `style:` and `documents:`: the style rules of the room's documents, and its initial
    /// documents as files (`ID.md` → text).
    Writing { style: Style, documents: BTreeMap<String, String> },
    /// `servers:`, `prompts:`, `optional:`: the MCP servers; `None` until a file lists them.
    Mcp(Option<Arc<McpSpec>>),
    /// `image:` or `build:` of a `shell` world (or a Harbor task's own image): the image its
    /// episodes run in, prepared once for all of them.
    Image(Arc<shell::image::ShellImage>),
}

/// A kind's own keys of one environment file, handed to the kind to decode (split from
/// the common ones by the one rule every kind, of environment or agent, shares).
pub use crate::config::kind_keys::KindKeys;

/// The kind that takes `key`, when one does.
pub fn owner_of(key: &str) -> Option<&'static dyn EnvironmentKind> {
    KINDS.iter().copied().find(|k| k.keys().contains(&key))
}

#[cfg(test)]
mod tests;
