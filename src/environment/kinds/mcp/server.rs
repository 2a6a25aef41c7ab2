//! An MCP server as an environment file declares it (`ServerSpec`), and running, with the
//! client speaking to it (`Server`): a stdio server started inside the sandbox under a
//! keeper (`sandbox::process::spawn`), or a streamable HTTP one.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, GetPromptRequestParams};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::io::AsyncReadExt;
use tokio::process::Command;

use super::outcome;
use crate::contract::ErrorType;
use crate::environment::{Definition, ToolFailure};
use crate::sandbox::process::{self, SAFE_PATH, Supervised};
use crate::sandbox::{Confinement, SandboxMode};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSpec {
    pub name: String,
    /// stdio: the program (a path, `~/…`, or a name looked up on the sandbox's `PATH`).
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    /// The only variables the server gets, besides `PATH`; `${NAME}` takes the runner's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    /// More paths the server may read (its installation is readable already).
    #[serde(default)]
    pub read_paths: Vec<String>,
    /// Streamable HTTP: the endpoint.
    pub url: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// `episode` (default): a server per episode; `run`: one for the run's episodes.
    #[serde(default)]
    pub scope: Scope,
    /// How long the server may take to start and answer `initialize`.
    #[serde(default = "default_start_timeout")]
    pub start_timeout_s: f64,
}

fn default_start_timeout() -> f64 {
    30.0
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    #[default]
    Episode,
    Run,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PromptRef {
    pub server: String,
    pub name: String,
    #[serde(default)]
    pub arguments: Map<String, Value>,
}

/// The program of a stdio server: `~/` is the home folder, a path with a `/` is the
/// environment file's when relative, a bare name is looked up on the sandbox's `PATH`.
pub(super) fn resolve_command(command: &str, base: &Path) -> Result<PathBuf, String> {
    if command.contains('/') {
        let path = expand_path(command, base);
        return if path.is_file() { Ok(path) } else { Err(format!("`{}` does not exist", path.display())) };
    }
    SAFE_PATH
        .split(':')
        .map(|dir| Path::new(dir).join(command))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("`{command}` is not installed (looked on {SAFE_PATH})"))
}

pub(super) fn expand_path(text: &str, base: &Path) -> PathBuf {
    if let Some(rest) = text.strip_prefix("~/")
        && let Some(home) = std::env::var_os("HOME")
    {
        return PathBuf::from(home).join(rest);
    }
    let path = PathBuf::from(text);
    if path.is_absolute() { path } else { base.join(path) }
}

/// Whether an argument names a file (and so is resolved, and made readable): a path, or a
/// script by its extension (`server.py`).
pub(super) fn is_path_argument(arg: &str) -> bool {
    arg.starts_with('/') || arg.starts_with("./") || arg.starts_with("../") || arg.starts_with("~/") || is_script(arg)
}

/// Whether an argument is a bare script name (`server.py`, `dist/index.js`), which is the
/// server's `cwd`'s when it has one, like a shell would read it, else the file's folder's.
fn is_script(arg: &str) -> bool {
    const SCRIPTS: [&str; 6] = [".py", ".js", ".mjs", ".cjs", ".ts", ".rb"];
    !arg.starts_with('-') && !arg.contains(['=', ':']) && SCRIPTS.iter().any(|e| arg.ends_with(e))
}

/// The file an argument names (see [`is_path_argument`]), given the file's folder `base`.
pub(super) fn argument_path(arg: &str, spec: &ServerSpec, base: &Path) -> PathBuf {
    match &spec.cwd {
        Some(cwd) if is_script(arg) && !arg.starts_with(['/', '.', '~']) => expand_path(arg, &expand_path(cwd, base)),
        _ => expand_path(arg, base),
    }
}

/// How much of a server's stderr is kept for messages.
const STDERR_TAIL: usize = 2000;

/// What a server must read of its own: the installation `path` belongs to — the folder
/// holding its outermost `node_modules`, a virtualenv, the prefix of a `bin/` folder — or
/// the file alone. Never a folder that holds the home folder.
pub(super) fn installation(path: &Path) -> Result<PathBuf, String> {
    let home = std::env::var_os("HOME").map(PathBuf::from).and_then(|h| h.canonicalize().ok());
    let mut found = None;
    for ancestor in path.ancestors().skip(1) {
        if ancestor.file_name().is_some_and(|n| n == "node_modules") {
            found = ancestor.parent().map(Path::to_path_buf);
        }
        if found.is_none() && ancestor.join("pyvenv.cfg").is_file() {
            found = Some(ancestor.to_path_buf());
        }
    }
    let found = found.unwrap_or_else(|| match path.parent() {
        Some(bin) if bin.file_name().is_some_and(|n| n == "bin") => bin.parent().unwrap_or(bin).to_path_buf(),
        _ => path.to_path_buf(),
    });
    let found = found.canonicalize().unwrap_or(found);
    if found.parent().is_none() || home.as_ref().is_some_and(|h| h.starts_with(&found)) {
        return Err(format!(
            "`{}` is installed in `{}`, which holds the home folder or is the whole file system: the sandbox \
             would have to open it all; install the server elsewhere",
            path.display(),
            found.display()
        ));
    }
    Ok(found)
}

/// The interpreter a script names on its `#!` line (`#!/usr/bin/env NAME` looked up on the
/// servers' `PATH`); `None` for a program that is not a script.
fn shebang_interpreter(program: &Path) -> Option<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(program).and_then(|mut f| f.read(&mut head)).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = String::from_utf8_lossy(line.split(|&b| b == b'\n').next()?).into_owned();
    let mut words = line.split_whitespace();
    let interpreter = PathBuf::from(words.next()?);
    if interpreter.file_name().is_some_and(|n| n == "env") {
        let name = words.find(|w| !w.starts_with('-'))?;
        return SAFE_PATH.split(':').map(|dir| Path::new(dir).join(name)).find(|p| p.is_file());
    }
    Some(interpreter)
}

/// `${NAME}` in `value` replaced by the runner's variable `NAME`.
pub(super) fn expand_vars(value: &str) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else {
            return Err(format!("`{value}`: `${{` without a closing `}}`"));
        };
        let name = &rest[start + 2..start + end];
        match std::env::var(name) {
            Ok(v) => out.push_str(&v),
            Err(_) => return Err(format!("`{value}` takes `${{{name}}}`, which is not set")),
        }
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The end of what a server wrote to stderr.
#[derive(Debug, Default)]
struct Tail(VecDeque<u8>);

impl Tail {
    /// Reads `stderr` to its end in a task of its own, keeping its last bytes; the
    /// receiver turns true once the end is reached.
    fn keep(
        mut stderr: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    ) -> (Arc<Mutex<Tail>>, tokio::sync::watch::Receiver<bool>) {
        let tail = Arc::new(Mutex::new(Tail::default()));
        let keep = tail.clone();
        let (read_to_end, stderr_read) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let mut tail = keep.lock().unwrap_or_else(|p| p.into_inner());
                tail.0.extend(&buf[..n]);
                let over = tail.0.len().saturating_sub(STDERR_TAIL);
                tail.0.drain(..over);
            }
            let _ = read_to_end.send(true);
        });
        (tail, stderr_read)
    }

    fn text(tail: &Mutex<Tail>) -> String {
        let guard = tail.lock().unwrap_or_else(|p| p.into_inner());
        let bytes: Vec<u8> = guard.0.iter().copied().collect();
        String::from_utf8_lossy(&bytes).trim().to_owned()
    }
}

/// One running, initialised MCP server and the client speaking to it.
pub struct Server {
    pub name: String,
    client: RunningService<RoleClient, ()>,
    /// A stdio server's process tree (killed when dropped).
    process: Option<tokio::sync::Mutex<Process>>,
    stderr: Arc<Mutex<Tail>>,
    /// Turns true when its stderr has been read to its end (the server and whatever else held
    /// the pipe are gone); a server over HTTP has none.
    stderr_read: Option<tokio::sync::watch::Receiver<bool>>,
    /// The sandbox it runs in, kept for the cgroup's final kill.
    sandbox: Option<Arc<Confinement>>,
}

/// A stdio server's process, and how it ended once known.
struct Process {
    supervised: Supervised,
    status: Option<std::process::ExitStatus>,
}

/// What a stdio server runs: its program, its arguments (the paths among them made
/// absolute), its working folder, and what the sandbox must let it read besides.
struct Launch {
    program: PathBuf,
    args: Vec<std::ffi::OsString>,
    cwd: PathBuf,
    readable: Vec<PathBuf>,
}

impl Launch {
    /// The launch `spec` asks for, its relative paths the environment file's (`base`), its
    /// working folder `dir` unless it names one.
    fn of(spec: &ServerSpec, base: &Path, dir: &Path) -> Result<Launch, String> {
        let name = &spec.name;
        let Some(command) = &spec.command else { return Err(format!("server `{name}` has no command")) };
        let program = resolve_command(command, base).map_err(|e| format!("server `{name}`: {e}"))?;
        let mut readable = vec![installation(&program).map_err(|e| format!("server `{name}`: {e}"))?];
        if let Ok(real) = program.canonicalize() {
            readable.push(installation(&real).map_err(|e| format!("server `{name}`: {e}"))?);
        }
        // A script's interpreter, followed through its links: a virtualenv's `python3` is a
        // link to the Python it was made from (a pyenv, conda or uv one under the home folder).
        if let Some(real) = shebang_interpreter(&program).and_then(|i| i.canonicalize().ok()) {
            readable.push(installation(&real).map_err(|e| format!("server `{name}`: {e}"))?);
        }
        let mut args = Vec::new();
        for arg in &spec.args {
            let arg = &expand_vars(arg).map_err(|e| format!("server `{name}`: argument {e}"))?;
            if is_path_argument(arg) {
                let path = argument_path(arg, spec, base);
                if path.exists() {
                    let real = path.canonicalize().unwrap_or(path.clone());
                    readable.push(installation(&real).map_err(|e| format!("server `{name}`: {e}"))?);
                }
                args.push(path.into_os_string());
            } else {
                args.push(arg.into());
            }
        }
        for extra in &spec.read_paths {
            readable.push(expand_path(extra, base));
        }
        let cwd = match &spec.cwd {
            Some(cwd) => {
                let path = expand_path(cwd, base);
                readable.push(path.clone());
                path
            }
            None => dir.to_path_buf(),
        };
        Ok(Launch { program, args, cwd, readable })
    }

    /// The command, with only `PATH` and the variables `spec` names in its environment.
    fn command(&self, spec: &ServerSpec) -> Result<Command, String> {
        let name = &spec.name;
        let mut command = Command::new(&self.program);
        command.args(&self.args).current_dir(&self.cwd).env_clear().env("PATH", SAFE_PATH);
        for (k, v) in &spec.env {
            command.env(k, expand_vars(v).map_err(|e| format!("server `{name}`: env `{k}`: {e}"))?);
        }
        Ok(command)
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Server {
    /// Starts `spec` (in `dir`, its working folder unless it names one) and initialises it.
    pub async fn start(
        spec: &ServerSpec,
        definition: &Definition,
        base: &Path,
        dir: &Path,
        mode: SandboxMode,
    ) -> Result<Server, String> {
        let timeout = Duration::from_secs_f64(spec.start_timeout_s);
        if let Some(url) = &spec.url {
            return Server::start_http(spec, url, timeout).await;
        }
        let name = &spec.name;
        let launch = Launch::of(spec, base, dir)?;
        let sandbox =
            definition.confinement(mode, &[dir], &launch.readable).map_err(|e| format!("server `{name}`: {e}"))?;
        let command = launch.command(spec)?;
        if !launch.cwd.is_dir() {
            return Err(format!("server `{name}`: its cwd `{}` is not a folder (any longer)", launch.cwd.display()));
        }
        let supervised = process::spawn(&command, process::Input::Piped, &sandbox).map_err(|e| {
            let mut message = format!("server `{name}`: failed to start `{}`: {e}", launch.program.display());
            if e.kind() == std::io::ErrorKind::PermissionDenied && sandbox.enforced()["enabled"] == true {
                message.push_str(
                    ": the sandbox keeps it (or the interpreter it runs) from being read; add the folder it is \
                     installed in to the server's `read_paths`",
                );
            }
            message
        })?;
        Server::initialise_stdio(name.clone(), &launch.program, supervised, sandbox, timeout).await
    }

    /// Connects to a streamable HTTP server, with the headers its spec names.
    async fn start_http(spec: &ServerSpec, url: &str, timeout: Duration) -> Result<Server, String> {
        let name = spec.name.clone();
        let mut headers = std::collections::HashMap::new();
        for (k, v) in &spec.headers {
            let value = expand_vars(v).map_err(|e| format!("server `{name}`: header `{k}`: {e}"))?;
            let (Ok(k), Ok(v)) = (http::HeaderName::try_from(k.as_str()), http::HeaderValue::try_from(value)) else {
                return Err(format!("server `{name}`: header `{k}` is not valid"));
            };
            headers.insert(k, v);
        }
        // rmcp's client brings no TLS provider of its own: the process's default is ring's
        // (an error only says one is installed already).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
        let transport = StreamableHttpClientTransport::from_config(config);
        let client = match tokio::time::timeout(timeout, ().serve(transport)).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(format!("server `{name}` at {url} did not initialise: {e}")),
            Err(_) => {
                return Err(format!("server `{name}` at {url} did not initialise within {}s", timeout.as_secs_f64()));
            }
        };
        Ok(Server { name, client, process: None, stderr: Default::default(), stderr_read: None, sandbox: None })
    }

    /// Initialises a started stdio server over its pipes; when it does not answer in time,
    /// kills it and says how it ended and what it wrote to stderr.
    async fn initialise_stdio(
        name: String,
        program: &Path,
        mut supervised: Supervised,
        sandbox: Arc<Confinement>,
        timeout: Duration,
    ) -> Result<Server, String> {
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (supervised.keeper.stdin.take(), supervised.keeper.stdout.take(), supervised.keeper.stderr.take())
        else {
            return Err(format!("server `{name}`: its pipes were not set up"));
        };
        let (tail, stderr_read) = Tail::keep(stderr);
        // rmcp drops a line longer than it reads and waits on: the bound answers instead.
        let stdout = super::bounded::Bounded::new(stdout, super::bounded::MAX_MESSAGE_BYTES);
        let transport = AsyncRwTransport::new_client(stdout, stdin).with_max_line_length(usize::MAX);
        let serving = tokio::time::timeout(timeout, ().serve(transport)).await;
        let why = match serving {
            Ok(Ok(client)) => {
                return Ok(Server {
                    name,
                    client,
                    process: Some(tokio::sync::Mutex::new(Process { supervised, status: None })),
                    stderr: tail,
                    stderr_read: Some(stderr_read),
                    sandbox: Some(sandbox),
                });
            }
            Ok(Err(e)) => format!("it did not initialise ({e})"),
            Err(_) => format!("it did not initialise within {}s", timeout.as_secs_f64()),
        };
        let status = tokio::time::timeout(Duration::from_millis(500), supervised.shell_status()).await.ok().flatten();
        supervised.tree.kill();
        sandbox.kill_all();
        // Whatever it said before it stopped.
        last_words(Some(stderr_read)).await;
        let exited = status.map(|s| format!(", {}", describe_exit(s))).unwrap_or_default();
        let said = Tail::text(&tail);
        let said = if said.is_empty() { "nothing on stderr".to_owned() } else { format!("its stderr ended: {said}") };
        Err(format!("server `{name}` (`{}`): {why}{exited}; {said}", program.display()))
    }

    /// Every tool the server lists, as it lists it.
    pub(super) async fn tools(&self) -> Result<Vec<Value>, String> {
        let tools = self.client.list_all_tools().await.map_err(|e| self.failure("tools/list", &e.to_string()))?;
        tools.iter().map(|t| serde_json::to_value(t).map_err(|e| e.to_string())).collect()
    }

    /// The text of a prompt's messages, for the system prompt.
    pub(super) async fn prompt(&self, prompt: &PromptRef) -> Result<String, String> {
        let mut params = GetPromptRequestParams::new(prompt.name.clone());
        if !prompt.arguments.is_empty() {
            params.arguments = Some(prompt.arguments.clone());
        }
        let got = self.client.get_prompt(params).await.map_err(|e| self.failure("prompts/get", &e.to_string()))?;
        let value = serde_json::to_value(&got).map_err(|e| e.to_string())?;
        let mut text = String::new();
        for message in value["messages"].as_array().into_iter().flatten() {
            if let Some(t) = message["content"]["text"].as_str() {
                text.push_str(t);
                text.push('\n');
            }
        }
        Ok(text)
    }

    fn failure(&self, what: &str, error: &str) -> String {
        let said = Tail::text(&self.stderr);
        let said = if said.is_empty() { String::new() } else { format!("; its stderr ended: {said}") };
        format!("server `{}`: {what} failed: {error}{said}", self.name)
    }

    /// Forwards one call to `tools/call`.
    pub(super) async fn call(&self, tool: &str, arguments: Value) -> Result<Value, ToolFailure> {
        let mut params = CallToolRequestParams::new(tool.to_owned());
        if let Value::Object(arguments) = arguments {
            params = params.with_arguments(arguments);
        }
        match self.client.call_tool(params).await {
            Ok(result) => {
                let result = serde_json::to_value(&result)
                    .map_err(|e| ToolFailure::new(ErrorType::ExecutionError, format!("an unreadable result: {e}")))?;
                outcome(result)
            }
            Err(error) => {
                // A protocol error of a live server is the call's; a dead server is the environment's.
                let wait = if self.client.is_closed() { 500 } else { 200 };
                let status = self.exit_status(Duration::from_millis(wait)).await;
                if !self.client.is_closed() && status.is_none() {
                    return Err(ToolFailure::new(ErrorType::ExecutionError, format!("`{tool}` failed: {error}")));
                }
                let exit = status.map(|s| format!(" ({})", describe_exit(s))).unwrap_or_default();
                last_words(self.stderr_read.clone()).await;
                let said = Tail::text(&self.stderr);
                let said = if said.is_empty() { String::new() } else { format!("; its stderr ended: {said}") };
                let message = format!("server `{}` stopped during `{tool}`{exit}: {error}{said}", self.name);
                let mut failure = ToolFailure::new(ErrorType::ExecutionError, message);
                failure.fault = Some(crate::contract::CallFault::EnvironmentFailed);
                Err(failure)
            }
        }
    }

    /// How a stdio server's process ended, waiting at most `wait`; `None` while it runs
    /// (or for a server over HTTP).
    async fn exit_status(&self, wait: Duration) -> Option<std::process::ExitStatus> {
        let process = self.process.as_ref()?;
        let mut process = process.lock().await;
        if process.status.is_none()
            && let Ok(Some(status)) = tokio::time::timeout(wait, process.supervised.shell_status()).await
        {
            process.status = Some(status);
        }
        process.status
    }

    /// Stops the server and everything it started.
    pub async fn stop(&mut self) {
        self.client.cancellation_token().cancel();
        if let Some(process) = &self.process {
            process.lock().await.supervised.tree.kill();
        }
        if let Some(sandbox) = &self.sandbox {
            sandbox.kill_all();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.client.cancellation_token().cancel();
        if let Some(process) = &mut self.process {
            process.get_mut().supervised.tree.kill();
        }
    }
}

/// Waits, a little at most, until a stopped server's stderr has been read to its end, so that
/// its tail holds what it said last (a pipe kept open by a process it left behind is not
/// waited for long).
async fn last_words(stderr_read: Option<tokio::sync::watch::Receiver<bool>>) {
    if let Some(mut read) = stderr_read {
        let _ = tokio::time::timeout(Duration::from_millis(500), read.wait_for(|done| *done)).await;
    }
}

fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => status.to_string(),
    }
}
