//! Running at scale: shards, scheduling with mock latency, and the files of a run folder.

use std::collections::BTreeSet;

use crate::{Sandbox, of_type, read_jsonl};

fn many_tasks(n: usize) -> String {
    let tasks: String = (0..n).map(|i| format!("  - {{id: t{i}, input: q{i}, mock: [{{text: \"ok\"}}]}}\n")).collect();
    format!("suite: many\nenvironment: kv\nscorers: [{{equals: ok}}]\ntasks:\n{tasks}")
}

fn episode_ids(sb: &Sandbox, run: &str) -> BTreeSet<String> {
    let events = read_jsonl(&sb.path().join(format!("results/{run}/events.jsonl")));
    of_type(&events, "episode_started").iter().map(|e| e["episode_id"].as_str().unwrap().to_owned()).collect()
}

#[test]
fn shards_split_the_episodes_without_overlap_or_loss() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &many_tasks(24));
    let all = sb.run(&["eval", "s.yaml", "--model", "mock", "--epochs", "2", "--run-id", "all", "--out", "results"]);
    assert_eq!(all.code, 0, "{all:?}");
    let everything = episode_ids(&sb, "all");
    assert_eq!(everything.len(), 48);
    let mut union = BTreeSet::new();
    for i in 1..=3 {
        let id = format!("shard{i}");
        let shard = format!("{i}/3");
        let run = sb.run(&[
            "eval", "s.yaml", "--model", "mock", "--epochs", "2", "--shard", &shard, "--run-id", &id, "--out",
            "results",
        ]);
        assert_eq!(run.code, 0, "{run:?}");
        let ids = episode_ids(&sb, &id);
        assert!(!ids.is_empty(), "shard {i} got nothing");
        assert!(union.is_disjoint(&ids), "shard {i} overlaps another");
        union.extend(ids);
    }
    assert_eq!(union, everything);
    // Adding tasks does not move the old ones between shards.
    sb.write("s.yaml", &many_tasks(30));
    let before = episode_ids(&sb, "shard2");
    sb.run(&[
        "eval", "s.yaml", "--model", "mock", "--epochs", "2", "--shard", "2/3", "--run-id", "again", "--out", "results",
    ]);
    assert!(before.is_subset(&episode_ids(&sb, "again")));
    let bad = sb.run(&["eval", "s.yaml", "--model", "mock", "--shard", "4/3", "--out", "r"]);
    assert_eq!(bad.code, 2, "{bad:?}");
}

#[test]
fn the_mock_can_wait_so_scheduling_can_be_measured() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &many_tasks(2));
    let run =
        sb.run(&["eval", "s.yaml", "--model", "mock", "--mock-delay-ms", "60", "--run-id", "test", "--out", "results"]);
    assert_eq!(run.code, 0, "{run:?}");
    for call in of_type(&sb.events(), "model_call") {
        assert!(call["latency_ms"].as_f64().unwrap() >= 55.0, "{call}");
    }
}

#[test]
fn a_run_folder_holds_run_json_and_summary_json() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &many_tasks(3));
    assert_eq!(sb.eval(&["s.yaml"]).code, 0);
    let run: serde_json::Value =
        serde_json::from_slice(&std::fs::read(sb.path().join("results/test/run.json")).unwrap()).unwrap();
    assert_eq!(run["run_id"], "test");
    assert_eq!(run["suites"][0]["name"], "many");
    assert_eq!(run["suites"][0]["digest"].as_str().unwrap().len(), 64);
    assert_eq!(run["models"][0], "mock");
    assert!(run["command_line"].as_array().unwrap().iter().any(|a| a == "--model"));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(sb.path().join("results/test/summary.json")).unwrap()).unwrap();
    assert_eq!(summary["total"]["episodes"], 3);
    assert_eq!(summary["rows"][0]["passed"], 3);
    assert_eq!(summary["rows"][0]["pass_rate"], 1.0);
}

#[test]
fn junit_and_markdown_reports_for_ci() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        "suite: ci\nenvironment: kv\nscorers: [{equals: ok}]\ntasks:\n  - {id: good, input: q, mock: [{text: ok}]}\n  - {id: bad, input: q, mock: [{text: \"<nope> & more\"}]}\n  - {id: broken, input: q, mock: []}\n",
    );
    let run = sb
        .command()
        .args([
            "eval",
            "s.yaml",
            "--model",
            "mock",
            "--run-id",
            "test",
            "--out",
            "results",
            "--junit",
            "out.xml",
            "--markdown",
            "out.md",
        ])
        .env("GITHUB_STEP_SUMMARY", sb.path().join("step.md"))
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(3), "one episode is unscored");
    let xml = std::fs::read_to_string(sb.path().join("out.xml")).unwrap();
    assert!(xml.contains(r#"tests="3" failures="1" errors="1" skipped="0""#), "{xml}");
    assert_eq!(xml.matches("<testcase ").count(), 3, "{xml}");
    assert!(xml.contains(r#"name="bad [mock, epoch 1]""#), "{xml}");
    assert!(xml.contains("does not equal &quot;ok&quot;") && xml.contains("&lt;nope&gt; &amp; more"), "{xml}");
    assert!(xml.contains(r#"<error message="unscored: mock_exhausted" type="mock_exhausted">"#), "{xml}");
    assert!(xml.trim_end().ends_with("</testsuites>"));
    let md = std::fs::read_to_string(sb.path().join("out.md")).unwrap();
    assert!(md.contains("| ci | mock | 3 | 1 | 1 | 1 | 50.0% |"), "{md}");
    assert_eq!(std::fs::read_to_string(sb.path().join("step.md")).unwrap(), md);
}
