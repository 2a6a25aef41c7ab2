//! The `cli` kind: a command-line agent that owns its loop and its tools. Its one turn
//! starts the episode's model gateway, runs the command in the world's folder inside the
//! sandbox with the gateway as its only network, and answers with what the program printed
//! (or the file it names). Its model calls are the gateway's `model_call`s; its tool calls
//! are derived from that traffic (`gateway/trajectory.rs`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::{Agent, AgentFault, AgentKind, EpisodeBudget, Proposal, Turn};
use crate::config::template;
use crate::contract::{FINAL_TOOL, ToolCall};
use crate::gateway::{Ending, Gateway};
use crate::log::{Event, UnscoredCause};
use crate::model::LanguageModel;
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

/// Checks a suite's `agent:` for the `cli` kind: its `command` is given (and, when a path,
/// is there), and the other kinds do not use its keys. The field at fault, and why.
pub fn check_cli(
    kind: AgentKind,
    command: &[String],
    answer: bool,
    suite_dir: Option<&Path>,
) -> Result<(), (&'static str, String)> {
    if kind != AgentKind::Cli {
        if !command.is_empty() {
            return Err(("agent.command", format!("is for `kind: cli`, not `{}`", kind.name())));
        }
        if answer {
            return Err(("agent.answer", format!("is for `kind: cli`, not `{}`", kind.name())));
        }
        return Ok(());
    }
    let Some(program) = command.first() else {
        return Err((
            "agent.command",
            "a `cli` agent needs its command line, e.g. `[claude, -p, \"{{ input }}\"]`".into(),
        ));
    };
    if program.contains('/') && !template::is_template(program) {
        let path = suite_dir.unwrap_or(Path::new(".")).join(program.trim_start_matches("./"));
        if !path.is_file() {
            return Err(("agent.command", format!("`{program}` is not installed: no file {}", path.display())));
        }
    }
    Ok(())
}

/// Where the program runs: the world's folder, and how to confine it once the gateway's
/// port is known.
pub struct ProgramRoom {
    pub folder: PathBuf,
    pub tmp: PathBuf,
    /// The world's sandbox with TCP to this port alone.
    pub confine: Box<dyn Fn(u16) -> Result<Arc<Confinement>, String> + Send + Sync>,
}

pub struct CliAgent {
    pub model: Arc<dyn LanguageModel>,
    pub model_name: String,
    pub command: Vec<String>,
    pub answer: CliAnswer,
    /// The task's template values.
    pub context: Map<String, Value>,
    pub input: String,
    pub room: Option<ProgramRoom>,
    pub episode: Option<Arc<EpisodeBudget>>,
    ran: bool,
}

impl CliAgent {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        model: Arc<dyn LanguageModel>,
        model_name: String,
        command: Vec<String>,
        answer: CliAnswer,
        context: Map<String, Value>,
        input: String,
        room: Option<ProgramRoom>,
        episode: Option<Arc<EpisodeBudget>>,
    ) -> Self {
        CliAgent { model, model_name, command, answer, context, input, room, episode, ran: false }
    }
}

fn fault(cause: UnscoredCause, message: impl Into<String>) -> AgentFault {
    AgentFault { cause, message: message.into() }
}

/// Whether `program` can be started: a path that is a file, or a name on `SAFE_PATH`.
fn installed(program: &str, folder: &Path) -> bool {
    if program.contains('/') {
        return folder.join(program).is_file();
    }
    SAFE_PATH.split(':').any(|dir| Path::new(dir).join(program).is_file())
}

#[async_trait]
impl Agent for CliAgent {
    async fn propose(&mut self, turn: Turn<'_>) -> Result<Proposal, AgentFault> {
        if std::mem::replace(&mut self.ran, true) {
            return Ok(Proposal::default());
        }
        let (Some(room), Some(episode)) = (self.room.as_ref(), self.episode.clone()) else {
            return Err(fault(
                UnscoredCause::EnvironmentError,
                "a `cli` agent runs in a world with a folder (`environment: shell`)",
            ));
        };
        let gateway = Gateway {
            model: self.model.clone(),
            model_name: self.model_name.clone(),
            ledger: episode,
            recorder: turn.recorder.clone(),
            derive_trajectory: true,
        };
        let handle =
            gateway.start().await.map_err(|e| fault(UnscoredCause::EnvironmentError, format!("the gateway: {e}")))?;
        let context = handle.template_context(self.context.clone());
        let argv: Vec<String> = self
            .command
            .iter()
            .map(|word| template::render(word, &context))
            .collect::<Result<_, _>>()
            .map_err(|e| fault(UnscoredCause::ConfigurationError, format!("agent.command: {e}")))?;
        let program = argv.first().cloned().unwrap_or_default();
        if !installed(&program, &room.folder) {
            return Err(fault(
                UnscoredCause::ConfigurationError,
                format!("the `cli` agent's command `{program}` is not installed: not found on {SAFE_PATH}"),
            ));
        }
        let sandbox = (room.confine)(handle.port()).map_err(|e| fault(UnscoredCause::EnvironmentError, e))?;
        let mut command = tokio::process::Command::new(&program);
        command
            .args(&argv[1..])
            .env_clear()
            .envs(handle.env())
            .env("PATH", SAFE_PATH)
            .env("HOME", &room.tmp)
            .env("TMPDIR", &room.tmp)
            .current_dir(&room.folder)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = std::time::Instant::now();
        let mut running = process::spawn(&mut command, &sandbox)
            .map_err(|e| fault(UnscoredCause::EnvironmentError, format!("`{program}` did not start: {e}")))?;
        if let Some(mut stdin) = running.keeper.stdin.take() {
            use tokio::io::AsyncWriteExt;
            // A program that reads no input closes its end: that is no fault.
            let _ = stdin.write_all(self.input.as_bytes()).await;
        }
        let (Some(stdout), Some(stderr)) = (running.keeper.stdout.take(), running.keeper.stderr.take()) else {
            return Err(fault(UnscoredCause::EnvironmentError, "the program's output could not be read"));
        };
        let outputs = async {
            let (out, err) =
                tokio::join!(process::read_capped(stdout, OUTPUT_CAP), process::read_capped(stderr, OUTPUT_CAP));
            let status = running.shell_status().await;
            (out, err, status)
        };
        let (out, err, status) = tokio::select! {
            done = outputs => done,
            ending = handle.ended() => {
                handle.close();
                return match ending {
                    Ending::Fault(error) => Err(fault(error.cause, error.message)),
                    // The loop sees the limit the gateway refused past, and ends there.
                    Ending::Limit(_) => Ok(Proposal::default()),
                };
            }
        };
        handle.close();
        let stdout = out.map(|c| c.text()).unwrap_or_default();
        let stderr = err.map(|c| c.text()).unwrap_or_default();
        let tail_from = stderr.len().saturating_sub(STDERR_TAIL);
        let tail_from = (tail_from..stderr.len()).find(|&i| stderr.is_char_boundary(i)).unwrap_or(stderr.len());
        turn.recorder.emit(&Event::AgentExited {
            exit_code: status.and_then(|s| s.code()),
            wall_ms: started.elapsed().as_secs_f64() * 1e3,
            stderr_tail: stderr[tail_from..].to_owned(),
        });
        if let Some(Ending::Fault(error)) = handle.ending() {
            return Err(fault(error.cause, error.message));
        }
        let answer = match &self.answer {
            CliAnswer::Stdout => stdout.trim().to_owned(),
            CliAnswer::File(path) => {
                std::fs::read_to_string(room.folder.join(path)).unwrap_or_default().trim().to_owned()
            }
        };
        let call = ToolCall::new("c_final", FINAL_TOOL, json!({"answer": answer}));
        Ok(Proposal { calls: vec![call], ..Proposal::default() })
    }
}
