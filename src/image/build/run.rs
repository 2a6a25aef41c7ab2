//! A `RUN` step's process: started in the image being built (a root of its layers) as the
//! image's user, in its working folder, with its variables and the network, and stopped at
//! the build's deadline. Its output goes to the build log and its last lines are kept.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tokio::io::AsyncReadExt;

use crate::sandbox::process::{self, Input};
use crate::sandbox::root::{IdMap, Root};
use crate::sandbox::{Confinement, ProcessLimits, SandboxSpec};

/// How many of the last lines of a failed step's output its error shows.
pub const TAIL_LINES: usize = 30;

/// What a `RUN` runs, and as whom.
pub struct RunCommand {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub workdir: PathBuf,
    pub user: (u32, u32),
}

/// How a step's process ended, when not with status 0.
#[derive(Debug)]
pub enum Ended {
    Failed { status: String, tail: String },
    TimedOut { tail: String },
    NotStarted(String),
}

/// Runs `command` in `root`, appending its output to `log`; `Ok` when it exits with 0.
pub async fn run(
    root: Arc<Root>,
    ids: Arc<IdMap>,
    command: &RunCommand,
    deadline: Instant,
    log: &mut (dyn Write + Send),
) -> Result<(), Ended> {
    // Builds install packages: no limit on CPU time, memory or file size; enough processes
    // for a compiler's jobs.
    let limits =
        ProcessLimits { cpu_s: None, memory_mb: None, processes: Some(4096), file_size_mb: None, open_files: None };
    let spec = SandboxSpec { network: true, limits, ..SandboxSpec::default() };
    let sandbox = Confinement::prepare_in_root(&spec, root, ids, command.user).map_err(Ended::NotStarted)?;
    let Some(program) = command.argv.first() else {
        return Err(Ended::NotStarted("an empty command".into()));
    };
    let mut spawned = tokio::process::Command::new(program);
    spawned.args(&command.argv[1..]).current_dir(&command.workdir).env_clear().envs(&command.env);
    let mut started = process::spawn(&spawned, Input::Null, &sandbox)
        .map_err(|e| Ended::NotStarted(format!("failed to start `{program}`: {e}")))?;
    let (Some(mut stdout), Some(mut stderr)) = (started.keeper.stdout.take(), started.keeper.stderr.take()) else {
        return Err(Ended::NotStarted("the command's output was not captured".into()));
    };
    let mut output = Output { log, tail: Vec::new(), failed_log: None };
    let work = async {
        let (mut out_buf, mut err_buf) = (vec![0u8; 16 * 1024], vec![0u8; 16 * 1024]);
        let (mut out_open, mut err_open) = (true, true);
        while out_open || err_open {
            tokio::select! {
                n = stdout.read(&mut out_buf), if out_open => match n {
                    Ok(0) | Err(_) => out_open = false,
                    Ok(n) => output.take(&out_buf[..n]),
                },
                n = stderr.read(&mut err_buf), if err_open => match n {
                    Ok(0) | Err(_) => err_open = false,
                    Ok(n) => output.take(&err_buf[..n]),
                },
            }
        }
        started.shell_status().await
    };
    let status = tokio::time::timeout_at(deadline.into(), work).await;
    started.tree.kill();
    if let Some(e) = output.failed_log {
        return Err(Ended::NotStarted(format!("failed to write the build log: {e}")));
    }
    let tail = output.tail();
    match status {
        Err(_) => Err(Ended::TimedOut { tail }),
        Ok(Some(status)) if status.success() => Ok(()),
        Ok(Some(status)) => Err(Ended::Failed { status: describe(status), tail }),
        Ok(None) => Err(Ended::Failed { status: "killed before it exited".into(), tail }),
    }
}

fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => format!("{status}"),
    }
}

/// A step's output as it comes: all of it to the log, its end kept.
struct Output<'a> {
    log: &'a mut (dyn Write + Send),
    tail: Vec<u8>,
    failed_log: Option<std::io::Error>,
}

impl Output<'_> {
    /// How much of the output's end is kept, in bytes: enough for the last lines.
    const KEEP: usize = 64 * 1024;

    fn take(&mut self, bytes: &[u8]) {
        if self.failed_log.is_none()
            && let Err(e) = self.log.write_all(bytes)
        {
            self.failed_log = Some(e);
        }
        self.tail.extend_from_slice(bytes);
        if self.tail.len() > 2 * Self::KEEP {
            self.tail.drain(..self.tail.len() - Self::KEEP);
        }
    }

    /// The last [`TAIL_LINES`] lines.
    fn tail(&self) -> String {
        let text = String::from_utf8_lossy(&self.tail);
        let lines: Vec<&str> = text.trim_end().lines().collect();
        lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
    }
}
