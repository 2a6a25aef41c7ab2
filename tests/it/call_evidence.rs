//! Every model call a program agent makes through the gateway is evidence, however it
//! ended: a call the provider's `timeout_s` cut, and one under way when the run was stopped
//! with Ctrl-C, each leave a `model_call` event with its status and a cassette line, and the
//! cassette replays them as what they were. So does each attempt the provider's backend
//! retried: a timed-out attempt is a `model_call` of its own before the retry's.

use std::time::Duration;

use serde_json::json;
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::{Run, Sandbox, have_python, of_type, read_jsonl};

const AGENT: &str = include_str!("../../examples/agents/urllib_cli_agent.py");

/// A `cli` suite of one task run by the urllib agent, on `local/tiny`.
fn suite() -> String {
    let agent: String = AGENT.lines().map(|l| format!("        {l}\n")).collect();
    format!(
        "suite: evidence\nenvironment: shell\nagent: {{kind: cli, command: [python3, agent.py]}}\nlimits: {{max_steps: 5, time_s: 60}}\n\
         tasks:\n  - id: slow\n    input: Say done.\n    files:\n      agent.py: |\n{agent}\
         \x20   scorers: [{{equals: done}}]\n"
    )
}

fn slow_server(runtime: &tokio::runtime::Runtime, delay: Duration) -> MockServer {
    runtime.block_on(async {
        let server = MockServer::start().await;
        let answer = serde_json::json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "done"},
                                         "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}});
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(200).set_body_json(answer).set_delay(delay))
            .mount(&server)
            .await;
        server
    })
}

fn setup(server: &MockServer, timeout_s: f64) -> Sandbox {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite());
    sb.write(
        "local.yaml",
        &format!(
            "providers:\n  local: {{api: openai, base_url: \"{}/v1\", max_retries: 0, timeout_s: {timeout_s}}}\n",
            server.uri()
        ),
    );
    sb
}

fn args<'a>(model: &'a str, run_id: &'a str) -> Vec<&'a str> {
    vec!["eval", "s.yaml", "--model", model, "--config", "local.yaml", "--run-id", run_id, "--out", "results"]
}

fn cassette(sb: &Sandbox) -> Vec<serde_json::Value> {
    read_jsonl(&sb.path().join("cassette.jsonl"))
}

#[test]
fn a_call_cut_by_the_providers_timeout_is_a_model_call_and_replays_as_one() {
    if !have_python() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let server = slow_server(&runtime, Duration::from_secs(5));
    let sb = setup(&server, 1.0);
    let mut recording = args("local/tiny", "rec");
    recording.extend(["--record", "cassette.jsonl"]);
    let run = sb.run(&recording);
    let events = read_jsonl(&sb.path().join("results/rec/events.jsonl"));
    let calls = of_type(&events, "model_call");
    assert_eq!(calls.len(), 1, "{run:?}\n{events:#?}");
    assert_eq!(calls[0]["status"], "timed_out", "{:?}", calls[0]);
    assert!(calls[0]["latency_ms"].as_f64().unwrap() >= 900.0, "{:?}", calls[0]);
    let finished = of_type(&events, "episode_finished");
    assert_eq!(
        finished[0]["outcome"]["cause"], "provider_error",
        "the provider's fault, not the agent's: {finished:?}"
    );
    let lines = cassette(&sb);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["failure"]["cause"], "provider_error");

    let run = sb.run(&args("replay:cassette.jsonl", "rep"));
    let events = read_jsonl(&sb.path().join("results/rep/events.jsonl"));
    let calls = of_type(&events, "model_call");
    assert_eq!(calls.len(), 1, "{run:?}");
    assert_eq!(calls[0]["cause"], "provider_error");
    assert_eq!(calls[0]["status"], "timed_out", "replayed as what it was: {:?}", calls[0]);
    let replayed = of_type(&events, "episode_finished");
    assert_eq!(replayed[0]["outcome"]["status"], "unscored");
    assert_eq!(replayed[0]["outcome"]["cause"], finished[0]["outcome"]["cause"], "{replayed:?}");
}

#[cfg(unix)]
#[test]
fn a_call_under_way_at_ctrl_c_is_a_cancelled_model_call_and_a_cassette_line() {
    if !have_python() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let server = slow_server(&runtime, Duration::from_secs(60));
    let sb = setup(&server, 120.0);
    let mut recording = args("local/tiny", "rec");
    recording.extend(["--record", "cassette.jsonl"]);
    let started = std::time::Instant::now();
    let run = interrupted(&sb, &recording, (&runtime, &server, 1));
    assert!(started.elapsed().as_secs() < 40, "{run:?}");
    let events = read_jsonl(&sb.path().join("results/rec/events.jsonl"));
    let calls = of_type(&events, "model_call");
    assert_eq!(calls.len(), 1, "{run:?}\n{events:#?}");
    assert_eq!(calls[0]["status"], "cancelled", "{:?}", calls[0]);
    assert!(calls[0]["latency_ms"].as_f64().unwrap() >= 300.0, "how long it waited: {:?}", calls[0]);
    assert!(!calls[0]["request_digest"].as_str().unwrap_or_default().is_empty());
    let lines = cassette(&sb);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["failure"]["cause"], "cancelled");
    assert_eq!(lines[0]["digest"], calls[0]["request_digest"], "the line is the call's");

    // Replayed, the call is what it was: cancelled, and the episode goes no further.
    let run = sb.run(&args("replay:cassette.jsonl", "rep"));
    let events = read_jsonl(&sb.path().join("results/rep/events.jsonl"));
    let calls = of_type(&events, "model_call");
    assert_eq!(calls.len(), 1, "{run:?}\n{events:#?}");
    assert_eq!(calls[0]["status"], "cancelled", "{:?}", calls[0]);
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished[0]["outcome"]["status"], "unscored", "{finished:?}");
}

/// The built-in agent's call under way at Ctrl-C is kept too: a `cancelled` `model_call`.
#[cfg(unix)]
#[test]
fn the_built_in_agents_call_under_way_at_ctrl_c_is_a_cancelled_model_call() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let server = slow_server(&runtime, Duration::from_secs(60));
    let sb = setup(&server, 120.0);
    sb.write("s.yaml", "suite: built-in\nenvironment: kv\nlimits: {time_s: 60}\ntasks:\n  - {id: t, input: Say done., scorers: [{equals: done}]}\n");
    let run = interrupted(&sb, &args("local/tiny", "rec"), (&runtime, &server, 1));
    let events = read_jsonl(&sb.path().join("results/rec/events.jsonl"));
    let calls = of_type(&events, "model_call");
    assert_eq!(calls.len(), 1, "{run:?}\n{events:#?}");
    assert_eq!(calls[0]["status"], "cancelled", "{:?}", calls[0]);
    assert_eq!(of_type(&events, "episode_finished")[0]["outcome"]["status"], "cancelled", "{run:?}");
}

/// A server whose first request waits `first` (past the provider's timeout) and whose
/// later ones wait `then`.
fn retried_server(runtime: &tokio::runtime::Runtime, first: Duration, then: Duration) -> MockServer {
    runtime.block_on(async {
        let server = MockServer::start().await;
        let answer = serde_json::json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "done"},
                                         "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}});
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(200).set_body_json(answer.clone()).set_delay(first))
            .up_to_n_times(1)
            .with_priority(1)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .respond_with(ResponseTemplate::new(200).set_body_json(answer).set_delay(then))
            .with_priority(2)
            .mount(&server)
            .await;
        server
    })
}

/// The provider retries once, soon, after a timeout of 1 s.
fn setup_retrying(server: &MockServer) -> Sandbox {
    let sb = setup(server, 1.0);
    sb.write(
        "local.yaml",
        &format!(
            "providers:\n  local: {{api: openai, base_url: \"{}/v1\", max_retries: 1, retry_base_s: 0.1, timeout_s: 1.0}}\n",
            server.uri()
        ),
    );
    sb
}

/// `(status, attempt, retried)` of each of a log's model calls.
fn attempts_of(events: &[serde_json::Value]) -> Vec<(String, u64, bool)> {
    of_type(events, "model_call")
        .iter()
        .map(|c| {
            let status = c["status"].as_str().unwrap_or_default().to_owned();
            (status, c["attempt"].as_u64().unwrap_or(0), c["retried"].as_bool().unwrap_or(false))
        })
        .collect()
}

#[test]
fn a_timed_out_attempt_before_an_answered_retry_is_a_model_call_of_its_own() {
    if !have_python() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let server = retried_server(&runtime, Duration::from_secs(5), Duration::ZERO);
    let sb = setup_retrying(&server);
    let mut recording = args("local/tiny", "rec");
    recording.extend(["--record", "cassette.jsonl"]);
    let run = sb.run(&recording);
    let events = read_jsonl(&sb.path().join("results/rec/events.jsonl"));
    let expected = vec![("timed_out".to_owned(), 1, true), ("answered".to_owned(), 2, false)];
    assert_eq!(attempts_of(&events), expected, "{run:?}\n{events:#?}");
    let calls = of_type(&events, "model_call");
    assert!(calls[0]["latency_ms"].as_f64().unwrap() >= 900.0, "the attempt's own wall: {:?}", calls[0]);
    assert!(calls[1]["latency_ms"].as_f64().unwrap() < 4000.0, "the retry's own wall: {:?}", calls[1]);
    assert_eq!(calls[0]["cause"], "provider_error", "{:?}", calls[0]);
    assert!(calls[0]["error"].as_str().unwrap_or_default().contains("no complete response within"), "{:?}", calls[0]);
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished[0]["outcome"]["passed"], true, "the retry answered: {finished:?}");
    let lines = cassette(&sb);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!((&lines[0]["failure"]["retried"], &lines[0]["failure"]["attempt"]), (&json!(true), &json!(1)));
    assert_eq!(lines[1]["response"]["text"], "done", "{lines:?}");

    let run = sb.run(&args("replay:cassette.jsonl", "rep"));
    let replayed = read_jsonl(&sb.path().join("results/rep/events.jsonl"));
    assert_eq!(attempts_of(&replayed), expected, "replayed as what it was: {run:?}");
    assert_eq!(of_type(&replayed, "episode_finished")[0]["outcome"], finished[0]["outcome"]);
}

#[cfg(unix)]
#[test]
fn a_timed_out_attempt_and_its_retry_under_way_at_ctrl_c_are_both_model_calls() {
    if !have_python() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let server = retried_server(&runtime, Duration::from_secs(5), Duration::from_secs(60));
    let sb = setup_retrying(&server);
    let mut recording = args("local/tiny", "rec");
    recording.extend(["--record", "cassette.jsonl"]);
    let started = std::time::Instant::now();
    let run = interrupted(&sb, &recording, (&runtime, &server, 2));
    assert!(started.elapsed().as_secs() < 40, "{run:?}");
    let events = read_jsonl(&sb.path().join("results/rec/events.jsonl"));
    let expected = vec![("timed_out".to_owned(), 1, true), ("cancelled".to_owned(), 2, false)];
    assert_eq!(attempts_of(&events), expected, "{run:?}\n{events:#?}");
    let calls = of_type(&events, "model_call");
    assert_eq!(calls[0]["request_digest"], calls[1]["request_digest"], "one call's attempts");
    assert!(calls[1]["latency_ms"].as_f64().unwrap() >= 300.0, "how long the retry waited: {:?}", calls[1]);
    let lines = cassette(&sb);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["failure"]["retried"], true, "{lines:?}");
    assert_eq!((&lines[1]["failure"]["cause"], &lines[1]["failure"]["attempt"]), (&json!("cancelled"), &json!(2)));

    let run = sb.run(&args("replay:cassette.jsonl", "rep"));
    let replayed = read_jsonl(&sb.path().join("results/rep/events.jsonl"));
    assert_eq!(attempts_of(&replayed), expected, "replayed as what it was: {run:?}");
    let finished = of_type(&replayed, "episode_finished");
    assert_eq!(finished[0]["outcome"]["status"], "unscored", "{finished:?}");
}

/// Runs runner with `args` and stops it with SIGINT 300 ms after the model's server got
/// `requests` requests.
#[cfg(unix)]
fn interrupted(
    sb: &Sandbox,
    args: &[&str],
    (runtime, server, requests): (&tokio::runtime::Runtime, &MockServer, usize),
) -> Run {
    let child = sb
        .command()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while runtime.block_on(server.received_requests()).unwrap_or_default().len() < requests {
        assert!(started.elapsed().as_secs() < 30, "the agent's call never reached the model");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: sends SIGINT to the child we spawned.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    Run::from(child.wait_with_output().unwrap())
}
