//! One episode from start to finish: set up the environment, let the agent and the
//! environment run their loop, score against the final world, tear down, log each part.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::cast::{Cast, Roster};
use super::memory::Slot;
use super::{EpisodeReport, EpisodeSpec};
use crate::agent::external::ExternalParts;
use crate::agent::memory::{SharedStores, Stores};
use crate::agent::memory_agent::ingestion::{self, Claim, Ingestions};
use crate::agent::memory_agent::{IngestionPlan, MemoryAgentParts};
use crate::agent::{Agent, AgentParts, CliAnswer, ProgramParts, ProgramRoom, Subagents};
use crate::config::template;
use crate::contract::Actor;
use crate::model::Role;
use std::sync::Arc;

use crate::domain::Task;
use crate::environment::World;
use crate::environment::{Ending, Environment, EpisodeBudget, SetupContext};
use crate::log::event::{INITIAL_SCORING, LimitOverrides, Stage};
use crate::log::{Event, EventLog, Outcome, Recorder, Termination, UnscoredCause};
use crate::sandbox::SandboxMode;
use crate::scoring::{self, Finished};
use crate::suite::{AgentConfig, DEFAULT_MAX_CHILDREN, DEFAULT_MAX_DEPTH, Suite};

/// Where a run's episodes run: its scratch folder (removed with the run), its own folder
/// (`results/<run-id>`, kept), and the sandbox and limits the command line asked for.
#[derive(Debug, Clone)]
pub struct Grounds {
    pub scratch: Arc<super::Scratch>,
    pub run_dir: std::path::PathBuf,
    pub sandbox: SandboxMode,
    pub limits: LimitOverrides,
}

pub async fn run_episode(
    spec: EpisodeSpec,
    mut memory: Option<Slot>,
    log: &EventLog,
    roster: &Roster,
    grounds: &Grounds,
    stop: &CancellationToken,
) -> EpisodeReport {
    let suite = &spec.suite;
    let variant = spec.variant();
    // A variant's settings stand in for the suite's, and its prompt for the task's input.
    let agent_config = variant.map_or(&suite.agent, |v| &v.agent);
    let asked = match variant {
        Some(v) => v.task(&suite.tasks[spec.task]),
        None => std::borrow::Cow::Borrowed(&suite.tasks[spec.task]),
    };
    let task: &Task = &asked;
    // With `scope: task`, the stores the epoch before left (it waits for that epoch to end).
    let kept = match memory.as_mut() {
        Some(slot) => slot.open().await.and_then(|kept| match (kept, suite.agent.memory.as_ref()) {
            // Read back, the stores get the checks the suite's own entries got.
            (Some(entries), Some(config)) => {
                Stores::checked(config, &entries).map(|_| Some(entries)).map_err(|(store, i, why)| {
                    format!(
                        "the task's memory {}: {store}[{i}] is not what the memory tool accepts: {why}",
                        slot.path().display()
                    )
                })
            }
            (kept, _) => Ok(kept),
        }),
        None => Ok(None),
    };
    let started = std::time::Instant::now();
    let toolset = suite.toolset_for(&spec.id);
    let environment =
        variant.and_then(|v| v.environment.as_ref()).or(toolset.map(|t| &t.environment)).unwrap_or(&suite.environment);
    let recorder = log.recorder(&spec.id);
    recorder.emit(&Event::EpisodeStarted {
        suite: suite.name.clone(),
        task_id: task.id.clone(),
        task_digest: task.digest.clone(),
        model: spec.model.name().to_owned(),
        epoch: spec.epoch,
        environment: suite.environment.name.clone(),
        toolset: toolset.map(|t| t.name.clone()),
        variant: variant.map(|v| v.name.clone()),
        sampling: agent_config.sampling.clone(),
    });

    let mut cast = Cast::of(&spec, roster);
    let mut memory_agent = (agent_config.kind == crate::agent::AgentKind::Memory)
        .then(|| memory_agent_parts(&spec.id, agent_config, task, &grounds.run_dir));
    let ingested = match memory_agent.as_mut() {
        Some(parts) => claim_ingestion(parts, (&spec, task, &mut cast), environment, &grounds.run_dir)
            .await
            .and_then(|()| skip_checkpointed_turns(parts, (&spec, task, &mut cast), &grounds.run_dir)),
        None => Ok(()),
    };
    let mut loop_ms = None;
    let mut user_spent = None;
    let mut agent_program = None;
    let context = SetupContext {
        sandbox: super::sandbox_mode(suite, grounds.sandbox),
        user_model: cast.user.clone(),
        run_dir: Some(&grounds.run_dir),
        ..SetupContext::new(grounds.scratch.path(), &spec.id)
    };
    let stores = suite.agent.memory.as_ref().map(|config| {
        let initial = match &kept {
            Ok(Some(entries)) => entries.clone(),
            _ => task.memory.clone(),
        };
        Stores::new(config, initial).shared()
    });
    let setup = match (kept.as_ref().and(ingested.as_ref()), &task.unavailable) {
        // The runner's own file, not the agent's doing: nothing runs, the episode is unscored.
        (Err(message), _) => Err((UnscoredCause::Other("memory_error".into()), message.clone())),
        // A world this host cannot give (a Harbor task's image): nobody's answer.
        (Ok(_), Some(why)) => Err((UnscoredCause::EnvironmentError, format!("the task cannot run here: {why}"))),
        (Ok(_), None) => match grounds.scratch.made_for(environment) {
            Err(message) => Err((UnscoredCause::EnvironmentError, message)),
            Ok(()) => Environment::setup(environment.clone(), task, &context)
                .await
                .map_err(|e| (UnscoredCause::EnvironmentError, e.to_string())),
        },
    };
    let (ending, outcome) = match setup {
        Err((cause, message)) => {
            recorder.emit(&Event::Error { step: 0, cause: cause.clone(), message: message.clone() });
            (Ending::new(Termination::EnvironmentError), Outcome::Unscored { cause, message })
        }
        Ok(env) => {
            let env = env.with_permissions(suite.permissions.clone());
            let budget = Arc::new(budget(suite, &grounds.limits, stop));
            let program = program_for((suite, agent_config), task, env.world(), context.sandbox, &budget);
            let mut agent = agent_for(
                (&spec.id, &cast),
                (suite, agent_config),
                task,
                stores.clone(),
                (program, &budget),
                memory_agent.take(),
            );
            let ending = env.run(agent.as_mut(), task, &budget, &recorder).await;
            user_spent = env.user().spent();
            let wall_s = started.elapsed().as_secs_f64();
            loop_ms = Some(wall_s * 1e3);
            // Scored against the final world, before it is torn down.
            let time_s = grounds.limits.time_s(suite.limits.time_s);
            let outcome = outcome_of(
                &ending,
                (&spec.id, &cast),
                (suite, time_s, context.sandbox),
                task,
                env.world(),
                wall_s,
                &recorder,
            )
            .await;
            agent_program = agent.finish(ending.termination, &outcome, &recorder).await;
            env.teardown().await;
            (ending, outcome)
        }
    };

    // What a scored epoch left is what the next one starts from; an unscored or cancelled
    // one is run again on resume, from the stores it started with.
    let mut outcome = outcome;
    if let (Some(slot), Some(stores), Outcome::Scored { .. }) = (&memory, &stores, &outcome) {
        let entries = stores.lock().unwrap_or_else(|p| p.into_inner()).entries().clone();
        if let Err(message) = slot.save(&entries) {
            let cause = UnscoredCause::Other("memory_error".into());
            recorder.emit(&Event::Error { step: ending.steps, cause: cause.clone(), message: message.clone() });
            outcome = Outcome::Unscored { cause, message };
        }
    }
    drop(memory);
    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
    recorder.emit(&Event::EpisodeFinished {
        outcome: outcome.clone(),
        termination: ending.termination,
        steps: ending.steps,
        tool_calls: ending.trajectory.tool_calls(),
        tool_errors: ending.trajectory.tool_errors(),
        usage: ending.usage,
        cost_usd: ending.cost_usd,
        wall_ms,
        loop_ms,
        user_usage: user_spent.map(|(usage, _)| usage),
        user_cost_usd: user_spent.and_then(|(_, cost)| cost),
        agent_program,
    });
    EpisodeReport {
        id: spec.id.clone(),
        suite: suite.name.clone(),
        task_id: task.id.clone(),
        model: spec.model.name().to_owned(),
        variant: variant.map(|v| v.name.clone()),
        epoch: spec.epoch,
        outcome,
        termination: ending.termination,
        steps: ending.steps,
        wall_ms,
    }
}

/// Builds the episode's agent, of the kind the suite names, played by the cast's model.
/// A `cli` agent's program: its command and answer, the task, and the world's folder it
/// runs in, confined with the gateway's port as its only network.
fn program_for(
    (suite, agent): (&Suite, &AgentConfig),
    task: &Task,
    world: &dyn World,
    mode: crate::sandbox::SandboxMode,
    budget: &Arc<EpisodeBudget>,
) -> Option<ProgramParts> {
    if agent.kind != crate::agent::AgentKind::Cli {
        return None;
    }
    let room = world.program_folders().map(|(folder, tmp)| {
        let definition = suite.environment.clone();
        let (own, own_tmp) = (folder.clone(), tmp.clone());
        let confine = move |port| definition.confinement_for_gateway(mode, &[own.as_path(), own_tmp.as_path()], port);
        ProgramRoom { folder, tmp, confine: Box::new(confine) }
    });
    Some(ProgramParts {
        command: agent.command.clone().unwrap_or_default(),
        answer: agent.answer.clone().unwrap_or(CliAnswer::Stdout),
        setup: agent.setup.clone(),
        env: agent.env.clone(),
        context: task.template_context(),
        input: task.input.clone(),
        room,
        episode: budget.clone(),
    })
}

fn agent_for(
    (episode_id, cast): (&str, &Cast<'_>),
    (suite, agent): (&Suite, &AgentConfig),
    task: &Task,
    memory: Option<SharedStores>,
    (program, budget): (Option<ProgramParts>, &Arc<EpisodeBudget>),
    memory_agent: Option<MemoryAgentParts>,
) -> Box<dyn Agent> {
    agent.kind.build(AgentParts {
        model: cast.agent.clone(),
        model_name: cast.under_test.name().to_owned(),
        system: system_prompt((suite, agent), task),
        require_final_answer: agent.require_final_answer,
        memory,
        plan_mode: agent.plan_mode,
        conversation: task.user.as_ref().is_some_and(|u| u.conversation),
        subagents: subagents_for(cast, agent, task),
        task_id: task.id.clone(),
        solution: task.solution.clone(),
        program,
        external: agent.program.as_ref().map(|program| ExternalParts {
            program: program.clone(),
            episode_id: episode_id.to_owned(),
            task: serde_json::json!({"id": task.id, "input": task.input, "metadata": task.full_metadata()}),
            budget: budget.clone(),
        }),
        session_search: suite.agent.searched_runs.clone(),
        memory_agent,
    })
}

/// A `memory` agent's parts: the task's conversation, the agent's settings (the suite's,
/// or its variant's), the episode's thread and the run folder its checkpoints are in.
fn memory_agent_parts(
    episode_id: &str,
    agent: &AgentConfig,
    task: &Task,
    run_dir: &std::path::Path,
) -> MemoryAgentParts {
    use crate::agent::memory_agent::{DEFAULT_FLUSH_EVERY, conversation};
    let text = |key: &str| task.metadata.get(key).and_then(|v| v.as_str()).map(str::to_owned);
    let evidence = task.metadata.get("answer_session_ids").and_then(|v| v.as_array());
    MemoryAgentParts {
        flush_every: agent.flush_every.unwrap_or(DEFAULT_FLUSH_EVERY),
        prompts: agent.prompts.clone().unwrap_or_default(),
        sessions: conversation::sessions_of(task.metadata_field("sessions"))
            .map_err(|(field, e)| format!("metadata.{field}: {e}")),
        thread: episode_id.to_owned(),
        run_dir: Some(run_dir.to_owned()),
        question: task.input.clone(),
        question_date: text("question_date"),
        question_type: text("question_type"),
        abstention: task.metadata.get("abstention").and_then(|v| v.as_bool()).unwrap_or(false),
        evidence_sessions: evidence.into_iter().flatten().filter_map(|v| v.as_str()).map(str::to_owned).collect(),
        evidence_turns: conversation::evidence_turns(&task.metadata),
        answering: agent.answering.clone().unwrap_or_default(),
        ingestion: IngestionPlan::Own,
        share_ingestion: agent.ingest.unwrap_or_default().share,
    }
}

/// A `memory` agent over the built-in `memory_store`, sharing its ingestion (the
/// default): the finished ingestion of its key, restored into the episode's store (under
/// `mock`, the script's turns that replay played are skipped), or the key's lease, for
/// which it waits while another episode replays the same haystack. A store the runner
/// cannot see (an MCP server's) is filled by each episode's own replay.
async fn claim_ingestion(
    parts: &mut MemoryAgentParts,
    (spec, task, cast): (&EpisodeSpec, &Task, &mut Cast<'_>),
    environment: &crate::environment::Definition,
    run_dir: &std::path::Path,
) -> Result<(), String> {
    use crate::environment::kinds::memory_store;
    let kind = environment.kind.map(|k| k.name());
    let (true, Some(kind @ "memory_store"), Ok(sessions)) = (parts.share_ingestion, kind, &parts.sessions) else {
        return Ok(());
    };
    if sessions.is_empty() {
        return Ok(());
    }
    let key = ingestion::key(&ingestion::KeyParts {
        sessions,
        flush_every: parts.flush_every,
        prompts: &parts.prompts,
        model: cast.under_test.name(),
        sampling: &cast.agent.sampling(),
        environment: &format!("{kind}:{}", environment.name),
    });
    let store = memory_store::store_path(&run_dir.join(memory_store::FOLDER), &spec.id);
    parts.ingestion = match Ingestions::of(run_dir).claim(&key, &spec.id, &store).await? {
        Claim::Todo(lease) => IngestionPlan::Shared(lease),
        Claim::Done(ingested) => {
            ingested.restore_into(run_dir, &store)?;
            skip_mock_turns(ingested.model_calls, spec, task, cast);
            IngestionPlan::Restored(ingested)
        }
    };
    Ok(())
}

/// Under `mock`, the script's first `n` turns were played by a replay this episode restores
/// or goes on with: its model starts after them, so that its answer turn is the one it would
/// have reached replaying the haystack itself.
fn skip_mock_turns(n: u32, spec: &EpisodeSpec, task: &Task, cast: &mut Cast<'_>) {
    if spec.model.name() != "mock" || n == 0 {
        return;
    }
    let mut rest = task.clone();
    rest.mock = task.mock.iter().skip(n as usize).cloned().collect();
    let epoch = (!spec.suite.share_epochs).then_some(spec.epoch);
    let sampling = spec.variant().map_or(&spec.suite.agent.sampling, |v| &v.agent.sampling);
    cast.agent = spec.model.lend_in_epoch(Role::Agent(&Actor::Main), &rest, &spec.id, epoch, sampling);
}

/// Under `mock`, a replay that goes on from the episode's own checkpoint (its attempt was
/// killed) skips the script's turns that replay had played.
fn skip_checkpointed_turns(
    parts: &MemoryAgentParts,
    (spec, task, cast): (&EpisodeSpec, &Task, &mut Cast<'_>),
    run_dir: &std::path::Path,
) -> Result<(), String> {
    if spec.model.name() != "mock" {
        return Ok(());
    }
    match &parts.ingestion {
        IngestionPlan::Restored(_) | IngestionPlan::Shared(ingestion::Lease { taken_over: Some(_), .. }) => {
            return Ok(());
        }
        IngestionPlan::Shared(_) | IngestionPlan::Own => {}
    }
    let n = crate::agent::memory_agent::replayed_calls(run_dir, &spec.id)?;
    skip_mock_turns(n, spec, task, cast);
    Ok(())
}

/// The suite's system prompt rendered for the task, then what the environment adds (an
/// MCP server's prompts).
fn system_prompt((suite, agent): (&Suite, &AgentConfig), task: &Task) -> Option<String> {
    // Every template was rendered against every task when the suite loaded.
    let system = agent.system.as_deref().map(|s| {
        template::render(s, &task.template_context())
            .unwrap_or_else(|e| format!("(the system prompt failed to render: {e})"))
    });
    match (system, suite.environment.system_addition.trim()) {
        (system, "") => system,
        (Some(own), added) => Some(format!("{own}\n\n{added}")),
        (None, added) => Some(added.to_owned()),
    }
}

/// The suite's subagents for one episode, when it has them: their prompt rendered for the
/// task, and each child's model as the cast gives it.
fn subagents_for(cast: &Cast<'_>, agent: &AgentConfig, task: &Task) -> Option<Arc<Subagents>> {
    let template = agent.subagent.as_deref()?;
    let system = template::render(template, &task.template_context())
        .unwrap_or_else(|e| format!("(the subagent prompt failed to render: {e})"));
    Some(Arc::new(Subagents {
        system,
        max_children: agent.max_children.unwrap_or(DEFAULT_MAX_CHILDREN),
        max_depth: agent.max_depth.unwrap_or(DEFAULT_MAX_DEPTH),
        models: cast.subagents.clone(),
        model_name: cast.under_test.name().to_owned(),
        require_final_answer: agent.require_final_answer,
    }))
}

/// The episode's budget, its clock started now: the suite's limits as the command line
/// overrode them.
fn budget(suite: &Suite, overrides: &LimitOverrides, stop: &CancellationToken) -> EpisodeBudget {
    let time = Duration::from_secs_f64(overrides.time_s(suite.limits.time_s));
    EpisodeBudget::new(overrides.max_steps(suite.limits.max_steps), time)
        .with_max_tokens(overrides.max_tokens(suite.limits.max_tokens))
        .with_max_cost_usd(suite.limits.max_cost_usd)
        .stopped_by(stop.clone())
}

/// Unscored when nobody answered, cancelled when the run was stopped, scored otherwise.
async fn outcome_of(
    ending: &Ending,
    (episode_id, cast): (&str, &Cast<'_>),
    (suite, time_s, sandbox): (&Suite, f64, SandboxMode),
    task: &Task,
    world: &dyn World,
    wall_s: f64,
    recorder: &Recorder,
) -> Outcome {
    if let Some(fault) = &ending.fault {
        return Outcome::Unscored { cause: fault.cause.clone(), message: fault.message.clone() };
    }
    if ending.termination == Termination::UserStop {
        return Outcome::Cancelled;
    }
    let finished = Finished {
        task,
        episode_id,
        under_test: Some(&cast.under_test),
        recorder: Some(recorder),
        ending,
        wall_s,
        suite_grader: suite.grader.as_ref().map(|g| g.model.as_str()),
        suite_template: suite.grader.as_ref().and_then(|g| g.template.as_deref()),
        world_limit: Duration::from_secs_f64(time_s),
        sandbox,
    };
    if suite.agent.kind == crate::agent::AgentKind::Memory {
        recorder.emit(&Event::Stage { stage: Stage::Judge, ingestion: None });
    }
    let scores = match scoring::score(&suite.scorers, &task.scorers, &finished, world, cast.graders).await {
        Ok(scores) => scores,
        Err(fault) => {
            // The verdicts the other scorers gave stand in the log (a regrade carries over
            // those about the world); the episode is unscored, unless they settle it.
            scoring::log_scores(recorder, INITIAL_SCORING, &fault.scores);
            recorder.emit(&Event::Error {
                step: ending.steps,
                cause: fault.cause.clone(),
                message: fault.message.clone(),
            });
            return match fault.settled(task_pass_score(suite)) {
                Some((score, passed)) => Outcome::Scored { score, passed },
                None => Outcome::Unscored { cause: fault.cause, message: fault.message },
            };
        }
    };
    scoring::log_scores(recorder, INITIAL_SCORING, &scores);
    let (score, passed) = scoring::aggregate(&scores, task_pass_score(suite));
    Outcome::Scored { score, passed }
}

fn task_pass_score(suite: &Suite) -> Option<f64> {
    suite.pass_score
}
