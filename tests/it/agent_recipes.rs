//! The `cli` recipes of `examples/agents/` — Claude Code, the Codex CLI, mini-swe-agent and
//! an agent on the OpenAI Agents SDK, as installed by `scripts/install-test-servers.sh` —
//! each on its scripted two-step task under `--model mock`: the file written with the
//! agent's own tool, then the answer; the trajectory derived from the gateway's traffic;
//! recorded into a cassette, then replayed offline in another folder with the same outcome.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{Run, Sandbox, of_type, read_jsonl};

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/agents");
/// Where the recipes say the agents are installed.
const PREFIX: &str = "/opt/runner-agents";

fn servers_dir() -> PathBuf {
    match std::env::var_os("RUNNER_TEST_SERVERS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/runner-test-servers"),
    }
}

/// A recipe's suite and environment file in a fresh folder, pointed at the installed agent
/// (and, for the Agents SDK, at the repository's `agent.py`); `None`, saying why, when the
/// agent is not installed.
fn recipe(name: &str, program: &str) -> Option<Sandbox> {
    let servers = servers_dir();
    let installed = servers.join(program);
    if !installed.exists() {
        eprintln!("skipped: {} is not installed (scripts/install-test-servers.sh)", installed.display());
        return None;
    }
    let sb = Sandbox::new();
    let folder = Path::new(EXAMPLES).join(name);
    let place = |text: &str| {
        text.replace(&format!("{PREFIX}/agents-sdk"), &folder.display().to_string())
            .replace(PREFIX, &servers.display().to_string())
    };
    sb.write("suite.yaml", &place(&std::fs::read_to_string(folder.join("suite.yaml")).unwrap()));
    let environments = folder.join("environments");
    for entry in std::fs::read_dir(&environments).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_str().unwrap();
        sb.write(&format!("environments/{file}"), &place(&std::fs::read_to_string(&path).unwrap()));
    }
    Some(sb)
}

fn eval(sb: &Sandbox, model: &str, run_id: &str, extra: &[&str]) -> Run {
    let mut args = vec!["eval", "suite.yaml", "--model", model, "--run-id", run_id, "--out", "results"];
    args.extend_from_slice(extra);
    sb.run(&args)
}

/// What an episode came to, as two runs are compared: outcome, answer, the derived tool
/// calls with their results.
#[derive(Debug, PartialEq)]
struct Outcome {
    outcome: Value,
    answer: Value,
    calls: Vec<(String, Value)>,
}

fn outcome(events: &[Value]) -> Outcome {
    let finished = of_type(events, "episode_finished");
    assert_eq!(finished.len(), 1, "{events:#?}");
    let finals = of_type(events, "final");
    let calls = of_type(events, "action_dispatched")
        .into_iter()
        .filter(|e| e["call"]["name"] != "final_answer")
        .map(|e| {
            let id = &e["call"]["call_id"];
            let observed = of_type(events, "observation")
                .into_iter()
                .find(|o| &o["observation"]["call_id"] == id)
                .map(|o| o["observation"]["error"].clone());
            (
                e["call"]["name"].as_str().unwrap_or_default().to_owned(),
                observed.unwrap_or(Value::String("none".into())),
            )
        })
        .collect();
    Outcome {
        outcome: finished[0]["outcome"].clone(),
        answer: finals.first().map(|f| f["answer"].clone()).unwrap_or(Value::Null),
        calls,
    }
}

/// Runs a recipe under `mock`, recording; checks it passed with `tool`'s call and its
/// observation in the trajectory; then replays the cassette in another folder, offline.
fn passes_and_replays(name: &str, program: &str, tool: &str) {
    let Some(recorded) = recipe(name, program) else { return };
    let run = eval(&recorded, "mock", "rec", &["--record", "cassette.jsonl"]);
    let events = read_jsonl(&recorded.path().join("results/rec/events.jsonl"));
    let first = outcome(&events);
    assert_eq!(run.code, 0, "{name}: {run:?}\n{events:#?}");
    assert_eq!(first.outcome["passed"], true, "{name}: {first:?}");
    assert!(
        first.calls.iter().any(|(called, error)| called == tool && error.is_null()),
        "{name}: the derived trajectory shows its {tool} call and that call's observation: {first:?}"
    );
    assert!(of_type(&events, "gateway_refused").is_empty(), "{name}: {events:#?}");
    // The episode's line says how large its prompts were: its largest call's input tokens.
    let largest = of_type(&events, "model_call").iter().filter_map(|c| c["usage"]["input_tokens"].as_u64()).max();
    let said = format!("input tokens (largest call {})", largest.unwrap_or_default());
    assert!(run.stdout.contains(&said), "{name}: {said} in {}", run.stdout);
    let cassette = std::fs::read_to_string(recorded.path().join("cassette.jsonl")).unwrap();
    assert!(cassette.lines().count() >= 2, "{name}: {cassette}");

    let replayed = recipe(name, program).unwrap();
    replayed.write("cassette.jsonl", &cassette);
    let run = eval(&replayed, "replay:cassette.jsonl", "rep", &[]);
    let events = read_jsonl(&replayed.path().join("results/rep/events.jsonl"));
    assert_eq!(run.code, 0, "{name}: {run:?}\n{events:#?}");
    assert_eq!(outcome(&events), first, "{name}: the replay in another folder has the recorded outcome");
    assert!(of_type(&events, "model_call").iter().all(|c| c["cache_hit"] == true), "{name}: all from the cassette");
}

#[test]
fn claude_code_recipe_passes_and_replays_in_another_folder() {
    passes_and_replays("claude-code", "node_modules/@anthropic-ai/claude-code/bin/claude.exe", "Bash");
}

#[test]
fn codex_recipe_passes_and_replays_in_another_folder() {
    passes_and_replays("codex", "node_modules/.bin/codex", "exec_command");
}

#[test]
fn mini_swe_agent_recipe_passes_and_replays_in_another_folder() {
    passes_and_replays("mini-swe-agent", "agents-venv/bin/mini", "bash");
}

#[test]
fn agents_sdk_recipe_passes_and_replays_in_another_folder() {
    passes_and_replays("agents-sdk", "agents-venv/lib", "write_file");
}
