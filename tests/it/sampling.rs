//! Sampling settings per suite and per variant, on the wire: a local server records every
//! request body, and each variant's agent calls carry its own settings over the provider's,
//! are logged with them, and are cached apart.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::{Run, Sandbox, of_type, read_jsonl};

/// Answers "ok" and keeps each request body.
#[derive(Clone, Default)]
struct Recorder {
    bodies: Arc<Mutex<Vec<Value>>>,
}

impl Respond for Recorder {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        self.bodies.lock().unwrap().push(request.body_json().unwrap_or(Value::Null));
        ResponseTemplate::new(200).set_body_json(json!({
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1}
        }))
    }
}

/// Both variants ask the same prompt with the same system prompt: only sampling tells them apart.
const SUITE: &str = "suite: sampled
environment: kv
agent: {sampling: {max_tokens: 50}}
variants:
  cold: {agent: {require_final_answer: false}}
  hot: {agent: {sampling: {temperature: 1.0, max_tokens: 200, seed: 7}}}
scorers: [{equals: ok}]
tasks:
  - {id: t1, input: Say ok.}
";

async fn run(sb: &Sandbox, args: Vec<String>) -> Run {
    let mut cmd = sb.command();
    cmd.args(args).env_remove("RUNNER_CONFIG");
    tokio::task::spawn_blocking(move || Run::from(cmd.output().unwrap())).await.unwrap()
}

fn eval_args(run_id: &str) -> Vec<String> {
    let args = ["eval", "s.yaml", "--model", "local/tiny", "--config", "local.yaml", "-j", "1", "--cache"];
    let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    args.extend(["--cache-dir", "cache", "--run-id", run_id, "--out", "results", "-q"].map(String::from));
    args
}

/// The sampling keys of a request body.
fn sampling_of(body: &Value) -> Value {
    let keys = ["temperature", "top_p", "max_tokens", "seed"];
    Value::Object(keys.iter().filter_map(|k| Some((k.to_string(), body.get(*k)?.clone()))).collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn each_variant_sends_its_own_sampling_over_the_providers_and_is_cached_apart() {
    let server = MockServer::start().await;
    let recorder = Recorder::default();
    Mock::given(method("POST")).and(path("/v1/chat/completions")).respond_with(recorder.clone()).mount(&server).await;
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let provider = format!(
        "providers:\n  local: {{api: openai, base_url: \"{}/v1\", sampling: {{temperature: 0, top_p: 0.5}}}}\n",
        server.uri()
    );
    sb.write("local.yaml", &provider);

    let first = run(&sb, eval_args("one")).await;
    assert_eq!(first.code, 0, "{first:?}");
    let bodies = recorder.bodies.lock().unwrap().clone();
    // The variants run in the file's order: cold, then hot. cold has the suite's max_tokens
    // over the provider's settings; hot its own three over both.
    let sent: Vec<Value> = bodies.iter().map(sampling_of).collect();
    assert_eq!(
        sent,
        [
            json!({"temperature": 0, "top_p": 0.5, "max_tokens": 50}),
            json!({"temperature": 1.0, "top_p": 0.5, "max_tokens": 200, "seed": 7}),
        ],
        "the same prompt under two samplings is two requests, not one cache hit"
    );
    assert_eq!(bodies[0]["messages"], bodies[1]["messages"]);

    let events = read_jsonl(&sb.path().join("results/one/events.jsonl"));
    let started = of_type(&events, "episode_started");
    let by_variant =
        |name: &str| started.iter().find(|e| e["variant"] == name).map(|e| (*e).clone()).unwrap_or(Value::Null);
    assert_eq!(by_variant("cold")["sampling"], json!({"max_tokens": 50}));
    assert_eq!(by_variant("hot")["sampling"], json!({"temperature": 1.0, "max_tokens": 200, "seed": 7}));
    let calls = of_type(&events, "model_call");
    let hot_id = &by_variant("hot")["episode_id"];
    let hot_call = calls.iter().find(|c| &c["episode_id"] == hot_id).unwrap();
    assert_eq!(hot_call["sampling"], json!({"temperature": 1.0, "top_p": 0.5, "max_tokens": 200, "seed": 7}));

    // Run again: each variant's answer comes from its own cache entry, nothing is asked.
    let again = run(&sb, eval_args("two")).await;
    assert_eq!(again.code, 0, "{again:?}");
    assert_eq!(recorder.bodies.lock().unwrap().len(), 2, "both variants were served from the cache");
    let events = read_jsonl(&sb.path().join("results/two/events.jsonl"));
    assert!(of_type(&events, "model_call").iter().all(|c| c["cache_hit"] == true), "{events:?}");
}

#[test]
fn a_sampling_setting_of_the_wrong_type_is_refused_at_its_line() {
    let sb = Sandbox::new();
    let suite = SUITE.replace("temperature: 1.0", "temperature: warm");
    sb.write("s.yaml", &suite);
    let run = sb.run(&["validate", "s.yaml"]);
    assert_ne!(run.code, 0, "{run:?}");
    assert!(
        run.stderr.contains("s.yaml:6:")
            && run.stderr.contains("variants.hot.agent.sampling.temperature")
            && run.stderr.contains("must be a number"),
        "{run:?}"
    );
    sb.write("s.yaml", &SUITE.replace("max_tokens: 50", "messages: []"));
    let run = sb.run(&["validate", "s.yaml"]);
    assert!(run.stderr.contains("s.yaml:3:") && run.stderr.contains("agent.sampling.messages"), "{run:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_providers_sampling_may_ask_for_tool_choice_required() {
    // A weak local model answers in prose unless it must call a tool.
    let server = MockServer::start().await;
    let recorder = Recorder::default();
    Mock::given(method("POST")).and(path("/v1/chat/completions")).respond_with(recorder.clone()).mount(&server).await;
    let sb = Sandbox::new();
    sb.write("s.yaml", "suite: s\nenvironment: kv\nscorers: [{equals: ok}]\ntasks:\n  - {id: t1, input: Say ok.}\n");
    let provider = format!(
        "providers:\n  local: {{api: openai, base_url: \"{}/v1\", sampling: {{tool_choice: required}}}}\n",
        server.uri()
    );
    sb.write("local.yaml", &provider);
    let args =
        ["eval", "s.yaml", "--model", "local/tiny", "--config", "local.yaml", "--run-id", "t", "--out", "results"];
    let run = run(&sb, args.map(String::from).to_vec()).await;
    assert_eq!(run.code, 0, "{run:?}");
    let bodies = recorder.bodies.lock().unwrap().clone();
    assert_eq!(bodies[0]["tool_choice"], "required", "{}", bodies[0]);
}
