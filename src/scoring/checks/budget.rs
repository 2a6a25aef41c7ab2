//! `max_steps`, `max_tool_errors`, `max_tokens`, `max_cost`, `max_latency`: what the episode
//! used against a budget.

use super::{CheckResult, verdict};
use crate::domain::scorer::Budget;
use crate::log::UnscoredCause;
use crate::scoring::{Finished, ScoringFault};

/// The episode used at most `max` of `what`. A cost budget of a model without a price is
/// nobody's answer: the episode is unscored.
pub(crate) fn check(episode: &Finished<'_>, what: Budget, max: f64) -> Result<CheckResult, ScoringFault> {
    let ending = episode.ending;
    let (used, unit) = match what {
        Budget::Steps => (Some(ending.steps as f64), "steps"),
        Budget::ToolErrors => (Some(ending.trajectory.tool_errors() as f64), "tool errors"),
        Budget::Tokens => (Some(ending.usage.total() as f64), "tokens"),
        Budget::CostUsd => (ending.cost_usd, "USD"),
        Budget::LatencyS => (Some(episode.wall_s), "seconds"),
    };
    Ok(match used {
        Some(used) if used <= max => verdict(true, format!("{used} {unit}, within {max}")),
        Some(used) => verdict(false, format!("{used} {unit}, over {max}")),
        None => {
            return Err(ScoringFault::new(
                UnscoredCause::CostUnknown,
                "`max_cost` needs the model's price: add it under `prices:` in runner.yaml",
            ));
        }
    })
}
