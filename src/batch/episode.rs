//! One episode from start to finish: set up the environment, let the agent and the
//! environment run their loop, score against the final world, tear down, log each part.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::cast::{Cast, Roster};
use super::memory::Slot;
use super::{EpisodeReport, EpisodeSpec};
use crate::agent::notes::Stores;
use crate::agent::{AgentConfig, AgentSetup, Lent, ProgramRoom, WorldFacts};
use crate::config::template;
use crate::contract::Actor;
use crate::model::Role;
use std::sync::Arc;

use crate::agent::EpisodeState;
use crate::domain::Task;
use crate::environment::{Definition, World};
use crate::environment::{Ending, Environment, SetupContext};
use crate::log::event::{INITIAL_SCORING, Stage};
use crate::log::{Event, EventLog, Outcome, Recorder, Termination, UnscoredCause};
use crate::sandbox::SandboxMode;
use crate::scoring::{self, Finished};
use crate::suite::Suite;

/// Where a run's episodes run: its scratch folder (removed with the run), its own folder
/// (`results/<run-id>`, kept), and the sandbox the command line asked for.
#[derive(Debug, Clone)]
pub struct Grounds {
    pub scratch: Arc<super::Scratch>,
    pub run_dir: std::path::PathBuf,
    pub sandbox: SandboxMode,
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
        Some(slot) => slot.open().await.and_then(|kept| match (kept, suite.agent.settings.notes()) {
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

    let cast = Cast::of(&spec, roster);
    let lend_again = |task: &Task| {
        let epoch = (!suite.share_epochs).then_some(spec.epoch);
        spec.model.lend_in_epoch(Role::Agent(&Actor::Main), task, &spec.id, epoch, &agent_config.sampling)
    };
    let stores = suite.agent.settings.notes().map(|config| {
        let initial = match &kept {
            Ok(Some(entries)) => entries.clone(),
            _ => task.memory.clone(),
        };
        Stores::new(config, initial).shared()
    });
    let mut setup = AgentSetup {
        episode_id: &spec.id,
        task,
        config: agent_config,
        model: cast.agent.clone(),
        model_name: cast.under_test.name().to_owned(),
        lend_again: &lend_again,
        subagent_models: cast.subagents.clone(),
        system: system_prompt((suite, agent_config), task),
        notes: stores.clone(),
        conversation: task.user.as_ref().is_some_and(|u| u.conversation),
        run_dir: Some(&grounds.run_dir),
        world: world_facts(environment, &grounds.run_dir, &spec.id),
        prepared: None,
    };
    let prepared = agent_config.kind.prepare(&mut setup).await;
    let mut loop_ms = None;
    let mut user_spent = None;
    let mut agent_program = None;
    let context = SetupContext {
        sandbox: super::sandbox_mode(suite, grounds.sandbox),
        user_model: cast.user.clone(),
        run_dir: Some(&grounds.run_dir),
        ..SetupContext::new(grounds.scratch.path(), &spec.id)
    };
    let world = match (kept.as_ref().and(prepared.as_ref()), &task.unavailable) {
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
    let (ending, outcome) = match world {
        Err((cause, message)) => {
            recorder.emit(&Event::Error { step: 0, cause: cause.clone(), message: message.clone() });
            (Ending::new(Termination::EnvironmentError), Outcome::Unscored { cause, message })
        }
        Ok(env) => {
            let env = env.with_permissions(suite.permissions.clone());
            let episode = Arc::new(EpisodeState::new(suite.limits).stopped_by(stop.clone()));
            let room = agent_config.kind.runs_in_the_world().then(|| program_room(suite, env.world(), context.sandbox));
            let mut agent = agent_config.kind.build(setup, Lent { room: room.flatten() });
            let ending = env.run(agent.as_mut(), task, &episode, &recorder).await;
            user_spent = env.user().spent();
            let wall_s = started.elapsed().as_secs_f64();
            loop_ms = Some(wall_s * 1e3);
            // Scored against the final world, before it is torn down.
            let time_s = suite.limits.time_s();
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

/// Where a program agent runs: the world's folder, confined with the gateway's port as
/// its only network; `None` for a world without a folder.
fn program_room(suite: &Suite, world: &dyn World, mode: SandboxMode) -> Option<ProgramRoom> {
    world.program_folders().map(|(folder, tmp)| {
        let definition = suite.environment.clone();
        let (own, own_tmp) = (folder.clone(), tmp.clone());
        let confine = move |port| definition.confinement_for_gateway(mode, &[own.as_path(), own_tmp.as_path()], port);
        ProgramRoom { folder, tmp, confine: Box::new(confine) }
    })
}

/// The episode's world as an agent that fills its store sees it before it starts.
fn world_facts(environment: &Definition, run_dir: &std::path::Path, episode_id: &str) -> WorldFacts {
    WorldFacts {
        environment: format!("{}:{}", environment.kind.map_or("", |k| k.name()), environment.name),
        store: environment.kind.and_then(|k| k.store_file(run_dir, episode_id)),
    }
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
    if suite.agent.kind.logs_stages() {
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
