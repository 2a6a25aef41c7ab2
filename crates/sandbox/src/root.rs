//! An episode's own root: an image's layers under a private writable layer, mounted as `/`
//! of a mount namespace that a small process, the holder, keeps for the episode. The holder
//! is also the first process of a pid namespace, so that the episode's processes see one
//! another in its `/proc` and nothing else, and all of them die with it. Each command of the
//! episode enters the mount namespace (its root and paths become the image's), is started in
//! the pid namespace by its keeper, then enters the user namespace in which the image's user
//! ids are host ids far from any account ([`IdMap`]): the image's root owns the image's
//! files, and nothing of the host.
//!
//! The holder is a copy of the runner made with `clone` (without `CLONE_VM`): between the
//! clone and its end it makes only system calls, on values prepared before the clone. It
//! holds a lifeline from the runner (a pipe only the runner writes): when the runner ends,
//! however it ends, the holder exits, and the kernel kills every process of the episode.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::raw;

/// What an episode's root is made of.
#[derive(Debug, Clone)]
pub struct RootSpec {
    /// The image's layers in overlayfs format, the bottom one first.
    pub layers: Vec<PathBuf>,
    /// A private folder of the episode's: its writable layer (`upper/`), overlayfs's
    /// `work/` and the mount point (`merged/`) are made in it. Removed by its owner.
    pub private: PathBuf,
    /// Host files and folders mounted into the root.
    pub binds: Vec<Bind>,
}

/// A host file or folder mounted at a path of the root.
#[derive(Debug, Clone)]
pub struct Bind {
    pub from: PathBuf,
    /// An absolute path inside the root; made when the image lacks it.
    pub to: PathBuf,
    pub writable: bool,
}

/// The host ids the image's ids are: image id `i` is host id `base + i`, for `i` below
/// `range`. The user namespace that maps them is made once and entered by every command of
/// every episode run from an image.
#[derive(Debug)]
pub struct IdMap {
    pub base: u32,
    pub range: u32,
    namespace: OwnedFd,
}

/// An episode's root, held by its holder process until dropped.
#[derive(Debug)]
pub struct Root {
    holder: libc::pid_t,
    /// Written by nobody: when it closes (this value dropped, or the runner gone), the
    /// holder exits.
    _lifeline: OwnedFd,
    mount_ns: OwnedFd,
    pid_ns: OwnedFd,
    /// The root folder, as the runner reaches it (`/proc/<holder>/root`).
    dir: OwnedFd,
    path: PathBuf,
    stopped: std::sync::atomic::AtomicBool,
}

impl IdMap {
    /// Makes the user namespace: a child in a new one waits while its maps are written,
    /// then the namespace is kept by a descriptor.
    pub fn new(base: u32, range: u32) -> io::Result<IdMap> {
        let (wait_read, wait_write) = pipe()?;
        let mut stack = vec![0u128; 1024];
        // SAFETY: the top of `stack`, 16-byte aligned, which outlives the child (it is
        // reaped below); the child only reads the pipe and exits.
        let top = unsafe { stack.as_mut_ptr().add(stack.len()).cast::<u8>() };
        extern "C" fn wait_then_exit(arg: *mut libc::c_void) -> libc::c_int {
            let fd = arg as usize as RawFd;
            let mut byte = [0u8; 1];
            // SAFETY: read fills the byte given.
            let _ = unsafe { raw::call(libc::SYS_read, &[fd as usize, byte.as_mut_ptr() as usize, 1]) };
            0
        }
        let arg = wait_read.as_raw_fd() as usize as *mut libc::c_void;
        // SAFETY: a child with its own copy of memory that only reads a pipe.
        let child = unsafe { raw::clone(libc::CLONE_NEWUSER | libc::SIGCHLD, top, wait_then_exit, arg) }?;
        let mapped = (|| {
            let map = format!("0 {base} {range}\n");
            std::fs::write(format!("/proc/{child}/uid_map"), &map)?;
            std::fs::write(format!("/proc/{child}/gid_map"), &map)?;
            std::fs::File::open(format!("/proc/{child}/ns/user")).map(OwnedFd::from)
        })();
        // A byte, not an end of file: the child holds a copy of the writing end too.
        let _ = raw::write(wait_write.as_raw_fd(), b"x");
        drop(wait_write);
        let mut status = 0;
        let _ = raw::wait(child, &mut status, 0);
        Ok(IdMap { base, range, namespace: mapped? })
    }

    /// The host id of image id `id`, when the map holds it.
    pub fn host_id(&self, id: u32) -> Option<u32> {
        (id < self.range).then(|| self.base + id)
    }
}

impl Root {
    /// Mounts the root and starts its holder; fails, naming the step, when a mount is
    /// refused (overlayfs missing, too many layers for the kernel) or the holder dies.
    pub fn start(spec: &RootSpec) -> io::Result<Root> {
        if spec.layers.is_empty() {
            return Err(io::Error::other("an image root needs at least one layer"));
        }
        let plan = HolderPlan::new(spec)?;
        let (ready_read, ready_write) = pipe()?;
        let (lifeline_read, lifeline_write) = pipe()?;
        let arg = HolderArg { plan: &plan, ready: ready_write.as_raw_fd(), lifeline: lifeline_read.as_raw_fd() };
        let mut stack = vec![0u128; 16 * 1024];
        // SAFETY: the top of `stack`, 16-byte aligned; without CLONE_VM the child runs on
        // its own copy of it, and of `arg` and `plan`, which it only reads.
        let top = unsafe { stack.as_mut_ptr().add(stack.len()).cast::<u8>() };
        let flags = libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::SIGCHLD;
        let arg_ptr = (&arg as *const HolderArg<'_>).cast_mut().cast::<libc::c_void>();
        // SAFETY: see above; the holder makes only system calls.
        let holder = unsafe { raw::clone(flags, top, holder, arg_ptr) }?;
        drop((ready_write, lifeline_read));
        let mut answer = [0u8; 8];
        // SAFETY: read fills the buffer given.
        let read =
            unsafe { raw::call(libc::SYS_read, &[ready_read.as_raw_fd() as usize, answer.as_mut_ptr() as usize, 8]) }
                .ok();
        let step = u32::from_ne_bytes([answer[0], answer[1], answer[2], answer[3]]);
        let errno = i32::from_ne_bytes([answer[4], answer[5], answer[6], answer[7]]);
        if read != Some(8) || step != READY {
            let mut status = 0;
            let _ = raw::wait(holder, &mut status, 0);
            let why = match read {
                Some(8) => io::Error::from_raw_os_error(errno),
                _ => io::Error::other("the holder died before the root was ready"),
            };
            return Err(io::Error::new(why.kind(), format!("{}: {why}", plan.step_name(step))));
        }
        let ns = |name: &str| std::fs::File::open(format!("/proc/{holder}/ns/{name}")).map(OwnedFd::from);
        let path = PathBuf::from(format!("/proc/{holder}/root"));
        let dir = std::fs::File::open(&path).map(OwnedFd::from)?;
        let stopped = std::sync::atomic::AtomicBool::new(false);
        Ok(Root { holder, _lifeline: lifeline_write, mount_ns: ns("mnt")?, pid_ns: ns("pid")?, dir, path, stopped })
    }

    /// The root folder as the runner reaches it: paths beneath it are the image's.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The root folder, held open.
    pub fn dir(&self) -> &OwnedFd {
        &self.dir
    }

    /// The holder's pid.
    pub fn holder(&self) -> u32 {
        self.holder as u32
    }

    pub(crate) fn mount_ns(&self) -> RawFd {
        self.mount_ns.as_raw_fd()
    }

    pub(crate) fn pid_ns(&self) -> RawFd {
        self.pid_ns.as_raw_fd()
    }
}

impl Root {
    /// Ends the holder, and with it every process of the episode; its mounts go with the
    /// mount namespace once nothing holds it. Once; a later call does nothing.
    pub fn stop(&self) {
        if self.stopped.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        raw::kill(self.holder, libc::SIGKILL);
        let mut status = 0;
        let _ = raw::wait(self.holder, &mut status, 0);
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        self.stop();
    }
}

impl IdMap {
    pub(crate) fn namespace(&self) -> RawFd {
        self.namespace.as_raw_fd()
    }
}

/// What the holder reports: `READY`, or the step that failed and its error number.
const READY: u32 = u32::MAX;

/// What the holder does, prepared before the clone: every path a C string.
struct HolderPlan {
    merged: CString,
    /// overlayfs's options: the layers (top first), the upper and work folders.
    lower: Vec<CString>,
    upper: CString,
    work: CString,
    /// Bind mounts: source, target inside `merged`, whether read-only, whether a folder.
    binds: Vec<(CString, CString, bool, bool)>,
    /// Folders made inside `merged` before mounting on them.
    proc_dir: CString,
    dev_dir: CString,
    shm_dir: CString,
    tmp_dir: CString,
    devices: Vec<(CString, u32, u32)>,
    links: Vec<(CString, CString)>,
}

struct HolderArg<'a> {
    plan: &'a HolderPlan,
    ready: RawFd,
    lifeline: RawFd,
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::other("a NUL byte in a path"))
}

impl HolderPlan {
    fn new(spec: &RootSpec) -> io::Result<HolderPlan> {
        let (upper, work, merged) =
            (spec.private.join("upper"), spec.private.join("work"), spec.private.join("merged"));
        for dir in [&upper, &work, &merged] {
            std::fs::create_dir_all(dir)?;
        }
        // The root folder is the upper layer's in the merged view: it gets the owner and
        // mode of the image's own, or the image's root could not write there.
        if let Some(top) = spec.layers.last() {
            use std::os::unix::fs::{MetadataExt, PermissionsExt};
            let own = std::fs::metadata(top)?;
            std::os::unix::fs::chown(&upper, Some(own.uid()), Some(own.gid()))?;
            std::fs::set_permissions(&upper, std::fs::Permissions::from_mode(own.mode() & 0o7777))?;
        }
        let inside = |path: &Path| merged.join(path.strip_prefix("/").unwrap_or(path));
        let mut binds = Vec::new();
        for bind in &spec.binds {
            let is_dir = std::fs::metadata(&bind.from)?.is_dir();
            binds.push((c_path(&bind.from)?, c_path(&inside(&bind.to))?, !bind.writable, is_dir));
        }
        let dev = inside(Path::new("/dev"));
        let devices =
            [("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9), ("tty", 5, 0)]
                .into_iter()
                .map(|(name, major, minor)| Ok((c_path(&dev.join(name))?, major, minor)))
                .collect::<io::Result<Vec<_>>>()?;
        let links = [
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ]
        .into_iter()
        .map(|(name, to)| Ok((c_path(&dev.join(name))?, c_path(Path::new(to))?)))
        .collect::<io::Result<Vec<_>>>()?;
        Ok(HolderPlan {
            lower: spec.layers.iter().rev().map(|l| c_path(l)).collect::<io::Result<_>>()?,
            upper: c_path(&upper)?,
            work: c_path(&work)?,
            binds,
            proc_dir: c_path(&inside(Path::new("/proc")))?,
            dev_dir: c_path(&dev)?,
            shm_dir: c_path(&dev.join("shm"))?,
            tmp_dir: c_path(&inside(Path::new("/tmp")))?,
            devices,
            links,
            merged: c_path(&merged)?,
        })
    }

    /// What a failed step was, for the error.
    fn step_name(&self, step: u32) -> &'static str {
        match step {
            1 => "failed to make the mounts private",
            2 => "failed to mount the image's layers (overlayfs)",
            3 => "failed to mount /proc in the image's root",
            4 => "failed to make /dev in the image's root",
            5 => "failed to mount a host path into the image's root",
            6 => "failed to make the image's root the namespace's",
            _ => "failed to start the image's root",
        }
    }
}

/// A pipe, both ends closed on exec.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two new descriptors, owned from here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The holder: the root mounted and made the namespace's, its readiness reported, then it
/// reaps the episode's orphans until the lifeline ends.
extern "C" fn holder(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is this process's copy of the runner's `HolderArg`, never changed.
    let arg = unsafe { &*arg.cast::<HolderArg<'_>>() };
    forget_the_runner(arg.ready, arg.lifeline);
    let mut message = [0u8; 8];
    match mount_root(arg.plan) {
        Ok(()) => message[..4].copy_from_slice(&READY.to_ne_bytes()),
        Err((step, e)) => {
            message[..4].copy_from_slice(&step.to_ne_bytes());
            message[4..].copy_from_slice(&e.raw_os_error().unwrap_or(libc::EINVAL).to_ne_bytes());
            let _ = raw::write(arg.ready, &message);
            raw::exit(1);
        }
    }
    let _ = raw::write(arg.ready, &message);
    raw::close(arg.ready);
    hold(arg.lifeline)
}

/// Makes the holder a process of its own: no handler of the runner's may run in its copy
/// of the runner (a signal would), and none of the runner's descriptors is kept but its own
/// two (a copy of the runner's signal pipe, written, would tell the runner it got a signal).
fn forget_the_runner(ready: RawFd, lifeline: RawFd) {
    let default = [0usize; 4];
    let none = 0u64;
    // SAFETY: system calls on this process alone, reading what they are given.
    unsafe {
        for signal in 1..=64usize {
            let _ = raw::call(libc::SYS_rt_sigaction, &[signal, default.as_ptr() as usize, 0, 8]);
        }
        let _ = raw::call(libc::SYS_rt_sigprocmask, &[libc::SIG_SETMASK as usize, &none as *const u64 as usize, 0, 8]);
        let _ = raw::call(libc::SYS_prctl, &[libc::PR_SET_NAME as usize, at_str(c"root-holder")]);
    }
    let (low, high) = (ready.min(lifeline), ready.max(lifeline));
    for (first, last) in [(0, low - 1), (low + 1, high - 1), (high + 1, libc::c_int::MAX)] {
        if first <= last {
            // SAFETY: closes descriptors of this process.
            let _ = unsafe { raw::call(libc::SYS_close_range, &[first as usize, last as usize, 0]) };
        }
    }
}

/// `mount(2)` of NUL-terminated strings given by address (`0` for none).
unsafe fn mount(source: usize, target: usize, fstype: usize, flags: libc::c_ulong, data: usize) -> io::Result<()> {
    // SAFETY: the caller's strings.
    unsafe { raw::call(libc::SYS_mount, &[source, target, fstype, flags as usize, data]) }.map(|_| ())
}

/// Makes a folder, when it is not there; whether it made it.
fn make_dir(path: &CString, mode: u32) -> io::Result<bool> {
    // SAFETY: a NUL-terminated path.
    match unsafe { raw::call(libc::SYS_mkdirat, &[libc::AT_FDCWD as usize, path.as_ptr() as usize, mode as usize]) } {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Makes `path` and its missing parents, as folders (or, with `file`, the last as an empty
/// file), each part resolved in the root being made. Allocates nothing.
fn make_path(path: &CString, file: bool) -> io::Result<()> {
    let bytes = path.as_bytes();
    let mut buffer = [0u8; 4096];
    if bytes.len() >= buffer.len() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    buffer[..bytes.len()].copy_from_slice(bytes);
    for i in 1..=bytes.len() {
        let last = i == bytes.len();
        if !last && bytes[i] != b'/' {
            continue;
        }
        buffer[i] = 0;
        let part = buffer.as_ptr() as usize;
        // SAFETY: `buffer` is NUL-terminated at `i`.
        let made = unsafe {
            if last && file {
                raw::call(
                    libc::SYS_openat,
                    &[
                        libc::AT_FDCWD as usize,
                        part,
                        (libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC) as usize,
                        0o644,
                    ],
                )
                .map(|fd| raw::close(fd as RawFd))
            } else {
                raw::call(libc::SYS_mkdirat, &[libc::AT_FDCWD as usize, part, 0o755]).map(|_| ())
            }
        };
        if let Err(e) = made
            && e.raw_os_error() != Some(libc::EEXIST)
        {
            return Err(e);
        }
        if !last {
            buffer[i] = b'/';
        }
    }
    Ok(())
}

/// The holder's mounts, in order; the step that failed, and how.
fn mount_root(plan: &HolderPlan) -> Result<(), (u32, io::Error)> {
    let step = |n: u32| move |e: io::Error| (n, e);
    let at = |s: &CString| s.as_ptr() as usize;
    // SAFETY: system calls in the holder, on strings prepared before the clone.
    unsafe {
        mount(0, at_str(c"/"), 0, libc::MS_REC | libc::MS_PRIVATE, 0).map_err(step(1))?;
        mount_layers(plan).map_err(step(2))?;
        make_dir(&plan.proc_dir, 0o555).map_err(step(3))?;
        let proc_flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
        mount(at_str(c"proc"), at(&plan.proc_dir), at_str(c"proc"), proc_flags, 0).map_err(step(3))?;
        make_dev(plan).map_err(step(4))?;
        // Made with the runner's umask: the mode is set after.
        if make_dir(&plan.tmp_dir, 0o1777).map_err(step(4))? {
            raw::call(libc::SYS_fchmodat, &[libc::AT_FDCWD as usize, at(&plan.tmp_dir), 0o1777, 0]).map_err(step(4))?;
        }
        for (from, to, read_only, is_dir) in &plan.binds {
            make_path(to, !is_dir).map_err(step(5))?;
            mount(at(from), at(to), 0, libc::MS_BIND | libc::MS_REC, 0).map_err(step(5))?;
            if *read_only {
                let flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
                mount(0, at(to), 0, flags, 0).map_err(step(5))?;
            }
        }
        // The root becomes the namespace's: the old one is put under it, then let go.
        raw::call(libc::SYS_chdir, &[at(&plan.merged)]).map_err(step(6))?;
        let here = at_str(c".");
        raw::call(libc::SYS_pivot_root, &[here, here]).map_err(step(6))?;
        raw::call(libc::SYS_umount2, &[here, libc::MNT_DETACH as usize]).map_err(step(6))?;
        raw::call(libc::SYS_chdir, &[at_str(c"/")]).map_err(step(6))?;
    }
    Ok(())
}

fn at_str(s: &std::ffi::CStr) -> usize {
    s.as_ptr() as usize
}

/// `fsconfig(2)`'s commands, and the flags of the mount calls, as the kernel's uapi has them.
const FSOPEN_CLOEXEC: usize = 1;
const FSCONFIG_SET_STRING: usize = 1;
const FSCONFIG_CMD_CREATE: usize = 6;
const FSMOUNT_CLOEXEC: usize = 1;
const MOVE_MOUNT_F_EMPTY_PATH: usize = 4;

/// Mounts the layers at `merged` with the new mount API, which takes the lower layers one
/// at a time (`lowerdir+`, Linux 6.8): an image of many layers fits, where `mount(2)`'s
/// options stop at a page.
unsafe fn mount_layers(plan: &HolderPlan) -> io::Result<()> {
    let at = |s: &CString| s.as_ptr() as usize;
    // SAFETY: system calls in the holder on NUL-terminated strings; the descriptors made are
    // closed before returning.
    unsafe {
        let fs = raw::call(libc::SYS_fsopen, &[at_str(c"overlay"), FSOPEN_CLOEXEC])?;
        let configured = (|| {
            let set = |key: &std::ffi::CStr, value: &CString| {
                raw::call(libc::SYS_fsconfig, &[fs, FSCONFIG_SET_STRING, at_str(key), at(value), 0])
            };
            for layer in &plan.lower {
                set(c"lowerdir+", layer)?;
            }
            set(c"upperdir", &plan.upper)?;
            set(c"workdir", &plan.work)?;
            raw::call(libc::SYS_fsconfig, &[fs, FSCONFIG_CMD_CREATE, 0, 0, 0])?;
            let mounted = raw::call(libc::SYS_fsmount, &[fs, FSMOUNT_CLOEXEC, 0])?;
            let moved = raw::call(
                libc::SYS_move_mount,
                &[mounted, at_str(c""), libc::AT_FDCWD as usize, at(&plan.merged), MOVE_MOUNT_F_EMPTY_PATH],
            );
            raw::close(mounted as RawFd);
            moved.map(|_| ())
        })();
        raw::close(fs as RawFd);
        configured
    }
}

/// A small `/dev` of its own: a tmpfs with the devices a program expects (null, zero,
/// full, random, urandom, tty), the `fd` and standard stream links, and `shm`.
unsafe fn make_dev(plan: &HolderPlan) -> io::Result<()> {
    let at = |s: &CString| s.as_ptr() as usize;
    make_dir(&plan.dev_dir, 0o755)?;
    // SAFETY: system calls in the holder on NUL-terminated strings.
    unsafe {
        let flags = libc::MS_NOSUID | libc::MS_NOEXEC;
        mount(at_str(c"tmpfs"), at(&plan.dev_dir), at_str(c"tmpfs"), flags, at_str(c"mode=755,size=65536k"))?;
        for (path, major, minor) in &plan.devices {
            let dev = libc::makedev(*major, *minor) as usize;
            raw::call(libc::SYS_mknodat, &[libc::AT_FDCWD as usize, at(path), (libc::S_IFCHR | 0o666) as usize, dev])?;
            // The umask would take the others' write bit away.
            raw::call(libc::SYS_fchmodat, &[libc::AT_FDCWD as usize, at(path), 0o666, 0])?;
        }
        for (path, to) in &plan.links {
            raw::call(libc::SYS_symlinkat, &[at(to), libc::AT_FDCWD as usize, at(path)])?;
        }
        make_dir(&plan.shm_dir, 0o1777)?;
        mount(
            at_str(c"tmpfs"),
            at(&plan.shm_dir),
            at_str(c"tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            at_str(c"mode=1777"),
        )?;
    }
    Ok(())
}

/// The holder's life once the root is ready: its children (the episode's orphans) are
/// reaped by the kernel (`SIGCHLD` ignored), and it waits for the lifeline to end.
fn hold(lifeline: RawFd) -> ! {
    let ignore = [libc::SIG_IGN, 0, 0, 0];
    // SAFETY: rt_sigaction and ppoll read what they are given.
    unsafe {
        let _ = raw::call(libc::SYS_rt_sigaction, &[libc::SIGCHLD as usize, ignore.as_ptr() as usize, 0, 8]);
        loop {
            let mut fds = [libc::pollfd { fd: lifeline, events: libc::POLLIN, revents: 0 }];
            let _ = raw::call(libc::SYS_ppoll, &[fds.as_mut_ptr() as usize, 1, 0, 0, 8]);
            if fds[0].revents != 0 {
                raw::exit(0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// Host ids the tests' images use: far from any account.
    const BASE: u32 = 1_000_000_000;

    /// A layer with a shell and the libraries it needs, copied from the host, owned by the
    /// image's root (host id `BASE`).
    fn shell_layer(dir: &Path) {
        for file in ["/bin/dash", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2"] {
            let to = dir.join(file.trim_start_matches('/'));
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(file, &to).unwrap();
        }
        std::os::unix::fs::symlink("dash", dir.join("bin/sh")).unwrap();
        std::fs::create_dir_all(dir.join("etc")).unwrap();
        std::fs::write(dir.join("etc/os-release"), "NAME=tiny\n").unwrap();
        std::fs::create_dir_all(dir.join("work")).unwrap();
        for entry in walk(dir) {
            std::os::unix::fs::lchown(&entry, Some(BASE), Some(BASE)).unwrap();
        }
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut all = vec![dir.to_path_buf()];
        let mut i = 0;
        while i < all.len() {
            if all[i].is_dir() && !all[i].is_symlink() {
                let mut more: Vec<PathBuf> = std::fs::read_dir(&all[i]).unwrap().map(|e| e.unwrap().path()).collect();
                all.append(&mut more);
            }
            i += 1;
        }
        all
    }

    /// Runs `script` in `root` as image user `user`, its output and exit code.
    async fn run(root: &Arc<Root>, ids: &Arc<IdMap>, user: (u32, u32), script: &str) -> (String, Option<i32>) {
        use tokio::io::AsyncReadExt;
        let spec = crate::SandboxSpec::default();
        let sandbox = crate::Confinement::prepare_in_root(&spec, root.clone(), ids.clone(), user).unwrap();
        let mut command = tokio::process::Command::new("sh");
        command.args(["-c", script]).current_dir("/work").env("PATH", "/bin:/usr/bin");
        let mut started = crate::process::spawn(&command, crate::process::Input::Null, &sandbox).unwrap();
        let mut out = String::new();
        started.keeper.stdout.take().unwrap().read_to_string(&mut out).await.unwrap();
        let mut err = String::new();
        started.keeper.stderr.take().unwrap().read_to_string(&mut err).await.unwrap();
        let code = started.shell_status().await.and_then(|s| s.code());
        (out + &err, code)
    }

    use std::sync::Arc;

    fn root_runner() -> bool {
        // SAFETY: geteuid cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        if !root {
            assert!(std::env::var_os("CI").is_none(), "image roots need a root runner, and CI runs as root");
        }
        root
    }

    /// A command runs in the image's root as the image's user: it sees the image's files and
    /// none of the host's, its writes land in the episode's layer (the image's stays as it
    /// was), it is the image's root without being the host's, and it sees its own processes
    /// alone in `/proc`.
    #[tokio::test]
    async fn a_command_runs_in_the_images_root_as_the_images_user_and_writes_only_its_layer() {
        if !root_runner() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let layer = dir.path().join("layer");
        shell_layer(&layer);
        let private = dir.path().join("episode");
        let ids = Arc::new(IdMap::new(BASE, 65536).unwrap());
        let spec = RootSpec { layers: vec![layer.clone()], private: private.clone(), binds: Vec::new() };
        let root = Arc::new(Root::start(&spec).unwrap());
        // Builtins only: the image has a shell and nothing else.
        let script = "while read l; do echo \"$l\"; done < /etc/os-release; \
                      while read k v rest; do [ \"$k\" = Uid: ] && echo uid=$v; done < /proc/self/status; \
                      echo made > /made.txt && echo wrote; \
                      [ -e /usr/bin/cargo ] && echo host-visible; \
                      n=0; for p in /proc/[0-9]*; do n=$((n+1)); done; echo processes=$n; pwd";
        let (out, code) = run(&root, &ids, (0, 0), script).await;
        assert_eq!(code, Some(0), "{out}");
        assert!(out.contains("NAME=tiny"), "the image's file: {out}");
        assert!(out.contains("wrote"), "the image's root writes its root folder: {out}");
        assert!(out.contains("uid=0\n"), "the image's user is its root: {out}");
        // The holder and the shell: nothing of the host's.
        assert!(out.contains("processes=2\n"), "{out}");
        assert!(!out.contains("host-visible"), "a host file is visible: {out}");
        assert!(out.trim_end().ends_with("/work"), "the working folder is the image's: {out}");
        assert!(!layer.join("made.txt").exists(), "the write reached the image's layer");
        let made = private.join("upper/made.txt");
        assert_eq!(std::fs::read_to_string(&made).unwrap(), "made\n");
        assert_eq!(std::fs::metadata(&made).unwrap().uid(), BASE, "the image's root is host id BASE");
        // Another user of the image may not write the image's root.
        let (out, code) = run(&root, &ids, (1000, 1000), "echo no > /other.txt").await;
        assert_ne!(code, Some(0), "{out}");
        drop(root);
    }

    /// The root's processes die with it: a command left running when the root goes is gone.
    #[tokio::test]
    async fn what_runs_in_a_root_dies_with_it() {
        if !root_runner() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let layer = dir.path().join("layer");
        shell_layer(&layer);
        let ids = Arc::new(IdMap::new(BASE, 65536).unwrap());
        let spec = RootSpec { layers: vec![layer], private: dir.path().join("episode"), binds: Vec::new() };
        let root = Arc::new(Root::start(&spec).unwrap());
        let holder = root.holder();
        let sandbox =
            crate::Confinement::prepare_in_root(&crate::SandboxSpec::default(), root.clone(), ids, (0, 0)).unwrap();
        let mut command = tokio::process::Command::new("sh");
        command.args(["-c", "while :; do :; done"]).current_dir("/").env("PATH", "/bin");
        let mut started = crate::process::spawn(&command, crate::process::Input::Null, &sandbox).unwrap();
        drop((sandbox, root));
        assert!(!Path::new(&format!("/proc/{holder}")).exists(), "the holder outlived its root");
        let status = tokio::time::timeout(std::time::Duration::from_secs(10), started.shell_status()).await;
        let status = status.expect("the command outlived its root").expect("a status");
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL), "{status:?}");
    }
}
