//! Anthropic Messages, `POST /v1/messages`: the request into the neutral transcript (a
//! user turn's `tool_result` blocks become tool messages, its text a user message), the
//! response back as a `message` or as the stream `message_start`, per block
//! `content_block_start` / `content_block_delta` (`text_delta`, `input_json_delta`) /
//! `content_block_stop`, then `message_delta` and `message_stop`.

use serde_json::{Map, Value, json};

use super::shape::{self, Asked, Refusal};
use crate::contract::ToolCall;
use crate::model::{Directives, Message, ModelResponse, ToolChoice};

const FIELDS: shape::Fields = shape::Fields {
    used: &["model", "messages", "system", "tools", "stream", "max_tokens", "tool_choice", "thinking", "output_config"],
    ignored: &["metadata", "temperature", "top_p", "top_k", "stop_sequences", "service_tier", "context_management"],
};

const TEXT_BLOCKS: &[&str] = &["text"];

pub fn decode(body: &Map<String, Value>) -> Result<Asked, Refusal> {
    let ignored = shape::check_fields(body, &FIELDS)?;
    let mut messages = Vec::new();
    let system = shape::text(body.get("system"), "system", TEXT_BLOCKS)?;
    if !system.is_empty() {
        messages.push(Message::System { content: system });
    }
    for (i, message) in shape::array(body.get("messages"), "messages")?.iter().enumerate() {
        decode_message(message, &format!("messages[{i}]"), &mut messages)?;
    }
    let mut asked = Asked::new(body, messages, Vec::new())?;
    for (i, tool) in shape::array(body.get("tools"), "tools")?.iter().enumerate() {
        let at = format!("tools[{i}]");
        match tool.get("type").and_then(Value::as_str).filter(|k| *k != "custom") {
            None => asked.tools.push(shape::tool(shape::object(tool, &at)?, &at, "input_schema")?),
            Some(kind) if shape::is_server_tool(kind) => asked.dropped.push(format!("{at} ({kind})")),
            Some(kind) => {
                return Err(Refusal::unsupported(
                    &format!("{at}.type"),
                    &format!(
                        "Anthropic-defined tools (`{kind}`) are not supported; only client tools with an input_schema"
                    ),
                ));
            }
        }
    }
    asked.directives = directives(body)?;
    asked.ignored = ignored;
    Ok(asked)
}

/// `max_tokens`, `tool_choice` (with `disable_parallel_tool_use`), the effort
/// (`output_config.effort`, else a thinking budget's size) and `output_config.format`.
fn directives(body: &Map<String, Value>) -> Result<Directives, Refusal> {
    let config = body.get("output_config").filter(|c| !c.is_null());
    let response_format = match config.and_then(|c| c.get("format")).filter(|f| !f.is_null()) {
        Some(format) => shape::json_format(format, "output_config.format")?,
        None => None,
    };
    let thinking = body.get("thinking").filter(|t| !t.is_null());
    let budget_effort = match thinking.and_then(|t| t.get("budget_tokens")).and_then(Value::as_u64) {
        Some(budget) if budget < 2048 => Some("low"),
        Some(budget) if budget < 8192 => Some("medium"),
        Some(_) => Some("high"),
        None => None,
    };
    let disabled = thinking.and_then(|t| t.get("type")).and_then(Value::as_str) == Some("disabled");
    let effort = match config.and_then(|c| c.get("effort")).filter(|e| !e.is_null()) {
        Some(effort) => Some(shape::string(Some(effort), "output_config.effort")?),
        None => budget_effort.map(str::to_owned),
    };
    let (tool_choice, parallel_tool_calls) = match body.get("tool_choice").filter(|c| !c.is_null()) {
        None => (None, None),
        Some(choice) => {
            let kind = choice.get("type").and_then(Value::as_str).unwrap_or_default();
            let named = choice.get("name").and_then(Value::as_str);
            let choice_of = match (kind, named) {
                ("auto", _) => ToolChoice::Auto,
                ("any", _) => ToolChoice::Required,
                ("none", _) => ToolChoice::None,
                ("tool", Some(name)) => ToolChoice::Named(name.to_owned()),
                _ => {
                    return Err(Refusal::unsupported(
                        "tool_choice.type",
                        &format!(
                            "a tool choice of type `{kind}` is not supported: auto, any, none or tool with a name"
                        ),
                    ));
                }
            };
            let serial = choice.get("disable_parallel_tool_use").and_then(Value::as_bool) == Some(true);
            (Some(choice_of), serial.then_some(false))
        }
    };
    Ok(Directives {
        reasoning_effort: if disabled { None } else { effort },
        response_format,
        tool_choice,
        parallel_tool_calls,
        max_output_tokens: shape::count(body, "max_tokens")?,
    })
}

/// One Anthropic message, which may become several neutral ones: each tool result its own.
fn decode_message(message: &Value, at: &str, out: &mut Vec<Message>) -> Result<(), Refusal> {
    let role = shape::string(message.get("role"), &format!("{at}.role"))?;
    let content = message.get("content");
    let field = format!("{at}.content");
    let blocks: Vec<Value> = match content {
        Some(Value::String(text)) => vec![json!({"type": "text", "text": text})],
        _ => shape::array(content, &field)?.to_vec(),
    };
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{field}[{j}]");
        let kind = block.get("type").and_then(Value::as_str).unwrap_or_default();
        match (role.as_str(), kind) {
            (_, "text") => text.push_str(&shape::string(block.get("text"), &format!("{at}.text"))?),
            // The model's reasoning of an earlier turn: the run's model is asked afresh.
            ("assistant", "thinking" | "redacted_thinking") => {}
            ("assistant", "tool_use") => tool_calls.push(ToolCall::new(
                shape::string(block.get("id"), &format!("{at}.id"))?,
                shape::string(block.get("name"), &format!("{at}.name"))?,
                block.get("input").cloned().unwrap_or_else(|| json!({})),
            )),
            ("user", "tool_result") => {
                let call_id = shape::string(block.get("tool_use_id"), &format!("{at}.tool_use_id"))?;
                out.push(Message::Tool {
                    // Named once every message is read: `Asked::new`.
                    name: String::new(),
                    call_id,
                    content: shape::text(block.get("content"), &format!("{at}.content"), TEXT_BLOCKS)?,
                    is_error: block.get("is_error").and_then(Value::as_bool).unwrap_or(false),
                });
            }
            _ => {
                return Err(Refusal::unsupported(
                    &format!("{at}.type"),
                    &format!("a `{kind}` block in a `{role}` message is not supported"),
                ));
            }
        }
    }
    match role.as_str() {
        "user" if !text.is_empty() || !blocks.iter().any(is_tool_result) => {
            out.push(Message::User { content: text });
        }
        "user" => {}
        // Not in Anthropic's documented shape, but Claude Code sends it on some requests.
        "system" if tool_calls.is_empty() => out.push(Message::System { content: text }),
        "assistant" => out.push(Message::Assistant { content: (!text.is_empty()).then_some(text), tool_calls }),
        other => {
            return Err(Refusal::unsupported(&format!("{at}.role"), &format!("role `{other}` is not supported")));
        }
    }
    Ok(())
}

fn is_tool_result(block: &Value) -> bool {
    block.get("type").and_then(Value::as_str) == Some("tool_result")
}

pub fn encode(asked: &Asked, response: &ModelResponse, step: u32) -> String {
    let id = format!("msg_{step:02}");
    let stop_reason = if response.tool_calls.is_empty() { "end_turn" } else { "tool_use" };
    let usage = json!({
        "input_tokens": response.usage.input_tokens,
        "output_tokens": response.usage.output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": response.usage.cached_tokens,
    });
    let text = response.text.as_deref().filter(|t| !t.is_empty());
    if !asked.stream {
        let mut content: Vec<Value> = text.map(|t| json!({"type": "text", "text": t})).into_iter().collect();
        content.extend(
            response
                .tool_calls
                .iter()
                .map(|c| json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input(&c.arguments)})),
        );
        return json!({
            "id": id, "type": "message", "role": "assistant", "model": asked.model, "content": content,
            "stop_reason": stop_reason, "stop_sequence": null, "usage": usage,
        })
        .to_string();
    }
    let mut out = String::new();
    let start_usage = json!({"input_tokens": response.usage.input_tokens, "output_tokens": 0,
                             "cache_creation_input_tokens": 0, "cache_read_input_tokens": response.usage.cached_tokens});
    let start = json!({"id": id, "type": "message", "role": "assistant", "model": asked.model, "content": [],
                       "stop_reason": null, "stop_sequence": null, "usage": start_usage});
    shape::sse(&mut out, Some("message_start"), &json!({"type": "message_start", "message": start}));
    let mut index = 0;
    let mut block = |out: &mut String, first: Value, delta: Value| {
        shape::sse(
            out,
            Some("content_block_start"),
            &json!({"type": "content_block_start", "index": index, "content_block": first}),
        );
        shape::sse(
            out,
            Some("content_block_delta"),
            &json!({"type": "content_block_delta", "index": index, "delta": delta}),
        );
        shape::sse(out, Some("content_block_stop"), &json!({"type": "content_block_stop", "index": index}));
        index += 1;
    };
    if let Some(text) = text {
        block(&mut out, json!({"type": "text", "text": ""}), json!({"type": "text_delta", "text": text}));
    }
    for call in &response.tool_calls {
        block(
            &mut out,
            json!({"type": "tool_use", "id": call.id, "name": call.name, "input": {}}),
            json!({"type": "input_json_delta", "partial_json": input(&call.arguments).to_string()}),
        );
    }
    let delta = json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                       "usage": {"output_tokens": response.usage.output_tokens}});
    shape::sse(&mut out, Some("message_delta"), &delta);
    shape::sse(&mut out, Some("message_stop"), &json!({"type": "message_stop"}));
    out
}

/// A tool's input is an object on this wire: arguments the model wrote as invalid JSON
/// travel as their text under `input`.
fn input(arguments: &Value) -> Value {
    match arguments {
        Value::Object(_) => arguments.clone(),
        other => json!({"input": shape::arguments_text(other)}),
    }
}
