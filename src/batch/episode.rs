//! One episode from start to finish: set up the environment, let the agent and the
//! environment run their loop, score, tear down, and log each part.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{EpisodeReport, EpisodeSpec};
use crate::agent::ToolCallingAgent;
use crate::environment::{Environment, EpisodeLimits};
use crate::log::{Event, EventLog, Outcome, Termination, Usage};
use crate::scoring::{self, Finished};
use crate::suite::template;

pub async fn run_episode(
    spec: EpisodeSpec,
    log: &EventLog,
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

    let (outcome, termination, steps, usage, tool_calls, tool_errors) =
        match Environment::create(suite.environment.clone(), task) {
            Err(e) => {
                let message = e.to_string();
                recorder.emit(&Event::Error {
                    step: 0,
                    cause: "environment_error".into(),
                    message: message.clone(),
                });
                let outcome = Outcome::Unscored {
                    cause: "environment_error".into(),
                    message,
                };
                (
                    outcome,
                    Termination::EnvironmentError,
                    0,
                    Usage::default(),
                    0,
                    0,
                )
            }
            Ok(env) => {
                // The suite was checked at load time against every task, so this renders.
                let system = suite
                    .agent
                    .system
                    .as_deref()
                    .map(|s| template::render(s, &task.template_context()));
                let system = match system {
                    Some(Ok(text)) => Some(text),
                    Some(Err(e)) => Some(format!("(the system prompt failed to render: {e})")),
                    None => None,
                };
                let model = spec.model.for_episode(task);
                let mut agent = ToolCallingAgent::new(
                    model,
                    spec.model.name(),
                    system,
                    suite.agent.require_final_answer,
                );
                let limits = EpisodeLimits {
                    max_steps: suite.limits.max_steps,
                    time: Duration::from_secs_f64(suite.limits.time_s),
                    max_tokens: suite.limits.max_tokens,
                };
                let ending = env.run(&mut agent, task, &limits, &recorder, stop).await;
                let outcome = match (&ending.fault, ending.termination) {
                    (Some(fault), _) => Outcome::Unscored {
                        cause: fault.cause.clone(),
                        message: fault.message.clone(),
                    },
                    (None, Termination::UserStop) => Outcome::Cancelled,
                    (None, _) => {
                        // Scored against the final world, before it is torn down.
                        let finished = Finished {
                            task,
                            answer: ending.final_answer.as_deref(),
                            termination: ending.termination,
                            trajectory: &ending.trajectory,
                        };
                        let scores =
                            scoring::score(suite.scorers.iter().chain(&task.scorers), &finished);
                        for s in &scores {
                            recorder.emit(&Event::Score {
                                scorer: s.scorer.clone(),
                                value: s.value,
                                passed: s.passed,
                                explanation: s.explanation.clone(),
                            });
                        }
                        let (score, passed) = scoring::aggregate(&scores);
                        Outcome::Scored { score, passed }
                    }
                };
                drop(env);
                let calls = ending.trajectory.calls.len() as u32;
                (
                    outcome,
                    ending.termination,
                    ending.steps,
                    ending.usage,
                    calls,
                    ending.trajectory.tool_errors,
                )
            }
        };

    let wall_ms = started.elapsed().as_secs_f64() * 1e3;
    recorder.emit(&Event::EpisodeFinished {
        outcome: outcome.clone(),
        termination,
        steps,
        tool_calls,
        tool_errors,
        usage,
        cost_usd: 0.0,
        wall_ms,
    });
    EpisodeReport {
        id: spec.id.clone(),
        suite: suite.name.clone(),
        task_id: task.id.clone(),
        model: spec.model.name().to_owned(),
        epoch: spec.epoch,
        outcome,
        termination,
        steps,
        wall_ms,
    }
}
