//! Two episodes of one task side by side, step by step: each turn of the main agent is the
//! tool calls it made (name and arguments) and, last, its final answer; turn `i` of one is
//! paired with turn `i` of the other, and the first turn where they differ is the first
//! divergence — where to start reading when one passed and the other did not.

use serde::Serialize;
use serde_json::Value;

/// One turn of an episode's main agent.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnCalls {
    pub step: u64,
    pub calls: Vec<CallMade>,
    /// The final answer, on the turn that gave it.
    pub answer: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallMade {
    pub name: String,
    pub arguments: Value,
    /// Whether its observation was an error.
    pub error: bool,
}

/// Turn `i` of each side, and whether they are the same.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnPair {
    pub a: Option<TurnCalls>,
    pub b: Option<TurnCalls>,
    pub same: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Alignment {
    pub rows: Vec<TurnPair>,
    /// The index of the first row whose turns differ; `None` when the two are the same.
    pub first_divergence: Option<usize>,
}

/// The turns of the main agent in an episode's events (as logged, in order).
pub fn turns(events: &[Value]) -> Vec<TurnCalls> {
    let mut out: Vec<TurnCalls> = Vec::new();
    let mut errors = std::collections::HashSet::new();
    for e in events {
        if e["type"] == "observation"
            && !e["observation"]["error"].is_null()
            && let Some(id) = e["observation"]["call_id"].as_str()
        {
            errors.insert(id.to_owned());
        }
    }
    let turn_of = |out: &mut Vec<TurnCalls>, step: u64| -> usize {
        match out.iter().position(|t| t.step == step) {
            Some(at) => at,
            None => {
                out.push(TurnCalls { step, calls: Vec::new(), answer: None });
                out.len() - 1
            }
        }
    };
    for e in events {
        let step = e["step"].as_u64().unwrap_or(0);
        match e["type"].as_str() {
            Some("action_dispatched") => {
                let call = &e["call"];
                if call["actor"].as_str().is_some_and(|a| a != "main") {
                    continue;
                }
                let at = turn_of(&mut out, step);
                let error = call["call_id"].as_str().is_some_and(|id| errors.contains(id));
                out[at].calls.push(CallMade {
                    name: call["name"].as_str().unwrap_or_default().to_owned(),
                    arguments: canonical(&call["arguments"]),
                    error,
                });
            }
            Some("final") => {
                let at = turn_of(&mut out, step);
                let answer = match &e["answer"] {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                out[at].answer = Some(answer);
            }
            _ => {}
        }
    }
    out
}

/// Arguments given as a JSON string are compared as the object they hold.
fn canonical(arguments: &Value) -> Value {
    match arguments {
        Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| arguments.clone()),
        other => other.clone(),
    }
}

/// TurnCalls by turn: the same when both made the same calls (names and arguments, in order)
/// and gave the same answer.
pub fn align(a: &[TurnCalls], b: &[TurnCalls]) -> Alignment {
    let n = a.len().max(b.len());
    let mut rows = Vec::with_capacity(n);
    let mut first_divergence = None;
    for i in 0..n {
        let (x, y) = (a.get(i), b.get(i));
        let same = match (x, y) {
            (Some(x), Some(y)) => {
                x.answer == y.answer
                    && x.calls.len() == y.calls.len()
                    && x.calls.iter().zip(&y.calls).all(|(c, d)| c.name == d.name && c.arguments == d.arguments)
            }
            _ => false,
        };
        if !same && first_divergence.is_none() {
            first_divergence = Some(i);
        }
        rows.push(TurnPair { a: x.cloned(), b: y.cloned(), same });
    }
    Alignment { rows, first_divergence }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(step: u64, id: &str, name: &str, args: Value) -> Value {
        json!({"type": "action_dispatched", "step": step, "call": {"call_id": id, "name": name, "arguments": args}})
    }

    #[test]
    fn the_first_turn_whose_calls_differ_is_the_divergence() {
        let a = vec![
            call(1, "c1", "set", json!({"key": "a", "value": "1"})),
            call(2, "c2", "get", json!({"key": "a"})),
            json!({"type": "final", "step": 3, "answer": "1"}),
        ];
        let b = vec![
            // The same call, its arguments as a JSON string in another key order.
            call(1, "d1", "set", json!("{\"value\": \"1\", \"key\": \"a\"}")),
            call(2, "d2", "get", json!({"key": "b"})),
            json!({"type": "observation", "step": 2, "observation": {"call_id": "d2", "error": {"type": "ExecutionError"}}}),
            json!({"type": "final", "step": 3, "answer": "none"}),
        ];
        let (ta, tb) = (turns(&a), turns(&b));
        assert_eq!(ta.len(), 3);
        assert!(tb[1].calls[0].error, "the failed call is marked");
        let aligned = align(&ta, &tb);
        assert_eq!(aligned.first_divergence, Some(1));
        assert_eq!(aligned.rows.iter().map(|r| r.same).collect::<Vec<_>>(), [true, false, false]);
    }

    #[test]
    fn a_longer_episode_diverges_where_the_shorter_ends() {
        let a = vec![call(1, "c1", "set", json!({"key": "a"}))];
        let b = vec![call(1, "c1", "set", json!({"key": "a"})), call(2, "c2", "get", json!({"key": "a"}))];
        let aligned = align(&turns(&a), &turns(&b));
        assert_eq!(aligned.first_divergence, Some(1));
        assert!(aligned.rows[1].a.is_none());
        assert_eq!(align(&turns(&a), &turns(&a)).first_divergence, None);
    }

    #[test]
    fn a_subagent_s_calls_are_not_the_main_agent_s_turns() {
        let mut sub = call(1, "s1", "get", json!({}));
        sub["call"]["actor"] = json!("main.1");
        assert!(turns(&[sub]).is_empty());
    }
}
