//! Repeats: a task's `pass_k: {k, n}` gate over its epochs, and `--epochs N` whose repeats
//! are independent of the response cache unless the suite says `cache: {share_epochs: true}`.

use serde_json::Value;

use crate::{Sandbox, of_type, read_jsonl};

/// `steady` passes 3 of its 3 epochs (k 2), `never` none of its 2 (k 1), `once` has no gate.
const PASS_K: &str = r#"
suite: gates
environment: kv
scorers:
  - includes: "yes"
tasks:
  - id: steady
    input: say yes
    pass_k: {k: 2, n: 3}
    mock: [{text: "yes"}]
  - id: never
    input: say yes
    pass_k: {k: 1, n: 2}
    mock: [{text: "no"}]
  - id: once
    input: say yes
    mock: [{text: "yes"}]
"#;

#[test]
fn pass_k_runs_n_epochs_of_its_task_and_gates_on_k_of_them() {
    let sb = Sandbox::new();
    sb.write("s.yaml", PASS_K);
    let run = sb.eval(&["s.yaml"]);
    let events = sb.events();
    let started = of_type(&events, "episode_started");
    let epochs_of = |task: &str| started.iter().filter(|e| e["task_id"] == task).count();
    assert_eq!((epochs_of("steady"), epochs_of("never"), epochs_of("once")), (3, 2, 1), "{run:?}");
    assert_eq!(run.code, 1, "a task below its pass_k fails the gate: {run:?}");
    assert!(
        run.stderr.contains("1 task(s) passed fewer epochs than their pass_k or the suite's k_of_n: never"),
        "{run:?}"
    );
    assert!(!run.stderr.contains("steady"), "{run:?}");
    assert_eq!(events[0]["suites"][0]["pass_k"]["steady"], serde_json::json!({"k": 2, "n": 3}));
    let summary: Value = serde_json::from_str(
        &std::fs::read_to_string(sb.path().join("results/test/summary.json")).expect("summary.json"),
    )
    .expect("JSON");
    let epochs = &summary["epochs"][0];
    assert_eq!((epochs["tasks"].as_u64(), epochs["tasks_passed"].as_u64()), (Some(3), Some(2)), "{summary}");
    assert_eq!(epochs["below_k_of_n"], serde_json::json!(["never"]), "{summary}");

    let bad = sb.run(&["eval", "s.yaml", "--model", "mock", "--epochs", "1", "--out", "r"]);
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(bad.stderr.contains("task `steady` has pass_k k 2, more than the 1 epoch(s)"), "{bad:?}");
}

/// Whether each model call of run `id` was a cache hit, by epoch.
fn hits(sb: &Sandbox, id: &str) -> Vec<(u64, bool)> {
    let events = read_jsonl(&sb.path().join(format!("results/{id}/events.jsonl")));
    let started = of_type(&events, "episode_started");
    let mut hits: Vec<(u64, bool)> = of_type(&events, "model_call")
        .iter()
        .map(|c| {
            let epoch = started.iter().find(|s| s["episode_id"] == c["episode_id"]).and_then(|s| s["epoch"].as_u64());
            (epoch.unwrap_or(0), c["cache_hit"] == true)
        })
        .collect();
    hits.sort();
    hits
}

const CACHED: &str = "suite: c\nenvironment: kv\nscorers: [{includes: yes}]\nSHARE\ntasks:\n  - {id: a, input: hi, mock: [{text: \"yes\"}]}\n";

#[test]
fn each_epoch_has_its_own_cache_entries_unless_the_suite_shares_them() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &CACHED.replace("SHARE\n", ""));
    let cache = sb.path().join("cache");
    let cache = cache.to_string_lossy();
    let args = |id: &'static str| {
        ["eval", "s.yaml", "--model", "mock", "--epochs", "3", "-j", "1", "--cache", "--cache-dir", &cache]
            .into_iter()
            .map(String::from)
            .chain(["--out", "results", "--run-id", id].map(String::from))
            .collect::<Vec<_>>()
    };
    let run = |id: &'static str| {
        let a = args(id);
        sb.run(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let first = run("first");
    assert_eq!(first.code, 0, "{first:?}");
    assert_eq!(hits(&sb, "first"), [(1, false), (2, false), (3, false)], "no epoch answered from another's entry");
    run("again");
    assert_eq!(hits(&sb, "again"), [(1, true), (2, true), (3, true)], "each epoch finds its own entry");

    sb.write("s.yaml", &CACHED.replace("SHARE", "cache: {share_epochs: true}"));
    std::fs::remove_dir_all(sb.path().join("cache")).expect("empty the cache");
    run("shared");
    assert_eq!(hits(&sb, "shared"), [(1, false), (2, true), (3, true)], "the epochs share one entry");
}
