//! Opt-in: a real llama.cpp server with a small model. Ignored unless asked for:
//! `RUNNER_LLAMA_URL=http://host:port/v1 cargo test --test it e2e_llama -- --ignored`
//! (`scripts/e2e-llama.sh` starts a server and runs it so).

use crate::{Sandbox, of_type};

#[test]
#[ignore = "needs a real model server in RUNNER_LLAMA_URL (see docs/src/contributing.md: Testing against a real model)"]
fn e2e_llama_server_speaks_to_runner() {
    // Asked for by name but given no server: that is a failure, not a pass.
    let Ok(url) = std::env::var("RUNNER_LLAMA_URL") else {
        panic!("set RUNNER_LLAMA_URL to an OpenAI-compatible base URL (scripts/e2e-llama.sh does)");
    };
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        "suite: tiny\nenvironment: kv\nagent: {system: \"Use the calc tool, then answer with the number.\"}\nlimits: {max_steps: 3, time_s: 300}\nscorers: [{includes: \"{{ target }}\"}]\ntasks:\n  - {id: add, input: \"What is 2 + 3?\", target: \"5\"}\n  - {id: mul, input: \"What is 6 times 7?\", target: \"42\"}\n",
    );
    sb.write("runner.yaml", "providers:\n  openai-compatible: {max_concurrency: 1, timeout_s: 240, max_retries: 1, sampling: {temperature: 0, max_tokens: 128}}\n");
    // The model is tiny: its answers may be wrong, but the run must finish and judge them.
    eval_on(&sb, &url, &["-j", "1"]);
    let events = sb.events();
    let calls = of_type(&events, "model_call");
    assert!(!calls.is_empty());
    for call in &calls {
        assert!(call["error"].is_null(), "a call to the real server failed: {call}");
        assert!(call["usage"]["input_tokens"].as_u64().unwrap() > 0, "{call}");
        assert!(call["raw_response"]["choices"].is_array(), "{call}");
        assert_eq!(call["request"]["model"], "gemma");
    }
    for f in of_type(&events, "episode_finished") {
        assert_eq!(f["outcome"]["status"], "scored", "{f}");
    }
}

/// `runner eval s.yaml` on the real model at `url`; the run finishes and judges (exit 0 or 1).
fn eval_on(sb: &Sandbox, url: &str, extra: &[&str]) {
    let output = sb
        .command()
        .args(["eval", "s.yaml", "--model", "openai-compatible/gemma", "--run-id", "test", "--out", "results"])
        .args(extra)
        .env("OPENAI_COMPATIBLE_BASE_URL", url)
        .output()
        .unwrap();
    let run = crate::Run::from(output);
    eprintln!("{run:?}");
    assert!([0, 1].contains(&run.code), "{run:?}");
}

const CLI_AGENT: &str = include_str!("../../examples/agents/urllib_cli_agent.py");

/// A `cli` agent (the standard-library recipe) on the real model, through the gateway: the
/// outcome is scored whatever the tiny model answers, every call is a `model_call` with its
/// tokens, and each tool call it asked for is in the derived trajectory with its result.
#[test]
#[ignore = "needs a real model server in RUNNER_LLAMA_URL (see docs/src/contributing.md: Testing against a real model)"]
fn e2e_llama_runs_a_cli_agent_through_the_gateway() {
    let Ok(url) = std::env::var("RUNNER_LLAMA_URL") else {
        panic!("set RUNNER_LLAMA_URL to an OpenAI-compatible base URL (scripts/e2e-llama.sh does)");
    };
    let sb = Sandbox::new();
    let agent: String = CLI_AGENT.lines().map(|l| format!("        {l}\n")).collect();
    sb.write(
        "s.yaml",
        &format!(
            "suite: tiny-cli\nenvironment: shell\nagent: {{kind: cli, command: [python3, agent.py]}}\n\
             limits: {{max_steps: 4, time_s: 900}}\ntasks:\n  - id: write\n    \
             input: Use the write_file tool to write hello into a.txt, then say done.\n    files:\n      agent.py: |\n{agent}\
             \x20   scorers: [{{file_contains: {{path: a.txt, text: hello}}}}]\n"
        ),
    );
    sb.write("runner.yaml", "providers:\n  openai-compatible: {max_concurrency: 1, timeout_s: 600, max_retries: 0, sampling: {temperature: 0, max_tokens: 128}}\n");
    eval_on(&sb, &url, &[]);
    let events = sb.events();
    let calls = of_type(&events, "model_call");
    assert!(!calls.is_empty(), "{events:#?}");
    for call in &calls {
        assert_eq!(call["status"], "answered", "{call}");
        assert!(call["usage"]["input_tokens"].as_u64().unwrap() > 0, "{call}");
    }
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished[0]["outcome"]["status"], "scored", "{finished:?}");
    let observed: Vec<&serde_json::Value> = of_type(&events, "observation");
    for asked in of_type(&events, "action_dispatched").iter().filter(|a| a["call"]["name"] != "final_answer") {
        let id = &asked["call"]["call_id"];
        let answered = calls.len() > asked["step"].as_u64().unwrap_or(0) as usize;
        if answered {
            assert!(observed.iter().any(|o| &o["observation"]["call_id"] == id), "{id} has its result: {events:#?}");
        }
    }
}
