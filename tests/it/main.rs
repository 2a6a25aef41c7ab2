//! Integration tests through the `runner` binary: one test binary, each test in its own
//! temporary folder.

mod agent_recipes;
mod bad_input;
mod batch;
mod budgets;
mod call_evidence;
mod checkpoints;
mod cli_agent;
mod code_scorers;
mod docs;
mod e2e;
mod epochs;
mod eval;
mod export;
mod external;
mod file_tools;
mod gateway;
mod gateway_golden;
mod harbor;
mod harbor_images;
mod image_build;
mod images;
mod judge_check;
mod kubernetes;
mod layers;
mod lifecycle;
mod local_server;
mod log;
mod mcp;
mod memory;
mod memory_agent;
mod memory_answering;
mod memory_stages;
mod models;
mod noise;
mod output_caps;
mod overrides;
mod permission_paths;
mod permissions;
mod promptfoo;
mod promptfoo_providers;
mod promptfoo_side_by_side;
mod provider_refusals;
mod python_world;
mod races;
mod ray;
mod replay;
mod report;
mod root_power;
mod runs;
mod sampling;
mod sandbox;
mod scoring;
mod scripts;
mod search;
mod secrets;
mod selection;
mod serve;
mod shards;
mod shell;
mod since;
mod slurm;
mod subagents;
mod survival;
mod toolsets;
mod user;
mod variants;
mod view;
mod web;
mod world_hazards;
mod writing;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// An isolated folder to write suites into and run `runner` from.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Sandbox {
    pub fn new() -> Self {
        Sandbox { dir: tempfile::tempdir().expect("temp dir") }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn write(&self, name: &str, content: &str) -> PathBuf {
        let path = self.path().join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("create dir");
        }
        std::fs::write(&path, content).expect("write file");
        path
    }

    pub fn command(&self) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_runner"));
        cmd.current_dir(self.path());
        cmd
    }

    pub fn run(&self, args: &[&str]) -> Run {
        let output = self.command().args(args).output().expect("run runner");
        Run::from(output)
    }

    /// `runner eval` with the mock model into `results/test`.
    pub fn eval(&self, suites: &[&str]) -> Run {
        let mut args = vec!["eval"];
        args.extend_from_slice(suites);
        args.extend_from_slice(&["--model", "mock", "--run-id", "test", "--out", "results"]);
        self.run(&args)
    }

    /// `runner eval s.yaml` with the mock model into `results/test`, interrupted (SIGINT)
    /// once a command of the run has made the file `mark`.
    #[cfg(unix)]
    pub fn eval_interrupted_at(&self, mark: &Path) -> Run {
        let child = self
            .command()
            .args(["eval", "s.yaml", "--model", "mock", "--run-id", "test", "--out", "results"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start runner");
        let started = std::time::Instant::now();
        while !mark.exists() {
            assert!(started.elapsed().as_secs() < 30, "no command of the run made {}", mark.display());
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        // SAFETY: sends SIGINT to the child we spawned.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGINT);
        }
        Run::from(child.wait_with_output().expect("wait for runner"))
    }

    /// The events of the run `eval` made.
    pub fn events(&self) -> Vec<Value> {
        read_jsonl(&self.path().join("results/test/events.jsonl"))
    }
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Self {
        Run {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {}\n--- stdout\n{}\n--- stderr\n{}", self.code, self.stdout, self.stderr)
    }
}

/// Waits up to two seconds for `pid` to be gone, or a zombie about to be reaped (a killed
/// process whose parent has not waited for it yet is dead all the same).
pub fn assert_gone(pid: i32) {
    assert!(std::path::Path::new("/proc/self/stat").exists(), "this check needs /proc");
    let started = std::time::Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().next());
        if !state.is_some_and(|s| s != "Z" && s != "X") {
            return;
        }
        assert!(started.elapsed().as_secs() < 2, "process {pid} still runs: {stat}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Whether a `python3` is on PATH; says so when a test is skipped for want of one.
pub fn have_python() -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join("python3").is_file()));
    if !found {
        eprintln!("skipped: no python3 on PATH");
    }
    found
}

pub fn read_jsonl(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
}

pub fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

/// The observations of tool calls (not the first one after reset).
pub fn tool_observations(events: &[Value]) -> Vec<&Value> {
    of_type(events, "observation").into_iter().map(|e| &e["observation"]).filter(|o| !o["call_id"].is_null()).collect()
}
