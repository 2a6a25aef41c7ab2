//! The run's folder: opened fresh or resumed ([`open_run`]: the folder, its log, its lock),
//! staged under a hidden name until its first event is in place, its `run.json`, and the
//! scratch folder beside it where episodes make their working directories.

use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::{RunError, RunOptions, episode_count, revision, sandbox_mode, suite_info};
use crate::log::event::SuiteInfo;
use crate::log::{Event, EventLog, LogWriter};
use crate::suite::Suite;

/// A run's folder, opened: fresh or resumed, its log appended to, its lock held.
pub(super) struct OpenRun {
    pub run_id: String,
    pub dir: PathBuf,
    pub events_path: PathBuf,
    pub log: EventLog,
    pub writer: LogWriter,
    /// The run folder's lock: held until the tables are written.
    pub lock: std::fs::File,
}

/// Opens the run's folder: a resumed run's, its lock already taken, with `run_resumed`
/// appended; or a new one, which appears with its first event (`run_started`) in place, or
/// not at all, so that a kill at any moment leaves a run that resumes, or none.
pub(super) fn open_run(suites: &[Arc<Suite>], options: &RunOptions) -> Result<OpenRun, RunError> {
    let total = episode_count(suites, options);
    if let Some(resume) = &options.resume {
        // The lock was taken before the plan was made from the log.
        let lock = resume.lock.try_clone().map_err(RunError::Log)?;
        let events_path = resume.dir.join("events.jsonl");
        let (log, writer) = EventLog::append(&events_path, &resume.run_id, resume.last_seq).map_err(RunError::Log)?;
        log.emit(
            None,
            &Event::RunResumed {
                runner_version: env!("CARGO_PKG_VERSION").into(),
                command_line: options.command_line.clone(),
                episodes: total,
                kept: resume.keep.len() as u64,
            },
        );
        let (run_id, dir) = (resume.run_id.clone(), resume.dir.clone());
        return Ok(OpenRun { run_id, dir, events_path, log, writer, lock });
    }
    let run_id = options.run_id.clone().unwrap_or_else(super::new_run_id);
    let staged = StagedRun::new(&options.out_dir, &run_id)?;
    let lock = lock(staged.path()).map_err(RunError::Locked)?;
    let started = run_started(suites, options, total);
    write_run_json(staged.path(), &run_id, &started).map_err(RunError::Log)?;
    let first = std::fs::File::create_new(staged.path().join("events.jsonl")).map_err(RunError::Log)?;
    let mut line = Vec::new();
    crate::log::writer::write_event(&mut line, &run_id, 1, &started).map_err(RunError::Log)?;
    std::io::Write::write_all(&mut &first, &line).map_err(RunError::Log)?;
    first.sync_data().map_err(RunError::Log)?;
    let dir = staged.publish()?;
    let events_path = dir.join("events.jsonl");
    let (log, writer) = EventLog::append(&events_path, &run_id, 1).map_err(RunError::Log)?;
    Ok(OpenRun { run_id, dir, events_path, log, writer, lock })
}

/// A new run's `run_started`: how it was asked for, its suites and what it will make.
fn run_started(suites: &[Arc<Suite>], options: &RunOptions, episodes: u64) -> Event {
    Event::RunStarted {
        runner_version: env!("CARGO_PKG_VERSION").into(),
        command_line: options.command_line.clone(),
        models: options.models.iter().map(|m| m.name().to_owned()).collect(),
        suites: suites
            .iter()
            .map(|s| SuiteInfo {
                epochs: options.epochs.unwrap_or(s.epochs),
                sandbox: s.environment.sandbox_check(sandbox_mode(s, options.sandbox)).ok().flatten(),
                ..suite_info(s)
            })
            .collect(),
        // With the episodes carried from an earlier run: the run holds them all.
        episodes: episodes + options.since.as_ref().map_or(0, |s| s.carried.len() as u64),
        jobs: options.jobs,
        git_revision: revision::git_revision(suites.first().map(|s| s.path.as_path())),
        shard: options.shard.map(|(i, n)| format!("{i}/{n}")),
        merged_from: Vec::new(),
        limits: options.limits,
        warnings: options.warnings.clone(),
        selection: options.selection.clone(),
        since: options.since.as_ref().map(|s| s.summary.clone()),
    }
}

/// Takes the run folder's lock, held while the returned file is open: one process at a
/// time appends to a run's log (a run, its resumption, a regrade).
pub fn lock(dir: &Path) -> Result<std::fs::File, String> {
    use std::os::fd::AsRawFd as _;
    let path = dir.join(".lock");
    let file = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("failed to open {}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor we own; it is released when the file closes.
    let taken = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if taken != 0 {
        return Err(format!("another runner is writing to {} (its .lock is held); wait for it to end", dir.display()));
    }
    Ok(file)
}

/// The first of the worlds a suite's episodes can have (its own, its toolsets', its
/// variants') that makes folders in the scratch folder.
pub(super) fn world_making_folders(suite: &Suite) -> Option<&Arc<crate::environment::definition::Definition>> {
    let variants = suite.variants.iter().filter_map(|v| v.environment.as_ref());
    std::iter::once(&suite.environment)
        .chain(suite.toolsets.iter().map(|t| &t.environment))
        .chain(variants)
        .find(|d| d.makes_folders())
}

/// The run's scratch folder, where episodes make their working directories:
/// `$TMPDIR/runner-<run id>-<hash of the run folder>`, made when the first world that makes
/// folders is set up (a run of in-memory worlds makes none). A run killed outright leaves it
/// behind; its resumption, which holds the run's lock, removes it before starting. Removed
/// when dropped.
#[derive(Debug)]
pub struct Scratch {
    path: PathBuf,
    /// Whether it was made, or why it could not be.
    made: std::sync::OnceLock<Result<(), String>>,
}

impl Scratch {
    pub fn at(run_dir: &Path) -> std::io::Result<Scratch> {
        let canonical = run_dir.canonicalize()?;
        let name = canonical.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let name: String =
            name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
        let hash = hex::encode(Sha256::digest(canonical.as_os_str().as_encoded_bytes()));
        let path = std::env::temp_dir().join(format!("runner-{name}-{}", &hash[..12]));
        match crate::environment::remove_tree(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(std::io::Error::other(format!(
                    "failed to remove the scratch folder of an earlier run {}: {e}",
                    path.display()
                )));
            }
        }
        Ok(Scratch { path, made: std::sync::OnceLock::new() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Makes the folder, once, when a world of `definition` makes folders in it.
    pub fn made_for(&self, definition: &crate::environment::definition::Definition) -> Result<(), String> {
        if !definition.makes_folders() {
            return Ok(());
        }
        let made = self.made.get_or_init(|| {
            // Its name can be guessed: a folder someone else made there meanwhile is
            // refused, not used, and ours is private.
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&self.path)
                .map_err(|e| format!("failed to create the scratch folder {}: {e}", self.path.display()))
        });
        made.clone()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.made.get().is_some_and(Result::is_ok) {
            crate::environment::forget_spares(&self.path);
            let _ = crate::environment::remove_tree(&self.path);
        }
    }
}

/// A run folder being filled under a hidden name beside its final one
/// (`<out_dir>/.<run-id>.XXXXXX`), removed if dropped; [`StagedRun::publish`] renames it to
/// `<out_dir>/<run-id>` in one step, so that a run folder never exists half made.
pub(crate) struct StagedRun {
    staged: tempfile::TempDir,
    dir: PathBuf,
}

impl StagedRun {
    /// Refuses a run id whose folder exists.
    pub(crate) fn new(out_dir: &Path, run_id: &str) -> Result<StagedRun, RunError> {
        let dir = out_dir.join(run_id);
        if dir.exists() {
            return Err(RunError::Exists(dir.display().to_string()));
        }
        let folder = |source| RunError::Folder { path: dir.display().to_string(), source };
        std::fs::create_dir_all(out_dir).map_err(folder)?;
        // The mode a plain folder gets (0777 less the umask), not a temporary one's 0700:
        // others (a merge job, a web server) may read runs.
        let staged = tempfile::Builder::new()
            .prefix(&format!(".{run_id}."))
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .tempdir_in(out_dir)
            .map_err(folder)?;
        Ok(StagedRun { staged, dir })
    }

    pub(crate) fn path(&self) -> &Path {
        self.staged.path()
    }

    /// Renames the folder to its final name; refuses to replace one made meanwhile.
    pub(crate) fn publish(self) -> Result<PathBuf, RunError> {
        let StagedRun { staged, dir } = self;
        let folder = |source| RunError::Folder { path: dir.display().to_string(), source };
        rename_no_replace(staged.path(), &dir).map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::DirectoryNotEmpty => {
                RunError::Exists(dir.display().to_string())
            }
            _ => folder(e),
        })?;
        // Renamed: nothing is left at the staged path to remove.
        let _ = staged.keep();
        Ok(dir)
    }
}

/// `rename(2)` that fails when `to` exists (a plain rename would replace an empty folder).
fn rename_no_replace(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(|_| std::io::Error::other("a NUL byte in a path"))
    };
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: two NUL-terminated paths that outlive the call.
    let done =
        unsafe { libc::renameat2(libc::AT_FDCWD, from.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::RENAME_NOREPLACE) };
    if done == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// run.json: the resolved configuration, for people and tools that do not read logs.
pub(crate) fn write_run_json(dir: &Path, run_id: &str, started: &Event) -> std::io::Result<()> {
    let mut run_json = serde_json::to_value(started).unwrap_or_default();
    if let Some(obj) = run_json.as_object_mut() {
        obj.remove("type");
        obj.insert("run_id".into(), serde_json::Value::String(run_id.into()));
        obj.insert("started_at".into(), serde_json::Value::String(chrono::Utc::now().to_rfc3339()));
    }
    let bytes = serde_json::to_vec_pretty(&run_json).unwrap_or_default();
    std::fs::write(dir.join("run.json"), crate::log::secrets::scrub_bytes(&bytes))
}
