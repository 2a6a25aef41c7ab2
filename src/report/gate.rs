//! The gates of a finished run, as verdicts: the unscored share, each suite's
//! `pass_threshold` and `k_of_n`, `--fail-under`, and the paired comparison with a baseline
//! run or between compared runs. Nothing here prints or exits; the command line does.

use super::compare::{Comparison, PairTest, against_baseline};
use super::summary::Summary;
use crate::log::projection::Projection;

/// What the run's own gates say, with a line for each gate that failed.
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    Passed,
    /// A threshold was not met.
    Failed(Vec<String>),
    /// More episodes went unscored than allowed: no other verdict can be trusted.
    TooManyUnscored(String),
}

impl Gate {
    /// The lines that say why the gate did not pass.
    pub fn reasons(&self) -> &[String] {
        match self {
            Gate::Passed => &[],
            Gate::Failed(reasons) => reasons,
            Gate::TooManyUnscored(reason) => std::slice::from_ref(reason),
        }
    }
}

/// Judges a run by its summary. Unscored episodes come first: a verdict built on too few
/// scored episodes cannot be trusted either way.
pub fn gate(summary: &Summary, fail_under: Option<f64>, max_unscored: f64) -> Gate {
    let total = summary.total();
    if total.episodes > 0 && total.unscored as f64 / total.episodes as f64 > max_unscored {
        return Gate::TooManyUnscored(format!(
            "gate: {} of {} episodes unscored, more than --max-unscored {max_unscored} allows",
            total.unscored, total.episodes
        ));
    }
    let mut reasons = Vec::new();
    for row in &summary.rows {
        let threshold = summary.thresholds.get(&row.suite).copied().flatten();
        if let (Some(threshold), Some(rate)) = (threshold, row.pass_rate())
            && rate < threshold
        {
            reasons.push(format!(
                "gate: suite `{}` on {} passed {:.1}%, below its pass_threshold {:.1}%",
                row.suite,
                row.label(),
                rate * 100.0,
                threshold * 100.0
            ));
        }
    }
    for row in summary.epoch_rows() {
        if !row.below_k_of_n.is_empty() {
            let shown: Vec<&str> = row.below_k_of_n.iter().take(5).map(String::as_str).collect();
            let more = row.below_k_of_n.len().saturating_sub(5);
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            reasons.push(format!(
                "gate: suite `{}` on {}: {} task(s) passed fewer epochs than their pass_k or the suite's k_of_n: {}{more}",
                row.suite,
                super::summary::label(&row.model, row.variant.as_deref()),
                row.below_k_of_n.len(),
                shown.join(", ")
            ));
        }
    }
    if let (Some(min), Some(rate)) = (fail_under, total.pass_rate())
        && rate < min
    {
        reasons.push(format!(
            "gate: {:.1}% of scored episodes passed, below --fail-under {:.1}%",
            rate * 100.0,
            min * 100.0
        ));
    }
    if reasons.is_empty() { Gate::Passed } else { Gate::Failed(reasons) }
}

/// A run against its baseline, model by model.
#[derive(Debug, Clone, PartialEq)]
pub struct BaselineVerdict {
    /// One line per model judged.
    pub lines: Vec<String>,
    /// Some model regressed significantly.
    pub regressed: bool,
    /// Why some models could not be judged (another model, no shared task); `None` when
    /// every model was.
    pub unjudged: Option<String>,
}

/// Compares `current` with `baseline` by the exact McNemar test on the shared episodes; a
/// drop up to `tolerance` is not a regression.
pub fn against(baseline: &Projection, current: &Projection, tolerance: f64, alpha: f64) -> BaselineVerdict {
    let (tests, unmatched) = against_baseline(baseline, current);
    let mut regressed = false;
    let mut lines = Vec::new();
    for t in &tests {
        let effect = t.effect.map_or("-".into(), |e| format!("{:+.1} pts", e * 100.0));
        let significant = t.regressed(tolerance, alpha);
        lines.push(format!(
            "baseline: {} vs {}: {} shared tasks ({} episodes), {} regressed, {} improved, effect {effect}, McNemar p = {:.4}: {}",
            t.b,
            t.a,
            t.shared,
            t.shared_episodes,
            t.only_a,
            t.only_b,
            t.p_value,
            if significant { "significant regression" } else { "no significant regression" }
        ));
        regressed |= significant;
        lines.extend(t.power_line(tolerance, alpha));
    }
    let unjudged = (!unmatched.is_empty()).then(|| {
        format!(
            "--baseline {} cannot judge {}: give a baseline of the same models and tasks",
            baseline.run_id,
            unmatched.join("; ")
        )
    });
    BaselineVerdict { lines, regressed, unjudged }
}

/// The paired tests `runner compare` gates on: each later run against the first, model by
/// model; in one run of several models, each model against the first. With `strict`
/// (`--fail-on-regression`), a model that cannot be judged is an error.
pub fn compared(runs: &[Projection], comparison: Comparison, strict: bool) -> Result<Vec<PairTest>, String> {
    let [first, later @ ..] = runs else { return Ok(Vec::new()) };
    if !later.is_empty() {
        let mut verdicts = Vec::new();
        for run in later {
            let (tests, unmatched) = against_baseline(first, run);
            if strict && !unmatched.is_empty() {
                return Err(format!(
                    "--fail-on-regression cannot judge {} of {} against {}: {}",
                    if unmatched.len() == 1 { "a model" } else { "models" },
                    run.run_id,
                    first.run_id,
                    unmatched.join("; ")
                ));
            }
            verdicts.extend(tests);
        }
        return Ok(verdicts);
    }
    let Some(first_group) = comparison.groups.first().map(|g| g.label.clone()) else { return Ok(Vec::new()) };
    let (gated, _): (Vec<_>, Vec<_>) = comparison.pairs.into_iter().partition(|p| p.a == first_group);
    if let Some(blind) = gated.iter().find(|p| p.shared == 0).filter(|_| strict) {
        return Err(format!(
            "--fail-on-regression cannot judge {} against {}: no task scored in both",
            blind.b, blind.a
        ));
    }
    Ok(gated)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::log::event::SuiteInfo;
    use crate::log::projection::EpisodeRow;
    use crate::log::{Outcome, Termination, UnscoredCause, Usage};

    fn row(task: usize, model: &str, outcome: Outcome) -> EpisodeRow {
        EpisodeRow {
            episode_id: format!("{model}-{task}").into(),
            suite: Arc::from("s"),
            task_id: Arc::from(format!("t{task}")),
            task_digest: Arc::from("d"),
            model: Arc::from(model),
            epoch: 1,
            outcome,
            termination: Termination::FinalAnswer,
            steps: 1,
            tool_calls: 0,
            tool_errors: 0,
            usage: Usage::default(),
            cost_usd: None,
            model_calls: 1,
            largest_input: 0,
            latency_ms: 1.0,
            wall_ms: 1.0,
            started_us: 0,
            finished_us: 0,
            toolset: None,
            variant: None,
        }
    }

    /// A finished run of `outcomes` on `model`, its suite asking for `threshold`.
    fn run(id: &str, model: &str, outcomes: Vec<Outcome>, threshold: Option<f64>) -> Projection {
        let suite = SuiteInfo {
            name: "s".into(),
            path: "s.yaml".into(),
            digest: "x".into(),
            tasks: outcomes.len(),
            environment: "kv".into(),
            epochs: 1,
            reducer: Default::default(),
            k_of_n: None,
            pass_k: Default::default(),
            sandbox: None,
            pass_threshold: threshold,
            variants: Vec::new(),
        };
        let mut p = Projection { run_id: id.into(), finished: true, ..Projection::default() };
        p.header.models = vec![model.into()];
        p.header.suites = vec![suite];
        p.episodes = outcomes.into_iter().enumerate().map(|(i, o)| row(i, model, o)).collect();
        p
    }

    fn summary(p: &Projection) -> Summary {
        let mut s = Summary::begin(p);
        p.episodes.iter().for_each(|e| s.add(e));
        s
    }

    fn passed(yes: bool) -> Outcome {
        Outcome::Scored { score: if yes { 1.0 } else { 0.0 }, passed: yes }
    }

    #[test]
    fn too_many_unscored_is_judged_before_any_threshold() {
        let gone = Outcome::Unscored { cause: UnscoredCause::RateLimited, message: String::new() };
        let p = run("r", "m", vec![passed(false), gone], Some(0.9));
        let verdict = gate(&summary(&p), Some(0.9), 0.0);
        assert!(matches!(&verdict, Gate::TooManyUnscored(r) if r.contains("1 of 2 episodes unscored")), "{verdict:?}");
        assert_eq!(gate(&summary(&p), None, 0.5).reasons().len(), 1, "the threshold alone fails at 50% unscored");
    }

    #[test]
    fn each_threshold_missed_is_a_reason_and_a_met_one_passes() {
        let p = run("r", "m", vec![passed(true), passed(false)], Some(0.8));
        let Gate::Failed(reasons) = gate(&summary(&p), Some(0.6), 0.0) else { panic!("the gate passed") };
        assert_eq!(reasons.len(), 2, "{reasons:?}");
        assert!(reasons[0].contains("below its pass_threshold 80.0%"), "{reasons:?}");
        assert!(reasons[1].contains("below --fail-under 60.0%"), "{reasons:?}");
        let p = run("r", "m", vec![passed(true), passed(true)], Some(0.8));
        assert_eq!(gate(&summary(&p), Some(0.6), 0.0), Gate::Passed);
    }

    #[test]
    fn a_baseline_judges_the_same_model_and_names_the_others() {
        let before = run("a", "m", (0..12).map(|_| passed(true)).collect(), None);
        let worse = run("b", "m", (0..12).map(|_| passed(false)).collect(), None);
        let verdict = against(&before, &worse, 0.0, 0.05);
        assert!(verdict.regressed && verdict.unjudged.is_none(), "{verdict:?}");
        assert!(verdict.lines[0].contains("significant regression"), "{:?}", verdict.lines);
        assert!(!against(&before, &before, 0.0, 0.05).regressed);
        let other = run("c", "other", (0..12).map(|_| passed(true)).collect(), None);
        let mut two = before.clone();
        two.episodes.extend(other.episodes);
        let verdict = against(&before, &two, 0.0, 0.05);
        assert!(verdict.unjudged.is_some_and(|u| u.contains("other (the baseline ran m)")));
    }

    #[test]
    fn compare_gates_later_runs_on_the_first_and_strictly_refuses_what_it_cannot_judge() {
        let first = run("a", "m", vec![passed(true), passed(true)], None);
        let later = run("b", "m", vec![passed(true), passed(false)], None);
        let runs = [first.clone(), later];
        let tests = compared(&runs, Comparison::of(&runs), true).unwrap();
        assert_eq!(tests.len(), 1);
        assert_eq!((tests[0].a.as_str(), tests[0].b.as_str()), ("a/m", "b/m"));
        let mut elsewhere = run("c", "m", vec![passed(true)], None);
        elsewhere.episodes[0].task_id = Arc::from("t9");
        let runs = [first, elsewhere];
        let refused = compared(&runs, Comparison::of(&runs), true).unwrap_err();
        assert_eq!(refused, "--fail-on-regression cannot judge a model of c against a: m (no task scored in both)");
        assert!(compared(&runs, Comparison::of(&runs), false).unwrap().is_empty());
    }
}
