//! An episode's limits: as a suite writes them (`limits:`), and as every episode of it runs
//! under them, the command line's overrides applied once, when the suite loads.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::log::event::LimitOverrides;

/// A time limit past any episode's end (136 years), for a time too large to count.
const NO_TIME_LIMIT: Duration = Duration::from_secs(u32::MAX as u64);

/// A suite's `limits:`, as written.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    pub max_steps: u32,
    pub time_s: f64,
    pub max_tokens: Option<u64>,
    /// USD per episode; applies to models with a price in the config.
    pub max_cost_usd: Option<f64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_steps: 20, time_s: 300.0, max_tokens: None, max_cost_usd: None }
    }
}

/// The limits every episode of a suite runs under.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EpisodeLimits {
    /// Turns of every agent of the episode, together.
    pub max_steps: u32,
    /// From the start of its agent's first turn; a time spent waiting for runner's own model
    /// slots is added to it.
    pub time: Duration,
    pub max_tokens: Option<u64>,
    pub max_cost_usd: Option<f64>,
}

impl EpisodeLimits {
    /// `max_steps` turns in `time`, no token or cost limit.
    pub fn new(max_steps: u32, time: Duration) -> Self {
        EpisodeLimits { max_steps, time, max_tokens: None, max_cost_usd: None }
    }

    pub fn with_max_tokens(self, max_tokens: Option<u64>) -> Self {
        EpisodeLimits { max_tokens, ..self }
    }

    pub fn with_max_cost_usd(self, max_cost_usd: Option<f64>) -> Self {
        EpisodeLimits { max_cost_usd, ..self }
    }

    /// The time limit in seconds.
    pub fn time_s(&self) -> f64 {
        self.time.as_secs_f64()
    }
}

impl Limits {
    /// These limits with the command line's overrides over them: `--time-s`, `--max-steps`
    /// and `--max-tokens` replace, `--time-factor` multiplies the time that results. The one
    /// place overrides are applied.
    pub fn resolved(&self, overrides: &LimitOverrides) -> EpisodeLimits {
        let time_s = overrides.time_s.unwrap_or(self.time_s) * overrides.time_factor.unwrap_or(1.0);
        EpisodeLimits {
            max_steps: overrides.max_steps.unwrap_or(self.max_steps),
            // A factor large enough to leave what a clock can count is no limit at all.
            time: Duration::try_from_secs_f64(time_s).unwrap_or(NO_TIME_LIMIT),
            max_tokens: overrides.max_tokens.or(self.max_tokens),
            max_cost_usd: self.max_cost_usd,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_replace_the_suites_limits_and_the_factor_scales_the_time_that_results() {
        let suite = Limits { max_steps: 20, time_s: 100.0, max_tokens: Some(500), max_cost_usd: Some(0.5) };
        assert_eq!(
            suite.resolved(&LimitOverrides::default()),
            EpisodeLimits::new(20, Duration::from_secs(100)).with_max_tokens(Some(500)).with_max_cost_usd(Some(0.5))
        );
        let overrides =
            LimitOverrides { time_s: Some(10.0), max_steps: Some(3), max_tokens: Some(7), time_factor: Some(2.5) };
        let resolved = suite.resolved(&overrides);
        assert_eq!((resolved.max_steps, resolved.time_s(), resolved.max_tokens), (3, 25.0, Some(7)));
        let sixty = Limits { max_steps: 20, time_s: 60.0, max_tokens: Some(9), max_cost_usd: None };
        let given = LimitOverrides { time_s: Some(10.0), max_steps: Some(3), max_tokens: None, time_factor: Some(2.5) };
        let resolved = sixty.resolved(&given);
        assert_eq!((resolved.time_s(), resolved.max_steps, resolved.max_tokens), (25.0, 3, Some(9)));
        let scaled = LimitOverrides { time_factor: Some(3.0), ..LimitOverrides::default() };
        assert_eq!(sixty.resolved(&scaled).time_s(), 180.0);
        let factor = LimitOverrides { time_factor: Some(0.5), ..LimitOverrides::default() };
        assert_eq!(suite.resolved(&factor).time_s(), 50.0, "the factor scales the suite's own time too");
        let huge = LimitOverrides { time_factor: Some(1e300), ..LimitOverrides::default() };
        assert_eq!(suite.resolved(&huge).time, NO_TIME_LIMIT, "a time too large to count is no limit");
    }
}
