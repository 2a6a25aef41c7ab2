//! The shell environment with real processes: arguments that fail the schema, commands that
//! hang, commands that print far too much, and a clean environment for the child.

use crate::{Sandbox, of_type, tool_observations};

fn shell_run(sb: &Sandbox, env_limits: &str, mock: &str) -> crate::Run {
    sb.write("environments/box.yaml", &format!("kind: shell\nlimits: {env_limits}\n"));
    sb.write(
        "s.yaml",
        &format!("suite: probe\nenvironment: box\nscorers:\n  - includes: ok\ntasks:\n  - id: t\n    input: go\n    mock:\n{mock}"),
    );
    sb.eval(&["s.yaml"])
}

#[test]
fn arguments_that_fail_the_schema_are_a_validation_error_and_the_episode_goes_on() {
    let sb = Sandbox::new();
    let run =
        shell_run(&sb, "{}", "      - tool_calls: [{name: run_command, arguments: {command: 5}}]\n      - text: ok\n");
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let obs = tool_observations(&events);
    assert_eq!(obs[0]["error"]["type"], "ValidationError", "{}", obs[0]);
    assert!(obs[0]["error"]["message"].as_str().unwrap().contains("/command"), "{}", obs[0]);
    assert_eq!(of_type(&events, "episode_finished")[0]["outcome"]["status"], "scored");
}

#[test]
fn a_command_that_hangs_times_out_and_its_process_group_is_killed() {
    let sb = Sandbox::new();
    let pid_file = sb.path().join("bg.pid");
    let mock = format!(
        "      - tool_calls: [{{name: run_command, arguments: {{command: \"sleep 300 & echo $! > {}; sleep 300\"}}}}]\n      - text: ok\n",
        pid_file.display()
    );
    let run = shell_run(&sb, "{command_timeout_s: 1}", &mock);
    assert_eq!(run.code, 0, "{run:?}");
    let obs = tool_observations(&sb.events())[0].clone();
    assert_eq!(obs["error"]["type"], "TimeoutError", "{obs}");
    let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    // The background `sleep` was in the command's group: it must be gone (or a zombie
    // about to be reaped by init), not still sleeping.
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let alive = state.split_whitespace().nth(2).is_some_and(|s| s != "Z" && s != "X");
    assert!(!alive, "the background process {pid} survived the timeout: {state}");
}

#[test]
fn a_command_that_prints_100_mb_is_cut_with_a_visible_marker() {
    let sb = Sandbox::new();
    let run = shell_run(
        &sb,
        "{output_cap_bytes: 4096}",
        "      - tool_calls: [{name: run_command, arguments: {command: \"head -c 100000000 /dev/zero | tr '\\\\0' a; echo done >&2\"}}]\n      - text: ok\n",
    );
    assert_eq!(run.code, 0, "{run:?}");
    let obs = tool_observations(&sb.events())[0].clone();
    assert_eq!(obs["error"]["type"], "OutputTruncated", "{}", &obs.to_string()[..300.min(obs.to_string().len())]);
    let stdout = obs["tool_result"]["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("aaaa"));
    assert!(stdout.contains("output truncated: showing 4096 of 100000000 bytes"), "{}", &stdout[stdout.len() - 100..]);
    assert!(stdout.len() < 4096 + 200, "stdout kept {} bytes", stdout.len());
    assert_eq!(obs["tool_result"]["stderr"], "done\n");
    assert_eq!(obs["tool_result"]["exit_code"], 0);
}

#[test]
fn the_child_sees_none_of_the_runners_variables() {
    let sb = Sandbox::new();
    sb.write("environments/box.yaml", "kind: shell\n");
    sb.write(
        "s.yaml",
        "suite: probe\nenvironment: box\nscorers: [{includes: ok}]\ntasks:\n  - id: t\n    input: go\n    mock:\n      - tool_calls: [{name: run_command, arguments: {command: env}}]\n      - text: ok\n",
    );
    let out = sb
        .command()
        .args(["eval", "s.yaml", "--model", "mock", "--run-id", "test", "--out", "results"])
        .env("OPENAI_API_KEY", "sk-test-secret-123")
        .env("ANTHROPIC_API_KEY", "sk-ant-secret-456")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let obs = tool_observations(&sb.events())[0].clone();
    let env = obs["tool_result"]["stdout"].as_str().unwrap();
    assert!(env.contains("PATH="), "{env}");
    assert!(!env.contains("secret"), "a secret reached the child: {env}");
    let log = std::fs::read_to_string(sb.path().join("results/test/events.jsonl")).unwrap();
    assert!(!log.contains("sk-test-secret-123") && !log.contains("sk-ant-secret-456"));
}

#[test]
fn file_tools_stay_inside_the_working_directory() {
    let sb = Sandbox::new();
    let run = shell_run(
        &sb,
        "{}",
        "      - tool_calls:\n          - {name: read_file, arguments: {path: ../../etc/passwd}}\n          - {name: read_file, arguments: {path: /etc/passwd}}\n          - {name: write_file, arguments: {path: sub/new.txt, content: hi}}\n      - tool_calls: [{name: read_file, arguments: {path: sub/new.txt}}]\n      - text: ok\n",
    );
    assert_eq!(run.code, 0, "{run:?}");
    let obs = tool_observations(&sb.events()).into_iter().cloned().collect::<Vec<_>>();
    assert_eq!(obs[0]["error"]["type"], "PermissionError");
    assert_eq!(obs[1]["error"]["type"], "PermissionError");
    assert_eq!(obs[2]["tool_result"]["bytes"], 2);
    assert_eq!(obs[3]["tool_result"]["content"], "hi");
}

#[test]
fn each_episode_gets_a_fresh_directory_seeded_with_its_files() {
    let sb = Sandbox::new();
    sb.write("environments/box.yaml", "kind: shell\nfiles: {shared.txt: fixture}\n");
    sb.write(
        "s.yaml",
        "suite: probe\nenvironment: box\nepochs: 2\nscorers: [{includes: ok}]\ntasks:\n  - id: t\n    input: go\n    files: {mine.txt: task}\n    mock:\n      - tool_calls: [{name: run_command, arguments: {command: \"ls; echo x >> mine.txt; cat mine.txt\"}}]\n      - text: ok\n",
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let commands: Vec<_> = tool_observations(&sb.events())
        .into_iter()
        .filter(|o| o["tool_result"]["stdout"].is_string())
        .cloned()
        .collect();
    assert_eq!(commands.len(), 2);
    for obs in commands {
        // Had the directory been shared, the second epoch would see two appended lines.
        assert_eq!(obs["tool_result"]["stdout"], "mine.txt\nshared.txt\ntaskx\n", "{obs}");
    }
}
