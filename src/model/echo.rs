//! The `echo` backend: answers every request with the prompt it was given (the last user
//! message), as promptfoo's `echo` provider does. It needs no key and no script, so a
//! suite's prompts, variants and scorers can be tried offline on the text they produce.

use async_trait::async_trait;

use super::{LanguageModel, Message, ModelError, ModelRequest, ModelResponse};
use crate::log::Usage;

pub struct EchoModel;

/// The text `echo` answers a transcript with: its last user message (a tool result when
/// the last message is one), or nothing.
pub fn echoed(messages: &[Message]) -> String {
    messages
        .iter()
        .rev()
        .find_map(|m| match m {
            Message::User { content } | Message::Tool { content, .. } => Some(content.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

#[async_trait]
impl LanguageModel for EchoModel {
    fn name(&self) -> &str {
        "echo"
    }

    async fn respond(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let text = echoed(request.messages);
        // Counted as promptfoo counts it: a token per word, in and out.
        let words = text.split_whitespace().count() as u64;
        Ok(ModelResponse {
            text: Some(text),
            usage: Usage { input_tokens: words, output_tokens: words, cached_tokens: 0 },
            finish_reason: Some("stop".into()),
            // Free, as promptfoo's: a cost limit holds.
            cost_usd: Some(0.0),
            attempts: 1,
            ..ModelResponse::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_answers_with_the_last_user_message() {
        let messages = vec![
            Message::System { content: "be brief".into() },
            Message::User { content: "first".into() },
            Message::Assistant { content: Some("a".into()), tool_calls: Vec::new() },
            Message::User { content: "What is 2+2?".into() },
        ];
        assert_eq!(echoed(&messages), "What is 2+2?");
        assert_eq!(echoed(&[]), "");
    }
}
