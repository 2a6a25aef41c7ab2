//! A transcript a provider accepts, whatever the model wrote: a tool call cut at
//! `max_tokens` goes back with arguments the server can parse, and a server that refuses
//! our request is not retried as if it were down.

use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::models::{openai_env, run_with};
use crate::{Sandbox, of_type, tool_observations};

/// Answers as llama.cpp's server does: a first turn cut at `max_tokens` in the middle of a
/// tool call's arguments, and a `500` for any request whose tool call arguments it cannot
/// parse; otherwise the answer.
struct CutAtMaxTokens;

impl Respond for CutAtMaxTokens {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: Value = request.body_json().unwrap_or(Value::Null);
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let calls: Vec<&Value> = messages.iter().filter_map(|m| m["tool_calls"].as_array()).flatten().collect();
        if calls.is_empty() {
            return ResponseTemplate::new(200).set_body_json(json!({"choices": [{"index": 0, "message": {
                "role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "kv_set", "arguments": "{\"key\": \"answer\", \"val"}}]},
                "finish_reason": "length"}], "usage": {"prompt_tokens": 20, "completion_tokens": 16}}));
        }
        let parsed = calls
            .iter()
            .all(|c| c["function"]["arguments"].as_str().and_then(|a| serde_json::from_str::<Value>(a).ok()).is_some());
        if !parsed {
            return ResponseTemplate::new(500).set_body_json(
                json!({"error": {"code": 500, "message": "Failed to parse tool call arguments as JSON", "type": "server_error"}}),
            );
        }
        ResponseTemplate::new(200).set_body_json(json!({"choices": [{"index": 0,
            "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 1}}))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tool_call_cut_at_max_tokens_goes_back_as_json_the_server_parses() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        "suite: m\nenvironment: kv\nscorers: [{equals: \"4\"}]\ntasks:\n  - {id: t, input: What is 2+2?}\n",
    );
    sb.write(
        "runner.yaml",
        "providers:\n  openai: {retry_base_s: 0.01, retry_max_s: 0.05, max_retries: 4, timeout_s: 5}\n",
    );
    let server = MockServer::start().await;
    Mock::given(method("POST")).and(path("/v1/chat/completions")).respond_with(CutAtMaxTokens).mount(&server).await;
    let args = ["eval", "s.yaml", "--model", "openai/local", "--run-id", "test", "--out", "results"];
    let run = run_with(&sb, &args, &openai_env(&server)).await;
    assert_eq!(run.code, 0, "{run:?}");
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 2, "one request per turn, none refused");
    let second: Value = requests[1].body_json().unwrap();
    let sent = &second["messages"].as_array().unwrap().iter().find(|m| m["role"] == "assistant").unwrap()["tool_calls"]
        [0]["function"]["arguments"];
    assert!(sent.as_str().and_then(|a| serde_json::from_str::<Value>(a).ok()).is_some(), "sent back: {sent}");

    let events = sb.events();
    let obs = tool_observations(&events);
    assert_eq!(obs[0]["error"]["type"], "ValidationError", "the agent is told: {}", obs[0]);
    // What the model wrote stays in the log.
    let first_call = of_type(&events, "model_call")[0];
    let raw = first_call["raw_response"]["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].clone();
    assert_eq!(raw, "{\"key\": \"answer\", \"val", "{first_call}");
    let finished = of_type(&events, "episode_finished")[0];
    assert_eq!(finished["outcome"]["status"], "scored", "{finished}");
    assert_eq!(finished["outcome"]["passed"], true, "{finished}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_cannot_parse_our_request_is_asked_once() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        "suite: m\nenvironment: kv\nscorers: [{equals: \"4\"}]\ntasks:\n  - {id: t, input: What is 2+2?}\n",
    );
    sb.write(
        "runner.yaml",
        "providers:\n  openai: {retry_base_s: 0.01, retry_max_s: 0.05, max_retries: 4, timeout_s: 5}\n",
    );
    let server = MockServer::start().await;
    let refusal = json!({"error": {"code": 500, "message": "Failed to parse tool call arguments as JSON"}});
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(ResponseTemplate::new(500).set_body_json(refusal))
        .mount(&server)
        .await;
    let args = ["eval", "s.yaml", "--model", "openai/local", "--run-id", "test", "--out", "results"];
    let run = run_with(&sb, &args, &openai_env(&server)).await;
    assert_eq!(server.received_requests().await.unwrap().len(), 1, "{run:?}");
    let finished = of_type(&sb.events(), "episode_finished")[0].clone();
    assert_eq!(finished["outcome"]["status"], "unscored", "{finished}");
}
