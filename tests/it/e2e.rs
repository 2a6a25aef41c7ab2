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
    let output = sb
        .command()
        .args([
            "eval",
            "s.yaml",
            "--model",
            "openai-compatible/gemma",
            "--run-id",
            "test",
            "--out",
            "results",
            "-j",
            "1",
        ])
        .env("OPENAI_COMPATIBLE_BASE_URL", &url)
        .output()
        .unwrap();
    let run = crate::Run::from(output);
    eprintln!("{run:?}");
    // The model is tiny: its answers may be wrong, but the run must finish and judge them.
    assert!([0, 1].contains(&run.code), "{run:?}");
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
