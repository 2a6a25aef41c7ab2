//! The noise floor through the binary: a model that passes a task in some epochs and not
//! others gives the summary's variance decomposition, `runner plan` the epochs and tasks a
//! 5-point difference needs, and `compare` says when a green verdict could not have been red.

use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::{Run, Sandbox};

/// Answers the n-th call with the n-th verdict of `pattern` (cycling): `true` is "ok".
struct Pattern {
    calls: AtomicUsize,
    pattern: Vec<bool>,
}

impl Respond for Pattern {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let text = if self.pattern[n % self.pattern.len()] { "ok" } else { "no" };
        ResponseTemplate::new(200).set_body_json(json!({
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 20, "completion_tokens": 2}
        }))
    }
}

fn suite(n: usize) -> String {
    let tasks: String = (0..n).map(|i| format!("  - {{id: t{i}, input: q{i}}}\n")).collect();
    format!("suite: noise\nenvironment: kv\nscorers: [{{equals: ok}}]\ntasks:\n{tasks}")
}

async fn run(sb: &Sandbox, args: &[&str]) -> Run {
    let mut cmd = sb.command();
    cmd.args(args).env_remove("RUNNER_CONFIG");
    tokio::task::spawn_blocking(move || Run::from(cmd.output().unwrap())).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_summary_decomposes_the_variance_and_plan_says_what_five_points_need() {
    // Episodes run in plan order (task by task, epoch after epoch) with -j 1, so the tasks
    // get [1,0], [1,1], [0,0], [1,0], twice over: the hand-computed fixture of
    // `report::power`'s tests. σ²_w = SS_w / (N − T) = (4 · 1·1/2) / (16 − 8) = 0.25;
    // MS_b = 2 · (4 · 0.25) / 7 = 2/7, n0 = 2, σ²_b = (2/7 − 1/4) / 2 = 1/56 = 0.0179.
    // MDE: (1.959964 + 0.841621) · √(2 · 0.25 / (2 · 8)) = 49.5 pts, below the McNemar floor
    // of 8 tasks, P(Binomial(8, δ) ≥ 6) = 0.8 at δ ≈ 0.80: shown 80.x pts.
    let server = MockServer::start().await;
    let pattern = vec![true, false, true, true, false, false, true, false];
    let responder = Pattern { calls: AtomicUsize::new(0), pattern };
    Mock::given(method("POST")).and(path("/v1/chat/completions")).respond_with(responder).mount(&server).await;
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(8));
    sb.write("local.yaml", &format!("providers:\n  local: {{api: openai, base_url: \"{}/v1\"}}\n", server.uri()));
    let eval = [
        "eval",
        "s.yaml",
        "--model",
        "local/tiny",
        "--config",
        "local.yaml",
        "--epochs",
        "2",
        "-j",
        "1",
        "--run-id",
        "test",
        "--out",
        "results",
    ];
    let done = run(&sb, &eval).await;
    assert_eq!(done.code, 0, "{done:?}");
    let noise = done.stdout.lines().find(|l| l.starts_with("noise") && l.contains("0.2500")).unwrap_or_default();
    assert!(noise.contains("0.0179") && noise.contains(" 80."), "{done:?}");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(sb.path().join("results/test/summary.json")).unwrap()).unwrap();
    let cell = &summary["noise"][0];
    assert_eq!(cell["within_task_variance"], 0.25);
    assert!((cell["between_task_variance"].as_f64().unwrap() - 1.0 / 56.0).abs() < 1e-12, "{cell}");

    // Five points: 2 · 0.25 · 2.801585² / 0.05² = 1569.78 episodes a side: 785 tasks of 2
    // epochs; epochs alone cannot do it with 8 tasks; 898 tasks if the task effects are
    // independent (2 · (1/56 + 0.25/2) · 2.801585² / 0.05²).
    let plan = run(&sb, &["plan", "results/test", "--mde", "5"]).await;
    assert_eq!(plan.code, 0, "{plan:?}");
    let row = plan.stdout.lines().find(|l| l.starts_with("noise")).unwrap_or_default();
    assert!(row.contains("more tasks") && row.contains(" 785") && row.ends_with(" 898"), "{plan:?}");
    let refused = run(&sb, &["plan", "results/test", "--mde", "0"]).await;
    assert_eq!(refused.code, 2, "{refused:?}");
}

#[test]
fn compare_says_a_green_verdict_on_too_few_tasks_could_not_have_been_red() {
    let sb = Sandbox::new();
    let tasks: String = (0..4).map(|i| format!("  - {{id: t{i}, input: q{i}, mock: [{{text: ok}}]}}\n")).collect();
    sb.write("s.yaml", &format!("suite: few\nenvironment: kv\nscorers: [{{equals: ok}}]\ntasks:\n{tasks}"));
    for id in ["a", "b"] {
        let done = sb.run(&["eval", "s.yaml", "--model", "mock", "--run-id", id, "--out", "results"]);
        assert_eq!(done.code, 0, "{done:?}");
    }
    let compared = sb.run(&["compare", "results/a", "results/b", "--fail-on-regression"]);
    assert_eq!(compared.code, 0, "{compared:?}");
    assert!(
        compared.stdout.contains(
            "power: b/mock vs a/mock: underpowered: with 4 shared task(s) the exact McNemar test cannot reach p < 0.05"
        ),
        "{compared:?}"
    );
    // The verdict stays the last line.
    assert!(compared.stdout.trim_end().lines().last().unwrap_or_default().starts_with("verdict:"), "{compared:?}");
}

#[test]
fn compare_with_enough_tasks_names_the_drop_it_could_detect() {
    let sb = Sandbox::new();
    let tasks: String = (0..40).map(|i| format!("  - {{id: t{i}, input: q{i}, mock: [{{text: ok}}]}}\n")).collect();
    sb.write("s.yaml", &format!("suite: many\nenvironment: kv\nscorers: [{{equals: ok}}]\ntasks:\n{tasks}"));
    for id in ["a", "b"] {
        let done = sb.run(&["eval", "s.yaml", "--model", "mock", "--run-id", id, "--out", "results"]);
        assert_eq!(done.code, 0, "{done:?}");
    }
    // Forty tasks, no noise: the McNemar floor, P(Binomial(40, δ) ≥ 6) = 0.8, is about 19
    // pts (at δ = 0.2 the mean is 8, sd 2.53: P(X ≥ 6) ≈ 0.84).
    let strict = sb.run(&["compare", "results/a", "results/b", "--tolerance", "0.05"]);
    assert!(strict.stdout.contains("underpowered: a drop of 5.0 pts (the tolerance) is below the 1"), "{strict:?}");
    let loose = sb.run(&["compare", "results/a", "results/b", "--tolerance", "0.3"]);
    assert!(loose.stdout.contains("a drop of 30.0 pts (the tolerance) would have been detected"), "{loose:?}");
}

#[test]
fn epochs_auto_adds_epochs_until_the_interval_is_narrow_and_logs_each_decision() {
    let sb = Sandbox::new();
    let tasks: String = (0..4).map(|i| format!("  - {{id: t{i}, input: q{i}, mock: [{{text: ok}}]}}\n")).collect();
    sb.write("s.yaml", &format!("suite: auto\nenvironment: kv\nscorers: [{{equals: ok}}]\ntasks:\n{tasks}"));
    // Four tasks that always pass; Wilson at level 1 − 0.05/5 (z = 2.576): after one epoch
    // (4/4) [0.376, 1], 0.62 wide; after two (8/8) [0.547, 1], 0.45 wide: narrow enough.
    let args = ["eval", "s.yaml", "--model", "mock", "--run-id", "test", "--out", "results"];
    let done = sb.run(&[&args[..], &["--epochs", "auto", "--ci-width", "0.5", "--max-epochs", "5"]].concat());
    assert_eq!(done.code, 0, "{done:?}");
    let events = sb.events();
    assert_eq!(crate::of_type(&events, "episode_finished").len(), 8, "two epochs of four tasks");
    let decided = crate::of_type(&events, "epochs_decided");
    let decisions: Vec<&str> = decided.iter().map(|e| e["decision"].as_str().unwrap_or_default()).collect();
    assert_eq!(decisions, ["continue", "stop_narrow"], "{decided:?}");
    assert!((decided[1]["low"].as_f64().unwrap() - 0.547).abs() < 0.001, "{:?}", decided[1]);
    assert!((decided[1]["level"].as_f64().unwrap() - 0.99).abs() < 1e-12);

    let sb = Sandbox::new();
    sb.write("s.yaml", &format!("suite: auto\nenvironment: kv\nscorers: [{{equals: ok}}]\ntasks:\n{tasks}"));
    let done = sb.run(&[&args[..], &["--epochs", "auto", "--ci-width", "0.01", "--max-epochs", "3"]].concat());
    assert_eq!(done.code, 0, "{done:?}");
    let events = sb.events();
    assert_eq!(crate::of_type(&events, "episode_finished").len(), 12);
    let last = crate::of_type(&events, "epochs_decided").last().map(|e| e["decision"].clone());
    assert_eq!(last, Some(json!("stop_max_epochs")));

    let refused = sb.run(&[&args[..], &["--ci-width", "0.1"]].concat());
    assert!(refused.code == 2 && refused.stderr.contains("--ci-width goes with --epochs auto"), "{refused:?}");
}

#[test]
fn epochs_auto_decides_each_variant_apart() {
    let sb = Sandbox::new();
    // Under `echo` the answer is the prompt. Variant `yes` asks "ok" of every task: 4/4
    // passes, narrow after two epochs (as in the test above). Variant `same` asks the task's
    // own input, "ok" for two tasks and "no" for two: 2 of 4 pass each epoch. Wilson at
    // z = 2.576 around one half is centred at 0.5 with half-width
    // z·√(0.25/n + z²/4n²) / (1 + z²/n): n = 16 gives 2.576·√(0.015625 + 0.00648)/1.4147
    // = 0.2707 (0.54 wide, go on); n = 20 gives 2.576·√(0.0125 + 0.004147)/1.3318 = 0.2496
    // (0.499 wide): narrow at the fifth look, which is also the last.
    let tasks: String =
        (0..4).map(|i| format!("  - {{id: t{i}, input: {}}}\n", if i < 2 { "ok" } else { "no" })).collect();
    sb.write(
        "s.yaml",
        &format!(
            "suite: auto\nenvironment: kv\nscorers: [{{equals: ok}}]\nvariants:\n  yes:\n    prompt: ok\n  same:\n    prompt: \"{{{{ input }}}}\"\ntasks:\n{tasks}"
        ),
    );
    let args = ["eval", "s.yaml", "--model", "echo", "--run-id", "test", "--out", "results", "--epochs", "auto"];
    let done = sb.run(&[&args[..], &["--ci-width", "0.5", "--max-epochs", "5"]].concat());
    assert!(done.code == 0 || done.code == 1, "{done:?}");
    let events = sb.events();
    let decided = crate::of_type(&events, "epochs_decided");
    let of = |variant: &str| -> Vec<String> {
        decided
            .iter()
            .filter(|e| e["variant"] == variant)
            .map(|e| e["decision"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert_eq!(of("yes"), ["continue", "stop_narrow"], "{decided:?}");
    assert_eq!(of("same"), ["continue", "continue", "continue", "continue", "stop_narrow"], "{decided:?}");
    assert_eq!(crate::of_type(&events, "episode_finished").len(), 4 * 2 + 4 * 5);
}

/// A suite too small for any drop to be detected gets one line, not a table of `none` rows;
/// a suite large enough keeps its row.
#[tokio::test(flavor = "multi_thread")]
async fn a_suite_too_small_to_measure_gets_one_line_instead_of_the_table() {
    let sb = Sandbox::new();
    let tasks = |n: usize| -> String {
        (0..n).map(|i| format!("  - {{id: t{i}, input: q{i}, mock: [{{text: ok}}]}}\n")).collect()
    };
    sb.write("small.yaml", &format!("suite: small\nenvironment: kv\nscorers: [{{equals: ok}}]\ntasks:\n{}", tasks(3)));
    let small = run(&sb, &["eval", "small.yaml", "--model", "mock", "--out", "results"]).await;
    assert_eq!(small.code, 0, "{small:?}");
    assert!(!small.stdout.contains("within-task var") && !small.stdout.contains("none:"), "{small:?}");
    // Six tasks all flipped one way is the least the exact test rejects at 5%: 2 · 0.5⁶ < 0.05.
    let line = "noise: too few tasks for the McNemar test to detect any drop (3 tasks; it needs 6); see `runner plan RUN --mde 5`";
    assert!(small.stdout.lines().any(|l| l == line), "{small:?}");

    sb.write("large.yaml", &format!("suite: large\nenvironment: kv\nscorers: [{{equals: ok}}]\ntasks:\n{}", tasks(8)));
    let both = run(&sb, &["eval", "small.yaml", "large.yaml", "--model", "mock", "--out", "results"]).await;
    assert_eq!(both.code, 0, "{both:?}");
    assert!(both.stdout.lines().any(|l| l.starts_with("large ") && l.contains(" pts")), "{both:?}");
    assert!(!both.stdout.lines().any(|l| l.starts_with("small ") && l.contains("0.0000")), "{both:?}");
    let named = "no MDE: too few tasks for the McNemar test to detect any drop (it needs 6): small mock (3 tasks)";
    assert!(both.stdout.lines().any(|l| l == named), "{both:?}");
}
