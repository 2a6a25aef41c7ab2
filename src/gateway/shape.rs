//! What the three wire APIs share: a request as the gateway understood it ([`Asked`]), a
//! refusal ([`Refusal`]), and readers of a request's fields that name the field at fault.

use hyper::StatusCode;
use serde_json::{Map, Value};

use super::GatewayEnd;
use crate::contract::ToolSpec;
use crate::log::Termination;
use crate::model::{Message, ModelError};

/// A request in the run's neutral shape.
#[derive(Debug, Default)]
pub struct Asked {
    /// The model the client named; echoed back, while the run's model answers.
    pub model: String,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    pub stream: bool,
    /// Chat Completions' `stream_options.include_usage`: a last chunk with the usage.
    pub include_usage: bool,
}

impl Asked {
    /// A request's ask: its decoded messages (each tool result named by its call) and
    /// tools, the model it named and whether it streams; no usage chunk asked for.
    pub fn new(body: &Map<String, Value>, mut messages: Vec<Message>, tools: Vec<ToolSpec>) -> Result<Asked, Refusal> {
        name_results(&mut messages);
        Ok(Asked {
            model: body.get("model").and_then(Value::as_str).unwrap_or_default().to_owned(),
            messages,
            tools,
            stream: flag(body, "stream")?,
            include_usage: false,
        })
    }
}

/// Why a request gets no answer: its status, the field at fault (a JSON path such as
/// `messages[2].content[0].type`) and what the SDK shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub status: StatusCode,
    pub field: Option<String>,
    pub message: String,
}

impl Refusal {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Refusal { status, field: None, message: message.into() }
    }

    pub fn unauthorised(message: &str) -> Self {
        Refusal::new(StatusCode::UNAUTHORIZED, message)
    }

    pub fn bad_request(field: Option<String>, message: impl Into<String>) -> Self {
        Refusal { status: StatusCode::BAD_REQUEST, field, message: message.into() }
    }

    /// A field the gateway does not speak.
    pub fn unsupported(field: &str, what: &str) -> Self {
        Refusal::bad_request(Some(field.to_owned()), format!("unsupported field `{field}`: {what}"))
    }

    /// The episode is over: a limit was reached, or the model behind failed. 403 for a
    /// limit (the SDKs do not retry it), 502 for the model's failure.
    pub fn ended(ending: &GatewayEnd) -> Self {
        match ending {
            GatewayEnd::Limit(termination) => Refusal::new(StatusCode::FORBIDDEN, limit_message(*termination)),
            GatewayEnd::Fault(error) => Refusal::fault(error),
        }
    }

    pub fn fault(error: &ModelError) -> Self {
        Refusal::new(
            StatusCode::BAD_GATEWAY,
            format!("the episode's model failed behind the gateway ({}): {}", error.cause, error.message),
        )
    }
}

fn limit_message(termination: Termination) -> String {
    let limit = match termination {
        Termination::MaxSteps => "its step limit (max_steps) is reached",
        Termination::TimeLimit => "its time limit (time_s) is up",
        Termination::TokenLimit => "its token limit (max_tokens) is spent",
        Termination::CostLimit => "its cost limit (max_cost_usd) is spent",
        _ => "it has ended",
    };
    format!("the episode's model calls are over: {limit}")
}

/// Reads a request's top-level fields: the ones the gateway uses are taken by the decoder;
/// these are read and let be (the run's model has its own sampling); any other field is
/// refused, naming it.
pub fn check_fields(body: &Map<String, Value>, used: &[&str], ignored: &[&str]) -> Result<(), Refusal> {
    match body.keys().find(|k| !used.contains(&k.as_str()) && !ignored.contains(&k.as_str())) {
        Some(field) => Err(Refusal::unsupported(field, "the gateway does not speak it")),
        None => Ok(()),
    }
}

/// `stream: true | false | null`.
pub fn flag(body: &Map<String, Value>, field: &str) -> Result<bool, Refusal> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(Refusal::bad_request(Some(field.to_owned()), format!("`{field}` must be true or false"))),
    }
}

pub fn string(value: Option<&Value>, field: &str) -> Result<String, Refusal> {
    match value {
        Some(Value::String(s)) => Ok(s.clone()),
        _ => Err(Refusal::bad_request(Some(field.to_owned()), format!("`{field}` must be a string"))),
    }
}

pub fn array<'a>(value: Option<&'a Value>, field: &str) -> Result<&'a [Value], Refusal> {
    match value {
        Some(Value::Array(items)) => Ok(items),
        None | Some(Value::Null) => Ok(&[]),
        _ => Err(Refusal::bad_request(Some(field.to_owned()), format!("`{field}` must be an array"))),
    }
}

pub fn object<'a>(value: &'a Value, field: &str) -> Result<&'a Map<String, Value>, Refusal> {
    value
        .as_object()
        .ok_or_else(|| Refusal::bad_request(Some(field.to_owned()), format!("`{field}` must be an object")))
}

/// Text given as a string or as a list of text parts (`type` one of `text_types`); any
/// other part (an image, a file, audio) is refused, naming it.
pub fn text(value: Option<&Value>, field: &str, text_types: &[&str]) -> Result<String, Refusal> {
    match value {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for (i, part) in parts.iter().enumerate() {
                let at = format!("{field}[{i}]");
                let kind = part.get("type").and_then(Value::as_str).unwrap_or_default();
                if !text_types.contains(&kind) {
                    return Err(Refusal::unsupported(
                        &format!("{at}.type"),
                        &format!("only text parts are supported, not `{kind}`"),
                    ));
                }
                out.push_str(&string(part.get("text"), &format!("{at}.text"))?);
            }
            Ok(out)
        }
        Some(_) => {
            Err(Refusal::bad_request(Some(field.to_owned()), format!("`{field}` must be text or a list of parts")))
        }
    }
}

/// A tool as a request declares it: `name`, `description` and its schema under
/// `schema_key` (`parameters`, `input_schema`) of `spec`, the tool found at `at`.
pub fn tool(spec: &Map<String, Value>, at: &str, schema_key: &str) -> Result<ToolSpec, Refusal> {
    Ok(ToolSpec::new(
        &string(spec.get("name"), &format!("{at}.name"))?,
        spec.get("description").and_then(Value::as_str).unwrap_or_default(),
        spec.get(schema_key).cloned().unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}})),
    ))
}

/// Arguments as the model wrote them, for a request: a JSON object, or the text when it was
/// not valid JSON.
pub fn arguments(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// Arguments as a provider sends them back: the JSON text (the text itself when the model
/// wrote invalid JSON).
pub fn arguments_text(arguments: &Value) -> String {
    match arguments {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// Names each tool result by the call it answers: the latest earlier assistant call with
/// its id (empty when none has it). One pass, whatever the number of calls and results.
fn name_results(messages: &mut [Message]) {
    let mut names: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for message in messages.iter_mut() {
        match message {
            Message::Assistant { tool_calls, .. } => {
                for call in tool_calls.iter() {
                    names.insert(call.call_id.clone(), call.name.clone());
                }
            }
            Message::Tool { name, call_id, .. } => {
                if let Some(found) = names.get(call_id.as_str()) {
                    name.clone_from(found);
                }
            }
            _ => {}
        }
    }
}

/// One event of a server-sent stream, as the providers write it.
pub fn sse(out: &mut String, event: Option<&str>, data: &Value) {
    if let Some(event) = event {
        out.push_str("event: ");
        out.push_str(event);
        out.push('\n');
    }
    out.push_str("data: ");
    out.push_str(&data.to_string());
    out.push_str("\n\n");
}
