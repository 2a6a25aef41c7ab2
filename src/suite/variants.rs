//! A suite's `variants:`: named overrides of its `agent:`, its `tools:` and its tasks' input
//! (`prompt:`). Each is a dimension of the run like `--model`: every task runs once under
//! each variant, and the variants pair by task in the summary and in `compare`.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use super::AgentConfig;
use crate::config::decode::{ConfigError, Source};
use crate::config::{template, yaml};
use crate::domain::Task;
use crate::environment::definition::Definition;

/// One variant, its overrides already applied to the suite's settings.
#[derive(Debug)]
pub struct Variant {
    pub name: String,
    /// The suite's `agent:` with the variant's keys over it.
    pub agent: AgentConfig,
    /// The task's input under this variant: a template over the task's fields (`{{ input }}`,
    /// `{{ target }}`, a dataset's columns).
    pub prompt: Option<String>,
    /// The environment narrowed to the variant's `tools:`, when it names them.
    pub environment: Option<Arc<Definition>>,
}

impl Variant {
    /// The task as this variant asks it: its input rendered from `prompt:` when there is one.
    pub fn task<'a>(&self, task: &'a Task) -> Cow<'a, Task> {
        let Some(prompt) = &self.prompt else { return Cow::Borrowed(task) };
        // Every prompt was rendered against every task when the suite loaded.
        let input = template::render(prompt, &task.template_context())
            .unwrap_or_else(|e| format!("(the variant's prompt failed to render: {e})"));
        Cow::Owned(Task { input, ..task.clone() })
    }
}

/// A variant as written: every key optional, none but these.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VariantFile {
    #[serde(default)]
    agent: AgentOverride,
    /// The task's input, a template over its fields.
    prompt: Option<String>,
    /// The environment's tools this variant offers, over the suite's `tools:`.
    tools: Option<Vec<String>>,
}

/// The keys of `agent:` a variant may set. The kind and a program's keys are the suite's:
/// a variant changes how the same agent is asked, not which agent runs.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct AgentOverride {
    system: Option<String>,
    require_final_answer: Option<bool>,
    subagent: Option<String>,
    max_children: Option<u32>,
    max_depth: Option<u32>,
    plan_mode: Option<bool>,
    /// `memory` agents: prompts over the suite's, each one given replacing its own.
    prompts: Option<crate::agent::memory_agent::MemoryPrompts>,
    flush_every: Option<u32>,
    /// Over the suite's `agent.sampling`, key by key.
    sampling: Option<serde_json::Map<String, Value>>,
}

/// A variant's name: it appears in episode ids, tables and labels.
fn check_name(name: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty() || !name.chars().all(allowed) {
        return Err(format!("`{name}` is not a variant name: use letters, digits, `.`, `_` and `-`"));
    }
    Ok(())
}

/// The suite's variants in the order the file gives them (the first is the one `compare`
/// gates the others against), each checked and applied over `agent` and `environment`.
pub(crate) fn resolve(
    source: &Source,
    written: &BTreeMap<String, VariantFile>,
    agent: &AgentConfig,
    (environment, toolsets): (&Arc<Definition>, bool),
) -> Result<Vec<Variant>, ConfigError> {
    let mut names: Vec<&String> = written.keys().collect();
    names.sort_by_key(|name| {
        let at = source.locations.find(&yaml::child("variants", name));
        (at.line, at.column)
    });
    let mut variants = Vec::with_capacity(names.len());
    for name in names {
        let at = yaml::child("variants", name);
        check_name(name).map_err(|e| source.error(&at, e))?;
        let file = &written[name];
        let over = &file.agent;
        let mut merged = agent.clone();
        if let Some(system) = &over.system {
            merged.system = Some(system.clone());
        }
        if let Some(subagent) = &over.subagent {
            merged.subagent = Some(subagent.clone());
        }
        merged.require_final_answer = over.require_final_answer.unwrap_or(merged.require_final_answer);
        merged.plan_mode = over.plan_mode.unwrap_or(merged.plan_mode);
        merged.max_children = over.max_children.or(merged.max_children);
        merged.max_depth = over.max_depth.or(merged.max_depth);
        let agent_at = yaml::child(&at, "agent");
        if over.prompts.is_some() || over.flush_every.is_some() {
            let key = if over.prompts.is_some() { "prompts" } else { "flush_every" };
            if merged.kind != crate::agent::AgentKind::Memory {
                return Err(source.error(&yaml::child(&agent_at, key), "is for `kind: memory` agents only"));
            }
            if over.flush_every == Some(0) {
                return Err(source.error(&yaml::child(&agent_at, "flush_every"), "must be at least 1"));
            }
            merged.flush_every = over.flush_every.or(merged.flush_every);
            if let Some(own) = &over.prompts {
                merged.prompts = Some(own.clone().over(merged.prompts.take().unwrap_or_default()));
            }
        }
        if let Some(sampling) = &over.sampling {
            crate::model::config::check_sampling(sampling)
                .map_err(|(key, e)| source.error(&yaml::child(&yaml::child(&agent_at, "sampling"), &key), e))?;
            merged.sampling.extend(sampling.clone());
        }
        for (key, value) in [("max_children", over.max_children), ("max_depth", over.max_depth)] {
            let here = yaml::child(&agent_at, key);
            if value == Some(0) {
                return Err(source.error(&here, "must be at least 1"));
            }
            if value.is_some() && merged.subagent.is_none() {
                return Err(source.error(&here, "has no effect without `agent.subagent`, the subagents' system prompt"));
            }
        }
        if merged.kind == crate::agent::AgentKind::External {
            let ignored = [("subagent", over.subagent.is_some()), ("plan_mode", over.plan_mode == Some(true))];
            if let Some((key, _)) = ignored.into_iter().find(|(_, given)| *given) {
                let message = "an external agent's program makes its own decisions: this key has no effect on it";
                return Err(source.error(&yaml::child(&agent_at, key), message));
            }
        }
        let environment = match &file.tools {
            Some(_) if toolsets => {
                let message = "the suite draws its tools from `toolsets:`; a variant cannot name its own";
                return Err(source.error(&yaml::child(&at, "tools"), message));
            }
            Some(tools) => Some(environment.narrowed(tools).map_err(|e| source.error(&yaml::child(&at, "tools"), e))?),
            None => None,
        };
        if file.prompt.as_deref().is_some_and(|p| p.trim().is_empty()) {
            return Err(source.error(&yaml::child(&at, "prompt"), "a prompt cannot be empty"));
        }
        variants.push(Variant { name: name.clone(), agent: merged, prompt: file.prompt.clone(), environment });
    }
    Ok(variants)
}

/// Checks that each variant's templates render for `task`, naming the variant's key.
pub(crate) fn check_task(source: &Source, variants: &[Variant], task: &Task) -> Result<(), ConfigError> {
    let ctx = task.template_context();
    for v in variants {
        let at = yaml::child("variants", &v.name);
        let templates = [
            ("prompt", v.prompt.as_deref()),
            ("agent.system", v.agent.system.as_deref()),
            ("agent.subagent", v.agent.subagent.as_deref()),
        ];
        for (key, text) in templates {
            if let Some(text) = text {
                template::render(text, &ctx)
                    .map_err(|e| source.error(&yaml::child(&at, key), format!("in task `{}`: {e}", task.id)))?;
            }
        }
    }
    Ok(())
}

/// The variants' names as a suite keeps them in its `run_started` info.
pub fn names(variants: &[Variant]) -> Vec<String> {
    variants.iter().map(|v| v.name.clone()).collect()
}

/// Reads `variants:` (absent or null is none).
pub(crate) fn decode(source: &Source) -> Result<BTreeMap<String, VariantFile>, ConfigError> {
    match source.value.get("variants") {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(value @ Value::Object(_)) => source.decode("variants", value),
        Some(_) => Err(source.error(
            "variants",
            "expected a mapping of names to overrides: `variants: {terse: {agent: {system: …}}, …}`",
        )),
    }
}
