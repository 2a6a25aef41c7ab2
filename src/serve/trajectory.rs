//! An episode's trajectory as a trainer reads it, taken from its events: each model call of
//! its agent (what came back, its usage, and the token ids and log-probabilities the
//! endpoint returned, passed through as they came), each tool call with its observation,
//! and the transcript the last call sent with its answer.

use std::sync::Arc;

use serde_json::{Value, json};

/// The trajectory of an episode's events.
pub fn of(events: &[Arc<Value>]) -> Value {
    let mut calls = Vec::new();
    let mut actions: Vec<Value> = Vec::new();
    let mut last_request: Option<&Value> = None;
    let mut last_answer: Option<&Value> = None;
    for event in events {
        match event["type"].as_str() {
            // A grader's calls are nobody's in the episode.
            Some("model_call") if event.get("scorer").is_none_or(Value::is_null) => {
                let raw = &event["raw_response"];
                let choice = &raw["choices"][0];
                let mut call = json!({
                    "step": event["step"],
                    "response": event["response"],
                    "usage": event["usage"],
                    "latency_ms": event["latency_ms"],
                });
                if let Some(error) = event["error"].as_str() {
                    call["error"] = json!(error);
                    call["cause"] = event["cause"].clone();
                }
                for (key, value) in [
                    ("logprobs", &choice["logprobs"]),
                    ("token_ids", &choice["token_ids"]),
                    ("prompt_token_ids", first_present(&[&raw["prompt_token_ids"], &choice["prompt_token_ids"]])),
                ] {
                    if !value.is_null() {
                        call[key] = value.clone();
                    }
                }
                if event["request"].is_object() {
                    last_request = Some(&event["request"]);
                    last_answer = Some(&choice["message"]);
                }
                calls.push(call);
            }
            Some("action_dispatched") => actions.push(json!({"step": event["step"], "call": event["call"]})),
            Some("observation") => {
                let id = &event["observation"]["call_id"];
                if let Some(action) = actions.iter_mut().rev().find(|a| &a["call"]["call_id"] == id && !id.is_null()) {
                    action["observation"] = event["observation"].clone();
                }
            }
            _ => {}
        }
    }
    let mut messages: Vec<Value> = last_request.and_then(|r| r["messages"].as_array()).cloned().unwrap_or_default();
    if let Some(answer) = last_answer.filter(|a| !a.is_null()) {
        messages.push(answer.clone());
    }
    json!({"model_calls": calls, "actions": actions, "messages": messages})
}

fn first_present<'a>(values: &[&'a Value]) -> &'a Value {
    values.iter().find(|v| !v.is_null()).copied().unwrap_or(&Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_ids_and_logprobs_pass_through_and_a_graders_calls_are_left_out() {
        let events: Vec<Arc<Value>> = [
            json!({"type": "model_call", "step": 1, "response": {"text": "4"}, "usage": {}, "latency_ms": 1.0,
                   "request": {"messages": [{"role": "user", "content": "2+2?"}]},
                   "raw_response": {"prompt_token_ids": [1, 2], "choices": [{"message": {"role": "assistant", "content": "4"},
                                    "token_ids": [7], "logprobs": {"content": [{"token": "4", "logprob": -0.1}]}}]}}),
            json!({"type": "model_call", "step": 1, "scorer": "llm_rubric", "response": {}, "usage": {}}),
        ]
        .into_iter()
        .map(Arc::new)
        .collect();
        let t = of(&events);
        assert_eq!(t["model_calls"].as_array().unwrap().len(), 1);
        assert_eq!(t["model_calls"][0]["token_ids"], json!([7]));
        assert_eq!(t["model_calls"][0]["prompt_token_ids"], json!([1, 2]));
        assert_eq!(t["model_calls"][0]["logprobs"]["content"][0]["logprob"], json!(-0.1));
        assert_eq!(t["messages"].as_array().unwrap().len(), 2, "{t}");
    }
}
