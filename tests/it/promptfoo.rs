//! promptfoo configs read as they are: every supported assertion type on `echo` gives the
//! verdict promptfoo's documented semantics give (worked out by hand in the fixture), prompts
//! are variants that `compare` pairs, and what runner does not do is refused at its line or,
//! with `--skip-unsupported`, left out and listed.

use crate::{Sandbox, have_python, of_type, read_jsonl};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/promptfoo");

/// The promptfoo fixtures in a fresh folder.
pub(crate) fn sandbox() -> Sandbox {
    let sb = Sandbox::new();
    for entry in std::fs::read_dir(FIXTURES).expect("the promptfoo fixtures") {
        let path = entry.expect("an entry").path();
        let name = path.file_name().expect("a name").to_string_lossy().into_owned();
        sb.write(&name, &std::fs::read_to_string(&path).expect("a fixture"));
    }
    sb
}

/// Each test's `expect:` var, in order.
fn expected(config: &str) -> Vec<bool> {
    config.lines().filter_map(|l| l.split("expect: ").nth(1)).map(|rest| rest.starts_with("pass")).collect()
}

#[test]
fn every_assertion_type_on_echo_gives_promptfoos_verdict() {
    let sb = sandbox();
    let run = sb.run(&["eval", "every_type.yaml", "--run-id", "all", "--out", "results", "-q"]);
    assert_eq!(run.code, 0, "{run:?}");
    let config = std::fs::read_to_string(sb.path().join("every_type.yaml")).expect("config");
    let expected = expected(&config);
    assert_eq!(expected.len(), 39);
    let events = read_jsonl(&sb.path().join("results/all/events.jsonl"));
    assert!(of_type(&events, "episode_started").iter().all(|e| e["model"] == "echo"), "the provider is the model");
    check_verdicts(&events, &expected);
}

#[test]
fn python_and_javascript_assertions_give_promptfoos_verdict() {
    let node =
        std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("node").is_file()));
    if !node {
        eprintln!("skipped: no node on PATH");
        return;
    }
    if !have_python() {
        return;
    }
    let sb = sandbox();
    let run = sb.run(&["eval", "code_types.yaml", "--run-id", "code", "--out", "results", "-q"]);
    assert_eq!(run.code, 0, "{run:?}");
    let config = std::fs::read_to_string(sb.path().join("code_types.yaml")).expect("config");
    let expected = expected(&config);
    assert_eq!(expected.len(), 18);
    let events = read_jsonl(&sb.path().join("results/code/events.jsonl"));
    check_verdicts(&events, &expected);
}

#[test]
fn scenarios_run_each_config_entry_with_each_test() {
    let sb = sandbox();
    let run = sb.run(&["eval", "scenarios.yaml", "--run-id", "sc", "--out", "results", "-q"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = read_jsonl(&sb.path().join("results/sc/events.jsonl"));
    // test-1: "Hey, Di" (the config's own test); Bonjour × Ana, Bonjour × Bo ("Ciao, Bo":
    // the test's var over the entry's), Hallo × Ana (the entry's `starts-with` too),
    // Hallo × Bo ("Ciao, Bo" does not start with Hallo); a scenario's test with no vars of its own: "Hi, Cy".
    check_verdicts(&events, &[true, true, true, true, false, true]);
}

/// The grader: an OpenAI-compatible server that answers by the marker in the output it is
/// shown, reasoning first and its letter on the last line, as the prompts ask.
async fn grader_server() -> wiremock::MockServer {
    use wiremock::matchers::{body_string_contains, method};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    let markers = [("GOOD", "Y"), ("BAD", "N"), ("CAT-A", "(A)"), ("CAT-B", "(B)"), ("CAT-C", "C")];
    for (marker, letter) in markers.into_iter().chain([("CAT-D", "(D)"), ("CAT-E", "E")]) {
        let reply = serde_json::json!({
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": format!("Step by step: it fits.\n{letter}")}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 8},
        });
        Mock::given(method("POST"))
            .and(body_string_contains(marker))
            .respond_with(ResponseTemplate::new(200).set_body_json(reply))
            .mount(&server)
            .await;
    }
    server
}

#[tokio::test(flavor = "multi_thread")]
async fn closedqa_and_factuality_give_promptfoos_verdict_on_the_graders_answer() {
    let server = grader_server().await;
    let sb = sandbox();
    sb.write("local.yaml", &format!("providers:\n  local: {{api: openai, base_url: \"{}/v1\"}}\n", server.uri()));
    let mut cmd = sb.command();
    cmd.args(["eval", "graded.yaml", "--config", "local.yaml", "--grader", "local/grader"])
        .args(["--run-id", "graded", "--out", "results", "-q"])
        .env_remove("RUNNER_CONFIG");
    let run =
        tokio::task::spawn_blocking(move || crate::Run::from(cmd.output().expect("runner"))).await.expect("the run");
    assert_eq!(run.code, 0, "{run:?}");
    let config = std::fs::read_to_string(sb.path().join("graded.yaml")).expect("config");
    let expected = expected(&config);
    assert_eq!(expected.len(), 7);
    let events = read_jsonl(&sb.path().join("results/graded/events.jsonl"));
    check_verdicts(&events, &expected);
    let scores = of_type(&events, "score");
    let d = scores.iter().find(|s| s["explanation"].as_str().is_some_and(|e| e.starts_with("(D)")));
    assert!(
        d.is_some_and(|s| s["explanation"] == "(D) disagrees with the expert answer: Step by step: it fits."),
        "{scores:?}"
    );
}

/// Each test's episode passed or failed as `expected` says, in the order of the tests.
fn check_verdicts(events: &[serde_json::Value], expected: &[bool]) {
    let mut outcomes = vec![None; expected.len()];
    let ids: std::collections::HashMap<&str, usize> = of_type(events, "episode_started")
        .iter()
        .filter_map(|e| {
            let n: usize = e["task_id"].as_str()?.strip_prefix("test-")?.parse().ok()?;
            Some((e["episode_id"].as_str()?, n - 1))
        })
        .collect();
    for finished in of_type(events, "episode_finished") {
        let index = ids[finished["episode_id"].as_str().unwrap_or_default()];
        outcomes[index] = finished["outcome"]["passed"].as_bool();
    }
    for (i, (want, got)) in expected.iter().zip(&outcomes).enumerate() {
        assert_eq!(Some(*want), *got, "test-{} should {}", i + 1, if *want { "pass" } else { "fail" });
    }
}

#[test]
fn prompts_are_variants_and_tests_come_from_a_csv_file() {
    let sb = sandbox();
    let run = sb.run(&["eval", "two_prompts.yaml", "--run-id", "two", "--out", "results", "-q"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.contains("echo [prompt-1]") && run.stdout.contains("echo [prompt-2]"), "{run:?}");
    let compare = sb.run(&["compare", "results/two", "--fail-on-regression"]);
    assert_eq!(compare.code, 1, "{compare:?}");
    assert!(compare.stdout.contains("verdict: echo [prompt-2] vs echo [prompt-1]"), "{compare:?}");
    assert!(compare.stdout.contains("McNemar p = 0.0005"), "{compare:?}");
}

#[test]
fn what_runner_does_not_do_is_refused_at_its_line_or_skipped_and_listed() {
    let sb = sandbox();
    let refused = sb.run(&["eval", "unsupported.yaml", "--out", "results", "-q"]);
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(
        refused.stderr.contains("unsupported.yaml:5:1: outputPath: the key `outputPath` is not supported"),
        "{refused:?}"
    );
    let skipped = sb.run(&["eval", "unsupported.yaml", "--out", "results", "-q", "--skip-unsupported"]);
    assert_eq!(skipped.code, 0, "{skipped:?}");
    for line in [
        "unsupported.yaml:4:19: skipped the provider `bedrock:anthropic.claude`",
        "unsupported.yaml:10:10: skipped the assertion type `rouge-n`",
        "unsupported.yaml:11:10: skipped the assertion type `similar`",
        "unsupported.yaml:14:10: skipped the assertion type `bleu`",
        "unsupported.yaml:12:5: skipped a test without assertions",
    ] {
        assert!(skipped.stderr.contains(line), "{line}: {skipped:?}");
    }
    let validate = sb.run(&["validate", "unsupported.yaml"]);
    assert_eq!(validate.code, 2, "validate refuses what eval would: {validate:?}");
}

#[test]
fn a_file_reference_out_of_the_configs_folder_is_refused_unless_allowed() {
    use std::os::unix::fs::symlink;
    let host = Sandbox::new();
    let secret = host.write("secret.txt", "host-secret-5b1e");
    host.write("tests.csv", "q,__expected\nhost-secret-5b1e,contains:x\n");
    host.write("check.py", "def get_assert(output, context):\n    return True\n");
    let beside = format!("../{}", host.path().file_name().expect("a name").to_string_lossy());
    let head = "providers: [echo]\n";
    let ask = "tests:\n  - vars: {q: hi}\n    assert: [{type: contains, value: hi}]\n";
    // (config, the line the reference is on)
    let cases = [
        (format!("prompts: [\"file://{}\"]\n{head}{ask}", secret.display()), 1),
        (format!("{head}prompts: [\"file://../{beside}/secret.txt\"]\n{ask}"), 2),
        (format!("{head}prompts: [\"file://linked.txt\"]\n{ask}"), 2),
        (format!("prompts: [\"{{{{q}}}}\"]\n{head}tests: [\"file://../{beside}/tests.csv\"]\n"), 3),
        (
            format!(
                "prompts: [\"{{{{q}}}}\"]\n{head}tests:\n  - vars: {{q: hi}}\n    \
                 assert: [{{type: python, value: \"file://../{beside}/check.py\"}}]\n"
            ),
            5,
        ),
    ];
    for (config, line) in cases {
        let sb = Sandbox::new();
        let path = sb.write("cfg/promptfooconfig.yaml", &config);
        symlink(&secret, sb.path().join("cfg/linked.txt")).expect("link");
        let run = sb.run(&["eval", "cfg/promptfooconfig.yaml", "--run-id", "t", "--out", "results", "-q"]);
        assert_eq!(run.code, 2, "{config}\n{run:?}");
        let at = format!("cfg/promptfooconfig.yaml:{line}:");
        assert!(run.stderr.contains(&at), "{config}\nstderr lacks {at}: {run:?}");
        assert!(run.stderr.contains("leads out of the config's folder"), "{config}\n{run:?}");
        assert!(run.stderr.contains("--allow-outside-files"), "{run:?}");
        assert!(!run.stderr.contains("host-secret-5b1e") && !sb.path().join("results").exists(), "{run:?}");
        // Asked for, the same reference is read.
        let allowed = sb.run(&["eval", &path.display().to_string(), "--allow-outside-files", "--out", "results", "-q"]);
        assert!(!allowed.stderr.contains("leads out"), "{config}\n{allowed:?}");
        assert!(sb.path().join("results").exists(), "{config}\n{allowed:?}");
    }
}
