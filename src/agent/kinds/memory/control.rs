//! The invoker and the decision of seed 002. The invoker turns a replayed conversation
//! into invocations, each with a control state; the decision says, from the control state
//! and the last tool that ran, what the invocation does next. Both are plain functions.

use serde::{Deserialize, Serialize};

use crate::domain::conversation::Session;

/// What an invocation of the memory agent is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ControlState {
    StartSession,
    ProcessMessage,
    ProcessMessageAndFlush,
    EndSession,
}

impl ControlState {
    pub fn name(self) -> &'static str {
        match self {
            ControlState::StartSession => "start_session",
            ControlState::ProcessMessage => "process_message",
            ControlState::ProcessMessageAndFlush => "process_message_and_flush",
            ControlState::EndSession => "end_session",
        }
    }
}

/// The tools of the memory protocol.
pub const ADD_ENTRY: &str = "add_entry";
pub const LIST_ENTRIES: &str = "list_entries";
pub const GET_CONTEXT: &str = "get_context";
pub const PUT_CONTEXT: &str = "put_context";
pub const AWAIT_CONSISTENCY: &str = "await_consistency";
pub const SEARCH_ENTRIES: &str = "search_entries";

/// What the model is asked to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// `add_entry` for the message being processed.
    AddEntry,
    /// `put_context`: the conversation so far, synthesised.
    PutContext,
}

impl Ask {
    pub fn tool(self) -> &'static str {
        match self {
            Ask::AddEntry => ADD_ENTRY,
            Ask::PutContext => PUT_CONTEXT,
        }
    }
}

/// The next thing an invocation does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Calls made by the agent's code, no model: these tools, with fixed arguments.
    Direct(&'static [&'static str]),
    /// The model is asked to write one call of a tool.
    Model(Ask),
    /// The invocation is complete.
    Done,
}

/// The decision: what comes after `last_tool` (`None` when the invocation has run no tool
/// yet) in an invocation of `control`. A pair this does not list means the sequence went
/// wrong, and the invocation is complete.
pub fn decide(control: ControlState, last_tool: Option<&str>) -> Next {
    use ControlState::*;
    match (control, last_tool) {
        (StartSession, None) => Next::Direct(&[GET_CONTEXT, LIST_ENTRIES]),
        (StartSession, Some(LIST_ENTRIES)) => Next::Done,
        (ProcessMessage, None) => Next::Model(Ask::AddEntry),
        (ProcessMessage, Some(ADD_ENTRY)) => Next::Done,
        (ProcessMessageAndFlush, None) => Next::Model(Ask::AddEntry),
        (ProcessMessageAndFlush, Some(ADD_ENTRY)) => Next::Direct(&[AWAIT_CONSISTENCY]),
        (ProcessMessageAndFlush, Some(AWAIT_CONSISTENCY)) => Next::Model(Ask::PutContext),
        (ProcessMessageAndFlush, Some(PUT_CONTEXT)) => Next::Done,
        (EndSession, None) => Next::Direct(&[AWAIT_CONSISTENCY]),
        (EndSession, Some(AWAIT_CONSISTENCY)) => Next::Model(Ask::PutContext),
        (EndSession, Some(PUT_CONTEXT)) => Next::Done,
        _ => Next::Done,
    }
}

/// One invocation of the replay: which session, which message (from 1), which control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Invocation {
    pub session: usize,
    pub message: Option<usize>,
    pub control: ControlState,
}

/// The invoker: every invocation of a replay, in order. A session is started, each of its
/// messages processed (every `flush_every`-th, counted from the session's start, also
/// flushes), then ended.
pub fn invocations(sessions: &[Session], flush_every: u32) -> Vec<Invocation> {
    let flush_every = flush_every.max(1) as usize;
    let mut all = Vec::new();
    for (session, s) in sessions.iter().enumerate() {
        all.push(Invocation { session, message: None, control: ControlState::StartSession });
        for count in 1..=s.messages.len() {
            let control = if count % flush_every == 0 {
                ControlState::ProcessMessageAndFlush
            } else {
                ControlState::ProcessMessage
            };
            all.push(Invocation { session, message: Some(count), control });
        }
        all.push(Invocation { session, message: None, control: ControlState::EndSession });
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::conversation::ChatMessage;

    /// The tools one invocation runs, `model:` for those the model writes, when every tool
    /// succeeds.
    fn sequence(control: ControlState) -> Vec<String> {
        let mut ran = Vec::new();
        let mut last: Option<&str> = None;
        loop {
            match decide(control, last) {
                Next::Direct(tools) => {
                    ran.extend(tools.iter().map(|t| t.to_string()));
                    last = tools.last().copied();
                }
                Next::Model(ask) => {
                    ran.push(format!("model:{}", ask.tool()));
                    last = Some(ask.tool());
                }
                Next::Done => return ran,
            }
        }
    }

    #[test]
    fn each_control_runs_the_seeds_sequence() {
        assert_eq!(sequence(ControlState::StartSession), ["get_context", "list_entries"]);
        assert_eq!(sequence(ControlState::ProcessMessage), ["model:add_entry"]);
        assert_eq!(
            sequence(ControlState::ProcessMessageAndFlush),
            ["model:add_entry", "await_consistency", "model:put_context"]
        );
        assert_eq!(sequence(ControlState::EndSession), ["await_consistency", "model:put_context"]);
    }

    #[test]
    fn thirteen_messages_flush_at_six_and_twelve() {
        let message = ChatMessage { role: "user".into(), content: "hi".into() };
        let session = Session { id: "s".into(), date: None, messages: vec![message; 13] };
        let controls: Vec<&str> = invocations(&[session], 6).iter().map(|i| i.control.name()).collect();
        let mut expected = vec!["start_session"];
        for n in 1..=13 {
            expected.push(if n % 6 == 0 { "process_message_and_flush" } else { "process_message" });
        }
        expected.push("end_session");
        assert_eq!(controls, expected);
    }
}
