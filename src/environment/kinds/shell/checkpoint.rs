//! Checkpoints of a working directory: `checkpoint(name)` copies its tree into a private
//! folder outside it, and `restore(name)` makes the tree what it was then, so that an agent
//! can try an approach and roll back.
//!
//! A copy never follows a symbolic link (the link itself is copied), skips what is neither
//! file, folder nor link (named pipes, sockets, devices: the result names them), and counts
//! against one size limit over all of an episode's checkpoints. A restore writes a file
//! back as a new file, never through the old one (it may have hard links elsewhere).

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::fs::{self, File};
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Value, json};

use crate::contract::ErrorType;
use crate::environment::ToolFailure;
use crate::environment::beneath::{self, Beneath, Kind, Links};

/// How many paths a result lists, of each kind; the counts are always whole.
const LISTED: usize = 20;

/// How deep a tree a checkpoint copies: the walks recurse, and a tree made deeper on
/// purpose must not overflow their stack.
const MAX_DEPTH: usize = 256;

/// An episode's checkpoints, kept in a folder beside its working directory.
pub struct Checkpoints {
    /// Where the checkpoints' folder is made, at the first checkpoint.
    parent: PathBuf,
    /// The most bytes of file content all checkpoints together may hold.
    limit: u64,
    /// Held for a whole checkpoint or restore: two of them never interleave.
    state: tokio::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    folder: Option<tempfile::TempDir>,
    taken: BTreeMap<String, Snapshot>,
    /// Copies made so far: each goes to a folder of its own number, never reused.
    made: u64,
}

#[derive(Debug, Clone)]
struct Snapshot {
    dir: PathBuf,
    bytes: u64,
    /// Each folder's mode, kept aside: the copies' own folders stay writable, so that
    /// they can always be removed.
    folder_modes: Vec<(PathBuf, u32)>,
}

/// What a copy held.
#[derive(Debug, Default)]
struct Copied {
    files: u64,
    folders: u64,
    links: u64,
    bytes: u64,
    skipped: Vec<String>,
    folder_modes: Vec<(PathBuf, u32)>,
}

/// What a restore changed.
#[derive(Debug, Default, PartialEq)]
pub struct Changes {
    /// Files and links written back: changed or deleted since the checkpoint.
    pub restored: Vec<String>,
    /// Files, links and folders made since the checkpoint, now removed.
    pub removed: Vec<String>,
    pub unchanged: u64,
}

#[derive(Debug)]
enum CopyError {
    TooLarge { needed: u64 },
    Io(String),
}

impl Checkpoints {
    /// Checkpoints kept in a new folder in `parent` (outside the working directory).
    pub fn new(parent: &Path, limit: u64) -> Self {
        Checkpoints { parent: parent.to_owned(), limit, state: tokio::sync::Mutex::new(State::default()) }
    }

    /// Copies the tree of `work` as checkpoint `name`, replacing one of that name.
    pub async fn take(&self, work: &Arc<Beneath>, name: &str) -> Result<Value, ToolFailure> {
        check_name(name)?;
        let mut state = self.state.lock().await;
        let used_by_others: u64 = state.taken.iter().filter(|(n, _)| *n != name).map(|(_, s)| s.bytes).sum();
        let budget = self.limit.saturating_sub(used_by_others);
        let folder = match &state.folder {
            Some(folder) => folder.path().to_owned(),
            None => {
                let folder = tempfile::Builder::new()
                    .prefix("runner-checkpoints-")
                    .tempdir_in(&self.parent)
                    .map_err(|e| ToolFailure::io("failed to make the checkpoints' folder", e))?;
                let path = folder.path().to_owned();
                state.folder = Some(folder);
                path
            }
        };
        state.made += 1;
        let dir = folder.join(state.made.to_string());
        let (from, to) = (work.clone(), dir.clone());
        let copied = tokio::task::spawn_blocking(move || {
            let copied = copy_all(&from, &to, budget);
            if copied.is_err() {
                let _ = remove_tree(&to);
            }
            copied
        })
        .await
        .map_err(|e| ToolFailure::new(ErrorType::ExecutionError, format!("the copy failed: {e}")))?;
        let copied = match copied {
            Ok(copied) => copied,
            Err(CopyError::TooLarge { needed }) => {
                let count = state.taken.keys().filter(|n| *n != name).count();
                return Err(ToolFailure::new(
                    ErrorType::ExecutionError,
                    format!(
                        "checkpoint `{name}` refused: it needs {needed} bytes, and {budget} of the checkpoint \
                         limit of {} bytes are left ({used_by_others} bytes used by {count} other checkpoint(s))",
                        self.limit
                    ),
                )
                .suggest("replace an old checkpoint by reusing its name, or remove large files first"));
            }
            Err(CopyError::Io(message)) => {
                return Err(ToolFailure::new(
                    ErrorType::ExecutionError,
                    format!("checkpoint `{name}` failed: {message}"),
                ));
            }
        };
        let snapshot = Snapshot { dir, bytes: copied.bytes, folder_modes: copied.folder_modes };
        if let Some(old) = state.taken.insert(name.to_owned(), snapshot) {
            let _ = tokio::task::spawn_blocking(move || remove_tree(&old.dir)).await;
        }
        let used: u64 = state.taken.values().map(|s| s.bytes).sum();
        Ok(json!({
            "name": name, "files": copied.files, "folders": copied.folders, "links": copied.links,
            "bytes": copied.bytes, "skipped": copied.skipped,
            "checkpoints": state.taken.keys().collect::<Vec<_>>(),
            "bytes_used": used, "bytes_limit": self.limit,
        }))
    }

    /// Makes the tree of `work` what it was at checkpoint `name`.
    pub async fn restore(&self, work: &Arc<Beneath>, name: &str) -> Result<Value, ToolFailure> {
        check_name(name)?;
        let state = self.state.lock().await;
        let Some(snapshot) = state.taken.get(name).cloned() else {
            let known: Vec<&str> = state.taken.keys().map(String::as_str).collect();
            let listed = if known.is_empty() { "there are none yet".to_owned() } else { known.join(", ") };
            return Err(ToolFailure::new(ErrorType::ExecutionError, format!("no checkpoint named `{name}`"))
                .suggest(format!("restore one of the checkpoints taken ({listed}), or call checkpoint first")));
        };
        let work = work.clone();
        let changes = tokio::task::spawn_blocking(move || restore_all(&snapshot, &work))
            .await
            .map_err(|e| ToolFailure::new(ErrorType::ExecutionError, format!("the restore failed: {e}")))?
            .map_err(|e| ToolFailure::new(ErrorType::ExecutionError, format!("restore of `{name}` failed: {e}")))?;
        let listed = |paths: &[String]| paths.iter().take(LISTED).cloned().collect::<Vec<_>>();
        Ok(json!({
            "name": name, "restored": changes.restored.len(), "removed": changes.removed.len(),
            "unchanged": changes.unchanged, "restored_paths": listed(&changes.restored),
            "removed_paths": listed(&changes.removed),
        }))
    }

    /// Removes the checkpoints' folder, off the runtime's threads.
    pub async fn teardown(&self) {
        let folder = self.state.lock().await.folder.as_ref().map(|f| f.path().to_owned());
        if let Some(folder) = folder {
            let _ = tokio::task::spawn_blocking(move || remove_tree(&folder)).await;
        }
    }
}

fn check_name(name: &str) -> Result<(), ToolFailure> {
    let bad = name.is_empty()
        || name.len() > 100
        || name == "."
        || name == ".."
        || name.chars().any(|c| c == '/' || c == '\\' || c.is_control());
    if bad {
        return Err(ToolFailure::new(
            ErrorType::ValidationError,
            format!("`{name}` is not a checkpoint name: use 1 to 100 characters, without slashes"),
        ));
    }
    Ok(())
}

/// Copies the tree of `work` into the new folder `to`, refusing when its files hold more
/// than `budget` bytes.
fn copy_all(work: &Beneath, to: &Path, budget: u64) -> Result<Copied, CopyError> {
    // Measured first, so that a refusal says how much was needed.
    let needed = measure(work).map_err(|e| CopyError::Io(e.to_string()))?;
    if needed > budget {
        return Err(CopyError::TooLarge { needed });
    }
    let mut copied = Copied::default();
    fs::create_dir(to).map_err(|e| CopyError::Io(format!("failed to make {}: {e}", to.display())))?;
    copy_tree(work, to, Path::new(""), budget, &mut copied, 0)?;
    Ok(copied)
}

/// The bytes of the regular files of `work`, links not followed.
fn measure(work: &Beneath) -> std::io::Result<u64> {
    let mut total: u64 = 0;
    let mut deep = false;
    work.walk(Path::new(""), usize::MAX, MAX_DEPTH + 2, |rel, entry| {
        if entry.kind == Kind::File {
            total = total.saturating_add(entry.size);
        }
        if entry.kind == Kind::Dir && rel.components().count() > MAX_DEPTH {
            deep = true;
            return false;
        }
        true
    })?;
    if deep {
        return Err(std::io::Error::other(format!("the tree is more than {MAX_DEPTH} folders deep")));
    }
    Ok(total)
}

fn copy_tree(
    work: &Beneath,
    to: &Path,
    rel: &Path,
    budget: u64,
    copied: &mut Copied,
    depth: usize,
) -> Result<(), CopyError> {
    let io = |what: &Path, e: std::io::Error| CopyError::Io(format!("`{}`: {e}", what.display()));
    if depth > MAX_DEPTH {
        return Err(CopyError::Io(format!("the tree is more than {MAX_DEPTH} folders deep")));
    }
    let dir = work.dir(rel, Links::None).map_err(|e| io(rel, e))?;
    let entries = beneath::entries(&dir).map_err(|e| io(rel, e))?;
    for entry in entries {
        let (target, rel) = (to.join(&entry.name), rel.join(&entry.name));
        let name = beneath::c_name(&entry.name).map_err(|e| io(&rel, e))?;
        match entry.kind {
            Kind::Link => {
                let points_to = beneath::read_link_at(dir.as_raw_fd(), &name).map_err(|e| io(&rel, e))?;
                std::os::unix::fs::symlink(points_to, &target).map_err(|e| io(&rel, e))?;
                copied.links += 1;
            }
            Kind::Dir => {
                fs::create_dir(&target).map_err(|e| io(&rel, e))?;
                copied.folder_modes.push((rel.clone(), entry.mode));
                copied.folders += 1;
                copy_tree(work, &target, &rel, budget, copied, depth + 1)?;
            }
            Kind::File => {
                let left = budget.saturating_sub(copied.bytes);
                let from = open_at(dir.as_raw_fd(), &name).map_err(|e| io(&rel, e))?;
                match copy_file(from, &target, left).map_err(|e| io(&rel, e))? {
                    Some(n) => {
                        copied.bytes += n;
                        copied.files += 1;
                    }
                    // It grew past the limit while being copied.
                    None => {
                        return Err(CopyError::TooLarge {
                            needed: copied.bytes.saturating_add(left).saturating_add(1),
                        });
                    }
                }
            }
            Kind::Other => copied.skipped.push(rel.display().to_string()),
        }
    }
    Ok(())
}

/// Opens the entry `name` of the folder `at` to read it, never following a link nor
/// waiting on a pipe.
fn open_at(at: RawFd, name: &CStr) -> std::io::Result<File> {
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC;
    // SAFETY: openat of one name in a folder held open; the descriptor is owned here.
    let fd = unsafe { libc::openat(at, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor, owned by nothing else.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Copies one regular file, keeping its mode, into a new file `target` (of the
/// checkpoints' own folder); `None` when it holds more than `cap` bytes.
fn copy_file(mut from: File, target: &Path, cap: u64) -> std::io::Result<Option<u64>> {
    let meta = from.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other("it is no longer a regular file"));
    }
    let mut to = fs::OpenOptions::new().write(true).create_new(true).mode(meta.permissions().mode()).open(target)?;
    let n = std::io::copy(&mut (&mut from).take(cap.saturating_add(1)), &mut to)?;
    // `mode` on create is cut by the umask: set it as it was.
    to.set_permissions(meta.permissions())?;
    Ok((n <= cap).then_some(n))
}

/// Writes the snapshot's file `source` as the new entry `name` of the folder `at` of the
/// working directory, with its mode.
fn write_back(source: &Path, at: RawFd, name: &CStr) -> std::io::Result<()> {
    let mut from = fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(source)?;
    let mode = from.metadata()?.permissions().mode();
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: openat of one name in a folder held open; the descriptor is owned here.
    let fd = unsafe { libc::openat(at, name.as_ptr(), flags, 0o600 as libc::c_uint) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor, owned by nothing else.
    let mut to = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    std::io::copy(&mut from, &mut to)?;
    to.set_permissions(fs::Permissions::from_mode(mode))
}

/// Makes the tree of `work` the snapshot's again: what is new is removed, what changed or
/// went is written back, what is the same is left alone.
fn restore_all(snapshot: &Snapshot, work: &Beneath) -> Result<Changes, String> {
    let mut changes = Changes::default();
    sync_tree(&snapshot.dir, work, Path::new(""), &mut changes)?;
    // Deepest first: a folder that may not be written is closed only once filled.
    for (rel, mode) in snapshot.folder_modes.iter().rev() {
        let io = |e: std::io::Error| format!("`{}`: {e}", rel.display());
        let folder = work.open_at(rel, libc::O_PATH | libc::O_DIRECTORY, 0, Links::None).map_err(io)?;
        beneath::chmod_fd(folder.as_raw_fd(), *mode).map_err(io)?;
    }
    Ok(changes)
}

/// Opens the folder `rel` of `work` (never through a link), made readable, writable and
/// searchable by its owner first: a folder closed since would keep its entries (its mode
/// is set back at the end).
fn open_for_sync(work: &Beneath, rel: &Path) -> std::io::Result<OwnedFd> {
    let path = work.open_at(rel, libc::O_PATH | libc::O_DIRECTORY, 0, Links::None)?;
    let mode = beneath::fstat(path.as_raw_fd())?.st_mode & 0o7777;
    if mode & 0o700 != 0o700 {
        beneath::chmod_fd(path.as_raw_fd(), mode | 0o700)?;
    }
    beneath::openat2(
        path.as_raw_fd(),
        Path::new("."),
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        0,
        Links::None,
    )
}

fn sync_tree(snap: &Path, work: &Beneath, rel: &Path, changes: &mut Changes) -> Result<(), String> {
    let io = |what: &Path, e: std::io::Error| format!("`{}`: {e}", what.display());
    let dir = open_for_sync(work, rel).map_err(|e| io(rel, e))?;
    // What is here and was not then (or was something else then) goes.
    let present = beneath::entries(&dir).map_err(|e| io(rel, e))?;
    for entry in present {
        let then = snap.join(&entry.name);
        let rel = rel.join(&entry.name);
        let same_kind = fs::symlink_metadata(&then).is_ok_and(|m| {
            let t = m.file_type();
            let now = entry.kind;
            (t.is_dir(), t.is_file(), t.is_symlink()) == (now == Kind::Dir, now == Kind::File, now == Kind::Link)
        });
        if !same_kind {
            let name = beneath::c_name(&entry.name).map_err(|e| io(&rel, e))?;
            if entry.kind == Kind::Dir {
                let mut gone = Vec::new();
                let _ = work.walk(&rel, usize::MAX, MAX_DEPTH, |path, e| {
                    if e.kind != Kind::Dir {
                        gone.push(path.display().to_string());
                    }
                    true
                });
                crate::environment::remove_tree_at(dir.as_raw_fd(), &name).map_err(|e| io(&rel, e))?;
                changes.removed.extend(gone);
            } else {
                unlink_at(dir.as_raw_fd(), &name, 0).map_err(|e| io(&rel, e))?;
                changes.removed.push(rel.display().to_string());
            }
        }
    }
    // What was then is made so again.
    let mut then: Vec<_> = fs::read_dir(snap)
        .map_err(|e| io(rel, e))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(|e| io(rel, e))?;
    then.sort();
    let mut dir = Some(dir);
    for name in then {
        let (source, rel) = (snap.join(&name), rel.join(&name));
        let c_name = beneath::c_name(&name).map_err(|e| io(&rel, e))?;
        // The folder is opened again after a sub-folder was synced.
        let at = match &dir {
            Some(dir) => dir.as_raw_fd(),
            None => dir
                .insert(open_for_sync(work, rel.parent().unwrap_or(Path::new(""))).map_err(|e| io(&rel, e))?)
                .as_raw_fd(),
        };
        let kind = fs::symlink_metadata(&source).map_err(|e| io(&rel, e))?.file_type();
        let now = beneath::stat_at(at, &c_name).ok().map(|s| Kind::of(s.st_mode));
        if kind.is_dir() {
            if now.is_none() {
                // SAFETY: mkdirat of one name in a folder held open.
                if unsafe { libc::mkdirat(at, c_name.as_ptr(), 0o700) } != 0 {
                    return Err(io(&rel, std::io::Error::last_os_error()));
                }
            }
            dir = None;
            sync_tree(&source, work, &rel, changes)?;
            continue;
        }
        let same = if kind.is_symlink() {
            now == Some(Kind::Link) && fs::read_link(&source).ok() == beneath::read_link_at(at, &c_name).ok()
        } else {
            now == Some(Kind::File)
                && same_file_content(&source, open_at(at, &c_name).map_err(|e| io(&rel, e))?)
                    .map_err(|e| io(&rel, e))?
        };
        if same {
            changes.unchanged += 1;
            continue;
        }
        if now.is_some() {
            unlink_at(at, &c_name, 0).map_err(|e| io(&rel, e))?;
        }
        if kind.is_symlink() {
            let points_to = fs::read_link(&source).map_err(|e| io(&rel, e))?;
            let target = beneath::c_path(&points_to).map_err(|e| io(&rel, e))?;
            // SAFETY: symlinkat of one name in a folder held open.
            if unsafe { libc::symlinkat(target.as_ptr(), at, c_name.as_ptr()) } != 0 {
                return Err(io(&rel, std::io::Error::last_os_error()));
            }
        } else {
            write_back(&source, at, &c_name).map_err(|e| io(&rel, e))?;
        }
        changes.restored.push(rel.display().to_string());
    }
    Ok(())
}

fn unlink_at(at: RawFd, name: &CStr, flags: libc::c_int) -> std::io::Result<()> {
    // SAFETY: unlinkat of one name in a folder held open.
    if unsafe { libc::unlinkat(at, name.as_ptr(), flags) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether two regular files have the same mode and bytes (read without following links).
fn same_file_content(a: &Path, mut b: File) -> std::io::Result<bool> {
    let mut a = fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(a)?;
    let (ma, mb) = (a.metadata()?, b.metadata()?);
    if !mb.is_file() || ma.len() != mb.len() || ma.permissions().mode() != mb.permissions().mode() {
        return Ok(false);
    }
    let (mut buf_a, mut buf_b) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let n = a.read(&mut buf_a)?;
        if n == 0 {
            return Ok(b.read(&mut buf_b[..1])? == 0);
        }
        b.read_exact(&mut buf_b[..n]).map(|_| ()).or_else(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => Ok(()),
            _ => Err(e),
        })?;
        if buf_a[..n] != buf_b[..n] {
            return Ok(false);
        }
    }
}

/// Removes a folder of the checkpoints' own (no command can reach it).
fn remove_tree(path: &Path) -> std::io::Result<()> {
    crate::environment::remove_tree(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every entry under `root`: its path, and what it is (file contents, link target, or a folder).
    fn tree(root: &Path) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
            for entry in fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                let rel = path.strip_prefix(root).unwrap().display().to_string();
                let meta = fs::symlink_metadata(&path).unwrap();
                let mode = meta.permissions().mode() & 0o777;
                if meta.file_type().is_symlink() {
                    out.insert(rel, format!("-> {}", fs::read_link(&path).unwrap().display()));
                } else if meta.is_dir() {
                    out.insert(rel, format!("dir {mode:o}"));
                    walk(&path, root, out);
                } else {
                    out.insert(rel, format!("{mode:o} {}", fs::read_to_string(&path).unwrap()));
                }
            }
        }
        walk(root, root, &mut out);
        out
    }

    struct Setup {
        _scratch: tempfile::TempDir,
        root: PathBuf,
        work: Arc<Beneath>,
        outside: PathBuf,
        checkpoints: Checkpoints,
    }

    fn setup(limit: u64) -> Setup {
        let scratch = tempfile::tempdir().unwrap();
        let root = scratch.path().join("work");
        fs::create_dir_all(root.join("src/deep")).unwrap();
        fs::write(root.join("a.txt"), "alpha").unwrap();
        fs::write(root.join("src/main.rs"), "fn main() {}").unwrap();
        fs::write(root.join("src/deep/run.sh"), "echo hi").unwrap();
        fs::set_permissions(root.join("src/deep/run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("a.txt", root.join("link")).unwrap();
        let outside = scratch.path().join("outside.txt");
        fs::write(&outside, "not mine").unwrap();
        let checkpoints = Checkpoints::new(scratch.path(), limit);
        let work = Arc::new(Beneath::open(&root).unwrap());
        Setup { _scratch: scratch, root, work, outside, checkpoints }
    }

    #[tokio::test]
    async fn restore_brings_back_the_exact_tree_and_says_what_changed() {
        let s = setup(1 << 20);
        let before = tree(&s.root);
        let taken = s.checkpoints.take(&s.work, "start").await.unwrap();
        assert_eq!(
            (taken["files"].clone(), taken["links"].clone(), taken["bytes"].clone()),
            (3.into(), 1.into(), 24.into())
        );

        fs::write(s.root.join("a.txt"), "changed").unwrap();
        fs::write(s.root.join("new.txt"), "new").unwrap();
        fs::create_dir(s.root.join("made")).unwrap();
        fs::write(s.root.join("made/x"), "x").unwrap();
        fs::remove_file(s.root.join("src/main.rs")).unwrap();
        fs::remove_file(s.root.join("link")).unwrap();
        fs::write(s.root.join("link"), "a file where a link was").unwrap();
        fs::set_permissions(s.root.join("src/deep/run.sh"), fs::Permissions::from_mode(0o644)).unwrap();
        assert_ne!(tree(&s.root), before);

        let restored = s.checkpoints.restore(&s.work, "start").await.unwrap();
        assert_eq!(tree(&s.root), before);
        assert_eq!(restored["restored"], 4, "{restored}");
        assert_eq!(restored["removed"], 3, "{restored}");
        assert_eq!(restored["unchanged"], 0, "{restored}");
        let removed: Vec<&str> =
            restored["removed_paths"].as_array().unwrap().iter().filter_map(|p| p.as_str()).collect();
        assert_eq!(removed, ["link", "made/x", "new.txt"]);

        // A second restore finds nothing to do, and the checkpoint is still there.
        let again = s.checkpoints.restore(&s.work, "start").await.unwrap();
        assert_eq!(
            (again["restored"].clone(), again["removed"].clone(), again["unchanged"].clone()),
            (0.into(), 0.into(), 4.into())
        );
    }

    #[tokio::test]
    async fn an_unknown_or_malformed_name_is_an_error() {
        let s = setup(1 << 20);
        let err = s.checkpoints.restore(&s.work, "nope").await.unwrap_err();
        assert_eq!(err.kind, ErrorType::ExecutionError);
        assert_eq!(err.message, "no checkpoint named `nope`");
        assert!(err.suggested_action.unwrap().contains("there are none yet"));
        for bad in ["", "a/b", "..", "x\n"] {
            let err = s.checkpoints.take(&s.work, bad).await.unwrap_err();
            assert_eq!(err.kind, ErrorType::ValidationError, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn checkpoints_over_the_limit_are_refused_and_a_reused_name_frees_its_bytes() {
        // Room for one copy of the 24 bytes of files, not two.
        let s = setup(40);
        s.checkpoints.take(&s.work, "one").await.unwrap();
        let err = s.checkpoints.take(&s.work, "two").await.unwrap_err();
        assert!(err.message.contains("it needs 24 bytes, and 16 of the checkpoint limit of 40 bytes are left (24 bytes used by 1 other checkpoint(s))"), "{}", err.message);
        // Replacing `one` counts only the new copy.
        fs::write(s.root.join("a.txt"), "beta!").unwrap();
        let taken = s.checkpoints.take(&s.work, "one").await.unwrap();
        assert_eq!(taken["bytes_used"], 24);
        assert_eq!(taken["checkpoints"], json!(["one"]));
        // The refused copy left nothing behind: only `one`'s folder remains.
        let state = s.checkpoints.state.lock().await;
        let folder = state.folder.as_ref().unwrap().path();
        assert_eq!(fs::read_dir(folder).unwrap().count(), 1);
    }

    #[tokio::test]
    async fn links_are_copied_as_links_never_followed() {
        let s = setup(1 << 20);
        std::os::unix::fs::symlink(&s.outside, s.root.join("escape")).unwrap();
        std::os::unix::fs::symlink(s.outside.parent().unwrap(), s.root.join("up")).unwrap();
        let taken = s.checkpoints.take(&s.work, "c").await.unwrap();
        assert_eq!(taken["bytes"], 24, "the files behind the links were not copied: {taken}");
        // Changing the link's target and restoring leaves the target alone.
        fs::write(&s.outside, "changed outside").unwrap();
        fs::remove_file(s.root.join("escape")).unwrap();
        s.checkpoints.restore(&s.work, "c").await.unwrap();
        assert_eq!(fs::read_link(s.root.join("escape")).unwrap(), s.outside);
        assert_eq!(fs::read_to_string(&s.outside).unwrap(), "changed outside");
        // A link made since is removed, not what it points to.
        std::os::unix::fs::symlink(&s.outside, s.root.join("later")).unwrap();
        s.checkpoints.restore(&s.work, "c").await.unwrap();
        assert!(fs::symlink_metadata(s.root.join("later")).is_err());
        assert!(s.outside.exists());
    }

    #[tokio::test]
    async fn a_tree_too_deep_is_refused() {
        let s = setup(1 << 20);
        let deep: PathBuf = std::iter::repeat_n("d", MAX_DEPTH + 2).collect();
        fs::create_dir_all(s.root.join(deep)).unwrap();
        let err = s.checkpoints.take(&s.work, "c").await.unwrap_err();
        assert!(err.message.contains("more than 256 folders deep"), "{}", err.message);
    }

    #[tokio::test]
    async fn a_named_pipe_is_skipped_and_named() {
        let s = setup(1 << 20);
        let made = std::process::Command::new("mkfifo").arg(s.root.join("pipe")).status().unwrap();
        assert!(made.success());
        let taken = s.checkpoints.take(&s.work, "c").await.unwrap();
        assert_eq!(taken["skipped"], json!(["pipe"]));
        // Restore takes away what the checkpoint does not hold.
        let restored = s.checkpoints.restore(&s.work, "c").await.unwrap();
        assert_eq!(restored["removed_paths"], json!(["pipe"]));
    }

    #[tokio::test]
    async fn a_folder_closed_for_writing_is_restored_with_its_mode() {
        let s = setup(1 << 20);
        fs::set_permissions(s.root.join("src"), fs::Permissions::from_mode(0o555)).unwrap();
        let before = tree(&s.root);
        s.checkpoints.take(&s.work, "c").await.unwrap();
        fs::set_permissions(s.root.join("src"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(s.root.join("src/extra"), "x").unwrap();
        fs::set_permissions(s.root.join("src"), fs::Permissions::from_mode(0o555)).unwrap();
        s.checkpoints.restore(&s.work, "c").await.unwrap();
        assert_eq!(tree(&s.root), before);
        s.checkpoints.teardown().await;
        fs::set_permissions(s.root.join("src"), fs::Permissions::from_mode(0o755)).unwrap();
    }
}
