//! What people read: progress while a run goes and the summary at its end. Everything here
//! is computed from the event log or from the stream of finished episodes.

pub mod compare;
pub mod html;
pub mod junit;
pub mod progress;
pub mod stats;
pub mod summary;
pub mod table;

pub use progress::Progress;
pub use summary::{Row, Summary};
