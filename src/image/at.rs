//! The system calls an unpack and the store make, relative to folders held open: a layer's
//! folder is written one entry at a time beneath its root, every parent opened with
//! `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, so a link an archive made earlier is
//! never followed, whatever later entries name.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A name or relative path as the C calls take it.
pub fn c_bytes(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a name holds a NUL byte"))
}

fn check(result: libc::c_int) -> io::Result<()> {
    if result == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

fn owned(fd: libc::c_long) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Opens the folder `rel` beneath `root` (`""` for the root itself), following no link and
/// never leaving it.
pub fn open_dir_beneath(root: RawFd, rel: &[u8]) -> io::Result<OwnedFd> {
    let rel = c_bytes(if rel.is_empty() { b"." } else { rel })?;
    // SAFETY: open_how is plain data; every field is set below.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    // RESOLVE_NO_SYMLINKS covers the last component too (ELOOP, which says why).
    how.flags = (libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    loop {
        // SAFETY: openat2 with a descriptor held open, a NUL-terminated path and the size of
        // the struct passed.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                root,
                rel.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        match owned(fd) {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => continue,
            other => return other,
        }
    }
}

/// Opens `name` in `dir` without following a link.
pub fn open_at(dir: RawFd, name: &CStr, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
    let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: openat of a NUL-terminated name in a folder held open.
    owned(unsafe { libc::openat(dir, name.as_ptr(), flags, mode as libc::c_uint) }.into())
}

/// Opens the folder at `path` (the store's own, trusted path).
pub fn open_dir(path: &std::path::Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let path = c_bytes(path.as_os_str().as_bytes())?;
    open_at(libc::AT_FDCWD, &path, libc::O_RDONLY | libc::O_DIRECTORY, 0)
}

pub fn mkdir_at(dir: RawFd, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: mkdirat of a NUL-terminated name in a folder held open.
    check(unsafe { libc::mkdirat(dir, name.as_ptr(), mode) })
}

pub fn mknod_at(dir: RawFd, name: &CStr, mode: u32, major: u32, minor: u32) -> io::Result<()> {
    // SAFETY: mknodat of a NUL-terminated name in a folder held open.
    check(unsafe { libc::mknodat(dir, name.as_ptr(), mode, libc::makedev(major, minor)) })
}

pub fn symlink_at(target: &CStr, dir: RawFd, name: &CStr) -> io::Result<()> {
    // SAFETY: symlinkat with NUL-terminated strings and a folder held open.
    check(unsafe { libc::symlinkat(target.as_ptr(), dir, name.as_ptr()) })
}

/// A hard link `to_dir/to` of `from_dir/from` (a link itself if it is one: never followed).
pub fn link_at(from_dir: RawFd, from: &CStr, to_dir: RawFd, to: &CStr) -> io::Result<()> {
    // SAFETY: linkat with NUL-terminated names in folders held open; flags 0 follow nothing.
    check(unsafe { libc::linkat(from_dir, from.as_ptr(), to_dir, to.as_ptr(), 0) })
}

pub fn unlink_at(dir: RawFd, name: &CStr, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unlinkat of a NUL-terminated name in a folder held open.
    check(unsafe { libc::unlinkat(dir, name.as_ptr(), flags) })
}

/// The owner of `name` in `dir` (a link itself, not what it names).
pub fn chown_at(dir: RawFd, name: &CStr, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: fchownat of a NUL-terminated name in a folder held open, not following it.
    check(unsafe { libc::fchownat(dir, name.as_ptr(), uid, gid, libc::AT_SYMLINK_NOFOLLOW) })
}

/// The mode of `name` in `dir`, which the caller made and knows is no link.
pub fn chmod_at(dir: RawFd, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: fchmodat of a NUL-terminated name in a folder held open.
    check(unsafe { libc::fchmodat(dir, name.as_ptr(), mode, 0) })
}

pub fn chown_fd(fd: RawFd, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: fchown of a descriptor held open.
    check(unsafe { libc::fchown(fd, uid, gid) })
}

pub fn chmod_fd(fd: RawFd, mode: u32) -> io::Result<()> {
    // SAFETY: fchmod of a descriptor held open.
    check(unsafe { libc::fchmod(fd, mode) })
}

/// Sets the modification (and access) time of `name` in `dir`, not following a link.
pub fn set_mtime_at(dir: RawFd, name: &CStr, seconds: i64) -> io::Result<()> {
    let time = libc::timespec { tv_sec: seconds as libc::time_t, tv_nsec: 0 };
    let times = [time, time];
    // SAFETY: utimensat of a NUL-terminated name in a folder held open with two timespecs.
    check(unsafe { libc::utimensat(dir, name.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) })
}

pub fn set_mtime_fd(fd: RawFd, seconds: i64) -> io::Result<()> {
    let time = libc::timespec { tv_sec: seconds as libc::time_t, tv_nsec: 0 };
    let times = [time, time];
    // SAFETY: futimens of a descriptor held open with two timespecs.
    check(unsafe { libc::futimens(fd, times.as_ptr()) })
}

pub fn set_xattr_fd(fd: RawFd, name: &CStr, value: &[u8]) -> io::Result<()> {
    // SAFETY: fsetxattr of a descriptor held open with a NUL-terminated name and a buffer
    // of the length given.
    check(unsafe { libc::fsetxattr(fd, name.as_ptr(), value.as_ptr().cast(), value.len(), 0) })
}

pub fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data, filled by fstat of a descriptor held open.
    unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        check(libc::fstat(fd, &mut stat))?;
        Ok(stat)
    }
}

/// What `name` in `dir` is, not following a link.
pub fn stat_at(dir: RawFd, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: stat is plain data, filled by fstatat of a NUL-terminated name in a folder
    // held open.
    unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        check(libc::fstatat(dir, name.as_ptr(), &mut stat, libc::AT_SYMLINK_NOFOLLOW))?;
        Ok(stat)
    }
}

/// Moves the file offset of `fd` `by` bytes on: a hole where nothing is written.
pub fn skip(fd: RawFd, by: u64) -> io::Result<()> {
    // SAFETY: lseek of a descriptor held open.
    let at = unsafe { libc::lseek(fd, by as libc::off_t, libc::SEEK_CUR) };
    if at < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

pub fn truncate_fd(fd: RawFd, size: u64) -> io::Result<()> {
    // SAFETY: ftruncate of a descriptor held open.
    check(unsafe { libc::ftruncate(fd, size as libc::off_t) })
}

/// Waits for a lock on the open file (`libc::LOCK_SH` or `libc::LOCK_EX`); it is released
/// when the file is closed.
pub fn lock(file: &std::fs::File, how: libc::c_int) -> io::Result<()> {
    loop {
        // SAFETY: flock of a descriptor held open.
        match check(unsafe { libc::flock(file.as_raw_fd(), how) }) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// The names in the open folder `dir`, without `.` and `..`.
pub fn names(dir: RawFd) -> io::Result<Vec<CString>> {
    // fdopendir takes the descriptor it is given; it gets a copy to close.
    // SAFETY: dup of a descriptor held open.
    let copy = owned(unsafe { libc::fcntl(dir, libc::F_DUPFD_CLOEXEC, 0) }.into())?;
    // SAFETY: the copy is handed to fdopendir, which owns it from now on.
    let stream = unsafe { libc::fdopendir(std::os::fd::IntoRawFd::into_raw_fd(copy)) };
    if stream.is_null() {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the stream is open until closedir below; each entry is read before the next
    // readdir call.
    unsafe { libc::rewinddir(stream) };
    let mut found = Vec::new();
    loop {
        // SAFETY: as above.
        let entry = unsafe { libc::readdir(stream) };
        if entry.is_null() {
            break;
        }
        // SAFETY: d_name of an entry readdir returned is NUL-terminated.
        let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
        if name != c"." && name != c".." {
            found.push(name.to_owned());
        }
    }
    // SAFETY: the stream opened above, closed once.
    unsafe { libc::closedir(stream) };
    Ok(found)
}
