//! Kinds of agent, in one explicit list: [`AgentKind::ALL`]. A suite's `agent: {kind: …}` is
//! looked up here, and each kind builds its agent for an episode from the same
//! [`AgentParts`]. Adding a kind is adding a variant, its name and its `build` arm here.

use std::sync::Arc;

use super::external::{ExternalAgent, ExternalParts, NoProgram};
use super::memory::SharedStores;
use super::memory_agent::{MemoryAgent, MemoryAgentParts};
use super::oracle::OracleAgent;
use super::{Agent, Subagents, ToolCallingAgent};
use crate::model::LanguageModel;

/// The kinds of agent a suite can name with `agent: {kind: …}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AgentKind {
    /// The model proposes tool calls and the agent passes them on: [`ToolCallingAgent`].
    #[default]
    ToolCalling,
    /// No model: the task's reference solution is run in the world: [`OracleAgent`].
    Oracle,
    /// A command-line agent that owns its loop, its model calls through the gateway:
    /// [`super::cli::CliAgent`].
    Cli,
    /// A program proposes the calls, over the external agent protocol: [`ExternalAgent`].
    External,
    /// Replays a conversation into a memory through control states (seed 002), then
    /// answers the task's question from it: [`MemoryAgent`].
    Memory,
}

/// What an agent of any kind is built from, for one episode: the model the episode's cast
/// gave it and the suite's settings, already decided (a kind takes what it needs).
pub struct AgentParts {
    /// The main agent's model.
    pub model: Arc<dyn LanguageModel>,
    /// The model's name, as the agent reports it.
    pub model_name: String,
    /// The system prompt, rendered for the task.
    pub system: Option<String>,
    pub require_final_answer: bool,
    /// The bounded memory's stores, when the suite gives the agent a memory.
    pub memory: Option<SharedStores>,
    pub plan_mode: bool,
    /// The task's user opens the episode and the agent talks with it.
    pub conversation: bool,
    /// The suite's subagents, when it has them.
    pub subagents: Option<Arc<Subagents>>,
    /// The task's id and its reference solution's commands, for the oracle.
    pub task_id: String,
    pub solution: Vec<String>,
    /// `cli`: the program to run and where (the world's folder, its sandbox), with the
    /// episode's budget its gateway spends from.
    pub program: Option<super::ProgramParts>,
    /// For an `external` agent: its program and what `start` tells it of the episode.
    pub external: Option<ExternalParts>,
    /// `session_search` over the runs the suite names, when it names some.
    pub session_search: Option<Arc<super::session_search::SessionSearch>>,
    /// For a `memory` agent: the conversation to replay, its settings and its thread.
    pub memory_agent: Option<MemoryAgentParts>,
}

impl AgentKind {
    pub const ALL: [AgentKind; 5] =
        [AgentKind::ToolCalling, AgentKind::Oracle, AgentKind::External, AgentKind::Cli, AgentKind::Memory];

    /// Kinds that `DESIGN.md` names but that are not built yet: refused as such, not as
    /// unknown, so that a suite written for them says what it is waiting for.
    pub const NOT_YET: [&str; 0] = [];

    pub fn name(self) -> &'static str {
        match self {
            AgentKind::ToolCalling => "tool_calling",
            AgentKind::Oracle => "oracle",
            AgentKind::External => "external",
            AgentKind::Cli => "cli",
            AgentKind::Memory => "memory",
        }
    }

    pub fn parse(name: &str) -> Result<AgentKind, String> {
        if let Some(kind) = Self::ALL.into_iter().find(|k| k.name() == name) {
            return Ok(kind);
        }
        let known: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
        if Self::NOT_YET.contains(&name) {
            Err(format!("agent kind `{name}` is not available yet; the available kinds are: {}", known.join(", ")))
        } else {
            Err(format!("unknown agent kind `{name}`, expected one of: {}", known.join(", ")))
        }
    }

    /// This kind's agent for one episode.
    pub fn build(self, mut parts: AgentParts) -> Box<dyn Agent> {
        match (self, parts.external.take()) {
            (AgentKind::ToolCalling, _) => Box::new(tool_calling(parts)),
            (AgentKind::Oracle, _) => Box::new(OracleAgent::new(&parts.task_id, parts.solution)),
            (AgentKind::External, Some(external)) => {
                Box::new(ExternalAgent::new(external, parts.system, (parts.model, parts.model_name)))
            }
            // A suite checks that its external agent has a program when it loads.
            (AgentKind::External, None) => Box::new(NoProgram),
            (AgentKind::Cli, _) => Box::new(super::cli::CliAgent::new(parts.model, parts.model_name, parts.program)),
            (AgentKind::Memory, _) => {
                let memory = parts.memory_agent.unwrap_or_else(|| MemoryAgentParts::empty(&parts.task_id));
                Box::new(MemoryAgent::new(parts.model, &parts.model_name, memory))
            }
        }
    }
}

fn tool_calling(parts: AgentParts) -> ToolCallingAgent {
    let mut agent = ToolCallingAgent::new(parts.model, &parts.model_name, parts.system, parts.require_final_answer);
    if let Some(stores) = parts.memory {
        agent = agent.with_memory(stores);
    }
    if parts.plan_mode {
        agent = agent.with_plan_mode();
    }
    if parts.conversation {
        agent = agent.in_conversation();
    }
    if let Some(subagents) = parts.subagents {
        agent = agent.with_subagents(subagents);
    }
    if let Some(search) = parts.session_search {
        agent = agent.with_session_search(search, &parts.task_id);
    }
    agent
}

impl serde::Serialize for AgentKind {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for AgentKind {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        AgentKind::parse(&name).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_is_known_not_yet_available_or_unknown() {
        assert_eq!(AgentKind::parse("tool_calling"), Ok(AgentKind::ToolCalling));
        for kind in AgentKind::ALL {
            assert_eq!(AgentKind::parse(kind.name()), Ok(kind));
        }
        assert_eq!(AgentKind::parse("oracle"), Ok(AgentKind::Oracle));
        assert_eq!(AgentKind::parse("memory"), Ok(AgentKind::Memory));
        let err = AgentKind::parse("toolcalling").unwrap_err();
        assert_eq!(
            err,
            "unknown agent kind `toolcalling`, expected one of: tool_calling, oracle, external, cli, memory"
        );
    }
}
