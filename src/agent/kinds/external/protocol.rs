//! The messages of the external agent protocol (version 1, `DESIGN.md`), one JSON object
//! per line: what runner writes on the program's stdin, and what it may write back.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::contract::{Observation, ToolSpec};

pub const PROTOCOL_VERSION: u32 = 1;

/// runner → program.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToAgent<'a> {
    Start {
        protocol: u32,
        episode_id: &'a str,
        task: &'a Value,
        system: Option<&'a str>,
        tools: Vec<ToolSpec>,
        limits: StartLimits,
        /// The episode's model gateway: `openai_base_url`, `anthropic_base_url`, `url`, `key`.
        gateway: Value,
    },
    Observations {
        step: u32,
        observations: &'a [Observation],
        budget: TurnBudget,
    },
    End {
        termination: &'a str,
        /// `scored`, `unscored` or `cancelled`.
        outcome: &'a str,
        /// Set when the episode was scored.
        #[serde(skip_serializing_if = "Option::is_none")]
        passed: Option<bool>,
    },
}

/// The episode's limits, as `start` states them.
#[derive(Debug, Serialize)]
pub struct StartLimits {
    pub max_steps: u32,
    pub time_s: f64,
    pub max_tokens: Option<u64>,
    pub max_cost_usd: Option<f64>,
}

/// What is left when a turn starts.
#[derive(Debug, Serialize)]
pub struct TurnBudget {
    pub steps_left: u32,
    pub time_left_s: f64,
    pub tokens_left: Option<u64>,
}

/// program → runner.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FromAgent {
    Actions {
        #[serde(default)]
        calls: Vec<WireCall>,
        #[serde(default)]
        text: Option<String>,
    },
    Usage {
        #[serde(default)]
        model: Option<String>,
        #[serde(default)]
        input_tokens: u64,
        #[serde(default)]
        output_tokens: u64,
        #[serde(default)]
        cost_usd: Option<f64>,
    },
    Fault {
        cause: String,
        #[serde(default)]
        message: String,
    },
    Log {
        message: String,
    },
}

const TYPES: [&str; 4] = ["actions", "usage", "fault", "log"];

/// A call as the program proposes it: without `call_id`, runner names it.
#[derive(Debug, Deserialize)]
pub struct WireCall {
    #[serde(default)]
    pub call_id: Option<String>,
    pub name: String,
    #[serde(default = "empty_object")]
    pub arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

impl ToAgent<'_> {
    /// The message as one line, newline included.
    pub fn line(&self) -> Vec<u8> {
        // Every field is a plain value or a type that serialises without failing.
        let mut line = serde_json::to_vec(self).unwrap_or_else(|_| b"{}".to_vec());
        line.push(b'\n');
        line
    }
}

impl FromAgent {
    /// Reads one line from the program, or says how it breaks the protocol.
    pub fn parse(line: &[u8]) -> Result<FromAgent, String> {
        let value: Value = serde_json::from_slice(line)
            .map_err(|e| format!("a line on stdout that is not JSON ({e}): {}", preview(line)))?;
        let kind = match value.get("type") {
            Some(Value::String(kind)) => kind.clone(),
            Some(_) | None => return Err(format!("a message without a `type` string: {}", preview(line))),
        };
        if !TYPES.contains(&kind.as_str()) {
            return Err(format!("a message of unknown type `{kind}` (expected one of: {})", TYPES.join(", ")));
        }
        serde_json::from_value(value).map_err(|e| format!("a `{kind}` message that does not fit the protocol: {e}"))
    }
}

/// The start of a line, for an error message.
fn preview(line: &[u8]) -> String {
    const SHOWN: usize = 200;
    let text = String::from_utf8_lossy(&line[..line.len().min(SHOWN)]).into_owned();
    if line.len() > SHOWN { format!("{text}[… {} more bytes]", line.len() - SHOWN) } else { text }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_bad_line_is_named() {
        assert!(FromAgent::parse(b"hello").unwrap_err().contains("not JSON"));
        assert!(FromAgent::parse(b"{\"calls\": []}").unwrap_err().contains("without a `type`"));
        let err = FromAgent::parse(b"{\"type\": \"act\"}").unwrap_err();
        assert!(err.contains("unknown type `act`"), "{err}");
        let err = FromAgent::parse(b"{\"type\": \"actions\", \"calls\": [{\"arguments\": {}}]}").unwrap_err();
        assert!(err.contains("`actions` message") && err.contains("name"), "{err}");
    }

    #[test]
    fn a_call_without_id_or_arguments_is_read() {
        let Ok(FromAgent::Actions { calls, text }) = FromAgent::parse(br#"{"type":"actions","calls":[{"name":"ls"}]}"#)
        else {
            panic!("not read")
        };
        assert_eq!((calls[0].call_id.as_deref(), calls[0].name.as_str(), text), (None, "ls", None));
        assert_eq!(calls[0].arguments, serde_json::json!({}));
    }
}
