//! The user a root runner's processes become. Landlock governs opening, writing and
//! removing files but not changing their metadata (`chmod`, `chown`, `utimensat`,
//! `setxattr`), and the kernel lets a file's owner do that without any capability: a
//! command running as root, with no capability, could still `chmod 4777` any file
//! root owns. So when the runner is root, each process it starts becomes a user of its own
//! that owns nothing on the host (no supplementary groups), keeping one capability,
//! `CAP_DAC_READ_SEARCH`, so that it still reads and runs what Landlock lets it read — an
//! interpreter or a server installed under `/root`, whose mode is 0700 — while Landlock
//! still decides what that is.
//!
//! The folders a world may write are handed to that user before each process starts
//! ([`Handover`]): what the runner wrote there (the task's files, a `write_file`, a
//! restored checkpoint) becomes the command's own, to change as before.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};

/// `CAP_DAC_READ_SEARCH`: read any file and search any folder, whatever its mode.
const CAP_DAC_READ_SEARCH: u32 = 2;

/// The ids tried for that user, highest first: below `nobody` (65534), within the 65,536
/// ids a container's user namespace usually maps, and free of any account on the host.
const CANDIDATE_IDS: std::ops::RangeInclusive<u32> = 65_000..=65_500;

/// How deep a [`Handover`] looks: what the runner writes lies near the top; a command's own
/// deeper folders are its own already.
const HAND_OVER_DEPTH: usize = 64;

/// An id no account and no group of the host has, and which this process's user namespace
/// maps; `None` when there is none.
pub(super) fn free_id() -> Option<u32> {
    let ids_in = |file: &str| -> Vec<u32> {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        text.lines().filter_map(|l| l.split(':').nth(2)?.parse().ok()).collect()
    };
    let taken: Vec<u32> = ids_in("/etc/passwd").into_iter().chain(ids_in("/etc/group")).collect();
    let mapped = |map: &str, id: u32| {
        let Ok(text) = std::fs::read_to_string(map) else { return true };
        text.lines().any(|line| {
            let fields: Vec<u64> = line.split_whitespace().filter_map(|f| f.parse().ok()).collect();
            matches!(fields[..], [inside, _, count] if (inside..inside + count).contains(&u64::from(id)))
        })
    };
    CANDIDATE_IDS
        .rev()
        .find(|id| !taken.contains(id) && mapped("/proc/self/uid_map", *id) && mapped("/proc/self/gid_map", *id))
}

/// Becomes user and group `id` with no supplementary groups, keeping only
/// `CAP_DAC_READ_SEARCH`, as an ambient capability so that it survives `exec`, under
/// `no_new_privs`. To be called by root in a command's child, before Landlock.
///
/// The bounding set is left as it is: it only limits what an `exec` may add to the
/// permitted set (from a program's file capabilities, or root's through a set-user-ID
/// program), and under `no_new_privs` an `exec` adds nothing: the kernel keeps the
/// permitted set within the one before, and a set-user-ID or set-group-ID bit changes no
/// id. With no capability left to raise it with, the user cannot become root again either.
/// Emptying the set took a `prctl` per capability, each copying the process's credentials:
/// about 40 of them, 24 µs a command.
///
/// # Safety
/// Only in a command's child that will `exec` or exit next: it changes the process for
/// good. It makes only system calls, without the C library, and allocates nothing.
pub(super) unsafe fn become_user(id: u32) -> io::Result<()> {
    use super::raw::call;
    let id = id as usize;
    let prctl = |option: libc::c_int, value: usize| {
        // SAFETY: prctl with plain numbers, on this process alone.
        unsafe { call(libc::SYS_prctl, &[option as usize, value]) }
    };
    // First, so that nothing this process runs gains a privilege (see above).
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1)?;
    // Raw calls: the C library's would signal threads this child does not have. The flag
    // that keeps capabilities across the change of user is cleared by `exec`.
    prctl(libc::PR_SET_KEEPCAPS, 1)?;
    // SAFETY: system calls on this process alone, with values made here.
    unsafe {
        call(libc::SYS_setgroups, &[0, 0])?;
        call(libc::SYS_setresgid, &[id, id, id])?;
        call(libc::SYS_setresuid, &[id, id, id])?;
        let mut header = CapHeader { version: 0x2008_0522, pid: 0 };
        let keep = 1u32 << CAP_DAC_READ_SEARCH;
        let data = [CapData { effective: keep, permitted: keep, inheritable: keep }, CapData::default()];
        call(libc::SYS_capset, &[&mut header as *mut CapHeader as usize, data.as_ptr() as usize])?;
        call(
            libc::SYS_prctl,
            &[libc::PR_CAP_AMBIENT as usize, libc::PR_CAP_AMBIENT_RAISE as usize, CAP_DAC_READ_SEARCH as usize],
        )?;
    }
    Ok(())
}

/// `struct __user_cap_header_struct` and `__user_cap_data_struct` (version 3: two of them).
#[repr(C)]
pub(super) struct CapHeader {
    pub version: u32,
    pub pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct CapData {
    pub effective: u32,
    pub permitted: u32,
    pub inheritable: u32,
}

/// The folders a world's processes may write, handed to the user they become before each
/// process starts.
pub(super) struct Handover {
    pub id: u32,
    folders: Vec<std::path::PathBuf>,
    /// When the last hand-over that finished began (seconds, the clock file times are
    /// stamped with); `i64::MIN` before the first.
    last_began: AtomicI64,
}

impl Handover {
    pub fn new(id: u32, folders: Vec<std::path::PathBuf>) -> Self {
        Handover { id, folders, last_began: AtomicI64::new(i64::MIN) }
    }

    /// Hands every folder over. A folder whose entries have not changed since the last
    /// hand-over began (its change time says so) is only looked through for folders: what
    /// was in it then was handed over then.
    pub fn run(&self) {
        let began = coarse_now();
        let since = self.last_began.load(Ordering::Acquire);
        let since = (since != i64::MIN).then_some(since);
        for folder in &self.folders {
            hand_over(folder, self.id, since);
        }
        self.last_began.fetch_max(began, Ordering::AcqRel);
    }
}

/// The time in seconds, as the coarse clock that stamps files has it.
fn coarse_now() -> i64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes the struct given.
    unsafe {
        libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut now);
    }
    now.tv_sec
}

/// Makes `id` the owner and group of `folder` and of everything beneath it that it does not
/// own yet, looking only for folders in those unchanged `since` then. Paths are resolved from
/// a handle of each folder and links are never followed, so a command that swaps a folder
/// for a link while this runs changes nothing outside; a file with other names (hard links)
/// is left alone, as are other file systems and what lies deeper than [`HAND_OVER_DEPTH`].
/// Errors are skipped: what could not be handed over stays the runner's, and a command that
/// writes it is refused and says so.
fn hand_over(folder: &Path, id: u32, since: Option<i64>) {
    let Ok(path) = std::ffi::CString::new(folder.as_os_str().as_bytes()) else { return };
    // SAFETY: a NUL-terminated path; the descriptor returned is owned below.
    let fd =
        unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        return;
    }
    // SAFETY: a new descriptor, owned from here on.
    let dir = unsafe { OwnedFd::from_raw_fd(fd) };
    let Some(top) = stat_at(dir.as_raw_fd(), c"", libc::AT_EMPTY_PATH) else { return };
    if (top.st_uid, top.st_gid) != (id, id) {
        // SAFETY: an open descriptor of the folder itself.
        unsafe {
            libc::fchown(dir.as_raw_fd(), id, id);
        }
    }
    hand_over_beneath(&dir, top.st_dev, id, since, 0);
}

fn hand_over_beneath(dir: &OwnedFd, device: libc::dev_t, id: u32, since: Option<i64>, depth: usize) {
    if depth >= HAND_OVER_DEPTH {
        return;
    }
    let Some(own) = stat_at(dir.as_raw_fd(), c"", libc::AT_EMPTY_PATH) else { return };
    // A second's margin: the clock that stamps files runs a little behind.
    let changed = since.is_none_or(|since| own.st_ctime >= since - 1);
    for (name, kind) in entries(dir) {
        if !changed && kind != libc::DT_DIR && kind != libc::DT_UNKNOWN {
            continue;
        }
        let Some(stat) = stat_at(dir.as_raw_fd(), &name, libc::AT_SYMLINK_NOFOLLOW) else { continue };
        if stat.st_dev != device {
            continue;
        }
        let is_dir = stat.st_mode & libc::S_IFMT == libc::S_IFDIR;
        if (stat.st_uid, stat.st_gid) != (id, id) && (is_dir || stat.st_nlink == 1) {
            // SAFETY: a NUL-terminated name beneath an open folder; the link itself, if one.
            unsafe {
                libc::fchownat(dir.as_raw_fd(), name.as_ptr(), id, id, libc::AT_SYMLINK_NOFOLLOW);
            }
        }
        if is_dir {
            let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
            // SAFETY: a NUL-terminated name beneath an open folder; the descriptor is owned.
            let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) };
            if fd >= 0 {
                // SAFETY: a new descriptor, owned from here on.
                let child = unsafe { OwnedFd::from_raw_fd(fd) };
                hand_over_beneath(&child, device, id, since, depth + 1);
            }
        }
    }
}

fn stat_at(dir: RawFd, name: &CStr, flags: libc::c_int) -> Option<libc::stat> {
    // SAFETY: an all-zero stat is a valid value, which fstatat overwrites.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: an open descriptor, a NUL-terminated name and a stat to fill.
    (unsafe { libc::fstatat(dir, name.as_ptr(), &mut stat, flags) } == 0).then_some(stat)
}

/// The names in an open folder, less `.` and `..`, with their types as the folder gives
/// them (`DT_UNKNOWN` on file systems that do not).
fn entries(dir: &OwnedFd) -> Vec<(std::ffi::CString, u8)> {
    // SAFETY: a duplicate of an open descriptor, handed to fdopendir, which owns it and
    // closes it in closedir.
    unsafe {
        let fd = libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0);
        if fd < 0 {
            return Vec::new();
        }
        let stream = libc::fdopendir(fd);
        if stream.is_null() {
            libc::close(fd);
            return Vec::new();
        }
        libc::rewinddir(stream);
        let mut names = Vec::new();
        loop {
            let entry = libc::readdir(stream);
            if entry.is_null() {
                break;
            }
            let name = CStr::from_ptr((*entry).d_name.as_ptr());
            if name != c"." && name != c".." {
                names.push((name.to_owned(), (*entry).d_type));
            }
        }
        libc::closedir(stream);
        names
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_free_id_is_no_accounts_and_lies_in_the_range() {
        if let Some(id) = free_id() {
            assert!(CANDIDATE_IDS.contains(&id));
            let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
            assert!(!passwd.lines().any(|l| l.split(':').nth(2) == Some(&id.to_string())), "{id} has an account");
        }
    }

    #[test]
    fn hand_over_changes_the_tree_but_no_link_or_what_a_link_points_to() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: only root can give files away");
            return;
        }
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("target");
        std::fs::write(&target, "x").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/file"), "x").unwrap();
        std::os::unix::fs::symlink(&target, root.join("a/link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("a/folder_link")).unwrap();
        std::fs::hard_link(&target, root.join("a/hard")).unwrap();
        let handover = Handover::new(65_432, vec![root.to_path_buf()]);
        handover.run();
        for path in ["", "a", "a/b", "a/b/file"] {
            let meta = std::fs::symlink_metadata(root.join(path)).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (65_432, 65_432), "{path}");
        }
        assert_eq!(std::fs::symlink_metadata(root.join("a/link")).unwrap().uid(), 65_432, "the link itself");
        for outside in [&target, &outside.path().to_path_buf()] {
            assert_eq!(std::fs::metadata(outside).unwrap().uid(), 0, "{} was given away", outside.display());
        }
        // What the runner writes later, deep down too, is handed over by the next one.
        std::fs::write(root.join("a/b/later"), "x").unwrap();
        std::fs::create_dir(root.join("a/b/made")).unwrap();
        handover.run();
        for path in ["a/b/later", "a/b/made"] {
            assert_eq!(std::fs::metadata(root.join(path)).unwrap().uid(), 65_432, "{path}");
        }
    }
}
