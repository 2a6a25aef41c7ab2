//! How the memory agent answers the task's question once the replay is over, as the suite
//! chooses (`agent: {kind: memory, answering: …}`):
//!
//! - `{with: context}` (the default): the agent's own code reads the memory for the
//!   question (`search_entries`, `get_context`) and asks the model once, with what it read
//!   in the prompt;
//! - `{with: tools, tools: [search_entries, list_entries, get_context], max_steps: 8}`: a
//!   [`ToolCallingAgent`] answers, offered only the store's read tools named (and
//!   `final_answer`); its final answer is the episode's. Its last step offers only
//!   `final_answer`. A call of a tool it was not offered never reaches the world: the
//!   agent refuses it, and the model is told why.
//!
//! Either way the agent keeps what the reads returned, for retrieval recall.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::control::{GET_CONTEXT, LIST_ENTRIES, SEARCH_ENTRIES};
use super::{MEMORY_ID, VAULT_ID, payload, stamp};
use crate::agent::kinds::tool_calling::ToolCallingAgent;
use crate::agent::{Agent, AgentFault, Proposal, Turn};
use crate::contract::{ErrorType, FINAL_TOOL, Observation, ToolCall, ToolError, ToolSpec};
use crate::log::ActionClass;

/// The store's read tools: all an answering agent may be offered.
pub const READ_TOOLS: [&str; 3] = [SEARCH_ENTRIES, LIST_ENTRIES, GET_CONTEXT];

/// The steps a tool-calling answer takes at most, unless the suite says.
pub const DEFAULT_MAX_STEPS: u32 = 8;

/// The suite's choice of how the question is answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Answering {
    pub with: AnswerWith,
    /// `with: tools`: the read tools offered (all three when not given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// `with: tools`: the model calls the answer may take, the last offering only
    /// `final_answer` ([`DEFAULT_MAX_STEPS`] when not given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerWith {
    /// The agent reads the memory itself and puts what it read in the model's prompt.
    Context,
    /// A tool-calling agent with the store's read tools.
    Tools,
}

impl Default for Answering {
    fn default() -> Self {
        Answering { with: AnswerWith::Context, tools: None, max_steps: None }
    }
}

impl Answering {
    /// What is wrong with the choice, as `(field under answering, why)`.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.with == AnswerWith::Context {
            if self.tools.is_some() {
                return Err(("tools", "is for `with: tools` only".into()));
            }
            if self.max_steps.is_some() {
                return Err(("max_steps", "is for `with: tools` only".into()));
            }
        }
        if let Some(tools) = &self.tools {
            if tools.is_empty() {
                return Err(("tools", "must name at least one tool".into()));
            }
            if let Some(other) = tools.iter().find(|t| !READ_TOOLS.contains(&t.as_str())) {
                return Err((
                    "tools",
                    format!("`{other}` is not a read tool of the store, expected some of: {}", READ_TOOLS.join(", ")),
                ));
            }
        }
        if self.max_steps == Some(0) {
            return Err(("max_steps", "must be at least 1".into()));
        }
        Ok(())
    }

    fn tools(&self) -> Vec<String> {
        self.tools.clone().unwrap_or_else(|| READ_TOOLS.iter().map(|t| t.to_string()).collect())
    }
}

/// A tool-calling agent answering the question, and what its reads returned.
pub(super) struct ToolAnswer {
    agent: ToolCallingAgent,
    tools: Vec<String>,
    max_steps: u32,
    steps: u32,
    /// The question, given to the agent as its first message.
    question: Option<String>,
    /// The calls of the last turn that went to the world.
    sent: Vec<String>,
    /// What every read returned (the tools' payloads), in order.
    pub(super) read: Vec<Value>,
}

/// What one turn of the answer came to.
pub(super) struct Answered {
    pub proposal: Proposal,
    /// Whether the proposal gives the final answer.
    pub done: bool,
}

impl ToolAnswer {
    pub(super) fn new(agent: ToolCallingAgent, answering: &Answering, question: &str) -> ToolAnswer {
        ToolAnswer {
            agent,
            tools: answering.tools(),
            max_steps: answering.max_steps.unwrap_or(DEFAULT_MAX_STEPS),
            steps: 0,
            question: Some(question.to_owned()),
            sent: Vec::new(),
            read: Vec::new(),
        }
    }

    /// One turn of the answering agent: it sees last turn's results and the read tools (on
    /// its last step only `final_answer`); its calls of those go to the world, any other
    /// is refused here.
    pub(super) async fn propose(&mut self, turn: &Turn<'_>) -> Result<Answered, AgentFault> {
        let mut observations: Vec<Observation> = Vec::new();
        if let Some(question) = self.question.take() {
            observations.push(Observation::of_messages(vec![question]));
        }
        for id in std::mem::take(&mut self.sent) {
            let Some(obs) = turn.observations.iter().find(|o| o.call_id.as_deref() == Some(&id)) else { continue };
            if obs.error.is_none() {
                self.read.push(payload(obs.tool_result.as_ref()));
            }
            observations.push(obs.clone());
        }
        self.steps += 1;
        if self.steps > self.max_steps {
            let why = format!("the answering agent used its {} steps without calling `final_answer`", self.max_steps);
            return Ok(Answered { proposal: Proposal { failed: Some(why), ..Proposal::default() }, done: true });
        }
        let last = self.steps == self.max_steps;
        let offered: Vec<ToolSpec> = turn
            .tools
            .iter()
            .filter(|t| t.name == FINAL_TOOL || (!last && self.tools.contains(&t.name)))
            .cloned()
            .collect();
        let inner = Turn {
            observations: &observations,
            tools: &offered,
            allowance: turn.allowance.clone(),
            recorder: turn.recorder,
            world: turn.world,
            episode: turn.episode,
        };
        let mut proposal = self.agent.propose(inner).await?;
        let mut calls: Vec<ToolCall> = Vec::with_capacity(proposal.calls.len());
        for mut call in std::mem::take(&mut proposal.calls) {
            if call.name == FINAL_TOOL {
                calls.push(call);
            } else if offered.iter().any(|t| t.name == call.name) {
                stamp(
                    &mut call.arguments,
                    turn.tools,
                    &call.name,
                    &[("vault_id", json!(VAULT_ID)), ("memory_id", json!(MEMORY_ID))],
                );
                self.sent.push(call.call_id.clone());
                calls.push(call);
            } else {
                let names: Vec<&str> = offered.iter().map(|t| t.name.as_str()).collect();
                let refusal = ToolError::new(
                    ErrorType::ToolNotFound,
                    format!(
                        "`{}` is not offered to answer the question; the tools are: {}",
                        call.name,
                        names.join(", ")
                    ),
                );
                self.agent.answer_own(turn, &call, ActionClass::Cognitive, Err(refusal));
            }
        }
        let done = calls.iter().any(|c| c.name == FINAL_TOOL);
        proposal.calls = calls;
        Ok(Answered { proposal, done })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_choice_is_checked() {
        assert_eq!(Answering::default().check(), Ok(()));
        let tools = |names: &[&str]| Answering {
            with: AnswerWith::Tools,
            tools: Some(names.iter().map(|n| n.to_string()).collect()),
            max_steps: None,
        };
        assert_eq!(tools(&["search_entries", "get_context"]).check(), Ok(()));
        let (field, why) = tools(&["add_entry"]).check().unwrap_err();
        assert_eq!(field, "tools");
        assert!(why.contains("`add_entry` is not a read tool"), "{why}");
        let context_with_steps = Answering { with: AnswerWith::Context, tools: None, max_steps: Some(3) };
        assert_eq!(context_with_steps.check().unwrap_err().0, "max_steps");
        let zero = Answering { with: AnswerWith::Tools, tools: None, max_steps: Some(0) };
        assert_eq!(zero.check().unwrap_err().0, "max_steps");
    }
}
