//! The `mock` backend: plays a task's scripted `mock:` turns in order. One instance per
//! episode, so concurrency cannot reorder a script.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;

use super::{LanguageModel, Message, ModelError, ModelRequest, ModelResponse, ProposedCall};
use crate::log::Usage;
use crate::suite::MockTurn;

pub struct MockModel {
    turns: Arc<[MockTurn]>,
    next: AtomicUsize,
}

impl MockModel {
    pub fn new(turns: Arc<[MockTurn]>) -> Self {
        MockModel { turns, next: AtomicUsize::new(0) }
    }
}

#[async_trait]
impl LanguageModel for MockModel {
    fn name(&self) -> &str {
        "mock"
    }

    async fn respond(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let Some(turn) = self.turns.get(n) else {
            return Err(ModelError::new(
                "mock_exhausted",
                format!("the task's mock script has {} turns and the agent asked for turn {}", self.turns.len(), n + 1),
            ));
        };
        let text = turn.text.as_ref().map(|t| t.0.clone());
        let tool_calls: Vec<ProposedCall> = turn
            .tool_calls
            .iter()
            .map(|c| ProposedCall { id: c.id.clone(), name: c.name.clone(), arguments: c.arguments.clone() })
            .collect();
        let output_chars = text.as_ref().map_or(0, |t| t.len())
            + tool_calls.iter().map(|c| c.name.len() + c.arguments.to_string().len()).sum::<usize>();
        let usage = Usage {
            input_tokens: estimate_tokens(request.messages),
            output_tokens: (output_chars / 4) as u64,
            cached_tokens: 0,
        };
        let finish_reason = Some(if tool_calls.is_empty() { "stop" } else { "tool_calls" }.to_owned());
        Ok(ModelResponse { text, tool_calls, usage, finish_reason, attempts: 1, ..ModelResponse::default() })
    }
}

/// About four characters a token: enough for token limits to mean something offline.
fn estimate_tokens(messages: &[Message]) -> u64 {
    let chars: usize = messages
        .iter()
        .map(|m| match m {
            Message::System { content } | Message::User { content } => content.len(),
            Message::Assistant { content, tool_calls } => {
                content.as_ref().map_or(0, |c| c.len()) + tool_calls.iter().map(|c| c.name.len() + 16).sum::<usize>()
            }
            Message::Tool { content, .. } => content.len(),
        })
        .sum();
    (chars / 4) as u64
}
