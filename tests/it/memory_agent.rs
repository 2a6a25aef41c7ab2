//! The `memory` agent over the `memory_store` kind, end to end through the binary: the
//! control states of a replay, the reminder for a model that skips its call, threads kept
//! apart, and a run killed with SIGKILL mid-conversation then resumed.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{Sandbox, of_type, read_jsonl, tool_observations};

/// A model turn that writes whichever call the agent asks for, and answers `Rex`.
const ANY_CALL: &str = r#"{text: "Rex", tool_calls: [{name: add_entry, arguments: {summary: "noted", raw_entry: "x"}}, {name: put_context, arguments: {content: "ctx"}}]}"#;

fn add_entry(summary: &str) -> String {
    format!(
        r#"{{tool_calls: [{{name: add_entry, arguments: {{summary: "{summary}", raw_entry: "{summary}", tags: {{role: user}}}}}}]}}"#
    )
}

fn put_context(content: &str) -> String {
    format!(r#"{{tool_calls: [{{name: put_context, arguments: {{content: "{content}"}}}}]}}"#)
}

/// A memory suite of one task per `(id, messages)`, each one session dated 2023-05-20
/// whose messages alternate user and assistant, with `mock` turns.
fn suite(flush_every: u32, tasks: &[(&str, Vec<String>, Vec<String>)]) -> String {
    let mut yaml = format!(
        "suite: mem\nenvironment: memory_store\nagent: {{kind: memory, flush_every: {flush_every}}}\n\
         limits: {{max_steps: 1000}}\nscorers: [{{includes: Rex}}]\ntasks:\n"
    );
    for (id, messages, mock) in tasks {
        let turns: Vec<Value> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| json!({"role": if i % 2 == 0 {"user"} else {"assistant"}, "content": m}))
            .collect();
        let sessions = json!([{"id": format!("{id}-s1"), "date": "2023/05/20 (Sat) 10:00", "messages": turns}]);
        yaml.push_str(&format!(
            "  - id: {id}\n    input: What is the dog called?\n    metadata: {{sessions: {sessions}}}\n    mock:\n"
        ));
        for turn in mock {
            yaml.push_str(&format!("      - {turn}\n"));
        }
    }
    yaml
}

/// `(control, direct calls, model calls, error)` of one `memory_invocation`.
type Invoked = (String, Vec<String>, Vec<String>, Option<String>);

/// Each `memory_invocation`, in order.
fn invocations(events: &[Value]) -> Vec<Invoked> {
    let names = |v: &Value| v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_owned()).collect();
    of_type(events, "memory_invocation")
        .iter()
        .map(|e| {
            (
                e["control"].as_str().unwrap().to_owned(),
                names(&e["direct"]),
                names(&e["model"]),
                e["error"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

/// The only store of the run `test`: (key, summary) of each entry, in key order.
fn stored(sb: &Sandbox) -> Vec<(String, String)> {
    let folder = sb.path().join("results/test/memory_store");
    let mut files: Vec<_> = std::fs::read_dir(&folder).unwrap().flatten().map(|e| e.path()).collect();
    files.retain(|p| p.extension().is_some_and(|x| x == "sqlite"));
    assert_eq!(files.len(), 1, "{files:?}");
    entries_of(&files[0])
}

fn entries_of(path: &Path) -> Vec<(String, String)> {
    let db = rusqlite::Connection::open(path).unwrap();
    let mut statement = db.prepare("SELECT key, summary FROM entries ORDER BY key").unwrap();
    let rows = statement.query_map([], |row| Ok((row.get(0)?, row.get(1)?))).unwrap();
    rows.map(Result::unwrap).collect()
}

fn messages(n: usize, prefix: &str) -> Vec<String> {
    (1..=n).map(|i| format!("{prefix} message {i}")).collect()
}

#[test]
fn thirteen_messages_with_flush_every_six_run_the_seeds_control_states() {
    let sb = Sandbox::new();
    let mut mock = Vec::new();
    for n in 1..=13 {
        mock.push(add_entry(&format!("m{n}")));
        if n % 6 == 0 {
            mock.push(put_context(&format!("after {n}")));
        }
    }
    mock.push(put_context("end"));
    mock.push(r#"{text: "The dog is called Rex."}"#.to_owned());
    sb.write("s.yaml", &suite(6, &[("t", messages(13, "t"), mock)]));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();

    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let mut expected = vec![("start_session".to_owned(), s(&["get_context", "list_entries"]), s(&[]), None)];
    for n in 1..=13 {
        expected.push(if n % 6 == 0 {
            ("process_message_and_flush".into(), s(&["await_consistency"]), s(&["add_entry", "put_context"]), None)
        } else {
            ("process_message".into(), s(&[]), s(&["add_entry"]), None)
        });
    }
    expected.push(("end_session".into(), s(&["await_consistency"]), s(&["put_context"]), None));
    assert_eq!(invocations(&events), expected);

    // Direct calls made no model call: one per model-written call, and one for the answer.
    assert_eq!(of_type(&events, "model_call").len(), 13 + 3 + 1);
    let entries = stored(&sb);
    assert_eq!(entries.len(), 13);
    assert_eq!(entries[0].1, "m1");
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished[0]["outcome"]["passed"], true, "{}", finished[0]);
    // The question was answered from the store's reads, made by the agent's own code.
    let dispatched: Vec<String> = of_type(&events, "action_dispatched")
        .iter()
        .map(|e| e["call"]["name"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(dispatched[dispatched.len() - 3..], ["search_entries", "get_context", "final_answer"], "{dispatched:?}");
}

#[test]
fn a_model_that_skips_add_entry_is_reminded_once_then_the_invocation_ends_in_an_error() {
    let sb = Sandbox::new();
    let mock = vec![
        // Message 1: no call, then no call again after the reminder.
        r#"{text: "I will not."}"#.to_owned(),
        r#"{text: "Still not."}"#.to_owned(),
        // Message 2: the wrong tool, then the right one after the reminder.
        put_context("wrong"),
        add_entry("m2"),
        // Message 3, then the end of the session.
        add_entry("m3"),
        put_context("end"),
        r#"{text: "Rex"}"#.to_owned(),
    ];
    sb.write("s.yaml", &suite(6, &[("t", messages(3, "t"), mock)]));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let reminders: Vec<_> =
        of_type(&events, "reminder").into_iter().filter(|r| r["kind"] == "memory_protocol").collect();
    assert_eq!(reminders.len(), 2, "{reminders:?}");
    assert!(reminders[0]["text"].as_str().unwrap().starts_with("you called no tool"), "{}", reminders[0]);
    assert!(reminders[1]["text"].as_str().unwrap().starts_with("you called `put_context`"), "{}", reminders[1]);
    let errors: Vec<_> = invocations(&events).into_iter().filter_map(|i| i.3).collect();
    assert_eq!(errors, ["the model did not call `add_entry`, even when reminded"]);
    let summaries: Vec<String> = stored(&sb).into_iter().map(|(_, s)| s).collect();
    assert_eq!(summaries, ["m2", "m3"], "the replay went on after the error");
    assert_eq!(of_type(&events, "episode_finished")[0]["outcome"]["passed"], true);
}

#[test]
fn each_thread_sees_only_its_own_conversation() {
    let sb = Sandbox::new();
    let mock = |n: usize| {
        let mut turns = vec![ANY_CALL.to_owned(); n + 1];
        turns.push(r#"{text: "Rex"}"#.to_owned());
        turns
    };
    sb.write("s.yaml", &suite(6, &[("a", messages(3, "alpha"), mock(3)), ("b", messages(3, "bravo"), mock(3))]));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    // Each thread's history (what its prompts are made of) holds its own messages only.
    let db = rusqlite::Connection::open(sb.path().join("results/test/memory_agent.sqlite")).unwrap();
    let mut statement =
        db.prepare("SELECT group_concat(content, ' | ') FROM history GROUP BY thread_id ORDER BY thread_id").unwrap();
    let states: Vec<String> = statement.query_map([], |r| r.get(0)).unwrap().map(Result::unwrap).collect();
    assert_eq!(states.len(), 2);
    for state in &states {
        let (own, other) = if state.contains("alpha") { ("alpha", "bravo") } else { ("bravo", "alpha") };
        assert!(!state.contains(other), "a thread holds the other's messages: {state}");
        assert!(state.contains(&format!("{own} message 3")), "{state}");
    }
    // And each episode its own store.
    let stores: Vec<_> = std::fs::read_dir(sb.path().join("results/test/memory_store"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sqlite"))
        .collect();
    assert_eq!(stores.len(), 2);
    for store in stores {
        assert_eq!(entries_of(&store).len(), 3, "{}", store.display());
    }
}

/// The replay's invocations that the checkpoints say are done, per thread.
fn checkpointed(run: &Path) -> u64 {
    let Ok(db) = rusqlite::Connection::open(run.join("memory_agent.sqlite")) else { return 0 };
    db.query_row("SELECT state FROM threads", [], |r| r.get::<_, String>(0))
        .ok()
        .and_then(|s| serde_json::from_str::<Value>(&s).ok())
        .and_then(|v| v["next"].as_u64())
        .unwrap_or(0)
}

#[test]
fn a_replay_killed_mid_conversation_resumes_where_it_stopped_storing_nothing_twice() {
    let sb = Sandbox::new();
    let n = 40;
    sb.write("s.yaml", &suite(6, &[("t", messages(n, "t"), vec![ANY_CALL.to_owned(); 2 * n])]));
    let mut child = sb
        .command()
        .args([
            "eval",
            "s.yaml",
            "--model",
            "mock",
            "--run-id",
            "test",
            "--out",
            "results",
            "--mock-delay-ms",
            "15",
            "-q",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn runner");
    let run = sb.path().join("results/test");
    let deadline = Instant::now() + Duration::from_secs(60);
    while checkpointed(&run) < 15 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().expect("kill -9");
    child.wait().expect("reap");
    let before = checkpointed(&run);
    let total = (n + 2) as u64;
    assert!((15..total).contains(&before), "killed after {before} of {total} invocations");
    let stored_before = stored(&sb).len();

    let resumed = sb.run(&["eval", "s.yaml", "--model", "mock", "--resume", "test", "--out", "results"]);
    assert_eq!(resumed.code, 0, "{resumed:?}");
    let entries = stored(&sb);
    let keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
    let mut expected: Vec<String> = (1..=n).map(|i| format!("/t-s1/{i}")).collect();
    expected.sort();
    let suffixes: Vec<String> = keys.iter().map(|k| k[k.find('/').unwrap()..].to_owned()).collect();
    assert_eq!(suffixes, expected, "every message stored once (before the kill: {stored_before})");

    // The resumed attempt began at the invocation after the checkpoint, not from the start.
    let events = read_jsonl(&run.join("events.jsonl"));
    let resumed_from = events.iter().rposition(|e| e["type"] == "episode_started").unwrap();
    let first = of_type(&events[resumed_from..], "memory_invocation")[0];
    assert_eq!(first["message"].as_u64(), Some(before), "{first}");
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished.last().unwrap()["outcome"]["passed"], true, "{}", finished.last().unwrap());
}

/// The example under `tasks/`: twelve LongMemEval questions, every type, replayed offline.
#[test]
fn the_longmemeval_example_replays_each_haystack_in_date_order_and_passes() {
    let sb = Sandbox::new();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let suite = repo.join("tasks/memory-replay.yaml");
    let run = sb.eval(&[suite.to_str().unwrap()]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished.len(), 12);
    assert!(finished.iter().all(|e| e["outcome"]["passed"] == true), "{finished:?}");
    let data = std::fs::read_to_string(repo.join("tasks/data/memory-replay.json")).unwrap();
    for kind in runner::suite::longmemeval::QUESTION_TYPES {
        assert!(data.contains(&format!("\"{kind}\"")), "the example has no `{kind}` question");
    }
    assert!(data.contains("_abs\""), "the example has no abstention question");
    // `ku-2` lists its later session first: the replay starts with the earlier one.
    let episode = of_type(&events, "episode_started").into_iter().find(|e| e["task_id"] == "ku-2").unwrap();
    let id = &episode["episode_id"];
    let sessions: Vec<&str> = of_type(&events, "memory_invocation")
        .into_iter()
        .filter(|e| &e["episode_id"] == id && e["control"] == "start_session")
        .map(|e| e["session"].as_str().unwrap())
        .collect();
    assert_eq!(sessions, ["s1", "s2"]);
    // The evidence marks of the haystack reach nothing a model or a reader of the log sees.
    assert!(events.iter().all(|e| !e.to_string().contains("has_answer")));
    assert!(of_type(&events, "memory_invocation").iter().all(|e| e["error"].is_null()));
}

#[test]
fn retrieval_recall_counts_the_evidence_sessions_the_search_found() {
    let sb = Sandbox::new();
    let sessions = json!([
        {"id": "s1", "date": "2023-05-01", "messages": [{"role": "user", "content": "I adopted a dog named Rex"}]},
        {"id": "s2", "date": "2023-05-02", "messages": [{"role": "user", "content": "I bought a red bicycle"}]},
    ]);
    let yaml = format!(
        "suite: mem\nenvironment: memory_store\nagent: {{kind: memory}}\nlimits: {{max_steps: 100}}\n\
         scorers: [{{includes: Rex}}]\ntasks:\n  - id: t\n    input: What is my dog called?\n    \
         metadata: {{question_type: multi-session, answer_session_ids: [s1, s2], sessions: {sessions}}}\n    mock:\n      - {}\n      - {}\n      - {}\n      - {}\n      - {}\n",
        add_entry("The user adopted a dog named Rex"),
        put_context("dog"),
        add_entry("The user bought a red bicycle"),
        put_context("bike"),
        r#"{text: "Rex"}"#,
    );
    sb.write("s.yaml", &yaml);
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let answered = of_type(&sb.events(), "memory_answered")[0].clone();
    assert_eq!(answered["retrieved_sessions"], json!(["s1"]), "{answered}");
    assert_eq!(answered["recall"], 0.5);
    assert_eq!(answered["entries_by_session"], json!({"s1": 1, "s2": 1}));
    assert!(
        run.stdout.contains("retrieval recall: 50.0% of evidence sessions found (mean over 1 questions)"),
        "{run:?}"
    );
    assert!(run.stdout.contains("multi-session                     1      1    100.0%"), "{run:?}");
}

/// A LoCoMo file (`tests/fixtures/locomo/mini.json`, original): each QA item is a task, its
/// sample's sessions replayed in number order, its category the question type.
#[test]
fn a_locomo_file_replays_its_conversation_for_each_question() {
    let sb = Sandbox::new();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/locomo/mini.json");
    sb.write(
        "locomo.yaml",
        &format!(
            "suite: locomo\nenvironment: memory_store\nagent: {{kind: memory, flush_every: 6}}\nlimits: {{max_steps: 100}}\n\
             dataset: {{path: {}, format: locomo}}\ngrader: {{model: mock}}\nscorers:\n  - llm_rubric: \"{{{{ rubric }}}}\"\n    \
             mock: [\"The answer meets the rubric.\\n{{\\\"score\\\": 1}}\"]\n",
            data.display()
        ),
    );
    let run = sb.eval(&["locomo.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let started = of_type(&events, "episode_started");
    let mut ids: Vec<&str> = started.iter().map(|e| e["task_id"].as_str().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, ["conv-mini-q1", "conv-mini-q2", "conv-mini-q3", "conv-mini-q4"]);
    assert!(of_type(&events, "episode_finished").iter().all(|e| e["outcome"]["passed"] == true), "{events:?}");
    // One replay of the conversation serves its four questions.
    let mut replayed: Vec<&Value> = of_type(&events, "memory_invocation").iter().map(|e| &e["episode_id"]).collect();
    replayed.dedup();
    assert_eq!(replayed.len(), 1, "{replayed:?}");
    assert_eq!(of_type(&events, "ingest_reused").len(), 3);
    // `session_2` comes first in the file, `session_3` has a date and no turns.
    let first = replayed[0];
    let sessions: Vec<&str> = of_type(&events, "memory_invocation")
        .into_iter()
        .filter(|e| &e["episode_id"] == first && e["control"] == "start_session")
        .map(|e| e["session"].as_str().unwrap())
        .collect();
    assert_eq!(sessions, ["session_1", "session_2"]);
    assert!(of_type(&events, "memory_invocation").iter().all(|e| e["error"].is_null()));
    for kind in ["single-hop", "temporal", "adversarial", "multi-hop"] {
        assert!(run.stdout.contains(kind), "no `{kind}` row: {run:?}");
    }
    assert!(run.stdout.contains("abstention"), "{run:?}");
}

/// The memory agent against an MCP memory server (`tests/fixtures/mcp/memory_server.py`,
/// plain Python, its own store and ranking) in place of the built-in store: the replay
/// stores through the server, the answer reads it back, and retrieval recall is counted
/// from what the server's search returned — whether the server gives structured content or
/// only JSON text.
#[test]
fn the_memory_agent_stores_and_answers_through_an_mcp_memory_server() {
    let server = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mcp/memory_server.py");
    for mode in ["structured", "text-only"] {
        let sb = Sandbox::new();
        sb.write(
            "environments/memory.yaml",
            &format!(
                "kind: mcp\nservers:\n  - {{name: memory, command: /usr/bin/python3, args: [\"{server}\", {mode}]}}\n"
            ),
        );
        let sessions = json!([
            {"id": "s1", "date": "2023-05-01", "messages": [{"role": "user", "content": "I adopted a dog named Rex"}]},
            {"id": "s2", "date": "2023-05-02", "messages": [{"role": "user", "content": "I bought a red bicycle"}]},
        ]);
        let yaml = format!(
            "suite: mem\nenvironment: memory\nagent: {{kind: memory}}\nlimits: {{max_steps: 100}}\n\
             scorers: [{{includes: Rex}}]\ntasks:\n  - id: t\n    input: What is my dog called?\n    \
             metadata: {{question_type: multi-session, answer_session_ids: [s1, s2], sessions: {sessions}}}\n    mock:\n      - {}\n      - {}\n      - {}\n      - {}\n      - {}\n",
            add_entry("The user adopted a dog named Rex"),
            put_context("The user has a dog, Rex."),
            add_entry("The user bought a red bicycle"),
            put_context("The user has a dog, Rex, and a red bicycle."),
            r#"{text: "Rex"}"#,
        );
        sb.write("s.yaml", &yaml);
        let run = sb.eval(&["s.yaml"]);
        assert_eq!(run.code, 0, "{mode}: {run:?}");
        let events = sb.events();
        assert!(of_type(&events, "memory_invocation").iter().all(|e| e["error"].is_null()), "{mode}: {events:?}");
        let answered = of_type(&events, "memory_answered")[0].clone();
        assert_eq!(answered["entries_by_session"], json!({"s1": 1, "s2": 1}), "{mode}: {answered}");
        // The server ranks by shared words: only the dog entry shares any with the question.
        assert_eq!(answered["retrieved_sessions"], json!(["s1"]), "{mode}: {answered}");
        assert_eq!(answered["recall"], 0.5, "{mode}");
        // The second session began with the context the first wrote, read back from the server.
        let read_back = tool_observations(&events)
            .iter()
            .any(|o| o["tool_result"].to_string().contains("The user has a dog, Rex.") && o["error"].is_null());
        assert!(read_back, "{mode}: the context was not read back: {events:?}");
        let finished = of_type(&events, "episode_finished");
        assert_eq!(finished[0]["outcome"]["passed"], true, "{mode}: {finished:?}");
    }
}

/// A memory suite whose tasks ask for the dog's name after one session, each `(id, question
/// type, answer)`; the scorer wants `Rex`.
fn dog_suite(environment: &str, tasks: &[(&str, &str, &str)]) -> String {
    let mut yaml = format!(
        "suite: mem\nenvironment: {environment}\nagent: {{kind: memory}}\nlimits: {{max_steps: 100}}\n\
         scorers: [{{includes: Rex}}]\ntasks:\n"
    );
    for (id, question_type, answer) in tasks {
        let sessions = json!([{"id": "s1", "date": "2023-05-01", "messages": [{"role": "user", "content": "I adopted a dog named Rex"}]}]);
        yaml.push_str(&format!(
            "  - id: {id}\n    input: What is my dog called?\n    \
             metadata: {{question_type: {question_type}, answer_session_ids: [s1], sessions: {sessions}}}\n    \
             mock:\n      - {}\n      - {}\n      - {{text: {answer}}}\n",
            add_entry("The user adopted a dog named Rex"),
            put_context("The user has a dog, Rex."),
        ));
    }
    yaml
}

/// Two memory configurations — the built-in store and an MCP memory server — compared: the
/// memory numbers side by side per question type, the questions paired by task.
#[test]
fn compare_shows_two_memory_configurations_side_by_side_paired_by_question() {
    let sb = Sandbox::new();
    let server = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mcp/memory_server.py");
    sb.write(
        "environments/memory.yaml",
        &format!("kind: mcp\nservers:\n  - {{name: memory, command: /usr/bin/python3, args: [\"{server}\"]}}\n"),
    );
    sb.write(
        "a.yaml",
        &dog_suite("memory_store", &[("t1", "single-session-user", "Rex"), ("t2", "multi-session", "Rex")]),
    );
    sb.write("b.yaml", &dog_suite("memory", &[("t1", "single-session-user", "Rex"), ("t2", "multi-session", "Max")]));
    for id in ["a", "b"] {
        let done = sb.run(&["eval", &format!("{id}.yaml"), "--model", "mock", "--run-id", id, "--out", "results"]);
        assert!(done.stdout.contains("memory: accuracy by question type"), "{done:?}");
    }
    let compared = sb.run(&["compare", "results/a", "results/b"]);
    assert_eq!(compared.code, 0, "{compared:?}");
    let out = &compared.stdout;
    assert!(out.contains("memory, side by side: A = a, B = b"), "{compared:?}");
    let row = |label: &str| {
        out.lines().find(|l| l.starts_with(&format!("{label} "))).map(|l| l.split_whitespace().collect::<Vec<_>>())
    };
    // label, A (passed/scored, %), B, B-A, pairs, A only, B only, McNemar
    assert_eq!(
        row("multi-session"),
        Some(vec!["multi-session", "1/1", "100.0%", "0/1", "0.0%", "-100.0", "1", "1", "0", "p=1.000"]),
        "{out}"
    );
    assert_eq!(
        row("single-session-user"),
        Some(vec!["single-session-user", "1/1", "100.0%", "1/1", "100.0%", "+0.0", "1", "0", "0", "p=1.000"]),
        "{out}"
    );
    assert_eq!(row("all").map(|r| r[1..8].join(" ")), Some("2/2 100.0% 1/2 50.0% -50.0 2 1".to_owned()), "{out}");
    assert!(out.contains("retrieval recall") && out.contains("100.0% (n=2)"), "{out}");
}

#[test]
fn the_memory_table_is_one_per_model_never_their_blend() {
    let sb = Sandbox::new();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let suite = repo.join("tasks/memory-replay.yaml");
    // The scripted verdicts asked for (`--grader mock`): what is tested is whose rows they count in.
    let args =
        ["eval", suite.to_str().unwrap(), "--model", "mock", "--model", "echo", "--grader", "mock", "--run-id", "test"];
    let run = sb.run(&[&args[..], &["--out", "results"]].concat());
    // `echo` answers with the prompt: its verdicts are its own, and they must not be
    // counted into mock's twelve passes (nor mock's into echo's).
    assert!(run.code == 0 || run.code == 1, "{run:?}");
    let table = |model: &str| -> String {
        let heading = format!("memory of memory-replay · {model}:");
        let start = run.stdout.find(&heading).unwrap_or_else(|| panic!("no table for {model}: {run:?}"));
        let rest = &run.stdout[start + heading.len()..];
        rest[..rest.find("memory of ").unwrap_or(rest.len())].to_owned()
    };
    let all = |text: &str| -> Vec<String> {
        let line = text.lines().find(|l| l.starts_with("all ")).unwrap_or_default();
        line.split_whitespace().skip(1).take(2).map(str::to_owned).collect()
    };
    assert_eq!(all(&table("mock")), ["12", "12"], "mock's twelve questions, all passed");
    assert_eq!(all(&table("echo"))[0], "12", "echo's twelve questions");
}
