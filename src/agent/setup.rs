//! The set-up of an episode's agent, the one value every kind builds its agent from:
//! [`AgentSetup`], decided before the episode's world is set up, and [`Lent`], what the
//! episode lends the agent once its world is there.

use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::config::AgentConfig;
use super::kinds::tool_calling::notes::SharedStores;
use super::{ModelFor, ProgramRoom};
use crate::domain::Task;
use crate::model::LanguageModel;

/// Lends the main agent's model again, for the task as given.
pub type LendAgain<'a> = &'a (dyn Fn(&Task) -> Arc<dyn LanguageModel> + Send + Sync);

/// What an episode's agent is built from, whatever its kind (each takes what it needs).
pub struct AgentSetup<'a> {
    /// The episode's id: the thread a memory agent keeps its state under, what an
    /// external agent is told.
    pub episode_id: &'a str,
    /// The task as the episode asks it (under a variant, its input rendered from the
    /// variant's prompt).
    pub task: &'a Task,
    /// The suite's agent, or its variant's.
    pub config: &'a AgentConfig,
    /// The main agent's model, as the episode's cast lent it, and the name it reports.
    pub model: Arc<dyn LanguageModel>,
    pub model_name: String,
    /// Lends the model again: a replay restored from another episode's skips the turns of
    /// a scripted model that replay played.
    pub lend_again: LendAgain<'a>,
    /// Each subagent's model, by actor.
    pub subagent_models: ModelFor,
    /// The system prompt rendered for the task, with what the environment adds.
    pub system: Option<String>,
    /// The agent's bounded notes, when it keeps them: as the task gives them, or as an
    /// earlier epoch left them.
    pub notes: Option<SharedStores>,
    /// The task's user opens the episode and the agent talks with it.
    pub conversation: bool,
    /// The run's folder (checkpoints, shared ingestions); `None` outside a run.
    pub run_dir: Option<&'a Path>,
    /// The world as an agent that fills it sees it.
    pub world: WorldFacts,
    /// What the kind's `prepare` left for its `build`: the kind's own type, read by it alone.
    pub prepared: Option<Box<dyn Any + Send>>,
}

/// What an agent that fills the world's store needs to know of the world before it starts.
#[derive(Debug, Clone, Default)]
pub struct WorldFacts {
    /// `kind:name` of the episode's environment: what an ingestion is shared within.
    pub environment: String,
    /// The file of the world's store, when the runner can fill it itself (a built-in
    /// store's): an ingestion another episode made can be restored into it before the
    /// world opens it.
    pub store: Option<PathBuf>,
}

/// What the episode lends its agent once the world is set up (the episode's state comes
/// with each turn).
pub struct Lent {
    /// Where a program runs, for a kind that runs one in the world's folder.
    pub room: Option<ProgramRoom>,
}
