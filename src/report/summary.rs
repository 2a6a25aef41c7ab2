//! The run summary: per suite and model, computed from the event log alone.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use chrono::{DateTime, FixedOffset};

use super::power;
use crate::log::projection::{EpisodeRow, Projection};
use crate::log::{Outcome, UnscoredCause, add_cost, usd};

/// One line of the summary table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Row {
    pub suite: String,
    pub model: String,
    /// The variant, in a suite that names `variants:`.
    pub variant: Option<String>,
    pub episodes: u64,
    pub passed: u64,
    pub failed: u64,
    /// Unscored for a fault; the episodes a budget kept from running are `not_run` instead.
    pub unscored: u64,
    pub cancelled: u64,
    /// Planned, but a run-wide budget stopped scheduling before they started.
    pub not_run: u64,
    pub steps: u64,
    pub tokens: u64,
    pub cost_usd: f64,
    /// Episodes whose cost is unknown (a model without a price).
    pub unpriced: u64,
    /// Why episodes went unscored, and how many.
    pub unscored_causes: BTreeMap<UnscoredCause, u64>,
    first_start: Option<DateTime<FixedOffset>>,
    last_finish: Option<DateTime<FixedOffset>>,
}

impl Row {
    /// The model, and the variant when there is one: `mock [terse]`.
    pub fn label(&self) -> String {
        label(&self.model, self.variant.as_deref())
    }

    pub fn scored(&self) -> u64 {
        self.passed + self.failed
    }

    /// Passed over scored; `None` when nothing was scored.
    pub fn pass_rate(&self) -> Option<f64> {
        (self.scored() > 0).then(|| self.passed as f64 / self.scored() as f64)
    }

    /// `n_scored / n_planned`, as shown beside every rate: `9/10`.
    pub fn coverage(&self) -> String {
        format!("{}/{}", self.scored(), self.episodes)
    }

    pub fn mean_steps(&self) -> f64 {
        let finished = self.episodes - self.cancelled;
        if finished == 0 { 0.0 } else { self.steps as f64 / finished as f64 }
    }

    /// From the first episode's start to the last one's end.
    pub fn wall_s(&self) -> f64 {
        match (self.first_start, self.last_finish) {
            (Some(a), Some(b)) => (b - a).num_microseconds().unwrap_or(0) as f64 / 1e6,
            _ => 0.0,
        }
    }
}

/// One task's scored epochs on one model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskTally {
    pub scores: Vec<f64>,
    pub passed: u64,
}

/// Per suite and model, over tasks: how they fared across their epochs.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochRow {
    pub suite: String,
    pub model: String,
    pub variant: Option<String>,
    pub k: u64,
    pub tasks: u64,
    /// Tasks that passed their k-of-n (by default, a majority of their scored epochs).
    pub tasks_passed: u64,
    pub pass_at_1: f64,
    pub pass_at_k: f64,
    pub pass_hat_k: f64,
    /// The mean over tasks of each task's reduced score.
    pub score: f64,
    /// Tasks below their k-of-n (the task's `pass_k`, else the suite's `k_of_n`), when one
    /// is set: these fail the gate.
    pub below_k_of_n: Vec<String>,
}

/// One toolset's episodes on one suite and model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolsetTally {
    pub episodes: u64,
    pub passed: u64,
    pub failed: u64,
    pub unscored: u64,
}

impl ToolsetTally {
    pub fn pass_rate(&self) -> Option<f64> {
        let scored = self.passed + self.failed;
        (scored > 0).then(|| self.passed as f64 / scored as f64)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub run_id: String,
    /// The run folder as the user named it, for the commands the summary suggests.
    pub run_dir: Option<String>,
    /// In the order suites and models first appear in the log.
    pub rows: Vec<Row>,
    pub thresholds: HashMap<String, Option<f64>>,
    pub suites: HashMap<String, crate::log::event::SuiteInfo>,
    /// By suite, model (with its variant, as [`label`] writes them) and task id.
    pub tasks: BTreeMap<(String, String, String), TaskTally>,
    /// By suite, model and the toolset drawn, for suites that name `toolsets:`.
    pub toolsets: BTreeMap<(String, String, String), ToolsetTally>,
    pub interrupted: bool,
    pub wall_ms: f64,
    /// Episodes started but never finished (the run was killed).
    pub unfinished: u64,
    pub torn_last_line: bool,
    /// The regrade whose outcomes the summary shows; `None` for the run's own scoring.
    pub scoring_id: Option<String>,
    /// For each cause of unscored episodes, the message of the first (in table order).
    pub first_messages: BTreeMap<UnscoredCause, String>,
    /// What the run warned about how it was set up (`run_started`), said again under the
    /// tables. A regrade's scoring is not the run's: its warnings are left out then.
    pub warnings: Vec<String>,
    /// The significance level of the minimum detectable difference (`--alpha`; 0.05 when
    /// unset).
    pub alpha: Option<f64>,
    /// Why the first episode a budget kept from running was not run.
    pub first_budget_message: Option<String>,
}

impl Summary {
    /// The alpha of the noise table.
    pub fn alpha(&self) -> f64 {
        self.alpha.unwrap_or(0.05)
    }

    /// Per suite and model (the one [`power::cell_key`]), the variance decomposition of the
    /// pass indicator over the scored episodes.
    pub fn noise(&self) -> Vec<(power::CellKey, power::Decomposition)> {
        let mut cells = power::Cells::new();
        for ((suite, model, task), tally) in &self.tasks {
            let count = power::TaskCount { epochs: tally.scores.len() as u64, passed: tally.passed };
            cells.entry(power::cell_key(suite, model)).or_default().insert(task.clone(), count);
        }
        power::decompose(&cells)
    }

    /// The noise table: within- and between-task variance and the noise floor, for the
    /// suites and models where a floor exists; the others, too small for the McNemar test
    /// to detect any drop, are named in one line under it (or alone, when none has one).
    pub fn render_noise(&self) -> String {
        let alpha = self.alpha();
        let mde_header = format!("MDE (80%, α={alpha})");
        let header =
            ["suite", "model", "tasks", "epochs/task", "within-task var", "between-task var", "total var", &mde_header];
        let mut lines: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
        let mut bounded = false;
        let mut unmeasurable = Vec::new();
        for (key, d) in self.noise() {
            let var = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.4}"));
            let mde = match d.detectable(alpha) {
                Some((m, true)) => format!("{:.1} pts", m * 100.0),
                Some((m, false)) => {
                    bounded = true;
                    format!("≤ {:.1} pts", m * 100.0)
                }
                None => {
                    unmeasurable.push((key, d.tasks));
                    continue;
                }
            };
            lines.push(vec![
                key.suite,
                key.model,
                d.tasks.to_string(),
                format!("{:.1}", d.epochs_per_task()),
                var(d.within),
                var(d.between),
                format!("{:.4}", d.total),
                mde,
            ]);
        }
        let needed = power::mcnemar_min_discordant(alpha);
        let tasks = |n: u64| if n == 1 { "1 task".to_owned() } else { format!("{n} tasks") };
        let mut out = String::new();
        if lines.len() > 1 {
            out.push_str(&table(&lines));
            out.push_str(
                "MDE: the smallest drop of pass rate a paired comparison of this many tasks and epochs detects with 80% power; `runner plan RUN --mde 5` says what 5 points needs\n",
            );
            if bounded {
                out.push_str(
                    "≤: one epoch per task cannot tell epochs' noise from tasks'; the bound counts it all as noise\n",
                );
            }
            if !unmeasurable.is_empty() {
                // A few are named; a long list would be the noise this line replaces.
                const NAMED: usize = 3;
                let mut named: Vec<String> = unmeasurable
                    .iter()
                    .take(NAMED)
                    .map(|(k, n)| format!("{} {} ({})", k.suite, k.model, tasks(*n)))
                    .collect();
                if unmeasurable.len() > NAMED {
                    named.push(format!("and {} more", unmeasurable.len() - NAMED));
                }
                let _ = writeln!(
                    out,
                    "no MDE: too few tasks for the McNemar test to detect any drop (it needs {needed}): {}",
                    named.join(", ")
                );
            }
        } else if let Some(most) = unmeasurable.iter().map(|(_, n)| *n).max() {
            let counted = if unmeasurable.len() == 1 { tasks(most) } else { format!("at most {}", tasks(most)) };
            let _ = writeln!(
                out,
                "noise: too few tasks for the McNemar test to detect any drop ({counted}; it needs {needed}); see `runner plan RUN --mde 5`"
            );
        }
        out
    }

    /// The table of tasks over their epochs.
    pub fn render_epochs(&self) -> String {
        let header = ["suite", "model", "tasks", "tasks passed", "pass@1", "pass@k", "pass^k", "k", "task score"];
        let mut lines: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
        for r in self.epoch_rows() {
            lines.push(vec![
                r.suite,
                label(&r.model, r.variant.as_deref()),
                r.tasks.to_string(),
                r.tasks_passed.to_string(),
                format!("{:.3}", r.pass_at_1),
                format!("{:.3}", r.pass_at_k),
                format!("{:.3}", r.pass_hat_k),
                r.k.to_string(),
                format!("{:.3}", r.score),
            ]);
        }
        table(&lines)
    }

    /// The table of toolsets: how the episodes that drew each one fared.
    pub fn render_toolsets(&self) -> String {
        let header = ["suite", "model", "toolset", "episodes", "passed", "failed", "unscored", "pass rate"];
        let mut lines: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
        for ((suite, model, toolset), t) in &self.toolsets {
            lines.push(vec![
                suite.clone(),
                model.clone(),
                toolset.clone(),
                t.episodes.to_string(),
                t.passed.to_string(),
                t.failed.to_string(),
                t.unscored.to_string(),
                t.pass_rate().map_or("-".into(), |p| format!("{:.1}%", p * 100.0)),
            ]);
        }
        table(&lines)
    }

    /// What the terminal says under the tables, line by line: episodes a budget kept from
    /// running, the causes of unscored episodes with the first message of each, a cost that
    /// is a lower bound, cancelled and unfinished episodes. The report and the viewer show
    /// the same lines.
    pub fn notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        let total = self.total();
        if total.not_run > 0 {
            notes.push(format!(
                "not run: {} of {} planned episodes, a budget stopped scheduling; `runner eval ... --resume {}` with a larger budget runs them (after `--epochs auto`, with `--epochs N`, the epochs it reached)",
                total.not_run,
                total.episodes,
                self.run_dir.as_deref().unwrap_or(&self.run_id)
            ));
            if let Some(message) = self.first_budget_message.as_deref() {
                notes.push(format!("  {}", first_line(message, 300)));
            }
        }
        if total.unscored > 0 {
            let causes: Vec<String> = total.unscored_causes.iter().map(|(c, n)| format!("{c}: {n}")).collect();
            notes.push(format!("unscored episodes are not failures; causes: {}", causes.join(", ")));
            for (cause, message) in &self.first_messages {
                notes.push(format!("  {cause}, the first: {}", first_line(message, 300)));
            }
        }
        if total.unpriced > 0 && total.unpriced < total.episodes {
            notes.push(format!("cost is a lower bound: {} episodes used a model without a price", total.unpriced));
        }
        if total.cancelled > 0 {
            notes.push(format!("cancelled: {}", total.cancelled));
        }
        if self.unfinished > 0 {
            notes.push(format!(
                "unfinished: {} episodes started and never finished (the run was killed); `runner eval ... --resume {}` runs them",
                self.unfinished,
                self.run_dir.as_deref().unwrap_or(&self.run_id)
            ));
        }
        notes
    }

    /// A summary of no episodes yet, with the run's own facts; the rows of the episodes
    /// table come with [`Summary::add`], one at a time.
    pub fn begin(p: &Projection) -> Summary {
        let mut summary = Summary {
            run_id: p.run_id.clone(),
            // A run with no `run_finished` after its last start was killed.
            interrupted: p.interrupted || !p.finished,
            wall_ms: p.wall_ms,
            unfinished: p.unfinished,
            torn_last_line: p.torn_last_line,
            scoring_id: p.scoring_id.clone(),
            warnings: if p.scoring_id.is_none() { p.header.warnings.clone() } else { Vec::new() },
            ..Summary::default()
        };
        for s in &p.header.suites {
            summary.thresholds.insert(s.name.clone(), s.pass_threshold);
            summary.suites.insert(s.name.clone(), s.clone());
        }
        summary
    }

    /// Counts one episode.
    pub fn add(&mut self, e: &EpisodeRow) {
        let variant = e.variant.as_deref();
        let at = match self
            .rows
            .iter()
            .position(|r| *r.suite == *e.suite && *r.model == *e.model && r.variant.as_deref() == variant)
        {
            Some(at) => at,
            None => {
                self.rows.push(Row {
                    suite: e.suite.to_string(),
                    model: e.model.to_string(),
                    variant: variant.map(str::to_owned),
                    ..Row::default()
                });
                self.rows.len() - 1
            }
        };
        if let Outcome::Scored { score, passed } = &e.outcome {
            let key = (e.suite.to_string(), label(&e.model, variant), e.task_id.to_string());
            let tally = self.tasks.entry(key).or_default();
            tally.scores.push(*score);
            tally.passed += u64::from(*passed);
        }
        if let Some(toolset) = &e.toolset {
            let key = (e.suite.to_string(), e.model.to_string(), toolset.to_string());
            let tally = self.toolsets.entry(key).or_default();
            tally.episodes += 1;
            match &e.outcome {
                Outcome::Scored { passed: true, .. } => tally.passed += 1,
                Outcome::Scored { passed: false, .. } => tally.failed += 1,
                Outcome::Unscored { .. } => tally.unscored += 1,
                Outcome::Cancelled => {}
            }
        }
        let row = &mut self.rows[at];
        let at = |us: i64| DateTime::from_timestamp_micros(us).map(|t| t.fixed_offset());
        let (start, finish) = (at(e.started_us), at(e.finished_us));
        row.first_start = row.first_start.min(start).or(row.first_start).or(start);
        row.last_finish = row.last_finish.max(finish);
        row.episodes += 1;
        row.steps += u64::from(e.steps);
        row.tokens += e.usage.total();
        match e.cost_usd {
            Some(c) => row.cost_usd = add_cost(row.cost_usd, c),
            None => row.unpriced += 1,
        }
        match &e.outcome {
            Outcome::Scored { passed: true, .. } => row.passed += 1,
            Outcome::Scored { passed: false, .. } => row.failed += 1,
            Outcome::Unscored { cause: UnscoredCause::Budget, message } => {
                row.not_run += 1;
                self.first_budget_message.get_or_insert_with(|| message.clone());
            }
            Outcome::Unscored { cause, message } => {
                row.unscored += 1;
                *row.unscored_causes.entry(cause.clone()).or_default() += 1;
                if !message.is_empty() {
                    self.first_messages.entry(cause.clone()).or_insert_with(|| message.clone());
                }
            }
            Outcome::Cancelled => row.cancelled += 1,
        }
    }

    /// The summary as `summary.json`: per suite and model, the totals, and the epochs table.
    pub fn to_json(&self) -> serde_json::Value {
        let row = |r: &Row| {
            serde_json::json!({
                "suite": r.suite, "model": r.model, "variant": r.variant, "episodes": r.episodes, "passed": r.passed,
                "failed": r.failed, "unscored": r.unscored, "cancelled": r.cancelled,
                "not_run": r.not_run, "coverage": r.scored() as f64 / r.episodes.max(1) as f64,
                "pass_rate": r.pass_rate(), "mean_steps": r.mean_steps(), "tokens": r.tokens,
                "cost_usd": if r.unpriced == r.episodes { None } else { Some(r.cost_usd) },
                "unscored_causes": r.unscored_causes, "wall_s": r.wall_s(),
            })
        };
        let epochs: Vec<serde_json::Value> = if self.has_epochs() {
            self.epoch_rows()
                .iter()
                .map(|e| {
                    serde_json::json!({
                        "suite": e.suite, "model": e.model, "variant": e.variant, "k": e.k, "tasks": e.tasks,
                        "tasks_passed": e.tasks_passed, "pass_at_1": e.pass_at_1, "pass_at_k": e.pass_at_k,
                        "pass_hat_k": e.pass_hat_k, "task_score": e.score, "below_k_of_n": e.below_k_of_n,
                    })
                })
                .collect()
        } else {
            Vec::new()
        };
        serde_json::json!({
            "run_id": self.run_id,
            "scoring_id": self.scoring_id,
            "interrupted": self.interrupted,
            "unfinished": self.unfinished,
            "rows": self.rows.iter().map(row).collect::<Vec<_>>(),
            "total": row(&self.total()),
            "epochs": epochs,
            "noise": self.noise().iter().map(|(key, d)| serde_json::json!({
                "suite": key.suite, "model": key.model, "tasks": d.tasks, "episodes": d.episodes,
                "within_task_variance": d.within, "between_task_variance": d.between,
                "total_variance": d.total, "alpha": self.alpha(), "power": power::POWER,
                "mde": d.detectable(self.alpha()).map(|m| m.0), "mde_is_bound": d.detectable(self.alpha()).is_some_and(|m| !m.1),
            })).collect::<Vec<_>>(),
            "toolsets": self.toolsets.iter().map(|((suite, model, toolset), t)| serde_json::json!({
                "suite": suite, "model": model, "toolset": toolset, "episodes": t.episodes,
                "passed": t.passed, "failed": t.failed, "unscored": t.unscored, "pass_rate": t.pass_rate(),
            })).collect::<Vec<_>>(),
        })
    }

    /// Whether any suite ran its tasks more than once.
    pub fn has_epochs(&self) -> bool {
        self.suites.values().any(|s| s.epochs > 1 || !s.pass_k.is_empty())
    }

    /// Per suite and model: tasks over their epochs, pass@1, pass@k and pass^k (k = the
    /// suite's epochs, or fewer when fewer epochs were scored).
    pub fn epoch_rows(&self) -> Vec<EpochRow> {
        let mut rows = Vec::new();
        for r in &self.rows {
            let info = self.suites.get(&r.suite);
            let epochs = info.map_or(1, |s| s.epochs as u64);
            let reducer = info.map(|s| s.reducer).unwrap_or_default();
            let k_of_n = info.and_then(|s| s.k_of_n);
            let mut row = EpochRow {
                suite: r.suite.clone(),
                model: r.model.clone(),
                variant: r.variant.clone(),
                k: epochs,
                tasks: 0,
                tasks_passed: 0,
                pass_at_1: 0.0,
                pass_at_k: 0.0,
                pass_hat_k: 0.0,
                score: 0.0,
                below_k_of_n: Vec::new(),
            };
            let model_label = r.label();
            for ((suite, model, task), tally) in &self.tasks {
                if *suite != r.suite || *model != model_label {
                    continue;
                }
                let n = tally.scores.len() as u64;
                let c = tally.passed;
                let k = epochs.min(n);
                row.tasks += 1;
                // The task's own `pass_k` over the suite's `k_of_n`.
                let gate = info.and_then(|s| s.pass_k.get(task)).map(|p| p.k).or(k_of_n);
                let needed = gate.map_or(n / 2 + 1, u64::from);
                if c >= needed {
                    row.tasks_passed += 1;
                } else if gate.is_some() {
                    row.below_k_of_n.push(task.clone());
                }
                row.pass_at_1 += super::stats::pass_at_k(n, c, 1);
                row.pass_at_k += super::stats::pass_at_k(n, c, k);
                row.pass_hat_k += super::stats::pass_hat_k(n, c, k);
                row.score += reducer.reduce(&tally.scores);
            }
            if row.tasks > 0 {
                let t = row.tasks as f64;
                (row.pass_at_1, row.pass_at_k, row.pass_hat_k, row.score) =
                    (row.pass_at_1 / t, row.pass_at_k / t, row.pass_hat_k / t, row.score / t);
            }
            rows.push(row);
        }
        rows
    }

    pub fn total(&self) -> Row {
        let mut t = Row { suite: "total".into(), ..Row::default() };
        for r in &self.rows {
            t.episodes += r.episodes;
            t.passed += r.passed;
            t.failed += r.failed;
            t.unscored += r.unscored;
            t.cancelled += r.cancelled;
            t.not_run += r.not_run;
            t.steps += r.steps;
            t.tokens += r.tokens;
            t.cost_usd = add_cost(t.cost_usd, r.cost_usd);
            t.unpriced += r.unpriced;
            for (cause, n) in &r.unscored_causes {
                *t.unscored_causes.entry(cause.clone()).or_default() += n;
            }
        }
        t
    }

    /// The table printed at the end of a run.
    pub fn render(&self) -> String {
        let header = [
            "suite",
            "model",
            "episodes",
            "passed",
            "failed",
            "unscored",
            "pass rate",
            "coverage",
            "mean steps",
            "tokens",
            "cost",
            "wall",
        ];
        let mut lines: Vec<[String; 12]> = vec![header.map(String::from)];
        for r in &self.rows {
            lines.push([
                r.suite.clone(),
                r.label(),
                r.episodes.to_string(),
                r.passed.to_string(),
                r.failed.to_string(),
                r.unscored.to_string(),
                r.pass_rate().map_or("-".into(), |p| format!("{:.1}%", p * 100.0)),
                r.coverage(),
                format!("{:.1}", r.mean_steps()),
                r.tokens.to_string(),
                if r.unpriced == r.episodes { "-".into() } else { usd(r.cost_usd) },
                format!("{:.2}s", r.wall_s()),
            ]);
        }
        let lines: Vec<Vec<String>> = lines.into_iter().map(|l| l.to_vec()).collect();
        let mut out = table(&lines);
        if self.has_epochs() {
            out.push('\n');
            out.push_str(&self.render_epochs());
        }
        if !self.toolsets.is_empty() {
            out.push('\n');
            out.push_str(&self.render_toolsets());
        }
        if !self.tasks.is_empty() {
            out.push('\n');
            out.push_str(&self.render_noise());
        }
        for note in self.notes() {
            let _ = writeln!(out, "{note}");
        }
        for warning in &self.warnings {
            let _ = writeln!(out, "warning: {warning}");
        }
        out
    }
}

/// A model and its variant as one label: `mock [terse]`, or `mock` without a variant.
pub fn label(model: &str, variant: Option<&str>) -> String {
    match variant {
        Some(variant) => format!("{model} [{variant}]"),
        None => model.to_owned(),
    }
}

/// A message as one line of the summary: its first line, cut at `max` characters.
fn first_line(message: &str, max: usize) -> String {
    let line = message.lines().next().unwrap_or_default();
    if line.chars().count() <= max {
        line.to_owned()
    } else {
        format!("{}…", line.chars().take(max).collect::<String>())
    }
}

/// Aligned columns: the first two to the left, numbers to the right.
pub(crate) fn table(lines: &[Vec<String>]) -> String {
    let columns = lines.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| lines.iter().map(|l| l.get(c).map_or(0, |x| x.chars().count())).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for line in lines {
        for (c, cell) in line.iter().enumerate() {
            let pad = widths[c].saturating_sub(cell.chars().count());
            if c < 2 {
                let _ = write!(out, "{cell}{}  ", " ".repeat(pad));
            } else {
                let _ = write!(out, "{}{cell}  ", " ".repeat(pad));
            }
        }
        let trimmed = out.trim_end().len();
        out.truncate(trimmed);
        out.push('\n');
    }
    out
}
