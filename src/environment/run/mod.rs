//! The control loop of an episode, owned by the environment: one loop for every actor.
//! The main agent and each subagent take their turns through `run_actor`: ask the agent,
//! run its calls concurrently, hand back the observations in call order, until the final
//! tool, a limit, the run's stop, or a fault. The run's stop and the episode's deadline are
//! met in one place, `wait`.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;

use super::Environment;
use crate::agent::{ActorEnding, Agent, AgentFault, EpisodeState, Proposal, Trajectory, Turn};
use crate::contract::{Actor, ErrorType, FINAL_TOOL, Observation, ToolCall, ToolError, ToolSpec};
use crate::domain::Task;
use crate::log::{Event, Recorder, Termination, UnscoredCause, Usage};

/// How long past the episode's deadline the loop waits for an agent to return.
const PROPOSE_GRACE: Duration = Duration::from_secs(2);

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

/// Who takes turns in the loop: the episode's main agent, or a subagent.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Rank {
    /// Its final answer is the episode's; in a conversation, it talks with the user.
    Main,
    /// It may use only the tools its parent gave it: any other call is refused before it
    /// reaches the permission rules or the world.
    Subagent,
}

/// An actor's seat in the loop: its rank and the tools it is offered.
struct Seat<'a> {
    rank: Rank,
    tools: &'a [ToolSpec],
}

impl Seat<'_> {
    /// Why `call` is refused before anything else looks at it, if it is.
    fn refusal(&self, call: &ToolCall) -> Option<Observation> {
        if self.rank == Rank::Main || self.tools.iter().any(|t| t.name == call.name) {
            return None;
        }
        let names: Vec<&str> = self.tools.iter().map(|t| t.name.as_str()).collect();
        let error = ToolError::new(ErrorType::ToolNotFound, format!("`{}` was not given to you", call.name))
            .suggest(format!("call one of: {}", names.join(", ")));
        Some(Observation::of_error(&call.call_id, error))
    }
}

/// What ended a wait of the loop: the work it waited for, or the run's stop or the deadline.
enum Waited<T> {
    Done(T),
    Ended(Termination),
}

/// The one place the loop waits: for an agent's decision, the user's reply, the permission
/// rules or a turn's calls, and always for the run's stop and the deadline (`grace` past it).
async fn wait<T>(work: impl Future<Output = T>, episode: &Arc<EpisodeState>, grace: Duration) -> Waited<T> {
    // Most waits end at once (a mock model, a call with no rules to ask about): in the same
    // order as the `select!` below, but without setting up its timers.
    if episode.stop.is_cancelled() {
        return Waited::Ended(Termination::UserStop);
    }
    if episode.deadline.is_passed(grace) {
        return Waited::Ended(Termination::TimeLimit);
    }
    let mut work = std::pin::pin!(work);
    if let std::task::Poll::Ready(done) = futures::poll!(work.as_mut()) {
        return Waited::Done(done);
    }
    tokio::select! {
        biased;
        _ = episode.stop.cancelled() => Waited::Ended(Termination::UserStop),
        _ = episode.deadline.passed(grace) => Waited::Ended(Termination::TimeLimit),
        done = work => Waited::Done(done),
    }
}

/// What a turn leads to: another turn over these observations, or the actor's end.
enum Next {
    Observe(Vec<Observation>),
    End(Termination),
}

impl Environment {
    /// Runs one episode of `task` with `agent` to its end, within `episode`'s limits.
    pub async fn run(
        &self,
        agent: &mut dyn Agent,
        task: &Task,
        episode: &Arc<EpisodeState>,
        recorder: &Recorder,
    ) -> Ending {
        self.world.begin(Arc::new(episode.over()));
        let first = self.reset(task);
        recorder.emit(&Event::Observation { step: 0, observation: first.clone() });
        if self.user().is_conversation() {
            // The user opens the conversation: the task's input is its first message.
            recorder.emit(&Event::Said { step: 0, actor: Actor::User, text: task.input.clone() });
        }
        let seat = Seat { rank: Rank::Main, tools: self.tools() };
        let end = self.run_actor(agent, &seat, first, episode, recorder).await;
        if let Some(fault) = &end.fault {
            recorder.emit(&Event::Error { step: end.step, cause: fault.cause.clone(), message: fault.message.clone() });
        }
        Ending {
            termination: end.termination,
            final_answer: end.answer,
            steps: episode.steps(),
            usage: episode.usage(),
            cost_usd: episode.cost_usd(),
            fault: end.fault,
            trajectory: episode.take_trajectory(),
        }
    }

    /// Runs a subagent's turns, from its goal, with the tools its parent gave it.
    pub(super) async fn run_child(
        &self,
        agent: &mut dyn Agent,
        goal: &str,
        tools: &[ToolSpec],
        episode: &Arc<EpisodeState>,
        recorder: &Recorder,
    ) -> ActorEnding {
        let first = Observation::of_messages(vec![goal.to_owned()]);
        self.run_actor(agent, &Seat { rank: Rank::Subagent, tools }, first, episode, recorder).await
    }

    /// The driver of the loop, for any actor: a step from the shared episode, the agent
    /// proposes, its calls run (or its words go to the user), and their observations are
    /// its next turn's; until its final answer, a limit, the run's stop, or a fault.
    async fn run_actor(
        &self,
        agent: &mut dyn Agent,
        seat: &Seat<'_>,
        first: Observation,
        episode: &Arc<EpisodeState>,
        recorder: &Recorder,
    ) -> ActorEnding {
        let mut end = ActorEnding::new(Termination::MaxSteps);
        let mut observations = vec![first];
        loop {
            if episode.out_of_time() {
                return end.ended(Termination::TimeLimit);
            }
            let Some(step) = episode.take_step() else {
                return end.ended(Termination::MaxSteps);
            };
            end.step = step;
            let turn = Turn {
                observations: &observations,
                tools: seat.tools,
                allowance: episode.allowance(step),
                recorder,
                world: self,
                episode,
            };
            // The model learns the deadline and gives up on its own just then, blaming the
            // provider if it was failing; the grace only covers an agent that ignores it.
            let proposal = match wait(agent.propose(turn), episode, PROPOSE_GRACE).await {
                Waited::Ended(termination) => return end.ended(termination),
                // A slow model cut by the deadline gave no answer in time: the time limit,
                // not a fault.
                Waited::Done(Err(fault)) if fault.cause == UnscoredCause::ModelTooSlow => {
                    return end.ended(Termination::TimeLimit);
                }
                Waited::Done(Err(fault)) => return end.failed(Termination::AgentError, fault),
                // The agent's own failure is its answer: scored, whenever it came.
                Waited::Done(Ok(Proposal { failed: Some(message), usage, cost_usd, .. })) => {
                    episode.spend(usage, cost_usd);
                    recorder.emit(&Event::AgentError { step, message });
                    return end.ended(Termination::AgentError);
                }
                Waited::Done(Ok(_)) if episode.out_of_time() => return end.ended(Termination::TimeLimit),
                Waited::Done(Ok(proposal)) => proposal,
            };
            episode.spend(proposal.usage, proposal.cost_usd);
            if let Some(limit) = episode.over_limits() {
                self.not_run(&proposal.calls, step, limit, episode, recorder);
                return end.ended(limit);
            }
            let next = match proposal.to_user {
                // In a conversation, a reply without calls goes to the user, who answers it.
                Some(text) if proposal.calls.is_empty() => self.say(text, step, episode, recorder, &mut end).await,
                _ => self.dispatch(&proposal.calls, seat, step, episode, recorder, &mut end).await,
            };
            match next {
                Next::Observe(next) => observations = next,
                Next::End(termination) => return end.ended(termination),
            }
        }
    }

    /// Calls proposed past a limit: none is dropped silently, each is logged, and logged
    /// as not run.
    fn not_run(
        &self,
        calls: &[ToolCall],
        step: u32,
        limit: Termination,
        episode: &Arc<EpisodeState>,
        recorder: &Recorder,
    ) {
        let message = format!("not run: the episode reached its {}", limit.as_str().replace('_', " "));
        for call in calls {
            recorder.emit(&Event::ActionDispatched { step, call: call.clone() });
            episode.dispatched(call);
            let obs = Observation::of_error(&call.call_id, ToolError::new(ErrorType::Cancelled, message.clone()));
            recorder.emit(&Event::Observation { step, observation: obs });
        }
    }

    /// The main agent's reply to the user in a conversation: the user's answer is the next
    /// turn's observation. The agent's last words to the user are the episode's answer.
    async fn say(
        &self,
        text: String,
        step: u32,
        episode: &Arc<EpisodeState>,
        recorder: &Recorder,
        end: &mut ActorEnding,
    ) -> Next {
        recorder.emit(&Event::Said { step, actor: Actor::Main, text: text.clone() });
        episode.told_user(&text);
        end.answer = Some(text.clone());
        match wait(self.converse(&text, step, recorder), episode, Duration::ZERO).await {
            Waited::Ended(termination) => Next::End(termination),
            Waited::Done(Ok(Some(reply))) => Next::Observe(vec![reply]),
            Waited::Done(Ok(None)) => Next::End(Termination::UserEnded),
            Waited::Done(Err(fault)) => {
                end.fault = Some(fault);
                Next::End(Termination::EnvironmentError)
            }
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
        seat: &Seat<'_>,
        step: u32,
        episode: &Arc<EpisodeState>,
        recorder: &Recorder,
        end: &mut ActorEnding,
    ) -> Next {
        for call in calls {
            recorder.emit(&Event::ActionDispatched { step, call: call.clone() });
            episode.dispatched(call);
        }
        let mut turn = InFlight::new(calls, step, recorder);
        let ended = self.await_calls(&mut turn, seat, episode, end).await;
        let succeeded =
            turn.slots.iter().zip(calls).filter(|(slot, _)| slot.as_ref().is_some_and(|o| o.error.is_none()));
        end.succeeded.extend(succeeded.map(|(_, call)| call.clone()));
        match ended {
            Some(termination) => Next::End(termination),
            None => Next::Observe(turn.slots.iter().flatten().cloned().collect()),
        }
        // `turn` goes here, and logs the calls that did not finish as cancelled.
    }

    /// Decides a turn's calls, runs those let through, and takes their observations as they
    /// come, until all are in (`None`), or the final answer, a fault, the run's stop or the
    /// deadline ends the actor's turns.
    async fn await_calls(
        &self,
        turn: &mut InFlight<'_>,
        seat: &Seat<'_>,
        episode: &Arc<EpisodeState>,
        end: &mut ActorEnding,
    ) -> Option<Termination> {
        let (calls, step, recorder) = (turn.calls, turn.step, turn.recorder);
        // Decided one call after another before any runs, so that the user's answers go to
        // the calls in the order they were made; a refused call never reaches the world.
        // A simulated user answering an `ask` takes time: the run's stop and the deadline
        // still hold (then no call runs).
        let deciding = async {
            let mut refused: Vec<Option<Observation>> = Vec::with_capacity(calls.len());
            for call in calls {
                refused.push(match seat.refusal(call) {
                    Some(refusal) => Some(refusal),
                    None => self.permit(call, step, recorder).await,
                });
            }
            refused
        };
        let refused = match wait(deciding, episode, Duration::ZERO).await {
            Waited::Done(refused) => refused,
            Waited::Ended(termination) => return Some(termination),
        };
        let started = &turn.started;
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
        loop {
            let (i, obs) = match wait(running.next(), episode, Duration::ZERO).await {
                Waited::Ended(termination) => return Some(termination),
                Waited::Done(None) => return None,
                Waited::Done(Some(done)) => done,
            };
            let call = &calls[i];
            recorder.emit(&Event::Observation { step, observation: obs.clone() });
            let fault = obs.error.as_ref().and_then(|error| {
                episode.failed(&call.call_id, error);
                AgentFault::of_call(call, &obs)
            });
            let answer = (obs.done && call.name == FINAL_TOOL).then(|| obs.answer_text());
            turn.slots[i] = Some(obs);
            if let Some(fault) = fault {
                end.fault = Some(fault);
                return Some(Termination::EnvironmentError);
            }
            if let Some(text) = answer {
                if seat.rank == Rank::Main {
                    recorder.emit(&Event::Final { step, call_id: call.call_id.clone(), answer: text.clone() });
                }
                end.answer = Some(text);
                return Some(Termination::FinalAnswer);
            }
        }
    }
}

/// A turn's calls while they run: which have started, and the observations of those that
/// finished. However the turn ends (the final answer, a fault, the run's stop, the
/// deadline, or a parent's turn that is dropped with its subagents' turns in it), the calls
/// without an observation are logged as cancelled when it goes, as the contract says.
struct InFlight<'a> {
    calls: &'a [ToolCall],
    step: u32,
    recorder: &'a Recorder,
    started: Vec<AtomicBool>,
    slots: Vec<Option<Observation>>,
}

impl<'a> InFlight<'a> {
    fn new(calls: &'a [ToolCall], step: u32, recorder: &'a Recorder) -> Self {
        InFlight {
            calls,
            step,
            recorder,
            started: calls.iter().map(|_| AtomicBool::new(false)).collect(),
            slots: vec![None; calls.len()],
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        for ((slot, call), started) in self.slots.iter().zip(self.calls).zip(&self.started) {
            if slot.is_some() {
                continue;
            }
            let was_running = started.load(Ordering::Relaxed);
            let message = if was_running {
                "the episode ended while this call was running: it was stopped, and what it did until then stands"
            } else {
                "the episode ended before this call started: it did nothing"
            };
            let mut obs = Observation::of_error(&call.call_id, ToolError::new(ErrorType::Cancelled, message));
            obs.info.insert("started".into(), serde_json::Value::Bool(was_running));
            self.recorder.emit(&Event::Observation { step: self.step, observation: obs });
        }
    }
}

impl ActorEnding {
    fn ended(mut self, termination: Termination) -> Self {
        self.termination = termination;
        self
    }

    fn failed(mut self, termination: Termination, fault: AgentFault) -> Self {
        self.fault = Some(fault);
        self.ended(termination)
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
        let observation = Observation::of_messages(vec![reply]);
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
