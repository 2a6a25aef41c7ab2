//! The formats other programs see: tool specs, tool calls and the observation envelope.
//!
//! These types are serialised exactly as `DESIGN.md` shows them. Fields may be added;
//! existing ones are never renamed.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A tool as the model sees it: the shape of OpenAI function calling and MCP tools.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// A JSON Schema for the arguments object.
    pub parameters: Value,
}

impl ToolSpec {
    pub fn new(name: &str, description: &str, parameters: Value) -> Self {
        ToolSpec { name: name.into(), description: description.into(), parameters }
    }
}

/// One action proposed by the agent. `call_id` is unique within the episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub call_id: String,
    pub name: String,
    pub arguments: Value,
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
}

impl Observation {
    pub fn of_result(call_id: &str, result: Value) -> Self {
        Observation {
            call_id: Some(call_id.to_owned()),
            done: false,
            error: None,
            tool_result: Some(result),
            messages: Vec::new(),
            info: Map::new(),
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
    fn tool_call_round_trips() {
        let text = r#"{"call_id":"c_7","name":"run_command","arguments":{"command":"ls"}}"#;
        let call: ToolCall = serde_json::from_str(text).unwrap();
        assert_eq!(call.arguments["command"], "ls");
        assert_eq!(serde_json::to_string(&call).unwrap(), text);
    }
}
