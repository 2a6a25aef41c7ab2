//! The agent: a policy that decides. It owns its transcript, asks its language model, and
//! proposes tool calls. It never executes a tool: the environment does. The kinds a suite
//! can name are in `kinds/`, each building its agent from one [`AgentSetup`].

mod config;
mod episode;
pub mod kinds;
mod setup;

pub use config::AgentConfig;
pub use episode::{CallError, Done, EpisodeState, Trajectory};
pub use kinds::cli::{CliAnswer, ProgramRoom, RoomInImage};
pub use kinds::tool_calling::notes;
pub use kinds::tool_calling::subagents::ModelFor;
pub use kinds::tool_calling::{ToolCallingAgent, plan};
pub use kinds::{AgentKind, AgentSettings};
pub use setup::{AgentSetup, Lent, WorldFacts};

use async_trait::async_trait;

use std::sync::Arc;

use crate::budget::Allowance;
use crate::contract::{Actor, CallFault, Observation, ToolCall, ToolSpec};
use crate::log::{Outcome, ProgramEnd, Recorder, Termination, UnscoredCause, Usage};

/// What the environment lends the agent for one decision.
pub struct Turn<'a> {
    /// The results of the previous turn's calls, in the order of the calls; after a reset,
    /// the first observation. Empty after a turn that made no calls.
    pub observations: &'a [Observation],
    pub tools: &'a [ToolSpec],
    /// What is left of the episode's limits as the turn starts.
    pub allowance: Allowance,
    /// Where the agent logs its model calls.
    pub recorder: &'a Recorder,
    /// What the world can tell the agent about the files it knows, and where a
    /// subagent's turns are run.
    pub world: &'a dyn WorldView,
    /// The episode's shared state: its limits and what the whole tree of agents has spent
    /// of them and done. The one route by which an agent (a program agent's gateway too)
    /// reaches it.
    pub episode: &'a Arc<EpisodeState>,
}

/// The world as an agent may ask it about itself between turns: which of the files an
/// actor read or wrote have changed since (by a command, another agent, the user). The
/// environment answers; what to do with the answer is the agent's own code.
#[async_trait]
pub trait WorldView: Send + Sync {
    /// The files `actor` knows that changed since it last read or wrote them, each named
    /// once per change (see `environment::world_model`).
    async fn changed_files(&self, actor: &Actor) -> Vec<String>;

    /// Runs a subagent's turns through the episode's one loop, as the main agent's are run:
    /// `agent` starts from `goal`, may use only `tools`, and spends from `episode`. Who
    /// starts, with what goal and which tools, and what its ending means are the parent
    /// agent's code; running the child's turns and calls is the environment's.
    async fn run_subagent(
        &self,
        agent: &mut dyn Agent,
        goal: &str,
        tools: &[ToolSpec],
        episode: &Arc<EpisodeState>,
        recorder: &Recorder,
    ) -> ActorEnding;
}

/// A world without files and without tools: nothing ever changes, and no subagent runs.
pub struct NoFiles;

#[async_trait]
impl WorldView for NoFiles {
    async fn changed_files(&self, _actor: &Actor) -> Vec<String> {
        Vec::new()
    }

    async fn run_subagent(
        &self,
        _agent: &mut dyn Agent,
        _goal: &str,
        _tools: &[ToolSpec],
        _episode: &Arc<EpisodeState>,
        _recorder: &Recorder,
    ) -> ActorEnding {
        ActorEnding::new(Termination::EnvironmentError)
    }
}

/// How one actor's turns in the episode's loop ended.
#[derive(Debug, Clone)]
pub struct ActorEnding {
    pub termination: Termination,
    /// Its final answer; in a conversation, its last words to the user.
    pub answer: Option<String>,
    /// Set when its turns ended on a fault that is nobody's answer.
    pub fault: Option<AgentFault>,
    /// The step of its last turn.
    pub step: u32,
    /// Its calls that succeeded, in the order of the calls of each turn.
    pub succeeded: Vec<ToolCall>,
}

impl ActorEnding {
    pub fn new(termination: Termination) -> Self {
        ActorEnding { termination, answer: None, fault: None, step: 0, succeeded: Vec::new() }
    }
}

/// The agent's decision: calls for the environment to run (possibly none).
#[derive(Debug, Default)]
pub struct Proposal {
    pub calls: Vec<ToolCall>,
    /// What the turn's model calls used, for the loop to count against the episode's
    /// limits. An agent that counted them in [`EpisodeState`] itself (before it started
    /// subagents, which spend from the same budget) returns nothing here.
    pub usage: Usage,
    /// What the turn's model calls cost; `None` when a call had no price.
    pub cost_usd: Option<f64>,
    /// In a conversation: what the agent says to the task's user (its text reply).
    pub to_user: Option<String>,
    /// Set when the agent failed on its own (an external agent's program broke the
    /// protocol), and how: the episode ends with `agent_error`, scored, and `calls` are not run.
    pub failed: Option<String>,
}

/// A failure to decide that is nobody's answer (the model backend failed, a mock script
/// ran out). The episode ends unscored with `cause`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{cause}: {message}")]
pub struct AgentFault {
    pub cause: UnscoredCause,
    pub message: String,
}

impl AgentFault {
    /// The fault a call's observation carries when the call failed for a cause that is
    /// nobody's answer (the runner's resources, the user).
    pub fn of_call(call: &ToolCall, obs: &Observation) -> Option<AgentFault> {
        let error = obs.error.as_ref()?;
        let fault = obs.fault?;
        let message = match fault {
            CallFault::UserFailed => format!("`{}` failed: {}", call.name, error.message),
            CallFault::ResourceExhausted => {
                format!("`{}` failed for want of the runner's resources: {}", call.name, error.message)
            }
            CallFault::EnvironmentFailed => {
                format!("`{}` failed: what the environment runs on stopped under it: {}", call.name, error.message)
            }
        };
        Some(AgentFault { cause: fault.into(), message })
    }
}

#[async_trait]
pub trait Agent: Send {
    async fn propose(&mut self, turn: Turn<'_>) -> Result<Proposal, AgentFault>;

    /// The episode is over, scored or not: an agent that holds something outside runner
    /// (an external agent's program) tells it how the episode ended and lets it go.
    /// Returns how its program ended, for `episode_finished`, when it is a program.
    async fn finish(
        &mut self,
        _termination: Termination,
        _outcome: &Outcome,
        _recorder: &Recorder,
    ) -> Option<ProgramEnd> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{ErrorType, ToolError};

    /// Regression: a server that crashed mid-call was reported as a want of the runner's
    /// resources.
    #[test]
    fn a_calls_fault_is_told_by_its_cause() {
        let call = ToolCall::new("c_1", "crash", serde_json::json!({}));
        let failed = |fault| {
            let mut obs = Observation::of_error("c_1", ToolError::new(ErrorType::ExecutionError, "server stopped"));
            obs.fault = Some(fault);
            AgentFault::of_call(&call, &obs).map(|f| (f.cause, f.message))
        };
        let (cause, message) = failed(CallFault::EnvironmentFailed).unwrap();
        assert_eq!(cause, UnscoredCause::EnvironmentError);
        assert!(!message.contains("resources") && message.contains("stopped under it"), "{message}");
        let (cause, message) = failed(CallFault::ResourceExhausted).unwrap();
        assert_eq!(cause, UnscoredCause::ResourceExhausted);
        assert!(message.contains("for want of the runner's resources"), "{message}");
    }
}
