//! OpenAI Responses, `POST /v1/responses`: `instructions` and `input` items (messages,
//! `function_call`, `function_call_output`) into the neutral transcript, the response back
//! as a `response` object or as the stream `response.created`, `response.in_progress`, per
//! output item `response.output_item.added` … `response.output_item.done` (text through
//! `response.content_part.*` and `response.output_text.*`, calls through
//! `response.function_call_arguments.*`), then `response.completed`.

use serde_json::{Map, Value, json};

use super::shape::{self, Asked, Refusal};
use crate::contract::{ToolCall, ToolSpec};
use crate::model::{Directives, Message, ModelResponse, ProposedCall};

const FIELDS: shape::Fields = shape::Fields {
    used: &[
        "model",
        "input",
        "instructions",
        "tools",
        "stream",
        "previous_response_id",
        "conversation",
        "background",
        "prompt",
        "reasoning",
        "text",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
    ],
    ignored: &[
        "temperature",
        "top_p",
        "metadata",
        "client_metadata",
        "store",
        "service_tier",
        "user",
        "truncation",
        "include",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
        "stream_options",
        "max_tool_calls",
        "top_logprobs",
    ],
};

const INPUT_TEXT: &[&str] = &["input_text", "output_text", "text"];

pub fn decode(body: &Map<String, Value>) -> Result<Asked, Refusal> {
    let ignored = shape::check_fields(body, &FIELDS)?;
    if body.get("conversation").is_some_and(|v| !v.is_null()) {
        return Err(Refusal::unsupported(
            "conversation",
            "the gateway keeps an episode's responses, not conversations: use previous_response_id or send the whole input",
        ));
    }
    if body.get("prompt").is_some_and(|v| !v.is_null()) {
        return Err(Refusal::unsupported("prompt", "stored prompt templates live with the provider, not the gateway"));
    }
    if body.get("background").and_then(Value::as_bool) == Some(true) {
        return Err(Refusal::unsupported("background", "the gateway answers in the foreground only"));
    }
    let previous = match body.get("previous_response_id") {
        None | Some(Value::Null) => None,
        value => Some(shape::string(value, "previous_response_id")?),
    };
    let mut messages = Vec::new();
    let instructions = shape::text(body.get("instructions"), "instructions", INPUT_TEXT)?;
    let instructed = !instructions.is_empty();
    if instructed {
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
    let mut asked = Asked::new(body, messages, Vec::new())?;
    decode_tools(body, &mut asked)?;
    asked.directives = directives(body)?;
    asked.ignored = ignored;
    asked.previous = previous;
    asked.instructed = instructed;
    Ok(asked)
}

/// The tools: functions as they are, `custom` (freeform) tools as a function of one text
/// `input`, a `namespace`'s tools flat as `NAMESPACE__NAME`, server tools dropped.
fn decode_tools(body: &Map<String, Value>, asked: &mut Asked) -> Result<(), Refusal> {
    for (i, tool) in shape::array(body.get("tools"), "tools")?.iter().enumerate() {
        let at = format!("tools[{i}]");
        let spec = shape::object(tool, &at)?;
        match spec.get("type").and_then(Value::as_str).unwrap_or_default() {
            "function" => asked.tools.push(shape::tool(spec, &at, "parameters")?),
            "custom" => {
                let tool = freeform(spec, &at)?;
                asked.freeform.push(tool.name.clone());
                asked.tools.push(tool);
            }
            "namespace" => {
                let namespace = shape::string(spec.get("name"), &format!("{at}.name"))?;
                for (j, inner) in shape::array(spec.get("tools"), &format!("{at}.tools"))?.iter().enumerate() {
                    let at = format!("{at}.tools[{j}]");
                    let mut tool = shape::tool(shape::object(inner, &at)?, &at, "parameters")?;
                    let flat = format!("{namespace}__{}", tool.name);
                    asked.namespaced.push((flat.clone(), namespace.clone(), std::mem::take(&mut tool.name)));
                    tool.name = flat;
                    asked.tools.push(tool);
                }
            }
            kind if shape::is_server_tool(kind) => asked.dropped.push(format!("{at} ({kind})")),
            kind => {
                return Err(Refusal::unsupported(
                    &format!("{at}.type"),
                    &format!("tools of type `{kind}` are not supported: function, custom and namespace tools are"),
                ));
            }
        }
    }
    Ok(())
}

/// A freeform tool: the model writes its input as text (a patch, say), offered to the
/// run's model as a function of one string, `input`; its grammar, if any, in the description.
fn freeform(spec: &Map<String, Value>, at: &str) -> Result<ToolSpec, Refusal> {
    let name = shape::string(spec.get("name"), &format!("{at}.name"))?;
    let mut description = spec.get("description").and_then(Value::as_str).unwrap_or_default().to_owned();
    if let Some(definition) = spec.get("format").and_then(|f| f.get("definition")).and_then(Value::as_str) {
        description.push_str("\n\nThe input follows this grammar:\n");
        description.push_str(definition);
    }
    let parameters = json!({"type": "object", "properties": {"input": {"type": "string", "description": "The tool's input, as text."}}, "required": ["input"]});
    Ok(ToolSpec::new(&name, &description, parameters))
}

/// `reasoning.effort`, `text.format`, `tool_choice`, `parallel_tool_calls`, `max_output_tokens`.
fn directives(body: &Map<String, Value>) -> Result<Directives, Refusal> {
    let reasoning_effort = match body.get("reasoning").and_then(|r| r.get("effort")) {
        None | Some(Value::Null) => None,
        Some(Value::String(effort)) if effort == "none" => None,
        effort => Some(shape::string(effort, "reasoning.effort")?),
    };
    let response_format = match body.get("text").and_then(|t| t.get("format")) {
        None | Some(Value::Null) => None,
        Some(format) => shape::json_format(format, "text.format")?,
    };
    Ok(Directives {
        reasoning_effort,
        response_format,
        tool_choice: shape::openai_tool_choice(body.get("tool_choice"))?,
        parallel_tool_calls: shape::maybe_flag(body, "parallel_tool_calls")?,
        max_output_tokens: shape::count(body, "max_output_tokens")?,
    })
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
            let name = shape::string(item.get("name"), &format!("{at}.name"))?;
            // A namespace's tool is offered flat: its call is named so in the transcript.
            let name = match item.get("namespace").and_then(Value::as_str) {
                Some(namespace) => format!("{namespace}__{name}"),
                None => name,
            };
            let call = ToolCall::new(
                shape::string(item.get("call_id"), &format!("{at}.call_id"))?,
                name,
                shape::arguments(item.get("arguments").and_then(Value::as_str).unwrap_or("{}")),
            );
            push_call(out, call);
        }
        "custom_tool_call" => {
            let call = ToolCall::new(
                shape::string(item.get("call_id"), &format!("{at}.call_id"))?,
                shape::string(item.get("name"), &format!("{at}.name"))?,
                json!({"input": shape::string(item.get("input"), &format!("{at}.input"))?}),
            );
            push_call(out, call);
        }
        "function_call_output" | "custom_tool_call_output" => {
            let call_id = shape::string(item.get("call_id"), &format!("{at}.call_id"))?;
            out.push(Message::Tool {
                // Named once every message is read: `Asked::new`.
                name: String::new(),
                call_id,
                content: shape::text(item.get("output"), &format!("{at}.output"), INPUT_TEXT)?,
                is_error: false,
            });
        }
        // The model's reasoning of an earlier turn (its summary, its encrypted content): an
        // opaque value of the provider that made it; the run's model is asked afresh.
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

/// A response's id: by step, the same in every run of the episode.
pub fn response_id(step: u32) -> String {
    format!("resp_{step:02}")
}

/// The calls of one response follow its message: one assistant turn.
fn push_call(out: &mut Vec<Message>, call: ToolCall) {
    match out.last_mut() {
        Some(Message::Assistant { tool_calls, .. }) => tool_calls.push(call),
        _ => out.push(Message::Assistant { content: None, tool_calls: vec![call] }),
    }
}

/// A call's output item: a `custom_tool_call` with its text for a freeform tool, else a
/// `function_call` (a namespace's tool named as the client knows it).
fn call_item(asked: &Asked, call: &ProposedCall, id: &str, status: &str, arguments: &str) -> Value {
    if asked.freeform.contains(&call.name) {
        let input = match &call.arguments {
            Value::Object(fields) => fields.get("input").and_then(Value::as_str).unwrap_or(arguments).to_owned(),
            _ => arguments.to_owned(),
        };
        let input = if status == "in_progress" { String::new() } else { input };
        return json!({"id": id, "type": "custom_tool_call", "status": status, "call_id": call.id,
                      "name": call.name, "input": input});
    }
    let mut item = json!({"id": id, "type": "function_call", "status": status, "call_id": call.id,
                          "name": call.name, "arguments": arguments});
    if let Some((_, namespace, name)) = asked.namespaced.iter().find(|(flat, ..)| *flat == call.name) {
        item["name"] = json!(name);
        item["namespace"] = json!(namespace);
    }
    item
}

pub fn encode(asked: &Asked, response: &ModelResponse, step: u32) -> String {
    let id = response_id(step);
    let message_id = format!("msg_{step:02}");
    let text = response.text.as_deref().filter(|t| !t.is_empty());
    let part = |text: &str| json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
    let message = |status: &str, content: Vec<Value>| json!({"id": message_id, "type": "message", "status": status, "role": "assistant", "content": content});
    let call_item = |i: usize, status: &str, arguments: &str| {
        call_item(asked, &response.tool_calls[i], &format!("fc_{step:02}_{i}"), status, arguments)
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
        if asked.freeform.contains(&call.name) {
            let input = output[index]["input"].clone();
            send(
                &mut out,
                "response.custom_tool_call_input.delta",
                json!({"item_id": item_id, "output_index": index, "delta": input}),
            );
            send(
                &mut out,
                "response.custom_tool_call_input.done",
                json!({"item_id": item_id, "output_index": index, "input": input}),
            );
        } else {
            send(
                &mut out,
                "response.function_call_arguments.delta",
                json!({"item_id": item_id, "output_index": index, "delta": arguments}),
            );
            send(
                &mut out,
                "response.function_call_arguments.done",
                json!({"item_id": item_id, "output_index": index, "arguments": arguments, "name": output[index]["name"]}),
            );
        }
        send(&mut out, "response.output_item.done", json!({"output_index": index, "item": output[index]}));
        index += 1;
    }
    send(&mut out, "response.completed", json!({"response": snapshot("completed", output, usage)}));
    out
}
