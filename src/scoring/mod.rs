//! Scoring: a finished episode (its final answer and trajectory) into scores. A task
//! passes when every one of its scorers passes; its score is their mean.

use crate::environment::Trajectory;
use crate::log::Termination;
use crate::suite::{ScorerSpec, Task, template};

/// One scorer's verdict on one episode.
#[derive(Debug, Clone, PartialEq)]
pub struct Score {
    pub scorer: String,
    pub value: f64,
    pub passed: bool,
    pub explanation: String,
}

/// What scorers look at.
pub struct Finished<'a> {
    pub task: &'a Task,
    pub answer: Option<&'a str>,
    pub termination: Termination,
    pub trajectory: &'a Trajectory,
}

/// Applies each scorer to the episode.
pub fn score<'s>(scorers: impl IntoIterator<Item = &'s ScorerSpec>, episode: &Finished<'_>) -> Vec<Score> {
    let context = episode.task.template_context();
    scorers.into_iter().map(|spec| apply(spec, episode, &context)).collect()
}

/// The episode's score (the mean) and whether it passed (every scorer passed).
pub fn aggregate(scores: &[Score]) -> (f64, bool) {
    if scores.is_empty() {
        return (0.0, false);
    }
    let mean = scores.iter().map(|s| s.value).sum::<f64>() / scores.len() as f64;
    (mean, scores.iter().all(|s| s.passed))
}

fn apply(spec: &ScorerSpec, episode: &Finished<'_>, context: &serde_json::Map<String, serde_json::Value>) -> Score {
    let verdict = |passed: bool, explanation: String| Score {
        scorer: spec.name().to_owned(),
        value: if passed { 1.0 } else { 0.0 },
        passed,
        explanation,
    };
    if let ScorerSpec::ToolCalled(name) = spec {
        let count = episode.trajectory.calls.iter().filter(|c| &c.name == name).count();
        return if count > 0 {
            verdict(true, format!("`{name}` was called {count} time(s)"))
        } else {
            verdict(false, format!("`{name}` was never called"))
        };
    }
    let (ScorerSpec::Includes(expected) | ScorerSpec::Equals(expected) | ScorerSpec::Regex(expected)) = spec else {
        unreachable!("tool_called is handled above");
    };
    // Suites are checked at load time, so a template that fails here is a bug; say so.
    let expected = match template::render(&expected.0, context) {
        Ok(text) => text,
        Err(e) => return verdict(false, format!("the scorer's template failed: {e}")),
    };
    let Some(answer) = episode.answer else {
        return verdict(false, format!("no final answer (the episode ended by {})", episode.termination.as_str()));
    };
    match spec {
        ScorerSpec::Includes(_) => {
            if answer.contains(&expected) {
                verdict(true, format!("the answer contains {expected:?}"))
            } else {
                verdict(false, format!("the answer {} does not contain {expected:?}", quote(answer)))
            }
        }
        ScorerSpec::Equals(_) => {
            if answer.trim() == expected.trim() {
                verdict(true, format!("the answer equals {expected:?}"))
            } else {
                verdict(false, format!("the answer {} is not {expected:?}", quote(answer)))
            }
        }
        ScorerSpec::Regex(_) => match regex::Regex::new(&expected) {
            Ok(re) if re.is_match(answer) => verdict(true, format!("the answer matches /{expected}/")),
            Ok(_) => verdict(false, format!("the answer {} does not match /{expected}/", quote(answer))),
            Err(e) => verdict(false, format!("invalid regex /{expected}/: {e}")),
        },
        ScorerSpec::ToolCalled(_) => unreachable!("handled above"),
    }
}

/// The answer as explanations show it: quoted, and cut when long.
fn quote(answer: &str) -> String {
    const MAX: usize = 200;
    if answer.chars().count() <= MAX {
        format!("{answer:?}")
    } else {
        let cut: String = answer.chars().take(MAX).collect();
        format!("{cut:?}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::ToolCall;
    use crate::suite::text::Text;
    use serde_json::json;
    use std::sync::Arc;

    fn task(target: &str) -> Task {
        Task {
            id: "t".into(),
            input: "q".into(),
            target: Some(target.into()),
            files: Default::default(),
            metadata: Default::default(),
            scorers: Vec::new(),
            mock: Arc::from(Vec::new()),
            digest: String::new(),
        }
    }

    fn check(spec: ScorerSpec, answer: Option<&str>, calls: &[&str]) -> Score {
        let task = task("3");
        let trajectory = Trajectory {
            calls: calls
                .iter()
                .map(|n| ToolCall { call_id: "c".into(), name: (*n).into(), arguments: json!({}) })
                .collect(),
            tool_errors: 0,
        };
        let finished = Finished { task: &task, answer, termination: Termination::FinalAnswer, trajectory: &trajectory };
        score([&spec], &finished).remove(0)
    }

    #[test]
    fn includes_renders_the_target() {
        assert!(check(ScorerSpec::Includes(Text("{{ target }}".into())), Some("it is 3 lines"), &[]).passed);
        let failed = check(ScorerSpec::Includes(Text("{{ target }}".into())), Some("four"), &[]);
        assert!(!failed.passed);
        assert_eq!(failed.value, 0.0);
        assert!(failed.explanation.contains("\"four\""), "{}", failed.explanation);
    }

    #[test]
    fn equals_ignores_surrounding_whitespace_only() {
        assert!(check(ScorerSpec::Equals(Text("3".into())), Some(" 3\n"), &[]).passed);
        assert!(!check(ScorerSpec::Equals(Text("3".into())), Some("33"), &[]).passed);
    }

    #[test]
    fn regex_searches_the_answer() {
        assert!(check(ScorerSpec::Regex(Text(r"^\d+$".into())), Some("42"), &[]).passed);
        assert!(!check(ScorerSpec::Regex(Text(r"^\d+$".into())), Some("42 lines"), &[]).passed);
    }

    #[test]
    fn tool_called_looks_at_the_trajectory() {
        assert!(check(ScorerSpec::ToolCalled("run_command".into()), None, &["read_file", "run_command"]).passed);
        assert!(!check(ScorerSpec::ToolCalled("run_command".into()), Some("3"), &["read_file"]).passed);
    }

    #[test]
    fn a_missing_answer_fails_text_scorers_and_says_why() {
        let s = check(ScorerSpec::Includes(Text("3".into())), None, &[]);
        assert!(!s.passed);
        assert!(s.explanation.contains("final_answer"), "{}", s.explanation);
    }

    #[test]
    fn aggregate_is_the_mean_and_all_must_pass() {
        let pass = Score { scorer: "a".into(), value: 1.0, passed: true, explanation: String::new() };
        let fail = Score { value: 0.0, passed: false, ..pass.clone() };
        assert_eq!(aggregate(&[pass.clone(), fail]), (0.5, false));
        assert_eq!(aggregate(&[pass.clone(), pass]), (1.0, true));
    }
}
