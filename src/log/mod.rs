//! The event log, `results/<run-id>/events.jsonl`: the source of truth of a run. Everything
//! else (progress, summaries, tables, reports) is computed from these events.

pub use crate::contract::event;
pub mod projection;
pub mod reader;
pub mod search;
pub mod secrets;
mod timestamp;
pub mod writer;

pub use event::{
    ActionClass, DecidedBy, Event, Outcome, PermissionDecision, ProgramEnd, Termination, TurnRef, UnscoredCause, Usage,
    add_cost, usd,
};
pub use reader::{LoggedEvent, for_each_event, read_events};
pub use writer::{EventLog, LogWriter, Recorder, Subscriber, Subscription, on_worker_park};
