//! API keys reach nothing that is stored, whatever path they take: echoed by a provider in
//! a successful answer, or read by a command from runner's own environment.

use serde_json::json;
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::{Run, Sandbox};

const KEY: &str = "sk-echoed-secret-0123456789abcdef";

/// The model reads runner's environment through /proc and writes what it found to a file
/// outside the log; then it answers with the key itself.
struct Turns;

impl Respond for Turns {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let body: serde_json::Value = request.body_json().unwrap_or_default();
        let turn = body["messages"].as_array().map_or(0, |m| m.iter().filter(|m| m["role"] == "tool").count());
        let message = if turn == 0 {
            let command = "tr '\\0' '\\n' < /proc/$PPID/environ > ../../../environ.txt; grep -c KEY ../../../environ.txt; cat ../../../environ.txt";
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                   "function": {"name": "run_command", "arguments": json!({"command": command}).to_string()}}]})
        } else {
            json!({"role": "assistant", "content": format!("the key is {KEY}, and again: {KEY}")})
        };
        ResponseTemplate::new(200).set_body_json(json!({"choices": [{"index": 0, "message": message,
            "finish_reason": "stop"}], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}))
    }
}

fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = entry.path();
        if p.is_dir() { out.extend(files_under(&p)) } else { out.push(p) }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_echoed_by_the_provider_or_read_by_a_command_is_stored_nowhere() {
    let server = MockServer::start().await;
    Mock::given(method("POST")).and(path("/v1/chat/completions")).respond_with(Turns).mount(&server).await;
    let sb = Sandbox::new();
    // The command's working directory is a folder of the run's scratch folder, under $TMPDIR.
    let tmp = sb.path().join("tmp/scratch");
    std::fs::create_dir_all(&tmp).unwrap();
    sb.write(
        "s.yaml",
        "suite: k\nenvironment: shell\nscorers: [{includes: key}]\ntasks:\n  - {id: t, input: tell me the key}\n",
    );
    sb.write("runner.yaml", "providers:\n  openai: {max_retries: 0, timeout_s: 30}\n");
    let mut cmd = sb.command();
    cmd.args(["eval", "s.yaml", "--model", "openai/gpt-test", "--run-id", "test", "--out", "results"])
        .args(["--record", "tape.jsonl", "--cache", "--cache-dir", "cache"])
        .env("OPENAI_BASE_URL", format!("{}/v1", server.uri()))
        .env("OPENAI_API_KEY", KEY)
        .env("TMPDIR", &tmp)
        // The sandbox keeps a command from reading the runner's environment at all (see
        // `crates/sandbox/`); without it, the key must already be gone from there.
        .args(["--sandbox", "off"]);
    let run = tokio::task::spawn_blocking(move || Run::from(cmd.output().unwrap())).await.unwrap();
    assert_eq!(run.code, 0, "{run:?}");
    let requests = server.received_requests().await.unwrap();
    assert_eq!(requests.len(), 2, "the command ran and the model answered");
    assert_eq!(requests[0].headers.get("authorization").unwrap(), &format!("Bearer {KEY}"), "the key is still sent");

    // What the command could read of runner's environment.
    let environ = std::fs::read_to_string(tmp.join("environ.txt")).expect("the command wrote what it read");
    assert!(environ.contains("TMPDIR="), "the command read runner's environment: {environ}");
    assert!(!environ.contains(KEY), "runner's environment still holds the key: {environ}");
    // The observation of the command reached the model, and the key did not.
    let second = requests[1].body_json::<serde_json::Value>().unwrap().to_string();
    assert!(second.contains("TMPDIR="), "{second}");
    assert!(!second.contains(KEY), "the command's output carried the key to the provider");

    let report = sb.run(&["report", "results/test", "--html"]);
    assert_eq!(report.code, 0, "{report:?}");
    let mut stored = files_under(&sb.path().join("results"));
    stored.extend(files_under(&sb.path().join("cache")));
    stored.push(sb.path().join("tape.jsonl"));
    assert!(stored.iter().any(|p| p.ends_with("report.html")), "{stored:?}");
    assert!(
        stored.iter().any(|p| p.extension().is_some_and(|x| x == "json") && p.starts_with(sb.path().join("cache")))
    );
    for file in &stored {
        let bytes = std::fs::read(file).unwrap();
        assert!(!bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()), "{} holds the key", file.display());
    }
    let log = std::fs::read_to_string(sb.path().join("results/test/events.jsonl")).unwrap();
    assert!(log.contains("the key is [REDACTED], and again: [REDACTED]"), "the answer is kept, the key cut");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_cut_in_two_by_a_shortened_error_is_not_stored_in_part() {
    let server = MockServer::start().await;
    // A gateway's error page that echoes the key where the message is cut short.
    let page = format!("{}{KEY} and more text after the key", "x".repeat(290));
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(ResponseTemplate::new(500).set_body_string(page))
        .mount(&server)
        .await;
    let sb = Sandbox::new();
    sb.write("s.yaml", "suite: k\nenvironment: kv\nscorers: [{includes: x}]\ntasks:\n  - {id: t, input: hi}\n");
    sb.write("runner.yaml", "providers:\n  openai: {max_retries: 0, timeout_s: 30}\n");
    let mut cmd = sb.command();
    cmd.args(["eval", "s.yaml", "--model", "openai/gpt-test", "--run-id", "test", "--out", "results"])
        .env("OPENAI_BASE_URL", format!("{}/v1", server.uri()))
        .env("OPENAI_API_KEY", KEY);
    let run = tokio::task::spawn_blocking(move || Run::from(cmd.output().unwrap())).await.unwrap();
    assert_eq!(run.code, 3, "the episode is unscored: {run:?}");
    let log = std::fs::read_to_string(sb.path().join("results/test/events.jsonl")).unwrap();
    assert!(log.contains("xxxx[REDACTED]"), "the error is logged with the key cut out: {log}");
    let part = &KEY[..12];
    assert!(!log.contains(part) && !run.stderr.contains(part), "a part of the key was kept: {run:?}");
}
