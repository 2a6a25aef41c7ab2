//! The agent: a policy that decides. It owns its transcript, asks its language model, and
//! proposes tool calls. It never executes a tool: the environment does. [`AgentKind`] is
//! the list of kinds a suite can name.

mod kind;
pub mod memory;
pub mod plan;
mod subagent;
mod tool_calling;

pub use kind::{AgentKind, AgentParts};
pub use subagent::{DELEGATE_TOOL, EpisodeTree, ModelFor, SubagentCalls, Subagents, delegate_spec};
pub use tool_calling::ToolCallingAgent;

use async_trait::async_trait;

use crate::contract::{Actor, Observation, ToolCall, ToolSpec};
use crate::log::{Recorder, Usage};
use crate::model::limiter::Deadline;

/// What the environment lends the agent for one decision.
pub struct Turn<'a> {
    /// The results of the previous turn's calls, in the order of the calls; after a reset,
    /// the first observation. Empty after a turn that made no calls.
    pub observations: &'a [Observation],
    pub tools: &'a [ToolSpec],
    pub budget: Budget,
    /// Where the agent logs its model calls.
    pub recorder: &'a Recorder,
    /// What the world can tell the agent about the files it knows, and where a
    /// subagent's calls are run.
    pub world: &'a dyn WorldModelView,
    /// The episode's limits and what the whole tree of agents has spent of them.
    pub tree: &'a EpisodeTree,
}

/// The world as an agent may ask it about itself between turns: which of the files an
/// actor read or wrote have changed since (by a command, another agent, the user). The
/// environment answers; what to do with the answer is the agent's own code.
#[async_trait]
pub trait WorldModelView: Send + Sync {
    /// The files `actor` knows that changed since it last read or wrote them, each named
    /// once per change (see `environment::world_model`).
    async fn changed_files(&self, actor: &Actor) -> Vec<String>;

    /// Runs a subagent's call as the episode's loop runs the main agent's: checked by the
    /// permission rules (a `permission` event), then executed by the world. The loop of a
    /// subagent is the agent's code; running its calls is the environment's.
    async fn act(&self, call: &ToolCall, step: u32, recorder: &Recorder) -> Observation;
}

/// A world without files and without tools: nothing ever changes, and no call runs.
pub struct NoFiles;

#[async_trait]
impl WorldModelView for NoFiles {
    async fn changed_files(&self, _actor: &Actor) -> Vec<String> {
        Vec::new()
    }

    async fn act(&self, call: &ToolCall, _step: u32, _recorder: &Recorder) -> Observation {
        let error =
            crate::contract::ToolError::new(crate::contract::ErrorType::ToolNotFound, "this world has no tools");
        Observation::of_error(&call.call_id, error)
    }
}

/// What is left of the episode's limits when a turn starts.
#[derive(Debug, Clone)]
pub struct Budget {
    /// The number of this turn, from 1.
    pub step: u32,
    pub steps_left: u32,
    pub deadline: Deadline,
    pub tokens_left: Option<u64>,
}

/// The agent's decision: calls for the environment to run (possibly none).
#[derive(Debug, Default)]
pub struct Proposal {
    pub calls: Vec<ToolCall>,
    /// What the turn's model calls used, for the loop to count against the episode's
    /// limits. An agent that counted them in [`EpisodeTree`] itself (before it started
    /// subagents, which spend from the same budget) returns nothing here.
    pub usage: Usage,
    /// What the turn's model calls cost; `None` when a call had no price.
    pub cost_usd: Option<f64>,
    /// In a conversation: what the agent says to the task's user (its text reply).
    pub to_user: Option<String>,
}

/// A failure to decide that is nobody's answer (the model backend failed, a mock script
/// ran out). The episode ends unscored with `cause`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{cause}: {message}")]
pub struct AgentFault {
    pub cause: crate::log::UnscoredCause,
    pub message: String,
}

impl AgentFault {
    /// The fault a call's observation carries when the call failed for a cause that is
    /// nobody's answer (the runner's resources, the user): `FAULT_INFO` in its `info`.
    pub fn of_call(call: &ToolCall, obs: &Observation) -> Option<AgentFault> {
        let error = obs.error.as_ref()?;
        let cause = obs.info.get(crate::contract::FAULT_INFO).and_then(|c| c.as_str())?;
        let message = if cause == crate::log::UnscoredCause::UserError.as_str() {
            format!("`{}` failed: {}", call.name, error.message)
        } else {
            format!("`{}` failed for want of the runner's resources: {}", call.name, error.message)
        };
        Some(AgentFault { cause: crate::log::UnscoredCause::from_name(cause), message })
    }
}

#[async_trait]
pub trait Agent: Send {
    async fn propose(&mut self, turn: Turn<'_>) -> Result<Proposal, AgentFault>;
}
