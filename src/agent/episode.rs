//! The episode's shared state: its limits and meter, its deadline, the run's stop, and the
//! trajectory of every agent of it. The main agent and every subagent take their turns
//! against this one value (lent by the loop in each [`Turn`](super::Turn)), so that a
//! child's steps, tokens and calls are the episode's; a program agent's gateway spends
//! from it too ([`ProgramLedger`]).

use std::sync::{Mutex, MutexGuard};

use tokio_util::sync::CancellationToken;

use crate::budget::{Allowance, EpisodeLimits, Meter};
use crate::contract::{ToolCall, ToolError};
use crate::log::{Termination, Usage};
use crate::model::limiter::Deadline;

/// One episode's limits, what every agent of it spent and did, its deadline and its stop.
pub struct EpisodeState {
    pub limits: EpisodeLimits,
    /// Started with the state. Time spent waiting for runner's own model slots moves it
    /// (not the agent's).
    pub deadline: Deadline,
    /// The run's stop (Ctrl-C): it ends every actor's turns.
    pub stop: CancellationToken,
    meter: Meter,
    trajectory: Mutex<Trajectory>,
}

/// What the agents did, as scorers see it.
#[derive(Debug, Clone, Default)]
pub struct Trajectory {
    /// Every dispatched call, in the order the agents proposed them, as the log holds them
    /// (`action_dispatched`): calls that were cancelled before they ran included, and a
    /// subagent's calls (each carries its actor) before those of the turn that started it.
    pub calls: Vec<ToolCall>,
    /// The calls that failed, and how.
    pub errors: Vec<CallError>,
    /// In a conversation, the agent's text replies to the user, in order (`said` events).
    pub told_user: Vec<String>,
    /// Calls, and failed calls, of a killed attempt whose work this one goes on with: they
    /// count in the episode's, though this attempt has none of them to show.
    pub carried_calls: u32,
    pub carried_errors: u32,
}

/// The steps, calls and failed calls of an episode up to some turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Done {
    pub steps: u32,
    pub tool_calls: u32,
    pub tool_errors: u32,
}

/// A failed call, as a grader reads the trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct CallError {
    pub call_id: String,
    pub error: ToolError,
}

impl Trajectory {
    pub fn tool_calls(&self) -> u32 {
        (self.calls.len() as u32).saturating_add(self.carried_calls)
    }

    pub fn tool_errors(&self) -> u32 {
        (self.errors.len() as u32).saturating_add(self.carried_errors)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every change under this lock is a single push: a panic cannot leave one half-done.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl EpisodeState {
    /// An episode under `limits`, its clock started now, and a stop nobody gives.
    pub fn new(limits: EpisodeLimits) -> Self {
        EpisodeState {
            limits,
            deadline: Deadline::after(limits.time),
            stop: CancellationToken::new(),
            meter: Meter::default(),
            trajectory: Mutex::default(),
        }
    }

    /// Ends every actor's turns when `stop` is cancelled.
    pub fn stopped_by(mut self, stop: CancellationToken) -> Self {
        self.stop = stop;
        self
    }

    /// Takes the next step of the episode for one agent's turn: its number, or `None` when
    /// the episode has used all its steps.
    pub fn take_step(&self) -> Option<u32> {
        self.meter.take_step(self.limits.max_steps)
    }

    /// The steps taken so far, by every agent.
    pub fn steps(&self) -> u32 {
        self.meter.steps()
    }

    /// Whether the episode's time is up, as things stand now.
    pub fn out_of_time(&self) -> bool {
        tokio::time::Instant::now() >= self.deadline.at()
    }

    /// A test for work that the loop cannot stop from outside (a query running inside
    /// SQLite): true once the episode's time is up or the run is stopped.
    pub fn over(&self) -> impl Fn() -> bool + Clone + Send + Sync + 'static {
        let (deadline, stop) = (self.deadline.clone(), self.stop.clone());
        move || stop.is_cancelled() || tokio::time::Instant::now() >= deadline.at()
    }

    /// What is left when the turn numbered `step` starts.
    pub fn allowance(&self, step: u32) -> Allowance {
        Allowance {
            step,
            steps_left: self.limits.max_steps.saturating_sub(self.steps()) + 1,
            deadline: self.deadline.clone(),
            tokens_left: self.limits.max_tokens.map(|max| max.saturating_sub(self.usage().total())),
        }
    }

    /// Counts one turn's model calls.
    pub fn spend(&self, usage: Usage, cost_usd: Option<f64>) {
        self.meter.spend(usage, cost_usd);
    }

    pub fn usage(&self) -> Usage {
        self.meter.usage()
    }

    pub fn cost_usd(&self) -> Option<f64> {
        self.meter.cost_usd()
    }

    /// The limit the tree has gone past (tokens, then cost), if any.
    pub fn over_limits(&self) -> Option<Termination> {
        self.meter.over(&self.limits)
    }

    /// What the episode has done before the turn under way: its steps (those carried
    /// included), its calls and its failed calls.
    pub fn done_before_this_turn(&self) -> Done {
        let trajectory = lock(&self.trajectory);
        Done {
            steps: self.steps().saturating_sub(1),
            tool_calls: trajectory.tool_calls(),
            tool_errors: trajectory.tool_errors(),
        }
    }

    /// Counts what a killed attempt did, whose work this one goes on with, as the
    /// episode's: its steps (the next turn's number comes after them), calls and failed calls.
    pub fn carry(&self, done: Done) {
        self.meter.carry_steps(done.steps);
        let mut trajectory = lock(&self.trajectory);
        trajectory.carried_calls = trajectory.carried_calls.saturating_add(done.tool_calls);
        trajectory.carried_errors = trajectory.carried_errors.saturating_add(done.tool_errors);
    }

    /// Adds a dispatched call to the episode's trajectory.
    pub fn dispatched(&self, call: &ToolCall) {
        lock(&self.trajectory).calls.push(call.clone());
    }

    /// Adds a failed call to the episode's trajectory.
    pub fn failed(&self, call_id: &str, error: &ToolError) {
        lock(&self.trajectory).errors.push(CallError { call_id: call_id.to_owned(), error: error.clone() });
    }

    /// Adds what the agent said to the user to the episode's trajectory.
    pub fn told_user(&self, text: &str) {
        lock(&self.trajectory).told_user.push(text.to_owned());
    }

    /// What every agent of the episode did.
    pub fn take_trajectory(&self) -> Trajectory {
        std::mem::take(&mut *lock(&self.trajectory))
    }
}

/// A program's model calls through the gateway spend from the episode as the built-in
/// agent's turns do: each call one step, refused past a limit.
impl EpisodeState {
    /// Whether one more model call may be made: the time, tokens and cost that are left.
    fn admits_a_call(&self) -> Result<(), Termination> {
        if self.out_of_time() {
            return Err(Termination::TimeLimit);
        }
        match self.over_limits() {
            Some(limit) => Err(limit),
            None => Ok(()),
        }
    }
}

/// Each model call through the gateway takes a step of its own.
impl crate::gateway::Ledger for EpisodeState {
    fn admit(&self) -> Result<u32, Termination> {
        self.admits_a_call()?;
        self.take_step().ok_or(Termination::MaxSteps)
    }

    fn spend(&self, usage: Usage, cost_usd: Option<f64>) {
        EpisodeState::spend(self, usage, cost_usd);
    }

    fn deadline(&self) -> &Deadline {
        &self.deadline
    }

    fn dispatched(&self, call: &ToolCall) {
        EpisodeState::dispatched(self, call);
    }
}

/// How the model calls of a program agent count against the episode's steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallSteps {
    /// `external`: the program's turns are the loop's; a call through the gateway is part
    /// of the turn the loop already counted and takes no step of its own.
    WithinTurns,
    /// `cli`: the program owns its loop. The loop's one turn took step 1, which is the
    /// first call's; each later call takes one more, so `max_steps: N` allows N calls.
    OwnLoop,
}

/// A program agent's ledger: the episode's state, its steps counted by [`CallSteps`].
pub struct ProgramLedger {
    episode: std::sync::Arc<EpisodeState>,
    steps: CallSteps,
    first: std::sync::atomic::AtomicBool,
}

impl ProgramLedger {
    pub fn new(episode: std::sync::Arc<EpisodeState>, steps: CallSteps) -> Self {
        ProgramLedger { episode, steps, first: std::sync::atomic::AtomicBool::new(true) }
    }
}

impl crate::gateway::Ledger for ProgramLedger {
    fn admit(&self) -> Result<u32, Termination> {
        let first = self.first.swap(false, std::sync::atomic::Ordering::SeqCst);
        match self.steps {
            CallSteps::OwnLoop if !first => crate::gateway::Ledger::admit(self.episode.as_ref()),
            _ => self.episode.admits_a_call().map(|()| self.episode.steps()),
        }
    }

    fn spend(&self, usage: Usage, cost_usd: Option<f64>) {
        self.episode.spend(usage, cost_usd);
    }

    fn deadline(&self) -> &Deadline {
        &self.episode.deadline
    }

    fn dispatched(&self, call: &ToolCall) {
        self.episode.dispatched(call);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn budget(max_steps: u32, max_tokens: Option<u64>, max_cost_usd: Option<f64>) -> EpisodeState {
        let limits = EpisodeLimits::new(max_steps, Duration::from_secs(60));
        EpisodeState::new(limits.with_max_tokens(max_tokens).with_max_cost_usd(max_cost_usd))
    }

    fn tokens(n: u64) -> Usage {
        Usage { input_tokens: n, ..Usage::default() }
    }

    #[test]
    fn steps_are_numbered_across_the_tree_and_run_out_for_everyone() {
        let tree = budget(3, None, None);
        assert_eq!([tree.take_step(), tree.take_step(), tree.take_step()], [Some(1), Some(2), Some(3)]);
        assert_eq!(tree.take_step(), None);
        assert_eq!(tree.steps(), 3, "a refused step is not taken");
    }

    #[test]
    fn steps_taken_at_once_are_each_taken_once() {
        let tree = Arc::new(budget(1000, None, None));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let tree = tree.clone();
                std::thread::spawn(move || (0..300).filter_map(|_| tree.take_step()).collect::<Vec<_>>())
            })
            .collect();
        let mut all: Vec<u32> = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        all.sort();
        assert_eq!(all, (1..=1000).collect::<Vec<_>>());
    }

    #[test]
    fn spending_counts_every_agent_and_the_cost_is_known_only_while_every_call_had_a_price() {
        let tree = budget(10, Some(100), Some(1.0));
        tree.spend(tokens(60), Some(0.25));
        assert_eq!(tree.allowance(2).tokens_left, Some(40));
        assert_eq!(tree.over_limits(), None);
        tree.spend(tokens(41), Some(0.25));
        assert_eq!((tree.usage().total(), tree.cost_usd()), (101, Some(0.5)));
        assert_eq!(tree.over_limits(), Some(Termination::TokenLimit));

        let tree = self::budget(10, None, Some(1.0));
        tree.spend(tokens(1), Some(0.75));
        tree.spend(tokens(1), Some(0.5));
        assert_eq!(tree.over_limits(), Some(Termination::CostLimit));
        tree.spend(tokens(1), None);
        assert_eq!(tree.cost_usd(), None, "one call without a price: the cost is unknown");
        tree.spend(tokens(1), Some(0.1));
        assert_eq!(tree.cost_usd(), None, "and stays unknown");
    }

    #[test]
    fn the_gateway_takes_a_step_per_call_and_is_refused_past_each_limit() {
        use crate::gateway::Ledger;
        let tree = budget(2, Some(100), None);
        assert_eq!([tree.admit(), tree.admit()], [Ok(1), Ok(2)]);
        assert_eq!(tree.admit(), Err(Termination::MaxSteps));
        let tree = budget(10, Some(100), None);
        Ledger::spend(&tree, tokens(101), None);
        assert_eq!(tree.admit(), Err(Termination::TokenLimit));
        assert_eq!(tree.steps(), 0, "a refused call takes no step");
        let tree = budget(10, None, Some(0.5));
        Ledger::spend(&tree, tokens(1), Some(0.75));
        assert_eq!(tree.admit(), Err(Termination::CostLimit));
        let tree = EpisodeState::new(EpisodeLimits::new(10, Duration::ZERO));
        assert_eq!(tree.admit(), Err(Termination::TimeLimit));
        let tree = budget(10, None, None);
        Ledger::dispatched(&tree, &ToolCall::new("c", "Write", serde_json::json!({})));
        assert_eq!(tree.take_trajectory().calls.len(), 1);
    }

    #[test]
    fn an_allowance_says_what_is_left_when_a_turn_starts() {
        let tree = budget(5, None, None);
        let step = tree.take_step().unwrap();
        let budget = tree.allowance(step);
        assert_eq!((budget.step, budget.steps_left, budget.tokens_left), (1, 5, None));
        tree.take_step();
        let step = tree.take_step().unwrap();
        assert_eq!(tree.allowance(step).steps_left, 3, "steps 3, 4 and 5 are left when step 3 starts");
    }

    /// An attempt that goes on with a killed one's work counts its steps and calls, and
    /// what it then records of itself includes them, in its first turn as after.
    #[test]
    fn carried_steps_and_calls_count_and_are_counted_again_in_what_is_recorded() {
        let budget = EpisodeState::new(EpisodeLimits::new(10, Duration::from_secs(60)));
        assert_eq!(budget.take_step(), Some(1));
        budget.carry(Done { steps: 6, tool_calls: 9, tool_errors: 2 });
        assert_eq!(budget.done_before_this_turn(), Done { steps: 6, tool_calls: 9, tool_errors: 2 });
        budget.dispatched(&ToolCall::new("c1", "get", serde_json::json!({})));
        assert_eq!(budget.take_step(), Some(8), "the turn after the first comes after the carried steps");
        assert_eq!(budget.done_before_this_turn(), Done { steps: 7, tool_calls: 10, tool_errors: 2 });
        let trajectory = budget.take_trajectory();
        assert_eq!((trajectory.tool_calls(), trajectory.tool_errors()), (10, 2));
        assert_eq!(budget.steps(), 8);
        // The limit counts the carried steps: two turns are left of ten.
        assert_eq!((budget.take_step(), budget.take_step(), budget.take_step()), (Some(9), Some(10), None));
    }
}
