//! `python:` and `js:`: a code scorer, run by a long-lived worker of its language
//! (`scoring/workers/`). It gets the final answer (`output`) and a context: the task's
//! target (`answer`), the task, its template values (`vars`), the trajectory and the final
//! world's files. It returns a bool, a number or `{pass, score, reason}`; anything else,
//! an exception, a timeout or a crash leaves the episode unscored (`scorer_error`), never
//! failed.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::{CheckResult, FILE_SCAN_CAP, Scene, quote};
use crate::domain::scorer::{CodeScorer, CodeSource};
use crate::log::UnscoredCause;
use crate::sandbox::SandboxMode;
use crate::scoring::ScoringFault;
use crate::scoring::workers::{Reply, WorkerKey, Workers};

pub(crate) async fn check(
    scene: &Scene<'_>,
    code: &CodeScorer,
    workers: &Workers,
) -> Result<CheckResult, ScoringFault> {
    let episode = scene.episode;
    let (file, function, expression) = match &code.source {
        CodeSource::File { path, function } => (Some(PathBuf::from(path)), Some(function.as_str()), None),
        CodeSource::Inline(expression) => (None, None, Some(expression.as_str())),
    };
    let key = WorkerKey {
        language: code.language,
        interpreter: code.interpreter.clone(),
        file,
        sandboxed: episode.sandbox == SandboxMode::On,
    };
    let request = json!({
        "function": function,
        "expression": expression,
        "output": episode.ending.final_answer,
        // The most a file of `context.files` may hold: a larger one is missing.
        "files_cap": FILE_SCAN_CAP,
        "context": {
            "answer": episode.task.target,
            "task": {
                "id": episode.task.id,
                "input": episode.task.input,
                "target": episode.task.target,
                "metadata": episode.task.metadata,
            },
            "vars": scene.context,
            "trajectory": trajectory(scene),
        },
    });
    let limit = Duration::from_secs_f64(code.timeout_s).min(episode.world_limit);
    let files = scene.world.files().and_then(|f| f.working_directory());
    let name = describe(code);
    match workers.call(&key, request, files, limit).await {
        Reply::Returned(value) => {
            let verdict = judge(&name, &value, code.threshold)?;
            Ok(if code.negate { turned(verdict, value.is_boolean()) } else { verdict })
        }
        Reply::Other(shown) => Err(not_a_verdict(&name, &shown)),
        Reply::Raised(traceback) => Err(fault(format!("{name} raised:\n{traceback}"))),
        Reply::Failed(why) => Err(fault(format!("{name}: {why}"))),
    }
}

/// The calls of every agent, each with its actor and, when it failed, its error.
fn trajectory(scene: &Scene<'_>) -> Vec<Value> {
    let trajectory = &scene.episode.ending.trajectory;
    trajectory
        .calls
        .iter()
        .map(|call| {
            let mut shown = Map::new();
            shown.insert("name".into(), Value::from(call.name.as_str()));
            shown.insert("arguments".into(), call.arguments.clone());
            shown.insert("actor".into(), Value::from(call.actor.to_string()));
            shown.insert("call_id".into(), Value::from(call.call_id.as_str()));
            if let Some(failed) = trajectory.errors.iter().find(|e| e.call_id == call.call_id) {
                shown.insert("error".into(), serde_json::to_value(&failed.error).unwrap_or_default());
            }
            Value::Object(shown)
        })
        .collect()
}

/// The verdict a returned value gives: a bool, a number, or `{pass, score, reason}`.
fn judge(name: &str, value: &Value, threshold: Option<f64>) -> Result<CheckResult, ScoringFault> {
    let by_number = |x: f64| threshold.map_or(x > 0.0, |t| x >= t);
    match value {
        Value::Bool(passed) => {
            Ok(CheckResult::valued(*passed, f64::from(u8::from(*passed)), format!("{name} returned {passed}")))
        }
        Value::Number(n) => match n.as_f64() {
            Some(x) => Ok(CheckResult::valued(by_number(x), x.clamp(0.0, 1.0), format!("{name} returned {x}"))),
            None => Err(not_a_verdict(name, &n.to_string())),
        },
        Value::Object(fields) => {
            let pass = fields.get("pass");
            let score = fields.get("score");
            let reason = fields.get("reason").and_then(Value::as_str);
            let (passed, value) = match (pass, score) {
                (Some(Value::Bool(p)), Some(Value::Number(s))) => (*p, s.as_f64().unwrap_or(0.0)),
                (Some(Value::Bool(p)), None) => (*p, f64::from(u8::from(*p))),
                (None, Some(Value::Number(s))) => {
                    let s = s.as_f64().unwrap_or(0.0);
                    (by_number(s), s)
                }
                _ => return Err(not_a_verdict(name, &value.to_string())),
            };
            // A score under the threshold fails, whatever `pass` says.
            let passed = passed && threshold.is_none_or(|t| value >= t);
            let explanation = match reason {
                Some(reason) => format!("{name}: {reason}"),
                None => format!("{name} returned {value}"),
            };
            Ok(CheckResult::valued(passed, value.clamp(0.0, 1.0), explanation))
        }
        other => Err(not_a_verdict(name, &other.to_string())),
    }
}

/// A `not_` scorer's verdict: passed and failed swapped; a bool's score follows its
/// verdict, a number's or an object's is kept.
fn turned(result: CheckResult, was_bool: bool) -> CheckResult {
    let value = if was_bool { 1.0 - result.value } else { result.value };
    CheckResult { passed: !result.passed, value, explanation: format!("not: {}", result.explanation), ..result }
}

fn not_a_verdict(name: &str, shown: &str) -> ScoringFault {
    fault(format!("{name} returned {}, not a bool, a number or {{pass, score, reason}}", quote(shown)))
}

fn fault(message: String) -> ScoringFault {
    ScoringFault::new(UnscoredCause::ScorerError, message)
}

/// The scorer as an explanation names it: `python check.py:grade`, `js expression`.
fn describe(code: &CodeScorer) -> String {
    let language = code.language.key();
    match &code.source {
        CodeSource::File { path, function } => {
            let file = std::path::Path::new(path).file_name().map(|f| f.to_string_lossy()).unwrap_or_default();
            format!("`{language}: {file}:{function}`")
        }
        CodeSource::Inline(expression) => {
            let first = expression.trim().lines().next().unwrap_or_default();
            let cut: String = first.chars().take(60).collect();
            format!("`{language}: {cut}{}`", if cut.len() < expression.trim().len() { "…" } else { "" })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bool_a_number_or_an_object_is_a_verdict_and_nothing_else() {
        let j = |v: Value, t: Option<f64>| judge("s", &v, t).map(|r| (r.passed, r.value, r.explanation));
        assert_eq!(j(json!(true), None).map(|v| (v.0, v.1)), Ok((true, 1.0)));
        assert_eq!(j(json!(0.3), None).map(|v| (v.0, v.1)), Ok((true, 0.3)), "a number above 0 passes");
        assert_eq!(j(json!(0.3), Some(0.5)).map(|v| (v.0, v.1)), Ok((false, 0.3)));
        assert_eq!(j(json!(0), None).map(|v| v.0), Ok(false));
        let reasoned = j(json!({"pass": false, "score": 0.25, "reason": "too long"}), None).unwrap();
        assert_eq!(reasoned, (false, 0.25, "s: too long".into()));
        assert_eq!(j(json!({"score": 0.9}), Some(0.8)).map(|v| v.0), Ok(true));
        assert_eq!(j(json!({"pass": true, "score": 0.5}), Some(0.8)).map(|v| v.0), Ok(false), "under the threshold");
        let not = |v: Value, t: Option<f64>| {
            judge("s", &v, t).map(|x| turned(x, v.is_boolean())).map(|r| (r.passed, r.value))
        };
        assert_eq!(not(json!(true), None), Ok((false, 0.0)));
        assert_eq!(not(json!(false), None), Ok((true, 1.0)));
        assert_eq!(not(json!(0.3), Some(0.5)), Ok((true, 0.3)), "a number's score is kept");
        for bad in [json!("yes"), json!(null), json!([1]), json!({"reason": "no verdict"}), json!({"pass": "yes"})] {
            let fault = judge("s", &bad, None).unwrap_err();
            assert_eq!(fault.cause, UnscoredCause::ScorerError);
            assert!(fault.message.contains("not a bool, a number or {pass, score, reason}"), "{}", fault.message);
        }
    }
}
