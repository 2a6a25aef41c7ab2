//! `runner search`: a query over the search indexes of several runs (`log::search`), their
//! hits merged best first, printed for people or as JSON.

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::log::search::{Filters, Freshness, Hit, SearchError, SearchIndex};

/// What a search found, and what was done to the indexes to find it.
#[derive(Debug, Default)]
pub struct Found {
    pub hits: Vec<Hit>,
    /// One line per index that was built or built again (or held in memory).
    pub notes: Vec<String>,
}

/// The best `limit` hits of `query` over the runs (their folders), best first. BM25 scores
/// of two runs are close to comparable, not exactly: each index weighs terms by its own run.
pub fn search(runs: &[PathBuf], query: &str, filters: &Filters, limit: usize) -> Result<Found, SearchError> {
    let mut found = Found::default();
    for dir in runs {
        let started = std::time::Instant::now();
        let index = SearchIndex::open(dir)?;
        if index.freshness != Freshness::Current || index.in_memory {
            let (episodes, texts) = index.counts()?;
            let how = match index.freshness {
                Freshness::Built | Freshness::Current => "built",
                Freshness::Rebuilt => "rebuilt (the log changed since it was built)",
            };
            let place = if index.in_memory {
                format!("in memory ({} cannot be written)", dir.display())
            } else {
                index.path().display().to_string()
            };
            found.notes.push(format!(
                "index {how}: {place}, {episodes} episodes, {texts} texts, in {:.1} s",
                started.elapsed().as_secs_f64()
            ));
        }
        found.hits.extend(index.search(query, filters, limit)?);
    }
    found.hits.sort_by(|a, b| b.score.total_cmp(&a.score));
    found.hits.truncate(limit);
    Ok(found)
}

/// Two lines per hit: where it is, then its snippet.
pub fn render(hits: &[Hit], several_runs: bool) -> String {
    let mut text = String::new();
    for hit in hits {
        let run = if several_runs { format!("{}  ", hit.run_id) } else { String::new() };
        let step = hit.step.map_or("after the run".to_owned(), |s| format!("step {s}"));
        let kind = match &hit.name {
            Some(name) => format!("{} {name}", hit.kind),
            None => hit.kind.clone(),
        };
        text += &format!(
            "{run}{}  {}/{}  {}  epoch {}  {}  {step}  {}  {kind}\n    {}\n",
            hit.episode_id,
            hit.suite,
            hit.task_id,
            hit.model,
            hit.epoch,
            hit.outcome,
            hit.actor,
            one_line(&hit.snippet)
        );
    }
    text += &format!("{} hit(s)\n", hits.len());
    text
}

/// The query (cut when long) and its hits, as `--json` prints them.
pub fn to_json(query: &str, hits: &[Hit]) -> Value {
    json!({"query": crate::log::search::shown_query(query), "hits": hits})
}

/// A snippet on one line: newlines and runs of spaces as one space.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
