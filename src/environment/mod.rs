//! Environments own tools and state, and run the episode's control loop: they execute the
//! agent's calls and report back. They never decide.

pub mod beneath;
pub mod definition;
mod file_world;
mod folder;
pub mod interpreter;
pub mod kind;
pub mod kinds;
pub mod permission;
mod run;
pub mod script;
pub mod tool;
pub mod user;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use serde_json::{Map, Value, json};
use tokio::sync::Semaphore;

use crate::agent::{ActorEnding, Agent, WorldView};
use crate::contract::fit;
use crate::contract::{
    Actor, CallFault, EXIT_PLAN_MODE, ErrorType, FINAL_TOOL, Observation, ToolCall, ToolError, ToolSpec,
};
use crate::domain::Task;
use crate::log::{Event, PermissionDecision, Recorder};
use definition::validate_arguments;
use permission::{Action, Permissions};
use user::{Answered, Prompt, User};

pub use crate::agent::{CallError, EpisodeState, Trajectory};
pub use beneath::read_regular;
pub use definition::{Definition, EnvLimits};
pub use file_world::{FileWorld, ImageRoot, OwnRoot, ReadBack};
pub use folder::{forget_spares, remove_tree, remove_tree_at};
pub use kind::{RunStore, SetupContext};
pub use kinds::{EnvironmentKind, KINDS, KindSettings};
pub use run::Ending;
pub use tool::{Tool, ToolDecl};

/// A tool's failure, raised by the world and normalised by the environment.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolFailure {
    pub kind: ErrorType,
    pub message: String,
    pub suggested_action: Option<String>,
    /// What the tool produced before it failed (truncated output, say).
    pub partial: Option<Value>,
    /// Set when the failure is nobody's answer (the runner ran out of open files, say):
    /// the episode then ends unscored.
    pub fault: Option<CallFault>,
}

impl ToolFailure {
    pub fn new(kind: ErrorType, message: impl Into<String>) -> Self {
        ToolFailure { kind, message: message.into(), suggested_action: None, partial: None, fault: None }
    }

    /// The failure of an operation on the world: the runner's own fault when the runner
    /// ran out of resources (open files, processes, memory), the tool's otherwise.
    pub fn io(what: &str, e: std::io::Error) -> Self {
        let message = if what.is_empty() { e.to_string() } else { format!("{what}: {e}") };
        let failure = ToolFailure::new(ErrorType::ExecutionError, message);
        if crate::sandbox::resources::is_exhaustion(&e) {
            ToolFailure { fault: Some(CallFault::ResourceExhausted), ..failure }
        } else {
            failure
        }
    }

    pub fn suggest(mut self, action: impl Into<String>) -> Self {
        self.suggested_action = Some(action.into());
        self
    }
}

/// Decodes a tool's arguments (already checked against its schema) into the tool's type.
pub(crate) fn decode_arguments<T: serde::de::DeserializeOwned>(arguments: Value) -> Result<T, ToolFailure> {
    serde_json::from_value(arguments).map_err(|e| ToolFailure::new(ErrorType::ValidationError, e.to_string()))
}

/// Whether the episode must end now: its time is up, or the run was stopped
/// (`EpisodeState::over`).
pub type Over = Arc<dyn Fn() -> bool + Send + Sync>;

/// The state a kind of environment acts on. Its tools are values (`tool.rs`); `call`
/// hands a call to the one named.
#[async_trait]
pub trait World: Send + Sync {
    /// Runs tool `name` for `actor` with arguments already checked against its schema.
    /// The actor matters to worlds that keep a model of what each agent knows (`shell`).
    async fn call(&self, actor: &Actor, name: &str, arguments: Value) -> Result<Value, ToolFailure>;

    /// The files `actor` read or wrote that changed since, each named once per change
    /// (`kinds/shell/world_model.rs`). A world without files has none.
    async fn changed_files(&self, _actor: &Actor) -> Vec<String> {
        Vec::new()
    }

    /// Told once, before the episode's first turn, when the episode must end (its deadline
    /// or the run's stop), as a test to ask. A world whose tools do work the loop cannot
    /// interrupt from outside (an SQLite statement runs inside the call's poll) asks it as
    /// it works, so that no call outlives the episode; most worlds need not.
    fn begin(&self, _over: Over) {}

    /// Releases what the world holds (processes, folders, connections), once the episode
    /// has been scored against it.
    async fn teardown(&mut self) {}

    /// Facts for the first observation's `info` (a working directory, say).
    fn describe(&self) -> Map<String, Value> {
        Map::new()
    }

    /// Facts added to the `info` of every observation of the world's tools, after the call
    /// (the writing room's outline and cursor). Most worlds add none.
    fn observe(&self) -> Map<String, Value> {
        Map::new()
    }

    /// The world's files, for scorers of the final state; a world without files has none
    /// (`file_world.rs`).
    fn files(&self) -> Option<&dyn FileWorld> {
        None
    }

    /// Where a program agent (`cli`) runs: the world's working folder and its `tmp/`. Only
    /// worlds of files whose commands run in a folder have one.
    fn program_folders(&self) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
        None
    }
}

/// The observation of a call the user could not answer: the loop ends the episode
/// unscored (`user_error`).
fn user_fault(call: &ToolCall, fault: user::UserFault) -> Observation {
    let mut obs = Observation::of_error(&call.call_id, ToolError::new(ErrorType::ExecutionError, fault.to_string()));
    obs.fault = Some(CallFault::UserFailed);
    obs
}

impl Environment {
    /// Runs one of the user's tools: `ask_user` and `clarify` when the task has a user,
    /// and `exit_plan_mode` always (with nobody to answer, it fails).
    async fn run_user_tool(&self, call: &ToolCall, step: u32, recorder: &Recorder) -> Observation {
        if let Err(error) = self.check_user_tool(call) {
            return Observation::of_error(&call.call_id, error);
        }
        match self.user.run_tool(call, step, recorder).await {
            Answered::Result(value) => Observation::of_result(&call.call_id, value),
            Answered::Failure(failure) => {
                let mut error = ToolError::new(failure.kind, failure.message);
                error.suggested_action = failure.suggested_action;
                Observation::of_error(&call.call_id, error)
            }
            Answered::Fault(fault) => user_fault(call, fault),
        }
    }

    /// Checks a user tool's arguments against its schema, as `check` does the world's.
    fn check_user_tool(&self, call: &ToolCall) -> Result<(), ToolError> {
        self.check_against(user::exposed(&call.name), call)
    }

    /// Whether `call` is one the user answers here: `exit_plan_mode` always, `ask_user`
    /// and `clarify` when the task has a user (elsewhere they are unknown tools).
    fn is_for_user(&self, call: &ToolCall) -> bool {
        call.name == EXIT_PLAN_MODE
            || (self.user.is_declared() && user::is_user_tool(&call.name) && self.definition.tool(&call.name).is_none())
    }
}

/// The agent asks the environment, which asks its world.
#[async_trait]
impl WorldView for Environment {
    async fn changed_files(&self, actor: &Actor) -> Vec<String> {
        self.world.changed_files(actor).await
    }

    async fn run_subagent(
        &self,
        agent: &mut dyn Agent,
        goal: &str,
        tools: &[ToolSpec],
        episode: &Arc<EpisodeState>,
        recorder: &Recorder,
    ) -> ActorEnding {
        self.run_child(agent, goal, tools, episode, recorder).await
    }
}

/// A failure to set up an environment: the episode is unscored (`environment_error`).
#[derive(Debug, thiserror::Error)]
#[error("failed to set up environment `{name}`: {message}")]
pub struct SetupError {
    pub name: String,
    pub message: String,
}

/// One episode's environment: a definition, a live world, its own concurrency limit, and
/// the permission rules its calls are checked against.
pub struct Environment {
    pub definition: Arc<Definition>,
    world: Box<dyn World>,
    slots: Semaphore,
    permissions: Arc<Permissions>,
    /// The task's user: answers the `ask` rules and the user's tools, and in a
    /// conversation talks with the agent.
    user: User,
    /// The tools offered when they are more than the definition's: the user's tools added.
    offered: Vec<ToolSpec>,
    /// Where `execute_code` runs its scripts, when the definition offers it.
    scripts: Option<script::ScriptHost>,
}

impl Environment {
    /// Sets up a fresh world for `task` through the definition's kind.
    pub async fn setup(
        definition: Arc<Definition>,
        task: &Task,
        context: &SetupContext<'_>,
    ) -> Result<Self, SetupError> {
        let Some(kind) = definition.kind else {
            let message = "its world is supplied in code: use Environment::with_world".into();
            return Err(SetupError { name: definition.name.clone(), message });
        };
        let world = kind.setup(&definition, task, context).await?;
        let scripts = match &definition.scripts {
            Some(settings) => {
                let confine = |writable: &[&std::path::Path], readable: &[std::path::PathBuf]| {
                    definition.confinement(context.sandbox, writable, readable)
                };
                let concurrency = definition.limits.max_concurrency;
                Some(
                    script::ScriptHost::create(&definition.name, settings, concurrency, context.work_root, confine)
                        .await?,
                )
            }
            None => None,
        };
        let user = User::of_task(task, context.user_model.clone())
            .map_err(|message| SetupError { name: definition.name.clone(), message })?;
        let environment = Self::with_world(definition, world).with_user(user);
        Ok(Environment { scripts, ..environment })
    }

    /// An environment over any world: for worlds defined outside the built-in kinds. Its
    /// calls are checked against the definition's permission rules.
    pub fn with_world(definition: Arc<Definition>, world: Box<dyn World>) -> Self {
        let slots = Semaphore::new(definition.limits.max_concurrency);
        let permissions = definition.permissions.clone();
        Environment { definition, world, slots, permissions, user: User::default(), offered: Vec::new(), scripts: None }
    }

    /// Gives the environment its task's user; a declared user's tools (`ask_user`,
    /// `clarify`) are offered after the definition's.
    pub fn with_user(self, user: User) -> Self {
        let offered = if user.is_declared() {
            self.definition.specs.iter().cloned().chain(user::tool_specs()).collect()
        } else {
            Vec::new()
        };
        Environment { user, offered, ..self }
    }

    /// The tools the agent is offered.
    pub fn tools(&self) -> &[ToolSpec] {
        if self.offered.is_empty() { &self.definition.specs } else { &self.offered }
    }

    /// The task's user.
    pub fn user(&self) -> &User {
        &self.user
    }

    /// Checks calls against `permissions` instead (a suite's rules and then the
    /// environment's, say).
    pub fn with_permissions(self, permissions: Arc<Permissions>) -> Self {
        Environment { permissions, ..self }
    }

    /// The live world, for scorers of the final state.
    pub fn world(&self) -> &dyn World {
        self.world.as_ref()
    }

    /// Tears the world down; the episode is over and scored.
    pub async fn teardown(mut self) {
        self.world.teardown().await;
    }

    /// The first observation: the task's input, the tools and the world's facts.
    pub fn reset(&self, task: &Task) -> Observation {
        let mut info = self.world.describe();
        if let Some(scripts) = &self.scripts
            && !info.contains_key("sandbox")
        {
            info.insert("sandbox".into(), scripts.sandbox_enforced().clone());
        }
        info.insert("environment".into(), Value::String(self.definition.name.clone()));
        info.insert("task_id".into(), Value::String(task.id.clone()));
        Observation { info, ..Observation::of_messages(vec![task.input.clone()]) }
    }

    /// Checks that `call` names a tool of the environment and that its arguments fit the
    /// tool's schema; if not, the error that says so.
    fn check(&self, call: &ToolCall) -> Result<(), ToolError> {
        self.check_against(self.definition.tool(&call.name), call)
    }

    /// Checks `call` against `tool`, the tool it names (`None` when there is none).
    fn check_against(&self, tool: Option<&definition::ExposedTool>, call: &ToolCall) -> Result<(), ToolError> {
        let Some(tool) = tool else {
            let names: Vec<&str> = self.definition.specs.iter().map(|t| t.name.as_str()).collect();
            let error = ToolError::new(ErrorType::ToolNotFound, format!("no tool named `{}`", call.name))
                .suggest(format!("call one of: {}", names.join(", ")));
            return Err(error);
        };
        if let Value::String(raw) = &call.arguments {
            let shown: String = raw.chars().take(200).collect();
            let error = ToolError::new(
                ErrorType::ValidationError,
                format!("the arguments of `{}` are not valid JSON: {shown:?}", call.name),
            )
            .suggest("send the arguments as one JSON object");
            return Err(error);
        }
        if let Err(message) = validate_arguments(tool, &call.arguments) {
            let error =
                ToolError::new(ErrorType::ValidationError, format!("invalid arguments for `{}`: {message}", call.name))
                    .suggest(format!("call `{}` with arguments that match its parameters schema", call.name));
            return Err(error);
        }
        Ok(())
    }

    /// Decides by the permission rules whether `call` may run, and logs the decision (a
    /// `permission` event); a call that may not gets its observation here. With no rules,
    /// nothing is decided. A call `check` refuses (an unknown tool, invalid arguments) is
    /// left to `execute` to report, and the final answer is always allowed.
    pub async fn permit(&self, call: &ToolCall, step: u32, recorder: &Recorder) -> Option<Observation> {
        if self.permissions.is_empty() || call.name == FINAL_TOOL || self.check(call).is_err() {
            return None;
        }
        let rule = self.permissions.rule_for(call);
        let answer = match rule {
            Some(rule) if rule.action == Action::Ask => {
                match self.user.answer(&Prompt::Permission(call), step, recorder).await {
                    Ok(answer) => answer,
                    Err(fault) => return Some(user_fault(call, fault)),
                }
            }
            _ => None,
        };
        let verdict = self.permissions.verdict(rule, answer);
        recorder.emit(&Event::Permission {
            step,
            call_id: call.call_id.clone(),
            tool: call.name.clone(),
            rule: verdict.rule.as_ref().map(|r| r.text()),
            decision: verdict.decision,
            decided_by: verdict.decided_by,
            answer: verdict.answer.clone(),
        });
        match verdict.decision {
            PermissionDecision::Allow => None,
            PermissionDecision::Deny => Some(Observation::of_error(&call.call_id, verdict.error(call))),
        }
    }

    /// Executes one call and normalises whatever happens into an observation. `started` is
    /// set once the tool itself begins to run, so that a cancelled call can be told apart
    /// from one that never acted on the world. The caller has asked `permit` first.
    pub async fn execute(&self, call: &ToolCall, started: &AtomicBool) -> Observation {
        if let Err(error) = self.check(call) {
            return Observation::of_error(&call.call_id, error);
        }
        if call.name == FINAL_TOOL {
            let answer = call.arguments.get("answer").cloned().unwrap_or(Value::Null);
            let mut obs = Observation::of_result(&call.call_id, json!({"answer": answer}));
            obs.done = true;
            return obs;
        }

        let Ok(_slot) = self.slots.acquire().await else {
            return Observation::of_error(
                &call.call_id,
                ToolError::new(ErrorType::Cancelled, "the environment is closed"),
            );
        };
        started.store(true, Ordering::Relaxed);
        let timeout = Duration::from_secs_f64(self.definition.limits.tool_timeout_s);
        let running = AssertUnwindSafe(self.world.call(&call.actor, &call.name, call.arguments.clone())).catch_unwind();
        let mut obs = match tokio::time::timeout(timeout, running).await {
            Ok(Ok(Ok(mut result))) => {
                if call.name == "grep" {
                    self.permissions.withhold_matches(&mut result);
                }
                Observation::of_result(&call.call_id, result)
            }
            Ok(Ok(Err(failure))) => {
                let mut error = ToolError::new(failure.kind, failure.message);
                error.suggested_action = failure.suggested_action;
                let mut obs = Observation::of_error(&call.call_id, error);
                obs.tool_result = failure.partial;
                // The loop ends the episode unscored on a fault: the agent did nothing wrong.
                obs.fault = failure.fault;
                obs
            }
            Ok(Err(panic)) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Observation::of_error(
                    &call.call_id,
                    ToolError::new(ErrorType::ExecutionError, format!("the tool crashed: {what}")),
                )
            }
            Err(_) => Observation::of_error(
                &call.call_id,
                ToolError::new(
                    ErrorType::TimeoutError,
                    format!("`{}` took longer than {}s", call.name, timeout.as_secs_f64()),
                )
                .suggest("try a smaller or faster action"),
            ),
        };
        cap_result(&mut obs, self.definition.limits.output_cap_bytes);
        for (key, value) in self.world.observe() {
            obs.info.entry(key).or_insert(value);
        }
        obs
    }
}

/// Room past `output_cap_bytes` for a result's structure and its tools' own markers.
pub const CAP_SLACK_BYTES: usize = 1024;

/// The one cap every tool's result obeys: serialised, `output_cap_bytes` plus
/// [`CAP_SLACK_BYTES`]. Past it the result is cut (strings keep their start, lists their
/// first items, each cut marked) and, unless the tool already failed, the observation
/// says `OutputTruncated`. Tools that cut their own output finer keep doing so.
fn cap_result(obs: &mut Observation, cap: usize) {
    let Some(result) = &obs.tool_result else { return };
    let limit = cap.saturating_add(CAP_SLACK_BYTES);
    // Measured first: almost every result fits, and `fit` would copy it to say so.
    let size = fit::size(result);
    if size <= limit {
        return;
    }
    let (fitted, _) = fit::fit(result, limit);
    obs.tool_result = Some(fitted);
    if obs.error.is_none() {
        let message = format!("the result was {size} bytes; it was cut to the output cap of {limit} bytes");
        obs.error = Some(
            ToolError::new(ErrorType::OutputTruncated, message)
                .suggest("ask for less at a time: a narrower path, a pattern or a range"),
        );
    }
}
