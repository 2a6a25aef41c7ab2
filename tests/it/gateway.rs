//! The model gateway spoken to by the official `openai` and `anthropic` Python SDKs
//! (installed by `scripts/install-test-servers.sh` into `sdk-venv`), with the `mock` model
//! behind it: each wire, streaming and not, a tool call round-tripped.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runner::agent::EpisodeBudget;
use runner::contract::Actor;
use runner::domain::{MockCall, MockTurn, Task, text::Text};
use runner::gateway::Gateway;
use runner::log::{Event, EventLog, Subscriber, Subscription};
use runner::model::{Backend, BackendOptions, Role, config::ModelConfig};
use serde_json::json;

/// Where the test servers and SDKs are installed: `$RUNNER_TEST_SERVERS`, else the cache folder.
fn servers_dir() -> PathBuf {
    match std::env::var_os("RUNNER_TEST_SERVERS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/runner-test-servers"),
    }
}

/// The Python that has the official SDKs; fails, saying how to install them, when missing.
pub fn sdk_python() -> PathBuf {
    let python = servers_dir().join("sdk-venv/bin/python3");
    assert!(
        python.is_file(),
        "the model SDKs are not installed: no {} — run scripts/install-test-servers.sh (CI's .ci/run does)",
        python.display()
    );
    python
}

const AGENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gateway/sdk_agent.py");

#[derive(Default)]
struct Seen(Vec<Event>);

impl Subscriber for Seen {
    fn event(&mut self, _: Option<&str>, event: &Event) {
        self.0.push(event.clone());
    }
}

/// The task's script: a `write_file` call, then the answer.
fn task() -> Task {
    let mut task = Task::new("t", "write a.txt");
    let call =
        MockCall { name: "write_file".into(), arguments: json!({"path": "a.txt", "content": "hello"}), id: None };
    task.mock = vec![
        MockTurn { text: None, tool_calls: vec![call] },
        MockTurn { text: Some(Text("done".into())), tool_calls: vec![] },
    ]
    .into();
    task
}

/// Runs the SDK agent on `api` (`stream` or `plain`) against a gateway of its own.
fn run_agent(api: &str, mode: &str) {
    let python = sdk_python();
    let dir = tempfile::tempdir().unwrap();
    let (log, writer) = EventLog::create(&dir.path().join("events.jsonl"), "r").unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let log = log.with_subscribers(&[Subscription::all(seen.clone())]);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let output = runtime.block_on(async {
        let backend = Backend::open("mock", &ModelConfig::default(), BackendOptions::default()).unwrap();
        let budget = Arc::new(EpisodeBudget::new(10, Duration::from_secs(60)));
        let gateway = Gateway {
            model: backend.lend(Role::Agent(&Actor::Main), &task(), "e1"),
            model_name: "mock".into(),
            ledger: budget.clone(),
            recorder: log.recorder("e1"),
            derive_trajectory: true,
        };
        let handle = gateway.start().await.unwrap();
        let output = tokio::process::Command::new(&python)
            .arg(AGENT)
            .args([api, mode])
            .env_clear()
            .envs(handle.env())
            .current_dir(dir.path())
            .output()
            .await
            .unwrap();
        assert_eq!(budget.steps(), 2, "two model calls, two steps");
        assert_eq!(budget.take_trajectory().calls.len(), 1, "the derived call is in the trajectory");
        output
    });
    drop(log);
    writer.close().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{api} {mode}: {stderr}");
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "done", "{api} {mode}: {stderr}");
    assert_eq!(std::fs::read_to_string(dir.path().join("a.txt")).unwrap(), "hello", "{api} {mode}");
    let seen = &seen.lock().unwrap().0;
    let kinds: Vec<&str> = seen
        .iter()
        .map(|e| match e {
            Event::ModelCall { .. } => "model_call",
            Event::ActionDispatched { .. } => "action_dispatched",
            Event::Observation { .. } => "observation",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["model_call", "action_dispatched", "observation", "model_call"], "{api} {mode}");
    let Event::Observation { observation, .. } = &seen[2] else { unreachable!() };
    assert_eq!(observation.tool_result, Some(json!("wrote 5 bytes to a.txt")), "{api} {mode}");
    let Event::ModelCall { request_digest, .. } = &seen[3] else { unreachable!() };
    assert!(!request_digest.is_empty());
}

#[test]
fn the_openai_sdk_round_trips_a_tool_call_through_chat_completions() {
    run_agent("chat", "plain");
}

#[test]
fn the_openai_sdk_streams_a_tool_call_through_chat_completions() {
    run_agent("chat", "stream");
}

#[test]
fn the_openai_sdk_round_trips_a_tool_call_through_responses() {
    run_agent("responses", "plain");
}

#[test]
fn the_openai_sdk_streams_a_tool_call_through_responses() {
    run_agent("responses", "stream");
}

#[test]
fn the_anthropic_sdk_round_trips_a_tool_use_through_messages() {
    run_agent("messages", "plain");
}

#[test]
fn the_anthropic_sdk_streams_a_tool_use_through_messages() {
    run_agent("messages", "stream");
}
