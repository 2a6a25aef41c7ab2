//! One long-lived session of the interpreter behind a `python` world (found by
//! `environment/interpreter.rs`), spoken to over the driver's line protocol (`driver.py`).

use std::path::Path;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout, Command};

use crate::environment::interpreter::Interpreter;
use crate::sandbox::Confinement;
use crate::sandbox::process::{self, Supervised};

const DRIVER: &str = include_str!("driver.py");

/// How long an interpreter may take to start in the sandbox.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a session runs: its working directory and its temp dir (which holds the files
/// that capture its output).
pub struct Folders<'a> {
    pub work: &'a Path,
    pub tmp: &'a Path,
}

/// One running interpreter and the pipes to its driver.
pub struct PythonSession {
    process: Supervised,
    requests: ChildStdin,
    answers: BufReader<ChildStdout>,
    next_id: u64,
    /// The longest answer read: the driver caps what it sends, so anything longer means
    /// the protocol broke.
    answer_limit: u64,
    /// How the interpreter ended, once [`PythonSession::gone`] found it so.
    exited: Option<ExitStatus>,
}

/// Why a request got no answer.
pub enum NoAnswer {
    /// The interpreter was gone before the request reached it: it died since the last call.
    Gone(String),
    /// It died while answering, or broke the protocol.
    Broke(String),
}

impl PythonSession {
    /// Starts the interpreter in `sandbox` and waits for its driver to say it is ready.
    pub async fn start(
        interpreter: &Interpreter,
        folders: &Folders<'_>,
        sandbox: &Arc<Confinement>,
        cap: usize,
    ) -> Result<PythonSession, String> {
        let mut command = Command::new(&interpreter.executable);
        // -E: no PYTHON* variables; -s: no user site-packages; -B: no .pyc files written.
        command
            .args(["-E", "-s", "-B", "-c", DRIVER])
            .arg(folders.tmp.join(".python-stdout"))
            .arg(folders.tmp.join(".python-stderr"))
            .arg(cap.to_string())
            .current_dir(folders.work)
            .env_clear()
            .env("PATH", super::SAFE_PATH)
            .env("HOME", folders.work)
            .env("TMPDIR", folders.tmp)
            .env("LANG", "C.UTF-8");
        let mut process = process::spawn(&command, process::Input::Piped, sandbox)
            .map_err(|e| format!("failed to start `{}`: {e}", interpreter.executable.display()))?;
        let (Some(requests), Some(answers), Some(mut stderr)) =
            (process.keeper.stdin.take(), process.keeper.stdout.take(), process.keeper.stderr.take())
        else {
            return Err("the interpreter's pipes were not set up".into());
        };
        let answer_limit = 16 * cap as u64 + (1 << 20);
        let mut session = PythonSession {
            process,
            requests,
            answers: BufReader::new(answers),
            next_id: 1,
            answer_limit,
            exited: None,
        };
        let ready = tokio::time::timeout(START_TIMEOUT, session.read_answer()).await;
        match ready {
            Ok(Ok(hello)) if hello["ready"] == true => Ok(session),
            failed => {
                let why = match failed {
                    Ok(Ok(hello)) => format!("its driver said {hello}"),
                    Ok(Err(e)) => e,
                    Err(_) => format!("it was not ready within {}s", START_TIMEOUT.as_secs()),
                };
                session.kill().await;
                // What the interpreter said before it stopped (its driver moves stderr away
                // once it runs, so this is only ever startup errors).
                let mut said = Vec::new();
                let _ =
                    tokio::time::timeout(Duration::from_secs(1), (&mut stderr).take(2000).read_to_end(&mut said)).await;
                let said = String::from_utf8_lossy(&said);
                Err(format!(
                    "the interpreter `{}` did not start: {why}{}{}",
                    interpreter.executable.display(),
                    if said.trim().is_empty() { "" } else { "; it said: " },
                    said.trim()
                ))
            }
        }
    }

    /// Sends one request (an object with `op`) and returns the driver's answer; an error
    /// when the interpreter died or the protocol broke, after which the session is useless.
    pub async fn ask(&mut self, mut request: Value) -> Result<Value, NoAnswer> {
        let id = self.next_id;
        self.next_id += 1;
        request["id"] = json!(id);
        let mut line = request.to_string();
        line.push('\n');
        let sent = async {
            self.requests.write_all(line.as_bytes()).await?;
            self.requests.flush().await
        };
        // Nobody reads the requests any more: the interpreter was gone already.
        sent.await.map_err(|e| NoAnswer::Gone(format!("the request could not be sent ({e})")))?;
        let answer = self.read_answer().await.map_err(NoAnswer::Broke)?;
        if answer["id"] != json!(id) {
            return Err(NoAnswer::Broke(format!("it answered another request than {id}")));
        }
        Ok(answer)
    }

    /// How the interpreter ended, when it has ended already (between calls: killed from
    /// outside, or by a thread of its own), without waiting.
    pub fn gone(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.process.shell_status().now_or_never().flatten();
        }
        self.exited
    }

    async fn read_answer(&mut self) -> Result<Value, String> {
        let mut line = Vec::new();
        let limit = self.answer_limit;
        let read = (&mut self.answers).take(limit).read_until(b'\n', &mut line).await;
        match read {
            Err(e) => Err(format!("its answer could not be read ({e})")),
            Ok(0) => Err("it exited".into()),
            Ok(_) if line.last() != Some(&b'\n') => Err(format!("it sent an answer longer than {limit} bytes")),
            Ok(_) => serde_json::from_slice(&line).map_err(|e| format!("it sent an answer that is not JSON ({e})")),
        }
    }

    /// Ends a session whose interpreter died or broke the protocol; how it ended, when
    /// the interpreter itself exited.
    pub async fn ended(mut self) -> Option<ExitStatus> {
        let status = match self.exited {
            Some(status) => Some(status),
            None => tokio::time::timeout(Duration::from_secs(2), self.process.shell_status()).await.ok().flatten(),
        };
        self.kill().await;
        status
    }

    /// Kills the interpreter and everything it started.
    pub async fn kill(&mut self) {
        self.process.tree.kill();
        // The keeper was killed with the tree: reap it now rather than in the background.
        let _ = self.process.keeper.wait().await;
    }
}
