//! The gateway over real HTTP (reqwest as the client) with the `mock` model behind it. The
//! official SDKs speak to it in `tests/it/gateway.rs`.

use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::domain::{MockCall, MockTurn, text::Text};
use crate::log::{EventLog, LogWriter, Subscriber, Subscription};
use crate::model::mock::MockModel;

#[derive(Default)]
struct Seen(Vec<Event>);

impl Subscriber for Seen {
    fn event(&mut self, _: Option<&str>, event: &Event) {
        self.0.push(event.clone());
    }
}

/// Limits of steps only, and the calls it was told of.
struct Steps {
    max: u32,
    taken: AtomicU32,
    deadline: Deadline,
    calls: Mutex<Vec<ToolCall>>,
}

impl Ledger for Steps {
    fn admit(&self) -> Result<u32, Termination> {
        let n = self.taken.fetch_add(1, Ordering::SeqCst) + 1;
        if n > self.max { Err(Termination::MaxSteps) } else { Ok(n) }
    }
    fn spend(&self, _: Usage, _: Option<f64>) {}
    fn deadline(&self) -> &Deadline {
        &self.deadline
    }
    fn dispatched(&self, call: &ToolCall) {
        self.calls.lock().unwrap().push(call.clone());
    }
}

struct Bench {
    handle: GatewayHandle,
    seen: Arc<Mutex<Seen>>,
    ledger: Arc<Steps>,
    client: reqwest::Client,
    _log: (tempfile::TempDir, LogWriter),
}

fn turn(text: Option<&str>, calls: &[(&str, Value)]) -> MockTurn {
    MockTurn {
        text: text.map(|t| Text(t.to_owned())),
        tool_calls: calls
            .iter()
            .map(|(name, arguments)| MockCall { name: (*name).to_owned(), arguments: arguments.clone(), id: None })
            .collect(),
    }
}

/// A tool call, then an answer.
fn two_turns() -> Vec<MockTurn> {
    vec![turn(None, &[("write_file", json!({"path": "a.txt", "content": "hi"}))]), turn(Some("done"), &[])]
}

async fn bench(turns: Vec<MockTurn>, max_steps: u32) -> Bench {
    bench_for(turns, max_steps, Duration::from_secs(60), Patience::default()).await
}

/// A bench of ten steps whose episode ends `time` from now, with the gateway's `patience`.
async fn bench_with(turns: Vec<MockTurn>, time: Duration, patience: Patience) -> Bench {
    bench_for(turns, 10, time, patience).await
}

async fn bench_for(turns: Vec<MockTurn>, max_steps: u32, time: Duration, patience: Patience) -> Bench {
    let dir = tempfile::tempdir().unwrap();
    let (log, writer) = EventLog::create(&dir.path().join("events.jsonl"), "r").unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let log = log.with_subscribers(&[Subscription::all(seen.clone())]);
    let ledger = Arc::new(Steps {
        max: max_steps,
        taken: AtomicU32::new(0),
        deadline: Deadline::after(time),
        calls: Mutex::default(),
    });
    let gateway = Gateway {
        run_own: Default::default(),
        model: Arc::new(MockModel::new(turns.into())),
        model_name: "mock".into(),
        ledger: ledger.clone(),
        recorder: log.recorder("e1"),
        derive_trajectory: true,
    };
    let handle = gateway.start_with(patience).await.unwrap();
    Bench { handle, seen, ledger, client: reqwest::Client::new(), _log: (dir, writer) }
}

impl Bench {
    async fn post(&self, path: &str, key: &str, body: Value) -> (u16, String) {
        let response =
            self.client.post(format!("{}{path}", self.handle.url())).bearer_auth(key).json(&body).send().await.unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    async fn chat(&self, body: Value) -> (u16, Value) {
        let key = self.handle.key().to_owned();
        let (status, text) = self.post("/v1/chat/completions", &key, body).await;
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    fn events(&self) -> Vec<Event> {
        self.seen.lock().unwrap().0.clone()
    }

    /// The request digests of the model calls, in order.
    fn digests(&self) -> Vec<String> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::ModelCall { request_digest, .. } => Some(request_digest),
                _ => None,
            })
            .collect()
    }

    fn refusals(&self) -> Vec<(u16, Option<String>)> {
        self.events()
            .into_iter()
            .filter_map(|e| match e {
                Event::GatewayRefused { status, field, .. } => Some((status, field)),
                _ => None,
            })
            .collect()
    }
}

fn user(text: &str) -> Value {
    json!({"model": "gpt-x", "messages": [{"role": "user", "content": text}]})
}

#[tokio::test]
async fn a_tool_call_and_its_result_round_trip_and_make_the_derived_trajectory() {
    let bench = bench(two_turns(), 10).await;
    let (status, first) = bench.chat(user("write a.txt")).await;
    assert_eq!(status, 200, "{first}");
    let call = &first["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["id"], "call_01_0");
    assert_eq!(call["function"]["name"], "write_file");
    assert_eq!(
        serde_json::from_str::<Value>(call["function"]["arguments"].as_str().unwrap()).unwrap()["path"],
        "a.txt"
    );
    assert_eq!(first["choices"][0]["finish_reason"], "tool_calls");

    let mut next = user("write a.txt");
    let messages = next["messages"].as_array_mut().unwrap();
    messages.push(first["choices"][0]["message"].clone());
    messages.push(json!({"role": "tool", "tool_call_id": "call_01_0", "content": "wrote 2 bytes"}));
    let (status, second) = bench.chat(next).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["choices"][0]["message"]["content"], "done");

    let events = bench.events();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| match e {
            Event::ModelCall { .. } => "model_call",
            Event::ActionDispatched { .. } => "action_dispatched",
            Event::Observation { .. } => "observation",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["model_call", "action_dispatched", "observation", "model_call"]);
    let Event::ModelCall { request, .. } = &events[3] else { unreachable!() };
    assert!(request.is_none(), "the mock keeps no wire body");
    let Event::Observation { step, observation } = &events[2] else { unreachable!() };
    assert_eq!((step, observation.call_id.as_deref()), (&2, Some("call_01_0")));
    assert_eq!(observation.tool_result, Some(json!("wrote 2 bytes")));
    assert_eq!(bench.ledger.calls.lock().unwrap().len(), 1, "the call is in the trajectory");
}

#[tokio::test]
async fn each_key_is_256_bits_from_the_kernel_not_from_the_threads_generator() {
    // Seeded alike before each start, this thread's generator would give the same key twice.
    fastrand::seed(7);
    let first = bench(Vec::new(), 10).await;
    fastrand::seed(7);
    let second = bench(Vec::new(), 10).await;
    let keys = [first.handle.key(), second.handle.key()];
    assert_ne!(keys[0], keys[1]);
    for key in keys {
        let digits = key.strip_prefix("rk-").unwrap_or_else(|| panic!("{key}"));
        assert_eq!(digits.len(), 64, "{key}");
        assert!(digits.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)), "{key}");
        let distinct: std::collections::BTreeSet<u8> = digits.bytes().collect();
        assert!(distinct.len() >= 8, "64 random hex digits use most of the 16: {key}");
    }
}

#[tokio::test]
async fn a_wrong_missing_or_expired_key_is_refused_with_401_and_logged() {
    let bench = bench(two_turns(), 10).await;
    let (status, body) = bench.post("/v1/chat/completions", "rk-wrong", user("hi")).await;
    assert_eq!(status, 401);
    assert!(body.contains("invalid_api_key") && body.contains("wrong API key"), "{body}");
    let response = bench.client.post(format!("{}/v1/messages", bench.handle.url())).body("{}").send().await.unwrap();
    assert_eq!(response.status().as_u16(), 401);
    let body = response.text().await.unwrap();
    assert!(body.contains("authentication_error") && body.contains("no API key"), "{body}");
    bench.handle.close();
    let (status, body) = bench.chat(user("hi")).await;
    assert_eq!(status, 401);
    assert!(body.to_string().contains("the episode has ended"), "{body}");
    assert_eq!(bench.refusals(), [(401, None), (401, None), (401, None)]);
    assert!(!bench.events().iter().any(|e| matches!(e, Event::ModelCall { .. })), "no refused call reached the model");
}

#[tokio::test]
async fn an_unsupported_shape_is_a_400_that_names_the_field_and_leaves_the_episode_unscored() {
    let bench = bench(two_turns(), 10).await;
    let image = json!({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]});
    let (status, body) = bench.chat(image).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["param"], "messages[0].content[1].type", "{body}");
    let Some(GatewayEnd::Fault(error)) = bench.handle.ending() else { panic!("{:?}", bench.handle.ending()) };
    assert_eq!(error.cause, crate::log::UnscoredCause::GatewayUnsupported);
    assert!(error.message.contains("messages[0].content[1].type"), "{error:?}");
    assert!(!bench.events().iter().any(|e| matches!(e, Event::ModelCall { .. })), "no refused call reached the model");

    let bench = super::tests::bench(two_turns(), 10).await;
    let (status, body) = bench.chat(json!({"model": "m", "messages": [], "functions": []})).await;
    assert_eq!(status, 400);
    assert!(body["error"]["message"].as_str().unwrap().contains("unsupported field `functions`"), "{body}");
    assert!(matches!(bench.handle.ending(), Some(GatewayEnd::Fault(_))));
}

#[tokio::test]
async fn a_clients_own_mistake_is_refused_and_the_episode_goes_on() {
    let bench = bench(two_turns(), 10).await;
    let key = bench.handle.key().to_owned();
    let (status, body) =
        bench.post("/v1/responses", &key, json!({"model": "m", "input": "hi", "previous_response_id": "r"})).await;
    assert_eq!(status, 400);
    assert!(body.contains("no response `r` in this episode"), "{body}");
    let (status, body) = bench.chat(json!({"model": "m", "messages": [], "tool_choice": 3})).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        bench.refusals().into_iter().map(|(_, f)| f.unwrap_or_default()).collect::<Vec<_>>(),
        ["previous_response_id", "tool_choice"]
    );
    assert_eq!(bench.handle.ending(), None);
}

#[tokio::test]
async fn server_tools_are_dropped_and_bookkeeping_let_be_each_logged_once() {
    let bench = bench(vec![turn(Some("a"), &[]), turn(Some("b"), &[])], 10).await;
    let key = bench.handle.key().to_owned();
    let request = json!({"model": "m", "max_tokens": 10, "metadata": {"user_id": "u"},
                         "messages": [{"role": "user", "content": "hi"}],
                         "output_config": {"effort": "low", "format": {"type": "json_schema", "schema": {"type": "object"}}},
                         "tools": [{"type": "web_search_20250305", "name": "web_search"},
                                   {"name": "f", "input_schema": {"type": "object"}}]});
    for _ in 0..2 {
        let (status, body) = bench.post("/v1/messages", &key, request.clone()).await;
        assert_eq!(status, 200, "{body}");
    }
    let noted: Vec<(Vec<String>, Vec<String>)> = bench
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::GatewayIgnored { fields, dropped_tools, .. } => Some((fields, dropped_tools)),
            _ => None,
        })
        .collect();
    assert_eq!(noted, [(vec!["metadata".to_owned()], vec!["tools[0] (web_search_20250305)".to_owned()])]);
    assert!(bench.refusals().is_empty());
}

#[tokio::test]
async fn previous_response_id_continues_the_episodes_earlier_response() {
    let bench = bench(two_turns(), 10).await;
    let key = bench.handle.key().to_owned();
    let tools = json!([{"type": "function", "name": "write_file", "parameters": {"type": "object"}}]);
    let first = json!({"model": "m", "instructions": "You write files.", "input": "write a.txt", "tools": tools, "store": true});
    let (status, body) = bench.post("/v1/responses", &key, first).await;
    assert_eq!(status, 200, "{body}");
    let first: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(first["id"], "resp_01");
    let call_id = first["output"][0]["call_id"].as_str().unwrap().to_owned();
    let next = json!({"model": "m", "instructions": "You write files.", "previous_response_id": "resp_01", "tools": tools,
                      "input": [{"type": "function_call_output", "call_id": call_id, "output": "wrote 2 bytes"}]});
    let (status, body) = bench.post("/v1/responses", &key, next).await;
    assert_eq!(status, 200, "{body}");
    // The result is matched to the call of the earlier response: the derived trajectory
    // has the call's observation, named after it.
    let observed: Vec<(Option<String>, Option<Value>)> = bench
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Observation { observation, .. } => Some((observation.call_id, observation.tool_result)),
            _ => None,
        })
        .collect();
    assert_eq!(observed, [(Some(call_id), Some(json!("wrote 2 bytes")))]);
    let digests = bench.digests();
    // The same transcript sent whole has the same digest: a replay finds it either way.
    let whole = json!({"model": "m", "instructions": "You write files.", "tools": tools, "input": [
        {"role": "user", "content": "write a.txt"},
        {"type": "function_call", "call_id": "call_01_0", "name": "write_file", "arguments": "{\"path\":\"a.txt\",\"content\":\"hi\"}"},
        {"type": "function_call_output", "call_id": "call_01_0", "output": "wrote 2 bytes"}]});
    let again = super::tests::bench(two_turns(), 10).await;
    let key = again.handle.key().to_owned();
    assert_eq!(
        again
            .post(
                "/v1/responses",
                &key,
                json!({"model": "m", "input": "write a.txt", "instructions": "You write files.", "tools": tools})
            )
            .await
            .0,
        200
    );
    assert_eq!(again.post("/v1/responses", &key, whole).await.0, 200);
    assert_eq!(digests, again.digests());
}

#[tokio::test]
async fn a_call_past_the_step_limit_is_refused_and_ends_the_episode() {
    let bench = bench(two_turns(), 1).await;
    assert_eq!(bench.chat(user("one")).await.0, 200);
    let (status, body) = bench.chat(user("two")).await;
    assert_eq!(status, 403);
    assert!(body["error"]["message"].as_str().unwrap().contains("step limit"), "{body}");
    assert_eq!(bench.handle.ending(), Some(GatewayEnd::Limit(Termination::MaxSteps)));
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(1), bench.handle.ended()).await,
        Ok(GatewayEnd::Limit(Termination::MaxSteps))
    );
}

#[tokio::test]
async fn a_model_failing_behind_the_gateway_is_the_episodes_fault_not_the_agents() {
    let bench = bench(vec![turn(Some("only"), &[])], 10).await;
    assert_eq!(bench.chat(user("one")).await.0, 200);
    let (status, body) = bench.chat(user("two")).await;
    assert_eq!(status, 502, "{body}");
    let Some(GatewayEnd::Fault(error)) = bench.handle.ending() else { panic!("{:?}", bench.handle.ending()) };
    assert_eq!(error.cause, crate::log::UnscoredCause::MockExhausted);
    assert_eq!(bench.chat(user("three")).await.0, 502, "the episode stays over");
    let calls = bench.events().iter().filter(|e| matches!(e, Event::ModelCall { .. })).count();
    assert_eq!(calls, 2, "the call after the fault never reached the model");
}

/// The `data:` payloads of a stream, with their `event:` names.
fn stream_events(text: &str) -> Vec<(Option<String>, String)> {
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let event = block.lines().find_map(|l| l.strip_prefix("event: ")).map(str::to_owned);
            let data = block.lines().find_map(|l| l.strip_prefix("data: ")).unwrap_or_default().to_owned();
            (event, data)
        })
        .collect()
}

#[tokio::test]
async fn each_wire_streams_the_events_its_provider_sends() {
    let turns = vec![
        turn(Some("thinking"), &[("f", json!({"a": 1}))]),
        turn(Some("thinking"), &[("f", json!({"a": 1}))]),
        turn(Some("thinking"), &[("f", json!({"a": 1}))]),
    ];
    let bench = bench(turns, 10).await;
    let key = bench.handle.key().to_owned();
    let (status, chat) = bench
        .post(
            "/v1/chat/completions",
            &key,
            json!({"model": "m", "stream": true,
        "stream_options": {"include_usage": true}, "messages": [{"role": "user", "content": "go"}]}),
        )
        .await;
    assert_eq!(status, 200);
    let chat = stream_events(&chat);
    assert!(chat.iter().all(|(event, _)| event.is_none()), "chat streams carry no event names");
    assert_eq!(chat.last().unwrap().1, "[DONE]");
    let usage: Value = serde_json::from_str(&chat[chat.len() - 2].1).unwrap();
    assert!(usage["usage"]["total_tokens"].is_u64(), "{usage}");

    let (status, messages) = bench
        .post(
            "/v1/messages",
            &key,
            json!({"model": "m", "max_tokens": 100, "stream": true,
        "messages": [{"role": "user", "content": "go"}]}),
        )
        .await;
    assert_eq!(status, 200);
    let names: Vec<String> = stream_events(&messages).into_iter().map(|(e, _)| e.unwrap_or_default()).collect();
    let block = ["content_block_start", "content_block_delta", "content_block_stop"];
    let expected: Vec<&str> = [&["message_start"][..], &block, &block, &["message_delta", "message_stop"]].concat();
    assert_eq!(names, expected);
    assert!(messages.contains(r#""partial_json":"{\"a\":1}""#), "{messages}");

    let (status, responses) =
        bench.post("/v1/responses", &key, json!({"model": "m", "stream": true, "input": "go"})).await;
    assert_eq!(status, 200);
    let events = stream_events(&responses);
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_deref().unwrap_or_default()).collect();
    assert_eq!(names.first(), Some(&"response.created"));
    assert_eq!(names.last(), Some(&"response.completed"));
    assert!(names.contains(&"response.output_text.delta") && names.contains(&"response.function_call_arguments.done"));
    for (i, (name, data)) in events.iter().enumerate() {
        let data: Value = serde_json::from_str(data).unwrap();
        assert_eq!((data["type"].as_str(), data["sequence_number"].as_u64()), (name.as_deref(), Some(i as u64)));
    }
}

#[tokio::test]
async fn models_lists_the_episodes_model_in_the_shape_of_the_client_that_asks() {
    let bench = bench(Vec::new(), 10).await;
    let get = |anthropic: bool| {
        let mut request = bench.client.get(format!("{}/v1/models", bench.handle.url())).bearer_auth(bench.handle.key());
        if anthropic {
            request = request.header("anthropic-version", "2023-06-01");
        }
        async move { request.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let up = bench.client.head(bench.handle.url()).send().await.unwrap();
    assert_eq!(up.status().as_u16(), 200, "a check that the endpoint is up needs no key");
    assert!(bench.refusals().is_empty());
    assert_eq!(get(false).await["data"][0]["id"], "mock");
    assert_eq!(get(true).await["data"][0]["type"], "model");
    let task = crate::domain::Task::new("t", "write a.txt");
    let command = "agent --base {{ gateway.openai_base_url }} --key {{ gateway.key }} {{ input }}";
    let rendered = crate::config::template::render(command, &bench.handle.template_context(task.template_context()));
    assert_eq!(
        rendered.unwrap(),
        format!("agent --base {}/v1 --key {} write a.txt", bench.handle.url(), bench.handle.key())
    );
    let env = bench.handle.env();
    let var = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()).unwrap();
    assert_eq!(var("OPENAI_BASE_URL"), format!("{}/v1", bench.handle.url()));
    assert_eq!(var("ANTHROPIC_API_KEY"), bench.handle.key());
}

#[tokio::test]
async fn requests_that_need_no_key_cannot_fill_the_log() {
    let bench = bench(Vec::new(), 10).await;
    let long = format!("/{}", "p".repeat(60_000));
    let key = bench.handle.key().to_owned();
    for i in 0..100 {
        let key = if i < 50 { "" } else { key.as_str() };
        let response = bench.client.get(format!("{}{long}", bench.handle.url())).bearer_auth(key).send().await.unwrap();
        assert_eq!(response.status().as_u16(), if i < 50 { 401 } else { 404 });
    }
    let Bench { handle, seen, _log, .. } = bench;
    drop(handle);
    let events = seen.lock().unwrap().0.clone();
    let logged: Vec<&Event> = events.iter().filter(|e| matches!(e, Event::GatewayRefused { .. })).collect();
    assert_eq!(logged.len(), REFUSALS_LOGGED as usize, "the first ones are logged one by one");
    for event in &logged {
        let Event::GatewayRefused { path, message, .. } = event else { unreachable!() };
        assert!(path.len() < 400 && path.contains("[... cut: showing"), "{} bytes of path", path.len());
        assert!(message.len() < 1200, "{} bytes of message", message.len());
    }
    let summaries: Vec<&Event> = events.iter().filter(|e| matches!(e, Event::GatewayRefusals { .. })).collect();
    let expected = Event::GatewayRefusals { count: 84, by_status: [(401, 34), (404, 50)].into() };
    assert_eq!(summaries, [&expected], "the others are counted, by status, once the gateway stops");
    let bytes: usize = events.iter().map(|e| serde_json::to_string(e).unwrap().len()).sum();
    assert!(bytes < 32 << 10, "100 refusals of 60 KB paths wrote {bytes} bytes of events");
}

#[tokio::test]
async fn a_long_result_the_program_sends_back_is_cut_in_its_observation() {
    let bench = bench(vec![turn(None, &[("f", json!({}))]), turn(Some("done"), &[])], 10).await;
    let key = bench.handle.key().to_owned();
    let ask = |messages: Value| json!({"model": "m", "max_tokens": 10, "messages": messages});
    let (status, first) = bench.post("/v1/messages", &key, ask(json!([{"role": "user", "content": "go"}]))).await;
    assert_eq!(status, 200, "{first}");
    let first: Value = serde_json::from_str(&first).unwrap();
    let id = first["content"][0]["id"].as_str().unwrap().to_owned();
    let result = json!({"type": "tool_result", "tool_use_id": id, "is_error": true, "content": "e".repeat(1 << 20)});
    let messages = json!([{"role": "user", "content": "go"}, {"role": "assistant", "content": first["content"]},
                          {"role": "user", "content": [result]}]);
    assert_eq!(bench.post("/v1/messages", &key, ask(messages)).await.0, 200);
    let observed: Vec<crate::contract::Observation> = bench
        .events()
        .into_iter()
        .filter_map(|e| match e {
            Event::Observation { observation, .. } => Some(observation),
            _ => None,
        })
        .collect();
    let error = observed[0].error.as_ref().unwrap_or_else(|| panic!("{observed:?}"));
    assert!(error.message.len() <= trajectory::RESULT_LOG_BYTES, "{} bytes logged", error.message.len());
    assert!(error.message.contains("of 1048576 bytes"), "the cut says so");
}

/// A connection to the bench's gateway, as a program (or anything on the host) opens it.
async fn connect(bench: &Bench) -> tokio::net::TcpStream {
    tokio::net::TcpStream::connect(("127.0.0.1", bench.handle.port())).await.unwrap()
}

/// A connection that sends a chat request's headers with the key and the first bytes of a
/// body of `length`, and no more.
async fn slow_body(bench: &Bench, length: usize) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut stream = connect(bench).await;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n{{\"model\":",
        bench.handle.key()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream
}

/// What the gateway answers on `stream`, read until it closes the connection.
async fn response(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut text = Vec::new();
    let _ = stream.read_to_end(&mut text).await;
    String::from_utf8_lossy(&text).into_owned()
}

/// A request that waits behind whatever is stalled would wait for good: this bound only
/// tells a wait from an answer.
const STALLED: Duration = Duration::from_secs(30);

#[tokio::test]
async fn idle_connections_without_the_key_do_not_keep_a_request_with_it_waiting() {
    let bench = bench(vec![turn(Some("hi"), &[])], 10).await;
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(connect(&bench).await);
    }
    let answered = tokio::time::timeout(STALLED, bench.chat(user("hi"))).await;
    assert_eq!(answered.map(|(status, _)| status).ok(), Some(200), "100 idle connections stalled the request");
}

#[tokio::test]
async fn past_the_most_unkeyed_connections_the_oldest_is_closed_for_the_newest() {
    use tokio::io::AsyncReadExt;
    let bench = bench(vec![turn(Some("hi"), &[])], 10).await;
    let mut oldest = connect(&bench).await;
    let mut idle = Vec::new();
    for _ in 0..connections::MAX_UNKEYED {
        idle.push(connect(&bench).await);
    }
    let read = tokio::time::timeout(STALLED, oldest.read(&mut [0u8; 64])).await;
    assert!(matches!(read, Ok(Ok(0))), "the oldest is still open: {read:?}");
    let answered = tokio::time::timeout(STALLED, bench.chat(user("hi"))).await;
    assert_eq!(answered.map(|(status, _)| status).ok(), Some(200));
}

#[tokio::test]
async fn slow_bodies_do_not_keep_other_requests_waiting() {
    let bench = bench(vec![turn(Some("hi"), &[])], 10).await;
    let mut slow = Vec::new();
    for _ in 0..8 {
        slow.push(slow_body(&bench, 1 << 20).await);
    }
    let answered = tokio::time::timeout(STALLED, bench.chat(user("hi"))).await;
    assert_eq!(answered.map(|(status, _)| status).ok(), Some(200), "8 slow bodies stalled the request");
}

/// Deadlines short enough to pass while a test waits.
const SHORT: Patience = Patience { headers: Duration::from_millis(200), body: Duration::from_millis(300) };

#[tokio::test]
async fn a_connection_that_sends_no_headers_is_closed_at_their_deadline() {
    use tokio::io::AsyncReadExt;
    let bench = bench_with(Vec::new(), Duration::from_secs(60), SHORT).await;
    let mut idle = connect(&bench).await;
    let read = tokio::time::timeout(STALLED, idle.read(&mut [0u8; 64])).await;
    assert!(matches!(read, Ok(Ok(0))), "the connection is still open: {read:?}");
}

#[tokio::test]
async fn a_body_that_stops_coming_is_refused_at_its_deadline() {
    let bench = bench_with(Vec::new(), Duration::from_secs(60), SHORT).await;
    let mut slow = slow_body(&bench, 1000).await;
    let answer = tokio::time::timeout(STALLED, response(&mut slow)).await.unwrap_or_default();
    assert!(answer.starts_with("HTTP/1.1 408") && answer.contains("did not arrive whole"), "{answer}");
}

#[tokio::test]
async fn a_body_still_coming_when_the_episode_ends_is_said_so_not_too_large() {
    let patient = Patience { headers: Duration::from_secs(60), body: Duration::from_secs(60) };
    let ending = bench_with(Vec::new(), Duration::from_millis(300), patient).await;
    let mut slow = slow_body(&ending, 1000).await;
    let answer = tokio::time::timeout(STALLED, response(&mut slow)).await.unwrap_or_default();
    assert!(answer.contains("the episode ended while the body was being read"), "{answer}");
    // A client gone once the episode is over is that, not a body too large either.
    let closing = bench(Vec::new(), 10).await;
    let slow = slow_body(&closing, 1000).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    closing.handle.close();
    drop(slow);
    let refused = |bench: &Bench| {
        bench.events().into_iter().find_map(|e| match e {
            Event::GatewayRefused { status, message, .. } => Some((status, message)),
            _ => None,
        })
    };
    for _ in 0..600 {
        if refused(&closing).is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, message) = refused(&closing).unwrap_or_default();
    assert_eq!((status, message.as_str()), (408, "the episode ended while the body was being read"));
}
