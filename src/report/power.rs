//! The noise floor of a run and the power of a comparison: how much of the pass indicator's
//! spread is between epochs of one task and how much between tasks, the smallest difference
//! a paired comparison would detect, how many epochs (and tasks) a wanted difference needs,
//! and the stopping rule of `--epochs auto`. Pure arithmetic; the commands print it.
//!
//! Statistics are grouped by one key, [`CellKey`] (suite × model), made only by
//! [`cell_key`]: a new dimension (a prompt variant) is added there and nowhere else.

use super::stats::wilson_at;
use std::collections::BTreeMap;

/// The power every minimum detectable difference is computed for.
pub const POWER: f64 = 0.8;

/// What the statistics of a run are grouped by: suite × model.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CellKey {
    pub suite: String,
    pub model: String,
}

/// The one way episodes are grouped for their statistics.
pub fn cell_key(suite: &str, model: &str) -> CellKey {
    CellKey { suite: suite.to_owned(), model: model.to_owned() }
}

/// One task's scored epochs: how many, and how many passed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskCount {
    pub epochs: u64,
    pub passed: u64,
}

/// The variance decomposition of the pass indicator `y` (1 passed, 0 failed) of one cell,
/// a one-way random-effects analysis of variance with tasks as the groups.
///
/// With `T` tasks, task `t` scored `n_t` times with `c_t` passes, `N = Σ n_t`, the task's
/// rate `p_t = c_t / n_t` and the pooled rate `p = Σ c_t / N`:
///
/// - within-task (between epochs of one task): `σ²_w = SS_w / (N − T)`, where
///   `SS_w = Σ_t Σ_e (y − p_t)² = Σ_t c_t (n_t − c_t) / n_t`; unknown when no task has two
///   epochs (`N = T`).
/// - between tasks: `σ²_b = max(0, (MS_b − σ²_w) / n_0)` with
///   `MS_b = Σ_t n_t (p_t − p)² / (T − 1)` and `n_0 = (N − Σ n_t² / N) / (T − 1)` (`= n`
///   when every task has `n` epochs); unknown with fewer than two tasks or no `σ²_w`.
/// - total: `p (1 − p)`, the spread of one episode's verdict about the pooled rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decomposition {
    pub tasks: u64,
    pub episodes: u64,
    pub pass_rate: f64,
    pub within: Option<f64>,
    pub between: Option<f64>,
    pub total: f64,
}

impl Decomposition {
    /// `None` when no episode was scored.
    pub fn of(tasks: &[TaskCount]) -> Option<Decomposition> {
        let tasks: Vec<TaskCount> = tasks.iter().copied().filter(|t| t.epochs > 0).collect();
        let t = tasks.len() as u64;
        let n: u64 = tasks.iter().map(|t| t.epochs).sum();
        if n == 0 {
            return None;
        }
        let c: u64 = tasks.iter().map(|t| t.passed).sum();
        let p = c as f64 / n as f64;
        let ss_within: f64 =
            tasks.iter().map(|t| t.passed as f64 * (t.epochs - t.passed) as f64 / t.epochs as f64).sum();
        let within = (n > t).then(|| ss_within / (n - t) as f64);
        let between = within.filter(|_| t >= 2).map(|within| {
            let ms_between: f64 =
                tasks.iter().map(|k| k.epochs as f64 * (k.passed as f64 / k.epochs as f64 - p).powi(2)).sum::<f64>()
                    / (t - 1) as f64;
            let sum_sq: f64 = tasks.iter().map(|k| (k.epochs * k.epochs) as f64).sum();
            let n0 = (n as f64 - sum_sq / n as f64) / (t - 1) as f64;
            ((ms_between - within) / n0).max(0.0)
        });
        Some(Decomposition { tasks: t, episodes: n, pass_rate: p, within, between, total: p * (1.0 - p) })
    }

    /// Scored epochs per task, on average.
    pub fn epochs_per_task(&self) -> f64 {
        if self.tasks == 0 { 0.0 } else { self.episodes as f64 / self.tasks as f64 }
    }

    /// The within-task variance, or, when one epoch cannot tell it apart, its upper bound:
    /// the total (the second value says which).
    pub fn within_or_bound(&self) -> (f64, bool) {
        match self.within {
            Some(w) => (w, true),
            None => (self.total, false),
        }
    }

    /// The noise floor: the minimum detectable difference, in pass rate, of a paired
    /// comparison of this cell with another run of the same tasks and epochs whose task
    /// effects are the same (a rerun, or a change that moves every task alike), two-sided at
    /// `alpha` with 80 % power:
    ///
    /// `MDE = (z_{1−α/2} + z_{0.8}) · √(2 σ²_w / (n T))`
    ///
    /// The difference of the two runs' pass rates over `T` tasks of `n` epochs is a mean of
    /// `T` task differences, each the difference of two means of `n` epochs: its variance is
    /// `2 σ²_w / (n T)`; pairing by task removes the between-task part. Any comparison of
    /// models that do not find the same tasks hard has more variance, so this is the least a
    /// paired comparison of this size can resolve. With one epoch `σ²_w` is unknown and
    /// its bound, the total, gives an upper bound (`exact` false).
    pub fn mde(&self, alpha: f64) -> Option<(f64, bool)> {
        let (within, exact) = self.within_or_bound();
        let n = self.epochs_per_task();
        (self.tasks > 0).then(|| (z_sum(alpha) * (2.0 * within / (n * self.tasks as f64)).sqrt(), exact))
    }

    /// What the gate's test can resolve: the larger of [`Decomposition::mde`] and the
    /// [`mcnemar_floor`] of this many tasks; `None` when the tasks are too few for the exact
    /// McNemar test to reject at all. The flag is `mde`'s (false: an upper bound).
    pub fn detectable(&self, alpha: f64) -> Option<(f64, bool)> {
        let floor = mcnemar_floor(self.tasks, alpha)?;
        self.mde(alpha).map(|(mde, exact)| (mde.max(floor), exact))
    }

    /// What a comparison able to detect `delta` (a fraction of pass rate) needs, from this
    /// cell's variances. Solving the [`Decomposition::mde`] formula for `n` and for `T`:
    /// `n T ≥ 2 σ²_w (z_{1−α/2} + z_{0.8})² / δ²`. Also, for a comparison whose task
    /// effects are independent (different tasks, or models that find different tasks hard),
    /// the tasks it needs at the current epochs: `T ≥ 2 (σ²_b + σ²_w / n) z² / δ²`. Tasks
    /// are at least what the [`mcnemar_floor`] of `delta` needs; epochs cannot lower that
    /// floor, so with too few tasks no number of epochs is enough (`epochs` is `None`).
    pub fn plan(&self, delta: f64, alpha: f64) -> Plan {
        let (within, exact) = self.within_or_bound();
        let z2 = z_sum(alpha).powi(2);
        let episodes_per_arm = 2.0 * within * z2 / (delta * delta);
        let n = self.epochs_per_task().max(1.0);
        let t = (self.tasks.max(1)) as f64;
        let floor_tasks = tasks_for_floor(delta, alpha);
        let unpaired =
            self.between.map(|b| ((2.0 * (b + within / n) * z2 / (delta * delta)).ceil() as u64).max(floor_tasks));
        let enough_tasks = mcnemar_floor(self.tasks, alpha).is_some_and(|floor| floor <= delta);
        Plan {
            epochs: enough_tasks.then(|| (episodes_per_arm / t).ceil().max(1.0) as u64),
            tasks: ((episodes_per_arm / n).ceil() as u64).max(floor_tasks),
            tasks_unpaired: unpaired,
            exact,
        }
    }
}

/// The smallest `k` with `2 · 0.5^k < alpha`: the fewest discordant tasks, all one way, with
/// which the exact two-sided McNemar test rejects.
pub fn mcnemar_min_discordant(alpha: f64) -> u64 {
    let mut k = 1;
    while 2.0 * 0.5_f64.powi(k as i32) >= alpha && k < 2000 {
        k += 1;
    }
    k
}

/// The least drop the exact McNemar test on `tasks` task verdicts detects with 80 % power
/// even without any noise. A drop of `δ` makes each task fail with chance `δ` (all flips one
/// way); the test rejects once `k` tasks flipped (the fewest with `2 · 0.5^k < α`), so its
/// power is `P(Binomial(T, δ) ≥ k)`; the floor is the `δ` where that reaches 80 %, found by
/// bisection. `None` when `T < k`: nothing could be detected. (`T = 6`, `α = 0.05`: `k = 6`,
/// power `δ⁶`, floor `0.8^{1/6} = 0.9635`.)
pub fn mcnemar_floor(tasks: u64, alpha: f64) -> Option<f64> {
    let k = mcnemar_min_discordant(alpha);
    if tasks < k {
        return None;
    }
    let power = |delta: f64| binomial_at_least(tasks, delta, k);
    let (mut low, mut high) = (0.0_f64, 1.0_f64);
    for _ in 0..60 {
        let mid = 0.5 * (low + high);
        if power(mid) >= POWER {
            high = mid;
        } else {
            low = mid;
        }
    }
    Some(high)
}

/// The fewest tasks whose [`mcnemar_floor`] is at most `delta`.
fn tasks_for_floor(delta: f64, alpha: f64) -> u64 {
    let fits = |t: u64| mcnemar_floor(t, alpha).is_some_and(|floor| floor <= delta);
    let mut high = mcnemar_min_discordant(alpha).max(1);
    while !fits(high) && high < 1 << 40 {
        high *= 2;
    }
    let mut low = high / 2;
    while low + 1 < high {
        let mid = low + (high - low) / 2;
        if fits(mid) { high = mid } else { low = mid }
    }
    high
}

/// `P(X ≥ k)` for `X ~ Binomial(n, p)`, as one minus the first `k` terms (k is small).
fn binomial_at_least(n: u64, p: f64, k: u64) -> f64 {
    if p <= 0.0 {
        return if k == 0 { 1.0 } else { 0.0 };
    }
    if p >= 1.0 {
        return if k <= n { 1.0 } else { 0.0 };
    }
    let nf = n as f64;
    let below: f64 = (0..k.min(n + 1))
        .map(|i| {
            let i = i as f64;
            let log = libm::lgamma(nf + 1.0) - libm::lgamma(i + 1.0) - libm::lgamma(nf - i + 1.0)
                + i * p.ln()
                + (nf - i) * (-p).ln_1p();
            log.exp()
        })
        .sum();
    (1.0 - below).clamp(0.0, 1.0)
}

/// What [`Decomposition::plan`] finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Epochs per task with the run's tasks; `None` when the run has too few tasks for any
    /// number of epochs.
    pub epochs: Option<u64>,
    /// Tasks with the run's epochs per task.
    pub tasks: u64,
    /// Tasks at the run's epochs when the two sides' task effects are independent; unknown
    /// without the between-task variance.
    pub tasks_unpaired: Option<u64>,
    /// False when one epoch per task left the within-task variance unknown and its upper
    /// bound was used: the numbers are then upper bounds too.
    pub exact: bool,
}

/// `z_{1−α/2} + z_{POWER}`, the multiplier of a standard error in a minimum detectable
/// difference.
pub fn z_sum(alpha: f64) -> f64 {
    normal_quantile(1.0 - alpha / 2.0) + normal_quantile(POWER)
}

/// The standard normal distribution function, `Φ(x) = erfc(−x / √2) / 2`.
pub fn normal_cdf(x: f64) -> f64 {
    0.5 * libm::erfc(-x / std::f64::consts::SQRT_2)
}

/// `Φ⁻¹(p)`, by bisection on [`normal_cdf`] (exact to the last bits of an f64 in 200
/// halvings of `[−40, 40]`); ±∞ at 0 and 1, NaN outside.
pub fn normal_quantile(p: f64) -> f64 {
    if !(0.0..=1.0).contains(&p) {
        return f64::NAN;
    }
    if p == 0.0 {
        return f64::NEG_INFINITY;
    }
    if p == 1.0 {
        return f64::INFINITY;
    }
    let (mut low, mut high) = (-40.0_f64, 40.0_f64);
    for _ in 0..200 {
        let mid = 0.5 * (low + high);
        if normal_cdf(mid) < p {
            low = mid;
        } else {
            high = mid;
        }
    }
    0.5 * (low + high)
}

/// The paired comparison of two groups by task: the minimum detectable difference from the
/// observed spread of the per-task differences.
///
/// With `d_t` the difference (B − A) of task `t`'s pass rates over its shared epochs and
/// `s²_d` their sample variance over the `T` shared tasks,
/// `MDE = (z_{1−α/2} + z_{0.8}) · √(max(s²_d, floor) / T)`, where `floor` is the epoch
/// noise of both sides, `(σ²_w,A + σ²_w,B) / n`, so that a handful of identical tasks does
/// not claim a precision their epochs cannot have. `None` with fewer than two tasks.
pub fn paired_mde(diffs: &[f64], epoch_floor: f64, alpha: f64) -> Option<f64> {
    let t = diffs.len();
    if t < 2 {
        return None;
    }
    let mean = diffs.iter().sum::<f64>() / t as f64;
    let var = diffs.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / (t - 1) as f64;
    Some(z_sum(alpha) * (var.max(epoch_floor) / t as f64).sqrt())
}

/// Whether the exact two-sided McNemar test on `tasks` tasks can reach `p < alpha` at all:
/// its smallest p-value, every task discordant the same way, is `2 · 0.5^T`.
pub fn mcnemar_can_reject(tasks: u64, alpha: f64) -> bool {
    let smallest = 2.0 * 0.5_f64.powi(tasks.min(2000) as i32);
    smallest < alpha
}

/// Per cell, its tasks' counts: the input of [`Decomposition::of`].
pub type Cells = BTreeMap<CellKey, BTreeMap<String, TaskCount>>;

/// Counts one scored episode into `cells`.
pub fn count(cells: &mut Cells, key: CellKey, task: &str, passed: bool) {
    let t = cells.entry(key).or_default().entry(task.to_owned()).or_default();
    t.epochs += 1;
    t.passed += u64::from(passed);
}

/// Each cell's decomposition, in key order.
pub fn decompose(cells: &Cells) -> Vec<(CellKey, Decomposition)> {
    cells
        .iter()
        .filter_map(|(key, tasks)| {
            let counts: Vec<TaskCount> = tasks.values().copied().collect();
            Decomposition::of(&counts).map(|d| (key.clone(), d))
        })
        .collect()
}

/// The stopping rule of `--epochs auto`: after each epoch (a "look"), the interval of the
/// cell's pass rate is a Wilson interval at level `1 − α / K`, where `K` is `--max-epochs`,
/// the most looks there can be (alpha spending by Bonferroni over a fixed sequence of
/// looks). Epochs stop when its width is at most `--ci-width` or `K` epochs ran.
///
/// Why the interval stays valid: the chance that any one look's interval misses the true
/// rate is at most `α / K`, so the chance that some look's misses is at most `α` (the union
/// bound). The look one stops at is one of them, whichever rule picked it, so its interval
/// misses with a chance of at most `α`: coverage `≥ 1 − α` whatever the data made the run
/// stop. A plain 95 % interval at each look would not keep that: stopping when it happens
/// to be narrow favours the looks where it misses.
///
/// The Wilson interval treats the cell's `N` episodes as independent; epochs of one task
/// share its difficulty, and for the rate over the suite's own tasks that heterogeneity
/// only lowers the variance below `p (1 − p) / N`, so the interval is conservative.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoppingRule {
    pub ci_width: f64,
    pub max_epochs: u32,
    pub alpha: f64,
}

/// What the rule says after a look.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Look {
    pub low: f64,
    pub high: f64,
    /// The interval's confidence level, `1 − α / K`.
    pub level: f64,
    pub decision: Decision,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Another epoch of every task.
    Continue,
    /// The interval is as narrow as asked.
    Narrow,
    /// `--max-epochs` epochs ran.
    MaxEpochs,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Continue => "continue",
            Decision::Narrow => "stop_narrow",
            Decision::MaxEpochs => "stop_max_epochs",
        }
    }
}

impl StoppingRule {
    /// The look after `epoch` epochs with `passed` of `scored` episodes passing.
    pub fn look(&self, epoch: u32, passed: u64, scored: u64) -> Look {
        let level = 1.0 - self.alpha / f64::from(self.max_epochs.max(1));
        let z = normal_quantile(1.0 - (1.0 - level) / 2.0);
        let (low, high) = wilson_at(passed, scored, z).unwrap_or((0.0, 1.0));
        let decision = if high - low <= self.ci_width {
            Decision::Narrow
        } else if epoch >= self.max_epochs {
            Decision::MaxEpochs
        } else {
            Decision::Continue
        };
        Look { low, high, level, decision }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    fn counts(list: &[(u64, u64)]) -> Vec<TaskCount> {
        list.iter().map(|&(epochs, passed)| TaskCount { epochs, passed }).collect()
    }

    #[test]
    fn the_normal_quantiles_are_the_tabled_ones() {
        // Φ⁻¹(0.975) = 1.959963984540054, Φ⁻¹(0.8) = 0.8416212335729143 (scipy.stats.norm.ppf).
        assert!(close(normal_quantile(0.975), 1.959963984540054, 1e-12));
        assert!(close(normal_quantile(0.8), 0.8416212335729143, 1e-12));
        assert!(close(normal_quantile(0.5), 0.0, 1e-12));
        assert!(close(normal_quantile(0.0025), -2.807033768343811, 1e-10));
        assert!(normal_quantile(1.5).is_nan());
    }

    #[test]
    fn the_decomposition_of_a_small_fixture_is_the_hand_computed_one() {
        // Four tasks of two epochs: [1,0], [1,1], [0,0], [1,0]. N = 8, T = 4, p = 4/8 = 0.5.
        // SS_w = 1·1/2 + 2·0/2 + 0·2/2 + 1·1/2 = 1; σ²_w = 1 / (8 − 4) = 0.25.
        // MS_b = (2·0² + 2·0.5² + 2·0.5² + 2·0²) / 3 = 1/3; n0 = (8 − 16/8) / 3 = 2;
        // σ²_b = (1/3 − 1/4) / 2 = 1/24 = 0.041666…; total = 0.5 · 0.5 = 0.25.
        let d = Decomposition::of(&counts(&[(2, 1), (2, 2), (2, 0), (2, 1)])).unwrap();
        assert_eq!((d.tasks, d.episodes), (4, 8));
        assert!(close(d.pass_rate, 0.5, 1e-15));
        assert!(close(d.within.unwrap(), 0.25, 1e-15));
        assert!(close(d.between.unwrap(), 1.0 / 24.0, 1e-15));
        assert!(close(d.total, 0.25, 1e-15));
        // MDE at α = 0.05: (1.959964 + 0.841621) · √(2 · 0.25 / (2 · 4)) = 2.801585 · 0.25.
        let (mde, exact) = d.mde(0.05).unwrap();
        assert!(exact);
        assert!(close(mde, 2.801585218112968 * 0.25, 1e-9), "{mde}");
    }

    #[test]
    fn unequal_epochs_use_the_weighted_n0() {
        // Tasks [1,1,1] and [0,1]: N = 5, T = 2, p = 4/5 = 0.8.
        // SS_w = 0 + 1·1/2 = 0.5; σ²_w = 0.5 / 3 = 1/6.
        // MS_b = 3·(1 − 0.8)² + 2·(0.5 − 0.8)² = 0.12 + 0.18 = 0.30 (over T − 1 = 1).
        // n0 = (5 − (9 + 4)/5) / 1 = 2.4; σ²_b = (0.30 − 1/6) / 2.4 = 0.0555…
        let d = Decomposition::of(&counts(&[(3, 3), (2, 1)])).unwrap();
        assert!(close(d.within.unwrap(), 1.0 / 6.0, 1e-15));
        assert!(close(d.between.unwrap(), (0.30 - 1.0 / 6.0) / 2.4, 1e-12));
        // Between-task variance below zero by sampling is reported as 0.
        let d = Decomposition::of(&counts(&[(2, 1), (2, 1)])).unwrap();
        assert_eq!(d.between, Some(0.0));
    }

    #[test]
    fn one_epoch_cannot_separate_the_components_and_says_so() {
        // Four tasks of one epoch, two passed: p = 0.5, total 0.25, within unknown.
        let d = Decomposition::of(&counts(&[(1, 1), (1, 0), (1, 1), (1, 0)])).unwrap();
        assert_eq!((d.within, d.between), (None, None));
        // The bound: 2.801585 · √(2 · 0.25 / (1 · 4)) = 2.801585 · 0.353553 = 0.990510.
        let (mde, exact) = d.mde(0.05).unwrap();
        assert!(!exact);
        assert!(close(mde, 2.801585218112968 * (0.125f64).sqrt(), 1e-9), "{mde}");
        assert_eq!(Decomposition::of(&[]), None);
    }

    #[test]
    fn a_plan_solves_the_mde_formula_for_epochs_and_tasks() {
        // σ²_w = 0.25, T = 4, n = 2 (the first fixture); δ = 0.05, α = 0.05:
        // n T ≥ 2 · 0.25 · 2.801585² / 0.05² = 0.5 · 7.848879 / 0.0025 = 1569.78 → episodes
        // per side 1569.78; epochs with 4 tasks ⌈392.44⌉ = 393; tasks with 2 epochs ⌈784.89⌉ = 785.
        // Independent task effects: T ≥ 2 (1/24 + 0.25/2) z² / δ² = 0.333… · 7.848879 / 0.0025
        // = 1046.52 → 1047.
        let d = Decomposition::of(&counts(&[(2, 1), (2, 2), (2, 0), (2, 1)])).unwrap();
        let plan = d.plan(0.05, 0.05);
        // Four tasks are fewer than the six the McNemar test needs: no number of epochs helps.
        assert_eq!(plan, Plan { epochs: None, tasks: 785, tasks_unpaired: Some(1047), exact: true });
        // δ = 1: n T ≥ 0.5 · 7.848879 / 1 = 3.92 → 2 tasks of 2 epochs, but six tasks at least.
        let plan = d.plan(1.0, 0.05);
        assert_eq!((plan.epochs, plan.tasks), (None, 6));
        // Eight such tasks (the integration test's): σ²_w = 2 / 8 = 0.25; MS_b = 2 · 4 · 0.25
        // / 7 = 2/7; n0 = (16 − 32/16) / 7 = 2; σ²_b = (2/7 − 1/4) / 2 = 1/56. 1569.78
        // episodes a side are ⌈196.2⌉ = 197 epochs, but the McNemar floor of 8 tasks (about
        // 0.80) is above 0.05: epochs cannot do it. Independent: 2 (1/56 + 0.25/2) · 7.848879
        // / 0.0025 = 897.0 → 898.
        let eight = Decomposition::of(&counts(&[(2, 1), (2, 2), (2, 0), (2, 1), (2, 1), (2, 2), (2, 0), (2, 1)]));
        let plan = eight.unwrap().plan(0.05, 0.05);
        assert_eq!((plan.epochs, plan.tasks, plan.tasks_unpaired), (None, 785, Some(898)));
        // 200 tasks: the floor is below 0.05, so epochs can: 1569.78 / 200 → 8 epochs.
        let many: Vec<(u64, u64)> = (0..200).map(|i| (2, [1, 2, 0, 1][i % 4])).collect();
        let plan = Decomposition::of(&counts(&many)).unwrap().plan(0.05, 0.05);
        assert_eq!(plan.epochs, Some(8));
    }

    #[test]
    fn the_paired_mde_uses_the_spread_of_task_differences() {
        // Differences 0, −0.5, 0.5, 0: mean 0, s² = (0.25 + 0.25) / 3 = 1/6, T = 4:
        // MDE = 2.801585 · √(1/6 / 4) = 2.801585 · 0.204124 = 0.571870.
        let mde = paired_mde(&[0.0, -0.5, 0.5, 0.0], 0.0, 0.05).unwrap();
        assert!(close(mde, 2.801585218112968 * (1.0f64 / 24.0).sqrt(), 1e-9), "{mde}");
        // Identical tasks claim no precision beyond their epochs' noise.
        let floor = paired_mde(&[0.0; 4], 0.25, 0.05).unwrap();
        assert!(close(floor, 2.801585218112968 * 0.25, 1e-9));
        assert_eq!(paired_mde(&[0.1], 0.0, 0.05), None);
    }

    #[test]
    fn the_mcnemar_floor_is_the_drop_flipping_enough_tasks_with_80_percent_power() {
        // T = 6, α = 0.05: all six must flip, power δ⁶ = 0.8 at δ = 0.8^(1/6) = 0.963492.
        assert!(close(mcnemar_floor(6, 0.05).unwrap(), 0.8f64.powf(1.0 / 6.0), 1e-12));
        assert_eq!(mcnemar_floor(5, 0.05), None);
        // T = 8: P(X ≥ 6) = 28 δ⁶ (1−δ)² + 8 δ⁷ (1−δ) + δ⁸; at δ = 0.8 that is
        // 0.29360 + 0.33554 + 0.16777 = 0.79691, just under 0.8: the floor is a little above.
        let floor = mcnemar_floor(8, 0.05).unwrap();
        assert!(floor > 0.8 && floor < 0.81, "{floor}");
        assert!(close(binomial_at_least(8, 0.8, 6), 0.796_918_4, 1e-6));
    }

    #[test]
    fn mcnemar_needs_six_tasks_to_reject_at_five_percent() {
        // 2 · 0.5^5 = 0.0625 ≥ 0.05; 2 · 0.5^6 = 0.03125 < 0.05.
        assert!(!mcnemar_can_reject(5, 0.05));
        assert!(mcnemar_can_reject(6, 0.05));
    }

    /// The stopping rule's coverage, by a seeded simulation: 20 tasks whose true pass
    /// probabilities are drawn once (uniform in [0.2, 0.95]), `--ci-width 0.25 --max-epochs
    /// 10` at α = 0.05, 2000 runs of the rule. The parameter is the tasks' mean
    /// probability. The rule's interval at its stop must cover it in at least 95 % of runs
    /// less three Monte-Carlo standard errors (√(0.95 · 0.05 / 2000) = 0.0049): the band
    /// is coverage ≥ 0.935. Most runs stop before the tenth epoch (width 0.25 needs about
    /// 125 episodes at level 1 − 0.05/10), so the stopping is data-dependent.
    #[test]
    fn the_stopping_rule_keeps_its_coverage_in_a_seeded_simulation() {
        let mut rng = fastrand::Rng::with_seed(23);
        let probabilities: Vec<f64> = (0..20).map(|_| 0.2 + 0.75 * rng.f64()).collect();
        let truth = probabilities.iter().sum::<f64>() / probabilities.len() as f64;
        let rule = StoppingRule { ci_width: 0.25, max_epochs: 10, alpha: 0.05 };
        let runs = 2000;
        let (mut covered, mut stopped_early) = (0, 0);
        for _ in 0..runs {
            let (mut passed, mut scored) = (0u64, 0u64);
            for epoch in 1..=rule.max_epochs {
                for p in &probabilities {
                    scored += 1;
                    passed += u64::from(rng.f64() < *p);
                }
                let look = rule.look(epoch, passed, scored);
                if look.decision != Decision::Continue {
                    covered += u64::from(look.low <= truth && truth <= look.high);
                    stopped_early += u64::from(look.decision == Decision::Narrow && epoch < rule.max_epochs);
                    break;
                }
            }
        }
        let coverage = covered as f64 / runs as f64;
        assert!(coverage >= 0.935, "coverage {coverage}");
        assert!(stopped_early > runs / 2, "the rule should stop early in most runs: {stopped_early}");
    }

    #[test]
    fn a_look_stops_when_narrow_or_at_the_maximum() {
        let rule = StoppingRule { ci_width: 0.05, max_epochs: 3, alpha: 0.05 };
        let look = rule.look(1, 5, 10);
        assert_eq!(look.decision, Decision::Continue);
        assert!(close(look.level, 1.0 - 0.05 / 3.0, 1e-15));
        assert_eq!(rule.look(3, 5, 30).decision, Decision::MaxEpochs);
        assert_eq!(rule.look(1, 100_000, 100_000).decision, Decision::Narrow);
    }
}
