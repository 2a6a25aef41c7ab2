//! ShareGPT with tools, as LLaMA-Factory reads it (`formatting: sharegpt` with the default
//! tags): one JSON line per episode, `{"conversations": [{"from", "value"}], "tools"}`.
//! `from` is `system`, `human`, `gpt`, `function_call` or `observation`; after the system
//! message, human/observation and gpt/function_call alternate, ending on the model's side.
//! A `function_call` value is the call as JSON (`{"name", "arguments"}`; a list of them for
//! a turn of several calls) and the `observation` that follows holds the result (a list of
//! them, in call order, for several). `tools` is the tools' definitions as a JSON string.
//! The convention has no place for text beside calls: it is kept only in a turn without
//! calls. Two messages in a row on one side are joined into one.

use serde_json::{Value, json};

use super::conversation::{Conversation, Entry, Thread};
use crate::contract::FINAL_TOOL;

/// The episode's line.
pub fn line(conversation: &Conversation, main: &Thread) -> Value {
    let mut messages: Vec<(&str, String)> = Vec::new();
    for entry in &main.entries {
        match entry {
            Entry::User { text, .. } => messages.push(("human", text.clone())),
            Entry::Assistant(turn) if turn.calls.is_empty() => {
                messages.push(("gpt", turn.text.clone().unwrap_or_default()));
            }
            Entry::Assistant(turn) => {
                let calls: Vec<Value> =
                    turn.calls.iter().map(|c| json!({"name": c.name, "arguments": c.arguments})).collect();
                let value = if let [call] = calls.as_slice() { call.to_string() } else { json!(calls).to_string() };
                messages.push(("function_call", value));
                let results: Vec<String> = turn
                    .calls
                    .iter()
                    .filter(|c| c.name != FINAL_TOOL)
                    .map(|c| {
                        conversation.results.get(&c.id).map(|r| r.content.clone()).unwrap_or_else(|| {
                            r#"{"error": "no result: the episode ended before the call's"}"#.to_owned()
                        })
                    })
                    .collect();
                match results.as_slice() {
                    [] => {}
                    [one] => messages.push(("observation", one.clone())),
                    _ => messages.push(("observation", json!(results).to_string())),
                }
            }
        }
    }
    let mut conversations: Vec<Value> = Vec::new();
    if let Some(system) = &main.system {
        conversations.push(json!({"from": "system", "value": system}));
    }
    let model_side = |from: &str| from == "gpt" || from == "function_call";
    let mut last: Option<(&str, String)> = None;
    for (from, value) in messages {
        last = match last {
            Some((prev, text)) if model_side(prev) == model_side(from) => Some((prev, format!("{text}\n\n{value}"))),
            Some((prev, text)) => {
                conversations.push(json!({"from": prev, "value": text}));
                Some((from, value))
            }
            None => Some((from, value)),
        };
    }
    // The convention ends on the model's side: what it never answered is left out.
    if let Some((from, value)) = last.filter(|(from, _)| model_side(from)) {
        conversations.push(json!({"from": from, "value": value}));
    }
    let mut line = json!({"conversations": conversations});
    if let Some(tools) = &main.tools {
        let functions: Vec<&Value> = tools.iter().map(|t| t.get("function").unwrap_or(t)).collect();
        line["tools"] = json!(json!(functions).to_string());
    }
    line
}
