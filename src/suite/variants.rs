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
    /// The keys of `agent:` it changes: the system prompt, sampling, and what the kind
    /// lets a variant change. The kind and a program's keys are the suite's: a variant
    /// changes how the same agent is asked, not which agent runs.
    agent: Option<Value>,
    /// The task's input, a template over its fields.
    prompt: Option<String>,
    /// The environment's tools this variant offers, over the suite's `tools:`.
    tools: Option<Vec<String>>,
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
        let merged = match &file.agent {
            Some(over) => agent.under_variant(source, &yaml::child(&at, "agent"), over)?,
            None => agent.clone(),
        };
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
            ("agent.subagent", v.agent.settings.subagents().map(|(prompt, _)| prompt)),
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
