//! Pure statistics for reports.
//!
//! Unbiased estimators over a task's epochs: with `n` scored samples of which `c` passed,
//! pass@k is the chance that at least one of k samples passes, pass^k that all k do.
//!
//! For comparing runs: the Wilson score interval for a pass rate, the exact McNemar test on
//! discordant pass/fail pairs, a seeded paired bootstrap on per-episode differences, and a
//! numpy-compatible linear-interpolation quantile. None of these panic: degenerate inputs give
//! `None` or a p-value of 1.0, as documented on each function.

/// `1 - C(n-c, k) / C(n, k)`, computed as a product so it never overflows.
pub fn pass_at_k(n: u64, c: u64, k: u64) -> f64 {
    if k == 0 || n == 0 || k > n {
        return 0.0;
    }
    if n - c < k {
        return 1.0;
    }
    1.0 - ((n - c + 1)..=n).map(|i| 1.0 - k as f64 / i as f64).product::<f64>()
}

/// `C(c, k) / C(n, k)`.
pub fn pass_hat_k(n: u64, c: u64, k: u64) -> f64 {
    if k == 0 || n == 0 || k > n || c < k {
        return 0.0;
    }
    (0..k).map(|i| (c - i) as f64 / (n - i) as f64).product()
}

/// The two-sided 95% standard-normal quantile, `Φ⁻¹(0.975)`.
const Z_95: f64 = 1.959963984540054;

/// The 95% (z = 1.959963984540054) Wilson score interval for `passed` successes out of `n`; None when n == 0.
///
/// The interval is the set of true pass rates `p` for which the observed rate is within `z` standard
/// errors (computed at `p`, not at the observed rate), so unlike the normal "Wald" interval it stays
/// inside `[0, 1]` and is sensible for 0 or `n` passes. Also None when `passed > n` (not a proportion).
pub fn wilson(passed: u64, n: u64) -> Option<(f64, f64)> {
    wilson_at(passed, n, Z_95)
}

/// The Wilson score interval for `passed` of `n` at `z` standard errors; `None` when
/// `n == 0` or `passed > n`.
pub fn wilson_at(passed: u64, n: u64, z: f64) -> Option<(f64, f64)> {
    if n == 0 || passed > n {
        return None;
    }
    let n = n as f64;
    let p = passed as f64 / n;
    let z2 = z * z;
    let denom = 1.0 + z2 / n;
    let center = (p + z2 / (2.0 * n)) / denom;
    let half = z / denom * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    Some(((center - half).clamp(0.0, 1.0), (center + half).clamp(0.0, 1.0)))
}

/// Exact two-sided McNemar test on discordant pairs: b = pairs passing only in A, c = only in B.
/// p = min(1, 2 * P[X <= min(b,c)]) with X ~ Binomial(b + c, 0.5); p = 1.0 when b + c == 0.
///
/// Under the null hypothesis that A and B pass equally often, each discordant pair is equally likely
/// to favour either side, so a small p means the split between `b` and `c` is too lopsided for chance.
/// For p = 0.5 this equals `scipy.stats.binomtest(min(b, c), b + c, 0.5).pvalue`.
///
/// Numerics: the point probability `P[X = min(b, c)]` is computed in log space with Loader's
/// saddle-point formula (as R's `dbinom` does), which is accurate to a few ulps for any `b + c`; the
/// tail is then summed downwards by the exact ratio `P[X = k - 1] / P[X = k] = k / (n - k + 1)`, which
/// only ever shrinks, until the remaining terms cannot change the sum. The work is
/// `O(min(min(b, c), sqrt(b + c)))`, so b + c in the millions is instant. Results whose true value is
/// below ~1e-308 underflow to 0.0. Exact up to b + c = 2^40 (~1.1e12 pairs); above that, the counts
/// are rescaled to b + c = 2^40 at the same z-score, a close approximation that keeps the cost ~10 ms.
pub fn mcnemar_exact(b: u64, c: u64) -> f64 {
    let m = b.min(c);
    let n = b as f64 + c as f64;
    if b == c || n == 0.0 {
        return 1.0;
    }
    let (mut m, mut n) = (m as f64, n);
    if n > EXACT_MCNEMAR_LIMIT {
        // Beyond any realistic count (and beyond exact f64 integers near 2^53), keep the work bounded:
        // move to n = 2^40 with the same z-score (n/2 - m) / sqrt(n), where the binomial is already
        // normal to ~1e-6 relative, instead of summing O(sqrt(n)) terms.
        let shortfall = (0.5 * n - m) * (EXACT_MCNEMAR_LIMIT / n).sqrt();
        n = EXACT_MCNEMAR_LIMIT;
        m = (0.5 * n - shortfall).round().max(0.0);
        if 2.0 * m >= n {
            return 1.0;
        }
    }
    let log_point = log_binomial_half_pmf(m, n);
    // Sum P[X = k] / P[X = m] for k = m, m - 1, ..., 0; every ratio is <= 1 because m < n / 2.
    let mut term = 1.0_f64;
    let mut sum = 1.0_f64;
    let mut k = m;
    while k > 0.0 {
        term *= k / (n - k + 1.0);
        sum += term;
        if term < sum * 1e-17 {
            break;
        }
        k -= 1.0;
    }
    (2.0 * (log_point + sum.ln()).exp()).min(1.0)
}

/// Largest `b + c` for which [`mcnemar_exact`] sums the exact tail (2^40).
const EXACT_MCNEMAR_LIMIT: f64 = 1_099_511_627_776.0;

/// `ln P[X = k]` for `X ~ Binomial(n, 0.5)` with `0 <= k <= n` (whole numbers passed as f64), by
/// Loader (2000), "Fast and accurate computation of binomial probabilities".
fn log_binomial_half_pmf(k: f64, n: f64) -> f64 {
    if k == 0.0 || k == n {
        return -n * std::f64::consts::LN_2;
    }
    let half_n = 0.5 * n;
    let lc = stirling_error(n) - stirling_error(k) - stirling_error(n - k) - bd0(k, half_n) - bd0(n - k, half_n);
    let lf = (2.0 * std::f64::consts::PI).ln() + k.ln() + (-k / n).ln_1p();
    lc - 0.5 * lf
}

/// `ln(n!) - ln(sqrt(2πn) (n/e)^n)` for a whole number `n >= 1`: the error of Stirling's formula.
fn stirling_error(n: f64) -> f64 {
    const S0: f64 = 1.0 / 12.0;
    const S1: f64 = 1.0 / 360.0;
    const S2: f64 = 1.0 / 1260.0;
    const S3: f64 = 1.0 / 1680.0;
    const S4: f64 = 1.0 / 1188.0;
    if n <= 15.0 {
        // Small enough to evaluate directly: ln(n!) as a sum of at most 15 logarithms.
        let mut ln_fact = 0.0;
        let mut i = 2.0;
        while i <= n {
            ln_fact += f64::ln(i);
            i += 1.0;
        }
        return ln_fact - 0.5 * (2.0 * std::f64::consts::PI * n).ln() - n * n.ln() + n;
    }
    let nn = n * n;
    if n > 500.0 {
        (S0 - S1 / nn) / n
    } else if n > 80.0 {
        (S0 - (S1 - S2 / nn) / nn) / n
    } else if n > 35.0 {
        (S0 - (S1 - (S2 - S3 / nn) / nn) / nn) / n
    } else {
        (S0 - (S1 - (S2 - (S3 - S4 / nn) / nn) / nn) / nn) / n
    }
}

/// The deviance term `x ln(x / np) + np - x`, computed without cancellation when `x` is near `np`.
fn bd0(x: f64, np: f64) -> f64 {
    if (x - np).abs() < 0.1 * (x + np) {
        let mut v = (x - np) / (x + np);
        let mut s = (x - np) * v;
        let mut ej = 2.0 * x * v;
        v *= v;
        for j in 1..1000 {
            ej *= v;
            let s1 = s + ej / f64::from(2 * j + 1);
            if s1 == s {
                return s1;
            }
            s = s1;
        }
        return s;
    }
    x * (x / np).ln() + np - x
}

/// Result of a paired bootstrap on per-pair differences (B minus A).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bootstrap {
    /// The observed mean difference (B minus A) over the finite diffs.
    pub mean_diff: f64,
    /// The 2.5th percentile of the resampled means.
    pub low: f64,
    /// The 97.5th percentile of the resampled means.
    pub high: f64,
    /// Two-sided bootstrap p-value for "the mean difference is zero"; never exactly 0, at most 1.
    pub p_value: f64,
}

/// Paired bootstrap over `diffs` (one difference per shared episode): `resamples` resamples with
/// replacement, a fixed `seed` so results are reproducible (fastrand::Rng::with_seed). 95% percentile
/// interval of the resampled means; two-sided p-value = the fraction of resampled means on the other
/// side of zero from the observed mean, doubled, capped at 1 (use the standard "(count + 1) / (resamples + 1)"
/// correction so p is never exactly 0). None when diffs is empty. When all diffs are 0, p = 1.0.
///
/// Details: a resampled mean exactly at zero counts as "on the other side". Non-finite diffs (NaN,
/// ±inf) are ignored; None when no finite diff remains, or when `resamples == 0`. When the observed
/// mean is exactly 0, p = 1.0. The interval endpoints are [`quantile`]s (numpy "linear") at 0.025 and
/// 0.975 of the resampled means.
///
/// Choosing `resamples`: the smallest attainable p is `2 / (resamples + 1)`, and the Monte Carlo
/// error of the interval endpoints shrinks like `1 / sqrt(resamples)`. 2_000 is a good default
/// (p resolution ~0.001, endpoints stable to a few percent of the interval width); use 10_000 when a
/// p-value near a significance threshold matters. Cost is `resamples * diffs.len()` random draws,
/// roughly 1 ns each in release builds, with one allocation of `resamples` floats in total.
pub fn paired_bootstrap(diffs: &[f64], resamples: u32, seed: u64) -> Option<Bootstrap> {
    let finite: std::borrow::Cow<[f64]> = if diffs.iter().all(|d| d.is_finite()) {
        std::borrow::Cow::Borrowed(diffs)
    } else {
        std::borrow::Cow::Owned(diffs.iter().copied().filter(|d| d.is_finite()).collect())
    };
    let diffs: &[f64] = &finite;
    let n = diffs.len();
    if n == 0 || resamples == 0 {
        return None;
    }
    let inv_n = 1.0 / n as f64;
    let mean_diff = diffs.iter().sum::<f64>() * inv_n;

    let mut rng = fastrand::Rng::with_seed(seed);
    let mut means = Vec::with_capacity(resamples as usize);
    for _ in 0..resamples {
        // Four accumulators break the floating-point add dependency chain in this hot loop.
        let mut acc = [0.0_f64; 4];
        let mut left = n;
        while left >= 4 {
            acc[0] += diffs[rng.usize(..n)];
            acc[1] += diffs[rng.usize(..n)];
            acc[2] += diffs[rng.usize(..n)];
            acc[3] += diffs[rng.usize(..n)];
            left -= 4;
        }
        for slot in acc.iter_mut().take(left) {
            *slot += diffs[rng.usize(..n)];
        }
        means.push(((acc[0] + acc[1]) + (acc[2] + acc[3])) * inv_n);
    }
    means.sort_unstable_by(f64::total_cmp);
    let low = sorted_quantile(&means, 0.025).unwrap_or(mean_diff);
    let high = sorted_quantile(&means, 0.975).unwrap_or(mean_diff);

    let p_value = if mean_diff == 0.0 || mean_diff.is_nan() {
        1.0
    } else {
        let other_side = if mean_diff > 0.0 {
            means.iter().filter(|&&m| m <= 0.0).count()
        } else {
            means.iter().filter(|&&m| m >= 0.0).count()
        };
        (2.0 * (other_side as f64 + 1.0) / (f64::from(resamples) + 1.0)).min(1.0)
    };
    Some(Bootstrap { mean_diff, low, high, p_value })
}

/// The q-quantile (0..=1) of `values` by linear interpolation between closest ranks (numpy's default,
/// "linear"); sorts a copy; ignores NaN; None when no finite value.
///
/// Infinite values are ignored along with NaN, so the result is always finite. `q` is clamped to
/// `[0, 1]`; a NaN `q` gives None. Matches `numpy.quantile(finite_values, q)`.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    if q.is_nan() {
        return None;
    }
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    sorted.sort_unstable_by(f64::total_cmp);
    sorted_quantile(&sorted, q)
}

/// [`quantile`] on an already sorted slice of finite values.
fn sorted_quantile(sorted: &[f64], q: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    if q.is_nan() {
        return None;
    }
    let h = last as f64 * q.clamp(0.0, 1.0);
    let lo = (h.floor() as usize).min(last);
    let hi = (lo + 1).min(last);
    let t = h - lo as f64;
    let (a, b) = (sorted[lo], sorted[hi]);
    // numpy's `_lerp`: interpolate from whichever end is nearer, so t = 1 lands exactly on b.
    let diff = b - a;
    Some(if t >= 0.5 { b - diff * (1.0 - t) } else { a + diff * t })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn pass_at_k_matches_the_combinatorial_definition() {
        // n = 5, c = 2, k = 2: 1 - C(3,2)/C(5,2) = 1 - 3/10.
        assert!(close(pass_at_k(5, 2, 2), 0.7));
        assert!(close(pass_at_k(5, 2, 1), 0.4), "pass@1 is c/n");
        assert!(close(pass_at_k(5, 0, 3), 0.0));
        assert!(close(pass_at_k(5, 3, 3), 1.0), "n - c < k: some pass is certain");
    }

    #[test]
    fn pass_hat_k_matches_the_combinatorial_definition() {
        // n = 5, c = 3, k = 2: C(3,2)/C(5,2) = 3/10.
        assert!(close(pass_hat_k(5, 3, 2), 0.3));
        assert!(close(pass_hat_k(4, 4, 4), 1.0));
        assert!(close(pass_hat_k(4, 3, 4), 0.0));
        assert!(close(pass_hat_k(5, 2, 1), 0.4), "pass^1 is c/n");
    }

    fn close_rel(a: f64, b: f64, rel: f64) -> bool {
        a == b || (a - b).abs() <= rel * b.abs().max(a.abs())
    }

    #[test]
    fn wilson_matches_statsmodels() {
        // statsmodels.stats.proportion.proportion_confint(passed, n, alpha=0.05, method='wilson')
        let cases: [(u64, u64, f64, f64); 8] = [
            (0, 1, 0.0, 0.7934506856227627),
            (0, 10, 0.0, 0.27753279986288926),
            (5, 10, 0.23659309051256394, 0.7634069094874361),
            (10, 10, 0.7224672001371106, 1.0),
            (1, 3, 0.06149194472039626, 0.7923403991979523),
            (37, 50, 0.6044684273515116, 0.841284725064476),
            (812, 1000, 0.7866068125887822, 0.8350052901162315),
            (1, 100000, 1.7652477303783092e-06, 5.664709659040968e-05),
        ];
        for (passed, n, low, high) in cases {
            let Some((l, h)) = wilson(passed, n) else { panic!("wilson({passed}, {n}) is None") };
            assert!(close_rel(l, low, 1e-12) || (l - low).abs() < 1e-15, "wilson({passed}, {n}) low {l} vs {low}");
            assert!(close_rel(h, high, 1e-12), "wilson({passed}, {n}) high {h} vs {high}");
        }
        assert_eq!(wilson(0, 0), None);
        assert_eq!(wilson(3, 2), None, "more passes than trials is not a proportion");
    }

    #[test]
    fn mcnemar_exact_matches_scipy_binomtest() {
        // scipy.stats.binomtest(min(b, c), b + c, 0.5).pvalue (two-sided, exact), scipy 1.17.1.
        let cases: [(u64, u64, f64); 19] = [
            (0, 5, 0.0625),
            (5, 0, 0.0625),
            (3, 12, 0.03515625),
            (50, 70, 0.08240747932752648),
            (1000, 1100, 0.03072070786424249),
            (100000, 100500, 0.26510509544159483),
            (7, 7, 1.0),
            (1, 2, 1.0),
            (0, 1, 1.0),
            (1, 1, 1.0),
            (10, 11, 1.0),
            (0, 30, 1.862645149230957e-09),
            (2, 9, 0.0654296875),
            (10, 30, 0.0022214337732293643),
            (250, 300, 0.036578745549102676),
            (49000, 50000, 0.0014980826229750034),
            // The true values are below the smallest f64 and underflow to 0 in both.
            (0, 1075, 0.0),
            (100, 199900, 0.0),
            (199900, 100, 0.0),
        ];
        for (b, c, want) in cases {
            let got = mcnemar_exact(b, c);
            assert!(close_rel(got, want, 1e-10), "mcnemar_exact({b}, {c}) = {got}, scipy says {want}");
        }
        // No discordant pairs: scipy rejects n = 0; by definition there is no evidence, p = 1.
        assert_eq!(mcnemar_exact(0, 0), 1.0);
    }

    #[test]
    fn mcnemar_exact_survives_extreme_counts() {
        for (b, c) in [(u64::MAX, 0), (0, u64::MAX), (u64::MAX, u64::MAX), (1 << 40, (1 << 40) + 5)] {
            let p = mcnemar_exact(b, c);
            assert!((0.0..=1.0).contains(&p), "mcnemar_exact({b}, {c}) = {p}");
        }
        // Past the exact limit the rescaled answer continues the exact one: b + c = 2^40 (exact) and
        // b + c = 2^41 (rescaled) with the same z = (c - b) / sqrt(b + c) ≈ 2.86 give the same p.
        let d = 1_500_000_u64;
        let exact = mcnemar_exact((1 << 39) - d, (1 << 39) + d);
        let d2 = 2_121_320_u64; // d * sqrt(2), rounded
        let rescaled = mcnemar_exact((1 << 40) - d2, (1 << 40) + d2);
        assert!(exact > 1e-3 && exact < 1e-2 && close_rel(rescaled, exact, 1e-4), "{exact} vs {rescaled}");
    }

    #[test]
    fn quantile_matches_numpy() {
        // numpy.quantile([3.5, -1.0, 2.0, 10.0, 0.25, 7.0], q), numpy 2.4.6 (method='linear').
        let values = [3.5, -1.0, 2.0, 10.0, 0.25, 7.0];
        let cases = [(0.0, -1.0), (0.1, -0.375), (0.25, 0.6875), (0.5, 2.75), (0.9, 8.5), (1.0, 10.0)];
        for (q, want) in cases {
            assert_eq!(quantile(&values, q), Some(want), "q = {q}");
        }
        // numpy.quantile([42.0], 0.3) and numpy.quantile([1.0, 2.0], 0.3)
        assert_eq!(quantile(&[42.0], 0.3), Some(42.0));
        let Some(q) = quantile(&[2.0, 1.0], 0.3) else { panic!("quantile of two values is None") };
        assert!(close(q, 1.3));
        // numpy.nanquantile([nan, 4.0, 1.0, nan, 2.0], 0.75)
        assert_eq!(quantile(&[f64::NAN, 4.0, 1.0, f64::NAN, 2.0], 0.75), Some(3.0));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&[f64::NAN, f64::INFINITY], 0.5), None);
        assert_eq!(quantile(&[1.0, 2.0], f64::NAN), None);
        assert_eq!(quantile(&[1.0, 2.0], 7.0), Some(2.0), "q is clamped to [0, 1]");
    }

    /// Deterministic pseudo-random diffs in `[lo, hi)` for the bootstrap tests.
    fn uniform_diffs(count: usize, lo: f64, hi: f64, seed: u64) -> Vec<f64> {
        let mut rng = fastrand::Rng::with_seed(seed);
        (0..count).map(|_| lo + (hi - lo) * rng.f64()).collect()
    }

    #[test]
    fn paired_bootstrap_is_reproducible() {
        let diffs = uniform_diffs(57, -1.0, 1.2, 1);
        let a = paired_bootstrap(&diffs, 2_000, 42);
        assert!(a.is_some());
        assert_eq!(a, paired_bootstrap(&diffs, 2_000, 42), "same seed, same result");
        assert_ne!(a, paired_bootstrap(&diffs, 2_000, 43), "a different seed resamples differently");
    }

    #[test]
    fn paired_bootstrap_detects_a_clear_shift() {
        let diffs = uniform_diffs(200, 0.5, 1.5, 2);
        let Some(r) = paired_bootstrap(&diffs, 2_000, 7) else { panic!("no bootstrap for 200 diffs") };
        let mean = diffs.iter().sum::<f64>() / 200.0;
        assert!(close(r.mean_diff, mean));
        assert!(r.p_value < 0.01, "p = {}", r.p_value);
        assert!(r.p_value > 0.0, "the +1 correction keeps p above 0");
        assert!(0.0 < r.low && r.low < r.mean_diff && r.mean_diff < r.high, "{r:?}");
        // A negative shift mirrors it.
        let neg: Vec<f64> = diffs.iter().map(|d| -d).collect();
        let Some(r) = paired_bootstrap(&neg, 2_000, 7) else { panic!("no bootstrap for 200 diffs") };
        assert!(r.p_value < 0.01 && r.high < 0.0, "{r:?}");
    }

    #[test]
    fn paired_bootstrap_finds_nothing_in_symmetric_noise() {
        // Exactly symmetric pass/fail noise: the observed mean is 0, so p is 1 by definition.
        let diffs: Vec<f64> = (0..200).map(|i| if i % 2 == 0 { 1.0 } else { -1.0 }).collect();
        let Some(r) = paired_bootstrap(&diffs, 2_000, 3) else { panic!("no bootstrap for 200 diffs") };
        assert!(r.p_value > 0.2 && r.low < 0.0 && 0.0 < r.high, "{r:?}");
        // Noise with a tiny nonzero observed mean: the bootstrap must not call it significant.
        let diffs = uniform_diffs(200, -1.0, 1.0, 4);
        let Some(r) = paired_bootstrap(&diffs, 2_000, 3) else { panic!("no bootstrap for 200 diffs") };
        assert!(r.mean_diff != 0.0 && r.mean_diff.abs() < 0.1, "{r:?}");
        assert!(r.p_value > 0.2 && r.low < 0.0 && 0.0 < r.high, "{r:?}");
    }

    #[test]
    fn paired_bootstrap_degenerate_inputs() {
        assert_eq!(paired_bootstrap(&[], 2_000, 0), None);
        assert_eq!(paired_bootstrap(&[f64::NAN, f64::INFINITY], 2_000, 0), None);
        assert_eq!(paired_bootstrap(&[1.0, 2.0], 0, 0), None);
        let zeros = [0.0; 30];
        assert_eq!(
            paired_bootstrap(&zeros, 2_000, 5),
            Some(Bootstrap { mean_diff: 0.0, low: 0.0, high: 0.0, p_value: 1.0 })
        );
        // Non-finite diffs are dropped, not propagated.
        let Some(r) = paired_bootstrap(&[f64::NAN, 1.0, 1.0, f64::NEG_INFINITY], 100, 5) else {
            panic!("finite diffs remain")
        };
        assert_eq!((r.mean_diff, r.low, r.high), (1.0, 1.0, 1.0));
        // A single diff: every resample equals it; p is the smallest attainable value.
        let Some(r) = paired_bootstrap(&[0.5], 99, 5) else { panic!("one diff is enough") };
        assert!(close(r.p_value, 2.0 / 100.0), "{r:?}");
    }
}
