//! How a task's verdicts over its epochs become one: the reducer of its scores and its
//! k-of-n gate, as a suite sets them and `run_started` records them.

use serde::{Deserialize, Serialize};

/// A task's k-of-n gate over its epochs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PassK {
    pub k: u32,
    pub n: u32,
}

impl PassK {
    /// Refuses a gate no task could pass or that runs nothing.
    pub fn check(&self) -> Result<(), String> {
        if self.n == 0 || self.k == 0 || self.k > self.n {
            return Err(format!("needs 1 <= k <= n, got k {} and n {}", self.k, self.n));
        }
        Ok(())
    }
}

/// How a task's scores over its epochs reduce to one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reducer {
    #[default]
    Mean,
    Max,
    Min,
    /// The score most epochs got (ties go to the lower).
    Majority,
}

impl Reducer {
    pub fn reduce(self, scores: &[f64]) -> f64 {
        if scores.is_empty() {
            return 0.0;
        }
        match self {
            Reducer::Mean => scores.iter().sum::<f64>() / scores.len() as f64,
            Reducer::Max => scores.iter().copied().fold(f64::MIN, f64::max),
            Reducer::Min => scores.iter().copied().fold(f64::MAX, f64::min),
            Reducer::Majority => {
                let mut sorted = scores.to_vec();
                sorted.sort_by(f64::total_cmp);
                let mut best = (sorted[0], 0);
                let mut i = 0;
                while i < sorted.len() {
                    let run = sorted[i..].iter().take_while(|x| **x == sorted[i]).count();
                    if run > best.1 {
                        best = (sorted[i], run);
                    }
                    i += run;
                }
                best.0
            }
        }
    }
}
