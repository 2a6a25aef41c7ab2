//! The sandbox every process a world starts runs in: commands of `shell`, `check:` scorers,
//! interpreters. It is planned once per run ([`ConfinementPlan`]), made for a world in the runner (at
//! its first process, for a `shell` world), and entered by each new process just before its
//! `exec` with a handful of system calls that allocate nothing:
//!
//! - **files** (Landlock): read-write beneath the episode's own folders, read-only on the
//!   system's (`/usr`, `/bin`, `/lib*`, `/etc` less what is hidden) and on the paths a world
//!   or a suite adds; nothing else — `$HOME`, the results, the suite's folder and other
//!   episodes' folders cannot be opened at all. Landlock also keeps the process from tracing
//!   or, from ABI 6, signalling anything outside its sandbox (the runner, the keeper).
//! - **network** (seccomp): no IPv4 or IPv6 socket, TCP or UDP, localhost included, unless
//!   the environment says `network: true`; no `io_uring`, which could open one unseen.
//!   From Landlock ABI 4, TCP bind and connect are refused by Landlock as well. A program
//!   agent may make plain TCP sockets and connect to the gateway's port alone.
//! - **resources** (rlimits, and a pids cgroup when the runner is root, whom the kernel
//!   exempts from the processes limit): CPU seconds, address space, processes, file size,
//!   open files; no core dumps.
//! - **privileges**: `no_new_privs`; when the runner is root, each process becomes a user
//!   of its own that owns nothing on the host, with no capability but reading what Landlock
//!   lets it read (see `unprivileged.rs`): it can neither raise its limits, override file
//!   permissions, nor change the mode, owner, times or attributes of a file outside.
//!
//! What the kernel cannot enforce is refused when the world is set up, naming what is
//! missing, unless the suite or the command line turns the sandbox off; what was enforced
//! is recorded in `run.json` and in each episode's first observation.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::root::{IdMap, Root};
use super::unprivileged::Handover;

/// The system folders a command may read and run from.
const SYSTEM_READ: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/proc"];

/// Devices a command may read and write.
const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"];

/// The oldest Landlock ABI the sandbox runs on: 6, Linux 6.12.
const MIN_LANDLOCK_ABI: i32 = 6;

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

/// The fewest open files a command needs: `sh` keeps the descriptors it saves around a
/// redirection at 10 and above, so `x=$(echo hi | cat)` fails with 11 (measured: dash,
/// python3 and coreutils all run with 12).
pub const MIN_OPEN_FILES: u64 = 12;

/// The least address space, in MiB, in which `sh` loads its libraries (measured: it fails
/// to map libc with 2 and runs with 4).
pub const MIN_MEMORY_MB: u64 = 4;

impl SandboxSpec {
    /// What makes these settings impossible, if anything: the field (under `sandbox.`)
    /// and why. Checked when the environment file is read, so that no episode starts
    /// under a sandbox in which no command could run.
    pub fn problem(&self) -> Option<(String, String)> {
        let l = &self.limits;
        let minimums = [
            ("cpu_s", l.cpu_s, 1, "a process with no CPU seconds is killed before it starts"),
            ("memory_mb", l.memory_mb, MIN_MEMORY_MB, "a shell does not load in less"),
            ("processes", l.processes, 1, "no command could start"),
            ("open_files", l.open_files, MIN_OPEN_FILES, "a shell's pipes and redirections need that many"),
        ];
        for (field, value, min, why) in minimums {
            if let Some(v) = value.filter(|v| *v < min) {
                return Some((
                    format!("limits.{field}"),
                    format!("must be at least {min} ({why}), got {v}; `null` lifts it"),
                ));
            }
        }
        for (i, path) in self.write_paths.iter().enumerate() {
            let system = SYSTEM_READ.iter().map(Path::new).find(|s| s.starts_with(path) || path.starts_with(s));
            if let Some(system) = system.filter(|_| path.is_absolute()) {
                let message = format!(
                    "`{}` would let every command change the host's `{}`; name a folder of its own",
                    path.display(),
                    system.display()
                );
                return Some((format!("write_paths[{i}]"), message));
            }
        }
        for (i, path) in self.read_paths.iter().enumerate() {
            if path.is_absolute() && !path.exists() {
                return Some((format!("read_paths[{i}]"), format!("`{}` does not exist", path.display())));
            }
        }
        None
    }
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
    /// The user a root runner's processes become; `None` when there is none free.
    unprivileged_id: Option<u32>,
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
        let unprivileged_id = if root { super::unprivileged::free_id() } else { None };
        Support { landlock_abi: abi.max(0), seccomp, root, unprivileged_id }
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
    /// The user the processes become, and the folders handed to it (the runner is root).
    unprivileged: Option<Handover>,
    /// For a world in an image's root: the root, the ids it is seen with, and the image's
    /// user its processes become.
    root: Option<InRoot>,
    /// What is enforced, as recorded.
    enforced: Value,
}

/// Where the processes of a world in an image's root live: its namespaces, and the image's
/// user (uid, gid) they run as.
#[derive(Debug)]
struct InRoot {
    root: Arc<Root>,
    ids: Arc<IdMap>,
    user: (u32, u32),
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
            unprivileged: None,
            root: None,
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
        ConfinementPlan::shared(spec, mode, readable)?.confine(writable)
    }

    /// Prepares the sandbox of a program agent whose only network is the model gateway: as
    /// [`Confinement::prepare`] with `network: false`, except that TCP connections to
    /// `gateway_port` are let through — Landlock (ABI 4, Linux 6.7) refuses every other TCP
    /// connect and every bind, and the seccomp filter lets only IPv4 and IPv6 TCP sockets be
    /// made (no MPTCP, SCTP, UDP, raw or Unix sockets) and refuses the ways TCP connects or
    /// listens without `connect` or `bind` (see [`gateway_only_sockets`]). Landlock knows
    /// ports, not addresses.
    pub fn prepare_for_gateway(
        spec: &SandboxSpec,
        mode: SandboxMode,
        writable: &[&Path],
        readable: &[PathBuf],
        gateway_port: u16,
    ) -> Result<Arc<Self>, String> {
        let spec = SandboxSpec { network: false, ..spec.clone() };
        Self::prepare_with(support(), &spec, mode, writable, readable, Some(gateway_port))
    }

    #[cfg(test)]
    fn prepare_on(
        support: &Support,
        spec: &SandboxSpec,
        mode: SandboxMode,
        writable: &[&Path],
        readable: &[PathBuf],
    ) -> Result<Arc<Self>, String> {
        Self::prepare_with(support, spec, mode, writable, readable, None)
    }

    fn prepare_with(
        support: &Support,
        spec: &SandboxSpec,
        mode: SandboxMode,
        writable: &[&Path],
        readable: &[PathBuf],
        gateway_port: Option<u16>,
    ) -> Result<Arc<Self>, String> {
        ConfinementPlan::new(support, spec, mode, readable, gateway_port)?.confine(writable)
    }

    /// Prepares the sandbox of a world in an image's `root`: its processes enter the root's
    /// namespaces and run as the image's `user` (uid, gid of the image, seen through `ids`),
    /// within the root alone (Landlock), with the network `spec` allows (seccomp, Landlock
    /// for TCP), under its limits. The sandbox cannot be off for such a world.
    pub fn prepare_in_root(
        spec: &SandboxSpec,
        root: Arc<Root>,
        ids: Arc<IdMap>,
        user: (u32, u32),
    ) -> Result<Arc<Self>, String> {
        Self::in_root(spec, root, ids, user, None)
    }

    /// The sandbox of a program agent in an image's root: as [`Confinement::prepare_in_root`]
    /// with `network: false`, except TCP connections to `gateway_port`, as
    /// [`Confinement::prepare_for_gateway`] lets through on the host.
    pub fn prepare_in_root_for_gateway(
        spec: &SandboxSpec,
        root: Arc<Root>,
        ids: Arc<IdMap>,
        user: (u32, u32),
        gateway_port: u16,
    ) -> Result<Arc<Self>, String> {
        let spec = SandboxSpec { network: false, ..spec.clone() };
        Self::in_root(&spec, root, ids, user, Some(gateway_port))
    }

    fn in_root(
        spec: &SandboxSpec,
        root: Arc<Root>,
        ids: Arc<IdMap>,
        user: (u32, u32),
        gateway_port: Option<u16>,
    ) -> Result<Arc<Self>, String> {
        let support = support();
        let off_hint = "";
        check_support(support, off_hint)?;
        if ids.host_id(user.0).is_none() || ids.host_id(user.1).is_none() {
            return Err(format!(
                "the image's user {}:{} is beyond the ids an image may use ({})",
                user.0, user.1, ids.range
            ));
        }
        let abi = landlock::ABI::from(support.landlock_abi);
        let ruleset = ruleset(abi, spec.network, &[root.path()], &[])
            .and_then(|r| to_gateway_only(r, abi, gateway_port))
            .map_err(|e| format!("the sandbox failed: {e}"))?;
        let (limits, pids_max, processes) = process_limits(support, &spec.limits);
        let cgroup = pids_max.map(|n| pids_cgroup(n, off_hint)).transpose()?;
        let filter = Some(match gateway_port {
            Some(_) => seccomp_filter_with(SocketRule::StreamOnly),
            None => seccomp_filter(spec.network),
        });
        let mut enforced = enforced(support, spec.network, gateway_port, None, (&limits, processes));
        enforced["filesystem"] = json!(format!(
            "the image's root alone (a mount namespace of its own; landlock ABI {})",
            support.landlock_abi
        ));
        enforced["user"] = json!(format!(
            "the image's {}:{} (host ids {} and up, a user namespace of their own)",
            user.0, user.1, ids.base
        ));
        let root = Some(InRoot { root, ids, user });
        Ok(Arc::new(Confinement { ruleset: Some(ruleset), filter, limits, cgroup, unprivileged: None, root, enforced }))
    }

    /// The root a world's processes run in, when it is an image's.
    pub fn root(&self) -> Option<&Arc<Root>> {
        self.root.as_ref().map(|r| &r.root)
    }

    /// What is enforced, for `run.json` and the first observation.
    pub fn enforced(&self) -> &Value {
        &self.enforced
    }

    /// Kills every process left in the episode's cgroup (none should be: each command's
    /// keeper kills its tree), so that nothing outlives the world.
    pub fn kill_all(&self) {
        if let Some(cgroup) = &self.cgroup {
            cgroup.kill_all();
        }
    }

    /// Hands the world's writable folders to the user its processes become, when the runner
    /// is root (see `unprivileged.rs`): to be called before each process starts, so that
    /// what the runner wrote there since is the process's own.
    pub fn hand_over(&self) {
        if let Some(handover) = &self.unprivileged {
            handover.run();
        }
    }

    /// The descriptors [`Confinement::enter`] uses (the Landlock ruleset, the cgroup's
    /// process list): a process that will enter must keep them open.
    pub(super) fn descriptors(&self) -> [Option<std::os::fd::RawFd>; 5] {
        let root = self.root.as_ref();
        [
            self.ruleset.as_ref().map(|r| r.as_raw_fd()),
            self.cgroup.as_ref().map(|c| c.procs.as_raw_fd()),
            root.map(|r| r.root.mount_ns()),
            root.map(|r| r.root.pid_ns()),
            root.map(|r| r.ids.namespace()),
        ]
    }

    /// In a command's keeper: its children (the command) are made in the root's pid
    /// namespace, when the world has a root.
    ///
    /// # Safety
    /// Only in a command's keeper; system calls only.
    pub(super) unsafe fn enter_pid_namespace(&self) -> io::Result<()> {
        let Some(root) = &self.root else { return Ok(()) };
        // SAFETY: setns of this process's children's pid namespace, by descriptor.
        unsafe { super::raw::call(libc::SYS_setns, &[root.root.pid_ns() as usize, libc::CLONE_NEWPID as usize]) }
            .map(|_| ())
    }

    /// In a command's child, before it enters its working folder: the root's mount
    /// namespace, whose root and paths become the process's, when the world has a root.
    ///
    /// # Safety
    /// Only in a command's child that will `exec` or exit next; system calls only.
    pub unsafe fn enter_root(&self) -> io::Result<()> {
        let Some(root) = &self.root else { return Ok(()) };
        // SAFETY: setns of this process's mount namespace, by descriptor.
        unsafe { super::raw::call(libc::SYS_setns, &[root.root.mount_ns() as usize, libc::CLONE_NEWNS as usize]) }
            .map(|_| ())
    }

    /// Enters the sandbox: to be called in a command's child, just before `exec`.
    ///
    /// # Safety
    /// Only in a child that will `exec` or exit next: it changes the process for good. It
    /// makes only system calls, without the C library, and allocates nothing.
    pub unsafe fn enter(&self) -> io::Result<()> {
        use super::raw::call;
        // SAFETY: system calls on this process alone, with values prepared by the parent,
        // made without the C library (see `raw.rs`).
        unsafe {
            if let Some(cgroup) = &self.cgroup {
                // "0" moves the writing process.
                super::raw::write(cgroup.procs.as_raw_fd(), b"0")?;
            }
            for (resource, limit) in &self.limits {
                call(libc::SYS_prlimit64, &[0, *resource as usize, limit as *const libc::rlimit as usize, 0])?;
            }
            call(libc::SYS_prctl, &[libc::PR_CAP_AMBIENT as usize, libc::PR_CAP_AMBIENT_CLEAR_ALL as usize, 0, 0, 0])?;
            if let Some(handover) = &self.unprivileged {
                super::unprivileged::become_user(handover.id)?;
            }
            if let Some(root) = &self.root {
                // The image's ids, in their own user namespace: its root has no power over
                // anything of the host's.
                call(libc::SYS_setns, &[root.ids.namespace() as usize, libc::CLONE_NEWUSER as usize])?;
                let (uid, gid) = (root.user.0 as usize, root.user.1 as usize);
                call(libc::SYS_setgroups, &[0, 0])?;
                call(libc::SYS_setresgid, &[gid, gid, gid])?;
                call(libc::SYS_setresuid, &[uid, uid, uid])?;
            }
            if let Some(ruleset) = &self.ruleset {
                call(libc::SYS_prctl, &[libc::PR_SET_NO_NEW_PRIVS as usize, 1, 0, 0, 0])?;
                call(libc::SYS_landlock_restrict_self, &[ruleset.as_raw_fd() as usize, 0])?;
            }
            if let Some(filter) = &self.filter {
                let program = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr().cast_mut() };
                call(
                    libc::SYS_prctl,
                    &[
                        libc::PR_SET_SECCOMP as usize,
                        libc::SECCOMP_MODE_FILTER as usize,
                        &program as *const libc::sock_fprog as usize,
                        0,
                        0,
                    ],
                )?;
            }
        }
        Ok(())
    }
}

/// What the sandboxes of one definition's worlds share, worked out once
/// ([`ConfinementPlan::shared`]): the kernel's support checked, the paths their processes read (a
/// hidden path's siblings listed one by one), the seccomp program, the limits, the user
/// they become and what is enforced. A world's own sandbox over its folders is made from it
/// by [`ConfinementPlan::confine`], which a world calls when it starts its first process.
pub struct ConfinementPlan {
    /// `Some(by)` when the sandbox is off: [`ConfinementPlan::confine`] makes none.
    off: Option<&'static str>,
    abi: landlock::ABI,
    network: bool,
    gateway_port: Option<u16>,
    /// What processes may read: the system's folders less what is hidden, the spec's
    /// `read_paths` and what the world needs.
    read: Vec<PathBuf>,
    /// The spec's `write_paths`, writable besides each world's own folders.
    write_paths: Vec<PathBuf>,
    filter: Box<[libc::sock_filter]>,
    limits: Vec<(libc::__rlimit_resource_t, libc::rlimit)>,
    /// The most processes of a world, held by a pids cgroup of its own (a root runner).
    pids_max: Option<u64>,
    /// The user a root runner's processes become.
    unprivileged_id: Option<u32>,
    enforced: Value,
}

/// How many plans [`ConfinementPlan::shared`] keeps: one per definition and sandbox mode of a run.
const PLANS_KEPT: usize = 16;

impl ConfinementPlan {
    /// The plan of `spec` under `mode` with `readable` added, made at its first use and kept
    /// for the process's lifetime: every world of a run shares it. A plan that fails is not
    /// kept (each asks again and is told why).
    pub fn shared(spec: &SandboxSpec, mode: SandboxMode, readable: &[PathBuf]) -> Result<Arc<ConfinementPlan>, String> {
        type Kept = Vec<(SandboxSpec, SandboxMode, Vec<PathBuf>, Arc<ConfinementPlan>)>;
        static PLANS: std::sync::Mutex<Kept> = std::sync::Mutex::new(Vec::new());
        let found = |plans: &Kept| {
            plans.iter().find(|(s, m, r, _)| s == spec && *m == mode && r == readable).map(|kept| kept.3.clone())
        };
        if let Some(plan) = found(&PLANS.lock().unwrap_or_else(|e| e.into_inner())) {
            return Ok(plan);
        }
        // Made outside the lock: it reads the file system. Two threads may both make one.
        let plan = Arc::new(ConfinementPlan::new(support(), spec, mode, readable, None)?);
        let mut plans = PLANS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(kept) = found(&plans) {
            return Ok(kept);
        }
        if plans.len() == PLANS_KEPT {
            plans.remove(0);
        }
        plans.push((spec.clone(), mode, readable.to_vec(), plan.clone()));
        Ok(plan)
    }

    fn new(
        support: &Support,
        spec: &SandboxSpec,
        mode: SandboxMode,
        readable: &[PathBuf],
        gateway_port: Option<u16>,
    ) -> Result<ConfinementPlan, String> {
        let abi = landlock::ABI::from(support.landlock_abi);
        if let SandboxMode::Off(by) = mode {
            return Ok(ConfinementPlan {
                off: Some(by),
                abi,
                network: true,
                gateway_port,
                read: Vec::new(),
                write_paths: Vec::new(),
                filter: Box::default(),
                limits: Vec::new(),
                pids_max: None,
                unprivileged_id: None,
                enforced: Confinement::off(by).enforced.clone(),
            });
        }
        let off_hint = "; to run without the sandbox, say `sandbox: off` in the suite or pass `--sandbox off`";
        check_support(support, off_hint)?;
        let hidden: Vec<PathBuf> = match &spec.hide {
            Some(paths) => resolved(paths),
            None => resolved(&HIDDEN_BY_DEFAULT.iter().map(PathBuf::from).collect::<Vec<_>>()),
        };
        let mut read: Vec<PathBuf> = Vec::new();
        for root in SYSTEM_READ.iter().map(Path::new).chain(spec.read_paths.iter().map(PathBuf::as_path)) {
            expand_without(root, &hidden, &mut read);
        }
        read.extend(readable.iter().cloned());
        let unprivileged_id = unprivileged_id(support, off_hint)?;
        let (limits, pids_max, processes) = process_limits(support, &spec.limits);
        let filter = match gateway_port {
            Some(_) => seccomp_filter_with(SocketRule::StreamOnly),
            None => seccomp_filter(spec.network),
        };
        let enforced = enforced(support, spec.network, gateway_port, unprivileged_id, (&limits, processes));
        Ok(ConfinementPlan {
            off: None,
            abi,
            network: spec.network,
            gateway_port,
            read,
            write_paths: spec.write_paths.clone(),
            filter,
            limits,
            pids_max,
            unprivileged_id,
            enforced,
        })
    }

    /// What the sandboxes made from this plan enforce, as `run.json` and the first
    /// observation record it.
    pub fn enforced(&self) -> &Value {
        &self.enforced
    }

    /// The sandbox of one world, over `writable`, its own folders (which must exist): its
    /// Landlock ruleset, its pids cgroup, the hand-over of its folders.
    pub fn confine(&self, writable: &[&Path]) -> Result<Arc<Confinement>, String> {
        if let Some(by) = self.off {
            return Ok(Confinement::off(by));
        }
        let off_hint = "; to run without the sandbox, say `sandbox: off` in the suite or pass `--sandbox off`";
        let mut writable = writable.to_vec();
        writable.extend(self.write_paths.iter().map(PathBuf::as_path));
        let ruleset = ruleset(self.abi, self.network, &writable, &self.read)
            .and_then(|r| to_gateway_only(r, self.abi, self.gateway_port))
            .map_err(|e| format!("the sandbox failed: {e}"))?;
        let cgroup = self.pids_max.map(|n| pids_cgroup(n, off_hint)).transpose()?;
        let unprivileged =
            self.unprivileged_id.map(|id| Handover::new(id, writable.iter().map(|p| p.to_path_buf()).collect()));
        Ok(Arc::new(Confinement {
            ruleset: Some(ruleset),
            filter: Some(self.filter.clone()),
            limits: self.limits.clone(),
            cgroup,
            unprivileged,
            root: None,
            enforced: self.enforced.clone(),
        }))
    }
}

/// When the runner is root, the user its processes become; `None` otherwise.
fn unprivileged_id(support: &Support, off_hint: &str) -> Result<Option<u32>, String> {
    if !support.root {
        return Ok(None);
    }
    let Some(id) = support.unprivileged_id else {
        return Err(format!(
            "the sandbox cannot take root's power from commands: the runner runs as root and none of the user ids \
             65000 to 65500 is free of an account and mapped in this user namespace{off_hint}"
        ));
    };
    Ok(Some(id))
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
/// Paths are compared once links are resolved (Landlock grants a link's target, and
/// `/lib` is often a link to `/usr/lib`); `hidden` must be resolved already.
fn expand_without(root: &Path, hidden: &[PathBuf], out: &mut Vec<PathBuf>) {
    let Ok(real) = root.canonicalize() else { return };
    if hidden.iter().any(|h| real.starts_with(h)) {
        return;
    }
    if !hidden.iter().any(|h| h.starts_with(&real)) {
        out.push(real);
        return;
    }
    let Ok(entries) = std::fs::read_dir(&real) else { return };
    for entry in entries.flatten() {
        expand_without(&entry.path(), hidden, out);
    }
}

/// Refuses a sandbox this kernel cannot enforce, saying what it lacks.
fn check_support(support: &Support, off_hint: &str) -> Result<(), String> {
    if support.landlock_abi < 1 {
        return Err(format!(
            "the sandbox cannot confine files: this kernel does not enforce Landlock (Linux 5.13 or later, with \
             `landlock` in the boot's lsm= list){off_hint}"
        ));
    }
    // ABI 3 controls truncate(2), ABI 6 keeps a command from signalling the runner.
    if support.landlock_abi < MIN_LANDLOCK_ABI {
        return Err(format!(
            "the sandbox needs Landlock ABI {MIN_LANDLOCK_ABI} (Linux 6.12) to keep commands from truncating \
             files outside and from signalling the runner; this kernel has ABI {}{off_hint}",
            support.landlock_abi
        ));
    }
    if !support.seccomp {
        return Err(format!(
            "the sandbox cannot filter system calls (the network, other processes' limits): seccomp filters \
             are not available on this system or architecture{off_hint}"
        ));
    }
    Ok(())
}

/// The resource limits of a world's processes, each lowered to the runner's own, the number
/// a pids cgroup of each world holds a root runner's to, and that number as `enforced` says
/// it.
#[allow(clippy::type_complexity)]
fn process_limits(
    support: &Support,
    l: &ProcessLimits,
) -> (Vec<(libc::__rlimit_resource_t, libc::rlimit)>, Option<u64>, String) {
    let mut limits = vec![(libc::RLIMIT_CORE, rlimit(0, 0))];
    if let Some(s) = l.cpu_s {
        // The soft limit sends SIGXCPU, the hard one a second later SIGKILL.
        limits.push((libc::RLIMIT_CPU, rlimit(s, s.saturating_add(1))));
    }
    if let Some(mb) = l.memory_mb {
        let bytes = mb.saturating_mul(1 << 20);
        limits.push((libc::RLIMIT_AS, rlimit(bytes, bytes)));
    }
    if let Some(mb) = l.file_size_mb {
        let bytes = mb.saturating_mul(1 << 20);
        limits.push((libc::RLIMIT_FSIZE, rlimit(bytes, bytes)));
    }
    if let Some(n) = l.open_files {
        limits.push((libc::RLIMIT_NOFILE, rlimit(n, n)));
    }
    let mut pids_max = None;
    let processes = match l.processes {
        None => "unlimited".to_owned(),
        // The kernel does not hold root to RLIMIT_NPROC: a pids cgroup does it.
        Some(n) if support.root => {
            pids_max = Some(n);
            format!("{n} (pids cgroup)")
        }
        Some(n) => {
            // RLIMIT_NPROC counts every process of the user, not only the episode's.
            let running = processes_of_user();
            let total = n.saturating_add(running);
            limits.push((libc::RLIMIT_NPROC, rlimit(total, total)));
            format!("{n} (RLIMIT_NPROC, over the {running} threads the user already runs, shared by its episodes)")
        }
    };
    let limits = limits.into_iter().map(|(resource, l)| (resource, within_own(resource, l))).collect();
    (limits, pids_max, processes)
}

/// A world's own pids cgroup, holding its processes to `max`.
fn pids_cgroup(max: u64, off_hint: &str) -> Result<Cgroup, String> {
    Cgroup::create(max).map_err(|e| {
        format!(
            "the sandbox cannot limit processes: the runner runs as root, whom the kernel exempts from \
             RLIMIT_NPROC, and no pids cgroup could be made ({e}); set `limits.processes: null` in the \
             environment's sandbox to run without that limit{off_hint}"
        )
    })
}

/// What a sandbox enforces, as `run.json` and the first observation say it.
fn enforced(
    support: &Support,
    network: bool,
    gateway_port: Option<u16>,
    unprivileged_id: Option<u32>,
    (limits, processes): (&[(libc::__rlimit_resource_t, libc::rlimit)], String),
) -> Value {
    // What each limit is once lowered to the runner's own, in the unit of the spec.
    let effective = |resource, unit: u64| {
        limits.iter().find(|(r, _)| *r == resource).map(|(_, l)| {
            #[allow(clippy::unnecessary_cast)]
            let soft = l.rlim_cur as u64;
            soft / unit
        })
    };
    let scoped = support.landlock_abi >= 6;
    json!({
        "enabled": true,
        "filesystem": format!("landlock ABI {}", support.landlock_abi),
        "network": match gateway_port {
            Some(port) => format!(
                "the model gateway only (landlock: TCP connect to port {port} alone, no bind; seccomp: IPv4/IPv6 \
                 TCP sockets only, no listen, no TCP Fast Open)"
            ),
            None if network => "allowed".to_owned(),
            None => "blocked (seccomp: no socket of any family, socketpair only; landlock for TCP)".to_owned(),
        },
        "signals": if scoped { "scoped to the sandbox" } else { "not scoped" },
        "other_processes": "no tracing, signals, limits or priorities of processes outside",
        "capabilities": if support.root {
            "CAP_DAC_READ_SEARCH alone (to read what Landlock allows), no_new_privs: no program gains more"
        } else {
            "none (not root)"
        },
        "user": match unprivileged_id {
            Some(id) => format!("uid and gid {id}, no account, no other groups (the runner is root)"),
            None => "the runner's".to_owned(),
        },
        "limits": {
            "cpu_s": effective(libc::RLIMIT_CPU, 1),
            "memory_mb": effective(libc::RLIMIT_AS, 1 << 20),
            "processes": processes,
            "file_size_mb": effective(libc::RLIMIT_FSIZE, 1 << 20),
            "open_files": effective(libc::RLIMIT_NOFILE, 1),
        },
    })
}

/// `paths`, links resolved where they exist.
fn resolved(paths: &[PathBuf]) -> Vec<PathBuf> {
    paths.iter().map(|p| p.canonicalize().unwrap_or_else(|_| p.clone())).collect()
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

/// Lets a ruleset that refuses all TCP (`network: false`) connect to `port`, when given: a
/// Landlock `NetPort` rule (ABI 4) added to the ruleset before any process enters it.
fn to_gateway_only(ruleset: OwnedFd, abi: landlock::ABI, port: Option<u16>) -> Result<OwnedFd, String> {
    let Some(port) = port else { return Ok(ruleset) };
    if (abi as i32) < 4 {
        return Err("a program agent's network is limited to the model gateway by Landlock ABI 4 (Linux 6.7)".into());
    }
    /// `struct landlock_net_port_attr`.
    #[repr(C)]
    struct NetPortAttr {
        allowed_access: u64,
        port: u64,
    }
    const LANDLOCK_RULE_NET_PORT: libc::c_int = 2;
    const LANDLOCK_ACCESS_NET_CONNECT_TCP: u64 = 1 << 1;
    let attr = NetPortAttr { allowed_access: LANDLOCK_ACCESS_NET_CONNECT_TCP, port: u64::from(port) };
    // SAFETY: adds one rule to a ruleset this process made, from an attribute that lives
    // through the call.
    let added = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            LANDLOCK_RULE_NET_PORT,
            &attr as *const NetPortAttr,
            0u32,
        )
    };
    if added < 0 {
        return Err(format!("the gateway's port could not be allowed: {}", io::Error::last_os_error()));
    }
    Ok(ruleset)
}

/// How many threads the current user runs (RLIMIT_NPROC counts them all, of every process).
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
        .map(|e| {
            let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
            status
                .lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|n| n.trim().parse::<u64>().ok())
                .unwrap_or(1)
        })
        .sum()
}

/// The architecture seccomp programs are checked against.
#[cfg(target_arch = "x86_64")]
const ARCH: Option<u32> = Some(0xc000_003e);
#[cfg(target_arch = "aarch64")]
const ARCH: Option<u32> = Some(0xc000_00b7);
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const ARCH: Option<u32> = None;

/// Which sockets a process may make.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SocketRule {
    /// Any (`network: true`).
    Any,
    /// None: `socket` is refused (socketpair stays).
    None,
    /// Plain TCP over IPv4 and IPv6 alone, for a program agent's connections to the gateway
    /// (see [`gateway_only_sockets`]).
    StreamOnly,
}

fn seccomp_filter(network: bool) -> Box<[libc::sock_filter]> {
    seccomp_filter_with(if network { SocketRule::Any } else { SocketRule::None })
}

// Classic BPF, as seccomp runs it: the opcodes the filters use.
const LD_W_ABS: u16 = 0x20;
const JEQ: u16 = 0x15;
const JGE: u16 = 0x35;
const JSET: u16 = 0x45;
const JA: u16 = 0x05;
const AND_K: u16 = 0x54;
const RET: u16 = 0x06;
const ALLOW: u32 = 0x7fff_0000;
const ERRNO: u32 = 0x0005_0000;

const fn op(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// Offset of the low half of argument `i` (little-endian, as on x86_64 and aarch64).
const fn arg(i: u32) -> u32 {
    16 + 8 * i
}

/// What one system call meets in the filter: its number and the instructions that decide
/// it, which end in a return whatever the path through them.
type Block = (libc::c_long, Vec<libc::sock_filter>);

/// The decision on one system call whatever its arguments.
fn always(nr: libc::c_long, verdict: u32) -> Block {
    (nr, vec![op(RET, 0, 0, verdict)])
}

/// `blocks` (each number once) and the allowing of every other number, as a search on the
/// number in the accumulator: a call meets about log2(blocks) comparisons, not one per
/// block. The kernel runs the program for every system call number when a process
/// installs it, to find those it always allows (`seccomp_cache_prepare`), so its cost per
/// command follows the length of its paths: installing the 11 blocks as a chain measured
/// 33–42 µs, as this tree 26–28 µs (a C program installing each 300 times, medians).
fn dispatch(blocks: &mut [Block]) -> Vec<libc::sock_filter> {
    blocks.sort_unstable_by_key(|(nr, _)| *nr);
    let mut program = search(blocks);
    program.push(op(RET, 0, 0, ALLOW));
    program
}

/// `blocks` (sorted) as a search on the number, falling through to the instruction after
/// it when no block is the number's. Halves too long for a jump's reach are checked one
/// block after another instead.
fn search(blocks: &[Block]) -> Vec<libc::sock_filter> {
    let chain = |blocks: &[Block]| {
        let mut program = Vec::new();
        for (nr, body) in blocks {
            program.push(op(JEQ, 0, body.len() as u8, *nr as u32));
            program.extend_from_slice(body);
        }
        program
    };
    if blocks.len() <= 2 {
        return chain(blocks);
    }
    let (low, high) = blocks.split_at(blocks.len() / 2);
    let first_high = high[0].0 as u32;
    let (low, high) = (search(low), search(high));
    let Ok(over_low) = u8::try_from(low.len() + 1) else { return chain(blocks) };
    // Numbers from the upper half's first on jump to it; the lower half falls through to a
    // jump over the upper one.
    let mut program = vec![op(JGE, over_low, 0, first_high)];
    program.extend(low);
    program.push(op(JA, 0, 0, high.len() as u32));
    program.extend(high);
    program
}

/// The seccomp program of the sandbox, checked call by call, first match deciding:
/// system calls of another ABI (x32, i386) fail with ENOSYS; `io_uring_setup` with EPERM
/// (its operations would bypass this filter), as is `open_by_handle_at`; without the
/// network, `socket` of any family with EACCES (`socketpair` stays: it reaches nothing
/// outside); for a program agent, what [`gateway_only_sockets`] refuses; and the calls that
/// act on another process by pid without Landlock seeing them (`prlimit64`, `setpriority`,
/// `ioprio_set`, the `sched_set*` family) with EPERM unless the pid is 0, the caller
/// itself: a command cannot lower the runner's limits or priority.
fn seccomp_filter_with(sockets: SocketRule) -> Box<[libc::sock_filter]> {
    let mut program = filter_head();
    program.extend(dispatch(&mut filter_blocks(sockets)));
    program.into_boxed_slice()
}

/// The program's start: another ABI's calls refused, the call's number loaded.
fn filter_head() -> Vec<libc::sock_filter> {
    const X32: u32 = 0x4000_0000;
    vec![
        op(LD_W_ABS, 0, 0, 4), // arch
        op(JEQ, 1, 0, ARCH.unwrap_or(0)),
        op(RET, 0, 0, ERRNO | libc::ENOSYS as u32),
        op(LD_W_ABS, 0, 0, 0), // nr
        op(JGE, 0, 1, X32),
        op(RET, 0, 0, ERRNO | libc::ENOSYS as u32),
    ]
}

/// The calls the program decides on, one block each; every other call is allowed.
fn filter_blocks(sockets: SocketRule) -> Vec<Block> {
    let mut blocks = vec![
        always(libc::SYS_io_uring_setup, ERRNO | libc::EPERM as u32),
        // With CAP_DAC_READ_SEARCH (a root runner's processes keep it) a file handle would
        // open a file by its inode, past every path.
        always(libc::SYS_open_by_handle_at, ERRNO | libc::EPERM as u32),
    ];
    match sockets {
        SocketRule::Any => {}
        SocketRule::None => blocks.push(always(libc::SYS_socket, ERRNO | libc::EACCES as u32)),
        SocketRule::StreamOnly => blocks.extend(gateway_only_sockets()),
    }
    // A call allowed only on the caller itself: argument `at` (a pid) is 0.
    let on_self_only: [(libc::c_long, u32); 7] = [
        (libc::SYS_prlimit64, 0),
        (libc::SYS_setpriority, 1),
        (libc::SYS_ioprio_set, 1),
        (libc::SYS_sched_setaffinity, 0),
        (libc::SYS_sched_setscheduler, 0),
        (libc::SYS_sched_setparam, 0),
        (libc::SYS_sched_setattr, 0),
    ];
    for (nr, at) in on_self_only {
        blocks.push((
            nr,
            vec![
                op(LD_W_ABS, 0, 0, arg(at)),
                op(JEQ, 0, 1, 0),
                op(RET, 0, 0, ALLOW),
                op(RET, 0, 0, ERRNO | libc::EPERM as u32),
            ],
        ));
    }
    blocks
}

/// The sockets of a program agent, whose network is TCP connections to the gateway's port:
/// Landlock checks the port of every TCP `connect` and `bind`, and this keeps every other
/// way out from reaching it. Refused with EACCES:
///
/// - `socket` of any family but IPv4 and IPv6, of any type but a stream, and of any protocol
///   but TCP (0 or `IPPROTO_TCP`): Landlock's rules are TCP's alone, so an MPTCP or SCTP
///   stream would connect anywhere;
/// - `sendto`, `sendmsg` and `sendmmsg` with `MSG_FASTOPEN`, which connects without
///   `connect` (the flags are a register argument; `sendmsg`'s own `msg_flags` are not read
///   for sending), and the `TCP_FASTOPEN_CONNECT` option;
/// - `listen`, which on an unbound socket binds it to a port of every address without
///   `bind`.
fn gateway_only_sockets() -> Vec<Block> {
    const SOCK_TYPE_MASK: u32 = 0xf;
    let refuse = op(RET, 0, 0, ERRNO | libc::EACCES as u32);
    let mut blocks = vec![(
        libc::SYS_socket,
        vec![
            op(LD_W_ABS, 0, 0, arg(0)), // domain
            op(JEQ, 2, 0, libc::AF_INET as u32),
            op(JEQ, 1, 0, libc::AF_INET6 as u32),
            refuse,
            op(LD_W_ABS, 0, 0, arg(1)), // type, less SOCK_NONBLOCK and SOCK_CLOEXEC
            op(AND_K, 0, 0, SOCK_TYPE_MASK),
            op(JEQ, 1, 0, libc::SOCK_STREAM as u32),
            refuse,
            op(LD_W_ABS, 0, 0, arg(2)), // protocol
            op(JEQ, 2, 0, 0),
            op(JEQ, 1, 0, libc::IPPROTO_TCP as u32),
            refuse,
            op(RET, 0, 0, ALLOW),
        ],
    )];
    for (nr, flags) in [(libc::SYS_sendto, 3), (libc::SYS_sendmsg, 2), (libc::SYS_sendmmsg, 3)] {
        blocks.push((
            nr,
            vec![
                op(LD_W_ABS, 0, 0, arg(flags)),
                op(JSET, 0, 1, libc::MSG_FASTOPEN as u32),
                refuse,
                op(RET, 0, 0, ALLOW),
            ],
        ));
    }
    blocks.push((
        libc::SYS_setsockopt,
        vec![
            op(LD_W_ABS, 0, 0, arg(1)), // level
            op(JEQ, 0, 3, libc::IPPROTO_TCP as u32),
            op(LD_W_ABS, 0, 0, arg(2)), // option
            op(JEQ, 0, 1, libc::TCP_FASTOPEN_CONNECT as u32),
            refuse,
            op(RET, 0, 0, ALLOW),
        ],
    ));
    blocks.push((libc::SYS_listen, vec![refuse]));
    blocks
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
        let at = |path: &Path| {
            let path = path.to_owned();
            move |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()))
        };
        std::fs::create_dir(&dir).map_err(at(&dir))?;
        let made = (|| {
            let max_file = dir.join("pids.max");
            std::fs::write(&max_file, max.to_string()).map_err(at(&max_file))?;
            let procs_file = dir.join("cgroup.procs");
            let procs = std::fs::OpenOptions::new().write(true).open(&procs_file).map_err(at(&procs_file))?;
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
        // On cgroup v2 a child gets the controller only if its parent hands it down; on v1
        // every cgroup of the hierarchy has it.
        let subtree = dir.join("cgroup.subtree_control");
        if subtree.exists() {
            std::fs::write(&subtree, "+pids").map_err(|e| format!("{}: {e}", subtree.display()))?;
        }
        if !dir.join("pids.max").exists() && !subtree.exists() {
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
    // The mount's own root: without a cgroup namespace, a container's hierarchy is mounted
    // at its cgroup, which /proc/self/cgroup names in full.
    let mount_of = |want_v2: bool| {
        mounts.lines().find_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let mut fields = before.split_whitespace();
            let root = fields.nth(3)?;
            let mount_point = fields.next()?;
            let mut after = after.split_whitespace();
            let fstype = after.next()?;
            let options = after.nth(1).unwrap_or_default();
            let fits = if want_v2 {
                fstype == "cgroup2"
            } else {
                fstype == "cgroup" && options.split(',').any(|o| o == "pids")
            };
            fits.then(|| (PathBuf::from(mount_point), root.to_owned()))
        })
    };
    let join = |(mount, root): (PathBuf, String), path: &str| {
        let inside = path.strip_prefix(root.trim_end_matches('/')).unwrap_or(path);
        mount.join(inside.trim_start_matches('/'))
    };
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
        if controllers.split(',').any(|c| c == "pids")
            && let Some(mount) = mount_of(false)
        {
            return Ok(join(mount, path));
        }
        if controllers.is_empty()
            && path.starts_with('/')
            && let Some(mount) = mount_of(true)
        {
            let base = join(mount, path);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_and_a_shared_folder_are_possible_and_a_system_folder_to_write_is_not() {
        assert_eq!(SandboxSpec::default().problem(), None);
        let writes = |path: &str| SandboxSpec { write_paths: vec![PathBuf::from(path)], ..SandboxSpec::default() };
        assert_eq!(writes("/srv/shared").problem(), None);
        assert_eq!(writes("/usr2").problem(), None, "a sibling of a system folder is not one");
        for path in ["/", "/usr", "/usr/local/bin", "/etc/ssh", "/proc"] {
            let (field, _) = writes(path).problem().unwrap_or_else(|| panic!("{path} should be refused"));
            assert_eq!(field, "write_paths[0]");
        }
        let at_least = ProcessLimits {
            open_files: Some(MIN_OPEN_FILES),
            memory_mb: Some(MIN_MEMORY_MB),
            ..ProcessLimits::default()
        };
        assert_eq!(SandboxSpec { limits: at_least, ..SandboxSpec::default() }.problem(), None);
        let lifted =
            ProcessLimits { cpu_s: None, memory_mb: None, processes: None, file_size_mb: None, open_files: None };
        assert_eq!(SandboxSpec { limits: lifted, ..SandboxSpec::default() }.problem(), None);
    }

    #[test]
    fn a_hidden_path_is_left_out_and_its_siblings_kept() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["a/secret", "a/open", "b"] {
            std::fs::create_dir_all(dir.path().join(name)).unwrap();
        }
        let base = dir.path().canonicalize().unwrap();
        std::os::unix::fs::symlink(base.join("a/secret"), base.join("b/link")).unwrap();
        std::os::unix::fs::symlink(base.join("a"), base.join("alias")).unwrap();
        let mut out = Vec::new();
        expand_without(&base.join("alias"), &[base.join("a/secret")], &mut out);
        assert_eq!(out, [base.join("a/open")], "a link to the folder is resolved before the hole is made");
        let mut out = Vec::new();
        expand_without(&base.join("b"), &[base.join("a/secret")], &mut out);
        assert_eq!(out, [base.join("b")], "nothing hidden beneath b itself");
        let mut out = Vec::new();
        expand_without(&base.join("b/link"), &[base.join("a/secret")], &mut out);
        assert!(out.is_empty(), "a link to a hidden path is not granted: {out:?}");
        let mut all = Vec::new();
        expand_without(&base, &[PathBuf::from("/elsewhere")], &mut all);
        assert_eq!(all, std::slice::from_ref(&base));
    }

    fn kernel(landlock_abi: i32, seccomp: bool) -> Support {
        Support { landlock_abi, seccomp, root: false, unprivileged_id: None }
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
        let err = prepare(&kernel(5, true), &spec, SandboxMode::On).unwrap_err();
        assert!(err.contains("needs Landlock ABI 6") && err.contains("has ABI 5"), "{err}");
        let err = prepare(&kernel(7, false), &spec, SandboxMode::On).unwrap_err();
        assert!(err.contains("cannot filter system calls"), "{err}");
        // Allowing the network does not make seccomp optional: it also guards other processes.
        let open = SandboxSpec { network: true, ..SandboxSpec::default() };
        assert!(prepare(&kernel(7, false), &open, SandboxMode::On).is_err());
        let enforced = prepare(&kernel(support().landlock_abi.max(6), true), &open, SandboxMode::On).unwrap();
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

    /// The filters of the three socket rules.
    fn filters() -> [(SocketRule, Box<[libc::sock_filter]>); 3] {
        [SocketRule::None, SocketRule::Any, SocketRule::StreamOnly].map(|rule| (rule, seccomp_filter_with(rule)))
    }

    #[test]
    fn the_network_filter_ends_every_path_with_a_return() {
        for (_, filter) in filters() {
            assert_eq!(filter.last().map(|i| i.code), Some(RET));
            // Every jump lands inside the program.
            for (i, op) in filter.iter().enumerate() {
                let reach = match op.code {
                    JA => op.k as usize,
                    code if code & 0x07 == 0x05 => op.jt.max(op.jf) as usize,
                    _ => continue,
                };
                assert!(i + 1 + reach < filter.len(), "jump at {i} leaves the program");
            }
        }
    }

    /// What `program` returns for a call of `nr` with `args` from `arch`, run as the kernel
    /// runs a seccomp program (the opcodes the filters use; any other fails the test).
    fn verdict(program: &[libc::sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_ne_bytes());
        data[4..8].copy_from_slice(&arch.to_ne_bytes());
        for (i, value) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&value.to_ne_bytes());
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let op = program[pc];
            pc += 1;
            let taken = |hit: bool| usize::from(if hit { op.jt } else { op.jf });
            match op.code {
                LD_W_ABS => {
                    let at = op.k as usize;
                    acc = u32::from_ne_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
                }
                AND_K => acc &= op.k,
                RET => return op.k,
                JA => pc += op.k as usize,
                JEQ => pc += taken(acc == op.k),
                JGE => pc += taken(acc >= op.k),
                JSET => pc += taken(acc & op.k != 0),
                code => panic!("opcode {code:#x} at {}", pc - 1),
            }
        }
    }

    /// Regression guard for the search on the call's number: for every number and a spread
    /// of arguments, each filter decides as the same blocks checked one after another do.
    #[test]
    fn the_filters_search_decides_every_call_as_a_chain_of_its_blocks_does() {
        let tcp = libc::IPPROTO_TCP as u64;
        let arguments: [[u64; 6]; 8] = [
            [0; 6],
            [1; 6],
            [libc::AF_INET as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0],
            [libc::AF_INET6 as u64, (libc::SOCK_STREAM | libc::SOCK_CLOEXEC) as u64, tcp, 0, 0, 0],
            [libc::AF_UNIX as u64, libc::SOCK_DGRAM as u64, 0, 0, 0, 0],
            [3, tcp, libc::TCP_FASTOPEN_CONNECT as u64, libc::MSG_FASTOPEN as u64, 0, 0],
            [3, 7, libc::MSG_FASTOPEN as u64, 0, 0, 0],
            [12345, 12345, 12345, 12345, 12345, 12345],
        ];
        let arch = ARCH.unwrap_or(0);
        for (rule, filter) in filters() {
            let mut chain = filter_head();
            for (nr, body) in filter_blocks(rule) {
                chain.push(op(JEQ, 0, body.len() as u8, nr as u32));
                chain.extend(body);
            }
            chain.push(op(RET, 0, 0, ALLOW));
            for nr in (0..1024).chain([0x4000_0000, 0x4000_0029]) {
                for args in arguments {
                    for arch in [arch, 0x4000_0003] {
                        assert_eq!(verdict(&filter, arch, nr, args), verdict(&chain, arch, nr, args), "{nr} {args:?}");
                    }
                }
            }
        }
        // And what the chain decides is what the sandbox promises.
        let [(_, none), (_, any), (_, stream)] = filters();
        let errno = |e: libc::c_int| ERRNO | e as u32;
        let call = |f: &[libc::sock_filter], nr: libc::c_long, args: [u64; 6]| verdict(f, arch, nr as u32, args);
        let unix = [libc::AF_UNIX as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0];
        let inet = [libc::AF_INET as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0];
        assert_eq!(call(&none, libc::SYS_socket, inet), errno(libc::EACCES));
        assert_eq!(call(&any, libc::SYS_socket, inet), ALLOW);
        assert_eq!(call(&stream, libc::SYS_socket, inet), ALLOW);
        assert_eq!(call(&stream, libc::SYS_socket, unix), errno(libc::EACCES));
        assert_eq!(call(&stream, libc::SYS_listen, [0; 6]), errno(libc::EACCES));
        for filter in [&none, &any, &stream] {
            assert_eq!(call(filter, libc::SYS_io_uring_setup, [0; 6]), errno(libc::EPERM));
            assert_eq!(call(filter, libc::SYS_open_by_handle_at, [0; 6]), errno(libc::EPERM));
            assert_eq!(call(filter, libc::SYS_prlimit64, [0; 6]), ALLOW);
            assert_eq!(call(filter, libc::SYS_prlimit64, [1; 6]), errno(libc::EPERM));
            assert_eq!(call(filter, libc::SYS_setpriority, [0, 7, 0, 0, 0, 0]), errno(libc::EPERM));
            assert_eq!(call(filter, libc::SYS_read, [1; 6]), ALLOW);
            assert_eq!(verdict(filter, 0x4000_0003, libc::SYS_read as u32, [0; 6]), errno(libc::ENOSYS));
            assert_eq!(call(filter, 0x4000_0000, [0; 6]), errno(libc::ENOSYS));
        }
    }
}
