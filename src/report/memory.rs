//! The memory table: for a run of the memory agent, accuracy per question type (and
//! task-averaged, overall, and on abstention questions), each with its Wilson interval and
//! scored and unscored counts; retrieval recall, by evidence session and by evidence turn;
//! tokens spent storing, answering and
//! judging; entries written per session. All of it from the log: the latest
//! `memory_answered` of each episode, its latest outcome and the scores of its latest scoring.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::stats::wilson;
use crate::log::reader::{ReadError, contains_bytes, for_each_event_of};

/// What the table knows of one episode.
#[derive(Debug, Default, Clone)]
struct Question {
    /// The suite and the model (and variant) that answered: each is a table of its own.
    group: String,
    /// The task and epoch: what pairs a question with itself in another run.
    task: (String, u64),
    question_type: String,
    abstention: bool,
    /// `Some(passed)` when scored, `None` when unscored or not finished.
    passed: Option<bool>,
    recall: Option<f64>,
    turn_recall: Option<f64>,
    sessions: u64,
    entries: u64,
    errors: u64,
    /// The replay was another episode's, restored (`ingest_reused`): its sessions, entries
    /// and errors are that episode's, counted there.
    reused: bool,
    ingest_tokens: u64,
    answer_tokens: u64,
    /// The latest scoring's id and its graders' tokens.
    judge: (String, u64),
}

/// One row of the table: a question type, the task average, all, abstention.
#[derive(Debug, Clone, PartialEq)]
pub struct Accuracy {
    pub label: String,
    pub scored: u64,
    pub passed: u64,
    pub unscored: u64,
}

impl Accuracy {
    fn of<'a>(label: &str, questions: impl Iterator<Item = &'a Question>) -> Accuracy {
        let mut row = Accuracy { label: label.to_owned(), scored: 0, passed: 0, unscored: 0 };
        for q in questions {
            match q.passed {
                Some(passed) => {
                    row.scored += 1;
                    row.passed += u64::from(passed);
                }
                None => row.unscored += 1,
            }
        }
        row
    }

    pub fn rate(&self) -> Option<f64> {
        (self.scored > 0).then(|| self.passed as f64 / self.scored as f64)
    }
}

/// The memory figures of a run.
#[derive(Debug, Default)]
pub struct MemoryReport {
    pub by_type: Vec<Accuracy>,
    /// The mean of the types' accuracies.
    pub task_averaged: Option<f64>,
    pub overall: Option<Accuracy>,
    pub abstention: Option<Accuracy>,
    /// Mean recall over the questions whose evidence sessions are known, and how many.
    pub recall: Option<(f64, u64)>,
    /// Mean recall over the questions whose evidence turns are known, and how many.
    pub turn_recall: Option<(f64, u64)>,
    pub ingest_tokens: u64,
    pub answer_tokens: u64,
    pub judge_tokens: u64,
    pub sessions: u64,
    pub entries: u64,
    pub errors: u64,
    /// Entries per session of the memories the questions were answered from, restored
    /// replays included (a restored replay has its writer's ratio), and the questions that
    /// restored another episode's replay.
    pub per_session: Option<f64>,
    pub restored: u64,
    /// Each question's task and epoch, type, whether it is an abstention question, and
    /// whether it passed (`None`: unscored): what `compare` pairs.
    pub questions: Vec<PairedQuestion>,
}

/// One question as `compare` pairs it.
#[derive(Debug, Clone, PartialEq)]
pub struct PairedQuestion {
    pub task: (String, u64),
    pub question_type: String,
    pub abstention: bool,
    pub passed: Option<bool>,
}

/// The memory figures of the log `events`, one report per suite and model (and variant),
/// named `suite · model [variant]`; empty when no memory agent answered in it.
pub fn read(events: &Path) -> Result<Vec<(String, MemoryReport)>, ReadError> {
    let mut questions: BTreeMap<String, Question> = BTreeMap::new();
    // Outcomes and grader tokens arrive for every episode; only memory episodes are kept.
    let mut outcomes: BTreeMap<String, Option<bool>> = BTreeMap::new();
    let mut judged: BTreeMap<String, (String, u64)> = BTreeMap::new();
    let mut tasks: BTreeMap<String, (String, u64)> = BTreeMap::new();
    let mut groups: BTreeMap<String, String> = BTreeMap::new();
    // Most runs have no memory agent: their log is not decoded for a table they lack.
    if !contains_bytes(events, b"\"memory_answered\"")? {
        return Ok(Vec::new());
    }
    let kinds = ["memory_answered", "ingest_reused", "episode_started", "episode_finished", "episode_scored", "score"];
    for_each_event_of(events, Some(&kinds), |e| {
        let Some(episode) = e.episode_id.clone() else { return };
        let f = &e.fields;
        match e.kind.as_str() {
            "memory_answered" => {
                let tokens = |key: &str| {
                    ["input_tokens", "output_tokens"].iter().filter_map(|t| f[key][t].as_u64()).sum::<u64>()
                };
                let number = |key: &str| f.get(key).and_then(Value::as_u64).unwrap_or(0);
                let q = questions.entry(episode).or_default();
                q.question_type = f.get("question_type").and_then(Value::as_str).unwrap_or("(none)").to_owned();
                q.abstention = f.get("abstention").and_then(Value::as_bool).unwrap_or(false);
                q.recall = f.get("recall").and_then(Value::as_f64);
                q.turn_recall = f.get("turn_recall").and_then(Value::as_f64);
                q.sessions = number("sessions");
                q.entries = number("entries");
                q.errors = number("errors");
                q.ingest_tokens = tokens("ingest_usage");
                q.answer_tokens = tokens("answer_usage");
            }
            "ingest_reused" => questions.entry(episode).or_default().reused = true,
            "episode_started" => {
                let task = f.get("task_id").and_then(Value::as_str).unwrap_or_default().to_owned();
                let text = |key: &str| f.get(key).and_then(Value::as_str).unwrap_or_default();
                let model = super::summary::label(text("model"), f.get("variant").and_then(Value::as_str));
                groups.insert(episode.clone(), format!("{} · {model}", text("suite")));
                // An attempt that came before this one (killed) restored nothing for it.
                if let Some(q) = questions.get_mut(&episode) {
                    q.reused = false;
                }
                tasks.insert(episode, (task, f.get("epoch").and_then(Value::as_u64).unwrap_or(1)));
            }
            "episode_finished" | "episode_scored" => {
                let outcome = &f["outcome"];
                let passed = if outcome.get("score").is_some() { outcome["passed"].as_bool() } else { None };
                outcomes.insert(episode, passed);
            }
            "score" => {
                let scoring = f.get("scoring_id").and_then(Value::as_str).unwrap_or("initial").to_owned();
                let usage = &f["grader"]["usage"];
                let tokens: u64 = ["input_tokens", "output_tokens"].iter().filter_map(|t| usage[t].as_u64()).sum();
                let judge = judged.entry(episode).or_insert_with(|| (scoring.clone(), 0));
                if judge.0 != scoring {
                    *judge = (scoring, 0);
                }
                judge.1 += tokens;
            }
            _ => {}
        }
    })?;
    let mut by_group: BTreeMap<String, Vec<Question>> = BTreeMap::new();
    for (episode, mut q) in questions {
        q.passed = outcomes.get(&episode).copied().flatten();
        q.judge = judged.remove(&episode).unwrap_or_default();
        q.group = groups.remove(&episode).unwrap_or_default();
        q.task = tasks.remove(&episode).unwrap_or_else(|| (episode.clone(), 1));
        by_group.entry(q.group.clone()).or_default().push(q);
    }
    Ok(by_group.into_iter().map(|(group, qs)| (group, MemoryReport::of(qs.iter()))).collect())
}

impl MemoryReport {
    fn of<'a>(questions: impl Iterator<Item = &'a Question> + Clone) -> MemoryReport {
        let mut types: BTreeMap<&str, Vec<&Question>> = BTreeMap::new();
        for q in questions.clone() {
            types.entry(&q.question_type).or_default().push(q);
        }
        let by_type: Vec<Accuracy> = types.iter().map(|(t, qs)| Accuracy::of(t, qs.iter().copied())).collect();
        let rates: Vec<f64> = by_type.iter().filter_map(Accuracy::rate).collect();
        let task_averaged = (!rates.is_empty()).then(|| rates.iter().sum::<f64>() / rates.len() as f64);
        let abstaining: Vec<&Question> = questions.clone().filter(|q| q.abstention).collect();
        let mean = |recalls: Vec<f64>| {
            (!recalls.is_empty()).then(|| (recalls.iter().sum::<f64>() / recalls.len() as f64, recalls.len() as u64))
        };
        let sum = |f: fn(&Question) -> u64| questions.clone().map(f).sum::<u64>();
        // A replay restored from another episode wrote nothing of its own.
        let written = |f: fn(&Question) -> u64| questions.clone().filter(|q| !q.reused).map(f).sum::<u64>();
        MemoryReport {
            by_type,
            task_averaged,
            overall: Some(Accuracy::of("all", questions.clone())),
            abstention: (!abstaining.is_empty()).then(|| Accuracy::of("abstention", abstaining.into_iter())),
            recall: mean(questions.clone().filter_map(|q| q.recall).collect()),
            turn_recall: mean(questions.clone().filter_map(|q| q.turn_recall).collect()),
            ingest_tokens: sum(|q| q.ingest_tokens),
            answer_tokens: sum(|q| q.answer_tokens),
            judge_tokens: sum(|q| q.judge.1),
            sessions: written(|q| q.sessions),
            entries: written(|q| q.entries),
            errors: written(|q| q.errors),
            per_session: {
                let sessions = sum(|q| q.sessions);
                (sessions > 0).then(|| sum(|q| q.entries) as f64 / sessions as f64)
            },
            restored: questions.clone().filter(|q| q.reused).count() as u64,
            questions: questions
                .map(|q| PairedQuestion {
                    task: q.task.clone(),
                    question_type: q.question_type.clone(),
                    abstention: q.abstention,
                    passed: q.passed,
                })
                .collect(),
        }
    }

    /// The table as the terminal shows it, under the summary.
    pub fn render(&self) -> String {
        let mut out = String::from("\nmemory: accuracy by question type (95% Wilson interval)\n");
        let _ = writeln!(
            out,
            "{:<28} {:>6} {:>6} {:>9} {:>15} {:>8}",
            "question type", "scored", "passed", "accuracy", "interval", "unscored"
        );
        let row = |out: &mut String, a: &Accuracy| {
            let rate = a.rate().map_or("-".to_owned(), |r| format!("{:.1}%", r * 100.0));
            let interval = wilson(a.passed, a.scored)
                .map_or("-".to_owned(), |(lo, hi)| format!("[{:.1}, {:.1}]", lo * 100.0, hi * 100.0));
            let _ = writeln!(
                out,
                "{:<28} {:>6} {:>6} {:>9} {:>15} {:>8}",
                a.label, a.scored, a.passed, rate, interval, a.unscored
            );
        };
        for a in &self.by_type {
            row(&mut out, a);
        }
        if let Some(avg) = self.task_averaged {
            let _ = writeln!(out, "{:<28} {:>6} {:>6} {:>8.1}%", "task-averaged", "", "", avg * 100.0);
        }
        for a in self.overall.iter().chain(&self.abstention) {
            row(&mut out, a);
        }
        match self.recall {
            Some((mean, n)) => {
                let _ = writeln!(
                    out,
                    "retrieval recall: {:.1}% of evidence sessions found (mean over {n} questions)",
                    mean * 100.0
                );
            }
            None => out.push_str("retrieval recall: - (no question with known evidence read the memory)\n"),
        }
        match self.turn_recall {
            Some((mean, n)) => {
                let _ = writeln!(
                    out,
                    "retrieval recall by turn: {:.1}% of evidence turns found (mean over {n} questions)",
                    mean * 100.0
                );
            }
            None => {
                out.push_str("retrieval recall by turn: - (no question with known evidence turns read the memory)\n")
            }
        }
        let _ = writeln!(
            out,
            "tokens: ingest {} · answer {} · judge {}",
            self.ingest_tokens, self.answer_tokens, self.judge_tokens
        );
        let per_session = self.per_session.map_or("-".to_owned(), |r| format!("{r:.1}"));
        let restored = match self.restored {
            0 => String::new(),
            n => format!(", {n} questions restored a replay written elsewhere"),
        };
        let _ = writeln!(
            out,
            "entries: {} written in {} sessions ({per_session} per session{restored}); invocations without their call: {}",
            self.entries, self.sessions, self.errors
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(question_type: &str, abstention: bool, passed: Option<bool>, recall: Option<f64>) -> Question {
        Question {
            question_type: question_type.into(),
            abstention,
            passed,
            recall,
            turn_recall: recall.map(|r| r / 2.0),
            sessions: 2,
            entries: 4,
            ..Question::default()
        }
    }

    #[test]
    fn accuracy_is_per_type_task_averaged_and_overall_with_unscored_apart() {
        let questions = [
            q("temporal-reasoning", false, Some(true), Some(1.0)),
            q("temporal-reasoning", false, Some(false), Some(0.5)),
            q("knowledge-update", false, Some(true), None),
            q("knowledge-update", true, None, None),
        ];
        let report = MemoryReport::of(questions.iter());
        let rows: Vec<(&str, u64, u64, u64)> =
            report.by_type.iter().map(|a| (a.label.as_str(), a.scored, a.passed, a.unscored)).collect();
        assert_eq!(rows, [("knowledge-update", 1, 1, 1), ("temporal-reasoning", 2, 1, 0)]);
        assert_eq!(report.task_averaged, Some(0.75));
        let overall = report.overall.as_ref().unwrap();
        assert_eq!((overall.scored, overall.passed, overall.unscored), (3, 2, 1));
        let abstention = report.abstention.as_ref().unwrap();
        assert_eq!((abstention.scored, abstention.unscored), (0, 1));
        assert_eq!(report.recall, Some((0.75, 2)));
        // Half of each: (0.5 + 0.25) / 2.
        assert_eq!(report.turn_recall, Some((0.375, 2)));
        assert!(
            report.render().contains("retrieval recall by turn: 37.5% of evidence turns found (mean over 2 questions)")
        );
        assert_eq!((report.entries, report.sessions), (16, 8));
        assert!(report.render().contains("task-averaged"), "{}", report.render());
    }

    /// Regression: an episode that restored another's replay counted that replay's sessions
    /// and entries again, so the totals grew with the epochs sharing one ingestion.
    #[test]
    fn a_restored_replay_counts_its_sessions_and_entries_once() {
        let own = Question { sessions: 3, entries: 7, errors: 1, ..q("single-session-user", false, Some(true), None) };
        let restored = Question { reused: true, ..own.clone() };
        let alone = restored.clone();
        let report = MemoryReport::of([own, restored.clone(), restored].iter());
        assert_eq!((report.sessions, report.entries, report.errors), (3, 7, 1));
        assert!(
            report
                .render()
                .contains("entries: 7 written in 3 sessions (2.3 per session, 2 questions restored a replay"),
            "{}",
            report.render()
        );
        // A table whose questions all restored their replays still says the memories' ratio.
        let only_restored = MemoryReport::of([alone].iter());
        assert_eq!((only_restored.entries, only_restored.per_session), (0, Some(7.0 / 3.0)));
        // Each question is still scored.
        assert_eq!(report.overall.map(|a| a.scored), Some(3));
    }
}
