//! `runner search` through the binary, over a real mock run: hits name their episode, step
//! and actor; filters, JSON, a bad query, and an index built again after a regrade.

use serde_json::Value;

use crate::Sandbox;

const SUITE: &str = r#"
suite: s
environment: kv
scorers:
  - includes: "{{ target }}"
tasks:
  - id: store-colour
    input: Remember that the colour is turquoise.
    target: turquoise
    mock:
      - tool_calls: [{name: kv_set, arguments: {key: colour, value: turquoise}}]
      - tool_calls: [{name: final_answer, arguments: {answer: "stored turquoise"}}]
  - id: wrong-sum
    input: What is 2 + 2?
    target: "4"
    mock:
      - text: "I think it is five, the turquoise answer"
"#;

fn searched() -> Sandbox {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    sb
}

#[test]
fn search_finds_calls_and_answers_with_their_episode_step_and_actor() {
    let sb = searched();
    let run = sb.run(&["search", "results/test", "turquoise"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stderr.contains("index built: results/test/search.sqlite, 2 episodes"), "{run:?}");
    assert!(sb.path().join("results/test/search.sqlite").is_file());
    assert!(run.stdout.contains("s/store-colour  mock  epoch 1  passed  step 1  main  tool_call kv_set"), "{run:?}");
    assert!(run.stdout.contains("    kv_set key colour value [turquoise]"), "{run:?}");
    // A plain-text answer is indexed once, as the message it was.
    assert!(run.stdout.contains("s/wrong-sum  mock  epoch 1  failed  step 1  main  message\n"), "{run:?}");
    assert!(run.stdout.contains("s/store-colour  mock  epoch 1  passed  step 0  main  observation\n    Remember that the colour is [turquoise]."), "the task's input, in the first observation: {run:?}");
    assert!(run.stdout.contains("after the run  scorer  score includes\n"), "{run:?}");
    assert!(run.stdout.ends_with("6 hit(s)\n"), "{run:?}");
    // Read again: the index matches the log and is not built again.
    let again = sb.run(&["search", "test", "turquoise", "--outcome", "failed", "--json", "--actor", "scorer"]);
    assert_eq!(again.code, 0, "{again:?}");
    assert!(!again.stderr.contains("index built"), "{again:?}");
    let json: Value = serde_json::from_str(&again.stdout).unwrap();
    let hits = json["hits"].as_array().unwrap();
    assert_eq!(hits.len(), 1, "{json}");
    assert!(hits.iter().all(|h| h["task_id"] == "wrong-sum"), "{json}");
    assert_eq!(hits[0]["type"], "score");
    assert_eq!(hits[0]["step"], Value::Null);
    assert_eq!(hits[0]["name"], "includes");
    assert!(hits[0]["snippet"].as_str().unwrap().contains("[turquoise]"), "{json}");
    let typed = sb.run(&["search", "test", "turquo*", "--type", "observation", "--json"]);
    let json: Value = serde_json::from_str(&typed.stdout).unwrap();
    assert!(json["hits"].as_array().unwrap().iter().all(|h| h["type"] == "observation"), "{json}");
}

#[test]
fn a_bad_query_or_filter_is_a_usage_error() {
    let sb = searched();
    let run = sb.run(&["search", "test", "turquoise AND"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("error: bad query \"turquoise AND\": fts5: syntax error"), "{run:?}");
    let run = sb.run(&["search", "test", "x", "--type", "thought"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("unknown type `thought`"), "{run:?}");
    let run = sb.run(&["search", "no-such-run", "x"]);
    assert_eq!(run.code, 2, "{run:?}");
}

#[test]
fn a_regrade_appends_to_the_log_and_the_index_is_built_again() {
    let sb = searched();
    assert_eq!(sb.run(&["search", "test", "turquoise"]).code, 0);
    let regrade = sb.run(&["regrade", "results/test"]);
    assert_eq!(regrade.code, 0, "{regrade:?}");
    let run = sb.run(&["search", "test", "turquoise", "--type", "score"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stderr.contains("index rebuilt (the log changed since it was built)"), "{run:?}");
}
