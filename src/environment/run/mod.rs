//! The control loop of one episode, owned by the environment: ask the agent, run its calls
//! concurrently, hand back the observations in call order, until the final tool, a limit,
//! or a fault.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use super::Environment;
use crate::agent::{Agent, AgentFault, EpisodeTree, SubagentCalls, Turn};
use crate::contract::{Actor, ErrorType, FINAL_TOOL, Observation, ToolCall, ToolError};
use crate::domain::Task;
use crate::log::{Event, Recorder, Termination, UnscoredCause, Usage};
use crate::model::limiter::Deadline;

/// How long past the episode's deadline the loop waits for an agent to return.
const PROPOSE_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy)]
pub struct EpisodeLimits {
    pub max_steps: u32,
    pub time: Duration,
    pub max_tokens: Option<u64>,
    pub max_cost_usd: Option<f64>,
}

/// What the agent did, as scorers see it.
#[derive(Debug, Clone, Default)]
pub struct Trajectory {
    /// Every dispatched call, in the order the agent proposed them, as the log holds them
    /// (`action_dispatched`): calls that were cancelled before they ran included.
    pub calls: Vec<ToolCall>,
    /// The calls that failed, and how.
    pub errors: Vec<CallError>,
    /// In a conversation, the agent's text replies to the user, in order (`said` events).
    pub told_user: Vec<String>,
}

/// A failed call, as a grader reads the trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct CallError {
    pub call_id: String,
    pub error: ToolError,
}

impl Trajectory {
    pub fn tool_errors(&self) -> u32 {
        self.errors.len() as u32
    }

    /// Adds the calls subagents made (each carries its actor).
    fn absorb(&mut self, subagents: SubagentCalls) {
        self.calls.extend(subagents.calls);
        self.errors.extend(subagents.errors.into_iter().map(|(call_id, error)| CallError { call_id, error }));
    }
}

/// How an episode's loop ended.
#[derive(Debug, Clone)]
pub struct Ending {
    pub termination: Termination,
    pub final_answer: Option<String>,
    pub steps: u32,
    pub usage: Usage,
    /// The model calls' cost; `None` when any call had no price.
    pub cost_usd: Option<f64>,
    /// Set when the episode cannot be scored: nobody's answer.
    pub fault: Option<AgentFault>,
    pub trajectory: Trajectory,
}

/// The observations of one turn, in call order, and whether the episode ends with it.
struct Dispatched {
    observations: Vec<Observation>,
    answer: Option<String>,
    stopped: Option<Termination>,
    /// A fault of the runner during a call: the episode ends unscored.
    fault: Option<AgentFault>,
}

impl Environment {
    /// Runs one episode of `task` with `agent` to its end.
    pub async fn run(
        &self,
        agent: &mut dyn Agent,
        task: &Task,
        limits: &EpisodeLimits,
        recorder: &Recorder,
        stop: &CancellationToken,
    ) -> Ending {
        // Time spent waiting for runner's own model slots moves the deadline (not the agent's).
        let deadline = Deadline::after(limits.time);
        // The limits the main agent and its subagents share, and what they spent of them.
        let tree = EpisodeTree::new(limits.max_steps, limits.max_tokens, limits.max_cost_usd, deadline);
        let mut ending = Ending::new(Termination::MaxSteps);
        ending.termination = self.drive(agent, task, &tree, recorder, stop, &mut ending).await;
        ending.steps = tree.steps();
        ending.usage = tree.usage();
        ending.cost_usd = tree.cost_usd();
        ending.trajectory.absorb(tree.take_subagent_calls());
        ending
    }

    /// The loop itself: how it ended. Steps, usage and cost are counted in `tree`.
    async fn drive(
        &self,
        agent: &mut dyn Agent,
        task: &Task,
        tree: &EpisodeTree,
        recorder: &Recorder,
        stop: &CancellationToken,
        ending: &mut Ending,
    ) -> Termination {
        let deadline = &tree.deadline;
        let first = self.reset(task);
        recorder.emit(&Event::Observation { step: 0, observation: first.clone() });
        if self.user().is_conversation() {
            // The user opens the conversation: the task's input is its first message.
            recorder.emit(&Event::Said { step: 0, actor: Actor::User, text: task.input.clone() });
        }
        let mut observations = vec![first];

        loop {
            let Some(step) = tree.take_step() else {
                return Termination::MaxSteps;
            };
            let turn = Turn {
                observations: &observations,
                tools: self.tools(),
                budget: tree.budget(step),
                recorder,
                world: self,
                tree,
            };
            // The model learns the deadline and gives up on its own just then, blaming the
            // provider if it was failing; the grace only covers an agent that ignores it.
            let proposal = tokio::select! {
                biased;
                _ = stop.cancelled() => return Termination::UserStop,
                _ = deadline.passed(PROPOSE_GRACE) => return Termination::TimeLimit,
                proposal = agent.propose(turn) => proposal,
            };
            // The subagents' calls of this turn come before the calls it proposes.
            ending.trajectory.absorb(tree.take_subagent_calls());
            if proposal.is_ok() && Instant::now() >= deadline.at() {
                return Termination::TimeLimit;
            }
            let proposal = match proposal {
                Ok(proposal) => proposal,
                Err(fault) => {
                    recorder.emit(&Event::Error { step, cause: fault.cause.clone(), message: fault.message.clone() });
                    ending.fault = Some(fault);
                    return Termination::AgentError;
                }
            };
            tree.spend(proposal.usage, proposal.cost_usd);
            if let Some(limit) = tree.over_budget() {
                // No call is dropped silently: these are logged, and logged as not run.
                for call in &proposal.calls {
                    recorder.emit(&Event::ActionDispatched { step, call: call.clone() });
                    ending.trajectory.calls.push(call.clone());
                    let message = format!("not run: the episode reached its {}", limit.as_str().replace('_', " "));
                    let obs = Observation::of_error(&call.call_id, ToolError::new(ErrorType::Cancelled, message));
                    recorder.emit(&Event::Observation { step, observation: obs });
                }
                return limit;
            }

            // In a conversation, a reply without calls goes to the user, who answers it.
            if let (true, Some(text)) = (proposal.calls.is_empty(), proposal.to_user) {
                // The agent's last words to the user are the episode's answer.
                recorder.emit(&Event::Said { step, actor: Actor::Main, text: text.clone() });
                ending.trajectory.told_user.push(text.clone());
                ending.final_answer = Some(text.clone());
                let conversed = tokio::select! {
                    biased;
                    _ = stop.cancelled() => return Termination::UserStop,
                    _ = sleep_until(deadline.at()) => return Termination::TimeLimit,
                    conversed = self.converse(&text, step, recorder) => conversed,
                };
                match conversed {
                    Ok(Some(reply)) => observations = vec![reply],
                    Ok(None) => return Termination::UserEnded,
                    Err(fault) => {
                        recorder.emit(&Event::Error {
                            step,
                            cause: fault.cause.clone(),
                            message: fault.message.clone(),
                        });
                        ending.fault = Some(fault);
                        return Termination::EnvironmentError;
                    }
                }
                continue;
            }

            let turn =
                self.dispatch(&proposal.calls, step, deadline.at(), stop, recorder, &mut ending.trajectory).await;
            if let Some(fault) = turn.fault {
                recorder.emit(&Event::Error { step, cause: fault.cause.clone(), message: fault.message.clone() });
                ending.fault = Some(fault);
                return Termination::EnvironmentError;
            }
            if let Some(answer) = turn.answer {
                ending.final_answer = Some(answer);
                return Termination::FinalAnswer;
            }
            if let Some(reason) = turn.stopped {
                return reason;
            }
            observations = turn.observations;
        }
    }

    /// Runs one call the permission rules let through: a script of `execute_code`, or a
    /// call of the world.
    async fn run_call(&self, call: &ToolCall, step: u32, recorder: &Recorder, started: &AtomicBool) -> Observation {
        if call.name == super::script::SCRIPT_TOOL {
            started.store(true, Ordering::Relaxed);
            return self.run_script(call, step, recorder).await;
        }
        if self.is_for_user(call) {
            started.store(true, Ordering::Relaxed);
            return self.run_user_tool(call, step, recorder).await;
        }
        self.execute(call, started).await
    }

    /// One call as the loop makes it, outside an episode's loop (a benchmark, a tool that
    /// replays calls): decided by the permission rules, then run; its events go to `recorder`.
    pub async fn act(&self, call: &ToolCall, step: u32, recorder: &Recorder) -> Observation {
        match self.permit(call, step, recorder).await {
            Some(refused) => refused,
            None => self.run_call(call, step, recorder, &AtomicBool::new(false)).await,
        }
    }

    /// Runs one turn's calls at once (bounded by the environment's own limit) and returns
    /// their observations in the order of the calls, whatever order they finished in.
    async fn dispatch(
        &self,
        calls: &[ToolCall],
        step: u32,
        deadline: Instant,
        stop: &CancellationToken,
        recorder: &Recorder,
        trajectory: &mut Trajectory,
    ) -> Dispatched {
        for call in calls {
            recorder.emit(&Event::ActionDispatched { step, call: call.clone() });
            trajectory.calls.push(call.clone());
        }
        // Decided one call after another before any runs, so that the user's answers go to
        // the calls in the order they were made; a refused call never reaches the world.
        // A simulated user answering an `ask` takes time: the run's stop and the deadline
        // still hold (then no call runs).
        let mut stopped = None;
        let deciding = async {
            let mut refused: Vec<Option<Observation>> = Vec::with_capacity(calls.len());
            for call in calls {
                refused.push(self.permit(call, step, recorder).await);
            }
            refused
        };
        let refused = tokio::select! {
            biased;
            _ = stop.cancelled() => { stopped = Some(Termination::UserStop); Vec::new() }
            _ = sleep_until(deadline) => { stopped = Some(Termination::TimeLimit); Vec::new() }
            refused = deciding => refused,
        };
        let mut slots: Vec<Option<Observation>> = vec![None; calls.len()];
        let started: Vec<AtomicBool> = calls.iter().map(|_| AtomicBool::new(false)).collect();
        let mut answer = None;
        let mut fault = None;
        {
            let started = &started;
            let mut running: FuturesUnordered<_> = calls
                .iter()
                .enumerate()
                .zip(refused)
                .map(|((i, call), refused)| async move {
                    match refused {
                        Some(obs) => (i, obs),
                        None => (i, self.run_call(call, step, recorder, &started[i]).await),
                    }
                })
                .collect();
            while !running.is_empty() {
                let (i, obs) = tokio::select! {
                    biased;
                    _ = stop.cancelled() => { stopped = Some(Termination::UserStop); break }
                    _ = sleep_until(deadline) => { stopped = Some(Termination::TimeLimit); break }
                    Some(done) = running.next() => done,
                };
                recorder.emit(&Event::Observation { step, observation: obs.clone() });
                if let Some(error) = &obs.error {
                    trajectory.errors.push(CallError { call_id: calls[i].call_id.clone(), error: error.clone() });
                    if let Some(call_fault) = AgentFault::of_call(&calls[i], &obs) {
                        fault = Some(call_fault);
                    }
                }
                let is_final = obs.done && calls[i].name == FINAL_TOOL;
                if is_final {
                    let text = obs.answer_text();
                    recorder.emit(&Event::Final { step, call_id: calls[i].call_id.clone(), answer: text.clone() });
                    answer = Some(text);
                }
                slots[i] = Some(obs);
                if is_final || fault.is_some() {
                    break;
                }
            }
            // Dropping the futures cancels the calls still in flight.
        }
        let observations = slots
            .into_iter()
            .zip(calls)
            .zip(&started)
            .map(|((slot, call), started)| {
                slot.unwrap_or_else(|| {
                    let was_running = started.load(Ordering::Relaxed);
                    let message = if was_running {
                        "the episode ended while this call was running: it was stopped, and what it did until then stands"
                    } else {
                        "the episode ended before this call started: it did nothing"
                    };
                    let mut obs = Observation::of_error(&call.call_id, ToolError::new(ErrorType::Cancelled, message));
                    obs.info.insert("started".into(), serde_json::Value::Bool(was_running));
                    recorder.emit(&Event::Observation { step, observation: obs.clone() });
                    obs
                })
            })
            .collect();
        Dispatched { observations, answer, stopped, fault }
    }
}

impl Environment {
    /// Asks the user to reply to the agent's `text`; the reply as the next observation, or
    /// `None` when the user said the stop word.
    async fn converse(&self, text: &str, step: u32, recorder: &Recorder) -> Result<Option<Observation>, AgentFault> {
        let reply = self
            .user()
            .answer(&super::user::Prompt::Reply(text), step, recorder)
            .await
            .map_err(|fault| AgentFault { cause: fault.cause(), message: fault.to_string() })?;
        let Some(reply) = reply else {
            return Err(AgentFault { cause: UnscoredCause::UserError, message: "the conversation has no user".into() });
        };
        recorder.emit(&Event::Said { step, actor: Actor::User, text: reply.clone() });
        if self.user().says_stop(&reply) {
            return Ok(None);
        }
        let observation = Observation {
            call_id: None,
            done: false,
            error: None,
            tool_result: None,
            messages: vec![reply],
            info: Default::default(),
        };
        recorder.emit(&Event::Observation { step, observation: observation.clone() });
        Ok(Some(observation))
    }
}

impl Ending {
    /// An ending with nothing done yet.
    pub fn new(termination: Termination) -> Self {
        Ending {
            termination,
            final_answer: None,
            steps: 0,
            usage: Usage::default(),
            cost_usd: None,
            fault: None,
            trajectory: Trajectory::default(),
        }
    }
}

#[cfg(test)]
mod tests;
