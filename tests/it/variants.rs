//! Variants: a suite's named overrides run as a dimension like `--model`. Each episode runs
//! under one, its id includes it, and the log, the table, the summary, JUnit and `compare`
//! show it; `compare` pairs the variants by task and gates on a regression.

use crate::{Sandbox, of_type, read_jsonl};

/// Twelve tasks; under `echo` the `plain` prompt answers each, the `vague` one none.
fn suite() -> String {
    let mut text = String::from(
        "suite: prompts
environment: kv
variants:
  plain: {prompt: \"The answer is {{ target }}.\", agent: {system: \"Answer plainly.\"}}
  vague: {prompt: \"I would rather not say.\"}
scorers:
  - includes: \"{{ target }}\"
tasks:
",
    );
    for i in 1..=12 {
        text.push_str(&format!("  - {{id: q{i}, input: \"What is {i} + 1?\", target: \"{}\"}}\n", i + 1));
    }
    text
}

fn eval(sb: &Sandbox, run: &str, extra: &[&str]) -> crate::Run {
    let mut args = vec!["eval", "s.yaml", "--model", "echo", "--run-id", run, "--out", "results", "-q"];
    args.extend_from_slice(extra);
    sb.run(&args)
}

#[test]
fn two_variants_one_regressing_compare_names_it_with_its_p_value_and_the_gate_fails() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite());
    let run = eval(&sb, "one", &[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("echo [plain]") && run.stdout.contains("echo [vague]"), "{run:?}");

    let compare = sb.run(&["compare", "results/one", "--fail-on-regression"]);
    assert_eq!(compare.code, 1, "the regressing variant fails the gate: {compare:?}");
    // 12 tasks pass only under `plain`: exact McNemar, 2 * 0.5^12.
    let verdict = compare.stdout.lines().find(|l| l.starts_with("verdict:")).unwrap_or_default();
    assert!(verdict.starts_with("verdict: echo [vague] vs echo [plain]"), "{compare:?}");
    assert!(verdict.contains("McNemar p = 0.0005"), "{verdict}");
    assert!(verdict.contains("REGRESSED"), "{verdict}");
    assert!(compare.stdout.contains("12 passed in A, failed in B"), "{compare:?}");
    // The paired bootstrap on the tasks' scores (12 tasks: enough to show it).
    assert!(compare.stdout.contains("-1.000"), "the score difference: {compare:?}");
}

#[test]
fn each_episode_runs_under_one_variant_shown_in_the_log_the_table_the_summary_and_junit() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite());
    assert_eq!(eval(&sb, "one", &[]).code, 0);
    let events = read_jsonl(&sb.path().join("results/one/events.jsonl"));
    let started = of_type(&events, "episode_started");
    assert_eq!(started.len(), 24, "12 tasks under 2 variants");
    let mut ids = std::collections::HashSet::new();
    for e in &started {
        assert!(["plain", "vague"].contains(&e["variant"].as_str().unwrap_or_default()), "{e}");
        ids.insert(e["episode_id"].as_str().unwrap_or_default().to_owned());
    }
    assert_eq!(ids.len(), 24, "the variant is part of the id");
    // The prompt is the variant's, rendered over the task's fields.
    let answers: Vec<&str> = of_type(&events, "final").iter().filter_map(|e| e["answer"].as_str()).collect();
    assert!(answers.contains(&"The answer is 13.") && answers.contains(&"I would rather not say."), "{answers:?}");
    let run_json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(sb.path().join("results/one/run.json")).expect("run.json"))
            .expect("json");
    assert_eq!(run_json["suites"][0]["variants"], serde_json::json!(["plain", "vague"]));

    let csv = std::fs::read_to_string(sb.path().join("results/one/episodes.csv")).expect("episodes.csv");
    let header: Vec<&str> = csv.lines().next().unwrap_or_default().split(',').collect();
    let (variant, outcome) = (
        header.iter().position(|c| *c == "variant").expect("a variant column"),
        header.iter().position(|c| *c == "outcome").expect("an outcome column"),
    );
    for line in csv.lines().skip(1) {
        let cells: Vec<&str> = line.split(',').collect();
        let expected = if cells[variant] == "plain" { "passed" } else { "failed" };
        assert_eq!(cells[outcome], expected, "{line}");
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(sb.path().join("results/one/summary.json")).expect("summary"))
            .expect("summary.json");
    let rows: Vec<(String, u64)> = summary["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| (r["variant"].as_str().unwrap_or_default().to_owned(), r["passed"].as_u64().unwrap_or(0)))
        .collect();
    assert_eq!(rows, [("plain".to_owned(), 12), ("vague".to_owned(), 0)]);

    let report = sb.run(&["report", "results/one", "--junit", "junit.xml"]);
    assert_eq!(report.code, 0, "{report:?}");
    let junit = std::fs::read_to_string(sb.path().join("junit.xml")).expect("junit.xml");
    assert!(junit.contains("q1 [echo, variant vague, epoch 1]"), "{junit}");
}

#[test]
fn variant_picks_some_and_resume_keeps_to_them() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite());
    let run = eval(&sb, "picked", &["--variant", "vague"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = read_jsonl(&sb.path().join("results/picked/events.jsonl"));
    let started = of_type(&events, "episode_started");
    assert_eq!(started.len(), 12);
    assert!(started.iter().all(|e| e["variant"] == "vague"));
    // The same episode has the same id in both runs.
    assert_eq!(eval(&sb, "all", &[]).code, 0);
    let all = read_jsonl(&sb.path().join("results/all/events.jsonl"));
    let all_ids: std::collections::HashSet<&str> =
        of_type(&all, "episode_started").iter().filter_map(|e| e["episode_id"].as_str()).collect();
    assert!(started.iter().all(|e| all_ids.contains(e["episode_id"].as_str().unwrap_or_default())));

    let unknown = eval(&sb, "none", &["--variant", "loud"]);
    assert_eq!(unknown.code, 2, "{unknown:?}");
    assert!(unknown.stderr.contains("--variant loud: no suite has such a variant"), "{unknown:?}");
    let resumed = sb.run(&["eval", "s.yaml", "--model", "echo", "--out", "results", "-q", "--resume", "picked"]);
    assert_eq!(resumed.code, 2, "{resumed:?}");
    assert!(resumed.stderr.contains("ran the variants vague, not plain, vague"), "{resumed:?}");
}
