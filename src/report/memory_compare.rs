//! Two memory configurations side by side, as `runner compare` shows them under its groups
//! when both runs hold memory-agent episodes: per question type (then all questions and the
//! abstention questions), each run's accuracy, the difference, and the paired counts —
//! questions paired by task and epoch, both scored; those only the first passed, those only
//! the second passed — with McNemar's exact p over the discordant pairs. Then retrieval
//! recall, tokens and entries per session, run by run.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::memory::{MemoryReport, PairedQuestion};
use super::stats::mcnemar_exact;

/// One row: a question type (or `all`, `abstention`) in both runs.
#[derive(Debug, Clone, PartialEq)]
pub struct SideRow {
    pub label: String,
    /// `(passed, scored)` in each run.
    pub a: (u64, u64),
    pub b: (u64, u64),
    /// Questions both runs scored; of them, passed only in A, only in B.
    pub pairs: u64,
    pub only_a: u64,
    pub only_b: u64,
}

impl SideRow {
    fn of(label: &str, a: &[&PairedQuestion], b: &[&PairedQuestion]) -> SideRow {
        let counts = |qs: &[&PairedQuestion]| {
            let scored: Vec<bool> = qs.iter().filter_map(|q| q.passed).collect();
            (scored.iter().filter(|p| **p).count() as u64, scored.len() as u64)
        };
        let in_b: BTreeMap<&(String, u64), bool> = b.iter().filter_map(|q| Some((&q.task, q.passed?))).collect();
        let (mut pairs, mut only_a, mut only_b) = (0, 0, 0);
        for q in a {
            let (Some(passed_a), Some(&passed_b)) = (q.passed, in_b.get(&q.task)) else { continue };
            pairs += 1;
            only_a += u64::from(passed_a && !passed_b);
            only_b += u64::from(passed_b && !passed_a);
        }
        SideRow { label: label.to_owned(), a: counts(a), b: counts(b), pairs, only_a, only_b }
    }

    /// B's accuracy minus A's, in points, when both scored any.
    pub fn delta(&self) -> Option<f64> {
        let rate = |(passed, scored): (u64, u64)| (scored > 0).then(|| passed as f64 / scored as f64);
        Some((rate(self.b)? - rate(self.a)?) * 100.0)
    }

    /// McNemar's exact two-sided p over the discordant pairs.
    pub fn p_value(&self) -> f64 {
        mcnemar_exact(self.only_a, self.only_b)
    }
}

/// The questions of `report` that `keep` keeps.
fn select<'r>(report: &'r MemoryReport, keep: &dyn Fn(&PairedQuestion) -> bool) -> Vec<&'r PairedQuestion> {
    report.questions.iter().filter(|q| keep(q)).collect()
}

/// The rows of `a` against `b`: each question type either run has, then `all`, then
/// `abstention` when either has abstention questions.
pub fn rows(a: &MemoryReport, b: &MemoryReport) -> Vec<SideRow> {
    let types: BTreeSet<&str> = a.questions.iter().chain(&b.questions).map(|q| q.question_type.as_str()).collect();
    let mut rows = Vec::with_capacity(types.len() + 2);
    for t in types {
        let of_type = |q: &PairedQuestion| q.question_type == t;
        rows.push(SideRow::of(t, &select(a, &of_type), &select(b, &of_type)));
    }
    rows.push(SideRow::of("all", &select(a, &|_| true), &select(b, &|_| true)));
    if a.questions.iter().chain(&b.questions).any(|q| q.abstention) {
        let abstaining = |q: &PairedQuestion| q.abstention;
        rows.push(SideRow::of("abstention", &select(a, &abstaining), &select(b, &abstaining)));
    }
    rows
}

/// The table as the terminal shows it; `a` and `b` name the runs.
pub fn render((a_name, a): (&str, &MemoryReport), (b_name, b): (&str, &MemoryReport)) -> String {
    let mut out = format!(
        "\nmemory, side by side: A = {a_name}, B = {b_name} (paired by question: task and epoch, both scored)\n"
    );
    let _ = writeln!(
        out,
        "{:<28} {:>15} {:>15} {:>8} {:>6} {:>7} {:>7} {:>8}",
        "question type", "A", "B", "B-A", "pairs", "A only", "B only", "McNemar"
    );
    let cell = |(passed, scored): (u64, u64)| match scored {
        0 => "-".to_owned(),
        _ => format!("{passed}/{scored} {:.1}%", passed as f64 / scored as f64 * 100.0),
    };
    for row in rows(a, b) {
        let delta = row.delta().map_or("-".to_owned(), |d| format!("{d:+.1}"));
        let p = if row.pairs > 0 { format!("p={:.3}", row.p_value()) } else { "-".to_owned() };
        let _ = writeln!(
            out,
            "{:<28} {:>15} {:>15} {:>8} {:>6} {:>7} {:>7} {:>8}",
            row.label,
            cell(row.a),
            cell(row.b),
            delta,
            row.pairs,
            row.only_a,
            row.only_b,
            p
        );
    }
    let recall = |r: Option<(f64, u64)>| r.map_or("-".to_owned(), |(mean, n)| format!("{:.1}% (n={n})", mean * 100.0));
    let _ = writeln!(out, "{:<28} {:>15} {:>15}", "retrieval recall (sessions)", recall(a.recall), recall(b.recall));
    let _ =
        writeln!(out, "{:<28} {:>15} {:>15}", "retrieval recall (turns)", recall(a.turn_recall), recall(b.turn_recall));
    for (label, figure) in [
        ("ingest tokens", (|r: &MemoryReport| r.ingest_tokens) as fn(&MemoryReport) -> u64),
        ("answer tokens", |r| r.answer_tokens),
        ("judge tokens", |r| r.judge_tokens),
    ] {
        let _ = writeln!(out, "{:<28} {:>15} {:>15}", label, figure(a), figure(b));
    }
    let per_session = |r: &MemoryReport| r.per_session.map_or("-".to_owned(), |x| format!("{x:.1}"));
    let _ = writeln!(out, "{:<28} {:>15} {:>15}", "entries per session", per_session(a), per_session(b));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(task: &str, question_type: &str, abstention: bool, passed: Option<bool>) -> PairedQuestion {
        PairedQuestion { task: (task.into(), 1), question_type: question_type.into(), abstention, passed }
    }

    fn report(questions: Vec<PairedQuestion>) -> MemoryReport {
        MemoryReport { questions, ..MemoryReport::default() }
    }

    #[test]
    fn questions_are_paired_by_task_within_each_type() {
        let a = report(vec![
            q("t1", "temporal", false, Some(true)),
            q("t2", "temporal", false, Some(false)),
            q("t3", "single-hop", false, Some(true)),
            q("t4", "adversarial", true, None),
        ]);
        let b = report(vec![
            // Listed in another order: pairing is by task, not by position.
            q("t3", "single-hop", false, Some(false)),
            q("t2", "temporal", false, Some(true)),
            q("t1", "temporal", false, Some(true)),
            q("t4", "adversarial", true, Some(true)),
        ]);
        let rows = rows(&a, &b);
        let labels: Vec<&str> = rows.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(labels, ["adversarial", "single-hop", "temporal", "all", "abstention"]);
        let temporal = &rows[2];
        assert_eq!((temporal.a, temporal.b), ((1, 2), (2, 2)));
        assert_eq!((temporal.pairs, temporal.only_a, temporal.only_b), (2, 0, 1));
        assert_eq!(temporal.delta(), Some(50.0));
        // t4 is unscored in A: no pair, and A has no accuracy to subtract.
        let adversarial = &rows[0];
        assert_eq!((adversarial.pairs, adversarial.delta()), (0, None));
        let all = &rows[3];
        assert_eq!((all.a, all.b, all.pairs, all.only_a, all.only_b), ((2, 3), (3, 4), 3, 1, 1));
        assert_eq!(all.p_value(), 1.0);
    }

    #[test]
    fn the_table_names_both_runs_and_each_row() {
        let a = report(vec![q("t1", "temporal", false, Some(true))]);
        let b = report(vec![q("t1", "temporal", false, Some(false))]);
        let text = render(("run-a", &a), ("run-b", &b));
        assert!(text.contains("A = run-a, B = run-b"), "{text}");
        assert!(text.contains("1/1 100.0%") && text.contains("0/1 0.0%") && text.contains("-100.0"), "{text}");
        assert!(text.contains("entries per session"), "{text}");
    }
}
