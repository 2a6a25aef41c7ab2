//! The runner's own work on a world's files, kept inside the world's folder while the
//! world's commands run and may swap any folder for a symbolic link at any moment.
//!
//! A [`Beneath`] holds a descriptor of the folder and resolves every path from it with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`: the kernel refuses `..` out of it, an
//! absolute path or link, and a link that leads out, at the moment of the open, so there is
//! no check that a swap could come after. [`Links::Inside`] follows relative links that stay
//! inside (what a model asks for by name); [`Links::None`] follows none (walks, copies,
//! removals). Walks go one folder at a time: each folder is opened beneath the root without
//! links, and its entries are looked at from that descriptor, never by a path joined again.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Which symbolic links a path may go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Relative links that stay inside the folder.
    Inside,
    /// None at all.
    None,
}

/// What an entry is, as seen without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Link,
    /// A named pipe, a socket, a device.
    Other,
}

impl Kind {
    pub fn of(mode: libc::mode_t) -> Kind {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFREG => Kind::File,
            libc::S_IFLNK => Kind::Link,
            _ => Kind::Other,
        }
    }
}

/// An entry met by [`Beneath::walk`] or listed by [`entries`].
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: OsString,
    pub kind: Kind,
    pub size: u64,
    pub mode: u32,
}

/// A folder whose files the runner works on, held open.
#[derive(Debug)]
pub struct Beneath {
    root: OwnedFd,
    path: PathBuf,
    /// The host ids what the runner makes here is given (a world in an image's root, whose
    /// user owns its files there); `None`: the runner's.
    owner: Option<(u32, u32)>,
}

impl Beneath {
    /// Opens the folder at `path`, which no command can replace (its parent is the runner's).
    pub fn open(path: &Path) -> io::Result<Self> {
        Self::open_with(path, libc::O_NOFOLLOW)
    }

    fn open_with(path: &Path, follow: libc::c_int) -> io::Result<Self> {
        let name = c_path(path)?;
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | follow | libc::O_CLOEXEC;
        // SAFETY: open with a NUL-terminated path; the descriptor is owned here.
        let fd = unsafe { libc::open(name.as_ptr(), flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd was just opened and is owned by nothing else.
        Ok(Beneath { root: unsafe { OwnedFd::from_raw_fd(fd) }, path: path.to_owned(), owner: None })
    }

    /// The same folder, seen by the runner at `path` but named `seen_as` by the processes
    /// that work in it (an image's root, reached through its holder), whose files and
    /// folders the runner makes here are `owner`'s (host ids).
    pub fn in_root(path: &Path, seen_as: &Path, owner: (u32, u32)) -> io::Result<Self> {
        // The root itself is `/proc/<holder>/root`, a link the kernel follows into it.
        let opened = Self::open_with(path, 0)?;
        Ok(Beneath { path: seen_as.to_owned(), owner: Some(owner), ..opened })
    }

    /// Gives what the runner made (a file it created, a folder) to the folder's owner, when
    /// it has one: the runner's own is root's, which no user of an image is.
    fn give(&self, fd: RawFd) -> io::Result<()> {
        let Some((uid, gid)) = self.owner else { return Ok(()) };
        if fstat(fd)?.st_uid != 0 {
            return Ok(());
        }
        // SAFETY: fchown of a descriptor held open.
        if unsafe { libc::fchown(fd, uid, gid) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Opens `rel` (relative, `""` or `.` for the folder itself) with `flags` (`O_CLOEXEC`
    /// is added), creating it with `mode` when `flags` say so. A path leading out fails
    /// with `EXDEV`, a link where none is followed with `ELOOP`.
    pub fn open_at(&self, rel: &Path, flags: libc::c_int, mode: u32, links: Links) -> io::Result<OwnedFd> {
        let fd = openat2(self.root.as_raw_fd(), rel, flags | libc::O_CLOEXEC, mode, links)?;
        if flags & libc::O_CREAT != 0 {
            self.give(fd.as_raw_fd())?;
        }
        Ok(fd)
    }

    /// Opens the file `rel` (see [`Beneath::open_at`]).
    pub fn file(&self, rel: &Path, flags: libc::c_int, mode: u32, links: Links) -> io::Result<File> {
        self.open_at(rel, flags, mode, links).map(File::from)
    }

    /// Opens the folder `rel` to read its entries.
    pub fn dir(&self, rel: &Path, links: Links) -> io::Result<OwnedFd> {
        self.open_at(rel, libc::O_RDONLY | libc::O_DIRECTORY, 0, links)
    }

    /// What `rel` is, the last part not followed.
    pub fn stat(&self, rel: &Path, links: Links) -> io::Result<Entry> {
        let fd = self.open_at(rel, libc::O_PATH | libc::O_NOFOLLOW, 0, links)?;
        let stat = fstat(fd.as_raw_fd())?;
        let name = rel.file_name().map(OsStr::to_os_string).unwrap_or_default();
        Ok(entry_of(name, &stat))
    }

    /// The regular file `rel`, through the links `links` allows, read up to `cap` bytes,
    /// with its permission bits: `Ok(None)` when there is none, an error when it leads out
    /// (`EXDEV`), is a link not followed, is something else (a folder, a pipe, a device:
    /// opened without blocking, never read) or is larger than `cap`.
    pub fn read(&self, rel: &Path, links: Links, cap: u64) -> io::Result<Option<(Vec<u8>, u32)>> {
        use std::io::Read;
        let file = match self.file(rel, libc::O_RDONLY | libc::O_NONBLOCK, 0, links) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) && links == Links::None => {
                return Err(io::Error::other("it is a link, which is not followed"));
            }
            Err(e) => return Err(e),
        };
        let stat = fstat(file.as_raw_fd())?;
        if stat.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(io::Error::other("it is not a regular file"));
        }
        if stat.st_size as u64 > cap {
            return Err(io::Error::other(format!("it holds {} bytes, more than {cap}", stat.st_size)));
        }
        let mut bytes = Vec::new();
        file.take(cap).read_to_end(&mut bytes)?;
        Ok(Some((bytes, stat.st_mode & 0o7777)))
    }

    /// Makes the folder `rel` and those above it that are missing, each inside the one
    /// above it opened beneath the root (links inside followed, as for the file itself).
    pub fn create_dir_all(&self, rel: &Path) -> io::Result<()> {
        let mut done = PathBuf::new();
        for part in rel.components() {
            let Component::Normal(name) = part else { continue };
            let parent = self.dir(&done, Links::Inside)?;
            let c_name = CString::new(name.as_bytes()).map_err(io::Error::other)?;
            // SAFETY: mkdirat of one name in a folder held open.
            if unsafe { libc::mkdirat(parent.as_raw_fd(), c_name.as_ptr(), 0o777) } != 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EEXIST) {
                    return Err(e);
                }
            }
            done.push(name);
            if self.owner.is_some() {
                self.give(self.dir(&done, Links::Inside)?.as_raw_fd())?;
            }
        }
        Ok(())
    }

    /// The folder `rel` (links inside followed) as a root of its own: nothing opened from
    /// it leads out of it, even where its parent would allow.
    pub fn beneath(&self, rel: &Path) -> io::Result<Beneath> {
        let real = self.real(rel)?;
        let root = self.dir(&real, Links::None)?;
        Ok(Beneath { root, path: self.path.join(real), owner: self.owner })
    }

    /// The path the root is known by (on the host, unless it is an image's root).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of `rel` with the links inside it resolved, relative to the root.
    pub fn real(&self, rel: &Path) -> io::Result<PathBuf> {
        let fd = self.open_at(rel, libc::O_PATH, 0, Links::Inside)?;
        let real = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        real.strip_prefix(&self.path).map(Path::to_owned).map_err(|_| io::Error::from_raw_os_error(libc::EXDEV))
    }

    /// Visits what is under `start` (a folder or a single entry, no link followed on the
    /// way), depth first with each folder's entries in order of their names, handing each
    /// entry (not the start) to `visit` by its path relative to the root, until `visit`
    /// says stop. Visits at most `max` entries; returns whether it stopped for that.
    /// Folders deeper than `max_depth` below the start are not entered.
    pub fn walk(
        &self,
        start: &Path,
        max: usize,
        max_depth: usize,
        mut visit: impl FnMut(&Path, &Entry) -> bool,
    ) -> io::Result<bool> {
        let top = self.stat(start, Links::None)?;
        if top.kind != Kind::Dir {
            visit(start, &top);
            return Ok(false);
        }
        // Entries still to visit, the next on top, with their depth.
        let mut pending: Vec<(PathBuf, Entry, usize)> = Vec::new();
        let push_folder = |rel: &Path, depth: usize, pending: &mut Vec<(PathBuf, Entry, usize)>| {
            // A folder swapped for a link, or gone, since it was seen is not entered.
            let Ok(dir) = self.dir(rel, Links::None) else { return };
            let Ok(list) = entries(&dir) else { return };
            for entry in list.into_iter().rev() {
                pending.push((rel.join(&entry.name), entry, depth));
            }
        };
        push_folder(start, 1, &mut pending);
        let mut seen = 0;
        while let Some((rel, entry, depth)) = pending.pop() {
            if seen >= max {
                return Ok(true);
            }
            seen += 1;
            if !visit(&rel, &entry) {
                break;
            }
            if entry.kind == Kind::Dir && depth < max_depth {
                push_folder(&rel, depth + 1, &mut pending);
            }
        }
        Ok(false)
    }
}

/// Opens `rel` beneath the folder `at`.
pub fn openat2(at: RawFd, rel: &Path, flags: libc::c_int, mode: u32, links: Links) -> io::Result<OwnedFd> {
    let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
    let name = c_path(rel)?;
    // SAFETY: open_how is plain data; every field is set below.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.mode = if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 { u64::from(mode) } else { 0 };
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    if links == Links::None {
        how.resolve |= libc::RESOLVE_NO_SYMLINKS;
    }
    // A rename elsewhere during the lookup makes the kernel ask for a retry.
    for _ in 0..100 {
        // SAFETY: openat2 with a descriptor held open, a NUL-terminated path and the size of
        // the struct passed; the descriptor returned is owned here.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                at,
                name.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            // SAFETY: the kernel returned a new descriptor.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EAGAIN) {
            return Err(e);
        }
    }
    Err(io::Error::from_raw_os_error(libc::EAGAIN))
}

/// The regular file `rel` under `root`, reached through no link at all, read up to `cap`
/// bytes: `Ok(None)` when there is none, an error when it is something else (a link, a
/// folder, a pipe) or larger than `cap`. For reading back what a world's processes wrote.
pub fn read_regular(root: &Path, rel: &Path, cap: u64) -> io::Result<Option<Vec<u8>>> {
    Ok(Beneath::open(root)?.read(rel, Links::None, cap)?.map(|(bytes, _)| bytes))
}

/// The entries of the open folder `dir` (not `.` nor `..`), each looked at without
/// following it, in order of their names.
pub fn entries(dir: &OwnedFd) -> io::Result<Vec<Entry>> {
    let mut names = names(dir)?;
    names.sort();
    let mut out = Vec::with_capacity(names.len());
    for (name, _) in names {
        // Gone since it was listed: not an entry any more.
        let Ok(stat) = stat_at(dir.as_raw_fd(), &name) else { continue };
        out.push(entry_of(OsStr::from_bytes(name.to_bytes()).to_os_string(), &stat));
    }
    Ok(out)
}

/// The names in the open folder `dir` (not `.` nor `..`), each with the type `readdir`
/// gives it (`DT_DIR`, …; `DT_UNKNOWN` where the file system does not say), in the order
/// the folder lists them.
pub fn names(dir: &OwnedFd) -> io::Result<Vec<(CString, u8)>> {
    let mut names = Vec::new();
    // SAFETY: fdopendir takes a duplicate of `dir`, which closedir closes; each entry's name
    // is copied out before the next readdir.
    unsafe {
        let copy = libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0);
        if copy < 0 {
            return Err(io::Error::last_os_error());
        }
        let stream = libc::fdopendir(copy);
        if stream.is_null() {
            let e = io::Error::last_os_error();
            libc::close(copy);
            return Err(e);
        }
        // A duplicate shares the offset: start from the first entry.
        libc::rewinddir(stream);
        loop {
            let entry = libc::readdir(stream);
            if entry.is_null() {
                break;
            }
            let name = CStr::from_ptr((*entry).d_name.as_ptr());
            if !matches!(name.to_bytes(), b"." | b"..") {
                names.push((name.to_owned(), (*entry).d_type));
            }
        }
        libc::closedir(stream);
    }
    Ok(names)
}

/// `fstatat` of `name` in the folder `at`, not following it.
pub fn stat_at(at: RawFd, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: fstatat of a NUL-terminated name in a folder held open, into a zeroed struct.
    unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        if libc::fstatat(at, name.as_ptr(), &mut stat, libc::AT_SYMLINK_NOFOLLOW) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stat)
    }
}

pub fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: fstat on an open descriptor into a zeroed struct.
    unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut stat) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stat)
    }
}

/// Sets the mode of what `fd` (which may be an `O_PATH` descriptor) is, never of what a
/// name leads to now.
pub fn chmod_fd(fd: RawFd, mode: u32) -> io::Result<()> {
    let path = CString::new(format!("/proc/self/fd/{fd}")).map_err(io::Error::other)?;
    // SAFETY: chmod of the descriptor's own magic link, a NUL-terminated path.
    if unsafe { libc::chmod(path.as_ptr(), mode as libc::mode_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The target of the link `name` in the folder `at`.
pub fn read_link_at(at: RawFd, name: &CStr) -> io::Result<PathBuf> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: readlinkat into a buffer of the length passed.
    let n = unsafe { libc::readlinkat(at, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(PathBuf::from(OsStr::from_bytes(&buf)))
}

fn entry_of(name: OsString, stat: &libc::stat) -> Entry {
    Entry { name, kind: Kind::of(stat.st_mode), size: stat.st_size as u64, mode: stat.st_mode & 0o7777 }
}

pub fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

pub fn c_name(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_links_out_of_the_folder_are_refused_and_links_inside_followed() {
        let top = tempfile::tempdir().unwrap();
        let root = top.path().join("root");
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::write(root.join("a/f"), "in").unwrap();
        std::fs::write(top.path().join("secret"), "out").unwrap();
        std::os::unix::fs::symlink("a/f", root.join("inside")).unwrap();
        std::os::unix::fs::symlink("../secret", root.join("out")).unwrap();
        std::os::unix::fs::symlink(top.path().join("secret"), root.join("absolute")).unwrap();
        let b = Beneath::open(&root).unwrap();
        let read = |rel: &str, links| {
            b.file(Path::new(rel), libc::O_RDONLY, 0, links).map(|f| std::io::read_to_string(f).unwrap())
        };
        assert_eq!(read("a/f", Links::None).unwrap(), "in");
        assert_eq!(read("inside", Links::Inside).unwrap(), "in");
        assert_eq!(read("inside", Links::None).unwrap_err().raw_os_error(), Some(libc::ELOOP));
        for out in ["out", "absolute", "../secret", "a/../../secret"] {
            assert_eq!(read(out, Links::Inside).unwrap_err().raw_os_error(), Some(libc::EXDEV), "{out}");
        }
        assert_eq!(b.real(Path::new("inside")).unwrap(), Path::new("a/f"));

        b.create_dir_all(Path::new("x/y/z")).unwrap();
        assert!(root.join("x/y/z").is_dir());
        let mut seen = Vec::new();
        let cut = b
            .walk(Path::new(""), 100, 100, |rel, e| {
                seen.push(format!("{} {:?}", rel.display(), e.kind));
                true
            })
            .unwrap();
        assert!(!cut);
        assert_eq!(
            seen,
            ["a Dir", "a/f File", "absolute Link", "inside Link", "out Link", "x Dir", "x/y Dir", "x/y/z Dir"]
        );
    }
}
