//! Subagents (seed 001 `self.subagent(prompt)`, seed 004 `delegate_task`): a cognitive
//! action of the agent. `delegate_task(goal, context, tools)` starts a child agent with a
//! fresh transcript, the suite's subagent prompt, a subset of its parent's tools and its
//! own actor (`main.1`, `main.1.2`, …), so its own world model over the same world. The
//! children of one turn run at once; the environment runs each one's turns through the
//! episode's one loop, against the episode's one budget, until its `final_answer`, which
//! becomes the observation of its parent's call.
//!
//! Every decision stays here, in the agent's code: whether a child starts, its goal and
//! tools, and what its ending means to its parent. The agent still never executes a tool.

use std::sync::Arc;

use futures::future::join_all;
use serde_json::{Value, json};

use super::ToolCallingAgent;
use crate::agent::{ActorEnding, AgentFault, Turn};
use crate::contract::{Actor, DELEGATE_TOOL, ErrorType, FINAL_TOOL, ToolCall, ToolError, ToolSpec};
use crate::log::Termination;
use crate::model::LanguageModel;

/// The spec of `delegate_task`, as the model is offered it.
pub fn delegate_spec() -> ToolSpec {
    ToolSpec::new(
        DELEGATE_TOOL,
        "Delegate a self-contained piece of work to a subagent with a fresh context. It works in the same \
         world with the tools you give it and returns its final answer and the files it wrote. Several \
         delegate_task calls in one turn run at the same time.",
        json!({
            "type": "object",
            "properties": {
                "goal": {"type": "string", "description": "What the subagent must achieve and answer."},
                "context": {"type": "string", "description": "What it needs to know that the goal does not say."},
                "tools": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "The names of the tools it may use, a subset of yours; all of yours when omitted."
                }
            },
            "required": ["goal"]
        }),
    )
}

/// Which model a subagent talks to: the main agent's, or under `mock`, its own script.
pub type ModelFor = Arc<dyn Fn(&Actor) -> Arc<dyn LanguageModel> + Send + Sync>;

/// A suite's `agent.subagent` and its limits, with the way to a child's model.
pub struct Subagents {
    /// The system prompt of every subagent, rendered for the task.
    pub system: String,
    /// How many `delegate_task` calls of one turn run; the rest are refused.
    pub max_children: u32,
    /// The deepest a subagent may be: the main agent is at 0, `main.1` at 1.
    pub max_depth: u32,
    pub models: ModelFor,
    pub model_name: String,
    pub require_final_answer: bool,
}

/// A child about to run: its agent, the tools it was given, its task.
struct Child {
    agent: ToolCallingAgent,
    tools: Vec<ToolSpec>,
    goal: String,
}

impl Child {
    /// The files it changed, as its parent is told: the `path` of each of its calls that
    /// succeeded of a tool not marked read-only, then what its own subagents wrote.
    fn written(&self, ending: &ActorEnding) -> Vec<String> {
        let mut written: Vec<String> = Vec::new();
        for call in &ending.succeeded {
            let writes = self.tools.iter().any(|t| t.name == call.name && t.annotations.is_some_and(|a| !a.read_only));
            if let Some(path) = call.arguments.get("path").and_then(Value::as_str).filter(|_| writes)
                && !written.iter().any(|w| w == path)
            {
                written.push(path.to_owned());
            }
        }
        for path in &self.agent.written_below {
            if !written.contains(path) {
                written.push(path.clone());
            }
        }
        written
    }
}

/// Why a child ended without an answer, as its parent reads it.
fn stopped_because(termination: Termination) -> String {
    match termination {
        Termination::UserStop => "the run was stopped".to_owned(),
        limit => format!("the episode reached its {}", limit.as_str().replace('_', " ")),
    }
}

impl ToolCallingAgent {
    /// Runs this turn's `delegate_task` calls: each either refused or a child, the children
    /// at once; each call is then answered in order (an `agent_action` event). A child's
    /// fault that is nobody's answer is the parent's too.
    pub(super) async fn delegate(&mut self, turn: &Turn<'_>, calls: Vec<ToolCall>) -> Result<(), AgentFault> {
        let mut answers: Vec<Option<Result<Value, ToolError>>> = vec![None; calls.len()];
        let mut children = Vec::new();
        for (i, call) in calls.iter().enumerate() {
            match self.start_child(turn, call, children.len()) {
                Ok(child) => children.push((i, child)),
                Err(refusal) => answers[i] = Some(Err(refusal)),
            }
        }
        let runs = children.iter_mut().map(|(i, child)| async move {
            let ending =
                turn.world.run_subagent(&mut child.agent, &child.goal, &child.tools, turn.episode, turn.recorder).await;
            (*i, ending)
        });
        let mut fault = None;
        for ((i, ending), (_, child)) in join_all(runs).await.into_iter().zip(&children) {
            let actor = child.agent.actor.clone();
            answers[i] = Some(match (ending.fault.clone(), ending.termination, ending.answer.clone()) {
                (Some(child_fault), _, _) => {
                    let message = format!("subagent {actor}: {}", child_fault.message);
                    let error = ToolError::new(ErrorType::ExecutionError, message.clone());
                    fault.get_or_insert(AgentFault { cause: child_fault.cause, message });
                    Err(error)
                }
                (None, Termination::FinalAnswer, Some(answer)) => {
                    let written = child.written(&ending);
                    for path in &written {
                        if !self.written_below.contains(path) {
                            self.written_below.push(path.clone());
                        }
                    }
                    Ok(json!({"actor": actor, "answer": answer, "files_written": written}))
                }
                (None, termination, _) => Err(ToolError::new(
                    ErrorType::Cancelled,
                    format!("subagent {actor} stopped without an answer: {}", stopped_because(termination)),
                )),
            });
        }
        for (call, answer) in calls.iter().zip(answers) {
            let answer = answer.unwrap_or_else(|| Err(ToolError::new(ErrorType::Cancelled, "not run")));
            self.answer_own(turn, call, crate::log::ActionClass::Cognitive, answer);
        }
        fault.map_or(Ok(()), Err)
    }

    /// A child for `call`, or why there is none. `running` children of this turn have
    /// started before it.
    fn start_child(&mut self, turn: &Turn<'_>, call: &ToolCall, running: usize) -> Result<Child, ToolError> {
        let offered = self.own_tools.iter().any(|t| t.name == DELEGATE_TOOL);
        let Some(config) = self.subagents.clone().filter(|_| offered) else {
            let why = match &self.subagents {
                None => "this suite has no subagents (`agent.subagent` is not set)".to_owned(),
                Some(_) => format!("`{DELEGATE_TOOL}` was not given to {}", self.actor),
            };
            return Err(ToolError::new(ErrorType::ToolNotFound, format!("`{DELEGATE_TOOL}` is not available: {why}")));
        };
        if let Some(limit) = turn.episode.over_limits() {
            let message = format!("not started: the episode reached its {}", limit.as_str().replace('_', " "));
            return Err(ToolError::new(ErrorType::Cancelled, message));
        }
        if running >= config.max_children as usize {
            return Err(ToolError::new(
                ErrorType::ExecutionError,
                format!("at most {} subagents run at once: this one was not started", config.max_children),
            )
            .suggest("delegate it again in a later turn"));
        }
        let invalid = |message: String| ToolError::new(ErrorType::ValidationError, message);
        let goal = match call.arguments.get("goal") {
            Some(Value::String(goal)) if !goal.trim().is_empty() => goal.clone(),
            _ => return Err(invalid(format!("`{DELEGATE_TOOL}` needs a `goal`, a non-empty text"))),
        };
        let context = match call.arguments.get("context") {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) => Some(c.clone()),
            Some(other) => return Err(invalid(format!("`context` is a text, not {other}"))),
        };
        let mine: Vec<&str> = turn.tools.iter().map(|t| t.name.as_str()).collect();
        let (given, may_delegate) = match call.arguments.get("tools") {
            None | Some(Value::Null) => (mine.iter().map(|n| n.to_string()).collect::<Vec<_>>(), true),
            Some(Value::Array(items)) => {
                let mut names = Vec::with_capacity(items.len());
                let mut delegate = false;
                for item in items {
                    let Some(name) = item.as_str() else {
                        return Err(invalid(format!("`tools` is a list of tool names, not {item}")));
                    };
                    if name == DELEGATE_TOOL {
                        delegate = true;
                    } else if mine.contains(&name) {
                        names.push(name.to_owned());
                    } else {
                        let message = format!("`{name}` is not one of your tools ({})", mine.join(", "));
                        return Err(invalid(message));
                    }
                }
                (names, delegate)
            }
            Some(other) => return Err(invalid(format!("`tools` is a list of tool names, not {other}"))),
        };
        let tools: Vec<ToolSpec> =
            turn.tools.iter().filter(|t| t.name == FINAL_TOOL || given.contains(&t.name)).cloned().collect();

        self.children += 1;
        let actor = self.actor.child(self.children);
        let model = (config.models)(&actor);
        let mut agent =
            ToolCallingAgent::new(model, &config.model_name, Some(config.system.clone()), config.require_final_answer);
        agent.actor = actor;
        if may_delegate {
            agent = agent.with_subagents(config.clone());
        }
        let goal = match context {
            Some(context) if !context.trim().is_empty() => format!("{goal}\n\nContext:\n{context}"),
            _ => goal,
        };
        Ok(Child { agent, tools, goal })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_childs_actor_extends_its_parents() {
        assert_eq!(Actor::Main.child(2), Actor::Subagent(vec![2]));
        assert_eq!(Actor::Subagent(vec![2]).child(1), Actor::Subagent(vec![2, 1]));
        assert_eq!((Actor::Main.depth(), Actor::Subagent(vec![2, 1]).depth()), (0, 2));
    }

    #[test]
    fn a_child_stopped_short_says_by_what() {
        assert_eq!(stopped_because(Termination::MaxSteps), "the episode reached its max steps");
        assert_eq!(stopped_because(Termination::TimeLimit), "the episode reached its time limit");
        assert_eq!(stopped_because(Termination::UserStop), "the run was stopped");
    }
}
