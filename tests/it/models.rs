//! The HTTP backends against local servers speaking each API's wire format: the exact
//! JSON sent, tool calls, usage, and every fault (429, 5xx, hangs, broken bodies, 401).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::{Run, Sandbox, of_type, read_jsonl, tool_observations};

/// Answers with each template in turn, then keeps answering with the last one.
struct Script {
    turns: Vec<ResponseTemplate>,
    next: AtomicUsize,
    bodies: Mutex<Vec<Value>>,
}

impl Respond for Script {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        self.bodies.lock().unwrap().push(request.body_json().unwrap_or(Value::Null));
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        self.turns[n.min(self.turns.len() - 1)].clone()
    }
}

fn ok(body: Value) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(body)
}

fn openai_text(text: &str) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0,
           "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 20, "completion_tokens": 2, "total_tokens": 22}})
}

fn openai_calls(calls: &[(&str, &str, &str)]) -> Value {
    let calls: Vec<Value> = calls
        .iter()
        .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}))
        .collect();
    json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": calls},
           "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 50, "completion_tokens": 9}})
}

const FAST: &str = "retry_base_s: 0.01, retry_max_s: 2, max_retries: 2, timeout_s: 2";

const SUITE: &str = "suite: m\nenvironment: kv\nagent: {system: Be brief.}\nscorers: [{equals: \"4\"}]\ntasks:\n  - {id: t, input: What is 2+2?}\n";

/// A sandbox with the suite and a config that retries fast; `openai` replaces the
/// openai provider's settings.
fn sandbox(openai: &str) -> Sandbox {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    sb.write(
        "runner.yaml",
        &format!(
            "providers:\n  openai: {{{openai}}}\n  anthropic: {{retry_base_s: 0.01, max_retries: 2, timeout_s: 2}}\nprices:\n  openai/gpt-test: {{input: 1.0, output: 2.0}}\n"
        ),
    );
    sb
}

async fn serve(route: &str, turns: Vec<ResponseTemplate>) -> (MockServer, std::sync::Arc<Script>) {
    let server = MockServer::start().await;
    let script = std::sync::Arc::new(Script { turns, next: AtomicUsize::new(0), bodies: Mutex::new(Vec::new()) });
    Mock::given(method("POST")).and(path(route)).respond_with(ScriptRef(script.clone())).mount(&server).await;
    (server, script)
}

struct ScriptRef(std::sync::Arc<Script>);

impl Respond for ScriptRef {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        self.0.respond(request)
    }
}

/// Runs `runner eval s.yaml --model MODEL` with the given environment, off the async runtime.
async fn eval(sb: &Sandbox, model: &str, env: &[(&str, String)], extra: &[&str]) -> Run {
    let args = [&["eval", "s.yaml", "--model", model, "--run-id", "test", "--out", "results"][..], extra].concat();
    run_with(sb, &args, env).await
}

/// Runs `runner` with only the given provider variables set, off the async runtime.
pub async fn run_with(sb: &Sandbox, args: &[&str], env: &[(&str, String)]) -> Run {
    let mut cmd = sb.command();
    cmd.args(args);
    for var in
        ["OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "OLLAMA_HOST", "RUNNER_CONFIG"]
    {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    tokio::task::spawn_blocking(move || Run::from(cmd.output().unwrap())).await.unwrap()
}

pub fn openai_env(server: &MockServer) -> Vec<(&'static str, String)> {
    vec![("OPENAI_BASE_URL", format!("{}/v1", server.uri())), ("OPENAI_API_KEY", "sk-test-key-123".into())]
}

/// The model calls, each as its last attempt's event, once it is checked that every attempt
/// retried before it has an event of its own, numbered in order.
fn model_calls(sb: &Sandbox) -> Vec<Value> {
    let mut calls = Vec::new();
    let mut retried = 0;
    for call in of_type(&sb.events(), "model_call") {
        if call["retried"] == true {
            retried += 1;
            assert_eq!(call["attempt"], retried, "{call}");
            continue;
        }
        if retried > 0 || call["attempts"].as_u64().unwrap_or(1) > 1 {
            assert_eq!((&call["attempt"], &call["attempts"]), (&json!(retried + 1), &json!(retried + 1)), "{call}");
        }
        retried = 0;
        calls.push(call.clone());
    }
    calls
}

#[tokio::test(flavor = "multi_thread")]
async fn openai_parallel_tool_calls_then_text_with_the_exact_json_sent() {
    let sb = sandbox(FAST);
    let (server, script) = serve(
        "/v1/chat/completions",
        vec![
            ok(openai_calls(&[
                ("call_a", "kv_set", "{\"key\": \"x\", \"value\": \"4\"}"),
                ("call_b", "calc", " {\"expression\": \"2+2\"} "),
            ])),
            ok(openai_text("4")),
        ],
    )
    .await;
    let run = eval(&sb, "openai/gpt-test", &openai_env(&server), &[]).await;
    assert_eq!(run.code, 0, "{run:?}");

    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].headers.get("authorization").unwrap(), "Bearer sk-test-key-123");
    let bodies = script.bodies.lock().unwrap().clone();
    let first = &bodies[0];
    assert_eq!(first["model"], "gpt-test");
    assert_eq!(
        first["messages"],
        json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}])
    );
    assert_eq!(first["tool_choice"], "auto");
    assert_eq!(first["parallel_tool_calls"], true);
    let tool_names: Vec<&str> =
        first["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert!(tool_names.contains(&"calc") && tool_names.contains(&"final_answer"), "{tool_names:?}");
    assert_eq!(first["tools"][0]["type"], "function");
    // The second request carries the calls and their results, matched by the model's ids.
    let second = &bodies[1]["messages"];
    assert_eq!(second[2]["role"], "assistant");
    // Regression: llama-cpp-python refuses `"content": null` beside tool calls.
    assert_eq!(second[2]["content"], "");
    assert_eq!(second[2]["tool_calls"][0]["id"], "call_a");
    assert_eq!(second[2]["tool_calls"][1]["function"]["arguments"], "{\"expression\":\"2+2\"}");
    assert_eq!(
        second[3],
        json!({"role": "tool", "tool_call_id": "call_a", "content": "{\"key\":\"x\",\"replaced\":false}"})
    );
    assert_eq!(second[4]["tool_call_id"], "call_b");

    let calls = model_calls(&sb);
    assert_eq!(calls[0]["usage"], json!({"input_tokens": 50, "output_tokens": 9, "cached_tokens": 0}));
    assert_eq!(calls[0]["attempts"], 1);
    assert_eq!(calls[0]["request"], bodies[0], "the log holds the request as sent");
    assert_eq!(calls[0]["raw_response"]["choices"][0]["finish_reason"], "tool_calls");
    assert!(calls[0]["url"].as_str().unwrap().ends_with("/v1/chat/completions"));
    // 50 input at $1/M and 9 output at $2/M, then 20 and 2.
    let cost = of_type(&sb.events(), "episode_finished")[0]["cost_usd"].as_f64().unwrap();
    assert!((cost - (50.0 + 18.0 + 20.0 + 4.0) / 1e6).abs() < 1e-12, "{cost}");
    assert!(run.stdout.contains("$0.0001"), "the summary shows the cost: {run:?}");
    let log = std::fs::read_to_string(sb.path().join("results/test/events.jsonl")).unwrap();
    assert!(!log.contains("sk-test-key-123"), "the key reached the log");
}

#[tokio::test(flavor = "multi_thread")]
async fn anthropic_tool_use_and_tool_result_blocks() {
    let sb = sandbox(FAST);
    let (server, script) = serve(
        "/v1/messages",
        vec![
            ok(json!({"id": "msg_1", "type": "message", "role": "assistant", "content": [
                {"type": "text", "text": "Let me compute."},
                {"type": "tool_use", "id": "toolu_01", "name": "calc", "input": {"expression": "2+2"}}],
                "stop_reason": "tool_use", "usage": {"input_tokens": 30, "output_tokens": 10}})),
            ok(json!({"content": [{"type": "text", "text": "4"}], "stop_reason": "end_turn",
                      "usage": {"input_tokens": 40, "output_tokens": 1}})),
        ],
    )
    .await;
    let env = vec![("ANTHROPIC_BASE_URL", server.uri()), ("ANTHROPIC_API_KEY", "sk-ant-test".into())];
    let run = eval(&sb, "anthropic/claude-test", &env, &[]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests[0].headers.get("x-api-key").unwrap(), "sk-ant-test");
    assert_eq!(requests[0].headers.get("anthropic-version").unwrap(), "2023-06-01");
    let bodies = script.bodies.lock().unwrap().clone();
    assert_eq!(bodies[0]["system"], "Be brief.");
    assert_eq!(bodies[0]["messages"], json!([{"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}]));
    assert!(bodies[0]["tools"][0]["input_schema"].is_object());
    assert!(bodies[0]["max_tokens"].as_u64().unwrap() > 0);
    let turn = &bodies[1]["messages"];
    assert_eq!(
        turn[1]["content"][1],
        json!({"type": "tool_use", "id": "toolu_01", "name": "calc", "input": {"expression": "2+2"}})
    );
    assert_eq!(turn[2]["content"][0]["type"], "tool_result");
    assert_eq!(turn[2]["content"][0]["tool_use_id"], "toolu_01");
    assert_eq!(turn[2]["content"][0]["is_error"], false);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_429_with_retry_after_is_waited_out_then_retried() {
    let sb = sandbox(FAST);
    let limited = ResponseTemplate::new(429)
        .insert_header("retry-after", "1")
        .set_body_json(json!({"error": {"message": "slow down"}}));
    let (server, _) = serve("/v1/chat/completions", vec![limited, ok(openai_text("4"))]).await;
    let run = eval(&sb, "openai/gpt-test", &openai_env(&server), &[]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let call = &model_calls(&sb)[0];
    assert_eq!(call["attempts"], 2);
    // The configured backoff is 10 ms; only Retry-After explains a wait of a second.
    assert!(call["latency_ms"].as_f64().unwrap() >= 950.0, "{call}");
}

#[tokio::test(flavor = "multi_thread")]
async fn rate_limits_without_retry_after_end_the_episode_unscored_as_rate_limited() {
    let sb = sandbox(FAST);
    let (server, _) = serve("/v1/chat/completions", vec![ResponseTemplate::new(429)]).await;
    let run = eval(&sb, "openai/gpt-test", &openai_env(&server), &[]).await;
    assert_eq!(run.code, 3, "{run:?}");
    assert_eq!(server.received_requests().await.unwrap().len(), 3, "one attempt and max_retries: 2");
    let finished = of_type(&sb.events(), "episode_finished")[0].clone();
    assert_eq!(finished["outcome"]["status"], "unscored");
    assert_eq!(finished["outcome"]["cause"], "rate_limited");
    assert_eq!(model_calls(&sb)[0]["attempts"], 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_500_then_success_is_scored() {
    let sb = sandbox(FAST);
    let (server, _) = serve("/v1/chat/completions", vec![ResponseTemplate::new(500), ok(openai_text("4"))]).await;
    let run = eval(&sb, "openai/gpt-test", &openai_env(&server), &[]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(model_calls(&sb)[0]["attempts"], 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_response_that_hangs_past_the_timeout_is_a_provider_error() {
    let sb = sandbox("retry_base_s: 0.01, timeout_s: 0.3, max_retries: 1");
    let slow = ok(openai_text("4")).set_delay(Duration::from_secs(5));
    let (server, _) = serve("/v1/chat/completions", vec![slow]).await;
    let run = eval(&sb, "openai/gpt-test", &openai_env(&server), &[]).await;
    assert_eq!(run.code, 3, "{run:?}");
    let call = &model_calls(&sb)[0];
    assert_eq!(call["cause"], "provider_error");
    assert!(call["error"].as_str().unwrap().contains("within 0.3s"), "{call}");
    assert_eq!(call["attempts"], 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn bodies_that_are_not_json_or_have_no_choices_are_provider_errors() {
    for (body, expect) in [
        (ResponseTemplate::new(200).set_body_string("<html>gateway</html>"), "not JSON"),
        (ok(json!({"choices": []})), "empty `choices`"),
    ] {
        let sb = sandbox(FAST);
        let (server, _) = serve("/v1/chat/completions", vec![body]).await;
        let run = eval(&sb, "openai/gpt-test", &openai_env(&server), &[]).await;
        assert_eq!(run.code, 3, "{run:?}");
        let call = &model_calls(&sb)[0];
        assert_eq!(call["cause"], "provider_error");
        assert!(call["error"].as_str().unwrap().contains(expect), "{call}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_truncated_body_is_retried() {
    // A server that promises 500 bytes and sends 20, then answers properly.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let good = openai_text("4").to_string();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for (i, stream) in listener.incoming().take(2).enumerate() {
            let mut stream = stream.unwrap();
            let mut buf = [0u8; 65536];
            let _ = stream.read(&mut buf);
            let reply = if i == 0 {
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{\"choices\": [{\"mess"
                    .to_string()
            } else {
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{good}",
                    good.len()
                )
            };
            let _ = stream.write_all(reply.as_bytes());
        }
    });
    let sb = sandbox(FAST);
    let env = vec![("OPENAI_BASE_URL", format!("http://{addr}/v1")), ("OPENAI_API_KEY", "k".into())];
    let run = eval(&sb, "openai/gpt-test", &env, &[]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(model_calls(&sb)[0]["attempts"], 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn invalid_json_arguments_are_the_models_answer_a_validation_error() {
    let sb = sandbox(FAST);
    let (server, _) = serve(
        "/v1/chat/completions",
        vec![ok(openai_calls(&[("c9", "calc", "{\"expression\": 2+2")])), ok(openai_text("4"))],
    )
    .await;
    let run = eval(&sb, "openai/gpt-test", &openai_env(&server), &[]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let obs = tool_observations(&sb.events())[0].clone();
    assert_eq!(obs["error"]["type"], "ValidationError", "{obs}");
    assert!(obs["error"]["message"].as_str().unwrap().contains("not valid JSON"), "{obs}");
    assert_eq!(of_type(&sb.events(), "episode_finished")[0]["outcome"]["status"], "scored");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_finish_reason_and_missing_usage_are_accepted() {
    let sb = sandbox(FAST);
    let body = json!({"choices": [{"message": {"content": "4"}, "finish_reason": "brand_new_reason"}]});
    let (server, _) = serve("/v1/chat/completions", vec![ok(body)]).await;
    let run = eval(&sb, "openai/gpt-test", &openai_env(&server), &[]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let call = &model_calls(&sb)[0];
    assert_eq!(call["response"]["finish_reason"], "brand_new_reason");
    assert_eq!(call["usage"]["input_tokens"], 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_key_stops_the_run_early_and_says_why() {
    let sb = sandbox(FAST);
    let tasks: String = (0..40).map(|i| format!("  - {{id: t{i}, input: q{i}}}\n")).collect();
    sb.write("s.yaml", &format!("suite: m\nenvironment: kv\nscorers: [{{equals: \"4\"}}]\ntasks:\n{tasks}"));
    let refused = ResponseTemplate::new(401).set_body_json(
        json!({"error": {"message": "Incorrect API key provided: sk-test-key-123", "type": "invalid_request_error"}}),
    );
    let (server, _) = serve("/v1/chat/completions", vec![refused]).await;
    let run = eval(&sb, "openai/gpt-test", &openai_env(&server), &["-j", "2"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("API key was refused") && run.stderr.contains("OPENAI_API_KEY"), "{run:?}");
    assert!(
        !run.stderr.contains("sk-test-key-123") && !run.stdout.contains("sk-test-key-123"),
        "the key was printed: {run:?}"
    );
    let sent = server.received_requests().await.unwrap().len();
    assert!(sent <= 4, "{sent} requests were sent after the key was refused");
    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    assert!(finished.iter().any(|f| f["outcome"]["cause"] == "configuration_error"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_key_is_a_usage_error_before_anything_runs() {
    let sb = sandbox(FAST);
    let run = eval(&sb, "openai/gpt-test", &[], &[]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("OPENAI_API_KEY"), "{run:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn ollama_and_config_providers_speak_the_openai_format() {
    let sb = sandbox(FAST);
    let (server, _) = serve("/v1/chat/completions", vec![ok(openai_text("4"))]).await;
    let host = server.uri().trim_start_matches("http://").to_owned();
    let run = eval(&sb, "ollama/qwen-test", &[("OLLAMA_HOST", host)], &[]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let requests = server.received_requests().await.unwrap();
    assert!(requests[0].headers.get("authorization").is_none());
    assert_eq!(requests[0].body_json::<Value>().unwrap()["model"], "qwen-test");

    let sb = sandbox(FAST);
    sb.write("local.yaml", &format!("providers:\n  local: {{api: openai, base_url: \"{}/v1\"}}\n", server.uri()));
    let run = eval(&sb, "local/tiny", &[], &["--config", "local.yaml"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(of_type(&sb.events(), "episode_started")[0]["model"], "local/tiny");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_cache_serves_an_unchanged_request_without_calling_the_provider() {
    let sb = sandbox(FAST);
    let (server, _) = serve("/v1/chat/completions", vec![ok(openai_text("4"))]).await;
    let cache = sb.path().join("cache").display().to_string();
    let run = eval(&sb, "openai/gpt-test", &openai_env(&server), &["--cache", "--cache-dir", &cache]).await;
    assert_eq!(run.code, 0, "{run:?}");
    std::fs::remove_dir_all(sb.path().join("results")).unwrap();
    let run = eval(&sb, "openai/gpt-test", &openai_env(&server), &["--cache", "--cache-dir", &cache]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(server.received_requests().await.unwrap().len(), 1, "the second run called the provider");
    assert_eq!(model_calls(&sb)[0]["cache_hit"], true);
    // Expired entries are not served.
    std::fs::remove_dir_all(sb.path().join("results")).unwrap();
    let run =
        eval(&sb, "openai/gpt-test", &openai_env(&server), &["--cache", "--cache-dir", &cache, "--cache-ttl-s", "0"])
            .await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(server.received_requests().await.unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn two_backends_run_the_same_episodes_side_by_side() {
    let sb = sandbox(FAST);
    let (server, _) = serve("/v1/chat/completions", vec![ok(openai_text("4"))]).await;
    let mut env = openai_env(&server);
    env.push(("OLLAMA_HOST", server.uri()));
    let run = eval(&sb, "openai/gpt-test", &env, &["--model", "ollama/qwen-test"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let started = of_type(&events, "episode_started");
    let mut pairs: Vec<(String, String)> =
        started.iter().map(|e| (e["task_id"].as_str().unwrap().into(), e["model"].as_str().unwrap().into())).collect();
    pairs.sort();
    assert_eq!(pairs, [("t".into(), "ollama/qwen-test".into()), ("t".into(), "openai/gpt-test".into())]);
    assert!(run.stdout.lines().any(|l| l.starts_with("m ") && l.contains("ollama/qwen-test")), "{run:?}");
    assert!(run.stdout.lines().any(|l| l.starts_with("m ") && l.contains("openai/gpt-test")), "{run:?}");
    let models: Vec<Value> = server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| r.body_json::<Value>().unwrap()["model"].clone())
        .collect();
    assert!(models.contains(&json!("gpt-test")) && models.contains(&json!("qwen-test")), "{models:?}");
}

/// Regression: a provider that echoes the key back must not put it in the log.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_echoed_by_the_provider_is_redacted_from_the_logged_body() {
    let sb = sandbox(FAST);
    let echo = ResponseTemplate::new(401)
        .set_body_json(json!({"error": {"message": "bad key", "got": "Bearer sk-test-key-123"}}));
    let (server, _) = serve("/v1/chat/completions", vec![echo]).await;
    let run = eval(&sb, "openai/gpt-test", &openai_env(&server), &[]).await;
    assert_eq!(run.code, 2, "{run:?}");
    let log = std::fs::read_to_string(sb.path().join("results/test/events.jsonl")).unwrap();
    assert!(!log.contains("sk-test-key-123"), "the key reached the log");
    assert!(log.contains("Bearer [REDACTED]"), "the body was logged, redacted");
}

/// Regression: `retry-after-ms: inf` crashed the runner.
#[tokio::test(flavor = "multi_thread")]
async fn an_absurd_retry_after_is_capped_not_fatal() {
    let sb = sandbox("retry_base_s: 0.01, retry_max_s: 0.05, max_retries: 1, timeout_s: 2");
    let limited = ResponseTemplate::new(429).insert_header("retry-after-ms", "inf");
    let (server, _) = serve("/v1/chat/completions", vec![limited, ok(openai_text("4"))]).await;
    let run = eval(&sb, "openai/gpt-test", &openai_env(&server), &[]).await;
    assert_eq!(run.code, 0, "{run:?}");
}

/// Regression: token counts near u64::MAX overflowed.
#[tokio::test(flavor = "multi_thread")]
async fn huge_token_counts_saturate() {
    let sb = sandbox(FAST);
    let body = json!({"choices": [{"message": {"content": "4"}}], "usage": {"prompt_tokens": u64::MAX, "completion_tokens": 5}});
    let (server, _) = serve("/v1/chat/completions", vec![ok(body)]).await;
    let run = eval(&sb, "openai/gpt-test", &openai_env(&server), &[]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let finished = of_type(&sb.events(), "episode_finished")[0].clone();
    assert_eq!(finished["usage"]["input_tokens"], u64::MAX);
}

/// Regression: one task's 400 (a prompt too long, say) stopped the whole run.
#[tokio::test(flavor = "multi_thread")]
async fn a_single_bad_request_does_not_stop_the_run() {
    let sb = sandbox(FAST);
    let tasks: String = (0..3).map(|i| format!("  - {{id: t{i}, input: q{i}}}\n")).collect();
    sb.write("s.yaml", &format!("suite: m\nenvironment: kv\nscorers: [{{equals: \"4\"}}]\ntasks:\n{tasks}"));
    let too_long = ResponseTemplate::new(400).set_body_json(json!({"error": {"message": "context_length_exceeded"}}));
    let (server, _) = serve("/v1/chat/completions", vec![too_long, ok(openai_text("4"))]).await;
    let run = eval(&sb, "openai/gpt-test", &openai_env(&server), &["-j", "1"]).await;
    assert_eq!(run.code, 3, "one unscored episode, the others scored: {run:?}");
    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished.len(), 3);
    assert_eq!(finished.iter().filter(|f| f["outcome"]["status"] == "scored").count(), 2);
}

/// Regression: an outage that lasted past the episode's time limit was scored as the
/// agent's failure (`time_limit`), with no record of the 503s.
#[tokio::test(flavor = "multi_thread")]
async fn an_outage_past_the_time_limit_is_the_providers_fault() {
    let sb = sandbox("retry_base_s: 0.2, retry_max_s: 0.5, max_retries: 50, timeout_s: 5");
    sb.write(
        "s.yaml",
        &SUITE.replace("agent: {system: Be brief.}", "agent: {system: Be brief.}\nlimits: {time_s: 1.5}"),
    );
    let (server, _) = serve("/v1/chat/completions", vec![ResponseTemplate::new(503)]).await;
    let run = eval(&sb, "openai/gpt-test", &openai_env(&server), &[]).await;
    assert_eq!(run.code, 3, "{run:?}");
    let finished = of_type(&sb.events(), "episode_finished")[0].clone();
    assert_eq!(finished["outcome"]["status"], "unscored", "{finished}");
    assert_eq!(finished["outcome"]["cause"], "provider_error");
    let call = model_calls(&sb)[0].clone();
    assert!(call["attempts"].as_u64().unwrap() >= 2, "{call}");
    assert!(call["error"].as_str().unwrap().contains("time ran out"), "{call}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_with_several_models_is_compared_within_itself() {
    let sb = sandbox(FAST);
    let tasks: String =
        (0..6).map(|i| format!("  - {{id: t{i}, input: What is 2+2?, mock: [{{text: \"4\"}}]}}\n")).collect();
    sb.write("s.yaml", &format!("suite: m\nenvironment: kv\nscorers: [{{equals: \"4\"}}]\ntasks:\n{tasks}"));
    let (server, _) = serve("/v1/chat/completions", vec![ok(openai_text("5"))]).await;
    let run = eval(&sb, "mock", &openai_env(&server), &["--model", "openai/gpt-test"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let cmp = sb.run(&["compare", "results/test", "--csv", "cmp.csv"]);
    assert_eq!(cmp.code, 0, "{cmp:?}");
    assert!(cmp.stdout.contains("mock vs openai/gpt-test: 6 passed in A, failed in B: m/t0, m/t1"), "{cmp:?}");
    let pairs = std::fs::read_to_string(sb.path().join("cmp.pairs.csv")).unwrap();
    // Exact McNemar with 6 discordant pairs all one way: 2 * (1/2)^6.
    let row: Vec<&str> = pairs.lines().nth(1).unwrap().split(',').collect();
    assert_eq!(row[..8], ["mock", "openai/gpt-test", "6", "6", "0", "1", "0", "-1"], "{pairs}");
    assert!((row[8].parse::<f64>().unwrap() - 0.03125).abs() < 1e-12, "{pairs}");
    // The mean score difference stands; with 6 tasks the bootstrap's interval and p do not.
    assert_eq!(row[9..13], ["-1", "", "", ""], "{pairs}");
    assert!(cmp.stdout.contains("n=6 <10"), "{cmp:?}");
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn a_second_ctrl_c_exits_at_once_while_the_first_waits_for_a_grader() {
    use std::io::BufRead as _;
    let sb = sandbox("timeout_s: 120, max_retries: 0");
    sb.write(
        "s.yaml",
        "suite: g\nenvironment: kv\ngrader: {model: openai/gpt-test}\nscorers: [{llm_rubric: The answer is 4.}]\ntasks:\n  - {id: t, input: q, mock: [{text: \"4\"}]}\n",
    );
    // The grader answers only after two minutes: a first Ctrl-C lets the scoring in flight
    // finish (the agent's work is done), so only a second one ends the process now.
    let slow = ok(openai_text("{\"score\": 1}")).set_delay(std::time::Duration::from_secs(120));
    let (server, _) = serve("/v1/chat/completions", vec![slow]).await;
    let mut cmd = sb.command();
    cmd.args(["eval", "s.yaml", "--model", "mock", "--run-id", "test", "--out", "results", "-q"])
        .envs(openai_env(&server))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let started = std::time::Instant::now();
    while server.received_requests().await.unwrap_or_default().is_empty() {
        assert!(started.elapsed().as_secs() < 30, "the grader was never called");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let stderr = child.stderr.take().unwrap();
    let (lines, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    let interrupt = || unsafe {
        // SAFETY: sends SIGINT to the child we spawned.
        libc::kill(child.id() as i32, libc::SIGINT);
    };
    interrupt();
    let first = std::iter::from_fn(|| seen.recv_timeout(std::time::Duration::from_secs(30)).ok())
        .find(|l| !l.trim().is_empty())
        .expect("a line after the first Ctrl-C");
    assert!(first.contains("Ctrl-C again to quit now"), "{first}");
    interrupt();
    let output = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap()).await.unwrap();
    assert_eq!(output.status.code(), Some(130));
    assert!(started.elapsed().as_secs() < 60, "it waited for the grader");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!stdout.contains("suite"), "no summary after the second Ctrl-C: {stdout}");
    let events = sb.events();
    assert!(of_type(&events, "run_finished").is_empty(), "the run did not end gracefully");
    assert!(of_type(&events, "episode_finished").is_empty(), "the episode was still being scored");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_recording_that_ended_in_a_provider_error_replays_to_the_same_outcome_and_says_why() {
    let sb = sandbox(FAST);
    let gateway = ResponseTemplate::new(200).set_body_string("<html>gateway</html>");
    let (server, _) = serve("/v1/chat/completions", vec![gateway]).await;
    let run = eval(&sb, "openai/gpt-test", &openai_env(&server), &["--record", "tape.jsonl"]).await;
    assert_eq!(run.code, 3, "{run:?}");
    drop(server);
    let finished = |run: &str| {
        let events = read_jsonl(&sb.path().join(format!("results/{run}/events.jsonl")));
        of_type(&events, "episode_finished")[0]["outcome"].clone()
    };
    let recorded = finished("test");
    assert_eq!(recorded["cause"], "provider_error", "{recorded}");

    for (source, run) in [("replay:results/test", "from-log"), ("replay:tape.jsonl", "from-cassette")] {
        let replay =
            run_with(&sb, &["eval", "s.yaml", "--model", source, "--run-id", run, "--out", "results"], &[]).await;
        assert_eq!(replay.code, 3, "{source}: {replay:?}");
        let outcome = finished(run);
        assert_eq!(outcome["cause"], "provider_error", "{source}: {outcome}");
        let message = outcome["message"].as_str().unwrap_or_default();
        assert!(message.contains("the recorded call failed") && message.contains("not JSON"), "{source}: {outcome}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_base_url_without_a_scheme_is_refused_before_any_episode_runs() {
    let sb = sandbox(FAST);
    let env = [("OPENAI_BASE_URL", "127.0.0.1:9/v1".to_owned()), ("OPENAI_API_KEY", "sk-test-key-123".into())];
    let run = eval(&sb, "openai/gpt-test", &env, &[]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("`127.0.0.1:9/v1` (from OPENAI_BASE_URL) is not an http(s) URL"), "{run:?}");
    assert!(!sb.path().join("results/test").exists(), "nothing ran");
}
