//! Permission rules through a whole run: a denied call is a `PermissionError` observation
//! naming its rule and never reaches the world; an `ask` rule is answered by the task's
//! scripted user; every decision is a `permission` event.

use serde_json::Value;

use crate::{Sandbox, of_type, tool_observations};

/// The observation of the call with this id.
fn observation<'a>(events: &'a [Value], call_id: &str) -> &'a Value {
    tool_observations(events).into_iter().find(|o| o["call_id"] == call_id).unwrap_or_else(|| panic!("no {call_id}"))
}

/// Each `permission` event as (call_id, rule, decision, decided_by).
fn decisions(events: &[Value]) -> Vec<(String, Value, String, String)> {
    of_type(events, "permission")
        .into_iter()
        .map(|e| {
            let text = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
            (text("call_id"), e["rule"].clone(), text("decision"), text("decided_by"))
        })
        .collect()
}

#[test]
fn a_denied_command_is_a_permission_error_naming_its_rule_and_does_not_run() {
    let sb = Sandbox::new();
    let keep = sb.write("keep.txt", "precious\n");
    // The environment would allow `rm`, but the suite's rules come first.
    sb.write(
        "environments/box.yaml",
        "kind: shell\npermissions:\n  - run_command(rm *): allow\n  - run_command(cat *): deny\n",
    );
    sb.write(
        "s.yaml",
        &format!(
            r#"suite: guarded
environment: box
permissions:
  - run_command(rm *): deny
scorers: [{{includes: ok}}]
tasks:
  - id: t
    input: go
    mock:
      - tool_calls:
          - {{name: run_command, id: rm, arguments: {{command: "rm -f {keep}"}}}}
          - {{name: run_command, id: cat, arguments: {{command: "cat {keep}"}}}}
          - {{name: run_command, id: echo, arguments: {{command: "echo hi"}}}}
      - text: ok
"#,
            keep = keep.display()
        ),
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(keep.exists(), "the denied command ran: the file is gone");
    let events = sb.events();
    let rm = &observation(&events, "rm")["error"];
    assert_eq!(rm["type"], "PermissionError", "{rm}");
    let message = rm["message"].as_str().unwrap_or_default();
    assert!(message.contains("`run_command(rm *): deny` (suite permissions[0])"), "{message}");
    let cat = observation(&events, "cat")["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(cat.contains("`run_command(cat *): deny` (environment `box` permissions[1])"), "{cat}");
    assert_eq!(observation(&events, "echo")["tool_result"]["stdout"], "hi\n");
    let rule = |text: &str| Value::String(text.into());
    assert_eq!(
        decisions(&events),
        [
            ("rm".into(), rule("run_command(rm *): deny"), "deny".into(), "rule".into()),
            ("cat".into(), rule("run_command(cat *): deny"), "deny".into(), "rule".into()),
            ("echo".into(), Value::Null, "allow".into(), "default".into()),
        ]
    );
    assert_eq!(of_type(&events, "episode_finished")[0]["tool_errors"], 2);
}

#[test]
fn an_ask_rule_is_answered_by_the_tasks_user_and_denied_when_no_answer_is_left() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        r#"suite: asking
environment: shell
permissions: [{write_file: ask}]
scorers: [{includes: ok}]
tasks:
  - id: t
    input: go
    answers: ["no", "yes"]
    mock:
      - tool_calls: [{name: write_file, id: w1, arguments: {path: a.txt, content: a}}]
      - tool_calls: [{name: write_file, id: w2, arguments: {path: b.txt, content: b}}]
      - tool_calls: [{name: write_file, id: w3, arguments: {path: c.txt, content: c}}]
      - text: ok
"#,
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let ask = Value::String("write_file: ask".into());
    assert_eq!(
        decisions(&events),
        [
            ("w1".into(), ask.clone(), "deny".into(), "user".into()),
            ("w2".into(), ask.clone(), "allow".into(), "user".into()),
            ("w3".into(), ask, "deny".into(), "default".into()),
        ]
    );
    assert_eq!(of_type(&events, "permission")[0]["answer"], "no");
    assert_eq!(observation(&events, "w1")["error"]["type"], "PermissionError");
    assert!(observation(&events, "w2")["error"].is_null());
    let w3 = observation(&events, "w3")["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(w3.contains("no one to answer"), "{w3}");
}
