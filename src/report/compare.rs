//! Backends side by side: per model (and run) the pass rate with its Wilson interval, cost,
//! latency and steps; between each pair, the tasks that flipped and a paired test on the
//! episodes both made — exact McNemar on pass/fail, a paired bootstrap on scores.
//!
//! Episodes pair by suite, task id and epoch, and only when the task's content is the same
//! in both (its digest): a changed task is a different question.

use std::collections::HashMap;
use std::fmt::Write as _;

use super::power;
use super::stats::{self, Bootstrap};
use crate::log::projection::{EpisodeRow, Projection};
use crate::log::{Outcome, add_cost, usd};

/// Below this many shared tasks the bootstrap's interval and p-value are not shown.
const MIN_BOOTSTRAP_TASKS: u64 = 10;

/// Resamples of the paired bootstrap; fixed seed, so a comparison is reproducible.
const RESAMPLES: u32 = 2_000;
const SEED: u64 = 0x5eed;

/// One model of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupStats {
    pub label: String,
    pub run_id: String,
    pub model: String,
    pub episodes: u64,
    pub scored: u64,
    pub passed: u64,
    pub unscored: u64,
    pub cancelled: u64,
    pub pass_rate: Option<f64>,
    /// The 95% Wilson interval of the pass rate.
    pub interval: Option<(f64, f64)>,
    pub mean_score: Option<f64>,
    pub tokens: u64,
    /// `None` when no episode had a price.
    pub cost_usd: Option<f64>,
    /// Of the episodes' summed model latency.
    pub latency_p50_ms: Option<f64>,
    pub latency_p95_ms: Option<f64>,
    pub mean_steps: f64,
}

impl GroupStats {
    pub fn of(label: String, run_id: String, model: String, rows: &[&EpisodeRow]) -> GroupStats {
        let mut g = GroupStats {
            label,
            run_id,
            model,
            episodes: rows.len() as u64,
            scored: 0,
            passed: 0,
            unscored: 0,
            cancelled: 0,
            pass_rate: None,
            interval: None,
            mean_score: None,
            tokens: 0,
            cost_usd: None,
            latency_p50_ms: None,
            latency_p95_ms: None,
            mean_steps: 0.0,
        };
        let mut score_sum = 0.0;
        let mut steps = 0u64;
        for r in rows {
            match &r.outcome {
                Outcome::Scored { score, passed } => {
                    g.scored += 1;
                    g.passed += u64::from(*passed);
                    score_sum += score;
                }
                Outcome::Unscored { .. } => g.unscored += 1,
                Outcome::Cancelled => g.cancelled += 1,
            }
            g.tokens += r.usage.total();
            if let Some(c) = r.cost_usd {
                g.cost_usd = Some(add_cost(g.cost_usd.unwrap_or(0.0), c));
            }
            steps += u64::from(r.steps);
        }
        if g.scored > 0 {
            g.pass_rate = Some(g.passed as f64 / g.scored as f64);
            g.mean_score = Some(score_sum / g.scored as f64);
        }
        g.interval = stats::wilson(g.passed, g.scored);
        let latencies: Vec<f64> = rows.iter().filter(|r| r.model_calls > 0).map(|r| r.latency_ms).collect();
        g.latency_p50_ms = stats::quantile(&latencies, 0.5);
        g.latency_p95_ms = stats::quantile(&latencies, 0.95);
        if !rows.is_empty() {
            g.mean_steps = steps as f64 / rows.len() as f64;
        }
        g
    }
}

/// A task whose verdict differs between the groups: it passed (a majority of its shared
/// epochs) in one and not in the other.
#[derive(Debug, Clone, PartialEq)]
pub struct Flip {
    pub suite: String,
    pub task_id: String,
    /// Epochs scored in both, and how many of them passed in A and in B.
    pub epochs: u32,
    pub passed_a: u32,
    pub passed_b: u32,
    /// Passed in A and not in B (a regression of B against A), or the other way.
    pub regressed: bool,
}

impl Flip {
    fn name(&self, markdown: bool) -> String {
        let tick = if markdown { "`" } else { "" };
        let counts = if self.epochs > 1 {
            format!(" ({}/{} → {}/{})", self.passed_a, self.epochs, self.passed_b, self.epochs)
        } else {
            String::new()
        };
        format!("{tick}{}/{}{tick}{counts}", self.suite, self.task_id)
    }
}

/// Group B against group A on the tasks both ran. The unit is the task, not the episode:
/// a task's epochs are not independent of each other, so each task counts once — passed
/// when a majority of its shared epochs passed, scored by its mean over them.
#[derive(Debug, Clone, PartialEq)]
pub struct PairTest {
    pub a: String,
    pub b: String,
    /// Tasks with at least one epoch scored in both.
    pub shared: u64,
    /// Episodes scored in both.
    pub shared_episodes: u64,
    /// Episode pairs left out because the task's content differs between the two.
    pub changed_tasks: u64,
    /// Tasks passing only in A, and only in B.
    pub only_a: u64,
    pub only_b: u64,
    /// Mean over the shared tasks of each task's pass rate over its shared epochs.
    pub pass_rate_a: Option<f64>,
    pub pass_rate_b: Option<f64>,
    /// B minus A, in pass rate.
    pub effect: Option<f64>,
    /// Exact McNemar on the tasks' verdicts, two-sided.
    pub p_value: f64,
    /// Tasks' mean scores, B minus A, resampling tasks.
    pub score: Option<Bootstrap>,
    pub flips: Vec<Flip>,
    /// Per shared task, B's pass rate over its shared epochs less A's: the spread the
    /// minimum detectable difference is computed from.
    pub task_diffs: Vec<f64>,
    /// The epochs' noise of both sides, `(σ²_w,A + σ²_w,B) / n`: the least variance a task's
    /// difference can have (see [`power::paired_mde`]).
    pub epoch_noise: f64,
}

/// One task's shared epochs.
#[derive(Default)]
struct TaskPair {
    epochs: u32,
    passed_a: u32,
    passed_b: u32,
    score_a: f64,
    score_b: f64,
}

impl PairTest {
    pub fn between(a: &GroupRef, b: &GroupRef) -> PairTest {
        let by_key: HashMap<(&str, &str, u32), &EpisodeRow> = a.rows.iter().map(|r| (r.pair_key(), *r)).collect();
        let mut t = PairTest {
            a: a.label.clone(),
            b: b.label.clone(),
            shared: 0,
            shared_episodes: 0,
            changed_tasks: 0,
            only_a: 0,
            only_b: 0,
            pass_rate_a: None,
            pass_rate_b: None,
            effect: None,
            p_value: 1.0,
            score: None,
            flips: Vec::new(),
            task_diffs: Vec::new(),
            epoch_noise: 0.0,
        };
        let mut tasks: std::collections::BTreeMap<(&str, &str), TaskPair> = std::collections::BTreeMap::new();
        for rb in &b.rows {
            let Some(ra) = by_key.get(&rb.pair_key()) else { continue };
            if ra.task_digest != rb.task_digest {
                t.changed_tasks += 1;
                continue;
            }
            let (Outcome::Scored { score: sa, passed: pa }, Outcome::Scored { score: sb, passed: pb }) =
                (&ra.outcome, &rb.outcome)
            else {
                continue;
            };
            t.shared_episodes += 1;
            let task = tasks.entry((&rb.suite, &rb.task_id)).or_default();
            task.epochs += 1;
            task.passed_a += u32::from(*pa);
            task.passed_b += u32::from(*pb);
            task.score_a += sa;
            task.score_b += sb;
        }
        let (mut rate_a, mut rate_b) = (0.0, 0.0);
        let mut diffs = Vec::with_capacity(tasks.len());
        let (mut counts_a, mut counts_b) = (Vec::new(), Vec::new());
        for ((suite, task_id), task) in &tasks {
            let n = f64::from(task.epochs);
            t.task_diffs.push(f64::from(task.passed_b) / n - f64::from(task.passed_a) / n);
            let epochs = u64::from(task.epochs);
            counts_a.push(power::TaskCount { epochs, passed: u64::from(task.passed_a) });
            counts_b.push(power::TaskCount { epochs, passed: u64::from(task.passed_b) });
            rate_a += f64::from(task.passed_a) / n;
            rate_b += f64::from(task.passed_b) / n;
            diffs.push((task.score_b - task.score_a) / n);
            let (ok_a, ok_b) = (task.passed_a * 2 > task.epochs, task.passed_b * 2 > task.epochs);
            if ok_a != ok_b {
                if ok_a {
                    t.only_a += 1;
                } else {
                    t.only_b += 1;
                }
                t.flips.push(Flip {
                    suite: suite.to_string(),
                    task_id: task_id.to_string(),
                    epochs: task.epochs,
                    passed_a: task.passed_a,
                    passed_b: task.passed_b,
                    regressed: ok_a,
                });
            }
        }
        t.shared = tasks.len() as u64;
        if let (Some(a), Some(b)) = (power::Decomposition::of(&counts_a), power::Decomposition::of(&counts_b)) {
            t.epoch_noise = (a.within.unwrap_or(0.0) + b.within.unwrap_or(0.0)) / a.epochs_per_task();
        }
        if t.shared > 0 {
            let n = t.shared as f64;
            t.pass_rate_a = Some(rate_a / n);
            t.pass_rate_b = Some(rate_b / n);
            t.effect = Some((rate_b - rate_a) / n);
        }
        t.p_value = stats::mcnemar_exact(t.only_a, t.only_b);
        t.score = stats::paired_bootstrap(&diffs, RESAMPLES, SEED);
        t
    }

    /// The bootstrap's interval and p-value, when there are tasks enough to resample: with
    /// a handful, every resample looks alike and the interval claims a certainty it lacks.
    pub fn bootstrap(&self) -> Option<Bootstrap> {
        self.score.filter(|_| self.shared >= MIN_BOOTSTRAP_TASKS)
    }

    /// A significant drop of B against A beyond `tolerance` (a fraction of pass rate).
    pub fn regressed(&self, tolerance: f64, alpha: f64) -> bool {
        self.effect.is_some_and(|e| e < -tolerance) && self.p_value < alpha
    }

    /// The minimum detectable difference of this pair at `alpha` and 80 % power, from the
    /// observed spread of its tasks' differences.
    pub fn mde(&self, alpha: f64) -> Option<f64> {
        let floor = power::mcnemar_floor(self.shared, alpha)?;
        power::paired_mde(&self.task_diffs, self.epoch_noise, alpha).map(|mde| mde.max(floor))
    }

    /// For a pair that did not regress: whether it could have. A green gate that could not
    /// have been red says so ("underpowered: …"). `None` for a regression or no shared task.
    pub fn power_line(&self, tolerance: f64, alpha: f64) -> Option<String> {
        if self.effect.is_none() || self.regressed(tolerance, alpha) {
            return None;
        }
        let who = format!("power: {} vs {}", self.b, self.a);
        if !power::mcnemar_can_reject(self.shared, alpha) {
            let needed = (2.0 / alpha).log2().floor() as u64 + 1;
            return Some(format!(
                "{who}: underpowered: with {} shared task(s) the exact McNemar test cannot reach p < {alpha} whatever the results (it needs at least {needed}): a regression could not have been detected",
                self.shared
            ));
        }
        let mde = self.mde(alpha)?;
        let pts = |x: f64| format!("{:.1} pts", x * 100.0);
        Some(if mde <= tolerance {
            format!(
                "{who}: a drop of {} (the tolerance) would have been detected with 80% power (MDE {})",
                pts(tolerance),
                pts(mde)
            )
        } else if tolerance > 0.0 {
            format!(
                "{who}: underpowered: a drop of {} (the tolerance) is below the {} this comparison detects with 80% power at alpha {alpha}; `runner plan RUN --mde {:.0}` says what it needs",
                pts(tolerance),
                pts(mde),
                tolerance * 100.0
            )
        } else {
            format!(
                "{who}: underpowered: only drops of {} or more are detected with 80% power at alpha {alpha}; a smaller regression passes unnoticed (set --tolerance to the drop that matters, `runner plan` says what it needs)",
                pts(mde)
            )
        })
    }

    /// One sentence for a CI log: whether B regressed against A, by how much, and why that
    /// is (or is not) judged a regression.
    pub fn verdict(&self, tolerance: f64, alpha: f64) -> String {
        let Some(effect) = self.effect else {
            return format!("verdict: {} vs {}: not judged, no task was scored in both", self.b, self.a);
        };
        let pts = |x: f64| format!("{:.1} pts", x * 100.0);
        let rates = match (self.pass_rate_a, self.pass_rate_b) {
            (Some(a), Some(b)) => format!(" ({:.1}% -> {:.1}%)", a * 100.0, b * 100.0),
            _ => String::new(),
        };
        let change = format!(
            "pass rate {:+.1} pts{rates} over {} shared tasks ({} worse, {} better), McNemar p = {:.4}",
            effect * 100.0,
            self.shared,
            self.only_a,
            self.only_b,
            self.p_value,
        );
        let why = if self.regressed(tolerance, alpha) {
            format!("REGRESSED: the drop is beyond the tolerance of {} and p < alpha {alpha}", pts(tolerance))
        } else if effect >= -tolerance {
            format!("no regression: the change is within the tolerance of {}", pts(tolerance))
        } else {
            format!("no significant regression: p >= alpha {alpha}")
        };
        format!("verdict: {} vs {}: {change}; {why}", self.b, self.a)
    }
}

/// The episodes of one model (under one variant, in suites that name `variants:`) in one run.
pub struct GroupRef<'a> {
    pub label: String,
    pub run_id: String,
    pub model: String,
    pub variant: Option<String>,
    pub rows: Vec<&'a EpisodeRow>,
}

/// Splits runs into groups, one per run, model and variant, in the order given (the
/// variants in the order their suites name them). Labels are the model names (`model
/// [variant]`) when those are unique, else `run/model`.
pub fn groups(runs: &[Projection]) -> Vec<GroupRef<'_>> {
    let mut out: Vec<GroupRef> = Vec::new();
    let mut run_of: Vec<usize> = Vec::new();
    for (i, p) in runs.iter().enumerate() {
        let mut models: Vec<&str> = p.header.models.iter().map(String::as_str).collect();
        for e in &p.episodes {
            if !models.contains(&&*e.model) {
                models.push(&e.model);
            }
        }
        // The variants in their suites' order, then any the header does not name.
        let mut variants: Vec<Option<&str>> = Vec::new();
        let named = p.header.suites.iter().flat_map(|s| s.variants.iter().map(|v| Some(v.as_str())));
        for v in named.chain(p.episodes.iter().map(|e| e.variant.as_deref())) {
            if !variants.contains(&v) {
                variants.push(v);
            }
        }
        if variants.is_empty() {
            variants.push(None);
        }
        for m in models {
            for v in &variants {
                let rows: Vec<&EpisodeRow> =
                    p.episodes.iter().filter(|e| &*e.model == m && e.variant.as_deref() == *v).collect();
                // A variant of a suite this model has no episode of (or none at all) is no group.
                if rows.is_empty() && (v.is_some() || variants.len() > 1) {
                    continue;
                }
                out.push(GroupRef {
                    label: super::summary::label(m, *v),
                    run_id: p.run_id.clone(),
                    model: m.to_string(),
                    variant: v.map(str::to_owned),
                    rows,
                });
                run_of.push(i + 1);
            }
        }
    }
    let unique = |out: &[GroupRef]| {
        let mut names: Vec<&str> = out.iter().map(|g| g.label.as_str()).collect();
        names.sort();
        names.windows(2).all(|w| w[0] != w[1])
    };
    if !unique(&out) {
        for g in &mut out {
            g.label = format!("{}/{}", g.run_id, super::summary::label(&g.model, g.variant.as_deref()));
        }
    }
    // Two folders of one run id (copies, or runs of two machines): number the runs.
    if !unique(&out) {
        for (g, i) in out.iter_mut().zip(run_of) {
            g.label = format!("#{i} {}/{}", g.run_id, super::summary::label(&g.model, g.variant.as_deref()));
        }
    }
    out
}

/// Every group's stats and a paired test between each pair of groups.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub groups: Vec<GroupStats>,
    pub pairs: Vec<PairTest>,
    /// Each group split by the toolset its episodes drew (`model [toolset]`), for runs of
    /// suites that name `toolsets:`; empty otherwise.
    pub toolsets: Vec<GroupStats>,
    /// Per group and cell ([`power::cell_key`]): the variance decomposition of its pass
    /// indicator, for the noise table.
    pub noise: Vec<(String, power::CellKey, power::Decomposition)>,
    /// The significance level of the noise table's minimum detectable difference.
    pub alpha: f64,
}

impl Comparison {
    pub fn of(runs: &[Projection]) -> Comparison {
        let refs = groups(runs);
        let groups =
            refs.iter().map(|g| GroupStats::of(g.label.clone(), g.run_id.clone(), g.model.clone(), &g.rows)).collect();
        let mut pairs = Vec::new();
        for i in 0..refs.len() {
            for j in i + 1..refs.len() {
                pairs.push(PairTest::between(&refs[i], &refs[j]));
            }
        }
        let mut toolsets = Vec::new();
        for g in &refs {
            let mut names: Vec<&str> = g.rows.iter().filter_map(|r| r.toolset.as_deref()).collect();
            names.sort_unstable();
            names.dedup();
            for name in names {
                let rows: Vec<&EpisodeRow> =
                    g.rows.iter().copied().filter(|r| r.toolset.as_deref() == Some(name)).collect();
                let label = format!("{} [{name}]", g.label);
                toolsets.push(GroupStats::of(label, g.run_id.clone(), g.model.clone(), &rows));
            }
        }
        let mut noise = Vec::new();
        for g in &refs {
            let mut cells = power::Cells::new();
            for r in &g.rows {
                if let Outcome::Scored { passed, .. } = r.outcome {
                    power::count(&mut cells, power::cell_key(&r.suite, &r.model), &r.task_id, passed);
                }
            }
            noise.extend(power::decompose(&cells).into_iter().map(|(key, d)| (g.label.clone(), key, d)));
        }
        Comparison { groups, pairs, toolsets, noise, alpha: 0.05 }
    }

    /// The per-model table as rows of cells, the header first.
    fn group_cells(&self) -> Vec<Vec<String>> {
        cells(&self.groups)
    }

    fn pair_cells(&self) -> Vec<Vec<String>> {
        let mut lines = vec![
            [
                "A",
                "B",
                "tasks",
                "A only",
                "B only",
                "pass rate A",
                "pass rate B",
                "effect (B-A)",
                "McNemar p",
                "score diff (B-A)",
                "95% CI",
                "bootstrap p",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for p in &self.pairs {
            lines.push(vec![
                p.a.clone(),
                p.b.clone(),
                p.shared.to_string(),
                p.only_a.to_string(),
                p.only_b.to_string(),
                percent(p.pass_rate_a),
                percent(p.pass_rate_b),
                p.effect.map_or("-".into(), |e| format!("{:+.1} pts", e * 100.0)),
                format_p(p.p_value),
                p.score.map_or("-".into(), |s| format!("{:+.3}", s.mean_diff)),
                p.bootstrap().map_or(few(p), |s| format!("[{:+.3}, {:+.3}]", s.low, s.high)),
                p.bootstrap().map_or(few(p), |s| format_p(s.p_value)),
            ]);
        }
        lines
    }

    /// The comparison for a terminal.
    pub fn render(&self) -> String {
        let mut out = super::summary::table(&self.group_cells());
        if !self.noise.is_empty() {
            out.push('\n');
            out.push_str(&super::summary::table(&self.noise_cells()));
        }
        if !self.toolsets.is_empty() {
            out.push('\n');
            out.push_str(&super::summary::table(&cells(&self.toolsets)));
        }
        if !self.pairs.is_empty() {
            out.push('\n');
            out.push_str(&super::summary::table(&self.pair_cells()));
        }
        for p in &self.pairs {
            out.push_str(&flip_lines(p, false));
            if p.changed_tasks > 0 {
                let _ = writeln!(
                    out,
                    "{} vs {}: {} pairs left out, their task changed between the runs",
                    p.a, p.b, p.changed_tasks
                );
            }
        }
        out
    }

    /// The noise table: per group and suite, the variance decomposition and the noise floor.
    fn noise_cells(&self) -> Vec<Vec<String>> {
        let mde = format!("MDE (80%, α={})", self.alpha);
        let header = ["model", "suite", "tasks", "epochs/task", "within-task var", "between-task var", &mde];
        let mut lines = vec![header.map(String::from).to_vec()];
        for (label, key, d) in &self.noise {
            let var = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.4}"));
            lines.push(vec![
                label.clone(),
                key.suite.clone(),
                d.tasks.to_string(),
                format!("{:.1}", d.epochs_per_task()),
                var(d.within),
                var(d.between),
                d.detectable(self.alpha).map_or(format!("none: {} tasks", d.tasks), |(m, exact)| {
                    format!("{}{:.1} pts", if exact { "" } else { "≤ " }, m * 100.0)
                }),
            ]);
        }
        lines
    }

    /// The comparison as Markdown, for a pull-request comment.
    pub fn markdown(&self) -> String {
        let mut out = String::from("## Comparison\n\n");
        out.push_str(&markdown_table(&self.group_cells()));
        if !self.noise.is_empty() {
            out.push_str("\n### Noise\n\n");
            out.push_str(&markdown_table(&self.noise_cells()));
        }
        if !self.toolsets.is_empty() {
            out.push_str("\n### By toolset\n\n");
            out.push_str(&markdown_table(&cells(&self.toolsets)));
        }
        if !self.pairs.is_empty() {
            out.push_str("\n### Paired tests\n\n");
            out.push_str(&markdown_table(&self.pair_cells()));
            for p in &self.pairs {
                out.push_str(&flip_lines(p, true));
            }
        }
        out
    }

    /// The per-model table as CSV.
    pub fn groups_csv(&self) -> Result<Vec<u8>, csv::Error> {
        let mut w = csv::Writer::from_writer(Vec::new());
        w.write_record([
            "label",
            "run_id",
            "model",
            "episodes",
            "scored",
            "passed",
            "unscored",
            "cancelled",
            "pass_rate",
            "ci_low",
            "ci_high",
            "mean_score",
            "tokens",
            "cost_usd",
            "latency_p50_ms",
            "latency_p95_ms",
            "mean_steps",
        ])?;
        for g in &self.groups {
            let opt = |v: Option<f64>| v.map_or(String::new(), |v| v.to_string());
            w.write_record([
                g.label.clone(),
                g.run_id.clone(),
                g.model.clone(),
                g.episodes.to_string(),
                g.scored.to_string(),
                g.passed.to_string(),
                g.unscored.to_string(),
                g.cancelled.to_string(),
                opt(g.pass_rate),
                opt(g.interval.map(|i| i.0)),
                opt(g.interval.map(|i| i.1)),
                opt(g.mean_score),
                g.tokens.to_string(),
                opt(g.cost_usd),
                opt(g.latency_p50_ms),
                opt(g.latency_p95_ms),
                g.mean_steps.to_string(),
            ])?;
        }
        w.into_inner().map_err(|e| csv::Error::from(e.into_error()))
    }

    /// The paired tests as CSV, one row per pair.
    pub fn pairs_csv(&self) -> Result<Vec<u8>, csv::Error> {
        let mut w = csv::Writer::from_writer(Vec::new());
        w.write_record([
            "a",
            "b",
            "shared_tasks",
            "only_a",
            "only_b",
            "pass_rate_a",
            "pass_rate_b",
            "effect",
            "mcnemar_p",
            "score_diff",
            "score_diff_low",
            "score_diff_high",
            "bootstrap_p",
            "regressions",
            "improvements",
            "changed_tasks",
            "shared_episodes",
        ])?;
        for p in &self.pairs {
            let opt = |v: Option<f64>| v.map_or(String::new(), |v| v.to_string());
            let regressions = p.flips.iter().filter(|f| f.regressed).count();
            w.write_record([
                p.a.clone(),
                p.b.clone(),
                p.shared.to_string(),
                p.only_a.to_string(),
                p.only_b.to_string(),
                opt(p.pass_rate_a),
                opt(p.pass_rate_b),
                opt(p.effect),
                p.p_value.to_string(),
                opt(p.score.map(|s| s.mean_diff)),
                opt(p.bootstrap().map(|s| s.low)),
                opt(p.bootstrap().map(|s| s.high)),
                opt(p.bootstrap().map(|s| s.p_value)),
                regressions.to_string(),
                (p.flips.len() - regressions).to_string(),
                p.changed_tasks.to_string(),
                p.shared_episodes.to_string(),
            ])?;
        }
        w.into_inner().map_err(|e| csv::Error::from(e.into_error()))
    }
}

/// How many flips to name before saying how many more there are.
const FLIPS_SHOWN: usize = 20;

/// A table of groups as rows of cells, the header first.
fn cells(groups: &[GroupStats]) -> Vec<Vec<String>> {
    let mut lines = vec![
        [
            "model",
            "run",
            "episodes",
            "scored",
            "unscored",
            "passed",
            "pass rate",
            "coverage",
            "95% CI",
            "mean score",
            "tokens",
            "cost",
            "p50 latency",
            "p95 latency",
            "mean steps",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for g in groups {
        lines.push(vec![
            g.label.clone(),
            g.run_id.clone(),
            g.episodes.to_string(),
            g.scored.to_string(),
            g.unscored.to_string(),
            g.passed.to_string(),
            percent(g.pass_rate),
            format!("{}/{}", g.scored, g.episodes),
            g.interval.map_or("-".into(), |(lo, hi)| format!("[{:.1}, {:.1}]", lo * 100.0, hi * 100.0)),
            g.mean_score.map_or("-".into(), |s| format!("{s:.3}")),
            g.tokens.to_string(),
            g.cost_usd.map_or("-".into(), usd),
            g.latency_p50_ms.map_or("-".into(), |l| format!("{l:.0}ms")),
            g.latency_p95_ms.map_or("-".into(), |l| format!("{l:.0}ms")),
            format!("{:.1}", g.mean_steps),
        ]);
    }
    lines
}

fn flip_lines(p: &PairTest, markdown: bool) -> String {
    let mut out = String::new();
    for (regressed, word) in [(true, "passed in A, failed in B"), (false, "failed in A, passed in B")] {
        let flips: Vec<&Flip> = p.flips.iter().filter(|f| f.regressed == regressed).collect();
        if flips.is_empty() {
            continue;
        }
        let named: Vec<String> = flips.iter().take(FLIPS_SHOWN).map(|f| f.name(markdown)).collect();
        let more = flips.len().saturating_sub(FLIPS_SHOWN);
        let more = if more > 0 { format!(" and {more} more") } else { String::new() };
        let bullet = if markdown { "- " } else { "" };
        let _ = writeln!(out, "{bullet}{} vs {}: {} {word}: {}{more}", p.a, p.b, flips.len(), named.join(", "));
    }
    out
}

/// What the bootstrap cells say when there is no bootstrap to show.
fn few(p: &PairTest) -> String {
    if p.score.is_some() { format!("n={} <{MIN_BOOTSTRAP_TASKS}", p.shared) } else { "-".into() }
}

fn percent(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{:.1}%", v * 100.0))
}

fn format_p(p: f64) -> String {
    if p < 0.0001 { "<0.0001".into() } else { format!("{p:.4}") }
}

fn markdown_table(lines: &[Vec<String>]) -> String {
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        let cells: Vec<String> = line.iter().map(|c| c.replace('|', "\\|")).collect();
        let _ = writeln!(out, "| {} |", cells.join(" | "));
        if i == 0 {
            let _ = writeln!(out, "|{}", " --- |".repeat(line.len()));
        }
    }
    out
}

/// Each model of `current` against its counterpart in `baseline`: the same model when the
/// baseline has it, else — when each run has one model — the baseline's only model (a
/// backend replaced by another). A = baseline, B = current. The models
/// that have no counterpart, or no task in common with it, come back in `unmatched`: a
/// gate must not pass on what it could not judge.
pub fn against_baseline(baseline: &Projection, current: &Projection) -> (Vec<PairTest>, Vec<String>) {
    let base = groups(std::slice::from_ref(baseline));
    let now = groups(std::slice::from_ref(current));
    let (mut tests, mut unmatched) = (Vec::new(), Vec::new());
    let name = |g: &GroupRef| super::summary::label(&g.model, g.variant.as_deref());
    for b in &now {
        let only = (base.len() == 1 && now.len() == 1).then(|| base.first()).flatten();
        let a = base.iter().find(|a| a.model == b.model && a.variant == b.variant).or(only);
        match a {
            Some(a) => {
                let mut t = PairTest::between(a, b);
                t.a = format!("{}/{}", a.run_id, name(a));
                t.b = format!("{}/{}", b.run_id, name(b));
                if t.shared == 0 {
                    unmatched.push(format!("{} (no task scored in both)", name(b)));
                } else {
                    tests.push(t);
                }
            }
            None => unmatched.push(format!(
                "{} (the baseline ran {})",
                name(b),
                base.iter().map(name).collect::<Vec<_>>().join(", ")
            )),
        }
    }
    (tests, unmatched)
}
