//! The `external` agent kind: a program as the policy, over the external agent protocol.
//! The reference clients under `examples/agents/`, and a test agent
//! (`tests/fixtures/external/agent.py`) that breaks the protocol in each way it can.

use std::collections::HashSet;
use std::path::Path;

use serde_json::Value;

use crate::{Sandbox, have_python, of_type};

const TEST_AGENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/external/agent.py");

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn have_node() -> bool {
    let found = Path::new("/usr/bin/node").is_file() || Path::new("/usr/local/bin/node").is_file();
    if !found {
        eprintln!("skipped: no node on /usr/local/bin:/usr/bin");
    }
    found
}

/// A suite whose agent is the test agent in `mode` (with `extra` arguments), on the shell.
fn suite(mode: &str, extra: &str, limits: &str) -> String {
    format!(
        "suite: s\nenvironment: shell\nagent: {{kind: external, command: [python3, {TEST_AGENT}, {mode}{extra}]}}\n\
         limits: {limits}\nscorers: [{{includes: done}}]\ntasks:\n  - {{id: a, input: hi}}\n"
    )
}

/// Runs the test agent in `mode` on one task; the run's events.
fn run(mode: &str, limits: &str) -> Vec<Value> {
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite(mode, "", limits));
    let run = sb.eval(&["s.yaml"]);
    // 3: an unscored episode fails the run's unscored gate.
    assert!([0, 1, 3].contains(&run.code), "{run:?}");
    sb.events()
}

fn one<'a>(events: &'a [Value], kind: &str) -> &'a Value {
    let found = of_type(events, kind);
    assert_eq!(found.len(), 1, "expected one `{kind}` event, got {found:?}");
    found[0]
}

/// The episode ended as the agent's failure: scored, failed, `agent_error`, with `why` in
/// its `agent_error` event and what it wrote on stderr (`said`) in the log.
fn assert_agents_failure(events: &[Value], why: &str, said: &str) {
    let finished = one(events, "episode_finished");
    assert_eq!(finished["termination"], "agent_error", "{finished}");
    assert_eq!(finished["outcome"]["status"], "scored", "{finished}");
    assert_eq!(finished["outcome"]["passed"], false, "{finished}");
    let error = one(events, "agent_error");
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains(why), "`{why}` not in: {message}");
    assert!(message.contains("s.yaml:3:"), "the suite's line is not named: {message}");
    let program = one(events, "agent_program");
    assert!(program["stderr_tail"].as_str().unwrap_or_default().contains(said), "{program}");
    assert_eq!(program["kept"], false, "{program}");
}

#[test]
fn the_python_reference_client_plays_its_suite() {
    let sb = Sandbox::new();
    let suite = repo().join("tasks/external.yaml");
    let run = sb.eval(&[suite.to_str().unwrap()]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished.len(), 2);
    assert!(
        finished.iter().all(|f| f["outcome"]["passed"] == true && f["termination"] == "final_answer"),
        "{finished:?}"
    );
    // Its `log` and `usage` messages are in the log, and its usage in the episode's.
    assert_eq!(of_type(&events, "agent_log").len(), 4);
    let spent: u64 = of_type(&events, "agent_usage").iter().map(|u| u["usage"]["input_tokens"].as_u64().unwrap()).sum();
    let counted: u64 = finished.iter().map(|f| f["usage"]["input_tokens"].as_u64().unwrap()).sum();
    assert!(spent > 0 && spent == counted, "{spent} reported, {counted} counted");
    // A process per episode, told the episode's tools, exited when its stdin closed.
    for program in of_type(&events, "agent_program") {
        assert_eq!(program["exit"], "exit code 0", "{program}");
        assert!(program["stderr_tail"].as_str().unwrap().contains("tools"), "{program}");
    }
    let pids: HashSet<u64> = of_type(&events, "agent_program").iter().map(|p| p["pid"].as_u64().unwrap()).collect();
    assert_eq!(pids.len(), 2);
}

#[test]
fn the_node_reference_client_plays_its_suite_in_one_process() {
    if !have_node() {
        return;
    }
    let sb = Sandbox::new();
    let suite = repo().join("tasks/external-node.yaml");
    let run = sb.run(&[
        "eval",
        suite.to_str().unwrap(),
        "--model",
        "mock",
        "--run-id",
        "test",
        "--out",
        "results",
        "-j",
        "1",
    ]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    assert!(finished.iter().all(|f| f["outcome"]["passed"] == true), "{finished:?}");
    let programs = of_type(&events, "agent_program");
    assert_eq!(programs.len(), 2);
    assert!(programs.iter().all(|p| p["kept"] == true && p["pid"] == programs[0]["pid"]), "{programs:?}");
}

#[test]
fn a_line_that_is_not_json_is_the_agents_failure() {
    if !have_python() {
        return;
    }
    let events = run("bad_json", "{time_s: 20}");
    assert_agents_failure(&events, "a line on stdout that is not JSON", "");
}

#[test]
fn a_message_of_unknown_type_is_the_agents_failure() {
    if !have_python() {
        return;
    }
    let events = run("unknown", "{time_s: 20}");
    assert_agents_failure(&events, "a message of unknown type `thoughts`", "");
}

#[test]
fn text_on_stdout_is_the_agents_failure() {
    if !have_python() {
        return;
    }
    let events = run("garbage", "{time_s: 20}");
    assert_agents_failure(&events, "not JSON (", "");
    assert!(one(&events, "agent_error")["message"].as_str().unwrap().contains("Loading model..."));
}

#[test]
fn a_line_over_the_cap_is_cut_and_the_agents_failure() {
    if !have_python() {
        return;
    }
    let events = run("huge", "{time_s: 20}");
    assert_agents_failure(&events, "longer than the cap of 1048576 bytes [cut]", "");
}

#[test]
fn silence_past_the_time_limit_is_the_agents_failure_and_the_program_is_killed() {
    if !have_python() {
        return;
    }
    let started = std::time::Instant::now();
    let events = run("silent", "{time_s: 2}");
    assert_agents_failure(
        &events,
        "sent no `actions` for step 1 within the episode's remaining time (",
        "waiting forever",
    );
    assert!(started.elapsed().as_secs() < 15, "took {:?}", started.elapsed());
    let program = one(&events, "agent_program");
    // It ignored its closed stdin: killed, not exited.
    assert!(program["exit"].is_null(), "{program}");
    // Killed: gone, or a zombie its new parent has not reaped yet.
    crate::assert_gone(program["pid"].as_u64().unwrap() as i32);
}

#[test]
fn an_exit_before_end_is_the_agents_failure_with_its_status_and_stderr() {
    if !have_python() {
        return;
    }
    let events = run("exit", "{time_s: 20}");
    assert_agents_failure(&events, "exited (exit code 3) before `end`", "giving up");
    assert_eq!(one(&events, "agent_program")["exit"], "exit code 3");
    let finished = one(&events, "episode_finished");
    assert_eq!(finished["agent_program"]["exit"], "exit code 3", "{finished}");
    assert!(finished["agent_program"]["stderr_tail"].as_str().unwrap_or_default().contains("giving up"), "{finished}");
}

#[test]
fn a_fault_makes_the_episode_unscored_with_its_cause() {
    if !have_python() {
        return;
    }
    let events = run("fault", "{time_s: 20}");
    let finished = one(&events, "episode_finished");
    assert_eq!(finished["outcome"]["status"], "unscored", "{finished}");
    assert_eq!(finished["outcome"]["cause"], "provider_error", "{finished}");
    assert_eq!(finished["outcome"]["message"], "upstream 503 after retries", "{finished}");
    assert!(of_type(&events, "agent_error").is_empty());
}

#[test]
fn a_fault_with_a_cause_runner_does_not_know_is_the_agents_failure() {
    if !have_python() {
        return;
    }
    let events = run("strange", "{time_s: 20}");
    assert_agents_failure(&events, "a cause runner does not know, `bad_mood`: not today", "");
}

#[test]
fn usage_is_counted_in_the_episodes_table() {
    if !have_python() {
        return;
    }
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite("well", "", "{time_s: 20}"));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let mut table = csv::Reader::from_path(sb.path().join("results/test/episodes.csv")).unwrap();
    let headers = table.headers().unwrap().clone();
    let row = table.records().next().unwrap().unwrap();
    let cell = |name: &str| row.get(headers.iter().position(|h| h == name).unwrap()).unwrap().to_owned();
    assert_eq!((cell("input_tokens"), cell("output_tokens"), cell("tokens")), ("7".into(), "5".into(), "12".into()));
    assert_eq!(cell("cost_usd").parse::<f64>().unwrap(), 0.25);
    let events = sb.events();
    assert_eq!(one(&events, "agent_log")["message"], "thinking");
    assert_eq!(one(&events, "agent_usage")["model"], "test/model");
}

#[test]
fn reported_tokens_stop_the_episode_at_its_token_limit() {
    if !have_python() {
        return;
    }
    let events = run("usage", "{time_s: 20, max_tokens: 1500}");
    let finished = one(&events, "episode_finished");
    assert_eq!(finished["termination"], "token_limit", "{finished}");
    assert_eq!(finished["steps"], 2, "{finished}");
    assert_eq!(finished["usage"]["input_tokens"], 2000, "{finished}");
}

#[test]
fn a_negative_cost_is_the_agents_failure_not_a_refund() {
    if !have_python() {
        return;
    }
    let events = run("refund", "{time_s: 20, max_cost_usd: 0.01}");
    assert_agents_failure(&events, "`cost_usd` is -1000, not a number from 0 up", "");
}

#[test]
fn long_log_messages_are_cut_in_the_log() {
    if !have_python() {
        return;
    }
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite("chatty", "", "{time_s: 60}"));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let logs = of_type(&events, "agent_log");
    assert_eq!(logs.len(), 40, "each message is logged");
    for log in logs {
        let message = log["message"].as_str().unwrap_or_default();
        assert!(message.len() <= 4096 && message.contains("of 524288 bytes"), "{} bytes", message.len());
    }
    let written = std::fs::metadata(sb.path().join("results/test/events.jsonl")).unwrap().len();
    assert!(written < 1 << 20, "20 MiB of messages wrote {written} bytes of log");
}

#[test]
fn costs_that_add_past_the_largest_number_stay_a_number_in_the_log_and_tables() {
    if !have_python() {
        return;
    }
    let sb = Sandbox::new();
    sb.write("s.yaml", &suite("fortune", "", "{time_s: 20}"));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let finished = one(&events, "episode_finished");
    assert_eq!(finished["cost_usd"].as_f64(), Some(f64::MAX), "held at the largest number, not null: {finished}");
    let mut table = csv::Reader::from_path(sb.path().join("results/test/episodes.csv")).unwrap();
    let headers = table.headers().unwrap().clone();
    let row = table.records().next().unwrap().unwrap();
    let cost = row.get(headers.iter().position(|h| h == "cost_usd").unwrap()).unwrap();
    assert_eq!(cost.parse::<f64>().ok(), Some(f64::MAX), "{cost:?}");
    assert!(run.stdout.contains("$1.798e308"), "the summary shows the cost: {}", run.stdout);
}

#[test]
fn reused_programs_serve_many_episodes_at_sixteen_jobs() {
    if !have_python() {
        return;
    }
    let sb = Sandbox::new();
    let starts = sb.path().join("starts.txt");
    let mut text = suite("pidfile", &format!(", {}", starts.display()), "{time_s: 60}");
    text = text.replace("]}\n", "], reuse: true}\n").replace("limits:", "epochs: 32\nlimits:");
    sb.write("s.yaml", &text);
    let run = sb.run(&["eval", "s.yaml", "--model", "mock", "--run-id", "test", "--out", "results", "-j", "16"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished.len(), 32);
    assert!(finished.iter().all(|f| f["outcome"]["passed"] == true), "{finished:?}");
    let started: Vec<String> = std::fs::read_to_string(&starts).unwrap().lines().map(str::to_owned).collect();
    assert_eq!(started.len(), 32, "one `start` per episode");
    let processes: HashSet<&String> = started.iter().collect();
    assert!(processes.len() <= 16 && processes.len() < 32, "{} processes for 32 episodes", processes.len());
    let logged: HashSet<u64> = of_type(&events, "agent_program").iter().map(|p| p["pid"].as_u64().unwrap()).collect();
    let written: HashSet<u64> = processes.iter().map(|p| p.parse().unwrap()).collect();
    assert_eq!(logged, written, "the log names the programs' own pids");
}

#[test]
fn a_program_not_on_its_path_fails_the_episode_naming_the_suite_line() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        "suite: s\nenvironment: kv\nagent:\n  kind: external\n  command: [no-such-agent-program, --go]\n\
         scorers: [{includes: x}]\ntasks:\n  - {id: a, input: hi}\n",
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "loaded and run: {run:?}");
    let events = sb.events();
    let finished = one(&events, "episode_finished");
    assert_eq!(finished["termination"], "agent_error", "{finished}");
    assert_eq!(finished["outcome"]["status"], "scored", "{finished}");
    let message = one(&events, "agent_error")["message"].as_str().unwrap().to_owned();
    assert!(message.contains("the external agent `no-such-agent-program --go` (s.yaml:5:13)"), "{message}");
    assert!(message.contains("is not on its PATH (/usr/local/bin:/usr/bin:/bin)"), "{message}");
}

/// An external agent whose decisions come from the run's model, through its gateway.
const MODEL_AGENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/agents/model_agent.py");

fn model_agent_suite(reuse: bool) -> String {
    model_agent_suite_with(&format!("[python3, {MODEL_AGENT}]"), reuse)
}

/// The two-task suite of the model agents, its agent run by `command`.
fn model_agent_suite_with(command: &str, reuse: bool) -> String {
    format!(
        "suite: m\nenvironment: shell\nagent: {{kind: external, command: {command}, reuse: {reuse}}}\n\
         limits: {{max_steps: 6, time_s: 60}}\nscorers:\n  - includes: done\n  - tool_called: write_file\n\
         tasks:\n  - id: a\n    input: Write hello into a.txt, then say done.\n    mock:\n      \
         - tool_calls: [{{name: write_file, arguments: {{path: a.txt, content: hello}}}}]\n      - text: done\n  \
         - id: b\n    input: Write hi into b.txt, then say done.\n    mock:\n      \
         - tool_calls: [{{name: write_file, arguments: {{path: b.txt, content: hi}}}}]\n      - text: done\n"
    )
}

#[test]
fn an_external_agents_model_calls_through_its_gateway_are_the_episodes_and_replay_offline() {
    if !have_python() {
        return;
    }
    let sb = Sandbox::new();
    // Reused processes: each episode's gateway and key reach the program in its `start`.
    sb.write("s.yaml", &model_agent_suite(true));
    let args = ["eval", "s.yaml", "--model", "mock", "-j", "1", "--record", "tape.jsonl", "--run-id", "rec"];
    let record = sb.run(&[&args[..], &["--out", "results"]].concat());
    assert_eq!(record.code, 0, "{record:?}");
    let events = crate::read_jsonl(&sb.path().join("results/rec/events.jsonl"));
    let calls = of_type(&events, "model_call");
    assert_eq!(calls.len(), 4, "two model calls per episode: {calls:?}");
    // A model call is a part of the loop's turn: it takes no step of its own.
    let steps: Vec<u64> = calls.iter().map(|c| c["step"].as_u64().unwrap_or(0)).collect();
    assert_eq!(steps, [1, 2, 1, 2], "{calls:?}");
    let finished = of_type(&events, "episode_finished");
    assert!(finished.iter().all(|f| f["outcome"]["passed"] == true && f["steps"] == 2), "{finished:?}");
    assert!(finished.iter().all(|f| f["usage"]["input_tokens"].as_u64().unwrap_or(0) > 0), "{finished:?}");
    let programs = of_type(&events, "agent_program");
    let pids: HashSet<u64> = programs.iter().filter_map(|p| p["pid"].as_u64()).collect();
    assert_eq!(pids.len(), 1, "one process served both episodes: {programs:?}");

    // Replayed from the tape (no key, no model): the same outcomes.
    let replay = sb.run(&["eval", "s.yaml", "--model", "replay:tape.jsonl", "--run-id", "rep", "--out", "results"]);
    assert_eq!(replay.code, 0, "{replay:?}");
    let replayed = crate::read_jsonl(&sb.path().join("results/rep/events.jsonl"));
    let served = of_type(&replayed, "model_call");
    assert_eq!(served.len(), 4, "{served:?}");
    assert!(served.iter().all(|c| c["cache_hit"] == true), "{served:?}");
    let outcomes = |events: &[Value]| -> Vec<Value> {
        of_type(events, "episode_finished").iter().map(|f| f["outcome"].clone()).collect()
    };
    assert_eq!(outcomes(&events), outcomes(&replayed));
}

/// The TypeScript model agent as Node runs it: with its type stripping (Node 22.6 and later),
/// else compiled into `out` by the `tsc` that `scripts/install-test-servers.sh` installs.
fn typescript_agent(out: &std::path::Path) -> Option<String> {
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/agents/model_agent.ts");
    let strips = std::process::Command::new("node")
        .args(["--experimental-strip-types", "-e", ""])
        .output()
        .is_ok_and(|o| o.status.success());
    if strips {
        return Some(format!("[node, --experimental-strip-types, {source}]"));
    }
    let servers = match std::env::var_os("RUNNER_TEST_SERVERS") {
        Some(dir) => std::path::PathBuf::from(dir),
        None => {
            std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/runner-test-servers")
        }
    };
    let tsc = servers.join("node_modules/.bin/tsc");
    if !tsc.is_file() {
        eprintln!(
            "skipped: this Node strips no types and there is no {} (scripts/install-test-servers.sh)",
            tsc.display()
        );
        return None;
    }
    let types = servers.join("node_modules/@types");
    let compiled = std::process::Command::new(&tsc)
        .args(["--target", "es2022", "--module", "nodenext", "--strict", "--types", "node", "--typeRoots"])
        .arg(&types)
        .arg("--outDir")
        .arg(out)
        .arg(source)
        .output()
        .unwrap();
    assert!(compiled.status.success(), "tsc: {}", String::from_utf8_lossy(&compiled.stdout));
    Some(format!("[node, {}]", out.join("model_agent.js").display()))
}

#[test]
fn the_typescript_model_agent_calls_the_model_and_replays_offline() {
    let sb = Sandbox::new();
    let Some(command) = typescript_agent(&sb.path().join("ts")) else { return };
    sb.write("s.yaml", &model_agent_suite_with(&command, false));
    let args = ["eval", "s.yaml", "--model", "mock", "--record", "tape.jsonl", "--run-id", "rec", "--out", "results"];
    let record = sb.run(&args);
    assert_eq!(record.code, 0, "{record:?}");
    let events = crate::read_jsonl(&sb.path().join("results/rec/events.jsonl"));
    assert_eq!(of_type(&events, "model_call").len(), 4, "two model calls per episode: {events:#?}");
    let finished = of_type(&events, "episode_finished");
    assert!(finished.iter().all(|f| f["outcome"]["passed"] == true), "{finished:?}");
    let replay = sb.run(&["eval", "s.yaml", "--model", "replay:tape.jsonl", "--run-id", "rep", "--out", "results"]);
    assert_eq!(replay.code, 0, "{replay:?}");
    let replayed = crate::read_jsonl(&sb.path().join("results/rep/events.jsonl"));
    let outcomes = |events: &[Value]| -> Vec<Value> {
        of_type(events, "episode_finished").iter().map(|f| f["outcome"].clone()).collect()
    };
    assert_eq!(outcomes(&events), outcomes(&replayed));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_model_failing_behind_an_external_agents_gateway_is_a_provider_error_not_its_failure() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    if !have_python() {
        return;
    }
    let sb = Sandbox::new();
    sb.write("s.yaml", &model_agent_suite(false));
    sb.write(
        "runner.yaml",
        "providers:\n  openai: {retry_base_s: 0.01, retry_max_s: 0.05, max_retries: 1, timeout_s: 5}\n",
    );
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(ResponseTemplate::new(503).set_body_string("upstream down"))
        .mount(&server)
        .await;
    let args = ["eval", "s.yaml", "--model", "openai/local", "--run-id", "test", "--out", "results"];
    let run = crate::models::run_with(&sb, &args, &crate::models::openai_env(&server)).await;
    assert_eq!(run.code, 3, "unscored episodes fail the unscored gate: {run:?}");
    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished.len(), 2, "{finished:?}");
    for f in finished {
        assert_eq!(f["outcome"]["status"], "unscored", "{f}");
        assert_eq!(f["outcome"]["cause"], "provider_error", "{f}");
    }
}
