//! Toolset distributions: each episode draws its toolset from its id, the same in every run
//! and shard; the draw is in `episode_started`, the episodes table, the summary and compare.

use std::collections::BTreeMap;

use crate::{Sandbox, of_type, read_jsonl};

const SUITE: &str = "suite: draws
environment: kv
epochs: 3
toolsets:
  readers: [kv_get, kv_list]
  writers: [kv_get, kv_set]
  never: [kv_delete]
toolset_distribution: {readers: 1, writers: 2, never: 0}
scorers:
  - includes: ok
mock:
  - tool_calls: [{name: kv_set, arguments: {key: a, value: b}}]
  - text: ok
tasks:
  - {id: t1, input: go}
  - {id: t2, input: go}
  - {id: t3, input: go}
  - {id: t4, input: go}
  - {id: t5, input: go}
  - {id: t6, input: go}
  - {id: t7, input: go}
  - {id: t8, input: go}
";

/// Each episode's id and the toolset it drew, from a run's log.
fn draws(sb: &Sandbox, run: &str) -> BTreeMap<String, String> {
    let events = read_jsonl(&sb.path().join(format!("results/{run}/events.jsonl")));
    of_type(&events, "episode_started")
        .iter()
        .map(|e| {
            let id = e["episode_id"].as_str().unwrap_or_default().to_owned();
            (id, e["toolset"].as_str().unwrap_or("(none)").to_owned())
        })
        .collect()
}

fn eval(sb: &Sandbox, run: &str, extra: &[&str]) -> crate::Run {
    let mut args = vec!["eval", "s.yaml", "--model", "mock", "--run-id", run, "--out", "results", "-q"];
    args.extend_from_slice(extra);
    sb.run(&args)
}

#[test]
fn each_episode_draws_the_same_toolset_in_every_run_and_shard() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let run = eval(&sb, "one", &[]);
    assert_eq!(run.code, 0, "{run:?}");
    let one = draws(&sb, "one");
    assert_eq!(one.len(), 24);
    let counts = one.values().fold(BTreeMap::<&str, usize>::new(), |mut c, t| {
        *c.entry(t.as_str()).or_default() += 1;
        c
    });
    assert!(!counts.contains_key("never"), "a toolset of weight 0 is never drawn: {counts:?}");
    assert!(counts.get("readers").is_some_and(|n| *n > 0) && counts.get("writers").is_some_and(|n| *n > 0));
    assert_eq!(eval(&sb, "two", &[]).code, 0);
    assert_eq!(draws(&sb, "two"), one, "a second run draws the same");
    let mut sharded = BTreeMap::new();
    for shard in ["1/2", "2/2"] {
        let name = format!("shard{}", &shard[..1]);
        assert_eq!(eval(&sb, &name, &["--shard", shard]).code, 0);
        sharded.extend(draws(&sb, &name));
    }
    assert_eq!(sharded, one, "the shards together draw what the whole run drew");
}

#[test]
fn the_drawn_toolset_is_what_the_agent_is_offered_and_a_dimension_of_the_reports() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let run = eval(&sb, "one", &[]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("toolset"), "the summary has a toolset table: {run:?}");
    let events = read_jsonl(&sb.path().join("results/one/events.jsonl"));
    // Under `readers`, the script's kv_set is not offered: its call is refused as unknown.
    let drawn = draws(&sb, "one");
    for obs in of_type(&events, "observation") {
        let Some(id) = obs["episode_id"].as_str() else { continue };
        // The script's first turn, its kv_set call.
        if obs["step"] != 1 {
            continue;
        }
        let error = &obs["observation"]["error"];
        match drawn[id].as_str() {
            "readers" => assert_eq!(error["type"], "ToolNotFound", "{obs}"),
            _ => assert!(error.is_null(), "{obs}"),
        }
    }
    let csv = std::fs::read_to_string(sb.path().join("results/one/episodes.csv")).expect("episodes.csv");
    let header: Vec<&str> = csv.lines().next().unwrap_or_default().split(',').collect();
    let column = header.iter().position(|c| *c == "toolset").expect("a toolset column");
    for line in csv.lines().skip(1) {
        let cells: Vec<&str> = line.split(',').collect();
        assert!(["readers", "writers"].contains(&cells[column]), "{line}");
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(sb.path().join("results/one/summary.json")).expect("summary"))
            .expect("summary.json");
    let rows = summary["toolsets"].as_array().expect("toolsets in summary.json");
    assert_eq!(rows.iter().map(|r| r["episodes"].as_u64().unwrap_or(0)).sum::<u64>(), 24);
    assert_eq!(eval(&sb, "two", &[]).code, 0);
    let compare = sb.run(&["compare", "results/one", "results/two"]);
    assert!(compare.stdout.contains("[readers]") && compare.stdout.contains("[writers]"), "{compare:?}");
}
