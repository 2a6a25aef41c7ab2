//! The trajectory of a program that runs its own tools, derived from its model traffic: a
//! tool call a response asks for is an `action_dispatched` event (actor `main`) at that
//! call's step, and the result the program sends back for it in a later request is its
//! `observation`, matched by call id. A call never answered stays without an observation.
//! The log keeps a result (or an error's message) up to [`RESULT_LOG_BYTES`]: the program
//! has it whole, and a request of 32 MiB may carry one.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use serde_json::Value;

use super::Gateway;
use crate::contract::fit::fit_text;
use crate::contract::{ErrorType, Observation, ToolCall, ToolError};
use crate::log::{Event, Recorder};
use crate::model::{Message, ProposedCall};

/// What an observation derived from the traffic keeps of its result: a world's default
/// output cap.
pub const RESULT_LOG_BYTES: usize = 32 << 10;

/// The calls asked for and not answered yet, by id.
#[derive(Default)]
pub struct Derived {
    pending: HashMap<String, ()>,
}

pub fn lock(derived: &Mutex<Derived>) -> MutexGuard<'_, Derived> {
    // Every change under this lock is one insert or remove: a panic cannot leave one half-done.
    derived.lock().unwrap_or_else(|e| e.into_inner())
}

impl Derived {
    /// The results a request carries for calls still pending: their observations, at the
    /// step of the request that brings them.
    pub fn observed(&mut self, messages: &[Message], step: u32, recorder: &Recorder) {
        for message in messages {
            let Message::Tool { call_id, content, is_error, .. } = message else { continue };
            if self.pending.remove(call_id).is_none() {
                continue;
            }
            let (kept, _) = fit_text(content, RESULT_LOG_BYTES);
            let observation = Observation {
                call_id: Some(call_id.clone()),
                done: false,
                error: is_error.then(|| ToolError::new(ErrorType::ExecutionError, kept.clone())),
                tool_result: (!is_error).then_some(Value::String(kept)),
                messages: Vec::new(),
                info: Default::default(),
                fault: None,
            };
            recorder.emit(&Event::Observation { step, observation });
        }
    }

    /// The calls a response asks for (each with its id by now): dispatched, pending.
    pub fn asked_for(&mut self, calls: &[ProposedCall], step: u32, gateway: &Gateway) {
        for call in calls {
            let id = call.id.clone().unwrap_or_default();
            let call = ToolCall::new(id.clone(), call.name.clone(), call.arguments.clone());
            gateway.ledger.dispatched(&call);
            gateway.recorder.emit(&Event::ActionDispatched { step, call });
            self.pending.insert(id, ());
        }
    }
}
