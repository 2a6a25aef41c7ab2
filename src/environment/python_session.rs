//! The interpreter behind a `python` world: finding a real `python3` (not a shim that only
//! works outside the sandbox), and one long-lived session of it, spoken to over the
//! driver's line protocol (`python_driver.py`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, ChildStdout, Command};

use crate::environment::process::{self, Supervised};
use crate::environment::sandbox::Confinement;

const DRIVER: &str = include_str!("python_driver.py");

/// What the probe prints: the real interpreter behind whatever was found, and its version.
const PROBE: &str = "import json, sys; print(json.dumps({'executable': sys.executable, \
    'version': sys.version.split()[0], 'release': list(sys.version_info[:2]), \
    'prefix': sys.prefix, 'base_prefix': sys.base_prefix}))";

/// The oldest Python the driver runs on.
const OLDEST: (u32, u32) = (3, 8);

/// How long an interpreter may take to answer the probe, or to start in the sandbox.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A Python interpreter that answered the probe.
#[derive(Debug)]
pub struct Interpreter {
    /// The interpreter itself (`sys.executable`), not a shim or wrapper that found it.
    pub executable: PathBuf,
    pub version: String,
    /// Its installation, which the sandbox must let it read.
    pub readable: Vec<PathBuf>,
}

#[derive(Deserialize)]
struct Probed {
    executable: PathBuf,
    version: String,
    release: (u32, u32),
    prefix: PathBuf,
    base_prefix: PathBuf,
}

/// Finds the interpreter: `configured` (an environment file's `python:`; a bare name is
/// looked up on `PATH`), else the first `python3` on `PATH` that answers. Each candidate
/// is run once, outside the sandbox, to learn where the real interpreter is (a pyenv shim
/// is a script that needs `$HOME`, which the sandbox hides); what was found is kept for
/// the rest of the process.
pub async fn find(configured: Option<&Path>) -> Result<Arc<Interpreter>, String> {
    static FOUND: OnceLock<Mutex<BTreeMap<Option<PathBuf>, Arc<Interpreter>>>> = OnceLock::new();
    let found = FOUND.get_or_init(Default::default);
    let key = configured.map(Path::to_path_buf);
    let known = found.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned();
    if let Some(interpreter) = known {
        return Ok(interpreter);
    }
    let hint = "install Python 3, or set `python: /path/to/python3` in the environment file";
    let (candidates, looked_for) = match configured {
        Some(path) if path.components().count() > 1 => {
            if !path.exists() {
                return Err(format!(
                    "the Python interpreter `{}` (the environment file's `python:`) does not exist",
                    path.display()
                ));
            }
            (vec![path.to_path_buf()], format!("`{}` (the environment file's `python:`)", path.display()))
        }
        Some(name) => (on_path(name), format!("`{}` (the environment file's `python:`) on PATH", name.display())),
        None => (on_path(Path::new("python3")), "`python3` on PATH".to_owned()),
    };
    if candidates.is_empty() {
        return Err(format!("found no {looked_for}: {hint}"));
    }
    let mut failures = Vec::new();
    for candidate in candidates {
        match probe(&candidate).await {
            Ok(interpreter) => {
                let interpreter = Arc::new(interpreter);
                found.lock().unwrap_or_else(|p| p.into_inner()).insert(key, interpreter.clone());
                return Ok(interpreter);
            }
            Err(e) => failures.push(format!("`{}` {e}", candidate.display())),
        }
    }
    Err(format!("no usable {looked_for}: {}; {hint}", failures.join("; ")))
}

/// Every executable file called `name` in the folders of `PATH`, in order.
fn on_path(name: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(name))
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
        .collect()
}

async fn probe(candidate: &Path) -> Result<Interpreter, String> {
    let mut command = Command::new(candidate);
    command
        .args(["-E", "-s", "-c", PROBE])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = match tokio::time::timeout(START_TIMEOUT, command.output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => return Err(format!("could not be run: {e}")),
        Err(_) => return Err(format!("did not answer within {}s", START_TIMEOUT.as_secs())),
    };
    if !output.status.success() {
        let said: String = String::from_utf8_lossy(&output.stderr).trim().chars().take(500).collect();
        return Err(format!("failed ({}): {said}", output.status));
    }
    let probed: Probed =
        serde_json::from_slice(&output.stdout).map_err(|e| format!("is not a Python the runner understands ({e})"))?;
    if probed.release < OLDEST || probed.executable.as_os_str().is_empty() {
        return Err(format!("is Python {}; {}.{} or later is needed", probed.version, OLDEST.0, OLDEST.1));
    }
    let mut readable = Vec::new();
    let real = probed.executable.canonicalize().ok();
    let folder = real.as_deref().and_then(Path::parent).map(Path::to_path_buf);
    let home = std::env::var_os("HOME").map(PathBuf::from).and_then(|h| h.canonicalize().ok());
    for path in [Some(probed.prefix), Some(probed.base_prefix), folder].into_iter().flatten() {
        // The whole file system is never opened up for an interpreter installed at `/`,
        // nor a home folder (keys, tokens) for one installed right in it.
        if home.as_ref().is_some_and(|h| h.starts_with(&path)) {
            return Err(format!(
                "is installed in `{}`, which holds the home folder: the sandbox would have to open it all; \
                 install it elsewhere or set `python:` to another interpreter",
                path.display()
            ));
        }
        if path.parent().is_some() && !readable.contains(&path) {
            readable.push(path);
        }
    }
    Ok(Interpreter { executable: probed.executable, version: probed.version, readable })
}

/// Where a session runs: its working directory and its temp dir (which holds the files
/// that capture its output).
pub struct Folders<'a> {
    pub work: &'a Path,
    pub tmp: &'a Path,
}

/// One running interpreter and the pipes to its driver.
pub struct Session {
    process: Supervised,
    requests: ChildStdin,
    answers: BufReader<ChildStdout>,
    next_id: u64,
    /// The longest answer read: the driver caps what it sends, so anything longer means
    /// the protocol broke.
    answer_limit: u64,
}

impl Session {
    /// Starts the interpreter in `sandbox` and waits for its driver to say it is ready.
    pub async fn start(
        interpreter: &Interpreter,
        folders: &Folders<'_>,
        sandbox: &Arc<Confinement>,
        cap: usize,
    ) -> Result<Session, String> {
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
            .env("LANG", "C.UTF-8")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut process = process::spawn(&mut command, sandbox)
            .map_err(|e| format!("failed to start `{}`: {e}", interpreter.executable.display()))?;
        let (Some(requests), Some(answers), Some(mut stderr)) =
            (process.keeper.stdin.take(), process.keeper.stdout.take(), process.keeper.stderr.take())
        else {
            return Err("the interpreter's pipes were not set up".into());
        };
        let answer_limit = 16 * cap as u64 + (1 << 20);
        let mut session = Session { process, requests, answers: BufReader::new(answers), next_id: 1, answer_limit };
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
    pub async fn ask(&mut self, mut request: Value) -> Result<Value, String> {
        let id = self.next_id;
        self.next_id += 1;
        request["id"] = json!(id);
        let mut line = request.to_string();
        line.push('\n');
        let sent = async {
            self.requests.write_all(line.as_bytes()).await?;
            self.requests.flush().await
        };
        sent.await.map_err(|e| format!("the request could not be sent ({e})"))?;
        let answer = self.read_answer().await?;
        if answer["id"] != json!(id) {
            return Err(format!("it answered another request than {id}"));
        }
        Ok(answer)
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
        let status = tokio::time::timeout(Duration::from_secs(2), self.process.shell_status()).await.ok().flatten();
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
