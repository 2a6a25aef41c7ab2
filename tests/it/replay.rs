//! Record a run, replay it for free, and get a loud, specific miss when a prompt changes.

use serde_json::Value;

use crate::{Sandbox, of_type, read_jsonl};

const SUITE: &str = r#"
suite: rec
environment: kv
agent: {system: "You keep notes. Be exact."}
epochs: 2
scorers: [{equals: "{{ target }}"}]
tasks:
  - id: sum
    input: Add 2 and 2.
    target: "4"
    mock:
      - tool_calls: [{name: calc, arguments: {expression: "2+2"}}]
      - text: "4"
  - id: note
    input: Store x.
    target: done
    mock:
      - tool_calls: [{name: kv_set, arguments: {key: x, value: "1"}}, {name: kv_list}]
      - text: done
"#;

/// The parts of an event that must match between a run and its replay.
fn stable(events: &[Value]) -> Vec<Value> {
    let mut per_episode: std::collections::BTreeMap<String, Vec<Value>> = Default::default();
    for e in events {
        let mut e = e.clone();
        let obj = e.as_object_mut().unwrap();
        for timing in
            ["ts", "seq", "run_id", "latency_ms", "wall_ms", "loop_ms", "cache_hit", "command_line", "git_revision"]
        {
            obj.remove(timing);
        }
        // The first observation carries the world's details; the kv world has none that vary.
        let id = obj.get("episode_id").and_then(Value::as_str).unwrap_or("run").to_owned();
        per_episode.entry(id).or_default().push(e);
    }
    per_episode.into_values().flatten().collect()
}

#[test]
fn a_replayed_run_has_the_same_events_and_a_changed_prompt_misses_loudly() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let record =
        sb.run(&["eval", "s.yaml", "--model", "mock", "--record", "tape.jsonl", "--run-id", "rec", "--out", "results"]);
    assert_eq!(record.code, 0, "{record:?}");
    assert_eq!(read_jsonl(&sb.path().join("tape.jsonl")).len(), 8, "4 episodes × 2 model calls");

    let replay = sb.run(&["eval", "s.yaml", "--model", "replay:tape.jsonl", "--run-id", "rep", "--out", "results"]);
    assert_eq!(replay.code, 0, "{replay:?}");
    let recorded = read_jsonl(&sb.path().join("results/rec/events.jsonl"));
    let replayed = read_jsonl(&sb.path().join("results/rep/events.jsonl"));
    let (mut a, mut b) = (stable(&recorded), stable(&replayed));
    // run_started differs only by the model spec given on the command line.
    a.retain(|e| e["type"] != "run_started");
    b.retain(|e| e["type"] != "run_started");
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x, y);
    }
    assert!(of_type(&replayed, "model_call").iter().all(|c| c["cache_hit"] == true));

    // Change the system prompt: every episode misses, and the miss says where.
    sb.write("s.yaml", &SUITE.replace("Be exact.", "Be quick."));
    let miss = sb.run(&["eval", "s.yaml", "--model", "replay:tape.jsonl", "--run-id", "miss", "--out", "results"]);
    assert_eq!(miss.code, 3, "{miss:?}");
    let events = read_jsonl(&sb.path().join("results/miss/events.jsonl"));
    let finished = of_type(&events, "episode_finished");
    assert!(finished.iter().all(|f| f["outcome"]["cause"] == "replay_miss"), "{finished:?}");
    let why = finished[0]["outcome"]["message"].as_str().unwrap();
    assert!(why.contains("message 1 (system)") && why.contains("exact") && why.contains("quick"), "{why}");
}

#[test]
fn a_run_log_can_be_replayed_directly() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    assert_eq!(sb.run(&["eval", "s.yaml", "--model", "mock", "--run-id", "rec", "--out", "results"]).code, 0);
    let replay = sb.run(&["eval", "s.yaml", "--model", "replay:results/rec", "--run-id", "rep", "--out", "results"]);
    assert_eq!(replay.code, 0, "{replay:?}");
    let events = read_jsonl(&sb.path().join("results/rep/events.jsonl"));
    assert_eq!(of_type(&events, "model_call").len(), 8);
    // A replay of more epochs than were recorded runs out, and says so.
    let more = sb.run(&[
        "eval",
        "s.yaml",
        "--model",
        "replay:results/rec",
        "--epochs",
        "3",
        "--run-id",
        "more",
        "--out",
        "results",
    ]);
    assert_eq!(more.code, 3, "{more:?}");
    let events = read_jsonl(&sb.path().join("results/more/events.jsonl"));
    let misses: Vec<_> =
        of_type(&events, "episode_finished").into_iter().filter(|f| f["outcome"]["cause"] == "replay_miss").collect();
    assert_eq!(misses.len(), 2);
    assert!(misses[0]["outcome"]["message"].as_str().unwrap().contains("has been served"), "{:?}", misses[0]);
}
