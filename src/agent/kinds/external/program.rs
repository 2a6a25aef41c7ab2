//! The program behind an external agent: its command as the suite gives it (checked at
//! load), its environment, and its running processes — one per episode, or (`reuse: true`)
//! a pool of idle ones that episodes check out and give back.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{ChildStdin, Command};
use tokio::sync::mpsc;

use super::protocol::FromAgent;
use crate::sandbox::Confinement;
use crate::sandbox::process::{self, SAFE_PATH, Supervised, find_program};

/// The longest line the program may write on stdout; a longer one is cut and a violation.
pub const MAX_LINE: usize = 1 << 20;
/// How much of the program's stderr is kept: its last bytes.
pub const STDERR_TAIL: usize = 4096;
/// How long a program has to exit once its stdin is closed after `end`.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// An external agent's program as a suite gives it.
pub struct Program {
    /// The command as written.
    pub command: Vec<String>,
    /// Extra environment variables, as written.
    pub env: BTreeMap<String, String>,
    pub reuse: bool,
    /// Where it runs, and what its relative paths are relative to: the suite file's folder.
    pub folder: PathBuf,
    /// Where the suite names it (`tasks/x.yaml:7:12`), for the errors of a run.
    pub at: String,
    /// With `reuse`, the processes no episode is using now.
    idle: Mutex<Vec<Process>>,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program").field("command", &self.command).field("reuse", &self.reuse).finish_non_exhaustive()
    }
}

impl Program {
    /// The program of a suite in `folder`, named at `at`. A command that is a path (it
    /// holds a `/`) must be an executable file now; a bare name is looked up on its `PATH`
    /// when an episode starts it.
    pub fn new(
        command: Vec<String>,
        env: BTreeMap<String, String>,
        reuse: bool,
        folder: &Path,
        at: String,
    ) -> Result<Program, String> {
        let Some(first) = command.first() else {
            return Err("the command is empty: give the program and its arguments, `[python3, agent.py]`".into());
        };
        if first.trim().is_empty() {
            return Err("the program's name is empty".into());
        }
        if first.contains('/') {
            let path = folder.join(first);
            executable(&path).map_err(|why| format!("`{first}` {why} (read from {})", folder.display()))?;
        }
        for key in env.keys() {
            if key.is_empty() || key.contains(['=', '\0']) {
                return Err(format!("env: `{key}` is not a variable name"));
            }
        }
        Ok(Program { command, env, reuse, folder: folder.to_owned(), at, idle: Mutex::new(Vec::new()) })
    }

    /// The environment the program gets: nothing of runner's own but `PATH` (the system's
    /// programs, unless `env:` sets it), `HOME` and `LANG`, then the suite's `env:`, then
    /// `extra` (the model gateway's variables, for instance).
    pub fn environment(&self, extra: &[(String, String)]) -> BTreeMap<String, String> {
        let mut vars = BTreeMap::from([("PATH".to_owned(), SAFE_PATH.to_owned())]);
        for name in ["HOME", "LANG"] {
            if let Ok(value) = std::env::var(name) {
                vars.insert(name.to_owned(), value);
            }
        }
        vars.extend(self.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        vars.extend(extra.iter().cloned());
        vars
    }

    /// A process for one episode: an idle one when the program is reused (and one is
    /// idle), else a new one.
    pub fn checkout(&self, extra: &[(String, String)]) -> Result<Process, String> {
        if self.reuse {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            while let Some(mut process) = idle.pop() {
                if process.is_usable() {
                    process.stderr.lock().unwrap_or_else(|p| p.into_inner()).clear();
                    return Ok(process);
                }
            }
        }
        self.spawn(extra)
    }

    /// Gives a process back after its episode: kept for the next one when the program is
    /// reused and the process is in a state to go on (`None`), else handed back to be closed.
    pub fn give_back(&self, mut process: Process) -> Option<Process> {
        if self.reuse && process.is_usable() {
            self.idle.lock().unwrap_or_else(|p| p.into_inner()).push(process);
            return None;
        }
        Some(process)
    }

    fn spawn(&self, extra: &[(String, String)]) -> Result<Process, String> {
        let vars = self.environment(extra);
        let first = &self.command[0];
        let program = if first.contains('/') {
            let path = self.folder.join(first);
            executable(&path).map_err(|why| format!("`{first}` {why} now (read from {})", self.folder.display()))?;
            path
        } else {
            let path_var = vars.get("PATH").map(String::as_str).unwrap_or(SAFE_PATH);
            find_program(first, path_var).ok_or_else(|| {
                format!("the program `{first}` is not on its PATH ({path_var}); set `PATH` in `env:` or give a path")
            })?
        };
        let mut command = Command::new(&program);
        command.args(&self.command[1..]).current_dir(&self.folder).env_clear().envs(&vars);
        // The program is the user's own policy, not part of the world: it runs as runner does.
        let unconfined = Confinement::off("the external agent kind");
        let mut supervised = process::spawn(&command, process::Input::Piped, &unconfined)
            .map_err(|e| format!("failed to start `{}`: {e}", program.display()))?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (supervised.keeper.stdin.take(), supervised.keeper.stdout.take(), supervised.keeper.stderr.take())
        else {
            return Err(format!("`{first}`: its pipes were not set up"));
        };
        let (sender, incoming) = mpsc::channel(64);
        tokio::spawn(read_messages(stdout, sender));
        let tail = Arc::new(Mutex::new(Tail::default()));
        let (read_to_end, stderr_read) = tokio::sync::watch::channel(false);
        tokio::spawn(keep_tail(stderr, tail.clone(), read_to_end));
        // The program is the keeper's one child: the keeper forked it before `spawn` returned.
        let keeper = supervised.keeper.id().unwrap_or_default();
        let children = std::fs::read_to_string(format!("/proc/{keeper}/task/{keeper}/children")).unwrap_or_default();
        let pid = children.split_whitespace().next().and_then(|p| p.parse().ok()).unwrap_or(keeper);
        let stdin = Some(stdin);
        Ok(Process {
            supervised,
            pid,
            stdin,
            incoming,
            stderr: tail,
            stderr_read,
            in_turn: false,
            closed: false,
            exit: None,
        })
    }
}

/// Why `path` cannot be run, if it cannot.
fn executable(path: &Path) -> Result<(), &'static str> {
    match std::fs::metadata(path) {
        Err(_) => Err("does not exist"),
        Ok(meta) if !meta.is_file() => Err("is not a file"),
        Ok(meta) if meta.permissions().mode() & 0o111 == 0 => Err("is not executable"),
        Ok(_) => Ok(()),
    }
}

/// What the program wrote on stdout, one line at a time.
#[derive(Debug)]
pub enum Incoming {
    Message(FromAgent),
    /// A line that breaks the protocol, and how.
    Violation(String),
    /// Its stdout closed: it exited (or closed it).
    Closed,
}

/// Reads the program's stdout line by line, each line capped at [`MAX_LINE`]. A longer
/// line is a violation as soon as it passes the cap; nothing after it is read.
async fn read_messages(stdout: tokio::process::ChildStdout, sender: mpsc::Sender<Incoming>) {
    let mut reader = BufReader::with_capacity(64 * 1024, stdout);
    let mut line = Vec::new();
    loop {
        line.clear();
        let ended = loop {
            let buf = match reader.fill_buf().await {
                Ok([]) => break true,
                Ok(buf) => buf,
                Err(_) => break true,
            };
            let newline = buf.iter().position(|b| *b == b'\n');
            let part = &buf[..newline.unwrap_or(buf.len())];
            if line.len() + part.len() > MAX_LINE {
                let cut = format!("a line on stdout longer than the cap of {MAX_LINE} bytes [cut]");
                let _ = sender.send(Incoming::Violation(cut)).await;
                return;
            }
            line.extend_from_slice(part);
            match newline {
                Some(i) => {
                    reader.consume(i + 1);
                    break false;
                }
                None => {
                    let read = buf.len();
                    reader.consume(read);
                }
            }
        };
        let incoming = if line.iter().all(u8::is_ascii_whitespace) {
            None
        } else {
            Some(FromAgent::parse(&line).map_or_else(Incoming::Violation, Incoming::Message))
        };
        if let Some(incoming) = incoming
            && sender.send(incoming).await.is_err()
        {
            return;
        }
        if ended {
            let _ = sender.send(Incoming::Closed).await;
            return;
        }
    }
}

/// The last [`STDERR_TAIL`] bytes the program wrote on stderr, and how many came before.
#[derive(Default)]
pub struct Tail {
    bytes: std::collections::VecDeque<u8>,
    cut: u64,
}

impl Tail {
    fn push(&mut self, data: &[u8]) {
        self.bytes.extend(data);
        let over = self.bytes.len().saturating_sub(STDERR_TAIL);
        self.bytes.drain(..over);
        self.cut += over as u64;
    }

    fn clear(&mut self) {
        *self = Tail::default();
    }

    /// The tail as text, with a marker when earlier bytes were cut.
    pub fn text(&self) -> String {
        let (a, b) = self.bytes.as_slices();
        let text = String::from_utf8_lossy(&[a, b].concat()).into_owned();
        if self.cut > 0 { format!("[… {} earlier bytes cut]{text}", self.cut) } else { text }
    }
}

async fn keep_tail(
    mut stderr: tokio::process::ChildStderr,
    tail: Arc<Mutex<Tail>>,
    read_to_end: tokio::sync::watch::Sender<bool>,
) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = stderr.read(&mut buf).await {
        if n == 0 {
            break;
        }
        tail.lock().unwrap_or_else(|p| p.into_inner()).push(&buf[..n]);
    }
    let _ = read_to_end.send(true);
}

/// One running process of the program.
pub struct Process {
    /// Killed, with everything it started, when the process is dropped.
    supervised: Supervised,
    /// The program's pid (its keeper's, should it not be known).
    pub pid: u32,
    stdin: Option<ChildStdin>,
    pub incoming: mpsc::Receiver<Incoming>,
    stderr: Arc<Mutex<Tail>>,
    /// Becomes true once its stderr is read to the end.
    stderr_read: tokio::sync::watch::Receiver<bool>,
    /// Between sending `observations` and reading the `actions` reply: a turn cut off
    /// here (by the deadline) leaves the process in no state to go on.
    pub in_turn: bool,
    /// Its stdout closed, or it broke the protocol.
    pub closed: bool,
    /// How it exited, once known.
    exit: Option<String>,
}

impl Process {
    fn is_usable(&mut self) -> bool {
        if self.in_turn || self.closed || self.stdin.is_none() {
            return false;
        }
        // Anything it said between episodes is out of turn: the process is not trusted again.
        !matches!(self.incoming.try_recv(), Ok(_) | Err(mpsc::error::TryRecvError::Disconnected))
    }

    /// Writes one line to its stdin.
    pub async fn send(&mut self, line: &[u8]) -> std::io::Result<()> {
        let stdin = self.stdin.as_mut().ok_or_else(|| std::io::Error::from(std::io::ErrorKind::BrokenPipe))?;
        stdin.write_all(line).await?;
        stdin.flush().await
    }

    pub fn stderr_tail(&self) -> String {
        self.stderr.lock().unwrap_or_else(|p| p.into_inner()).text()
    }

    /// How it exited, if it has, waiting up to `wait` for it.
    pub async fn exit_status(&mut self, wait: Duration) -> Option<String> {
        // The keeper reports the status once.
        if self.exit.is_none() {
            let status = tokio::time::timeout(wait, self.supervised.shell_status()).await.ok().flatten()?;
            self.exit = Some(describe(status));
        }
        self.exit.clone()
    }

    /// Closes its stdin, gives it [`EXIT_GRACE`] to exit, then kills what is left; how it
    /// exited (`None` when it had to be killed).
    pub async fn close(&mut self) -> Option<String> {
        self.stdin = None;
        let exit = self.exit_status(EXIT_GRACE).await;
        self.supervised.tree.kill();
        // Its last words on stderr, when it wrote them as it went.
        let _ = tokio::time::timeout(Duration::from_millis(200), self.stderr_read.wait_for(|done| *done)).await;
        exit
    }
}

fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => "exited".into(),
    }
}

/// Reads the next line of the program, waiting up to `wait`; `None` when it said nothing
/// in that time.
pub async fn next_incoming(process: &mut Process, wait: Duration) -> Option<Incoming> {
    match tokio::time::timeout(wait, process.incoming.recv()).await {
        Ok(Some(incoming)) => Some(incoming),
        Ok(None) => Some(Incoming::Closed),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stderr_tail_keeps_the_last_bytes_and_says_how_many_were_cut() {
        let mut tail = Tail::default();
        tail.push(&vec![b'a'; STDERR_TAIL]);
        tail.push(b"end");
        let text = tail.text();
        assert!(text.starts_with("[… 3 earlier bytes cut]") && text.ends_with("aend"), "{}", &text[..40]);
    }

    #[test]
    fn a_path_command_must_be_an_executable_file() {
        let dir = std::env::temp_dir();
        let at = "s.yaml:1:1".to_owned();
        let missing = Program::new(vec!["./no-such-agent".into()], BTreeMap::new(), false, &dir, at.clone());
        assert!(missing.unwrap_err().contains("does not exist"));
        let empty = Program::new(Vec::new(), BTreeMap::new(), false, &dir, at.clone());
        assert!(empty.unwrap_err().contains("empty"));
        // A bare name is looked up when an episode starts it.
        assert!(Program::new(vec!["no-such-program".into()], BTreeMap::new(), false, &dir, at).is_ok());
        assert_eq!(find_program("sh", SAFE_PATH).map(|p| p.is_absolute()), Some(true));
        assert_eq!(find_program("no-such-program", SAFE_PATH), None);
    }
}
