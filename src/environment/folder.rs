//! An episode's folder, for worlds that have files: `work/`, the working directory (and
//! `HOME`), seeded with the definition's and the task's `files:`, and `tmp/`, the
//! processes' `TMPDIR`, made with their sandbox (an episode that runs none makes none). Both
//! are what the sandbox lets a world's processes write. The folder of an episode in which
//! no process ran is emptied and given to a later episode of the run ([`EpisodeFolder::
//! give_back`]): making and removing folders is most of what such an episode costs (ext4
//! looks through its recently freed inodes for every folder it makes). Also
//! [`remove_tree`], which removes such a folder however deep a command made it.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use super::beneath::{Beneath, Kind, Links, fstat};
use crate::domain::{FileCopy, Task};

pub struct EpisodeFolder {
    /// `runner-episode-XXXX`, removed with [`remove_tree`] (a command may have made it
    /// deeper than a recursive removal's stack allows).
    dir: PathBuf,
    /// The working directory, with symlinks resolved.
    pub work: PathBuf,
    /// The processes' `TMPDIR`, beside `work`: made by [`EpisodeFolder::make_tmp`].
    pub tmp: PathBuf,
    /// Whether `tmp/` was made: a process may have run in the folder.
    tmp_made: AtomicBool,
    /// The run's scratch folder it is in, where it may go to a later episode.
    work_root: PathBuf,
    /// Whether the folder went to a later episode ([`EpisodeFolder::give_back`]).
    given_back: bool,
}

/// An emptied episode folder, ready for another episode of the run whose scratch folder
/// holds it: `dir`, and `work` empty inside it (both with symlinks resolved).
struct Spare {
    work_root: PathBuf,
    dir: PathBuf,
    work: PathBuf,
}

/// The spare folders, as many as episodes ran at once (at most [`SPARES_KEPT`]).
static SPARES: Mutex<Vec<Spare>> = Mutex::new(Vec::new());

/// The most spare folders kept: beyond, a folder given back is removed.
const SPARES_KEPT: usize = 256;

/// Forgets the spare folders in `work_root`, which is being removed with them.
pub fn forget_spares(work_root: &Path) {
    SPARES.lock().unwrap_or_else(|e| e.into_inner()).retain(|spare| spare.work_root != work_root);
}

/// A spare folder in `work_root`, if one is there still.
fn spare_in(work_root: &Path) -> Option<Spare> {
    let mut spares = SPARES.lock().unwrap_or_else(|e| e.into_inner());
    let at = spares.iter().rposition(|spare| spare.work_root == work_root)?;
    let spare = spares.swap_remove(at);
    drop(spares);
    // Only this runner writes in its scratch folder; that folder may have been removed.
    std::fs::symlink_metadata(&spare.work).is_ok_and(|m| m.is_dir()).then_some(spare)
}

impl EpisodeFolder {
    /// Makes `runner-episode-XXXX/work` in `work_root` and writes the files: the
    /// definition's `files`, then the task's.
    pub fn create(files: &BTreeMap<String, String>, task: &Task, work_root: &Path) -> Result<Self, String> {
        let made = |what: &str| {
            let what = what.to_owned();
            move |e: std::io::Error| format!("failed to create {what}: {e}")
        };
        let folder = |dir: PathBuf, work: PathBuf| {
            let tmp = dir.join("tmp");
            let work_root = work_root.to_owned();
            EpisodeFolder { dir, work, tmp, tmp_made: AtomicBool::new(false), work_root, given_back: false }
        };
        let folder = match spare_in(work_root) {
            Some(Spare { dir, work, .. }) => folder(dir, work),
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("runner-episode-")
                    .tempdir_in(work_root)
                    .map_err(made("the episode's folder"))?;
                let base =
                    dir.path().canonicalize().map_err(|e| format!("failed to resolve the episode's folder: {e}"))?;
                // From here on removed by `remove_tree`, when the value is dropped.
                let folder = folder(base.clone(), base.join("work"));
                let _ = dir.keep();
                std::fs::create_dir(&folder.work).map_err(made("the working directory"))?;
                folder
            }
        };
        let work = folder.work.clone();
        for (name, content) in files.iter().chain(&task.files) {
            if !crate::domain::is_relative_inside(name) {
                return Err(format!("file `{name}` would land outside the working directory"));
            }
            let path = work.join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| format!("failed to create {}: {e}", parent.display()))?;
            }
            std::fs::write(&path, content).map_err(|e| format!("failed to write {name}: {e}"))?;
        }
        // No process of the world runs yet: nothing can move under these paths.
        for copy in &task.copies {
            if !crate::domain::is_relative_inside(&copy.to) {
                return Err(format!("file `{}` would land outside the working directory", copy.to));
            }
            let path = work.join(&copy.to);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| format!("failed to create {}: {e}", parent.display()))?;
            }
            copy_beneath(copy, &path)
                .map_err(|e| format!("failed to copy {} to {}: {e}", copy.from.display(), copy.to))?;
        }
        Ok(folder)
    }

    /// Makes `tmp/`, unless it is there: before the world's first process.
    pub fn make_tmp(&self) -> Result<(), String> {
        self.tmp_made.store(true, Ordering::Release);
        match std::fs::create_dir(&self.tmp) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(format!("failed to create the temp dir: {e}")),
            _ => Ok(()),
        }
    }

    /// Empties the working directory and keeps the folder for a later episode of the run,
    /// when no process ran in it (`tmp/` was never made): then only the runner wrote there,
    /// and what it wrote is removed here. Otherwise, or if it cannot be emptied, removes it
    /// ([`EpisodeFolder::remove`]).
    pub async fn give_back(&mut self) {
        if self.tmp_made.load(Ordering::Acquire) || self.empty_work().is_err() {
            return self.remove().await;
        }
        let kept = {
            let mut spares = SPARES.lock().unwrap_or_else(|e| e.into_inner());
            let room = spares.len() < SPARES_KEPT;
            if room {
                let (dir, work) = (self.dir.clone(), self.work.clone());
                spares.push(Spare { work_root: self.work_root.clone(), dir, work });
            }
            room
        };
        match kept {
            true => self.given_back = true,
            false => self.remove().await,
        }
    }

    /// Removes everything in the working directory, which only the runner wrote: on this
    /// thread, as the runner wrote it.
    fn empty_work(&self) -> io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let dir: OwnedFd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(&self.work)?
            .into();
        for (name, _) in super::beneath::names(&dir)? {
            remove_tree_at(dir.as_raw_fd(), &name)?;
        }
        match super::beneath::names(&dir)?.is_empty() {
            true => Ok(()),
            false => Err(io::Error::other("the working directory is not empty")),
        }
    }

    /// Moves the folder to `to` (on the same filesystem), to be kept: `--keep-worlds`.
    pub fn keep(&self, to: &Path) -> io::Result<()> {
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::rename(&self.dir, to)
    }

    /// Removes the folder, off the runtime's threads (it may hold many files); dropping
    /// the value then finds nothing, or retries what failed here. A failure is no failure
    /// of the episode: what is left is in the run's scratch folder, removed with it.
    pub async fn remove(&self) {
        let dir = self.dir.clone();
        let _ = tokio::task::spawn_blocking(move || remove_tree(&dir)).await;
    }
}

impl Drop for EpisodeFolder {
    fn drop(&mut self) {
        if !self.given_back {
            let _ = remove_tree(&self.dir);
        }
    }
}

/// A task's host file to copy, opened beneath its root through no link, with its
/// permission bits; refused unless it is a regular file (a pipe is never read).
pub fn open_copy(copy: &FileCopy) -> io::Result<(std::fs::File, u32)> {
    let from = Beneath::open(&copy.root)?.file(&copy.from, libc::O_RDONLY | libc::O_NONBLOCK, 0, Links::None)?;
    let stat = fstat(from.as_raw_fd())?;
    if Kind::of(stat.st_mode) != Kind::File {
        return Err(io::Error::other("it is not a regular file"));
    }
    Ok((from, stat.st_mode & 0o7777))
}

/// Copies a task's file ([`open_copy`]) into the working directory at `to`, its permission
/// bits kept.
fn copy_beneath(copy: &FileCopy, to: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let (mut from, mode) = open_copy(copy)?;
    let mut out = std::fs::File::create(to)?;
    io::copy(&mut from, &mut out)?;
    out.set_permissions(std::fs::Permissions::from_mode(mode))
}

/// Removes `path` and everything below it, however deep, without following links: down
/// one folder at a time by descriptor (never by a path longer than a name), back up by
/// `..`, checked to be the folder it came down from. Neither the stack nor the open files
/// grow with the depth (two descriptors at most), and folders a command made unreadable
/// or unwritable are opened up first. Gone already is done.
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::other(format!("{} names no entry of a folder", path.display())));
    };
    let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
    let c_parent = CString::new(parent.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    // SAFETY: open with a NUL-terminated path; the descriptor is owned here.
    let fd = unsafe { libc::open(c_parent.as_ptr(), flags) };
    let parent = match fd {
        // SAFETY: a new descriptor, owned by nothing else.
        0.. => unsafe { OwnedFd::from_raw_fd(fd) },
        _ => match io::Error::last_os_error() {
            e if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            e => return Err(e),
        },
    };
    let c_name = CString::new(name.as_bytes()).map_err(io::Error::other)?;
    remove_tree_at(parent.as_raw_fd(), &c_name)
}

/// Removes the entry `name` of the open folder `at` and everything below it, as
/// [`remove_tree`] does: also while commands run in it, as nothing is looked up by a path.
pub fn remove_tree_at(at: RawFd, name: &CStr) -> io::Result<()> {
    let meta = match super::beneath::stat_at(at, name) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        other => other?,
    };
    if meta.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return unlink(at, name, 0);
    }
    let mut current = open_folder(at, name)?;
    /// A folder on the way down: who it is, the folders in it still to remove, and its
    /// name in the folder above (none for the top).
    struct Level {
        id: (u64, u64),
        pending: Vec<OsString>,
        name: Option<OsString>,
    }
    let top = identity(current.as_raw_fd())?;
    let mut levels = vec![Level { id: top, pending: clear(&current)?, name: None }];
    while let Some(level) = levels.last_mut() {
        if let Some(name) = level.pending.pop() {
            let Ok(c_name) = CString::new(name.as_bytes()) else { continue };
            let child = match open_folder(current.as_raw_fd(), &c_name) {
                Ok(child) => child,
                // No longer a folder (or gone): whatever it is now goes as a file.
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP | libc::ENOENT)) => {
                    unlink(current.as_raw_fd(), &c_name, 0)?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let pending = clear(&child)?;
            levels.push(Level { id: identity(child.as_raw_fd())?, pending, name: Some(name) });
            current = child;
        } else {
            let Some(Level { name: Some(name), .. }) = levels.pop() else { break };
            let parent = open_folder(current.as_raw_fd(), c"..")?;
            if levels.last().map(|l| l.id) != Some(identity(parent.as_raw_fd())?) {
                return Err(io::Error::other("the folder moved while it was being removed"));
            }
            let c_name = CString::new(name.into_vec()).map_err(io::Error::other)?;
            unlink(parent.as_raw_fd(), &c_name, libc::AT_REMOVEDIR)?;
            current = parent;
        }
    }
    drop(current);
    // Still the folder emptied, unless it was moved meanwhile: then that one is left.
    match super::beneath::stat_at(at, name) {
        Ok(now) if id_of(&now) == top => unlink(at, name, libc::AT_REMOVEDIR),
        Ok(_) => Err(io::Error::other("the folder moved while it was being removed")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Opens the folder `name` in `at` without following a link, made readable, writable and
/// searchable by its owner first when it is not (a command may have taken that away).
fn open_folder(at: RawFd, name: &CStr) -> io::Result<OwnedFd> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: openat with a valid descriptor (or AT_FDCWD) and a NUL-terminated name; the
    // descriptor returned is owned here.
    let opened = |()| unsafe {
        let fd = libc::openat(at, name.as_ptr(), flags);
        if fd < 0 { Err(io::Error::last_os_error()) } else { Ok(OwnedFd::from_raw_fd(fd)) }
    };
    let fd = match opened(()) {
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
            // Opened as a path only (a link is refused), and opened up by that descriptor:
            // never what the name leads to a moment later.
            let path = {
                let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
                // SAFETY: openat of a NUL-terminated name in a folder held open.
                let fd = unsafe { libc::openat(at, name.as_ptr(), flags) };
                if fd < 0 {
                    return Err(e);
                }
                // SAFETY: a new descriptor, owned by nothing else.
                unsafe { OwnedFd::from_raw_fd(fd) }
            };
            let stat = super::beneath::fstat(path.as_raw_fd())?;
            super::beneath::chmod_fd(path.as_raw_fd(), (stat.st_mode & 0o7777) | 0o700)?;
            opened(())?
        }
        other => other?,
    };
    // SAFETY: fstat/fchmod on the descriptor just opened.
    unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        if libc::fstat(fd.as_raw_fd(), &mut stat) == 0 && stat.st_mode & 0o700 != 0o700 {
            libc::fchmod(fd.as_raw_fd(), (stat.st_mode & 0o7777) | 0o700);
        }
    }
    Ok(fd)
}

/// The device and inode of an open folder.
fn identity(fd: RawFd) -> io::Result<(u64, u64)> {
    super::beneath::fstat(fd).map(|stat| id_of(&stat))
}

/// The device and inode of what a `stat` describes (their types vary by architecture).
#[allow(clippy::unnecessary_cast)]
fn id_of(stat: &libc::stat) -> (u64, u64) {
    (stat.st_dev as u64, stat.st_ino as u64)
}

fn unlink(at: RawFd, name: &CStr, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unlinkat on a NUL-terminated name in a folder this process holds open.
    let done = unsafe { libc::unlinkat(at, name.as_ptr(), flags) };
    match done {
        0 => Ok(()),
        _ => match io::Error::last_os_error() {
            e if e.kind() == io::ErrorKind::NotFound => Ok(()),
            e => Err(e),
        },
    }
}

/// Removes every entry of the open folder `dir` that is not a folder, and returns the names
/// of those that are.
fn clear(dir: &OwnedFd) -> io::Result<Vec<OsString>> {
    let mut folders = Vec::new();
    for (name, kind) in super::beneath::names(dir)? {
        let is_folder = match kind {
            libc::DT_DIR => true,
            libc::DT_UNKNOWN => super::beneath::stat_at(dir.as_raw_fd(), &name)
                .is_ok_and(|stat| stat.st_mode & libc::S_IFMT == libc::S_IFDIR),
            _ => false,
        };
        if is_folder {
            folders.push(OsString::from_vec(name.into_bytes()));
        } else {
            unlink(dir.as_raw_fd(), &name, 0)?;
        }
    }
    Ok(folders)
}

#[cfg(test)]
mod tests {
    use super::remove_tree;

    #[test]
    fn a_tree_deeper_than_a_path_can_be_long_is_removed() {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let top = tempfile::tempdir().unwrap();
        let root = top.path().join("deep");
        std::fs::create_dir(&root).unwrap();
        // 3,000 levels (6,000 bytes of path, more than PATH_MAX), made one step at a time by
        // descriptor, with a file at the bottom and an unwritable folder on the way.
        let mut here = OwnedFd::from(std::fs::File::open(&root).unwrap());
        for level in 0..3000 {
            // SAFETY: mkdirat/openat on a folder this test holds open, with literal names.
            unsafe {
                assert_eq!(libc::mkdirat(here.as_raw_fd(), c"d".as_ptr(), 0o755), 0);
                let fd = libc::openat(here.as_raw_fd(), c"d".as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY);
                assert!(fd >= 0);
                if level == 2990 {
                    libc::fchmod(here.as_raw_fd(), 0o500);
                }
                here = OwnedFd::from_raw_fd(fd);
            }
        }
        // SAFETY: as above.
        unsafe {
            let fd = libc::openat(here.as_raw_fd(), c"f".as_ptr(), libc::O_WRONLY | libc::O_CREAT, 0o644);
            assert!(fd >= 0);
            libc::close(fd);
        }
        drop(here);
        std::fs::write(root.join("a file"), "x").unwrap();
        std::os::unix::fs::symlink("/", root.join("link")).unwrap();
        remove_tree(&root).unwrap();
        assert!(!root.exists(), "the tree is gone");
        remove_tree(&root).unwrap();
    }
}
