//! What a command costs: `run_command("true")` in a `shell` world, sandboxed and not,
//! against a bare `posix_spawn` of `sh -c true` (std's `Command` without a `pre_exec` hook
//! starts a program that way), one at a time and 64 at once. Prints the CPU time per
//! command — this process's own and its reaped children's, so the keeper's and the shell's
//! too — and the wall time per command: medians of rounds.
//!
//! `cargo bench --bench commands` (a plain program, not criterion: it measures CPU time);
//! `cargo bench --bench commands -- sandboxed` runs only the lines whose label holds
//! `sandboxed` (a profile of one kind of command, say).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use runner::contract::Actor;
use runner::domain::Task;
use runner::environment::definition::Definition;
use runner::environment::{Environment, SetupContext, kinds};
use runner::sandbox::SandboxMode;

const ROUNDS: usize = 7;
const COMMANDS: usize = 640;
const AT_ONCE: usize = 64;

/// User and system time of this process and of its children that were reaped.
fn cpu() -> Duration {
    let time = |who| {
        // SAFETY: getrusage only fills the struct given.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(who, &mut usage) };
        let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
        tv(usage.ru_utime) + tv(usage.ru_stime)
    };
    time(libc::RUSAGE_SELF) + time(libc::RUSAGE_CHILDREN)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Runs `round` (which starts `COMMANDS` commands) `ROUNDS` times: the median CPU and wall
/// microseconds per command.
fn measure(mut round: impl FnMut()) -> (f64, f64) {
    round();
    let (mut cpus, mut walls) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let (cpu0, wall0) = (cpu(), Instant::now());
        round();
        cpus.push((cpu() - cpu0).as_secs_f64() * 1e6 / COMMANDS as f64);
        walls.push(wall0.elapsed().as_secs_f64() * 1e6 / COMMANDS as f64);
    }
    (median(cpus), median(walls))
}

fn bare(runtime: &tokio::runtime::Runtime, lanes: usize) {
    runtime.block_on(async {
        let tasks: Vec<_> = (0..lanes)
            .map(|_| {
                tokio::spawn(async move {
                    for _ in 0..COMMANDS / lanes {
                        let status = tokio::process::Command::new("sh").args(["-c", "true"]).status().await;
                        assert!(status.expect("sh starts").success());
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("a lane");
        }
    });
}

fn commands(runtime: &tokio::runtime::Runtime, worlds: &[Arc<Environment>], lanes: usize) {
    runtime.block_on(async {
        let tasks: Vec<_> = worlds[..lanes]
            .iter()
            .map(|env| {
                let env = env.clone();
                tokio::spawn(async move {
                    for _ in 0..COMMANDS / lanes {
                        let out = env.world().call(&Actor::Main, "run_command", json!({"command": "true"})).await;
                        assert_eq!(out.expect("`true` runs")["exit_code"], 0);
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("a lane");
        }
    });
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let shell = kinds::find("shell").expect("the shell kind");
    let definition = Arc::new(Definition::builtin(shell));
    let task = Task::new("bench", "go");
    let dir = tempfile::tempdir().expect("temp dir");
    // `cargo bench` passes `--bench`; any other word picks the lines to run.
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let wanted = |label: &str| only.is_empty() || only.iter().any(|w| label.contains(w.as_str()));
    println!("{:<40} {:>12} {:>12}", "per command", "CPU µs", "wall µs");
    for lanes in [1, AT_ONCE] {
        let label = format!("posix_spawn sh -c true, {lanes} at once");
        if wanted(&label) {
            let (cpu, wall) = measure(|| bare(&runtime, lanes));
            println!("{label:<40} {cpu:>12.1} {wall:>12.1}");
        }
    }
    for (label, mode) in [("sandboxed", SandboxMode::On), ("unsandboxed", SandboxMode::Off("the bench"))] {
        if ![1, AT_ONCE].iter().any(|lanes| wanted(&format!("run_command true {label}, {lanes} at once"))) {
            continue;
        }
        let context = SetupContext { sandbox: mode, ..SetupContext::new(dir.path(), "bench") };
        let worlds: Vec<Arc<Environment>> = (0..AT_ONCE)
            .map(|_| {
                let env = runtime.block_on(Environment::setup(definition.clone(), &task, &context));
                Arc::new(env.expect("a shell world"))
            })
            .collect();
        for lanes in [1, AT_ONCE] {
            let line = format!("run_command true {label}, {lanes} at once");
            if wanted(&line) {
                let (cpu, wall) = measure(|| commands(&runtime, &worlds, lanes));
                println!("{line:<40} {cpu:>12.1} {wall:>12.1}");
            }
        }
        for env in worlds {
            if let Ok(env) = Arc::try_unwrap(env) {
                runtime.block_on(env.teardown());
            }
        }
    }
}
