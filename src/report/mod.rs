//! What people read: progress while a run goes and the summary at its end. Everything here
//! is computed from the event log or from the stream of finished episodes.

pub mod agreement;
pub mod compare;
pub mod export;
pub mod gate;
pub mod html;
pub mod judge_check;
pub mod judges;
pub mod junit;
pub mod memory;
pub mod memory_compare;
pub mod oracle;
pub mod power;
pub mod progress;
pub mod search;
pub mod stats;
pub mod summary;
pub mod table;

pub use progress::Progress;
pub use summary::{Row, Summary};

/// A new temporary file in `path`'s folder, named after it (`.NAME.XXXXXX.tmp`), removed
/// unless persisted: each writer has its own, so two processes writing the same report (a
/// run and a `runner report` of it) never write into one file.
pub(crate) fn temporary_beside(path: &std::path::Path) -> std::io::Result<tempfile::NamedTempFile> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // The mode a plain new file gets (0666 less the umask), not a temporary one's 0600.
    tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666))
        .tempfile_in(dir)
}

/// Writes `bytes` to `path` through a temporary file renamed into place: a reader sees the
/// old file or the new one, never half of one.
pub(crate) fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut file = temporary_beside(path)?;
    file.write_all(bytes)?;
    file.persist(path).map(drop).map_err(|e| e.error)
}
