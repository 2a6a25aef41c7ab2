//! How far two or more raters agree on pass/fail verdicts: the confusion matrix, accuracy
//! and Cohen's kappa of one rater (the judge) against another (people), and Krippendorff's
//! alpha (nominal) when a unit has several raters. Pure arithmetic; `judge_check` feeds it.

use std::collections::BTreeMap;

/// Pairs of verdicts, people's against the judge's, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Confusion {
    /// People passed, the judge passed.
    pub both_pass: u64,
    /// People passed, the judge failed.
    pub people_pass_judge_fail: u64,
    /// People failed, the judge passed.
    pub people_fail_judge_pass: u64,
    /// People failed, the judge failed.
    pub both_fail: u64,
}

impl Confusion {
    pub fn add(&mut self, people: bool, judge: bool) {
        match (people, judge) {
            (true, true) => self.both_pass += 1,
            (true, false) => self.people_pass_judge_fail += 1,
            (false, true) => self.people_fail_judge_pass += 1,
            (false, false) => self.both_fail += 1,
        }
    }

    pub fn total(&self) -> u64 {
        self.both_pass + self.people_pass_judge_fail + self.people_fail_judge_pass + self.both_fail
    }

    pub fn agreed(&self) -> u64 {
        self.both_pass + self.both_fail
    }

    /// The share of pairs on which the judge and people agree; `None` without pairs.
    pub fn accuracy(&self) -> Option<f64> {
        let n = self.total();
        (n > 0).then(|| self.agreed() as f64 / n as f64)
    }

    /// Cohen's kappa: the agreement beyond what the two sides' pass rates give by chance,
    /// `(p_o - p_e) / (1 - p_e)`. `None` without pairs, or when chance alone agrees on every
    /// pair (both sides gave one verdict only): kappa is then undefined.
    pub fn kappa(&self) -> Option<f64> {
        let n = self.total() as f64;
        if n == 0.0 {
            return None;
        }
        let observed = self.agreed() as f64 / n;
        let people_pass = (self.both_pass + self.people_pass_judge_fail) as f64 / n;
        let judge_pass = (self.both_pass + self.people_fail_judge_pass) as f64 / n;
        let chance = people_pass * judge_pass + (1.0 - people_pass) * (1.0 - judge_pass);
        (chance < 1.0).then(|| (observed - chance) / (1.0 - chance))
    }
}

/// Krippendorff's alpha for nominal values: `1 - D_o / D_e`, from the coincidence matrix of
/// the units that have at least two values (`units`: each unit's values, one per rater who
/// rated it). `None` when fewer than two values are pairable, or all pairable values are
/// one value (no disagreement is expected: alpha is undefined).
pub fn krippendorff_alpha<V: Ord + Clone>(units: &[Vec<V>]) -> Option<f64> {
    // o[c][k]: each ordered pair of values in a unit, weighted 1 / (m_u - 1), counted from
    // how often each value occurs in the unit (n_c * n_k pairs, or n_c * (n_c - 1) for
    // c = k) rather than pair by pair: linear in the raters of a unit, not quadratic.
    let mut coincidences: BTreeMap<(V, V), f64> = BTreeMap::new();
    for values in units.iter().filter(|v| v.len() >= 2) {
        let weight = 1.0 / (values.len() - 1) as f64;
        let mut counts: BTreeMap<&V, f64> = BTreeMap::new();
        for value in values {
            *counts.entry(value).or_default() += 1.0;
        }
        for (c, n_c) in &counts {
            for (k, n_k) in &counts {
                let pairs = if c == k { n_c * (n_c - 1.0) } else { n_c * n_k };
                if pairs > 0.0 {
                    *coincidences.entry(((*c).clone(), (*k).clone())).or_default() += pairs * weight;
                }
            }
        }
    }
    let mut totals: BTreeMap<V, f64> = BTreeMap::new();
    for ((c, _), o) in &coincidences {
        *totals.entry(c.clone()).or_default() += o;
    }
    let n: f64 = totals.values().sum();
    if n < 2.0 {
        return None;
    }
    let observed: f64 = coincidences.iter().filter(|((c, k), _)| c != k).map(|(_, o)| o).sum();
    let mut expected = 0.0;
    for (c, n_c) in &totals {
        for (k, n_k) in &totals {
            if c != k {
                expected += n_c * n_k;
            }
        }
    }
    (expected > 0.0).then(|| 1.0 - (n - 1.0) * observed / expected)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-12)
    }

    #[test]
    fn kappa_against_the_hand_computed_value() {
        // 50 pairs: people pass & judge pass 20, people pass & judge fail 5, people fail &
        // judge pass 10, both fail 15.
        //   p_o = (20 + 15) / 50 = 0.7
        //   people pass 25/50 = 0.5; judge pass 30/50 = 0.6
        //   p_e = 0.5 * 0.6 + 0.5 * 0.4 = 0.5
        //   kappa = (0.7 - 0.5) / (1 - 0.5) = 0.4
        let c = Confusion { both_pass: 20, people_pass_judge_fail: 5, people_fail_judge_pass: 10, both_fail: 15 };
        assert!(close(c.accuracy(), 0.7));
        assert!(close(c.kappa(), 0.4), "{:?}", c.kappa());
        // Perfect agreement on both verdicts: p_o = 1, p_e = 0.5, kappa = 1.
        let perfect = Confusion { both_pass: 3, both_fail: 3, ..Confusion::default() };
        assert!(close(perfect.kappa(), 1.0));
        // Agreement no better than chance: 2 of each cell, p_o = 0.5 = p_e, kappa = 0.
        let chance = Confusion { both_pass: 2, people_pass_judge_fail: 2, people_fail_judge_pass: 2, both_fail: 2 };
        assert!(close(chance.kappa(), 0.0));
        // Everyone always says pass: p_e = 1, kappa undefined.
        assert_eq!(Confusion { both_pass: 4, ..Confusion::default() }.kappa(), None);
        assert_eq!(Confusion::default().accuracy(), None);
    }

    #[test]
    fn alpha_against_the_hand_computed_value() {
        // Units (P pass, F fail): [P,P] [P,F] [F,F] [F,F] [P,P] [P,P,F] [P].
        // Coincidences, each ordered pair weighted 1/(m_u - 1):
        //   [P,P] twice:  o_PP += 2 each          -> o_PP = 4
        //   [F,F] twice:  o_FF += 2 each          -> o_FF = 4
        //   [P,F]:        o_PF += 1, o_FP += 1
        //   [P,P,F] (m=3, weight 1/2): PP pairs 2 -> o_PP += 1; PF pairs 2 -> o_PF += 1;
        //                              FP pairs 2 -> o_FP += 1
        //   [P] alone: not pairable, left out.
        //   o_PP = 5, o_FF = 4, o_PF = o_FP = 2; n_P = 7, n_F = 6, n = 13
        //   alpha = 1 - (n - 1) * (o_PF + o_FP) / (2 * n_P * n_F) = 1 - 12 * 4 / 84 = 3/7
        let (p, f) = (true, false);
        let units = vec![vec![p, p], vec![p, f], vec![f, f], vec![f, f], vec![p, p], vec![p, p, f], vec![p]];
        assert!(close(krippendorff_alpha(&units), 3.0 / 7.0), "{:?}", krippendorff_alpha(&units));
        // Without the three-rater unit: o_PP = 4, o_FF = 4, o_PF = o_FP = 1, n_P = n_F = 5,
        // n = 10: alpha = 1 - 9 * 2 / 50 = 0.64.
        let two = &units[..5];
        assert!(close(krippendorff_alpha(two), 0.64), "{:?}", krippendorff_alpha(two));
        // Full agreement: alpha = 1; one value everywhere: undefined; nothing pairable: undefined.
        assert!(close(krippendorff_alpha(&[vec![p, p], vec![f, f]]), 1.0));
        assert_eq!(krippendorff_alpha(&[vec![p, p], vec![p, p]]), None);
        assert_eq!(krippendorff_alpha(&[vec![p]]), None);
    }
}
