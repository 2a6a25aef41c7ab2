//! The nouns of a run that every part shares: a task and what is scripted for it, how scores
//! reduce over epochs, a scorer as written. Low in the layers: it knows no loader, no
//! model, no environment.

pub mod conversation;
pub mod document;
pub mod harbor;
pub mod scorer;
pub mod text;

pub use crate::contract::reduce::{PassK, Reducer};
pub use crate::contract::selection;

use std::collections::BTreeMap;
use std::path::{Component, Path};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use scorer::ScorerSpec;
use text::Text;

/// The longest an episode may be allowed to run: thirty days.
pub const MAX_EPISODE_S: f64 = 30.0 * 24.0 * 3600.0;

/// One thing to do.
#[derive(Debug, Clone)]
pub struct Task {
    pub id: String,
    pub input: String,
    pub target: Option<String>,
    pub files: BTreeMap<String, String>,
    pub metadata: Map<String, Value>,
    /// Scorers of this task alone; the suite's apply as well.
    pub scorers: Vec<ScorerSpec>,
    /// The scripted turns `--model mock` plays, templates already rendered.
    pub mock: Arc<[MockTurn]>,
    /// The scripted turns of each subagent (`main.1`, `main.1.2`, …) under `--model mock`,
    /// keyed by the actor's name; a subagent without a script has none (its first call
    /// finds the script run out).
    pub mock_subagents: Arc<BTreeMap<String, Arc<[MockTurn]>>>,
    /// The task's user's scripted answers to permission `ask` rules, given out in order.
    pub answers: Vec<String>,
    /// The task's user (`user:`), part of the world: it answers `ask_user`, `clarify`,
    /// `exit_plan_mode` and the permission `ask` rules, and in a conversation it talks.
    pub user: Option<Arc<UserSpec>>,
    /// SHA-256 over the task's content (input, target, files, metadata).
    pub digest: String,
    /// The entries the agent's bounded memory starts with (`memory:`), when it has one.
    pub memory: NoteEntries,
    /// The reference solution, shell commands the `oracle` agent runs in order (`solution:`,
    /// or a Harbor task's `solution/solve.sh`).
    pub solution: Vec<String>,
    /// Why the task cannot run on this host (a Harbor task that needs its image, or a
    /// program its Dockerfile installs): its episodes are unscored with this reason.
    pub unavailable: Option<String>,
    /// Files copied byte for byte, with their permissions, into the working directory
    /// after `files` (a Harbor task's binary or executable `COPY`s).
    pub copies: Vec<FileCopy>,
    /// The task's `tags:`, which `--tag` selects by.
    pub tags: Vec<String>,
    /// `pass_k: {k, n}`: the task runs n epochs and passes when k of them pass.
    pub pass_k: Option<PassK>,
    /// The task's `split:` (`train`, `test`, …; the suite's when the task names none), by
    /// which `runner serve` lists tasks to a trainer.
    pub split: Option<String>,
    /// Metadata the task shares with others, held once for all of them (a LoCoMo
    /// conversation, which each of its questions replays); the task's own wins.
    pub shared: Option<Arc<SharedMetadata>>,
}

/// Metadata several tasks share, and its digest (part of each task's).
#[derive(Debug, PartialEq)]
pub struct SharedMetadata {
    pub fields: Map<String, Value>,
    pub digest: String,
}

impl SharedMetadata {
    pub fn new(fields: Map<String, Value>) -> SharedMetadata {
        use sha2::{Digest, Sha256};
        let digest = hex::encode(Sha256::digest(Value::Object(fields.clone()).to_string().as_bytes()));
        SharedMetadata { fields, digest }
    }
}

/// A file of the host copied into an episode's working directory as it is: `from` is
/// opened beneath the folder `root`, through no link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileCopy {
    pub root: std::path::PathBuf,
    /// Relative to `root`, every link resolved when the task was loaded.
    pub from: std::path::PathBuf,
    /// Where, relative to the working directory.
    pub to: String,
}

/// The most characters of a metadata string an episode's log keeps.
pub const LOGGED_METADATA_CHARS: usize = 80;

impl Task {
    /// The task's own metadata entries whose values are strings, numbers or booleans, each
    /// string cut to [`LOGGED_METADATA_CHARS`]: what its episodes' logs carry for filtering.
    /// Lists, objects and shared metadata stay out: they can be large.
    pub fn logged_metadata(&self) -> Map<String, Value> {
        let mut out = Map::new();
        for (key, value) in &self.metadata {
            let kept = match value {
                Value::String(s) if s.chars().count() > LOGGED_METADATA_CHARS => {
                    Value::String(s.chars().take(LOGGED_METADATA_CHARS).collect())
                }
                Value::String(_) | Value::Number(_) | Value::Bool(_) => value.clone(),
                Value::Null | Value::Array(_) | Value::Object(_) => continue,
            };
            out.insert(key.clone(), kept);
        }
        out
    }

    /// A task with only an id and an input: no target, files, scorers, scripts, user or
    /// memory, and no digest (one made in code, not loaded from a suite).
    pub fn new(id: &str, input: &str) -> Task {
        Task {
            id: id.to_owned(),
            input: input.to_owned(),
            target: None,
            files: BTreeMap::new(),
            metadata: Map::new(),
            scorers: Vec::new(),
            mock: Arc::from(Vec::new()),
            mock_subagents: Arc::default(),
            answers: Vec::new(),
            user: None,
            digest: String::new(),
            memory: NoteEntries::default(),
            solution: Vec::new(),
            unavailable: None,
            copies: Vec::new(),
            tags: Vec::new(),
            pass_k: None,
            split: None,
            shared: None,
        }
    }

    /// A field of the task's metadata, its own or shared.
    pub fn metadata_field(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key).or_else(|| self.shared.as_ref()?.fields.get(key))
    }

    /// The task's metadata with the shared fields it does not override: a copy, for the
    /// few readers that want it whole (an external agent's task).
    pub fn full_metadata(&self) -> Map<String, Value> {
        let mut all = self.metadata.clone();
        if let Some(shared) = &self.shared {
            for (key, value) in &shared.fields {
                all.entry(key.clone()).or_insert_with(|| value.clone());
            }
        }
        all
    }
}

/// The entries of the agent's two memory stores (`agent/kinds/tool_calling/notes.rs`): a task's initial ones,
/// or what an episode left.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NoteEntries {
    pub memory: Vec<String>,
    pub user: Vec<String>,
}

impl NoteEntries {
    pub fn is_empty(&self) -> bool {
        self.memory.is_empty() && self.user.is_empty()
    }
}

impl Task {
    /// The variables templates see: `id`, `input`, `target` (undefined when the task has
    /// none, so that a scorer needing it fails at load), `metadata`, and each metadata
    /// field (a dataset's extra columns) by its own name.
    pub fn template_context(&self) -> Map<String, Value> {
        let mut ctx = self.metadata.clone();
        ctx.insert("id".into(), Value::String(self.id.clone()));
        ctx.insert("input".into(), Value::String(self.input.clone()));
        match &self.target {
            Some(target) => ctx.insert("target".into(), Value::String(target.clone())),
            None => ctx.remove("target"),
        };
        ctx.insert("metadata".into(), Value::Object(self.metadata.clone()));
        ctx
    }
}

/// The stop word a user says to end a conversation, unless the task names another.
pub const DEFAULT_STOP: &str = "###STOP###";

/// What a scripted user says when its script has run out, unless the task says (`then:`).
pub const DEFAULT_SCRIPT_END: &str = "I have nothing more to add.";

/// A task's user as written: scripted replies or a model playing a persona.
#[derive(Debug, Clone, PartialEq)]
pub struct UserSpec {
    pub kind: UserKind,
    /// `conversation: true`: the user opens the episode (the task's input is its first
    /// message), the agent's text replies go to it, and its stop word ends the episode.
    pub conversation: bool,
    /// The word that ends a conversation when a reply of the user contains it.
    pub stop: String,
    /// The turns `mock` plays as the simulated user (`mock_user:`): under `--model mock`,
    /// whatever the user's model, and when the user's model is `mock`.
    pub mock: Arc<[MockTurn]>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum UserKind {
    /// `script:` replies in order, then `then` every time.
    Scripted { replies: Vec<String>, then: String },
    /// A language model plays the user from the task's persona and instructions.
    Simulated { model: String, persona: String, instructions: String },
}

/// One scripted model turn: text, tool calls, or both.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MockTurn {
    pub text: Option<Text>,
    #[serde(default)]
    pub tool_calls: Vec<MockCall>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MockCall {
    pub name: String,
    #[serde(default = "empty_object")]
    pub arguments: Value,
    /// The id the model gives the call; the agent makes one when it is missing.
    pub id: Option<String>,
}

fn empty_object() -> Value {
    json!({})
}

/// A relative path that cannot climb out of the directory it is joined to.
pub fn is_relative_inside(name: &str) -> bool {
    let path = Path::new(name);
    !name.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}
