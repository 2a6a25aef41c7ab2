//! The sandbox every process a world starts runs in: commands of `shell`, `check:` scorers,
//! interpreters. It is prepared once per world, in the runner, and entered by each new
//! process between `fork` and `exec` with a handful of system calls that allocate nothing:
//!
//! - **files** (Landlock): read-write beneath the episode's own folders, read-only on the
//!   system's (`/usr`, `/bin`, `/lib*`, `/etc` less what is hidden) and on the paths a world
//!   or a suite adds; nothing else — `$HOME`, the results, the suite's folder and other
//!   episodes' folders cannot be opened at all. Landlock also keeps the process from tracing
//!   or, from ABI 6, signalling anything outside its sandbox (the runner, the keeper).
//! - **network** (seccomp): no IPv4 or IPv6 socket, TCP or UDP, localhost included, unless
//!   the environment says `network: true`; no `io_uring`, which could open one unseen.
//!   From Landlock ABI 4, TCP bind and connect are refused by Landlock as well.
//! - **resources** (rlimits, and a pids cgroup when the runner is root, whom the kernel
//!   exempts from the processes limit): CPU seconds, address space, processes, file size,
//!   open files; no core dumps.
//! - **privileges**: `no_new_privs`, and when the runner is root, an empty capability
//!   bounding set: a root command can then neither raise its limits nor override file
//!   permissions.
//!
//! What the kernel cannot enforce is refused when the world is set up, naming what is
//! missing, unless the suite or the command line turns the sandbox off; what was enforced
//! is recorded in `run.json` and in each episode's first observation.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The system folders a command may read and run from.
const SYSTEM_READ: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc"];

/// Devices a command may read and write.
const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"];

/// Parts of `/etc` withheld unless a definition says otherwise: secrets of the host.
pub const HIDDEN_BY_DEFAULT: &[&str] =
    &["/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers", "/etc/sudoers.d", "/etc/ssh"];

/// An environment's `sandbox:`; absent means on with these defaults.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SandboxSpec {
    /// Whether processes may open IPv4 and IPv6 sockets.
    pub network: bool,
    /// More folders or files to read (and run programs from).
    pub read_paths: Vec<PathBuf>,
    /// Folders outside the episode's own that processes may also write (a shared output
    /// folder, say): every episode can then change them.
    pub write_paths: Vec<PathBuf>,
    /// System paths to withhold, beneath the readable ones; replaces [`HIDDEN_BY_DEFAULT`].
    pub hide: Option<Vec<PathBuf>>,
    pub limits: ProcessLimits,
}

/// Limits of each process a world starts; `null` lifts one.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProcessLimits {
    /// CPU seconds of each process.
    pub cpu_s: Option<u64>,
    /// Address space of each process, in MiB.
    pub memory_mb: Option<u64>,
    /// Processes (and threads) alive at once in the episode.
    pub processes: Option<u64>,
    /// The largest file a process may write, in MiB.
    pub file_size_mb: Option<u64>,
    pub open_files: Option<u64>,
}

impl Default for ProcessLimits {
    fn default() -> Self {
        ProcessLimits {
            cpu_s: Some(120),
            memory_mb: Some(4096),
            processes: Some(256),
            file_size_mb: Some(1024),
            open_files: Some(1024),
        }
    }
}

/// Whether the sandbox is on, and who turned it off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SandboxMode {
    #[default]
    On,
    /// Turned off by the suite (`sandbox: off`) or the command line (`--sandbox off`).
    Off(&'static str),
}

/// What the kernel offers, found once.
#[derive(Debug, Clone)]
struct Support {
    /// The Landlock ABI, 0 without Landlock.
    landlock_abi: i32,
    /// Whether seccomp filters can be installed for this architecture.
    seccomp: bool,
    root: bool,
}

fn support() -> &'static Support {
    static SUPPORT: OnceLock<Support> = OnceLock::new();
    SUPPORT.get_or_init(|| {
        // SAFETY: asking for the ABI version takes no pointer (NULL, 0) and changes nothing.
        let abi =
            unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0usize, 1u32) as i32 };
        // SAFETY: PR_GET_SECCOMP only reads this thread's mode.
        let seccomp = ARCH.is_some() && unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) } >= 0;
        // SAFETY: geteuid cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        Support { landlock_abi: abi.max(0), seccomp, root }
    })
}

/// A world's sandbox, prepared in the runner and entered by each process the world starts.
pub struct Confinement {
    /// The Landlock ruleset, ready to restrict a process.
    ruleset: Option<OwnedFd>,
    /// The seccomp program that refuses network sockets.
    filter: Option<Box<[libc::sock_filter]>>,
    limits: Vec<(libc::__rlimit_resource_t, libc::rlimit)>,
    /// The episode's pids cgroup, when the processes limit needs one.
    cgroup: Option<Cgroup>,
    /// Empty the capability bounding set (the runner is root).
    drop_capabilities: bool,
    /// What is enforced, as recorded.
    enforced: Value,
}

impl std::fmt::Debug for Confinement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Confinement").field("enforced", &self.enforced).finish_non_exhaustive()
    }
}

impl Confinement {
    /// No sandbox: the processes run as the runner does (with a clean environment).
    pub fn off(by: &str) -> Arc<Self> {
        Arc::new(Confinement {
            ruleset: None,
            filter: None,
            limits: Vec::new(),
            cgroup: None,
            drop_capabilities: false,
            enforced: json!({"enabled": false, "turned_off_by": by}),
        })
    }

    /// Prepares the sandbox of one world: `writable` are its own folders, `readable` what
    /// the world itself needs besides the system's (an interpreter's installation, say).
    /// Fails, naming what is missing, when the kernel cannot enforce a part.
    pub fn prepare(
        spec: &SandboxSpec,
        mode: SandboxMode,
        writable: &[&Path],
        readable: &[PathBuf],
    ) -> Result<Arc<Self>, String> {
        Self::prepare_on(support(), spec, mode, writable, readable)
    }

    fn prepare_on(
        support: &Support,
        spec: &SandboxSpec,
        mode: SandboxMode,
        writable: &[&Path],
        readable: &[PathBuf],
    ) -> Result<Arc<Self>, String> {
        if let SandboxMode::Off(by) = mode {
            return Ok(Self::off(by));
        }
        let off_hint = "; to run without the sandbox, say `sandbox: off` in the suite or pass `--sandbox off`";
        if support.landlock_abi < 1 {
            return Err(format!(
                "the sandbox cannot confine files: this kernel does not enforce Landlock (Linux 5.13 or later, with \
                 `landlock` in the boot's lsm= list){off_hint}"
            ));
        }
        if !spec.network && !support.seccomp {
            return Err(format!(
                "the sandbox cannot block the network: seccomp filters are not available on this system or \
                 architecture; say `network: true` in the environment's sandbox to allow it{off_hint}"
            ));
        }
        let abi = landlock::ABI::from(support.landlock_abi);
        let hidden: Vec<PathBuf> = match &spec.hide {
            Some(paths) => paths.clone(),
            None => HIDDEN_BY_DEFAULT.iter().map(PathBuf::from).collect(),
        };
        let mut read: Vec<PathBuf> = Vec::new();
        for root in SYSTEM_READ.iter().map(Path::new).chain(spec.read_paths.iter().map(PathBuf::as_path)) {
            expand_without(root, &hidden, &mut read);
        }
        read.extend(readable.iter().cloned());
        let mut writable = writable.to_vec();
        writable.extend(spec.write_paths.iter().map(PathBuf::as_path));
        let ruleset = ruleset(abi, spec.network, &writable, &read).map_err(|e| format!("the sandbox failed: {e}"))?;

        let mut limits = vec![(libc::RLIMIT_CORE, rlimit(0, 0))];
        let l = &spec.limits;
        if let Some(s) = l.cpu_s {
            // The soft limit sends SIGXCPU, the hard one a second later SIGKILL.
            limits.push((libc::RLIMIT_CPU, rlimit(s, s + 1)));
        }
        if let Some(mb) = l.memory_mb {
            limits.push((libc::RLIMIT_AS, rlimit(mb << 20, mb << 20)));
        }
        if let Some(mb) = l.file_size_mb {
            limits.push((libc::RLIMIT_FSIZE, rlimit(mb << 20, mb << 20)));
        }
        if let Some(n) = l.open_files {
            limits.push((libc::RLIMIT_NOFILE, rlimit(n, n)));
        }
        let mut cgroup = None;
        let processes = match l.processes {
            None => "unlimited".to_owned(),
            // The kernel does not hold root to RLIMIT_NPROC: a pids cgroup does it.
            Some(n) if support.root => {
                cgroup = Some(Cgroup::create(n).map_err(|e| {
                    format!(
                        "the sandbox cannot limit processes: the runner runs as root, whom the kernel exempts from \
                         RLIMIT_NPROC, and no pids cgroup could be made ({e}); set `limits.processes: null` in the \
                         environment's sandbox to run without that limit{off_hint}"
                    )
                })?);
                format!("{n} (pids cgroup)")
            }
            Some(n) => {
                // RLIMIT_NPROC counts every process of the user, not only the episode's.
                let running = processes_of_user();
                limits.push((libc::RLIMIT_NPROC, rlimit(n + running, n + running)));
                format!("{n} (RLIMIT_NPROC, over the {running} the user already runs)")
            }
        };
        let limits: Vec<_> = limits.into_iter().map(|(resource, l)| (resource, within_own(resource, l))).collect();
        let filter = (!spec.network).then(network_filter);
        // What each limit is once lowered to the runner's own, in the unit of the spec.
        let effective = |resource, unit: u64| {
            limits.iter().find(|(r, _)| *r == resource).map(|(_, l)| {
                #[allow(clippy::unnecessary_cast)]
                let soft = l.rlim_cur as u64;
                soft / unit
            })
        };
        let scoped = support.landlock_abi >= 6;
        let enforced = json!({
            "enabled": true,
            "filesystem": format!("landlock ABI {}", support.landlock_abi),
            "network": if spec.network {
                "allowed".to_owned()
            } else if support.landlock_abi >= 4 {
                "blocked (seccomp, and landlock for TCP)".to_owned()
            } else {
                "blocked (seccomp)".to_owned()
            },
            "signals": if scoped { "scoped to the sandbox" } else { "not scoped (landlock ABI < 6)" },
            "capabilities": if support.root { "none (bounding set emptied)" } else { "none (not root)" },
            "limits": {
                "cpu_s": effective(libc::RLIMIT_CPU, 1),
                "memory_mb": effective(libc::RLIMIT_AS, 1 << 20),
                "processes": processes,
                "file_size_mb": effective(libc::RLIMIT_FSIZE, 1 << 20),
                "open_files": effective(libc::RLIMIT_NOFILE, 1),
            },
        });
        Ok(Arc::new(Confinement {
            ruleset: Some(ruleset),
            filter,
            limits,
            cgroup,
            drop_capabilities: support.root,
            enforced,
        }))
    }

    /// What is enforced, for `run.json` and the first observation.
    pub fn enforced(&self) -> &Value {
        &self.enforced
    }

    pub fn is_on(&self) -> bool {
        self.ruleset.is_some()
    }

    /// Kills every process left in the episode's cgroup (none should be: each command's
    /// keeper kills its tree), so that nothing outlives the world.
    pub fn kill_all(&self) {
        if let Some(cgroup) = &self.cgroup {
            cgroup.kill_all();
        }
    }

    /// Enters the sandbox: to be called in a freshly forked child, just before `exec`.
    ///
    /// # Safety
    /// Only in a child of `fork` that will `exec` or exit next: it changes the process for
    /// good. It makes only async-signal-safe system calls and allocates nothing.
    pub unsafe fn enter(&self) -> io::Result<()> {
        fn check(result: libc::c_long) -> io::Result<()> {
            if result < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
        }
        // SAFETY: system calls on this process alone, with values prepared by the parent.
        unsafe {
            if let Some(cgroup) = &self.cgroup {
                // "0" moves the writing process.
                check(libc::write(cgroup.procs.as_raw_fd(), b"0".as_ptr().cast(), 1) as libc::c_long)?;
            }
            for (resource, limit) in &self.limits {
                check(libc::setrlimit(*resource, limit) as libc::c_long)?;
            }
            if self.drop_capabilities {
                // Caps past the kernel's last one give EINVAL: that is the end of the set.
                for cap in 0..64 {
                    if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                        break;
                    }
                }
                libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
            }
            if let Some(ruleset) = &self.ruleset {
                check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) as libc::c_long)?;
                check(libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32))?;
            }
            if let Some(filter) = &self.filter {
                let program = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr().cast_mut() };
                check(libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &program as *const _, 0, 0)
                    as libc::c_long)?;
            }
        }
        Ok(())
    }
}

/// A summary of what the sandbox would enforce for `spec` on this machine, without
/// making anything: for `run.json`, and to refuse a run at its start rather than per
/// episode. Errs as [`Confinement::prepare`] would.
pub fn check(spec: &SandboxSpec, mode: SandboxMode) -> Result<Value, String> {
    let dir = std::env::temp_dir();
    Confinement::prepare(spec, mode, &[dir.as_path()], &[]).map(|c| c.enforced.clone())
}

fn rlimit(soft: u64, hard: u64) -> libc::rlimit {
    libc::rlimit { rlim_cur: soft as libc::rlim_t, rlim_max: hard as libc::rlim_t }
}

/// `wanted`, lowered to what the runner itself may give: a hard limit can only be raised
/// with a capability the runner may not have (and should not use on a command's behalf).
/// The open files limit is the one the runner started with, before it raised its own.
fn within_own(resource: libc::__rlimit_resource_t, wanted: libc::rlimit) -> libc::rlimit {
    let mut own = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: getrlimit only writes the struct given.
    let known = unsafe { libc::getrlimit(resource, &mut own) } == 0;
    if resource == libc::RLIMIT_NOFILE
        && let Some(start) = super::resources::starting_open_files_limit()
    {
        own = libc::rlimit { rlim_cur: start.rlim_cur, rlim_max: start.rlim_cur };
    }
    if !known {
        return wanted;
    }
    let hard = wanted.rlim_max.min(own.rlim_max);
    libc::rlimit { rlim_cur: wanted.rlim_cur.min(hard), rlim_max: hard }
}

/// Adds `root` to `out`, or, when a hidden path lies beneath it, every entry of it but the
/// way to that path (Landlock grants whole trees: a hole is made by granting around it).
fn expand_without(root: &Path, hidden: &[PathBuf], out: &mut Vec<PathBuf>) {
    if hidden.iter().any(|h| h == root) || std::fs::symlink_metadata(root).is_err() {
        return;
    }
    if !hidden.iter().any(|h| h.starts_with(root)) {
        out.push(root.to_owned());
        return;
    }
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        expand_without(&entry.path(), hidden, out);
    }
}

fn ruleset(abi: landlock::ABI, network: bool, writable: &[&Path], readable: &[PathBuf]) -> Result<OwnedFd, String> {
    use landlock::{Access, AccessFs, AccessNet, Ruleset, RulesetAttr, RulesetCreatedAttr, Scope, path_beneath_rules};
    let made = (|| -> Result<_, landlock::RulesetError> {
        let mut ruleset = Ruleset::default().handle_access(AccessFs::from_all(abi))?;
        if !network {
            // No rule follows: every TCP bind and connect is refused (ABI 4 and later).
            ruleset = ruleset.handle_access(AccessNet::from_all(abi))?;
        }
        let created = ruleset
            .scope(Scope::from_all(abi))?
            .create()?
            .add_rules(path_beneath_rules(writable, AccessFs::from_all(abi)))?
            .add_rules(path_beneath_rules(DEVICES, AccessFs::from_read(abi) | AccessFs::from_write(abi)))?
            .add_rules(path_beneath_rules(readable, AccessFs::from_read(abi)))?;
        Ok(created)
    })();
    let fd: Option<OwnedFd> = made.map_err(|e| e.to_string())?.into();
    fd.ok_or_else(|| "the kernel made no Landlock ruleset".to_owned())
}

/// How many processes the current user runs (for RLIMIT_NPROC, which counts them all).
fn processes_of_user() -> u64 {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0 };
    entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter(|e| {
            use std::os::unix::fs::MetadataExt;
            e.metadata().is_ok_and(|m| m.uid() == uid)
        })
        .count() as u64
}

/// The architecture seccomp programs are checked against.
#[cfg(target_arch = "x86_64")]
const ARCH: Option<u32> = Some(0xc000_003e);
#[cfg(target_arch = "aarch64")]
const ARCH: Option<u32> = Some(0xc000_00b7);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const ARCH: Option<u32> = None;

/// A seccomp program: `socket(AF_INET|AF_INET6, …)` fails with EACCES, `io_uring_setup`
/// with EPERM, system calls of another ABI (x32, i386) with ENOSYS; all else is allowed.
fn network_filter() -> Box<[libc::sock_filter]> {
    const LD_W_ABS: u16 = 0x20;
    const JEQ: u16 = 0x15;
    const JGE: u16 = 0x35;
    const RET: u16 = 0x06;
    const ALLOW: u32 = 0x7fff_0000;
    const ERRNO: u32 = 0x0005_0000;
    const X32: u32 = 0x4000_0000;
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    let arch = ARCH.unwrap_or(0);
    Box::new([
        op(LD_W_ABS, 0, 0, 4), // arch
        op(JEQ, 1, 0, arch),
        op(RET, 0, 0, ERRNO | libc::ENOSYS as u32),
        op(LD_W_ABS, 0, 0, 0), // nr
        op(JGE, 0, 1, X32),
        op(RET, 0, 0, ERRNO | libc::ENOSYS as u32),
        op(JEQ, 0, 1, libc::SYS_io_uring_setup as u32),
        op(RET, 0, 0, ERRNO | libc::EPERM as u32),
        op(JEQ, 1, 0, libc::SYS_socket as u32),
        op(RET, 0, 0, ALLOW),
        op(LD_W_ABS, 0, 0, 16), // args[0], low half
        op(JEQ, 2, 0, libc::AF_INET as u32),
        op(JEQ, 1, 0, libc::AF_INET6 as u32),
        op(RET, 0, 0, ALLOW),
        op(RET, 0, 0, ERRNO | libc::EACCES as u32),
    ])
}

/// A pids cgroup of one world (cgroup v1 `pids` or v2 with the pids controller).
struct Cgroup {
    dir: PathBuf,
    /// `cgroup.procs`, open for the children to move themselves in.
    procs: OwnedFd,
}

impl Cgroup {
    fn create(max: u64) -> io::Result<Cgroup> {
        let parent = run_cgroup()?;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = parent.join(format!("world-{n}"));
        std::fs::create_dir(&dir)?;
        let made = (|| {
            std::fs::write(dir.join("pids.max"), max.to_string())?;
            let procs = std::fs::OpenOptions::new().write(true).open(dir.join("cgroup.procs"))?;
            Ok(Cgroup { dir: dir.clone(), procs: procs.into() })
        })();
        if made.is_err() {
            let _ = std::fs::remove_dir(&dir);
        }
        made
    }

    fn kill_all(&self) {
        for _ in 0..100 {
            let Ok(pids) = std::fs::read_to_string(self.dir.join("cgroup.procs")) else { return };
            let pids: Vec<libc::pid_t> = pids.lines().filter_map(|l| l.trim().parse().ok()).collect();
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                // SAFETY: kill only sends a signal, to a process of this world's cgroup.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        self.kill_all();
        // Dead processes leave the cgroup once reaped; the keeper reaps them at once.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}

/// This run's cgroup under which each world makes its own, `runner-<pid>`; made once.
/// Those of runners no longer alive are removed on the way.
fn run_cgroup() -> io::Result<PathBuf> {
    static RUN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    RUN.get_or_init(|| {
        let base = pids_cgroup_base().map_err(|e| e.to_string())?;
        if let Ok(entries) = std::fs::read_dir(&base) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("runner-")) else { continue };
                if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
                    if let Ok(worlds) = std::fs::read_dir(entry.path()) {
                        for world in worlds.flatten().filter(|w| w.path().is_dir()) {
                            let _ = std::fs::remove_dir(world.path());
                        }
                    }
                    let _ = std::fs::remove_dir(entry.path());
                }
            }
        }
        let dir = base.join(format!("runner-{}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("{}: {e}", dir.display())),
        }
        if !dir.join("pids.max").exists() {
            let _ = std::fs::remove_dir(&dir);
            return Err(format!("{} has no pids controller", dir.display()));
        }
        Ok(dir)
    })
    .clone()
    .map_err(io::Error::other)
}

/// The folder of the runner's own pids cgroup: cgroup v1's `pids` hierarchy, or v2's.
fn pids_cgroup_base() -> io::Result<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup")?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")?;
    // mountinfo: `id parent major:minor root mount-point options - fstype source super-options`
    let mount_of = |want_v2: bool| {
        mounts.lines().find_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let mount_point = before.split_whitespace().nth(4)?;
            let mut after = after.split_whitespace();
            let fstype = after.next()?;
            let options = after.nth(1).unwrap_or_default();
            let fits = if want_v2 {
                fstype == "cgroup2"
            } else {
                fstype == "cgroup" && options.split(',').any(|o| o == "pids")
            };
            fits.then(|| PathBuf::from(mount_point))
        })
    };
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
        let relative = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "pids")
            && let Some(mount) = mount_of(false)
        {
            return Ok(mount.join(relative));
        }
        if controllers.is_empty()
            && path.starts_with('/')
            && let Some(mount) = mount_of(true)
        {
            let base = mount.join(relative);
            let offered = std::fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
            if offered.split_whitespace().any(|c| c == "pids") {
                // Children get the controller only if this cgroup hands it down.
                let _ = std::fs::write(base.join("cgroup.subtree_control"), "+pids");
                return Ok(base);
            }
        }
    }
    Err(io::Error::other("no pids cgroup hierarchy is mounted and writable"))
}

/// `PATH`'s entry for `program`, resolved through links: where an interpreter lives.
pub fn find_program(program: &str, path: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return std::fs::canonicalize(program).ok();
    }
    path.split(':').map(|dir| Path::new(dir).join(program)).find_map(|p| {
        use std::os::unix::fs::PermissionsExt;
        let real = std::fs::canonicalize(&p).ok()?;
        let meta = std::fs::metadata(&real).ok()?;
        (meta.is_file() && meta.permissions().mode() & 0o111 != 0).then_some(real)
    })
}

/// A C string of `text`, refused when it holds a NUL byte.
pub fn c_string(text: &str) -> io::Result<CString> {
    CString::new(text).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in a path or argument"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hidden_path_is_left_out_and_its_siblings_kept() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["a/secret", "a/open", "b"] {
            std::fs::create_dir_all(dir.path().join(name)).unwrap();
        }
        let mut out = Vec::new();
        expand_without(dir.path(), &[dir.path().join("a/secret")], &mut out);
        out.sort();
        assert_eq!(out, [dir.path().join("a/open"), dir.path().join("b")]);
        let mut all = Vec::new();
        expand_without(dir.path(), &[PathBuf::from("/elsewhere")], &mut all);
        assert_eq!(all, [dir.path().to_owned()]);
    }

    fn kernel(landlock_abi: i32, seccomp: bool) -> Support {
        Support { landlock_abi, seccomp, root: false }
    }

    #[test]
    fn a_kernel_without_landlock_or_seccomp_is_refused_naming_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let spec = SandboxSpec::default();
        let prepare = |support: &Support, spec: &SandboxSpec, mode| {
            Confinement::prepare_on(support, spec, mode, &[dir.path()], &[]).map(|c| c.enforced.clone())
        };
        let err = prepare(&kernel(0, true), &spec, SandboxMode::On).unwrap_err();
        assert!(err.contains("does not enforce Landlock") && err.contains("`sandbox: off`"), "{err}");
        let err = prepare(&kernel(7, false), &spec, SandboxMode::On).unwrap_err();
        assert!(err.contains("cannot block the network") && err.contains("network: true"), "{err}");
        // What cannot be enforced is not refused once it is not asked for.
        let open = SandboxSpec { network: true, ..SandboxSpec::default() };
        let enforced = prepare(&kernel(support().landlock_abi.max(1), false), &open, SandboxMode::On).unwrap();
        assert_eq!(enforced["network"], "allowed");
        let off = prepare(&kernel(0, false), &spec, SandboxMode::Off("the suite")).unwrap();
        assert_eq!(off, json!({"enabled": false, "turned_off_by": "the suite"}));
    }

    #[test]
    fn limits_are_lowered_to_the_runners_own_and_recorded_so() {
        let mut own = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit only writes the struct given.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut own) }, 0);
        let wanted = rlimit(u64::MAX - 1, u64::MAX - 1);
        let got = within_own(libc::RLIMIT_FSIZE, wanted);
        assert!(got.rlim_max <= own.rlim_max && got.rlim_cur <= got.rlim_max, "{} {}", got.rlim_cur, got.rlim_max);
        let small = within_own(libc::RLIMIT_FSIZE, rlimit(10, 20));
        assert_eq!((small.rlim_cur, small.rlim_max), (10, 20.min(own.rlim_max)));
    }

    #[test]
    fn the_network_filter_ends_every_path_with_a_return() {
        let filter = network_filter();
        assert_eq!(filter.last().map(|i| i.code), Some(0x06));
        // Every jump lands inside the program.
        for (i, op) in filter.iter().enumerate() {
            if op.code & 0x07 == 0x05 {
                assert!(i + 1 + (op.jt.max(op.jf) as usize) < filter.len(), "jump at {i} leaves the program");
            }
        }
    }
}
