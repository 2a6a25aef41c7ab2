//! The kinds of agent, each in its own file or folder, beside one explicit list:
//! [`AGENT_KINDS`]. A kind is a value that names itself, decodes its own keys of a suite's
//! `agent:` into [`AgentSettings`], checks the tasks it is to play, and builds its agent
//! for an episode from one [`AgentSetup`]. A suite's `agent: {kind: …}` and `--agent` are
//! looked up here, and nowhere else: the batch and the suite loader name no kind.

pub mod cli;
pub mod external;
pub mod memory;
pub mod oracle;
pub mod tool_calling;

use std::path::Path;

use async_trait::async_trait;

use super::{Agent, AgentSetup, Lent};
use crate::config::decode::ConfigError;
use crate::config::kind_keys::KindKeys;
use crate::domain::Task;
use cli::Cli;
use external::External;
use memory::Memory;
use oracle::Oracle;
use tool_calling::ToolCalling;

/// Every kind of agent there is. Adding a kind is adding it here.
pub const AGENT_KINDS: &[&dyn AgentKind] = &[&ToolCalling, &Oracle, &External, &Cli, &Memory];

/// The kind named `name`, or why there is none.
pub fn find(name: &str) -> Result<&'static dyn AgentKind, String> {
    AGENT_KINDS
        .iter()
        .copied()
        .find(|k| k.name() == name)
        .ok_or_else(|| format!("unknown agent kind `{name}`, expected one of: {}", names().join(", ")))
}

/// The names of all kinds, for messages that list them.
pub fn names() -> Vec<&'static str> {
    AGENT_KINDS.iter().map(|k| k.name()).collect()
}

/// How a suite is told that `key` is not its kind's, when some kind takes it: the same
/// words for every kind, naming every kind that does.
pub fn refuse_key(key: &str) -> Option<String> {
    let owners: Vec<String> =
        AGENT_KINDS.iter().filter(|k| k.keys().contains(&key)).map(|k| format!("`kind: {}`", k.name())).collect();
    (!owners.is_empty()).then(|| format!("is for {} agents only", owners.join(" and ")))
}

/// A kind of agent: its name, its own keys, the checks it makes of a suite, and how its
/// agent is built for one episode.
#[async_trait]
pub trait AgentKind: Send + Sync {
    /// The name suites use (`tool_calling`).
    fn name(&self) -> &'static str;

    /// The keys of a suite's `agent:` it takes beside the common ones (`kind`, `system`,
    /// `sampling`); a suite of another kind that gives one is refused.
    fn keys(&self) -> &'static [&'static str] {
        &[]
    }

    /// Those of its keys a variant may set over the suite's.
    fn variant_keys(&self) -> &'static [&'static str] {
        &[]
    }

    /// Decodes its own keys of a suite's `agent:` (those it declared in `keys`, as far as
    /// the suite gives them) into its settings.
    fn decode(&self, keys: &KindKeys<'_>) -> Result<AgentSettings, ConfigError>;

    /// Its settings with a variant's keys (those of `variant_keys` it gives) over them.
    fn over(&self, settings: &AgentSettings, _variant: &KindKeys<'_>) -> Result<AgentSettings, ConfigError> {
        Ok(settings.clone())
    }

    /// Whether a task can be played by it: the field of the task at fault, and why.
    fn check_task(&self, _settings: &AgentSettings, _task: &Task) -> Result<(), (String, String)> {
        Ok(())
    }

    /// Whether its tools are its own, not the environment's (a `cli` agent's): its scorers
    /// may then name any tool.
    fn owns_its_tools(&self) -> bool {
        false
    }

    /// Whether it runs a program in the world's folder, which then needs the world's
    /// folders and sandbox ([`super::ProgramRoom`]).
    fn runs_in_the_world(&self) -> bool {
        false
    }

    /// Whether its episodes go through named stages (`stage` events): judging is then the
    /// last, logged when scoring starts.
    fn logs_stages(&self) -> bool {
        false
    }

    /// Work done before the episode's world is set up, whose result `build` takes from
    /// [`AgentSetup::prepared`]. A failure makes the episode unscored.
    async fn prepare(&self, _setup: &mut AgentSetup<'_>) -> Result<(), String> {
        Ok(())
    }

    /// This kind's agent for one episode, once the world is set up.
    fn build(&self, setup: AgentSetup<'_>, lent: Lent) -> Box<dyn Agent>;

    /// Carries what it keeps in run `from`'s folder into run `to`'s (a merge of shards).
    fn carry(&self, _from: &Path, _to: &Path) -> Result<(), String> {
        Ok(())
    }
}

impl std::fmt::Debug for dyn AgentKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl PartialEq for dyn AgentKind {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name()
    }
}

/// What a suite's `agent:` holds of its kind's own keys: one variant per kind.
#[derive(Debug, Clone)]
pub enum AgentSettings {
    ToolCalling(tool_calling::Settings),
    Oracle,
    External(external::Settings),
    Cli(cli::Settings),
    Memory(memory::Settings),
}

impl AgentSettings {
    /// The bounded notes (`memory:`), when the agent keeps them.
    pub fn notes(&self) -> Option<&tool_calling::notes::NotesConfig> {
        match self {
            AgentSettings::ToolCalling(settings) => settings.notes.as_ref(),
            _ => None,
        }
    }

    /// The subagents' system prompt, a template over the task's fields, and the depth they
    /// may reach, when the agent starts subagents.
    pub fn subagents(&self) -> Option<(&str, u32)> {
        match self {
            AgentSettings::ToolCalling(settings) => settings.subagent.as_deref().map(|s| (s, settings.reach())),
            _ => None,
        }
    }

    /// Host folders the agent's world binds into an image's root for it: a `cli` agent's
    /// `install:` folder, read only, at [`cli::AGENT_DIR`].
    pub fn binds(&self) -> Vec<crate::sandbox::root::Bind> {
        match self {
            AgentSettings::Cli(cli::Settings { install: Some(folder), .. }) => vec![crate::sandbox::root::Bind {
                from: folder.clone(),
                to: std::path::PathBuf::from(cli::AGENT_DIR),
                writable: false,
            }],
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_is_found_by_its_name_and_an_unknown_one_is_refused_listing_them() {
        assert_eq!(find("tool_calling").map(|k| k.name()), Ok("tool_calling"));
        for kind in AGENT_KINDS {
            assert_eq!(find(kind.name()).map(|k| k.name()), Ok(kind.name()));
        }
        let err = find("toolcalling").err();
        assert_eq!(
            err.as_deref(),
            Some("unknown agent kind `toolcalling`, expected one of: tool_calling, oracle, external, cli, memory")
        );
    }

    #[test]
    fn a_key_is_refused_naming_every_kind_that_takes_it() {
        assert_eq!(refuse_key("flush_every").as_deref(), Some("is for `kind: memory` agents only"));
        assert_eq!(refuse_key("command").as_deref(), Some("is for `kind: external` and `kind: cli` agents only"));
        assert_eq!(refuse_key("nobody_takes_it"), None);
    }
}
