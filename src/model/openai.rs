//! The OpenAI Chat Completions wire format, also spoken by vLLM, llama.cpp, Ollama,
//! LiteLLM and OpenRouter. Decoding is lenient: missing usage, unknown finish reasons,
//! extra fields, the legacy `function_call`, and arguments that are not valid JSON (those
//! reach the environment, which answers with a `ValidationError`, and go back to the
//! provider as `{}`).

use serde_json::{Map, Value, json};

use super::config::{Provider, TOOL_CHOICE};
use super::{Directives, Message, ModelRequest, ModelResponse, ProposedCall, ToolChoice};
use crate::log::Usage;

pub fn endpoint(base_url: &str) -> String {
    format!("{base_url}/chat/completions")
}

pub fn encode(model: &str, request: &ModelRequest<'_>, provider: &Provider) -> Value {
    let messages: Vec<Value> = request
        .messages
        .iter()
        .map(|m| match m {
            Message::System { content } => json!({"role": "system", "content": content}),
            Message::User { content } => json!({"role": "user", "content": content}),
            Message::Assistant { content, tool_calls } => {
                // Some servers (llama-cpp-python) refuse a null content beside tool calls;
                // every server takes an empty string.
                let mut msg = json!({"role": "assistant", "content": content.as_deref().unwrap_or("")});
                if !tool_calls.is_empty() {
                    let calls: Vec<Value> = tool_calls
                        .iter()
                        .map(|c| {
                            // Arguments that were not a JSON object (cut at `max_tokens`, say)
                            // go back as `{}`: a server refuses a transcript whose arguments
                            // it cannot parse. What the model wrote stays in the log.
                            let arguments = match &c.arguments {
                                Value::Object(_) => c.arguments.to_string(),
                                _ => "{}".to_owned(),
                            };
                            json!({"id": c.call_id, "type": "function",
                                   "function": {"name": c.name, "arguments": arguments}})
                        })
                        .collect();
                    msg["tool_calls"] = Value::Array(calls);
                }
                msg
            }
            Message::Tool { call_id, content, .. } => {
                json!({"role": "tool", "tool_call_id": call_id, "content": content})
            }
        })
        .collect();
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("messages".into(), Value::Array(messages));
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}))
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        body.insert("tool_choice".into(), json!("auto"));
        if let Some(parallel) = provider.parallel_tool_calls {
            body.insert("parallel_tool_calls".into(), json!(parallel));
        }
    }
    for (k, v) in &provider.sampling {
        // Without tools, the API refuses a `tool_choice`.
        if k != TOOL_CHOICE || !request.tools.is_empty() {
            body.insert(k.clone(), v.clone());
        }
    }
    directed(&mut body, request.directives, !request.tools.is_empty());
    Value::Object(body)
}

/// What a client asked of the answer, over the provider's own settings: Chat Completions'
/// fields. A tool choice or parallel calls without tools are left out (the API refuses them).
fn directed(body: &mut Map<String, Value>, directives: &Directives, tools: bool) {
    if let Some(effort) = &directives.reasoning_effort {
        body.insert("reasoning_effort".into(), json!(effort));
    }
    if let Some(format) = &directives.response_format {
        body.insert("response_format".into(), format.clone());
    }
    if let Some(tokens) = directives.max_output_tokens {
        // `max_tokens` is what every compatible server reads; a provider configured with
        // OpenAI's newer name keeps it.
        let key = if body.contains_key("max_completion_tokens") { "max_completion_tokens" } else { "max_tokens" };
        body.insert(key.into(), json!(tokens));
    }
    if !tools {
        return;
    }
    if let Some(choice) = &directives.tool_choice {
        let choice = match choice {
            ToolChoice::Auto => json!("auto"),
            ToolChoice::None => json!("none"),
            ToolChoice::Required => json!("required"),
            ToolChoice::Named(name) => json!({"type": "function", "function": {"name": name}}),
        };
        body.insert(TOOL_CHOICE.into(), choice);
    }
    if let Some(parallel) = directives.parallel_tool_calls {
        body.insert("parallel_tool_calls".into(), json!(parallel));
    }
}

pub fn decode(body: &Value) -> Result<ModelResponse, String> {
    let choice = match body.get("choices").and_then(Value::as_array) {
        Some(choices) if !choices.is_empty() => &choices[0],
        Some(_) => return Err("the response has an empty `choices`".into()),
        None => return Err("the response has no `choices`".into()),
    };
    let message = choice.get("message").ok_or("the first choice has no `message`")?;
    let text = match message.get("content") {
        Some(Value::String(s)) => Some(s.clone()),
        // Some servers send content as a list of parts.
        Some(Value::Array(parts)) => {
            Some(parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join(""))
        }
        _ => None,
    }
    .filter(|t| !t.is_empty());
    let mut tool_calls = Vec::new();
    if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
        for call in calls {
            let function = call.get("function").unwrap_or(&Value::Null);
            tool_calls.push(ProposedCall {
                id: call.get("id").and_then(Value::as_str).map(String::from),
                name: function.get("name").and_then(Value::as_str).unwrap_or_default().to_owned(),
                arguments: parse_arguments(function.get("arguments")),
            });
        }
    } else if let Some(function) = message.get("function_call").filter(|f| f.is_object()) {
        tool_calls.push(ProposedCall {
            id: None,
            name: function.get("name").and_then(Value::as_str).unwrap_or_default().to_owned(),
            arguments: parse_arguments(function.get("arguments")),
        });
    }
    let usage = body.get("usage").map(usage_of).unwrap_or_default();
    let finish_reason = choice.get("finish_reason").and_then(Value::as_str).map(String::from);
    Ok(ModelResponse { text, tool_calls, usage, finish_reason, ..ModelResponse::default() })
}

/// Arguments arrive as a JSON string; a string that does not parse is kept as it is.
fn parse_arguments(raw: Option<&Value>) -> Value {
    match raw {
        Some(Value::String(s)) if s.trim().is_empty() => json!({}),
        Some(Value::String(s)) => serde_json::from_str(s.trim()).unwrap_or_else(|_| Value::String(s.clone())),
        Some(Value::Object(o)) => Value::Object(o.clone()),
        None | Some(Value::Null) => json!({}),
        Some(other) => other.clone(),
    }
}

fn usage_of(u: &Value) -> Usage {
    let n = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
    Usage {
        input_tokens: n(u.get("prompt_tokens")),
        output_tokens: n(u.get("completion_tokens")),
        cached_tokens: n(u.pointer("/prompt_tokens_details/cached_tokens")),
    }
}

/// The provider's own words from an error body.
pub fn error_message(body: &Value) -> Option<String> {
    body.pointer("/error/message").or_else(|| body.get("error")).or_else(|| body.get("message")).and_then(|m| match m {
        Value::String(s) => Some(s.clone()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_tool_calls_text_and_usage() {
        let body = json!({"choices": [{"message": {"content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": " {\"a\": 1} "}},
            {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{not json"}}]},
            "finish_reason": "something_new"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}}});
        let r = decode(&body).unwrap();
        assert_eq!(r.text, None);
        assert_eq!(r.tool_calls[0].arguments, json!({"a": 1}));
        assert_eq!(r.tool_calls[1].arguments, json!("{not json"));
        assert_eq!(r.finish_reason.as_deref(), Some("something_new"));
        assert_eq!(r.usage, Usage { input_tokens: 10, output_tokens: 3, cached_tokens: 4 });
    }

    #[test]
    fn decodes_the_legacy_function_call_and_missing_usage() {
        let body = json!({"choices": [{"message": {"content": "", "function_call": {"name": "f", "arguments": ""}}}]});
        let r = decode(&body).unwrap();
        assert_eq!(r.tool_calls, [ProposedCall { id: None, name: "f".into(), arguments: json!({}) }]);
        assert_eq!(r.usage, Usage::default());
    }

    /// Regression: a call cut at `max_tokens` came back with its arguments as written, which
    /// the server then refused to parse (`500 Failed to parse tool call arguments as JSON`).
    #[test]
    fn arguments_that_did_not_parse_go_back_as_valid_json() {
        let body = json!({"choices": [{"message": {"content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"path\": \"a.t"}},
            {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "\"just text\""}},
            {"id": "call_3", "type": "function", "function": {"name": "h", "arguments": "{\"a\": 1}"}}]}}]});
        let decoded = decode(&body).unwrap();
        let tool_calls = decoded
            .tool_calls
            .iter()
            .map(|c| crate::contract::ToolCall::new(c.id.clone().unwrap_or_default(), &c.name, c.arguments.clone()))
            .collect();
        let messages = [Message::Assistant { content: None, tool_calls }];
        let request = ModelRequest::new(&messages, &[]);
        let config = crate::model::config::ModelConfig::default();
        let sent = encode("m", &request, &config.providers["openai"]);
        let arguments: Vec<Value> = sent["messages"][0]["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap())
            .collect();
        assert_eq!(arguments, [json!({}), json!({}), json!({"a": 1})]);
    }

    /// Regression: `parallel_tool_calls: false` in runner.yaml sent nothing, so a server that
    /// defaults to parallel calls kept making them.
    #[test]
    fn parallel_tool_calls_is_sent_as_configured_and_only_when_configured() {
        let tools = [crate::contract::ToolSpec {
            name: "f".into(),
            description: String::new(),
            parameters: json!({"type": "object"}),
            annotations: None,
        }];
        let request = ModelRequest::new(&[], &tools);
        let config = crate::model::config::ModelConfig::default();
        let mut provider = config.providers["openai-compatible"].clone();
        assert_eq!(encode("m", &request, &provider).get("parallel_tool_calls"), None);
        for setting in [false, true] {
            provider.parallel_tool_calls = Some(setting);
            assert_eq!(encode("m", &request, &provider)["parallel_tool_calls"], json!(setting));
        }
        assert_eq!(encode("m", &request, &config.providers["openai"])["parallel_tool_calls"], json!(true));
    }

    /// Regression: a weak local model needs `tool_choice: required`, which sampling refused.
    #[test]
    fn a_tool_choice_in_sampling_is_sent_with_tools_only() {
        let tools = [crate::contract::ToolSpec::new("f", "", json!({"type": "object"}))];
        let mut provider = crate::model::config::ModelConfig::default().providers["openai-compatible"].clone();
        provider.sampling.insert("tool_choice".into(), json!("required"));
        let with = ModelRequest::new(&[], &tools);
        assert_eq!(encode("m", &with, &provider)["tool_choice"], "required");
        let without = ModelRequest::new(&[], &[]);
        assert_eq!(encode("m", &without, &provider).get("tool_choice"), None);
    }

    #[test]
    fn empty_choices_are_an_error() {
        assert!(decode(&json!({"choices": []})).unwrap_err().contains("empty"));
        assert!(decode(&json!({"id": "x"})).is_err());
    }
}
