//! Programmatic tool calling (`execute_code`): the agent sends a Python script; the script
//! calls the environment's tools as functions of a generated `runner_tools` module, and
//! only what it prints comes back. Each script runs in a fresh interpreter, in the sandbox,
//! in a folder of its own. Each tool function sends one request over a Unix socket the
//! runner hands the interpreter as descriptor 3 (newline-delimited JSON, one request and
//! one response per call), and the runner runs the call through the same permission check,
//! validation and world as a call of the agent's own ([`Environment::permit`],
//! [`Environment::execute`]). Each inner call is logged (`inner_call`, with the script's
//! call as its parent); none enters the agent's transcript.
//!
//! Never offered to scripts: `execute_code` itself, `final_answer`, and every tool the
//! environment marks as not safe for scripts (those that talk to a user).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use super::tool::ToolDecl;
use super::{Environment, SetupError};
use crate::contract::fit::fit;
use crate::contract::{CallFault, ErrorType, FINAL_TOOL, Observation, ToolCall, ToolError, ToolSpec};
use crate::log::{Event, Recorder};
use crate::sandbox::Confinement;
use crate::sandbox::process::{self, Captured, SAFE_PATH, read_capped};

/// The tool's name.
pub const SCRIPT_TOOL: &str = "execute_code";

/// An environment's `execute_code:` settings (`true` takes these defaults).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScriptSettings {
    /// Tool calls one script may make; further calls get an error result.
    pub max_calls: u32,
    /// How long a script may run: then SIGTERM, and SIGKILL 5 s later.
    pub timeout_s: f64,
    pub stdout_bytes: usize,
    pub stderr_bytes: usize,
    /// The interpreter; by default `python3` on the system's `PATH`.
    pub python: Option<PathBuf>,
}

impl Default for ScriptSettings {
    fn default() -> Self {
        ScriptSettings { max_calls: 50, timeout_s: 120.0, stdout_bytes: 50_000, stderr_bytes: 10_000, python: None }
    }
}

/// The longest request line a script may send.
const MAX_REQUEST_BYTES: u64 = 16 << 20;

/// How long a script has to end after SIGTERM.
const GRACE: Duration = Duration::from_secs(5);

/// Whether a script may call the tool `name`: never itself nor the final answer, and only
/// tools the environment marks safe for scripts.
fn callable_from_scripts(name: &str, script_safe: bool) -> bool {
    script_safe && name != SCRIPT_TOOL && name != FINAL_TOOL
}

/// The `execute_code` tool of an environment whose tools are `offered`: its description
/// names the functions a script can call.
pub fn tool_decl(offered: &[ToolDecl]) -> ToolDecl {
    let callable: Vec<String> = offered
        .iter()
        .filter(|t| callable_from_scripts(&t.spec.name, t.script_safe))
        .map(|t| format!("{}({})", t.spec.name, parameter_list(&t.spec.parameters).unwrap_or("**arguments".into())))
        .collect();
    let description = format!(
        "Run a Python 3 script that calls tools as functions and prints what you need: only its output comes \
         back. The tool functions are in scope (and in the module `runner_tools`): {}. Each returns the tool's \
         result (parsed JSON) or raises `ToolError` (with `.type` and `.message`). At most a fixed number of tool \
         calls and seconds per script; no network.",
        if callable.is_empty() { "none".to_owned() } else { callable.join(", ") }
    );
    ToolDecl {
        spec: ToolSpec::new(
            SCRIPT_TOOL,
            &description,
            json!({
                "type": "object",
                "properties": {"code": {"type": "string", "minLength": 1, "description": "The Python script."}},
                "required": ["code"], "additionalProperties": false
            }),
        ),
        script_safe: false,
    }
}

/// A Python parameter list for a tool's JSON Schema: required parameters first, then the
/// optional ones defaulting to "not given"; `None` when a name cannot be a Python parameter.
fn parameter_list(schema: &Value) -> Option<String> {
    let properties = schema.get("properties")?.as_object()?;
    let required: Vec<&str> =
        schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
    // Names with a leading underscore would shadow the module's own (`_call`, `_MISSING`).
    let is_name = |n: &str| {
        !PYTHON_KEYWORDS.contains(&n)
            && !n.starts_with('_')
            && n.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if !properties.keys().all(|k| is_name(k)) {
        return None;
    }
    let mut parts: Vec<String> =
        required.iter().filter(|r| properties.contains_key(**r)).map(|r| r.to_string()).collect();
    parts.extend(properties.keys().filter(|k| !required.contains(&k.as_str())).map(|k| format!("{k}=_MISSING")));
    Some(parts.join(", "))
}

const PYTHON_KEYWORDS: &[&str] = &[
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class", "continue", "def", "del",
    "elif", "else", "except", "finally", "for", "from", "global", "if", "import", "in", "is", "lambda", "nonlocal",
    "not", "or", "pass", "raise", "return", "try", "while", "with", "yield",
];

/// The `runner_tools` module for the tools scripts may call.
fn module_source(tools: &[&ToolSpec]) -> String {
    let mut source = String::from(MODULE_HEAD);
    let mut names = Vec::new();
    for spec in tools {
        let name = &spec.name;
        let doc = serde_json::to_string(&spec.description).unwrap_or_else(|_| "\"\"".into());
        match parameter_list(&spec.parameters) {
            Some(params) => {
                let keys: Vec<String> = spec.parameters["properties"]
                    .as_object()
                    .map(|p| p.keys().map(|k| format!("({k:?}, {k})")).collect())
                    .unwrap_or_default();
                source.push_str(&format!(
                    "\ndef {name}({params}):\n    {doc}\n    return _call({name:?}, {{k: v for k, v in ({},) if v is not _MISSING}})\n",
                    keys.join(", ")
                ));
            }
            None => source
                .push_str(&format!("\ndef {name}(**arguments):\n    {doc}\n    return _call({name:?}, arguments)\n")),
        }
        names.push(format!("{name:?}"));
    }
    source.push_str(&format!("\n__all__ = [\"ToolError\", {}]\n", names.join(", ")));
    source
}

const MODULE_HEAD: &str = r#""""The environment's tools, as functions. Generated for this script by runner."""
import json as _json
import os as _os
import socket as _socket
import threading as _threading

_MISSING = object()
_sock = _socket.socket(fileno=int(_os.environ.pop("RUNNER_TOOLS_FD", "3")))
_reader = _sock.makefile("rb")
# One call at a time on the one connection: a request and its answer are one exchange,
# whichever thread makes it.
_lock = _threading.Lock()


class ToolError(Exception):
    """A tool call that failed: `type` is its error type, `message` says why."""

    def __init__(self, type, message):
        super().__init__(f"{type}: {message}")
        self.type = type
        self.message = message


def _call(name, arguments):
    request = (_json.dumps({"tool": name, "arguments": arguments}) + "\n").encode()
    with _lock:
        _sock.sendall(request)
        line = _reader.readline()
    if not line:
        raise ToolError("Cancelled", "the runner closed the tool connection")
    response = _json.loads(line)
    if response.get("ok"):
        return response.get("result")
    error = response.get("error") or {}
    raise ToolError(error.get("type", "ExecutionError"), error.get("message", ""))
"#;

/// Runs the script in `script.py` with the tool functions in scope, so that tracebacks
/// name the script's own lines.
const BOOTSTRAP: &str = r#"import sys, runner_tools
_scope = {"__name__": "__main__", "runner_tools": runner_tools}
_scope.update({n: getattr(runner_tools, n) for n in runner_tools.__all__})
with open("script.py", encoding="utf-8") as _f:
    _code = compile(_f.read(), "script.py", "exec")
del _f
exec(_code, _scope)
"#;

/// What an environment needs to run scripts: a folder for them, the sandbox they run in,
/// the interpreter.
///
/// The folder (`runner-scripts-XXXX`, the runner's alone) holds `code/`, where each script
/// gets a private folder (mode 0700, made by descriptor) holding its code, which scripts
/// may read but no process of a world may write, so no script can make the runner write
/// another's code where it chose; and `tmp/`, the scripts' `HOME` and `TMPDIR`, the one
/// place they may write.
pub struct ScriptHost {
    settings: ScriptSettings,
    /// Scripts running at once, at most the environment's `max_concurrency`.
    slots: tokio::sync::Semaphore,
    python: PathBuf,
    /// Removed with all it holds when the host is dropped.
    _dir: tempfile::TempDir,
    /// `code/`, held open: each script's folder is made in it by descriptor.
    code_fd: OwnedFd,
    code: PathBuf,
    scratch: PathBuf,
    sandbox: Arc<Confinement>,
    next: AtomicU32,
}

impl ScriptHost {
    /// Prepares scripts for one episode of the environment `name`, in a folder of
    /// `work_root`: finds the interpreter as the `python` kind does (`interpreter.rs`:
    /// `settings.python`, else `python3` on `PATH`, a shim resolved to the real
    /// interpreter) and has `confine` make the sandbox over that folder, reading it. At
    /// most `max_concurrency` inner calls run at once.
    pub async fn create(
        name: &str,
        settings: &ScriptSettings,
        max_concurrency: usize,
        work_root: &Path,
        confine: impl FnOnce(&[&Path], &[PathBuf]) -> Result<Arc<Confinement>, String>,
    ) -> Result<Self, SetupError> {
        let fail = |message: String| SetupError { name: name.to_owned(), message };
        let interpreter = super::interpreter::find(settings.python.as_deref())
            .await
            .map_err(|e| fail(format!("execute_code needs a Python 3 interpreter: {e}")))?;
        let dir = tempfile::Builder::new()
            .prefix("runner-scripts-")
            .tempdir_in(work_root)
            .map_err(|e| fail(format!("failed to create the scripts' folder: {e}")))?;
        let real =
            dir.path().canonicalize().map_err(|e| fail(format!("failed to resolve the scripts' folder: {e}")))?;
        let (code, scratch) = (real.join("code"), real.join("tmp"));
        let made = |path: &Path| {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(path)
                .map_err(|e| fail(format!("failed to create {}: {e}", path.display())))
        };
        made(&code)?;
        made(&scratch)?;
        let code_fd = std::fs::File::open(&code)
            .map(OwnedFd::from)
            .map_err(|e| fail(format!("failed to open {}: {e}", code.display())))?;
        let mut readable = interpreter.readable.clone();
        readable.push(code.clone());
        let sandbox = confine(&[&scratch], &readable).map_err(fail)?;
        let python = interpreter.executable.clone();
        let slots = tokio::sync::Semaphore::new(max_concurrency);
        Ok(ScriptHost {
            settings: settings.clone(),
            slots,
            python,
            _dir: dir,
            code_fd,
            code,
            scratch,
            sandbox,
            next: AtomicU32::new(0),
        })
    }
}

impl ScriptHost {
    /// Makes the private folder `name` of one script in `code/` (mode 0700) and opens it,
    /// refusing anything but the folder just made.
    fn private_folder(&self, name: &str) -> std::io::Result<OwnedFd> {
        let c_name = std::ffi::CString::new(name).map_err(std::io::Error::other)?;
        let at = self.code_fd.as_raw_fd();
        // SAFETY: mkdirat and openat of one name in a folder held open; the descriptor
        // returned is owned here.
        unsafe {
            if libc::mkdirat(at, c_name.as_ptr(), 0o700) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
            let fd = libc::openat(at, c_name.as_ptr(), flags);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(OwnedFd::from_raw_fd(fd))
        }
    }

    /// What the scripts' sandbox enforces.
    pub fn sandbox_enforced(&self) -> &Value {
        self.sandbox.enforced()
    }
}

#[derive(Deserialize)]
struct Request {
    tool: String,
    #[serde(default)]
    arguments: Value,
}

/// How a script ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Status {
    Success,
    Error,
    Timeout,
    Interrupted,
}

impl Environment {
    /// Runs the script of an `execute_code` call to its end and reports what it printed.
    pub(crate) async fn run_script(&self, call: &ToolCall, step: u32, recorder: &Recorder) -> Observation {
        if let Err(error) = self.check(call) {
            return Observation::of_error(&call.call_id, error);
        }
        let Some(host) = &self.scripts else {
            let error = ToolError::new(ErrorType::ExecutionError, "this environment cannot run scripts");
            return Observation::of_error(&call.call_id, error);
        };
        // Scripts of one turn run at once up to the environment's limit, apart from the
        // slots their own inner calls take.
        let Ok(_slot) = host.slots.acquire().await else {
            return Observation::of_error(
                &call.call_id,
                ToolError::new(ErrorType::Cancelled, "the environment is closed"),
            );
        };
        let code = call.arguments.get("code").and_then(Value::as_str).unwrap_or_default();
        match self.script(host, call, code, step, recorder).await {
            Ok((result, fault)) => {
                // An inner call failed for want of the runner's resources: nobody's answer.
                Observation { fault, ..Observation::of_result(&call.call_id, result) }
            }
            Err(failure) => Observation::of_error(&call.call_id, failure),
        }
    }

    /// Runs one script: writes it beside the module of its callable tools, starts the
    /// interpreter, answers its tool calls until it ends or runs out of time, and reports.
    async fn script(
        &self,
        host: &ScriptHost,
        call: &ToolCall,
        code: &str,
        step: u32,
        recorder: &Recorder,
    ) -> Result<(Value, Option<CallFault>), ToolError> {
        let started = Instant::now();
        let cleanup = self.write_script(host, code)?;
        let Interpreter { mut child, socket, stdout, stderr } = Interpreter::start(host, &cleanup.0)?;
        let calls_made = AtomicU32::new(0);
        let settings = &host.settings;
        let serve = self.serve(socket, call, step, recorder, &calls_made, settings.max_calls);
        let (status, work) = run_within_time(&mut child, stdout, stderr, serve, settings).await;
        let _ = child.keeper.wait().await;
        let (out, err, exit, fault) = work;
        let (out, err) = (out.unwrap_or_else(lost), err.unwrap_or_else(lost));
        let mut errors = err.text();
        let status = status.unwrap_or_else(|| ended_status(exit, &mut errors));
        if status == Status::Timeout {
            errors.push_str(&format!(
                "\n[the script ran longer than {}s and was stopped; its output so far is above]",
                settings.timeout_s
            ));
        }
        let result = json!({
            "status": status,
            "output": out.text(),
            "errors": errors.trim_start_matches('\n'),
            "tool_calls_made": calls_made.load(Ordering::Relaxed),
            "duration_s": (started.elapsed().as_secs_f64() * 1e3).round() / 1e3,
        });
        Ok((result, fault))
    }

    /// Makes the script's own folder and writes into it the script and the module of the
    /// tools it may call; the folder goes when the returned guard does.
    fn write_script(&self, host: &ScriptHost, code: &str) -> Result<RemoveOnDrop, ToolError> {
        let n = host.next.fetch_add(1, Ordering::Relaxed);
        let name = format!("script-{n}");
        let private = host.private_folder(&name).map_err(|e| setup_error("failed to make the script's folder", e))?;
        let cleanup = RemoveOnDrop(host.code.join(&name));
        let callable: Vec<&ToolSpec> = self
            .definition
            .tools
            .iter()
            .filter(|t| callable_from_scripts(&t.spec.name, t.script_safe))
            .map(|t| &t.spec)
            .collect();
        create_in(&private, c"runner_tools.py", &module_source(&callable))
            .and_then(|()| create_in(&private, c"script.py", code))
            .map_err(|e| setup_error("failed to write the script", e))?;
        Ok(cleanup)
    }

    /// Answers the script's tool calls, one request line at a time, until it closes the socket.
    async fn serve(
        &self,
        socket: tokio::net::UnixStream,
        parent: &ToolCall,
        step: u32,
        recorder: &Recorder,
        calls_made: &AtomicU32,
        max_calls: u32,
    ) -> Option<CallFault> {
        let mut fault = None;
        let (read, mut write) = socket.into_split();
        let mut reader = BufReader::new(read);
        let mut n = 0u32;
        let mut buffer = Vec::new();
        loop {
            buffer.clear();
            // One request is one line, of bounded length: a script that sends without end
            // is cut off, not buffered.
            match (&mut reader).take(MAX_REQUEST_BYTES + 1).read_until(b'\n', &mut buffer).await {
                Ok(0) | Err(_) => return fault,
                Ok(_) if buffer.last() != Some(&b'\n') => {
                    let message = format!("a request longer than {MAX_REQUEST_BYTES} bytes; the connection is closed");
                    let text = format!("{}\n", refusal(ErrorType::ValidationError, message));
                    let _ = write.write_all(text.as_bytes()).await;
                    return fault;
                }
                Ok(_) => {}
            }
            let line = String::from_utf8_lossy(&buffer);
            n += 1;
            let response = match serde_json::from_str::<Request>(&line) {
                Err(e) => refusal(ErrorType::ValidationError, format!("a request the runner cannot read: {e}")),
                Ok(_) if n > max_calls => refusal(
                    ErrorType::ExecutionError,
                    format!("this script has made its {max_calls} tool calls; no more are run"),
                ),
                Ok(request) => {
                    let call = ToolCall {
                        call_id: format!("{}.{n}", parent.call_id),
                        name: request.tool,
                        arguments: request.arguments,
                        actor: parent.actor.clone(),
                    };
                    let observation = self.inner_call(&call, step, recorder).await;
                    calls_made.fetch_add(1, Ordering::Relaxed);
                    if let Some(cause) = observation.fault {
                        fault.get_or_insert(cause);
                    }
                    recorder.emit(&Event::InnerCall {
                        step,
                        parent: parent.call_id.clone(),
                        call: logged_call(call),
                        observation: logged_observation(&observation),
                    });
                    match observation.error {
                        None => json!({"ok": true, "result": observation.tool_result}),
                        Some(error) => json!({"ok": false, "error": {"type": error.kind, "message": error.message}}),
                    }
                }
            };
            let mut text = response.to_string();
            text.push('\n');
            if write.write_all(text.as_bytes()).await.is_err() {
                return fault;
            }
        }
    }

    /// One call of a script: refused when scripts may not call the tool, else decided by the
    /// permission rules and run like any call.
    async fn inner_call(&self, call: &ToolCall, step: u32, recorder: &Recorder) -> Observation {
        if !self.definition.tool(&call.name).is_some_and(|t| callable_from_scripts(&call.name, t.script_safe)) {
            let message = format!("`{}` cannot be called from a script", call.name);
            return Observation::of_error(&call.call_id, ToolError::new(ErrorType::ToolNotFound, message));
        }
        if let Some(refused) = self.permit(call, step, recorder).await {
            return refused;
        }
        self.execute(call, &AtomicBool::new(false)).await
    }
}

/// The most bytes of an inner call's arguments, and of its result, that its `inner_call`
/// event keeps: a short script can make thousands of calls, and the script gets the whole
/// result either way.
pub const INNER_CALL_LOG_BYTES: usize = 1024;

fn logged_call(mut call: ToolCall) -> ToolCall {
    call.arguments = fit(&call.arguments, INNER_CALL_LOG_BYTES).0;
    call
}

fn logged_observation(observation: &Observation) -> Observation {
    let mut logged = observation.clone();
    logged.tool_result = logged.tool_result.map(|r| fit(&r, INNER_CALL_LOG_BYTES).0);
    logged
}

fn refusal(kind: ErrorType, message: String) -> Value {
    json!({"ok": false, "error": {"type": kind, "message": message}})
}

fn abandoned() -> std::io::Error {
    std::io::Error::other("a process the script started kept its output open; it was killed")
}

fn lost(e: std::io::Error) -> Captured {
    Captured { kept: format!("[output lost: {e}]").into_bytes(), total: 0 }
}

/// A tool failure of the script's own set-up.
fn setup_error(what: &str, e: std::io::Error) -> ToolError {
    ToolError::new(ErrorType::ExecutionError, format!("{what}: {e}"))
}

/// A script's interpreter, started in the sandbox: its process, the runner's end of the
/// socket its tool calls come over, and its output.
struct Interpreter {
    child: process::Supervised,
    socket: tokio::net::UnixStream,
    stdout: tokio::process::ChildStdout,
    stderr: tokio::process::ChildStderr,
}

impl Interpreter {
    /// Starts the interpreter on the bootstrap in the script's folder `dir`, with a bare
    /// environment and the other end of the socket as its descriptor 3.
    fn start(host: &ScriptHost, dir: &Path) -> Result<Interpreter, ToolError> {
        let (ours, theirs) =
            std::os::unix::net::UnixStream::pair().map_err(|e| setup_error("failed to make a socket", e))?;
        ours.set_nonblocking(true).map_err(|e| setup_error("failed to make a socket", e))?;
        let socket = tokio::net::UnixStream::from_std(ours).map_err(|e| setup_error("failed to make a socket", e))?;
        let mut command = Command::new(&host.python);
        command
            .args(["-B", "-E", "-s", "-c", BOOTSTRAP])
            .current_dir(dir)
            .env_clear()
            .env("PATH", SAFE_PATH)
            .env("HOME", &host.scratch)
            .env("TMPDIR", &host.scratch)
            .env("LANG", "C.UTF-8")
            .env("RUNNER_TOOLS_FD", "3");
        let mut child = process::spawn_passing(&command, process::Input::Null, &host.sandbox, Some(theirs.as_raw_fd()))
            .map_err(|e| setup_error("failed to start the interpreter", e))?;
        drop(theirs);
        let (Some(stdout), Some(stderr)) = (child.keeper.stdout.take(), child.keeper.stderr.take()) else {
            return Err(ToolError::new(ErrorType::ExecutionError, "the script's output was not captured"));
        };
        Ok(Interpreter { child, socket, stdout, stderr })
    }
}

/// What a script left: its output and errors as read, how its interpreter exited, and the
/// fault of an inner call, if one had one.
type ScriptEnd =
    (std::io::Result<Captured>, std::io::Result<Captured>, Option<std::process::ExitStatus>, Option<CallFault>);

/// Reads the script's output and answers its calls until it ends, or stops it when it
/// runs past its time (`Some(Status::Timeout)`): terminated, then killed, then its output
/// given up.
async fn run_within_time(
    child: &mut process::Supervised,
    stdout: tokio::process::ChildStdout,
    stderr: tokio::process::ChildStderr,
    serve: impl std::future::Future<Output = Option<CallFault>>,
    settings: &ScriptSettings,
) -> (Option<Status>, ScriptEnd) {
    let stopper = child.stopper();
    let status = async {
        let status = child.shell_status().await;
        child.tree.kill();
        status
    };
    let work = async {
        let (out, err, status, fault) = tokio::join!(
            read_capped(stdout, settings.stdout_bytes),
            read_capped(stderr, settings.stderr_bytes),
            status,
            serve
        );
        (out, err, status, fault)
    };
    tokio::pin!(work);
    let limit = Duration::from_secs_f64(settings.timeout_s);
    match tokio::time::timeout(limit, &mut work).await {
        Ok(done) => (None, done),
        Err(_) => {
            stopper.terminate();
            match tokio::time::timeout(GRACE, &mut work).await {
                Ok(done) => (Some(Status::Timeout), done),
                Err(_) => {
                    stopper.kill();
                    // A process that left the tree may still hold the pipes: after a last
                    // grace, the output read so far is given up.
                    match tokio::time::timeout(GRACE, &mut work).await {
                        Ok(done) => (Some(Status::Timeout), done),
                        Err(_) => (Some(Status::Timeout), (Err(abandoned()), Err(abandoned()), None, None)),
                    }
                }
            }
        }
    }
}

/// How a script that was not stopped ended, by its interpreter's exit; a signal is also
/// said in its `errors`.
fn ended_status(exit: Option<std::process::ExitStatus>, errors: &mut String) -> Status {
    match exit {
        Some(exit) if exit.success() => Status::Success,
        Some(exit) => {
            use std::os::unix::process::ExitStatusExt;
            match exit.signal() {
                Some(signal) => {
                    errors.push_str(&format!("\n[the interpreter was killed by signal {signal}]"));
                    Status::Interrupted
                }
                None => Status::Error,
            }
        }
        None => Status::Interrupted,
    }
}

/// Creates the new file `name` in the folder `at` (never an existing one, never through a
/// link) and writes `text` to it.
fn create_in(at: &OwnedFd, name: &std::ffi::CStr, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: openat of one name in a folder held open; the descriptor is owned here.
    let fd = unsafe { libc::openat(at.as_raw_fd(), name.as_ptr(), flags, 0o600 as libc::c_uint) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor, owned by nothing else.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.write_all(text.as_bytes())
}

/// Removes a script's folder when the script is done, however it ends.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = super::remove_tree(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_become_a_python_signature_or_keyword_arguments() {
        let schema =
            json!({"type": "object", "properties": {"key": {}, "value": {}, "ttl": {}}, "required": ["key", "value"]});
        assert_eq!(parameter_list(&schema).as_deref(), Some("key, value, ttl=_MISSING"));
        let odd = json!({"type": "object", "properties": {"from": {}}});
        assert_eq!(parameter_list(&odd), None, "a keyword cannot be a parameter");
        let spec = ToolSpec::new("kv_get", "Get.", schema);
        let source = module_source(&[&spec]);
        assert!(source.contains("def kv_get(key, value, ttl=_MISSING):"), "{source}");
        assert!(source.contains("__all__ = [\"ToolError\", \"kv_get\"]"), "{source}");
    }

    #[test]
    fn the_description_lists_only_what_scripts_may_call() {
        let decl = |name: &str, safe| ToolDecl {
            spec: ToolSpec::new(name, "x", json!({"type": "object", "properties": {"a": {}}, "required": ["a"]})),
            script_safe: safe,
        };
        let offered = [decl("kv_get", true), decl("ask_user", false), decl(FINAL_TOOL, false)];
        let tool = tool_decl(&offered);
        assert!(tool.spec.description.contains("kv_get(a)"), "{}", tool.spec.description);
        assert!(!tool.spec.description.contains("ask_user") && !tool.spec.description.contains(FINAL_TOOL));
        assert!(!tool.script_safe, "a script may not start a script");
    }
}
