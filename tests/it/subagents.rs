//! Subagents through the binary: `delegate_task` starts children that run at once in the
//! same world under their own actors, share the episode's limits, and answer their parent;
//! a child's outage leaves the episode unscored.

use std::path::Path;

use chrono::DateTime;
use serde_json::{Value, json};

use crate::{Sandbox, of_type, tool_observations};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The events of one episode of the run, by its task.
fn episode<'a>(events: &'a [Value], task: &str) -> Vec<&'a Value> {
    let started = events.iter().find(|e| e["type"] == "episode_started" && e["task_id"] == task).unwrap();
    let id = started["episode_id"].clone();
    events.iter().filter(|e| e["episode_id"] == id).collect()
}

fn typed<'a>(events: &[&'a Value], kind: &str) -> Vec<&'a Value> {
    events.iter().copied().filter(|e| e["type"] == kind).collect()
}

fn finished<'a>(events: &[&'a Value]) -> &'a Value {
    typed(events, "episode_finished")[0]
}

/// A suite over the shell world with subagents, the given limits, and one task.
fn suite(limits: &str, subagent: &str, task: &str) -> String {
    format!(
        "suite: s\nenvironment: shell\nagent:\n  subagent: {subagent:?}\nlimits: {limits}\nscorers: [{{includes: ok}}]\ntasks:\n{task}"
    )
}

#[test]
fn the_example_suite_delegates_answers_up_the_tree_and_reminds_across_agents() {
    let sb = Sandbox::new();
    let out = sb.path().join("results");
    let run = sb
        .command()
        .current_dir(repo())
        .args(["eval", "tasks/subagents.yaml", "--model", "mock", "--run-id", "test", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let run = crate::Run::from(run);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    for e in of_type(&events, "episode_finished") {
        assert_eq!(e["outcome"]["passed"], true, "{e}");
    }

    // Two children answered; a child's final_answer ended the child, not the episode: the
    // main agent asked its model again and gave the episode's one final answer.
    let count = episode(&events, "count-in-parallel");
    let delegations = typed(&count, "agent_action");
    let results: Vec<&Value> = delegations.iter().map(|e| &e["result"]).collect();
    assert_eq!(
        results,
        [
            &json!({"actor": "main.1", "answer": "3", "files_written": []}),
            &json!({"actor": "main.2", "answer": "2", "files_written": []})
        ]
    );
    let finals = typed(&count, "final");
    assert_eq!(finals.len(), 1);
    assert_eq!((finals[0]["call_id"].as_str(), finals[0]["answer"].as_str()), (Some("c_3"), Some("5")));
    let main_calls = typed(&count, "model_call").into_iter().filter(|e| e.get("actor").is_none()).count();
    assert_eq!(main_calls, 2, "the main agent's two turns");
    // Steps, tokens and calls are the whole tree's: 2 main turns and 2 of each child.
    let end = finished(&count);
    assert_eq!(end["steps"], 6);
    assert_eq!(end["tool_calls"], 5, "main's final answer and 2 calls of each child: {end}");
    let tokens: u64 = typed(&count, "model_call").iter().map(|e| e["usage"]["input_tokens"].as_u64().unwrap()).sum();
    assert_eq!(end["usage"]["input_tokens"], tokens);

    // main read app.ini, main.1 edited it: main is told before its next model call.
    let edit = episode(&events, "a-child-edits-what-main-read");
    let reminders = typed(&edit, "reminder");
    assert_eq!(reminders.len(), 1, "{reminders:?}");
    assert!(reminders[0].get("actor").is_none(), "the main agent is reminded: {}", reminders[0]);
    assert_eq!(reminders[0]["paths"], json!(["app.ini"]));
    let child_edit =
        edit.iter().find(|e| e["type"] == "action_dispatched" && e["call"]["name"] == "edit_file").unwrap();
    assert_eq!(child_edit["call"]["actor"], "main.1");
    assert!(child_edit["seq"].as_u64() < reminders[0]["seq"].as_u64());
    let delegated = typed(&edit, "agent_action")[0];
    assert_eq!(delegated["result"]["files_written"], json!(["app.ini"]));

    // The grandchild's file travels up: main.1 reports what main.1.1 wrote.
    let deep = episode(&events, "a-grandchild-writes");
    let actions = typed(&deep, "agent_action");
    assert_eq!(actions[0]["actor"], "main.1");
    assert_eq!(actions[0]["result"]["actor"], "main.1.1");
    assert_eq!(actions[1]["result"]["files_written"], json!(["greeting.txt"]), "{}", actions[1]);
}

/// The interval a call ran, from its dispatch to its observation, by the log's timestamps.
fn interval(events: &[Value], call_id: &str) -> (DateTime<chrono::FixedOffset>, DateTime<chrono::FixedOffset>) {
    let ts = |e: &Value| DateTime::parse_from_rfc3339(e["ts"].as_str().unwrap()).unwrap();
    let start = events.iter().find(|e| e["type"] == "action_dispatched" && e["call"]["call_id"] == call_id);
    let end = events.iter().find(|e| e["type"] == "observation" && e["observation"]["call_id"] == call_id);
    (ts(start.unwrap()), ts(end.unwrap()))
}

#[test]
fn children_of_one_turn_run_at_the_same_time() {
    let sb = Sandbox::new();
    let child = |n: u32| {
        format!(
            "      main.{n}:\n        - tool_calls: [{{name: run_command, arguments: {{command: \"sleep 1; echo {n}\"}}}}]\n        - tool_calls: [{{name: final_answer, arguments: {{answer: \"{n}\"}}}}]\n"
        )
    };
    let task = format!(
        "  - id: t\n    input: go\n    mock:\n      - tool_calls: [{{name: delegate_task, arguments: {{goal: a}}}}, {{name: delegate_task, arguments: {{goal: b}}}}]\n      - text: ok\n    mock_subagents:\n{}{}",
        child(1),
        child(2)
    );
    sb.write("s.yaml", &suite("{max_steps: 10, time_s: 60}", "help", &task));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let (start1, end1) = interval(&events, "main_1_c_1");
    let (start2, end2) = interval(&events, "main_2_c_1");
    // Each ran its second of sleep; each began before the other ended.
    for (start, end) in [(start1, end1), (start2, end2)] {
        assert!(end - start >= chrono::Duration::milliseconds(1000), "{start} .. {end}");
    }
    assert!(start1 < end2 && start2 < end1, "main.1 ran {start1}..{end1}, main.2 ran {start2}..{end2}: not at once");
    let obs = tool_observations(&events);
    assert!(obs.iter().any(|o| o["tool_result"]["stdout"] == "1\n"), "{obs:?}");
    assert!(obs.iter().any(|o| o["tool_result"]["stdout"] == "2\n"), "{obs:?}");
}

#[test]
fn a_tree_that_uses_up_the_episodes_steps_stops() {
    let sb = Sandbox::new();
    let busy: String = (0..10)
        .map(|_| "        - tool_calls: [{name: run_command, arguments: {command: \"true\"}}]\n".to_owned())
        .collect();
    let task = format!(
        "  - id: t\n    input: go\n    mock:\n      - tool_calls: [{{name: delegate_task, arguments: {{goal: loop}}}}]\n      - text: ok\n    mock_subagents:\n      main.1:\n{busy}"
    );
    sb.write("s.yaml", &suite("{max_steps: 5, time_s: 60}", "help", &task));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "a failed episode is no error of the run: {run:?}");
    let events = sb.events();
    let end = &of_type(&events, "episode_finished")[0];
    assert_eq!(end["termination"], "max_steps", "{end}");
    assert_eq!(end["outcome"]["passed"], false, "{end}");
    assert_eq!(end["steps"], 5);
    // The main agent's turn and four of the child's: five model calls, no more.
    let calls = of_type(&events, "model_call");
    let actors: Vec<&str> = calls.iter().map(|c| c["actor"].as_str().unwrap_or("main")).collect();
    assert_eq!(actors, ["main", "main.1", "main.1", "main.1", "main.1"]);
    let answer = &of_type(&events, "agent_action")[0]["error"];
    assert_eq!(answer["type"], "Cancelled");
    assert_eq!(answer["message"], "subagent main.1 stopped without an answer: the episode reached its max steps");
    assert!(of_type(&events, "final").is_empty());
}

#[test]
fn a_tree_that_spends_the_episodes_tokens_stops_and_the_childs_tokens_count() {
    let sb = Sandbox::new();
    // The subagent's prompt alone is some 1,000 tokens (four characters a token).
    let long_prompt = "read carefully ".repeat(270);
    let task = "  - id: t\n    input: go\n    mock:\n      - tool_calls: [{name: delegate_task, arguments: {goal: g}}]\n      - text: ok\n    mock_subagents:\n      main.1:\n        - tool_calls: [{name: run_command, arguments: {command: \"touch never\"}}]\n        - text: done\n";
    sb.write("s.yaml", &suite("{max_steps: 10, time_s: 60, max_tokens: 600}", &long_prompt, task));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let end = &of_type(&events, "episode_finished")[0];
    assert_eq!(end["termination"], "token_limit", "{end}");
    let calls = of_type(&events, "model_call");
    assert_eq!(calls.len(), 2, "main's turn and the child's first: {calls:?}");
    let child_tokens = calls[1]["usage"]["input_tokens"].as_u64().unwrap();
    assert_eq!(calls[1]["actor"], "main.1");
    assert!(child_tokens > 600, "{child_tokens}");
    let main_tokens = calls[0]["usage"]["input_tokens"].as_u64().unwrap();
    assert_eq!(end["usage"]["input_tokens"], main_tokens + child_tokens, "the whole tree's tokens: {end}");
    // The child's call was logged and not run.
    let obs = tool_observations(&events);
    assert_eq!(obs[0]["call_id"], "main_1_c_1");
    assert_eq!(obs[0]["error"]["message"], "not run: the episode reached its token limit");
}

#[test]
fn a_childs_outage_leaves_the_episode_unscored() {
    let sb = Sandbox::new();
    // main.1 has no script: its model (the mock) has nothing to say.
    let task = "  - id: t\n    input: go\n    mock:\n      - tool_calls: [{name: delegate_task, arguments: {goal: g}}]\n      - text: ok\n";
    sb.write("s.yaml", &suite("{max_steps: 10, time_s: 60}", "help", task));
    let run = sb.eval(&["s.yaml"]);
    let events = sb.events();
    let end = &of_type(&events, "episode_finished")[0];
    assert_eq!(end["termination"], "agent_error", "{end}");
    assert_eq!(end["outcome"]["status"], "unscored", "{end}");
    assert_eq!(end["outcome"]["cause"], "mock_exhausted", "{end}");
    assert!(end["outcome"]["message"].as_str().unwrap().starts_with("subagent main.1: "), "{end}");
    assert!(of_type(&events, "score").is_empty(), "nothing is scored");
    assert_ne!(run.code, 0, "{run:?}");
}

#[test]
fn a_childs_tool_error_stays_in_the_child() {
    let sb = Sandbox::new();
    let task = "  - id: t\n    input: go\n    mock:\n      - tool_calls: [{name: delegate_task, arguments: {goal: g}}]\n      - text: ok\n    mock_subagents:\n      main.1:\n        - tool_calls: [{name: read_file, arguments: {path: missing.txt}}]\n        - tool_calls: [{name: final_answer, arguments: {answer: \"no such file\"}}]\n";
    sb.write("s.yaml", &suite("{max_steps: 10, time_s: 60}", "help", task));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let obs = tool_observations(&events);
    assert_eq!(obs[0]["call_id"], "main_1_c_1");
    assert_eq!(obs[0]["error"]["type"], "ExecutionError", "{}", obs[0]);
    let delegated = &of_type(&events, "agent_action")[0];
    assert!(delegated.get("error").is_none(), "{delegated}");
    assert_eq!(delegated["result"]["answer"], "no such file");
    let end = &of_type(&events, "episode_finished")[0];
    assert_eq!(end["tool_errors"], 1, "the child's error is in the episode's trajectory: {end}");
    assert_eq!(end["outcome"]["passed"], true);
}

/// A provider for the HTTP backend: the main agent (any request without the subagents'
/// prompt) delegates, then answers; every request of a subagent fails with a 500.
struct Outage;

impl wiremock::Respond for Outage {
    fn respond(&self, request: &wiremock::Request) -> wiremock::ResponseTemplate {
        let body: Value = request.body_json().unwrap_or(Value::Null);
        let text = body.to_string();
        if text.contains("SUBAGENT PROMPT") {
            return wiremock::ResponseTemplate::new(500);
        }
        let delegated = text.contains("delegate_1");
        let message = if delegated {
            json!({"role": "assistant", "content": "ok"})
        } else {
            let call = json!({"id": "delegate_1", "type": "function",
                              "function": {"name": "delegate_task", "arguments": "{\"goal\": \"g\"}"}});
            json!({"role": "assistant", "content": null, "tool_calls": [call]})
        };
        wiremock::ResponseTemplate::new(200).set_body_json(json!({"choices": [{"index": 0, "message": message,
            "finish_reason": if delegated { "stop" } else { "tool_calls" }}], "usage": {"prompt_tokens": 10, "completion_tokens": 2}}))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_providers_outage_under_a_child_leaves_the_episode_unscored() {
    let sb = Sandbox::new();
    sb.write(
        "runner.yaml",
        "providers:\n  openai: {retry_base_s: 0.01, retry_max_s: 0.05, max_retries: 2, timeout_s: 2}\n",
    );
    sb.write("s.yaml", &suite("{max_steps: 10, time_s: 30}", "SUBAGENT PROMPT", "  - {id: t, input: go}\n"));
    let server = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::method("POST")).respond_with(Outage).mount(&server).await;
    let args = ["eval", "s.yaml", "--model", "openai/gpt-test", "--run-id", "test", "--out", "results"];
    let run = crate::models::run_with(&sb, &args, &crate::models::openai_env(&server)).await;
    assert_eq!(run.code, 3, "an unscored episode: {run:?}");
    let events = sb.events();
    let (retried, calls): (Vec<_>, Vec<_>) =
        of_type(&events, "model_call").into_iter().partition(|c| c["retried"] == true);
    assert_eq!(retried.len(), 2, "the child's retried attempts: {retried:?}");
    assert_eq!(calls.len(), 2, "main's delegation and the child's failed call: {calls:?}");
    assert!(calls[0].get("actor").is_none() && calls[0]["error"].is_null(), "{}", calls[0]);
    assert_eq!(calls[1]["actor"], "main.1");
    assert_eq!(calls[1]["cause"], "provider_error", "{}", calls[1]);
    assert_eq!(calls[1]["attempts"], 3, "the 500s were retried: {}", calls[1]);
    let end = &of_type(&events, "episode_finished")[0];
    assert_eq!(end["outcome"]["status"], "unscored", "{end}");
    assert_eq!(end["outcome"]["cause"], "provider_error");
    assert!(end["outcome"]["message"].as_str().unwrap().starts_with("subagent main.1: "), "{end}");
}

/// The observation the log holds for `call_id`, which must have one.
fn observation_of<'a>(events: &'a [Value], call_id: &str) -> &'a Value {
    let found = events.iter().find(|e| e["type"] == "observation" && e["observation"]["call_id"] == call_id);
    &found.unwrap_or_else(|| panic!("no observation of {call_id} in the log: {events:#?}"))["observation"]
}

/// A task whose child runs `command` and would answer after it.
fn a_child_runs(command: &str) -> String {
    format!(
        "  - id: t\n    input: go\n    mock:\n      - tool_calls: [{{name: delegate_task, arguments: {{goal: wait}}}}]\n      - text: ok\n    mock_subagents:\n      main.1:\n        - tool_calls: [{{name: run_command, arguments: {{command: {command:?}}}}}]\n        - tool_calls: [{{name: final_answer, arguments: {{answer: done}}}}]\n"
    )
}

#[test]
fn a_childs_call_running_at_the_deadline_is_logged_as_cancelled() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite("{max_steps: 10, time_s: 1}", "help", &a_child_runs("sleep 20")));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "the suite has no gate: {run:?}");
    let events = sb.events();
    let obs = observation_of(&events, "main_1_c_1");
    assert_eq!(obs["error"]["type"], "Cancelled", "{obs}");
    assert_eq!(obs["info"]["started"], true, "{obs}");
    let end = &of_type(&events, "episode_finished")[0];
    assert_eq!(end["termination"], "time_limit", "{end}");
    let delegated = &of_type(&events, "agent_action")[0];
    assert_eq!(delegated["error"]["type"], "Cancelled", "{delegated}");
}

#[cfg(unix)]
#[test]
fn a_childs_call_running_at_ctrl_c_is_logged_as_cancelled() {
    let sb = Sandbox::new();
    // The child's command marks its start in the test's folder, which the sandbox lets it write.
    sb.write(
        "environments/slow.yaml",
        &format!(
            "kind: shell\nlimits: {{command_timeout_s: 60, tool_timeout_s: 60}}\nsandbox: {{write_paths: [{}]}}\n",
            sb.path().display()
        ),
    );
    let mark = sb.path().join("started");
    let suite =
        suite("{max_steps: 10, time_s: 60}", "help", &a_child_runs(&format!("touch {}; sleep 50", mark.display())))
            .replace("environment: shell", "environment: slow");
    sb.write("s.yaml", &suite);
    let run = sb.eval_interrupted_at(&mark);
    assert_eq!(run.code, 130, "{run:?}");
    let events = sb.events();
    let obs = observation_of(&events, "main_1_c_1");
    assert_eq!(obs["error"]["type"], "Cancelled", "{obs}");
    assert_eq!(obs["info"]["started"], true, "{obs}");
    let end = &of_type(&events, "episode_finished")[0];
    assert_eq!(end["termination"], "user_stop", "{end}");
}
