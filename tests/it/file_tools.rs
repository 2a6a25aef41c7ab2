//! The shell's file tools and its world model through the binary: a file the agent read
//! changes under it, the agent is reminded before its next model call (an event, and a
//! message its model sees), and an edit of the stale file is refused.

use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::models::{openai_env, run_with};
use crate::{Sandbox, of_type, tool_observations};

/// Read, change by a command, edit (refused: stale), read again, edit, answer.
const TURNS: &[(&str, &str)] = &[
    ("read_file", r#"{"path": "notes.txt"}"#),
    ("run_command", r#"{"command": "echo appended >> notes.txt"}"#),
    ("edit_file", r#"{"path": "notes.txt", "old_string": "draft", "new_string": "final"}"#),
    ("read_file", r#"{"path": "notes.txt"}"#),
    ("edit_file", r#"{"path": "notes.txt", "old_string": "draft", "new_string": "final"}"#),
    ("final_answer", r#"{"answer": "ok"}"#),
];

fn suite(mock: &str) -> String {
    format!(
        "suite: files\nenvironment: shell\nscorers:\n  - includes: ok\n  - file_contains: {{path: notes.txt, text: final}}\ntasks:\n  - id: t\n    input: go\n    files: {{notes.txt: \"a draft\\n\"}}\n{mock}"
    )
}

fn reminder_of(events: &[Value]) -> Value {
    let reminders = of_type(events, "reminder");
    assert_eq!(reminders.len(), 1, "one change, one reminder: {reminders:?}");
    reminders[0].clone()
}

#[test]
fn a_file_changed_by_a_command_is_named_in_a_reminder_and_a_stale_edit_is_refused() {
    let sb = Sandbox::new();
    let mock: String = TURNS
        .iter()
        .map(|(name, args)| format!("      - tool_calls: [{{name: {name}, arguments: {args}}}]\n"))
        .collect();
    sb.write("s.yaml", &format!("{}    mock:\n{mock}", suite("")));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();

    let reminder = reminder_of(&events);
    assert_eq!(reminder["kind"], "stale_files");
    assert_eq!(reminder["paths"], json!(["notes.txt"]));
    assert_eq!(reminder["step"], 3, "named before the model call that follows the change");
    assert!(reminder["text"].as_str().unwrap().contains("notes.txt"), "{reminder}");
    // Logged before the model call of its step: the model was asked after it.
    let step3_call = events.iter().find(|e| e["type"] == "model_call" && e["step"] == 3).unwrap();
    assert!(reminder["seq"].as_u64() < step3_call["seq"].as_u64());

    let obs = tool_observations(&events);
    assert_eq!(obs[2]["error"]["type"], "ExecutionError", "{}", obs[2]);
    let message = obs[2]["error"]["message"].as_str().unwrap();
    assert!(message.contains("changed since you last read it; read it again"), "{message}");
    assert_eq!(obs[3]["tool_result"]["content"], "     1\ta draft\n     2\tappended\n");
    assert_eq!(obs[4]["tool_result"]["replacements"], 1, "{}", obs[4]);
    assert_eq!(of_type(&events, "episode_finished")[0]["outcome"]["passed"], true);
}

/// Answers with each of the turns in order, keeping the bodies it was sent.
struct Script(std::sync::Mutex<Vec<Value>>);

impl Respond for Script {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let mut bodies = self.0.lock().unwrap();
        bodies.push(request.body_json().unwrap_or(Value::Null));
        let (name, args) = TURNS[(bodies.len() - 1).min(TURNS.len() - 1)];
        let call = json!({"id": format!("call_{}", bodies.len()), "type": "function",
                          "function": {"name": name, "arguments": args}});
        ResponseTemplate::new(200).set_body_json(json!({"choices": [{"index": 0,
            "message": {"role": "assistant", "content": null, "tool_calls": [call]}, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5}}))
    }
}

struct Shared(std::sync::Arc<Script>);

impl Respond for Shared {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        self.0.respond(request)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_model_call_after_a_change_carries_the_reminder() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(""));
    let server = MockServer::start().await;
    let script = std::sync::Arc::new(Script(std::sync::Mutex::new(Vec::new())));
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(Shared(script.clone()))
        .mount(&server)
        .await;
    let args = ["eval", "s.yaml", "--model", "openai/gpt-test", "--run-id", "test", "--out", "results"];
    let run = run_with(&sb, &args, &openai_env(&server)).await;
    assert_eq!(run.code, 0, "{run:?}");
    let text = reminder_of(&sb.events())["text"].as_str().unwrap().to_owned();

    let bodies = script.0.lock().unwrap().clone();
    let reminded = |body: &Value| {
        body["messages"].as_array().unwrap().iter().any(|m| m["role"] == "user" && m["content"] == text.as_str())
    };
    assert!(!reminded(&bodies[1]), "reminded before anything changed");
    // The third request is the first after the command: its last message is the reminder.
    let third = bodies[2]["messages"].as_array().unwrap();
    assert_eq!(third.last().unwrap(), &json!({"role": "user", "content": text}));
    assert!(bodies[3..].iter().all(reminded), "the reminder stays in the transcript");
}
