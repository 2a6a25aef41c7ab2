//! The `external` agent kind: a program as the policy. It speaks the external agent
//! protocol (`protocol.rs`, `DESIGN.md`) on its stdin and stdout; the environment keeps
//! the loop, the tools and the log. Each turn sends the observations and reads one
//! `actions` reply; whatever breaks the protocol ends the episode as the agent's failure
//! (`agent_error`, scored), a `fault` makes it unscored with the program's cause.

mod program;
mod protocol;

pub use program::{MAX_LINE, Program, STDERR_TAIL};

/// What an `agent_log` event keeps of a `log` message: the program chooses its length (up
/// to a whole line), and the episode's log is not its to fill.
pub const LOG_MESSAGE_BYTES: usize = 4 << 10;

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::agent::episode::{CallSteps, ProgramLedger};
use crate::agent::kinds::{AgentKind, AgentSettings};
use crate::agent::{Agent, AgentFault, AgentSetup, Lent, Proposal, Turn};
use crate::config::decode::ConfigError;
use crate::config::kind_keys::KindKeys;
use crate::config::yaml;
use crate::contract::fit::fit_text;
use crate::contract::{FINAL_TOOL, ToolCall};
use crate::gateway::{Gateway, GatewayEnd, GatewayHandle};
use crate::log::{Event, Outcome, ProgramEnd, Recorder, Termination, UnscoredCause, Usage};
use crate::model::LanguageModel;
use program::{Incoming, Process, next_incoming};
use protocol::{FromAgent, PROTOCOL_VERSION, StartLimits, ToAgent, TurnBudget};

/// `kind: external`: a program proposes the calls.
pub struct External;

/// What a suite's `agent:` says of an external agent: its program, checked.
#[derive(Debug, Clone)]
pub struct Settings {
    pub program: Arc<Program>,
}

impl AgentKind for External {
    fn name(&self) -> &'static str {
        "external"
    }

    fn keys(&self) -> &'static [&'static str] {
        &["command", "env", "reuse"]
    }

    /// The program, checked: it runs in the suite file's folder, with the suite's `env:`
    /// added to its otherwise clean environment; with `reuse`, one process serves many
    /// episodes, one after another (a `start` each).
    fn decode(&self, keys: &KindKeys<'_>) -> Result<AgentSettings, ConfigError> {
        let Some(command) = keys.decode::<Vec<String>>("command")? else {
            return Err(keys.source.error(&keys.at, "an external agent needs `command: [program, args…]`"));
        };
        let env = keys.decode("env")?.unwrap_or_default();
        let reuse = keys.decode("reuse")?.unwrap_or(false);
        // The program itself, where the suite names it.
        let first = yaml::item(&keys.path_of("command"), 0);
        let position = keys.source.locations.find(&first);
        let at = format!("{}:{}:{}", keys.path.display(), position.line, position.column);
        let folder = keys.path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
        let field = if command.is_empty() { keys.path_of("command") } else { first };
        let program = Program::new(command, env, reuse, folder, at).map_err(|e| keys.source.error(&field, e))?;
        Ok(AgentSettings::External(Settings { program: Arc::new(program) }))
    }

    fn build(&self, setup: AgentSetup<'_>, _lent: Lent) -> Box<dyn Agent> {
        let AgentSettings::External(settings) = &setup.config.settings else {
            return Box::new(NoProgram);
        };
        let task = &setup.task;
        let parts = ExternalParts {
            program: settings.program.clone(),
            episode_id: setup.episode_id.to_owned(),
            task: json!({"id": task.id, "input": task.input, "metadata": task.full_metadata()}),
        };
        Box::new(ExternalAgent::new(parts, setup.system, (setup.model, setup.model_name)))
    }
}

/// What an episode tells its external agent about itself in `start`.
pub struct ExternalParts {
    pub program: Arc<Program>,
    pub episode_id: String,
    /// `{id, input, metadata}` of the task.
    pub task: Value,
}

/// One episode's external agent: the program's process (started, or checked out of the
/// pool, at the first turn) and what the protocol needs to remember.
pub struct ExternalAgent {
    parts: ExternalParts,
    system: Option<String>,
    /// The episode's model and its name, which the program reaches through its gateway.
    model: (Arc<dyn LanguageModel>, String),
    /// The episode's model gateway, started with the process.
    gateway: Option<GatewayHandle>,
    process: Option<Process>,
    /// Set once the process is lost to the episode (it could not start, or broke the
    /// protocol): later turns fail at once.
    broken: Option<String>,
    /// The call ids of the episode so far: each must be new.
    call_ids: HashSet<String>,
}

impl ExternalAgent {
    pub fn new(parts: ExternalParts, system: Option<String>, model: (Arc<dyn LanguageModel>, String)) -> Self {
        ExternalAgent { parts, system, model, gateway: None, process: None, broken: None, call_ids: HashSet::new() }
    }

    /// The episode's gateway, started at the first turn: its model calls are the episode's.
    async fn gateway(&mut self, turn: &Turn<'_>) -> Result<GatewayHandle, String> {
        if let Some(gateway) = self.gateway.take() {
            return Ok(gateway);
        }
        let gateway = Gateway {
            run_own: Default::default(),
            model: self.model.0.clone(),
            model_name: self.model.1.clone(),
            ledger: Arc::new(ProgramLedger::new(turn.episode.clone(), CallSteps::WithinTurns)),
            recorder: turn.recorder.clone(),
            // Its tools are the world's: the loop logs its calls.
            derive_trajectory: false,
        };
        gateway.start().await.map_err(|e| format!("its model gateway did not start: {e}"))
    }

    /// The episode's process, started and sent `start` at its first turn.
    async fn process(&mut self, turn: &Turn<'_>, gateway: &GatewayHandle) -> Result<&mut Process, String> {
        if let Some(why) = &self.broken {
            return Err(why.clone());
        }
        if self.process.is_none() {
            let (env, endpoints) = (gateway.env(), endpoints(gateway));
            let mut process = self.parts.program.checkout(&env)?;
            let limits = StartLimits {
                max_steps: turn.episode.limits.max_steps,
                time_s: time_left(turn).as_secs_f64(),
                max_tokens: turn.episode.limits.max_tokens,
                max_cost_usd: turn.episode.limits.max_cost_usd,
            };
            let start = ToAgent::Start {
                protocol: PROTOCOL_VERSION,
                episode_id: &self.parts.episode_id,
                task: &self.parts.task,
                system: self.system.as_deref(),
                tools: turn.tools.iter().map(|t| t.as_offered()).collect(),
                limits,
                gateway: endpoints,
            };
            let sent = tokio::time::timeout(time_left(turn), process.send(&start.line())).await;
            let pid = process.pid;
            self.process = Some(process);
            match sent {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(self.gone(format!("`start` could not be written (pid {pid}): {e}")).await),
                Err(_) => return Err("it read no `start` within the episode's time".into()),
            }
        }
        self.process.as_mut().ok_or_else(|| "no process".to_owned())
    }

    /// Why the process is gone: what the caller saw, and how it exited.
    async fn gone(&mut self, what: String) -> String {
        let exit = match self.process.as_mut() {
            Some(process) => process.exit_status(std::time::Duration::from_millis(500)).await,
            None => None,
        };
        match exit {
            Some(exit) => format!("{what}; it exited ({exit}) before `end`"),
            None => what,
        }
    }

    /// One turn: the observations out, then messages in until the `actions` reply.
    async fn turn(&mut self, turn: &Turn<'_>, gateway: &GatewayHandle) -> Result<Proposal, Failure> {
        let step = turn.allowance.step;
        let message = ToAgent::Observations {
            step,
            observations: turn.observations,
            budget: TurnBudget {
                steps_left: turn.allowance.steps_left,
                time_left_s: time_left(turn).as_secs_f64(),
                tokens_left: turn.allowance.tokens_left,
            },
        };
        let line = message.line();
        let process = self.process(turn, gateway).await.map_err(Failure::Violation)?;
        process.in_turn = true;
        match tokio::time::timeout(time_left(turn), process.send(&line)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(Failure::Violation(self.gone(format!("its stdin closed ({e})")).await)),
            Err(_) => return Err(Failure::Violation("it read no observations within the episode's time".into())),
        }
        let waited = time_left(turn).as_secs_f64();
        loop {
            let wait = time_left(turn);
            let Some(process) = self.process.as_mut() else { return Err(Failure::Violation("no process".into())) };
            let incoming = match next_incoming(process, wait).await {
                Some(incoming) => incoming,
                None => {
                    return Err(Failure::Violation(format!(
                        "it sent no `actions` for step {step} within the episode's remaining time ({waited:.1}s)"
                    )));
                }
            };
            match incoming {
                Incoming::Closed => {
                    let what = format!("its stdout closed while runner waited for `actions` for step {step}");
                    return Err(Failure::Violation(self.gone(what).await));
                }
                Incoming::Violation(what) => return Err(Failure::Violation(format!("it sent {what}"))),
                Incoming::Message(FromAgent::Log { message }) => {
                    let message = fit_text(&message, LOG_MESSAGE_BYTES).0;
                    turn.recorder.emit(&Event::AgentLog { step, message });
                }
                Incoming::Message(FromAgent::Usage { cost_usd: Some(cost), .. })
                    if !(cost.is_finite() && cost >= 0.0) =>
                {
                    let why = format!("it sent a `usage` whose `cost_usd` is {cost}, not a number from 0 up");
                    return Err(Failure::Violation(why));
                }
                Incoming::Message(FromAgent::Usage { model, input_tokens, output_tokens, cost_usd }) => {
                    let usage = Usage { input_tokens, output_tokens, cached_tokens: 0 };
                    // Counted as it comes, so that the episode's limits see it at this turn's end.
                    turn.episode.spend(usage, cost_usd);
                    turn.recorder.emit(&Event::AgentUsage { step, model, usage, cost_usd });
                }
                Incoming::Message(FromAgent::Fault { cause, message }) => {
                    let cause = UnscoredCause::from_name(&cause);
                    if let UnscoredCause::Other(name) = &cause {
                        let why = format!("it sent a `fault` with a cause runner does not know, `{name}`: {message}");
                        return Err(Failure::Violation(why));
                    }
                    return Err(Failure::Fault(AgentFault { cause, message }));
                }
                Incoming::Message(FromAgent::Actions { calls, text }) => {
                    process.in_turn = false;
                    return self.proposal(step, calls, text).map_err(Failure::Violation);
                }
            }
        }
    }

    /// The `actions` reply as a proposal: its calls, each with an id new to the episode; a
    /// reply with no calls and some text is the final answer, as a model's plain text is.
    fn proposal(
        &mut self,
        step: u32,
        calls: Vec<protocol::WireCall>,
        text: Option<String>,
    ) -> Result<Proposal, String> {
        let mut proposed = Vec::with_capacity(calls.len().max(1));
        for (i, call) in calls.into_iter().enumerate() {
            let call_id = call.call_id.unwrap_or_else(|| format!("x{step}_{}", i + 1));
            if !self.call_ids.insert(call_id.clone()) {
                return Err(format!("it used the call id `{call_id}` twice in the episode"));
            }
            proposed.push(ToolCall::new(call_id, call.name, call.arguments));
        }
        if proposed.is_empty()
            && let Some(text) = text.filter(|t| !t.trim().is_empty())
        {
            let call_id = format!("x{step}_answer");
            self.call_ids.insert(call_id.clone());
            proposed.push(ToolCall::new(call_id, FINAL_TOOL, json!({"answer": text})));
        }
        // What it spent was counted as its `usage` messages came.
        Ok(Proposal { calls: proposed, cost_usd: Some(0.0), ..Proposal::default() })
    }
}

/// An external agent whose settings are not an external agent's (a bug of the caller's):
/// each turn is its failure.
pub struct NoProgram;

#[async_trait]
impl Agent for NoProgram {
    async fn propose(&mut self, _turn: Turn<'_>) -> Result<Proposal, AgentFault> {
        let failed = Some("the external agent has no program: its suite gives no `agent.command`".to_owned());
        Ok(Proposal { failed, ..Proposal::default() })
    }
}

/// How a turn failed: the program broke the protocol (its failure), or said it could not
/// go on for a cause that is nobody's answer.
enum Failure {
    Violation(String),
    Fault(AgentFault),
}

/// The gateway as `start` tells it: a reused process keeps the environment it started with,
/// so each episode's endpoints and key come in its `start` too.
fn endpoints(gateway: &GatewayHandle) -> Value {
    json!({
        "openai_base_url": gateway.openai_base_url(),
        "anthropic_base_url": gateway.anthropic_base_url(),
        "url": gateway.url(),
        "key": gateway.key(),
    })
}

fn time_left(turn: &Turn<'_>) -> std::time::Duration {
    turn.episode.deadline.at().saturating_duration_since(tokio::time::Instant::now())
}

#[async_trait]
impl Agent for ExternalAgent {
    async fn propose(&mut self, turn: Turn<'_>) -> Result<Proposal, AgentFault> {
        let gateway = match self.gateway(&turn).await {
            Ok(gateway) => gateway,
            Err(why) => return Ok(Proposal { failed: Some(why), cost_usd: Some(0.0), ..Proposal::default() }),
        };
        let turned = tokio::select! {
            turned = self.turn(&turn, &gateway) => Some(turned),
            _ = gateway.ended() => None,
        };
        let ending = gateway.ending();
        self.gateway = Some(gateway);
        // What the gateway saw comes first: a model failing behind it is nobody's answer,
        // whatever the program made of its 502; a limit its calls reached ends the episode.
        match ending {
            Some(GatewayEnd::Fault(error)) => {
                self.broken = Some(format!("its model failed: {}", error.message));
                return Err(AgentFault { cause: error.cause, message: error.message });
            }
            Some(GatewayEnd::Limit(_)) => return Ok(Proposal::default()),
            None => {}
        }
        let Some(turned) = turned else { return Ok(Proposal::default()) };
        match turned {
            Ok(proposal) => Ok(proposal),
            Err(Failure::Fault(fault)) => {
                self.broken = Some(format!("it sent a fault: {fault}"));
                Err(fault)
            }
            Err(Failure::Violation(why)) => {
                if let Some(process) = self.process.as_mut() {
                    process.closed = true;
                }
                let program = &self.parts.program;
                let why = format!("the external agent `{}` ({}): {why}", program.command.join(" "), program.at);
                self.broken = Some(why.clone());
                Ok(Proposal { failed: Some(why), cost_usd: Some(0.0), ..Proposal::default() })
            }
        }
    }

    async fn finish(&mut self, termination: Termination, outcome: &Outcome, recorder: &Recorder) -> Option<ProgramEnd> {
        if let Some(gateway) = self.gateway.take() {
            gateway.close();
        }
        let mut process = self.process.take()?;
        let (status, passed) = match outcome {
            Outcome::Scored { passed, .. } => ("scored", Some(*passed)),
            Outcome::Unscored { .. } => ("unscored", None),
            Outcome::Cancelled => ("cancelled", None),
        };
        let end = ToAgent::End { termination: termination.as_str(), outcome: status, passed };
        let wait = std::time::Duration::from_secs(1);
        if !matches!(tokio::time::timeout(wait, process.send(&end.line())).await, Ok(Ok(()))) {
            process.closed = true;
        }
        let pid = process.pid;
        let stderr_tail = process.stderr_tail();
        let event = match self.parts.program.give_back(process) {
            None => Event::AgentProgram { pid, exit: None, kept: true, stderr_tail },
            // Not kept: it exits (or is killed) now, as part of its episode.
            Some(mut process) => {
                let exit = process.close().await;
                Event::AgentProgram { pid, exit, kept: false, stderr_tail: process.stderr_tail() }
            }
        };
        recorder.emit(&event);
        let Event::AgentProgram { exit, stderr_tail, .. } = event else { return None };
        Some(ProgramEnd { exit, wall_ms: None, stderr_tail })
    }
}
