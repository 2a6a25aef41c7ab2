//! The shell environment with real processes: arguments that fail the schema, commands that
//! hang, commands that print far too much, and a clean environment for the child.

use crate::{Sandbox, of_type, tool_observations};

fn shell_run(sb: &Sandbox, env_limits: &str, mock: &str) -> crate::Run {
    // Commands may write the test's folder (to leave a pid there), and nothing else outside.
    sb.write(
        "environments/box.yaml",
        &format!("kind: shell\nlimits: {env_limits}\nsandbox: {{write_paths: [{}]}}\n", sb.path().display()),
    );
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
    // The background `sleep` was in the command's group: it must be gone.
    crate::assert_gone(pid);
}

#[test]
fn a_process_that_leaves_the_group_is_killed_when_the_episode_ends() {
    let sb = Sandbox::new();
    let pid_file = sb.path().join("escapee.pid");
    let mock = format!(
        "      - tool_calls: [{{name: run_command, arguments: {{command: \"setsid sleep 600 >/dev/null 2>&1 </dev/null & echo $! > {}; sleep 0.2\"}}}}]\n      - text: ok\n",
        pid_file.display()
    );
    let run = shell_run(&sb, "{}", &mock);
    assert_eq!(run.code, 0, "{run:?}");
    let pid: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    crate::assert_gone(pid);
}

/// The observation of the call with this id.
fn observation(events: &[serde_json::Value], call_id: &str) -> serde_json::Value {
    tool_observations(events)
        .into_iter()
        .find(|o| o["call_id"] == call_id)
        .cloned()
        .unwrap_or_else(|| panic!("no {call_id}"))
}

#[test]
fn a_symlink_cannot_lead_a_read_or_write_out_of_the_working_directory() {
    let sb = Sandbox::new();
    let outside = sb.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "secret").unwrap();
    let o = outside.display();
    let mock = format!(
        "      - tool_calls: [{{name: run_command, arguments: {{command: \"ln -s {o}/new.txt dangling; ln -s {o} away; echo in > inner.txt; ln -s inner.txt near\"}}}}]\n      - tool_calls:\n          - {{id: w1, name: write_file, arguments: {{path: dangling, content: pwned}}}}\n          - {{id: w2, name: write_file, arguments: {{path: away/f.txt, content: pwned}}}}\n          - {{id: r1, name: read_file, arguments: {{path: away/secret.txt}}}}\n          - {{id: l1, name: list_dir, arguments: {{path: away}}}}\n          - {{id: r2, name: read_file, arguments: {{path: near}}}}\n          - {{id: w3, name: write_file, arguments: {{path: near, content: changed}}}}\n      - text: ok\n"
    );
    let run = shell_run(&sb, "{}", &mock);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(!outside.join("new.txt").exists(), "a write followed a dangling link out");
    assert!(!outside.join("f.txt").exists(), "a write followed a linked folder out");
    let events = sb.events();
    for id in ["w1", "w2", "r1", "l1", "w3"] {
        assert_eq!(observation(&events, id)["error"]["type"], "PermissionError", "{id}: {}", observation(&events, id));
    }
    // A link that stays inside may be read.
    assert_eq!(observation(&events, "r2")["tool_result"]["content"], "     1\tin\n");
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
    let events = sb.events();
    assert_eq!(observation(&events, "c_1")["error"]["type"], "PermissionError");
    assert_eq!(observation(&events, "c_2")["error"]["type"], "PermissionError");
    assert_eq!(observation(&events, "c_3")["tool_result"]["bytes"], 2);
    assert_eq!(observation(&events, "c_4")["tool_result"]["content"], "     1\thi\n");
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

/// `--keep-worlds` keeps each episode's folder, with what the agent left in it, and says
/// where; without it the folder is gone.
#[test]
fn keep_worlds_keeps_each_episodes_folder_and_says_where() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        "suite: s\nenvironment: shell\ntasks:\n  - id: t\n    input: go\n    scorers: [{equals: done}]\n    mock:\n      - tool_calls: [{name: write_file, arguments: {path: left.txt, content: kept}}]\n      - text: done\n",
    );
    let run = sb.run(&["eval", "s.yaml", "--model", "mock", "--run-id", "kept", "--out", "results", "--keep-worlds"]);
    assert_eq!(run.code, 0, "{run:?}");
    let said = run.stderr.lines().find_map(|l| l.strip_prefix("worlds kept in ")).expect("the run says where");
    let kept: Vec<std::path::PathBuf> =
        std::fs::read_dir(said).expect("the kept folder").map(|e| e.expect("an entry").path()).collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(std::fs::read_to_string(kept[0].join("work/left.txt")).unwrap_or_default(), "kept");
    let _ = std::fs::remove_dir_all(said);
}
