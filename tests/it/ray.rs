//! Shards on a real Ray cluster: `examples/ray/driver.py` against a local Ray head (from
//! PyPI, on 127.0.0.1), one shard's `runner` killed mid-run and run again by Ray, resumed;
//! the merged run compared with an unsharded one. Opt-in with `RUNNER_RAY_TEST=1` (`.ci/run`
//! sets it after `scripts/install-test-servers.sh` put `ray` in a venv of its cache).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::shards::differences;
use crate::{of_type, read_jsonl};

const OPT_IN: &str = "RUNNER_RAY_TEST";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The venv `scripts/install-test-servers.sh` installs `ray` into.
fn venv() -> PathBuf {
    let cache = std::env::var_os("RUNNER_TEST_SERVERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/runner-test-servers"));
    cache.join("ray-venv/bin")
}

/// A Ray head on 127.0.0.1, stopped when dropped — also when a test fails.
struct Head {
    port: u16,
    temp: PathBuf,
}

impl Head {
    fn start(temp: PathBuf) -> Head {
        let port = free_port();
        let out = Command::new(venv().join("ray"))
            .args(["start", "--head", "--node-ip-address=127.0.0.1", "--num-cpus=4", "--disable-usage-stats"])
            .arg(format!("--port={port}"))
            .arg("--include-dashboard=false")
            .arg(format!("--temp-dir={}", temp.display()))
            .output()
            .expect("run ray start");
        assert!(out.status.success(), "ray start: {}", String::from_utf8_lossy(&out.stderr));
        Head { port, temp }
    }

    fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Head {
    fn drop(&mut self) {
        let stopped = Command::new(venv().join("ray")).args(["stop", "--force"]).output();
        if !matches!(&stopped, Ok(o) if o.status.success()) {
            eprintln!("the Ray head on port {} did not stop: {stopped:?}", self.port);
        }
        let _ = std::fs::remove_dir_all(&self.temp);
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

/// A suite of `n` `kv` tasks, each a tool call and an answer; every fifth answers wrongly.
fn suite(n: usize) -> String {
    let tasks: String = (0..n)
        .map(|i| {
            let answer = if i % 5 == 4 { "no" } else { "ok" };
            format!("  - {{id: t{i:02}, input: q{i}, mock: [{{tool_calls: [{{name: get, arguments: {{key: k}}}}]}}, {{text: \"{answer}\"}}]}}\n")
        })
        .collect();
    format!("suite: ray\nenvironment: kv\nscorers: [{{equals: ok}}]\ntasks:\n{tasks}")
}

/// The process whose command line holds every one of `parts`, when there is one.
fn process_with(parts: &[&str]) -> Option<i32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<String> = cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        if parts.iter().all(|p| args.iter().any(|a| a == p)) {
            return Some(pid);
        }
    }
    None
}

fn finished(events: &Path) -> usize {
    std::fs::read_to_string(events).map(|t| t.matches("\"type\":\"episode_finished\"").count()).unwrap_or(0)
}

fn shown(out: &Output) -> String {
    format!(
        "exit {:?}\n{}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn shards_on_ray_survive_a_killed_shard_and_merge_into_the_unsharded_run() {
    if std::env::var_os(OPT_IN).is_none() {
        eprintln!("skipped: set {OPT_IN}=1 to start a local Ray head (ray from PyPI) and run examples/ray/ on it");
        return;
    }
    let runner = env!("CARGO_BIN_EXE_runner");
    let tmp = tempfile::tempdir().expect("temp dir");
    let dir = tmp.path();
    std::fs::write(dir.join("s.yaml"), suite(40)).expect("write the suite");
    let eval = ["s.yaml", "--model", "mock", "-j", "1", "--mock-delay-ms", "100"];
    let whole = Command::new(runner)
        .current_dir(dir)
        .arg("eval")
        .args(eval)
        .args(["--out", "results", "--run-id", "whole", "-q"])
        .output()
        .expect("run runner");
    assert!(whole.status.success(), "the unsharded run: {}", shown(&whole));

    // Ray's sockets live under its temp folder, whose path must stay short.
    let head = Head::start(PathBuf::from(format!("/tmp/ray-{}", std::process::id())));
    let driver = Command::new(venv().join("python3"))
        .current_dir(dir)
        .arg(repo().join("examples/ray/driver.py"))
        .args(["--address", &head.address(), "--shards", "4", "--out", "results", "--run-name", "night"])
        .args(["--runner", runner, "--"])
        .args(eval)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the driver");

    // Shard 2's runner, killed once it has finished an episode and before it is done.
    let shard = dir.join("results/night/shard-2");
    let started = Instant::now();
    let killed = loop {
        assert!(started.elapsed() < Duration::from_secs(120), "shard 2 never ran an episode");
        if finished(&shard.join("events.jsonl")) >= 1
            && let Some(pid) = process_with(&["eval", "--shard", "2/4", "--run-id", "shard-2"])
        {
            // SAFETY: a signal to a process this test's driver started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            break pid;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = driver.wait_with_output().expect("the driver ends");
    assert!(out.status.success(), "driver (shard 2's runner {killed} killed): {}", shown(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("shard 2/4: done, exit 0 (resumed after a retry)"), "{}", shown(&out));

    // Ray ran it again, and the attempt resumed the killed one's log.
    let events = read_jsonl(&shard.join("events.jsonl"));
    assert_eq!(of_type(&events, "run_resumed").len(), 1, "shard 2 was resumed once");
    let merged = dir.join("results/night/merged");
    assert_eq!(differences(&dir.join("results/whole"), &merged), None);
    let compare =
        Command::new(runner).current_dir(dir).args(["compare", "results/whole"]).arg(&merged).output().unwrap();
    assert!(compare.status.success(), "{}", shown(&compare));
    assert!(String::from_utf8_lossy(&compare.stdout).contains("(0 worse, 0 better)"), "{}", shown(&compare));

    // A shard whose process dies at every attempt: named, and nothing merged...
    let dying = dir.join("dying-runner");
    std::fs::write(
        &dying,
        format!("#!/bin/sh\ncase \"$*\" in *\"--shard 2/4\"*) kill -9 $$ ;; esac\nexec {runner} \"$@\"\n"),
    )
    .unwrap();
    std::fs::set_permissions(&dying, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let twice = |extra: &[&str]| {
        Command::new(venv().join("python3"))
            .current_dir(dir)
            .arg(repo().join("examples/ray/driver.py"))
            .args(["--address", &head.address(), "--shards", "4", "--out", "results", "--run-name", "dies"])
            .args(["--max-retries", "1", "--runner"])
            .arg(&dying)
            .args(extra)
            .arg("--")
            .args(eval)
            .output()
            .expect("run the driver")
    };
    let failed = twice(&[]);
    assert_eq!(failed.status.code(), Some(1), "{}", shown(&failed));
    let said = String::from_utf8_lossy(&failed.stderr);
    assert!(said.contains("shard 2/4: failed after 2 attempt(s): shard 2/4: runner was killed by SIGKILL"), "{said}");
    assert!(said.contains("nothing merged"), "{said}");
    assert!(!dir.join("results/dies/merged").exists(), "nothing was merged");
    // ...and with --allow-partial, the others merged, the missing shard said.
    let partial = twice(&["--allow-partial"]);
    let said = String::from_utf8_lossy(&partial.stderr);
    assert!(said.contains("warning: shard(s) 2/4 missing from the merge"), "{}", shown(&partial));
    let merged = read_jsonl(&dir.join("results/dies/merged/events.jsonl"));
    let whole_episodes = of_type(&read_jsonl(&dir.join("results/whole/events.jsonl")), "episode_finished").len();
    let partial_episodes = of_type(&merged, "episode_finished").len();
    assert!(partial_episodes > 0 && partial_episodes < whole_episodes, "{partial_episodes} of {whole_episodes}");
    drop(head);

    // A cluster that cannot be reached: said, and nothing merged.
    let closed = free_port();
    let unreachable = Command::new(venv().join("python3"))
        .current_dir(dir)
        .arg(repo().join("examples/ray/driver.py"))
        .args(["--address", &format!("127.0.0.1:{closed}"), "--out", "results", "--run-name", "nowhere"])
        .args(["--runner", runner, "--"])
        .args(eval)
        .output()
        .expect("run the driver");
    assert_eq!(unreachable.status.code(), Some(2), "{}", shown(&unreachable));
    let said = String::from_utf8_lossy(&unreachable.stderr);
    assert!(said.contains(&format!("cannot reach the Ray cluster at 127.0.0.1:{closed}")), "{said}");
    assert!(!dir.join("results/nowhere").exists(), "nothing was made");
}
