//! What the three wire APIs share: a request as the gateway understood it ([`Asked`]), a
//! refusal ([`Refusal`]), and readers of a request's fields that name the field at fault.

use hyper::StatusCode;
use serde_json::{Map, Value};

use super::GatewayEnd;
use crate::contract::ToolSpec;
use crate::log::{Termination, UnscoredCause};
use crate::model::{Directives, Message, ModelError, ToolChoice};

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
    /// What the client asked of the answer, for the backend to map.
    pub directives: Directives,
    /// The fields read and let be (they do not change the answer), for the log.
    pub ignored: Vec<String>,
    /// The tools dropped from the list (server tools the gateway cannot run), for the log.
    pub dropped: Vec<String>,
    /// Responses' `previous_response_id`: the episode's earlier response this one continues.
    pub previous: Option<String>,
    /// Whether the first message is Responses' `instructions` (not carried to a response
    /// that continues this one).
    pub instructed: bool,
    /// Tools offered as freeform text (Responses' `custom` tools): their calls go back as
    /// `custom_tool_call` items with the text as `input`.
    pub freeform: Vec<String>,
    /// Tools of a namespace, offered flat as `NAMESPACE__NAME`: (flat name, namespace, name).
    pub namespaced: Vec<(String, String, String)>,
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
            ..Asked::default()
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
    /// A shape the gateway does not speak (not a client's mistake).
    pub unsupported: bool,
}

impl Refusal {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Refusal { status, field: None, message: message.into(), unsupported: false }
    }

    pub fn unauthorised(message: &str) -> Self {
        Refusal::new(StatusCode::UNAUTHORIZED, message)
    }

    pub fn bad_request(field: Option<String>, message: impl Into<String>) -> Self {
        Refusal { status: StatusCode::BAD_REQUEST, field, message: message.into(), unsupported: false }
    }

    /// A field the gateway does not speak: the request is fine, the gateway falls short,
    /// so the episode is unscored (`gateway_unsupported`), never the agent's failure.
    pub fn unsupported(field: &str, what: &str) -> Self {
        Refusal {
            status: StatusCode::BAD_REQUEST,
            field: Some(field.to_owned()),
            message: format!("unsupported field `{field}`: {what}"),
            unsupported: true,
        }
    }

    /// What ends the episode when the gateway refuses a shape it does not speak.
    pub fn gap(&self) -> Option<ModelError> {
        self.unsupported.then(|| {
            ModelError::new(
                UnscoredCause::GatewayUnsupported,
                format!("the gateway refused a request it does not support: {}", self.message),
            )
        })
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

/// How a wire treats a request's top-level fields.
pub struct Fields {
    /// Read by the decoder: mapped to the transcript, the tools or the [`Directives`].
    pub used: &'static [&'static str],
    /// Read and let be: they do not change the answer (bookkeeping, caching hints,
    /// sampling the run's model has its own of). Logged once per episode.
    pub ignored: &'static [&'static str],
}

/// Checks a request's top-level fields: the ignored ones present are returned for the log;
/// any field neither used nor ignored is refused, naming it, so that nothing the client
/// asked for is silently left out of the answer.
pub fn check_fields(body: &Map<String, Value>, fields: &Fields) -> Result<Vec<String>, Refusal> {
    let mut ignored = Vec::new();
    for (key, value) in body {
        if fields.used.contains(&key.as_str()) {
            continue;
        }
        if !fields.ignored.contains(&key.as_str()) {
            return Err(Refusal::unsupported(key, "the gateway does not speak it"));
        }
        if !value.is_null() {
            ignored.push(key.clone());
        }
    }
    Ok(ignored)
}

/// The server-side tools of the OpenAI and Anthropic APIs: run by the provider, which the
/// gateway is not, so dropped from the list (and logged) rather than refused.
pub const SERVER_TOOLS: &[&str] = &[
    "web_search",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "file_search",
    "code_interpreter",
    "image_generation",
    "mcp",
];

/// Whether a tool of `kind` is one the provider runs (Anthropic's are dated:
/// `web_search_20250305`, `code_execution_20250522`, `web_fetch_20250910`).
pub fn is_server_tool(kind: &str) -> bool {
    SERVER_TOOLS.contains(&kind)
        || ["web_search_", "web_fetch_", "code_execution_"].iter().any(|prefix| kind.starts_with(prefix))
}

/// An OpenAI `tool_choice`: `auto`, `none`, `required`, or a named function (Chat's
/// `{"type": "function", "function": {"name"}}`, Responses' `{"type": "function", "name"}`,
/// or a custom tool's `{"type": "custom", "name"}`).
pub fn openai_tool_choice(value: Option<&Value>) -> Result<Option<ToolChoice>, Refusal> {
    let field = "tool_choice";
    Ok(Some(match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(word)) => match word.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => return Err(Refusal::bad_request(Some(field.into()), format!("unknown tool_choice `{other}`"))),
        },
        Some(Value::Object(choice)) => {
            let kind = choice.get("type").and_then(Value::as_str).unwrap_or_default();
            let name = choice.get("name").or_else(|| choice.get("function").and_then(|f| f.get("name")));
            match (kind, name.and_then(Value::as_str)) {
                ("function" | "custom", Some(name)) => ToolChoice::Named(name.to_owned()),
                _ => {
                    return Err(Refusal::unsupported(
                        &format!("{field}.type"),
                        &format!(
                            "a tool choice of type `{kind}` is not supported: auto, none, required or a named function"
                        ),
                    ));
                }
            }
        }
        Some(_) => return Err(Refusal::bad_request(Some(field.into()), "`tool_choice` must be a word or an object")),
    }))
}

/// An optional whole number at `field`.
pub fn count(body: &Map<String, Value>, field: &str) -> Result<Option<u64>, Refusal> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_u64()
            .map(Some)
            .ok_or_else(|| Refusal::bad_request(Some(field.to_owned()), format!("`{field}` must be a whole number"))),
    }
}

/// An optional `true | false` at `field`.
pub fn maybe_flag(body: &Map<String, Value>, field: &str) -> Result<Option<bool>, Refusal> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => flag(body, field).map(Some),
    }
}

/// A JSON-schema answer asked for as `{"type": "json_schema", "name", "schema", "strict"}`
/// (Responses' `text.format`, Anthropic's `output_config.format`), in Chat Completions'
/// `response_format` shape; `json_object` as it is; `text` as nothing asked.
pub fn json_format(format: &Value, field: &str) -> Result<Option<Value>, Refusal> {
    let kind = format.get("type").and_then(Value::as_str).unwrap_or_default();
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(serde_json::json!({"type": "json_object"}))),
        "json_schema" => {
            // Chat Completions nests the schema; the others give it flat.
            if let Some(nested) = format.get("json_schema") {
                return Ok(Some(serde_json::json!({"type": "json_schema", "json_schema": nested})));
            }
            let schema = format.get("schema").cloned().ok_or_else(|| {
                Refusal::bad_request(Some(format!("{field}.schema")), "a `json_schema` format needs its `schema`")
            })?;
            let name = format.get("name").and_then(Value::as_str).unwrap_or("answer");
            let mut nested = serde_json::json!({"name": name, "schema": schema});
            if let Some(strict) = format.get("strict").and_then(Value::as_bool) {
                nested["strict"] = Value::Bool(strict);
            }
            Ok(Some(serde_json::json!({"type": "json_schema", "json_schema": nested})))
        }
        other => Err(Refusal::unsupported(
            &format!("{field}.type"),
            &format!("an answer format of type `{other}` is not supported: text, json_object or json_schema"),
        )),
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
pub fn name_results(messages: &mut [Message]) {
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
