//! `runner serve`: a real server process on a real port, asked over HTTP by real clients —
//! reqwest here, a Python client of the standard library with 64 threads, and OpenEnv's own
//! client from PyPI — against `mock` and local OpenAI-compatible endpoints.

use std::io::BufRead as _;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::{Run, Sandbox, of_type, read_jsonl};

/// Two kv tasks answered with the calculator, in two splits.
const SUITE: &str = "suite: served
environment: kv
scorers: [{equals: \"4\"}]
mock:
  - tool_calls: [{name: calc, arguments: {expression: \"2+2\"}}]
  - text: \"4\"
tasks:
  - {id: add, input: What is 2+2?, split: train}
  - {id: held-add, input: What is 2+2 again?, split: test}
";

/// One kv task, answered by whatever the endpoint says.
const ONE_TASK: &str =
    "suite: one\nenvironment: kv\nscorers: [{equals: \"4\"}]\ntasks:\n  - {id: add, input: What is 2+2?}\n";

/// A `runner serve` process, killed when dropped.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    /// Starts `runner serve s.yaml --listen 127.0.0.1:0 --run-id test --out results ARGS`
    /// and waits for the address it says it listens on.
    fn start(sb: &Sandbox, args: &[&str]) -> Server {
        Server::start_on(sb, "127.0.0.1:0", args)
    }

    /// [`Server::start`] listening on `listen`.
    fn start_on(sb: &Sandbox, listen: &str, args: &[&str]) -> Server {
        let stderr = std::fs::File::options().create(true).append(true).open(sb.path().join("serve.err")).unwrap();
        let mut child = sb
            .command()
            .args(["serve", "s.yaml", "--listen", listen, "--run-id", "test", "--out", "results"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start runner serve");
        let mut first = String::new();
        let stdout = child.stdout.take().unwrap();
        let mut lines = std::io::BufReader::new(stdout);
        lines.read_line(&mut first).unwrap();
        let url = first.trim().strip_prefix("listening on ").map(String::from).unwrap_or_else(|| {
            let _ = child.kill();
            panic!(
                "no address: {first:?}; stderr: {}",
                std::fs::read_to_string(sb.path().join("serve.err")).unwrap_or_default()
            )
        });
        // The rest of stdout is read so that the server never blocks on it.
        std::thread::spawn(move || for _ in lines.lines() {});
        Server { child, url }
    }

    /// Stops it as Ctrl-C would; its exit.
    fn stop(mut self) -> i32 {
        // SAFETY: a signal to the child we started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap().code().unwrap_or(-1)
    }

    /// Kills it outright (`kill -9`).
    fn kill(mut self) {
        // SAFETY: a signal to the child we started.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn post(url: &str, body: &Value) -> (u16, Value) {
    let response = reqwest::Client::new().post(url).json(body).send().await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap_or(Value::Null))
}

async fn get(url: &str) -> (u16, Value) {
    let response = reqwest::get(url).await.unwrap();
    (response.status().as_u16(), response.json().await.unwrap_or(Value::Null))
}

/// An OpenAI-compatible endpoint that answers every request with `text`, after `delay`.
async fn endpoint(text: &str, delay: Duration) -> MockServer {
    let server = MockServer::start().await;
    let answer = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                        "finish_reason": "stop", "token_ids": [19], "logprobs": {"content": [{"token": text, "logprob": -0.25}]}}],
                        "prompt_token_ids": [1, 2, 3], "usage": {"prompt_tokens": 3, "completion_tokens": 1}});
    let template = ResponseTemplate::new(200).set_body_json(answer).set_delay(delay);
    Mock::given(method("POST")).and(path("/v1/chat/completions")).respond_with(template).mount(&server).await;
    server
}

/// A port nobody listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_served_episode_is_scored_and_its_run_reads_as_any_run() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let server = Server::start(&sb, &[]);
    let (status, answer) = post(&format!("{}/v1/episodes", server.url), &json!({"task": "add", "model": "mock"})).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["outcome"], json!({"status": "scored", "score": 1.0, "passed": true}), "{answer}");
    assert_eq!((answer["reward"].as_f64(), answer["masked"].as_bool()), (Some(1.0), Some(false)));
    assert_eq!(answer["scores"][0]["scorer"], "equals", "{answer}");
    let calls: Vec<&str> =
        answer["trajectory"]["actions"].as_array().unwrap().iter().filter_map(|a| a["call"]["name"].as_str()).collect();
    assert_eq!(calls, ["calc", "final_answer"], "{answer}");
    assert_eq!(answer["trajectory"]["actions"][0]["observation"]["tool_result"]["value"], json!(4.0), "{answer}");
    let id = answer["episode_id"].as_str().unwrap();
    let (_, again) = get(&format!("{}/v1/episodes/{id}", server.url)).await;
    assert_eq!(again["outcome"], answer["outcome"]);
    // A second request of the task is a new episode: the next epoch.
    let (_, second) = post(&format!("{}/v1/episodes", server.url), &json!({"task": "add", "model": "mock"})).await;
    assert_eq!((second["epoch"].as_u64(), second["episode_id"] != answer["episode_id"]), (Some(2), true), "{second}");
    // The run folder is an ordinary run's, read by `runner report` while it serves.
    // (The log's writer thread writes an episode's last lines within milliseconds of its
    // answer: the report is asked again until they are there.)
    let mut csv = String::new();
    for _ in 0..50 {
        let report = sb.run(&["report", "results/test"]);
        assert_eq!(report.code, 0, "{report:?}");
        csv = std::fs::read_to_string(sb.path().join("results/test/episodes.csv")).unwrap();
        if csv.lines().count() == 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(csv.lines().count(), 3, "a header and the two episodes: {csv}");
    assert_eq!(server.stop(), 0);
    let events = sb.events();
    assert_eq!(of_type(&events, "episode_finished").len(), 2);
    assert_eq!(of_type(&events, "run_finished").len(), 1, "the run is closed when the server stops");
    assert_eq!(sb.run(&["report", "results/test"]).code, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn tasks_are_listed_by_split_and_the_key_is_asked_for() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    sb.write("key", "k-0123456789abcdef\n");
    let server = Server::start(&sb, &["--key-file", "key"]);
    let client = reqwest::Client::new();
    let tasks = format!("{}/v1/tasks?split=test", server.url);
    assert_eq!(client.get(&tasks).send().await.unwrap().status().as_u16(), 401);
    let wrong = client.get(&tasks).bearer_auth("k-0123456789abcdeX").send().await.unwrap();
    assert_eq!(wrong.status().as_u16(), 401);
    let body: Value = wrong.json().await.unwrap();
    assert_eq!(body["error"]["field"], "authorization", "{body}");
    let listed: Value =
        client.get(&tasks).bearer_auth("k-0123456789abcdef").send().await.unwrap().json().await.unwrap();
    let ids: Vec<&str> = listed["tasks"].as_array().unwrap().iter().filter_map(|t| t["task"].as_str()).collect();
    assert_eq!(ids, ["held-add"], "{listed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_are_refused_naming_the_field() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let server = Server::start(&sb, &[]);
    let episodes = format!("{}/v1/episodes", server.url);
    let cases = [
        (json!({"task": "nope", "model": "mock"}), 404, "task"),
        (json!({"task": "add"}), 400, "model"),
        (json!({"task": "add", "model": {"base_url": "localhost:1", "model": "m"}}), 400, "model.base_url"),
        (json!({"task": "add", "model": "mock", "epoch": 0}), 400, "epoch"),
        (json!({"task": "add", "model": "mock", "suite": "other"}), 404, "suite"),
    ];
    for (body, status, field) in cases {
        let (got, answer) = post(&episodes, &body).await;
        assert_eq!((got, answer["error"]["field"].as_str()), (status, Some(field)), "{body}: {answer}");
    }
    let raw = reqwest::Client::new().post(&episodes).body("{\"task\": ").send().await.unwrap();
    assert_eq!(raw.status().as_u16(), 400);
    let answer: Value = raw.json().await.unwrap();
    assert_eq!(answer["error"]["field"], "body", "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("not JSON"), "{answer}");
    let (status, answer) =
        post(&format!("{}/step", server.url), &json!({"session_id": "ep_nope", "action": {"text": "4"}})).await;
    assert_eq!((status, answer["error"]["field"].as_str()), (404, Some("session_id")), "{answer}");
    let (status, _) = get(&format!("{}/v1/episodes/ep_nope", server.url)).await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread")]
async fn past_the_bound_a_request_gets_429_with_retry_after_and_delete_cancels() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let server = Server::start(&sb, &["-j", "1", "--mock-delay-ms", "3000"]);
    let episodes = format!("{}/v1/episodes", server.url);
    let (status, first) = post(&episodes, &json!({"task": "add", "model": "mock", "wait": false})).await;
    assert_eq!((status, first["status"].as_str()), (202, Some("running")), "{first}");
    let refused =
        reqwest::Client::new().post(&episodes).json(&json!({"task": "add", "model": "mock"})).send().await.unwrap();
    assert_eq!(refused.status().as_u16(), 429);
    assert_eq!(refused.headers()["retry-after"], "1");
    let id = first["episode_id"].as_str().unwrap();
    let cancel = reqwest::Client::new().delete(format!("{episodes}/{id}")).send().await.unwrap();
    assert_eq!(cancel.status().as_u16(), 202);
    let ended = poll_ended(&server.url, id).await;
    assert_eq!(
        (ended["outcome"]["status"].as_str(), ended["masked"].as_bool()),
        (Some("cancelled"), Some(true)),
        "{ended}"
    );
    assert_eq!(ended["termination"], "user_stop", "{ended}");
    // Its place is free again.
    let (status, _) = post(&episodes, &json!({"task": "add", "model": "mock", "wait": false})).await;
    assert_eq!(status, 202);
}

async fn poll_ended(url: &str, id: &str) -> Value {
    for _ in 0..200 {
        let (_, answer) = get(&format!("{url}/v1/episodes/{id}")).await;
        if answer["status"] == "ended" {
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("episode {id} did not end");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_callers_endpoint_that_is_down_makes_the_episode_unscored_never_0() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let server = Server::start(&sb, &["--endpoint-retries", "0"]);
    let model = json!({"base_url": format!("http://127.0.0.1:{}/v1", closed_port()), "model": "tiny"});
    let (status, answer) = post(&format!("{}/v1/episodes", server.url), &json!({"task": "add", "model": model})).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["outcome"]["status"], "unscored", "{answer}");
    assert_eq!(answer["outcome"]["cause"], "provider_error", "{answer}");
    assert_eq!((answer["reward"].clone(), answer["masked"].as_bool()), (Value::Null, Some(true)), "{answer}");
    assert!(answer["says"].as_str().unwrap().contains("not a reward of 0"), "{answer}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_goes_away_mid_episode_cancels_it() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let server = Server::start(&sb, &["--mock-delay-ms", "2000"]);
    let url = format!("{}/v1/episodes", server.url);
    let body = json!({"task": "add", "model": "mock"});
    // The client gives up after half a second: its connection closes mid-episode.
    let gone = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap()
        .post(&url)
        .json(&body)
        .send()
        .await;
    assert!(gone.is_err(), "the episode should still run");
    let (_, listed) = get(&format!("{}/v1/episodes", server.url)).await;
    let id = listed["episodes"][0]["episode_id"].as_str().map(String::from);
    let id = match id {
        Some(id) => id,
        None => of_type(&sb.events(), "episode_started")[0]["episode_id"].as_str().unwrap().to_owned(),
    };
    let ended = poll_ended(&server.url, &id).await;
    assert_eq!(ended["outcome"]["status"], "cancelled", "{ended}");
    assert_eq!(server.stop(), 0);
    let finished = of_type(&sb.events(), "episode_finished").into_iter().cloned().collect::<Vec<_>>();
    assert_eq!(finished[0]["outcome"]["status"], "cancelled", "logged: {finished:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn token_ids_pass_through_and_a_recorded_episode_replays_to_the_same_reward() {
    let model = endpoint("4", Duration::ZERO).await;
    let sb = Sandbox::new();
    sb.write("s.yaml", ONE_TASK);
    let server = Server::start(&sb, &["--record", "served.jsonl"]);
    let caller = json!({"base_url": format!("{}/v1", model.uri()), "model": "tiny", "api_key": "caller-secret-1234"});
    let (_, answer) = post(&format!("{}/v1/episodes", server.url), &json!({"task": "add", "model": caller})).await;
    assert_eq!(answer["reward"].as_f64(), Some(1.0), "{answer}");
    let call = &answer["trajectory"]["model_calls"][0];
    assert_eq!(
        (call["token_ids"].clone(), call["prompt_token_ids"].clone()),
        (json!([19]), json!([1, 2, 3])),
        "{call}"
    );
    assert_eq!(call["logprobs"]["content"][0]["logprob"], json!(-0.25), "{call}");
    let roles: Vec<&str> =
        answer["trajectory"]["messages"].as_array().unwrap().iter().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(roles, ["user", "assistant"], "the transcript the endpoint saw and its answer: {answer}");
    assert_eq!(server.stop(), 0);
    let everything = std::fs::read_to_string(sb.path().join("results/test/events.jsonl")).unwrap()
        + &std::fs::read_to_string(sb.path().join("served.jsonl")).unwrap()
        + &std::fs::read_to_string(sb.path().join("results/test/serve.jsonl")).unwrap();
    assert!(!everything.contains("caller-secret-1234"), "the caller's key was written");
    let replay =
        sb.run(&["eval", "s.yaml", "--model", "replay:served.jsonl", "--run-id", "replayed", "--out", "results"]);
    assert_eq!(replay.code, 0, "{replay:?}");
    let replayed = read_jsonl(&sb.path().join("results/replayed/events.jsonl"));
    let finished = of_type(&replayed, "episode_finished");
    assert_eq!(finished[0]["episode_id"], answer["episode_id"], "the same episode, by id");
    assert_eq!(finished[0]["outcome"]["score"], answer["reward"], "{:?}", finished[0]);
}

/// 64 episodes at once from a Python client's threads, half on a fast endpoint and half on
/// a slow one; the server is killed (`kill -9`) once the fast ones have ended, and started
/// again on the same run: the slow ones are interrupted, retried by id, and every episode
/// ends with exactly one outcome, which replaying the cassette reproduces.
#[tokio::test(flavor = "multi_thread")]
async fn sixty_four_episodes_survive_a_kill_and_replay_to_the_same_rewards() {
    if !crate::have_python() {
        return;
    }
    let (fast, slow) = (endpoint("4", Duration::ZERO).await, endpoint("4", Duration::from_secs(30)).await);
    let sb = Sandbox::new();
    sb.write("s.yaml", ONE_TASK);
    let jobs: Vec<Value> = (0..64)
        .map(|i| {
            let uri = if i % 2 == 0 { fast.uri() } else { slow.uri() };
            json!({"task": "add", "model": {"base_url": format!("{uri}/v1"), "model": "tiny"}})
        })
        .collect();
    sb.write("jobs.json", &serde_json::to_string(&jobs).unwrap());
    let server = Server::start(&sb, &["-j", "64", "--record", "served.jsonl"]);
    let client = std::process::Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/serve/client.py"))
        .args([&server.url, "out.jsonl", "jobs.json"])
        .current_dir(sb.path())
        .spawn()
        .unwrap();
    let out = sb.path().join("out.jsonl");
    let ended = || std::fs::read_to_string(&out).map(|t| t.lines().count()).unwrap_or(0);
    let started = std::time::Instant::now();
    while ended() < 32 {
        assert!(started.elapsed() < Duration::from_secs(60), "the fast half did not end");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.kill();
    let client = tokio::task::spawn_blocking(move || {
        let mut c = client;
        c.wait()
    })
    .await
    .unwrap()
    .unwrap();
    assert!(client.success());
    let lines = read_jsonl(&out);
    assert_eq!(lines.len(), 64, "every request has a line");
    let lost: Vec<&str> = lines.iter().filter(|l| l["lost"] == true).filter_map(|l| l["episode_id"].as_str()).collect();
    assert_eq!(lost.len(), 32, "the slow half was in flight: {lines:?}");
    // Started again on the same run: the interrupted ones are said to be so, then retried
    // against an endpoint that answers now.
    slow.reset().await;
    Mock::given(method("POST")).and(path("/v1/chat/completions")).respond_with(
        ResponseTemplate::new(200).set_body_json(json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}]})),
    ).mount(&slow).await;
    let server = Server::start(&sb, &["-j", "64", "--record", "served.jsonl"]);
    for id in &lost {
        let (_, status) = get(&format!("{}/v1/episodes/{id}", server.url)).await;
        assert_eq!(
            (status["status"].as_str(), status["masked"].as_bool()),
            (Some("interrupted"), Some(true)),
            "{status}"
        );
        let (code, retried) = post(&format!("{}/v1/episodes/{id}/retry", server.url), &json!({})).await;
        assert_eq!((code, retried["reward"].as_f64()), (200, Some(1.0)), "{retried}");
    }
    for line in lines.iter().filter(|l| l["lost"] != true) {
        let (_, status) = get(&format!("{}/v1/episodes/{}", server.url, line["episode_id"].as_str().unwrap())).await;
        assert_eq!(status["outcome"], line["outcome"], "reported after the restart as it ended before");
    }
    assert_eq!(server.stop(), 0);
    // Exactly one outcome per episode in the run's tables.
    let report = sb.run(&["report", "results/test"]);
    assert_eq!(report.code, 0, "{report:?}");
    let csv = std::fs::read_to_string(sb.path().join("results/test/episodes.csv")).unwrap();
    assert_eq!(csv.lines().count(), 65, "64 episodes, each once: {csv}");
    // The cassette replays every reward offline.
    let replay = sb.run(&[
        "eval",
        "s.yaml",
        "--model",
        "replay:served.jsonl",
        "--epochs",
        "64",
        "--run-id",
        "replayed",
        "--out",
        "results",
    ]);
    assert_eq!(replay.code, 0, "{replay:?}");
    let served = read_jsonl(&sb.path().join("results/test/events.jsonl"));
    let replayed = read_jsonl(&sb.path().join("results/replayed/events.jsonl"));
    let outcomes = |events: &[Value]| -> std::collections::BTreeMap<String, Value> {
        of_type(events, "episode_finished")
            .iter()
            .map(|e| (e["episode_id"].as_str().unwrap().to_owned(), e["outcome"].clone()))
            .collect()
    };
    let (served, replayed) = (outcomes(&served), outcomes(&replayed));
    assert_eq!(replayed.len(), 64);
    assert_eq!(served, replayed, "every episode replays to its outcome");
}

/// The OpenEnv client from PyPI, installed by `scripts/install-test-servers.sh`.
fn openenv_python() -> std::path::PathBuf {
    let python = crate::gateway::servers_dir().join("openenv-venv/bin/python3");
    assert!(
        python.is_file(),
        "openenv-core is not installed: no {} — run scripts/install-test-servers.sh (CI's .ci/run does)",
        python.display()
    );
    python
}

/// Runs OpenEnv's client against `url`: reset `task`, then each of `actions`, off the runtime.
async fn openenv(url: &str, task: &str, actions: &Value) -> Value {
    let mut command = std::process::Command::new(openenv_python());
    command.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/serve/openenv_steps.py"));
    command.args([url, task, &actions.to_string()]);
    let output = tokio::task::spawn_blocking(move || command.output().unwrap()).await.unwrap();
    let run = Run::from(output);
    assert_eq!(run.code, 0, "{run:?}");
    serde_json::from_str(run.stdout.lines().last().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}: {run:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn openenvs_own_client_steps_a_kv_task_to_its_reward() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    sb.write("key", "k-0123456789abcdef\n");
    let server = Server::start(&sb, &["--key-file", "key"]);
    let keyed = server.url.replacen("http://", "http://runner:k-0123456789abcdef@", 1);
    let actions = json!([{"tool_calls": [{"name": "calc", "arguments": {"expression": "2+2"}}]}, {"text": "4"}]);
    let run = openenv(&keyed, "add", &actions).await;
    assert!(run["tools"].as_array().unwrap().contains(&json!("calc")), "{run}");
    assert_eq!(run["first"]["messages"].as_array().unwrap().last().unwrap()["content"], "What is 2+2?", "{run}");
    let calc = &run["steps"][0];
    assert_eq!(calc["done"], false, "{run}");
    assert!(
        calc["observation"]["messages"][0]["content"].as_str().unwrap().contains('4'),
        "the result comes back: {run}"
    );
    assert_eq!((run["done"].as_bool(), run["reward"].as_f64()), (Some(true), Some(1.0)), "{run}");
    assert_eq!(run["state"]["done"], true, "{run}");
    assert_eq!(server.stop(), 0);
    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished[0]["outcome"]["status"], "scored", "the stepped episode is logged as any: {finished:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn openenvs_own_client_steps_a_shell_task_in_its_sandbox_to_its_reward() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        "suite: files\nenvironment: shell\nscorers: [{equals: \"3\"}]\ntasks:\n  - id: count\n    input: How many lines are in data.txt?\n    files: {data.txt: \"a\\nb\\nc\\n\"}\n",
    );
    let server = Server::start(&sb, &[]);
    let actions = json!([{"name": "run_command", "arguments": {"command": "wc -l < data.txt"}}, {"text": "3"}]);
    let run = openenv(&server.url, "count", &actions).await;
    assert!(run["tools"].as_array().unwrap().contains(&json!("run_command")), "{run}");
    let output = run["steps"][0]["observation"]["messages"][0]["content"].as_str().unwrap_or_default().to_owned();
    assert!(output.contains('3'), "the command ran in the task's folder: {run}");
    assert_eq!((run["done"].as_bool(), run["reward"].as_f64()), (Some(true), Some(1.0)), "{run}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_http_step_api_names_a_session_and_refuses_a_step_after_the_end() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let server = Server::start(&sb, &[]);
    let (status, first) = post(&format!("{}/reset", server.url), &json!({"task": "add"})).await;
    assert_eq!((status, first["done"].as_bool()), (200, Some(false)), "{first}");
    let session = first["session_id"].as_str().unwrap().to_owned();
    let (_, state) = get(&format!("{}/state?session_id={session}", server.url)).await;
    assert_eq!((state["task"].as_str(), state["done"].as_bool()), (Some("add"), Some(false)), "{state}");
    let step = |action: Value| {
        let (url, session) = (format!("{}/step", server.url), session.clone());
        async move { post(&url, &json!({"session_id": session, "action": action})).await }
    };
    let (status, bad) = step(json!({"tool_calls": [{"arguments": {}}]})).await;
    assert_eq!((status, bad["error"]["field"].as_str()), (400, Some("action.tool_calls[0].name")), "{bad}");
    let (_, end) = step(json!({"text": "5"})).await;
    assert_eq!(
        (end["done"].as_bool(), end["reward"].as_f64()),
        (Some(true), Some(0.0)),
        "a wrong answer is a reward of 0: {end}"
    );
    assert_eq!(end["info"]["masked"], false, "{end}");
    let (status, after) = step(json!({"text": "4"})).await;
    assert_eq!((status, after["error"]["field"].as_str()), (409, Some("session_id")), "{after}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_episodes_events_stream_as_server_sent_events_until_it_ends() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let server = Server::start(&sb, &["--mock-delay-ms", "300"]);
    let (_, admitted) =
        post(&format!("{}/v1/episodes", server.url), &json!({"task": "add", "model": "mock", "wait": false})).await;
    let id = admitted["episode_id"].as_str().unwrap();
    let mut response = reqwest::get(format!("{}/v1/episodes/{id}/events", server.url)).await.unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut text = String::new();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(20), response.chunk()).await.unwrap().unwrap() {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let kinds: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(kinds.first(), Some(&"episode_started"), "{text}");
    assert_eq!(kinds.last(), Some(&"episode_finished"), "the stream ends with the episode: {text}");
    assert_eq!(kinds.iter().filter(|k| **k == "model_call").count(), 2, "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_is_checked_whole_first_then_streams_each_answer_as_it_ends() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let server = Server::start(&sb, &["-j", "2"]);
    let batches = format!("{}/v1/batches", server.url);
    let bad = json!({"episodes": [{"task": "add", "model": "mock"}, {"task": "nope", "model": "mock"}]});
    let (status, refused) = post(&batches, &bad).await;
    assert_eq!((status, refused["error"]["field"].as_str()), (404, Some("episodes[1].task")), "{refused}");
    let (_, listed) = get(&format!("{}/v1/episodes", server.url)).await;
    assert_eq!(listed["episodes"], json!([]), "nothing of a refused batch ran");
    let five: Vec<Value> =
        (0..5).map(|i| json!({"task": if i % 2 == 0 { "add" } else { "held-add" }, "model": "mock"})).collect();
    let response = reqwest::Client::new().post(&batches).json(&json!({"episodes": five})).send().await.unwrap();
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let text = response.text().await.unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let mut indexes: Vec<u64> = lines.iter().filter_map(|l| l["index"].as_u64()).collect();
    indexes.sort();
    assert_eq!(indexes, [0, 1, 2, 3, 4], "{text}");
    assert!(lines.iter().all(|l| l["outcome"]["status"] == "scored"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn it_listens_on_a_unix_socket_too() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let socket = sb.path().join("runner.sock");
    let listen = format!("unix:{}", socket.display());
    let server = Server::start_on(&sb, &listen, &[]);
    assert_eq!(server.url, listen);
    let mut stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
    stream.write_all(b"GET /v1/tasks HTTP/1.1\r\nhost: runner\r\nconnection: close\r\n\r\n").await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"held-add\""), "{answer}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stepped_episode_is_recorded_and_replays_to_the_same_reward() {
    let sb = Sandbox::new();
    sb.write("s.yaml", ONE_TASK);
    let server = Server::start(&sb, &["--record", "steps.jsonl"]);
    let (_, first) = post(&format!("{}/reset", server.url), &json!({"task": "add"})).await;
    let session = first["session_id"].as_str().unwrap();
    let step = format!("{}/step", server.url);
    let calc = json!({"session_id": session, "action": {"name": "calc", "arguments": {"expression": "2+2"}}});
    let (_, observed) = post(&step, &calc).await;
    assert_eq!(observed["observation"]["messages"][0]["role"], "tool", "{observed}");
    let (_, end) = post(&step, &json!({"session_id": session, "action": {"text": "4"}})).await;
    assert_eq!(end["reward"].as_f64(), Some(1.0), "{end}");
    assert_eq!(server.stop(), 0);
    let replay =
        sb.run(&["eval", "s.yaml", "--model", "replay:steps.jsonl", "--run-id", "replayed", "--out", "results"]);
    assert_eq!(replay.code, 0, "{replay:?}");
    let replayed = read_jsonl(&sb.path().join("results/replayed/events.jsonl"));
    let finished = of_type(&replayed, "episode_finished");
    assert_eq!(finished[0]["episode_id"], end["episode_id"], "{finished:?}");
    assert_eq!(finished[0]["outcome"]["score"], json!(1.0), "{finished:?}");
    let calls: Vec<&str> =
        of_type(&replayed, "action_dispatched").iter().filter_map(|e| e["call"]["name"].as_str()).collect();
    assert_eq!(calls, ["calc", "final_answer"], "the caller's actions, replayed");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_websocket_that_closes_mid_episode_cancels_it() {
    use futures::SinkExt as _;
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let server = Server::start(&sb, &[]);
    let address = server.url.trim_start_matches("http://").to_owned();
    let stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let (mut socket, _) = tokio_tungstenite::client_async(format!("ws://{address}/ws"), stream).await.unwrap();
    let reset = json!({"type": "reset", "data": {"task": "add"}}).to_string();
    socket.send(tokio_tungstenite::tungstenite::Message::text(reset)).await.unwrap();
    let answer = futures::StreamExt::next(&mut socket).await.unwrap().unwrap();
    let answer: Value = serde_json::from_str(answer.to_text().unwrap()).unwrap();
    assert_eq!(answer["type"], "observation", "{answer}");
    let id = answer["data"]["episode_id"].as_str().unwrap().to_owned();
    drop(socket);
    let ended = poll_ended(&server.url, &id).await;
    assert_eq!(
        (ended["outcome"]["status"].as_str(), ended["termination"].as_str()),
        (Some("cancelled"), Some("user_stop")),
        "{ended}"
    );
}

/// A kill between the log's last line of an episode and the queue's: the log says it
/// finished, so after the restart it is reported ended, not interrupted, and the queue is told.
#[tokio::test(flavor = "multi_thread")]
async fn an_episode_the_log_shows_finished_is_not_reported_interrupted() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let server = Server::start(&sb, &[]);
    let (_, answer) = post(&format!("{}/v1/episodes", server.url), &json!({"task": "add", "model": "mock"})).await;
    assert_eq!(server.stop(), 0);
    let queue = sb.path().join("results/test/serve.jsonl");
    let lines: Vec<String> = std::fs::read_to_string(&queue).unwrap().lines().map(String::from).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    std::fs::write(&queue, format!("{}\n", lines[0])).unwrap();
    let server = Server::start(&sb, &[]);
    let id = answer["episode_id"].as_str().unwrap();
    let (_, status) = get(&format!("{}/v1/episodes/{id}", server.url)).await;
    assert_eq!(
        (status["status"].as_str(), status["outcome"].clone()),
        (Some("ended"), answer["outcome"].clone()),
        "{status}"
    );
    let (_, open) = get(&format!("{}/v1/episodes", server.url)).await;
    assert_eq!(open["episodes"], json!([]), "nothing interrupted");
    assert_eq!(std::fs::read_to_string(&queue).unwrap().lines().count(), 2, "the queue was told it ended");
}

/// A kill after an answer, before the log's writer wrote the episode's last lines: the
/// queue says it ended, the log has no finish. After the restart it is interrupted (the
/// log is the truth), so a retry runs it and the run's tables count it once.
#[tokio::test(flavor = "multi_thread")]
async fn an_episode_the_queue_ended_without_a_finish_in_the_log_is_interrupted() {
    let sb = Sandbox::new();
    sb.write("s.yaml", SUITE);
    let server = Server::start(&sb, &[]);
    let (_, answer) = post(&format!("{}/v1/episodes", server.url), &json!({"task": "add", "model": "mock"})).await;
    assert_eq!(server.stop(), 0);
    let id = answer["episode_id"].as_str().unwrap().to_owned();
    let log = sb.path().join("results/test/events.jsonl");
    let kept: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter(|l| !(l.contains("\"episode_finished\"") && l.contains(&id)))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&log, kept.concat()).unwrap();
    let server = Server::start(&sb, &[]);
    let (_, status) = get(&format!("{}/v1/episodes/{id}", server.url)).await;
    assert_eq!(status["status"].as_str(), Some("interrupted"), "{status}");
    let (_, retried) = post(&format!("{}/v1/episodes/{id}/retry", server.url), &json!({})).await;
    assert_eq!(retried["outcome"], answer["outcome"], "{retried}");
    assert_eq!(server.stop(), 0);
    let finishes = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"episode_finished\"") && l.contains(&id))
        .count();
    assert_eq!(finishes, 1, "the retried episode is finished once in the log");
}
