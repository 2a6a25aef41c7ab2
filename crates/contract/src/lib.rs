//! The formats other programs see: tool specs, tool calls, actors and the observation
//! envelope (here), and the event log's lines (`event`), with the small nouns those lines
//! record (`selection`, `reduce`). A crate of its own, as the stable formats of a tool
//! are kept apart from its internals: it depends on nothing of runner's.
//!
//! These types are serialised exactly as `DESIGN.md` shows them. Fields may be added;
//! existing ones are never renamed.

pub mod event;
pub mod fit;
pub mod reduce;
pub mod selection;

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

/// A tool as the model sees it: the shape of OpenAI function calling and MCP tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// A JSON Schema for the arguments object.
    pub parameters: Value,
    /// What the tool does to the world, for the agent's own choices (plan mode offers only
    /// read-only tools). Never sent to a model provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<ToolAnnotations>,
}

impl ToolSpec {
    pub fn new(name: &str, description: &str, parameters: Value) -> Self {
        ToolSpec { name: name.into(), description: description.into(), parameters, annotations: None }
    }

    pub fn annotated(mut self, annotations: ToolAnnotations) -> Self {
        self.annotations = Some(annotations);
        self
    }

    /// The spec as a model provider gets it: without the annotations, which are ours.
    pub fn as_offered(&self) -> ToolSpec {
        ToolSpec { annotations: None, ..self.clone() }
    }
}

/// The MCP tool hints: whether a tool only reads the world, and whether it may destroy or
/// overwrite what is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolAnnotations {
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub destructive: bool,
}

impl ToolAnnotations {
    pub const READ_ONLY: ToolAnnotations = ToolAnnotations { read_only: true, destructive: false };
    /// Changes the world and may overwrite or remove what is there.
    pub const DESTRUCTIVE: ToolAnnotations = ToolAnnotations { read_only: false, destructive: true };
}

/// One action proposed by the agent. `call_id` is unique within the episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub call_id: String,
    pub name: String,
    pub arguments: Value,
    /// Who proposed it. Written only when it is not `main`, so logs of a lone agent read
    /// as they always did.
    #[serde(default, skip_serializing_if = "Actor::is_main")]
    pub actor: Actor,
}

impl ToolCall {
    /// A call of the episode's main agent.
    pub fn new(call_id: impl Into<String>, name: impl Into<String>, arguments: Value) -> Self {
        ToolCall { call_id: call_id.into(), name: name.into(), arguments, actor: Actor::Main }
    }
}

/// Who acted in an episode: its main agent, a subagent, or the simulated user. Written as
/// `main`, `main.1`, `main.1.2` (subagents numbered from 1 in the order they were started,
/// under the agent that started them) and `user`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum Actor {
    #[default]
    Main,
    /// The start numbers from the main agent down: `main.1.2` is `[1, 2]`. Never empty.
    Subagent(Vec<u32>),
    User,
}

impl Actor {
    pub fn is_main(&self) -> bool {
        *self == Actor::Main
    }

    /// The `n`th subagent this actor started: `main` → `main.n`, `main.1` → `main.1.n`.
    pub fn child(&self, n: u32) -> Actor {
        match self {
            Actor::Subagent(path) => Actor::Subagent(path.iter().copied().chain([n]).collect()),
            Actor::Main | Actor::User => Actor::Subagent(vec![n]),
        }
    }

    /// How many delegations below the main agent: `main` is 0, `main.1.2` is 2.
    pub fn depth(&self) -> u32 {
        match self {
            Actor::Subagent(path) => path.len() as u32,
            Actor::Main | Actor::User => 0,
        }
    }

    pub fn parse(text: &str) -> Result<Actor, String> {
        let invalid = || format!("invalid actor `{text}`: expected `main`, `main.N`, `main.N.M`, … or `user`");
        match text {
            "main" => Ok(Actor::Main),
            "user" => Ok(Actor::User),
            _ => {
                let path = text.strip_prefix("main.").ok_or_else(invalid)?;
                // Only the one way of writing each number, so that an actor reads back as written.
                let number = |n: &str| {
                    let canonical = n.bytes().all(|b| b.is_ascii_digit()) && !n.starts_with('0');
                    canonical.then(|| n.parse::<u32>().ok()).flatten()
                };
                let numbers = path.split('.').map(number).collect::<Option<Vec<u32>>>().ok_or_else(invalid)?;
                Ok(Actor::Subagent(numbers))
            }
        }
    }
}

impl fmt::Display for Actor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Actor::Main => f.write_str("main"),
            Actor::User => f.write_str("user"),
            Actor::Subagent(path) => {
                f.write_str("main")?;
                path.iter().try_for_each(|n| write!(f, ".{n}"))
            }
        }
    }
}

impl Serialize for Actor {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Actor {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Actor::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// The environment's envelope back to the agent after a reset or a tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// The call this observes; `None` for the first observation after `reset`.
    pub call_id: Option<String>,
    pub done: bool,
    pub error: Option<ToolError>,
    pub tool_result: Option<Value>,
    /// Text the environment says to the agent (the task's input, after a reset).
    #[serde(default)]
    pub messages: Vec<String>,
    #[serde(default)]
    pub info: Map<String, Value>,
    /// Set when the call failed for a cause that is nobody's answer. It travels beside the
    /// envelope, never in it: neither the agent nor the log's `observation` sees it.
    #[serde(skip)]
    pub fault: Option<CallFault>,
}

/// Why a call failed for a cause that is nobody's answer: the loop then ends the episode
/// unscored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFault {
    /// The runner ran out of open files, processes or memory (`resource_exhausted`).
    ResourceExhausted,
    /// What the world runs on stopped under the call, a server that died (`environment_error`).
    EnvironmentFailed,
    /// The task's user could not answer (`user_error`).
    UserFailed,
}

impl Observation {
    /// The answer of a `final_answer` call's observation, as text (empty when it has none).
    pub fn answer_text(&self) -> String {
        match self.tool_result.as_ref().and_then(|r| r.get("answer")) {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        }
    }

    /// An observation of no call: what the environment (or the user) says to the agent.
    pub fn of_messages(messages: Vec<String>) -> Self {
        Observation {
            call_id: None,
            done: false,
            error: None,
            tool_result: None,
            messages,
            info: Map::new(),
            fault: None,
        }
    }

    pub fn of_result(call_id: &str, result: Value) -> Self {
        Observation {
            call_id: Some(call_id.to_owned()),
            done: false,
            error: None,
            tool_result: Some(result),
            messages: Vec::new(),
            info: Map::new(),
            fault: None,
        }
    }

    pub fn of_error(call_id: &str, error: ToolError) -> Self {
        Observation {
            call_id: Some(call_id.to_owned()),
            done: false,
            error: Some(error),
            tool_result: None,
            messages: Vec::new(),
            info: Map::new(),
            fault: None,
        }
    }
}

/// Stable, machine-readable error types; the agent's code may branch on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorType {
    ToolNotFound,
    ValidationError,
    TimeoutError,
    PermissionError,
    ExecutionError,
    OutputTruncated,
    /// The call was still in flight when the episode ended.
    Cancelled,
}

impl ErrorType {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorType::ToolNotFound => "ToolNotFound",
            ErrorType::ValidationError => "ValidationError",
            ErrorType::TimeoutError => "TimeoutError",
            ErrorType::PermissionError => "PermissionError",
            ErrorType::ExecutionError => "ExecutionError",
            ErrorType::OutputTruncated => "OutputTruncated",
            ErrorType::Cancelled => "Cancelled",
        }
    }

    /// Whether trying the same call again may succeed.
    pub fn retryable(self) -> bool {
        matches!(self, ErrorType::TimeoutError | ErrorType::OutputTruncated)
    }
}

/// The normalised `error` object of an observation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolError {
    #[serde(rename = "type")]
    pub kind: ErrorType,
    pub message: String,
    pub retryable: bool,
    pub suggested_action: Option<String>,
}

impl ToolError {
    pub fn new(kind: ErrorType, message: impl Into<String>) -> Self {
        ToolError { kind, message: message.into(), retryable: kind.retryable(), suggested_action: None }
    }

    pub fn suggest(mut self, action: impl Into<String>) -> Self {
        self.suggested_action = Some(action.into());
        self
    }
}

/// The name of the tool that ends an episode.
pub const FINAL_TOOL: &str = "final_answer";

/// The tools whose names cross layers: the agent handles some itself, the environment's
/// user answers others, and suites and scorers name them.
///
/// The user's question, answered in free text.
pub const ASK_USER: &str = "ask_user";
/// The user's multiple-choice question.
pub const CLARIFY: &str = "clarify";
/// The agent enters plan mode (cognitive).
pub const ENTER_PLAN_MODE: &str = "enter_plan_mode";
/// The agent hands its plan to the user, then reads the answer (hybrid).
pub const EXIT_PLAN_MODE: &str = "exit_plan_mode";
/// The agent starts a subagent (cognitive).
pub const DELEGATE_TOOL: &str = "delegate_task";
/// The agent's bounded memory (cognitive).
pub const MEMORY_TOOL: &str = "memory";
/// The agent searches earlier episodes of named runs, its episodic memory (cognitive).
pub const SESSION_SEARCH_TOOL: &str = "session_search";

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn observation_serialises_as_the_design_envelope() {
        let obs = Observation::of_error("c_1", ToolError::new(ErrorType::TimeoutError, "slow").suggest("retry"));
        let v = serde_json::to_value(&obs).unwrap();
        assert_eq!(
            v,
            json!({"call_id": "c_1", "done": false, "tool_result": null, "messages": [], "info": {},
                   "error": {"type": "TimeoutError", "message": "slow", "retryable": true,
                             "suggested_action": "retry"}})
        );
        let back: Observation = serde_json::from_value(v).unwrap();
        assert_eq!(back, obs);
    }

    #[test]
    fn a_calls_fault_never_reaches_the_envelope() {
        let mut obs = Observation::of_error("c_1", ToolError::new(ErrorType::ExecutionError, "no files left"));
        let plain = serde_json::to_value(&obs).unwrap();
        obs.fault = Some(CallFault::ResourceExhausted);
        assert_eq!(serde_json::to_value(&obs).unwrap(), plain);
    }

    #[test]
    fn an_actor_reads_back_as_written_and_nothing_else_is_one() {
        for text in ["main", "main.1", "main.1.2", "main.10", "user"] {
            let actor = Actor::parse(text).unwrap();
            assert_eq!(actor.to_string(), text);
            assert_eq!(serde_json::to_value(&actor).unwrap(), json!(text));
        }
        assert_eq!(Actor::parse("main.1.2").unwrap(), Actor::Subagent(vec![1, 2]));
        for text in ["", "Main", "main.", "main.0", "main.01", "main.1.", "main.-1", "main.a", "user.1", "sub"] {
            assert!(Actor::parse(text).is_err(), "`{text}` was taken for an actor");
        }
    }

    #[test]
    fn a_main_call_is_written_without_its_actor_and_others_with_it() {
        let main = ToolCall::new("c_1", "read_file", json!({"path": "a"}));
        assert_eq!(
            serde_json::to_string(&main).unwrap(),
            r#"{"call_id":"c_1","name":"read_file","arguments":{"path":"a"}}"#
        );
        let user = ToolCall { actor: Actor::User, ..main.clone() };
        let text = serde_json::to_string(&user).unwrap();
        assert_eq!(text, r#"{"call_id":"c_1","name":"read_file","arguments":{"path":"a"},"actor":"user"}"#);
        assert_eq!(serde_json::from_str::<ToolCall>(&text).unwrap(), user);
        let sub: ToolCall =
            serde_json::from_value(json!({"call_id": "c", "name": "f", "arguments": {}, "actor": "main.2"})).unwrap();
        assert_eq!(sub.actor, Actor::Subagent(vec![2]));
        let bad =
            serde_json::from_value::<ToolCall>(json!({"call_id": "c", "name": "f", "arguments": {}, "actor": "boss"}));
        assert!(bad.unwrap_err().to_string().contains("invalid actor `boss`"));
    }

    #[test]
    fn annotations_are_written_only_when_a_spec_has_them() {
        let plain = ToolSpec::new("f", "does f", json!({"type": "object"}));
        assert_eq!(
            serde_json::to_value(&plain).unwrap(),
            json!({"name": "f", "description": "does f", "parameters": {"type": "object"}})
        );
        let read_only = plain.clone().annotated(ToolAnnotations::READ_ONLY);
        let v = serde_json::to_value(&read_only).unwrap();
        assert_eq!(v["annotations"], json!({"read_only": true, "destructive": false}));
        assert_eq!(serde_json::from_value::<ToolSpec>(v).unwrap(), read_only);
        assert_eq!(read_only.as_offered(), plain);
    }

    #[test]
    fn tool_call_round_trips() {
        let text = r#"{"call_id":"c_7","name":"run_command","arguments":{"command":"ls"}}"#;
        let call: ToolCall = serde_json::from_str(text).unwrap();
        assert_eq!(call.arguments["command"], "ls");
        assert_eq!(serde_json::to_string(&call).unwrap(), text);
    }
}
