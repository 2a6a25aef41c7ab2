//! The verdict on a task set run under the `oracle` agent: every task must pass with its
//! reference solution; the tasks that did not are named, each with why (the failing
//! scorer's explanation, or the unscored cause and message). Read from the log.

use std::collections::HashMap;
use std::path::Path;

use crate::log::projection::Index;
use crate::log::reader::ReadError;
use crate::log::{Event, Outcome};

/// One task that did not pass under the oracle, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct NotPassed {
    pub task: String,
    pub why: String,
}

/// The tasks of the run that did not pass, and how many episodes there were.
pub fn verdict(events: &Path) -> Result<(Vec<NotPassed>, usize), ReadError> {
    // The failing verdicts of each episode, as its latest scoring gave them.
    let mut failing: HashMap<String, (String, Vec<String>)> = HashMap::new();
    let index = Index::build_with(events, &["score"], |episode, event| {
        if let (Some(id), Event::Score { scoring_id, scorer, passed, explanation, .. }) = (episode, event) {
            let entry = failing.entry(id.to_owned()).or_default();
            if entry.0 != scoring_id {
                *entry = (scoring_id, Vec::new());
            }
            if !passed {
                entry.1.push(format!("{scorer}: {explanation}"));
            }
        }
    })?;
    let mut not_passed = Vec::new();
    let mut episodes = 0;
    index.for_each_row(|row| {
        episodes += 1;
        let why = match &row.outcome {
            Outcome::Scored { passed: true, .. } => return,
            Outcome::Scored { score, .. } => {
                let reasons = failing.get(&*row.episode_id).map(|(_, r)| r.join("; ")).unwrap_or_default();
                format!("failed (score {score:.2}): {reasons}")
            }
            Outcome::Unscored { cause, message } => format!("unscored ({cause}): {message}"),
            Outcome::Cancelled => "cancelled".to_owned(),
        };
        not_passed.push(NotPassed { task: format!("{}/{}", row.suite, row.task_id), why });
    })?;
    Ok((not_passed, episodes))
}
