//! What a command costs: `run_command("true")` in a `shell` world, sandboxed and not,
//! one at a time and 64 at once, against a bare `posix_spawn` of `sh -c true` and tokio's
//! `Command` (std's, which starts a program without a `pre_exec` hook that way too, with
//! tokio's handling of its child). Prints the CPU time per command — this process's own and
//! its reaped children's, so the keeper's and the shell's too — and the wall time per
//! command: medians of rounds.
//!
//! The reference is glibc's `posix_spawn`, called directly and waited for with `waitpid`:
//! what a small program pays to start `sh -c true` (the call shares the caller's memory until
//! `execve`, so the caller's size does not count; a small C program doing the same measured
//! about 2% more). Two more lines measure what confinement alone costs, with no runner
//! around it: `sh -c true` started as `posix_spawn` starts it, its child entering a shell world's
//! sandbox before `execve` or not. Their difference is the floor under a sandboxed command's
//! cost. A third starts the same commands from one process that entered the sandbox once:
//! what a command would cost if a world's commands came from a standing confined process.
//! Last, each line's CPU as a multiple of the reference's.
//!
//! `cargo bench --bench commands` (a plain program, not criterion: it measures CPU time);
//! `cargo bench --bench commands -- sandboxed` runs only the reference and the lines whose
//! label holds `sandboxed` (a profile of one kind of command, say).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use runner::contract::Actor;
use runner::domain::Task;
use runner::environment::definition::Definition;
use runner::environment::{Environment, SetupContext, kinds};
use runner::sandbox::{Confinement, SandboxMode, SandboxSpec};

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

/// The line the others are measured against.
const REFERENCE: &str = "C posix_spawn sh -c true, 1 at once";

/// `sh -c true` started by glibc's `posix_spawn` and waited for, one at a time.
fn spawned() {
    let args = [c"sh", c"-c", c"true"];
    let argv =
        [args[0].as_ptr().cast_mut(), args[1].as_ptr().cast_mut(), args[2].as_ptr().cast_mut(), std::ptr::null_mut()];
    let envp = [c"PATH=/usr/bin:/bin".as_ptr().cast_mut(), std::ptr::null_mut()];
    for _ in 0..COMMANDS {
        let mut pid = 0;
        // SAFETY: the program, arguments and environment are NUL-terminated and outlive the call.
        let failed = unsafe {
            libc::posix_spawn(
                &mut pid,
                c"/bin/sh".as_ptr(),
                std::ptr::null(),
                std::ptr::null(),
                argv.as_ptr(),
                envp.as_ptr(),
            )
        };
        assert_eq!(failed, 0, "posix_spawn: {}", std::io::Error::from_raw_os_error(failed));
        let mut status = 0;
        // SAFETY: waits for the child just started.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "sh -c true: status {status}");
    }
}

/// What [`start_and_wait`]'s child is given: all made before it starts, as it may not allocate.
struct Start<'a> {
    confinement: Option<&'a Confinement>,
    argv: [*const libc::c_char; 4],
    envp: [*const libc::c_char; 2],
}

extern "C" fn start_sh(start: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `start` is the `Start` that `start_and_wait` lends for the child's life (it waits, as
    // `CLONE_VFORK` makes it, until the child has called `execve` or exited).
    let start = unsafe { &*(start as *const Start) };
    if let Some(confinement) = start.confinement {
        // SAFETY: this child calls `execve` or exits next.
        if unsafe { confinement.enter() }.is_err() {
            unsafe { libc::_exit(126) };
        }
    }
    unsafe {
        libc::execve(start.argv[0], start.argv.as_ptr(), start.envp.as_ptr());
        libc::_exit(127)
    }
}

impl<'a> Start<'a> {
    /// `/bin/sh -c true` with only `PATH` set, its child entering `confinement` first.
    fn new(confinement: Option<&'a Confinement>) -> Self {
        let args = [c"/bin/sh", c"-c", c"true"];
        Start {
            confinement,
            argv: [args[0].as_ptr(), args[1].as_ptr(), args[2].as_ptr(), std::ptr::null()],
            envp: [c"PATH=/usr/bin:/bin".as_ptr(), std::ptr::null()],
        }
    }
}

/// Starts `start`'s command as glibc's `posix_spawn` starts a program — `clone(CLONE_VM |
/// CLONE_VFORK)`, the child calling `execve` on `stack` — and waits for it: its wait status,
/// or -1 when it could not be started or waited for. System calls only, so that a forked
/// child of this (multi-threaded) process may call it.
///
/// # Safety
/// `stack` is no other thread's, and outlives the child's `execve` (`CLONE_VFORK` returns
/// only then).
unsafe fn start_and_wait(start: &Start, stack: &mut [u128]) -> libc::c_int {
    let top = stack.as_mut_ptr_range().end.cast::<libc::c_void>();
    let arg = start as *const Start as *mut libc::c_void;
    // SAFETY: as the caller promises; `start` is read only.
    unsafe {
        let pid = libc::clone(start_sh, top, libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD, arg);
        let mut status = 0;
        if pid <= 0 || libc::waitpid(pid, &mut status, 0) != pid {
            return -1;
        }
        status
    }
}

/// `sh -c true` started as `posix_spawn` starts it, one at a time, the child entering
/// `confinement` first when there is one.
fn cloned(confinement: Option<&Confinement>) {
    let start = Start::new(confinement);
    let mut stack = vec![0u128; 4096];
    for _ in 0..COMMANDS {
        // SAFETY: the stack is this loop's alone.
        let status = unsafe { start_and_wait(&start, &mut stack) };
        assert_eq!(status, 0, "sh -c true: status {status} ({})", std::io::Error::last_os_error());
    }
}

/// `sh -c true` started as [`cloned`] starts it, 640 times, by one process that entered
/// `confinement` once: what a command would cost if each world's commands came from a
/// standing process confined for the world, with no keeper and no runner around it.
fn from_confined(confinement: &Confinement) {
    let start = Start::new(None);
    let mut stack = vec![0u128; 4096];
    // SAFETY: the child makes only system calls on what was made above (no allocation, no
    // lock: this process has other threads) and exits.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        // SAFETY: as above; the stack is the child's copy, used by one command at a time.
        unsafe {
            if confinement.enter().is_err() {
                libc::_exit(126);
            }
            for _ in 0..COMMANDS {
                if start_and_wait(&start, &mut stack) != 0 {
                    libc::_exit(1);
                }
            }
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waits for the child just started.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the confined process: status {status}");
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
    println!("{:<52} {:>12} {:>12}", "per command", "CPU µs", "wall µs");
    // Each line's label and CPU, for the multiples printed last.
    let mut lines: Vec<(String, f64)> = Vec::new();
    let mut print = |label: &str, (cpu, wall): (f64, f64)| {
        println!("{label:<52} {cpu:>12.1} {wall:>12.1}");
        lines.push((label.to_owned(), cpu));
    };
    // Measured whichever lines are picked: the multiples are against it.
    let reference = measure(spawned);
    print(REFERENCE, reference);
    for lanes in [1, AT_ONCE] {
        let label = format!("tokio Command sh -c true, {lanes} at once");
        if wanted(&label) {
            print(&label, measure(|| bare(&runtime, lanes)));
        }
    }
    let label = "clone sh -c true, 1 at once";
    if wanted(label) {
        print(label, measure(|| cloned(None)));
    }
    let [entering, entered] =
        ["clone sh -c true confined, 1 at once", "clone sh -c true from a confined process, 1 at once"];
    if wanted(entering) || wanted(entered) {
        let folder = dir.path().join("confined");
        std::fs::create_dir(&folder).expect("a folder");
        let confinement = Confinement::prepare(&SandboxSpec::default(), SandboxMode::On, &[folder.as_path()], &[])
            .expect("a sandbox on this machine");
        confinement.hand_over();
        if wanted(entering) {
            print(entering, measure(|| cloned(Some(&confinement))));
        }
        if wanted(entered) {
            print(entered, measure(|| from_confined(&confinement)));
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
                print(&line, measure(|| commands(&runtime, &worlds, lanes)));
            }
        }
        for env in worlds {
            if let Ok(env) = Arc::try_unwrap(env) {
                runtime.block_on(env.teardown());
            }
        }
    }
    println!("\nCPU as a multiple of `{REFERENCE}`");
    for (label, cpu) in &lines {
        println!("{label:<52} {:>12.2}", cpu / reference.0);
    }
}
