//! The `cli` kind: a command-line agent that owns its loop and its tools. Its one turn
//! starts the episode's model gateway, runs the command in the world's folder inside the
//! sandbox with the gateway as its only network, and answers with what the program printed
//! (or the file it names). Its model calls are the gateway's `model_call`s; its tool calls
//! are derived from that traffic (`gateway/trajectory.rs`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::agent::episode::{CallSteps, ProgramLedger};
use crate::agent::kinds::{AgentKind, AgentSettings};
use crate::agent::{Agent, AgentFault, AgentSetup, Lent, Proposal, Turn};
use crate::config::decode::ConfigError;
use crate::config::kind_keys::KindKeys;
use crate::config::template;
use crate::contract::{FINAL_TOOL, ToolCall};
use crate::gateway::{Gateway, GatewayEnd, GatewayHandle};
use crate::log::{Event, Outcome, ProgramEnd, Recorder, Termination, UnscoredCause};
use crate::model::{LanguageModel, RunOwn};
use crate::sandbox::Confinement;
use crate::sandbox::process::{self, SAFE_PATH};

/// What a program's standard output and error keep, each.
const OUTPUT_CAP: usize = 1 << 20;
/// What of its standard error the log keeps.
const STDERR_TAIL: usize = 4 << 10;

/// Where a `cli` agent's final answer is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum CliAnswer {
    Stdout,
    /// A file of the world's folder it wrote.
    File(String),
}

/// `kind: cli`: a command-line agent that owns its loop.
pub struct Cli;

/// What a suite's `agent:` says of a `cli` agent.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The program and its arguments, each word a template over the task's fields and
    /// `gateway` (`{{ input }}`, `{{ gateway.openai_base_url }}`).
    pub command: Vec<String>,
    /// Variables added to the program's otherwise clean environment.
    pub env: BTreeMap<String, String>,
    /// Where its final answer is, `stdout` (the default) or `{file: PATH}`.
    pub answer: CliAnswer,
    /// Commands run in the world, in order, before the agent starts.
    pub setup: Vec<String>,
    /// A host folder holding the program (an npm prefix, say): in a world in an image's
    /// root it is bound there, read only, at [`AGENT_DIR`], its `bin/` and itself first on
    /// `PATH`. A world on the host does not use it.
    pub install: Option<PathBuf>,
}

/// Where a `cli` agent's `install:` folder is in an image's root.
pub const AGENT_DIR: &str = "/opt/runner-agent";

impl AgentKind for Cli {
    fn name(&self) -> &'static str {
        "cli"
    }

    fn keys(&self) -> &'static [&'static str] {
        &["command", "env", "answer", "setup", "install"]
    }

    /// Its `command` is given (and, when a path, is there), and its answer file is a path
    /// inside the world's folder.
    fn decode(&self, keys: &KindKeys<'_>) -> Result<AgentSettings, ConfigError> {
        let command: Vec<String> = keys.decode("command")?.unwrap_or_default();
        let Some(program) = command.first() else {
            let message = "a `cli` agent needs its command line, e.g. `[claude, -p, \"{{ input }}\"]`";
            return Err(keys.error("command", message));
        };
        if program.contains('/') && !template::is_template(program) {
            let path = keys.folder().join(program.trim_start_matches("./"));
            if !path.is_file() {
                return Err(keys.error("command", format!("`{program}` is not installed: no file {}", path.display())));
            }
        }
        let answer = keys.decode("answer")?.unwrap_or(CliAnswer::Stdout);
        if let CliAnswer::File(path) = &answer
            && !crate::domain::is_relative_inside(path)
        {
            let why = format!(
                "`file: {path}` must be a path inside the world's folder, relative and without `..` (the answer is read from there)"
            );
            return Err(keys.error("answer", why));
        }
        let install = match keys.decode::<PathBuf>("install")? {
            Some(folder) => {
                let folder = keys.folder().join(folder);
                if !folder.is_dir() {
                    return Err(keys.error("install", format!("no folder {}", folder.display())));
                }
                Some(folder.canonicalize().map_err(|e| keys.error("install", format!("{}: {e}", folder.display())))?)
            }
            None => None,
        };
        Ok(AgentSettings::Cli(Settings {
            install,
            env: keys.decode("env")?.unwrap_or_default(),
            answer,
            setup: keys.decode("setup")?.unwrap_or_default(),
            command,
        }))
    }

    fn owns_its_tools(&self) -> bool {
        true
    }

    fn runs_in_the_world(&self) -> bool {
        true
    }

    fn build(&self, setup: AgentSetup<'_>, lent: Lent) -> Box<dyn Agent> {
        let program = match &setup.config.settings {
            AgentSettings::Cli(settings) => Some(ProgramParts {
                command: settings.command.clone(),
                answer: settings.answer.clone(),
                setup: settings.setup.clone(),
                env: settings.env.clone(),
                install: settings.install.clone(),
                context: setup.task.template_context(),
                input: setup.task.input.clone(),
                room: lent.room,
            }),
            _ => None,
        };
        Box::new(CliAgent::new(setup.model, setup.model_name, program))
    }
}

/// Where the program runs: the world's folder, and how to confine it once the gateway's
/// port is known.
pub struct ProgramRoom {
    /// The world's working folder, as the runner reaches it (the answer file is read there).
    pub folder: PathBuf,
    pub tmp: PathBuf,
    /// When the world is an image's root: the program runs in it.
    pub image: Option<RoomInImage>,
    /// The world's sandbox with TCP to this port alone.
    pub confine: Box<dyn Fn(u16) -> Result<Arc<Confinement>, String> + Send + Sync>,
}

/// A program agent's place in an image's root: the root's folder on the host (to find the
/// program in), and the working folder and variables the image's processes start with.
pub struct RoomInImage {
    pub root: PathBuf,
    pub workdir: PathBuf,
    pub env: BTreeMap<String, String>,
}

/// What a `cli` agent is built from besides the common parts.
pub struct ProgramParts {
    pub command: Vec<String>,
    pub answer: CliAnswer,
    /// Commands run in the world before the agent, each a template like `command`'s words.
    pub setup: Vec<String>,
    /// The suite's `agent.env`, added to the program's environment.
    pub env: BTreeMap<String, String>,
    /// The `install:` folder, bound at [`AGENT_DIR`] in an image's root.
    pub install: Option<PathBuf>,
    /// The task's template values, and its input (also the program's standard input).
    pub context: serde_json::Map<String, serde_json::Value>,
    pub input: String,
    pub room: Option<ProgramRoom>,
}

pub struct CliAgent {
    model: Arc<dyn LanguageModel>,
    model_name: String,
    /// `None` only when the episode gave it no program (a suite checks that it has one).
    program: Option<ProgramParts>,
    ran: bool,
    /// How its program ended, once it has.
    ended: Option<ProgramEnd>,
}

impl CliAgent {
    pub fn new(model: Arc<dyn LanguageModel>, model_name: String, program: Option<ProgramParts>) -> Self {
        CliAgent { model, model_name, program, ran: false, ended: None }
    }
}

fn fault(cause: UnscoredCause, message: impl Into<String>) -> AgentFault {
    AgentFault { cause, message: message.into() }
}

/// Whether `program` can be started: a path that is a file, or a name on `SAFE_PATH`.
/// Whether `program` is in the image's root (`root` on the host): a path from the working
/// folder `workdir`, or a name on `path`.
fn installed_in(program: &str, root: &Path, workdir: &Path, path: &str) -> bool {
    let in_root = |inside: &Path| root.join(inside.strip_prefix("/").unwrap_or(inside));
    if program.contains('/') {
        return in_root(&workdir.join(program)).is_file();
    }
    path.split(':').any(|dir| in_root(&Path::new(dir).join(program)).is_file())
}

fn installed(program: &str, folder: &Path) -> bool {
    if program.contains('/') {
        return folder.join(program).is_file();
    }
    process::find_program(program, SAFE_PATH).is_some()
}

#[async_trait]
impl Agent for CliAgent {
    async fn propose(&mut self, turn: Turn<'_>) -> Result<Proposal, AgentFault> {
        if std::mem::replace(&mut self.ran, true) {
            return Ok(Proposal::default());
        }
        let Some(program) = self.program.as_ref() else {
            return Err(fault(UnscoredCause::ConfigurationError, "a `cli` agent needs `agent.command`"));
        };
        let Some(room) = program.room.as_ref() else {
            return Err(fault(
                UnscoredCause::EnvironmentError,
                "a `cli` agent runs in a world with a folder (`environment: shell`), on the host or in runner's own \
                 image roots (not in the podman provider's containers)",
            ));
        };
        let gateway = Gateway {
            run_own: run_own(room),
            model: self.model.clone(),
            model_name: self.model_name.clone(),
            ledger: Arc::new(ProgramLedger::new(turn.episode.clone(), CallSteps::OwnLoop)),
            recorder: turn.recorder.clone(),
            derive_trajectory: true,
        };
        let handle =
            gateway.start().await.map_err(|e| fault(UnscoredCause::EnvironmentError, format!("the gateway: {e}")))?;
        let launch = Launch::new(program, room, &handle)?;
        if let Err(failed) = launch.setup().await {
            handle.close();
            return Err(failed);
        }
        // The task's input reaches the program once: in its command when the command says
        // `{{ input }}`, else on its standard input.
        let stdin = if program.command.iter().any(|word| names_input(word)) { "" } else { program.input.as_str() };
        let (ran, ending) = tokio::select! {
            done = launch.agent(stdin) => (done, None),
            ending = handle.ended() => (Err(String::new()), Some(ending)),
        };
        handle.close();
        match ending {
            Some(GatewayEnd::Fault(error)) => return Err(fault(error.cause, error.message)),
            // The loop sees the limit the gateway refused past, and ends there.
            Some(GatewayEnd::Limit(_)) => return Ok(Proposal::default()),
            None => {}
        }
        let name = &launch.name;
        let done = ran.map_err(|e| fault(UnscoredCause::EnvironmentError, not_started(name, launch.folder, &e)))?;
        self.ended = Some(exited(&done, turn.recorder));
        if let Some(GatewayEnd::Fault(error)) = handle.ending() {
            return Err(fault(error.cause, error.message));
        }
        let answer = match &program.answer {
            CliAnswer::Stdout => done.stdout.trim().to_owned(),
            CliAnswer::File(path) => read_answer(&room.folder, path).trim().to_owned(),
        };
        let call = ToolCall::new("c_final", FINAL_TOOL, json!({"answer": answer}));
        Ok(Proposal { calls: vec![call], ..Proposal::default() })
    }

    async fn finish(&mut self, _: Termination, _: &Outcome, _: &Recorder) -> Option<ProgramEnd> {
        self.ended.take()
    }
}

/// Why a program did not start, and, when the sandbox would not let it be read or run, what
/// to add to the environment file.
fn not_started(name: &str, folder: &Path, error: &str) -> String {
    if !error.contains("os error 13") {
        return format!("`{name}` did not start: {error}");
    }
    let found = if name.contains('/') { Some(folder.join(name)) } else { process::find_program(name, SAFE_PATH) };
    let real = found.as_ref().and_then(|p| p.canonicalize().ok()).or(found);
    let holder = real.as_ref().and_then(|p| p.parent()).map(|p| p.display().to_string());
    let holder = holder.unwrap_or_else(|| "its folder".to_owned());
    let shown = real.map_or_else(|| name.to_owned(), |p| p.display().to_string());
    format!(
        "`{name}` did not start: the sandbox may not read or run {shown} ({error}); let it: add its folder to the \
         environment file's `sandbox: {{read_paths: [{holder}]}}` (for an npm package, its `node_modules`; for a \
         Python virtual environment, the environment's folder)"
    )
}

/// Whether a command word puts the task's input in the command line (`{{ input }}`).
fn names_input(word: &str) -> bool {
    let compact: String = word.chars().filter(|c| !c.is_whitespace()).collect();
    compact.contains("{{input}}") || compact.contains("{{input|")
}

/// What a program's requests carry that is this episode's own: its folder (as given and as
/// the kernel resolves it, and as Claude Code names a project, `/` turned `-`) and its
/// scratch folder (the program's home and temporary folder).
fn run_own(room: &ProgramRoom) -> RunOwn {
    let mut own = RunOwn::default();
    let mut folders = vec![room.folder.clone()];
    folders.extend(room.folder.canonicalize().ok());
    for folder in &folders {
        let folder = folder.to_string_lossy();
        own.add(&folder, "folder");
        let dashed: String = folder.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
        own.add(&dashed, "folder-dashed");
    }
    let mut scratch = vec![room.tmp.clone()];
    scratch.extend(room.tmp.canonicalize().ok());
    for tmp in &scratch {
        own.add(&tmp.to_string_lossy(), "scratch");
    }
    own.with_volatile_reports()
}

/// A `cli` agent's program, ready to start once its gateway runs: its command line and setup
/// rendered over the task's fields and the gateway's, its environment, its sandbox.
struct Launch<'a> {
    /// The program, the command line's first word.
    name: String,
    argv: Vec<String>,
    setup: Vec<String>,
    environment: Vec<(String, String)>,
    /// Where it starts, as it names that folder.
    folder: &'a Path,
    sandbox: Arc<Confinement>,
}

impl<'a> Launch<'a> {
    fn new(program: &ProgramParts, room: &'a ProgramRoom, handle: &GatewayHandle) -> Result<Self, AgentFault> {
        let context = handle.template_context(program.context.clone());
        let render = |words: &[String], field: &str| -> Result<Vec<String>, AgentFault> {
            words
                .iter()
                .map(|word| template::render(word, &context))
                .collect::<Result<_, _>>()
                .map_err(|e| fault(UnscoredCause::ConfigurationError, format!("{field}: {e}")))
        };
        let argv = render(&program.command, "agent.command")?;
        let setup = render(&program.setup, "agent.setup")?;
        let name = argv.first().cloned().unwrap_or_default();
        let (path, home, tmp, folder) = match &room.image {
            Some(image) => {
                let image_path = image.env.get("PATH").map_or(SAFE_PATH, String::as_str);
                let path = match &program.install {
                    Some(_) => format!("{AGENT_DIR}/bin:{AGENT_DIR}:{image_path}"),
                    None => image_path.to_owned(),
                };
                let home = image.env.get("HOME").cloned().unwrap_or_else(|| "/".into());
                (path, home, "/tmp".to_owned(), image.workdir.as_path())
            }
            None => {
                let tmp = room.tmp.to_string_lossy().into_owned();
                (SAFE_PATH.to_owned(), tmp.clone(), tmp, room.folder.as_path())
            }
        };
        let found = match &room.image {
            Some(image) => installed_in(&name, &image.root, folder, &path),
            None => installed(&name, &room.folder),
        };
        if !found {
            return Err(fault(
                UnscoredCause::ConfigurationError,
                format!("the `cli` agent's command `{name}` is not installed: not found on {path}"),
            ));
        }
        let sandbox = (room.confine)(handle.port()).map_err(|e| fault(UnscoredCause::EnvironmentError, e))?;
        let image_env =
            room.image.iter().flat_map(|i| i.env.iter()).filter(|(k, _)| !["PATH", "HOME"].contains(&k.as_str()));
        let environment: Vec<(String, String)> = image_env
            .map(|(k, v)| (k.clone(), v.clone()))
            .chain(handle.env())
            .chain([("PATH".to_owned(), path), ("HOME".to_owned(), home), ("TMPDIR".to_owned(), tmp)])
            .chain(program.env.iter().map(|(k, v)| (k.clone(), v.clone())))
            .collect();
        Ok(Launch { name, argv, setup, environment, folder, sandbox })
    }

    fn command(&self, program: &str, args: &[String]) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(program);
        command.args(args).env_clear().envs(self.environment.iter().map(|(k, v)| (k, v))).current_dir(self.folder);
        command
    }

    /// Runs the setup commands in order; the first that does not exit 0 is the fault.
    async fn setup(&self) -> Result<(), AgentFault> {
        for line in &self.setup {
            let command = self.command("/bin/sh", &["-c".to_owned(), line.clone()]);
            let (code, output) = match run(&command, &self.sandbox, "").await {
                Ok(done) => (done.status.and_then(|s| s.code()), done.stdout + &done.stderr),
                Err(e) => (None, e),
            };
            if code != Some(0) {
                let how = code.map_or("did not finish".to_owned(), |c| format!("exited {c}"));
                return Err(fault(
                    UnscoredCause::EnvironmentError,
                    format!("the `cli` agent's setup command `{line}` {how}: {}", tail(&output, 600)),
                ));
            }
        }
        Ok(())
    }

    /// Runs the agent's program, `input` on its standard input, until it exits.
    async fn agent(&self, input: &str) -> Result<Finished, String> {
        run(&self.command(&self.name, &self.argv[1..]), &self.sandbox, input).await
    }
}

/// How a program ended, logged as `agent_exited` and kept for `episode_finished`.
fn exited(done: &Finished, recorder: &Recorder) -> ProgramEnd {
    let (exit_code, wall_ms, stderr_tail) =
        (done.status.and_then(|s| s.code()), done.wall.as_secs_f64() * 1e3, tail(&done.stderr, STDERR_TAIL));
    let exit = match (exit_code, done.status.and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s))) {
        (Some(code), _) => Some(format!("exit code {code}")),
        (None, Some(signal)) => Some(format!("killed by signal {signal}")),
        (None, None) => None,
    };
    recorder.emit(&Event::AgentExited { exit_code, wall_ms, stderr_tail: stderr_tail.clone() });
    ProgramEnd { exit, wall_ms: Some(wall_ms), stderr_tail }
}

/// What a program left: its exit status (`None` when killed by a signal or lost), how long
/// it ran, and its standard output and error, each read up to [`OUTPUT_CAP`] with a marker
/// where cut.
struct Finished {
    status: Option<std::process::ExitStatus>,
    wall: std::time::Duration,
    stdout: String,
    stderr: String,
}

/// How long a program's output is still read once it has exited: a child it left running
/// holds the pipes open, and may be finishing a write. Then the rest of the tree is killed.
const PIPE_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Runs `command` in the sandbox under a keeper, `input` on its standard input, until the
/// program exits: not until its output closes, which a child left running (`daemon &`) would
/// put off to the episode's end, and the answer with it. What it left running is killed
/// after [`PIPE_GRACE`]; the whole tree also dies when this future is dropped.
async fn run(command: &tokio::process::Command, sandbox: &Arc<Confinement>, input: &str) -> Result<Finished, String> {
    let started = std::time::Instant::now();
    let mut running = process::spawn(command, process::Input::Piped, sandbox).map_err(|e| e.to_string())?;
    let stdin = running.keeper.stdin.take();
    // Written while the output is read: a program that prints before it reads its input
    // (or never reads it) must not leave both sides waiting on full pipes.
    let feed = async move {
        if let Some(mut stdin) = stdin {
            use tokio::io::AsyncWriteExt;
            // A program that reads no input closes its end: that is no fault.
            let _ = stdin.write_all(input.as_bytes()).await;
        }
    };
    let (Some(stdout), Some(stderr)) = (running.keeper.stdout.take(), running.keeper.stderr.take()) else {
        return Err("the program's output could not be read".into());
    };
    let reading = async {
        let ((), out, err) =
            tokio::join!(feed, process::read_capped(stdout, OUTPUT_CAP), process::read_capped(stderr, OUTPUT_CAP));
        (out, err)
    };
    tokio::pin!(reading);
    let (status, read) = tokio::select! {
        status = running.shell_status() => (status, None),
        read = &mut reading => (running.shell_status().await, Some(read)),
    };
    let wall = started.elapsed();
    let (out, err) = match read {
        Some(read) => read,
        None => match tokio::time::timeout(PIPE_GRACE, &mut reading).await {
            Ok(read) => read,
            Err(_) => {
                running.tree.kill();
                // Killed, the writers are gone: the pipes end at once.
                tokio::time::timeout(PIPE_GRACE, &mut reading).await.unwrap_or_else(|_| {
                    let lost = || Err(std::io::Error::other("the output was still open after the program was killed"));
                    (lost(), lost())
                })
            }
        },
    };
    running.tree.kill();
    let _ = running.keeper.wait().await;
    Ok(Finished {
        status,
        wall,
        stdout: out.map(|c| c.text()).unwrap_or_default(),
        stderr: err.map(|c| c.text()).unwrap_or_default(),
    })
}

/// The last `bytes` of `text`, cut at a character boundary.
fn tail(text: &str, bytes: usize) -> String {
    let from = text.len().saturating_sub(bytes);
    let from = (from..text.len()).find(|&i| text.is_char_boundary(i)).unwrap_or(text.len());
    text[from..].to_owned()
}

/// The answer file a program named, read only when it is a regular file inside its
/// folder (the program has ended: nothing moves under this read); empty otherwise.
fn read_answer(folder: &Path, path: &str) -> String {
    let (Ok(root), Ok(file)) = (folder.canonicalize(), folder.join(path).canonicalize()) else {
        return String::new();
    };
    if !file.starts_with(&root) || !file.is_file() {
        return String::new();
    }
    use std::io::Read;
    let mut text = String::new();
    let read = std::fs::File::open(&file).map(|f| f.take(OUTPUT_CAP as u64).read_to_string(&mut text));
    match read {
        Ok(Ok(_)) => text,
        _ => String::new(),
    }
}
