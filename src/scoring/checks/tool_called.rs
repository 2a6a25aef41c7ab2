//! `tool_called` and `tool_not_called`: whether the trajectory holds a call of a tool, by
//! any agent or by the ones `actor:` names.

use super::{CheckResult, verdict};
use crate::contract::ToolCall;
use crate::domain::scorer::ActorFilter;
use crate::environment::Trajectory;

/// `name` was called (or, negated, never called) by the agents `actor` names.
pub(crate) fn check(trajectory: &Trajectory, name: &str, negate: bool, actor: Option<&ActorFilter>) -> CheckResult {
    let by = |c: &&ToolCall| actor.is_none_or(|a| a.matches(&c.actor));
    let count = trajectory.calls.iter().filter(by).filter(|c| c.name == name).count();
    let whom = actor.map(|a| format!(" by {a}")).unwrap_or_default();
    match (count > 0, negate) {
        (true, false) => verdict(true, format!("`{name}` was called{whom} {count} time(s)")),
        (false, false) => verdict(false, format!("`{name}` was never called{whom}")),
        (true, true) => verdict(false, format!("`{name}` was called{whom} {count} time(s)")),
        (false, true) => verdict(true, format!("`{name}` was never called{whom}")),
    }
}
