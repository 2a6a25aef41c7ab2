//! The `memory` agent (seed 002): replays a conversation into a memory, one invocation at
//! a time, as an invoker drives it through control states. Some calls are the agent's own
//! code (`get_context`, `list_entries`, `await_consistency`: no model); the model writes
//! the others (`add_entry`, `put_context`) from the seed's prompts. Every call goes to the
//! world like any agent's: the agent only proposes them.
//!
//! When the replay is over and the task asks a question, the agent answers it from the
//! memory, as the suite chooses (`answering.rs`): by default it searches the entries for
//! the question and reads the context document (its own calls), then asks the model with
//! both in the prompt, and gives the model's words as its final answer; with
//! `answering: {with: tools}` a tool-calling agent offered only the store's read tools
//! answers. Either way, what the reads returned gives retrieval recall: by evidence session
//! and by evidence turn (an entry's key names the session and message it was written for).

pub mod answering;
mod checkpoint;
pub mod control;
pub mod ingestion;
mod kind;
mod prompts;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use super::tool_calling::ToolCallingAgent;
use crate::agent::{Agent, AgentFault, Proposal, Turn};
use crate::contract::{Actor, FINAL_TOOL, Observation, ToolCall, ToolSpec};
use crate::domain::conversation::{self, ChatMessage, Session};
use crate::log::event::Stage;
use crate::log::{Event, TurnRef, UnscoredCause, Usage};
use crate::model::{Caller, LanguageModel, Message, ModelRequest, ModelResponse, respond_logged};
use answering::ToolAnswer;
pub use answering::{AnswerWith, Answering};
pub use checkpoint::FILE as CHECKPOINT_FILE;
use checkpoint::{ReplayCheckpoints, ReplaySpent, ThreadState};
use control::{ADD_ENTRY, Ask, ControlState, GET_CONTEXT, Invocation, LIST_ENTRIES, Next, SEARCH_ENTRIES, decide};
use ingestion::{Ingested, Lease};
pub use kind::{Memory, Settings};
pub use prompts::MemoryPrompts;
use prompts::Prompts;

/// Carries run `from`'s checkpoints and ingestions into run `to` (a merge of shards), so
/// that a resume of `to` goes on with each thread where `from` left it.
pub fn carry(from: &std::path::Path, to: &std::path::Path) -> Result<(), String> {
    let checkpoints = from.join(checkpoint::FILE);
    if checkpoints.is_file() {
        ReplayCheckpoints::open(&to.join(checkpoint::FILE))?.absorb(&checkpoints)?;
    }
    ingestion::carry(from, to)
}

/// The model calls `thread`'s replay had made at its last checkpoint in the run `run_dir`
/// (none without one): under `mock`, the script's turns that an attempt going on from that
/// checkpoint does not play again.
pub fn replayed_calls(run_dir: &std::path::Path, thread: &str) -> Result<u32, String> {
    let file = run_dir.join(checkpoint::FILE);
    if !file.is_file() {
        return Ok(0);
    }
    Ok(ReplayCheckpoints::open(&file)?.load(thread)?.spent.model_calls)
}

/// Every `flush_every`-th message of a session also flushes, unless the suite says.
pub const DEFAULT_FLUSH_EVERY: u32 = 6;

/// The vault and memory the agent writes to.
const VAULT_ID: &str = "default";
const MEMORY_ID: &str = "default";

/// What a memory agent is built from, for one episode.
pub struct MemoryAgentParts {
    pub flush_every: u32,
    pub prompts: MemoryPrompts,
    /// The conversation to replay, already in date order, or why the task's cannot be read.
    pub sessions: Result<Vec<Session>, String>,
    /// The thread the agent's state is kept under (the episode's id).
    pub thread: String,
    /// The run folder, where the checkpoints are; `None` outside a run.
    pub run_dir: Option<PathBuf>,
    /// The question to answer after the replay (the task's input; none when empty), and
    /// the date it is asked on.
    pub question: String,
    pub question_date: Option<String>,
    /// The question's type and whether it is an abstention question, for the report; the
    /// sessions that hold its evidence, to tell whether the agent's reads found them.
    /// None of these is shown to the model.
    pub question_type: Option<String>,
    pub abstention: bool,
    pub evidence_sessions: Vec<String>,
    /// The turns that hold the evidence, as (session id, message number from 1).
    pub evidence_turns: Vec<(String, u32)>,
    /// How the question is answered.
    pub answering: Answering,
    /// Whether the episode replays its haystack, and whether it saves the result for others.
    pub ingestion: IngestionPlan,
    /// `ingest: {share}`: whether one ingestion may serve every episode of the same key.
    pub share_ingestion: bool,
}

/// How an episode's memory gets filled.
pub enum IngestionPlan {
    /// It replays its haystack, for itself alone.
    Own,
    /// It replays its haystack, holding the key's lease, and saves the result for the
    /// episodes that need the same.
    Shared(Lease),
    /// Another episode's replay, restored: no model call ingests.
    Restored(Box<Ingested>),
}

impl MemoryAgentParts {
    /// Nothing to replay, no question, no checkpoints: an agent that only reports.
    pub fn empty(thread: &str) -> Self {
        MemoryAgentParts {
            flush_every: DEFAULT_FLUSH_EVERY,
            prompts: MemoryPrompts::default(),
            sessions: Ok(Vec::new()),
            thread: thread.to_owned(),
            run_dir: None,
            question: String::new(),
            question_date: None,
            question_type: None,
            abstention: false,
            evidence_sessions: Vec::new(),
            evidence_turns: Vec::new(),
            answering: Answering::default(),
            ingestion: IngestionPlan::Own,
            share_ingestion: false,
        }
    }
}

pub struct MemoryAgent {
    model: Arc<dyn LanguageModel>,
    model_name: String,
    prompts: Prompts,
    thread: String,
    sessions: Vec<Session>,
    plan: Vec<Invocation>,
    /// Why the agent cannot run (a conversation it cannot read, checkpoints it cannot open).
    broken: Option<String>,
    run_dir: Option<PathBuf>,
    /// Behind a lock only so that the agent can be shared while it waits for the model.
    checkpoints: Option<std::sync::Mutex<ReplayCheckpoints>>,
    loaded: bool,
    state: ThreadState,
    current: Option<InProgress>,
    question: String,
    question_date: Option<String>,
    answer: AnswerStage,
    calls_made: u64,
    question_type: Option<String>,
    abstention: bool,
    evidence_sessions: Vec<String>,
    evidence_turns: Vec<(String, u32)>,
    answering: Answering,
    /// The tool-calling agent answering, once it started (`answering: {with: tools}`).
    tool_answer: Option<ToolAnswer>,
    /// Why the answering agent failed on its own (it never gave its answer).
    failed: Option<String>,
    /// What the answer's model calls used (the replay's are in the state, `spent`).
    answer_usage: Usage,
    /// What this episode's earlier, killed attempt spent on the replay this one goes on
    /// with: charged to the episode in its first turn.
    carried: Option<ReplaySpent>,
    ingestion: IngestionPlan,
    /// The stage the agent last announced.
    stage: Option<Stage>,
    /// The thread whose replay wrote the entries' keys: another episode's, when its
    /// ingestion was restored.
    key_thread: Option<String>,
}

/// One invocation under way: the seed's `tool_history`, as what the agent needs of it.
struct InProgress {
    invocation: Invocation,
    last_tool: Option<String>,
    /// The calls proposed last turn, by id, and whether the model wrote each.
    pending: Vec<(String, String, bool)>,
    direct: Vec<String>,
    model: Vec<String>,
    /// The reminder given after the model's first wrong answer, if it was given.
    reminded: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
enum AnswerStage {
    NotYet,
    /// The memory's reads for the question were proposed.
    Reading(Vec<String>),
    /// A tool-calling agent is answering.
    Tools,
    Given,
}

impl MemoryAgent {
    pub fn new(model: Arc<dyn LanguageModel>, model_name: &str, parts: MemoryAgentParts) -> Self {
        let (sessions, broken) = match parts.sessions {
            Ok(sessions) => (sessions, None),
            Err(why) => (Vec::new(), Some(why)),
        };
        let plan = control::invocations(&sessions, parts.flush_every);
        MemoryAgent {
            model,
            model_name: model_name.to_owned(),
            prompts: Prompts::resolve(parts.prompts),
            thread: parts.thread,
            sessions,
            plan,
            broken,
            run_dir: parts.run_dir,
            checkpoints: None,
            loaded: false,
            state: ThreadState::default(),
            current: None,
            question: parts.question,
            question_date: parts.question_date,
            answer: AnswerStage::NotYet,
            calls_made: 0,
            question_type: parts.question_type,
            abstention: parts.abstention,
            evidence_sessions: parts.evidence_sessions,
            evidence_turns: parts.evidence_turns,
            answering: parts.answering,
            tool_answer: None,
            failed: None,
            answer_usage: Usage::default(),
            carried: None,
            ingestion: parts.ingestion,
            stage: None,
            key_thread: None,
        }
    }

    /// The thread's state as its last checkpoint left it, read once.
    fn load(&mut self) -> Result<(), AgentFault> {
        if self.loaded {
            return Ok(());
        }
        self.loaded = true;
        if let Some(why) = &self.broken {
            return Err(fault(why.clone()));
        }
        // Whether the state holds another episode's work, taken over.
        let mut taken_over = false;
        let mut checkpoints = match &self.run_dir {
            Some(dir) => {
                let mut checkpoints = ReplayCheckpoints::open(&dir.join(checkpoint::FILE)).map_err(fault)?;
                self.state = checkpoints.load(&self.thread).map_err(fault)?;
                if let IngestionPlan::Shared(Lease { taken_over: Some(earlier), .. }) = &self.ingestion {
                    // The replay another episode began, and its store (copied at the claim),
                    // go on from where that episode's last checkpoint left them.
                    self.state = checkpoints.load(earlier).map_err(fault)?;
                    taken_over = true;
                }
                Some(checkpoints)
            }
            None => None,
        };
        if let IngestionPlan::Restored(ingested) = &self.ingestion {
            self.state = ingested.thread_state();
            // Another episode's replay, restored: this one spent nothing on it.
            taken_over = ingested.saved_by.as_deref() != Some(self.thread.as_str());
        }
        if taken_over {
            // What another episode spent counts in that episode: in its finish when it
            // ended (a limit, a fault), or never again when it was killed, since whose
            // attempt was killed and whose finished cannot be told apart here.
            self.state.spent = ReplaySpent::default();
        }
        if let Some(checkpoints) = checkpoints.as_mut()
            && (taken_over || matches!(self.ingestion, IngestionPlan::Restored(_)))
        {
            checkpoints.save(&self.thread, &self.state).map_err(fault)?;
        }
        if self.state.spent != ReplaySpent::default() {
            self.carried = Some(self.state.spent);
        }
        self.checkpoints = checkpoints.map(std::sync::Mutex::new);
        match &self.ingestion {
            IngestionPlan::Restored(ingested) => self.key_thread = Some(ingested.episode.clone()),
            IngestionPlan::Shared(lease) if lease.key_thread != self.thread => {
                self.key_thread = Some(lease.key_thread.clone());
            }
            _ => {}
        }
        Ok(())
    }

    /// Announces the ingest stage, once: the key of a shared ingestion; when it was
    /// restored, which one; and what an earlier attempt spent on the replay this one goes
    /// on with, which this turn is charged for.
    fn begin_ingest(&mut self, turn: &Turn<'_>, spent: &mut Spent) {
        if self.stage.is_some() {
            return;
        }
        self.stage = Some(Stage::Ingest);
        let key = match &self.ingestion {
            IngestionPlan::Own => None,
            IngestionPlan::Shared(lease) => Some(lease.key.clone()),
            IngestionPlan::Restored(ingested) => Some(ingested.key.clone()),
        };
        turn.recorder.emit(&Event::Stage { stage: Stage::Ingest, ingestion: key });
        if let IngestionPlan::Restored(ingested) = &self.ingestion
            && self.carried.is_none()
        {
            turn.recorder.emit(&Event::IngestReused {
                key: ingested.key.clone(),
                from_episode: ingested.episode.clone(),
                entries: ingested.state.entries,
                model_calls: ingested.model_calls,
            });
        }
        if let Some(earlier) = self.carried.take() {
            turn.recorder.emit(&Event::IngestResumed {
                next: self.state.next as u32,
                model_calls: earlier.model_calls,
                usage: earlier.usage,
                cost_usd: earlier.cost(),
                steps: earlier.done.steps,
                tool_calls: earlier.done.tool_calls,
                tool_errors: earlier.done.tool_errors,
            });
            turn.episode.carry(earlier.done);
            spent.usage.add(earlier.usage);
            spent.cost_usd = spent.cost_usd.zip(earlier.cost()).map(|(a, b)| crate::log::add_cost(a, b));
        }
    }

    /// The replay is over: a shared one is saved for the episodes that need it, and the
    /// answer stage begins.
    fn end_ingest(&mut self, turn: &Turn<'_>) -> Result<(), AgentFault> {
        if self.stage == Some(Stage::Answer) {
            return Ok(());
        }
        if let IngestionPlan::Shared(lease) = std::mem::replace(&mut self.ingestion, IngestionPlan::Own) {
            let key = lease.key.clone();
            self.state.spent.done = turn.episode.done_before_this_turn();
            lease.save(&self.state).map_err(fault)?;
            turn.recorder.emit(&Event::IngestSaved {
                key,
                entries: self.state.entries,
                model_calls: self.state.spent.model_calls,
            });
        }
        self.stage = Some(Stage::Answer);
        turn.recorder.emit(&Event::Stage { stage: Stage::Answer, ingestion: None });
        Ok(())
    }

    fn call_id(&mut self) -> String {
        self.calls_made += 1;
        format!("mem_{}", self.calls_made)
    }

    fn session(&self, invocation: &Invocation) -> &Session {
        &self.sessions[invocation.session]
    }

    /// Starts the next invocation of the replay; `false` when the replay is over.
    fn start_next(&mut self) -> bool {
        let Some(&invocation) = self.plan.get(self.state.next) else { return false };
        match invocation.control {
            ControlState::StartSession => self.state.session_start = self.state.conversation_history.len(),
            ControlState::ProcessMessage | ControlState::ProcessMessageAndFlush => {
                if let Some(message) = self.to_process(&invocation) {
                    self.state.conversation_history.push(message);
                }
            }
            ControlState::EndSession => {}
        }
        self.current = Some(InProgress {
            invocation,
            last_tool: None,
            pending: Vec::new(),
            direct: Vec::new(),
            model: Vec::new(),
            reminded: None,
        });
        true
    }

    /// The message an invocation processes.
    fn to_process(&self, invocation: &Invocation) -> Option<ChatMessage> {
        let n = invocation.message?;
        self.session(invocation).messages.get(n - 1).cloned()
    }

    /// Ends the invocation under way (with `error` when the model never wrote the call it
    /// was asked for), logs it, and checkpoints the thread.
    fn finish_invocation(&mut self, turn: &Turn<'_>, error: Option<String>) -> Result<(), AgentFault> {
        let Some(done) = self.current.take() else { return Ok(()) };
        if error.is_some() {
            self.state.errors += 1;
        }
        let session = self.session(&done.invocation).id.clone();
        turn.recorder.emit(&Event::MemoryInvocation {
            step: turn.allowance.step,
            thread: self.thread.clone(),
            session,
            control: done.invocation.control.name().to_owned(),
            message: done.invocation.message.map(|n| n as u32),
            direct: done.direct,
            model: done.model,
            error,
        });
        self.state.next += 1;
        self.state.spent.done = turn.episode.done_before_this_turn();
        match &self.checkpoints {
            Some(checkpoints) => {
                let mut checkpoints = checkpoints.lock().unwrap_or_else(|p| p.into_inner());
                checkpoints.save(&self.thread, &self.state).map_err(fault)
            }
            None => Ok(()),
        }
    }

    /// Reads the results of last turn's calls into the invocation: the last tool that ran,
    /// what `start_session` retrieved, the entries stored. Returns what failed, if a call did.
    fn read(&mut self, observations: &[Observation]) -> Option<(String, bool, String)> {
        let current = self.current.as_mut()?;
        let pending = std::mem::take(&mut current.pending);
        let mut failed = None;
        for (call_id, tool, by_model) in pending {
            let Some(obs) = observations.iter().find(|o| o.call_id.as_deref() == Some(&call_id)) else {
                failed.get_or_insert((tool.clone(), by_model, "no result came back".to_owned()));
                continue;
            };
            if let Some(error) = &obs.error {
                failed.get_or_insert((tool.clone(), by_model, error.message.clone()));
                continue;
            }
            let result = payload(obs.tool_result.as_ref());
            if tool == GET_CONTEXT || tool == LIST_ENTRIES {
                let label = if tool == GET_CONTEXT { "Previous context" } else { "Recent entries" };
                let text = match &result {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                self.state
                    .conversation_history
                    .push(ChatMessage { role: "system".into(), content: format!("{label}:\n{text}") });
            }
            if tool == ADD_ENTRY && result.get("stored") != Some(&Value::Bool(false)) {
                self.state.entries += 1;
                let session = self.sessions[current.invocation.session].id.clone();
                match self.state.entries_by_session.iter_mut().find(|(id, _)| *id == session) {
                    Some((_, n)) => *n += 1,
                    None => self.state.entries_by_session.push((session, 1)),
                }
            }
            if by_model {
                current.model.push(tool.clone());
            } else {
                current.direct.push(tool.clone());
            }
            current.last_tool = Some(tool);
        }
        failed
    }

    /// The calls the agent makes itself, with fixed arguments.
    fn direct(&mut self, tools: &[&str], offered: &[ToolSpec]) -> Vec<ToolCall> {
        let mut calls = Vec::with_capacity(tools.len());
        for tool in tools {
            let mut arguments = json!({});
            if *tool == LIST_ENTRIES {
                arguments["limit"] = json!(10);
            }
            stamp(&mut arguments, offered, tool, &[("vault_id", json!(VAULT_ID)), ("memory_id", json!(MEMORY_ID))]);
            let id = self.call_id();
            if let Some(current) = self.current.as_mut() {
                current.pending.push((id.clone(), tool.to_string(), false));
            }
            calls.push(ToolCall::new(id, *tool, arguments));
        }
        calls
    }

    /// The seed's prompt for `ask`, for the invocation under way.
    fn prompt(&self, ask: Ask) -> String {
        let Some(current) = &self.current else { return String::new() };
        let session = self.session(&current.invocation);
        let history =
            &self.state.conversation_history[self.state.session_start.min(self.state.conversation_history.len())..];
        let header = format!(
            "Vault ID: {VAULT_ID}\nMemory ID: {MEMORY_ID}\nSession: {}{}",
            session.id,
            session.date.as_deref().map(|d| format!(" ({d})")).unwrap_or_default()
        );
        match ask {
            Ask::AddEntry => {
                let (previous, message) = match history.split_last() {
                    Some((last, previous)) => (previous, Some(last)),
                    None => (history, None),
                };
                self.prompts.add_entry(&header, &format_messages(previous), message)
            }
            Ask::PutContext => self.prompts.put_context(&header, &format_messages(history)),
        }
    }

    /// Asks the model to write the call `ask` needs; one corrective reminder when its
    /// answer is not that call. `None` when even the reminded answer is not.
    async fn ask_for(&mut self, turn: &Turn<'_>, ask: Ask, spent: &mut Spent) -> Result<Option<ToolCall>, AgentFault> {
        let tool = ask.tool();
        let Some(spec) = turn.tools.iter().find(|t| t.name == tool).cloned() else {
            return Err(AgentFault {
                cause: UnscoredCause::ConfigurationError,
                message: format!("the memory agent needs the tool `{tool}`, which the environment does not offer"),
            });
        };
        let mut messages = vec![
            Message::System { content: self.prompt(ask) },
            Message::User { content: "Execute the required operation.".into() },
        ];
        if let Some(reminder) = self.current.as_ref().and_then(|c| c.reminded.clone()) {
            messages.push(Message::User { content: reminder });
        }
        loop {
            let response = self.respond(turn, &messages, std::slice::from_ref(&spec), spent).await?;
            if let Some(proposed) = response.tool_calls.iter().find(|c| c.name == tool) {
                let mut arguments = proposed.arguments.clone();
                let stamps = self.stamps(ask);
                stamp(&mut arguments, turn.tools, tool, &stamps);
                let id = self.call_id();
                if let Some(current) = self.current.as_mut() {
                    current.pending.push((id.clone(), tool.to_owned(), true));
                }
                return Ok(Some(ToolCall::new(id, tool, arguments)));
            }
            let Some(current) = self.current.as_mut() else { return Ok(None) };
            if current.reminded.is_some() {
                return Ok(None);
            }
            let wrote = match response.tool_calls.first() {
                Some(other) => format!("you called `{}`", other.name),
                None => "you called no tool".to_owned(),
            };
            let reminder = format!("{wrote}. Call the `{tool}` tool now, exactly once, following the rules above.");
            turn.recorder.emit(&Event::Reminder {
                step: turn.allowance.step,
                actor: Actor::Main,
                kind: "memory_protocol".into(),
                paths: Vec::new(),
                text: reminder.clone(),
            });
            current.reminded = Some(reminder.clone());
            messages.push(Message::Assistant { content: response.text.clone(), tool_calls: Vec::new() });
            messages.push(Message::User { content: reminder });
        }
    }

    /// What the agent's code sets in a call the model wrote: the ids of its memory and, for
    /// an entry, when the message was said and a key that keeps a repeated call harmless.
    fn stamps(&self, ask: Ask) -> Vec<(&'static str, Value)> {
        let mut stamps = vec![("vault_id", json!(VAULT_ID)), ("memory_id", json!(MEMORY_ID))];
        if let (Ask::AddEntry, Some(current)) = (ask, &self.current) {
            let session = self.session(&current.invocation);
            let n = current.invocation.message.unwrap_or(0);
            let thread = self.key_thread.as_deref().unwrap_or(&self.thread);
            stamps.push(("key", json!(format!("{thread}/{}/{n}", session.id))));
            if let Some(date) = &session.date {
                stamps.push(("time", json!(conversation::message_time(date, n))));
            }
        }
        stamps
    }

    async fn respond(
        &mut self,
        turn: &Turn<'_>,
        messages: &[Message],
        tools: &[ToolSpec],
        spent: &mut Spent,
    ) -> Result<ModelResponse, AgentFault> {
        let request = ModelRequest { deadline: Some(&turn.allowance.deadline), ..ModelRequest::new(messages, tools) };
        let (result, event) = respond_logged(
            self.model.as_ref(),
            &self.model_name,
            &request,
            turn.allowance.step,
            Caller::Actor(Actor::Main),
        )
        .await;
        turn.recorder.emit(&event);
        let response = result.map_err(|e| AgentFault { cause: e.cause, message: e.message })?;
        spent.usage.add(response.usage);
        if self.answer == AnswerStage::NotYet {
            self.state.spent.add(response.usage, response.cost_usd);
        } else {
            self.answer_usage.add(response.usage);
        }
        spent.cost_usd = match (spent.cost_usd, response.cost_usd) {
            (Some(a), Some(b)) => Some(crate::log::add_cost(a, b)),
            _ => None,
        };
        Ok(response)
    }

    /// After the replay: the question answered from the memory, or, with no question, a
    /// report of what was stored.
    async fn answer(&mut self, turn: &Turn<'_>, spent: &mut Spent) -> Result<Vec<ToolCall>, AgentFault> {
        match std::mem::replace(&mut self.answer, AnswerStage::Given) {
            AnswerStage::NotYet if !self.question.trim().is_empty() && self.answering.with == AnswerWith::Tools => {
                let agent = ToolCallingAgent::new(
                    self.model.clone(),
                    &self.model_name,
                    Some(self.prompts.answer_with_tools(self.question_date.as_deref())),
                    false,
                );
                self.tool_answer = Some(ToolAnswer::new(agent, &self.answering, &self.question));
                self.answer = AnswerStage::Tools;
                self.answer_with_tools(turn, spent).await
            }
            AnswerStage::Tools => {
                self.answer = AnswerStage::Tools;
                self.answer_with_tools(turn, spent).await
            }
            AnswerStage::NotYet if !self.question.trim().is_empty() => {
                let search =
                    if turn.tools.iter().any(|t| t.name == SEARCH_ENTRIES) { SEARCH_ENTRIES } else { LIST_ENTRIES };
                let mut calls = Vec::new();
                for tool in [search, GET_CONTEXT] {
                    let mut arguments = match tool {
                        SEARCH_ENTRIES => json!({"query": self.question, "limit": 10}),
                        LIST_ENTRIES => json!({"limit": 50}),
                        _ => json!({}),
                    };
                    stamp(
                        &mut arguments,
                        turn.tools,
                        tool,
                        &[("vault_id", json!(VAULT_ID)), ("memory_id", json!(MEMORY_ID))],
                    );
                    calls.push(ToolCall::new(self.call_id(), tool, arguments));
                }
                self.answer = AnswerStage::Reading(calls.iter().map(|c| c.call_id.clone()).collect());
                Ok(calls)
            }
            AnswerStage::Reading(ids) => {
                let observed: Vec<&Observation> = ids
                    .iter()
                    .filter_map(|id| turn.observations.iter().find(|o| o.call_id.as_deref() == Some(id)))
                    .collect();
                let results: Vec<Value> = observed.iter().map(|o| payload(o.tool_result.as_ref())).collect();
                let retrieved = self.found(&results);
                let read: Vec<String> = observed
                    .iter()
                    .map(|o| match (&o.error, payload(o.tool_result.as_ref())) {
                        (Some(e), _) => format!("(the memory could not be read: {})", e.message),
                        (None, Value::String(s)) => s,
                        (None, Value::Null) => String::new(),
                        (None, v) => v.to_string(),
                    })
                    .collect();
                let prompt = self.prompts.answer(&read.join("\n\n"), &self.question, self.question_date.as_deref());
                let messages = [Message::System { content: prompt }, Message::User { content: self.question.clone() }];
                self.answer = AnswerStage::Given;
                let response = self.respond(turn, &messages, &[], spent).await?;
                let answer = response.text.unwrap_or_default();
                self.report(turn, Some(retrieved));
                Ok(vec![ToolCall::new(self.call_id(), FINAL_TOOL, json!({ "answer": answer }))])
            }
            _ => {
                self.report(turn, None);
                let answer = format!(
                    "replayed {} session(s): {} entries stored, {} invocation(s) without the call asked for",
                    self.sessions.len(),
                    self.state.entries,
                    self.state.errors
                );
                Ok(vec![ToolCall::new(self.call_id(), FINAL_TOOL, json!({ "answer": answer }))])
            }
        }
    }
}

impl MemoryAgent {
    /// One turn of the tool-calling answer: its calls, and once it answers, the report.
    async fn answer_with_tools(&mut self, turn: &Turn<'_>, spent: &mut Spent) -> Result<Vec<ToolCall>, AgentFault> {
        let Some(answer) = self.tool_answer.as_mut() else { return Ok(Vec::new()) };
        let answered = answer.propose(turn).await?;
        let proposal = answered.proposal;
        spent.usage.add(proposal.usage);
        self.answer_usage.add(proposal.usage);
        spent.cost_usd = match (spent.cost_usd, proposal.cost_usd) {
            (Some(a), Some(b)) => Some(crate::log::add_cost(a, b)),
            _ => None,
        };
        if answered.done {
            self.answer = AnswerStage::Given;
            // An answering agent that read nothing has no recall to count, rather than none found.
            let results = std::mem::take(&mut answer.read);
            let retrieved = (!results.is_empty()).then(|| self.found(&results));
            self.report(turn, retrieved);
        }
        self.failed = proposal.failed;
        Ok(proposal.calls)
    }

    /// What the reads for the question returned: the entries' sources, each once, in the
    /// order found. An entry the agent wrote has the key `thread/session/message`.
    fn found(&self, results: &[Value]) -> Found {
        let mut found = Found::default();
        let entries = results.iter().filter_map(|result| result.get("entries")?.as_array());
        for entry in entries.flatten() {
            let Some(key) = entry.get("key").and_then(Value::as_str) else { continue };
            let Some((session, n)) = self.source(key) else { continue };
            if !found.sessions.iter().any(|s| s == session) {
                found.sessions.push(session.to_owned());
            }
            if !found.turns.iter().any(|(s, m)| s == session && *m == n) {
                found.turns.push((session.to_owned(), n));
            }
        }
        found
    }

    /// The session and message number an entry's key names: `<thread>/<session id>/<n>`,
    /// the thread the replay ran under (this episode's, or the one whose ingestion it
    /// restored) and the session one of the conversation's.
    fn source(&self, key: &str) -> Option<(&str, u32)> {
        let thread = self.key_thread.as_deref().unwrap_or(&self.thread);
        let rest = key.strip_prefix(thread)?.strip_prefix('/')?;
        let (session, n) = rest.rsplit_once('/')?;
        let n: u32 = n.parse().ok()?;
        let session = self.sessions.iter().map(|s| s.id.as_str()).find(|id| *id == session)?;
        Some((session, n))
    }

    /// The `memory_answered` event: what the replay stored and spent, and, when the agent
    /// read the memory for a question, which evidence sessions and turns it found.
    fn report(&self, turn: &Turn<'_>, retrieved: Option<Found>) {
        let recall = match (&retrieved, self.evidence_sessions.len()) {
            (Some(found), n) if n > 0 => {
                let hit = self.evidence_sessions.iter().filter(|s| found.sessions.contains(s)).count();
                Some(hit as f64 / n as f64)
            }
            _ => None,
        };
        let turn_recall = match (&retrieved, self.evidence_turns.len()) {
            (Some(found), n) if n > 0 => {
                let hit = self.evidence_turns.iter().filter(|t| found.turns.contains(t)).count();
                Some(hit as f64 / n as f64)
            }
            _ => None,
        };
        let retrieved = retrieved.unwrap_or_default();
        turn.recorder.emit(&Event::MemoryAnswered {
            step: turn.allowance.step,
            thread: self.thread.clone(),
            question_type: self.question_type.clone(),
            abstention: self.abstention,
            sessions: self.sessions.len() as u32,
            entries: self.state.entries,
            entries_by_session: self.state.entries_by_session.iter().cloned().collect(),
            errors: self.state.errors,
            ingest_usage: self.state.spent.usage,
            answer_usage: self.answer_usage,
            evidence_sessions: self.evidence_sessions.clone(),
            retrieved_sessions: retrieved.sessions,
            recall,
            evidence_turns: self.evidence_turns.iter().map(|(s, n)| TurnRef { session: s.clone(), turn: *n }).collect(),
            retrieved_turns: retrieved.turns.into_iter().map(|(session, turn)| TurnRef { session, turn }).collect(),
            turn_recall,
        });
    }
}

/// The sources of the entries the answer's reads returned.
#[derive(Debug, Default)]
struct Found {
    sessions: Vec<String>,
    /// (session id, message number from 1).
    turns: Vec<(String, u32)>,
}

/// What a turn's model calls used and cost.
#[derive(Default)]
struct Spent {
    usage: Usage,
    cost_usd: Option<f64>,
}

#[async_trait]
impl Agent for MemoryAgent {
    /// One turn: read what last turn's calls did, then go on through the invocations until
    /// one needs the world (its calls are this turn's proposal) or the replay is over.
    async fn propose(&mut self, turn: Turn<'_>) -> Result<Proposal, AgentFault> {
        self.load()?;
        let mut spent = Spent { usage: Usage::default(), cost_usd: Some(0.0) };
        self.begin_ingest(&turn, &mut spent);
        if let Some((tool, by_model, why)) = self.read(turn.observations) {
            let reminded = self.current.as_ref().is_some_and(|c| c.reminded.is_some());
            match (by_model, reminded) {
                // The model's call failed: it is asked again, once, with the error.
                (true, false) => {
                    if let Some(current) = self.current.as_mut() {
                        current.reminded =
                            Some(format!("Your `{tool}` call failed: {why}. Call `{tool}` again, correctly."));
                    }
                }
                _ => self.finish_invocation(&turn, Some(format!("`{tool}` failed: {why}")))?,
            }
        }
        let calls = loop {
            if self.current.is_none() && !self.start_next() {
                self.end_ingest(&turn)?;
                break self.answer(&turn, &mut spent).await?;
            }
            let (control, last_tool) = match &self.current {
                Some(c) => (c.invocation.control, c.last_tool.clone()),
                None => continue,
            };
            match decide(control, last_tool.as_deref()) {
                Next::Direct(tools) => break self.direct(tools, turn.tools),
                Next::Model(ask) => match self.ask_for(&turn, ask, &mut spent).await? {
                    Some(call) => break vec![call],
                    None => {
                        let why = format!("the model did not call `{}`, even when reminded", ask.tool());
                        self.finish_invocation(&turn, Some(why))?;
                    }
                },
                Next::Done => self.finish_invocation(&turn, None)?,
            }
        };
        Ok(Proposal {
            calls,
            usage: spent.usage,
            cost_usd: spent.cost_usd,
            failed: self.failed.take(),
            ..Proposal::default()
        })
    }
}

/// What a memory tool answered, whichever world served it: the built-in store's value as
/// it is; an MCP server's result (`{content: [blocks], structuredContent?}`) as its
/// structured content, else its text — parsed, when the text is JSON. The agent reads
/// `stored`, `entries` and the context from this, so a server that speaks the protocol
/// serves it as the built-in store does.
fn payload(result: Option<&Value>) -> Value {
    let Some(result) = result else { return Value::Null };
    let blocks = match result.get("content").and_then(Value::as_array) {
        Some(blocks) if blocks.iter().all(|b| b.get("type").is_some_and(Value::is_string)) => blocks,
        _ => return result.clone(),
    };
    if let Some(structured) = result.get("structuredContent") {
        return structured.clone();
    }
    let text: Vec<&str> = blocks.iter().filter_map(|b| b.get("text").and_then(Value::as_str)).collect();
    let text = text.join("\n");
    serde_json::from_str(&text).unwrap_or(Value::String(text))
}

fn fault(message: String) -> AgentFault {
    AgentFault { cause: UnscoredCause::Other("memory_error".into()), message }
}

/// Sets each of `stamps` in `arguments`, where the tool `tool` of `offered` takes it.
fn stamp(arguments: &mut Value, offered: &[ToolSpec], tool: &str, stamps: &[(&str, Value)]) {
    let Some(spec) = offered.iter().find(|t| t.name == tool) else { return };
    let Some(properties) = spec.parameters.get("properties").and_then(Value::as_object) else { return };
    let Some(map) = arguments.as_object_mut() else { return };
    for (key, value) in stamps {
        if properties.contains_key(*key) {
            map.insert((*key).to_owned(), value.clone());
        }
    }
}

/// Messages as the prompts show them, one `role: content` per message.
fn format_messages(messages: &[ChatMessage]) -> String {
    if messages.is_empty() {
        return "(none)".into();
    }
    messages.iter().map(|m| format!("{}: {}", m.role, m.content)).collect::<Vec<_>>().join("\n")
}
