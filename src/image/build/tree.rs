//! Files written into an image's root as the runner reaches it (a started root's
//! `/proc/<holder>/root`), while no process of the image runs: paths are resolved one part
//! at a time, links followed as the image would see them (an absolute link leads to the
//! image's own root, `..` stops there), and the last part is never followed. What is written
//! is owned by the image's ids (`ID_BASE + id` on the host).

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::image::{ID_BASE, ID_RANGE};

/// An image's root folder, as the runner reaches it.
#[derive(Debug, Clone)]
pub struct ImageTree {
    pub root: PathBuf,
}

/// What a written entry gets: its image owner, mode and modification time.
#[derive(Debug, Clone, Copy)]
pub struct Meta {
    pub owner: (u32, u32),
    pub mode: u32,
    pub mtime: Option<(i64, i64)>,
}

impl ImageTree {
    pub fn new(root: &Path) -> ImageTree {
        ImageTree { root: root.to_path_buf() }
    }

    /// The host path of an image path whose folders hold no links.
    pub fn host(&self, resolved: &Path) -> PathBuf {
        self.root.join(resolved.strip_prefix("/").unwrap_or(resolved))
    }

    /// `path` (absolute in the image) with the links of its folders resolved in the image,
    /// and of its last part too when `follow_last`; parts that do not exist are kept as
    /// given.
    pub fn resolve(&self, path: &Path, follow_last: bool) -> io::Result<PathBuf> {
        let mut todo: Vec<OsString> = parts(path);
        todo.reverse();
        let mut done = PathBuf::from("/");
        let mut hops = 0;
        while let Some(part) = todo.pop() {
            if part == ".." {
                done.pop();
                continue;
            }
            let next = done.join(&part);
            let is_last = todo.is_empty();
            match std::fs::symlink_metadata(self.host(&next)) {
                Ok(meta) if meta.file_type().is_symlink() && (!is_last || follow_last) => {
                    hops += 1;
                    if hops > 40 {
                        return Err(io::Error::from_raw_os_error(libc::ELOOP));
                    }
                    let target = std::fs::read_link(self.host(&next))?;
                    if target.is_absolute() {
                        done = PathBuf::from("/");
                    }
                    let mut more = parts(&target);
                    more.reverse();
                    todo.extend(more);
                }
                _ => done = next,
            }
        }
        Ok(done)
    }

    /// Makes the folder `dir` (absolute in the image) and its missing parents, each new one
    /// owned by `owner` with mode 0755; its path, resolved.
    pub fn make_dirs(&self, dir: &Path, owner: (u32, u32)) -> io::Result<PathBuf> {
        let mut done = PathBuf::from("/");
        for part in parts(dir) {
            done = self.resolve(&done.join(part), true)?;
            let host = self.host(&done);
            match std::fs::symlink_metadata(&host) {
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => {
                    let message = format!("`{}` is in the image and is not a folder", done.display());
                    return Err(io::Error::new(io::ErrorKind::AlreadyExists, message));
                }
                Err(_) => {
                    std::fs::create_dir(&host)?;
                    set_meta(&host, Meta { owner, mode: 0o755, mtime: None })?;
                }
            }
        }
        Ok(done)
    }

    /// Writes a file at `dest` (its folder resolved) from `from`, replacing what is there
    /// unless it is a folder.
    pub fn write_file(&self, dest: &Path, from: &mut dyn io::Read, meta: Meta) -> io::Result<()> {
        let host = self.replaceable(dest)?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o600)
            .open(&host)?;
        io::copy(from, &mut file)?;
        drop(file);
        set_meta(&host, meta)
    }

    /// Makes a symbolic link at `dest` to `target`.
    pub fn write_link(&self, dest: &Path, target: &Path, meta: Meta) -> io::Result<()> {
        let host = self.replaceable(dest)?;
        std::os::unix::fs::symlink(target, &host)?;
        set_meta(&host, meta)
    }

    /// Makes a hard link at `dest` to the file at `existing` (both in the image).
    pub fn write_hard_link(&self, dest: &Path, existing: &Path) -> io::Result<()> {
        let existing = self.host(&self.resolve(existing, false)?);
        let host = self.replaceable(dest)?;
        std::fs::hard_link(existing, host)
    }

    /// Makes (or keeps) the folder `dest` and gives it `meta`.
    pub fn write_dir(&self, dest: &Path, meta: Meta) -> io::Result<()> {
        let parent = dest.parent().unwrap_or(Path::new("/"));
        let resolved = self.make_dirs(parent, meta.owner)?.join(dest.file_name().unwrap_or_default());
        let host = self.host(&resolved);
        match std::fs::symlink_metadata(&host) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                std::fs::remove_file(&host)?;
                std::fs::create_dir(&host)?;
            }
            Err(_) => std::fs::create_dir(&host)?,
        }
        set_meta(&host, meta)
    }

    /// The host path where an entry may be written at `dest`: its folders made (owned by
    /// the image's root) and a file or link there removed; a folder there is an error.
    fn replaceable(&self, dest: &Path) -> io::Result<PathBuf> {
        let parent = dest.parent().unwrap_or(Path::new("/"));
        let name = dest.file_name().ok_or_else(|| io::Error::other("a destination with no name"))?;
        let resolved = self.make_dirs(parent, (0, 0))?.join(name);
        let host = self.host(&resolved);
        match std::fs::symlink_metadata(&host) {
            Ok(m) if m.is_dir() => Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("`{}` is a folder in the image", resolved.display()),
            )),
            Ok(_) => std::fs::remove_file(&host).map(|()| host),
            Err(_) => Ok(host),
        }
    }
}

/// The normal parts of `path` (and its `..`), without its root or `.`.
fn parts(path: &Path) -> Vec<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(p.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

/// Gives the entry at `host` (not followed) its image owner, then its mode (after the
/// owner: a change of owner clears the set-id bits), then its time.
pub fn set_meta(host: &Path, meta: Meta) -> io::Result<()> {
    let (uid, gid) = meta.owner;
    if uid >= ID_RANGE || gid >= ID_RANGE {
        return Err(io::Error::other(format!("the owner {uid}:{gid} is beyond the ids an image may use ({ID_RANGE})")));
    }
    std::os::unix::fs::lchown(host, Some(ID_BASE + uid), Some(ID_BASE + gid))?;
    let is_link = std::fs::symlink_metadata(host)?.file_type().is_symlink();
    if !is_link {
        std::fs::set_permissions(host, std::fs::Permissions::from_mode(meta.mode & 0o7777))?;
    }
    if let Some((secs, nanos)) = meta.mtime {
        let times = [libc::timespec { tv_sec: secs, tv_nsec: nanos }, libc::timespec { tv_sec: secs, tv_nsec: nanos }];
        let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(host.as_os_str()))
            .map_err(|_| io::Error::other("a NUL byte in a path"))?;
        // SAFETY: a NUL-terminated path and two timespecs.
        if unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The modification time of `meta`, as [`Meta::mtime`] takes it.
pub fn mtime_of(meta: &std::fs::Metadata) -> Option<(i64, i64)> {
    Some((meta.mtime(), meta.mtime_nsec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_resolve_inside_the_image_and_never_out_of_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("usr/bin")).unwrap();
        std::os::unix::fs::symlink("usr/bin", root.join("bin")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("usr/escape")).unwrap();
        std::os::unix::fs::symlink("../../../../..", root.join("usr/up")).unwrap();
        let tree = ImageTree::new(root);
        assert_eq!(tree.resolve(Path::new("/bin/tool"), false).unwrap(), Path::new("/usr/bin/tool"));
        assert_eq!(tree.resolve(Path::new("/usr/escape/passwd"), false).unwrap(), Path::new("/etc/passwd"));
        assert_eq!(tree.resolve(Path::new("/usr/up/x"), false).unwrap(), Path::new("/x"), "`..` stops at the root");
        assert_eq!(tree.resolve(Path::new("/bin"), false).unwrap(), Path::new("/bin"), "the last part is kept");
        std::os::unix::fs::symlink("loop", root.join("loop")).unwrap();
        assert!(tree.resolve(Path::new("/loop/x"), false).is_err());
    }
}
