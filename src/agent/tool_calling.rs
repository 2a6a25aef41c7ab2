//! The default agent: the model proposes tool calls, the agent passes them on. Every
//! decision it makes is in `propose`, top to bottom.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::json;

use super::{Agent, AgentFault, Proposal, Turn};
use crate::contract::{FINAL_TOOL, Observation, ToolCall};
use crate::log::Event;
use crate::model::{LanguageModel, Message, ModelRequest, ModelResponse};

pub const FINAL_ANSWER_REMINDER: &str =
    "You answered without calling a tool. When you are done, call `final_answer` with your answer.";
pub const EMPTY_REPLY_REMINDER: &str = "Your reply was empty. Use a tool, or call `final_answer` with your answer.";

pub struct ToolCallingAgent {
    model: Arc<dyn LanguageModel>,
    model_name: String,
    transcript: Vec<Message>,
    require_final_answer: bool,
    /// The tool each call id named: ids stay unique, and results are labelled.
    call_names: HashMap<String, String>,
}

impl ToolCallingAgent {
    pub fn new(model: Arc<dyn LanguageModel>, model_name: &str, system: Option<String>, require_final_answer: bool) -> Self {
        let transcript = system.filter(|s| !s.trim().is_empty()).map(|content| Message::System { content }).into_iter().collect();
        ToolCallingAgent { model, model_name: model_name.to_owned(), transcript, require_final_answer, call_names: HashMap::new() }
    }

    pub fn transcript(&self) -> &[Message] {
        &self.transcript
    }

    /// Perceives: the environment's observations become messages of the transcript.
    fn perceive(&mut self, observations: &[Observation]) {
        for obs in observations {
            if let Some(call_id) = &obs.call_id {
                let content = match (&obs.error, &obs.tool_result) {
                    (None, Some(serde_json::Value::String(s))) => s.clone(),
                    (None, Some(result)) => result.to_string(),
                    (None, None) => "null".to_owned(),
                    (Some(error), partial) => json!({"error": error, "tool_result": partial}).to_string(),
                };
                let name = self.call_names.get(call_id).cloned().unwrap_or_default();
                self.transcript.push(Message::Tool { call_id: call_id.clone(), name, content });
            }
            for text in &obs.messages {
                self.transcript.push(Message::User { content: text.clone() });
            }
        }
    }

    /// Gives each call an id unique in the episode, keeping the model's own when it can.
    fn name_call(&mut self, proposed: Option<&str>, tool: &str) -> String {
        let id = match proposed.map(str::trim).filter(|id| !id.is_empty() && !self.call_names.contains_key(*id)) {
            Some(id) => id.to_owned(),
            None => (self.call_names.len() + 1..)
                .map(|n| format!("c_{n}"))
                .find(|id| !self.call_names.contains_key(id))
                .unwrap_or_default(),
        };
        self.call_names.insert(id.clone(), tool.to_owned());
        id
    }

    async fn ask_model(&self, turn: &Turn<'_>) -> Result<ModelResponse, AgentFault> {
        let request = ModelRequest { messages: &self.transcript, tools: turn.tools };
        let started = std::time::Instant::now();
        let result = self.model.respond(&request).await;
        let latency_ms = started.elapsed().as_secs_f64() * 1e3;
        match result {
            Ok(response) => {
                turn.recorder.emit(&Event::ModelCall {
                    model: self.model_name.clone(),
                    step: turn.budget.step,
                    request_digest: request.digest(),
                    response: json!({"text": response.text, "tool_calls": response.tool_calls,
                                     "finish_reason": response.finish_reason}),
                    usage: response.usage,
                    latency_ms,
                    attempts: 1,
                    cache_hit: false,
                });
                Ok(response)
            }
            Err(e) => Err(AgentFault { cause: e.cause, message: e.message }),
        }
    }
}

#[async_trait]
impl Agent for ToolCallingAgent {
    async fn propose(&mut self, turn: Turn<'_>) -> Result<Proposal, AgentFault> {
        self.perceive(turn.observations);

        let response = self.ask_model(&turn).await?;
        let usage = response.usage;

        let mut calls = Vec::with_capacity(response.tool_calls.len());
        for proposed in response.tool_calls {
            let call_id = self.name_call(proposed.id.as_deref(), &proposed.name);
            calls.push(ToolCall { call_id, name: proposed.name, arguments: proposed.arguments });
        }
        self.transcript.push(Message::Assistant { content: response.text.clone(), tool_calls: calls.clone() });
        if !calls.is_empty() {
            return Ok(Proposal { calls, usage });
        }

        // No tool calls: either the answer itself, or the agent reminds the model what it
        // must do, and the turn still counts against the step limit.
        let text = response.text.unwrap_or_default();
        if text.trim().is_empty() {
            self.transcript.push(Message::User { content: EMPTY_REPLY_REMINDER.into() });
            return Ok(Proposal { calls: Vec::new(), usage });
        }
        if self.require_final_answer {
            self.transcript.push(Message::User { content: FINAL_ANSWER_REMINDER.into() });
            return Ok(Proposal { calls: Vec::new(), usage });
        }
        let call_id = self.name_call(None, FINAL_TOOL);
        let call = ToolCall { call_id, name: FINAL_TOOL.into(), arguments: json!({"answer": text}) };
        Ok(Proposal { calls: vec![call], usage })
    }
}
