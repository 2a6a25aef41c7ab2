//! What an episode or a run may spend, and what it has spent: an episode's limits, resolved
//! once when its suite loads (`limits.rs`), its meter (`meter.rs`), a turn's allowance
//! (`allowance.rs`), and a run's caps and meter (`run.rs`). Every count of steps, tokens,
//! dollars and model calls that a limit is checked against is kept here.

mod allowance;
mod limits;
mod meter;
pub mod run;

pub use allowance::Allowance;
pub use limits::{EpisodeLimits, Limits};
pub use meter::Meter;
pub use run::{Admission, RunCaps, RunMeter, Spend, provider_of};
