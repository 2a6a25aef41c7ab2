//! `kind: memory` as a suite names it: its own keys of `agent:`, the settings they decode
//! into, and an episode's agent: its conversation read from the task, the shared ingestion
//! claimed (or restored) before the world opens its store, and the turns a scripted model
//! already played skipped.

use std::path::Path;

use super::ingestion::{self, Claim, IngestSettings, Ingestions};
use super::{Answering, DEFAULT_FLUSH_EVERY, IngestionPlan, MemoryAgent, MemoryAgentParts, MemoryPrompts};
use crate::agent::kinds::{AgentKind, AgentSettings};
use crate::agent::{Agent, AgentSetup, Lent};
use crate::config::decode::ConfigError;
use crate::config::kind_keys::KindKeys;
use crate::domain::Task;
use crate::domain::conversation;

/// `kind: memory`: replays a conversation into a memory through control states (seed 002),
/// then answers the task's question from it.
pub struct Memory;

/// What a suite's `agent:` says of a memory agent.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Every how many messages of a session it also flushes ([`DEFAULT_FLUSH_EVERY`]).
    pub flush_every: Option<u32>,
    /// Its own prompts in place of the default files.
    pub prompts: Option<MemoryPrompts>,
    /// How the question is answered after the replay, `{with: context}` (the default) or
    /// `{with: tools, tools: [...], max_steps: N}`.
    pub answering: Option<Answering>,
    /// Whether one ingestion serves every episode of the same key.
    pub ingest: Option<IngestSettings>,
}

#[async_trait::async_trait]
impl AgentKind for Memory {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn keys(&self) -> &'static [&'static str] {
        &["flush_every", "prompts", "answering", "ingest"]
    }

    fn variant_keys(&self) -> &'static [&'static str] {
        &["flush_every", "prompts"]
    }

    fn decode(&self, keys: &KindKeys<'_>) -> Result<AgentSettings, ConfigError> {
        let answering: Option<Answering> = keys.decode("answering")?;
        if let Some(answering) = &answering {
            answering.check().map_err(|(field, why)| keys.error(&format!("answering.{field}"), why))?;
        }
        let settings = Settings { answering, ingest: keys.decode("ingest")?, ..Settings::default() }.over(keys)?;
        Ok(AgentSettings::Memory(settings))
    }

    fn over(&self, settings: &AgentSettings, variant: &KindKeys<'_>) -> Result<AgentSettings, ConfigError> {
        match settings {
            AgentSettings::Memory(settings) => Ok(AgentSettings::Memory(settings.clone().over(variant)?)),
            other => Ok(other.clone()),
        }
    }

    fn check_task(&self, _settings: &AgentSettings, task: &Task) -> Result<(), (String, String)> {
        conversation::sessions_of(task.metadata_field("sessions"))
            .map(|_| ())
            .map_err(|(field, e)| (format!("metadata.{field}"), e))
    }

    fn logs_stages(&self) -> bool {
        true
    }

    /// Reads the task's conversation and, over a store the runner can see, claims the
    /// ingestion the episode shares: restored when another episode made it, or the key's
    /// lease (waiting while another episode replays the same haystack). Under `mock`, the
    /// script's turns that a replay played (restored, or the episode's own killed attempt)
    /// are skipped.
    async fn prepare(&self, setup: &mut AgentSetup<'_>) -> Result<(), String> {
        let mut parts = parts(setup);
        claim_ingestion(&mut parts, setup).await?;
        skip_checkpointed_turns(&parts, setup)?;
        setup.prepared = Some(Box::new(parts));
        Ok(())
    }

    fn build(&self, setup: AgentSetup<'_>, _lent: Lent) -> Box<dyn Agent> {
        let prepared = setup.prepared.and_then(|p| p.downcast::<MemoryAgentParts>().ok());
        let parts = prepared.map_or_else(|| MemoryAgentParts::empty(&setup.task.id), |p| *p);
        Box::new(MemoryAgent::new(setup.model, &setup.model_name, parts))
    }

    fn carry(&self, from: &Path, to: &Path) -> Result<(), String> {
        super::carry(from, to)
    }
}

impl Settings {
    /// These settings with the keys of `given` over them: its prompts each over the one it
    /// replaces, and its `flush_every`.
    fn over(self, given: &KindKeys<'_>) -> Result<Settings, ConfigError> {
        let flush_every = given.decode::<u32>("flush_every")?;
        if flush_every == Some(0) {
            return Err(given.error("flush_every", "must be at least 1"));
        }
        let prompts = match given.decode::<MemoryPrompts>("prompts")? {
            Some(own) => Some(own.over(self.prompts.clone().unwrap_or_default())),
            None => self.prompts.clone(),
        };
        Ok(Settings { flush_every: flush_every.or(self.flush_every), prompts, ..self })
    }
}

/// A memory agent's parts for one episode: the task's conversation, the agent's settings
/// (the suite's, or its variant's), the episode's thread and the run folder its
/// checkpoints are in.
fn parts(setup: &AgentSetup<'_>) -> MemoryAgentParts {
    let settings = match &setup.config.settings {
        AgentSettings::Memory(settings) => settings.clone(),
        _ => Settings::default(),
    };
    let task = setup.task;
    let text = |key: &str| task.metadata.get(key).and_then(|v| v.as_str()).map(str::to_owned);
    let evidence = task.metadata.get("answer_session_ids").and_then(|v| v.as_array());
    MemoryAgentParts {
        flush_every: settings.flush_every.unwrap_or(DEFAULT_FLUSH_EVERY),
        prompts: settings.prompts.unwrap_or_default(),
        sessions: conversation::sessions_of(task.metadata_field("sessions"))
            .map_err(|(field, e)| format!("metadata.{field}: {e}")),
        thread: setup.episode_id.to_owned(),
        run_dir: setup.run_dir.map(Path::to_owned),
        question: task.input.clone(),
        question_date: text("question_date"),
        question_type: text("question_type"),
        abstention: task.metadata.get("abstention").and_then(|v| v.as_bool()).unwrap_or(false),
        evidence_sessions: evidence.into_iter().flatten().filter_map(|v| v.as_str()).map(str::to_owned).collect(),
        evidence_turns: conversation::evidence_turns(&task.metadata),
        answering: settings.answering.unwrap_or_default(),
        ingestion: IngestionPlan::Own,
        share_ingestion: settings.ingest.unwrap_or_default().share,
    }
}

/// A memory agent over a store the runner can see, sharing its ingestion (the default):
/// the finished ingestion of its key, restored into the episode's store (under `mock`, the
/// script's turns that replay played are skipped), or the key's lease, for which it waits
/// while another episode replays the same haystack. A store the runner cannot see (an MCP
/// server's) is filled by each episode's own replay.
async fn claim_ingestion(parts: &mut MemoryAgentParts, setup: &mut AgentSetup<'_>) -> Result<(), String> {
    let (true, Some(store), Some(run_dir), Ok(sessions)) =
        (parts.share_ingestion, setup.world.store.clone(), setup.run_dir, &parts.sessions)
    else {
        return Ok(());
    };
    if sessions.is_empty() {
        return Ok(());
    }
    let key = ingestion::key(&ingestion::KeyParts {
        sessions,
        flush_every: parts.flush_every,
        prompts: &parts.prompts,
        model: &setup.model_name,
        sampling: &setup.model.sampling(),
        environment: &setup.world.environment,
    });
    parts.ingestion = match Ingestions::of(run_dir).claim(&key, setup.episode_id, &store).await? {
        Claim::Todo(lease) => IngestionPlan::Shared(lease),
        Claim::Done(ingested) => {
            ingested.restore_into(run_dir, &store)?;
            skip_mock_turns(ingested.model_calls, setup);
            IngestionPlan::Restored(ingested)
        }
    };
    Ok(())
}

/// Under `mock`, the script's first `n` turns were played by a replay this episode restores
/// or goes on with: its model starts after them, so that its answer turn is the one it would
/// have reached replaying the haystack itself.
fn skip_mock_turns(n: u32, setup: &mut AgentSetup<'_>) {
    if setup.model_name != "mock" || n == 0 {
        return;
    }
    let mut rest = setup.task.clone();
    rest.mock = setup.task.mock.iter().skip(n as usize).cloned().collect();
    setup.model = (setup.lend_again)(&rest);
}

/// Under `mock`, a replay that goes on from the episode's own checkpoint (its attempt was
/// killed) skips the script's turns that replay had played.
fn skip_checkpointed_turns(parts: &MemoryAgentParts, setup: &mut AgentSetup<'_>) -> Result<(), String> {
    let Some(run_dir) = setup.run_dir.filter(|_| setup.model_name == "mock") else { return Ok(()) };
    match &parts.ingestion {
        IngestionPlan::Restored(_) | IngestionPlan::Shared(ingestion::Lease { taken_over: Some(_), .. }) => {
            return Ok(());
        }
        IngestionPlan::Shared(_) | IngestionPlan::Own => {}
    }
    let n = super::replayed_calls(run_dir, setup.episode_id)?;
    skip_mock_turns(n, setup);
    Ok(())
}
