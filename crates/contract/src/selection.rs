//! Which tasks a run makes, as the command line chose them (`--filter`, `--tag`,
//! `--sample`, `--failing`, `--range`): recorded in `run_started` and `run.json`, and
//! checked again by a resumption. `batch/select.rs` applies it.

use serde::{Deserialize, Serialize};

/// The command line's choice of tasks; empty when it made none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Selection {
    /// `--filter GLOB`: tasks whose `suite/task` id, task id or suite name matches one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub filter: Vec<String>,
    /// `--tag T`: tasks with one of these in their `tags:`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// `--sample N`: N of the tasks the rest chose, drawn by a hash of their ids and the seed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sample: Option<u64>,
    /// `--sample-seed S`.
    #[serde(skip_serializing_if = "is_zero")]
    pub sample_seed: u64,
    /// `--failing RUN`: the run (as named) whose failed or unscored tasks run again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failing: Option<String>,
    /// `--range A..B`: the tasks at positions A to B-1 of the run's task list, from 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub range: Option<TaskRange>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Selection {
    pub fn is_none(&self) -> bool {
        *self == Selection::default()
    }

    /// The flags that make this selection, to name it in messages.
    pub fn as_flags(&self) -> String {
        let mut flags: Vec<String> = Vec::new();
        flags.extend(self.filter.iter().map(|g| format!("--filter {g}")));
        flags.extend(self.tags.iter().map(|t| format!("--tag {t}")));
        flags.extend(self.sample.map(|n| format!("--sample {n}")));
        if self.sample_seed != 0 {
            flags.push(format!("--sample-seed {}", self.sample_seed));
        }
        flags.extend(self.failing.as_ref().map(|r| format!("--failing {r}")));
        flags.extend(self.range.map(|r| format!("--range {r}")));
        if flags.is_empty() { "no task selection".into() } else { flags.join(" ") }
    }
}

/// `A..B`, `A..` or `..B`: positions from 0, B excluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskRange {
    pub start: u64,
    pub end: Option<u64>,
}

impl TaskRange {
    pub fn parse(text: &str) -> Result<TaskRange, String> {
        let bad = || format!("a range is A..B (tasks A to B-1, counted from 0), A.. or ..B, not `{text}`");
        let (a, b) = text.split_once("..").ok_or_else(bad)?;
        let start = if a.trim().is_empty() { 0 } else { a.trim().parse().map_err(|_| bad())? };
        let end = if b.trim().is_empty() { None } else { Some(b.trim().parse().map_err(|_| bad())?) };
        if end.is_some_and(|end| end <= start) {
            return Err(format!("the range `{text}` holds no task: its end must be above its start"));
        }
        Ok(TaskRange { start, end })
    }

    pub fn contains(&self, position: u64) -> bool {
        position >= self.start && self.end.is_none_or(|end| position < end)
    }
}

impl std::fmt::Display for TaskRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.end {
            Some(end) => write!(f, "{}..{end}", self.start),
            None => write!(f, "{}..", self.start),
        }
    }
}

impl Serialize for TaskRange {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TaskRange {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        TaskRange::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_counts_from_zero_and_leaves_out_its_end() {
        let r = TaskRange::parse("2..4").unwrap();
        assert_eq!((r.contains(1), r.contains(2), r.contains(3), r.contains(4)), (false, true, true, false));
        assert!(TaskRange::parse("3..").unwrap().contains(1000));
        assert!(TaskRange::parse("..2").unwrap().contains(0));
        for bad in ["4..2", "2..2", "a..b", "5", "1...3"] {
            assert!(TaskRange::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(TaskRange::parse("..7").unwrap().to_string(), "0..7");
    }
}
