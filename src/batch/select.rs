//! Which tasks a run makes: the command line's [`Selection`] applied to the suites' tasks,
//! once, before the plan. `--range` counts the run's tasks in plan order (suite by suite,
//! from 0); `--filter`, `--tag` and `--failing` keep the tasks they name; `--sample` then
//! draws N of what is left by a hash of each task's id and the seed, so the same tasks are
//! drawn in every run and shard. A task chosen runs all its models and epochs.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::EpisodeSpec;
use crate::domain::Task;
use crate::domain::selection::Selection;
use crate::environment::permission::glob_matches;
use crate::log::Outcome;
use crate::log::projection::Projection;
use crate::suite::Suite;

/// The tasks chosen, by suite: their positions in the suite's list.
#[derive(Debug, Default)]
pub struct Chosen {
    by_suite: HashMap<String, HashSet<usize>>,
}

impl Chosen {
    pub fn contains(&self, episode: &EpisodeSpec) -> bool {
        self.by_suite.get(&episode.suite.name).is_some_and(|tasks| tasks.contains(&episode.task))
    }

    /// How many tasks were chosen.
    pub fn len(&self) -> usize {
        self.by_suite.values().map(HashSet::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The `(suite, task id)` of every task that failed or was unscored in the run whose log is
/// `events` (its latest attempt under its latest scoring; a merged run of shards is one run).
pub fn failing_in(events: &Path) -> Result<HashSet<(String, String)>, String> {
    let run = Projection::from_log(events).map_err(|e| format!("{}: {e}", events.display()))?;
    Ok(run
        .episodes
        .iter()
        .filter(|e| matches!(e.outcome, Outcome::Scored { passed: false, .. } | Outcome::Unscored { .. }))
        .map(|e| (e.suite.to_string(), e.task_id.to_string()))
        .collect())
}

/// The tasks `selection` chooses; `None` when it chooses none in particular (every task
/// runs). `failing` is what `--failing` named, read by [`failing_in`].
pub fn choose(
    suites: &[Arc<Suite>],
    selection: &Selection,
    failing: Option<&HashSet<(String, String)>>,
) -> Option<Chosen> {
    if selection.is_none() {
        return None;
    }
    let mut kept: Vec<(&str, usize, &Task)> = Vec::new();
    let mut position = 0u64;
    for suite in suites {
        for (index, task) in suite.tasks.iter().enumerate() {
            let in_range = selection.range.is_none_or(|r| r.contains(position));
            position += 1;
            let filtered = selection.filter.is_empty()
                || selection.filter.iter().any(|glob| {
                    glob_matches(glob, &format!("{}/{}", suite.name, task.id))
                        || glob_matches(glob, &task.id)
                        || glob_matches(glob, &suite.name)
                });
            let tagged = selection.tags.is_empty() || task.tags.iter().any(|t| selection.tags.contains(t));
            let failed = failing.is_none_or(|f| f.contains(&(suite.name.clone(), task.id.clone())));
            if in_range && filtered && tagged && failed {
                kept.push((&suite.name, index, task));
            }
        }
    }
    if let Some(n) = selection.sample {
        let draw = |suite: &str, task: &Task| {
            let mut h = Sha256::new();
            h.update(selection.sample_seed.to_le_bytes());
            for part in [suite, task.id.as_str()] {
                h.update(part.as_bytes());
                h.update([0]);
            }
            h.finalize()
        };
        kept.sort_by_cached_key(|(suite, _, task)| draw(suite, task));
        kept.truncate(usize::try_from(n).unwrap_or(usize::MAX));
    }
    let mut chosen = Chosen::default();
    for (suite, index, _) in kept {
        chosen.by_suite.entry(suite.to_owned()).or_default().insert(index);
    }
    Some(chosen)
}
