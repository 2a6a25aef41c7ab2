//! The OpenAI fine-tuning chat format: one JSON line per episode, `{"messages": [...],
//! "tools": [...]}`, the main agent's conversation as its model saw it — the system prompt,
//! the input, assistant messages with `tool_calls`, a `tool` message answering each call by
//! its id, and the final answer (the `final_answer` call, whose own result is left out: the
//! conversation ends with it). A user's last message the model never answered is left out.

use serde_json::{Value, json};

use super::conversation::Conversation;
use super::conversation::{Entry, Thread};
use crate::contract::FINAL_TOOL;

/// The episode's line; `tools` is there when the request body was logged.
pub fn line(conversation: &Conversation, main: &Thread) -> Value {
    let mut messages = Vec::new();
    if let Some(system) = &main.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    for entry in &main.entries {
        match entry {
            Entry::User { text, .. } => messages.push(json!({"role": "user", "content": text})),
            Entry::Assistant(turn) => {
                let mut message = json!({"role": "assistant", "content": turn.text});
                if !turn.calls.is_empty() {
                    let calls: Vec<Value> = turn
                        .calls
                        .iter()
                        .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments.to_string()}}))
                        .collect();
                    message["tool_calls"] = json!(calls);
                }
                messages.push(message);
                for call in turn.calls.iter().filter(|c| c.name != FINAL_TOOL) {
                    let content = conversation.results.get(&call.id).map(|r| r.content.as_str());
                    let content = content.unwrap_or(r#"{"error": "no result: the episode ended before the call's"}"#);
                    messages.push(json!({"role": "tool", "tool_call_id": call.id, "content": content}));
                }
            }
        }
    }
    // The user's last word, which the model never answered, teaches it nothing.
    while messages.last().is_some_and(|m| m["role"] == "user") {
        messages.pop();
    }
    let mut line = json!({"messages": messages});
    if let Some(tools) = &main.tools {
        line["tools"] = json!(tools);
    }
    line
}
