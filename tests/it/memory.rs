//! The agent's bounded memory end to end: the stores across a task's epochs (`scope:
//! task`) and across a resume, each epoch afresh (`scope: episode`), and the stores in the
//! system prompt a real HTTP model is sent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::{Sandbox, of_type, read_jsonl};

/// Each epoch reads the user store, then adds one entry, then answers.
fn suite(scope: &str, epochs: u32) -> String {
    format!(
        r#"
suite: mem
environment: kv
agent:
  memory: {{scope: {scope}}}
epochs: {epochs}
scorers: [{{includes: ok}}]
tasks:
  - id: t
    input: remember
    memory: {{user: ["is called Ada"]}}
    mock:
      - tool_calls: [{{name: memory, arguments: {{action: read, target: user}}}}]
      - tool_calls: [{{name: memory, arguments: {{action: add, target: user, content: "likes tea"}}}}]
      - text: ok
"#
    )
}

/// Per epoch, the `agent_action` events of its episode, in order: (action, entries or error).
fn actions_by_epoch(events: &[Value]) -> HashMap<u64, Vec<(String, Value)>> {
    let epochs: HashMap<&str, u64> = of_type(events, "episode_started")
        .iter()
        .map(|e| (e["episode_id"].as_str().unwrap(), e["epoch"].as_u64().unwrap()))
        .collect();
    let mut by_epoch: HashMap<u64, Vec<(String, Value)>> = HashMap::new();
    for a in of_type(events, "agent_action") {
        assert_eq!(a["class"], "cognitive", "{a}");
        let outcome = if a["error"].is_null() { a["result"]["entries"].clone() } else { a["error"]["message"].clone() };
        let action = a["arguments"]["action"].as_str().unwrap().to_owned();
        by_epoch.entry(epochs[a["episode_id"].as_str().unwrap()]).or_default().push((action, outcome));
    }
    by_epoch
}

fn first_epoch() -> Vec<(String, Value)> {
    vec![("read".into(), json!(["is called Ada"])), ("add".into(), json!(["is called Ada", "likes tea"]))]
}

fn later_epoch() -> Vec<(String, Value)> {
    vec![
        ("read".into(), json!(["is called Ada", "likes tea"])),
        ("add".into(), json!("that entry is already in `user`; nothing was added")),
    ]
}

/// A crash right after the first episode finished: the log ends there.
pub fn cut_after_the_first_finish(events: &std::path::Path) {
    let text = std::fs::read_to_string(events).unwrap();
    let first_end = text.find("\"type\":\"episode_finished\"").unwrap();
    let end = first_end + text[first_end..].find('\n').unwrap() + 1;
    std::fs::write(events, &text[..end]).unwrap();
}

fn memory_files(sb: &Sandbox) -> Vec<Value> {
    let dir = sb.path().join("results/test/memory");
    let mut files: Vec<Value> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| serde_json::from_slice(&std::fs::read(e.path()).unwrap()).unwrap()).collect())
        .unwrap_or_default();
    files.sort_by_key(|v| v.to_string());
    files
}

#[test]
fn with_scope_task_each_epoch_starts_from_what_the_one_before_left_even_run_at_once() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite("task", 3));
    let run = sb.eval(&["s.yaml", "-j", "3"]);
    assert_eq!(run.code, 0, "{run:?}");
    let by_epoch = actions_by_epoch(&sb.events());
    assert_eq!(by_epoch[&1], first_epoch());
    assert_eq!(by_epoch[&2], later_epoch());
    assert_eq!(by_epoch[&3], later_epoch());
    // Each epoch saves what it leaves in a file of its own; all three left the same stores.
    let left = json!({"memory": [], "user": ["is called Ada", "likes tea"]});
    assert_eq!(memory_files(&sb), [left.clone(), left.clone(), left]);
    // The world never saw a memory call.
    assert!(of_type(&sb.events(), "action_dispatched").iter().all(|d| d["call"]["name"] != "memory"));
}

#[test]
fn with_scope_episode_every_epoch_starts_from_the_tasks_entries_and_nothing_is_kept() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite("episode", 2));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let by_epoch = actions_by_epoch(&sb.events());
    assert_eq!(by_epoch[&1], first_epoch());
    assert_eq!(by_epoch[&2], first_epoch());
    assert!(!sb.path().join("results/test/memory").exists());
}

#[test]
fn a_resumed_run_starts_the_epochs_it_runs_again_from_the_memory_in_the_run_folder() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite("task", 3));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    // A crash right after epoch 1 finished: the log ends there. (Epochs 2 and 3 left the
    // stores as epoch 1 did: their add was refused.)
    let events = sb.path().join("results/test/events.jsonl");
    cut_after_the_first_finish(&events);
    assert_eq!(actions_by_epoch(&read_jsonl(&events)).len(), 1);

    let resumed = sb.run(&["eval", "s.yaml", "--model", "mock", "--resume", "test", "--out", "results"]);
    assert_eq!(resumed.code, 0, "{resumed:?}");
    assert!(resumed.stderr.contains("1 scored episodes kept, 2 to run"), "{resumed:?}");
    let by_epoch = actions_by_epoch(&read_jsonl(&events));
    assert_eq!(by_epoch[&1], first_epoch());
    // Not the task's entries: the run folder's.
    assert_eq!(by_epoch[&2], later_epoch());
    assert_eq!(by_epoch[&3], later_epoch());
}

/// Regression: the stores read back from the run folder skipped the checks the suite's own
/// entries get, so a file edited by hand (or by another tool) reached the agent as it was.
#[test]
fn memory_read_back_from_the_run_folder_gets_the_suites_checks() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite("task", 2));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.path().join("results/test/events.jsonl");
    cut_after_the_first_finish(&events);
    // The kept stores now hold an entry twice, which the memory tool refuses.
    let dir = sb.path().join("results/test/memory");
    // What epoch 1 left, which the resumed epoch 2 starts from.
    let file = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(".e1.json"))
        .unwrap();
    std::fs::write(&file, r#"{"memory": [], "user": ["is called Ada", "is called Ada"]}"#).unwrap();

    let resumed = sb.run(&["eval", "s.yaml", "--model", "mock", "--resume", "test", "--out", "results"]);
    assert_eq!(resumed.code, 3, "{resumed:?}");
    let all = read_jsonl(&events);
    let finished = of_type(&all, "episode_finished");
    let outcome = &finished.last().unwrap()["outcome"];
    assert_eq!(outcome["cause"], "memory_error", "{outcome}");
    let message = outcome["message"].as_str().unwrap_or_default();
    assert!(message.contains("user[1] is not what the memory tool accepts"), "{message}");
}

/// Answers each request with the next response, keeping the requests' bodies.
struct Script {
    responses: Vec<Value>,
    bodies: Mutex<Vec<Value>>,
}

/// The server's handle on the script, which the test keeps too.
struct Shared(Arc<Script>);

impl Respond for Shared {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let script = &self.0;
        let mut bodies = script.bodies.lock().unwrap();
        bodies.push(request.body_json().unwrap_or(Value::Null));
        let at = (bodies.len() - 1).min(script.responses.len() - 1);
        ResponseTemplate::new(200).set_body_json(&script.responses[at])
    }
}

fn openai(message: Value) -> Value {
    json!({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 30, "completion_tokens": 5}})
}

#[tokio::test(flavor = "multi_thread")]
async fn the_model_is_sent_the_stores_in_its_system_prompt_and_the_memory_tool() {
    let add = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "m1", "type": "function",
        "function": {"name": "memory", "arguments": "{\"action\":\"add\",\"target\":\"memory\",\"content\":\"the answer is 4\"}"}}]});
    let answer = json!({"role": "assistant", "content": "4"});
    let script = Arc::new(Script {
        responses: vec![openai(add), openai(answer.clone()), openai(answer)],
        bodies: Mutex::new(Vec::new()),
    });
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(Shared(script.clone()))
        .mount(&server)
        .await;
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        "suite: m\nenvironment: kv\nagent:\n  system: Be brief.\n  memory: {memory_chars: 1000, scope: task}\nepochs: 2\n\
         scorers: [{equals: \"4\"}]\ntasks:\n  - {id: t, input: What is 2+2?}\n",
    );
    let args = ["eval", "s.yaml", "--model", "openai/gpt-test", "--run-id", "test", "--out", "results"];
    let run = crate::models::run_with(&sb, &args, &crate::models::openai_env(&server)).await;
    assert_eq!(run.code, 0, "{run:?}");

    let bodies = script.bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 3, "two turns in epoch 1, one in epoch 2");
    let system = |body: &Value| body["messages"][0].clone();
    let empty = "Be brief.\n\nMEMORY (your notes) [0% — 0/1,000 chars]\n(empty)\n\n\
                 USER PROFILE (what you know about the user) [0% — 0/1,375 chars]\n(empty)\n\n\
                 Keep them with the `memory` tool: add, replace or remove an entry, or read a store.";
    assert_eq!(system(&bodies[0]), json!({"role": "system", "content": empty}));
    // Within the episode the prompt stays as it began; the tool's answer had the news.
    assert_eq!(system(&bodies[1]), system(&bodies[0]));
    let tool_answer = bodies[1]["messages"].as_array().unwrap().iter().find(|m| m["role"] == "tool").unwrap().clone();
    let content: Value = serde_json::from_str(tool_answer["content"].as_str().unwrap()).unwrap();
    assert_eq!(content["usage"], "[1% — 15/1,000 chars]");
    // Epoch 2 starts from what epoch 1 left: 15 chars of 1,000.
    let kept = empty.replace("[0% — 0/1,000 chars]\n(empty)", "[1% — 15/1,000 chars]\nthe answer is 4");
    assert_eq!(system(&bodies[2]), json!({"role": "system", "content": kept}));
    // The memory tool is offered after the world's tools.
    let tools: Vec<&str> =
        bodies[0]["tools"].as_array().unwrap().iter().map(|t| t["function"]["name"].as_str().unwrap()).collect();
    assert_eq!(tools.last(), Some(&"memory"), "{tools:?}");
    assert!(tools.contains(&"kv_get") && tools.contains(&"final_answer"), "{tools:?}");
}
