//! The Anthropic Messages wire format: a top-level `system`, alternating user and
//! assistant turns, `tool_use` blocks from the model and `tool_result` blocks back.

use serde_json::{Map, Value, json};

use super::config::{Provider, TOOL_CHOICE};
use super::{Directives, Message, ModelRequest, ModelResponse, ProposedCall, ToolChoice};
use crate::log::Usage;

pub const VERSION: &str = "2023-06-01";

pub fn endpoint(base_url: &str) -> String {
    format!("{base_url}/v1/messages")
}

pub fn encode(model: &str, request: &ModelRequest<'_>, provider: &Provider) -> Value {
    let mut system = Vec::new();
    if let Some(format) = &request.directives.response_format {
        system.push(json_instruction(format));
    }
    // Anthropic wants turns to alternate: consecutive messages of one role merge.
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    let mut push = |role: &'static str, block: Value| match turns.last_mut() {
        Some((r, blocks)) if *r == role => blocks.push(block),
        _ => turns.push((role, vec![block])),
    };
    for m in request.messages {
        match m {
            Message::System { content } => system.push(content.clone()),
            Message::User { content } => push("user", json!({"type": "text", "text": content})),
            Message::Assistant { content, tool_calls } => {
                if let Some(text) = content.as_ref().filter(|t| !t.is_empty()) {
                    push("assistant", json!({"type": "text", "text": text}));
                }
                for c in tool_calls {
                    let input = if c.arguments.is_object() { c.arguments.clone() } else { json!({}) };
                    push("assistant", json!({"type": "tool_use", "id": c.call_id, "name": c.name, "input": input}));
                }
            }
            Message::Tool { call_id, content, is_error, .. } => {
                push(
                    "user",
                    json!({"type": "tool_result", "tool_use_id": call_id, "content": content, "is_error": is_error}),
                );
            }
        }
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    if !system.is_empty() {
        body.insert("system".into(), json!(system.join("\n\n")));
    }
    let messages: Vec<Value> =
        turns.into_iter().map(|(role, content)| json!({"role": role, "content": content})).collect();
    body.insert("messages".into(), Value::Array(messages));
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.parameters}))
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        body.insert("tool_choice".into(), json!({"type": "auto"}));
    }
    for (k, v) in &provider.sampling {
        match (k.as_str(), v.as_str()) {
            // Without tools, the API refuses a `tool_choice`.
            (TOOL_CHOICE, _) if request.tools.is_empty() => {}
            // The portable words, in Anthropic's terms (`required` is its `any`).
            (TOOL_CHOICE, Some(choice)) => {
                let kind = if choice == "required" { "any" } else { choice };
                body.insert(k.clone(), json!({"type": kind}));
            }
            _ => {
                body.insert(k.clone(), v.clone());
            }
        }
    }
    directed(&mut body, request.directives, !request.tools.is_empty());
    body.entry("max_tokens").or_insert(json!(4096));
    Value::Object(body)
}

/// What a client asked of the answer, in Messages' terms: `tool_choice` (`any` for
/// required, `tool` for a named one, `disable_parallel_tool_use`), `max_tokens`, and a
/// reasoning effort as a thinking budget.
fn directed(body: &mut Map<String, Value>, directives: &Directives, tools: bool) {
    if let Some(tokens) = directives.max_output_tokens {
        body.insert("max_tokens".into(), json!(tokens));
    }
    let budget = match directives.reasoning_effort.as_deref() {
        Some("low") => Some(1024),
        Some("medium") => Some(4096),
        Some("high") => Some(16384),
        _ => None,
    };
    // Thinking allows only an `auto` tool choice, and needs room beyond its budget.
    let thinking = budget.filter(|_| matches!(directives.tool_choice, None | Some(ToolChoice::Auto)));
    if let Some(budget) = thinking {
        body.insert("thinking".into(), json!({"type": "enabled", "budget_tokens": budget}));
        let room = body.get("max_tokens").and_then(Value::as_u64).unwrap_or(4096);
        body.insert("max_tokens".into(), json!(room.max(budget + 1024)));
    }
    if !tools {
        return;
    }
    let mut choice = match &directives.tool_choice {
        None => match body.get(TOOL_CHOICE) {
            Some(choice) => choice.clone(),
            None => return,
        },
        Some(ToolChoice::Auto) => json!({"type": "auto"}),
        Some(ToolChoice::None) => json!({"type": "none"}),
        Some(ToolChoice::Required) => json!({"type": "any"}),
        Some(ToolChoice::Named(name)) => json!({"type": "tool", "name": name}),
    };
    if directives.parallel_tool_calls == Some(false) && choice.get("type").and_then(Value::as_str) != Some("none") {
        choice["disable_parallel_tool_use"] = json!(true);
    }
    body.insert(TOOL_CHOICE.into(), choice);
}

/// A JSON answer asked of a model whose API has no such field: said in its system prompt.
fn json_instruction(format: &Value) -> String {
    match format.get("json_schema").and_then(|s| s.get("schema")) {
        Some(schema) => format!("Answer with one JSON value that matches this JSON schema, and nothing else: {schema}"),
        None => "Answer with one JSON object, and nothing else.".to_owned(),
    }
}

pub fn decode(body: &Value) -> Result<ModelResponse, String> {
    let blocks = body.get("content").and_then(Value::as_array).ok_or("the response has no `content`")?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or_default()),
            Some("tool_use") => tool_calls.push(ProposedCall {
                id: block.get("id").and_then(Value::as_str).map(String::from),
                name: block.get("name").and_then(Value::as_str).unwrap_or_default().to_owned(),
                arguments: block.get("input").cloned().unwrap_or_else(|| json!({})),
            }),
            // Thinking and other blocks carry nothing the agent acts on.
            _ => {}
        }
    }
    let usage = body.get("usage").map(usage_of).unwrap_or_default();
    Ok(ModelResponse {
        text: Some(text).filter(|t| !t.is_empty()),
        tool_calls,
        usage,
        finish_reason: body.get("stop_reason").and_then(Value::as_str).map(String::from),
        ..ModelResponse::default()
    })
}

fn usage_of(u: &Value) -> Usage {
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    let cached = n("cache_read_input_tokens");
    // Anthropic counts cached and cache-writing tokens apart from `input_tokens`.
    Usage {
        input_tokens: n("input_tokens") + cached + n("cache_creation_input_tokens"),
        output_tokens: n("output_tokens"),
        cached_tokens: cached,
    }
}

pub fn error_message(body: &Value) -> Option<String> {
    body.pointer("/error/message").and_then(Value::as_str).map(String::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{ToolCall, ToolSpec};

    #[test]
    fn what_a_client_asks_of_the_answer_is_said_in_messages_terms() {
        let provider = crate::model::config::ModelConfig::default().providers["anthropic"].clone();
        let tools = vec![ToolSpec::new("Bash", "runs", json!({"type": "object"}))];
        let directives = Directives {
            tool_choice: Some(ToolChoice::Named("Bash".into())),
            parallel_tool_calls: Some(false),
            max_output_tokens: Some(900),
            reasoning_effort: Some("high".into()),
            response_format: Some(
                json!({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}}),
            ),
        };
        let messages = vec![Message::User { content: "hi".into() }];
        let request = ModelRequest {
            messages: &messages,
            tools: &tools,
            deadline: None,
            directives: &directives,
            run_own: &crate::model::RunOwn::NONE,
            watch: None,
        };
        let body = encode("claude-x", &request, &provider);
        assert_eq!(body["tool_choice"], json!({"type": "tool", "name": "Bash", "disable_parallel_tool_use": true}));
        assert_eq!(body["max_tokens"], 900);
        assert!(body.get("thinking").is_none(), "thinking allows only an auto tool choice: {body}");
        assert!(body["system"].as_str().unwrap().contains(r#"{"type":"object"}"#), "{body}");
        let thinking = Directives { reasoning_effort: Some("medium".into()), ..Directives::default() };
        let request = ModelRequest { directives: &thinking, ..request };
        let body = encode("claude-x", &request, &provider);
        assert_eq!(body["thinking"], json!({"type": "enabled", "budget_tokens": 4096}));
        assert_eq!(body["max_tokens"], 5120, "room for the answer past the budget");
    }

    #[test]
    fn tool_results_and_text_merge_into_one_user_turn() {
        let messages = vec![
            Message::System { content: "sys".into() },
            Message::User { content: "hi".into() },
            Message::Assistant {
                content: Some("let me look".into()),
                tool_calls: vec![ToolCall::new("t1", "f", json!({"a": 1}))],
            },
            Message::Tool { call_id: "t1".into(), name: "f".into(), content: "42".into(), is_error: false },
            Message::User { content: "reminder".into() },
        ];
        let tools = vec![ToolSpec::new("f", "does f", json!({"type": "object"}))];
        let provider = super::super::config::ModelConfig::default().providers["anthropic"].clone();
        let body = encode("claude-x", &ModelRequest::new(&messages, &tools), &provider);
        assert_eq!(body["system"], "sys");
        assert_eq!(body["max_tokens"], 4096);
        let turns = body["messages"].as_array().unwrap();
        assert_eq!(turns.len(), 3);
        assert_eq!(turns[1]["content"][1], json!({"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}));
        assert_eq!(turns[2]["role"], "user");
        assert_eq!(turns[2]["content"][0]["type"], "tool_result");
        assert_eq!(turns[2]["content"][1]["text"], "reminder");
        assert_eq!(body["tools"][0]["input_schema"], json!({"type": "object"}));
    }

    #[test]
    fn a_portable_tool_choice_is_written_in_anthropics_terms() {
        let tools = vec![ToolSpec::new("f", "does f", json!({"type": "object"}))];
        let mut provider = super::super::config::ModelConfig::default().providers["anthropic"].clone();
        let request = ModelRequest::new(&[], &tools);
        for (choice, sent) in [("required", "any"), ("auto", "auto"), ("none", "none")] {
            provider.sampling.insert("tool_choice".into(), json!(choice));
            assert_eq!(encode("claude-x", &request, &provider)["tool_choice"], json!({"type": sent}));
        }
        let named = json!({"type": "tool", "name": "f"});
        provider.sampling.insert("tool_choice".into(), named.clone());
        assert_eq!(encode("claude-x", &request, &provider)["tool_choice"], named);
        let without = ModelRequest::new(&[], &[]);
        assert_eq!(encode("claude-x", &without, &provider).get("tool_choice"), None);
    }

    /// A `tool_use` block's `input` must be an object: arguments that did not parse (kept
    /// as the text the model wrote) go back as `{}`.
    #[test]
    fn arguments_that_did_not_parse_go_back_as_an_empty_object() {
        let messages = vec![
            Message::User { content: "hi".into() },
            Message::Assistant {
                content: None,
                tool_calls: vec![ToolCall::new("t1", "f", json!("{\"a\": 1")), ToolCall::new("t2", "f", json!(7))],
            },
        ];
        let provider = super::super::config::ModelConfig::default().providers["anthropic"].clone();
        let body = encode("claude-x", &ModelRequest::new(&messages, &[]), &provider);
        let blocks = &body["messages"][1]["content"];
        assert_eq!(blocks[0]["input"], json!({}));
        assert_eq!(blocks[1]["input"], json!({}));
    }

    #[test]
    fn decodes_tool_use_and_usage() {
        let body = json!({"content": [{"type": "text", "text": "ok"}, {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 2}}],
                          "stop_reason": "tool_use", "usage": {"input_tokens": 5, "output_tokens": 7, "cache_read_input_tokens": 3}});
        let r = decode(&body).unwrap();
        assert_eq!(r.text.as_deref(), Some("ok"));
        assert_eq!(r.tool_calls[0].id.as_deref(), Some("toolu_1"));
        assert_eq!(r.usage, Usage { input_tokens: 8, output_tokens: 7, cached_tokens: 3 });
    }
}
