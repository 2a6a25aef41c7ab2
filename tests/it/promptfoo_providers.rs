//! promptfoo's providers beyond the model APIs, against real local servers: an `http`
//! provider renders its request from the prompt and the test's vars and reads the answer
//! with `transformResponse`; `similar` asks an embeddings endpoint in the OpenAI wire format
//! and compares by cosine; a provider's or a prompt's `config` sets the sampling.

use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::{Run, Sandbox, of_type, read_jsonl};

/// Each test's episode passed or failed, in the order of the tests (`test-1`, …).
fn verdicts(events: &[Value]) -> Vec<Option<bool>> {
    let started = of_type(events, "episode_started");
    let mut tests: Vec<(String, Option<bool>)> = started
        .iter()
        .map(|s| {
            let finished = of_type(events, "episode_finished")
                .into_iter()
                .find(|f| f["episode_id"] == s["episode_id"])
                .and_then(|f| f["outcome"]["passed"].as_bool());
            (s["task_id"].as_str().unwrap_or_default().to_owned(), finished)
        })
        .collect();
    tests.sort_by_key(|(id, _)| id.trim_start_matches("test-").parse::<u32>().unwrap_or(0));
    tests.into_iter().map(|(_, v)| v).collect()
}

async fn run(sb: &Sandbox, args: &[&str]) -> Run {
    let mut cmd = sb.command();
    cmd.args(args).env_remove("RUNNER_CONFIG");
    tokio::task::spawn_blocking(move || Run::from(cmd.output().unwrap())).await.unwrap()
}

/// A translation service: answers `{"result": {"choices": [{"text": …}]}}`, "Bonjour" for
/// French and "Hund" otherwise, and keeps each request.
/// Each request's body and its `X-Team` header.
type Seen = Arc<Mutex<Vec<(Value, Option<String>)>>>;

#[derive(Clone, Default)]
struct Translator {
    seen: Seen,
}

impl Respond for Translator {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: Value = request.body_json().unwrap_or(Value::Null);
        let team = request.headers.get("x-team").and_then(|v| v.to_str().ok()).map(String::from);
        let text = if body["lang"] == "French" { "Bonjour" } else { "Hund" };
        self.seen.lock().unwrap().push((body, team));
        ResponseTemplate::new(200).set_body_json(json!({"result": {"choices": [{"text": text}]}}))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http_provider_sends_the_rendered_request_and_reads_the_answer_with_transform_response() {
    let server = MockServer::start().await;
    let translator = Translator::default();
    Mock::given(method("POST")).and(path("/generate")).respond_with(translator.clone()).mount(&server).await;
    let sb = Sandbox::new();
    let config = format!(
        "prompts: ['Translate {{{{word}}}} into {{{{language}}}}']
providers:
  - id: http
    label: translator
    config:
      url: {}/generate
      method: POST
      headers: {{X-Team: evals}}
      body: {{q: '{{{{prompt}}}}', lang: '{{{{language}}}}'}}
      transformResponse: 'json.result.choices[0].text'
tests:
  - vars: {{word: hello, language: French}}
    assert: [{{type: equals, value: Bonjour}}]
  - vars: {{word: cat, language: German}}
    assert: [{{type: contains, value: Katze}}]
",
        server.uri()
    );
    sb.write("promptfooconfig.yaml", &config);
    let done = run(&sb, &["eval", "promptfooconfig.yaml", "--run-id", "h", "--out", "results", "-q", "-j", "1"]).await;
    // One of two passes; without a gate the run still succeeds.
    assert_eq!(done.code, 0, "{done:?}");
    let seen = translator.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [
            (json!({"q": "Translate hello into French", "lang": "French"}), Some("evals".to_owned())),
            (json!({"q": "Translate cat into German", "lang": "German"}), Some("evals".to_owned())),
        ]
    );
    let events = read_jsonl(&sb.path().join("results/h/events.jsonl"));
    assert_eq!(verdicts(&events), [Some(true), Some(false)]);
    let started = of_type(&events, "episode_started");
    assert!(started.iter().all(|e| e["model"] == "http/translator"), "{started:?}");
    let call = of_type(&events, "model_call")[0].clone();
    assert_eq!(call["response"]["text"], "Bonjour", "{call}");
    assert_eq!(call["raw_response"]["result"]["choices"][0]["text"], "Bonjour", "{call}");
}

#[test]
fn a_transform_response_runner_cannot_read_is_refused_at_its_line() {
    let sb = Sandbox::new();
    sb.write(
        "promptfooconfig.yaml",
        "prompts: ['{{q}}']
providers:
  - id: https://example.invalid/api
    config:
      transformResponse: 'json.output.trim()'
tests:
  - vars: {q: hi}
    assert: [{type: equals, value: hi}]
",
    );
    let refused = sb.run(&["validate", "promptfooconfig.yaml"]);
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(
        refused.stderr.contains("promptfooconfig.yaml:5:7: providers[0].config.transformResponse:")
            && refused.stderr.contains("`json.output.trim()` is more than a path"),
        "{refused:?}"
    );
}

/// Serves `/v1/embeddings` with fixed vectors per text, and keeps each request.
#[derive(Clone, Default)]
struct Embeddings {
    seen: Arc<Mutex<Vec<Value>>>,
}

impl Respond for Embeddings {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: Value = request.body_json().unwrap_or(Value::Null);
        self.seen.lock().unwrap().push(body.clone());
        let vector = |text: &str| match text {
            "Paris is the capital of France." => json!([1.0, 0.0, 0.0]),
            "The capital of France is Paris." => json!([0.8, 0.6, 0.0]),
            "Bananas are yellow." => json!([0.0, 0.6, 0.8]),
            _ => json!([0.0, 0.0, 1.0]),
        };
        let inputs = body["input"].as_array().cloned().unwrap_or_default();
        // Given back in reverse order, each with its index, as servers may.
        let data: Vec<Value> = inputs
            .iter()
            .enumerate()
            .rev()
            .map(|(i, t)| json!({"object": "embedding", "index": i, "embedding": vector(t.as_str().unwrap_or(""))}))
            .collect();
        ResponseTemplate::new(200).set_body_json(json!({"object": "list", "data": data, "model": body["model"]}))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn similar_compares_embeddings_from_the_configured_endpoint_by_cosine() {
    let server = MockServer::start().await;
    let embeddings = Embeddings::default();
    Mock::given(method("POST")).and(path("/v1/embeddings")).respond_with(embeddings.clone()).mount(&server).await;
    let sb = Sandbox::new();
    // Under echo the answer is the `answer` var. Cosines, by hand:
    //   (0.8, 0.6, 0)·(1, 0, 0) = 0.8 (both of length 1): similar at 0.75 passes, at 0.85 fails;
    //   (0, 0.6, 0.8)·(1, 0, 0) = 0: similar fails, not-similar passes.
    let config = format!(
        "prompts: ['{{{{answer}}}}']
providers: [echo]
defaultTest:
  options:
    provider: {{id: 'openai:embedding:fixed-3', config: {{apiBaseUrl: '{}/v1'}}}}
tests:
  - vars: {{answer: The capital of France is Paris.}}
    assert: [{{type: similar, value: Paris is the capital of France.}}]
  - vars: {{answer: The capital of France is Paris.}}
    assert: [{{type: similar, value: Paris is the capital of France., threshold: 0.85}}]
  - vars: {{answer: Bananas are yellow.}}
    assert: [{{type: similar, value: Paris is the capital of France.}}]
  - vars: {{answer: Bananas are yellow.}}
    assert: [{{type: not-similar, value: Paris is the capital of France.}}]
",
        server.uri()
    );
    sb.write("promptfooconfig.yaml", &config);
    let done = run(&sb, &["eval", "promptfooconfig.yaml", "--run-id", "s", "--out", "results", "-q"]).await;
    assert_eq!(done.code, 0, "{done:?}");
    let events = read_jsonl(&sb.path().join("results/s/events.jsonl"));
    assert_eq!(verdicts(&events), [Some(true), Some(false), Some(false), Some(true)]);
    let seen = embeddings.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 4);
    assert!(seen.iter().all(|b| b["model"] == "fixed-3"), "{seen:?}");
    let scores = of_type(&events, "score");
    let similar = scores.iter().filter(|s| s["scorer"].as_str().is_some_and(|n| n.ends_with("similar")));
    let mut values: Vec<f64> = similar.filter_map(|s| s["value"].as_f64()).collect();
    values.sort_by(f64::total_cmp);
    // similar scores the cosine (0.8, 0.8, 0); not-similar 1 − cosine (1).
    let expected = [0.0, 0.8, 0.8, 1.0];
    assert_eq!(values.len(), 4, "{scores:?}");
    assert!(values.iter().zip(expected).all(|(got, want)| (got - want).abs() < 1e-9), "{values:?}");
}

#[test]
fn a_providers_config_and_a_prompts_config_set_the_sampling() {
    let sb = Sandbox::new();
    sb.write(
        "promptfooconfig.yaml",
        "prompts:
  - {raw: 'Say {{x}}', label: cold}
  - {raw: 'Say {{x}}!', label: hot, config: {temperature: 1.0, seed: 7}}
providers:
  - {id: echo, config: {temperature: 0, max_tokens: 64}}
tests:
  - vars: {x: hi}
    assert: [{type: contains, value: hi}]
",
    );
    let done = sb.run(&["eval", "promptfooconfig.yaml", "--run-id", "p", "--out", "results", "-q"]);
    assert_eq!(done.code, 0, "{done:?}");
    let events = read_jsonl(&sb.path().join("results/p/events.jsonl"));
    let started = of_type(&events, "episode_started");
    let of = |variant: &str| started.iter().find(|e| e["variant"] == variant).map(|e| e["sampling"].clone());
    assert_eq!(of("cold"), Some(json!({"temperature": 0, "max_tokens": 64})));
    assert_eq!(of("hot"), Some(json!({"temperature": 1.0, "max_tokens": 64, "seed": 7})));

    sb.write(
        "bad.yaml",
        "prompts: ['{{x}}']
providers:
  - {id: echo, config: {temperature: warm}}
tests:
  - vars: {x: hi}
    assert: [{type: contains, value: hi}]
",
    );
    let bad = sb.run(&["validate", "bad.yaml"]);
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(bad.stderr.contains("bad.yaml:3:") && bad.stderr.contains("must be a number"), "{bad:?}");
}

/// A promptfoo test is one completion, as promptfoo runs it: the rendered prompt goes to the
/// model with no tools (no `final_answer` to call, and to cut short), and its text is the
/// output the assertions judge.
#[tokio::test(flavor = "multi_thread")]
async fn a_promptfoo_test_is_one_completion_with_no_tools_offered() {
    let server = MockServer::start().await;
    let answer = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "Bonjour"},
                        "finish_reason": "stop"}], "usage": {"prompt_tokens": 9, "completion_tokens": 1}});
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(ResponseTemplate::new(200).set_body_json(answer))
        .mount(&server)
        .await;
    let sb = Sandbox::new();
    sb.write(
        "promptfooconfig.yaml",
        "prompts: ['Say hello in {{lang}}']
providers: ['openai:chat:tiny']
tests:
  - vars: {lang: French}
    assert: [{type: equals, value: Bonjour}]
",
    );
    let args = ["eval", "promptfooconfig.yaml", "--run-id", "p", "--out", "results", "-q"];
    let done = crate::models::run_with(&sb, &args, &crate::models::openai_env(&server)).await;
    assert_eq!(done.code, 0, "{done:?}");
    let events = read_jsonl(&sb.path().join("results/p/events.jsonl"));
    assert_eq!(verdicts(&events), [Some(true)]);
    let sent = server.received_requests().await.unwrap();
    assert_eq!(sent.len(), 1, "one completion");
    let body: Value = sent[0].body_json().unwrap();
    assert!(body.get("tools").is_none() && body.get("tool_choice").is_none(), "no tools offered: {body}");
    assert_eq!(body["messages"].as_array().unwrap().last().unwrap()["content"], "Say hello in French");
}
