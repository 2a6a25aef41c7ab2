//! `tool_sequence`: the trajectory holds expected calls, in order or in any order, with
//! arguments matched exactly, as a subset or by pattern; optionally with partial credit.

use serde_json::Value;

use super::CheckResult;
use crate::contract::{FINAL_TOOL, ToolCall};
use crate::domain::scorer::{ActorFilter, ArgMatch, ExpectedCall};
use crate::environment::Trajectory;

/// How many `expected` calls the trajectory holds (of the agents `actor` names), in order
/// or in any order, their arguments matched as `mode` says; with `partial`, the F1 is the
/// value.
pub(crate) fn check(
    trajectory: &Trajectory,
    expected: &[ExpectedCall],
    ordered: bool,
    mode: ArgMatch,
    partial: bool,
    actor: Option<&ActorFilter>,
) -> CheckResult {
    let made: Vec<ToolCall> = match actor {
        Some(a) => trajectory.calls.iter().filter(|c| a.matches(&c.actor)).cloned().collect(),
        None => trajectory.calls.clone(),
    };
    sequence(&made, expected, ordered, mode, partial)
}

fn arguments_match(mode: ArgMatch, expected: Option<&Value>, actual: &Value) -> bool {
    let Some(expected) = expected else { return true };
    match mode {
        ArgMatch::Exact => expected == actual,
        ArgMatch::Subset | ArgMatch::Pattern => {
            let (Some(want), Some(got)) = (expected.as_object(), actual.as_object()) else { return expected == actual };
            want.iter().all(|(k, w)| {
                let Some(g) = got.get(k) else { return false };
                match (mode, w) {
                    (ArgMatch::Pattern, Value::String(pattern)) => {
                        let text = g.as_str().map(String::from).unwrap_or_else(|| g.to_string());
                        super::text::matches(crate::domain::scorer::TextOp::Regex, &text, pattern, false) == Ok(true)
                    }
                    _ => w == g,
                }
            })
        }
    }
}

/// How many expected calls the trajectory holds (in order, or in any order), and the F1
/// of matched calls against the calls made.
fn sequence(
    actual: &[ToolCall],
    expected: &[ExpectedCall],
    ordered: bool,
    mode: ArgMatch,
    partial: bool,
) -> CheckResult {
    let made: Vec<&ToolCall> = actual.iter().filter(|c| c.name != FINAL_TOOL).collect();
    let matches =
        |e: &ExpectedCall, c: &ToolCall| e.name == c.name && arguments_match(mode, e.arguments.as_ref(), &c.arguments);
    let matched = if ordered {
        let mut next = 0;
        for call in &made {
            if next < expected.len() && matches(&expected[next], call) {
                next += 1;
            }
        }
        next
    } else {
        // The most expected calls that can each have a made call of their own (bipartite
        // matching by augmenting paths; the lists are short).
        let edges: Vec<Vec<usize>> =
            expected.iter().map(|e| (0..made.len()).filter(|&i| matches(e, made[i])).collect()).collect();
        let mut owner: Vec<Option<usize>> = vec![None; made.len()];
        fn augment(e: usize, edges: &[Vec<usize>], owner: &mut [Option<usize>], seen: &mut [bool]) -> bool {
            for &c in &edges[e] {
                if !seen[c] {
                    seen[c] = true;
                    if owner[c].is_none_or(|other| augment(other, edges, owner, seen)) {
                        owner[c] = Some(e);
                        return true;
                    }
                }
            }
            false
        }
        (0..expected.len()).filter(|&e| augment(e, &edges, &mut owner, &mut vec![false; made.len()])).count()
    };
    let recall = matched as f64 / expected.len() as f64;
    let precision = if made.is_empty() { 0.0 } else { matched as f64 / made.len() as f64 };
    let f1 = if matched == 0 { 0.0 } else { 2.0 * precision * recall / (precision + recall) };
    let passed = matched == expected.len();
    let how = if ordered { "in order" } else { "in any order" };
    let explanation =
        format!("{matched} of {} expected calls made {how} ({} calls in all; F1 {f1:.2})", expected.len(), made.len());
    let value = match (partial, passed) {
        (true, _) => f1,
        (false, true) => 1.0,
        (false, false) => 0.0,
    };
    CheckResult::valued(passed, value, explanation)
}
