//! `shell`: a fresh temporary working directory per episode, seeded with fixture and task
//! files, and tools to run commands and read and write files inside it.
//!
//! Commands run in their own process group with a clean environment (none of the runner's
//! variables, so no API keys); on timeout or cancellation the whole group is killed.

use std::path::{Component, Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::definition::{Definition, EnvLimits};
use super::{ToolFailure, World, decode_arguments};
use crate::contract::{ErrorType, ToolSpec};
use crate::suite::Task;

const SAFE_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
const MARK_VAR: &str = "RUNNER_EPISODE_MARK";

pub fn tool_specs() -> Vec<ToolSpec> {
    let spec = ToolSpec::new;
    vec![
        spec(
            "run_command",
            "Run a shell command in the working directory.",
            json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "minLength": 1},
                "timeout_s": {"type": "number", "exclusiveMinimum": 0, "default": 60}
            },
            "required": ["command"], "additionalProperties": false}),
        ),
        spec(
            "read_file",
            "Read a text file in the working directory.",
            json!({
            "type": "object", "properties": {"path": {"type": "string", "minLength": 1}},
            "required": ["path"], "additionalProperties": false}),
        ),
        spec(
            "write_file",
            "Write a text file in the working directory, creating folders as needed.",
            json!({
            "type": "object",
            "properties": {"path": {"type": "string", "minLength": 1}, "content": {"type": "string"}},
            "required": ["path", "content"], "additionalProperties": false}),
        ),
        spec(
            "list_dir",
            "List a folder of the working directory.",
            json!({
            "type": "object", "properties": {"path": {"type": "string", "default": "."}},
            "additionalProperties": false}),
        ),
    ]
}

pub struct ShellWorld {
    /// Every process of this episode carries `RUNNER_EPISODE_MARK=<mark>`, so that
    /// those that left the command's process group (`setsid`) are found at teardown.
    mark: String,
    ran_commands: std::sync::atomic::AtomicBool,
    dir: tempfile::TempDir,
    /// `dir` with symlinks resolved, to check that paths stay inside it.
    root: PathBuf,
    limits: EnvLimits,
}

impl ShellWorld {
    pub fn create(definition: &Definition, task: &Task, work_root: &Path) -> Result<Self, String> {
        let dir = tempfile::Builder::new()
            .prefix("runner-episode-")
            .tempdir_in(work_root)
            .map_err(|e| format!("failed to create a working directory: {e}"))?;
        let root = dir.path().canonicalize().map_err(|e| format!("failed to resolve the working directory: {e}"))?;
        for (name, content) in definition.files.iter().chain(&task.files) {
            if !crate::suite::is_relative_inside(name) {
                return Err(format!("file `{name}` would land outside the working directory"));
            }
            let path = root.join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| format!("failed to create {}: {e}", parent.display()))?;
            }
            std::fs::write(&path, content).map_err(|e| format!("failed to write {name}: {e}"))?;
        }
        let mark = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        Ok(ShellWorld { mark, ran_commands: false.into(), dir, root, limits: definition.limits.clone() })
    }

    /// Resolves a path the model gave, refusing any that leads outside the working directory.
    fn resolve(&self, given: &str) -> Result<PathBuf, ToolFailure> {
        let refuse = || {
            ToolFailure::new(ErrorType::PermissionError, format!("`{given}` is outside the working directory"))
                .suggest("use a path relative to the working directory")
        };
        let path = Path::new(given);
        let relative = if path.is_absolute() { path.strip_prefix(&self.root).map_err(|_| refuse())? } else { path };
        if relative.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(refuse());
        }
        // A symlink inside the directory may point out of it, or nowhere yet (a write
        // would then create its target outside): every link on the way must resolve inside.
        let mut full = self.root.clone();
        for part in relative.components() {
            full.push(part);
            if std::fs::symlink_metadata(&full).is_ok_and(|m| m.file_type().is_symlink()) {
                match full.canonicalize() {
                    Ok(real) if real.starts_with(&self.root) => {}
                    _ => return Err(refuse()),
                }
            }
        }
        Ok(full)
    }

    async fn run_command(&self, args: RunCommand) -> Result<Value, ToolFailure> {
        // Both bounds were checked when the definition loaded; the schema keeps timeout_s > 0.
        let limit = self.limits.command_timeout_s;
        let timeout = Duration::from_secs_f64(args.timeout_s.unwrap_or(limit).min(limit).max(0.001));
        let mut child = Command::new("/bin/sh")
            .arg("-c")
            .arg(&args.command)
            .current_dir(self.dir.path())
            .env_clear()
            .env("PATH", SAFE_PATH)
            .env("HOME", self.dir.path())
            .env("TMPDIR", self.dir.path())
            .env("LANG", "C.UTF-8")
            .env(MARK_VAR, &self.mark)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| ToolFailure::new(ErrorType::ExecutionError, format!("failed to start the shell: {e}")))?;
        self.ran_commands.store(true, std::sync::atomic::Ordering::Relaxed);
        // From here on, however this future ends (timeout, cancellation), the group dies.
        let group = ProcessGroup(child.id().map(|id| id as libc::pid_t));
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(ToolFailure::new(ErrorType::ExecutionError, "the shell's output was not captured"));
        };
        let cap = self.limits.output_cap_bytes;
        let work = async {
            let status = async {
                let status = child.wait().await;
                // Background processes the command left behind would hold the pipes open.
                group.kill();
                status
            };
            tokio::join!(read_capped(stdout, cap), read_capped(stderr, cap), status)
        };
        let (out, err, status) = match tokio::time::timeout(timeout, work).await {
            Ok(done) => done,
            Err(_) => {
                group.kill();
                return Err(ToolFailure::new(
                    ErrorType::TimeoutError,
                    format!("the command ran longer than {}s; its process group was killed", timeout.as_secs_f64()),
                )
                .suggest("make the command faster, or pass a larger timeout_s"));
            }
        };
        let status = status
            .map_err(|e| ToolFailure::new(ErrorType::ExecutionError, format!("failed to wait for the command: {e}")))?;
        let (out, err) = (out.map_err(io_failure)?, err.map_err(io_failure)?);
        let truncated = out.total > out.kept.len() || err.total > err.kept.len();
        let mut result = Map::new();
        result.insert("exit_code".into(), json!(status.code()));
        {
            use std::os::unix::process::ExitStatusExt;
            if let Some(signal) = status.signal() {
                result.insert("signal".into(), json!(signal));
            }
        }
        result.insert("stdout".into(), Value::String(out.text()));
        result.insert("stderr".into(), Value::String(err.text()));
        let result = Value::Object(result);
        if truncated {
            return Err(ToolFailure {
                kind: ErrorType::OutputTruncated,
                message: format!(
                    "output cut to {cap} bytes (stdout was {} bytes, stderr {} bytes)",
                    out.total, err.total
                ),
                suggested_action: Some("narrow the output, e.g. with head, tail or grep".into()),
                partial: Some(result),
            });
        }
        Ok(result)
    }

    async fn read_file(&self, path: &str) -> Result<Value, ToolFailure> {
        let full = self.resolve(path)?;
        let file = tokio::fs::File::open(&full).await.map_err(|e| not_found_or(e, path))?;
        let read = read_capped(file, self.limits.output_cap_bytes).await.map_err(io_failure)?;
        let result = json!({"path": path, "content": read.text()});
        if read.total > read.kept.len() {
            return Err(ToolFailure {
                kind: ErrorType::OutputTruncated,
                message: format!("`{path}` has {} bytes; only the first {} are shown", read.total, read.kept.len()),
                suggested_action: Some("read a part of it with run_command (head, sed -n, grep)".into()),
                partial: Some(result),
            });
        }
        Ok(result)
    }

    async fn write_file(&self, path: &str, content: &str) -> Result<Value, ToolFailure> {
        let full = self.resolve(path)?;
        if let Some(parent) = full.parent() {
            tokio::fs::create_dir_all(parent).await.map_err(io_failure)?;
        }
        // O_NOFOLLOW: a link swapped in after the check above is refused, not followed.
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&full)
            .await
            .map_err(|e| {
                if e.raw_os_error() == Some(libc::ELOOP) {
                    ToolFailure::new(
                        ErrorType::PermissionError,
                        format!("`{path}` is a symbolic link; write to its target"),
                    )
                } else {
                    io_failure(e)
                }
            })?;
        file.write_all(content.as_bytes()).await.map_err(io_failure)?;
        file.flush().await.map_err(io_failure)?;
        Ok(json!({"path": path, "bytes": content.len()}))
    }

    async fn list_dir(&self, path: &str) -> Result<Value, ToolFailure> {
        let full = self.resolve(path)?;
        let mut reader = tokio::fs::read_dir(&full).await.map_err(|e| not_found_or(e, path))?;
        let mut entries = Vec::new();
        while let Some(entry) = reader.next_entry().await.map_err(io_failure)? {
            let meta = entry.metadata().await.map_err(io_failure)?;
            let kind = if meta.is_dir() {
                "dir"
            } else if meta.is_file() {
                "file"
            } else {
                "other"
            };
            entries.push(json!({"name": entry.file_name().to_string_lossy(), "type": kind, "size": meta.len()}));
        }
        entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        Ok(json!({"path": path, "entries": entries}))
    }
}

#[derive(Deserialize)]
struct RunCommand {
    command: String,
    timeout_s: Option<f64>,
}

#[derive(Deserialize)]
struct PathArg {
    #[serde(default = "dot")]
    path: String,
}

fn dot() -> String {
    ".".into()
}

#[derive(Deserialize)]
struct WriteFile {
    path: String,
    content: String,
}

#[async_trait]
impl World for ShellWorld {
    async fn call(&self, name: &str, arguments: Value) -> Result<Value, ToolFailure> {
        match name {
            "run_command" => self.run_command(decode_arguments(arguments)?).await,
            "read_file" => self.read_file(&decode_arguments::<PathArg>(arguments)?.path).await,
            "write_file" => {
                let WriteFile { path, content } = decode_arguments(arguments)?;
                self.write_file(&path, &content).await
            }
            "list_dir" => self.list_dir(&decode_arguments::<PathArg>(arguments)?.path).await,
            other => Err(ToolFailure::new(ErrorType::ToolNotFound, format!("shell has no tool `{other}`"))),
        }
    }

    async fn read_back(&self, path: &str) -> Option<String> {
        let full = self.resolve(path).ok()?;
        tokio::fs::read_to_string(full).await.ok()
    }

    async fn run_check(&self, command: &str, timeout_s: f64) -> Result<(i32, String), String> {
        let args = RunCommand { command: command.to_owned(), timeout_s: Some(timeout_s) };
        let out = match self.run_command(args).await {
            Ok(out) => out,
            Err(f) if f.kind == ErrorType::OutputTruncated => f.partial.unwrap_or_default(),
            Err(f) => return Err(f.message),
        };
        let code = out["exit_code"].as_i64().map_or(-1, |c| c as i32);
        let text =
            format!("{}{}", out["stdout"].as_str().unwrap_or_default(), out["stderr"].as_str().unwrap_or_default());
        Ok((code, text))
    }

    fn describe(&self) -> Map<String, Value> {
        let mut info = Map::new();
        info.insert("cwd".into(), Value::String(self.root.display().to_string()));
        info
    }
}

impl Drop for ShellWorld {
    fn drop(&mut self) {
        if self.ran_commands.load(std::sync::atomic::Ordering::Relaxed) {
            kill_marked(&format!("{MARK_VAR}={}", self.mark));
        }
    }
}

/// Kills every process whose environment holds `needle`: the ones that escaped their
/// process group. Processes that clear their own environment are out of reach.
fn kill_marked(needle: &str) {
    let Ok(entries) = std::fs::read_dir("/proc") else { return };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<libc::pid_t>().ok()) else { continue };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
        if environ.split(|b| *b == 0).any(|var| var == needle.as_bytes()) {
            // SAFETY: kill only sends a signal, to a process that carries this episode's mark.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

fn io_failure(e: std::io::Error) -> ToolFailure {
    ToolFailure::new(ErrorType::ExecutionError, e.to_string())
}

fn not_found_or(e: std::io::Error, path: &str) -> ToolFailure {
    if e.kind() == std::io::ErrorKind::NotFound {
        ToolFailure::new(ErrorType::ExecutionError, format!("`{path}` does not exist"))
            .suggest("call list_dir to see the files")
    } else {
        io_failure(e)
    }
}

/// A command's process group, killed when this guard is dropped.
struct ProcessGroup(Option<libc::pid_t>);

impl ProcessGroup {
    fn kill(&self) {
        if let Some(pgid) = self.0 {
            // SAFETY: killpg only sends a signal; a group that is already gone yields ESRCH.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.kill();
    }
}

struct Captured {
    kept: Vec<u8>,
    total: usize,
}

impl Captured {
    fn text(&self) -> String {
        let mut text = String::from_utf8_lossy(&self.kept).into_owned();
        if self.total > self.kept.len() {
            text.push_str(&format!(
                "\n[... output truncated: showing {} of {} bytes ...]",
                self.kept.len(),
                self.total
            ));
        }
        text
    }
}

/// Reads everything, keeping the first `cap` bytes and counting the rest.
async fn read_capped(mut reader: impl AsyncRead + Unpin, cap: usize) -> std::io::Result<Captured> {
    let mut kept = Vec::new();
    let mut total = 0;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = reader.read(&mut buf).await?;
        if n == 0 {
            return Ok(Captured { kept, total });
        }
        total += n;
        if kept.len() < cap {
            let room = cap - kept.len();
            kept.extend_from_slice(&buf[..n.min(room)]);
        }
    }
}
