//! The stages of a memory benchmark — ingest, answer, judge — logged apart and run apart:
//! one ingestion per question serves every variant and epoch (counted at a local OpenAI
//! server, by what each request asks), an ingestion cut short is never reused, a regrade
//! calls only the judge, and `compare` says whether two runs' judges are comparable.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::{Sandbox, of_type, read_jsonl};

/// Requests by what they ask: `ingest` (the store's write tools are offered), `answer`
/// (the agent's model, no tools), `judge:<model>`.
#[derive(Default)]
struct Counts(Mutex<BTreeMap<String, u64>>);

impl Counts {
    fn get(&self, role: &str) -> u64 {
        self.0.lock().unwrap().get(role).copied().unwrap_or(0)
    }

    fn reset(&self) {
        self.0.lock().unwrap().clear();
    }
}

/// Plays the memory agent's model and two judges: `judge-pass` passes every answer,
/// `judge-fail` fails it.
struct Server(Arc<Counts>);

impl Respond for Server {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: Value = request.body_json().unwrap_or(Value::Null);
        let model = body["model"].as_str().unwrap_or_default().to_owned();
        let tools: Vec<String> = body["tools"]
            .as_array()
            .map(|t| t.iter().filter_map(|t| t["function"]["name"].as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        let call = |name: &str, arguments: Value| {
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": name, "arguments": arguments.to_string()}}]})
        };
        let (role, message) = if tools.iter().any(|t| t == "add_entry") {
            // The message the prompt asks to store, stored as it is.
            let prompt = body["messages"][0]["content"].as_str().unwrap_or_default();
            let said = prompt.split("Current message to process:\nRole: ").nth(1).unwrap_or_default();
            let said = said.split("\n\nINSTRUCTION").next().unwrap_or_default();
            let text = said.split_once("\nContent: ").map_or(said, |(_, text)| text);
            ("ingest".to_owned(), call("add_entry", json!({"summary": text, "raw_entry": text})))
        } else if tools.iter().any(|t| t == "put_context") {
            ("ingest".to_owned(), call("put_context", json!({"content": "what was said"})))
        } else if model.starts_with("judge") {
            let score = if model == "judge-fail" { 0 } else { 1 };
            (
                format!("judge:{model}"),
                json!({"role": "assistant", "content": format!("Judged.\n{{\"score\": {score}}}")}),
            )
        } else {
            ("answer".to_owned(), json!({"role": "assistant", "content": "Biscuit"}))
        };
        *self.0.0.lock().unwrap().entry(role).or_default() += 1;
        ResponseTemplate::new(200).set_body_json(json!({
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2}
        }))
    }
}

async fn serve() -> (MockServer, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(Server(counts.clone()))
        .mount(&server)
        .await;
    (server, counts)
}

/// Two LongMemEval questions, each with two sessions of two messages: a replay makes
/// 2 × (2 `add_entry` + 1 `put_context`) = 6 model calls.
fn dataset() -> String {
    let question = |id: &str, pet: &str| {
        json!({
            "question_id": id, "question_type": "single-session-user",
            "question": format!("What is the name of my {pet}?"), "answer": "Biscuit",
            "question_date": "2024/03/10 (Sun) 09:00",
            "haystack_session_ids": ["s1", "s2"],
            "haystack_dates": ["2024/03/01 (Fri) 18:20", "2024/03/05 (Tue) 08:10"],
            "haystack_sessions": [
                [{"role": "user", "content": format!("We adopted a {pet}, we named her Biscuit."), "has_answer": true},
                 {"role": "assistant", "content": "A lovely name!"}],
                [{"role": "user", "content": "Can you suggest a quick breakfast?"},
                 {"role": "assistant", "content": "Overnight oats."}]
            ],
            "answer_session_ids": ["s1"]
        })
    };
    json!([question("q-dog", "dog"), question("q-cat", "cat")]).to_string()
}

/// Two variants that change only how the question is answered, two epochs.
fn suite(ingest: &str) -> String {
    format!(
        "suite: stages\nenvironment: memory_store\nagent: {{kind: memory, flush_every: 6{ingest}}}\n\
         limits: {{max_steps: 200}}\nepochs: 2\ndataset: {{path: data.json, format: longmemeval}}\n\
         grader: {{model: openai/judge-pass}}\nscorers:\n  - llm_rubric: \"{{{{ rubric }}}}\"\n\
         variants:\n  asked: {{prompt: \"{{{{ input }}}} Answer with the name only.\"}}\n\
         \x20 brief: {{agent: {{prompts: {{answer: \"Answer in one word.\"}}}}}}\n"
    )
}

fn sandbox(ingest: &str) -> Sandbox {
    let sb = Sandbox::new();
    sb.write("data.json", &dataset());
    sb.write("s.yaml", &suite(ingest));
    sb.write("runner.yaml", "providers:\n  openai: {retry_base_s: 0.01, max_retries: 1, timeout_s: 5}\n");
    sb
}

async fn eval(sb: &Sandbox, server: &MockServer, run_id: &str) -> crate::Run {
    let args = ["eval", "s.yaml", "--model", "openai/gpt-test", "-j", "4", "--run-id", run_id, "--out", "results"];
    crate::models::run_with(sb, &args, &crate::models::openai_env(server)).await
}

/// Each episode's stages, in order.
fn stages(events: &[Value]) -> BTreeMap<String, Vec<String>> {
    let mut by_episode: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in of_type(events, "stage") {
        let episode = e["episode_id"].as_str().unwrap().to_owned();
        by_episode.entry(episode).or_default().push(e["stage"].as_str().unwrap().to_owned());
    }
    by_episode
}

#[tokio::test(flavor = "multi_thread")]
async fn one_ingestion_per_question_serves_two_variants_and_two_epochs_run_at_once() {
    let (server, counts) = serve().await;
    let sb = sandbox("");
    let run = eval(&sb, &server, "test").await;
    assert_eq!(run.code, 0, "{run:?}");
    // 2 questions × 2 variants × 2 epochs = 8 episodes, 2 ingestions of 6 calls.
    assert_eq!(counts.get("ingest"), 12, "one replay per question");
    assert_eq!(counts.get("answer"), 8);
    assert_eq!(counts.get("judge:judge-pass"), 8);

    let events = sb.events();
    let saved = of_type(&events, "ingest_saved");
    let reused = of_type(&events, "ingest_reused");
    assert_eq!(saved.len(), 2, "{saved:?}");
    assert_eq!(reused.len(), 6, "{reused:?}");
    for r in &reused {
        let from = saved.iter().find(|s| s["key"] == r["key"]).expect("a reused ingestion was saved");
        assert_eq!(r["from_episode"], from["episode_id"]);
        assert_eq!((r["model_calls"].as_u64(), r["entries"].as_u64()), (Some(6), Some(4)), "{r}");
    }
    let by_episode = stages(&events);
    assert_eq!(by_episode.len(), 8);
    assert!(by_episode.values().all(|s| s == &["ingest", "answer", "judge"]), "{by_episode:?}");
    // A restored episode's ingest stage holds no model call; its answer reads the store.
    for r in &reused {
        let own: Vec<&Value> = events.iter().filter(|e| e["episode_id"] == r["episode_id"]).collect();
        let at = |kind: &str, stage: &str| {
            own.iter().position(|e| e["type"] == kind && (stage.is_empty() || e["stage"] == stage)).unwrap()
        };
        let calls = own[at("stage", "ingest")..at("stage", "answer")].iter().filter(|e| e["type"] == "model_call");
        assert_eq!(calls.count(), 0);
        let answered = own.iter().find(|e| e["type"] == "memory_answered").unwrap();
        assert_eq!((answered["entries"].as_u64(), answered["recall"].as_f64()), (Some(4), Some(1.0)), "{answered}");
    }
    let passed = of_type(&events, "episode_finished").iter().filter(|e| e["outcome"]["passed"] == true).count();
    assert_eq!(passed, 8);
    // The memory tables (one per variant) count each replay's entries once, not once per
    // episode that used it; which variant replayed a question is a race.
    let written: u64 =
        run.stdout.lines().filter_map(|l| l.strip_prefix("entries: ")?.split(' ').next()?.parse::<u64>().ok()).sum();
    assert_eq!(written, 8, "{}", run.stdout);
    assert!(run.stdout.contains("(2.0 per session"), "{}", run.stdout);

    // `ingest: {share: false}`: every episode replays its own haystack.
    counts.reset();
    let alone = sandbox(", ingest: {share: false}");
    let run = eval(&alone, &server, "test").await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(counts.get("ingest"), 48);
    assert!(of_type(&alone.events(), "ingest_reused").is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_regrade_of_a_memory_run_with_another_judge_calls_only_the_judge() {
    let (server, counts) = serve().await;
    let sb = sandbox("");
    let run = eval(&sb, &server, "test").await;
    assert_eq!(run.code, 0, "{run:?}");
    counts.reset();

    let args = ["regrade", "results/test", "--grader", "openai/judge-fail"];
    let regraded = crate::models::run_with(&sb, &args, &crate::models::openai_env(&server)).await;
    assert_eq!(regraded.code, 0, "{regraded:?}");
    assert_eq!((counts.get("ingest"), counts.get("answer")), (0, 0), "no agent call");
    assert_eq!((counts.get("judge:judge-fail"), counts.get("judge:judge-pass")), (8, 0));
    let events = sb.events();
    let verdicts: Vec<&Value> = of_type(&events, "episode_scored");
    assert_eq!(verdicts.len(), 8);
    assert!(verdicts.iter().all(|e| e["outcome"]["passed"] == false), "{verdicts:?}");
    let scores: Vec<&Value> = of_type(&events, "score").into_iter().filter(|e| e["scoring_id"] != "initial").collect();
    assert_eq!(scores.len(), 8);
    assert!(scores.iter().all(|s| s["grader"]["model"] == "openai/judge-fail"), "{scores:?}");
    // The regrade is each episode's judge stage again, logged as such before its scores.
    let regrade_at = events.iter().position(|e| e["type"] == "scoring_started").unwrap();
    let again = stages(&events[regrade_at..]);
    assert_eq!(again.len(), 8, "{again:?}");
    assert!(again.values().all(|s| s == &["judge"]), "{again:?}");
    for (episode, _) in again {
        let own = |kind: &str| {
            events[regrade_at..].iter().position(|e| e["episode_id"] == episode.as_str() && e["type"] == kind).unwrap()
        };
        assert!(own("stage") < own("score"), "{episode}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn compare_says_whether_two_runs_judges_are_comparable_and_names_what_differs() {
    let (server, _counts) = serve().await;
    let sb = sandbox("");
    for id in ["one", "two"] {
        let run = eval(&sb, &server, id).await;
        assert_eq!(run.code, 0, "{run:?}");
    }
    let events = read_jsonl(&sb.path().join("results/one/events.jsonl"));
    let scores = of_type(&events, "score");
    assert_eq!(scores.len(), 8);
    for s in &scores {
        let judge = &s["grader"]["judge_settings"];
        assert_eq!(judge["model"], "openai/judge-pass", "{s}");
        assert_eq!((judge["samples"].as_u64(), judge["kind"].as_str()), (Some(1), Some("rubric")), "{s}");
        assert_eq!(s["grader"]["judge"].as_str().map(str::len), Some(64), "{s}");
    }

    let same = sb.run(&["compare", "results/one", "results/two"]);
    assert_eq!(same.code, 0, "{same:?}");
    assert!(same.stdout.contains("judges: one and two are comparable: `llm_rubric`"), "{same:?}");
    assert!(!same.stderr.contains("warning: the judges"), "{same:?}");

    // The same judge model, sent another temperature: not the same judge.
    sb.write(
        "runner.yaml",
        "providers:\n  openai: {retry_base_s: 0.01, max_retries: 1, timeout_s: 5, sampling: {temperature: 0.7}}\n",
    );
    let args = ["regrade", "results/two"];
    let regraded = crate::models::run_with(&sb, &args, &crate::models::openai_env(&server)).await;
    assert_eq!(regraded.code, 0, "{regraded:?}");
    let differ = sb.run(&["compare", "results/one", "results/two"]);
    assert_eq!(differ.code, 0, "{differ:?}");
    assert!(
        differ
            .stdout
            .contains("judges: one and two are NOT comparable: `llm_rubric`: sampling {} vs {\"temperature\":0.7}"),
        "{differ:?}"
    );
    assert!(differ.stderr.contains("warning: the judges of one and two differ: `llm_rubric`: sampling"), "{differ:?}");
}

/// The ingestions a run saved.
fn saved_ingestions(sb: &Sandbox) -> Vec<String> {
    let folder = sb.path().join("results/test/ingestions");
    let Ok(entries) = std::fs::read_dir(&folder) else { return Vec::new() };
    let mut names: Vec<String> = entries.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    names.retain(|n| !n.starts_with('.'));
    names
}

fn checkpointed(sb: &Sandbox) -> u64 {
    let Ok(db) = rusqlite::Connection::open(sb.path().join("results/test/memory_agent.sqlite")) else { return 0 };
    db.query_row("SELECT max(json_extract(state, '$.next')) FROM threads", [], |r| r.get::<_, Option<i64>>(0))
        .ok()
        .flatten()
        .map_or(0, |n| n as u64)
}

/// A memory suite of one task, two epochs sharing its ingestion: one session of `n`
/// messages, and a mock script of `2 n` turns, each its own (a resumed replay that played
/// the script from its start again would store, and be sent, other words).
fn replaying_suite(n: usize, max_steps: u32) -> String {
    let turns: Vec<Value> = (0..n)
        .map(|i| json!({"role": if i % 2 == 0 {"user"} else {"assistant"}, "content": format!("message {i}")}))
        .collect();
    let sessions = json!([{"id": "s1", "date": "2023/05/20 (Sat) 10:00", "messages": turns}]);
    let mock: Vec<String> = (0..2 * n)
        .map(|i| {
            format!(
                r#"{{text: "Rex", tool_calls: [{{name: add_entry, arguments: {{summary: "noted {i}", raw_entry: "x"}}}}, {{name: put_context, arguments: {{content: "context number {i}"}}}}]}}"#
            )
        })
        .collect();
    format!(
        "suite: mem\nenvironment: memory_store\nagent: {{kind: memory, flush_every: 6}}\nepochs: 2\n\
         limits: {{max_steps: {max_steps}}}\nscorers: [{{includes: Rex}}]\ntasks:\n  - id: t\n    input: What is the dog called?\n\
         \x20   metadata: {{sessions: {sessions}}}\n    mock: [{}]\n",
        mock.join(", ")
    )
}

#[test]
fn an_ingestion_killed_midway_is_not_reused_the_resumed_replay_finishes_and_serves_the_next_epoch() {
    let sb = Sandbox::new();
    let n = 30;
    sb.write("s.yaml", &replaying_suite(n, 1000));
    // The same run never killed, to compare with; one episode at a time, so that the
    // first epoch replays and the second restores in both.
    let never_killed =
        sb.run(&["eval", "s.yaml", "--model", "mock", "--run-id", "whole", "--out", "results", "-j", "1", "-q"]);
    assert_eq!(never_killed.code, 0, "{never_killed:?}");
    let mut child = sb
        .command()
        .args(["eval", "s.yaml", "--model", "mock", "--run-id", "test", "--out", "results", "--mock-delay-ms", "40"])
        .args(["-j", "1", "-q"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn runner");
    let deadline = Instant::now() + Duration::from_secs(60);
    while checkpointed(&sb) < 5 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().expect("kill -9");
    child.wait().expect("reap");
    let before = checkpointed(&sb);
    assert!((5..(n as u64 + 2)).contains(&before), "killed after {before} invocations");
    assert_eq!(saved_ingestions(&sb), Vec::<String>::new(), "nothing saved before the replay ended");

    let resumed = sb.run(&["eval", "s.yaml", "--model", "mock", "--resume", "test", "--out", "results", "-j", "1"]);
    assert_eq!(resumed.code, 0, "{resumed:?}");
    assert_eq!(saved_ingestions(&sb).len(), 1);
    let events = sb.events();
    let resumed_at = events.iter().position(|e| e["type"] == "run_resumed").unwrap();
    // Before the kill, the second epoch had not begun.
    assert!(of_type(&events[..resumed_at], "ingest_reused").is_empty());
    assert!(of_type(&events[..resumed_at], "ingest_saved").is_empty());
    let saved = of_type(&events[resumed_at..], "ingest_saved");
    let reused = of_type(&events[resumed_at..], "ingest_reused");
    assert_eq!((saved.len(), reused.len()), (1, 1), "{saved:?} {reused:?}");
    assert_ne!(saved[0]["episode_id"], reused[0]["episode_id"]);
    let invocations_after = of_type(&events[resumed_at..], "memory_invocation");
    assert!(invocations_after.iter().all(|e| e["episode_id"] == saved[0]["episode_id"]));
    assert_eq!(invocations_after.len() as u64, n as u64 + 2 - before, "the replay went on from its checkpoint");
    let finished = of_type(&events[resumed_at..], "episode_finished");
    assert!(finished.iter().all(|e| e["outcome"]["passed"] == true), "{finished:?}");
    // The calls the killed attempt made before its checkpoint count in the episode that
    // went on with them: the tables are those of the run never killed.
    let carried = of_type(&events[resumed_at..], "ingest_resumed");
    assert_eq!(carried.len(), 1, "{carried:?}");
    assert_eq!(carried[0]["episode_id"], saved[0]["episode_id"]);
    assert_eq!(carried[0]["next"].as_u64(), Some(before), "{}", carried[0]);
    assert!(carried[0]["model_calls"].as_u64().is_some_and(|n| n >= before - 1), "{}", carried[0]);
    let results = sb.path().join("results");
    assert_eq!(crate::shards::differences(&results.join("whole"), &results.join("test")), None);
}

/// Regression: a run killed after an episode had saved its ingestion, but before it
/// finished, restored that ingestion on resume as if it were another episode's: the replay's
/// model calls and tokens counted in no episode, and the resumed run's tables differed from
/// those of a run never killed.
#[test]
fn an_episode_resumed_after_it_saved_its_ingestion_is_charged_for_that_replay() {
    let sb = Sandbox::new();
    let suite = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tasks/memory-replay.yaml");
    let suite = suite.to_str().expect("a UTF-8 path");
    let whole = sb.run(&["eval", suite, "--model", "mock", "--run-id", "whole", "--out", "results", "-q"]);
    assert_eq!(whole.code, 0, "{whole:?}");
    let results = sb.path().join("results");
    crate::bad_input::copy_tree(&results.join("whole"), &results.join("cut")).expect("copy the run");

    // The log as a kill just after an ingestion was saved leaves it: that episode's answer
    // and everything after are lost; every ingestion stays saved on disk.
    let log = std::fs::read_to_string(results.join("whole/events.jsonl")).expect("the log");
    let lines: Vec<&str> = log.lines().collect();
    let events: Vec<Value> = lines.iter().map(|l| serde_json::from_str(l).expect("an event")).collect();
    let cut = events.iter().position(|e| e["type"] == "ingest_saved").expect("an ingestion was saved");
    let episode = events[cut]["episode_id"].clone();
    let replay_calls = events[cut]["model_calls"].as_u64().expect("model_calls");
    assert!(replay_calls > 0, "{}", events[cut]);
    std::fs::write(results.join("cut/events.jsonl"), format!("{}\n", lines[..=cut].join("\n"))).expect("cut the log");

    let resumed = sb.run(&["eval", suite, "--model", "mock", "--resume", "results/cut", "-q"]);
    assert_eq!(resumed.code, 0, "{resumed:?}");
    let events = read_jsonl(&results.join("cut/events.jsonl"));
    let resumed_at = events.iter().position(|e| e["type"] == "run_resumed").expect("run_resumed");
    let of_episode = |kind: &str| -> Vec<&Value> {
        of_type(&events[resumed_at..], kind).into_iter().filter(|e| e["episode_id"] == episode).collect()
    };
    assert_eq!(of_episode("ingest_reused"), Vec::<&Value>::new(), "its own replay is not another's");
    let carried = of_episode("ingest_resumed");
    assert_eq!(carried.len(), 1, "{carried:?}");
    assert_eq!(carried[0]["model_calls"].as_u64(), Some(replay_calls), "{}", carried[0]);
    let asked = of_episode("model_call").into_iter().filter(|e| e["scorer"].is_null()).count();
    assert_eq!(asked, 1, "only the answer is asked again");
    assert_eq!(crate::shards::differences(&results.join("whole"), &results.join("cut")), None);
}

/// Regression: in a run nobody killed, an epoch whose replay ran out of steps left the key's
/// replay to the next epoch, which took it over and was charged for the first epoch's work
/// as well — counted twice, and its steps too, so it ran out of steps in turn.
#[test]
fn a_replay_taken_over_from_an_epoch_that_ran_out_of_steps_is_not_charged_again() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &replaying_suite(12, 10));
    let run = sb.run(&["eval", "s.yaml", "--model", "mock", "--run-id", "test", "--out", "results", "-j", "1", "-q"]);
    assert!(run.code == 0 || run.code == 1, "{run:?}");
    let events = sb.events();
    assert_eq!(of_type(&events, "ingest_resumed"), Vec::<&Value>::new(), "nobody was killed");
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished.len(), 2);
    assert_eq!(finished[0]["termination"], "max_steps", "the first epoch ran out of steps: {}", finished[0]);
    // Each epoch's model calls in the table are those it made itself.
    let table = crate::runs::table(&sb.path().join("results/test"));
    for (row, done) in table.iter().zip(&finished) {
        let made = events
            .iter()
            .filter(|e| e["type"] == "model_call" && e["episode_id"] == done["episode_id"] && e["scorer"].is_null())
            .count();
        assert_eq!(row["model_calls"], made.to_string(), "{row:?}");
        assert_eq!(row["steps"], done["steps"].to_string(), "{row:?}");
    }
    // Its steps are its own: charged the first epoch's, it would have had one turn left.
    let second = of_type(&events, "episode_started")[1]["episode_id"].clone();
    let second_invocations =
        of_type(&events, "memory_invocation").into_iter().filter(|e| e["episode_id"] == second).count();
    assert!(second_invocations >= 3, "the second epoch went on with the replay: {second_invocations} invocations");
}
