//! Record a run, replay it for free, and get a loud, specific miss when a prompt changes.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::models::{openai_env, run_with};
use crate::{Sandbox, of_type, read_jsonl};

const SUITE: &str = r#"
suite: rec
environment: kv
agent: {system: "You keep notes. Be exact."}
epochs: 2
scorers: [{equals: "{{ target }}"}]
tasks:
  - id: sum
    input: Add 2 and 2.
    target: "4"
    mock:
      - tool_calls: [{name: calc, arguments: {expression: "2+2"}}]
      - text: "4"
  - id: note
    input: Store x.
    target: done
    mock:
      - tool_calls: [{name: kv_set, arguments: {key: x, value: "1"}}, {name: kv_list}]
      - text: done
"#;

/// The parts of an event that must match between a run and its replay.
fn stable(events: &[Value]) -> Vec<Value> {
    let mut per_episode: std::collections::BTreeMap<String, Vec<Value>> = Default::default();
    for e in events {
        let mut e = e.clone();
        let obj = e.as_object_mut().unwrap();
        for timing in
            ["ts", "seq", "run_id", "latency_ms", "wall_ms", "loop_ms", "cache_hit", "command_line", "git_revision"]
        {
            obj.remove(timing);
        }
        // The first observation carries the world's details; the kv world has none that vary.
        let id = obj.get("episode_id").and_then(Value::as_str).unwrap_or("run").to_owned();
        per_episode.entry(id).or_default().push(e);
    }
    per_episode.into_values().flatten().collect()
}

#[test]
fn a_replayed_run_has_the_same_events_and_a_changed_prompt_misses_loudly() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let record =
        sb.run(&["eval", "s.yaml", "--model", "mock", "--record", "tape.jsonl", "--run-id", "rec", "--out", "results"]);
    assert_eq!(record.code, 0, "{record:?}");
    assert_eq!(read_jsonl(&sb.path().join("tape.jsonl")).len(), 8, "4 episodes × 2 model calls");

    let replay = sb.run(&["eval", "s.yaml", "--model", "replay:tape.jsonl", "--run-id", "rep", "--out", "results"]);
    assert_eq!(replay.code, 0, "{replay:?}");
    let recorded = read_jsonl(&sb.path().join("results/rec/events.jsonl"));
    let replayed = read_jsonl(&sb.path().join("results/rep/events.jsonl"));
    let (mut a, mut b) = (stable(&recorded), stable(&replayed));
    // run_started differs only by the model spec given on the command line.
    a.retain(|e| e["type"] != "run_started");
    b.retain(|e| e["type"] != "run_started");
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x, y);
    }
    assert!(of_type(&replayed, "model_call").iter().all(|c| c["cache_hit"] == true));

    // Change the system prompt: every episode misses, and the miss says where.
    sb.write("s.yaml", &SUITE.replace("Be exact.", "Be quick."));
    let miss = sb.run(&["eval", "s.yaml", "--model", "replay:tape.jsonl", "--run-id", "miss", "--out", "results"]);
    assert_eq!(miss.code, 3, "{miss:?}");
    let events = read_jsonl(&sb.path().join("results/miss/events.jsonl"));
    let finished = of_type(&events, "episode_finished");
    assert!(finished.iter().all(|f| f["outcome"]["cause"] == "replay_miss"), "{finished:?}");
    let why = finished[0]["outcome"]["message"].as_str().unwrap();
    assert!(why.contains("message 1 (system)") && why.contains("exact") && why.contains("quick"), "{why}");
}

#[test]
fn a_run_log_can_be_replayed_directly() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    assert_eq!(sb.run(&["eval", "s.yaml", "--model", "mock", "--run-id", "rec", "--out", "results"]).code, 0);
    let replay = sb.run(&["eval", "s.yaml", "--model", "replay:results/rec", "--run-id", "rep", "--out", "results"]);
    assert_eq!(replay.code, 0, "{replay:?}");
    let events = read_jsonl(&sb.path().join("results/rep/events.jsonl"));
    assert_eq!(of_type(&events, "model_call").len(), 8);
    // A replay of more epochs than were recorded runs out, and says so.
    let more = sb.run(&[
        "eval",
        "s.yaml",
        "--model",
        "replay:results/rec",
        "--epochs",
        "3",
        "--run-id",
        "more",
        "--out",
        "results",
    ]);
    assert_eq!(more.code, 3, "{more:?}");
    let events = read_jsonl(&sb.path().join("results/more/events.jsonl"));
    let misses: Vec<_> =
        of_type(&events, "episode_finished").into_iter().filter(|f| f["outcome"]["cause"] == "replay_miss").collect();
    assert_eq!(misses.len(), 2);
    // The recorded epochs keep their own answers; the third was never recorded.
    let epochs = epochs_of(&events);
    assert!(misses.iter().all(|m| epochs[m["episode_id"].as_str().unwrap()] == 3), "{misses:?}");
    let why = misses[0]["outcome"]["message"].as_str().unwrap();
    assert!(why.contains("nothing was recorded for this episode") && why.contains("in other episodes"), "{why}");
}

/// Each episode's epoch, from its `episode_started`.
fn epochs_of(events: &[Value]) -> std::collections::HashMap<String, u64> {
    of_type(events, "episode_started")
        .into_iter()
        .map(|e| (e["episode_id"].as_str().unwrap().to_owned(), e["epoch"].as_u64().unwrap()))
        .collect()
}

/// A suite whose system prompt names the task, so that two tasks' requests differ from the
/// first message on.
const NAMED: &str = r#"
suite: named
environment: kv
agent: {system: "Be exact. Notes: {{ input }}"}
scorers: [{equals: "{{ target }}"}]
tasks:
  - id: sum
    input: Add 2 and 2.
    target: "4"
    mock:
      - tool_calls: [{name: calc, arguments: {expression: "2+2"}}]
      - text: "4"
  - id: note
    input: Store x.
    target: done
    mock:
      - tool_calls: [{name: kv_set, arguments: {key: x, value: "1"}}]
      - text: done
"#;

#[test]
fn a_miss_is_explained_by_the_same_episodes_request_and_printed_on_the_console() {
    let sb = Sandbox::new();
    sb.write("s.yaml", NAMED);
    let record =
        sb.run(&["eval", "s.yaml", "--model", "mock", "--record", "tape.jsonl", "--run-id", "rec", "--out", "results"]);
    assert_eq!(record.code, 0, "{record:?}");
    sb.write("s.yaml", &NAMED.replace("Be exact.", "Be quick."));
    let miss = sb.run(&["eval", "s.yaml", "--model", "replay:tape.jsonl", "--run-id", "miss", "--out", "results"]);
    assert_eq!(miss.code, 3, "{miss:?}");
    let events = read_jsonl(&sb.path().join("results/miss/events.jsonl"));
    let tasks: BTreeMap<&str, &str> = of_type(&events, "episode_started")
        .into_iter()
        .map(|e| (e["episode_id"].as_str().unwrap(), e["task_id"].as_str().unwrap()))
        .collect();
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished.len(), 2);
    for f in finished {
        let why = f["outcome"]["message"].as_str().unwrap();
        let (own, other) = match tasks[f["episode_id"].as_str().unwrap()] {
            "sum" => ("Add 2 and 2.", "Store x."),
            _ => ("Store x.", "Add 2 and 2."),
        };
        // The recorded side of the difference is this task's own prompt, not the other's.
        assert!(why.contains("message 1 (system)"), "{why}");
        assert!(why.contains(&format!("recorded \"Be exact. Notes: {own}\"")), "{why}");
        assert!(!why.contains(other), "{why}");
        // The console says it too, naming the task.
        let task = tasks[f["episode_id"].as_str().unwrap()];
        assert!(
            miss.stderr
                .lines()
                .any(|l| l.contains("replay miss") && l.contains(&format!("`{task}`")) && l.contains("Be quick")),
            "{miss:?}"
        );
    }
}

/// Answers the n-th request with the n-th of `answers` (cycling), each after its delay, so
/// that requests sent together are answered in another order than they came.
struct Varying {
    answers: Vec<(String, u64)>,
    next: AtomicUsize,
    bodies: Mutex<Vec<Value>>,
}

impl Respond for Varying {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        self.bodies.lock().unwrap().push(request.body_json().unwrap_or(Value::Null));
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        let (text, delay_ms) = &self.answers[n % self.answers.len()];
        let body = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                          "finish_reason": "stop"}], "usage": {"prompt_tokens": 20, "completion_tokens": 2}});
        ResponseTemplate::new(200).set_body_json(body).set_delay(Duration::from_millis(*delay_ms))
    }
}

struct Shared(std::sync::Arc<Varying>);

impl Respond for Shared {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        self.0.respond(request)
    }
}

async fn varying_server(answers: &[(&str, u64)]) -> (MockServer, std::sync::Arc<Varying>) {
    let server = MockServer::start().await;
    let varying = std::sync::Arc::new(Varying {
        answers: answers.iter().map(|(t, d)| (t.to_string(), *d)).collect(),
        next: AtomicUsize::new(0),
        bodies: Mutex::new(Vec::new()),
    });
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(Shared(varying.clone()))
        .mount(&server)
        .await;
    (server, varying)
}

/// Each episode's outcome, by episode id.
fn outcomes(sb: &Sandbox, run: &str) -> BTreeMap<String, Value> {
    let events = read_jsonl(&sb.path().join(format!("results/{run}/events.jsonl")));
    of_type(&events, "episode_finished")
        .into_iter()
        .map(|e| (e["episode_id"].as_str().unwrap().to_owned(), e["outcome"].clone()))
        .collect()
}

/// Answers that pass and fail in turn, the earlier ones slower: eight requests sent four at
/// a time come back in another order than they went.
const SCRAMBLED: [(&str, u64); 8] =
    [("4", 600), ("5", 400), ("4", 200), ("5", 0), ("5", 600), ("4", 400), ("5", 200), ("4", 0)];

#[tokio::test(flavor = "multi_thread")]
async fn a_replay_gives_every_epoch_the_answer_it_was_recorded_with() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        "suite: m\nenvironment: kv\nagent: {system: Be brief.}\nepochs: 8\nscorers: [{equals: \"4\"}]\ntasks:\n  - {id: t, input: What is 2+2?}\n",
    );
    let (server, varying) = varying_server(&SCRAMBLED).await;
    let record = run_with(
        &sb,
        &[
            "eval",
            "s.yaml",
            "--model",
            "openai/gpt-test",
            "-j",
            "4",
            "--record",
            "tape.jsonl",
            "--run-id",
            "rec",
            "--out",
            "results",
        ],
        &openai_env(&server),
    )
    .await;
    assert_eq!(varying.bodies.lock().unwrap().len(), 8, "{record:?}");
    let recorded = outcomes(&sb, "rec");
    assert_eq!(recorded.len(), 8);
    let passed = recorded.values().filter(|o| o["passed"] == true).count();
    assert!(passed > 0 && passed < 8, "the answers should vary: {recorded:?}");
    drop(server);

    for (source, run) in [("replay:results/rec", "from-log"), ("replay:tape.jsonl", "from-cassette")] {
        let replay =
            run_with(&sb, &["eval", "s.yaml", "--model", source, "-j", "4", "--run-id", run, "--out", "results"], &[])
                .await;
        assert_eq!(replay.code, record.code, "{replay:?}");
        assert_eq!(outcomes(&sb, run), recorded, "{source}");
    }
}

const GRADED: &str = r#"
suite: graded
environment: kv
epochs: 4
limits: {max_steps: 1}
grader: {model: openai/judge}
scorers: [{llm_rubric: "The answer is 4."}]
tasks:
  - id: answers
    input: What is 2+2?
    mock: [{text: "4"}]
  - id: never-answers
    input: What is 3+3?
    mock: [{tool_calls: [{name: kv_list}]}]
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_graded_run_replays_offline_with_the_graders_recorded_verdicts() {
    let sb = Sandbox::new();
    sb.write("s.yaml", GRADED);
    let verdicts = [
        ("It is right.\n{\"score\": 1}", 300),
        ("It is wrong.\n{\"score\": 0}", 0),
        ("It is wrong.\n{\"score\": 0}", 300),
        ("It is right.\n{\"score\": 1}", 0),
    ];
    let (server, grader) = varying_server(&verdicts).await;
    let record = run_with(
        &sb,
        &[
            "eval",
            "s.yaml",
            "--model",
            "mock",
            "-j",
            "4",
            "--record",
            "tape.jsonl",
            "--run-id",
            "rec",
            "--out",
            "results",
        ],
        &openai_env(&server),
    )
    .await;
    // Only the episodes with an answer were graded.
    assert_eq!(grader.bodies.lock().unwrap().len(), 4, "{record:?}");
    let events = read_jsonl(&sb.path().join("results/rec/events.jsonl"));
    let tasks: BTreeMap<&str, &str> = of_type(&events, "episode_started")
        .into_iter()
        .map(|e| (e["episode_id"].as_str().unwrap(), e["task_id"].as_str().unwrap()))
        .collect();
    let graded: Vec<&Value> =
        of_type(&events, "model_call").into_iter().filter(|c| c["scorer"] == "llm_rubric").collect();
    assert_eq!(graded.len(), 4);
    assert!(
        graded.iter().all(|c| c["model"] == "openai/judge" && tasks[c["episode_id"].as_str().unwrap()] == "answers")
    );
    for score in of_type(&events, "score") {
        if tasks[score["episode_id"].as_str().unwrap()] == "never-answers" {
            assert_eq!(score["passed"], false);
            assert!(score["explanation"].as_str().unwrap().contains("no final answer"), "{score}");
        }
    }
    // The episodes table counts the agent's calls, not the grader's.
    let table = std::fs::read_to_string(sb.path().join("results/rec/episodes.csv")).unwrap();
    let mut rows = table.lines();
    let column = rows.next().unwrap().split(',').position(|c| c == "model_calls").unwrap();
    assert!(rows.all(|r| r.split(',').nth(column) == Some("1")), "{table}");
    let recorded = outcomes(&sb, "rec");
    assert!(recorded.values().all(|o| o["status"] == "scored"), "{recorded:?}");
    let passed = recorded.values().filter(|o| o["passed"] == true).count();
    assert_eq!(passed, 2, "two of the four graded episodes pass: {recorded:?}");
    drop(server);

    // No grader endpoint, no key.
    for (source, run) in [("replay:results/rec", "from-log"), ("replay:tape.jsonl", "from-cassette")] {
        let replay =
            run_with(&sb, &["eval", "s.yaml", "--model", source, "-j", "4", "--run-id", run, "--out", "results"], &[])
                .await;
        assert_eq!(replay.code, record.code, "{replay:?}");
        assert_eq!(outcomes(&sb, run), recorded, "{source}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_graders_unparseable_outputs_are_in_the_log() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &GRADED.replace("epochs: 4", "epochs: 1"));
    let (server, grader) = varying_server(&[("Looks fine to me.", 0)]).await;
    let run = run_with(
        &sb,
        &["eval", "s.yaml", "--model", "mock", "--run-id", "test", "--out", "results"],
        &openai_env(&server),
    )
    .await;
    // One answer, asked three times (two retries).
    assert_eq!(grader.bodies.lock().unwrap().len(), 3, "{run:?}");
    let events = sb.events();
    let graded: Vec<&Value> =
        of_type(&events, "model_call").into_iter().filter(|c| c["scorer"] == "llm_rubric").collect();
    assert_eq!(graded.len(), 3);
    assert!(graded.iter().all(|c| c["response"]["text"] == "Looks fine to me."), "{graded:?}");
    let unscored: Vec<&Value> =
        of_type(&events, "episode_finished").into_iter().filter(|f| f["outcome"]["cause"] == "grader_error").collect();
    assert_eq!(unscored.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_graders_calls_are_cached_one_file_per_sample() {
    let sb = Sandbox::new();
    let suite =
        GRADED.replace("epochs: 4", "epochs: 1").replace("\"The answer is 4.\"}", "\"The answer is 4.\", samples: 3}");
    sb.write("s.yaml", &suite);
    let verdicts = [("Yes.\n{\"score\": 1}", 0), ("No.\n{\"score\": 0}", 0), ("Yes.\n{\"score\": 0.9}", 0)];
    let (server, grader) = varying_server(&verdicts).await;
    let raw_outputs = |run: &str| -> Vec<Value> {
        let events = read_jsonl(&sb.path().join(format!("results/{run}/events.jsonl")));
        of_type(&events, "score")
            .into_iter()
            .filter_map(|s| s["grader"]["raw_outputs"].as_array().cloned())
            .flatten()
            .collect()
    };
    for run in ["first", "second"] {
        let args = [
            "eval",
            "s.yaml",
            "--model",
            "mock",
            "--cache",
            "--cache-dir",
            "cache",
            "--run-id",
            run,
            "--out",
            "results",
        ];
        let done = run_with(&sb, &args, &openai_env(&server)).await;
        assert_eq!(done.code, 0, "{done:?}");
    }
    // Asked three times in the first run, never in the second.
    assert_eq!(grader.bodies.lock().unwrap().len(), 3);
    let first = raw_outputs("first");
    assert_eq!(
        first,
        vec![json!("Yes.\n{\"score\": 1}"), json!("No.\n{\"score\": 0}"), json!("Yes.\n{\"score\": 0.9}")]
    );
    assert_eq!(raw_outputs("second"), first);
}
