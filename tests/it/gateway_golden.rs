//! The first requests of real clients — Codex CLI, Claude Code, mini-swe-agent, the OpenAI
//! Agents SDK, streaming and not — as captured by `scripts/capture-client-requests.py`
//! (`tests/fixtures/gateway/golden/`), replayed against the gateway: none is refused, what
//! does not change the answer is logged as ignored, server tools are dropped with a note,
//! and what does change it reaches the backend in its own fields.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runner::agent::EpisodeState;
use runner::budget::EpisodeLimits;
use runner::contract::Actor;
use runner::domain::{MockTurn, Task, text::Text};
use runner::gateway::{Gateway, GatewayEnd};
use runner::log::{Event, EventLog, Subscriber, Subscription, UnscoredCause};
use runner::model::{Backend, BackendOptions, Role, config::ModelConfig};
use serde_json::{Value, json};

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gateway/golden");

#[derive(Default)]
struct Seen(Vec<Event>);

impl Subscriber for Seen {
    fn event(&mut self, _: Option<&str>, event: &Event) {
        self.0.push(event.clone());
    }
}

/// One captured request: its path, the headers that say which client sent it, its body.
struct Golden {
    name: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Value,
}

fn golden(name: &str) -> Golden {
    let file = Path::new(GOLDEN).join(format!("{name}.json"));
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let captured: Value = serde_json::from_str(&text).unwrap();
    let headers = captured["headers"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| ["anthropic-version", "anthropic-beta", "openai-beta"].contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect();
    Golden {
        name: name.to_owned(),
        path: captured["path"].as_str().unwrap().to_owned(),
        headers,
        body: captured["body"].clone(),
    }
}

fn all_golden() -> Vec<Golden> {
    let mut names: Vec<String> = std::fs::read_dir(GOLDEN)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".json").map(str::to_owned))
        .collect();
    names.sort();
    assert!(names.len() >= 8, "the captured requests: {names:?}");
    names.iter().map(|n| golden(n)).collect()
}

/// What one request through a fresh gateway gave: status, body, the episode's events and
/// why the gateway ended the episode, if it did.
struct Sent {
    status: u16,
    body: String,
    events: Vec<Event>,
    ending: Option<GatewayEnd>,
}

impl Sent {
    fn refusals(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::GatewayRefused { status, field, message, .. } => Some(format!("{status} {field:?}: {message}")),
                _ => None,
            })
            .collect()
    }

    fn ignored(&self) -> (Vec<String>, Vec<String>) {
        let mut all = (Vec::new(), Vec::new());
        for event in &self.events {
            if let Event::GatewayIgnored { fields, dropped_tools, .. } = event {
                all.0.extend(fields.iter().cloned());
                all.1.extend(dropped_tools.iter().cloned());
            }
        }
        all
    }
}

fn task() -> Task {
    let mut task = Task::new("t", "say done");
    task.mock = vec![MockTurn { text: Some(Text("done".into())), tool_calls: vec![] }].into();
    task
}

/// Sends `golden` to a gateway whose model is `backend`, as its client did.
fn send(golden: &Golden, backend: &Backend) -> Sent {
    let dir = tempfile::tempdir().unwrap();
    let (log, writer) = EventLog::create(&dir.path().join("events.jsonl"), "r").unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let log = log.with_subscribers(&[Subscription::all(seen.clone())]);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (status, body, ending) = runtime.block_on(async {
        let gateway = Gateway {
            run_own: Default::default(),
            model: backend.lend(Role::Agent(&Actor::Main), &task(), "e1"),
            model_name: backend.name().to_owned(),
            ledger: Arc::new(EpisodeState::new(EpisodeLimits::new(10, Duration::from_secs(60)))),
            recorder: log.recorder("e1"),
            derive_trajectory: true,
        };
        let handle = gateway.start().await.unwrap();
        let mut request = reqwest::Client::new()
            .post(format!("{}{}", handle.url(), golden.path))
            .bearer_auth(handle.key())
            .header("x-api-key", handle.key())
            .json(&golden.body);
        for (name, value) in &golden.headers {
            request = request.header(name, value);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap(), handle.ending())
    });
    drop(log);
    writer.close().unwrap();
    let events = std::mem::take(&mut seen.lock().unwrap().0);
    Sent { status, body, events, ending }
}

fn mock() -> Backend {
    Backend::open("mock", &ModelConfig::default(), BackendOptions::default()).unwrap()
}

#[test]
fn every_captured_client_request_is_answered_and_none_refused() {
    for golden in all_golden() {
        let sent = send(&golden, &mock());
        assert_eq!(sent.status, 200, "{}: {} {:?}", golden.name, sent.body, sent.refusals());
        assert!(sent.refusals().is_empty(), "{}: {:?}", golden.name, sent.refusals());
        assert_eq!(sent.ending, None, "{}", golden.name);
        assert!(sent.body.contains("done"), "{}: the answer is in the reply: {}", golden.name, sent.body);
        let calls = sent.events.iter().filter(|e| matches!(e, Event::ModelCall { .. })).count();
        assert_eq!(calls, 1, "{}", golden.name);
    }
}

#[test]
fn codex_bookkeeping_is_logged_as_ignored_and_its_web_search_dropped() {
    let sent = send(&golden("codex-stream"), &mock());
    assert_eq!(sent.status, 200, "{}", sent.body);
    let (mut fields, dropped) = sent.ignored();
    fields.sort();
    assert_eq!(fields, ["client_metadata", "include", "prompt_cache_key", "store"]);
    assert_eq!(dropped, ["tools[8] (web_search)"]);
    assert!(sent.body.starts_with("event: response.created"), "streamed as asked: {}", &sent.body[..80]);
}

/// A backend `local/m` on an OpenAI-compatible server that records the bodies it is sent
/// and answers `done`.
fn recording_upstream() -> (tokio::runtime::Runtime, wiremock::MockServer, Backend) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let server = runtime.block_on(async {
        let server = wiremock::MockServer::start().await;
        let answer = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "done"},
                            "finish_reason": "stop"}], "usage": {"prompt_tokens": 5, "completion_tokens": 1}});
        wiremock::Mock::given(wiremock::matchers::method("POST"))
            .respond_with(wiremock::ResponseTemplate::new(200).set_body_json(answer))
            .mount(&server)
            .await;
        server
    });
    let backend = crate::gateway::local_backend(&server, 0);
    (runtime, server, backend)
}

/// The body the backend sent upstream for one golden request.
fn upstream_body(golden: &Golden) -> Value {
    let (runtime, server, backend) = recording_upstream();
    let sent = send(golden, &backend);
    assert_eq!(sent.status, 200, "{}: {}", golden.name, sent.body);
    let received = runtime.block_on(server.received_requests()).unwrap();
    assert_eq!(received.len(), 1, "{}", golden.name);
    serde_json::from_slice(&received[0].body).unwrap()
}

#[test]
fn codexs_mapped_fields_reach_an_openai_compatible_backend() {
    let mut codex = golden("codex-stream");
    // Codex asks for an effort and a format when its config says so: the captured request
    // with `model_reasoning_effort = "high"` and an output schema.
    codex.body["reasoning"] = json!({"effort": "high", "summary": "auto"});
    codex.body["text"] = json!({"format": {"type": "json_schema", "name": "out", "strict": true,
                                          "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}});
    codex.body["tool_choice"] = json!("required");
    codex.body["parallel_tool_calls"] = json!(false);
    codex.body["max_output_tokens"] = json!(900);
    let body = upstream_body(&codex);
    assert_eq!(body["reasoning_effort"], "high", "{body}");
    assert_eq!(body["tool_choice"], "required");
    assert_eq!(body["parallel_tool_calls"], false);
    assert_eq!(body["max_tokens"], 900);
    assert_eq!(body["response_format"]["type"], "json_schema");
    assert_eq!(body["response_format"]["json_schema"]["name"], "out");
    assert_eq!(body["response_format"]["json_schema"]["strict"], true);
    let names: Vec<&str> =
        body["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"exec_command"), "{names:?}");
    assert!(names.contains(&"multi_agent_v1__close_agent"), "a namespace's tools, flat: {names:?}");
    assert!(!names.iter().any(|n| n.contains("web_search")), "the server tool is dropped: {names:?}");
    // The developer messages are the system prompt; the task is the last user message.
    assert_eq!(body["messages"][0]["role"], "system");
    let last = body["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(last["content"], "Write hello into a.txt, then say done.");
}

#[test]
fn claude_codes_effort_format_and_token_limit_reach_an_openai_compatible_backend() {
    let title = upstream_body(&golden("claude-code-title-stream"));
    assert_eq!(title["reasoning_effort"], "high", "{title}");
    assert_eq!(title["max_tokens"], 32000);
    assert_eq!(title["response_format"]["json_schema"]["schema"]["required"], json!(["title"]));
    let mut turn = golden("claude-code-stream");
    turn.body["tool_choice"] = json!({"type": "tool", "name": "Bash", "disable_parallel_tool_use": true});
    let body = upstream_body(&turn);
    assert_eq!(
        body["tool_choice"],
        json!({"type": "function", "function": {"name": "Bash"}}),
        "{}",
        body["tool_choice"]
    );
    assert_eq!(body["parallel_tool_calls"], false);
}

#[test]
fn a_request_that_asks_nothing_leaves_the_backends_own_settings() {
    // The Agents SDK sends nothing beyond messages and tools: nothing is added upstream.
    let body = upstream_body(&golden("agents-sdk-chat-plain"));
    for field in ["reasoning_effort", "response_format", "max_tokens"] {
        assert!(body.get(field).is_none(), "{field}: {body}");
    }
    assert_eq!(body["tool_choice"], "auto", "the backend's own default");
    assert_eq!(body["parallel_tool_calls"], true, "the provider's own setting");
}

#[test]
fn a_shape_the_gateway_does_not_speak_ends_the_episode_unscored_naming_the_field() {
    let mut codex = golden("codex-stream");
    codex.body["tools"].as_array_mut().unwrap().push(json!({"type": "computer_use_preview", "display_width": 800}));
    let sent = send(&codex, &mock());
    assert_eq!(sent.status, 400, "{}", sent.body);
    assert!(sent.body.contains("tools[9].type"), "{}", sent.body);
    let Some(GatewayEnd::Fault(error)) = &sent.ending else { panic!("{:?}", sent.ending) };
    assert_eq!(error.cause, UnscoredCause::GatewayUnsupported);
    assert!(error.message.contains("tools[9].type") && error.message.contains("computer_use_preview"), "{error:?}");
    // A client's own mistake is its own: a bad value is refused and the episode goes on.
    let mut bad = golden("agents-sdk-chat-plain");
    bad.body["parallel_tool_calls"] = json!("yes");
    let sent = send(&bad, &mock());
    assert_eq!(sent.status, 400, "{}", sent.body);
    assert_eq!(sent.ending, None);
}
