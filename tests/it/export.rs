//! `runner export` through the binary: a mock run with parallel tool calls, a subagent and
//! a failed episode, exported as ATIF (checked against the vendored schema and ATIF's own
//! rules), ShareGPT and OpenAI messages; the filters say what they skipped.

use std::collections::HashSet;
use std::path::Path;

use serde_json::Value;

use crate::{Sandbox, read_jsonl};

const SUITE: &str = r#"
suite: s
environment: shell
agent:
  subagent: "Do the goal you are given, then call final_answer."
  max_children: 2
limits: {max_steps: 10, time_s: 60}
scorers:
  - includes: "{{ target }}"
tasks:
  - id: two-calls-at-once
    input: How many lines do a.txt and b.txt have?
    target: "3 and 2"
    files: {a.txt: "1\n2\n3\n", b.txt: "x\ny\n"}
    mock:
      - tool_calls:
          - {name: run_command, arguments: {command: "wc -l < a.txt"}}
          - {name: run_command, arguments: {command: "wc -l < b.txt"}}
      - tool_calls: [{name: final_answer, arguments: {answer: "3 and 2"}}]
  - id: delegated
    input: How many lines does a.txt have?
    target: "3"
    files: {a.txt: "1\n2\n3\n"}
    mock:
      - tool_calls:
          - {name: delegate_task, arguments: {goal: "Count the lines of a.txt.", tools: [run_command]}}
      - tool_calls: [{name: final_answer, arguments: {answer: "3"}}]
    mock_subagents:
      main.1:
        - tool_calls: [{name: run_command, arguments: {command: "wc -l < a.txt"}}]
        - tool_calls: [{name: final_answer, arguments: {answer: "3"}}]
  - id: wrong
    input: What is 2 + 2?
    target: "4"
    mock:
      - tool_calls: [{name: final_answer, arguments: {answer: "5"}}]
"#;

fn run_suite() -> Sandbox {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("FAIL s/wrong"), "one task fails: {run:?}");
    sb
}

fn export(sb: &Sandbox, args: &[&str]) -> crate::Run {
    let mut all = vec!["export", "test"];
    all.extend_from_slice(args);
    let run = sb.run(&all);
    assert_eq!(run.code, 0, "{run:?}");
    run
}

fn read(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// ATIF's rules its schema cannot say: step ids run from 1, an observation answers a call of
/// its own step, and the agent-only fields appear only on agent steps.
fn check_atif_rules(file: &str, trajectory: &Value) {
    for (i, step) in trajectory["steps"].as_array().unwrap().iter().enumerate() {
        assert_eq!(step["step_id"], i + 1, "{file}: {step}");
        let ids: HashSet<&str> =
            step["tool_calls"].as_array().into_iter().flatten().map(|c| c["tool_call_id"].as_str().unwrap()).collect();
        for result in step["observation"]["results"].as_array().into_iter().flatten() {
            let source = result["source_call_id"].as_str().unwrap();
            assert!(ids.contains(source), "{file}: step {} answers {source}, not one of its calls {ids:?}", i + 1);
        }
        if step["source"] != "agent" {
            for field in ["model_name", "reasoning_content", "tool_calls", "metrics"] {
                assert!(step.get(field).is_none(), "{file}: {field} on a {} step", step["source"]);
            }
        }
    }
}

#[test]
fn atif_trajectories_match_the_schema_and_each_observation_answers_its_call() {
    let sb = run_suite();
    let run = export(&sb, &["--format", "atif"]);
    assert!(run.stdout.contains("exported 3 episode(s) as atif"), "{run:?}");
    let dir = sb.path().join("results/test/export/atif");
    let schema = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/atif/schema.json"));
    let validator = jsonschema::validator_for(&schema).unwrap();
    let report = read(&dir.join("export.json"));
    let files: Vec<&str> = report["files"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    // Three main trajectories and the subagent's own.
    assert_eq!(files.len(), 4, "{report}");
    let mut by_task = std::collections::HashMap::new();
    for file in &files {
        let trajectory = read(&dir.join(file));
        let errors: Vec<String> =
            validator.iter_errors(&trajectory).map(|e| format!("{e} at {}", e.instance_path())).collect();
        assert!(errors.is_empty(), "{file}: {errors:?}");
        check_atif_rules(file, &trajectory);
        assert_eq!(trajectory["schema_version"], "ATIF-v1.6");
        by_task.insert(
            (
                trajectory["extra"]["task_id"].as_str().unwrap().to_owned(),
                trajectory["agent"]["extra"]["actor"].as_str().unwrap().to_owned(),
            ),
            trajectory,
        );
    }

    // The schema is not vacuous: a step from nobody, or a field ATIF does not have, is refused.
    let mut bad = by_task[&("wrong".to_owned(), "main".to_owned())].clone();
    bad["steps"][0]["source"] = "robot".into();
    assert!(!validator.is_valid(&bad));
    let mut bad = by_task[&("wrong".to_owned(), "main".to_owned())].clone();
    bad["steps"][1]["tool_calls"][0]["id"] = "c_1".into();
    assert!(!validator.is_valid(&bad));

    // Two calls in one step, each answered by its own result, in call order.
    let two = &by_task[&("two-calls-at-once".to_owned(), "main".to_owned())];
    let step = &two["steps"][1];
    let calls: Vec<&str> =
        step["tool_calls"].as_array().unwrap().iter().map(|c| c["tool_call_id"].as_str().unwrap()).collect();
    let answered: Vec<&str> = step["observation"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["source_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(calls.len(), 2, "{step}");
    assert_eq!(calls, answered);
    assert!(step["observation"]["results"][0]["content"].as_str().unwrap().contains("\"stdout\":\"3\\n\""), "{step}");
    assert!(step["observation"]["results"][1]["content"].as_str().unwrap().contains("\"stdout\":\"2\\n\""), "{step}");
    assert_eq!(step["metrics"]["prompt_tokens"].as_u64().map(|n| n > 0), Some(true), "{step}");
    assert_eq!(two["agent"]["model_name"], "mock");

    // The subagent is its own trajectory, referenced from the delegating call's result.
    let main = &by_task[&("delegated".to_owned(), "main".to_owned())];
    let sub = &by_task[&("delegated".to_owned(), "main.1".to_owned())];
    let reference = &main["steps"][1]["observation"]["results"][0]["subagent_trajectory_ref"][0];
    assert_eq!(reference["session_id"], sub["session_id"], "{main}");
    assert!(dir.join(reference["trajectory_path"].as_str().unwrap()).is_file(), "{reference}");
    assert_eq!(sub["steps"][0]["source"], "user");
    assert_eq!(sub["steps"][0]["message"], "Count the lines of a.txt.");
    assert_eq!(sub["steps"][1]["tool_calls"][0]["function_name"], "run_command");
    assert_eq!(sub["extra"]["parent_session_id"], main["session_id"]);
}

#[test]
fn passed_only_skips_the_failed_episode_and_says_so() {
    let sb = run_suite();
    let out = sb.path().join("sft");
    let run = export(&sb, &["--format", "openai", "--passed-only", "--out", out.to_str().unwrap()]);
    assert!(
        run.stdout.contains("exported 2 episode(s)") && run.stdout.contains("skipped 1: failed (only passed asked)"),
        "{run:?}"
    );
    let report = read(&out.join("export.json"));
    assert_eq!(report["written"], 2);
    assert_eq!(report["skipped"]["failed (only passed asked)"], 1, "{report}");
    let skipped: Vec<&Value> =
        report["episodes"].as_array().unwrap().iter().filter(|e| e.get("skipped").is_some()).collect();
    assert_eq!((skipped.len(), skipped[0]["status"].as_str()), (1, Some("failed")), "{report}");
    assert_eq!(read_jsonl(&out.join("openai.jsonl")).len(), 2);

    let run = export(&sb, &["--format", "sharegpt", "--outcome", "failed"]);
    assert!(
        run.stdout.contains("exported 1 episode(s)") && run.stdout.contains("skipped 2: passed (only failed asked)"),
        "{run:?}"
    );
}

#[test]
fn openai_lines_answer_every_tool_call_by_its_id() {
    let sb = run_suite();
    export(&sb, &["--format", "openai"]);
    let lines = read_jsonl(&sb.path().join("results/test/export/openai/openai.jsonl"));
    assert_eq!(lines.len(), 3);
    check_openai(&lines);
    let parallel = lines
        .iter()
        .flat_map(|l| l["messages"].as_array().unwrap())
        .any(|m| m["tool_calls"].as_array().is_some_and(|c| c.len() == 2));
    assert!(parallel, "the two-calls turn is one assistant message with two calls");
    // The conversation ends with the model's final answer.
    for line in &lines {
        let last = line["messages"].as_array().unwrap().last().unwrap();
        assert_eq!(last["tool_calls"][0]["function"]["name"], "final_answer", "{line}");
    }
}

/// Every `tool` message answers a call a preceding assistant message made, and every call is
/// answered before the conversation goes on.
fn check_openai(lines: &[Value]) {
    for line in lines {
        let messages = line["messages"].as_array().unwrap();
        let first = if messages[0]["role"] == "system" { &messages[1] } else { &messages[0] };
        assert_eq!(first["role"], "user", "{line}");
        let mut open: Vec<String> = Vec::new();
        for m in messages {
            match m["role"].as_str().unwrap() {
                "assistant" => {
                    assert!(open.is_empty(), "calls {open:?} unanswered before the next assistant message: {line}");
                    for call in m["tool_calls"].as_array().into_iter().flatten() {
                        assert_eq!(call["type"], "function");
                        let arguments: Value =
                            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
                        assert!(arguments.is_object(), "{call}");
                        if call["function"]["name"] != "final_answer" {
                            open.push(call["id"].as_str().unwrap().to_owned());
                        }
                    }
                }
                "tool" => {
                    let id = m["tool_call_id"].as_str().unwrap();
                    let at = open.iter().position(|o| o == id);
                    assert!(at.is_some(), "tool message for {id}, which no preceding tool_calls named: {line}");
                    open.remove(at.unwrap_or_default());
                }
                "user" | "system" => assert!(open.is_empty(), "{line}"),
                other => panic!("unexpected role {other}: {line}"),
            }
        }
        assert!(open.is_empty(), "{line}");
        assert_eq!(messages.last().unwrap()["role"], "assistant", "{line}");
    }
}

#[test]
fn sharegpt_lines_alternate_and_end_on_the_models_side() {
    let sb = run_suite();
    export(&sb, &["--format", "sharegpt"]);
    let lines = read_jsonl(&sb.path().join("results/test/export/sharegpt/sharegpt.jsonl"));
    assert_eq!(lines.len(), 3);
    check_sharegpt(&lines);
    let two =
        lines.iter().find(|l| l["conversations"][0]["value"].as_str().unwrap().contains("a.txt and b.txt")).unwrap();
    let calls: Value = serde_json::from_str(two["conversations"][1]["value"].as_str().unwrap()).unwrap();
    assert_eq!(calls.as_array().map(Vec::len), Some(2), "{two}");
    let results: Value = serde_json::from_str(two["conversations"][2]["value"].as_str().unwrap()).unwrap();
    assert_eq!(results.as_array().map(Vec::len), Some(2), "{two}");
}

/// Conversations with the task's user, reminders and plan mode: the user's replies, the
/// reminders after results and the user's last word keep both formats well formed.
#[test]
fn conversations_with_the_user_and_reminders_stay_well_formed() {
    let sb = Sandbox::new();
    let out = sb.path().join("results");
    let run = sb
        .command()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["eval", "tasks/conversation.yaml", "tasks/user.yaml", "tasks/plan-mode.yaml", "tasks/subagents.yaml"])
        .args(["--model", "mock", "--run-id", "test", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let run = crate::Run::from(run);
    assert_eq!(run.code, 0, "{run:?}");
    export(&sb, &["--format", "openai"]);
    let openai = read_jsonl(&out.join("test/export/openai/openai.jsonl"));
    check_openai(&openai);
    // The user's replies are there, each once.
    let booking =
        openai.iter().find(|l| l["messages"][0]["content"].as_str().unwrap().contains("book a table")).unwrap();
    let users: Vec<&str> = booking["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(users, ["Hi, I'd like to book a table for tonight.", "Two people, at 8pm please."], "{booking}");
    export(&sb, &["--format", "sharegpt"]);
    let sharegpt = read_jsonl(&out.join("test/export/sharegpt/sharegpt.jsonl"));
    assert_eq!(sharegpt.len(), openai.len());
    check_sharegpt(&sharegpt);
    let run = export(&sb, &["--format", "atif"]);
    assert!(run.stdout.contains("skipped 0"), "{run:?}");
}

/// Past the system message, the model's side and the other alternate, from a human message
/// to a message of the model.
fn check_sharegpt(lines: &[Value]) {
    for line in lines {
        let turns: Vec<&Value> =
            line["conversations"].as_array().unwrap().iter().filter(|m| m["from"] != "system").collect();
        assert_eq!(turns.len() % 2, 0, "{line}");
        for (i, m) in turns.iter().enumerate() {
            let from = m["from"].as_str().unwrap();
            let expected: &[&str] = if i % 2 == 0 { &["human", "observation"] } else { &["gpt", "function_call"] };
            assert!(expected.contains(&from), "message {i} is from {from}: {line}");
        }
        assert_eq!(turns[0]["from"], "human");
    }
    let two =
        lines.iter().find(|l| l["conversations"][0]["value"].as_str().unwrap().contains("a.txt and b.txt")).unwrap();
    let calls: Value = serde_json::from_str(two["conversations"][1]["value"].as_str().unwrap()).unwrap();
    assert_eq!(calls.as_array().map(Vec::len), Some(2), "{two}");
    let results: Value = serde_json::from_str(two["conversations"][2]["value"].as_str().unwrap()).unwrap();
    assert_eq!(results.as_array().map(Vec::len), Some(2), "{two}");
}

#[test]
fn an_unknown_run_is_refused_naming_it() {
    let sb = Sandbox::new();
    let run = sb.run(&["export", "nope", "--format", "atif"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("nope"), "{run:?}");
}

/// Over HTTP the request bodies are logged: the exports then carry the system prompt, the
/// tools' definitions, the model's own call ids and the priced cost.
#[tokio::test(flavor = "multi_thread")]
async fn an_http_backends_system_prompt_tools_and_cost_reach_the_exports() {
    use serde_json::json;
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let server = MockServer::start().await;
    let calls = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "kv_set", "arguments": "{\"key\": \"x\", \"value\": \"4\"}"}},
            {"id": "call_b", "type": "function", "function": {"name": "calc", "arguments": "{\"expression\": \"2+2\"}"}}]},
        "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 50, "completion_tokens": 9}});
    let text = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 2}});
    let route = || Mock::given(method("POST")).and(path("/v1/chat/completions"));
    route().respond_with(ResponseTemplate::new(200).set_body_json(calls)).up_to_n_times(1).mount(&server).await;
    route().respond_with(ResponseTemplate::new(200).set_body_json(text)).mount(&server).await;

    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        "suite: m\nenvironment: kv\nagent: {system: Be brief.}\nscorers: [{equals: \"4\"}]\ntasks:\n  - {id: t, input: What is 2+2?}\n",
    );
    sb.write(
        "runner.yaml",
        "providers:\n  openai: {max_retries: 0, timeout_s: 5}\nprices:\n  openai/gpt-test: {input: 1.0, output: 2.0}\n",
    );
    let env = [("OPENAI_BASE_URL", format!("{}/v1", server.uri())), ("OPENAI_API_KEY", "sk-test".to_owned())];
    let args = ["eval", "s.yaml", "--model", "openai/gpt-test", "--run-id", "test", "--out", "results"];
    let run = crate::models::run_with(&sb, &args, &env).await;
    assert_eq!(run.code, 0, "{run:?}");

    let sb = std::sync::Arc::new(sb);
    let exported = {
        let sb = sb.clone();
        tokio::task::spawn_blocking(move || {
            for format in ["openai", "sharegpt", "atif"] {
                export(&sb, &["--format", format]);
            }
        })
    };
    exported.await.unwrap();
    let dir = sb.path().join("results/test/export");

    let line = &read_jsonl(&dir.join("openai/openai.jsonl"))[0];
    check_openai(std::slice::from_ref(line));
    let messages = line["messages"].as_array().unwrap();
    assert_eq!(messages[0], json!({"role": "system", "content": "Be brief."}));
    assert_eq!(messages[2]["tool_calls"][0]["id"], "call_a");
    assert_eq!(messages[3]["tool_call_id"], "call_a");
    assert_eq!(messages[4]["tool_call_id"], "call_b");
    assert_eq!(messages.last().unwrap(), &json!({"role": "assistant", "content": "4"}));
    let tools: Vec<&str> =
        line["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert!(tools.contains(&"calc") && tools.contains(&"kv_set"), "{tools:?}");

    let sharegpt = &read_jsonl(&dir.join("sharegpt/sharegpt.jsonl"))[0];
    assert_eq!(sharegpt["conversations"][0], json!({"from": "system", "value": "Be brief."}));
    let tools: Value = serde_json::from_str(sharegpt["tools"].as_str().unwrap()).unwrap();
    assert!(tools.as_array().unwrap().iter().any(|t| t["name"] == "calc"), "{tools}");
    assert_eq!(sharegpt["conversations"].as_array().unwrap().last().unwrap(), &json!({"from": "gpt", "value": "4"}));

    let report = read(&dir.join("atif/export.json"));
    assert_eq!(report["without_system_prompt"], 0, "{report}");
    let trajectory = read(&dir.join("atif").join(report["files"][0].as_str().unwrap()));
    assert_eq!(trajectory["steps"][0], json!({"step_id": 1, "source": "system", "message": "Be brief."}));
    assert_eq!(trajectory["agent"]["tool_definitions"].as_array().map(|t| t.len() >= 2), Some(true));
    // 50 input at $1/M and 9 output at $2/M, then 20 and 2.
    let cost = trajectory["final_metrics"]["total_cost_usd"].as_f64().unwrap();
    assert!((cost - 92.0 / 1e6).abs() < 1e-12, "{cost}");
    assert_eq!(trajectory["steps"][2]["metrics"]["prompt_tokens"], 50);
    assert!(trajectory["steps"][2]["metrics"]["cost_usd"].as_f64().is_some(), "{trajectory}");
}

/// A log cut short (the process was killed) holds an episode that never finished: it is
/// skipped and counted, never written half.
#[test]
fn an_episode_the_log_never_saw_finish_is_skipped_as_unfinished() {
    let sb = run_suite();
    let log = sb.path().join("results/test/events.jsonl");
    let events = read_jsonl(&log);
    let wrong = events.iter().find(|e| e["type"] == "episode_started" && e["task_id"] == "wrong").unwrap();
    let id = wrong["episode_id"].clone();
    let kept: String = events
        .iter()
        .filter(|e| !(e["episode_id"] == id && e["type"] == "episode_finished") && e["type"] != "run_finished")
        .map(|e| format!("{e}\n"))
        .collect();
    std::fs::write(&log, kept).unwrap();
    let run = export(&sb, &["--format", "openai"]);
    assert!(run.stdout.contains("exported 2 episode(s)"), "{run:?}");
    assert!(run.stdout.contains("skipped 1: unfinished: the log ends before the episode does"), "{run:?}");
    let report = read(&sb.path().join("results/test/export/openai/export.json"));
    let skipped: Vec<&Value> =
        report["episodes"].as_array().unwrap().iter().filter(|e| e.get("skipped").is_some()).collect();
    assert_eq!(skipped[0]["episode_id"], id, "{report}");
}

/// Regression: a resumed run runs an unscored episode again under the same id; the export
/// is its latest attempt alone, not both attempts' turns run together.
#[test]
fn a_resumed_episode_is_exported_from_its_latest_attempt_only() {
    let sb = Sandbox::new();
    let suite = "suite: s\nenvironment: kv\nscorers: [{equals: \"4\"}]\ntasks:\n  - id: t\n    input: What is 2 + 2?\n    mock:\n      - tool_calls: [{name: calc, arguments: {expression: \"2+2\"}}]\n";
    sb.write("s.yaml", suite);
    let run = sb.eval(&["s.yaml"]);
    assert!(run.stdout.contains("UNSCORED"), "the mock runs out of turns: {run:?}");
    let resumed = sb.run(&["eval", "s.yaml", "--model", "mock", "--resume", "test", "--out", "results"]);
    assert!(resumed.stdout.contains("UNSCORED"), "{resumed:?}");
    let starts = sb.events().iter().filter(|e| e["type"] == "episode_started").count();
    assert_eq!(starts, 2, "the episode ran twice");
    export(&sb, &["--format", "openai"]);
    let lines = read_jsonl(&sb.path().join("results/test/export/openai/openai.jsonl"));
    assert_eq!(lines.len(), 1);
    let roles: Vec<&str> =
        lines[0]["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["user", "assistant", "tool"], "{}", lines[0]);
}

/// The oracle runs reference solutions without a model: its episodes have nothing to learn
/// from, and the export says so rather than writing empty conversations.
#[test]
fn episodes_without_model_turns_are_skipped_and_said_so() {
    let sb = Sandbox::new();
    let out = sb.path().join("results");
    let run = sb
        .command()
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["eval", "tasks/harbor", "--agent", "oracle", "--run-id", "test", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let run = crate::Run::from(run);
    assert_eq!(run.code, 0, "{run:?}");
    let run = export(&sb, &["--format", "atif"]);
    assert!(run.stdout.contains("exported 0 episode(s)"), "{run:?}");
    assert!(run.stdout.contains("skipped 3: no model turns (an agent without a model)"), "{run:?}");
}

/// Regression: an episode whose model call the time limit cut (nothing of it is logged) was
/// skipped as "an agent without a model". The loop waits 2 s past the deadline for an
/// agent's turn: a 4 s answer is cut.
#[test]
fn an_episode_whose_model_call_was_cut_is_skipped_saying_so() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        "suite: s\nenvironment: kv\nscorers: [{equals: ok}]\ntasks:\n  - {id: a, input: hi, mock: [{text: ok}]}\n",
    );
    let args = ["eval", "s.yaml", "--model", "mock", "--mock-delay-ms", "4000", "--time-s", "0.5"];
    let run = sb.run(&[&args[..], &["--run-id", "test", "--out", "results"]].concat());
    assert!(run.stdout.contains("FAIL s/a (mock, epoch 1) 1 steps, time_limit"), "{run:?}");
    let run = export(&sb, &["--format", "openai"]);
    let why =
        "no model turns: the episode ended (time_limit) while its first model call was running, and that call was cut";
    assert!(run.stdout.contains(&format!("skipped 1: {why}")), "{run:?}");
    assert!(!run.stdout.contains("an agent without a model"), "{run:?}");
}
