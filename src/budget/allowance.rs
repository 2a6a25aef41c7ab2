//! A turn's allowance: what is left of the episode's limits when one agent's turn starts.

use crate::model::limiter::Deadline;

/// What is left of the episode's limits when a turn starts.
#[derive(Debug, Clone)]
pub struct Allowance {
    /// The number of this turn, from 1.
    pub step: u32,
    pub steps_left: u32,
    pub deadline: Deadline,
    pub tokens_left: Option<u64>,
}
