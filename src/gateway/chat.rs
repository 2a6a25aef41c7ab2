//! OpenAI Chat Completions, `POST /v1/chat/completions`: the request into the neutral
//! transcript, the response back as a `chat.completion` or a stream of
//! `chat.completion.chunk`s ended by `data: [DONE]`.

use serde_json::{Map, Value, json};

use super::shape::{self, Asked, Refusal};
use crate::contract::ToolCall;
use crate::model::{Directives, Message, ModelResponse};

const FIELDS: shape::Fields = shape::Fields {
    used: &[
        "model",
        "messages",
        "tools",
        "stream",
        "stream_options",
        "n",
        "response_format",
        "logprobs",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning_effort",
        "max_tokens",
        "max_completion_tokens",
    ],
    ignored: &[
        "temperature",
        "top_p",
        "seed",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "user",
        "metadata",
        "store",
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
        "verbosity",
        "top_logprobs",
        // A search the provider runs: the gateway has none, and says so in the log.
        "web_search_options",
    ],
};

const TEXT_PARTS: &[&str] = &["text"];

pub fn decode(body: &Map<String, Value>) -> Result<Asked, Refusal> {
    let ignored = shape::check_fields(body, &FIELDS)?;
    if body.get("n").and_then(Value::as_u64).is_some_and(|n| n != 1) {
        return Err(Refusal::unsupported("n", "the gateway gives one choice per request"));
    }
    if body.get("logprobs").and_then(Value::as_bool) == Some(true) {
        return Err(Refusal::unsupported("logprobs", "the run's model gives no log probabilities"));
    }
    let mut messages = Vec::new();
    for (i, message) in shape::array(body.get("messages"), "messages")?.iter().enumerate() {
        messages.push(decode_message(message, &format!("messages[{i}]"))?);
    }
    let mut tools = Vec::new();
    let mut dropped = Vec::new();
    for (i, tool) in shape::array(body.get("tools"), "tools")?.iter().enumerate() {
        let at = format!("tools[{i}]");
        match tool.get("type").and_then(Value::as_str).unwrap_or_default() {
            "function" => {
                let function = shape::object(tool.get("function").unwrap_or(&Value::Null), &format!("{at}.function"))?;
                tools.push(shape::tool(function, &format!("{at}.function"), "parameters")?);
            }
            kind if shape::is_server_tool(kind) => dropped.push(format!("{at} ({kind})")),
            kind => {
                return Err(Refusal::unsupported(
                    &format!("{at}.type"),
                    &format!("only `function` tools are supported, not `{kind}`"),
                ));
            }
        }
    }
    let response_format = match body.get("response_format") {
        None | Some(Value::Null) => None,
        Some(format) => shape::json_format(format, "response_format")?,
    };
    let reasoning_effort = match body.get("reasoning_effort") {
        None | Some(Value::Null) => None,
        Some(Value::String(effort)) if effort == "none" => None,
        effort => Some(shape::string(effort, "reasoning_effort")?),
    };
    let directives = Directives {
        reasoning_effort,
        response_format,
        tool_choice: shape::openai_tool_choice(body.get("tool_choice"))?,
        parallel_tool_calls: shape::maybe_flag(body, "parallel_tool_calls")?,
        max_output_tokens: shape::count(body, "max_completion_tokens")?.or(shape::count(body, "max_tokens")?),
    };
    let include_usage = body.get("stream_options").and_then(|o| o.get("include_usage")).and_then(Value::as_bool);
    Ok(Asked {
        include_usage: include_usage == Some(true),
        directives,
        ignored,
        dropped,
        ..Asked::new(body, messages, tools)?
    })
}

fn decode_message(message: &Value, at: &str) -> Result<Message, Refusal> {
    let role = shape::string(message.get("role"), &format!("{at}.role"))?;
    let content = message.get("content");
    let field = format!("{at}.content");
    Ok(match role.as_str() {
        "system" | "developer" => Message::System { content: shape::text(content, &field, TEXT_PARTS)? },
        "user" => Message::User { content: shape::text(content, &field, TEXT_PARTS)? },
        "assistant" => {
            let text = shape::text(content, &field, &["text", "refusal"])?;
            let mut tool_calls = Vec::new();
            for (j, call) in shape::array(message.get("tool_calls"), &format!("{at}.tool_calls"))?.iter().enumerate() {
                let at = format!("{at}.tool_calls[{j}]");
                let function = shape::object(call.get("function").unwrap_or(&Value::Null), &format!("{at}.function"))?;
                tool_calls.push(ToolCall::new(
                    shape::string(call.get("id"), &format!("{at}.id"))?,
                    shape::string(function.get("name"), &format!("{at}.function.name"))?,
                    shape::arguments(function.get("arguments").and_then(Value::as_str).unwrap_or("{}")),
                ));
            }
            Message::Assistant { content: (!text.is_empty()).then_some(text), tool_calls }
        }
        "tool" => {
            let call_id = shape::string(message.get("tool_call_id"), &format!("{at}.tool_call_id"))?;
            Message::Tool {
                // Named once every message is read: `Asked::new`.
                name: String::new(),
                call_id,
                content: shape::text(content, &field, TEXT_PARTS)?,
                is_error: false,
            }
        }
        other => {
            return Err(Refusal::unsupported(&format!("{at}.role"), &format!("role `{other}` is not supported")));
        }
    })
}

pub fn encode(asked: &Asked, response: &ModelResponse, step: u32) -> String {
    let id = format!("chatcmpl-{step:02}");
    let finish = if response.tool_calls.is_empty() { "stop" } else { "tool_calls" };
    let usage = json!({
        "prompt_tokens": response.usage.input_tokens,
        "completion_tokens": response.usage.output_tokens,
        "total_tokens": response.usage.total(),
        "prompt_tokens_details": {"cached_tokens": response.usage.cached_tokens},
    });
    let calls = |with_index: bool| -> Vec<Value> {
        response
            .tool_calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut call = json!({"id": c.id, "type": "function",
                    "function": {"name": c.name, "arguments": shape::arguments_text(&c.arguments)}});
                if with_index {
                    call["index"] = json!(i);
                }
                call
            })
            .collect()
    };
    if !asked.stream {
        let mut message = json!({"role": "assistant", "content": response.text, "refusal": null});
        if !response.tool_calls.is_empty() {
            message["tool_calls"] = json!(calls(false));
        }
        return json!({
            "id": id, "object": "chat.completion", "created": 0, "model": asked.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": null}],
            "usage": usage,
        })
        .to_string();
    }
    let chunk = |delta: Value, finish_reason: Value| {
        json!({"id": id, "object": "chat.completion.chunk", "created": 0, "model": asked.model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": null}]})
    };
    let mut out = String::new();
    shape::sse(&mut out, None, &chunk(json!({"role": "assistant", "content": ""}), Value::Null));
    if let Some(text) = response.text.as_deref().filter(|t| !t.is_empty()) {
        shape::sse(&mut out, None, &chunk(json!({"content": text}), Value::Null));
    }
    for call in calls(true) {
        shape::sse(&mut out, None, &chunk(json!({"tool_calls": [call]}), Value::Null));
    }
    shape::sse(&mut out, None, &chunk(json!({}), json!(finish)));
    if asked.include_usage {
        let last = json!({"id": id, "object": "chat.completion.chunk", "created": 0, "model": asked.model,
                          "choices": [], "usage": usage});
        shape::sse(&mut out, None, &last);
    }
    out.push_str("data: [DONE]\n\n");
    out
}
