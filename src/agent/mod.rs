//! The agent: a policy that decides. It owns its transcript, asks its language model, and
//! proposes tool calls. It never executes a tool: the environment does.

mod tool_calling;

pub use tool_calling::ToolCallingAgent;

use async_trait::async_trait;

use crate::contract::{Observation, ToolCall, ToolSpec};
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
    pub usage: Usage,
    /// What the turn's model calls cost; `None` when a call had no price.
    pub cost_usd: Option<f64>,
}

/// A failure to decide that is nobody's answer (the model backend failed, a mock script
/// ran out). The episode ends unscored with `cause`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{cause}: {message}")]
pub struct AgentFault {
    pub cause: crate::log::UnscoredCause,
    pub message: String,
}

#[async_trait]
pub trait Agent: Send {
    async fn propose(&mut self, turn: Turn<'_>) -> Result<Proposal, AgentFault>;
}
