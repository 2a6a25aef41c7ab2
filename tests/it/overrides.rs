//! A real (local) model tried as a new user would: limits overridden from the command line,
//! a slow model that runs out of time, a `mock` grader beside a real model, and a simulated
//! user whose model cannot be opened.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::models::run_with;
use crate::{Sandbox, of_type};

/// Answers with each template in turn, then keeps answering with the last one.
struct Turns {
    turns: Vec<ResponseTemplate>,
    next: AtomicUsize,
}

impl Respond for Turns {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        self.turns[n.min(self.turns.len() - 1)].clone()
    }
}

fn text(answer: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 5}
    }))
}

fn kv_set() -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "kv_set", "arguments": "{\"key\": \"k\", \"value\": \"v\"}"}}
        ]}, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 5}
    }))
}

/// A local OpenAI-compatible server answering `turns` in order, and `local.yaml` naming it
/// as the provider `local` (no key, no retries).
async fn serve(sb: &Sandbox, turns: Vec<ResponseTemplate>) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(Turns { turns, next: AtomicUsize::new(0) })
        .mount(&server)
        .await;
    sb.write(
        "local.yaml",
        &format!(
            "providers:\n  local: {{api: openai, base_url: \"{}/v1\", max_retries: 0, timeout_s: 30}}\n",
            server.uri()
        ),
    );
    server
}

const SUITE: &str = "suite: s\nenvironment: kv\nlimits: {max_steps: 5, time_s: 60}\nscorers: [{includes: \"4\"}]\ntasks:\n  - {id: t, input: What is 2+2?, mock: [{text: \"4\"}]}\n";

/// `runner eval s.yaml --model local/agent` and `extra`, into `results/test`.
async fn eval(sb: &Sandbox, extra: &[&str]) -> crate::Run {
    let args = [&["eval", "s.yaml", "--model", "local/agent", "--config", "local.yaml", "--run-id", "test"][..], extra]
        .concat();
    run_with(sb, &args, &[]).await
}

fn finished(sb: &Sandbox) -> Value {
    of_type(&sb.events(), "episode_finished")[0].clone()
}

fn started(sb: &Sandbox) -> Value {
    of_type(&sb.events(), "run_started")[0].clone()
}

const GRADED: &str = r#"suite: g
environment: kv
grader: {model: mock}
tasks:
  - id: congo
    input: What is the country of the Congo River?
    scorers:
      - llm_rubric: The answer names a country the Congo flows through.
        mock: ["Fine.\n{\"score\": 1}"]
    mock: [{text: "The Democratic Republic of the Congo."}]
"#;

/// Regression: `tasks/graded.yaml` keeps `grader: {model: mock}`, which passed a real
/// model's wrong answer ("capital of France") without a word.
#[tokio::test(flavor = "multi_thread")]
async fn a_mock_grader_of_a_real_models_answers_is_named_first_and_in_the_summary() {
    let sb = Sandbox::new();
    sb.write("s.yaml", GRADED);
    let _server = serve(&sb, vec![text("The capital of France.")]).await;
    let run = eval(&sb, &["--markdown", "summary.md"]).await;
    // The scripted verdict is not taken: the episode is unscored (grader_error).
    assert_eq!(run.code, 3, "{run:?}");
    let markdown = std::fs::read_to_string(sb.path().join("summary.md")).unwrap();
    assert!(markdown.contains("**Warning:**") && markdown.contains("`mock` grader"), "{markdown}");
    let first = run.stderr.lines().find(|l| l.starts_with("warning:")).unwrap_or_default();
    assert!(first.contains("`mock` grader") && first.contains("s.yaml") && first.contains("--grader"), "{run:?}");
    assert!(run.stdout.contains("warning:") && run.stdout.contains("`mock` grader"), "{run:?}");
    let warnings = &started(&sb)["warnings"];
    assert!(warnings[0].as_str().unwrap_or_default().contains("`mock` grader"), "{warnings}");
    // `runner report` reads it back from the log.
    let report = sb.run(&["report", "results/test"]);
    assert!(report.stdout.contains("`mock` grader"), "{report:?}");

    // Under --model mock the verdicts are as scripted as the answers: nothing to say.
    let sb = Sandbox::new();
    sb.write("s.yaml", GRADED);
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(!run.stderr.contains("warning:") && !run.stdout.contains("warning:"), "{run:?}");
    // Nor with a real grader named on the command line.
    let sb = Sandbox::new();
    sb.write("s.yaml", GRADED);
    let _server = serve(&sb, vec![text("The Democratic Republic of the Congo."), text("Right.\n{\"score\": 1}")]).await;
    let run = eval(&sb, &["--grader", "local/judge"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(!run.stderr.contains("mock` grader") && !run.stdout.contains("warning:"), "{run:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn max_steps_and_max_tokens_flags_override_every_suites_limits_and_are_recorded() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let _server = serve(&sb, vec![kv_set(), kv_set(), text("4")]).await;
    let run = eval(&sb, &["--max-steps", "2"]).await;
    assert_eq!(finished(&sb)["termination"], "max_steps", "{run:?}");
    assert_eq!(finished(&sb)["steps"], 2);
    assert_eq!(started(&sb)["limits"], json!({"max_steps": 2}));

    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let _server = serve(&sb, vec![kv_set(), kv_set(), text("4")]).await;
    let run = eval(&sb, &["--max-tokens", "100"]).await;
    assert_eq!(finished(&sb)["termination"], "token_limit", "{run:?}");
    assert_eq!(started(&sb)["limits"], json!({"max_tokens": 100}));

    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(started(&sb).get("limits").is_none(), "no overrides, no field: {}", started(&sb));

    for (flag, value) in
        [("--max-steps", "0"), ("--max-tokens", "0"), ("--time-s", "0"), ("--time-factor", "0"), ("--time-s", "inf")]
    {
        let run = sb.run(&["eval", "s.yaml", "--model", "mock", flag, value]);
        assert_eq!(run.code, 2, "{flag} {value}: {run:?}");
        assert!(run.stderr.contains(flag), "{flag}: {run:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn time_flags_override_and_scale_the_suites_time_limit() {
    let slow = || text("4").set_delay(Duration::from_millis(1500));
    // The suite gives 60 s; --time-s 1 leaves too little for a 1.5 s answer.
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let _server = serve(&sb, vec![kv_set(), slow()]).await;
    let run = eval(&sb, &["--time-s", "1"]).await;
    assert_eq!(finished(&sb)["termination"], "time_limit", "{run:?}");
    assert_eq!(started(&sb)["limits"], json!({"time_s": 1.0}));

    // --time-factor 10 makes those 1 s into 10: the slow answer arrives in time.
    let sb = Sandbox::new();
    sb.write("s.yaml", &SUITE.replace("time_s: 60", "time_s: 1"));
    let _server = serve(&sb, vec![slow()]).await;
    let run = eval(&sb, &["--time-factor", "10"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(finished(&sb)["termination"], "final_answer", "{run:?}");
    assert_eq!(started(&sb)["limits"], json!({"time_factor": 10.0}));
}

/// Regression: a slow but answering model whose call the episode's deadline cut was
/// labelled `provider_error`, the word for an outage, and left unscored.
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_answering_model_cut_by_the_deadline_ends_at_the_time_limit_and_is_scored() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &SUITE.replace("time_s: 60", "time_s: 1.5"));
    let _server = serve(&sb, vec![kv_set(), text("4").set_delay(Duration::from_secs(5))]).await;
    let run = eval(&sb, &[]).await;
    let finish = finished(&sb);
    assert_eq!(finish["termination"], "time_limit", "{run:?}");
    assert_eq!(finish["outcome"]["status"], "scored", "{finish}");
    assert_eq!(finish["outcome"]["passed"], false, "{finish}");
    let calls = of_type(&sb.events(), "model_call").into_iter().cloned().collect::<Vec<_>>();
    let cut = calls.last().unwrap();
    assert_eq!(cut["cause"], "model_too_slow", "{cut}");
    assert!(cut["error"].as_str().unwrap().contains("time ran out"), "{cut}");
}

/// A model that has not answered once cannot be told from a server that hangs: its call cut
/// by the deadline stays the provider's fault, unscored.
#[tokio::test(flavor = "multi_thread")]
async fn a_model_that_never_answered_cut_by_the_deadline_is_still_a_provider_error() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &SUITE.replace("time_s: 60", "time_s: 1"));
    let _server = serve(&sb, vec![text("4").set_delay(Duration::from_secs(5))]).await;
    let run = eval(&sb, &[]).await;
    let finish = finished(&sb);
    assert_eq!(finish["outcome"]["cause"], "provider_error", "{run:?}");
    assert_eq!(finish["termination"], "agent_error", "{finish}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resume_with_other_limit_overrides_is_refused() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let run = sb.run(&["eval", "s.yaml", "--model", "mock", "--run-id", "test", "--max-steps", "3"]);
    assert_eq!(run.code, 0, "{run:?}");
    let run = sb.run(&["eval", "s.yaml", "--model", "mock", "--resume", "test"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("--max-steps 3"), "{run:?}");
    let run = sb.run(&["eval", "s.yaml", "--model", "mock", "--resume", "test", "--max-steps", "3"]);
    assert_eq!(run.code, 0, "{run:?}");
}

const USER_SUITE: &str = r#"suite: u
environment: kv
tasks:
  - id: book
    input: I need a table.
    conversation: true
    user:
      simulated:
        model: anthropic/claude-user
        persona: A diner in a hurry.
        instructions: Two people at 8pm. End with DONE.
        stop: DONE
    mock_user: [{text: "Two at 8. DONE"}]
    scorers: [{includes: booked}]
"#;

/// Regression: a simulated user's model without a key refused a whole multi-suite run with
/// `error: simulated user: provider anthropic needs an API key`, naming no suite.
#[tokio::test(flavor = "multi_thread")]
async fn a_simulated_user_whose_model_cannot_open_is_named_by_file_and_line_and_can_be_replaced() {
    let sb = Sandbox::new();
    sb.write("s.yaml", USER_SUITE);
    let _server = serve(&sb, vec![text("For how many?"), text("You are booked.")]).await;
    let run = eval(&sb, &[]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("s.yaml:9:"), "the line of `model:`: {run:?}");
    assert!(run.stderr.contains("ANTHROPIC_API_KEY") && run.stderr.contains("--user-model"), "{run:?}");

    let run = eval(&sb, &["--user-model", "mock"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let said: Vec<&Value> = of_type(&events, "said").into_iter().filter(|s| s["actor"] == "user").collect();
    assert_eq!(said.last().unwrap()["text"], "Two at 8. DONE", "{said:?}");
    assert_eq!(finished(&sb)["termination"], "user_ended");
}

/// A `check:` scorer may take as long as the episode could: the scaled time limit.
#[test]
fn a_check_scorer_gets_the_time_limit_the_time_factor_gives() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        "suite: s\nenvironment: shell\nlimits: {time_s: 1}\ntasks:\n  - id: t\n    input: wait\n    scorers: [{check: \"sleep 1.5\"}]\n    mock: [{text: done}]\n",
    );
    let run = sb.run(&["eval", "s.yaml", "--model", "mock", "--run-id", "test", "--time-factor", "4"]);
    assert_eq!(run.code, 0, "{run:?}");
    let score = of_type(&sb.events(), "score")[0].clone();
    assert_eq!(score["passed"], true, "{score}");
}

#[test]
fn shards_run_under_other_limit_flags_do_not_merge() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let shard = |i: &str, extra: &[&str]| {
        let id = format!("shard{}", &i[..1]);
        let args = [&["eval", "s.yaml", "--model", "mock", "--run-id", &id, "--shard", i][..], extra].concat();
        let run = sb.run(&args);
        assert_eq!(run.code, 0, "{run:?}");
    };
    shard("1/2", &["--max-steps", "3"]);
    shard("2/2", &[]);
    let run = sb.run(&["merge", "results/shard1", "results/shard2", "--allow-partial"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("--max-steps 3") && run.stderr.contains("same limits"), "{run:?}");
}
