//! Suite loading: `tasks/*.yaml` (and their datasets) into validated [`Suite`]s.
//!
//! Every mistake is reported with the file, line and column, and what was expected.

mod code;
pub mod dataset;
pub mod harbor;
pub mod locomo;
pub mod longmemeval;
pub mod promptfoo;
mod task_folder;
pub mod variants;

use crate::config::{decode, template, yaml};
use crate::contract::{ASK_USER, Actor, CLARIFY, ENTER_PLAN_MODE, EXIT_PLAN_MODE};
use crate::domain::scorer::ScorerSpec;
use crate::domain::{
    DEFAULT_SCRIPT_END, DEFAULT_STOP, MAX_EPISODE_S, MockCall, MockTurn, Reducer, Task, UserKind, UserSpec,
    is_relative_inside, text,
};

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::agent::AgentConfig;
use crate::budget::{EpisodeLimits, Limits};
use crate::environment::definition::Definition;
use crate::environment::permission::{self, Permissions};
use crate::log::event::LimitOverrides;
use crate::sandbox::SandboxMode;
use crate::scoring::{Check, GraderKind, JsonCheck, TextOp};
use decode::{ConfigError, Source};
use text::Text;

/// One loaded suite: shared settings plus its tasks.
#[derive(Debug)]
pub struct Suite {
    pub name: String,
    /// `cache: {share_epochs: true}`: the epochs of a task share the response cache (by
    /// default each epoch has its own entries, so `--epochs N` repeats are independent).
    pub share_epochs: bool,
    pub version: u32,
    pub description: String,
    pub path: std::path::PathBuf,
    /// SHA-256 of the suite file (and its dataset, when it has one).
    pub digest: String,
    pub environment: Arc<Definition>,
    /// `Off` when the suite says `sandbox: off`.
    pub sandbox: SandboxMode,
    /// The suite's permission rules, then its environment's: the first that matches a call decides.
    pub permissions: Arc<Permissions>,
    pub agent: AgentConfig,
    /// The limits of each episode, the command line's overrides applied.
    pub limits: EpisodeLimits,
    pub epochs: u32,
    /// How a task's scores over its epochs reduce to one.
    pub reducer: Reducer,
    /// A task passes when at least this many of its epochs pass; when set, a task that
    /// does not fails the run's gate.
    pub k_of_n: Option<u32>,
    pub pass_threshold: Option<f64>,
    /// A task passes when its weighted score reaches this; by default, when every
    /// scorer (with a weight) passes.
    pub pass_score: Option<f64>,
    pub grader: Option<GraderConfig>,
    pub scorers: Vec<ScorerSpec>,
    pub tasks: Vec<Task>,
    /// Tasks checked and not kept ([`LoadOptions::check_only`]): tasks of the suite
    /// besides `tasks`.
    pub tasks_checked: usize,
    /// Grader scorers that name no model in a suite without `grader:`, with where they
    /// are: an error unless `--grader` gives one.
    pub ungraded: Vec<ConfigError>,
    /// `toolsets:` with their `toolset_distribution:` weights, in name order; each episode
    /// draws one ([`Suite::toolset_for`]). Empty when the suite names none.
    pub toolsets: Vec<Toolset>,
    /// `variants:`, in the file's order: every task runs once under each. Empty when the
    /// suite names none (its episodes then run under the suite's own settings).
    pub variants: Vec<variants::Variant>,
    /// The models a promptfoo config's `providers:` name: the run's, when `--model` is not given.
    pub providers: Vec<String>,
    /// The HTTP endpoints among those models (a promptfoo config's `http` providers).
    pub endpoints: BTreeMap<String, Arc<crate::model::endpoint::Endpoint>>,
    /// What `--skip-unsupported` left out of a promptfoo config, one line each.
    pub skipped: Vec<String>,
}

/// How suite files are read.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// Leave out (and list) what runner does not support in a promptfoo config, instead of
    /// refusing it.
    pub skip_unsupported: bool,
    /// Read a promptfoo config's `file://` references outside the config's folder too.
    pub allow_outside_files: bool,
    /// The command line's limits over every suite's `limits:`, applied as it loads.
    pub limits: LimitOverrides,
    /// Check each task and keep none (`validate`): the load holds one dataset row at a
    /// time, however many the file has.
    pub check_only: bool,
}

/// A named list of the environment's tools an episode may be offered, and its weight.
#[derive(Debug)]
pub struct Toolset {
    pub name: String,
    pub tools: Vec<String>,
    pub weight: f64,
    /// The suite's environment narrowed to these tools.
    pub environment: Arc<Definition>,
}

impl Suite {
    /// The toolset an episode draws, from its id alone: the same in every run and shard.
    /// `None` when the suite names no toolsets.
    pub fn toolset_for(&self, episode_id: &str) -> Option<&Toolset> {
        let total: f64 = self.toolsets.iter().map(|t| t.weight).sum();
        let digest = Sha256::digest(format!("toolset\0{episode_id}").as_bytes());
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&digest[..8]);
        // A point in [0, total), uniform over the ids.
        let point = (u64::from_be_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64 * total;
        let mut reached = 0.0;
        let drawn = self.toolsets.iter().filter(|t| t.weight > 0.0).find(|t| {
            reached += t.weight;
            point < reached
        });
        drawn.or_else(|| self.toolsets.iter().rfind(|t| t.weight > 0.0))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraderConfig {
    pub model: String,
    /// A minijinja template for every grader scorer of the suite (a scorer's own wins).
    pub template: Option<String>,
}

fn one() -> u32 {
    1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SuiteFile {
    suite: String,
    #[serde(default = "one")]
    version: u32,
    #[serde(default)]
    description: String,
    /// A name (an environment file, a path, a built-in kind) or a mapping written as an
    /// environment file would be.
    environment: Value,
    /// The environment's tools this suite offers the agent, when not all of them.
    tools: Option<Vec<String>>,
    /// `off` runs the environment's processes unconfined.
    sandbox: Option<Value>,
    /// Ordered rules, each `- TOOL[(ARGUMENT)]: allow | deny | ask`; checked before the
    /// environment's own.
    #[serde(default)]
    permissions: Value,
    /// The agent, decoded by `AgentConfig::decode` (its kind decodes its own keys).
    #[serde(default)]
    #[allow(dead_code)]
    agent: Value,
    #[serde(default)]
    limits: Limits,
    #[serde(default = "one")]
    epochs: u32,
    #[serde(default)]
    reducer: Reducer,
    k_of_n: Option<u32>,
    pass_threshold: Option<f64>,
    pass_score: Option<f64>,
    grader: Option<GraderConfig>,
    /// How the suite uses the response cache (`--cache`).
    #[serde(default)]
    cache: CacheSettings,
    #[serde(default)]
    scorers: Vec<ScorerSpec>,
    /// The default script for `--model mock`, rendered per task.
    #[serde(default)]
    mock: Vec<MockTurn>,
    /// The default scripts of subagents for `--model mock`, keyed by actor (`main.1`).
    #[serde(default)]
    mock_subagents: BTreeMap<String, Vec<MockTurn>>,
    /// Each task is decoded on its own as it is parsed ([`load_with`]); left here only when
    /// it is not a list, for the decoder's error.
    #[serde(default)]
    #[allow(dead_code)]
    tasks: Vec<TaskFile>,
    /// The split of every task that names none of its own.
    split: Option<String>,
    dataset: Option<dataset::DatasetSpec>,
    /// Named lists of the environment's tools; each episode is offered one.
    #[serde(default)]
    toolsets: BTreeMap<String, Vec<String>>,
    /// The weight of each toolset (default: all equal).
    toolset_distribution: Option<BTreeMap<String, f64>>,
    /// Named overrides of `agent:`, `tools:` and the tasks' input; read by `variants::decode`.
    #[serde(default)]
    #[allow(dead_code)]
    variants: Value,
}

/// A suite's `cache:`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CacheSettings {
    /// The epochs of a task share cached responses.
    #[serde(default)]
    share_epochs: bool,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskFile {
    pub id: Text,
    pub input: Text,
    pub target: Option<Text>,
    #[serde(default)]
    pub files: BTreeMap<String, Text>,
    #[serde(default)]
    pub metadata: Map<String, Value>,
    /// Metadata shared with other tasks of the same file (a dataset reader's, never written).
    #[serde(skip)]
    pub shared: Option<Arc<crate::domain::SharedMetadata>>,
    #[serde(default)]
    pub scorers: Vec<ScorerSpec>,
    pub mock: Option<Vec<MockTurn>>,
    /// Scripts of subagents, keyed by actor (`main.1`); they replace the suite's.
    pub mock_subagents: Option<BTreeMap<String, Vec<MockTurn>>>,
    /// The user's answers to permission `ask` rules, in order.
    #[serde(default)]
    pub answers: Vec<Text>,
    /// The entries the agent's memory starts with: `{memory: [...], user: [...]}`.
    #[serde(default)]
    pub memory: crate::domain::NoteEntries,
    /// The task's user: `script:` or `simulated:`.
    pub user: Option<UserFile>,
    /// The user opens the episode and the agent talks with it until it says its stop word.
    #[serde(default)]
    pub conversation: bool,
    /// The turns `mock` plays as a simulated user: under `--model mock`, or when the user's
    /// model is `mock`.
    pub mock_user: Option<Vec<MockTurn>>,
    /// The reference solution: shell commands the `oracle` agent runs in order.
    #[serde(default)]
    pub solution: Vec<Text>,
    /// Labels that `--tag` selects tasks by.
    #[serde(default)]
    pub tags: Vec<String>,
    /// `{k, n}`: the task runs n epochs and passes when at least k of them pass.
    pub pass_k: Option<crate::domain::PassK>,
    /// The split the task belongs to (`train`, `test`, …), over the suite's.
    pub split: Option<String>,
}

/// A task's `user:` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UserFile {
    /// Replies in order.
    script: Option<Vec<Text>>,
    /// What a scripted user says once its script has run out.
    then: Option<Text>,
    simulated: Option<SimulatedFile>,
    /// The stop word of a scripted user (a simulated one names it under `simulated:`).
    stop: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SimulatedFile {
    model: String,
    #[serde(default)]
    persona: Text,
    #[serde(default)]
    instructions: Text,
    stop: Option<String>,
}

/// Reads a task's `user:`, `conversation:` and `mock_user:`; an error names the field.
fn user_spec(
    user: Option<UserFile>,
    conversation: bool,
    mock_user: Option<Vec<MockTurn>>,
    answers: &[String],
) -> Result<Option<Arc<UserSpec>>, (&'static str, String)> {
    let Some(user) = user else {
        if conversation {
            return Err(("conversation", "a conversation needs the task's `user:` (`script:` or `simulated:`)".into()));
        }
        if mock_user.is_some() {
            return Err(("mock_user", "`mock_user:` plays a simulated user: add `user: {simulated: …}`".into()));
        }
        return Ok(None);
    };
    if !answers.is_empty() {
        return Err((
            "answers",
            "the task has a `user:`, who answers the `ask` rules: put these in `user.script`".into(),
        ));
    }
    let nonempty = |stop: Option<String>, field: &'static str| match stop {
        Some(s) if s.trim().is_empty() => Err((field, "the stop word cannot be empty".to_string())),
        Some(s) => Ok(s),
        None => Ok(DEFAULT_STOP.to_owned()),
    };
    let (kind, stop) = match (user.script, user.simulated) {
        (Some(replies), None) => {
            let then = user.then.map_or_else(|| DEFAULT_SCRIPT_END.to_owned(), |t| t.0);
            let kind = UserKind::Scripted { replies: replies.into_iter().map(|r| r.0).collect(), then };
            (kind, nonempty(user.stop, "user.stop")?)
        }
        (None, Some(sim)) => {
            if user.then.is_some() || user.stop.is_some() {
                let message =
                    "`then` and `stop` belong to a scripted user; a simulated one names `stop` under `simulated:`";
                return Err(("user", message.into()));
            }
            if sim.model.trim().is_empty() {
                return Err(("user.simulated.model", "name the model that plays the user (`mock` offline)".into()));
            }
            let stop = nonempty(sim.stop, "user.simulated.stop")?;
            (UserKind::Simulated { model: sim.model, persona: sim.persona.0, instructions: sim.instructions.0 }, stop)
        }
        (Some(_), Some(_)) => return Err(("user", "a user is either `script:` or `simulated:`, not both".into())),
        (None, None) => {
            return Err((
                "user",
                "expected `script: [replies…]` or `simulated: {model, persona, instructions}`".into(),
            ));
        }
    };
    if matches!(kind, UserKind::Scripted { .. }) && mock_user.is_some() {
        return Err(("mock_user", "`mock_user:` plays a simulated user; this one is scripted".into()));
    }
    let mock = mock_user.unwrap_or_default().into();
    Ok(Some(Arc::new(UserSpec { kind, conversation, stop, mock })))
}

/// Loads and validates one suite file, or a Harbor task directory.
pub fn load(path: &Path) -> Result<Suite, ConfigError> {
    load_with(path, LoadOptions::default())
}

/// Loads and validates one suite file, a promptfoo config, or a Harbor task directory.
pub fn load_with(path: &Path, options: LoadOptions) -> Result<Suite, ConfigError> {
    if path.is_dir() {
        return harbor::load(path, &options.limits);
    }
    // Each task is decoded as soon as it is parsed: the file is never held whole as values.
    let mut written = Vec::new();
    let mut mistake = None;
    let (source, bytes) = Source::read_taking(path, "tasks", |i, value, items| {
        if mistake.is_none() {
            match items.decode::<TaskFile>(&yaml::item("tasks", i), &value) {
                Ok(task) => written.push(task),
                Err(e) => mistake = Some(e),
            }
        }
    })?;
    if !promptfoo::is_config(&source.value) {
        let decoded = (&source, bytes, (Vec::new(), Vec::new()));
        return from_source((path, &options), decoded, mistake.map_or(Ok(written), Err));
    }
    let translated = promptfoo::translate(&source, &options)?;
    let aliases = translated.aliases;
    let extra = (translated.providers, translated.skipped);
    let endpoints = translated.endpoints.into_iter().map(|(name, e)| (name, Arc::new(e))).collect();
    // Its errors name the config's parts (`tests[3].assert[1]`), not the suite's it became.
    let mut source = translated.source;
    let written = match source.value.get_mut("tasks") {
        Some(Value::Array(items)) => std::mem::take(items),
        _ => Vec::new(),
    };
    let written = written.iter().enumerate().map(|(i, t)| source.decode(&yaml::item("tasks", i), t)).collect();
    let suite = from_source((path, &options), (&source, bytes, extra), written)
        .map_err(|e| promptfoo::in_config_terms(e, &aliases))?;
    Ok(Suite { endpoints, ..suite })
}

/// A suite from its parsed file, with the providers and skipped parts of the promptfoo
/// config it came from, if it did: its settings checked, its agent and environment
/// resolved, then each task built and checked against them.
fn from_source(
    (path, options): (&Path, &LoadOptions),
    (source, bytes, (providers, skipped)): (&Source, Vec<u8>, (Vec<String>, Vec<String>)),
    written: Result<Vec<TaskFile>, ConfigError>,
) -> Result<Suite, ConfigError> {
    let mut file = decode_file(source)?;
    let written = written?;
    let mut hasher = Sha256::new();
    hasher.update(&bytes);
    check_settings(source, &file)?;
    let agent = AgentConfig::decode(source, source.value.get("agent"))?;
    // The depth subagents may reach, or `None` when the suite starts none.
    let reach = agent.settings.subagents().map(|(_, reach)| reach);
    check_actors(source, "mock_subagents", file.mock_subagents.keys(), reach)?;
    let environment = match &file.environment {
        Value::String(name) => Definition::resolve(name, path).map_err(|e| source.error("environment", e))?,
        Value::Object(_) => Arc::new(Definition::inline(source, &file.suite)?),
        _ => {
            let why = "a name (environments/NAME.yaml, a path, a built-in kind) or a mapping with `kind:`";
            return Err(source.error("environment", why));
        }
    };
    let environment = match &file.tools {
        Some(names) => environment.narrowed(names).map_err(|e| source.error("tools", e))?,
        None => environment,
    };
    let sandbox = suite_sandbox(source, file.sandbox.as_ref())?;
    // A `cli` agent's tools are its own, not the environment's: its scorers may name any.
    if !agent.kind.owns_its_tools() {
        check_tool_refs(source, "scorers", &file.scorers, &environment)?;
    }
    code::resolve(source, "scorers", &mut file.scorers, path.parent())?;
    let toolsets = toolsets(source, &file.toolsets, file.toolset_distribution.as_ref(), &environment)?;
    let variants = variants::resolve(source, &variants::decode(source)?, &agent, (&environment, !toolsets.is_empty()))?;
    let tools: Vec<&str> = environment.specs.iter().map(|t| t.name.as_str()).collect();
    let permissions = permission::parse_rules(&file.permissions, "suite", &tools)
        .map_err(|(at, e)| source.error(&at, e))?
        .then(&environment.permissions);
    let mut ungraded = ungraded(source, &file, "scorers", &file.scorers);
    let building = Building {
        source,
        path,
        agent: &agent,
        environment: &environment,
        variants: &variants,
        file: &file,
        reach,
        suite_mock: file.mock.clone().into(),
    };
    let mut tasks = Tasks { check_only: options.check_only, ..Tasks::default() };
    for (i, raw) in written.into_iter().enumerate() {
        let at = yaml::item("tasks", i);
        ungraded.extend(self::ungraded(source, &file, &yaml::child(&at, "scorers"), &raw.scorers));
        let task = building.written_task(&at, raw)?;
        tasks.add(&building, &at, task)?;
    }
    if let Some(spec) = &file.dataset {
        dataset::read(source, spec, &mut hasher, |row| {
            let task = build_task(row.task, &building.suite_mock, &file.mock_subagents)
                .map_err(|(field, e)| ConfigError::at(&row.file, row.position, format!("{field}: {e}")))?;
            tasks.add(&building, &row.origin, task).map_err(|e| ConfigError::at(&row.file, row.position, e.message))
        })?;
    }
    if tasks.kept.is_empty() && tasks.checked == 0 {
        return Err(source.error("tasks", "the suite has no tasks: add `tasks:` or a `dataset:`"));
    }
    Ok(Suite {
        name: file.suite,
        share_epochs: file.cache.share_epochs,
        version: file.version,
        description: file.description,
        path: path.to_owned(),
        digest: hex::encode(hasher.finalize()),
        environment,
        sandbox,
        permissions: Arc::new(permissions),
        agent,
        limits: file.limits.resolved(&options.limits),
        epochs: file.epochs,
        reducer: file.reducer,
        k_of_n: file.k_of_n,
        pass_threshold: file.pass_threshold,
        pass_score: file.pass_score,
        grader: file.grader,
        scorers: file.scorers,
        tasks: tasks.kept,
        tasks_checked: tasks.checked,
        ungraded,
        toolsets,
        variants,
        providers,
        endpoints: BTreeMap::new(),
        skipped,
    })
}

/// The suite file's keys but its tasks (decoded one at a time), `dataset: PATH` read as
/// `dataset: {path: PATH}`.
fn decode_file(source: &Source) -> Result<SuiteFile, ConfigError> {
    let Some(keys) = source.value.as_object() else {
        return Err(source.error("", "a suite must be a mapping with `suite`, `environment` and `tasks`"));
    };
    // Only the keys are copied, and what the tasks' places hold (`null`) is left out.
    let mut keys = keys.clone();
    if matches!(keys.get("tasks"), Some(Value::Array(_))) {
        keys.remove("tasks");
    }
    if let Some(Value::String(p)) = keys.get("dataset") {
        let short = json!({"path": p});
        keys.insert("dataset".into(), short);
    }
    source.decode("", &Value::Object(keys))
}

/// Refuses a suite-wide setting no run could use: no name, no epoch, a gate out of range,
/// limits that end every episode before it starts.
fn check_settings(source: &Source, file: &SuiteFile) -> Result<(), ConfigError> {
    if file.suite.trim().is_empty() {
        return Err(source.error("suite", "the suite needs a name"));
    }
    if file.epochs == 0 {
        return Err(source.error("epochs", "must be at least 1"));
    }
    if let Some(k) = file.k_of_n
        && (k == 0 || k > file.epochs)
    {
        return Err(source.error("k_of_n", format!("must be from 1 to the suite's epochs ({}), got {k}", file.epochs)));
    }
    for (key, value) in [("pass_threshold", file.pass_threshold), ("pass_score", file.pass_score)] {
        if let Some(t) = value
            && !(0.0..=1.0).contains(&t)
        {
            return Err(source.error(key, format!("must be between 0 and 1, got {t}")));
        }
    }
    if file.limits.max_steps == 0 {
        return Err(source.error("limits.max_steps", "must be at least 1"));
    }
    decode::check_seconds(source, "limits.time_s", file.limits.time_s, 0.001, MAX_EPISODE_S)?;
    if file.limits.max_tokens == Some(0) {
        return Err(source.error("limits.max_tokens", "must be at least 1"));
    }
    if let Some(usd) = file.limits.max_cost_usd
        && !(usd.is_finite() && usd > 0.0)
    {
        return Err(source.error("limits.max_cost_usd", format!("must be a positive number of USD, got {usd}")));
    }
    Ok(())
}

/// The suite's `sandbox:`: `off` runs the environment's processes unconfined.
fn suite_sandbox(source: &Source, given: Option<&Value>) -> Result<SandboxMode, ConfigError> {
    match given {
        None => Ok(SandboxMode::On),
        Some(Value::String(s)) if s == "off" => Ok(SandboxMode::Off("the suite")),
        Some(Value::Bool(false)) => Ok(SandboxMode::Off("the suite")),
        Some(Value::String(s)) if s == "on" => Ok(SandboxMode::On),
        Some(Value::Bool(true)) => Ok(SandboxMode::On),
        Some(_) => {
            let message = "expected `off` or `on`; the sandbox's settings belong in the environment file";
            Err(source.error("sandbox", message))
        }
    }
}

/// Grader scorers (of the suite or a task, at `at`) that name no model in a suite without
/// `grader:`, with where they are: an error unless `--grader` gives one.
fn ungraded(source: &Source, file: &SuiteFile, at: &str, scorers: &[ScorerSpec]) -> Vec<ConfigError> {
    if file.grader.is_some() {
        return Vec::new();
    }
    let mut ungraded = Vec::new();
    for (i, scorer) in scorers.iter().enumerate() {
        if let Check::Grader { model: None, .. } = scorer.check {
            ungraded.push(source.error(
                &yaml::item(at, i),
                format!(
                    "`{}` needs a grader model: set `grader: {{model: …}}` in the suite, `model:` on the scorer, \
                     or pass --grader",
                    scorer.name
                ),
            ));
        }
    }
    ungraded
}

/// What a suite's tasks are built and checked against: its file, its agent, its
/// environment, its variants.
struct Building<'a> {
    source: &'a Source,
    path: &'a Path,
    agent: &'a AgentConfig,
    environment: &'a Arc<Definition>,
    variants: &'a [variants::Variant],
    file: &'a SuiteFile,
    /// The depth subagents may reach, or `None` when the suite starts none.
    reach: Option<u32>,
    /// The suite's `mock:`, shared by the tasks whose script has no template.
    suite_mock: Arc<[MockTurn]>,
}

/// The tasks a load keeps, and the ids it has seen.
#[derive(Default)]
struct Tasks {
    kept: Vec<Task>,
    /// Tasks checked and not kept.
    checked: usize,
    check_only: bool,
    /// A fingerprint of each id seen (16 bytes of its SHA-256): a load that keeps no rows
    /// still finds an id given twice, without holding every id.
    seen: HashSet<[u8; 16]>,
}

impl Tasks {
    /// Checks `task` (at `at`) against the suite, then keeps it, or only counts it when
    /// the load keeps none.
    fn add(&mut self, building: &Building, at: &str, mut task: Task) -> Result<(), ConfigError> {
        let source = building.source;
        let agent = building.agent;
        let system = agent.system.as_deref().unwrap_or("");
        let subagent = agent.settings.subagents().map_or("", |(prompt, _)| prompt);
        let mut fingerprint = [0u8; 16];
        fingerprint.copy_from_slice(&Sha256::digest(task.id.as_bytes())[..16]);
        if !self.seen.insert(fingerprint) {
            return Err(source.error(&yaml::child(at, "id"), format!("duplicate task id `{}`", task.id)));
        }
        check_task(source, at, &task, (system, subagent), &building.file.scorers)?;
        variants::check_task(source, building.variants, &task)?;
        if self.check_only {
            self.checked += 1;
            return Ok(());
        }
        if task.split.is_none() {
            task.split.clone_from(&building.file.split);
        }
        self.kept.push(task);
        Ok(())
    }
}

impl Building<'_> {
    /// A task the suite writes (at `at`), built and checked: its scorers, its gate, its
    /// subagents' scripts, its files, its notes, and what its agent's kind asks of it.
    fn written_task(&self, at: &str, mut raw: TaskFile) -> Result<Task, ConfigError> {
        let (source, agent) = (self.source, self.agent);
        code::resolve(source, &yaml::child(at, "scorers"), &mut raw.scorers, self.path.parent())?;
        if let Some(pass_k) = &raw.pass_k {
            pass_k.check().map_err(|e| source.error(&yaml::child(at, "pass_k"), e))?;
        }
        if let Some(scripts) = &raw.mock_subagents {
            check_actors(source, &yaml::child(at, "mock_subagents"), scripts.keys(), self.reach)?;
        }
        if !agent.kind.owns_its_tools() {
            check_tool_refs(source, &yaml::child(at, "scorers"), &raw.scorers, self.environment)?;
        }
        for name in raw.files.keys() {
            if !is_relative_inside(name) {
                return Err(source.error(
                    &yaml::child(&yaml::child(at, "files"), name),
                    "file names must be relative paths inside the working directory",
                ));
            }
        }
        if !raw.memory.is_empty() && agent.settings.notes().is_none() {
            let message = "the task has memory entries, but the suite's agent has no `memory:`";
            return Err(source.error(&yaml::child(at, "memory"), message));
        }
        let task = build_task(raw, &self.suite_mock, &self.file.mock_subagents)
            .map_err(|(field, e)| source.error(&yaml::child(at, field), e))?;
        agent
            .kind
            .check_task(&agent.settings, &task)
            .map_err(|(field, e)| source.error(&yaml::child(at, &field), e))?;
        Ok(task)
    }
}

/// The suite's toolsets, each with its weight and its narrowed environment; every name and
/// weight checked.
fn toolsets(
    source: &Source,
    named: &BTreeMap<String, Vec<String>>,
    distribution: Option<&BTreeMap<String, f64>>,
    environment: &Arc<Definition>,
) -> Result<Vec<Toolset>, ConfigError> {
    if named.is_empty() {
        return match distribution {
            Some(_) => Err(source.error("toolset_distribution", "names toolsets, but the suite has no `toolsets:`")),
            None => Ok(Vec::new()),
        };
    }
    if let Some(weights) = distribution {
        if let Some(unknown) = weights.keys().find(|name| !named.contains_key(*name)) {
            let known: Vec<&str> = named.keys().map(String::as_str).collect();
            let message = format!("no toolset `{unknown}`; `toolsets:` names {}", known.join(", "));
            return Err(source.error(&yaml::child("toolset_distribution", unknown), message));
        }
        for (name, weight) in weights {
            if !(weight.is_finite() && *weight >= 0.0) {
                let message = format!("a weight is a number from 0 up, got {weight}");
                return Err(source.error(&yaml::child("toolset_distribution", name), message));
            }
        }
        if weights.values().sum::<f64>() <= 0.0 {
            return Err(source.error("toolset_distribution", "at least one weight must be above 0"));
        }
    }
    named
        .iter()
        .map(|(name, tools)| {
            let at = yaml::child("toolsets", name);
            if tools.is_empty() {
                return Err(source.error(&at, "a toolset lists at least one tool"));
            }
            let narrowed = environment.narrowed(tools).map_err(|e| source.error(&at, e))?;
            // Left out of the distribution, a toolset is never drawn.
            let weight = distribution.map_or(1.0, |w| w.get(name).copied().unwrap_or(0.0));
            Ok(Toolset { name: name.clone(), tools: tools.clone(), weight, environment: narrowed })
        })
        .collect()
}

/// Checks that the templates a task will meet render.
fn check_task(
    source: &Source,
    at: &str,
    task: &Task,
    (system, subagent): (&str, &str),
    suite_scorers: &[ScorerSpec],
) -> Result<(), ConfigError> {
    if suite_scorers.is_empty() && task.scorers.is_empty() {
        return Err(
            source.error(at, format!("task `{}` has no scorers: add `scorers:` to the suite or to the task", task.id))
        );
    }
    let ctx = task.template_context();
    template::render(system, &ctx).map_err(|e| source.error("agent.system", format!("in task `{}`: {e}", task.id)))?;
    template::render(subagent, &ctx)
        .map_err(|e| source.error("agent.subagent", format!("in task `{}`: {e}", task.id)))?;
    for (i, scorer) in suite_scorers.iter().chain(&task.scorers).enumerate() {
        let where_ = if i < suite_scorers.len() {
            yaml::item("scorers", i)
        } else {
            yaml::item(&yaml::child(at, "scorers"), i - suite_scorers.len())
        };
        for text in scorer.templates() {
            let rendered = template::render(text, &ctx)
                .map_err(|e| source.error(&where_, format!("in task `{}`: {e}", task.id)))?;
            let ignore_case = match scorer.check {
                Check::Text { op: TextOp::Regex, ignore_case, .. } => Some(ignore_case),
                Check::FileContains { regex: true, .. } => Some(false),
                _ => None,
            };
            // Compiled once per distinct pattern and kept for scoring; only a refusal is
            // compiled again, for its message.
            if let Some(ignore_case) = ignore_case
                && !crate::scoring::keep_pattern(&rendered, ignore_case)
            {
                regex::Regex::new(&rendered).map_err(|e| source.error(&where_, format!("invalid regex: {e}")))?;
            }
            if let Check::Numeric { .. } = scorer.check {
                // Read as the scorer reads it; a non-number would fail every episode.
                let problem = match rendered.trim().replace(',', "").parse::<f64>() {
                    Ok(x) if x.is_finite() => None,
                    Ok(_) => Some(format!("not a finite number: {rendered}")),
                    Err(_) => Some(format!("expected a number, found {rendered:?}")),
                };
                if let Some(problem) = problem {
                    return Err(source.error(&where_, format!("in task `{}`: `numeric`: {problem}", task.id)));
                }
            }
        }
        if let Check::Grader { kind: GraderKind::Qa, .. } = scorer.check
            && task.target.is_none()
        {
            return Err(
                source.error(&where_, format!("in task `{}`: `model_graded_qa` needs the task's `target`", task.id))
            );
        }
        if let Check::Json(JsonCheck::Schema(schema))
        | Check::Literal(crate::domain::scorer::Literal::Json { schema: Some(schema), .. }) = &scorer.check
        {
            jsonschema::validator_for(schema)
                .map_err(|e| source.error(&where_, format!("invalid JSON Schema: {e}")))?;
        }
    }
    Ok(())
}

/// Turns a task as written into a [`Task`]; an error names the field it is about.
pub(crate) fn build_task(
    raw: TaskFile,
    suite_mock: &Arc<[MockTurn]>,
    suite_mock_subagents: &BTreeMap<String, Vec<MockTurn>>,
) -> Result<Task, (&'static str, String)> {
    if raw.id.0.trim().is_empty() {
        return Err(("id", "a task needs a non-empty id".into()));
    }
    let files: BTreeMap<String, String> = raw.files.into_iter().map(|(k, v)| (k, v.0)).collect();
    let target = raw.target.map(|t| t.0);
    let answers: Vec<String> = raw.answers.into_iter().map(|a| a.0).collect();
    let user = user_spec(raw.user, raw.conversation, raw.mock_user, &answers)?;
    let digest = {
        let mut content = json!({"input": raw.input.0, "target": target, "files": files, "metadata": raw.metadata});
        // Only when there are any, so that the digests of tasks without them stay as they were.
        if !answers.is_empty() {
            content["answers"] = json!(answers);
        }
        if let Some(user) = &user {
            content["user"] = user_content(user);
        }
        if !raw.memory.is_empty() {
            content["memory"] = json!(raw.memory);
        }
        if let Some(shared) = &raw.shared {
            content["shared"] = json!(shared.digest);
        }
        hex::encode(Sha256::digest(content.to_string().as_bytes()))
    };
    let mut task = Task {
        id: raw.id.0,
        input: raw.input.0,
        target,
        files,
        metadata: raw.metadata,
        scorers: raw.scorers,
        mock: suite_mock.clone(),
        mock_subagents: Default::default(),
        answers,
        user,
        digest,
        memory: raw.memory,
        // Not part of the digest: like `mock:`, it is how the task is played, not the task.
        solution: raw.solution.into_iter().map(|c| c.0).collect(),
        unavailable: None,
        copies: Vec::new(),
        tags: raw.tags,
        pass_k: raw.pass_k,
        split: raw.split,
        shared: raw.shared,
    };
    let ctx = task.template_context();
    let render_script = |script: &[MockTurn]| -> Result<Arc<[MockTurn]>, String> {
        if script.iter().any(turn_has_template) {
            Ok(script.iter().map(|t| render_turn(t, &ctx)).collect::<Result<Vec<_>, _>>()?.into())
        } else {
            Ok(script.to_vec().into())
        }
    };
    let scripts = raw.mock_subagents.as_ref().unwrap_or(suite_mock_subagents);
    let mock_subagents = scripts
        .iter()
        .map(|(actor, script)| Ok((actor.clone(), render_script(script)?)))
        .collect::<Result<BTreeMap<_, _>, String>>()
        .map_err(|e| ("mock_subagents", e))?;
    task.mock_subagents = Arc::new(mock_subagents);
    let script: &[MockTurn] = match &raw.mock {
        Some(turns) => turns,
        None => suite_mock,
    };
    if script.iter().any(turn_has_template) {
        let ctx = task.template_context();
        let rendered = script.iter().map(|t| render_turn(t, &ctx)).collect::<Result<Vec<_>, _>>();
        task.mock = rendered.map_err(|e| ("mock", e))?.into();
    } else if let Some(turns) = raw.mock {
        task.mock = turns.into();
    }
    Ok(task)
}

/// The keys of a `mock_subagents:` mapping name subagents: `main.1`, `main.1.2`, …
/// Checks that each key of a `mock_subagents` names a subagent that can run: one the
/// suite starts (`agent.subagent`), no deeper than `reach` (its `max_depth`).
fn check_actors<'a>(
    source: &Source,
    at: &str,
    keys: impl Iterator<Item = &'a String>,
    reach: Option<u32>,
) -> Result<(), ConfigError> {
    for key in keys {
        let actor = match Actor::parse(key) {
            Ok(actor @ Actor::Subagent(_)) => actor,
            _ => {
                let message =
                    format!("`{key}` is not a subagent: the keys are actors `main.1`, `main.2`, `main.1.1`, …");
                return Err(source.error(at, message));
            }
        };
        let Some(max_depth) = reach else {
            let message = format!("`{key}` can never run: the suite starts no subagents without `agent.subagent`");
            return Err(source.error(at, message));
        };
        if actor.depth() > max_depth {
            let message =
                format!("`{key}` is at depth {} and can never run: `agent.max_depth` is {max_depth}", actor.depth());
            return Err(source.error(at, message));
        }
    }
    Ok(())
}

/// What of a task's user is part of its content (and so of its episodes' ids): not the
/// turns `mock` plays, as a task's own `mock:` is not.
fn user_content(user: &UserSpec) -> Value {
    let kind = match &user.kind {
        UserKind::Scripted { replies, then } => json!({"script": replies, "then": then}),
        UserKind::Simulated { model, persona, instructions } => {
            json!({"simulated": {"model": model, "persona": persona, "instructions": instructions}})
        }
    };
    json!({"user": kind, "conversation": user.conversation, "stop": user.stop})
}

fn turn_has_template(turn: &MockTurn) -> bool {
    fn value_has(v: &Value) -> bool {
        match v {
            Value::String(s) => template::is_template(s),
            Value::Array(a) => a.iter().any(value_has),
            Value::Object(o) => o.values().any(value_has),
            _ => false,
        }
    }
    turn.text.as_ref().is_some_and(|t| template::is_template(&t.0))
        || turn.tool_calls.iter().any(|c| value_has(&c.arguments))
}

fn render_turn(turn: &MockTurn, ctx: &Map<String, Value>) -> Result<MockTurn, String> {
    Ok(MockTurn {
        text: turn.text.as_ref().map(|t| template::render(&t.0, ctx).map(Text)).transpose()?,
        tool_calls: turn
            .tool_calls
            .iter()
            .map(|c| {
                Ok(MockCall {
                    name: c.name.clone(),
                    arguments: template::render_value(&c.arguments, ctx)?,
                    id: c.id.clone(),
                })
            })
            .collect::<Result<_, String>>()?,
    })
}

fn check_tool_refs(source: &Source, at: &str, scorers: &[ScorerSpec], env: &Definition) -> Result<(), ConfigError> {
    for (i, scorer) in scorers.iter().enumerate() {
        for name in scorer.tools() {
            // The user's tools and plan mode's are offered by tasks and agents, not environments;
            // tools not yet discovered are checked once they are (`discover_tools`).
            let elsewhere = [ASK_USER, CLARIFY, ENTER_PLAN_MODE, EXIT_PLAN_MODE].contains(&name);
            let pending = env.undiscovered && env.expose.as_ref().is_none_or(|e| e.iter().any(|t| t == name));
            if env.tool(name).is_none() && !elsewhere && !pending {
                let known: Vec<&str> = env.specs.iter().map(|t| t.name.as_str()).collect();
                return Err(source.error(
                    &yaml::child(&yaml::item(at, i), &scorer.name),
                    format!("unknown tool `{name}`: environment `{}` has {}", env.name, known.join(", ")),
                ));
            }
        }
    }
    Ok(())
}

/// The suites with their environments' tools discovered (MCP servers started once, listed
/// and stopped), each scorer's tool checked against them. Suites whose optional
/// environment is not installed are left out, with a note; an environment whose discovery
/// failed is kept as it is (its episodes are unscored), with a note.
pub async fn discover_tools(
    suites: Vec<Arc<Suite>>,
    sandbox: impl Fn(&Suite) -> SandboxMode,
) -> Result<(Vec<Arc<Suite>>, Vec<String>), Vec<String>> {
    let mut kept = Vec::new();
    let mut notes = Vec::new();
    let mut errors = Vec::new();
    for suite in suites {
        if !suite.environment.undiscovered {
            kept.push(suite);
            continue;
        }
        let env = &suite.environment;
        if let Some((server, command)) =
            crate::environment::kinds::mcp::spec_of(env).filter(|m| m.optional).and_then(|m| m.missing_command())
        {
            notes.push(format!(
                "{}: skipped suite `{}`: environment `{}` is optional and its server `{server}` needs `{command}`, \
                 which is not installed",
                suite.path.display(),
                suite.name,
                env.name
            ));
            continue;
        }
        let discovered = match env.discovered(sandbox(&suite)).await {
            Ok(d) => d,
            Err(e) => {
                // Each episode starts the servers again, and is unscored with what they said.
                notes.push(format!(
                    "{}: environment `{}`: its tools could not be discovered, its episodes will be unscored: {e}",
                    suite.path.display(),
                    env.name
                ));
                kept.push(suite);
                continue;
            }
        };
        let scorers = suite
            .scorers
            .iter()
            .map(|s| ("suite", s))
            .chain(suite.tasks.iter().flat_map(|t| t.scorers.iter().map(move |s| (t.id.as_str(), s))));
        let mut unknown = Vec::new();
        for (owner, scorer) in scorers {
            for name in scorer.tools() {
                if discovered.tool(name).is_none() {
                    unknown.push(format!("scorer `{}` of {owner} names tool `{name}`", scorer.name));
                }
            }
        }
        if !unknown.is_empty() {
            let known: Vec<&str> = discovered.specs.iter().map(|t| t.name.as_str()).collect();
            errors.push(format!(
                "{}: {}; environment `{}` offers: {}",
                suite.path.display(),
                unknown.join("; "),
                discovered.name,
                known.join(", ")
            ));
            continue;
        }
        match Arc::try_unwrap(suite) {
            Ok(owned) => {
                let toolsets: Result<Vec<Toolset>, String> = owned
                    .toolsets
                    .iter()
                    .map(|t| {
                        let environment = discovered.narrowed(&t.tools)?;
                        Ok(Toolset { name: t.name.clone(), tools: t.tools.clone(), weight: t.weight, environment })
                    })
                    .collect();
                match toolsets {
                    Ok(toolsets) => kept.push(Arc::new(Suite { environment: discovered, toolsets, ..owned })),
                    Err(e) => errors.push(format!("{}: toolsets: {e}", owned.path.display())),
                }
            }
            Err(shared) => {
                errors.push(format!("{}: the suite is in use and cannot be completed", shared.path.display()))
            }
        }
    }
    if errors.is_empty() { Ok((kept, notes)) } else { Err(errors) }
}

/// Loads several suite files (or Harbor task directories); suite names must be unique
/// across them.
pub fn load_all(paths: &[std::path::PathBuf]) -> Result<Vec<Arc<Suite>>, Vec<ConfigError>> {
    load_all_with(paths, LoadOptions::default())
}

/// Loads several suite files as `options` say; suite names must be unique across them.
pub fn load_all_with(paths: &[std::path::PathBuf], options: LoadOptions) -> Result<Vec<Arc<Suite>>, Vec<ConfigError>> {
    let mut suites: Vec<Arc<Suite>> = Vec::new();
    let mut errors = Vec::new();
    for path in paths {
        match load_with(path, options) {
            Ok(suite) => {
                if let Some(other) = suites.iter().find(|s| s.name == suite.name) {
                    errors.push(ConfigError::whole(
                        path,
                        format!("suite name `{}` is already used by {}", suite.name, other.path.display()),
                    ));
                } else {
                    suites.push(Arc::new(suite));
                }
            }
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() { Ok(suites) } else { Err(errors) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suite_with(weights: &[(&str, f64)]) -> Suite {
        let mut suite = plain_suite();
        let environment = suite.environment.clone();
        suite.toolsets = weights
            .iter()
            .map(|(name, weight)| Toolset {
                name: (*name).into(),
                tools: Vec::new(),
                weight: *weight,
                environment: environment.clone(),
            })
            .collect();
        suite
    }

    fn plain_suite() -> Suite {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("s.yaml");
        std::fs::write(&path, "suite: s\nenvironment: kv\nscorers: [{includes: x}]\ntasks: [{id: a, input: hi}]\n")
            .unwrap_or_else(|e| panic!("{e}"));
        load(&path).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Regression: the loader compiled every regex of every task again to check it, and
    /// threw it away: most of the CPU of a 1,000-test suite of regex scorers.
    #[test]
    fn the_loader_keeps_the_patterns_it_checks_for_scoring() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("s.yaml");
        let yaml = "suite: s\nenvironment: kv\nscorers:\n  - regex: '^kept by the loader \\d+$'\n  \
                    - {regex: 'also kept {{ target }}', ignore_case: true}\ntasks:\n  \
                    - {id: a, input: hi, target: one}\n  - {id: b, input: hi, target: two}\n";
        std::fs::write(&path, yaml).unwrap_or_else(|e| panic!("{e}"));
        load(&path).unwrap_or_else(|e| panic!("{e}"));
        let patterns = &crate::scoring::PATTERNS;
        assert!(patterns.kept(r"^kept by the loader \d+$", false), "the fixed pattern was not kept");
        assert!(patterns.kept("also kept one", true) && patterns.kept("also kept two", true), "rendered ones");
        assert!(!patterns.kept("also kept one", false), "kept under its own case setting");
    }

    fn dataset_suite(rows: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let path = dir.path().join("s.yaml");
        let suite = "suite: s\nenvironment: kv\nscorers: [{equals: '{{ target }}'}]\ndataset: rows.csv\n";
        std::fs::write(&path, suite).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join("rows.csv"), rows).unwrap_or_else(|e| panic!("{e}"));
        (dir, path)
    }

    /// The dataset is digested as it is read, row by row: the suite's digest must stay the
    /// one of the whole files, or `--since` would stop reusing the runs made before.
    #[test]
    fn a_streamed_dataset_keeps_the_digest_of_the_whole_files() {
        let rows = "id,input,target\na,\"one, \"\"quoted\"\"\",1\nb,\"two\nlines\",2\n";
        let (dir, path) = dataset_suite(rows);
        let suite = load(&path).unwrap_or_else(|e| panic!("{e}"));
        let mut whole = Sha256::new();
        whole.update(std::fs::read(&path).unwrap_or_else(|e| panic!("{e}")));
        whole.update(rows.as_bytes());
        assert_eq!(suite.digest, hex::encode(whole.finalize()));
        assert_eq!(suite.tasks.len(), 2);
        drop(dir);
    }

    #[test]
    fn a_load_that_only_checks_keeps_no_task_and_still_finds_an_id_twice() {
        let (_dir, path) = dataset_suite("id,input,target\na,x,1\nb,y,2\nc,z,3\n");
        let options = LoadOptions { check_only: true, ..LoadOptions::default() };
        let suite = load_with(&path, options).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((suite.tasks.len(), suite.tasks_checked), (0, 3));
        let (_dir, path) = dataset_suite("id,input,target\na,x,1\nb,y,2\na,z,3\n");
        let error = load_with(&path, options).err().unwrap_or_else(|| panic!("`a` is there twice"));
        assert!(error.message.contains("duplicate task id `a`"), "{error}");
        assert_eq!(error.position.map(|p| p.line), Some(4), "{error}");
    }

    #[test]
    fn a_draw_follows_the_weights_and_depends_on_the_episode_id_alone() {
        let suite = suite_with(&[("a", 1.0), ("b", 3.0), ("never", 0.0)]);
        let mut counts = BTreeMap::<&str, u32>::new();
        for i in 0..4000 {
            let id = format!("ep_{i:016x}");
            let drawn = suite.toolset_for(&id).map(|t| t.name.as_str()).unwrap_or_default();
            assert_eq!(suite.toolset_for(&id).map(|t| t.name.as_str()), Some(drawn), "the same id draws the same");
            *counts.entry(drawn).or_default() += 1;
        }
        assert!(!counts.contains_key("never"), "{counts:?}");
        let share_b = f64::from(counts["b"]) / 4000.0;
        assert!((0.72..0.78).contains(&share_b), "b has 3 of 4 parts of the weight: {counts:?}");
        assert!(suite_with(&[]).toolset_for("ep_1").is_none());
    }
}
