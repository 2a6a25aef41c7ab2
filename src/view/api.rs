//! What the viewer's JSON API answers, computed from loaded runs by the report's own code
//! (`report::html::head` for a run's tables, `report::compare` for flips and paired tests):
//! the page shows the numbers the terminal prints. Episodes are filtered and paged here, so
//! a page never holds more than one page of a run.

use std::collections::{BTreeMap, HashMap};

use serde_json::{Value, json};

use super::catalog::Loaded;
use crate::log::projection::EpisodeRow;
use crate::report::compare::{Comparison, GroupStats, PairTest, groups};
use crate::report::html::{Listed, head, stats};

/// The most rows of one page.
pub const MAX_PAGE: usize = 1000;

/// A run's line in the list of runs.
pub fn run_item(l: &Loaded) -> Value {
    let p = &l.projection;
    let all: Vec<&EpisodeRow> = p.episodes.iter().collect();
    let totals = stats(None, &GroupStats::of(String::new(), p.run_id.clone(), String::new(), &all));
    let status = if p.finished && !p.interrupted {
        "finished"
    } else if p.finished {
        "interrupted"
    } else {
        "running"
    };
    json!({
        "key": l.key,
        "run_id": p.run_id,
        "dir": l.dir.display().to_string(),
        "started": l.started,
        "status": status,
        "models": p.header.models,
        "suites": p.header.suites.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        "planned": l.planned,
        "warnings": p.header.warnings.len(),
        "totals": totals,
    })
}

/// A run's page above its episodes: the report's head, what the filters can choose, and
/// where a live view of it continues.
pub fn run_head(l: &Loaded, labels: &[Value]) -> Result<Value, String> {
    let p = &l.projection;
    let mut out = head(p);
    let mut facets: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
    for e in &p.episodes {
        *facets.entry("suite").or_default().entry(&*e.suite).or_default() += 1;
        *facets.entry("model").or_default().entry(&*e.model).or_default() += 1;
        *facets.entry("status").or_default().entry(e.status()).or_default() += 1;
        if let Some(v) = &e.variant {
            *facets.entry("variant").or_default().entry(&**v).or_default() += 1;
        }
        if let Some(c) = e.unscored_cause() {
            *facets.entry("cause").or_default().entry(c).or_default() += 1;
        }
        for t in &e.tags {
            *facets.entry("tag").or_default().entry(&**t).or_default() += 1;
        }
    }
    out["key"] = json!(l.key);
    out["dir"] = json!(l.dir.display().to_string());
    out["facets"] = json!(facets);
    out["finished"] = json!(p.finished);
    out["planned"] = json!(l.planned);
    out["episodes"] = json!(p.episodes.len());
    out["running"] = json!(l.running()?);
    out["log_bytes"] = json!(l.log_bytes());
    out["labels"] = json!(labels.len());
    Ok(out)
}

/// What the episodes table is filtered by.
#[derive(Debug, Default)]
pub struct EpisodeQuery {
    /// `passed`, `failed`, `unscored`, `cancelled`, or `scored` (passed or failed).
    pub status: Option<String>,
    pub cause: Option<String>,
    pub suite: Option<String>,
    pub model: Option<String>,
    pub variant: Option<String>,
    pub tag: Option<String>,
    pub meta: Option<MetaFilter>,
    /// Text in the episode id or the task id.
    pub text: Option<String>,
    /// Only episodes a person labelled.
    pub labelled: bool,
    pub offset: usize,
    pub limit: usize,
}

/// `meta=KEY=VALUE`: episodes whose task's metadata has `KEY` with the value `VALUE`
/// (as text: `3`, `true`, `hard`).
#[derive(Debug, Clone, PartialEq)]
pub struct MetaFilter {
    pub key: String,
    pub value: String,
}

impl MetaFilter {
    fn from_pairs(pairs: &HashMap<String, String>) -> Result<Option<MetaFilter>, String> {
        let Some(given) = pairs.get("meta").map(|m| m.trim()).filter(|m| !m.is_empty()) else { return Ok(None) };
        match given.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                Ok(Some(MetaFilter { key: key.trim().to_owned(), value: value.trim().to_owned() }))
            }
            _ => Err(format!("`meta`: {given:?} is not KEY=VALUE")),
        }
    }

    fn keeps(&self, e: &EpisodeRow) -> bool {
        e.metadata.iter().any(|(k, v)| **k == *self.key && **v == *self.value)
    }
}

/// Whether the episode's task has the tag and the metadata asked for (none asked: yes).
fn labelled_as(tag: Option<&str>, meta: Option<&MetaFilter>, e: &EpisodeRow) -> bool {
    tag.is_none_or(|t| e.tags.iter().any(|x| **x == *t)) && meta.is_none_or(|m| m.keeps(e))
}

impl EpisodeQuery {
    pub fn from_pairs(pairs: &HashMap<String, String>) -> Result<EpisodeQuery, String> {
        let text = |k: &str| pairs.get(k).filter(|v| !v.is_empty()).cloned();
        let number = |k: &str, default: usize| -> Result<usize, String> {
            match pairs.get(k).filter(|v| !v.is_empty()) {
                None => Ok(default),
                Some(v) => v.parse().map_err(|_| format!("`{k}`: {v:?} is not a number")),
            }
        };
        let status = text("status");
        if let Some(s) = &status
            && !["passed", "failed", "unscored", "cancelled", "scored"].contains(&s.as_str())
        {
            return Err(format!("`status`: {s:?} is none of passed, failed, scored, unscored, cancelled"));
        }
        Ok(EpisodeQuery {
            status,
            cause: text("cause"),
            suite: text("suite"),
            model: text("model"),
            variant: text("variant"),
            tag: text("tag"),
            meta: MetaFilter::from_pairs(pairs)?,
            text: text("q").map(|q| q.to_lowercase()),
            labelled: pairs.get("labelled").is_some_and(|v| v == "1" || v == "true"),
            offset: number("offset", 0)?,
            limit: number("limit", 100)?.clamp(1, MAX_PAGE),
        })
    }

    fn keeps(&self, e: &EpisodeRow, labelled: &std::collections::HashSet<&str>) -> bool {
        let status_ok = match self.status.as_deref() {
            None => true,
            Some("scored") => e.passed().is_some(),
            Some(s) => e.status() == s,
        };
        let is = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        status_ok
            && self.cause.as_deref().is_none_or(|c| e.unscored_cause() == Some(c))
            && is(&self.suite, &e.suite)
            && is(&self.model, &e.model)
            && self.variant.as_deref().is_none_or(|v| e.variant.as_deref() == Some(v))
            && labelled_as(self.tag.as_deref(), self.meta.as_ref(), e)
            && self
                .text
                .as_deref()
                .is_none_or(|q| e.task_id.to_lowercase().contains(q) || e.episode_id.to_lowercase().contains(q))
            && (!self.labelled || labelled.contains(&*e.episode_id))
    }
}

/// One page of the run's episodes that pass the filters, in table order, and how many pass.
pub fn episodes(l: &Loaded, q: &EpisodeQuery, labels: &[Value]) -> Value {
    let labelled: std::collections::HashSet<&str> = labels.iter().filter_map(|l| l["episode_id"].as_str()).collect();
    let mut matched = 0usize;
    let mut rows = Vec::new();
    for e in &l.projection.episodes {
        if !q.keeps(e, &labelled) {
            continue;
        }
        if matched >= q.offset && rows.len() < q.limit {
            let mut row = serde_json::to_value(Listed::of(e)).unwrap_or_default();
            row["labelled"] = json!(labelled.contains(&*e.episode_id));
            row["tags"] = json!(e.tags);
            rows.push(row);
        }
        matched += 1;
    }
    json!({"total": l.projection.episodes.len(), "matched": matched, "offset": q.offset, "rows": rows})
}

/// One episode: its line of the table, its events as logged, and the labels people gave it.
pub fn episode(l: &Loaded, id: &str, labels: &[Value]) -> Result<Value, String> {
    let events = super::catalog::episode_events(l, id)?;
    let events: Vec<Value> = events.iter().filter_map(|t| serde_json::from_str(t).ok()).collect();
    let row = l.projection.episodes.iter().find(|e| &*e.episode_id == id);
    let mine: Vec<&Value> = labels.iter().filter(|x| x["episode_id"] == id).collect();
    Ok(json!({
        "key": l.key,
        "run_id": l.projection.run_id,
        "scoring_id": l.projection.scoring_id,
        "warnings": l.projection.header.warnings,
        "episode": row.map(Listed::of),
        "events": events,
        "labels": mine,
    }))
}

/// What the task table of a comparison is filtered by.
#[derive(Debug, Default)]
pub struct CompareQuery {
    /// `flips` (any change against the baseline), `failures` (failed somewhere),
    /// `unscored` (unscored somewhere).
    pub only: Option<String>,
    pub cause: Option<String>,
    pub suite: Option<String>,
    /// Tasks with this tag, or this metadata (`KEY=VALUE`), in any run.
    pub tag: Option<String>,
    pub meta: Option<MetaFilter>,
    /// Tasks with an episode of this variant in any run.
    pub variant: Option<String>,
    /// One task (with `suite`): its episodes in each group.
    pub task: Option<String>,
    pub offset: usize,
    pub limit: usize,
}

impl CompareQuery {
    pub fn from_pairs(pairs: &HashMap<String, String>) -> Result<CompareQuery, String> {
        let text = |k: &str| pairs.get(k).filter(|v| !v.is_empty()).cloned();
        let only = text("only");
        if let Some(o) = &only
            && !["flips", "failures", "unscored"].contains(&o.as_str())
        {
            return Err(format!("`only`: {o:?} is none of flips, failures, unscored"));
        }
        let number = |k: &str, default: usize| pairs.get(k).and_then(|v| v.parse().ok()).unwrap_or(default);
        Ok(CompareQuery {
            only,
            cause: text("cause"),
            suite: text("suite"),
            tag: text("tag"),
            meta: MetaFilter::from_pairs(pairs)?,
            variant: text("variant"),
            task: text("task"),
            offset: number("offset", 0),
            limit: number("limit", 200).clamp(1, MAX_PAGE),
        })
    }
}

/// One group's episodes of a task.
#[derive(Default)]
struct Cell<'a> {
    episodes: Vec<&'a EpisodeRow>,
}

impl Cell<'_> {
    fn json(&self) -> Value {
        let scored = self.episodes.iter().filter(|e| e.passed().is_some()).count();
        let passed = self.episodes.iter().filter(|e| e.passed() == Some(true)).count();
        let causes: Vec<&str> = self.episodes.iter().filter_map(|e| e.unscored_cause()).collect();
        let eps: Vec<Value> = self
            .episodes
            .iter()
            .map(|e| json!({"episode_id": e.episode_id, "epoch": e.epoch, "outcome": e.status(), "cause": e.unscored_cause(), "score": e.score()}))
            .collect();
        json!({"scored": scored, "passed": passed, "unscored": causes.len(), "causes": causes, "episodes": eps})
    }
}

/// The runs side by side, the first group the baseline: the groups' stats and paired tests
/// as `runner compare` computes them, and per task each group's episodes with the task's
/// change against the baseline (`pass→fail`, `fail→pass`, `scored→unscored`).
pub fn compare(runs: &[std::sync::Arc<Loaded>], q: &CompareQuery) -> Value {
    let projections: Vec<crate::log::projection::Projection> = runs.iter().map(|l| l.projection.clone()).collect();
    let comparison = Comparison::of(&projections);
    let refs = groups(&projections);
    let mut tasks: BTreeMap<(&str, &str), Vec<Cell>> = BTreeMap::new();
    for (g, group) in refs.iter().enumerate() {
        for &e in &group.rows {
            let cells = tasks
                .entry((&*e.suite, &*e.task_id))
                .or_insert_with(|| (0..refs.len()).map(|_| Cell::default()).collect());
            cells[g].episodes.push(e);
        }
    }
    // Against the baseline: the flips of each pair (0, j), from the paired test itself.
    let mut changes: HashMap<(usize, &str, &str), &'static str> = HashMap::new();
    for (j, pair) in baseline_pairs(&comparison, refs.len()) {
        for f in &pair.flips {
            let kind = if f.regressed { "pass→fail" } else { "fail→pass" };
            if let Some((&(suite, task), _)) = tasks.get_key_value(&(f.suite.as_str(), f.task_id.as_str())) {
                changes.insert((j, suite, task), kind);
            }
        }
    }
    let tags: std::collections::BTreeSet<&str> =
        refs.iter().flat_map(|g| g.rows.iter()).flat_map(|e| e.tags.iter().map(|t| &**t)).collect();
    let variants: std::collections::BTreeSet<&str> =
        refs.iter().flat_map(|g| g.rows.iter()).filter_map(|e| e.variant.as_deref()).collect();
    let mut matched = 0usize;
    let mut rows = Vec::new();
    for ((suite, task), cells) in &tasks {
        let scored_in_base = cells[0].episodes.iter().any(|e| e.passed().is_some());
        let change: Vec<Option<&str>> = (0..cells.len())
            .map(|j| {
                if j == 0 {
                    return None;
                }
                changes.get(&(j, *suite, *task)).copied().or_else(|| {
                    let lost = cells[j].episodes.iter().all(|e| e.passed().is_none()) && !cells[j].episodes.is_empty();
                    (scored_in_base && lost).then_some("scored→unscored")
                })
            })
            .collect();
        if !compare_keeps(q, (*suite, *task), cells, &change) {
            continue;
        }
        if matched >= q.offset && rows.len() < q.limit {
            rows.push(json!({
                "suite": suite, "task_id": task,
                "cells": cells.iter().map(Cell::json).collect::<Vec<_>>(),
                "change": change,
            }));
        }
        matched += 1;
    }
    // Each group's run: `groups` makes a run's groups together, in the runs' order.
    let group_runs: Vec<usize> = projections
        .iter()
        .enumerate()
        .flat_map(|(i, p)| std::iter::repeat_n(i, groups(std::slice::from_ref(p)).len()))
        .collect();
    json!({
        "runs": runs.iter().map(|l| json!({"key": l.key, "run_id": l.projection.run_id, "warnings": l.projection.header.warnings})).collect::<Vec<_>>(),
        "group_runs": group_runs,
        "groups": comparison.groups.iter().map(|g| stats(None, g)).collect::<Vec<_>>(),
        "pairs": comparison.pairs.iter().map(pair_json).collect::<Vec<_>>(),
        "tasks": tasks.len(),
        "tags": tags,
        "variants": variants,
        "matched": matched,
        "offset": q.offset,
        "rows": rows,
    })
}

/// The pairs of the baseline (group 0) with each other group `j`, in `Comparison::of`'s
/// order: (0,1), (0,2), … come first.
fn baseline_pairs(comparison: &Comparison, groups: usize) -> Vec<(usize, &PairTest)> {
    comparison.pairs.iter().take(groups.saturating_sub(1)).enumerate().map(|(i, p)| (i + 1, p)).collect()
}

fn compare_keeps(q: &CompareQuery, (suite, task): (&str, &str), cells: &[Cell], change: &[Option<&str>]) -> bool {
    let all = || cells.iter().flat_map(|c| c.episodes.iter());
    q.suite.as_deref().is_none_or(|s| s == suite)
        && q.task.as_deref().is_none_or(|t| t == task)
        && match q.only.as_deref() {
            Some("flips") => change.iter().any(Option::is_some),
            Some("failures") => all().any(|e| e.passed() == Some(false)),
            Some("unscored") => all().any(|e| e.unscored_cause().is_some()),
            _ => true,
        }
        && q.cause.as_deref().is_none_or(|c| all().any(|e| e.unscored_cause() == Some(c)))
        && (q.tag.is_none() && q.meta.is_none() || all().any(|e| labelled_as(q.tag.as_deref(), q.meta.as_ref(), e)))
        && q.variant.as_deref().is_none_or(|v| all().any(|e| e.variant.as_deref() == Some(v)))
}

fn pair_json(p: &PairTest) -> Value {
    let boot = p.bootstrap();
    json!({
        "a": p.a, "b": p.b, "shared": p.shared, "shared_episodes": p.shared_episodes,
        "changed_tasks": p.changed_tasks, "only_a": p.only_a, "only_b": p.only_b,
        "pass_rate_a": p.pass_rate_a, "pass_rate_b": p.pass_rate_b, "effect": p.effect,
        "mcnemar_p": p.p_value,
        "score_diff": p.score.map(|s| s.mean_diff),
        "score_diff_low": boot.map(|s| s.low), "score_diff_high": boot.map(|s| s.high),
        "bootstrap_p": boot.map(|s| s.p_value),
        "flips": p.flips.iter().map(|f| json!({
            "suite": f.suite, "task_id": f.task_id, "epochs": f.epochs,
            "passed_a": f.passed_a, "passed_b": f.passed_b, "regressed": f.regressed,
        })).collect::<Vec<_>>(),
    })
}

/// Two episodes side by side, their turns aligned.
pub fn align(a: &Loaded, a_id: &str, b: &Loaded, b_id: &str) -> Result<Value, String> {
    let read = |l: &Loaded, id: &str| -> Result<Vec<Value>, String> {
        Ok(super::catalog::episode_events(l, id)?.iter().filter_map(|t| serde_json::from_str(t).ok()).collect())
    };
    let (ea, eb) = (read(a, a_id)?, read(b, b_id)?);
    let aligned = super::align::align(&super::align::turns(&ea), &super::align::turns(&eb));
    let row = |l: &Loaded, id: &str| {
        l.projection.episodes.iter().find(|e| &*e.episode_id == id).map(Listed::of).map(|x| json!(x))
    };
    Ok(json!({
        "a": {"key": a.key, "episode_id": a_id, "episode": row(a, a_id)},
        "b": {"key": b.key, "episode_id": b_id, "episode": row(b, b_id)},
        "rows": aligned.rows,
        "first_divergence": aligned.first_divergence,
    }))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::log::Outcome;

    fn row(task: &str, tags: &[&str], metadata: &[(&str, &str)]) -> EpisodeRow {
        EpisodeRow {
            tags: tags.iter().map(|&t| Arc::from(t)).collect(),
            metadata: metadata.iter().map(|&(k, v)| (Arc::from(k), Arc::from(v))).collect(),
            ..EpisodeRow::example(task, "mock", Outcome::Scored { score: 1.0, passed: true })
        }
    }

    fn query(pairs: &[(&str, &str)]) -> Result<EpisodeQuery, String> {
        EpisodeQuery::from_pairs(&pairs.iter().map(|&(k, v)| (k.to_owned(), v.to_owned())).collect())
    }

    fn kept(q: &EpisodeQuery, rows: &[EpisodeRow]) -> Vec<String> {
        rows.iter().filter(|e| q.keeps(e, &Default::default())).map(|e| e.task_id.to_string()).collect()
    }

    #[test]
    fn episodes_are_filtered_by_tag_and_by_metadata() {
        let rows = [
            row("t1", &["math", "easy"], &[("level", "1"), ("lang", "en")]),
            row("t2", &["math"], &[("level", "2")]),
            row("t3", &[], &[("level", "1"), ("lang", "fr")]),
            row("t4", &["mathematics"], &[]),
        ];
        assert_eq!(kept(&query(&[("tag", "math")]).unwrap(), &rows), ["t1", "t2"]);
        assert_eq!(kept(&query(&[("tag", "easy")]).unwrap(), &rows), ["t1"]);
        assert_eq!(kept(&query(&[("meta", "level=1")]).unwrap(), &rows), ["t1", "t3"]);
        assert_eq!(kept(&query(&[("meta", " lang = fr ")]).unwrap(), &rows), ["t3"]);
        assert_eq!(kept(&query(&[("tag", "math"), ("meta", "level=1")]).unwrap(), &rows), ["t1"]);
        assert!(kept(&query(&[("meta", "level=3")]).unwrap(), &rows).is_empty());
        assert_eq!(kept(&query(&[("tag", ""), ("meta", "")]).unwrap(), &rows).len(), 4);
        let err = query(&[("meta", "level")]).unwrap_err();
        assert!(err.contains("`meta`") && err.contains("KEY=VALUE"), "{err}");
    }

    #[test]
    fn a_compared_task_is_kept_when_an_episode_of_any_run_has_the_tag_or_metadata() {
        let (a, b) = (row("t1", &[], &[]), row("t1", &["hard"], &[("n", "3")]));
        let cells = [Cell { episodes: vec![&a] }, Cell { episodes: vec![&b] }];
        let q = |pairs: &[(&str, &str)]| {
            CompareQuery::from_pairs(&pairs.iter().map(|&(k, v)| (k.to_owned(), v.to_owned())).collect()).unwrap()
        };
        let keeps = |q: &CompareQuery, cells: &[Cell]| compare_keeps(q, ("s", "t1"), cells, &[None, None]);
        assert!(keeps(&q(&[("tag", "hard")]), &cells));
        assert!(keeps(&q(&[("meta", "n=3")]), &cells));
        assert!(!keeps(&q(&[("tag", "hard")]), &cells[..1]));
        assert!(!keeps(&q(&[("meta", "n=4")]), &cells));
        assert!(!keeps(&q(&[("tag", "easy")]), &cells));
    }

    #[test]
    fn a_compared_task_is_kept_when_an_episode_of_any_run_has_the_variant() {
        let a = row("t1", &[], &[]);
        let b = EpisodeRow { variant: Some(Arc::from("terse")), ..row("t1", &[], &[]) };
        let cells = [Cell { episodes: vec![&a] }, Cell { episodes: vec![&b] }];
        let q = |v: &str| CompareQuery::from_pairs(&[("variant".to_owned(), v.to_owned())].into()).unwrap();
        let keeps = |q: &CompareQuery, cells: &[Cell]| compare_keeps(q, ("s", "t1"), cells, &[None, None]);
        assert!(keeps(&q("terse"), &cells));
        assert!(!keeps(&q("terse"), &cells[..1]));
        assert!(!keeps(&q("verbose"), &cells));
        assert!(keeps(&q(""), &cells[..1]), "an empty choice keeps every task");
    }
}
