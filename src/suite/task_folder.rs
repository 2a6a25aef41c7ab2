//! A Harbor task folder, read beneath its own descriptor.
//!
//! A task folder comes from someone else, and what it holds lands in the agent's folder,
//! in its input and in the event log before any sandbox exists. So every file of a task
//! (`task.toml`, `instruction.md`, `tests/`, `solution/`, `environment/` and what the
//! Dockerfile copies from it) is opened from the folder held open, with
//! `openat2(RESOLVE_BENEATH)` (`environment/beneath.rs`): a link, an absolute path or a
//! `..` that leads out is refused by the kernel at the open, never followed. Links that
//! stay inside are followed, as a checkout of the task would have them. Pipes and devices
//! are never read (opened without blocking, then refused).

use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::config::decode::ConfigError;
use crate::environment::beneath::{Beneath, Entry, Kind, Links, fstat};

/// The most a text of the task (`task.toml`, `instruction.md`, a script) may hold.
const TEXT_CAP: u64 = 16 << 20;

/// The most files one `COPY` may bring, and how deep a folder it walks.
const MAX_FILES: usize = 100_000;
const MAX_DEPTH: usize = 64;

/// A task folder held open.
pub struct TaskFolder {
    root: Beneath,
}

/// Why a file of the build context is not copied: the task is refused (it reaches out of
/// its folder, or names what is not a file), or it cannot run here (the reason).
#[derive(Debug)]
pub enum CopyError {
    Refused(String),
    Needs(String),
}

/// A file under a `COPY` source: its path below the source, its path beneath
/// `environment/` with every link resolved, its size and permission bits.
pub struct ContextFile {
    pub below: PathBuf,
    pub real: PathBuf,
    pub size: u64,
    pub mode: u32,
}

impl TaskFolder {
    /// Opens the task folder `dir`.
    pub fn open(dir: &Path) -> Result<TaskFolder, ConfigError> {
        let real = dir.canonicalize().map_err(|e| ConfigError::whole(dir, format!("failed to open: {e}")))?;
        let root = Beneath::open(&real).map_err(|e| ConfigError::whole(dir, format!("failed to open: {e}")))?;
        Ok(TaskFolder { root })
    }

    /// The folder's path on the host, every link resolved.
    pub fn path(&self) -> &Path {
        self.root.path()
    }

    /// The text of the file `rel`, `None` when there is none.
    pub fn text(&self, dir: &Path, rel: &str) -> Result<Option<String>, ConfigError> {
        let shown = dir.join(rel);
        match self.root.read(Path::new(rel), Links::Inside, TEXT_CAP) {
            Ok(None) => Ok(None),
            Ok(Some((bytes, _))) => {
                String::from_utf8(bytes).map(Some).map_err(|_| ConfigError::whole(&shown, "not UTF-8 text"))
            }
            Err(e) => Err(refusal(&shown, &e)),
        }
    }

    /// What `rel` is (links inside followed) and its permission bits, `None` when there
    /// is nothing there; an error when it leads out.
    pub fn stat(&self, dir: &Path, rel: &str) -> Result<Option<(Kind, u32)>, ConfigError> {
        let fd = match self.root.open_at(Path::new(rel), libc::O_PATH, 0, Links::Inside) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(refusal(&dir.join(rel), &e)),
        };
        let stat = fstat(fd.as_raw_fd()).map_err(|e| refusal(&dir.join(rel), &e))?;
        Ok(Some((Kind::of(stat.st_mode), stat.st_mode & 0o7777)))
    }

    /// The folder `rel` on the host, every link resolved, `None` when there is none; an
    /// error when it leads out of the task folder.
    pub fn folder(&self, dir: &Path, rel: &str) -> Result<Option<PathBuf>, ConfigError> {
        match self.root.beneath(Path::new(rel)) {
            Ok(folder) => Ok(Some(folder.path().to_owned())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(refusal(&dir.join(rel), &e)),
        }
    }

    /// The folder `rel` held open as a root of its own (the build context), `None` when
    /// there is none.
    pub fn beneath(&self, dir: &Path, rel: &str) -> Result<Option<Beneath>, ConfigError> {
        match self.root.beneath(Path::new(rel)) {
            Ok(folder) => Ok(Some(folder)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(refusal(&dir.join(rel), &e)),
        }
    }

    /// Adds every file below the folder `rel` to `hasher`: each one's path below it and
    /// its bytes, in name order, depth first. Links are not followed: a link adds its
    /// path and where it leads inside (or that it leads out).
    pub fn hash(&self, hasher: &mut Sha256, rel: &str) {
        let Ok(folder) = self.root.beneath(Path::new(rel)) else { return };
        let _ = folder.walk(Path::new(""), MAX_FILES, MAX_DEPTH, |path, entry| {
            match entry.kind {
                Kind::File => {
                    hasher.update(path.to_string_lossy().as_bytes());
                    let _ = hash_file(hasher, &folder, path);
                }
                Kind::Link => {
                    hasher.update(path.to_string_lossy().as_bytes());
                    let target = folder.real(path).map_or_else(|_| "->out".into(), |p| format!("->{}", p.display()));
                    hasher.update(target.as_bytes());
                }
                Kind::Dir | Kind::Other => {}
            }
            true
        });
    }
}

fn hash_file(hasher: &mut Sha256, folder: &Beneath, path: &Path) -> io::Result<()> {
    let mut file = folder.file(path, libc::O_RDONLY | libc::O_NONBLOCK, 0, Links::None)?;
    let mut buffer = vec![0u8; 1 << 16];
    loop {
        match file.read(&mut buffer)? {
            0 => return Ok(()),
            n => hasher.update(&buffer[..n]),
        }
    }
}

/// The files a `COPY` of `source` (relative, inside the build context `context`) brings:
/// the source itself when it is a file, else every file below it, depth first in name
/// order. A link is followed when it stays inside the build context.
pub fn files_under(context: &Beneath, source: &str) -> Result<Vec<ContextFile>, CopyError> {
    let leads_out = || CopyError::Refused(format!("environment/{source} leads out of environment/ (a link)"));
    let real = match context.real(Path::new(source)) {
        Ok(real) => real,
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => return Err(leads_out()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(CopyError::Needs(format!("environment/{source} does not exist")));
        }
        Err(e) => return Err(CopyError::Needs(format!("failed to read environment/{source}: {e}"))),
    };
    let top = context.stat(&real, Links::None).map_err(|e| CopyError::Needs(format!("environment/{source}: {e}")))?;
    match top.kind {
        Kind::File => return Ok(vec![found(PathBuf::new(), real, &top)]),
        Kind::Dir => {}
        Kind::Link | Kind::Other => return Err(not_a_file(source)),
    }
    let mut out = Vec::new();
    let mut error = None;
    let cut = context
        .walk(&real, MAX_FILES, MAX_DEPTH, |path, entry| {
            let below = path.strip_prefix(&real).unwrap_or(path).to_owned();
            let shown = Path::new(source).join(&below).display().to_string();
            match visit(context, path, entry, &shown) {
                Ok(Some((real, entry))) => out.push(found(below, real, &entry)),
                Ok(None) => {}
                Err(e) => error = Some(e),
            }
            error.is_none()
        })
        .map_err(|e| CopyError::Needs(format!("failed to read environment/{source}: {e}")))?;
    if let Some(error) = error {
        return Err(error);
    }
    if cut {
        return Err(CopyError::Needs(format!("environment/{source} holds more than {MAX_FILES} entries")));
    }
    Ok(out)
}

/// An entry met in a copied folder: a file to copy (with its real path), a folder whose
/// entries come next, or why the copy stops.
fn visit(context: &Beneath, path: &Path, entry: &Entry, shown: &str) -> Result<Option<(PathBuf, Entry)>, CopyError> {
    match entry.kind {
        Kind::File => Ok(Some((path.to_owned(), entry.clone()))),
        Kind::Dir => Ok(None),
        Kind::Other => Err(not_a_file(shown)),
        Kind::Link => {
            let real = context.real(path).map_err(|e| match e.raw_os_error() {
                Some(libc::EXDEV) => {
                    CopyError::Refused(format!("environment/{shown} leads out of environment/ (a link)"))
                }
                _ => CopyError::Needs(format!("environment/{shown}: {e}")),
            })?;
            let target =
                context.stat(&real, Links::None).map_err(|e| CopyError::Needs(format!("environment/{shown}: {e}")))?;
            match target.kind {
                Kind::File => Ok(Some((real, target))),
                Kind::Dir => Err(CopyError::Needs(format!(
                    "environment/{shown} is a link to a folder, which runner does not follow"
                ))),
                Kind::Link | Kind::Other => Err(not_a_file(shown)),
            }
        }
    }
}

fn found(below: PathBuf, real: PathBuf, entry: &Entry) -> ContextFile {
    ContextFile { below, real, size: entry.size, mode: entry.mode }
}

fn not_a_file(shown: &str) -> CopyError {
    CopyError::Refused(format!("environment/{shown} is neither a regular file nor a folder"))
}

/// A file of the task that could not be read, said for the task's author.
fn refusal(path: &Path, e: &io::Error) -> ConfigError {
    match e.raw_os_error() {
        Some(libc::EXDEV) => ConfigError::whole(
            path,
            "leads out of the task folder (a link, an absolute path or `..`): a task's files are read only from inside it",
        ),
        _ => ConfigError::whole(path, format!("failed to read: {e}")),
    }
}
