//! One worker process: an interpreter running the language's driver (`driver.py`,
//! `driver.js`) inside the sandbox, spoken to in JSON lines.
//!
//! Its sandbox lets it read the system's folders, its interpreter's installation, the
//! scorer's own file and its *view*, a folder of its own into which the runner moves the
//! episode's working directory for the length of a call (`Workers::call`): a worker that
//! served one episode cannot read the next one's files, nor any other episode's. It writes
//! nothing, opens no socket, and gets a cleared environment.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout, Command};

use super::WorkerKey;
use crate::domain::scorer::Language;
use crate::sandbox::process::{self, SAFE_PATH, Supervised};
use crate::sandbox::{Confinement, ProcessLimits, SandboxMode, SandboxSpec};

const PYTHON_DRIVER: &str = include_str!("driver.py");
const JS_DRIVER: &str = include_str!("driver.js");

/// How long an interpreter may take to start and load the scorer's file.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest answer read: a verdict is small.
const ANSWER_LIMIT: u64 = 4 << 20;

/// How much of the worker's stderr is kept, for a crash's explanation.
const STDERR_KEPT: usize = 2000;

/// A running worker.
pub(super) struct Worker {
    process: Supervised,
    /// Held as long as the worker runs: its pids cgroup, when it has one, kills every
    /// process in it when dropped.
    sandbox: Arc<Confinement>,
    requests: ChildStdin,
    answers: BufReader<ChildStdout>,
    /// The last of what it wrote on stderr.
    stderr: Arc<Mutex<String>>,
    /// The task that keeps it, which ends when the worker does.
    stderr_read: Option<tokio::task::JoinHandle<()>>,
    pub view: tempfile::TempDir,
    next_id: u64,
}

/// Why a worker did not start.
pub(super) enum Unstarted {
    /// Loading the scorer's file raised (the traceback's last lines): it would again.
    Raised(String),
    Failed(String),
}

/// Why a call got no answer.
pub(super) enum Broken {
    /// The worker exited or broke the protocol: it is dropped, a new one starts next time.
    Crashed(String),
    /// It did not answer in time: it is killed, a new one starts next time.
    TimedOut,
}

impl Worker {
    /// Starts a worker for `key` with a new view under `views`; `Err` says why it could not
    /// start, or what loading the scorer's file raised.
    pub async fn start(key: &WorkerKey, views: &Path) -> Result<Worker, Unstarted> {
        let view = tempfile::Builder::new()
            .prefix("view-")
            .tempdir_in(views)
            .map_err(|e| Unstarted::Failed(format!("failed to make the worker's folder: {e}")))?;
        let (program, mut readable) = interpreter(key).await.map_err(Unstarted::Failed)?;
        readable.push(view.path().to_path_buf());
        readable.extend(key.file.iter().cloned());
        // A worker lives as long as the run: its CPU seconds are not limited, its calls are.
        let spec =
            SandboxSpec { limits: ProcessLimits { cpu_s: None, ..ProcessLimits::default() }, ..Default::default() };
        let mode = if key.sandboxed { SandboxMode::On } else { SandboxMode::Off("the suite or the command line") };
        let sandbox = Confinement::prepare(&spec, mode, &[], &readable).map_err(Unstarted::Failed)?;
        let file = key.file.as_deref().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        let mut command = Command::new(&program);
        match key.language {
            // -E: no PYTHON* variables; -s: no user site-packages; -B: no .pyc files written.
            Language::Python => command.args(["-E", "-s", "-B", "-c", PYTHON_DRIVER]),
            Language::Js => command.args(["-e", JS_DRIVER]),
        };
        command
            .arg(&file)
            .current_dir(view.path())
            .env_clear()
            .env("PATH", SAFE_PATH)
            .env("LANG", "C.UTF-8")
            .env("HOME", view.path());
        let mut process = process::spawn(&command, process::Input::Piped, &sandbox)
            .map_err(|e| Unstarted::Failed(format!("failed to start `{}`: {e}", program.display())))?;
        let (Some(requests), Some(answers), Some(stderr_pipe)) =
            (process.keeper.stdin.take(), process.keeper.stdout.take(), process.keeper.stderr.take())
        else {
            return Err(Unstarted::Failed("the worker's pipes were not set up".into()));
        };
        let stderr = Arc::new(Mutex::new(String::new()));
        let stderr_read = Some(tokio::spawn(keep_tail(stderr_pipe, stderr.clone())));
        let mut worker = Worker {
            process,
            sandbox,
            requests,
            answers: BufReader::new(answers),
            stderr,
            stderr_read,
            view,
            next_id: 1,
        };
        match tokio::time::timeout(START_TIMEOUT, worker.read_answer()).await {
            Ok(Ok(hello)) if hello["ready"] == true => Ok(worker),
            Ok(Ok(hello)) => {
                let raised = hello["error"].as_str().unwrap_or_default();
                Err(Unstarted::Raised(format!("loading `{file}` raised:\n{raised}")))
            }
            Ok(Err(e)) => {
                Err(Unstarted::Failed(format!("`{}` did not start: {e}{}", program.display(), worker.said().await)))
            }
            Err(_) => Err(Unstarted::Failed(format!(
                "`{}` was not ready within {}s",
                program.display(),
                START_TIMEOUT.as_secs()
            ))),
        }
    }

    /// Sends one request and reads its answer within `limit`.
    pub async fn ask(&mut self, mut request: Value, limit: Duration) -> Result<Value, Broken> {
        let id = self.next_id;
        self.next_id += 1;
        request["id"] = Value::from(id);
        let mut line = request.to_string();
        line.push('\n');
        let exchange = async {
            self.requests
                .write_all(line.as_bytes())
                .await
                .map_err(|e| format!("the request could not be sent ({e})"))?;
            self.requests.flush().await.map_err(|e| format!("the request could not be sent ({e})"))?;
            self.read_answer().await
        };
        match tokio::time::timeout(limit, exchange).await {
            Err(_) => Err(Broken::TimedOut),
            Ok(Err(e)) => Err(Broken::Crashed(format!("{e}{}", self.said().await))),
            Ok(Ok(answer)) if answer["id"] == id => Ok(answer),
            Ok(Ok(_)) => Err(Broken::Crashed(format!("it answered another request than {id}"))),
        }
    }

    async fn read_answer(&mut self) -> Result<Value, String> {
        let mut line = Vec::new();
        let read = (&mut self.answers).take(ANSWER_LIMIT).read_until(b'\n', &mut line).await;
        match read {
            Err(e) => Err(format!("its answer could not be read ({e})")),
            Ok(0) => Err("the worker exited".into()),
            Ok(_) if line.last() != Some(&b'\n') => Err(format!("it sent an answer longer than {ANSWER_LIMIT} bytes")),
            Ok(_) => serde_json::from_slice(&line).map_err(|e| format!("it sent an answer that is not JSON ({e})")),
        }
    }

    /// The end of what the worker wrote on stderr, for an explanation: read to its end when
    /// the worker is gone (within a second).
    async fn said(&mut self) -> String {
        if let Some(reading) = self.stderr_read.take() {
            let _ = tokio::time::timeout(Duration::from_secs(1), reading).await;
        }
        let kept = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        match kept.trim() {
            "" => String::new(),
            text => format!("; its stderr ends: {text}"),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.process.tree.kill();
        self.sandbox.kill_all();
    }
}

/// The interpreter to run and what of its installation the sandbox must let it read.
async fn interpreter(key: &WorkerKey) -> Result<(PathBuf, Vec<PathBuf>), String> {
    match key.language {
        Language::Python => {
            let found = crate::environment::interpreter::find(key.interpreter.as_deref().map(Path::new)).await?;
            Ok((found.executable.clone(), found.readable.clone()))
        }
        Language::Js => {
            let name = key.interpreter.as_deref().unwrap_or("node");
            let path = std::env::var("PATH").unwrap_or_default();
            let program = if name.contains('/') {
                PathBuf::from(name)
            } else {
                process::find_program(name, &path)
                    .ok_or_else(|| format!("found no `{name}` on PATH: install Node.js, or set `interpreter:`"))?
            };
            let real = program.canonicalize().map_err(|e| format!("`{}`: {e}", program.display()))?;
            // An installation of its own (`.../node/bin/node`): its folder and libraries.
            let install = real.parent().and_then(Path::parent).filter(|p| p.parent().is_some());
            Ok((real.clone(), install.map(Path::to_path_buf).into_iter().collect()))
        }
    }
}

/// Keeps the last [`STDERR_KEPT`] bytes of a worker's stderr.
async fn keep_tail(mut pipe: impl tokio::io::AsyncRead + Unpin, kept: Arc<Mutex<String>>) {
    let mut buffer = [0u8; 4096];
    while let Ok(n) = pipe.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        let mut text = kept.lock().unwrap_or_else(|p| p.into_inner());
        text.push_str(&String::from_utf8_lossy(&buffer[..n]));
        if text.len() > 2 * STDERR_KEPT {
            let cut = text.len() - STDERR_KEPT;
            let boundary = (cut..text.len()).find(|i| text.is_char_boundary(*i)).unwrap_or(text.len());
            text.drain(..boundary);
        }
    }
}
