//! A command's processes, every one of them. The shell runs under a small keeper process
//! that is a child subreaper (Linux): whatever the command starts — also processes that
//! leave its process group or session (`setsid`) or clear their environment — stays a
//! descendant of the keeper, so it is found and killed when the command ends, however it
//! ends. The keeper reports the shell's exit status on a pipe and reaps everything else.
//! The keeper is a fork of the runner; the shell is started from it as `posix_spawn` does
//! (a child sharing the keeper's memory until its `exec`), so that the runner's memory is
//! copied once per command, not twice.
//!
//! The runner itself is not made a subreaper: orphans of other children (external agents,
//! MCP servers) would then become its zombies, and telling them apart from the children
//! tokio waits for is not possible.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::Arc;

use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::process::{Child, Command};

use super::confinement::Confinement;

/// The `PATH` commands get: the system's programs only.
pub const SAFE_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The first executable file called `name` in the folders of `path` (a `PATH` value), as
/// a shell finds it.
pub fn find_program(name: &str, path: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    path.split(':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| std::path::Path::new(dir).join(name))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// A started command: the keeper (the child tokio knows), the pipe on which it reports the
/// shell's status, and the guard that kills the whole tree.
pub struct Supervised {
    /// First, so that it drops first: killing the keeper before its descendants would
    /// hand them to init.
    pub tree: Tree,
    pub keeper: Child,
    status: pipe::Receiver,
}

/// Starts `command` (a shell) under a keeper, the shell inside `sandbox` (the keeper stays
/// outside, to kill what the shell starts). The command should ask for its own process
/// group; the shell then gets a group of its own, so that a `kill 0` spares the keeper.
/// Its environment is only the variables set on it, as after `env_clear`.
pub fn spawn(command: &mut Command, sandbox: &Arc<Confinement>) -> io::Result<Supervised> {
    spawn_passing(command, sandbox, None)
}

/// [`spawn`], the command also getting `pass` as its descriptor 3 (a socket to talk back
/// to the runner on, say).
pub fn spawn_passing(
    command: &mut Command,
    sandbox: &Arc<Confinement>,
    pass: Option<std::os::fd::RawFd>,
) -> io::Result<Supervised> {
    // The child enters it before `exec`, and its failure would read as a missing program.
    if let Some(dir) = command.as_std().get_current_dir() {
        let entered = std::fs::metadata(dir)
            .and_then(|m| if m.is_dir() { Ok(()) } else { Err(io::ErrorKind::NotADirectory.into()) });
        if let Err(e) = entered {
            return Err(io::Error::new(
                e.kind(),
                format!("its working directory `{}` cannot be entered: {e}", dir.display()),
            ));
        }
    }
    let sandbox = sandbox.clone();
    sandbox.hand_over();
    let argv = Argv::of(command.as_std())?;
    let (read, write) = status_pipe()?;
    let report = write.as_raw_fd();
    // The runner raised its own limit of open files; the command gets the one it started with.
    let files_limit = super::resources::starting_open_files_limit();
    // SAFETY: the closure runs in the forked child and only makes async-signal-safe calls
    // (prctl, signal, mmap, clone, setpgid, setrlimit, close_range, waitpid, write, execvp,
    // _exit, and the sandbox's own, see `Confinement::enter`); it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            // The keeper's parent is the runner; should the runner die (SIGKILL, a second
            // Ctrl-C), the keeper sees another parent and ends the command's tree itself.
            let runner = libc::getppid();
            #[cfg(target_os = "linux")]
            if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The runtime's SIGCHLD handler was inherited; the keeper waits plainly.
            libc::signal(libc::SIGCHLD, libc::SIG_DFL);
            let shell = Shell { argv: &argv, files_limit: files_limit.as_ref(), pass, sandbox: &sandbox, failed: 0 };
            let pid = start_shell(shell)?;
            keep(pid, report, runner)
        });
    }
    let keeper = command.spawn()?;
    // Only the keeper may hold the writing end: its death then reads as an end of file.
    drop(write);
    let tree = Tree(keeper.id().map(|id| id as libc::pid_t));
    let status = pipe::Receiver::from_owned_fd(read)?;
    Ok(Supervised { tree, keeper, status })
}

/// A command's program, arguments and environment, ready for `execvp` in the keeper's
/// child: made in the runner, since nothing may be allocated after the fork.
struct Argv {
    _strings: Vec<std::ffi::CString>,
    /// Pointers into `_strings`, each list ending with a null: the program and its
    /// arguments, then the environment's `NAME=value` entries.
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
}

// SAFETY: the pointers point into the strings owned beside them, which never change.
unsafe impl Send for Argv {}
// SAFETY: as above; nothing is written through them.
unsafe impl Sync for Argv {}

impl Argv {
    /// The command's words, and only the variables set on it: a command is given none of
    /// the runner's (its callers clear the environment, and the keeper's start applies the
    /// variables only after the hook that starts the shell).
    fn of(command: &std::process::Command) -> io::Result<Argv> {
        use std::os::unix::ffi::OsStrExt;
        let nul = |_| io::Error::new(io::ErrorKind::InvalidInput, "a command's word or variable holds a NUL byte");
        let words = std::iter::once(command.get_program()).chain(command.get_args());
        let words: Vec<std::ffi::CString> =
            words.map(|w| std::ffi::CString::new(w.as_bytes())).collect::<Result<_, _>>().map_err(nul)?;
        let variables: Vec<std::ffi::CString> = command
            .get_envs()
            .filter_map(|(name, value)| Some([name.as_bytes(), b"=", value?.as_bytes()].concat()))
            .map(std::ffi::CString::new)
            .collect::<Result<_, _>>()
            .map_err(nul)?;
        let ended = |strings: &[std::ffi::CString]| {
            strings.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect()
        };
        let (argv, envp) = (ended(&words), ended(&variables));
        Ok(Argv { _strings: words.into_iter().chain(variables).collect(), argv, envp })
    }
}

/// What the shell's start needs, on the keeper's stack; `failed` is where the shell's child
/// leaves the error number of a failed start.
struct Shell<'a> {
    argv: &'a Argv,
    files_limit: Option<&'a libc::rlimit>,
    pass: Option<std::os::fd::RawFd>,
    sandbox: &'a Confinement,
    failed: libc::c_int,
}

/// The stack of the shell's child, which lives only until its `exec`.
const SHELL_STACK_BYTES: usize = 256 * 1024;

/// In the keeper: starts the shell as posix_spawn does, a child that shares the keeper's
/// memory and runs until its `exec` while the keeper waits (`CLONE_VM | CLONE_VFORK`), so
/// that the runner's memory, which the keeper was forked with, is not copied a second
/// time. The shell's failure to start (its sandbox, its program) is the keeper's error.
///
/// SAFETY: to be called only in a freshly forked child (the keeper).
unsafe fn start_shell(mut shell: Shell<'_>) -> io::Result<libc::pid_t> {
    extern "C" fn run(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the keeper's `Shell`, alive while the keeper waits for this `exec`.
        unsafe {
            let shell = &mut *arg.cast::<Shell<'_>>();
            let failed = enter_and_exec(shell).raw_os_error().unwrap_or(libc::EINVAL);
            shell.failed = failed;
            libc::_exit(127)
        }
    }
    // SAFETY: a fresh mapping, given to the child as its stack and unmapped once it has
    // exec'd or exited (CLONE_VFORK returns only then).
    unsafe {
        let stack = libc::mmap(
            std::ptr::null_mut(),
            SHELL_STACK_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        );
        if stack == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // No handler of the runner's may run in the child while it shares this memory.
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_SETMASK, &all, &mut before);
        let top = stack.cast::<u8>().add(SHELL_STACK_BYTES).cast::<libc::c_void>();
        let arg = (&mut shell as *mut Shell<'_>).cast::<libc::c_void>();
        let pid = libc::clone(run, top, libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD, arg);
        let cloned = io::Error::last_os_error();
        libc::sigprocmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
        libc::munmap(stack, SHELL_STACK_BYTES);
        if pid < 0 {
            return Err(cloned);
        }
        if shell.failed != 0 {
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
            return Err(io::Error::from_raw_os_error(shell.failed));
        }
        Ok(pid)
    }
}

/// In the shell's child: its own process group, the command's limits and descriptor, the
/// sandbox, then the program. Returns only the error that stopped it.
///
/// SAFETY: only in the child of [`start_shell`].
unsafe fn enter_and_exec(shell: &Shell<'_>) -> io::Error {
    // SAFETY: system calls on this process alone, with values prepared by the runner.
    unsafe {
        // The runner ignores SIGPIPE; a command gets the default (`yes | head`).
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::setpgid(0, 0);
        if let Some(limit) = shell.files_limit {
            libc::setrlimit(libc::RLIMIT_NOFILE, limit);
        }
        if let Some(fd) = shell.pass {
            // dup2 onto itself would keep close-on-exec: clear it then.
            if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0);
            } else if libc::dup2(fd, 3) < 0 {
                return io::Error::last_os_error();
            }
        }
        if let Err(e) = shell.sandbox.enter() {
            return e;
        }
        // The keeper's mask was empty (the command's own start cleared it).
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        // The command's environment, also where `execvp` looks for the program. The
        // keeper's memory is shared until `exec`: the keeper's copy changes too, and it
        // reads no variable again.
        unsafe extern "C" {
            static mut environ: *const *const libc::c_char;
        }
        environ = shell.argv.envp.as_ptr();
        libc::execvp(shell.argv.argv[0], shell.argv.argv.as_ptr());
        io::Error::last_os_error()
    }
}

impl Supervised {
    /// The shell's exit status, once it has exited; `None` when the keeper died first
    /// (the command killed it).
    pub async fn shell_status(&mut self) -> Option<ExitStatus> {
        let mut raw = [0u8; 4];
        self.status.read_exact(&mut raw).await.ok()?;
        Some(ExitStatus::from_raw(i32::from_ne_bytes(raw)))
    }
}

impl Supervised {
    /// A handle to stop the command with while its output is being read.
    pub fn stopper(&self) -> Stopper {
        Stopper(self.tree.0)
    }
}

/// Stops a command: gently, or outright. Valid while its [`Supervised`] is alive (the
/// keeper is not reaped before, so its pid cannot be reused).
#[derive(Debug, Clone, Copy)]
pub struct Stopper(Option<libc::pid_t>);

impl Stopper {
    /// Kills the whole tree, as [`Tree::kill`].
    pub fn kill(&self) {
        Tree(self.0).kill();
    }

    /// Asks the command to end: SIGTERM to the process group of each of the keeper's
    /// children (the command's own group, and any that left it).
    pub fn terminate(&self) {
        let Some(keeper) = self.0 else { return };
        let children = std::fs::read_to_string(format!("/proc/{keeper}/task/{keeper}/children")).unwrap_or_default();
        for pid in children.split_whitespace().filter_map(|p| p.parse::<libc::pid_t>().ok()) {
            // SAFETY: kill only sends a signal, to a child of this command's keeper and its group.
            unsafe {
                libc::kill(-pid, libc::SIGTERM);
                libc::kill(pid, libc::SIGTERM);
            }
        }
    }
}

fn status_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills `fds` with two new descriptors, which are then owned here.
    unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(io::Error::last_os_error());
        }
        use std::os::fd::FromRawFd;
        Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])))
    }
}

/// The keeper's life: reap every child (orphans of the command are reparented to it),
/// report the shell's status when it exits, and exit when no child is left. Once a second
/// it looks whether the runner (its parent) is still there; when it is not, it kills the
/// command's whole tree and exits, so that nothing outlives a runner killed outright.
///
/// SAFETY: to be called only in a freshly forked child, with `report` open.
unsafe fn keep(shell: libc::pid_t, report: libc::c_int, runner: libc::pid_t) -> ! {
    extern "C" fn wake(_: libc::c_int) {}
    // SAFETY: async-signal-safe calls on descriptors and children of this process only.
    unsafe {
        // Copies of the runner's descriptors (other commands' pipes among them) would keep
        // those open for as long as this command lives.
        close_from(0, report);
        close_from(report + 1, libc::c_int::MAX);
        // SIGALRM interrupts the wait below (no SA_RESTART), so the parent is checked.
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = wake as *const () as libc::sighandler_t;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGALRM, &action, std::ptr::null_mut());
        let mut report = Some(report);
        loop {
            if libc::getppid() != runner {
                kill_tree_and_exit(shell);
            }
            libc::alarm(1);
            let mut status = 0;
            let pid = libc::waitpid(-1, &mut status, 0);
            if pid == shell {
                if let Some(fd) = report.take() {
                    let bytes = status.to_ne_bytes();
                    libc::write(fd, bytes.as_ptr().cast(), bytes.len());
                    libc::close(fd);
                }
            } else if pid < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                libc::_exit(0);
            }
        }
    }
}

/// In the keeper: kills the shell's process group, then every child the keeper has (what
/// escaped the group was reparented to it), until none is left; then exits.
///
/// SAFETY: to be called only in the keeper; it allocates nothing.
unsafe fn kill_tree_and_exit(shell: libc::pid_t) -> ! {
    // SAFETY: signals to this keeper's own children and the shell's group; raw reads of
    // this process's own /proc file into a stack buffer.
    unsafe {
        libc::kill(-shell, libc::SIGKILL);
        let mut buffer = [0u8; 64];
        let path = children_path(libc::getpid() as u32, &mut buffer);
        for _ in 0..1000 {
            let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
            let mut buf = [0u8; 4096];
            let n = if fd >= 0 { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) } else { -1 };
            if fd >= 0 {
                libc::close(fd);
            }
            let mut current: libc::pid_t = 0;
            for &b in buf.iter().take(n.max(0) as usize) {
                if b.is_ascii_digit() {
                    current = current * 10 + libc::pid_t::from(b - b'0');
                } else if current > 0 {
                    libc::kill(current, libc::SIGKILL);
                    current = 0;
                }
            }
            // Reap what died; no child left means nothing is left to kill.
            let mut status = 0;
            while libc::waitpid(-1, &mut status, libc::WNOHANG) > 0 {}
            if libc::waitpid(-1, &mut status, libc::WNOHANG) < 0 {
                libc::_exit(0);
            }
            let pause = libc::timespec { tv_sec: 0, tv_nsec: 1_000_000 };
            libc::nanosleep(&pause, std::ptr::null_mut());
        }
        libc::_exit(0);
    }
}

/// `/proc/self/task/PID/children` (NUL-terminated) written into `buffer`, without leading
/// zeros, which procfs does not accept. It allocates nothing: it runs after a fork.
fn children_path(pid: u32, buffer: &mut [u8; 64]) -> &[u8] {
    const HEAD: &[u8] = b"/proc/self/task/";
    const TAIL: &[u8] = b"/children\0";
    let mut digits = [0u8; 10];
    let mut start = digits.len();
    let mut rest = pid;
    loop {
        start -= 1;
        digits[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    let mut len = 0;
    for part in [HEAD, &digits[start..], TAIL] {
        buffer[len..len + part.len()].copy_from_slice(part);
        len += part.len();
    }
    &buffer[..len]
}

/// Closes descriptors `first..last` (exclusive of `last`).
unsafe fn close_from(first: libc::c_int, last: libc::c_int) {
    if first >= last {
        return;
    }
    // SAFETY: closing descriptors of this process; close_range needs Linux 5.9.
    unsafe {
        #[cfg(target_os = "linux")]
        if libc::syscall(libc::SYS_close_range, first as libc::c_uint, (last - 1) as libc::c_uint, 0) == 0 {
            return;
        }
        for fd in first..last.min(65_536) {
            libc::close(fd);
        }
    }
}

/// A keeper and everything below it; killed when dropped.
pub struct Tree(Option<libc::pid_t>);

impl Tree {
    /// Kills every descendant of the keeper, then the keeper. Processes may fork while
    /// they are being killed, so this repeats until none is left (or gives up after a
    /// while against a fork bomb).
    pub fn kill(&mut self) {
        // Once killed, the keeper may be reaped at any moment and its pid reused: it is
        // never signalled again.
        let Some(keeper) = self.0.take() else { return };
        for _ in 0..200 {
            let below = descendants(keeper);
            if below.is_empty() {
                break;
            }
            for pid in below {
                // SAFETY: kill only sends a signal, to a descendant of this command's keeper.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            std::thread::yield_now();
        }
        // SAFETY: the keeper is our child and not yet reaped, so its pid is still its own.
        unsafe {
            libc::kill(keeper, libc::SIGKILL);
        }
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The live (not zombie) descendants of `root`.
fn descendants(root: libc::pid_t) -> Vec<libc::pid_t> {
    // Most commands leave nothing behind: the keeper's list of children says so cheaply.
    let children = format!("/proc/{root}/task/{root}/children");
    if std::fs::read_to_string(&children).is_ok_and(|c| c.trim().is_empty()) {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut parents = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<libc::pid_t>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
        let mut fields = stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace()).into_iter().flatten();
        let (Some(state), Some(ppid)) = (fields.next(), fields.next().and_then(|p| p.parse::<libc::pid_t>().ok()))
        else {
            continue;
        };
        parents.push((pid, ppid, state == "Z" || state == "X"));
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(parents.iter().filter(|(pid, ppid, _)| *ppid == parent && *pid != root).map(|(pid, _, _)| *pid));
        i += 1;
    }
    found.retain(|pid| *pid != root && parents.iter().any(|(p, _, dead)| p == pid && !dead));
    found
}

/// Output read with a cap: the first bytes kept, and how many there were in all.
pub struct Captured {
    pub kept: Vec<u8>,
    pub total: usize,
}

impl Captured {
    /// The kept bytes as text, with a visible marker when some were cut.
    pub fn text(&self) -> String {
        let mut text = String::from_utf8_lossy(&self.kept).into_owned();
        if self.total > self.kept.len() {
            text.push_str(&format!(
                "\n[... output truncated: showing {} of {} bytes ...]",
                self.kept.len(),
                self.total
            ));
        }
        text
    }
}

/// Reads everything, keeping the first `cap` bytes and counting the rest.
pub async fn read_capped(mut reader: impl tokio::io::AsyncRead + Unpin, cap: usize) -> std::io::Result<Captured> {
    let mut kept = Vec::new();
    let mut total = 0;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = reader.read(&mut buf).await?;
        if n == 0 {
            return Ok(Captured { kept, total });
        }
        total += n;
        if kept.len() < cap {
            let room = cap - kept.len();
            kept.extend_from_slice(&buf[..n.min(room)]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::children_path;

    /// Regression: a missing working directory was reported as the program's absence.
    #[tokio::test]
    async fn a_missing_working_directory_is_named_not_the_program() {
        let gone = tempfile::tempdir().unwrap().path().join("gone");
        let mut command = tokio::process::Command::new("/bin/true");
        command.current_dir(&gone);
        let sandbox = super::Confinement::off("a test");
        let Err(e) = super::spawn(&mut command, &sandbox) else { panic!("started in a missing folder") };
        let message = e.to_string();
        assert!(message.contains(&format!("`{}` cannot be entered", gone.display())), "{message}");
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }

    #[tokio::test]
    async fn a_program_that_cannot_start_is_the_spawns_error() {
        let mut command = tokio::process::Command::new("/nonexistent/program");
        let sandbox = super::Confinement::off("a test");
        let Err(e) = super::spawn(&mut command, &sandbox) else { panic!("a missing program started") };
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    }

    /// The shell is started from the keeper without a second copy of the runner: it must
    /// still be the keeper's child, in a process group of its own, with its exit status
    /// reported, the descriptor passed to it and only the variables set on it.
    #[tokio::test]
    async fn the_shell_is_the_keepers_child_in_a_group_of_its_own() {
        use tokio::io::AsyncReadExt;
        let passed = std::fs::File::open("/dev/null").unwrap();
        let mut command = tokio::process::Command::new("sh");
        command
            .args([
                "-c",
                "read -r stat < /proc/$$/stat; echo $$ $stat; ls -l /proc/$$/fd/3; echo ${HOME-unset} $ONLY; exit 7",
            ])
            .env("ONLY", "this")
            .stdout(std::process::Stdio::piped())
            .process_group(0);
        let sandbox = super::Confinement::off("a test");
        use std::os::fd::AsRawFd;
        let mut started = super::spawn_passing(&mut command, &sandbox, Some(passed.as_raw_fd())).unwrap();
        let keeper = started.keeper.id().unwrap() as i64;
        let mut out = String::new();
        started.keeper.stdout.take().unwrap().read_to_string(&mut out).await.unwrap();
        let status = started.shell_status().await.expect("the keeper reports the shell's status");
        assert_eq!(status.code(), Some(7), "{out}");
        // `PID PID (sh) S PPID PGRP …`
        let fields: Vec<&str> = out.split_whitespace().collect();
        let (pid, ppid, group) = (fields[0], fields[4], fields[5]);
        assert_eq!(ppid, keeper.to_string(), "the shell's parent: {out}");
        assert_eq!(group, pid, "the shell's process group: {out}");
        assert!(out.contains("-> /dev/null\n"), "descriptor 3 is the one passed: {out}");
        assert!(out.ends_with("\nunset this\n"), "the environment is only what was set: {out}");
        let _ = started.keeper.wait().await;
    }

    #[test]
    fn the_keepers_children_path_has_no_leading_zeros() {
        let mut buffer = [0u8; 64];
        assert_eq!(children_path(19800, &mut buffer), b"/proc/self/task/19800/children\0");
        assert_eq!(children_path(7, &mut buffer), b"/proc/self/task/7/children\0");
        assert_eq!(children_path(u32::MAX, &mut buffer), b"/proc/self/task/4294967295/children\0");
    }
}
