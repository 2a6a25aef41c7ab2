//! One output cap for every tool: a result larger than `output_cap_bytes` (plus room for
//! its structure) is cut where observations are made, with a marker and `OutputTruncated`,
//! whichever tool made it.

use serde_json::{Value, json};

use crate::{Sandbox, tool_observations};

const CAP: usize = 4096;
/// `output_cap_bytes` plus the room the runner leaves for a result's structure.
const LIMIT: usize = CAP + 1024;

/// The observations of one episode of `environment` (a file written as given) that makes
/// `calls`, one per turn.
fn observe(environment: &str, files: &str, calls: &[Value]) -> Vec<Value> {
    let sb = Sandbox::new();
    sb.write("environments/e.yaml", environment);
    let mut mock: String = calls.iter().map(|c| format!("      - tool_calls: [{c}]\n")).collect();
    mock.push_str("      - text: ok\n");
    sb.write(
        "s.yaml",
        &format!(
            "suite: caps\nenvironment: e\nlimits: {{max_steps: 10, time_s: 120}}\nscorers: [{{includes: ok}}]\ntasks:\n  - id: t\n    input: go\n{files}    mock:\n{mock}"
        ),
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    tool_observations(&events).into_iter().filter(|o| o["done"] != true).cloned().collect()
}

fn assert_capped(obs: &Value, marker: &str) {
    let result = obs["tool_result"].to_string();
    assert!(result.len() <= LIMIT, "{} bytes: {}", result.len(), &result[..300.min(result.len())]);
    assert!(result.contains(marker), "no `{marker}` in {result}");
    assert_eq!(obs["error"]["type"], "OutputTruncated", "{}", obs["error"]);
}

#[test]
fn list_dir_of_a_hundred_thousand_files_is_cut_at_the_cap() {
    let environment = format!("kind: shell\nlimits: {{output_cap_bytes: {CAP}}}\n");
    let make =
        json!({"name": "run_command", "arguments": {"command": "mkdir d && cd d && seq -w 100000 | xargs touch"}});
    let list = json!({"name": "list_dir", "arguments": {"path": "d"}});
    let obs = observe(&environment, "", &[make, list]);
    assert_eq!(obs[0]["tool_result"]["exit_code"], 0, "{}", obs[0]);
    assert_capped(&obs[1], "more items cut");
}

#[test]
fn kv_get_of_a_fifteen_megabyte_value_is_cut_at_the_cap() {
    let environment = format!("kind: kv\nlimits: {{output_cap_bytes: {CAP}}}\n");
    let files = format!("    files: {{big: {}}}\n", "x".repeat(15_000_000));
    let obs = observe(&environment, &files, &[json!({"name": "kv_get", "arguments": {"key": "big"}})]);
    assert_capped(&obs[0], "of 15000000 bytes");
}

#[test]
fn the_writing_rooms_read_doc_and_export_of_a_long_document_are_cut_at_the_cap() {
    let environment = format!("kind: writing_room\nlimits: {{output_cap_bytes: {CAP}}}\n");
    let text = "word ".repeat(4000);
    let calls = [
        json!({"name": "open_doc", "arguments": {"doc_id": "long"}}),
        json!({"name": "write_section", "arguments": {"doc_id": "long", "heading": "All", "text": text}}),
        json!({"name": "read_doc", "arguments": {"doc_id": "long"}}),
        json!({"name": "export", "arguments": {"doc_id": "long", "format": "html"}}),
    ];
    let obs = observe(&environment, "", &calls);
    assert_eq!(obs.len(), 4, "{obs:?}");
    assert_capped(&obs[2], "[... cut: showing");
    assert_capped(&obs[3], "[... cut: showing");
}

#[test]
fn an_mcp_servers_fifteen_megabytes_of_structured_content_are_cut_at_the_cap() {
    let server = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mcp/large_server.py");
    let environment = format!(
        "kind: mcp\nlimits: {{output_cap_bytes: {CAP}}}\nservers:\n  - {{name: large, command: /usr/bin/python3, args: [\"{server}\"]}}\n"
    );
    let obs = observe(&environment, "", &[json!({"name": "large", "arguments": {}})]);
    assert_capped(&obs[0], "more items cut");
}

/// Regression: an answer longer than the MCP client reads of one message (16 MiB) was
/// dropped while the call waited for it, and reported as "took longer than" its timeout.
#[test]
fn an_mcp_servers_fifty_megabyte_answer_is_cut_with_a_marker_and_a_larger_one_says_how_large_it_was() {
    let server = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mcp/large_server.py");
    let environment = format!(
        "kind: mcp\nlimits: {{output_cap_bytes: {CAP}, tool_timeout_s: 60}}\nservers:\n  - {{name: large, command: /usr/bin/python3, args: [\"{server}\"]}}\n"
    );
    let calls = [
        json!({"name": "text", "arguments": {"bytes": 50_000_000}}),
        json!({"name": "text", "arguments": {"bytes": 70_000_000}}),
    ];
    let obs = observe(&environment, "", &calls);
    let result = obs[0]["tool_result"].to_string();
    assert!(result.len() <= LIMIT && result.contains("of 50000000 bytes"), "{}", &result[..300.min(result.len())]);
    let error = obs[1]["error"]["message"].as_str().unwrap_or_default();
    assert!(error.contains("answer was 700000") && error.contains("more than the 64 MiB"), "{}", obs[1]);
    assert_ne!(obs[1]["error"]["type"], "TimeoutError", "{}", obs[1]);
}
