//! `shell`: a fresh temporary working directory per episode, seeded with fixture and task
//! files, and tools to run commands and read and write files inside it.
//!
//! Every command runs in the world's sandbox (`src/sandbox/`: files beneath the episode's
//! own folders, no network, limits, no privileges) with a clean environment (none of the
//! runner's variables, so no API keys), under a keeper process (`sandbox/process.rs`): when a
//! command ends, times out or is cancelled, every process it started is killed, also those
//! that left its group or session.
//!
//! Nothing a world contains may block or bloat the run: files are opened without waiting
//! (a named pipe would wait for a writer), only regular files are read or written, reads
//! stop at a cap, and a file with other hard links (which may live outside) is not written.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::{EnvironmentKind, KindKeys, KindSettings};
use crate::config::decode::ConfigError;
use crate::contract::{Actor, CallFault, ErrorType, ToolAnnotations};
use crate::domain::Task;
use crate::environment::beneath::{self, Beneath, Kind, Links};
use crate::environment::folder::EpisodeFolder;
use crate::environment::tool::{self, Tool, ToolDecl};
use crate::environment::{
    Definition, EnvLimits, FileWorld, ReadBack, SetupContext, SetupError, ToolFailure, World, decode_arguments,
};
use crate::sandbox::process::{self, Captured, read_capped};
use crate::sandbox::resources;
use crate::sandbox::{Confinement, LazyConfinement};

mod checkpoint;
mod files;
pub mod image;
pub mod place;
pub mod podman;
pub mod provider;
pub mod world_model;

use checkpoint::Checkpoints;

use world_model::WorldModels;

use crate::sandbox::process::SAFE_PATH;

/// The kind `shell`.
pub struct Shell;

#[async_trait]
impl EnvironmentKind for Shell {
    fn name(&self) -> &'static str {
        "shell"
    }

    fn tools(&self) -> Vec<ToolDecl> {
        tool::offer(TOOLS)
    }

    fn keys(&self) -> &'static [&'static str] {
        &["image", "build"]
    }

    fn decode_settings(&self, keys: &KindKeys<'_>) -> Result<KindSettings, ConfigError> {
        Ok(match image::decode(keys)? {
            Some(source) => KindSettings::Image(Arc::new(image::ShellImage::new(source))),
            None => KindSettings::Plain,
        })
    }

    async fn setup(
        &self,
        definition: &Definition,
        task: &Task,
        context: &SetupContext<'_>,
    ) -> Result<Box<dyn World>, SetupError> {
        let failed = |message| SetupError { name: definition.name.clone(), message };
        let world = match &definition.settings {
            KindSettings::Image(image) => {
                let prepared = image.ready(context.images()).await.map_err(failed)?;
                ShellWorld::create_in_image(definition, task, context, prepared.as_ref()).await.map_err(failed)?
            }
            _ => ShellWorld::create(definition, task, context).map_err(failed)?,
        };
        Ok(Box::new(world))
    }

    fn open_files_per_call(&self) -> u64 {
        resources::FDS_PER_CALL
    }

    fn sandboxed(&self) -> bool {
        true
    }
}

/// The tools of `shell`, in the order models are shown them.
pub const TOOLS: &[&dyn Tool<ShellWorld>] = &[
    &RunCommand,
    &files::ReadFile,
    &files::WriteFile,
    &files::EditFile,
    &files::Glob,
    &files::Grep,
    &ListDir,
    &Checkpoint,
    &Restore,
];

struct RunCommand;

#[async_trait]
impl Tool<ShellWorld> for RunCommand {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::DESTRUCTIVE)
    }

    fn name(&self) -> &'static str {
        "run_command"
    }

    fn description(&self) -> &'static str {
        "Run a shell command in the working directory."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "minLength": 1},
                "timeout_s": {"type": "number", "exclusiveMinimum": 0, "default": 60}
            },
            "required": ["command"], "additionalProperties": false})
    }

    async fn call(&self, world: &ShellWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        world.run_command(decode_arguments(arguments)?).await
    }
}

struct ListDir;

#[async_trait]
impl Tool<ShellWorld> for ListDir {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::READ_ONLY)
    }

    fn name(&self) -> &'static str {
        "list_dir"
    }

    fn description(&self) -> &'static str {
        "List a folder of the working directory."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object", "properties": {"path": {"type": "string", "default": "."}},
            "additionalProperties": false})
    }

    async fn call(&self, world: &ShellWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        world.list_dir(&decode_arguments::<PathArg>(arguments)?.path).await
    }
}

struct Checkpoint;

#[async_trait]
impl Tool<ShellWorld> for Checkpoint {
    fn annotations(&self) -> Option<ToolAnnotations> {
        // It changes no file of the working directory; it is kept outside.
        Some(ToolAnnotations { read_only: false, destructive: false })
    }

    fn name(&self) -> &'static str {
        "checkpoint"
    }

    fn description(&self) -> &'static str {
        "Save a copy of the whole working directory under a name, to restore later; a name used again is replaced."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object", "properties": {"name": {"type": "string", "minLength": 1}},
            "required": ["name"], "additionalProperties": false})
    }

    async fn call(&self, world: &ShellWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        world.checkpoints.take(&world.files, &decode_arguments::<NameArg>(arguments)?.name).await
    }
}

struct Restore;

#[async_trait]
impl Tool<ShellWorld> for Restore {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::DESTRUCTIVE)
    }

    fn name(&self) -> &'static str {
        "restore"
    }

    fn description(&self) -> &'static str {
        "Make the working directory what it was at a checkpoint: changed and deleted files come back, new ones are removed."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object", "properties": {"name": {"type": "string", "minLength": 1}},
            "required": ["name"], "additionalProperties": false})
    }

    async fn call(&self, world: &ShellWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        world.checkpoints.restore(&world.files, &decode_arguments::<NameArg>(arguments)?.name).await
    }
}

pub struct ShellWorld {
    /// The episode's folder: the working directory `work/` and the commands' `tmp/`; in an
    /// image's root, its private layer.
    dir: EpisodeFolder,
    /// The working directory, with symlinks resolved, as the runner reaches it.
    root: PathBuf,
    /// The working directory as the world's commands name it (the image's path, in an
    /// image's root).
    inside: PathBuf,
    /// The image's place the world is in, when it is in one (a provider's: runner's own
    /// root, a container); stopped after the world's processes.
    place: Option<Box<dyn provider::Place>>,
    /// The working directory held open: every file tool resolves its paths from here.
    files: Arc<Beneath>,
    tmp: PathBuf,
    limits: EnvLimits,
    /// Made, with `tmp`, when the world starts its first process.
    sandbox: LazyConfinement,
    /// What each actor last saw of the files it read or wrote.
    models: WorldModels,
    checkpoints: Checkpoints,
    /// Where the world's folder goes when it ends, instead of away (`--keep-worlds`).
    keep: Option<PathBuf>,
}

impl ShellWorld {
    pub fn create(definition: &Definition, task: &Task, context: &SetupContext<'_>) -> Result<Self, String> {
        let dir = EpisodeFolder::create(&definition.files, task, context.work_root)?;
        let (root, tmp) = (dir.work.clone(), dir.tmp.clone());
        let plan = definition.sandbox_plan(context.sandbox)?;
        let sandbox = LazyConfinement::new(plan, vec![root.clone(), tmp.clone()]);
        let checkpoints = Checkpoints::new(context.work_root, definition.limits.checkpoint_bytes);
        let files = Beneath::open(&root).map_err(|e| format!("failed to open the working directory: {e}"))?;
        Ok(ShellWorld {
            files: Arc::new(files),
            dir,
            inside: root.clone(),
            place: None,
            tmp,
            root,
            limits: definition.limits.clone(),
            sandbox,
            models: WorldModels::default(),
            checkpoints,
            keep: context.keep.clone(),
        })
    }

    /// A world in an image a provider prepared: its place started over the episode's own
    /// folder, the image's working folder seeded with the files, commands run there as the
    /// image's user.
    pub async fn create_in_image(
        definition: &Definition,
        task: &Task,
        context: &SetupContext<'_>,
        image: &dyn provider::Prepared,
    ) -> Result<Self, String> {
        let dir = EpisodeFolder::create(&Default::default(), &Task::new("", ""), context.work_root)?;
        let start = provider::Start { definition, task, private: &dir.work, binds: &context.binds };
        let place = image.start(start).await.map_err(|e| e.to_string())?;
        let files = match place.files() {
            Ok(files) => files,
            Err(e) => {
                place.stop().await;
                return Err(e);
            }
        };
        let root = place.root();
        Ok(ShellWorld {
            files: Arc::new(files),
            root: root.workdir_on_host(),
            inside: root.workdir.clone(),
            tmp: root.path().join("tmp"),
            sandbox: LazyConfinement::made(place.sandbox()),
            place: Some(place),
            dir,
            limits: definition.limits.clone(),
            models: WorldModels::default(),
            checkpoints: Checkpoints::new(context.work_root, definition.limits.checkpoint_bytes),
            keep: context.keep.clone(),
        })
    }

    /// The world's sandbox, made with `tmp/` at its first process.
    fn sandbox(&self) -> Result<&Arc<Confinement>, String> {
        self.sandbox.get(|| self.dir.make_tmp())
    }

    /// The path a model gave, relative to the working directory, refusing one that names a
    /// place outside it or leads out through a link now. That is said early; what keeps a
    /// tool inside is that every open resolves the path again beneath the working
    /// directory's descriptor (`beneath.rs`), where the kernel refuses a link that leads out
    /// at the moment of the open, whatever a command swapped in since.
    fn resolve(&self, given: &str) -> Result<PathBuf, ToolFailure> {
        let path = Path::new(given);
        let relative =
            if path.is_absolute() { path.strip_prefix(&self.inside).map_err(|_| outside(given))? } else { path };
        if relative.components().any(|c| matches!(c, Component::ParentDir)) {
            return Err(outside(given));
        }
        let relative: PathBuf = relative.components().filter(|c| matches!(c, Component::Normal(_))).collect();
        match self.files.open_at(&relative, libc::O_PATH, 0, Links::Inside) {
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => Err(outside(given)),
            _ => Ok(relative),
        }
    }

    async fn run_command(&self, args: RunCommandArgs) -> Result<Value, ToolFailure> {
        // Both bounds were checked when the definition loaded; the schema keeps timeout_s > 0.
        let limit = self.limits.command_timeout_s;
        let timeout = Duration::from_secs_f64(args.timeout_s.unwrap_or(limit).min(limit).max(0.001));
        let command = match &self.place {
            Some(place) => place.command(&args.command, timeout.as_secs_f64()),
            None => {
                let mut command = Command::new("/bin/sh");
                command.arg("-c").arg(&args.command).current_dir(&self.inside).env_clear();
                command.env("PATH", SAFE_PATH).env("HOME", &self.root).env("TMPDIR", &self.tmp).env("LANG", "C.UTF-8");
                command
            }
        };
        let sandbox = self.sandbox().map_err(|message| ToolFailure {
            fault: Some(CallFault::EnvironmentFailed),
            ..ToolFailure::new(ErrorType::ExecutionError, message)
        })?;
        // From here on, however this future ends (timeout, cancellation), every process
        // the command started dies with it.
        let mut started = process::spawn(&command, process::Input::Null, sandbox)
            .map_err(|e| ToolFailure::io("failed to start the shell", e))?;
        let (Some(stdout), Some(stderr)) = (started.keeper.stdout.take(), started.keeper.stderr.take()) else {
            return Err(ToolFailure::new(ErrorType::ExecutionError, "the shell's output was not captured"));
        };
        let cap = self.limits.output_cap_bytes;
        let work = async {
            let status = async {
                let status = started.shell_status().await;
                // Background processes the command left behind would hold the pipes open.
                started.tree.kill();
                status
            };
            tokio::join!(read_capped(stdout, cap), read_capped(stderr, cap), status)
        };
        let (out, err, status) = match tokio::time::timeout(timeout, work).await {
            Ok(done) => done,
            Err(_) => {
                started.tree.kill();
                return Err(ToolFailure::new(
                    ErrorType::TimeoutError,
                    format!(
                        "the command ran longer than {}s; it and every process it started were killed",
                        timeout.as_secs_f64()
                    ),
                )
                .suggest("make the command faster, or pass a larger timeout_s"));
            }
        };
        // The keeper was killed with the tree: reap it now rather than in the background.
        let _ = started.keeper.wait().await;
        let status = status.ok_or_else(|| {
            ToolFailure::new(
                ErrorType::ExecutionError,
                "the command's keeper process was killed before the shell ended",
            )
        })?;
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
                fault: None,
            });
        }
        Ok(result)
    }

    /// Opens a file of the working directory without waiting (a named pipe would wait for
    /// its other end), and refuses anything that is not a regular file; returns its size.
    async fn open_regular(
        &self,
        path: &str,
        access: libc::c_int,
        flags: libc::c_int,
    ) -> Result<(tokio::fs::File, u64), ToolFailure> {
        let relative = self.resolve(path)?;
        let file = self
            .files
            .file(&relative, access | flags | libc::O_NONBLOCK, 0o666, Links::Inside)
            .map(tokio::fs::File::from_std)
            .map_err(|e| match e.raw_os_error() {
                // Opening a named pipe for writing, without a reader, fails so.
                Some(libc::ENXIO) => not_regular(path, "a named pipe"),
                // O_NOFOLLOW met a link.
                Some(libc::ELOOP) => ToolFailure::new(
                    ErrorType::PermissionError,
                    format!("`{path}` is a symbolic link; write to its target"),
                ),
                _ => not_found_or(e, path),
            })?;
        let meta = file.metadata().await.map_err(io_failure)?;
        let kind = meta.file_type();
        if !kind.is_file() {
            use std::os::unix::fs::FileTypeExt;
            let what = if kind.is_fifo() {
                "a named pipe"
            } else if kind.is_socket() {
                "a socket"
            } else if kind.is_dir() {
                "a folder"
            } else {
                "a device"
            };
            return Err(not_regular(path, what));
        }
        Ok((file, meta.len()))
    }

    async fn write_file(&self, path: &str, content: &str) -> Result<Value, ToolFailure> {
        let relative = self.resolve(path)?;
        if let Some(parent) = relative.parent() {
            self.files.create_dir_all(parent).map_err(|e| not_found_or(e, path))?;
        }
        // O_NOFOLLOW: a link in the file's place is refused, not followed.
        // No O_TRUNC: the file is cut only once it is known to be ours alone.
        let (mut file, _) = self.open_regular(path, libc::O_WRONLY | libc::O_CREAT, libc::O_NOFOLLOW).await?;
        // Another hard link to the file may be outside the working directory.
        let links = {
            use std::os::unix::fs::MetadataExt;
            file.metadata().await.map_err(io_failure)?.nlink()
        };
        if links > 1 {
            return Err(ToolFailure::new(
                ErrorType::PermissionError,
                format!("`{path}` has {links} hard links: writing it would change the file under its other names too"),
            )
            .suggest("remove it first, or write to a new file"));
        }
        file.set_len(0).await.map_err(io_failure)?;
        file.write_all(content.as_bytes()).await.map_err(io_failure)?;
        file.flush().await.map_err(io_failure)?;
        Ok(json!({"path": path, "bytes": content.len()}))
    }

    async fn list_dir(&self, path: &str) -> Result<Value, ToolFailure> {
        let relative = self.resolve(path)?;
        // Off the runtime's threads: a folder may hold many entries.
        let files = self.files.clone();
        let listed =
            tokio::task::spawn_blocking(move || files.dir(&relative, Links::Inside).and_then(|d| beneath::entries(&d)))
                .await
                .map_err(|e| ToolFailure::new(ErrorType::ExecutionError, format!("the listing failed: {e}")))?;
        let listed = listed.map_err(|e| not_found_or(e, path))?;
        let mut entries = Vec::new();
        for entry in listed {
            let kind = match entry.kind {
                Kind::Dir => "dir",
                Kind::File => "file",
                _ => "other",
            };
            entries.push(json!({"name": entry.name.to_string_lossy(), "type": kind, "size": entry.size}));
        }
        entries.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
        Ok(json!({"path": path, "entries": entries}))
    }
}

#[derive(Deserialize)]
struct RunCommandArgs {
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
struct NameArg {
    name: String,
}

#[async_trait]
impl World for ShellWorld {
    async fn call(&self, actor: &Actor, name: &str, arguments: Value) -> Result<Value, ToolFailure> {
        tool::call(TOOLS, Shell.name(), self, actor, name, arguments).await
    }

    fn program_folders(&self) -> Option<(PathBuf, PathBuf)> {
        // A program agent's own sandbox covers `tmp/` as well: it must be there. Were it
        // not made, the program could not write it, and would say so.
        if self.place.is_none() {
            let _ = self.dir.make_tmp();
        }
        Some((self.root.clone(), self.tmp.clone()))
    }

    fn files(&self) -> Option<&dyn FileWorld> {
        Some(self)
    }

    async fn changed_files(&self, actor: &Actor) -> Vec<String> {
        self.changed_for(actor).await
    }

    fn describe(&self) -> Map<String, Value> {
        let mut info = Map::new();
        info.insert("cwd".into(), Value::String(self.inside.display().to_string()));
        info.insert("sandbox".into(), self.sandbox.enforced().clone());
        info
    }

    async fn teardown(&mut self) {
        // Every process a command started died with the command (`sandbox/process.rs`); what is
        // left is the folder. It is removed off the runtime's threads, as it may hold many
        // files; dropping `dir` then finds nothing, or retries what failed here.
        self.sandbox.kill_all();
        // An image's root goes first: its processes with it, then its layer can go.
        if let Some(place) = &self.place {
            place.stop().await;
        }
        match &self.keep {
            Some(to) => {
                if let Err(e) = self.dir.keep(to) {
                    eprintln!("warning: the world could not be kept in {}: {e}", to.display());
                }
            }
            // Only a folder no process ran in can go to another episode (`give_back`).
            None if self.place.is_none() => self.dir.give_back().await,
            None => self.dir.remove().await,
        }
        self.checkpoints.teardown().await;
    }
}

#[async_trait]
impl FileWorld for ShellWorld {
    fn working_directory(&self) -> Option<&std::path::Path> {
        Some(&self.root)
    }

    fn image_root(&self) -> Option<crate::environment::ImageRoot> {
        self.place.as_ref().map(|place| place.root())
    }

    async fn read_back(&self, path: &str, cap: usize) -> Result<ReadBack, ToolFailure> {
        let (file, size) = self.open_regular(path, libc::O_RDONLY, 0).await?;
        let read = read_start(file, size, cap).await?;
        let text = match String::from_utf8(read.kept) {
            Ok(text) => text,
            // A cut may split a character: keep what comes before it.
            Err(e) if read.total > cap && e.utf8_error().error_len().is_none() => {
                let valid = e.utf8_error().valid_up_to();
                let mut bytes = e.into_bytes();
                bytes.truncate(valid);
                String::from_utf8(bytes).unwrap_or_default()
            }
            Err(_) => return Err(ToolFailure::new(ErrorType::ExecutionError, format!("`{path}` is not UTF-8 text"))),
        };
        Ok(ReadBack { text, size })
    }

    async fn run_check(&self, command: &str, timeout_s: f64) -> Result<(i32, String), ToolFailure> {
        let args = RunCommandArgs { command: command.to_owned(), timeout_s: Some(timeout_s) };
        let out = match self.run_command(args).await {
            Ok(out) => out,
            Err(f) if f.kind == ErrorType::OutputTruncated => f.partial.unwrap_or_default(),
            Err(f) => return Err(f),
        };
        let code = out["exit_code"].as_i64().map_or(-1, |c| c as i32);
        let text =
            format!("{}{}", out["stdout"].as_str().unwrap_or_default(), out["stderr"].as_str().unwrap_or_default());
        Ok((code, text))
    }
}

fn io_failure(e: std::io::Error) -> ToolFailure {
    ToolFailure::io("", e)
}

fn not_regular(path: &str, what: &str) -> ToolFailure {
    ToolFailure::new(
        ErrorType::PermissionError,
        format!("`{path}` is {what}, not a regular file: it is not read or written"),
    )
}

/// The refusal of a path outside the working directory.
fn outside(given: &str) -> ToolFailure {
    ToolFailure::new(ErrorType::PermissionError, format!("`{given}` is outside the working directory"))
        .suggest("use a path relative to the working directory")
}

fn not_found_or(e: std::io::Error, path: &str) -> ToolFailure {
    // The kernel refused a path or a link leading out of the working directory.
    if e.raw_os_error() == Some(libc::EXDEV) {
        return outside(path);
    }
    if e.kind() == std::io::ErrorKind::NotFound {
        ToolFailure::new(ErrorType::ExecutionError, format!("`{path}` does not exist"))
            .suggest("call list_dir to see the files")
    } else {
        io_failure(e)
    }
}

/// Reads the first `cap` bytes of a regular file of `size` bytes, and no more: a file may
/// be far larger than memory (a sparse file of 20 GB costs nothing to make).
async fn read_start(file: tokio::fs::File, size: u64, cap: usize) -> Result<Captured, ToolFailure> {
    let mut kept = Vec::new();
    file.take(cap as u64).read_to_end(&mut kept).await.map_err(io_failure)?;
    let total = usize::try_from(size).unwrap_or(usize::MAX).max(kept.len());
    Ok(Captured { kept, total })
}

#[cfg(test)]
mod tests;
