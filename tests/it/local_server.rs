//! A local model server, as people run one (llama.cpp, vLLM, Ollama): few slots, slow
//! answers, sometimes not started at all. Time waiting behind runner's own limits is not
//! the agent's, and a server that is not there is said to be missing, at once.

use std::time::Duration;

use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::{Run, Sandbox, of_type};

fn answer(text: &str) -> Value {
    json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 20, "completion_tokens": 2}})
}

/// A suite of `n` tasks answered by "4", with a time limit.
fn suite(n: usize, time_s: f64) -> String {
    let tasks: String = (0..n).map(|i| format!("  - {{id: t{i}, input: What is 2+2?}}\n")).collect();
    format!(
        "suite: local\nenvironment: kv\nlimits: {{time_s: {time_s}}}\nscorers: [{{equals: \"4\"}}]\ntasks:\n{tasks}"
    )
}

/// Runs `runner eval s.yaml --model local/tiny --config local.yaml`, off the async runtime.
async fn eval(sb: &Sandbox, extra: &[&str]) -> Run {
    let mut cmd = sb.command();
    cmd.args([
        "eval",
        "s.yaml",
        "--model",
        "local/tiny",
        "--config",
        "local.yaml",
        "--run-id",
        "test",
        "--out",
        "results",
    ])
    .args(extra)
    .env_remove("RUNNER_CONFIG");
    tokio::task::spawn_blocking(move || Run::from(cmd.output().unwrap())).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn time_queued_behind_max_concurrency_does_not_count_against_time_s() {
    // One slot, one second per answer, four episodes at once: the last waits three seconds
    // for the slot, longer than its two-second limit, though its own call takes one.
    let server = MockServer::start().await;
    let slow = ResponseTemplate::new(200).set_body_json(answer("4")).set_delay(Duration::from_secs(1));
    Mock::given(method("POST")).and(path("/v1/chat/completions")).respond_with(slow).mount(&server).await;
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(4, 2.0));
    sb.write(
        "local.yaml",
        &format!(
            "providers:\n  local: {{api: openai, base_url: \"{}/v1\", max_concurrency: 1, max_retries: 0, timeout_s: 30}}\n",
            server.uri()
        ),
    );
    let run = eval(&sb, &["-j", "4"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished.len(), 4);
    for f in finished {
        assert_eq!(f["termination"], "final_answer", "{f}");
        assert_eq!(f["outcome"]["status"], "scored", "{f}");
        assert_eq!(f["outcome"]["passed"], true, "{f}");
    }
    // The limit held: the calls did not overlap, so some episodes did wait.
    let slowest = of_type(&events, "episode_finished").iter().filter_map(|f| f["wall_ms"].as_f64()).fold(0.0, f64::max);
    assert!(slowest >= 3000.0, "the fourth episode should have waited for three calls: {slowest} ms");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_connection_stops_the_run_at_once_and_says_so_once() {
    // A port nobody listens on: bound, then let go.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(20, 60.0));
    // The default retries would try each episode for about 25 seconds.
    sb.write(
        "local.yaml",
        &format!("providers:\n  local: {{api: openai, base_url: \"http://127.0.0.1:{port}/v1\"}}\n"),
    );
    let run = eval(&sb, &["-j", "2"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    let said = run.stderr.matches("connection refused").count();
    assert_eq!(said, 1, "said {said} times: {run:?}");
    assert!(run.stderr.contains(&format!("http://127.0.0.1:{port}/v1/chat/completions")), "{run:?}");
    let events = sb.events();
    for call in of_type(&events, "model_call") {
        assert_eq!(call["attempts"], 1, "a refused connection was retried: {call}");
    }
    let finished = of_type(&events, "episode_finished");
    assert!(finished.len() <= 4, "{} episodes ran after the connection was refused", finished.len());
    assert!(finished.iter().all(|f| f["outcome"]["status"] != "scored"), "{finished:?}");
}
