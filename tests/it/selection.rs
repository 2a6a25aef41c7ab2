//! Reruns by selection: `--filter`, `--tag`, `--sample`, `--failing` (also of a merged
//! run of shards) and `--range`, recorded in `run.json` and `run_started`, with `--resume`
//! and `--shard`.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::{Run, Sandbox, of_type, read_jsonl};

const SUITE: &str = r#"
suite: pick
environment: kv
scorers:
  - includes: "{{ target }}"
tasks:
  - {id: alpha, input: a, target: yes, tags: [smoke], mock: [{text: "yes"}]}
  - {id: apple, input: a, target: yes, mock: [{text: "yes"}]}
  - {id: beta, input: b, target: yes, tags: [slow, smoke], mock: [{text: "no"}]}
  - {id: berry, input: b, target: yes, mock: [{text: "yes"}]}
  - {id: cherry, input: c, target: yes, mock: [{text: "no"}]}
"#;

fn sandbox() -> Sandbox {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    sb
}

/// `runner eval s.yaml --model mock --out results --run-id ID` with `more`.
fn eval(sb: &Sandbox, id: &str, more: &[&str]) -> Run {
    let mut args = vec!["eval", "s.yaml", "--model", "mock", "--out", "results", "--run-id", id];
    args.extend_from_slice(more);
    sb.run(&args)
}

/// The task ids of the episodes run `id` made.
fn tasks_of(sb: &Sandbox, id: &str) -> BTreeSet<String> {
    let events = read_jsonl(&sb.path().join(format!("results/{id}/events.jsonl")));
    of_type(&events, "episode_started").iter().filter_map(|e| e["task_id"].as_str().map(String::from)).collect()
}

fn set(ids: &[&str]) -> BTreeSet<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

fn run_json(sb: &Sandbox, id: &str) -> Value {
    let text = std::fs::read_to_string(sb.path().join(format!("results/{id}/run.json"))).expect("run.json");
    serde_json::from_str(&text).expect("JSON")
}

#[test]
fn filter_keeps_the_tasks_whose_id_matches_a_glob_and_is_recorded() {
    let sb = sandbox();
    let run = eval(&sb, "f", &["--filter", "a*", "--filter", "pick/cherry"]);
    assert!(run.code == 0 || run.code == 1, "{run:?}");
    assert_eq!(tasks_of(&sb, "f"), set(&["alpha", "apple", "cherry"]));
    assert_eq!(run_json(&sb, "f")["selection"]["filter"], serde_json::json!(["a*", "pick/cherry"]));
    let events = read_jsonl(&sb.path().join("results/f/events.jsonl"));
    assert_eq!(events[0]["selection"]["filter"][0], "a*", "run_started records it");
    assert_eq!(events[0]["episodes"], 3);
}

#[test]
fn tag_keeps_the_tasks_that_carry_it() {
    let sb = sandbox();
    eval(&sb, "t", &["--tag", "smoke"]);
    assert_eq!(tasks_of(&sb, "t"), set(&["alpha", "beta"]));
    eval(&sb, "t2", &["--tag", "slow", "--tag", "none-such"]);
    assert_eq!(tasks_of(&sb, "t2"), set(&["beta"]));
}

#[test]
fn sample_draws_the_same_tasks_every_time_and_others_with_another_seed() {
    let sb = sandbox();
    eval(&sb, "s1", &["--sample", "2"]);
    eval(&sb, "s2", &["--sample", "2"]);
    let drawn = tasks_of(&sb, "s1");
    assert_eq!(drawn.len(), 2);
    assert_eq!(drawn, tasks_of(&sb, "s2"), "the draw is stable");
    let seeds: BTreeSet<BTreeSet<String>> = (1..6)
        .map(|seed| {
            let id = format!("seed{seed}");
            eval(&sb, &id, &["--sample", "2", "--sample-seed", &seed.to_string()]);
            tasks_of(&sb, &id)
        })
        .collect();
    assert!(seeds.len() > 1, "other seeds draw other tasks: {seeds:?}");
    // Sharded, the halves of a sample are the sample.
    eval(&sb, "h1", &["--sample", "3", "--shard", "1/2"]);
    eval(&sb, "h2", &["--sample", "3", "--shard", "2/2"]);
    eval(&sb, "whole", &["--sample", "3"]);
    let halves: BTreeSet<String> = tasks_of(&sb, "h1").union(&tasks_of(&sb, "h2")).cloned().collect();
    assert_eq!(halves, tasks_of(&sb, "whole"));
}

#[test]
fn range_keeps_the_tasks_at_those_positions() {
    let sb = sandbox();
    eval(&sb, "r", &["--range", "1..3"]);
    assert_eq!(tasks_of(&sb, "r"), set(&["apple", "beta"]));
    eval(&sb, "r2", &["--range", "3.."]);
    assert_eq!(tasks_of(&sb, "r2"), set(&["berry", "cherry"]));
    let bad = eval(&sb, "r3", &["--range", "3..1"]);
    assert_eq!(bad.code, 2, "{bad:?}");
    assert!(bad.stderr.contains("holds no task"), "{bad:?}");
}

#[test]
fn failing_reruns_what_failed_also_in_a_merged_run_of_shards() {
    let sb = sandbox();
    eval(&sb, "all", &[]);
    eval(&sb, "again", &["--failing", "all"]);
    assert_eq!(tasks_of(&sb, "again"), set(&["beta", "cherry"]));
    assert_eq!(run_json(&sb, "again")["selection"]["failing"], "all");
    eval(&sb, "p1", &["--shard", "1/2"]);
    eval(&sb, "p2", &["--shard", "2/2"]);
    let merged = sb.run(&["merge", "results/p1", "results/p2", "--out", "results", "--run-id", "merged"]);
    assert!(merged.code == 0 || merged.code == 1, "{merged:?}");
    eval(&sb, "fixed", &["--failing", "merged"]);
    assert_eq!(tasks_of(&sb, "fixed"), set(&["beta", "cherry"]));
    // Nothing failed in `fixed`'s passing subset: a rerun of nothing is refused.
    eval(&sb, "good", &["--filter", "a*"]);
    let none = eval(&sb, "none", &["--failing", "good"]);
    assert_eq!(none.code, 2, "{none:?}");
    assert!(none.stderr.contains("no failed or unscored episode"), "{none:?}");
}

#[test]
fn a_resumption_keeps_the_selection_it_was_run_with() {
    let sb = sandbox();
    eval(&sb, "res", &["--filter", "b*"]);
    let widened = sb.run(&["eval", "s.yaml", "--model", "mock", "--out", "results", "--resume", "res"]);
    assert_eq!(widened.code, 2, "{widened:?}");
    assert!(widened.stderr.contains("was run with --filter b*, not no task selection"), "{widened:?}");
    let same = sb.run(&["eval", "s.yaml", "--model", "mock", "--out", "results", "--resume", "res", "--filter", "b*"]);
    assert!(same.code == 0 || same.code == 1, "{same:?}");
    assert_eq!(tasks_of(&sb, "res"), set(&["beta", "berry"]));
}
