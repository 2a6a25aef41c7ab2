//! OpenAI Responses, `POST /v1/responses`: `instructions` and `input` items (messages,
//! `function_call`, `function_call_output`) into the neutral transcript, the response back
//! as a `response` object or as the stream `response.created`, `response.in_progress`, per
//! output item `response.output_item.added` … `response.output_item.done` (text through
//! `response.content_part.*` and `response.output_text.*`, calls through
//! `response.function_call_arguments.*`), then `response.completed`.

use serde_json::{Map, Value, json};

use super::shape::{self, Asked, Refusal};
use crate::contract::ToolCall;
use crate::model::{Message, ModelResponse};

const USED: &[&str] =
    &["model", "input", "instructions", "tools", "stream", "previous_response_id", "conversation", "background"];
/// Sampling and bookkeeping: the run's model has its own.
const IGNORED: &[&str] = &[
    "temperature",
    "top_p",
    "max_output_tokens",
    "metadata",
    "parallel_tool_calls",
    "tool_choice",
    "store",
    "reasoning",
    "service_tier",
    "user",
    "truncation",
    "text",
    "include",
    "prompt_cache_key",
    "safety_identifier",
    "stream_options",
    "max_tool_calls",
    "top_logprobs",
];

const INPUT_TEXT: &[&str] = &["input_text", "output_text", "text"];

pub fn decode(body: &Map<String, Value>) -> Result<Asked, Refusal> {
    shape::check_fields(body, USED, IGNORED)?;
    for field in ["previous_response_id", "conversation"] {
        if body.get(field).is_some_and(|v| !v.is_null()) {
            return Err(Refusal::unsupported(field, "the gateway keeps no responses: send the whole input each time"));
        }
    }
    if body.get("background").and_then(Value::as_bool) == Some(true) {
        return Err(Refusal::unsupported("background", "the gateway answers in the foreground only"));
    }
    let mut messages = Vec::new();
    let instructions = shape::text(body.get("instructions"), "instructions", INPUT_TEXT)?;
    if !instructions.is_empty() {
        messages.push(Message::System { content: instructions });
    }
    match body.get("input") {
        Some(Value::String(text)) => messages.push(Message::User { content: text.clone() }),
        input => {
            for (i, item) in shape::array(input, "input")?.iter().enumerate() {
                decode_item(item, &format!("input[{i}]"), &mut messages)?;
            }
        }
    }
    let mut tools = Vec::new();
    for (i, tool) in shape::array(body.get("tools"), "tools")?.iter().enumerate() {
        let at = format!("tools[{i}]");
        let kind = tool.get("type").and_then(Value::as_str).unwrap_or_default();
        if kind != "function" {
            return Err(Refusal::unsupported(
                &format!("{at}.type"),
                &format!("only `function` tools are supported, not `{kind}`"),
            ));
        }
        tools.push(shape::tool(shape::object(tool, &at)?, &at, "parameters")?);
    }
    Asked::new(body, messages, tools)
}

fn decode_item(item: &Value, at: &str, out: &mut Vec<Message>) -> Result<(), Refusal> {
    let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
    match kind {
        "message" => {
            let role = shape::string(item.get("role"), &format!("{at}.role"))?;
            let content = shape::text(item.get("content"), &format!("{at}.content"), INPUT_TEXT)?;
            out.push(match role.as_str() {
                "system" | "developer" => Message::System { content },
                "user" => Message::User { content },
                "assistant" => Message::Assistant { content: Some(content), tool_calls: Vec::new() },
                other => {
                    return Err(Refusal::unsupported(
                        &format!("{at}.role"),
                        &format!("role `{other}` is not supported"),
                    ));
                }
            });
        }
        "function_call" => {
            let call = ToolCall::new(
                shape::string(item.get("call_id"), &format!("{at}.call_id"))?,
                shape::string(item.get("name"), &format!("{at}.name"))?,
                shape::arguments(item.get("arguments").and_then(Value::as_str).unwrap_or("{}")),
            );
            // The calls of one response follow its message: one assistant turn.
            match out.last_mut() {
                Some(Message::Assistant { tool_calls, .. }) => tool_calls.push(call),
                _ => out.push(Message::Assistant { content: None, tool_calls: vec![call] }),
            }
        }
        "function_call_output" => {
            let call_id = shape::string(item.get("call_id"), &format!("{at}.call_id"))?;
            out.push(Message::Tool {
                // Named once every message is read: `Asked::new`.
                name: String::new(),
                call_id,
                content: shape::text(item.get("output"), &format!("{at}.output"), INPUT_TEXT)?,
                is_error: false,
            });
        }
        // The model's reasoning of an earlier turn: the run's model is asked afresh.
        "reasoning" => {}
        other => {
            return Err(Refusal::unsupported(
                &format!("{at}.type"),
                &format!("input items of type `{other}` are not supported"),
            ));
        }
    }
    Ok(())
}

pub fn encode(asked: &Asked, response: &ModelResponse, step: u32) -> String {
    let id = format!("resp_{step:02}");
    let message_id = format!("msg_{step:02}");
    let text = response.text.as_deref().filter(|t| !t.is_empty());
    let part = |text: &str| json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
    let message = |status: &str, content: Vec<Value>| json!({"id": message_id, "type": "message", "status": status, "role": "assistant", "content": content});
    let call_item = |i: usize, status: &str, arguments: &str| {
        let call = &response.tool_calls[i];
        json!({"id": format!("fc_{step:02}_{i}"), "type": "function_call", "status": status,
               "call_id": call.id, "name": call.name, "arguments": arguments})
    };
    let mut output: Vec<Value> = text.map(|t| message("completed", vec![part(t)])).into_iter().collect();
    output.extend(
        (0..response.tool_calls.len())
            .map(|i| call_item(i, "completed", &shape::arguments_text(&response.tool_calls[i].arguments))),
    );
    let usage = json!({
        "input_tokens": response.usage.input_tokens,
        "input_tokens_details": {"cached_tokens": response.usage.cached_tokens},
        "output_tokens": response.usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": response.usage.total(),
    });
    let snapshot = |status: &str, output: Vec<Value>, usage: Value| {
        json!({"id": id, "object": "response", "created_at": 0, "status": status, "model": asked.model,
               "output": output, "usage": usage, "error": null, "incomplete_details": null,
               "instructions": null, "metadata": {}, "parallel_tool_calls": true, "temperature": null,
               "tool_choice": "auto", "tools": [], "top_p": null, "text": {"format": {"type": "text"}}})
    };
    if !asked.stream {
        return snapshot("completed", output, usage).to_string();
    }
    let mut out = String::new();
    let mut sequence = 0;
    let mut send = |out: &mut String, kind: &str, mut event: Value| {
        event["type"] = json!(kind);
        event["sequence_number"] = json!(sequence);
        sequence += 1;
        shape::sse(out, Some(kind), &event);
    };
    send(&mut out, "response.created", json!({"response": snapshot("in_progress", vec![], Value::Null)}));
    send(&mut out, "response.in_progress", json!({"response": snapshot("in_progress", vec![], Value::Null)}));
    let mut index = 0;
    if let Some(text) = text {
        let at = json!({"item_id": message_id, "output_index": index, "content_index": 0});
        let with = |mut base: Value, extra: Value| {
            if let (Some(base), Some(extra)) = (base.as_object_mut(), extra.as_object()) {
                base.extend(extra.clone());
            }
            base
        };
        send(
            &mut out,
            "response.output_item.added",
            json!({"output_index": index, "item": message("in_progress", vec![])}),
        );
        send(&mut out, "response.content_part.added", with(at.clone(), json!({"part": part("")})));
        send(&mut out, "response.output_text.delta", with(at.clone(), json!({"delta": text, "logprobs": []})));
        send(&mut out, "response.output_text.done", with(at.clone(), json!({"text": text, "logprobs": []})));
        send(&mut out, "response.content_part.done", with(at, json!({"part": part(text)})));
        send(&mut out, "response.output_item.done", json!({"output_index": index, "item": output[0]}));
        index += 1;
    }
    for (i, call) in response.tool_calls.iter().enumerate() {
        let arguments = shape::arguments_text(&call.arguments);
        let item_id = format!("fc_{step:02}_{i}");
        send(
            &mut out,
            "response.output_item.added",
            json!({"output_index": index, "item": call_item(i, "in_progress", "")}),
        );
        send(
            &mut out,
            "response.function_call_arguments.delta",
            json!({"item_id": item_id, "output_index": index, "delta": arguments}),
        );
        send(
            &mut out,
            "response.function_call_arguments.done",
            json!({"item_id": item_id, "output_index": index, "arguments": arguments, "name": call.name}),
        );
        send(&mut out, "response.output_item.done", json!({"output_index": index, "item": output[index]}));
        index += 1;
    }
    send(&mut out, "response.completed", json!({"response": snapshot("completed", output, usage)}));
    out
}
