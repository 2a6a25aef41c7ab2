//! A command's processes, every one of them. The shell runs under a small keeper process
//! that is a child subreaper (Linux): whatever the command starts — also processes that
//! leave its process group or session (`setsid`) or clear their environment — stays a
//! descendant of the keeper, so it is found and killed when the command ends, however it
//! ends. The keeper reports the shell's exit status on a pipe and reaps everything else.
//!
//! Neither the keeper nor the shell's start copies the runner's memory: the keeper is a
//! process that shares it (`clone(CLONE_VM)`) and runs on a small stack of its own, and it
//! starts the shell as `posix_spawn` does (`CLONE_VM | CLONE_VFORK`, the shell running in
//! that shared memory until its `exec`). Both therefore touch nothing of the runner's but
//! what was prepared for them ([`Plan`]), allocate nothing, and make their system calls
//! without the C library (`raw.rs`). A fork would copy the page tables of the runner's
//! tens of MiB at every command, and every page either side wrote afterwards.
//!
//! The runner itself is not made a subreaper: orphans of other children (external agents,
//! MCP servers) would then become its zombies, and telling them apart from the children
//! tokio waits for is not possible.

use std::ffi::CString;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::io::AsyncReadExt;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;
use tokio::process::{ChildStderr, ChildStdin, ChildStdout, Command};

use super::confinement::Confinement;
use super::raw;

/// The `PATH` commands get: the system's programs only.
pub const SAFE_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Where a program named without a slash is looked for when its command sets no `PATH`,
/// as the C library's `execvp` does.
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// The first executable file called `name` in the folders of `path` (a `PATH` value), as
/// a shell finds it.
pub fn find_program(name: &str, path: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    path.split(':')
        .filter(|dir| !dir.is_empty())
        .map(|dir| std::path::Path::new(dir).join(name))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// What a command reads: a pipe the runner writes (`ChildStdin`), or nothing (`/dev/null`).
/// Its output and errors are always pipes the runner reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    Piped,
    Null,
}

/// A started command: the keeper (the child the runner reaps), the pipe on which it
/// reports the shell's status, and the guard that kills the whole tree.
pub struct Supervised {
    /// First, so that it drops first: killing the keeper before its descendants would
    /// hand them to init.
    pub tree: Tree,
    pub keeper: Keeper,
    status: pipe::Receiver,
}

/// Starts `command` (its program, arguments, variables and working folder; nothing else of
/// it is read) under a keeper, the shell inside `sandbox` (the keeper stays outside, to
/// kill what the shell starts). The keeper and the shell each get a process group of their
/// own, so that a `kill 0` spares the keeper and a Ctrl-C at the terminal reaches neither.
/// The environment is only the variables set on `command`, as after `env_clear`.
pub fn spawn(command: &Command, input: Input, sandbox: &Arc<Confinement>) -> io::Result<Supervised> {
    spawn_passing(command, input, sandbox, None)
}

/// [`spawn`], the command also getting `pass` as its descriptor 3 (a socket to talk back
/// to the runner on, say).
pub fn spawn_passing(
    command: &Command,
    input: Input,
    sandbox: &Arc<Confinement>,
    pass: Option<RawFd>,
) -> io::Result<Supervised> {
    let command = command.as_std();
    // The child enters it before `exec`, and its failure would read as a missing program.
    let root = sandbox.root().map(|r| r.path().to_path_buf());
    // In an image's root, paths are the root's: looked at from the runner through it.
    let seen = |path: &std::path::Path| match &root {
        Some(root) => root.join(path.strip_prefix("/").unwrap_or(path)),
        None => path.to_path_buf(),
    };
    let cwd = match command.get_current_dir() {
        Some(dir) => {
            let entered = std::fs::metadata(seen(dir))
                .and_then(|m| if m.is_dir() { Ok(()) } else { Err(io::ErrorKind::NotADirectory.into()) });
            if let Err(e) = entered {
                return Err(io::Error::new(
                    e.kind(),
                    format!("its working directory `{}` cannot be entered: {e}", dir.display()),
                ));
            }
            Some(c_string(dir.as_os_str())?)
        }
        None => None,
    };
    reap_orphans();
    sandbox.hand_over();
    let argv = Argv::of(command)?;
    let (stdin, child_stdin) = match input {
        Input::Piped => {
            let (read, write) = cloexec_pipe()?;
            (Some(write), above_stdio(read)?)
        }
        Input::Null => (None, above_stdio(std::fs::File::open("/dev/null")?.into())?),
    };
    let (stdout, child_stdout) = cloexec_pipe()?;
    let (stderr, child_stderr) = cloexec_pipe()?;
    let (child_stdout, child_stderr) = (above_stdio(child_stdout)?, above_stdio(child_stderr)?);
    let (report, child_report) = cloexec_pipe()?;
    let child_report = above_stdio(child_report)?;
    let pass = pass.map(duplicate_above_stdio).transpose()?;
    let stacks = SPARE.take()?;
    let program = argv.program(root.as_deref())?;
    let script = [SHELL.as_ptr(), program.as_ptr()].into_iter().chain(argv.argv[1..].iter().copied()).collect();
    let plan = Plan {
        program,
        script,
        argv,
        cwd,
        stdio: [child_stdin.as_raw_fd(), child_stdout.as_raw_fd(), child_stderr.as_raw_fd()],
        pass: pass.as_ref().map(|fd| fd.as_raw_fd()),
        files_limit: super::resources::starting_open_files_limit(),
        sandbox: sandbox.clone(),
        report: child_report.as_raw_fd(),
        lifeline: lifeline()?,
        shell_stack: stacks.top(1),
    };
    // SAFETY: the stacks stay alive until the keeper is reaped (the keeper owns them), and
    // the plan until the keeper has reported the shell's start, read below.
    let pid = unsafe { start_keeper(&plan, &stacks) };
    // The child's ends are the keeper's now (or nobody's): the runner's copies go.
    drop((child_stdin, child_stdout, child_stderr, child_report, pass));
    let pid = pid?;
    let mut keeper = Keeper::new(pid, stacks);
    // The keeper says at once whether the shell started; only the keeper held the writing
    // end, so its death reads as an end of file.
    let mut report = std::fs::File::from(report);
    let mut started = [0u8; 8];
    let outcome = report.read_exact(&mut started);
    drop(plan);
    let (tag, value) = (
        i32::from_ne_bytes([started[0], started[1], started[2], started[3]]),
        i32::from_ne_bytes([started[4], started[5], started[6], started[7]]),
    );
    if outcome.is_err() || tag != STARTED {
        keeper.reap_now();
        return Err(match outcome {
            Err(_) => io::Error::other("the command's keeper ended before it could start the command"),
            Ok(()) => io::Error::from_raw_os_error(value),
        });
    }
    let tree = Tree(Some(pid));
    keeper.stdin = stdin.map(|fd| ChildStdin::from_std(std::process::ChildStdin::from(fd))).transpose()?;
    keeper.stdout = Some(ChildStdout::from_std(std::process::ChildStdout::from(stdout))?);
    keeper.stderr = Some(ChildStderr::from_std(std::process::ChildStderr::from(stderr))?);
    let status = pipe::Receiver::from_owned_fd(report.into())?;
    Ok(Supervised { tree, keeper, status })
}

/// How many more times, a millisecond apart, a program that is busy (ETXTBSY) is tried.
const BUSY_TRIES: usize = 100;

/// What runs a program that has no `#!` line.
const SHELL: &std::ffi::CStr = c"/bin/sh";

/// The first report's tag when the shell started (its value: the shell's pid); any other
/// tag is a failure, its value the error number.
const STARTED: i32 = 0;
const FAILED: i32 = 1;

/// A path or word as a C string; a NUL byte in it is refused.
fn c_string(text: &std::ffi::OsStr) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(text.as_bytes()).map_err(|_| {
        io::Error::new(io::ErrorKind::InvalidInput, "a command's word, variable or folder holds a NUL byte")
    })
}

/// A pipe, both ends closed on `exec`: (reading end, writing end).
fn cloexec_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills `fds` with two new descriptors, which are then owned here.
    unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])))
    }
}

/// A copy of `fd` numbered 4 or more, closed on `exec`: the shell's child puts descriptors
/// onto 0 to 3, which must not be one of those it takes them from.
fn duplicate_above_stdio(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC makes a new descriptor, owned from here on.
    let copy = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 4) };
    if copy < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    Ok(unsafe { OwnedFd::from_raw_fd(copy) })
}

/// `fd` itself when it is numbered 4 or more, else a copy that is.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() >= 4 { Ok(fd) } else { duplicate_above_stdio(fd.as_raw_fd()) }
}

/// The reading end of the runner's lifeline: a pipe whose writing end only the runner
/// holds, open for as long as it lives. Every keeper watches it: when the runner dies,
/// however it dies, the keeper sees the pipe's end and kills the command's tree.
fn lifeline() -> io::Result<RawFd> {
    static LIFELINE: OnceLock<Result<(OwnedFd, OwnedFd), String>> = OnceLock::new();
    match LIFELINE.get_or_init(|| cloexec_pipe().map_err(|e| e.to_string())) {
        Ok((read, _write)) => Ok(read.as_raw_fd()),
        Err(e) => Err(io::Error::other(format!("the commands' lifeline: {e}"))),
    }
}

/// What the keeper and the shell's child need, made in the runner (nothing may be
/// allocated after the clone) and read by them until the keeper reports the shell's start.
struct Plan {
    /// The top of the stack the shell's child runs on until its `exec`.
    shell_stack: *mut u8,
    argv: Argv,
    /// The program's path, found in the command's `PATH` as `execvp` would.
    program: CString,
    /// `/bin/sh`, the program's path and its arguments: how a program without a `#!` line
    /// is run, as `execvp` runs it (its `exec` fails with ENOEXEC).
    script: Vec<*const libc::c_char>,
    cwd: Option<CString>,
    /// The shell's descriptors 0, 1 and 2, each numbered 4 or more in the runner.
    stdio: [RawFd; 3],
    /// The shell's descriptor 3, numbered 4 or more in the runner.
    pass: Option<RawFd>,
    /// The runner raised its own limit of open files; the command gets the one it started with.
    files_limit: Option<libc::rlimit>,
    sandbox: Arc<Confinement>,
    /// The writing end of the keeper's reports.
    report: RawFd,
    /// The reading end of the runner's lifeline.
    lifeline: RawFd,
}

/// A command's program, arguments and environment, ready for `execve` in the keeper's
/// child: made in the runner, since nothing may be allocated after the clone.
struct Argv {
    _strings: Vec<CString>,
    /// Pointers into `_strings`, each list ending with a null: the program and its
    /// arguments, then the environment's `NAME=value` entries.
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    /// The program as named, and the command's `PATH`, if it sets one.
    name: std::ffi::OsString,
    path: Option<std::ffi::OsString>,
}

// SAFETY: the pointers point into the strings owned beside them, which never change.
unsafe impl Send for Argv {}
// SAFETY: as above; nothing is written through them.
unsafe impl Sync for Argv {}

impl Argv {
    /// The command's words, and only the variables set on it: a command is given none of
    /// the runner's (its callers clear the environment).
    fn of(command: &std::process::Command) -> io::Result<Argv> {
        use std::os::unix::ffi::OsStrExt;
        let words = std::iter::once(command.get_program()).chain(command.get_args());
        let words: Vec<CString> = words.map(c_string).collect::<Result<_, _>>()?;
        let mut path = None;
        let variables: Vec<CString> = command
            .get_envs()
            .filter_map(|(name, value)| {
                let value = value?;
                if name == "PATH" {
                    path = Some(value.to_owned());
                }
                Some([name.as_bytes(), b"=", value.as_bytes()].concat())
            })
            .map(|v| c_string(std::ffi::OsStr::from_bytes(&v)))
            .collect::<Result<_, _>>()?;
        let ended =
            |strings: &[CString]| strings.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
        let (argv, envp) = (ended(&words), ended(&variables));
        Ok(Argv {
            _strings: words.into_iter().chain(variables).collect(),
            argv,
            envp,
            name: command.get_program().to_owned(),
            path,
        })
    }

    /// The program's path: as named when the name holds a slash, else the first executable
    /// file of that name in the command's `PATH`. A missing program is `ENOENT`, as
    /// `execvp`'s.
    fn program(&self, root: Option<&std::path::Path>) -> io::Result<CString> {
        use std::os::unix::ffi::OsStrExt;
        if self.name.as_bytes().contains(&b'/') {
            return c_string(&self.name);
        }
        let path = self.path.as_deref().and_then(|p| p.to_str()).unwrap_or(DEFAULT_PATH);
        let found = self.name.to_str().and_then(|name| match root {
            Some(root) => find_program_in_root(root, name, path),
            None => find_program(name, path),
        });
        match found {
            Some(found) => c_string(found.as_os_str()),
            None => Err(io::Error::from_raw_os_error(libc::ENOENT)),
        }
    }
}

/// The first executable file named `name` in one of `path`'s folders, each folder resolved
/// in the image's `root` (its links too, as they are seen from inside): its path there.
fn find_program_in_root(root: &std::path::Path, name: &str, path: &str) -> Option<std::path::PathBuf> {
    let root_dir = std::fs::File::open(root).ok()?;
    path.split(':').filter(|dir| dir.starts_with('/')).find_map(|dir| {
        let candidate = std::path::Path::new(dir).join(name);
        let executable = in_root(&root_dir, &candidate)
            .is_some_and(|mode| mode & libc::S_IFMT == libc::S_IFREG && mode & 0o111 != 0);
        executable.then_some(candidate)
    })
}

/// The mode of `path` resolved in the root held open by `root` (absolute links lead to the
/// root's own places), when it is there.
fn in_root(root: &std::fs::File, path: &std::path::Path) -> Option<libc::mode_t> {
    use std::os::unix::ffi::OsStrExt;
    let relative = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: open_how is plain data; every field is set below.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 reads the path and the struct given, and makes a descriptor that is
    // owned and closed here.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            relative.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: a new descriptor, owned from here.
    let file = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat fills the struct given.
    (unsafe { libc::fstat(file.as_raw_fd(), &mut stat) } == 0).then_some(stat.st_mode)
}

/// The keeper's stack and the shell's child's, each above a page that may not be touched,
/// so that an overflow faults instead of writing into the runner's memory.
struct Stacks {
    base: *mut libc::c_void,
}

// SAFETY: a mapping of this process, unmapped once by whoever owns it.
unsafe impl Send for Stacks {}

/// Each stack's size, and the guard page below it.
const STACK_BYTES: usize = 128 * 1024;
const GUARD_BYTES: usize = 4096;
const STACKS_BYTES: usize = 2 * (GUARD_BYTES + STACK_BYTES);

/// Stacks that nothing runs on any more, kept for the next commands: mapping and unmapping a
/// pair for each command was a tenth of the runner's CPU in starting it.
struct Spare {
    stacks: Mutex<Vec<Stacks>>,
    /// How many are kept at most; one given back beyond is unmapped.
    most: usize,
}

/// The keepers' spare stacks: as many as commands at once that reuse them.
static SPARE: Spare = Spare { stacks: Mutex::new(Vec::new()), most: 64 };

impl Spare {
    /// A pair that nothing runs on: a spare one, or a new one.
    fn take(&self) -> io::Result<Stacks> {
        let spare = self.stacks.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).pop();
        spare.map_or_else(Stacks::new, Ok)
    }

    /// Keeps a pair that nothing runs on any more (its keeper was reaped).
    fn give_back(&self, stacks: Stacks) {
        let mut spare = self.stacks.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if spare.len() < self.most {
            spare.push(stacks);
        }
    }
}

impl Stacks {
    fn new() -> io::Result<Stacks> {
        // SAFETY: a fresh mapping, owned by the `Stacks` returned; its guard pages made
        // inaccessible.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                STACKS_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK | libc::MAP_NORESERVE,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            let stacks = Stacks { base };
            for guard in [0, GUARD_BYTES + STACK_BYTES] {
                if libc::mprotect(base.cast::<u8>().add(guard).cast(), GUARD_BYTES, libc::PROT_NONE) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(stacks)
        }
    }

    /// The top of the keeper's stack (0) or of the shell's child's (1), 16-byte aligned.
    fn top(&self, which: usize) -> *mut u8 {
        // SAFETY: within the mapping.
        unsafe { self.base.cast::<u8>().add((which + 1) * (GUARD_BYTES + STACK_BYTES)) }
    }
}

impl Drop for Stacks {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, which nothing runs on any more.
        unsafe {
            libc::munmap(self.base, STACKS_BYTES);
        }
    }
}

/// Starts the keeper: a process sharing the runner's memory, on the first of `stacks`,
/// running [`keeper`] with `plan`. No handler of the runner's may run in it: it starts with
/// every signal blocked, and keeps them so.
///
/// SAFETY: `plan` must stay alive until the keeper has reported the shell's start, and
/// `stacks` until the keeper is reaped.
unsafe fn start_keeper(plan: &Plan, stacks: &Stacks) -> io::Result<libc::pid_t> {
    // SAFETY: the mask is restored below; the clone's promises are the caller's.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut before);
        let arg = (plan as *const Plan).cast_mut().cast::<libc::c_void>();
        let pid = raw::clone(libc::CLONE_VM | libc::SIGCHLD, stacks.top(0), keeper, arg);
        libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
        pid
    }
}

/// The keeper: its own process group, a subreaper, the shell started and its start
/// reported; then [`keep`]. It shares the runner's memory: see the module's documentation.
extern "C" fn keeper(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the runner's `Plan`, alive until the report below is read.
    let plan = unsafe { &*arg.cast::<Plan>() };
    let (report, lifeline) = (plan.report, plan.lifeline);
    // First of all, the copies of the runner's descriptors that the command does not need
    // go: one of a file another thread has open for writing would make running that file
    // fail with ETXTBSY ("Text file busy") for as long as it is held, and the shell's child
    // would inherit them all until its `exec`.
    let [stdin, stdout, stderr] = plan.stdio;
    let [ruleset, cgroup, mount_ns, pid_ns, user_ns] = plan.sandbox.descriptors().map(|fd| fd.unwrap_or(report));
    let pass = plan.pass.unwrap_or(report);
    close_all_but(&mut [stdin, stdout, stderr, pass, report, lifeline, ruleset, cgroup, mount_ns, pid_ns, user_ns]);
    // SAFETY: system calls on this process alone.
    let made = unsafe {
        let _ = raw::call(libc::SYS_setpgid, &[0, 0]);
        let _ = raw::call(libc::SYS_prctl, &[libc::PR_SET_NAME as usize, c"keeper".as_ptr() as usize]);
        raw::call(libc::SYS_prctl, &[libc::PR_SET_CHILD_SUBREAPER as usize, 1])
            .and_then(|_| plan.sandbox.enter_pid_namespace())
    };
    let started = made.and_then(|_| start_shell(plan));
    let (tag, value) = match &started {
        Ok(pid) => (STARTED, *pid),
        Err(e) => (FAILED, e.raw_os_error().unwrap_or(libc::EINVAL)),
    };
    let mut message = [0u8; 8];
    message[..4].copy_from_slice(&tag.to_ne_bytes());
    message[4..].copy_from_slice(&value.to_ne_bytes());
    // The plan may be gone once this is written: what is needed of it was copied above.
    let _ = raw::write(report, &message);
    match started {
        Ok(shell) => keep(shell, report, lifeline),
        Err(_) => raw::exit(0),
    }
}

/// What the shell's child is given: the plan, and where it leaves the error number of a
/// failed start.
struct Shell<'a> {
    plan: &'a Plan,
    failed: libc::c_int,
}

/// In the keeper: starts the shell as posix_spawn does, a child that shares the memory and
/// runs until its `exec` while the keeper waits (`CLONE_VM | CLONE_VFORK`). The shell's
/// failure to start (its sandbox, its program) is the keeper's error.
fn start_shell(plan: &Plan) -> io::Result<libc::pid_t> {
    extern "C" fn run(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the keeper's `Shell`, alive while the keeper waits for this `exec`.
        let shell = unsafe { &mut *arg.cast::<Shell<'_>>() };
        // SAFETY: in the shell's child, which execs or exits next.
        let failed = unsafe { enter_and_exec(shell.plan) };
        shell.failed = failed.raw_os_error().unwrap_or(libc::EINVAL);
        127
    }
    let mut shell = Shell { plan, failed: 0 };
    let arg = (&mut shell as *mut Shell<'_>).cast::<libc::c_void>();
    // SAFETY: the shell's stack is the plan's, unused by anything else; `shell` lives on
    // this stack until the child has exec'd or exited (CLONE_VFORK returns only then).
    let pid = unsafe { raw::clone(libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD, plan.shell_stack, run, arg) }?;
    // SAFETY: the child wrote it before it ended, and is done with it.
    let failed = unsafe { std::ptr::read_volatile(&shell.failed) };
    if failed != 0 {
        let mut status = 0;
        let _ = raw::wait(pid, &mut status, 0);
        return Err(io::Error::from_raw_os_error(failed));
    }
    Ok(pid)
}

/// In the shell's child: its working folder, its own process group, the command's limits,
/// the sandbox, its descriptors, then the program. Returns only the error that stopped it.
///
/// SAFETY: only in the child of [`start_shell`].
unsafe fn enter_and_exec(plan: &Plan) -> io::Error {
    // SAFETY: system calls on this process alone, with values prepared by the runner.
    let entered = unsafe {
        (|| -> io::Result<()> {
            // No handler of the runner's may run here, in its memory, once the mask is
            // emptied below: every handled signal goes back to its default, as posix_spawn
            // does. The runner ignores SIGPIPE; a command gets the default (`yes | head`).
            // Other ignored signals stay ignored. A handler of zeroes is SIG_DFL.
            let default = [0usize; 4];
            for signal in 1..=64usize {
                let mut old = [0usize; 4];
                let read = raw::call(libc::SYS_rt_sigaction, &[signal, 0, old.as_mut_ptr() as usize, 8]);
                let handled = read.is_ok() && old[0] != libc::SIG_DFL && old[0] != libc::SIG_IGN;
                if handled || signal == libc::SIGPIPE as usize {
                    raw::call(libc::SYS_rt_sigaction, &[signal, default.as_ptr() as usize, 0, 8])?;
                }
            }
            // In an image's root, the working folder is the root's.
            plan.sandbox.enter_root()?;
            if let Some(cwd) = &plan.cwd {
                raw::call(libc::SYS_chdir, &[cwd.as_ptr() as usize])?;
            }
            raw::call(libc::SYS_setpgid, &[0, 0])?;
            if let Some(limit) = &plan.files_limit {
                let limit = limit as *const libc::rlimit as usize;
                raw::call(libc::SYS_prlimit64, &[0, libc::RLIMIT_NOFILE as usize, limit, 0])?;
            }
            plan.sandbox.enter()?;
            // Should the keeper die without killing the tree (the kernel's OOM killer ends
            // every process sharing the runner's memory at once), the shell dies with it.
            // Set after the change of user, which clears it.
            raw::call(libc::SYS_prctl, &[libc::PR_SET_PDEATHSIG as usize, libc::SIGKILL as usize])?;
            for (to, from) in plan.stdio.iter().enumerate() {
                raw::call(libc::SYS_dup3, &[*from as usize, to, 0])?;
            }
            if let Some(fd) = plan.pass {
                raw::call(libc::SYS_dup3, &[fd as usize, 3, 0])?;
            }
            // The keeper's mask blocks everything; the command starts with nothing blocked.
            let none = 0u64;
            raw::call(libc::SYS_rt_sigprocmask, &[libc::SIG_SETMASK as usize, &none as *const u64 as usize, 0, 8])?;
            let (program, argv, envp) = (plan.program.as_ptr(), plan.argv.argv.as_ptr(), plan.argv.envp.as_ptr());
            let mut ran = raw::call(libc::SYS_execve, &[program as usize, argv as usize, envp as usize]);
            // A program another process has open for writing cannot run (ETXTBSY). A copy
            // of the runner's descriptors held for an instant by another command's keeper
            // (cloned while the file was being written) is let go within milliseconds: tried
            // again for up to 100 ms before it is the command's error.
            for _ in 0..BUSY_TRIES {
                if !ran.as_ref().is_err_and(|e| e.raw_os_error() == Some(libc::ETXTBSY)) {
                    break;
                }
                let pause = libc::timespec { tv_sec: 0, tv_nsec: 1_000_000 };
                let _ = raw::call(libc::SYS_nanosleep, &[&pause as *const libc::timespec as usize, 0]);
                ran = raw::call(libc::SYS_execve, &[program as usize, argv as usize, envp as usize]);
            }
            if ran.as_ref().is_err_and(|e| e.raw_os_error() == Some(libc::ENOEXEC)) {
                raw::call(libc::SYS_execve, &[SHELL.as_ptr() as usize, plan.script.as_ptr() as usize, envp as usize])?;
            }
            ran.map(|_| ())
        })()
    };
    entered.err().unwrap_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The keeper's life: reap every child (orphans of the command are reparented to it),
/// report the shell's status when it exits, and exit when no child is left. When the
/// runner's lifeline ends (the runner died, however it died), it kills the command's whole
/// tree and exits, so that nothing outlives a runner killed outright. It waits for either
/// on a `signalfd` of SIGCHLD and the lifeline, signals all blocked.
fn keep(shell: libc::pid_t, report: RawFd, lifeline: RawFd) -> ! {
    // The shell's descriptors (other commands' pipes would stay open for as long as this
    // command lives if their copies were kept).
    close_all_but(&mut [report, lifeline]);
    let children: u64 = 1 << (libc::SIGCHLD - 1);
    // SAFETY: signalfd4 reads the mask given and makes a descriptor of this process.
    let signals = unsafe {
        raw::call(
            libc::SYS_signalfd4,
            &[usize::MAX, &children as *const u64 as usize, 8, (libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) as usize],
        )
    }
    .ok()
    .map(|fd| fd as RawFd);
    let mut report = Some(report);
    loop {
        loop {
            let mut status = 0;
            match raw::wait(-1, &mut status, libc::WNOHANG) {
                Ok(0) => break,
                Ok(pid) if pid == shell => {
                    if let Some(fd) = report.take() {
                        let _ = raw::write(fd, &status.to_ne_bytes());
                        raw::close(fd);
                    }
                }
                Ok(_) => {}
                // No child left.
                Err(_) => raw::exit(0),
            }
        }
        let mut fds = [
            libc::pollfd { fd: lifeline, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: signals.unwrap_or(-1), events: libc::POLLIN, revents: 0 },
        ];
        // Without a signalfd (a kernel without it), children are looked for every 50 ms.
        let every = libc::timespec { tv_sec: 0, tv_nsec: 50_000_000 };
        let timeout = if signals.is_some() { 0 } else { &every as *const libc::timespec as usize };
        // SAFETY: ppoll fills the `revents` of the descriptors given.
        let _ = unsafe { raw::call(libc::SYS_ppoll, &[fds.as_mut_ptr() as usize, fds.len(), timeout, 0, 8]) };
        if fds[0].revents != 0 {
            kill_tree_and_exit(shell);
        }
        if let Some(fd) = signals {
            let mut drained = [0u8; 1024];
            // SAFETY: read fills the buffer given.
            while unsafe { raw::call(libc::SYS_read, &[fd as usize, drained.as_mut_ptr() as usize, drained.len()]) }
                .is_ok_and(|n| n > 0)
            {}
        }
    }
}

/// In the keeper: kills the shell's process group, then every child the keeper has (what
/// escaped the group was reparented to it), until none is left; then exits.
fn kill_tree_and_exit(shell: libc::pid_t) -> ! {
    raw::kill(-shell, libc::SIGKILL);
    let mut buffer = [0u8; 64];
    // SAFETY: getpid takes nothing.
    let own = unsafe { raw::call(libc::SYS_getpid, &[]) }.unwrap_or(0) as u32;
    let path = children_path(own, &mut buffer);
    for _ in 0..1000 {
        let mut buf = [0u8; 4096];
        // SAFETY: a NUL-terminated path; the descriptor is closed below.
        let opened = unsafe {
            raw::call(
                libc::SYS_openat,
                &[libc::AT_FDCWD as usize, path.as_ptr() as usize, (libc::O_RDONLY | libc::O_CLOEXEC) as usize],
            )
        };
        let n = match opened {
            Ok(fd) => {
                // SAFETY: read fills the buffer given.
                let n = unsafe { raw::call(libc::SYS_read, &[fd, buf.as_mut_ptr() as usize, buf.len()]) };
                raw::close(fd as RawFd);
                n.unwrap_or(0)
            }
            Err(_) => 0,
        };
        let mut current: libc::pid_t = 0;
        for &b in buf.iter().take(n) {
            if b.is_ascii_digit() {
                current = current * 10 + libc::pid_t::from(b - b'0');
            } else if current > 0 {
                raw::kill(current, libc::SIGKILL);
                current = 0;
            }
        }
        // Reap what died; no child left means nothing is left to kill.
        let mut status = 0;
        while raw::wait(-1, &mut status, libc::WNOHANG).is_ok_and(|pid| pid > 0) {}
        if raw::wait(-1, &mut status, libc::WNOHANG).is_err() {
            raw::exit(0);
        }
        let pause = libc::timespec { tv_sec: 0, tv_nsec: 1_000_000 };
        // SAFETY: nanosleep reads the time given.
        let _ = unsafe { raw::call(libc::SYS_nanosleep, &[&pause as *const libc::timespec as usize, 0]) };
    }
    raw::exit(0)
}

/// `/proc/self/task/PID/children` (NUL-terminated) written into `buffer`, without leading
/// zeros, which procfs does not accept. It allocates nothing: the keeper runs it.
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

/// Closes every descriptor of this process but `kept` (which it sorts). Allocates nothing:
/// the keeper runs it.
fn close_all_but(kept: &mut [RawFd]) {
    kept.sort_unstable();
    let mut next = 0;
    for &fd in kept.iter() {
        close_from(next, fd);
        next = next.max(fd + 1);
    }
    close_from(next, libc::c_int::MAX);
}

/// Closes descriptors `first..last` (exclusive of `last`).
fn close_from(first: libc::c_int, last: libc::c_int) {
    if first >= last {
        return;
    }
    // SAFETY: closing descriptors of this process; close_range needs Linux 5.9.
    if unsafe { raw::call(libc::SYS_close_range, &[first as usize, (last - 1) as usize, 0]) }.is_ok() {
        return;
    }
    for fd in first..last.min(65_536) {
        raw::close(fd);
    }
}

/// The keeper, as the runner sees it: its pid, the command's pipes, and its end.
pub struct Keeper {
    pid: libc::pid_t,
    pub stdin: Option<ChildStdin>,
    pub stdout: Option<ChildStdout>,
    pub stderr: Option<ChildStderr>,
    /// A descriptor that becomes readable when the keeper ends (a pidfd), if the kernel
    /// has them; without one, the keeper is looked for every few milliseconds.
    ended: Option<AsyncFd<OwnedFd>>,
    /// Its status, once reaped.
    status: Option<ExitStatus>,
    /// What the keeper runs on, given back once it is reaped.
    stacks: Option<Stacks>,
}

impl Keeper {
    fn new(pid: libc::pid_t, stacks: Stacks) -> Keeper {
        // SAFETY: pidfd_open makes a descriptor of this process, owned from here on; the
        // keeper is not reaped yet, so its pid is its own.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        // SAFETY: as above.
        let ended = (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) });
        // Outside a runtime, registering would panic, and unwinding here would unmap the
        // stacks the keeper runs on: the keeper is then looked for by polling.
        let in_runtime = tokio::runtime::Handle::try_current().is_ok();
        // SAFETY: an owned descriptor, which stays open and the same while registered.
        let ended = ended
            .filter(|_| in_runtime)
            .and_then(|fd| unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.ok());
        Keeper { pid, stdin: None, stdout: None, stderr: None, ended, status: None, stacks: Some(stacks) }
    }

    /// The keeper's pid, until it is reaped.
    pub fn id(&self) -> Option<u32> {
        self.status.is_none().then_some(self.pid as u32)
    }

    /// Waits for the keeper to end (it ends once every process of the command has).
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.try_reap()? {
                return Ok(status);
            }
            match &self.ended {
                Some(ended) => ended.readable().await?.clear_ready(),
                None => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
            }
        }
    }

    /// Its status, reaping it if it has ended.
    fn try_reap(&mut self) -> io::Result<Option<ExitStatus>> {
        if let Some(status) = self.status {
            return Ok(Some(status));
        }
        let mut raw_status = 0;
        // SAFETY: waitpid on this process's own child, writing the status given.
        let reaped = unsafe { libc::waitpid(self.pid, &mut raw_status, libc::WNOHANG) };
        if reaped < 0 {
            return Err(io::Error::last_os_error());
        }
        if reaped == 0 {
            return Ok(None);
        }
        self.status = Some(ExitStatus::from_raw(raw_status));
        if let Some(stacks) = self.stacks.take() {
            SPARE.give_back(stacks);
        }
        Ok(self.status)
    }

    /// Waits for a keeper that is ending of itself (it failed to start the shell).
    fn reap_now(&mut self) {
        let mut raw_status = 0;
        // SAFETY: waitpid on this process's own child, writing the status given.
        if unsafe { libc::waitpid(self.pid, &mut raw_status, 0) } == self.pid {
            self.status = Some(ExitStatus::from_raw(raw_status));
            if let Some(stacks) = self.stacks.take() {
                SPARE.give_back(stacks);
            }
        }
    }
}

impl Drop for Keeper {
    /// A keeper not reaped yet (the tree, killed first, is dying) is reaped later, with its
    /// stacks, by the next command's start.
    fn drop(&mut self) {
        if matches!(self.try_reap(), Ok(None))
            && let Some(stacks) = self.stacks.take()
        {
            let mut orphans = ORPHANS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            orphans.push((self.pid, stacks));
        }
    }
}

/// Keepers dropped before they ended, and their stacks.
static ORPHANS: Mutex<Vec<(libc::pid_t, Stacks)>> = Mutex::new(Vec::new());

/// Reaps the keepers dropped earlier that have ended since, giving back their stacks.
fn reap_orphans() {
    let mut orphans = ORPHANS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if orphans.is_empty() {
        return;
    }
    let (running, ended): (Vec<_>, Vec<_>) = std::mem::take(&mut *orphans).into_iter().partition(|(pid, _)| {
        let mut status = 0;
        // SAFETY: waitpid on this process's own child.
        unsafe { libc::waitpid(*pid, &mut status, libc::WNOHANG) == 0 }
    });
    *orphans = running;
    drop(orphans);
    ended.into_iter().for_each(|(_, stacks)| SPARE.give_back(stacks));
}

impl Supervised {
    /// The shell's exit status, once it has exited; `None` when the keeper died first
    /// (the command killed it).
    pub async fn shell_status(&mut self) -> Option<ExitStatus> {
        let mut raw = [0u8; 4];
        self.status.read_exact(&mut raw).await.ok()?;
        Some(ExitStatus::from_raw(i32::from_ne_bytes(raw)))
    }

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
    use super::{Spare, children_path};
    use std::sync::Mutex;

    /// Regression: a missing working directory was reported as the program's absence.
    #[tokio::test]
    async fn a_missing_working_directory_is_named_not_the_program() {
        let gone = tempfile::tempdir().unwrap().path().join("gone");
        let mut command = tokio::process::Command::new("/bin/true");
        command.current_dir(&gone);
        let sandbox = super::Confinement::off("a test");
        let Err(e) = super::spawn(&command, super::Input::Null, &sandbox) else {
            panic!("started in a missing folder")
        };
        let message = e.to_string();
        assert!(message.contains(&format!("`{}` cannot be entered", gone.display())), "{message}");
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }

    /// Regression: a file another thread of the runner had open for writing while a command
    /// started (a verifier's script being copied, say) stayed open in that command's keeper
    /// until the shell's `exec`, and running the file then failed with ETXTBSY ("Text file
    /// busy"). Scripts are written and run on one thread while commands start on others.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_script_written_while_other_commands_start_runs() {
        let dir = tempfile::tempdir().unwrap();
        let sandbox = super::Confinement::off("a test");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let others: Vec<_> = (0..2)
            .map(|_| {
                let (sandbox, stop) = (sandbox.clone(), stop.clone());
                tokio::spawn(async move {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let command = tokio::process::Command::new("/bin/true");
                        let mut started = super::spawn(&command, super::Input::Null, &sandbox).unwrap();
                        let _ = started.keeper.wait().await;
                    }
                })
            })
            .collect();
        let mut busy = 0;
        for i in 0..1000 {
            let script = dir.path().join(format!("script-{i}.sh"));
            let written = std::fs::write(&script, "#!/bin/sh\nexit 0\n").and_then(|()| {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            });
            written.unwrap();
            let command = tokio::process::Command::new(&script);
            match super::spawn(&command, super::Input::Null, &sandbox) {
                Ok(mut started) => {
                    let _ = started.keeper.wait().await;
                }
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => busy += 1,
                Err(e) => panic!("{e}"),
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for other in others {
            other.await.unwrap();
        }
        assert_eq!(busy, 0, "{busy} of 1000 scripts were busy");
    }

    #[tokio::test]
    async fn a_program_that_cannot_start_is_the_spawns_error() {
        let command = tokio::process::Command::new("/nonexistent/program");
        let sandbox = super::Confinement::off("a test");
        let Err(e) = super::spawn(&command, super::Input::Null, &sandbox) else { panic!("a missing program started") };
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
            .env("ONLY", "this");
        let sandbox = super::Confinement::off("a test");
        use std::os::fd::AsRawFd;
        let mut started =
            super::spawn_passing(&command, super::Input::Null, &sandbox, Some(passed.as_raw_fd())).unwrap();
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

    /// Neither the keeper nor the shell's start copies the runner's memory: the keeper
    /// shares it (the kernel's `kcmp` says the same memory), and the shell, once it has
    /// exec'd, has its own.
    #[tokio::test]
    async fn the_keeper_shares_the_runners_memory_and_the_shell_has_its_own() {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        const KCMP_VM: usize = 1;
        let same_memory = |a: u32, b: u32| unsafe { libc::syscall(libc::SYS_kcmp, a, b, KCMP_VM, 0, 0) };
        let mut command = tokio::process::Command::new("sh");
        command.args(["-c", "echo $$; read -r line"]);
        let sandbox = super::Confinement::off("a test");
        let mut started = super::spawn(&command, super::Input::Piped, &sandbox).unwrap();
        let (own, keeper) = (std::process::id(), started.keeper.id().unwrap());
        let mut lines = tokio::io::BufReader::new(started.keeper.stdout.take().unwrap()).lines();
        let shell: u32 = lines.next_line().await.unwrap().unwrap().trim().parse().unwrap();
        assert_eq!(same_memory(own, keeper), 0, "the keeper has memory of its own");
        assert_ne!(same_memory(own, shell), 0, "the shell still shares the runner's memory");
        let mut stdin = started.keeper.stdin.take().unwrap();
        stdin.write_all(b"go\n").await.unwrap();
        assert_eq!(started.shell_status().await.and_then(|s| s.code()), Some(0));
        assert!(started.keeper.wait().await.unwrap().success());
        assert_eq!(started.keeper.id(), None, "a reaped keeper has no pid");
    }

    /// A root runner's sandboxed command changes user while it shares the runner's memory:
    /// the kernel must then mark that memory not dumpable, so that no other command of that
    /// user can trace the start before its `exec` (and, through it, the runner).
    #[tokio::test]
    async fn a_root_runners_memory_is_not_dumpable_once_a_command_changed_user_in_it() {
        let dir = tempfile::tempdir().unwrap();
        let mode = crate::SandboxMode::On;
        let root = unsafe { libc::geteuid() } == 0;
        let Ok(sandbox) = super::Confinement::prepare(&Default::default(), mode, &[dir.path()], &[]) else {
            assert!(!root || std::env::var_os("CI").is_none(), "the sandbox is missing on a root CI machine");
            return;
        };
        let mut command = tokio::process::Command::new("/bin/sh");
        command.args(["-c", "id -u"]).current_dir(dir.path());
        let mut started = super::spawn(&command, super::Input::Null, &sandbox).unwrap();
        use tokio::io::AsyncReadExt;
        let mut out = String::new();
        started.keeper.stdout.take().unwrap().read_to_string(&mut out).await.unwrap();
        assert_eq!(started.shell_status().await.and_then(|s| s.code()), Some(0));
        if root {
            assert_ne!(out.trim(), "0", "the command ran as root");
            // 0, or 2 where `fs.suid_dumpable` makes such processes dump for root alone.
            assert_ne!(unsafe { libc::prctl(libc::PR_GET_DUMPABLE) }, 1, "the runner is still dumpable");
        }
    }

    /// A program without a `#!` line is run by `/bin/sh`, with its arguments, as `execvp`
    /// runs it.
    #[tokio::test]
    async fn a_program_without_a_shebang_is_run_by_the_shell() {
        use std::os::unix::fs::PermissionsExt;
        use tokio::io::AsyncReadExt;
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("greet");
        std::fs::write(&script, "echo hello \"$1\"\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut command = tokio::process::Command::new(&script);
        command.arg("there");
        let sandbox = super::Confinement::off("a test");
        let mut started = super::spawn(&command, super::Input::Null, &sandbox).unwrap();
        let mut out = String::new();
        started.keeper.stdout.take().unwrap().read_to_string(&mut out).await.unwrap();
        assert_eq!(started.shell_status().await.and_then(|s| s.code()), Some(0));
        assert_eq!(out, "hello there\n");
    }

    #[test]
    fn stacks_given_back_are_reused_and_those_beyond_the_most_dropped() {
        let spare = Spare { stacks: Mutex::new(Vec::new()), most: 1 };
        let (first, second) = (spare.take().expect("a pair"), spare.take().expect("another"));
        assert_ne!(first.base, second.base);
        let kept = first.base;
        spare.give_back(first);
        spare.give_back(second);
        assert_eq!(spare.stacks.lock().expect("not poisoned").len(), 1, "the second is dropped, so unmapped");
        let again = spare.take().expect("the kept pair");
        assert_eq!(again.base, kept);
        assert_ne!(spare.take().expect("a new pair").base, kept, "none is left to reuse");
    }

    #[test]
    fn the_keepers_children_path_has_no_leading_zeros() {
        let mut buffer = [0u8; 64];
        assert_eq!(children_path(19800, &mut buffer), b"/proc/self/task/19800/children\0");
        assert_eq!(children_path(7, &mut buffer), b"/proc/self/task/7/children\0");
        assert_eq!(children_path(u32::MAX, &mut buffer), b"/proc/self/task/4294967295/children\0");
    }
}
