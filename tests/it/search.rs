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

/// A later suite whose agent searches the earlier run: one task shares an id with the
/// earlier run's `store-colour` (its own episodes are left out), one asks a bad query.
const RECALLING: &str = r#"
suite: recall
environment: kv
agent:
  session_search: {runs: [results/test]}
scorers:
  - includes: "{{ target }}"
tasks:
  - id: recall-colour
    input: Which colour did an earlier episode store?
    target: turquoise
    mock:
      - tool_calls: [{name: session_search, arguments: {query: "kv_set AND colour"}}]
      - tool_calls: [{name: session_search, arguments: {query: "colour AND"}}]
      - tool_calls: [{name: final_answer, arguments: {answer: "turquoise"}}]
  - id: store-colour
    input: Store the colour again.
    target: none
    mock:
      - tool_calls: [{name: session_search, arguments: {query: "turquoise"}}]
      - tool_calls: [{name: session_search, arguments: {query: "turquoise OR colour", outcome: passed}}]
      - tool_calls: [{name: final_answer, arguments: {answer: "none"}}]
"#;

#[test]
fn session_search_lets_an_agent_search_earlier_episodes_as_its_own_action() {
    let sb = searched();
    sb.write("recall.yaml", RECALLING);
    let run = sb.run(&["eval", "recall.yaml", "--model", "mock", "--run-id", "later", "--out", "results"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = crate::read_jsonl(&sb.path().join("results/later/events.jsonl"));
    let actions = crate::of_type(&events, "agent_action");
    assert_eq!(actions.len(), 4, "{actions:?}");
    assert!(actions.iter().all(|a| a["name"] == "session_search" && a["class"] == "cognitive"), "{actions:?}");
    // The two episodes run at once: their actions are told apart by their queries.
    let asked = |query: &str| *actions.iter().find(|a| a["arguments"]["query"] == query).unwrap();
    let hits = asked("kv_set AND colour")["result"]["hits"].as_array().unwrap();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(hits[0]["task_id"], "store-colour");
    assert_eq!(hits[0]["type"], "tool_call");
    assert_eq!(hits[0]["step"], 1);
    assert_eq!(hits[0]["snippet"], "[kv_set] key [colour] value turquoise");
    assert_eq!(hits[0]["run"], "test");
    // A query FTS5 cannot parse is the model's mistake: an error it reads, and it goes on.
    let bad = asked("colour AND");
    assert_eq!(bad["error"]["type"], "ValidationError", "{bad}");
    assert!(bad["error"]["message"].as_str().unwrap().contains("bad query \"colour AND\""), "{bad}");
    // The task that ran before under the same id does not see its own earlier episode.
    let own: Vec<&Value> = asked("turquoise")["result"]["hits"].as_array().unwrap().iter().collect();
    assert!(!own.is_empty() && own.iter().all(|h| h["task_id"] == "wrong-sum"), "{own:?}");
    // Its outcome filter: the only passed episode is its own task's.
    assert_eq!(asked("turquoise OR colour")["result"]["count"], 0);
    // The world never saw the calls.
    let dispatched = crate::of_type(&events, "action_dispatched");
    assert!(dispatched.iter().all(|d| d["call"]["name"] != "session_search"), "{dispatched:?}");
}

#[test]
fn a_session_search_past_the_query_caps_is_refused_and_the_agent_goes_on() {
    let sb = searched();
    let many: Vec<String> = (0..300).map(|i| format!("w{i}")).collect();
    let suite = format!(
        "suite: recall\nenvironment: kv\nagent:\n  session_search: {{runs: [results/test]}}\nscorers:\n  - includes: x\n\
         tasks:\n  - id: long\n    input: Find it.\n    mock:\n      \
         - tool_calls: [{{name: session_search, arguments: {{query: \"{}\"}}}}]\n      \
         - tool_calls: [{{name: final_answer, arguments: {{answer: x}}}}]\n",
        many.join(" OR ")
    );
    sb.write("recall.yaml", &suite);
    let run = sb.run(&["eval", "recall.yaml", "--model", "mock", "--run-id", "later", "--out", "results"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = crate::read_jsonl(&sb.path().join("results/later/events.jsonl"));
    let actions = crate::of_type(&events, "agent_action");
    assert_eq!(actions.len(), 1, "{actions:?}");
    assert_eq!(actions[0]["error"]["type"], "ValidationError", "{}", actions[0]);
    let message = actions[0]["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("the query has 300 terms; at most 256"), "{message}");
}

#[test]
fn a_long_query_is_repeated_back_cut() {
    let sb = searched();
    // A bad query of 100,000 bytes: the error names it by its start and its length.
    let bad = format!("{}AND", "turquoise ".repeat(10_000));
    let run = sb.run(&["search", "test", &bad]);
    assert_eq!(run.code, 2, "{}", &run.stderr[..run.stderr.len().min(500)]);
    assert!(run.stderr.len() < 1000, "the query is echoed whole: {} bytes of stderr", run.stderr.len());
    assert!(run.stderr.contains("… (100003 bytes in all)"), "{run:?}");
    // --json repeats the query the same way.
    let long = "turquoise ".repeat(50);
    let run = sb.run(&["search", "test", &long, "--json"]);
    assert_eq!(run.code, 0, "{run:?}");
    let json: Value = serde_json::from_str(&run.stdout).unwrap();
    let echoed = json["query"].as_str().unwrap();
    assert!(echoed.starts_with(&long[..200]) && echoed.ends_with("… (500 bytes in all)"), "{echoed}");
}
