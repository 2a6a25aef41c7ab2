//! Whole trees of the store: their size on disk and their removal, by descriptor, following
//! no link. A layer is at most [`MAX_DEPTH`] folders deep (deeper archives are refused), so
//! a walk holds at most that many folders open.

use std::collections::HashSet;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::at;

/// The deepest an entry of a layer may be, in folders.
pub const MAX_DEPTH: usize = 256;

fn is_dir(stat: &libc::stat) -> bool {
    stat.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// The folder holding `path`, open, and `path`'s name in it.
fn parent_of(path: &Path) -> io::Result<(OwnedFd, std::ffi::CString)> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::other(format!("{} names no entry of a folder", path.display())));
    };
    let parent = if parent.as_os_str().is_empty() { Path::new(".") } else { parent };
    Ok((at::open_dir(parent)?, at::c_bytes(name.as_bytes())?))
}

/// Removes `path` and everything below it; gone already is done.
pub fn remove(path: &Path) -> io::Result<()> {
    let (parent, name) = match parent_of(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        other => other?,
    };
    match at::stat_at(parent.as_raw_fd(), &name) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Ok(stat) if !is_dir(&stat) => return at::unlink_at(parent.as_raw_fd(), &name, 0),
        other => other?,
    };
    let top = at::open_at(parent.as_raw_fd(), &name, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    let pending = at::names(top.as_raw_fd())?;
    let mut stack = vec![(top, pending, name)];
    while let Some((dir, pending, _)) = stack.last_mut() {
        if let Some(child) = pending.pop() {
            let stat = at::stat_at(dir.as_raw_fd(), &child)?;
            if is_dir(&stat) {
                let opened = at::open_at(dir.as_raw_fd(), &child, libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
                let names = at::names(opened.as_raw_fd())?;
                stack.push((opened, names, child));
            } else {
                at::unlink_at(dir.as_raw_fd(), &child, 0)?;
            }
            continue;
        }
        let Some((_, _, name)) = stack.pop() else { break };
        let holder = stack.last().map_or(parent.as_raw_fd(), |(fd, _, _)| fd.as_raw_fd());
        at::unlink_at(holder, &name, libc::AT_REMOVEDIR)?;
    }
    Ok(())
}

/// The bytes `path`'s tree takes on disk, as `du` counts them: allocated blocks (a hole
/// takes none), each file once however many hard links it has.
pub fn disk_usage(path: &Path) -> io::Result<u64> {
    let top = at::open_dir(path)?;
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let mut total = block_bytes(&at::fstat(top.as_raw_fd())?);
    let pending = at::names(top.as_raw_fd())?;
    let mut stack = vec![(top, pending)];
    while let Some((dir, pending)) = stack.last_mut() {
        let Some(child) = pending.pop() else {
            stack.pop();
            continue;
        };
        let stat = at::stat_at(dir.as_raw_fd(), &child)?;
        #[allow(clippy::unnecessary_cast)]
        let id = (stat.st_dev as u64, stat.st_ino as u64);
        if stat.st_nlink > 1 && !is_dir(&stat) && !seen.insert(id) {
            continue;
        }
        total += block_bytes(&stat);
        if is_dir(&stat) {
            let opened = open_child(dir.as_raw_fd(), &child)?;
            let names = at::names(opened.as_raw_fd())?;
            stack.push((opened, names));
        }
    }
    Ok(total)
}

fn open_child(dir: std::os::fd::RawFd, name: &CStr) -> io::Result<OwnedFd> {
    at::open_at(dir, name, libc::O_RDONLY | libc::O_DIRECTORY, 0)
}

#[allow(clippy::unnecessary_cast)]
fn block_bytes(stat: &libc::stat) -> u64 {
    stat.st_blocks as u64 * 512
}
