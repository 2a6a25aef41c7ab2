//! `communicated`: what the agent told the task's user contains a text.

use serde_json::Value;

use super::{CheckResult, Scene, quote, verdict};
use crate::contract::{ASK_USER, CLARIFY, EXIT_PLAN_MODE};
use crate::environment::Trajectory;

/// What the agent told the user (see [`told_user`]) contains `expected` (a template).
pub(crate) fn check(scene: &Scene<'_>, expected: &str, ignore_case: bool) -> CheckResult {
    let expected = match scene.render(expected) {
        Ok(e) => e,
        Err(failed) => return failed,
    };
    let told = told_user(&scene.episode.ending.trajectory);
    if told.is_empty() {
        return verdict(false, "the agent told the user nothing".into());
    }
    let found = told.iter().any(|text| {
        if ignore_case { text.to_lowercase().contains(&expected.to_lowercase()) } else { text.contains(&expected) }
    });
    if found {
        verdict(true, format!("the agent told the user {expected:?}"))
    } else {
        let last = told.last().map(String::as_str).unwrap_or_default();
        verdict(false, format!("the agent never told the user {expected:?} (its last words: {})", quote(last)))
    }
}

/// What the agent told the user: its conversation replies, the questions of `ask_user` and
/// `clarify` (with their choices), and the plans of `exit_plan_mode`, in order.
pub fn told_user(trajectory: &Trajectory) -> Vec<String> {
    let asked = trajectory.calls.iter().filter_map(|call| {
        let field = |name: &str| call.arguments.get(name).and_then(Value::as_str).map(str::to_owned);
        match call.name.as_str() {
            ASK_USER => field("question"),
            CLARIFY => {
                let choices: Vec<&str> = call
                    .arguments
                    .get("choices")
                    .and_then(Value::as_array)
                    .map(|c| c.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                field("question").map(|q| format!("{q} ({})", choices.join(" / ")))
            }
            EXIT_PLAN_MODE => field("plan"),
            _ => None,
        }
    });
    asked.chain(trajectory.told_user.iter().cloned()).collect()
}
