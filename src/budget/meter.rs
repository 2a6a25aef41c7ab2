//! An episode's meter: the steps every agent of it has taken, and the tokens and dollars
//! their model calls spent, checked against the episode's limits.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use super::EpisodeLimits;
use crate::log::{Termination, Usage, add_cost};

/// What an episode's agents have spent so far; shared by every actor of the episode.
#[derive(Debug, Default)]
pub struct Meter {
    steps: AtomicU32,
    spent: Mutex<Spent>,
}

#[derive(Debug, Default)]
struct Spent {
    usage: Usage,
    /// Known only while every model call so far had a price.
    cost_usd: Option<f64>,
    any: bool,
}

impl Meter {
    fn spent(&self) -> std::sync::MutexGuard<'_, Spent> {
        // Every change under the lock is a single sum: a panic cannot leave one half-done.
        self.spent.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the next step for one agent's turn: its number, or `None` once `max_steps`
    /// have been taken.
    pub fn take_step(&self, max_steps: u32) -> Option<u32> {
        let taken = self.steps.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < max_steps).then_some(n + 1));
        taken.ok().map(|n| n + 1)
    }

    /// The steps taken so far, by every agent.
    pub fn steps(&self) -> u32 {
        self.steps.load(Ordering::SeqCst)
    }

    /// Counts `steps` taken elsewhere (a killed attempt this one goes on from).
    pub fn carry_steps(&self, steps: u32) {
        self.steps.fetch_add(steps, Ordering::SeqCst);
    }

    /// Counts one turn's model calls.
    pub fn spend(&self, usage: Usage, cost_usd: Option<f64>) {
        let mut spent = self.spent();
        spent.usage.add(usage);
        spent.cost_usd = if spent.any { spent.cost_usd.zip(cost_usd).map(|(a, b)| add_cost(a, b)) } else { cost_usd };
        spent.any = true;
    }

    pub fn usage(&self) -> Usage {
        self.spent().usage
    }

    pub fn cost_usd(&self) -> Option<f64> {
        self.spent().cost_usd
    }

    /// The limit of `limits` the episode has gone past (tokens, then cost), if any.
    pub fn over(&self, limits: &EpisodeLimits) -> Option<Termination> {
        let spent = self.spent();
        if limits.max_tokens.is_some_and(|max| spent.usage.total() > max) {
            Some(Termination::TokenLimit)
        } else if limits.max_cost_usd.zip(spent.cost_usd).is_some_and(|(max, cost)| cost > max) {
            Some(Termination::CostLimit)
        } else {
            None
        }
    }
}
