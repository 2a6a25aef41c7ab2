//! The run survives what its episodes do: a child that is gone when the runner writes to
//! it, a reader of the runner's own output that went away.

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::Stdio;

use crate::{Run, Sandbox, have_python, of_type, tool_observations};

/// The writing end of a pipe whose reader is already gone: every write to it fails with
/// EPIPE (or raises SIGPIPE).
fn pipe_without_reader() -> Stdio {
    let mut fds = [0; 2];
    // SAFETY: pipe fills `fds` with two new descriptors, owned here from then on.
    unsafe {
        assert_eq!(libc::pipe(fds.as_mut_ptr()), 0, "pipe");
        drop(OwnedFd::from_raw_fd(fds[0]));
        Stdio::from(OwnedFd::from_raw_fd(fds[1]))
    }
}

#[test]
fn a_python_interpreter_that_ended_between_calls_is_restarted_and_the_run_lives_on() {
    if !have_python() {
        return;
    }
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        r#"suite: py
environment: python
scorers: [{includes: done}]
tasks:
  - id: t
    input: go
    mock:
      - tool_calls: [{name: exec, arguments: {code: "import signal\nsignal.alarm(1)\n"}}]
      - tool_calls: [{name: eval, arguments: {code: "6 * 7"}}]
      - tool_calls: [{name: eval, arguments: {code: "6 * 7"}}]
      - text: done
"#,
    );
    // The model's delay lets the alarm end the interpreter before the next call is sent.
    let run = sb.run(&[
        "eval",
        "s.yaml",
        "--model",
        "mock",
        "--mock-delay-ms",
        "1600",
        "--run-id",
        "test",
        "--out",
        "results",
    ]);
    assert_eq!(run.code, 0, "the runner must outlive its interpreter: {run:?}");
    let events = sb.events();
    let obs = tool_observations(&events);
    assert_eq!(obs[1]["error"]["type"], "ExecutionError", "{}", obs[1]);
    assert!(obs[1]["error"]["message"].as_str().unwrap_or("").contains("state"), "{}", obs[1]);
    assert_eq!(obs[2]["tool_result"]["value"], 42, "a fresh interpreter answers: {}", obs[2]);
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished[0]["outcome"]["status"], "scored", "{}", finished[0]);
    assert_eq!(events.last().unwrap()["type"], "run_finished");
}

#[test]
fn a_command_piping_into_head_ends_at_once() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        "suite: yes\nenvironment: shell\nscorers: [{includes: ok}]\ntasks:\n  - id: t\n    input: go\n    mock:\n      - tool_calls: [{name: run_command, arguments: {command: \"yes | head -1\"}}]\n      - text: ok\n",
    );
    let started = std::time::Instant::now();
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    assert!(started.elapsed().as_secs() < 20, "`yes | head -1` did not end at once");
    let obs = tool_observations(&sb.events())[0].clone();
    assert_eq!(obs["tool_result"]["exit_code"], 0, "{obs}");
    assert_eq!(obs["tool_result"]["stdout"].as_str().map(str::trim), Some("y"), "{obs}");
}

#[test]
fn a_report_whose_reader_went_away_ends_quietly_and_still_writes_its_files() {
    let sb = Sandbox::new();
    sb.write(
        "s.yaml",
        "suite: kv\nenvironment: kv\nscorers: [{equals: ok}]\ntasks:\n  - {id: t, input: q, mock: [{text: ok}]}\n",
    );
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let output = sb
        .command()
        .args(["report", "results/test", "--html", "--markdown", "summary.md"])
        .stdout(pipe_without_reader())
        .stderr(Stdio::piped())
        .output()
        .expect("run runner");
    let report = Run::from(output);
    assert_eq!(report.code, 0, "{report:?}");
    assert!(!report.stderr.contains("panicked"), "{report:?}");
    assert!(sb.path().join("summary.md").is_file(), "the Markdown summary was not written");
    assert!(sb.path().join("results/test/report.html").is_file(), "the HTML report was not written");
}

/// Whether `pid` is a live process (not a zombie about to be reaped).
fn alive(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().next()).is_some_and(|s| s != "Z" && s != "X")
}

#[test]
fn a_process_that_left_its_session_does_not_outlive_a_runner_killed_outright() {
    let sb = Sandbox::new();
    let pid_file = sb.path().join("escaped.pid");
    sb.write(
        "environments/box.yaml",
        &format!(
            "kind: shell\nlimits: {{command_timeout_s: 120, tool_timeout_s: 120}}\nsandbox: {{write_paths: [{}]}}\n",
            sb.path().display()
        ),
    );
    sb.write(
        "s.yaml",
        &format!(
            "suite: escape\nenvironment: box\nscorers: [{{includes: ok}}]\ntasks:\n  - id: t\n    input: go\n    mock:\n      - tool_calls: [{{name: run_command, arguments: {{command: \"setsid -f sh -c 'echo $$ > {}.tmp; mv {0}.tmp {0}; exec sleep 300'; sleep 300\"}}}}]\n      - text: ok\n",
            pid_file.display()
        ),
    );
    let mut child = sb
        .command()
        .args(["eval", "s.yaml", "--model", "mock", "--run-id", "test", "--out", "results", "-q"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn runner");
    let started = std::time::Instant::now();
    let pid = loop {
        if let Some(pid) = std::fs::read_to_string(&pid_file).ok().and_then(|p| p.trim().parse::<i32>().ok()) {
            break pid;
        }
        assert!(started.elapsed().as_secs() < 60, "the command did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let cmdline = |pid: i32| std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    while cmdline(pid) != b"sleep\x00300\x00" {
        assert!(started.elapsed().as_secs() < 60, "the escaped process did not sleep");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().expect("kill runner");
    child.wait().expect("reap runner");
    let killed = std::time::Instant::now();
    while alive(pid) && killed.elapsed().as_secs() < 5 {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let survived = alive(pid) && cmdline(pid) == b"sleep\x00300\x00";
    if survived {
        // SAFETY: kills the survivor this test made, known by its command line.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
    assert!(!survived, "process {pid}, which left its session, outlived the killed runner");
}

#[test]
fn an_episode_that_made_a_very_deep_tree_is_removed_and_the_run_finishes() {
    if !have_python() {
        return;
    }
    let sb = Sandbox::new();
    let tmp = sb.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    // Whatever the run leaves is removed by `rm` (iterative) before the test's own folder
    // is (recursive, in this thread).
    let _cleanup = RemoveWithRm(tmp.clone());
    // Built from the bottom up, each step at the top of the episode's folder: mkdir'ing
    // down a deep path costs, under Landlock, a walk to the root per call (quadratic in the
    // depth: minutes on a loaded machine), while these renames touch only shallow paths.
    let deep = "python3 -c \\\"import os\\nos.mkdir('d')\\nfor _ in range(19999):\\n    os.mkdir('e'); os.rename('d', 'e/d'); os.rename('e', 'd')\\nprint('deep')\\\"";
    sb.write(
        "s.yaml",
        &format!(
            "suite: deep\nenvironment: shell\nscorers: [{{includes: ok}}]\ntasks:\n  - id: t\n    input: go\n    mock:\n      - tool_calls: [{{name: run_command, arguments: {{command: \"{deep}\"}}}}]\n      - text: ok\n"
        ),
    );
    let output = sb
        .command()
        .args(["eval", "s.yaml", "--model", "mock", "--run-id", "test", "--out", "results"])
        .env("TMPDIR", &tmp)
        .output()
        .expect("run runner");
    let run = Run::from(output);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.events();
    let obs = tool_observations(&events);
    assert_eq!(obs[0]["tool_result"]["stdout"].as_str().map(str::trim), Some("deep"), "{}", obs[0]);
    assert_eq!(of_type(&events, "episode_finished")[0]["outcome"]["status"], "scored");
    assert_eq!(events.last().unwrap()["type"], "run_finished", "the run was finished, no --resume needed");
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().map(|e| e.path()).collect();
    assert!(left.is_empty(), "the run left folders in $TMPDIR: {left:?}");
}

/// Removes a folder with `rm -rf` when dropped.
struct RemoveWithRm(std::path::PathBuf);

impl Drop for RemoveWithRm {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rm").arg("-rf").arg(&self.0).status();
    }
}
