//! How the memory agent answers after the replay: a tool-calling agent with the store's
//! read tools (`answering: {with: tools}`) or the context in one prompt (the default), and
//! retrieval recall by evidence session and by evidence turn, from the sources of the
//! entries the answer's reads returned.

use serde_json::{Value, json};

use crate::{Sandbox, of_type, tool_observations};

fn add_entry(summary: &str) -> String {
    format!(r#"{{tool_calls: [{{name: add_entry, arguments: {{summary: "{summary}", raw_entry: "{summary}"}}}}]}}"#)
}

fn put_context(content: &str) -> String {
    format!(r#"{{tool_calls: [{{name: put_context, arguments: {{content: "{content}"}}}}]}}"#)
}

/// One task: session `s1` (the dog adopted, turn 1; its name, turn 2) and session `s2` (a
/// bicycle, turn 1). The evidence is the name's turn and the bicycle's: sessions s1 and
/// s2, turns (s1, 2) and (s2, 1). The replay's model turns, then `answer`'s.
fn suite(answering: &str, input: &str, answer: &[&str]) -> String {
    let sessions = json!([
        {"id": "s1", "date": "2023-05-01", "messages": [
            {"role": "user", "content": "I adopted a dog"}, {"role": "user", "content": "His name is Rex"}]},
        {"id": "s2", "date": "2023-05-02", "messages": [{"role": "user", "content": "I bought a red bicycle"}]},
    ]);
    let evidence = json!([{"session": "s1", "turn": 2}, {"session": "s2", "turn": 1}]);
    let mut mock = vec![
        add_entry("The user adopted a dog"),
        add_entry("His name is Rex"),
        put_context("dog"),
        add_entry("Bought a red bicycle"),
        put_context("bike"),
    ];
    mock.extend(answer.iter().map(|t| t.to_string()));
    let turns: String = mock.iter().map(|t| format!("      - {t}\n")).collect();
    format!(
        "suite: mem\nenvironment: memory_store\nagent: {{kind: memory{answering}}}\nlimits: {{max_steps: 100}}\n\
         scorers: [{{includes: Rex}}]\ntasks:\n  - id: t\n    input: {input}\n    \
         metadata: {{question_type: multi-session, answer_session_ids: [s1, s2], evidence_turns: {evidence}, sessions: {sessions}}}\n    \
         mock:\n{turns}"
    )
}

/// The names of the calls the world ran after the replay's last `put_context`.
fn answering_calls(events: &[Value]) -> Vec<String> {
    let names: Vec<String> = of_type(events, "action_dispatched")
        .iter()
        .map(|e| e["call"]["name"].as_str().unwrap_or("").to_owned())
        .collect();
    let last_write = names.iter().rposition(|n| n == "put_context").unwrap();
    names[last_write + 1..].to_vec()
}

#[test]
fn a_tool_calling_answer_searches_the_store_then_answers_and_recall_counts_its_reads() {
    let sb = Sandbox::new();
    let answer = [
        r#"{tool_calls: [{name: search_entries, arguments: {query: adopted}}]}"#,
        // Not a read tool: refused by the agent, never run.
        r#"{tool_calls: [{name: add_entry, arguments: {summary: "sneaky", raw_entry: "sneaky"}}]}"#,
        r#"{tool_calls: [{name: final_answer, arguments: {answer: "The dog is Rex."}}]}"#,
    ];
    let answering = ", answering: {with: tools, tools: [search_entries, get_context], max_steps: 3}";
    sb.write("s.yaml", &suite(answering, "What is the dog called?", &answer));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    assert_eq!(answering_calls(&events), ["search_entries", "final_answer"]);
    // The search reached the store: its result holds the one entry that matches.
    let search = of_type(&events, "action_dispatched")
        .into_iter()
        .find(|e| e["call"]["name"] == "search_entries")
        .map(|e| e["call"]["call_id"].clone())
        .unwrap();
    let found = tool_observations(&events)
        .into_iter()
        .find(|o| o["call_id"] == search)
        .unwrap_or_else(|| panic!("no search result: {events:?}"));
    let entries = found["tool_result"]["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{found}");
    assert_eq!(entries[0]["summary"], "The user adopted a dog", "{found}");
    let refused: Vec<&Value> =
        of_type(&events, "agent_action").into_iter().filter(|e| e["name"] == "add_entry").collect();
    assert_eq!(refused.len(), 1, "{events:?}");
    assert!(refused[0]["error"]["message"].as_str().unwrap().contains("not offered"), "{}", refused[0]);
    assert_eq!(of_type(&events, "episode_finished")[0]["outcome"]["passed"], true);

    // The search found s1's first turn only: one of the two evidence sessions, none of the
    // two evidence turns (the dog's name is in turn 2).
    let answered = of_type(&events, "memory_answered")[0].clone();
    assert_eq!(answered["retrieved_sessions"], json!(["s1"]), "{answered}");
    assert_eq!(answered["retrieved_turns"], json!([{"session": "s1", "turn": 1}]), "{answered}");
    assert_eq!(answered["recall"], 0.5);
    assert_eq!(answered["turn_recall"], 0.0);
    assert!(run.stdout.contains("retrieval recall: 50.0% of evidence sessions found"), "{run:?}");
    assert!(run.stdout.contains("retrieval recall by turn: 0.0% of evidence turns found (mean over 1 questions)"));
    // Three answering model calls, counted apart from the replay's five.
    let usage = &answered["answer_usage"];
    assert!(usage["input_tokens"].as_u64().unwrap() > 0, "{answered}");
}

#[test]
fn the_last_step_offers_only_final_answer_and_an_answer_never_given_is_the_agents_failure() {
    let sb = Sandbox::new();
    let answer = [
        // Step 1 of 1 offers only `final_answer`: the search is refused.
        r#"{tool_calls: [{name: search_entries, arguments: {query: dog}}]}"#,
        r#"{text: "Rex"}"#,
    ];
    sb.write("s.yaml", &suite(", answering: {with: tools, max_steps: 1}", "What is the dog called?", &answer));
    let run = sb.eval(&["s.yaml"]);
    let events = sb.events();
    assert!(answering_calls(&events).is_empty(), "{events:?}");
    let refused = of_type(&events, "agent_action");
    assert_eq!(refused.len(), 1, "{events:?}");
    assert!(refused[0]["error"]["message"].as_str().unwrap().contains("the tools are: final_answer"), "{}", refused[0]);
    let failed = of_type(&events, "agent_error");
    assert_eq!(failed.len(), 1, "{events:?}");
    assert!(failed[0]["message"].as_str().unwrap().contains("used its 1 steps"), "{}", failed[0]);
    assert_eq!(of_type(&events, "episode_finished")[0]["outcome"]["passed"], false, "{run:?}");
}

#[test]
fn the_context_answer_counts_recall_by_session_and_by_turn() {
    let sb = Sandbox::new();
    // The agent searches with the question's words: `the` and `dog` match turn 1's entry,
    // `is` turn 2's; the bicycle's entry has none of them.
    sb.write("s.yaml", &suite("", "What is the dog called?", &[r#"{text: "Rex"}"#]));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let answered = of_type(&sb.events(), "memory_answered")[0].clone();
    assert_eq!(answered["retrieved_sessions"], json!(["s1"]), "{answered}");
    let mut turns: Vec<Value> = answered["retrieved_turns"].as_array().unwrap().clone();
    turns.sort_by_key(|t| t["turn"].as_u64());
    assert_eq!(turns, [json!({"session": "s1", "turn": 1}), json!({"session": "s1", "turn": 2})]);
    assert_eq!(answered["recall"], 0.5);
    assert_eq!(answered["turn_recall"], 0.5);
    assert!(run.stdout.contains("retrieval recall by turn: 50.0% of evidence turns found"), "{run:?}");
}

#[test]
fn answering_is_checked_when_the_suite_loads() {
    let sb = Sandbox::new();
    let cases = [
        (", answering: {with: tools, tools: [add_entry]}", "agent.answering.tools", "`add_entry` is not a read tool"),
        (", answering: {with: context, max_steps: 2}", "agent.answering.max_steps", "is for `with: tools` only"),
        (", answering: {with: magic}", "answering", "magic"),
    ];
    for (answering, field, why) in cases {
        sb.write("s.yaml", &suite(answering, "Q?", &[]));
        let run = sb.eval(&["s.yaml"]);
        assert_ne!(run.code, 0, "{answering}: {run:?}");
        assert!(run.stderr.contains(field) && run.stderr.contains(why), "{answering}: {run:?}");
    }
    sb.write("s.yaml", &suite("", "Q?", &[]).replace("kind: memory", "kind: tool_calling, answering: {with: tools}"));
    let run = sb.eval(&["s.yaml"]);
    assert!(run.stderr.contains("agent.answering") && run.stderr.contains("for `kind: memory` agents only"), "{run:?}");
}

#[test]
fn a_read_made_with_the_final_answer_is_not_counted_for_recall() {
    let sb = Sandbox::new();
    let answer = [
        r#"{tool_calls: [{name: search_entries, arguments: {query: adopted}}]}"#,
        // The bicycle's search goes with the answer: its result reaches no model before the
        // answer is given, so it is not what the agent retrieved to answer.
        r#"{tool_calls: [{name: search_entries, arguments: {query: bicycle}}, {name: final_answer, arguments: {answer: "Rex"}}]}"#,
    ];
    let answering = ", answering: {with: tools, max_steps: 3}";
    sb.write("s.yaml", &suite(answering, "What is the dog called?", &answer));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    assert_eq!(answering_calls(&events), ["search_entries", "search_entries", "final_answer"], "{events:?}");
    // The bicycle's search ran and found its entry (so counting it would give 1.0)...
    let searches: Vec<Value> = of_type(&events, "action_dispatched")
        .into_iter()
        .filter(|e| e["call"]["name"] == "search_entries")
        .map(|e| e["call"]["call_id"].clone())
        .collect();
    let bicycle = tool_observations(&events).into_iter().find(|o| o["call_id"] == searches[1]);
    let bicycle = bicycle.unwrap_or_else(|| panic!("no result of the second search: {events:?}"));
    assert_eq!(bicycle["tool_result"]["entries"][0]["summary"], "Bought a red bicycle", "{bicycle}");
    // ... but recall counts only what the agent had read when it answered.
    let answered = of_type(&events, "memory_answered")[0].clone();
    assert_eq!(answered["retrieved_sessions"], json!(["s1"]), "{answered}");
    assert_eq!(answered["recall"], 0.5, "{answered}");
}
