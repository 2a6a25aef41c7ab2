//! An episode's conversations, folded from its events: one thread per agent (the main agent
//! and each subagent), each as its model saw it — the input, the model's turns with the ids
//! the calls were dispatched under, and what came back for each call. The formats are
//! projections of this.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::contract::{Actor, DELEGATE_TOOL, Observation};
use crate::log::writer::OVER_BUDGET_PAYLOAD_BYTES;
use crate::log::{Event, LoggedEvent, Usage};

/// One call a model turn proposed, under the id it was dispatched with.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

/// A model turn: what it said and the calls it proposed, with its model, tokens and cost.
#[derive(Debug, Clone, PartialEq)]
pub struct ConversationTurn {
    pub ts: String,
    pub model: String,
    pub text: Option<String>,
    pub calls: Vec<Call>,
    pub usage: Usage,
    pub cost_usd: Option<f64>,
    /// Calls proposed but not yet matched to the id they were dispatched under.
    unmatched: Vec<bool>,
    step: u32,
}

/// What a thread holds, in the order its agent saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// Text the agent was given: the task's input, a reminder, the user's reply.
    User {
        ts: String,
        text: String,
    },
    Assistant(ConversationTurn),
}

/// What came back for a call, as the agent's transcript got it.
#[derive(Debug, Clone, PartialEq)]
pub struct CallResult {
    pub content: String,
    pub is_error: bool,
    /// The subagent a `delegate_task` call started.
    pub child: Option<Actor>,
}

/// One agent's conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Thread {
    pub actor: Actor,
    /// The system prompt and the tools (OpenAI function form), when the model call's request
    /// body was logged (HTTP backends); `None` otherwise.
    pub system: Option<String>,
    pub tools: Option<Vec<Value>>,
    /// A subagent's goal, as its parent's `delegate_task` gave it.
    pub goal: Option<String>,
    pub entries: Vec<Entry>,
}

impl Thread {
    fn new(actor: Actor) -> Self {
        Thread { actor, system: None, tools: None, goal: None, entries: Vec::new() }
    }

    pub fn turns(&self) -> impl Iterator<Item = &ConversationTurn> {
        self.entries.iter().filter_map(|e| match e {
            Entry::Assistant(turn) => Some(turn),
            Entry::User { .. } => None,
        })
    }

    pub fn usage(&self) -> Usage {
        let mut total = Usage::default();
        self.turns().for_each(|t| total.add(t.usage));
        total
    }

    /// The sum of the turns' costs; `None` when a turn had no price.
    pub fn cost_usd(&self) -> Option<f64> {
        self.turns().try_fold(0.0, |sum, t| t.cost_usd.map(|c| crate::log::add_cost(sum, c)))
    }
}

/// An episode's threads, the main agent's first, and the results of every call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conversation {
    pub threads: Vec<Thread>,
    pub results: HashMap<String, CallResult>,
    /// Payloads the log cut to keep the episode within its log budget.
    pub cut_payloads: bool,
}

impl Conversation {
    pub fn main(&self) -> Option<&Thread> {
        self.threads.iter().find(|t| t.actor.is_main())
    }

    pub fn thread(&self, actor: &Actor) -> Option<&Thread> {
        self.threads.iter().find(|t| t.actor == *actor)
    }

    /// Folds an episode's events, in log order.
    pub fn fold(events: &[LoggedEvent]) -> Conversation {
        let mut fold = Fold::default();
        for logged in events {
            if let Some(event) = logged.event() {
                fold.add(&logged.ts, event);
            }
        }
        fold.finish()
    }
}

/// Whether `content` holds a payload the log cut past the episode's log budget: its markers
/// show at most [`OVER_BUDGET_PAYLOAD_BYTES`] kept, where a tool's output cap (what the
/// model saw cut) keeps far more.
fn cut_by_the_log(content: &str) -> bool {
    content.match_indices("[... cut: showing ").any(|(at, marker)| {
        let rest = &content[at + marker.len()..];
        let kept = rest.split(' ').next().and_then(|n| n.parse::<usize>().ok());
        kept.is_some_and(|kept| kept <= OVER_BUDGET_PAYLOAD_BYTES)
    })
}

#[derive(Default)]
struct Fold {
    conversation: Conversation,
    /// Whose each dispatched call was.
    call_actors: HashMap<String, Actor>,
}

impl Fold {
    fn thread(&mut self, actor: &Actor) -> &mut Thread {
        let threads = &mut self.conversation.threads;
        let index = match threads.iter().position(|t| t.actor == *actor) {
            Some(i) => i,
            None => {
                threads.push(Thread::new(actor.clone()));
                threads.len() - 1
            }
        };
        &mut threads[index]
    }

    fn say(&mut self, actor: &Actor, ts: &str, text: &str) {
        let thread = self.thread(actor);
        // A conversation's opening message is both the reset's and the user's: keep it once.
        if let Some(Entry::User { text: last, .. }) = thread.entries.last()
            && last == text
        {
            return;
        }
        thread.entries.push(Entry::User { ts: ts.to_owned(), text: text.to_owned() });
    }

    fn add(&mut self, ts: &str, event: Event) {
        match event {
            Event::ModelCall {
                model,
                step,
                response,
                usage,
                cost_usd,
                error: None,
                scorer: None,
                actor,
                request,
                ..
            } if actor != Actor::User && !response.is_null() => {
                let thread = self.thread(&actor);
                if thread.system.is_none()
                    && let Some(request) = &request
                {
                    let (system, tools) = from_request(request);
                    thread.system = system;
                    thread.tools = tools;
                }
                let text = response["text"].as_str().filter(|t| !t.is_empty()).map(str::to_owned);
                let calls: Vec<Call> = response["tool_calls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| Call {
                        id: c["id"].as_str().unwrap_or_default().to_owned(),
                        name: c["name"].as_str().unwrap_or_default().to_owned(),
                        arguments: c["arguments"].clone(),
                    })
                    .collect();
                let unmatched = vec![true; calls.len()];
                let turn = ConversationTurn { ts: ts.to_owned(), model, text, calls, usage, cost_usd, unmatched, step };
                thread.entries.push(Entry::Assistant(turn));
            }
            Event::ActionDispatched { step, call } => {
                self.call_actors.insert(call.call_id.clone(), call.actor.clone());
                self.match_call(&call.actor, step, &call.call_id, &call.name);
            }
            Event::AgentAction { step, actor, call_id, name, arguments, result, error, .. } => {
                self.call_actors.insert(call_id.clone(), actor.clone());
                self.match_call(&actor, step, &call_id, &name);
                let child = (name == DELEGATE_TOOL)
                    .then(|| result["actor"].as_str().and_then(|a| Actor::parse(a).ok()))
                    .flatten();
                if let Some(child) = &child {
                    let goal = arguments["goal"].as_str().unwrap_or_default();
                    let goal = match arguments["context"].as_str().filter(|c| !c.trim().is_empty()) {
                        Some(context) => format!("{goal}\n\nContext:\n{context}"),
                        None => goal.to_owned(),
                    };
                    self.thread(child).goal = Some(goal);
                }
                let (content, is_error) = match (&error, &result) {
                    (Some(error), _) => (json!({"error": error}).to_string(), true),
                    (None, Value::String(s)) => (s.clone(), false),
                    (None, value) => (value.to_string(), false),
                };
                self.conversation.results.insert(call_id, CallResult { content, is_error, child });
            }
            Event::Observation { observation, .. } => self.observe(ts, observation),
            Event::Reminder { actor, text, .. } => self.say(&actor, ts, &text),
            Event::Said { actor: Actor::User, text, .. } => self.say(&Actor::Main, ts, &text),
            _ => {}
        }
    }

    /// Gives the call of `actor`'s turn at `step` the id it was dispatched under: the one the
    /// model proposed when it kept it, else the first unmatched call of that name.
    fn match_call(&mut self, actor: &Actor, step: u32, id: &str, name: &str) {
        let thread = self.thread(actor);
        let turn = thread.entries.iter_mut().rev().find_map(|e| match e {
            Entry::Assistant(turn) if turn.step == step => Some(turn),
            _ => None,
        });
        let Some(turn) = turn else { return };
        let by_id = (0..turn.calls.len()).find(|&i| turn.unmatched[i] && turn.calls[i].id == id);
        let by_name = || (0..turn.calls.len()).find(|&i| turn.unmatched[i] && turn.calls[i].name == name);
        // A call the model did not propose (the agent's own `final_answer` for a text
        // answer) is not the model's turn.
        if let Some(i) = by_id.or_else(by_name) {
            turn.unmatched[i] = false;
            turn.calls[i].id = id.to_owned();
        }
    }

    fn observe(&mut self, ts: &str, observation: Observation) {
        let actor = match &observation.call_id {
            Some(id) => self.call_actors.get(id).cloned().unwrap_or_default(),
            None => Actor::Main,
        };
        if let Some(call_id) = &observation.call_id {
            let content = match (&observation.error, &observation.tool_result) {
                (None, Some(Value::String(s))) => s.clone(),
                (None, Some(result)) => result.to_string(),
                (None, None) => "null".to_owned(),
                (Some(error), partial) => json!({"error": error, "tool_result": partial}).to_string(),
            };
            self.conversation.cut_payloads |= cut_by_the_log(&content);
            let result = CallResult { content, is_error: observation.error.is_some(), child: None };
            self.conversation.results.insert(call_id.clone(), result);
        }
        for text in &observation.messages {
            self.say(&actor, ts, text);
        }
    }

    fn finish(mut self) -> Conversation {
        // A call never dispatched (refused before it ran) keeps the model's id, or gets one.
        for thread in &mut self.conversation.threads {
            let actor = thread.actor.to_string().replace('.', "_");
            for entry in &mut thread.entries {
                if let Entry::Assistant(turn) = entry {
                    for (i, call) in turn.calls.iter_mut().enumerate() {
                        if call.id.is_empty() {
                            call.id = format!("{actor}_s{}_{}", turn.step, i + 1);
                        }
                    }
                }
            }
        }
        self.conversation.threads.sort_by_key(|t| (t.actor.depth(), t.actor.to_string()));
        self.conversation
    }
}

/// The system prompt and tools of a logged request body: OpenAI's chat form (`messages`
/// with a `system` message, `tools` as functions) or Anthropic's (`system`, `tools` with
/// `input_schema`). Tools come back in OpenAI's function form.
fn from_request(request: &Value) -> (Option<String>, Option<Vec<Value>>) {
    let text = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => Some(parts.iter().filter_map(|p| p["text"].as_str()).collect::<Vec<_>>().join("\n")),
        _ => None,
    };
    let system = text(&request["system"]).or_else(|| {
        let messages = request["messages"].as_array()?;
        messages.iter().find(|m| m["role"] == "system" || m["role"] == "developer").and_then(|m| text(&m["content"]))
    });
    let tools = request["tools"].as_array().map(|tools| {
        tools
            .iter()
            .map(|t| match t.get("input_schema") {
                Some(schema) => json!({"type": "function", "function": {
                    "name": t["name"], "description": t["description"], "parameters": schema,
                }}),
                None => t.clone(),
            })
            .collect()
    });
    (system, tools)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_cut_by_the_log_is_told_from_one_cut_at_the_output_cap() {
        use crate::contract::fit::fit;
        let long = json!({"stdout": "x".repeat(100_000)});
        let (logged, _) = fit(&long, OVER_BUDGET_PAYLOAD_BYTES);
        assert!(cut_by_the_log(&logged.to_string()), "{logged}");
        let (capped, _) = fit(&long, 16 * 1024);
        assert!(!cut_by_the_log(&capped.to_string()));
        assert!(!cut_by_the_log("[... cut: showing nothing"));
    }

    #[test]
    fn the_system_prompt_and_tools_are_read_from_either_providers_request() {
        let openai = json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]});
        let (system, tools) = from_request(&openai);
        assert_eq!(system.as_deref(), Some("Be brief."));
        assert_eq!(tools.unwrap()[0]["function"]["name"], "f");
        let anthropic = json!({"system": [{"type": "text", "text": "Be brief."}],
            "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}]});
        let (system, tools) = from_request(&anthropic);
        assert_eq!(system.as_deref(), Some("Be brief."));
        assert_eq!(
            tools.unwrap()[0],
            json!({"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}})
        );
        assert_eq!(from_request(&json!({})), (None, None));
    }
}
