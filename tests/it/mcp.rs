//! MCP servers as an environment, through the binary, against real servers nobody here
//! wrote — the reference "everything" server (npm) and `mcp-server-time` (PyPI), installed
//! by `scripts/install-test-servers.sh` (which `.ci/run` runs) — and a deliberately faulty
//! one (`tests/fixtures/mcp/faulty_server.py`) for the faults.

use std::path::PathBuf;

use serde_json::Value;

use crate::{Sandbox, of_type, tool_observations};

const FAULTY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/mcp/faulty_server.py");

/// Where the test servers are installed: `$RUNNER_TEST_SERVERS`, else the cache folder.
fn servers_dir() -> PathBuf {
    match std::env::var_os("RUNNER_TEST_SERVERS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/runner-test-servers"),
    }
}

/// The everything server's entry point; fails, saying how to install it, when it is missing.
fn everything_js() -> String {
    let js = servers_dir().join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        js.is_file() && ["/usr/bin/node", "/usr/local/bin/node"].iter().any(|n| std::path::Path::new(n).is_file()),
        "the MCP test servers are not installed: need node in /usr/bin or /usr/local/bin and {} — run \
         scripts/install-test-servers.sh (CI's .ci/run does; set RUNNER_TEST_SERVERS to install elsewhere)",
        js.display()
    );
    js.display().to_string()
}

fn time_server() -> String {
    let bin = servers_dir().join("venv/bin/mcp-server-time");
    assert!(
        bin.is_file(),
        "the MCP test servers are not installed: no {} — run scripts/install-test-servers.sh (CI's .ci/run does)",
        bin.display()
    );
    bin.display().to_string()
}

fn everything_server(name: &str, extra: &str) -> String {
    format!("  - {{name: {name}, command: node, args: [\"{}\", stdio]{extra}}}\n", everything_js())
}

fn faulty_server(name: &str, mode: &str, extra: &str) -> String {
    format!("  - {{name: {name}, command: /usr/bin/python3, args: [\"{FAULTY}\", {mode}]{extra}}}\n")
}

/// The observation of call `c_N` (a turn's observations are logged as the calls end).
fn call(events: &[Value], n: usize) -> &Value {
    let id = format!("c_{n}");
    tool_observations(events).into_iter().find(|o| o["call_id"] == id.as_str()).unwrap_or_else(|| panic!("no {id}"))
}

fn finished(events: &[Value]) -> Vec<&Value> {
    of_type(events, "episode_finished")
}

#[test]
fn runner_tools_lists_the_discovered_tools_with_their_annotations() {
    let sb = Sandbox::new();
    sb.write("environments/ev.yaml", &format!("kind: mcp\nservers:\n{}", everything_server("everything", "")));
    let run = sb.run(&["tools", "ev"]);
    assert_eq!(run.code, 0, "{run:?}");
    let specs: Vec<Value> = serde_json::from_str(&run.stdout).expect("a JSON list of tool specs");
    let names: Vec<&str> = specs.iter().filter_map(|s| s["name"].as_str()).collect();
    // One server: the names are the server's own.
    for expected in ["echo", "get-sum", "get-tiny-image", "get-resource-reference", "final_answer"] {
        assert!(names.contains(&expected), "{expected} missing from {names:?}");
    }
    assert_eq!(names.last(), Some(&"final_answer"));
    let echo = specs.iter().find(|s| s["name"] == "echo").unwrap();
    // The server marks echo readOnlyHint: true, destructiveHint: false.
    assert_eq!(echo["annotations"], serde_json::json!({"read_only": true, "destructive": false}), "{echo}");
    assert_eq!(echo["parameters"]["required"], serde_json::json!(["message"]), "{echo}");
    // Built-in kinds print their specs without starting anything.
    let run = sb.run(&["tools", "kv"]);
    assert_eq!(run.code, 0, "{run:?}");
    let specs: Vec<Value> = serde_json::from_str(&run.stdout).unwrap();
    assert!(specs.iter().any(|s| s["name"] == "kv_get"), "{}", run.stdout);
}

#[test]
fn validate_starts_no_server() {
    let sb = Sandbox::new();
    // A server that would leave a mark if it were started: validate starts nothing.
    let mark = sb.path().join("started");
    sb.write(
        "environments/ev.yaml",
        &format!(
            "kind: mcp\nservers:\n  - {{name: marks, command: python3, args: [-c, \"open('{}', 'w')\"]}}\n",
            mark.display()
        ),
    );
    sb.write("s.yaml", "suite: s\nenvironment: ev\nscorers: [{includes: x}]\ntasks:\n  - {id: a, input: hi}\n");
    let run = sb.run(&["validate", "s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(!mark.exists(), "validate started the server");
    // What it can see without starting one, it checks: a program that is not there.
    sb.write("environments/ev.yaml", "kind: mcp\nservers:\n  - {name: gone, command: /nonexistent/server}\n");
    let run = sb.run(&["validate", "s.yaml"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(
        run.stderr.contains("environments/ev.yaml:3:") && run.stderr.contains("`/nonexistent/server` does not exist"),
        "{run:?}"
    );
    assert!(!mark.exists(), "validate started the server");
}

#[test]
fn text_image_and_resource_content_become_the_tool_result() {
    let sb = Sandbox::new();
    sb.write("environments/ev.yaml", &format!("kind: mcp\nservers:\n{}", everything_server("everything", "")));
    sb.write(
        "s.yaml",
        r#"suite: s
environment: ev
scorers: [{equals: done}]
tasks:
  - id: a
    input: go
    mock:
      - tool_calls:
          - {name: echo, arguments: {message: hi there}}
          - {name: get-tiny-image, arguments: {}}
          - {name: get-resource-reference, arguments: {resourceType: Text, resourceId: 2}}
      - tool_calls: [{name: final_answer, arguments: {answer: done}}]
"#,
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let obs = [call(&events, 1), call(&events, 2), call(&events, 3)];
    let text = &obs[0]["tool_result"]["content"][0];
    assert_eq!(text["type"], "text", "{}", obs[0]);
    assert_eq!(text["text"], "Echo: hi there", "{}", obs[0]);
    let blocks = obs[1]["tool_result"]["content"].as_array().expect("content blocks");
    let image = blocks.iter().find(|b| b["type"] == "image").unwrap_or_else(|| panic!("no image in {}", obs[1]));
    assert_eq!(image["mimeType"], "image/png", "{image}");
    assert!(image["data"].as_str().is_some_and(|d| !d.is_empty()), "{image}");
    let blocks = obs[2]["tool_result"]["content"].as_array().expect("content blocks");
    let resource =
        blocks.iter().find(|b| b["type"] == "resource").unwrap_or_else(|| panic!("no resource in {}", obs[2]));
    assert!(resource["resource"]["uri"].as_str().is_some_and(|u| u.ends_with('2')), "{resource}");
    let first = &of_type(&events, "observation")[0]["observation"]["info"];
    assert_eq!(first["mcp_servers"], serde_json::json!(["everything"]), "{first}");
    assert_eq!(finished(&events)[0]["outcome"]["passed"], true);
}

#[test]
fn several_servers_prefix_their_tools_and_is_error_is_an_execution_error() {
    let sb = Sandbox::new();
    let time = time_server();
    sb.write(
        "environments/both.yaml",
        &format!("kind: mcp\nservers:\n{}  - {{name: time, command: \"{time}\"}}\n", everything_server("ev", "")),
    );
    sb.write(
        "s.yaml",
        r#"suite: s
environment: both
scorers: [{equals: done}, {tool_called: time__get_current_time}]
tasks:
  - id: a
    input: go
    mock:
      - tool_calls:
          - {name: ev__get-sum, arguments: {a: 2, b: 40}}
          - {name: time__get_current_time, arguments: {timezone: Europe/Paris}}
          - {name: time__get_current_time, arguments: {timezone: Not/AZone}}
          - {name: echo, arguments: {message: unprefixed}}
      - tool_calls: [{name: final_answer, arguments: {answer: done}}]
"#,
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let obs = [call(&events, 1), call(&events, 2), call(&events, 3), call(&events, 4)];
    let sum = obs[0]["tool_result"]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(sum.contains("42"), "{}", obs[0]);
    let now = obs[1]["tool_result"]["content"][0]["text"].as_str().unwrap_or_default();
    assert!(now.contains("Europe/Paris"), "{}", obs[1]);
    // The server answered isError: true for a timezone that does not exist.
    assert_eq!(obs[2]["error"]["type"], "ExecutionError", "{}", obs[2]);
    assert!(obs[2]["error"]["message"].as_str().unwrap_or_default().contains("Not/AZone"), "{}", obs[2]);
    // With two servers the bare name is not a tool.
    assert_eq!(obs[3]["error"]["type"], "ToolNotFound", "{}", obs[3]);
    assert_eq!(finished(&events)[0]["outcome"]["passed"], true, "{run:?}");
}

#[test]
fn a_hung_call_times_out_and_the_server_still_answers() {
    let sb = Sandbox::new();
    sb.write(
        "environments/f.yaml",
        &format!("kind: mcp\nlimits: {{tool_timeout_s: 1}}\nservers:\n{}", faulty_server("f", "serve", "")),
    );
    sb.write(
        "s.yaml",
        r#"suite: s
environment: f
scorers: [{equals: done}]
tasks:
  - id: a
    input: go
    mock:
      - tool_calls: [{name: hang, arguments: {}}]
      - tool_calls: [{name: ok, arguments: {}}]
      - tool_calls: [{name: final_answer, arguments: {answer: done}}]
"#,
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let obs = tool_observations(&events);
    assert_eq!(obs[0]["error"]["type"], "TimeoutError", "{}", obs[0]);
    assert_eq!(obs[1]["tool_result"]["content"][0]["text"], "ok", "{}", obs[1]);
    assert_eq!(finished(&events)[0]["outcome"]["status"], "scored");
}

#[test]
fn a_server_that_exits_mid_episode_ends_it_unscored_with_what_it_said() {
    let sb = Sandbox::new();
    sb.write("environments/f.yaml", &format!("kind: mcp\nservers:\n{}", faulty_server("f", "serve", "")));
    sb.write(
        "s.yaml",
        r#"suite: s
environment: f
scorers: [{equals: done}]
tasks:
  - id: a
    input: go
    mock:
      - tool_calls: [{name: crash, arguments: {}}]
      - tool_calls: [{name: final_answer, arguments: {answer: done}}]
"#,
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 3, "an unscored episode fails the default --max-unscored 0: {run:?}");
    let events = sb.events();
    let obs = tool_observations(&events);
    assert_eq!(obs[0]["error"]["type"], "ExecutionError", "{}", obs[0]);
    let message = obs[0]["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("crashing on purpose") && message.contains("exit code 3"), "{message}");
    let end = finished(&events)[0];
    assert_eq!(end["outcome"]["status"], "unscored", "{end}");
    assert_eq!(end["outcome"]["cause"], "environment_error", "{end}");
    assert_eq!(end["termination"], "environment_error", "{end}");
}

#[test]
fn a_server_that_never_initialises_makes_the_episode_unscored_with_its_stderr() {
    let sb = Sandbox::new();
    sb.write(
        "environments/f.yaml",
        &format!("kind: mcp\nservers:\n{}", faulty_server("f", "never-init", ", start_timeout_s: 1")),
    );
    sb.write("s.yaml", "suite: s\nenvironment: f\nscorers: [{includes: x}]\ntasks:\n  - {id: a, input: hi}\n");
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 3, "{run:?}");
    assert!(run.stderr.contains("could not be discovered"), "the run says so at its start: {run:?}");
    let events = sb.events();
    let end = finished(&events)[0];
    assert_eq!(end["outcome"]["cause"], "environment_error", "{end}");
    let message = end["outcome"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("did not initialise within 1s"), "{message}");
    assert!(message.contains("refusing to initialise"), "the server's stderr tail: {message}");
    // `runner tools` says the same, as an error.
    let tools = sb.run(&["tools", "f"]);
    assert_eq!(tools.code, 2, "{tools:?}");
    assert!(tools.stderr.contains("refusing to initialise"), "{tools:?}");
}

#[test]
fn a_run_scoped_server_is_shared_by_the_runs_episodes_and_an_episode_one_is_not() {
    // toggle-simulated-logging keeps its state per session: shared, the second call of the
    // run stops what the first started; each episode with its own server starts it anew.
    let sb = Sandbox::new();
    for (name, scope) in [("shared", "run"), ("own", "episode")] {
        sb.write(
            &format!("environments/{name}.yaml"),
            &format!("kind: mcp\nservers:\n{}", everything_server("everything", &format!(", scope: {scope}"))),
        );
        sb.write(
            &format!("{name}.yaml"),
            &format!(
                r#"suite: {name}
environment: {name}
scorers: [{{equals: done}}]
tasks:
  - id: a
    input: go
    mock:
      - tool_calls: [{{name: toggle-simulated-logging, arguments: {{}}}}]
      - tool_calls: [{{name: final_answer, arguments: {{answer: done}}}}]
  - id: b
    input: go
    mock:
      - tool_calls: [{{name: toggle-simulated-logging, arguments: {{}}}}]
      - tool_calls: [{{name: final_answer, arguments: {{answer: done}}}}]
"#
            ),
        );
    }
    // One episode at a time, so that the second toggles what the first left.
    let texts = |suite: &str| {
        let out = format!("out-{suite}");
        let run = sb.run(&["eval", suite, "--model", "mock", "-j", "1", "--run-id", "test", "--out", &out]);
        assert_eq!(run.code, 0, "{run:?}");
        let events = crate::read_jsonl(&sb.path().join(out).join("test/events.jsonl"));
        let mut texts: Vec<String> = tool_observations(&events)
            .iter()
            .filter_map(|o| o["tool_result"]["content"][0]["text"].as_str().map(str::to_owned))
            .collect();
        texts.sort();
        texts
    };
    let shared = texts("shared.yaml");
    // One server, one session: the first episode started the logging, the second stopped it.
    assert!(shared[0].starts_with("Started") && shared[1].starts_with("Stopped"), "{shared:?}");
    let own = texts("own.yaml");
    assert!(own.iter().all(|t| t.starts_with("Started")), "each episode its own server: {own:?}");
}

#[test]
fn a_server_sees_only_the_variables_listed_for_it() {
    let sb = Sandbox::new();
    sb.write(
        "environments/ev.yaml",
        &format!(
            "kind: mcp\nservers:\n{}",
            everything_server("everything", ", env: {GREETING: hello, FROM_RUNNER: \"${RUNNER_TEST_PASSED}\"}")
        ),
    );
    sb.write(
        "s.yaml",
        r#"suite: s
environment: ev
scorers: [{equals: done}]
tasks:
  - id: a
    input: go
    mock:
      - tool_calls: [{name: get-env, arguments: {}}]
      - tool_calls: [{name: final_answer, arguments: {answer: done}}]
"#,
    );
    let output = sb
        .command()
        .args(["eval", "s.yaml", "--model", "mock", "--run-id", "test", "--out", "results"])
        .env("RUNNER_TEST_SECRET", "must-not-leak")
        .env("RUNNER_TEST_PASSED", "passed-on")
        .output()
        .expect("run runner");
    let run = crate::Run::from(output);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let obs = tool_observations(&events);
    let text = obs[0]["tool_result"]["content"][0]["text"].as_str().unwrap_or_default();
    let env: serde_json::Map<String, Value> = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let mut names: Vec<&str> = env.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(names, ["FROM_RUNNER", "GREETING", "PATH"], "{text}");
    assert_eq!(env["FROM_RUNNER"], "passed-on");
    assert_eq!(env["PATH"], "/usr/local/bin:/usr/bin:/bin");
}

#[test]
fn an_optional_environment_that_is_not_installed_skips_its_suite() {
    let sb = Sandbox::new();
    sb.write(
        "environments/gone.yaml",
        "kind: mcp\noptional: true\nservers:\n  - {name: g, command: /nonexistent/node}\n",
    );
    sb.write("s.yaml", "suite: s\nenvironment: gone\nscorers: [{includes: x}]\ntasks:\n  - {id: a, input: hi}\n");
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stderr.contains("skipped suite `s`") && run.stderr.contains("/nonexistent/node"), "{run:?}");
    assert!(run.stderr.contains("nothing to run"), "{run:?}");
}

#[test]
fn a_scorer_naming_a_tool_the_servers_do_not_offer_is_refused_at_the_runs_start() {
    let sb = Sandbox::new();
    sb.write("environments/ev.yaml", &format!("kind: mcp\nservers:\n{}", everything_server("everything", "")));
    sb.write("s.yaml", "suite: s\nenvironment: ev\nscorers: [{tool_called: ech0}]\ntasks:\n  - {id: a, input: hi}\n");
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("names tool `ech0`") && run.stderr.contains("echo"), "{run:?}");
    // A `tools:` list that names a tool no server offers.
    sb.write(
        "environments/ev.yaml",
        &format!("kind: mcp\ntools: [echo, nope]\nservers:\n{}", everything_server("everything", "")),
    );
    let run = sb.run(&["tools", "ev"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("`tools:` lists `nope`, which no server offers"), "{run:?}");
}

#[test]
fn the_example_suite_passes_offline() {
    everything_js();
    let root = env!("CARGO_MANIFEST_DIR");
    let sb = Sandbox::new();
    let suite = format!("{root}/tasks/mcp.yaml");
    let run = sb.eval(&[&suite]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let ends = finished(&events);
    assert_eq!(ends.len(), 3);
    assert!(ends.iter().all(|e| e["outcome"]["passed"] == true), "{run:?}");
    let obs = tool_observations(&events);
    assert!(obs.iter().any(|o| o["error"]["type"] == "ValidationError"), "the bad call is refused before the server");
}

/// The everything server over streamable HTTP, on a free port, killed when dropped.
struct HttpServer {
    child: std::process::Child,
    url: String,
}

impl HttpServer {
    fn start() -> HttpServer {
        let js = everything_js();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = std::process::Command::new("node")
            .args([js.as_str(), "streamableHttp"])
            .env("PORT", port.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start node");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "the HTTP server did not listen on {port}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        HttpServer { child, url: format!("http://127.0.0.1:{port}/mcp") }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_server_over_streamable_http_is_called_like_a_stdio_one() {
    let server = HttpServer::start();
    let sb = Sandbox::new();
    sb.write(
        "environments/remote.yaml",
        &format!("kind: mcp\nservers:\n  - {{name: remote, url: \"{}\", headers: {{X-Test: yes}}}}\n", server.url),
    );
    sb.write(
        "s.yaml",
        r#"suite: s
environment: remote
scorers: [{equals: done}, {tool_called: echo}]
tasks:
  - id: a
    input: go
    mock:
      - tool_calls: [{name: echo, arguments: {message: over http}}]
      - tool_calls: [{name: final_answer, arguments: {answer: done}}]
"#,
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    assert_eq!(call(&events, 1)["tool_result"]["content"][0]["text"], "Echo: over http", "{run:?}");
}

#[test]
fn a_servers_prompt_is_added_to_the_system_prompt() {
    let sb = Sandbox::new();
    sb.write(
        "environments/ev.yaml",
        &format!(
            "kind: mcp\nprompts: [{{server: everything, name: simple-prompt}}]\nservers:\n{}",
            everything_server("everything", "")
        ),
    );
    let run = sb.run(&["tools", "ev"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stderr.contains("This is a simple prompt without arguments."), "{run:?}");
    sb.write(
        "s.yaml",
        r#"suite: s
environment: ev
agent: {system: "Suite's own words."}
scorers: [{equals: done}]
tasks:
  - id: a
    input: go
    mock:
      - tool_calls: [{name: final_answer, arguments: {answer: done}}]
"#,
    );
    let run = sb.run(&["eval", "s.yaml", "--model", "mock", "--out", "results", "--record", "c.jsonl"]);
    assert_eq!(run.code, 0, "{run:?}");
    // The request the model was sent (as recorded) holds both, the suite's first.
    let recorded = crate::read_jsonl(&sb.path().join("c.jsonl"));
    let system = &recorded[0]["request"]["messages"][0];
    assert_eq!(system["role"], "system", "{system}");
    assert_eq!(system["content"], "Suite's own words.\n\nThis is a simple prompt without arguments.", "{system}");
}

/// `runner tools f` over servers of the faulty server's `names` mode, each `(server, names)`;
/// `tools` is the file's `tools:` line, if any.
fn tools_named(servers: &[(&str, &str)], tools: &str) -> crate::Run {
    let sb = Sandbox::new();
    let list: String =
        servers.iter().map(|(name, names)| faulty_server(name, &format!("names, {names}"), "")).collect();
    sb.write("environments/f.yaml", &format!("kind: mcp\n{tools}servers:\n{list}"));
    sb.run(&["tools", "f"])
}

#[test]
fn a_tool_named_like_one_of_the_agents_own_actions_is_refused_naming_the_server() {
    for action in
        ["memory", "delegate_task", "ask_user", "clarify", "enter_plan_mode", "exit_plan_mode", "final_answer"]
    {
        let run = tools_named(&[("notes", &format!("ok, {action}"))], "");
        assert_eq!(run.code, 2, "{run:?}");
        assert!(run.stderr.contains(&format!("server `notes` offers a tool named `{action}`")), "{run:?}");
        assert!(run.stderr.contains("the agent's own actions"), "{run:?}");
    }
    // Left out by `tools:`, it is never shown and shadows nothing.
    let run = tools_named(&[("notes", "ok, memory")], "tools: [ok]\n");
    assert_eq!(run.code, 0, "{run:?}");
    // With several servers, its name is the server's: `notes__memory` shadows nothing.
    let run = tools_named(&[("notes", "memory"), ("other", "ok")], "");
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("\"notes__memory\""), "{run:?}");
}

#[test]
fn tool_names_a_provider_would_refuse_are_refused_when_discovered() {
    let run = tools_named(&[("notes", "ok, \"read note\"")], "");
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("server `notes` offers a tool named `read note`, which providers refuse"), "{run:?}");
    let run = tools_named(&[("notes", "ok, \"@300\"")], "");
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("which providers refuse") && run.stderr.contains("1 to 64"), "{run:?}");
    assert!(!run.stderr.contains(&"x".repeat(100)), "the message shows the start of the name: {run:?}");
    // 64 is the limit, the server's prefix included.
    assert_eq!(tools_named(&[("notes", "\"@64\"")], "").code, 0);
    let run = tools_named(&[("notes", "\"@60\""), ("b", "ok")], "");
    assert!(run.code == 2 && run.stderr.contains("`notes__` included"), "{run:?}");
    let run = tools_named(&[("notes", "ok, ok")], "");
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("server `notes` offers two tools named `ok`"), "{run:?}");
}

#[test]
fn a_server_name_that_would_join_into_anothers_tool_names_is_refused() {
    // `s_`'s `x` and `s`'s `_x` would both be `s___x`.
    let sb = Sandbox::new();
    sb.write(
        "environments/f.yaml",
        &format!("kind: mcp\nservers:\n{}{}", faulty_server("s", "names, _x", ""), faulty_server("s_", "names, x", "")),
    );
    sb.write("s.yaml", "suite: s\nenvironment: f\nscorers: [{equals: done}]\ntasks: [{id: a, input: hi}]\n");
    let run = sb.run(&["validate", "s.yaml"]);
    assert_eq!(run.code, 2, "{run:?}");
    assert!(run.stderr.contains("environments/f.yaml:4:") && run.stderr.contains("`s_`"), "{run:?}");
}

#[test]
fn relative_paths_are_the_environment_files_when_the_suite_is_given_by_a_relative_path() {
    let sb = Sandbox::new();
    let script = std::fs::read_to_string(FAULTY).expect("read the faulty server");
    sb.write("suites/environments/servers/faulty.py", &script);
    sb.write(
        "suites/environments/f.yaml",
        "kind: mcp\nservers:\n  - {name: f, command: /usr/bin/python3, args: [./servers/faulty.py, serve], cwd: servers}\n",
    );
    sb.write(
        "suites/s.yaml",
        "suite: s\nenvironment: f\nscorers: [{equals: ok}]\ntasks:\n  - id: a\n    input: hi\n    mock:\n      \
         - tool_calls: [{name: ok, arguments: {}}]\n      - text: ok\n",
    );
    let validate = sb.run(&["validate", "suites/s.yaml"]);
    assert_eq!(validate.code, 0, "{validate:?}");
    let run = sb.eval(&["suites/s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let result = &call(&events, 1)["tool_result"];
    assert_eq!(result["content"][0]["text"], "ok", "the server ran and answered: {result}");
    // The same from another folder, the suite named by a path that climbs out of it.
    std::fs::create_dir_all(sb.path().join("elsewhere")).expect("mkdir");
    let output = sb
        .command()
        .current_dir(sb.path().join("elsewhere"))
        .args(["eval", "../suites/s.yaml", "--model", "mock", "--run-id", "again", "--out", "../results"])
        .output()
        .expect("run runner");
    let run = crate::Run::from(output);
    assert_eq!(run.code, 0, "{run:?}");
    // A bare script name is the server's `cwd`'s, and a missing one is refused by `validate`.
    sb.write(
        "suites/environments/f.yaml",
        "kind: mcp\nservers:\n  - {name: f, command: /usr/bin/python3, args: [faulty.py, serve], cwd: servers}\n",
    );
    assert_eq!(sb.run(&["validate", "suites/s.yaml"]).code, 0);
    sb.write(
        "suites/environments/f.yaml",
        "kind: mcp\nservers:\n  - {name: f, command: python3, args: [faulty.py, serve]}\n",
    );
    let run = sb.run(&["validate", "suites/s.yaml"]);
    assert!(
        run.code == 2 && run.stderr.contains("servers[0].args[0]") && run.stderr.contains("faulty.py` does not exist"),
        "{run:?}"
    );
}

#[test]
fn an_optional_environment_whose_program_is_missing_is_still_valid() {
    // Its suites are skipped when they run, not refused.
    let sb = Sandbox::new();
    sb.write(
        "environments/f.yaml",
        "kind: mcp\noptional: true\nservers:\n  - {name: f, command: no-such-mcp-server}\n",
    );
    sb.write("s.yaml", "suite: s\nenvironment: f\nscorers: [{equals: ok}]\ntasks: [{id: a, input: hi}]\n");
    let run = sb.run(&["validate", "s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
}

/// Regression: after a failed discovery every episode started the servers again and waited
/// `start_timeout_s` for each, only to fail as discovery had.
#[test]
fn after_a_failed_discovery_no_episode_starts_the_servers_again() {
    let sb = Sandbox::new();
    sb.write(
        "environments/f.yaml",
        &format!("kind: mcp\nservers:\n{}", faulty_server("f", "never-init", ", start_timeout_s: 5")),
    );
    sb.write(
        "s.yaml",
        "suite: s\nenvironment: f\nscorers: [{includes: x}]\ntasks:\n  - {id: a, input: hi}\n  - {id: b, input: hi}\n  - {id: c, input: hi}\n",
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 3, "{run:?}");
    let events = sb.events();
    let ends = finished(&events);
    assert_eq!(ends.len(), 3);
    for end in ends {
        assert_eq!(end["outcome"]["cause"], "environment_error", "{end}");
        let message = end["outcome"]["message"].as_str().unwrap_or_default();
        assert!(message.contains("not started again") && message.contains("refusing to initialise"), "{message}");
        // Starting the server again would have waited its 5 s start timeout.
        assert!(end["wall_ms"].as_f64().unwrap() < 5000.0, "{end}");
    }
}

/// A Python whose real interpreter lies under the home folder (pyenv, conda, uv), as the
/// sandbox hides it: `None` where every `python3` on the PATH is the system's.
fn python_under_home() -> Option<PathBuf> {
    let home = PathBuf::from(std::env::var_os("HOME")?).canonicalize().ok()?;
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys, os; print(os.path.realpath(sys.executable))"])
        .output()
        .ok()?;
    let real = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    real.starts_with(&home).then_some(real)
}

/// Regression: a server installed in a virtual environment made from a Python under the
/// home folder failed with a bare "Permission denied": its entry script's interpreter is a
/// link into the home folder, which the sandbox hides.
#[test]
fn a_server_in_a_venv_of_a_python_under_the_home_folder_starts_in_the_sandbox() {
    let Some(python) = python_under_home() else {
        eprintln!("skipped: no python3 under the home folder on this machine");
        return;
    };
    let sb = Sandbox::new();
    let venv = sb.path().join("venv");
    let made = std::process::Command::new(&python).args(["-m", "venv", "--without-pip"]).arg(&venv).status().unwrap();
    assert!(made.success(), "the venv was made");
    // An entry script as pip writes one: its shebang names the venv's interpreter, a link.
    let script = venv.join("bin/faulty-server");
    let body = std::fs::read_to_string(FAULTY).unwrap();
    std::fs::write(&script, format!("#!{}\n{body}", venv.join("bin/python3").display())).unwrap();
    std::process::Command::new("chmod").arg("+x").arg(&script).status().unwrap();
    sb.write(
        "environments/f.yaml",
        &format!("kind: mcp\nservers:\n  - {{name: f, command: {}, args: [serve]}}\n", script.display()),
    );
    sb.write(
        "s.yaml",
        "suite: s\nenvironment: f\nscorers: [{includes: ok}]\ntasks:\n  - id: a\n    input: hi\n    mock:\n      - tool_calls: [{name: ok, arguments: {}}]\n      - text: ok\n",
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    assert_eq!(tool_observations(&events)[0]["tool_result"]["content"][0]["text"], "ok", "{events:?}");
}
