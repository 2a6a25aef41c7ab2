//! What a shell world may contain or start must not hang, bloat or outlive the run: named
//! pipes, huge sparse files, hard links out of the working directory, processes that leave
//! their session, and a runner short of file descriptors.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{Run, Sandbox, of_type, read_jsonl, tool_observations};

/// Runs `runner eval s.yaml --model mock` under `sh -c "<prefix>; exec runner …"` (for
/// `ulimit`), killing it if it has not ended within `limit`.
fn eval_within(sb: &Sandbox, prefix: &str, extra: &[&str], limit: Duration) -> Run {
    let script = format!("{prefix}\nexec \"$0\" \"$@\"");
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_runner"))
        .args(["eval", "s.yaml", "--model", "mock", "--run-id", "test", "--out", "results"])
        .args(extra)
        .current_dir(sb.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start runner");
    let started = Instant::now();
    while child.try_wait().expect("wait for runner").is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("collect runner");
            panic!("runner did not end within {limit:?}: {:?}", Run::from(out));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Run::from(child.wait_with_output().expect("collect runner"))
}

fn suite(sb: &Sandbox, env: &str, body: &str) {
    sb.write("environments/box.yaml", env);
    sb.write("s.yaml", &format!("suite: probe\nenvironment: box\n{body}"));
}

fn scores(events: &[Value]) -> Vec<&Value> {
    of_type(events, "score")
}

fn explanation<'a>(events: &'a [Value], scorer: &str) -> &'a str {
    scores(events)
        .into_iter()
        .find(|s| s["scorer"] == scorer)
        .and_then(|s| s["explanation"].as_str())
        .unwrap_or_else(|| panic!("no score from {scorer}"))
}

#[test]
fn a_named_pipe_in_the_final_world_hangs_no_scorer_and_no_tool() {
    let sb = Sandbox::new();
    suite(
        &sb,
        "kind: shell\n",
        "limits: {max_steps: 5, time_s: 5}\nscorers:\n  - file_contains: {path: p, text: x}\n  - file_exists: p\n  - check: cat p\ntasks:\n  - id: t\n    input: go\n    mock:\n      - tool_calls: [{name: run_command, arguments: {command: mkfifo p}}]\n      - tool_calls: [{name: read_file, arguments: {path: p}}]\n      - text: ok\n",
    );
    let run = eval_within(&sb, "", &[], Duration::from_secs(90));
    assert!(run.code == 0 || run.code == 1, "{run:?}");
    assert!(sb.path().join("results/test/episodes.csv").exists(), "no tables: {run:?}");
    let events = sb.events();
    let read = tool_observations(&events)[1].clone();
    assert_eq!(read["error"]["type"], "PermissionError", "{read}");
    assert!(read["error"]["message"].as_str().unwrap().contains("named pipe"), "{read}");
    let finished = of_type(&events, "episode_finished")[0];
    assert_eq!(finished["outcome"]["status"], "scored", "{finished}");
    assert_eq!(finished["outcome"]["passed"], false, "{finished}");
    assert!(explanation(&events, "file_contains").contains("named pipe"), "{events:?}");
    assert!(explanation(&events, "file_exists").contains("named pipe"), "{events:?}");
    // `cat p` waits for a writer forever: it is stopped at the episode's 5 s.
    assert!(explanation(&events, "check").contains("longer than 5s"), "{}", explanation(&events, "check"));
}

#[test]
fn a_sparse_20_gb_file_is_read_and_searched_with_a_cap() {
    let sb = Sandbox::new();
    suite(
        &sb,
        // The sandbox's file size limit would refuse the 20 GB file.
        "kind: shell\nsandbox: {limits: {file_size_mb: null}}\n",
        "scorers:\n  - file_contains: {path: big, text: needle}\ntasks:\n  - id: t\n    input: go\n    mock:\n      - tool_calls: [{name: run_command, arguments: {command: \"truncate -s 20G big\"}}]\n      - tool_calls: [{name: read_file, arguments: {path: big}}]\n      - text: ok\n",
    );
    // 4 GB of address space is plenty for a run, and far too little for 20 GB of file.
    let run = eval_within(&sb, "ulimit -v 4000000", &[], Duration::from_secs(120));
    assert!(run.code == 0 || run.code == 1, "{run:?}");
    let events = sb.events();
    let read = tool_observations(&events)[1].clone();
    // All NUL bytes: read_file refuses it as binary, having looked at its first 8 KB only.
    assert_eq!(read["error"]["type"], "ExecutionError", "{read}");
    let message = read["error"]["message"].as_str().unwrap();
    assert!(message.contains("21474836480 bytes") && message.contains("binary"), "{read}");
    let searched = explanation(&events, "file_contains");
    assert!(searched.contains("21474836480 bytes") && searched.contains("first"), "{searched}");
    assert_eq!(of_type(&events, "episode_finished")[0]["outcome"]["passed"], false);
}

#[test]
fn write_file_refuses_a_hard_link_to_a_file_outside() {
    let sb = Sandbox::new();
    let outside = sb.write("outside.txt", "precious\n");
    // The sandbox refuses the link itself; write_file, which runs in the runner, must
    // refuse it too where the link exists (made before, or with the sandbox off).
    suite(
        &sb,
        "kind: shell\nsandbox: off\n",
        &format!(
            "scorers: [{{includes: ok}}]\ntasks:\n  - id: t\n    input: go\n    mock:\n      - tool_calls: [{{name: run_command, arguments: {{command: \"ln {} hl\"}}}}]\n      - tool_calls: [{{name: write_file, arguments: {{path: hl, content: pwned}}}}]\n      - text: ok\n",
            outside.display()
        ),
    );
    let run = eval_within(&sb, "", &[], Duration::from_secs(60));
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    assert_eq!(tool_observations(&events)[0]["tool_result"]["exit_code"], 0, "the link was not made");
    let write = tool_observations(&events)[1].clone();
    assert_eq!(write["error"]["type"], "PermissionError", "{write}");
    assert!(write["error"]["message"].as_str().unwrap().contains("hard links"), "{write}");
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "precious\n");
}

/// The pids of live processes whose command line holds `needle` (a pgrep -f).
pub(crate) fn pids_with(needle: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("this check needs /proc").flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let zombie = stat.rsplit(')').next().and_then(|s| s.split_whitespace().next()) == Some("Z");
        if !zombie && String::from_utf8_lossy(&cmdline).replace('\0', " ").contains(needle) {
            found.push(pid);
        }
    }
    found
}

#[test]
fn processes_that_leave_the_session_and_clear_their_environment_end_with_the_episode() {
    let sb = Sandbox::new();
    // Unique durations mark the two escapees.
    let tag = format!("{}", 100_000 + std::process::id() % 100_000);
    let marks = [format!("sleep 7{tag}.1"), format!("sleep 7{tag}.2")];
    let commands = [
        format!("unset RUNNER_EPISODE_MARK; setsid {} >/dev/null 2>&1 </dev/null & sleep 0.3", marks[0]),
        format!("env -i setsid -f {} >/dev/null 2>&1 </dev/null", marks[1]),
    ];
    suite(
        &sb,
        "kind: shell\n",
        &format!(
            "scorers: [{{includes: ok}}]\ntasks:\n  - id: t\n    input: go\n    mock:\n      - tool_calls:\n          - {{name: run_command, arguments: {{command: {:?}}}}}\n          - {{name: run_command, arguments: {{command: {:?}}}}}\n      - tool_calls: [{{name: run_command, arguments: {{command: \"sleep 0.3\"}}}}]\n      - text: ok\n",
            commands[0], commands[1]
        ),
    );
    let run = eval_within(&sb, "", &[], Duration::from_secs(60));
    assert_eq!(run.code, 0, "{run:?}");
    let started = Instant::now();
    loop {
        let left: Vec<(String, Vec<i32>)> =
            marks.iter().map(|m| (m.clone(), pids_with(m))).filter(|(_, p)| !p.is_empty()).collect();
        if left.is_empty() {
            return;
        }
        if started.elapsed() > Duration::from_secs(3) {
            for pid in left.iter().flat_map(|(_, p)| p) {
                // SAFETY: only signals the escapees this test started.
                unsafe { libc::kill(*pid, libc::SIGKILL) };
            }
            panic!("processes survived their episode: {left:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The outcomes of a run's episodes: (status, passed, cause).
fn outcomes(dir: &Path) -> Vec<(String, Option<bool>, Option<String>)> {
    of_type(&read_jsonl(&dir.join("results/test/events.jsonl")), "episode_finished")
        .into_iter()
        .map(|e| {
            let o = &e["outcome"];
            (o["status"].as_str().unwrap().to_owned(), o["passed"].as_bool(), o["cause"].as_str().map(String::from))
        })
        .collect()
}

#[test]
fn a_low_open_file_limit_lowers_the_jobs_and_fails_no_episode() {
    let sb = Sandbox::new();
    suite(
        &sb,
        "kind: shell\n",
        "epochs: 100\nscorers:\n  - file_contains: {path: f.txt, text: hi}\n  - check: test -f f.txt\ntasks:\n  - id: t\n    input: go\n    mock:\n      - tool_calls: [{name: run_command, arguments: {command: \"echo hi > f.txt; sleep 0.05\"}}]\n      - text: ok\n",
    );
    let run = eval_within(&sb, "ulimit -n 64", &["-j", "100", "-q"], Duration::from_secs(300));
    let outcomes = outcomes(sb.path());
    assert_eq!(outcomes.len(), 100, "{run:?}");
    let failed: Vec<_> = outcomes.iter().filter(|o| o.1 == Some(false)).collect();
    assert!(failed.is_empty(), "{} episodes failed: {run:?}", failed.len());
    for (status, _, cause) in &outcomes {
        assert!(status == "scored" || cause.as_deref() == Some("resource_exhausted"), "{status} {cause:?}");
    }
    assert!(run.stderr.contains("-j 100 lowered to"), "{run:?}");
}

#[test]
fn a_runner_out_of_file_descriptors_leaves_the_episode_unscored_not_failed() {
    let sb = Sandbox::new();
    // Twenty commands at once need about sixty descriptors; the runner has far fewer.
    let calls: String = (0..20)
        .map(|i| format!("          - {{name: run_command, arguments: {{command: \"sleep 1; echo > f{i}\"}}}}\n"))
        .collect();
    suite(
        &sb,
        "kind: shell\nlimits: {max_concurrency: 20}\n",
        &format!(
            "scorers:\n  - check: \"test $(ls f* | wc -l) -eq 20\"\ntasks:\n  - id: t\n    input: go\n    mock:\n      - tool_calls:\n{calls}      - text: ok\n"
        ),
    );
    let run = eval_within(&sb, "ulimit -n 48", &["-q"], Duration::from_secs(120));
    let outcomes = outcomes(sb.path());
    assert_eq!(outcomes.len(), 1, "{run:?}");
    assert_eq!(outcomes[0].0, "unscored", "{outcomes:?} {run:?}");
    assert_eq!(outcomes[0].2.as_deref(), Some("resource_exhausted"), "{outcomes:?}");
    assert_eq!(run.code, 3, "{run:?}");
}
