//! One episode from start to finish: set up the environment, let the agent and the
//! environment run their loop, score against the final world, tear down, log each part.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{EpisodeReport, EpisodeSpec};
use crate::agent::{Agent, AgentKind, ToolCallingAgent};
use crate::config::template;
use crate::domain::Task;
use crate::environment::World;
use crate::environment::sandbox::SandboxMode;
use crate::environment::{Ending, Environment, EpisodeLimits, SetupContext};
use crate::log::event::INITIAL_SCORING;
use crate::log::{Event, EventLog, Outcome, Recorder, Termination, UnscoredCause};
use crate::model::Backend;
use crate::scoring::{self, Finished, Graders};
use crate::suite::Suite;

pub async fn run_episode(
    spec: EpisodeSpec,
    log: &EventLog,
    graders: &Graders,
    work_root: &std::path::Path,
    run_dir: &std::path::Path,
    sandbox: SandboxMode,
    stop: &CancellationToken,
) -> EpisodeReport {
    let started = std::time::Instant::now();
    let suite = &spec.suite;
    let task = &suite.tasks[spec.task];
    let recorder = log.recorder(&spec.id);
    recorder.emit(&Event::EpisodeStarted {
        suite: suite.name.clone(),
        task_id: task.id.clone(),
        task_digest: task.digest.clone(),
        model: spec.model.name().to_owned(),
        epoch: spec.epoch,
        environment: suite.environment.name.clone(),
    });

    let mut loop_ms = None;
    let context = SetupContext {
        sandbox: super::sandbox_mode(suite, sandbox),
        run_dir: Some(run_dir),
        ..SetupContext::new(work_root, &spec.id)
    };
    let (ending, outcome) = match Environment::setup(suite.environment.clone(), task, &context).await {
        Err(e) => {
            let message = e.to_string();
            recorder.emit(&Event::Error { step: 0, cause: UnscoredCause::EnvironmentError, message: message.clone() });
            (
                Ending::new(Termination::EnvironmentError),
                Outcome::Unscored { cause: UnscoredCause::EnvironmentError, message },
            )
        }
        Ok(env) => {
            let env = env.with_permissions(suite.permissions.clone());
            let mut agent = agent_for(&spec, suite, task);
            let ending = env.run(agent.as_mut(), task, &limits(suite), &recorder, stop).await;
            let wall_s = started.elapsed().as_secs_f64();
            loop_ms = Some(wall_s * 1e3);
            // Scored against the final world, before it is torn down.
            let outcome =
                outcome_of(&ending, (&spec.id, &spec.model), suite, task, env.world(), graders, wall_s, &recorder)
                    .await;
            env.teardown().await;
            (ending, outcome)
        }
    };

    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
    recorder.emit(&Event::EpisodeFinished {
        outcome: outcome.clone(),
        termination: ending.termination,
        steps: ending.steps,
        tool_calls: ending.trajectory.calls.len() as u32,
        tool_errors: ending.trajectory.tool_errors(),
        usage: ending.usage,
        cost_usd: ending.cost_usd,
        wall_ms,
        loop_ms,
    });
    EpisodeReport {
        id: spec.id.clone(),
        suite: suite.name.clone(),
        task_id: task.id.clone(),
        model: spec.model.name().to_owned(),
        epoch: spec.epoch,
        outcome,
        termination: ending.termination,
        steps: ending.steps,
        wall_ms,
    }
}

/// Builds the episode's agent: one arm per kind a suite can name.
fn agent_for(spec: &EpisodeSpec, suite: &Suite, task: &Task) -> Box<dyn Agent> {
    // Every template was rendered against every task when the suite loaded.
    let system = suite.agent.system.as_deref().map(|s| {
        template::render(s, &task.template_context())
            .unwrap_or_else(|e| format!("(the system prompt failed to render: {e})"))
    });
    match suite.agent.kind {
        AgentKind::ToolCalling => {
            let model = spec.model.for_episode(task, &spec.id);
            Box::new(ToolCallingAgent::new(model, spec.model.name(), system, suite.agent.require_final_answer))
        }
    }
}

fn limits(suite: &Suite) -> EpisodeLimits {
    EpisodeLimits {
        max_steps: suite.limits.max_steps,
        time: Duration::from_secs_f64(suite.limits.time_s),
        max_tokens: suite.limits.max_tokens,
        max_cost_usd: suite.limits.max_cost_usd,
    }
}

/// Unscored when nobody answered, cancelled when the run was stopped, scored otherwise.
#[allow(clippy::too_many_arguments)]
async fn outcome_of(
    ending: &Ending,
    (episode_id, under_test): (&str, &Backend),
    suite: &Suite,
    task: &Task,
    world: &dyn World,
    graders: &Graders,
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
        under_test: Some(under_test),
        recorder: Some(recorder),
        ending,
        wall_s,
        suite_grader: suite.grader.as_ref().map(|g| g.model.as_str()),
        suite_template: suite.grader.as_ref().and_then(|g| g.template.as_deref()),
        world_limit: Duration::from_secs_f64(suite.limits.time_s),
    };
    let scores = match scoring::score(&suite.scorers, &task.scorers, &finished, world, graders).await {
        Ok(scores) => scores,
        Err(fault) => {
            // The verdicts the other scorers gave stand in the log (a regrade carries over
            // those about the world); the episode is unscored.
            scoring::log_scores(recorder, INITIAL_SCORING, &fault.scores);
            recorder.emit(&Event::Error {
                step: ending.steps,
                cause: fault.cause.clone(),
                message: fault.message.clone(),
            });
            return Outcome::Unscored { cause: fault.cause, message: fault.message };
        }
    };
    scoring::log_scores(recorder, INITIAL_SCORING, &scores);
    let (score, passed) = scoring::aggregate(&scores, task_pass_score(suite));
    Outcome::Scored { score, passed }
}

fn task_pass_score(suite: &Suite) -> Option<f64> {
    suite.pass_score
}
