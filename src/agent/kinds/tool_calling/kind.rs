//! `kind: tool_calling` as a suite names it: its own keys of `agent:` (final answer,
//! subagents, plan mode, notes, session search), the settings they decode into, and the
//! agent built from them for an episode.

use std::path::Path;
use std::sync::Arc;

use super::ToolCallingAgent;
use super::notes::{NotesConfig, Stores};
use super::session_search::{DEFAULT_HITS, MAX_HITS, SessionSearch, SessionSearchConfig};
use super::subagents::Subagents;
use crate::agent::kinds::{AgentKind, AgentSettings};
use crate::agent::{Agent, AgentSetup, Lent};
use crate::config::decode::ConfigError;
use crate::config::kind_keys::KindKeys;
use crate::config::{template, yaml};
use crate::domain::Task;

/// How many `delegate_task` calls of one turn run at once, unless the suite says.
pub const DEFAULT_MAX_CHILDREN: u32 = 3;
/// How deep the tree of agents may grow, unless the suite says.
pub const DEFAULT_MAX_DEPTH: u32 = 2;

/// The default kind: the model proposes tool calls, the agent passes them on.
pub struct ToolCalling;

/// What a suite's `agent:` says of a tool-calling agent.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// When true, a plain text answer does not end the episode: the agent is reminded to
    /// call `final_answer`.
    pub require_final_answer: bool,
    /// The system prompt of a subagent, a template over the task's fields. When set, the
    /// agent is offered `delegate_task`.
    pub subagent: Option<String>,
    /// How many `delegate_task` calls of one turn run at once ([`DEFAULT_MAX_CHILDREN`]).
    pub max_children: Option<u32>,
    /// How deep the tree of agents may grow: the main agent is at depth 0, its children
    /// at 1 ([`DEFAULT_MAX_DEPTH`]).
    pub max_depth: Option<u32>,
    /// When true, the agent offers `enter_plan_mode` (and, in plan mode, `exit_plan_mode`).
    pub plan_mode: bool,
    /// The bounded notes (`memory:`): the `memory` tool and its stores in the system prompt.
    pub notes: Option<NotesConfig>,
    /// `session_search` over earlier runs, their folders checked when the suite loaded.
    pub session_search: Option<Arc<SessionSearch>>,
}

impl Settings {
    /// The depth subagents may reach.
    pub fn reach(&self) -> u32 {
        self.max_depth.unwrap_or(DEFAULT_MAX_DEPTH)
    }
}

impl AgentKind for ToolCalling {
    fn name(&self) -> &'static str {
        "tool_calling"
    }

    fn keys(&self) -> &'static [&'static str] {
        &["require_final_answer", "subagent", "max_children", "max_depth", "plan_mode", "memory", "session_search"]
    }

    fn variant_keys(&self) -> &'static [&'static str] {
        &["require_final_answer", "subagent", "max_children", "max_depth", "plan_mode"]
    }

    fn decode(&self, keys: &KindKeys<'_>) -> Result<AgentSettings, ConfigError> {
        let over = Settings::default().over(keys)?;
        let notes: Option<NotesConfig> = keys.decode("memory")?;
        if let Some(notes) = &notes {
            notes.check().map_err(|(field, e)| keys.error(&yaml::child("memory", field), e))?;
        }
        let session_search = match keys.decode::<SessionSearchConfig>("session_search")? {
            Some(config) => Some(searched_runs(keys, &config)?),
            None => None,
        };
        Ok(AgentSettings::ToolCalling(Settings { notes, session_search, ..over }))
    }

    fn over(&self, settings: &AgentSettings, variant: &KindKeys<'_>) -> Result<AgentSettings, ConfigError> {
        match settings {
            AgentSettings::ToolCalling(settings) => Ok(AgentSettings::ToolCalling(settings.over(variant)?)),
            other => Ok(other.clone()),
        }
    }

    fn check_task(&self, settings: &AgentSettings, task: &Task) -> Result<(), (String, String)> {
        let (Some(notes), false) = (settings.notes(), task.memory.is_empty()) else { return Ok(()) };
        Stores::checked(notes, &task.memory)
            .map(|_| ())
            .map_err(|(store, i, why)| (yaml::item(&yaml::child("memory", store), i), why))
    }

    fn build(&self, setup: AgentSetup<'_>, _lent: Lent) -> Box<dyn Agent> {
        let AgentSettings::ToolCalling(settings) = &setup.config.settings else {
            return Box::new(ToolCallingAgent::new(setup.model, &setup.model_name, setup.system, false));
        };
        let mut agent = ToolCallingAgent::new(
            setup.model.clone(),
            &setup.model_name,
            setup.system.clone(),
            settings.require_final_answer,
        );
        if let Some(stores) = setup.notes.clone() {
            agent = agent.with_memory(stores);
        }
        if settings.plan_mode {
            agent = agent.with_plan_mode();
        }
        if setup.conversation {
            agent = agent.in_conversation();
        }
        if let Some(subagents) = subagents(settings, &setup) {
            agent = agent.with_subagents(subagents);
        }
        if let Some(search) = settings.session_search.clone() {
            agent = agent.with_session_search(search, &setup.task.id);
        }
        Box::new(agent)
    }
}

impl Settings {
    /// These settings with the keys of `given` over them, each checked.
    fn over(&self, given: &KindKeys<'_>) -> Result<Settings, ConfigError> {
        let mut settings = self.clone();
        if let Some(text) = given.decode::<String>("subagent")? {
            settings.subagent = Some(text);
        }
        settings.require_final_answer = given.decode("require_final_answer")?.unwrap_or(settings.require_final_answer);
        settings.plan_mode = given.decode("plan_mode")?.unwrap_or(settings.plan_mode);
        for key in ["max_children", "max_depth"] {
            let Some(value) = given.decode::<u32>(key)? else { continue };
            if value == 0 {
                return Err(given.error(key, "must be at least 1"));
            }
            if settings.subagent.is_none() {
                return Err(given.error(key, "has no effect without `agent.subagent`, the subagents' system prompt"));
            }
            match key {
                "max_children" => settings.max_children = Some(value),
                _ => settings.max_depth = Some(value),
            }
        }
        Ok(settings)
    }
}

/// The suite's subagents for one episode, when it has them: their prompt rendered for the
/// task, and each child's model as the episode's cast gives it.
fn subagents(settings: &Settings, setup: &AgentSetup<'_>) -> Option<Arc<Subagents>> {
    let template = settings.subagent.as_deref()?;
    let system = template::render(template, &setup.task.template_context())
        .unwrap_or_else(|e| format!("(the subagent prompt failed to render: {e})"));
    Some(Arc::new(Subagents {
        system,
        max_children: settings.max_children.unwrap_or(DEFAULT_MAX_CHILDREN),
        max_depth: settings.reach(),
        models: setup.subagent_models.clone(),
        model_name: setup.model_name.clone(),
        require_final_answer: settings.require_final_answer,
    }))
}

/// The runs `session_search` names: run folders (relative to the suite file) that hold a
/// log, opened once for the whole run.
fn searched_runs(keys: &KindKeys<'_>, config: &SessionSearchConfig) -> Result<Arc<SessionSearch>, ConfigError> {
    if config.runs.is_empty() {
        let message = "names no run: list run folders, such as ../results/baseline";
        return Err(keys.error("session_search.runs", message));
    }
    if let Some(limit) = config.limit
        && !(1..=MAX_HITS).contains(&limit)
    {
        return Err(keys.error("session_search.limit", format!("must be from 1 to {MAX_HITS}, got {limit}")));
    }
    let folder = keys.path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut runs = Vec::new();
    for (i, run) in config.runs.iter().enumerate() {
        let dir = folder.join(run);
        if !dir.join("events.jsonl").is_file() {
            let message = format!(
                "no run at {} (a run folder holds events.jsonl; the path is relative to the suite file)",
                dir.display()
            );
            return Err(keys.error(&yaml::item("session_search.runs", i), message));
        }
        runs.push(dir);
    }
    let limit = config.limit.unwrap_or(DEFAULT_HITS);
    Ok(Arc::new(SessionSearch::new(runs, limit, config.same_task)))
}
