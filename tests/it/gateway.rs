//! The model gateway spoken to by the official `openai` and `anthropic` Python SDKs
//! (installed by `scripts/install-test-servers.sh` into `sdk-venv`), with the `mock` model
//! behind it: each wire, streaming and not, a tool call round-tripped.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runner::agent::EpisodeState;
use runner::budget::EpisodeLimits;
use runner::contract::Actor;
use runner::domain::{MockCall, MockTurn, Task, text::Text};
use runner::gateway::{Gateway, GatewayEnd};
use runner::log::{Event, EventLog, Subscriber, Subscription, UnscoredCause};
use runner::model::{Backend, BackendOptions, Role, config::ModelConfig};
use serde_json::json;

/// Where the test servers and SDKs are installed: `$RUNNER_TEST_SERVERS`, else the cache folder.
pub fn servers_dir() -> PathBuf {
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

/// What one run of the SDK agent gave: its output, its folder, the episode's events, and
/// why the gateway said the episode must end.
struct Ran {
    output: std::process::Output,
    dir: tempfile::TempDir,
    events: Vec<Event>,
    ending: Option<GatewayEnd>,
}

impl Ran {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.output.stdout).trim().to_owned()
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }

    fn kinds(&self) -> Vec<&'static str> {
        self.events
            .iter()
            .map(|e| match e {
                Event::ModelCall { .. } => "model_call",
                Event::ActionDispatched { .. } => "action_dispatched",
                Event::Observation { .. } => "observation",
                Event::GatewayRefused { .. } => "gateway_refused",
                _ => "other",
            })
            .collect()
    }

    fn digests(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::ModelCall { request_digest, .. } => Some(request_digest.clone()),
                _ => None,
            })
            .collect()
    }
}

/// Runs the SDK agent on `api` (`stream` or `plain`) against a gateway of its own, answered
/// by `backend` as lent to episode `e1` of [`task`].
fn run_agent(api: &str, mode: &str, backend: &Backend) -> Ran {
    let python = sdk_python();
    let dir = tempfile::tempdir().unwrap();
    let (log, writer) = EventLog::create(&dir.path().join("events.jsonl"), "r").unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let log = log.with_subscribers(&[Subscription::all(seen.clone())]);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let (output, ending) = runtime.block_on(async {
        let budget = Arc::new(EpisodeState::new(EpisodeLimits::new(10, Duration::from_secs(60))));
        let gateway = Gateway {
            run_own: Default::default(),
            model: backend.lend(Role::Agent(&Actor::Main), &task(), "e1"),
            model_name: backend.name().to_owned(),
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
        let calls = budget.take_trajectory().calls.len();
        let steps = budget.steps();
        if output.status.success() {
            assert_eq!((steps, calls), (2, 1), "two model calls, two steps, one derived call in the trajectory");
        }
        (output, handle.ending())
    });
    drop(log);
    writer.close().unwrap();
    let events = std::mem::take(&mut seen.lock().unwrap().0);
    Ran { output, dir, events, ending }
}

fn mock() -> Backend {
    Backend::open("mock", &ModelConfig::default(), BackendOptions::default()).unwrap()
}

/// The agent wrote its file, said `done`, and the derived trajectory shows its call.
fn passes(api: &str, mode: &str, ran: &Ran) {
    assert!(ran.output.status.success(), "{api} {mode}: {}", ran.stderr());
    assert_eq!(ran.stdout(), "done", "{api} {mode}: {}", ran.stderr());
    assert_eq!(std::fs::read_to_string(ran.dir.path().join("a.txt")).unwrap(), "hello", "{api} {mode}");
    assert_eq!(ran.kinds(), ["model_call", "action_dispatched", "observation", "model_call"], "{api} {mode}");
    let Event::Observation { observation, .. } = &ran.events[2] else { unreachable!() };
    assert_eq!(observation.tool_result, Some(json!("wrote 5 bytes to a.txt")), "{api} {mode}");
}

fn check(api: &str, mode: &str) {
    passes(api, mode, &run_agent(api, mode, &mock()));
}

#[test]
fn the_openai_sdk_round_trips_a_tool_call_through_chat_completions() {
    check("chat", "plain");
}

#[test]
fn the_openai_sdk_streams_a_tool_call_through_chat_completions() {
    check("chat", "stream");
}

#[test]
fn the_openai_sdk_round_trips_a_tool_call_through_responses() {
    check("responses", "plain");
}

#[test]
fn the_openai_sdk_streams_a_tool_call_through_responses() {
    check("responses", "stream");
}

#[test]
fn the_anthropic_sdk_round_trips_a_tool_use_through_messages() {
    check("messages", "plain");
}

#[test]
fn the_anthropic_sdk_streams_a_tool_use_through_messages() {
    check("messages", "stream");
}

#[test]
fn a_recorded_run_replays_offline_with_no_key_and_the_same_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let cassette = dir.path().join("cassette.jsonl");
    let writer = Arc::new(runner::model::replay::CassetteWriter::create(&cassette).unwrap());
    let options = BackendOptions { record: Some(writer), ..BackendOptions::default() };
    let recording = Backend::open("mock", &ModelConfig::default(), options).unwrap();
    let recorded = run_agent("messages", "stream", &recording);
    passes("messages", "stream", &recorded);

    let replay =
        Backend::open(&format!("replay:{}", cassette.display()), &ModelConfig::default(), BackendOptions::default())
            .unwrap();
    let replayed = run_agent("messages", "stream", &replay);
    passes("messages", "stream", &replayed);
    assert_eq!(replayed.digests(), recorded.digests(), "the same requests, answered from the cassette");
    let hits: Vec<bool> = replayed
        .events
        .iter()
        .filter_map(|e| match e {
            Event::ModelCall { cache_hit, .. } => Some(*cache_hit),
            _ => None,
        })
        .collect();
    assert_eq!(hits, [true, true], "both calls served by the cassette");
}

/// An OpenAI-compatible server: a `write_file` call for a request without tool results,
/// else `done`; or `503` for everything when `down`.
struct Upstream {
    down: bool,
}

impl wiremock::Respond for Upstream {
    fn respond(&self, request: &wiremock::Request) -> wiremock::ResponseTemplate {
        if self.down {
            return wiremock::ResponseTemplate::new(503).set_body_json(json!({"error": {"message": "overloaded"}}));
        }
        let body: serde_json::Value = request.body_json().unwrap_or_default();
        let answered = body["messages"].as_array().is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        let message = if answered {
            json!({"role": "assistant", "content": "done"})
        } else {
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_up", "type": "function",
                "function": {"name": "write_file", "arguments": "{\"path\": \"a.txt\", \"content\": \"hello\"}"}}]})
        };
        wiremock::ResponseTemplate::new(200).set_body_json(json!({"choices": [{"index": 0, "message": message,
            "finish_reason": if answered { "stop" } else { "tool_calls" }}], "usage": {"prompt_tokens": 20, "completion_tokens": 5}}))
    }
}

/// The backend `local/m`: an OpenAI-compatible provider at `server`, retrying `retries` times
/// at once.
pub fn local_backend(server: &wiremock::MockServer, retries: u32) -> Backend {
    let mut config = ModelConfig::default();
    let mut provider = config.providers["openai"].clone();
    provider.name = "local".into();
    provider.base_url = Some(format!("{}/v1", server.uri()));
    provider.base_url_env = None;
    provider.key_env = None;
    provider.max_retries = retries;
    provider.retry_base_s = 0.01;
    provider.retry_max_s = 0.02;
    config.providers.insert("local".into(), provider);
    Backend::open("local/m", &config, BackendOptions::default()).unwrap()
}

/// A backend `local/m` on an OpenAI-compatible server that answers as `upstream` does.
fn upstream(down: bool) -> (tokio::runtime::Runtime, wiremock::MockServer, Backend) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let server = runtime.block_on(async {
        let server = wiremock::MockServer::start().await;
        wiremock::Mock::given(wiremock::matchers::method("POST")).respond_with(Upstream { down }).mount(&server).await;
        server
    });
    let backend = local_backend(&server, 1);
    (runtime, server, backend)
}

#[test]
fn an_anthropic_speaking_agent_runs_on_an_openai_compatible_model() {
    let (_runtime, _server, backend) = upstream(false);
    let ran = run_agent("messages", "plain", &backend);
    passes("messages", "plain", &ran);
    let Event::ActionDispatched { call, .. } = &ran.events[1] else { unreachable!() };
    assert_eq!(call.call_id, "call_up", "the upstream model's call id travels through");
}

#[test]
fn an_outage_behind_the_gateway_is_a_provider_error_not_the_agents_failure() {
    let (_runtime, _server, backend) = upstream(true);
    let ran = run_agent("chat", "plain", &backend);
    assert!(!ran.output.status.success(), "the SDK shows the error: {}", ran.stdout());
    assert!(ran.stderr().contains("502") || ran.stderr().contains("InternalServerError"), "{}", ran.stderr());
    let Some(GatewayEnd::Fault(error)) = &ran.ending else { panic!("{:?}", ran.ending) };
    assert_eq!(error.cause, UnscoredCause::ProviderError, "{error:?}");
    assert_eq!(ran.kinds(), ["model_call", "model_call", "gateway_refused"], "the retried attempt, then the last");
    let Event::ModelCall { retried: true, attempt: Some(1), .. } = &ran.events[0] else {
        panic!("{:?}", ran.events[0])
    };
    let Event::ModelCall { cause, attempt: Some(2), .. } = &ran.events[1] else { panic!("{:?}", ran.events[1]) };
    assert_eq!(cause.as_ref(), Some(&UnscoredCause::ProviderError));
}

#[test]
fn a_wrong_key_is_refused_with_401_through_the_sdk() {
    let python = sdk_python();
    let dir = tempfile::tempdir().unwrap();
    let (log, writer) = EventLog::create(&dir.path().join("events.jsonl"), "r").unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let output = runtime.block_on(async {
        let budget = Arc::new(EpisodeState::new(EpisodeLimits::new(10, Duration::from_secs(60))));
        let gateway = Gateway {
            run_own: Default::default(),
            model: mock().lend(Role::Agent(&Actor::Main), &task(), "e1"),
            model_name: "mock".into(),
            ledger: budget,
            recorder: log.recorder("e1"),
            derive_trajectory: true,
        };
        let handle = gateway.start().await.unwrap();
        let mut env = handle.env();
        env.retain(|(k, _)| !k.ends_with("API_KEY"));
        tokio::process::Command::new(&python)
            .arg(AGENT)
            .args(["messages", "plain"])
            .env_clear()
            .envs(env)
            .env("ANTHROPIC_API_KEY", "sk-ant-not-the-episodes")
            .current_dir(dir.path())
            .output()
            .await
            .unwrap()
    });
    drop(log);
    writer.close().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("AuthenticationError") && stderr.contains("401"), "{stderr}");
    let events = runner::log::read_events(&dir.path().join("events.jsonl")).unwrap().events;
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["gateway_refused"], "logged, and no model call made");
}

#[test]
fn a_program_confined_to_the_gateway_reaches_it_and_no_other_listener() {
    use runner::sandbox::{Confinement, SandboxMode, SandboxSpec, process};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let python = sdk_python();
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gateway/confined_agent.py"),
        dir.path().join("agent.py"),
    )
    .unwrap();
    let (log, writer) = EventLog::create(&dir.path().join("events.jsonl"), "r").unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let (output, enforced) = runtime.block_on(async {
        let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let other_port = other.local_addr().unwrap().port();
        let counted = accepted.clone();
        tokio::spawn(async move {
            while other.accept().await.is_ok() {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        });
        let mut task = task();
        task.mock = vec![MockTurn { text: Some(Text("hi".into())), tool_calls: vec![] }].into();
        let gateway = Gateway {
            run_own: Default::default(),
            model: mock().lend(Role::Agent(&Actor::Main), &task, "e1"),
            model_name: "mock".into(),
            ledger: Arc::new(EpisodeState::new(EpisodeLimits::new(10, Duration::from_secs(60)))),
            recorder: log.recorder("e1"),
            derive_trajectory: true,
        };
        let handle = gateway.start().await.unwrap();
        let venv = servers_dir().join("sdk-venv");
        let sandbox = Confinement::prepare_for_gateway(
            &SandboxSpec::default(),
            SandboxMode::On,
            &[dir.path()],
            &[venv],
            handle.port(),
        )
        .unwrap();
        let mut command = tokio::process::Command::new(&python);
        command.arg("agent.py").arg(other_port.to_string()).env_clear().envs(handle.env()).current_dir(dir.path());
        let mut started = process::spawn(&command, process::Input::Null, &sandbox).unwrap();
        let (mut stdout, mut stderr) = (started.keeper.stdout.take().unwrap(), started.keeper.stderr.take().unwrap());
        let (mut out, mut err) = (String::new(), String::new());
        use tokio::io::AsyncReadExt;
        let _ = tokio::join!(stdout.read_to_string(&mut out), stderr.read_to_string(&mut err));
        started.shell_status().await;
        ((out, err), sandbox.enforced().clone())
    });
    drop(log);
    writer.close().unwrap();
    let (out, err) = output;
    let seen: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|_| panic!("{out}\n{err}"));
    assert_eq!(seen["answer"], "hi", "the gateway answered: {seen}");
    assert!(seen["other"].as_str().unwrap().starts_with("refused"), "{seen}");
    assert!(seen["udp"].as_str().unwrap().starts_with("refused"), "{seen}");
    assert!(seen["unix"].as_str().unwrap().starts_with("refused"), "{seen}");
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "the other listener saw no connection");
    assert!(enforced["network"].as_str().unwrap().contains("the model gateway only"), "{enforced}");
}

/// The Claude Code CLI, when installed (`scripts/install-test-servers.sh` tries to).
fn claude_code() -> Option<PathBuf> {
    let claude = servers_dir().join("node_modules/.bin/claude");
    if !claude.is_file() {
        eprintln!(
            "skipped: Claude Code is not installed: no {} — run scripts/install-test-servers.sh",
            claude.display()
        );
        return None;
    }
    Some(claude)
}

#[test]
fn claude_code_writes_a_file_with_its_own_tool_and_answers_through_the_gateway() {
    let Some(claude) = claude_code() else { return };
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let target = work.join("a.txt");
    let (log, writer) = EventLog::create(&dir.path().join("events.jsonl"), "r").unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let log = log.with_subscribers(&[Subscription::all(seen.clone())]);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let output = runtime.block_on(async {
        let mut task = task();
        let write = MockCall {
            name: "Write".into(),
            arguments: json!({"file_path": target.display().to_string(), "content": "hello"}),
            id: None,
        };
        task.mock = vec![
            MockTurn { text: None, tool_calls: vec![write] },
            MockTurn { text: Some(Text("done".into())), tool_calls: vec![] },
        ]
        .into();
        let gateway = Gateway {
            run_own: Default::default(),
            model: mock().lend(Role::Agent(&Actor::Main), &task, "e1"),
            model_name: "mock".into(),
            ledger: Arc::new(EpisodeState::new(EpisodeLimits::new(20, Duration::from_secs(120)))),
            recorder: log.recorder("e1"),
            derive_trajectory: true,
        };
        let handle = gateway.start().await.unwrap();
        tokio::process::Command::new(&claude)
            .args(["-p", "Write hello into a.txt, then say done.", "--dangerously-skip-permissions"])
            .env_clear()
            .envs(handle.env())
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", dir.path())
            .env("IS_SANDBOX", "1")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .current_dir(&work)
            .output()
            .await
            .unwrap()
    });
    drop(log);
    writer.close().unwrap();
    let events = std::mem::take(&mut seen.lock().unwrap().0);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let refused: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            Event::GatewayRefused { status, path, message, .. } => Some(format!("{status} {path}: {message}")),
            _ => None,
        })
        .collect();
    assert!(output.status.success(), "stdout: {stdout}\nstderr: {stderr}\nrefused: {refused:?}");
    assert_eq!(stdout.trim(), "done", "stderr: {stderr}\nrefused: {refused:?}");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "hello");
    let dispatched: Vec<&str> = events
        .iter()
        .filter_map(|e| match e {
            Event::ActionDispatched { call, .. } => Some(call.name.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(dispatched, ["Write"], "the derived trajectory shows Claude Code's own tool call");
    let observed = events.iter().any(
        |e| matches!(e, Event::Observation { observation, .. } if observation.call_id.as_deref() == Some("toolu_01_0")),
    );
    assert!(observed, "and its result, by call id: {events:?}");
}
