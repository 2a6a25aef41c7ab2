//! Run-wide budgets: scheduling stops before the next episode could cross a cap, the
//! episodes never started are logged as not run (unscored, cause `budget`), the run exits
//! 5 (incomplete), and `--resume` with a larger budget runs the rest. Per-provider caps come
//! from runner.yaml; a cost cap needs prices.

use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::{Run, Sandbox, of_type};

/// `n` tasks, each answered `ok` in one model call.
fn suite(n: usize) -> String {
    let tasks: String = (0..n).map(|i| format!("  - {{id: t{i}, input: q{i}, mock: [{{text: ok}}]}}\n")).collect();
    format!("suite: budgets\nenvironment: kv\nscorers: [{{equals: ok}}]\ntasks:\n{tasks}")
}

/// `runner eval s.yaml --model mock` into `results/test`, with `extra` flags.
fn eval_with(sb: &Sandbox, extra: &[&str]) -> Run {
    let args = ["eval", "s.yaml", "--model", "mock", "--run-id", "test", "--out", "results"];
    sb.run(&[&args[..], extra].concat())
}

fn not_run(events: &[Value]) -> usize {
    of_type(events, "episode_finished")
        .into_iter()
        .filter(|e| e["outcome"]["cause"] == "budget" && e["termination"] == "not_run")
        .count()
}

#[test]
fn a_call_budget_stops_scheduling_and_a_larger_one_resumes_the_rest() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(6));
    let base = ["eval", "s.yaml", "--model", "mock", "--out", "results", "-j", "1"];
    let run = sb.run(&[&base[..], &["--run-id", "test", "--max-model-calls", "3"]].concat());
    assert_eq!(run.code, 5, "incomplete: {run:?}");
    let events = sb.events();
    assert_eq!(of_type(&events, "model_call").len(), 3, "no call beyond the cap");
    assert_eq!(not_run(&events), 3);
    let reached = of_type(&events, "budget_reached");
    assert_eq!(reached.len(), 1, "{reached:?}");
    assert_eq!((reached[0]["scope"].as_str(), reached[0]["cap"].as_str()), (Some("run"), Some("max_model_calls")));
    assert!(run.stdout.contains("not run: 3 of 6 planned episodes"), "{run:?}");
    assert!(run.stdout.contains("3/6"), "coverage beside the rate: {run:?}");
    assert!(run.stderr.contains("incomplete: 3 of 6 planned episodes not run"), "{run:?}");

    // The same budget again: the kept episodes already spent it, nothing more runs.
    let again = sb.run(&[&base[..], &["--resume", "results/test", "--max-model-calls", "3"]].concat());
    assert_eq!(again.code, 5, "{again:?}");
    assert_eq!(of_type(&sb.events(), "model_call").len(), 3);

    let resumed = sb.run(&[&base[..], &["--resume", "results/test", "--max-model-calls", "6"]].concat());
    assert_eq!(resumed.code, 0, "{resumed:?}");
    assert_eq!(of_type(&sb.events(), "model_call").len(), 6);
    assert!(resumed.stdout.contains("6/6"), "{resumed:?}");
    assert!(!resumed.stdout.contains("not run:"), "{resumed:?}");
}

#[test]
fn episodes_in_flight_count_against_the_budget() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(20));
    // Four at once: an episode starts only if the calls made, plus one for each episode in
    // flight and one for itself, stay within ten.
    let run = eval_with(&sb, &["--max-model-calls", "10", "-j", "4"]);
    assert_eq!(run.code, 5, "{run:?}");
    let events = sb.events();
    let calls = of_type(&events, "model_call").len();
    assert!((4..=10).contains(&calls), "{calls} calls");
    assert_eq!(not_run(&events) + calls, 20);
}

fn answer() -> Value {
    json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 20, "completion_tokens": 2}})
}

async fn local_server() -> MockServer {
    let server = MockServer::start().await;
    let ok = ResponseTemplate::new(200).set_body_json(answer());
    Mock::given(method("POST")).and(path("/v1/chat/completions")).respond_with(ok).mount(&server).await;
    server
}

async fn eval(sb: &Sandbox, args: &[&str]) -> Run {
    let mut cmd = sb.command();
    cmd.args(["eval", "s.yaml", "--config", "local.yaml", "--run-id", "test", "--out", "results", "-j", "1"])
        .args(args)
        .env_remove("RUNNER_CONFIG");
    tokio::task::spawn_blocking(move || Run::from(cmd.output().unwrap())).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_providers_cost_cap_stops_its_episodes_and_not_the_others() {
    let server = local_server().await;
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(4));
    // 22 tokens a call at $1000 per million: $0.022 an episode; a cap of $0.05 holds two.
    sb.write(
        "local.yaml",
        &format!(
            "providers:\n  local: {{api: openai, base_url: \"{}/v1\", max_retries: 0, budget: {{max_cost_usd: 0.05}}}}\nprices:\n  local/tiny: {{input: 1000, output: 1000}}\n",
            server.uri()
        ),
    );
    let run = eval(&sb, &["--model", "local/tiny", "--model", "mock"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    let events = sb.events();
    let calls = of_type(&events, "model_call");
    assert_eq!(calls.iter().filter(|c| c["model"] == "local/tiny").count(), 2);
    assert_eq!(calls.iter().filter(|c| c["model"] == "mock").count(), 4, "mock's provider has no cap");
    assert_eq!(not_run(&events), 2);
    let reached = of_type(&events, "budget_reached");
    assert_eq!(reached[0]["scope"], "provider local");
    assert_eq!(reached[0]["cap"], "max_cost_usd");
    let finished = of_type(&events, "episode_finished");
    let message = finished.iter().find(|e| e["outcome"]["cause"] == "budget").unwrap()["outcome"]["message"].clone();
    assert!(message.as_str().unwrap().contains("providers.local.budget.max_cost_usd"), "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_budget_counts_the_providers_usage() {
    let server = local_server().await;
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(4));
    sb.write("local.yaml", &format!("providers:\n  local: {{api: openai, base_url: \"{}/v1\"}}\n", server.uri()));
    // 22 tokens an episode: two fit in 50, a third would make 66.
    let run = eval(&sb, &["--model", "local/tiny", "--max-run-tokens", "50"]).await;
    assert_eq!(run.code, 5, "{run:?}");
    let events = sb.events();
    assert_eq!(of_type(&events, "model_call").len(), 2);
    assert_eq!(not_run(&events), 2);
    assert_eq!(of_type(&events, "budget_reached")[0]["cap"], "max_tokens");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cost_cap_on_a_model_without_a_price_is_refused_with_how_to_give_one() {
    let server = local_server().await;
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(1));
    sb.write("local.yaml", &format!("providers:\n  local: {{api: openai, base_url: \"{}/v1\"}}\n", server.uri()));
    let run = eval(&sb, &["--model", "local/tiny", "--max-cost-usd", "1"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("--max-cost-usd needs a price for every model, and `local/tiny` has none")
            && run.stderr.contains("prices: {\"local/tiny\": {input:"),
        "{run:?}"
    );
    assert!(!sb.path().join("results/test").exists(), "nothing ran");
    let run = eval(&sb, &["--model", "mock", "--max-cost-usd", "1"]).await;
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("`mock` has none") && run.stderr.contains("--max-run-tokens"), "{run:?}");
}

#[test]
fn a_hard_budget_cancels_the_episodes_in_flight() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(8));
    // Four at once, each call 0.3 to 0.9 s: the cap of two calls is reached while the two
    // others still wait for their answers; they are cancelled, and the last four never start.
    let run = eval_with(&sb, &["--max-model-calls", "2", "--budget-hard", "-j", "4", "--mock-delay-ms", "300-900"]);
    assert_eq!(run.code, 5, "{run:?}");
    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    let cancelled = finished.iter().filter(|e| e["outcome"]["status"] == "cancelled").count();
    assert!(cancelled >= 1, "episodes in flight were cancelled: {run:?}");
    assert_eq!(not_run(&events), 4);
    assert!(of_type(&events, "budget_reached").iter().any(|e| e["hard"] == true));
}

/// `n` tasks, each two model calls (a tool call, then the answer).
fn two_call_suite(n: usize) -> String {
    let tasks: String = (0..n)
        .map(|i| {
            format!(
                "  - {{id: t{i}, input: q{i}, mock: [{{tool_calls: [{{name: kv_get, arguments: {{key: a}}}}]}}, {{text: ok}}]}}\n"
            )
        })
        .collect();
    format!("suite: budgets\nenvironment: kv\nscorers: [{{equals: ok}}]\ntasks:\n{tasks}")
}

#[test]
fn a_soft_cap_starts_one_episode_before_it_knows_what_one_spends() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &two_call_suite(8));
    // Eight may run at once, but nothing has finished to say what an episode spends: the
    // first runs alone (2 calls); then 2 spent + 2 for the next > 3, and scheduling stops.
    let run = eval_with(&sb, &["--max-model-calls", "3", "-j", "8"]);
    assert_eq!(run.code, 5, "{run:?}");
    let events = sb.events();
    assert_eq!(of_type(&events, "model_call").len(), 2, "never past the cap: {run:?}");
    assert_eq!(not_run(&events), 7);
    assert_eq!(of_type(&events, "budget_reached").len(), 1);
}

#[test]
fn a_hard_cap_that_cancels_every_episode_leaves_the_run_incomplete() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &two_call_suite(8));
    // All eight start at once; the third call reaches the cap and cancels them all.
    let run = eval_with(&sb, &["--max-model-calls", "3", "--budget-hard", "-j", "8", "--mock-delay-ms", "100-300"]);
    assert_eq!(run.code, 5, "incomplete, not passed: {run:?}");
    assert!(run.stderr.contains("cancelled by --budget-hard"), "{run:?}");
}

#[test]
fn run_wide_caps_are_refused_with_a_shard() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(2));
    let run = eval_with(&sb, &["--max-model-calls", "3", "--shard", "1/2"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("with --shard each shard would spend up to the cap"), "{run:?}");
}

#[test]
fn an_epoch_a_budget_cut_short_is_the_last_epochs_auto_plans() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(8));
    // One call an episode, three allowed: epoch 1 runs three episodes and five are not run;
    // no second or third epoch is planned (each would log eight more not-run episodes).
    let run = eval_with(
        &sb,
        &["--max-model-calls", "3", "-j", "1", "--epochs", "auto", "--ci-width", "0.1", "--max-epochs", "3"],
    );
    assert_eq!(run.code, 5, "{run:?}");
    let events = sb.events();
    assert_eq!(of_type(&events, "episode_finished").len(), 8, "one epoch planned: {run:?}");
    assert_eq!(not_run(&events), 5);
    assert!(of_type(&events, "epochs_decided").is_empty(), "no look after a cut epoch");
}

#[test]
fn an_episode_a_hard_budget_cancels_ends_with_termination_budget_not_user_stop() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &two_call_suite(8));
    // All eight start at once; the third call reaches the cap and cancels the others.
    let run = eval_with(&sb, &["--max-model-calls", "3", "--budget-hard", "-j", "8", "--mock-delay-ms", "100-300"]);
    assert_eq!(run.code, 5, "{run:?}");
    let events = sb.events();
    let cancelled: Vec<&Value> =
        of_type(&events, "episode_finished").into_iter().filter(|e| e["outcome"]["status"] == "cancelled").collect();
    assert!(!cancelled.is_empty(), "{run:?}");
    for finished in cancelled {
        assert_eq!(finished["termination"], "budget", "nobody pressed Ctrl-C: {finished}");
    }
}
