//! A suite's `agent:` as decoded: which kind of agent plays each episode, the keys every
//! kind shares, and the kind's own settings, which the kind decodes. A variant's `agent:`
//! applies over it the same way.

use std::path::Path;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::kinds::{self, AgentKind, AgentSettings};
use crate::config::decode::{ConfigError, Source};
use crate::config::kind_keys;
use crate::config::yaml;

/// The keys of `agent:` every kind takes; the rest are a kind's own.
const COMMON_KEYS: [&str; 3] = ["kind", "system", "sampling"];

/// The keys of a variant's `agent:` every kind takes; a kind may allow more of its own.
const VARIANT_COMMON_KEYS: [&str; 2] = ["system", "sampling"];

/// A suite's `agent:`, or a variant's applied over it.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// `tool_calling` when the suite does not say.
    pub kind: &'static dyn AgentKind,
    /// The system prompt, a template over the task's fields.
    pub system: Option<String>,
    /// Sampling settings of the agents' model calls (`temperature`, `max_tokens`, `seed`, …),
    /// merged into their request bodies over the provider's; the graders and a simulated
    /// user keep their provider's.
    pub sampling: Map<String, Value>,
    /// What the kind's own keys say.
    pub settings: AgentSettings,
}

impl Default for AgentConfig {
    /// A `tool_calling` agent with no system prompt and none of its keys given.
    fn default() -> Self {
        let kind = kinds::AGENT_KINDS[0];
        let settings = AgentSettings::ToolCalling(Default::default());
        AgentConfig { kind, system: None, sampling: Map::new(), settings }
    }
}

/// The common keys as written.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Common {
    kind: Option<String>,
    system: Option<String>,
    #[serde(default)]
    sampling: Map<String, Value>,
}

impl AgentConfig {
    /// Decodes the suite's `agent:` (absent: a `tool_calling` agent with no settings), the
    /// kind's keys by the kind.
    pub fn decode(source: &Source, value: Option<&Value>) -> Result<AgentConfig, ConfigError> {
        let empty = Map::new();
        let mapping = match value {
            None | Some(Value::Null) => &empty,
            Some(Value::Object(mapping)) => mapping,
            Some(_) => return Err(source.error("agent", "expected a mapping: `agent: {kind: …, system: …}`")),
        };
        let common = only(mapping, &COMMON_KEYS);
        let written: Common = source.decode("agent", &Value::Object(common))?;
        let kind = match written.kind.as_deref() {
            None => kinds::AGENT_KINDS[0],
            Some(name) => kinds::find(name).map_err(|e| source.error("agent.kind", e))?,
        };
        check_sampling(source, "agent", &written.sampling)?;
        let at = (source, source.file.as_path(), "agent");
        let keys = kind_keys::split(at, mapping, (&COMMON_KEYS, kind.keys()), kinds::refuse_key)?;
        let settings = kind.decode(&keys)?;
        Ok(AgentConfig { kind, system: written.system, sampling: written.sampling, settings })
    }

    /// This agent with a variant's `agent:` (at `at` in `source`) over it: its system
    /// prompt, its sampling key by key, and what the kind lets a variant change.
    pub fn under_variant(&self, source: &Source, at: &str, value: &Value) -> Result<Self, ConfigError> {
        let Value::Object(mapping) = value else {
            return Err(source.error(at, "expected a mapping of the agent's keys a variant changes"));
        };
        let written: Common = source.decode(at, &Value::Object(only(mapping, &VARIANT_COMMON_KEYS)))?;
        check_sampling(source, at, &written.sampling)?;
        let refusal = |key: &str| {
            let owners: Vec<String> = kinds::AGENT_KINDS
                .iter()
                .filter(|k| k.variant_keys().contains(&key))
                .map(|k| format!("`kind: {}`", k.name()))
                .collect();
            (!owners.is_empty()).then(|| format!("is for {} agents only", owners.join(" and ")))
        };
        let own = self.kind.variant_keys();
        let keys =
            kind_keys::split((source, source.file.as_path(), at), mapping, (&VARIANT_COMMON_KEYS, own), refusal)?;
        let mut sampling = self.sampling.clone();
        sampling.extend(written.sampling);
        Ok(AgentConfig {
            kind: self.kind,
            system: written.system.or_else(|| self.system.clone()),
            sampling,
            settings: self.kind.over(&self.settings, &keys)?,
        })
    }

    /// This agent as `kind` plays it (`--agent`): its own settings when the kind is its
    /// own, else the other kind's with none of its keys given; the error says why that
    /// kind cannot play without them.
    pub fn as_kind(&self, kind: &'static dyn AgentKind, suite: &Path) -> Result<Self, String> {
        if *kind == *self.kind {
            return Ok(self.clone());
        }
        let source = Source::parse(suite, "agent: {}").map_err(|e| e.message)?;
        let keys = kind_keys::KindKeys { source: &source, path: suite, at: "agent".into(), given: Default::default() };
        let settings = kind.decode(&keys).map_err(|e| e.message)?;
        Ok(AgentConfig { kind, settings, ..self.clone() })
    }
}

/// The entries of `mapping` whose keys are among `keys`.
fn only(mapping: &Map<String, Value>, keys: &[&str]) -> Map<String, Value> {
    mapping.iter().filter(|(k, _)| keys.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// Checks `sampling:` of the `agent:` at `at`, naming the key at fault.
fn check_sampling(source: &Source, at: &str, sampling: &Map<String, Value>) -> Result<(), ConfigError> {
    crate::model::config::check_sampling(sampling)
        .map_err(|(key, e)| source.error(&yaml::child(&yaml::child(at, "sampling"), &key), e))
}
