//! A run's life under bad luck: signals, kills at any moment, torn logs, readers of a live
//! run. Whatever happens, the run can be resumed or restarted, and nothing is lost twice.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::{Run, Sandbox, of_type, read_jsonl};

/// `n` kv tasks that pass under `--model mock`.
fn kv_suite(n: usize) -> String {
    let tasks: String = (0..n)
        .map(|i| {
            format!(
                "  - {{id: t{i:03}, input: q{i}, mock: [{{tool_calls: [{{name: kv_get, arguments: {{key: k}}}}]}}, {{text: ok}}]}}\n"
            )
        })
        .collect();
    format!("suite: life\nenvironment: kv\nscorers: [{{equals: ok}}]\ntasks:\n{tasks}")
}

fn send(child: &Child, signal: i32) {
    // SAFETY: sends a signal to a child this test spawned and has not reaped.
    unsafe {
        libc::kill(child.id() as i32, signal);
    }
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The pids of live processes whose arguments are exactly `sleep MARKER`.
fn sleeping(marker: &str) -> Vec<i32> {
    let needle = format!("sleep\0{marker}\0");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        // A zombie has exited; it only waits to be reaped by its parent.
        let zombie = stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z'));
        if !zombie && cmdline == needle.as_bytes() {
            found.push(pid);
        }
    }
    found
}

/// A shell suite whose commands sleep for a long time, each marked by `marker` in its
/// command line and leaving a file in `marks` when it starts.
fn sleeping_suite(sb: &Sandbox, marker: &str, marks: &Path) {
    std::fs::create_dir_all(marks).unwrap();
    sb.write(
        "environments/slow.yaml",
        &format!(
            "kind: shell\nlimits: {{command_timeout_s: 120, tool_timeout_s: 120}}\nsandbox: {{write_paths: [{}]}}\n",
            marks.display()
        ),
    );
    let tasks: String = (0..3)
        .map(|i| {
            format!(
                "  - id: t{i}\n    input: wait\n    mock:\n      - tool_calls: [{{name: run_command, arguments: {{command: \"touch {}/{i}; sleep {marker}\"}}}}]\n      - text: x\n",
                marks.display()
            )
        })
        .collect();
    sb.write("s.yaml", &format!("suite: slow\nenvironment: slow\nscorers: [{{includes: x}}]\ntasks:\n{tasks}"));
}

fn spawn_eval(sb: &Sandbox, tmp: &Path, run_id: &str, extra: &[&str]) -> Child {
    sb.command()
        .args(["eval", "s.yaml", "--model", "mock", "--out", "results", "-q"])
        .args(if extra.contains(&"--resume") { vec![] } else { vec!["--run-id", run_id] })
        .args(extra)
        .env("TMPDIR", tmp)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn runner")
}

/// A run of [`sleeping_suite`] with its own `$TMPDIR`, started and waited for until its
/// three commands sleep.
struct Sleeping {
    sb: Sandbox,
    tmp: PathBuf,
    marks: PathBuf,
    marker: String,
}

impl Sleeping {
    fn new(first: u32) -> Sleeping {
        let sb = Sandbox::new();
        let (tmp, marks) = (sb.path().join("tmp"), sb.path().join("marks"));
        std::fs::create_dir_all(&tmp).unwrap();
        // Unique to this test process, so that tests running at once do not count each other's.
        let marker = format!("{first}.{}", std::process::id());
        sleeping_suite(&sb, &marker, &marks);
        Sleeping { sb, tmp, marks, marker }
    }

    fn start(&self, extra: &[&str]) -> Child {
        let _ = std::fs::remove_dir_all(&self.marks);
        std::fs::create_dir_all(&self.marks).unwrap();
        let child = spawn_eval(&self.sb, &self.tmp, "test", extra);
        wait_for("the three commands to start", Duration::from_secs(60), || entries(&self.marks).len() == 3);
        wait_for("the three commands to sleep", Duration::from_secs(60), || sleeping(&self.marker).len() == 3);
        child
    }
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default()
}

#[test]
fn sigterm_cancels_the_episodes_writes_the_tables_and_leaves_no_process_or_folder() {
    let slow = Sleeping::new(417);
    let (sb, tmp, marker) = (&slow.sb, &slow.tmp, &slow.marker);
    let child = slow.start(&[]);
    send(&child, libc::SIGTERM);
    let run = Run::from(child.wait_with_output().unwrap());
    assert_eq!(run.code, 130, "SIGTERM is an interruption: {run:?}");
    assert!(run.stderr.contains("stopping on SIGTERM"), "{run:?}");

    let events = sb.events();
    let finished = of_type(&events, "episode_finished");
    assert_eq!(finished.len(), 3, "every episode in flight is logged");
    assert!(finished.iter().all(|e| e["outcome"]["status"] == "cancelled"), "{finished:?}");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "run_finished");
    assert_eq!(last["interrupted"], true);
    let dir = sb.path().join("results/test");
    for table in ["episodes.csv", "episodes.parquet", "summary.json"] {
        assert!(dir.join(table).is_file(), "{table} was not written");
    }
    assert!(sleeping(marker).is_empty(), "a command outlived the run");
    assert_eq!(entries(tmp), Vec::<PathBuf>::new(), "the run left folders in $TMPDIR");
}

#[test]
fn a_second_sigterm_exits_at_once() {
    let sb = Sandbox::new();
    // A grader that never answers keeps the first SIGTERM waiting for the scoring.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    sb.write(
        "runner.yaml",
        &format!(
            "providers:\n  slow: {{api: openai, base_url: \"http://{addr}/v1\", timeout_s: 300, max_retries: 0}}\n"
        ),
    );
    sb.write(
        "s.yaml",
        "suite: g\nenvironment: kv\nscorers: [{llm_rubric: is it ok, model: slow/judge}]\ntasks:\n  - {id: t, input: q, mock: [{text: ok}]}\n",
    );
    let tmp = sb.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let child = spawn_eval(&sb, &tmp, "test", &[]);
    listener.set_nonblocking(true).unwrap();
    let mut connection = None;
    wait_for("the grader to be called", Duration::from_secs(60), || {
        connection = listener.accept().ok();
        connection.is_some()
    });
    send(&child, libc::SIGTERM);
    // Past the second in which a repeated SIGTERM is taken for the same one.
    std::thread::sleep(Duration::from_millis(1500));
    send(&child, libc::SIGTERM);
    let started = Instant::now();
    let run = Run::from(child.wait_with_output().unwrap());
    assert!(started.elapsed() < Duration::from_secs(30), "the second SIGTERM did not end the process");
    assert_eq!(run.code, 130, "{run:?}");
    drop(connection);
}

#[test]
fn a_sigterm_delivered_twice_at_once_stops_the_run_gracefully() {
    // As `timeout` does: the signal to the process, then the same to its process group.
    use std::io::BufRead as _;
    let slow = Sleeping::new(419);
    let mut child = slow.start(&[]);
    let stderr = child.stderr.take().unwrap();
    let (lines, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    send(&child, libc::SIGTERM);
    // The second copy arrives once the first was taken, within the same moment.
    assert!(seen.iter().any(|line| line.contains("stopping on SIGTERM")), "the first SIGTERM was not taken");
    send(&child, libc::SIGTERM);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let events = slow.sb.events();
    assert_eq!(events.last().unwrap()["type"], "run_finished", "the run was cut short by the copy");
    assert!(slow.sb.path().join("results/test/summary.json").is_file(), "no tables");
}

#[test]
fn a_run_killed_outright_leaves_no_command_and_its_scratch_folder_is_removed_when_resumed() {
    let slow = Sleeping::new(418);
    let (tmp, marker) = (&slow.tmp, &slow.marker);
    let mut child = slow.start(&[]);
    child.kill().unwrap();
    child.wait().unwrap();
    let left = entries(tmp);
    assert_eq!(left.len(), 1, "the killed run's scratch folder: {left:?}");
    assert!(!entries(&left[0]).is_empty(), "with the episodes' folders in it");
    // No command outlives a runner killed outright: each keeper sees its parent gone.
    wait_for("the killed run's commands to end", Duration::from_secs(30), || sleeping(marker).is_empty());

    let resumed = slow.start(&["--resume", "results/test"]);
    let inside: Vec<PathBuf> = entries(tmp).iter().flat_map(|d| entries(d)).collect();
    assert_eq!(inside.len(), 3, "only the resumed episodes' folders remain: {inside:?}");
    send(&resumed, libc::SIGTERM);
    let run = Run::from(resumed.wait_with_output().unwrap());
    assert_eq!(run.code, 130, "{run:?}");
    assert_eq!(entries(tmp), Vec::<PathBuf>::new(), "the run left folders in $TMPDIR");
}

#[test]
fn a_last_line_without_its_newline_is_torn_for_the_reader_and_the_writer_alike() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &kv_suite(20));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.path().join("results/test/events.jsonl");
    let text = std::fs::read_to_string(&events).unwrap();
    // A crash after an episode's last event was written, but before its newline.
    let cut = text.match_indices("\"type\":\"episode_finished\"").nth(9).map(|(i, _)| i).unwrap();
    let end = cut + text[cut..].find('\n').unwrap();
    std::fs::write(&events, &text[..end]).unwrap();

    let report = sb.run(&["report", "results/test"]);
    assert_eq!(report.code, 0, "{report:?}");
    let rows = csv::Reader::from_path(sb.path().join("results/test/episodes.csv")).unwrap().records().count();
    assert_eq!(rows, 9, "the torn line is not an episode that finished");

    let resumed = sb.run(&["eval", "s.yaml", "--model", "mock", "--resume", "test", "--out", "results"]);
    assert_eq!(resumed.code, 0, "{resumed:?}");
    assert!(resumed.stderr.contains("9 scored episodes kept, 11 to run"), "{resumed:?}");
    let log = read_jsonl(&events);
    let rows = csv::Reader::from_path(sb.path().join("results/test/episodes.csv")).unwrap().records().count();
    assert_eq!(rows, 20, "every episode has its row");
    let seqs: Vec<u64> = log.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "event numbers go 1, 2, 3, … across the cut");
}

#[test]
fn a_torn_line_that_names_its_number_does_not_make_the_resume_skip_one() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &kv_suite(3));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.path().join("results/test/events.jsonl");
    let mut text = std::fs::read_to_string(&events).unwrap();
    let last_seq = read_jsonl(&events).last().unwrap()["seq"].as_u64().unwrap();
    // Torn after its type: a reader can tell its number and type, but it is not whole.
    text.push_str(&format!(
        "{{\"v\":1,\"run_id\":\"test\",\"seq\":{},\"ts\":\"2026-01-01T00:00:00Z\",\"episode_id\":\"ep_0\",\"type\":\"observation\",\"step",
        last_seq + 1
    ));
    std::fs::write(&events, text).unwrap();
    let resumed = sb.run(&["eval", "s.yaml", "--model", "mock", "--resume", "test", "--out", "results"]);
    assert_eq!(resumed.code, 0, "{resumed:?}");
    let seqs: Vec<u64> = read_jsonl(&events).iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "no number skipped: {seqs:?}");
}

#[test]
fn a_bad_finish_in_a_log_is_reported_at_its_line() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &kv_suite(3));
    let run = sb.eval(&["s.yaml"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.path().join("results/test/events.jsonl");
    let text = std::fs::read_to_string(&events).unwrap();
    let line = text.lines().position(|l| l.contains("\"type\":\"episode_finished\"")).unwrap() + 1;
    let broken: Vec<String> = text
        .lines()
        .enumerate()
        .map(
            |(i, l)| {
                if i + 1 == line { l.replace("\"status\":\"scored\"", "\"status\":\"splendid\"") } else { l.into() }
            },
        )
        .collect();
    std::fs::write(&events, broken.join("\n") + "\n").unwrap();
    let report = sb.run(&["report", "results/test"]);
    assert_eq!(report.code, 4, "{report:?}");
    assert!(report.stderr.contains(&format!("events.jsonl:{line}:")), "the error names line {line}: {report:?}");
}

#[test]
fn the_unfinished_hint_names_the_run_folder_where_it_is() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &kv_suite(3));
    let run = sb.run(&["eval", "s.yaml", "--model", "mock", "--run-id", "r", "--out", "elsewhere"]);
    assert_eq!(run.code, 0, "{run:?}");
    let events = sb.path().join("elsewhere/r/events.jsonl");
    // As if killed after the first episode started.
    let text = std::fs::read_to_string(&events).unwrap();
    let kept: Vec<&str> = text.lines().take_while(|l| !l.contains("\"type\":\"episode_finished\"")).collect();
    std::fs::write(&events, kept.join("\n") + "\n").unwrap();
    let report = sb.run(&["report", "elsewhere/r"]);
    assert_eq!(report.code, 0, "{report:?}");
    assert!(report.stdout.contains("--resume elsewhere/r"), "{report:?}");
}

#[test]
fn reports_of_a_live_run_do_not_disturb_it() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &kv_suite(50));
    let child = sb
        .command()
        .args([
            "eval", "s.yaml", "--model", "mock", "--epochs", "40", "-j", "16", "--run-id", "live", "--out", "results",
        ])
        .args(["--mock-delay-ms", "1", "-q"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let events = sb.path().join("results/live/events.jsonl");
    wait_for("the run to start", Duration::from_secs(60), || events.is_file());
    // Reports, two at a time, until the run has written its own tables.
    let mut reports = 0;
    let summary = sb.path().join("results/live/summary.json");
    let ran = Instant::now();
    while !summary.is_file() || reports < 4 {
        assert!(ran.elapsed() < Duration::from_secs(240), "the run did not end");
        let a = sb.command().args(["report", "results/live"]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn();
        let b = sb.command().args(["report", "results/live"]).stdout(Stdio::null()).stderr(Stdio::piped()).spawn();
        for r in [a, b] {
            let out = r.unwrap().wait_with_output().unwrap();
            assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
        }
        reports += 2;
    }
    let run = Run::from(child.wait_with_output().unwrap());
    assert_eq!(run.code, 0, "the run was disturbed by {reports} reports: {run:?}");
    let rows = csv::Reader::from_path(sb.path().join("results/live/episodes.csv")).unwrap().records().count();
    assert_eq!(rows, 2000);
    let stray: Vec<PathBuf> = entries(&sb.path().join("results/live"))
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(stray.is_empty(), "temporary files left: {stray:?}");
}

#[test]
fn a_run_killed_at_any_moment_of_its_start_can_be_resumed_or_started_again() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &kv_suite(2));
    for attempt in 0..60u64 {
        let id = format!("r{attempt}");
        let dir = sb.path().join("results").join(&id);
        let mut child = sb
            .command()
            .args(["eval", "s.yaml", "--model", "mock", "--run-id", &id, "--out", "results", "-q"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        if attempt % 2 == 0 {
            // The moment its folder appears.
            while !dir.exists() && child.try_wait().unwrap().is_none() {}
        } else {
            // At a different moment each time, from before it reads the suite to after it ends.
            std::thread::sleep(Duration::from_micros(attempt * 300));
        }
        let _ = child.kill();
        child.wait().unwrap();
        let again = if dir.exists() {
            let log = dir.join("events.jsonl");
            let first = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(
                first.starts_with("{") && first.contains("\"type\":\"run_started\""),
                "attempt {attempt}: a run folder without its first event: {first:?}"
            );
            sb.run(&["eval", "s.yaml", "--model", "mock", "--resume", &id, "--out", "results", "-q"])
        } else {
            sb.run(&["eval", "s.yaml", "--model", "mock", "--run-id", &id, "--out", "results", "-q"])
        };
        assert_eq!(again.code, 0, "attempt {attempt}: {again:?}");
    }
}

/// The mode a plain new file gets here: 0666 less the umask.
fn plain_file_mode() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let umask = status.lines().find_map(|l| l.strip_prefix("Umask:")).map(str::trim).unwrap();
    0o666 & !u32::from_str_radix(umask, 8).unwrap()
}

#[test]
fn tables_and_reports_get_the_mode_of_plain_files() {
    use std::os::unix::fs::PermissionsExt as _;
    let sb = Sandbox::new();
    sb.write("s.yaml", &kv_suite(2));
    assert_eq!(sb.eval(&["s.yaml"]).code, 0);
    assert_eq!(sb.run(&["report", "results/test", "--html"]).code, 0);
    let dir = sb.path().join("results/test");
    for name in ["events.jsonl", "run.json", "episodes.csv", "episodes.parquet", "summary.json", "report.html"] {
        let mode = std::fs::metadata(dir.join(name)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, plain_file_mode(), "{name} has mode {mode:o}: others cannot read it");
    }
}

#[test]
fn a_cassette_cut_mid_write_replays_and_records_on() {
    let sb = Sandbox::new();
    sb.write("s.yaml", &kv_suite(3));
    let rec =
        sb.run(&["eval", "s.yaml", "--model", "mock", "--record", "tape.jsonl", "--run-id", "a", "--out", "results"]);
    assert_eq!(rec.code, 0, "{rec:?}");
    let whole = std::fs::read_to_string(sb.path().join("tape.jsonl")).unwrap();
    sb.write("tape.jsonl", &format!("{whole}{{\"model\":\"mock\",\"digest\":\"ab"));
    let replay = sb.run(&["eval", "s.yaml", "--model", "replay:tape.jsonl", "--run-id", "b", "--out", "results"]);
    assert_eq!(replay.code, 0, "a torn last entry is left out: {replay:?}");
    let again =
        sb.run(&["eval", "s.yaml", "--model", "mock", "--record", "tape.jsonl", "--run-id", "c", "--out", "results"]);
    assert_eq!(again.code, 0, "{again:?}");
    let text = std::fs::read_to_string(sb.path().join("tape.jsonl")).unwrap();
    assert!(text.ends_with('\n') && text.starts_with(&whole), "recording goes on after the last whole entry");
    for (i, line) in text.lines().enumerate() {
        assert!(serde_json::from_str::<serde_json::Value>(line).is_ok(), "line {} is not whole: {line}", i + 1);
    }
}
