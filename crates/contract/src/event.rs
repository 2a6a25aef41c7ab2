//! The events of a run: one JSON object per line of `events.jsonl`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::selection::Selection;
use crate::{Actor, CallFault, Observation, ToolCall};

/// The version of the event schema, written as `v` on every line.
pub const SCHEMA_VERSION: u32 = 1;

/// The scoring id of the scores given while a run goes.
pub const INITIAL_SCORING: &str = "initial";

fn initial_scoring() -> String {
    INITIAL_SCORING.into()
}

fn one() -> f64 {
    1.0
}

/// How an agent that is a program (`external`, `cli`) ended its episode, as
/// `episode_finished` carries it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProgramEnd {
    /// `exit code N` or `killed by signal N`; `None` while it lives on (an `external`
    /// program kept for another episode) or when it was not seen to end.
    #[serde(default)]
    pub exit: Option<String>,
    /// How long it ran, when runner started it for the episode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_ms: Option<f64>,
    /// The last 4 KiB it wrote on its standard error during the episode.
    #[serde(default)]
    pub stderr_tail: String,
}

/// Tokens spent by model calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default)]
    pub cached_tokens: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// Counts come from providers: they saturate rather than overflow.
    pub fn add(&mut self, other: Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(other.cached_tokens);
    }
}

/// Two costs in USD added, the sum held at the largest finite number. Costs come from
/// programs and price lists: two large ones would add up to infinity, which JSON writes as
/// `null`, so that an episode's cost would read as unknown and drop out of every total.
pub fn add_cost(a: f64, b: f64) -> f64 {
    (a + b).min(f64::MAX)
}

/// A cost as tables and messages print it: `$0.0123`, or in exponent form from a billion
/// dollars up, where the digits of a summed cost could run to hundreds.
pub fn usd(cost: f64) -> String {
    if cost.abs() < 1e9 { format!("${cost:.4}") } else { format!("${cost:.3e}") }
}

/// Why an episode stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Termination {
    FinalAnswer,
    MaxSteps,
    TimeLimit,
    TokenLimit,
    CostLimit,
    AgentError,
    EnvironmentError,
    /// The run was stopped (^C): the episode is cancelled.
    UserStop,
    /// A hard budget (`--budget-hard`) was reached while the episode ran: it is cancelled.
    Budget,
    /// In a conversation, the task's user said the stop word: the conversation is over.
    /// Not `user_stop`, which already means the run was stopped.
    UserEnded,
    /// The run's budget stopped scheduling before the episode started: it never ran.
    NotRun,
}

impl Termination {
    pub fn as_str(self) -> &'static str {
        match self {
            Termination::FinalAnswer => "final_answer",
            Termination::MaxSteps => "max_steps",
            Termination::TimeLimit => "time_limit",
            Termination::TokenLimit => "token_limit",
            Termination::CostLimit => "cost_limit",
            Termination::AgentError => "agent_error",
            Termination::EnvironmentError => "environment_error",
            Termination::UserStop => "user_stop",
            Termination::Budget => "budget",
            Termination::UserEnded => "user_ended",
            Termination::NotRun => "not_run",
        }
    }
}

/// Whether a call may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionDecision {
    Allow,
    Deny,
}

/// Who decided whether a call may run: a rule (`allow` or `deny`), the task's user (an
/// `ask` rule they answered), or the default (no rule matched, so allowed; or an `ask`
/// nobody answered, so denied).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecidedBy {
    Rule,
    User,
    Default,
}

/// How an episode counts: scored, unscored (nobody's answer, never a 0), or cancelled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    Scored { score: f64, passed: bool },
    Unscored { cause: UnscoredCause, message: String },
    Cancelled,
}

/// Why an episode is unscored: a fault that is nobody's answer. Written to the log as its
/// snake_case name; a name this version does not know (from a newer runner, or an external
/// agent's `fault`) is kept as `Other`, so that reading an old or foreign log never fails.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum UnscoredCause {
    /// The model backend failed (after retries).
    ProviderError,
    /// The provider kept answering 429 after retries.
    RateLimited,
    /// The provider refused the request as configured (a bad key, an unknown model).
    ConfigurationError,
    /// A grader's verdict could not be had or parsed.
    GraderError,
    /// The environment would not start.
    EnvironmentError,
    /// A replayed run or cassette has no response for the request.
    ReplayMiss,
    /// A response could not be written to the cassette.
    RecordError,
    /// The runner itself ran out of open files, processes or memory.
    ResourceExhausted,
    /// A cost limit could not be checked because a model call had no price.
    CostUnknown,
    /// A `mock` script has no turn left.
    MockExhausted,
    /// A regrade needs the final world, which is gone.
    WorldGone,
    /// The task's user could not answer (a simulated user's model failed).
    UserError,
    /// On a `model_call` only: the episode's time ran out while a model that answers (it
    /// answered earlier in the run) was still answering. Not an outage: the episode ends
    /// at its time limit (`time_limit`) and is scored as usual.
    ModelTooSlow,
    /// A task's verifier (a Harbor task's `tests/test.sh`) crashed or wrote no reward.
    VerifierError,
    /// A code scorer (`python:`, `js:`) raised, timed out, crashed, or returned something
    /// that is not a verdict.
    ScorerError,
    /// Not run: a run-wide budget (`--max-cost-usd`, `--max-run-tokens`,
    /// `--max-model-calls`, or a provider's) stopped scheduling before the episode started.
    Budget,
    /// The model gateway refused a request of a program agent for a shape it does not
    /// speak (the field named in the message): the gateway's gap, not the agent's failure.
    GatewayUnsupported,
    Other(String),
}

impl UnscoredCause {
    const NAMED: [UnscoredCause; 17] = [
        UnscoredCause::ProviderError,
        UnscoredCause::RateLimited,
        UnscoredCause::ConfigurationError,
        UnscoredCause::GraderError,
        UnscoredCause::EnvironmentError,
        UnscoredCause::ReplayMiss,
        UnscoredCause::RecordError,
        UnscoredCause::ResourceExhausted,
        UnscoredCause::CostUnknown,
        UnscoredCause::MockExhausted,
        UnscoredCause::WorldGone,
        UnscoredCause::UserError,
        UnscoredCause::ModelTooSlow,
        UnscoredCause::VerifierError,
        UnscoredCause::ScorerError,
        UnscoredCause::Budget,
        UnscoredCause::GatewayUnsupported,
    ];

    pub fn as_str(&self) -> &str {
        match self {
            UnscoredCause::ProviderError => "provider_error",
            UnscoredCause::RateLimited => "rate_limited",
            UnscoredCause::ConfigurationError => "configuration_error",
            UnscoredCause::GraderError => "grader_error",
            UnscoredCause::EnvironmentError => "environment_error",
            UnscoredCause::ReplayMiss => "replay_miss",
            UnscoredCause::RecordError => "record_error",
            UnscoredCause::ResourceExhausted => "resource_exhausted",
            UnscoredCause::CostUnknown => "cost_unknown",
            UnscoredCause::MockExhausted => "mock_exhausted",
            UnscoredCause::WorldGone => "world_gone",
            UnscoredCause::UserError => "user_error",
            UnscoredCause::ModelTooSlow => "model_too_slow",
            UnscoredCause::VerifierError => "verifier_error",
            UnscoredCause::ScorerError => "scorer_error",
            UnscoredCause::Budget => "budget",
            UnscoredCause::GatewayUnsupported => "gateway_unsupported",
            UnscoredCause::Other(name) => name,
        }
    }

    /// The cause of this name; never fails (an unknown name is `Other`).
    pub fn from_name(name: &str) -> Self {
        UnscoredCause::NAMED
            .into_iter()
            .find(|c| c.as_str() == name)
            .unwrap_or_else(|| UnscoredCause::Other(name.to_owned()))
    }
}

impl std::fmt::Display for UnscoredCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&str> for UnscoredCause {
    fn from(name: &str) -> Self {
        UnscoredCause::from_name(name)
    }
}

/// Causes sort by name, as tables and summaries list them.
impl Ord for UnscoredCause {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for UnscoredCause {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq<str> for UnscoredCause {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for UnscoredCause {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Serialize for UnscoredCause {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for UnscoredCause {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        Ok(UnscoredCause::from_name(&name))
    }
}

impl Outcome {
    pub fn passed(&self) -> bool {
        matches!(self, Outcome::Scored { passed: true, .. })
    }
}

/// One suite as the run saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SuiteInfo {
    pub name: String,
    pub path: String,
    pub digest: String,
    pub tasks: usize,
    pub environment: String,
    pub epochs: u32,
    #[serde(default)]
    pub reducer: crate::reduce::Reducer,
    #[serde(default)]
    pub k_of_n: Option<u32>,
    /// The tasks' own k-of-n gates (`pass_k:`), by task id; absent when none has one.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub pass_k: std::collections::BTreeMap<String, crate::reduce::PassK>,
    pub pass_threshold: Option<f64>,
    /// What the sandbox enforces on the suite's worlds (absent for worlds that start no process).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Value>,
    /// The variants the run made of the suite, in order (absent when it has none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<String>,
}

/// The suites' `limits:` as the command line overrode them for the whole run
/// (`--time-s`, `--max-steps`, `--max-tokens`, `--time-factor`); all `None` when it did not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LimitOverrides {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Multiplies every episode's time limit (the suite's `time_s`, or `--time-s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_factor: Option<f64>,
}

impl LimitOverrides {
    pub fn is_none(&self) -> bool {
        *self == LimitOverrides::default()
    }

    /// The flags that give these overrides, as a person would type them; `no limit flags`
    /// when there are none.
    pub fn as_flags(&self) -> String {
        let flags: Vec<String> = [
            self.time_s.map(|v| format!("--time-s {v}")),
            self.max_steps.map(|v| format!("--max-steps {v}")),
            self.max_tokens.map(|v| format!("--max-tokens {v}")),
            self.time_factor.map(|v| format!("--time-factor {v}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        if flags.is_empty() { "no limit flags".into() } else { flags.join(" ") }
    }
}

/// Digests of the parts of an episode, each over what that part is made of once loaded:
/// what the agent sees of the task, the environment, the agent, the model and its sampling
/// (for `mock`, its script), the scorers (with the target) and the scorers among them that
/// read the final world, and the grader.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpisodeDigests {
    pub task: String,
    pub environment: String,
    pub agent: String,
    pub model: String,
    pub scorers: String,
    pub world_scorers: String,
    pub grader: String,
}

/// One episode of a `--since` plan, as `run_started` shows the first of each kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedEpisode {
    pub suite: String,
    pub task_id: String,
    pub model: String,
    pub epoch: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    pub reason: String,
}

/// What `runner eval --since RUN` planned: how many episodes of the run are reused,
/// regraded and run again, and the first few of each with why.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SincePlan {
    /// The earlier run: its id and its folder.
    pub run_id: String,
    pub path: String,
    pub reuse: u64,
    pub regrade: u64,
    pub rerun: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub first_reused: Vec<PlannedEpisode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub first_regraded: Vec<PlannedEpisode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub first_rerun: Vec<PlannedEpisode>,
}

/// The fields of [`Event::ModelCall`] that its timing needs, decoded without the request and
/// response the line also holds (the folds read many per episode). Tested against the event,
/// so that a renamed field cannot drift.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ModelCallTiming {
    pub latency_ms: f64,
    /// What the call used: its input tokens size the episode's largest call.
    #[serde(default)]
    pub usage: Usage,
    /// Set on a grader's calls, which are not the agent's.
    #[serde(default)]
    pub scorer: Option<String>,
    /// `user` on a simulated user's calls, which are not the agent's either.
    #[serde(default)]
    pub actor: Actor,
}

/// The fields of [`Event::EpisodeStarted`] that a table's row is keyed by, decoded straight
/// into a struct (an event, tagged by its `type`, is decoded through a buffer of its fields).
/// Tested against the event.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct EpisodeStartedKey {
    pub suite: String,
    pub task_id: String,
    pub task_digest: String,
    pub model: String,
    pub epoch: u32,
    #[serde(default)]
    pub toolset: Option<String>,
    #[serde(default)]
    pub variant: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub metadata: Map<String, Value>,
}

/// The fields of [`Event::EpisodeFinished`] that a table's row shows, decoded straight into
/// a struct. Tested against the event.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct EpisodeFinishedRow {
    pub outcome: Outcome,
    pub termination: Termination,
    pub steps: u32,
    pub tool_calls: u32,
    pub tool_errors: u32,
    pub usage: Usage,
    pub cost_usd: Option<f64>,
    pub wall_ms: f64,
}

/// One turn of a replayed conversation: its session's id and its message number (from 1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnRef {
    pub session: String,
    pub turn: u32,
}

/// The stages of an episode of a conversation-replay benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    Ingest,
    Answer,
    Judge,
}

/// How an action the agent handled itself relates to the world (seed 001).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionClass {
    /// Changes only the agent.
    Cognitive,
    /// Acts on the world, then changes the agent.
    Hybrid,
}

/// The body of an event; `type` names the variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    RunStarted {
        runner_version: String,
        command_line: Vec<String>,
        models: Vec<String>,
        suites: Vec<SuiteInfo>,
        episodes: u64,
        jobs: usize,
        git_revision: Option<String>,
        /// `i/n` when the run is one shard of several.
        #[serde(default)]
        shard: Option<String>,
        /// The runs `runner merge` combined into this one.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        merged_from: Vec<String>,
        /// The suites' limits as the command line overrode them; absent when it did not.
        #[serde(default, skip_serializing_if = "LimitOverrides::is_none")]
        limits: LimitOverrides,
        /// What a person should know about how the run was set up (a `mock` grader judging
        /// a real model's answers): printed before the run starts and under its summary.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        warnings: Vec<String>,
        /// The tasks the command line chose (`--filter`, `--tag`, `--sample`, `--failing`,
        /// `--range`); absent when it chose none.
        #[serde(default, skip_serializing_if = "Selection::is_none")]
        selection: Selection,
        /// `--since RUN`: what was reused, regraded and run again.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        since: Option<SincePlan>,
    },
    EpisodeStarted {
        suite: String,
        task_id: String,
        task_digest: String,
        model: String,
        epoch: u32,
        environment: String,
        /// The toolset the episode drew, when its suite names `toolsets:`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        toolset: Option<String>,
        /// The variant the episode ran under, when its suite names `variants:`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        variant: Option<String>,
        /// The sampling settings its agents' model calls get over their provider's (its
        /// suite's or variant's `agent.sampling`); absent when none.
        #[serde(default, skip_serializing_if = "Map::is_empty")]
        sampling: Map<String, Value>,
        /// What the episode was made of, part by part, for `runner eval --since` to tell
        /// what changed; absent in logs of runners before it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        digests: Option<EpisodeDigests>,
        /// The task's `tags:`; absent when it has none.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tags: Vec<String>,
        /// The task's own metadata entries whose values are strings, numbers or booleans,
        /// each string cut short, for a reader to filter by; absent when there are none.
        #[serde(default, skip_serializing_if = "Map::is_empty")]
        metadata: Map<String, Value>,
    },
    /// The episode was not run again: it was carried from an earlier run by `--since`,
    /// reused as it was or scored again from its logged trajectory. Follows its
    /// `episode_started`.
    EpisodeCarried {
        /// The run it came from, and its id there.
        from_run: String,
        from_episode: String,
        /// `reuse` or `regrade`.
        plan: String,
        reason: String,
    },
    ModelCall {
        model: String,
        step: u32,
        /// The digest of the canonical request (model, sampling, messages, tools): the
        /// key of record, replay and the cache.
        request_digest: String,
        #[serde(default)]
        sampling: serde_json::Map<String, Value>,
        /// What the model answered: text, tool calls, usage, finish reason. Null on error.
        response: Value,
        usage: Usage,
        latency_ms: f64,
        attempts: u32,
        /// Served from a cassette or the response cache.
        cache_hit: bool,
        cost_usd: Option<f64>,
        /// Why the call produced no answer; the episode is then unscored with `cause`.
        #[serde(default)]
        error: Option<String>,
        #[serde(default)]
        cause: Option<UnscoredCause>,
        /// The endpoint, the request body as sent and the response body as received
        /// (HTTP backends only; keys travel in headers and are never logged).
        #[serde(default)]
        url: Option<String>,
        #[serde(default)]
        request: Option<Value>,
        #[serde(default)]
        raw_response: Option<Value>,
        /// Set when a grader made the call: the scorer it graded for. Absent for the
        /// agent's calls.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scorer: Option<String>,
        /// The agent that asked. Written only when it is not `main` (a grader's calls,
        /// which have `scorer`, are nobody's in the episode and are written without it).
        #[serde(default, skip_serializing_if = "Actor::is_main")]
        actor: Actor,
        /// How the call ended: `answered`, `failed`, `timed_out` (no complete answer within
        /// the provider's `timeout_s`, after its retries), `cut` (the episode's time ran out
        /// first) or `cancelled` (the episode ended, or the run was stopped, while the model
        /// was answering). Absent in logs written before it was recorded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<String>,
        /// Which attempt of the call this event is, when the call took more than one: each
        /// attempt that failed or timed out before a retry has its own event (`retried`),
        /// and the call's last attempt — answered, failed, or cancelled while under way —
        /// has the next number. `latency_ms` is then the attempt's own wall time (the last
        /// attempt's counts from the end of the one before). Absent on a call of one attempt.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attempt: Option<u32>,
        /// Set on an attempt that failed and was retried: the call went on.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        retried: bool,
    },
    /// The call carries its own `actor`.
    ActionDispatched {
        step: u32,
        call: ToolCall,
    },
    Observation {
        step: u32,
        observation: Observation,
    },
    /// The agent added a reminder to its transcript before asking its model: `kind` says
    /// why (`stale_files`: files it knows changed since it last read them, named in `paths`).
    Reminder {
        step: u32,
        #[serde(default, skip_serializing_if = "Actor::is_main")]
        actor: Actor,
        kind: String,
        #[serde(default)]
        paths: Vec<String>,
        text: String,
    },
    /// A call the agent handled itself (seed 001): a `cognitive` action changes only the
    /// agent (`delegate_task`, `enter_plan_mode`, `memory`) and never reaches the world; a
    /// `hybrid` one is a world call followed by the agent's own code (`exit_plan_mode`).
    /// `result` is what the agent's transcript got back; `error` is set when it refused.
    AgentAction {
        step: u32,
        #[serde(default, skip_serializing_if = "Actor::is_main")]
        actor: Actor,
        call_id: String,
        name: String,
        class: ActionClass,
        #[serde(default)]
        arguments: Value,
        #[serde(default)]
        result: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<crate::ToolError>,
    },
    /// A message of a conversation between the agent (`main`) and the task's user (`user`):
    /// the user's opening message, the agent's text replies, the user's answers to them.
    Said {
        step: u32,
        actor: Actor,
        text: String,
    },
    /// A fault of the episode, not of a tool call: tool errors are observations.
    Error {
        step: u32,
        cause: UnscoredCause,
        message: String,
    },
    Final {
        step: u32,
        call_id: String,
        answer: String,
    },
    /// One invocation of the memory agent (seed 002), when it ended: its control state,
    /// the calls it made directly and those the model wrote, and, when the model did not
    /// write the call asked for even after a reminder, why it ended without it.
    MemoryInvocation {
        step: u32,
        thread: String,
        session: String,
        control: String,
        /// The message's index in its session (from 1), for the controls that process one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<u32>,
        #[serde(default)]
        direct: Vec<String>,
        #[serde(default)]
        model: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// The memory agent's replay is over and it answers: what it stored, what it spent on
    /// storing and on answering, and which sessions its reads for the question found
    /// against the question's evidence sessions (`recall`: the share of them found).
    MemoryAnswered {
        step: u32,
        thread: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        question_type: Option<String>,
        #[serde(default)]
        abstention: bool,
        sessions: u32,
        entries: u32,
        #[serde(default)]
        entries_by_session: BTreeMap<String, u32>,
        /// Invocations that ended without the call the model was asked for.
        errors: u32,
        ingest_usage: Usage,
        answer_usage: Usage,
        #[serde(default)]
        evidence_sessions: Vec<String>,
        #[serde(default)]
        retrieved_sessions: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        recall: Option<f64>,
        /// The turns that hold the evidence, and those among the entries the reads
        /// returned; `turn_recall` is the share found.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        evidence_turns: Vec<TurnRef>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        retrieved_turns: Vec<TurnRef>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        turn_recall: Option<f64>,
    },
    /// The episode enters a stage: `ingest` (a memory agent replays its haystack, or
    /// restores a saved ingestion), `answer`, `judge` (the scorers). The episode's events
    /// that follow, up to the next `stage`, belong to it.
    Stage {
        stage: Stage,
        /// For `ingest`: the key of the ingestion, when it is shared.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ingestion: Option<String>,
    },
    /// A memory agent's episode restored a finished ingestion in place of replaying its
    /// haystack: its key, the episode that replayed it, the entries it holds and the model
    /// calls the replay made (none is made again).
    IngestReused {
        key: String,
        from_episode: String,
        entries: u32,
        model_calls: u32,
    },
    /// A replay's result was saved under its key, for the episodes that need the same one.
    IngestSaved {
        key: String,
        entries: u32,
        model_calls: u32,
    },
    /// The episode's ingest stage goes on from work its own earlier attempt did and that was
    /// killed before the episode finished: its replay, checkpointed or saved. That attempt's
    /// `model_calls`, `usage`, `cost_usd`, `steps`, `tool_calls` and `tool_errors` count in
    /// this episode, as they would have had it not been killed; `next` is the invocation the
    /// replay goes on from.
    IngestResumed {
        next: u32,
        model_calls: u32,
        usage: Usage,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost_usd: Option<f64>,
        /// The episode's steps and tool calls up to there, counted in this one's too.
        #[serde(default)]
        steps: u32,
        #[serde(default)]
        tool_calls: u32,
        #[serde(default)]
        tool_errors: u32,
    },
    /// The agent failed on its own (an external agent's program broke the protocol): the
    /// episode ends with `agent_error` and is scored, as any answer of the agent's is.
    AgentError {
        step: u32,
        message: String,
    },
    /// A `log` message of an external agent's program.
    AgentLog {
        step: u32,
        message: String,
    },
    /// A `usage` message of an external agent's program: counted in the episode's tokens
    /// and cost, and against its limits.
    AgentUsage {
        step: u32,
        #[serde(default)]
        model: Option<String>,
        usage: Usage,
        #[serde(default)]
        cost_usd: Option<f64>,
    },
    /// An external agent's program when its episode ended: its pid, how it exited (`None`
    /// when it was kept for another episode, or had to be killed), whether it was kept
    /// (`reuse: true`), and the tail of what it wrote on stderr during the episode.
    AgentProgram {
        pid: u32,
        #[serde(default)]
        exit: Option<String>,
        #[serde(default)]
        kept: bool,
        #[serde(default)]
        stderr_tail: String,
    },
    /// Whether a call may run, by the permission rules: which rule decided (none when no
    /// rule matched), the decision, and who made it.
    Permission {
        step: u32,
        call_id: String,
        tool: String,
        /// The rule as written, `run_command(rm *): deny`; `None` when no rule matched.
        rule: Option<String>,
        decision: PermissionDecision,
        decided_by: DecidedBy,
        /// The user's answer, when an `ask` rule was answered.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answer: Option<String>,
    },
    /// A call a script of the agent made through `execute_code` (`parent` is that call's
    /// id), with its observation. Not part of the agent's transcript, nor of its trajectory.
    InnerCall {
        step: u32,
        parent: String,
        call: ToolCall,
        observation: Observation,
    },
    /// A `cli` agent's program ended: its exit code (none when a signal ended it), how long
    /// it ran, and the end of its standard error.
    AgentExited {
        exit_code: Option<i32>,
        wall_ms: f64,
        stderr_tail: String,
    },
    /// A request the model gateway refused: a wrong or expired key (401), a limit reached
    /// (403), a shape it does not speak (400, `field` names what), the model failing behind
    /// it (502). `path` is the request's path. The path, field and message are cut to a few
    /// hundred bytes: a request chooses them.
    GatewayRefused {
        status: u16,
        path: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        field: Option<String>,
        message: String,
    },
    /// What the model gateway accepted from a program's client and let be, each logged the
    /// first time in the episode: request fields that do not change the answer
    /// (`client_metadata`, `store`, …) and server tools it cannot run, dropped from the tool
    /// list (`tools[8] (web_search)`). `path` is the request's path.
    GatewayIgnored {
        path: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        fields: Vec<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        dropped_tools: Vec<String>,
    },
    /// Refusals of the model gateway past the first ones of the episode, counted rather
    /// than logged one by one: how many, by status. Logged once, when the gateway stops.
    GatewayRefusals {
        count: u64,
        by_status: std::collections::BTreeMap<u16, u64>,
    },
    Score {
        /// Which scoring this belongs to: `initial` at run time, a new id per regrade.
        #[serde(default = "initial_scoring")]
        scoring_id: String,
        scorer: String,
        value: f64,
        passed: bool,
        #[serde(default = "one")]
        weight: f64,
        explanation: String,
        /// For LLM graders: model, template digest, raw outputs, agreement, tokens, cost.
        #[serde(default)]
        grader: Option<Value>,
        /// What the scorer checked (its argument and options): one value shared by the
        /// scorer's every score.
        #[serde(default)]
        check: std::sync::Arc<Value>,
    },
    EpisodeFinished {
        outcome: Outcome,
        termination: Termination,
        steps: u32,
        tool_calls: u32,
        tool_errors: u32,
        usage: Usage,
        /// `None` when a model call had no price in the config.
        cost_usd: Option<f64>,
        wall_ms: f64,
        /// From the start to the end of the agent's loop: `wall_ms` without setup and scoring.
        #[serde(default)]
        loop_ms: Option<f64>,
        /// What a simulated user's model calls used and cost, counted apart from the agent's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user_usage: Option<Usage>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user_cost_usd: Option<f64>,
        /// An `external` or `cli` agent's program: how it exited, how long it ran, its stderr.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent_program: Option<ProgramEnd>,
    },
    /// `runner eval --resume` continues the run: what follows runs the episodes that were
    /// missing or unscored; the scored ones are kept.
    RunResumed {
        runner_version: String,
        command_line: Vec<String>,
        /// Episodes to run now.
        episodes: u64,
        /// Scored episodes kept from before.
        kept: u64,
    },
    /// A re-scoring of a finished run begins (`runner regrade`).
    ScoringStarted {
        scoring_id: String,
        command_line: Vec<String>,
        grader: Option<String>,
        suites: Vec<SuiteInfo>,
    },
    /// An episode's outcome under a scoring; the latest scoring's outcome is the one that counts.
    EpisodeScored {
        scoring_id: String,
        outcome: Outcome,
    },
    ScoringFinished {
        scoring_id: String,
        episodes: u64,
        scored: u64,
        passed: u64,
        unscored: u64,
    },
    /// `--epochs auto`: after each epoch of a suite and model, the pass rate's interval (at
    /// `level`, alpha spent over the most epochs there can be) and what the rule decided:
    /// `continue`, `stop_narrow` (the interval is at most `ci_width` wide) or
    /// `stop_max_epochs`.
    EpochsDecided {
        suite: String,
        model: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        variant: Option<String>,
        epoch: u32,
        scored: u64,
        passed: u64,
        low: f64,
        high: f64,
        level: f64,
        ci_width: f64,
        decision: String,
    },
    /// A run-wide budget stopped scheduling: `scope` is `run` or `provider NAME`, `cap` the
    /// limit that the next episode could cross (`max_cost_usd`, `max_tokens`,
    /// `max_model_calls`), `limit` its value, `spent` what the run had spent then, `hard`
    /// whether the episodes in flight were cancelled.
    BudgetReached {
        scope: String,
        cap: String,
        limit: f64,
        spent: f64,
        hard: bool,
    },
    RunFinished {
        episodes: u64,
        scored: u64,
        passed: u64,
        unscored: u64,
        cancelled: u64,
        interrupted: bool,
        wall_ms: f64,
    },
}

impl Event {
    /// This event with its payloads (an observation's result and error message, an inner
    /// call's arguments and result, the free text of an `agent_log` or a `gateway_refused`)
    /// cut to about `bytes` each, with markers; `None` for an event that has none, or none
    /// that large.
    pub fn with_payloads_cut(&self, bytes: usize) -> Option<Event> {
        use crate::fit::{fit, fit_text};
        let text = |text: &str| fit_text(text, bytes);
        let cut_observation = |observation: &Observation| {
            let mut observation = observation.clone();
            let mut cut = false;
            if let Some(result) = &observation.tool_result {
                let (result, cut_result) = fit(result, bytes);
                observation.tool_result = Some(result);
                cut |= cut_result;
            }
            if let Some(error) = &mut observation.error {
                let (message, cut_message) = text(&error.message);
                error.message = message;
                cut |= cut_message;
            }
            (observation, cut)
        };
        match self {
            Event::Observation { step, observation } => {
                let (observation, cut) = cut_observation(observation);
                cut.then_some(Event::Observation { step: *step, observation })
            }
            Event::InnerCall { step, parent, call, observation } => {
                let (observation, cut_observation) = cut_observation(observation);
                let (arguments, cut_arguments) = fit(&call.arguments, bytes);
                let call = ToolCall { arguments, ..call.clone() };
                (cut_observation || cut_arguments).then(|| Event::InnerCall {
                    step: *step,
                    parent: parent.clone(),
                    call,
                    observation,
                })
            }
            Event::AgentLog { step, message } => {
                let (message, cut) = text(message);
                cut.then_some(Event::AgentLog { step: *step, message })
            }
            Event::GatewayRefused { status, path, field, message } => {
                let (path, cut_path) = text(path);
                let field = field.as_deref().map(text);
                let (message, cut_message) = text(message);
                let cut_field = field.as_ref().is_some_and(|(_, cut)| *cut);
                (cut_path || cut_field || cut_message).then(|| Event::GatewayRefused {
                    status: *status,
                    path,
                    field: field.map(|(field, _)| field),
                    message,
                })
            }
            _ => None,
        }
    }
}

/// The cause an episode is unscored with when a call's fault ends it.
impl From<CallFault> for UnscoredCause {
    fn from(fault: CallFault) -> Self {
        match fault {
            CallFault::ResourceExhausted => UnscoredCause::ResourceExhausted,
            CallFault::EnvironmentFailed => UnscoredCause::EnvironmentError,
            CallFault::UserFailed => UnscoredCause::UserError,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_named_cause_is_written_as_its_name_and_read_back() {
        for cause in UnscoredCause::NAMED {
            let written = serde_json::to_value(&cause).unwrap();
            assert_eq!(written, Value::String(cause.as_str().into()));
            assert_eq!(serde_json::from_value::<UnscoredCause>(written).unwrap(), cause);
        }
        assert_eq!(UnscoredCause::ResourceExhausted.as_str(), "resource_exhausted");
        assert_eq!(UnscoredCause::from_name("replay_miss"), UnscoredCause::ReplayMiss);
    }

    #[test]
    fn an_unknown_cause_in_a_log_is_read_and_written_back_unchanged() {
        let line = r#"{"status": "unscored", "cause": "quota_gone", "message": "m"}"#;
        let outcome: Outcome = serde_json::from_str(line).unwrap();
        let Outcome::Unscored { cause, .. } = &outcome else { panic!("{outcome:?}") };
        assert_eq!(*cause, UnscoredCause::Other("quota_gone".into()));
        assert_eq!(serde_json::to_value(&outcome).unwrap()["cause"], "quota_gone");
    }

    fn model_call(actor: Actor, scorer: Option<String>) -> Event {
        Event::ModelCall {
            model: "mock".into(),
            step: 1,
            request_digest: "d".into(),
            sampling: Default::default(),
            response: Value::Null,
            usage: Usage::default(),
            latency_ms: 12.5,
            attempts: 1,
            cache_hit: false,
            cost_usd: None,
            error: None,
            cause: None,
            url: None,
            request: None,
            raw_response: None,
            scorer,
            actor,
            status: None,
            attempt: None,
            retried: false,
        }
    }

    #[test]
    fn the_model_call_timing_view_reads_what_the_event_writes() {
        for scorer in [None, Some("rubric".to_string())] {
            let event = model_call(Actor::Main, scorer.clone());
            let view: ModelCallTiming = serde_json::from_value(serde_json::to_value(&event).unwrap()).unwrap();
            assert_eq!(view, ModelCallTiming { latency_ms: 12.5, usage: Usage::default(), scorer, actor: Actor::Main });
        }
    }

    #[test]
    fn the_episode_views_read_what_the_events_write() {
        let some_metadata: Map<String, Value> = serde_json::from_str(r#"{"level": "hard", "n": 3}"#).unwrap();
        for (toolset, variant, tags, metadata) in [
            (None, None, vec![], Map::new()),
            (Some("t".to_string()), Some("v".to_string()), vec!["math".to_string()], some_metadata),
        ] {
            let started = Event::EpisodeStarted {
                suite: "s".into(),
                task_id: "t1".into(),
                task_digest: "d".into(),
                model: "mock".into(),
                epoch: 3,
                environment: "kv".into(),
                toolset: toolset.clone(),
                variant: variant.clone(),
                sampling: Default::default(),
                digests: None,
                tags: tags.clone(),
                metadata: metadata.clone(),
            };
            let view: EpisodeStartedKey = serde_json::from_value(serde_json::to_value(&started).unwrap()).unwrap();
            let expected = EpisodeStartedKey {
                suite: "s".into(),
                task_id: "t1".into(),
                task_digest: "d".into(),
                model: "mock".into(),
                epoch: 3,
                toolset,
                variant,
                tags,
                metadata,
            };
            assert_eq!(view, expected);
        }
        let usage = Usage { input_tokens: 7, output_tokens: 2, cached_tokens: 1 };
        for cost_usd in [None, Some(0.25)] {
            let finished = Event::EpisodeFinished {
                outcome: Outcome::Scored { score: 0.5, passed: false },
                termination: Termination::MaxSteps,
                steps: 4,
                tool_calls: 3,
                tool_errors: 1,
                usage,
                cost_usd,
                wall_ms: 9.5,
                loop_ms: Some(8.0),
                user_usage: None,
                user_cost_usd: None,
                agent_program: None,
            };
            let view: EpisodeFinishedRow = serde_json::from_value(serde_json::to_value(&finished).unwrap()).unwrap();
            let expected = EpisodeFinishedRow {
                outcome: Outcome::Scored { score: 0.5, passed: false },
                termination: Termination::MaxSteps,
                steps: 4,
                tool_calls: 3,
                tool_errors: 1,
                usage,
                cost_usd,
                wall_ms: 9.5,
            };
            assert_eq!(view, expected);
        }
    }

    /// How overrides apply to a suite's limits is `budget::Limits::resolved`'s, tested there.
    #[test]
    fn limit_overrides_are_written_only_when_given() {
        let none = LimitOverrides::default();
        assert_eq!(none.as_flags(), "no limit flags");
        let given = LimitOverrides { time_s: Some(10.0), max_steps: Some(3), max_tokens: None, time_factor: Some(2.5) };
        assert_eq!(given.as_flags(), "--time-s 10 --max-steps 3 --time-factor 2.5");
        assert_eq!(serde_json::to_value(given).unwrap(), json!({"time_s": 10.0, "max_steps": 3, "time_factor": 2.5}));
    }

    #[test]
    fn causes_sort_by_name() {
        let mut causes =
            [UnscoredCause::RateLimited, UnscoredCause::Other("a_cause".into()), UnscoredCause::GraderError];
        causes.sort();
        let names: Vec<&str> = causes.iter().map(UnscoredCause::as_str).collect();
        assert_eq!(names, ["a_cause", "grader_error", "rate_limited"]);
    }

    #[test]
    fn a_model_call_names_its_actor_only_when_it_is_not_main() {
        let main = serde_json::to_value(model_call(Actor::Main, None)).unwrap();
        assert!(main.get("actor").is_none(), "{main}");
        let sub = serde_json::to_value(model_call(Actor::Subagent(vec![1]), None)).unwrap();
        assert_eq!(sub["actor"], json!("main.1"));
        assert_eq!(serde_json::from_value::<Event>(sub).unwrap(), model_call(Actor::Subagent(vec![1]), None));
        // Logs written before actors were named read as the main agent's.
        assert_eq!(serde_json::from_value::<Event>(main).unwrap(), model_call(Actor::Main, None));
    }

    #[test]
    fn a_reminder_reads_back_as_written_and_names_its_actor_only_when_not_main() {
        let reminder = |actor| Event::Reminder {
            step: 3,
            actor,
            kind: "stale_files".into(),
            paths: vec!["a.txt".into()],
            text: "a.txt changed".into(),
        };
        let main = serde_json::to_value(reminder(Actor::Main)).unwrap();
        assert_eq!(main["type"], "reminder");
        assert_eq!(main["paths"], json!(["a.txt"]));
        assert!(main.get("actor").is_none(), "{main}");
        assert_eq!(serde_json::from_value::<Event>(main).unwrap(), reminder(Actor::Main));
        let sub = serde_json::to_value(reminder(Actor::Subagent(vec![2]))).unwrap();
        assert_eq!(sub["actor"], "main.2");
    }

    #[test]
    fn a_dispatched_call_carries_its_actor() {
        let call = crate::ToolCall { actor: Actor::User, ..crate::ToolCall::new("c", "f", json!({})) };
        let event = serde_json::to_value(Event::ActionDispatched { step: 2, call }).unwrap();
        assert_eq!(event["call"]["actor"], "user");
    }
}
