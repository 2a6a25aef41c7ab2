//! Whether two runs were judged alike: every LLM-graded score carries its judge's digest
//! (`grader.judge`: model, sampling, template, criteria, samples, threshold, hashed) and the
//! settings behind it (`grader.judge_settings`). Two runs' judges are comparable when each
//! scorer both runs graded with a model was graded under the same digests; when not, the
//! settings that differ are named. Only each episode's latest scoring counts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::Value;

use crate::log::reader::{ReadError, for_each_event_of};

/// The judges of one run, by scorer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Judges {
    pub by_scorer: BTreeMap<String, Judged>,
}

/// What one scorer's verdicts say of their judges.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Judged {
    pub digests: BTreeSet<String>,
    /// Each setting's values over the verdicts, as JSON text.
    pub settings: BTreeMap<String, BTreeSet<String>>,
    /// Verdicts of a grader model that carry no judge digest (a log older than it).
    pub undigested: u64,
}

/// The judges of the run whose log is `events`.
pub fn read(events: &Path) -> Result<Judges, ReadError> {
    // Per episode: its latest scoring id and that scoring's graded verdicts.
    let mut latest: BTreeMap<String, (String, Vec<(String, Value)>)> = BTreeMap::new();
    for_each_event_of(events, Some(&["score"]), |e| {
        let Some(episode) = e.episode_id.clone() else { return };
        let f = &e.fields;
        let scoring = f.get("scoring_id").and_then(Value::as_str).unwrap_or("initial").to_owned();
        let slot = latest.entry(episode).or_insert_with(|| (scoring.clone(), Vec::new()));
        if slot.0 != scoring {
            *slot = (scoring, Vec::new());
        }
        let grader = f.get("grader").cloned().unwrap_or(Value::Null);
        if grader.get("model").is_some() {
            let scorer = f.get("scorer").and_then(Value::as_str).unwrap_or_default().to_owned();
            slot.1.push((scorer, grader));
        }
    })?;
    let mut judges = Judges::default();
    for (scorer, grader) in latest.into_values().flat_map(|(_, graded)| graded) {
        let judged = judges.by_scorer.entry(scorer).or_default();
        let Some(digest) = grader.get("judge").and_then(Value::as_str) else {
            judged.undigested += 1;
            continue;
        };
        judged.digests.insert(digest.to_owned());
        if let Some(settings) = grader.get("judge_settings").and_then(Value::as_object) {
            for (key, value) in settings {
                judged.settings.entry(key.clone()).or_default().insert(value.to_string());
            }
        }
    }
    Ok(judges)
}

/// Why the judges of `a` and `b` are not comparable, one line per scorer both graded with
/// a model; empty when they are.
pub fn differences(a: &Judges, b: &Judges) -> Vec<String> {
    let mut lines = Vec::new();
    for (scorer, ja) in &a.by_scorer {
        let Some(jb) = b.by_scorer.get(scorer) else { continue };
        if ja.undigested > 0 || jb.undigested > 0 {
            lines.push(format!("`{scorer}`: some verdicts carry no judge digest (a run older than it)"));
            continue;
        }
        if ja.digests == jb.digests {
            continue;
        }
        let keys: BTreeSet<&String> = ja.settings.keys().chain(jb.settings.keys()).collect();
        let named: Vec<String> = keys
            .into_iter()
            .filter(|k| ja.settings.get(*k) != jb.settings.get(*k))
            .map(|k| {
                let values = |j: &Judged| {
                    let set = j.settings.get(k).cloned().unwrap_or_default();
                    if set.len() == 1 {
                        set.into_iter().next().unwrap_or_default()
                    } else {
                        format!("{} values", set.len())
                    }
                };
                format!("{k} {} vs {}", values(ja), values(jb))
            })
            .collect();
        let why = if named.is_empty() { "the judge digests differ".to_owned() } else { named.join(", ") };
        lines.push(format!("`{scorer}`: {why}"));
    }
    lines
}

/// The scorers both runs graded with a model, each with its judge digest (its first 12
/// digits; `several` when its verdicts had several, one per task's criteria).
pub fn shared(a: &Judges, b: &Judges) -> Vec<String> {
    a.by_scorer
        .iter()
        .filter(|(scorer, _)| b.by_scorer.contains_key(*scorer))
        .map(|(scorer, j)| match j.digests.iter().collect::<Vec<_>>().as_slice() {
            [one] => format!("`{scorer}` judge {}", &one[..one.len().min(12)]),
            _ => format!("`{scorer}` judges ({} digests)", j.digests.len()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judged(digest: &str, model: &str) -> Judged {
        Judged {
            digests: [digest.to_owned()].into(),
            settings: [
                ("model".to_owned(), [format!("\"{model}\"")].into()),
                ("samples".to_owned(), ["1".to_owned()].into()),
            ]
            .into(),
            undigested: 0,
        }
    }

    #[test]
    fn judges_differ_by_the_settings_named_and_agree_on_one_digest() {
        let a = Judges { by_scorer: [("llm_rubric".to_owned(), judged("d1", "openai/a"))].into() };
        let b = Judges { by_scorer: [("llm_rubric".to_owned(), judged("d2", "openai/b"))].into() };
        assert_eq!(differences(&a, &a), Vec::<String>::new());
        assert_eq!(differences(&a, &b), ["`llm_rubric`: model \"openai/a\" vs \"openai/b\""]);
        let old =
            Judges { by_scorer: [("llm_rubric".to_owned(), Judged { undigested: 2, ..Judged::default() })].into() };
        assert!(differences(&a, &old)[0].contains("no judge digest"));
    }
}
