//! The task's user as part of the world: scripted and simulated users, conversations that
//! end on the user's stop word, plan mode's approval, and a user whose model fails.

use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

use crate::models::run_with;
use crate::{Sandbox, of_type};

/// Copies an example suite of the repository into the sandbox and runs it with `mock`.
fn example(sb: &Sandbox, name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(format!("{}/tasks/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    sb.write(name, &text);
    let run = sb.eval(&[name]);
    assert_eq!(run.code, 0, "{run:?}");
    sb.events()
}

/// Each episode's task id and its `episode_finished` event.
fn finishes(events: &[Value]) -> Vec<(String, Value)> {
    let task_of = |id: &Value| {
        of_type(events, "episode_started")
            .into_iter()
            .find(|e| &e["episode_id"] == id)
            .map(|e| e["task_id"].as_str().unwrap_or_default().to_owned())
            .unwrap_or_default()
    };
    let mut all: Vec<(String, Value)> =
        of_type(events, "episode_finished").into_iter().map(|e| (task_of(&e["episode_id"]), e.clone())).collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

fn of_episode<'a>(events: &'a [Value], task: &str, kind: &str) -> Vec<&'a Value> {
    let id =
        of_type(events, "episode_started").into_iter().find(|e| e["task_id"] == task).unwrap()["episode_id"].clone();
    events.iter().filter(|e| e["episode_id"] == id && e["type"] == kind).collect()
}

#[test]
fn the_user_example_suite_answers_ask_user_clarify_and_ask_rules() {
    let sb = Sandbox::new();
    let events = example(&sb, "user.yaml");
    for (task, finish) in finishes(&events) {
        assert_eq!(finish["outcome"]["passed"], true, "{task}: {finish}");
    }
    let asks = of_episode(&events, "the-user-answers-ask-rules", "permission");
    let decided: Vec<(&str, &str)> =
        asks.iter().map(|p| (p["decision"].as_str().unwrap(), p["answer"].as_str().unwrap())).collect();
    // `ask_user` took the first scripted reply, the first delete the second; the fixed reply refuses.
    assert_eq!(decided, [("allow", "yes"), ("deny", "no, leave the rest")]);
}

#[test]
fn the_conversation_example_ends_when_the_user_says_the_stop_word() {
    let sb = Sandbox::new();
    let events = example(&sb, "conversation.yaml");
    let finished = finishes(&events);
    assert_eq!(finished.len(), 2);
    for (task, finish) in &finished {
        assert_eq!(finish["termination"], "user_ended", "{task}");
        assert_eq!(finish["outcome"]["passed"], true, "{task}: {finish}");
    }
    let said: Vec<(String, String)> = of_episode(&events, "book-a-table", "said")
        .iter()
        .map(|e| (e["actor"].as_str().unwrap().to_owned(), e["text"].as_str().unwrap().to_owned()))
        .collect();
    let actors: Vec<&str> = said.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(actors, ["user", "main", "user", "main", "user"]);
    assert_eq!(said[0].1, "Hi, I'd like to book a table for tonight.", "the input opens the conversation");
    assert!(said[4].1.contains("###STOP###"));
    // The user's model calls are the user's: marked, and not counted as the agent's.
    let calls = of_episode(&events, "book-a-table", "model_call");
    let users = calls.iter().filter(|c| c["actor"] == "user").count();
    assert_eq!((calls.len(), users), (5, 2));
    let finish = &finished.iter().find(|(t, _)| t == "book-a-table").unwrap().1;
    assert!(finish["user_usage"]["input_tokens"].as_u64().unwrap() > 0, "{finish}");
    let table = std::fs::read_to_string(sb.path().join("results/test/episodes.csv")).unwrap();
    let row = table.lines().find(|l| l.contains("book-a-table")).unwrap();
    let header: Vec<&str> = table.lines().next().unwrap().split(',').collect();
    let at = header.iter().position(|h| *h == "model_calls").unwrap();
    assert_eq!(row.split(',').nth(at), Some("3"), "only the agent's calls: {row}");

    // A regrade reads what was said from the log alone.
    let regrade = sb.run(&["regrade", "results/test"]);
    assert_eq!(regrade.code, 0, "{regrade:?}");
    let events = sb.events();
    let regraded: Vec<(&str, bool)> = of_type(&events, "score")
        .into_iter()
        .filter(|s| s["scoring_id"] != "initial" && s["scorer"] == "communicated")
        .map(|s| (s["explanation"].as_str().unwrap(), s["passed"].as_bool().unwrap()))
        .collect();
    assert_eq!(regraded.len(), 2, "{regraded:?}");
    assert!(regraded.iter().all(|(_, passed)| *passed), "{regraded:?}");
}

#[test]
fn the_plan_mode_example_refuses_writes_until_the_plan_is_approved() {
    let sb = Sandbox::new();
    let events = example(&sb, "plan-mode.yaml");
    for (task, finish) in finishes(&events) {
        assert_eq!(finish["outcome"]["passed"], true, "{task}: {finish}");
    }
    // The write proposed in plan mode never reached the world: no `action_dispatched` for it.
    let dispatched: Vec<&str> = of_episode(&events, "plan-then-act", "action_dispatched")
        .iter()
        .map(|e| e["call"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(dispatched, ["kv_list", "exit_plan_mode", "kv_set", "final_answer"]);
    let actions: Vec<(&str, &str, bool)> = of_episode(&events, "rejected-then-approved", "agent_action")
        .iter()
        .map(|a| (a["name"].as_str().unwrap(), a["class"].as_str().unwrap(), a.get("error").is_some()))
        .collect();
    assert_eq!(
        actions,
        [
            ("enter_plan_mode", "cognitive", false),
            ("exit_plan_mode", "hybrid", false),
            ("kv_delete", "cognitive", true),
            ("exit_plan_mode", "hybrid", false),
        ]
    );
    // The rejection's feedback is what the agent observed.
    let feedback = of_episode(&events, "rejected-then-approved", "observation")
        .into_iter()
        .map(|e| &e["observation"])
        .find(|o| o["tool_result"]["approved"] == false)
        .unwrap();
    assert_eq!(feedback["tool_result"]["feedback"], "reject: keep b");
}

#[test]
fn a_mock_user_that_runs_out_makes_the_episode_unscored_as_user_error() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        r#"
suite: s
environment: kv
tasks:
  - id: t
    input: hello
    conversation: true
    user: {simulated: {model: mock, persona: p, instructions: i}}
    mock_user: [{text: "tell me more"}]
    scorers: [{includes: x}]
    mock: [{text: "hi"}, {text: "more"}]
"#,
    );
    let run = sb.eval(&["s.yaml"]);
    assert_ne!(run.code, 0, "{run:?}");
    let events = sb.events();
    let finish = of_type(&events, "episode_finished")[0];
    assert_eq!(finish["outcome"]["status"], "unscored", "{finish}");
    assert_eq!(finish["outcome"]["cause"], "user_error", "{finish}");
    assert!(finish["outcome"]["message"].as_str().unwrap().contains("mock_exhausted"), "{finish}");
}

/// A suite whose simulated user is the model `local/user`, and the config that points it at `server`.
fn simulated_suite(sb: &Sandbox, server: &MockServer) {
    sb.write(
        "s.yaml",
        r#"
suite: s
environment: kv
tasks:
  - id: book
    input: I need a table.
    conversation: true
    user:
      simulated:
        model: local/user
        persona: A diner in a hurry.
        instructions: Two people at 8pm. End with DONE.
        stop: DONE
    scorers: [{communicated: "how many"}, {includes: booked}]
"#,
    );
    sb.write(
        "local.yaml",
        &format!(
            "providers:\n  local: {{api: openai, base_url: \"{}/v1\", max_retries: 0, timeout_s: 10}}\n",
            server.uri()
        ),
    );
}

fn text(answer: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({
        "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 5}
    }))
}

/// Answers the agent's (`local/agent`) and the user's (`local/user`) turns, each in order,
/// and keeps the bodies the user's model was sent. Anything past a script is a 500.
struct Turns {
    agent: Vec<ResponseTemplate>,
    user: Vec<ResponseTemplate>,
    seen: std::sync::Mutex<(usize, Vec<Value>)>,
}

/// The server's side of the `Turns` the test keeps.
struct Shared(std::sync::Arc<Turns>);

impl wiremock::Respond for Shared {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let mut seen = self.0.seen.lock().unwrap();
        let answer = if body["model"] == "user" {
            seen.1.push(body);
            self.0.user.get(seen.1.len() - 1)
        } else {
            seen.0 += 1;
            self.0.agent.get(seen.0 - 1)
        };
        answer.cloned().unwrap_or_else(|| ResponseTemplate::new(500))
    }
}

async fn serve(user: Vec<ResponseTemplate>) -> (MockServer, std::sync::Arc<Turns>) {
    let server = MockServer::start().await;
    let agent = vec![text("For how many, and when?"), text("You are booked.")];
    let turns = std::sync::Arc::new(Turns { agent, user, seen: Default::default() });
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(Shared(turns.clone()))
        .mount(&server)
        .await;
    (server, turns)
}

const EVAL: &[&str] = &["eval", "s.yaml", "--model", "local/agent", "--config", "local.yaml", "--out", "results"];

#[tokio::test(flavor = "multi_thread")]
async fn a_simulated_user_over_http_plays_its_persona_and_ends_the_conversation() {
    let (server, turns) = serve(vec![text("Two people, 8pm."), text("Great, thanks. DONE")]).await;
    let sb = Sandbox::new();
    simulated_suite(&sb, &server);
    let run = run_with(&sb, &[EVAL, &["--run-id", "test", "--record", "tape.jsonl"]].concat(), &[]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let finish = of_type(&events, "episode_finished")[0];
    assert_eq!(finish["termination"], "user_ended", "{finish}");
    // The agent's tokens are its own two calls': 2 × (50 in, 5 out).
    assert_eq!(finish["usage"], json!({"input_tokens": 100, "output_tokens": 10, "cached_tokens": 0}));
    assert_eq!(finish["outcome"]["passed"], true, "{finish}");
    assert_eq!(finish["user_usage"], json!({"input_tokens": 100, "output_tokens": 10, "cached_tokens": 0}));
    let seen = turns.seen.lock().unwrap().1.clone();
    assert_eq!(seen.len(), 2);
    let system = seen[0]["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("A diner in a hurry.") && system.contains("End with DONE") && system.contains("DONE alone")
    );
    // The user's model sees the agent as the other party, and its own replies as its own.
    let second = &seen[1]["messages"];
    assert_eq!(second[1], json!({"role": "user", "content": "For how many, and when?"}));
    assert_eq!(second[2]["role"], "assistant");
    assert_eq!(second[2]["content"], "Two people, 8pm.");
    let user_calls: Vec<&Value> = of_type(&events, "model_call").into_iter().filter(|c| c["actor"] == "user").collect();
    assert_eq!(user_calls.len(), 2);
    assert_eq!(user_calls[0]["model"], "local/user");

    // Replayed from the run's log or from its cassette, the agent's and the user's answers
    // come back without the server.
    drop(server);
    for (source, id) in [("replay:results/test", "again"), ("replay:tape.jsonl", "tape")] {
        let args = ["eval", "s.yaml", "--model", source, "--run-id", id, "--out", "results"];
        let replay = run_with(&sb, &args, &[]).await;
        assert_eq!(replay.code, 0, "{source}: {replay:?}");
        let events = crate::read_jsonl(&sb.path().join(format!("results/{id}/events.jsonl")));
        let finish = of_type(&events, "episode_finished")[0];
        let ended = (finish["termination"].as_str(), finish["outcome"]["passed"].as_bool());
        assert_eq!(ended, (Some("user_ended"), Some(true)), "{source}");
        let said: Vec<&str> = of_type(&events, "said").iter().map(|e| e["text"].as_str().unwrap()).collect();
        assert_eq!(
            said,
            [
                "I need a table.",
                "For how many, and when?",
                "Two people, 8pm.",
                "You are booked.",
                "Great, thanks. DONE"
            ],
            "{source}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_simulated_user_whose_server_fails_makes_the_episode_unscored_not_failed() {
    // The user's first answer is fine, its second a 500: the episode is nobody's failure.
    let (server, _) = serve(vec![text("Two people.")]).await;
    let sb = Sandbox::new();
    simulated_suite(&sb, &server);
    let run = run_with(&sb, &[EVAL, &["--run-id", "test"]].concat(), &[]).await;
    assert_ne!(run.code, 0, "{run:?}");
    let events = sb.events();
    let finish = of_type(&events, "episode_finished")[0];
    assert_eq!(finish["outcome"]["status"], "unscored", "{finish}");
    assert_eq!(finish["outcome"]["cause"], "user_error", "{finish}");
    let failed: Vec<&Value> =
        of_type(&events, "model_call").into_iter().filter(|c| c["actor"] == "user" && !c["error"].is_null()).collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["cause"], "provider_error");
}

#[test]
fn a_bad_user_is_named_with_its_field() {
    let cases = [
        ("conversation: true", "conversation", "needs the task's `user:`"),
        ("user: {script: [a], simulated: {model: mock}}", "user", "not both"),
        ("user: {}", "user", "expected `script:"),
        ("user: {script: [a]}\n    answers: [yes]", "answers", "user.script"),
        ("user: {script: [a]}\n    mock_user: [{text: x}]", "mock_user", "scripted"),
        ("user: {script: [a], stop: \"\"}", "user.stop", "cannot be empty"),
    ];
    for (yaml, field, message) in cases {
        let sb = Sandbox::new();
        sb.write(
            "s.yaml",
            &format!("suite: s\nenvironment: kv\ntasks:\n  - id: t\n    input: hi\n    scorers: [{{includes: x}}]\n    {yaml}\n"),
        );
        let run = sb.run(&["validate", "s.yaml"]);
        assert_ne!(run.code, 0, "{yaml}: {run:?}");
        assert!(run.stderr.contains(field) && run.stderr.contains(message), "{yaml}: {}", run.stderr);
        assert!(run.stderr.contains("s.yaml:"), "the file and line: {}", run.stderr);
    }
}

#[test]
fn under_the_mock_model_a_simulated_user_of_any_model_is_played_by_its_mock_user_turns() {
    // No key and no server for `openai/…`: under `--model mock` nothing is opened for it.
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        r#"
suite: s
environment: kv
tasks:
  - id: t
    input: hello
    conversation: true
    user: {simulated: {model: openai/gpt-4o-mini, persona: p, instructions: i, stop: BYE}}
    mock_user: [{text: "BYE"}]
    scorers: [{communicated: hi}]
    mock: [{text: "hi"}]
"#,
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let user = of_type(&events, "model_call").into_iter().find(|c| c["actor"] == "user").cloned().unwrap();
    assert_eq!(user["model"], "mock");
    assert_eq!(of_type(&events, "episode_finished")[0]["termination"], "user_ended");
}
