//! The default agent (`kind: tool_calling`): the model proposes tool calls, the agent
//! passes the world's tools on to the environment and handles its own. Every decision it
//! makes is visible from `propose`: a list of named steps, run in order, no hooks.

mod kind;
pub mod notes;
pub mod plan;
pub mod session_search;
pub mod subagents;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};

use crate::agent::{Agent, AgentFault, Proposal, Turn};
use crate::contract::{
    Actor, DELEGATE_TOOL, ENTER_PLAN_MODE, EXIT_PLAN_MODE, FINAL_TOOL, MEMORY_TOOL, Observation, SESSION_SEARCH_TOOL,
    ToolCall, ToolError, ToolSpec,
};
use crate::log::{ActionClass, Event, Usage};
use crate::model::{CallUnderWay, Caller, LanguageModel, Message, ModelRequest, ModelResponse, respond_logged};
pub use kind::{DEFAULT_MAX_CHILDREN, DEFAULT_MAX_DEPTH, Settings, ToolCalling};
use notes::SharedStores;
use plan::PlanMode;
use session_search::SessionSearch;
use subagents::{Subagents, delegate_spec};

pub const FINAL_ANSWER_REMINDER: &str =
    "You answered without calling a tool. When you are done, call `final_answer` with your answer.";
pub const EMPTY_REPLY_REMINDER: &str = "Your reply was empty. Use a tool, or call `final_answer` with your answer.";

/// The reminder about files the agent knows that changed since it last read or wrote them.
pub fn stale_files_reminder(paths: &[String]) -> String {
    format!(
        "These files changed since you last read or wrote them (by a command, another agent or the user): {}. Read them again before editing them.",
        paths.join(", ")
    )
}

pub struct ToolCallingAgent {
    /// Who this agent is in the episode: its calls and model calls are logged as its.
    pub(super) actor: Actor,
    model: Arc<dyn LanguageModel>,
    model_name: String,
    transcript: Vec<Message>,
    require_final_answer: bool,
    /// The tool each call id named: ids stay unique, and results are labelled.
    call_names: HashMap<String, String>,
    /// The specs of the tools the agent handles itself (cognitive and hybrid actions),
    /// offered to the model after the world's.
    pub(super) own_tools: Vec<ToolSpec>,
    /// The suite's subagents, when it has them (`subagent.rs`).
    pub(super) subagents: Option<Arc<Subagents>>,
    /// How many subagents this agent has started: the next is `<actor>.<children + 1>`.
    pub(super) children: u32,
    /// The files this agent's subagents (and theirs) wrote, as their answers said.
    pub(super) written_below: Vec<String>,
    /// Plan mode, when the suite offers it (`agent: {plan_mode: true}`).
    plan: Option<PlanMode>,
    /// In a conversation, a text reply goes to the task's user instead of ending the episode.
    conversational: bool,
    /// The bounded memory (`memory.rs`), when the suite gives the agent one.
    memory: Option<SharedStores>,
    /// Episodic memory (`session_search.rs`), with the task this agent works on.
    session_search: Option<(Arc<SessionSearch>, String)>,
}

impl ToolCallingAgent {
    pub fn new(
        model: Arc<dyn LanguageModel>,
        model_name: &str,
        system: Option<String>,
        require_final_answer: bool,
    ) -> Self {
        let transcript =
            system.filter(|s| !s.trim().is_empty()).map(|content| Message::System { content }).into_iter().collect();
        ToolCallingAgent {
            actor: Actor::Main,
            model,
            model_name: model_name.to_owned(),
            transcript,
            require_final_answer,
            call_names: HashMap::new(),
            own_tools: Vec::new(),
            subagents: None,
            children: 0,
            written_below: Vec::new(),
            plan: None,
            conversational: false,
            memory: None,
            session_search: None,
        }
    }

    /// Lets this agent delegate (`delegate_task` is offered) while its depth is below the
    /// suite's `max_depth`.
    pub fn with_subagents(mut self, subagents: Arc<Subagents>) -> Self {
        if self.actor.depth() < subagents.max_depth {
            self.own_tools.push(delegate_spec());
        }
        self.subagents = Some(subagents);
        self
    }

    /// Gives the agent the bounded memory: the `memory` tool, and both stores shown in the
    /// system prompt with their usage. The prompt shows them as the episode starts and then
    /// stays as it is, so that the conversation's prefix (and a provider's prompt cache)
    /// holds; the tool's every answer carries the store's entries and usage as they are now.
    pub fn with_memory(mut self, stores: SharedStores) -> Self {
        let base = match self.transcript.first() {
            Some(Message::System { content }) => Some(content.clone()),
            _ => None,
        };
        let prompt = notes::system_prompt(base.as_deref(), &stores.lock().unwrap_or_else(|p| p.into_inner()));
        match self.transcript.first_mut() {
            Some(Message::System { content }) => *content = prompt,
            _ => self.transcript.insert(0, Message::System { content: prompt }),
        }
        self.own_tools.push(notes::tool_spec());
        self.memory = Some(stores);
        self
    }

    /// Gives the agent `session_search` over earlier episodes of the suite's named runs, as
    /// an agent working on `task_id` (whose own task's episodes are left out unless the
    /// suite says `same_task: true`).
    pub fn with_session_search(mut self, search: Arc<SessionSearch>, task_id: &str) -> Self {
        self.own_tools.push(session_search::tool_spec());
        self.session_search = Some((search, task_id.to_owned()));
        self
    }

    /// Offers plan mode: `enter_plan_mode`, and in plan mode `exit_plan_mode`.
    pub fn with_plan_mode(mut self) -> Self {
        self.plan = Some(PlanMode::default());
        self
    }

    /// Talks with the task's user: a text reply is said to the user.
    pub fn in_conversation(mut self) -> Self {
        self.conversational = true;
        self
    }

    /// The second half of a hybrid `exit_plan_mode`: the world's answer came back, and the
    /// agent's own code leaves plan mode if the user approved.
    fn read_plan_answers(&mut self, turn: &Turn<'_>) {
        let Some(plan) = &mut self.plan else { return };
        for obs in turn.observations {
            let Some((arguments, result)) = plan.exit_answered(obs) else { continue };
            let call_id = obs.call_id.clone().unwrap_or_default();
            turn.recorder.emit(&Event::AgentAction {
                step: turn.allowance.step,
                actor: self.actor.clone(),
                call_id,
                name: EXIT_PLAN_MODE.into(),
                class: ActionClass::Hybrid,
                arguments,
                result,
                error: None,
            });
        }
    }

    /// The plan-mode reminder, once each time plan mode begins.
    fn remind_of_plan_mode(&mut self, turn: &Turn<'_>) {
        let Some(text) = self.plan.as_mut().and_then(PlanMode::take_reminder) else { return };
        self.transcript.push(Message::User { content: text.into() });
        turn.recorder.emit(&Event::Reminder {
            step: turn.allowance.step,
            actor: self.actor.clone(),
            kind: "plan_mode".into(),
            paths: Vec::new(),
            text: text.into(),
        });
    }

    /// Answers a call the agent handled itself: the result (or the refusal) enters the
    /// transcript as the call's tool result, and the action is logged as an `agent_action`.
    pub(super) fn answer_own(
        &mut self,
        turn: &Turn<'_>,
        call: &ToolCall,
        class: ActionClass,
        result: Result<Value, ToolError>,
    ) {
        let (content, is_error) = match &result {
            Ok(Value::String(s)) => (s.clone(), false),
            Ok(value) => (value.to_string(), false),
            Err(error) => (json!({"error": error}).to_string(), true),
        };
        self.transcript.push(Message::Tool {
            call_id: call.call_id.clone(),
            name: call.name.clone(),
            content,
            is_error,
        });
        let (result, error) = match result {
            Ok(value) => (value, None),
            Err(error) => (Value::Null, Some(error)),
        };
        turn.recorder.emit(&Event::AgentAction {
            step: turn.allowance.step,
            actor: self.actor.clone(),
            call_id: call.call_id.clone(),
            name: call.name.clone(),
            class,
            arguments: call.arguments.clone(),
            result,
            error,
        });
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
                let is_error = obs.error.is_some();
                self.transcript.push(Message::Tool { call_id: call_id.clone(), name, content, is_error });
            }
            for text in &obs.messages {
                self.transcript.push(Message::User { content: text.clone() });
            }
        }
    }

    /// Gives each call an id unique in the episode, keeping the model's own when it can; a
    /// subagent's ids begin with its actor (`main_1_c_1`: providers allow only letters,
    /// digits, `_` and `-` in an id).
    fn name_call(&mut self, proposed: Option<&str>, tool: &str) -> String {
        let prefix = if self.actor.is_main() { String::new() } else { format!("{}_", self.actor).replace('.', "_") };
        let proposed = proposed.map(str::trim).filter(|id| !id.is_empty()).map(|id| format!("{prefix}{id}"));
        let id = match proposed.filter(|id| !self.call_names.contains_key(id)) {
            Some(id) => id,
            None => (self.call_names.len() + 1..)
                .map(|n| format!("{prefix}c_{n}"))
                .find(|id| !self.call_names.contains_key(id))
                .unwrap_or_default(),
        };
        self.call_names.insert(id.clone(), tool.to_owned());
        id
    }

    /// A call of this agent's.
    fn call(&self, call_id: String, name: String, arguments: Value) -> ToolCall {
        ToolCall { call_id, name, arguments, actor: self.actor.clone() }
    }

    /// Whether the world asks for one completion: the final answer is its only tool, and a
    /// text answer may end the episode.
    fn completes(&self, tools: &[ToolSpec]) -> bool {
        !self.require_final_answer && !self.conversational && tools.iter().all(|t| t.name == FINAL_TOOL)
    }

    /// Asks the model and logs the call, answered or not.
    async fn ask_model(&self, turn: &Turn<'_>) -> Result<ModelResponse, AgentFault> {
        let offered: Cow<'_, [ToolSpec]> = match &self.plan {
            Some(plan) => {
                Cow::Owned(plan.offer(turn.tools).into_iter().chain(self.own_tools.iter().cloned()).collect())
            }
            // A world whose one tool is the final answer asks for a completion (a promptfoo
            // test, a plain prompt): its text is the answer, so no tool is offered, and a
            // small model cannot end on a call to it cut short.
            None if self.own_tools.is_empty() && self.completes(turn.tools) => Cow::Borrowed(&[]),
            None if self.own_tools.is_empty() => Cow::Borrowed(turn.tools),
            None => Cow::Owned(turn.tools.iter().chain(&self.own_tools).cloned().collect()),
        };
        let request =
            ModelRequest { deadline: Some(&turn.allowance.deadline), ..ModelRequest::new(&self.transcript, &offered) };
        let caller = || Caller::Actor(self.actor.clone());
        let step = turn.allowance.step;
        let mut in_flight =
            CallUnderWay::new(self.model.as_ref(), &self.model_name, &request, (step, caller()), turn.recorder);
        let watched = in_flight.watching(&request);
        let (result, mut event) = respond_logged(self.model.as_ref(), &self.model_name, &watched, step, caller()).await;
        in_flight.landed(&mut event);
        turn.recorder.emit(&event);
        result.map_err(|e| AgentFault { cause: e.cause, message: e.message })
    }
}

#[async_trait]
impl Agent for ToolCallingAgent {
    /// One decision, as the steps it takes, in order.
    async fn propose(&mut self, turn: Turn<'_>) -> Result<Proposal, AgentFault> {
        self.perceive(turn.observations);
        self.read_plan_answers(&turn);
        self.remind_of_changed_files(&turn).await;
        self.remind_of_plan_mode(&turn);
        let response = self.ask_model(&turn).await?;
        let mut spent = Spent { usage: response.usage, cost_usd: response.cost_usd };
        let calls = self.take_calls(&response);
        let mut sorted = self.sort(&turn, calls);
        if !sorted.delegations.is_empty() {
            let delegations = std::mem::take(&mut sorted.delegations);
            spent = self.delegate_now(&turn, delegations, spent).await?;
        }
        Ok(self.answer(sorted, response.text, spent))
    }
}

/// What a turn's model calls used and cost, for the loop to count.
struct Spent {
    usage: Usage,
    cost_usd: Option<f64>,
}

/// A turn's calls, sorted by who handles them.
struct Sorted {
    /// The calls for the world (the final answer among them), in the order they were made.
    world: Vec<ToolCall>,
    /// `delegate_task` calls: subagents for the agent to start.
    delegations: Vec<ToolCall>,
    /// Whether the agent handles any call itself: that is a turn's work too, and the model
    /// goes on next turn.
    handled_own: bool,
}

impl ToolCallingAgent {
    /// Files this agent knows may have changed under it: it says so to the model, once per
    /// change, before asking it (a write of such a file is refused until it is read).
    async fn remind_of_changed_files(&mut self, turn: &Turn<'_>) {
        let changed = turn.world.changed_files(&self.actor).await;
        if changed.is_empty() {
            return;
        }
        let text = stale_files_reminder(&changed);
        self.transcript.push(Message::User { content: text.clone() });
        turn.recorder.emit(&Event::Reminder {
            step: turn.allowance.step,
            actor: self.actor.clone(),
            kind: "stale_files".into(),
            paths: changed,
            text,
        });
    }

    /// The calls of the model's response, each with an id unique in the episode, and the
    /// response in the transcript.
    fn take_calls(&mut self, response: &ModelResponse) -> Vec<ToolCall> {
        let mut calls = Vec::with_capacity(response.tool_calls.len());
        for proposed in &response.tool_calls {
            let call_id = self.name_call(proposed.id.as_deref(), &proposed.name);
            calls.push(self.call(call_id, proposed.name.clone(), proposed.arguments.clone()));
        }
        self.transcript.push(Message::Assistant { content: response.text.clone(), tool_calls: calls.clone() });
        calls
    }

    /// The one place where each call is sorted: the world's calls go back to the loop, the
    /// agent's own are handled here and never reach the environment.
    fn sort(&mut self, turn: &Turn<'_>, calls: Vec<ToolCall>) -> Sorted {
        let mut sorted = Sorted { world: Vec::with_capacity(calls.len()), delegations: Vec::new(), handled_own: false };
        for call in calls {
            match Handling::of(&call.name) {
                Handling::Physical => match self.plan.as_ref().and_then(|p| p.refusal(&call.name, turn.tools)) {
                    // Plan mode: a call that does more than read never reaches the world.
                    Some(refusal) => {
                        self.answer_own(turn, &call, ActionClass::Cognitive, Err(refusal));
                        sorted.handled_own = true;
                    }
                    None => sorted.world.push(call),
                },
                Handling::FinalAnswer => sorted.world.push(call),
                // Cognitive: subagents start after the sorting (`subagent.rs`); in plan mode,
                // where only reading is allowed, a delegation is refused like a write.
                Handling::Delegate => {
                    match self.plan.as_ref().and_then(|p| p.refusal(&call.name, turn.tools)) {
                        Some(refusal) => self.answer_own(turn, &call, ActionClass::Cognitive, Err(refusal)),
                        None => sorted.delegations.push(call),
                    }
                    sorted.handled_own = true;
                }
                // A cognitive action: the agent changes its own memory; the world never sees it.
                Handling::Memory => match self.memory.clone() {
                    Some(stores) => {
                        let result = stores.lock().unwrap_or_else(|p| p.into_inner()).act(&call.arguments);
                        self.answer_own(turn, &call, ActionClass::Cognitive, result);
                        sorted.handled_own = true;
                    }
                    None => sorted.world.push(call),
                },
                // A cognitive action: the agent reads its episodic memory; the world never sees it.
                Handling::SessionSearch => match self.session_search.clone() {
                    Some((search, task_id)) => {
                        let result = search.search(&call.arguments, &task_id, turn.episode.over());
                        self.answer_own(turn, &call, ActionClass::Cognitive, result);
                        sorted.handled_own = true;
                    }
                    None => sorted.world.push(call),
                },
                Handling::EnterPlanMode => match &mut self.plan {
                    Some(plan) => {
                        let result = plan.enter();
                        self.answer_own(turn, &call, ActionClass::Cognitive, Ok(result));
                        sorted.handled_own = true;
                    }
                    None => sorted.world.push(call),
                },
                // Hybrid: the world asks the user; `read_plan_answers` reads the answer.
                Handling::ExitPlanMode => match &mut self.plan {
                    Some(plan) => match plan.exit_refusal() {
                        Some(refusal) => {
                            self.answer_own(turn, &call, ActionClass::Cognitive, Err(refusal));
                            sorted.handled_own = true;
                        }
                        None => {
                            plan.exit_sent(&call.call_id, &call.arguments);
                            sorted.world.push(call);
                        }
                    },
                    None => sorted.world.push(call),
                },
            }
        }
        sorted
    }

    /// Starts this turn's subagents and waits for their answers, which enter the transcript
    /// before the world's results (those come with the next turn). This turn's model call
    /// counts before the children spend from the same budget; the loop has nothing left to
    /// count for it.
    async fn delegate_now(
        &mut self,
        turn: &Turn<'_>,
        delegations: Vec<ToolCall>,
        spent: Spent,
    ) -> Result<Spent, AgentFault> {
        turn.episode.spend(spent.usage, spent.cost_usd);
        self.delegate(turn, delegations).await?;
        Ok(Spent { usage: Usage::default(), cost_usd: spent.cost_usd.map(|_| 0.0) })
    }

    /// The turn's proposal: the world's calls; without any (and nothing handled here), the
    /// model's text is the answer, or the agent reminds the model what it must do, and the
    /// turn still counts against the step limit.
    fn answer(&mut self, sorted: Sorted, text: Option<String>, spent: Spent) -> Proposal {
        let Spent { usage, cost_usd } = spent;
        if !sorted.world.is_empty() || sorted.handled_own {
            return Proposal { calls: sorted.world, usage, cost_usd, to_user: None, failed: None };
        }
        let text = text.unwrap_or_default();
        if text.trim().is_empty() {
            self.transcript.push(Message::User { content: EMPTY_REPLY_REMINDER.into() });
            return Proposal { calls: Vec::new(), usage, cost_usd, to_user: None, failed: None };
        }
        // In a conversation, text is said to the user, whose reply comes back next turn.
        if self.conversational {
            return Proposal { calls: Vec::new(), usage, cost_usd, to_user: Some(text), failed: None };
        }
        if self.require_final_answer {
            self.transcript.push(Message::User { content: FINAL_ANSWER_REMINDER.into() });
            return Proposal { calls: Vec::new(), usage, cost_usd, to_user: None, failed: None };
        }
        let call_id = self.name_call(None, FINAL_TOOL);
        let call = self.call(call_id, FINAL_TOOL.into(), json!({"answer": text}));
        Proposal { calls: vec![call], usage, cost_usd, to_user: None, failed: None }
    }
}

/// Who handles a tool the model called (seed 001): the world (a physical action), the
/// agent alone (a cognitive action, which never reaches the environment), or the world and
/// then the agent's own code (a hybrid action). Every tool the agent handles has its arm
/// here, and `propose` has one `match` over them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handling {
    /// A physical action: the environment runs it.
    Physical,
    /// The agent's decision to stop. The environment still gets the call: it checks the
    /// answer against the tool's schema, logs it and ends the episode.
    FinalAnswer,
    /// A cognitive action: start subagents (`subagent.rs`); their answers are the result.
    Delegate,
    /// Cognitive: the agent enters plan mode (when the suite offers it).
    EnterPlanMode,
    /// Hybrid: the world hands the plan to the user, then the agent's code reads the answer.
    ExitPlanMode,
    /// The bounded memory (a cognitive action), when the agent has one; otherwise the call
    /// goes to the world like any other.
    Memory,
    /// Episodic memory: a search of earlier episodes (cognitive), when the suite names
    /// runs to search; otherwise the call goes to the world like any other.
    SessionSearch,
}

impl Handling {
    fn of(tool: &str) -> Handling {
        match tool {
            FINAL_TOOL => Handling::FinalAnswer,
            DELEGATE_TOOL => Handling::Delegate,
            ENTER_PLAN_MODE => Handling::EnterPlanMode,
            EXIT_PLAN_MODE => Handling::ExitPlanMode,
            MEMORY_TOOL => Handling::Memory,
            SESSION_SEARCH_TOOL => Handling::SessionSearch,
            _ => Handling::Physical,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{ActorEnding, EpisodeState, ModelFor, NoFiles, WorldView};
    use crate::budget::EpisodeLimits;
    use crate::contract::ToolSpec;
    use crate::contract::{ErrorType, ToolError};
    use crate::domain::{MockCall, MockTurn, text::Text};
    use crate::log::{EventLog, Recorder, Termination};
    use crate::model::mock::MockModel;
    use serde_json::Value;

    fn turn_of(text: Option<&str>, calls: &[(&str, Value, Option<&str>)]) -> MockTurn {
        MockTurn {
            text: text.map(|t| Text(t.into())),
            tool_calls: calls
                .iter()
                .map(|(n, a, id)| MockCall { name: (*n).into(), arguments: a.clone(), id: id.map(String::from) })
                .collect(),
        }
    }

    fn agent(turns: Vec<MockTurn>, require_final: bool) -> ToolCallingAgent {
        let model = Arc::new(MockModel::new(turns.into()));
        ToolCallingAgent::new(model, "mock", Some("be careful".into()), require_final)
    }

    fn tools() -> Vec<ToolSpec> {
        vec![
            ToolSpec::new("run_command", "run", json!({"type": "object"})),
            ToolSpec::new(FINAL_TOOL, "answer", json!({"type": "object"})),
        ]
    }

    fn first_observation() -> Observation {
        Observation::of_messages(vec!["count the lines".into()])
    }

    /// Asks the agent once, with a log that goes to a temporary file.
    async fn propose(agent: &mut ToolCallingAgent, observations: &[Observation]) -> Result<Proposal, AgentFault> {
        propose_logged(agent, observations).await.0
    }

    /// Asks the agent once and returns the events it logged as well.
    async fn propose_logged(
        agent: &mut ToolCallingAgent,
        observations: &[Observation],
    ) -> (Result<Proposal, AgentFault>, Vec<Value>) {
        propose_in(agent, observations, &NoFiles).await
    }

    /// Asks the agent once in a world that answers as `world` does.
    async fn propose_in(
        agent: &mut ToolCallingAgent,
        observations: &[Observation],
        world: &dyn WorldView,
    ) -> (Result<Proposal, AgentFault>, Vec<Value>) {
        let dir = tempfile::tempdir().unwrap();
        let (log, writer) = EventLog::create(&dir.path().join("e.jsonl"), "r").unwrap();
        let recorder = log.recorder("ep");
        let tools = tools();
        let episode = Arc::new(EpisodeState::new(EpisodeLimits::new(20, std::time::Duration::from_secs(60))));
        let allowance = episode.allowance(episode.take_step().unwrap());
        let turn = Turn { observations, tools: &tools, allowance, recorder: &recorder, world, episode: &episode };
        let result = agent.propose(turn).await;
        drop((recorder, log));
        writer.close().unwrap();
        let text = std::fs::read_to_string(dir.path().join("e.jsonl")).unwrap();
        (result, text.lines().map(|l| serde_json::from_str(l).unwrap()).collect())
    }

    #[tokio::test]
    async fn proposes_the_models_tool_calls_without_running_them() {
        let mut a = agent(vec![turn_of(None, &[("run_command", json!({"command": "wc -l f"}), None)])], false);
        let p = propose(&mut a, &[first_observation()]).await.unwrap();
        assert_eq!(p.calls, [ToolCall::new("c_1", "run_command", json!({"command": "wc -l f"}))]);
        assert_eq!(
            a.transcript()[..2],
            [Message::System { content: "be careful".into() }, Message::User { content: "count the lines".into() }]
        );
    }

    #[tokio::test]
    async fn the_main_agent_acts_as_main_and_its_model_calls_are_logged_without_an_actor() {
        let mut a = agent(vec![turn_of(None, &[("run_command", json!({"command": "ls"}), None)])], false);
        let (proposal, events) = propose_logged(&mut a, &[first_observation()]).await;
        assert_eq!(proposal.unwrap().calls[0].actor, Actor::Main);
        let model_calls: Vec<&Value> = events.iter().filter(|e| e["type"] == "model_call").collect();
        assert_eq!(model_calls.len(), 1, "{events:?}");
        assert!(model_calls[0].get("actor").is_none(), "{}", model_calls[0]);
    }

    #[test]
    fn the_final_answer_the_memory_and_plan_mode_are_the_agents_own_tools() {
        assert_eq!(Handling::of(FINAL_TOOL), Handling::FinalAnswer);
        assert_eq!(Handling::of(MEMORY_TOOL), Handling::Memory);
        assert_eq!(Handling::of("enter_plan_mode"), Handling::EnterPlanMode);
        assert_eq!(Handling::of("exit_plan_mode"), Handling::ExitPlanMode);
        assert_eq!(Handling::of(DELEGATE_TOOL), Handling::Delegate);
        for tool in ["run_command", "read_file", "kv_set", "anything"] {
            assert_eq!(Handling::of(tool), Handling::Physical, "{tool}");
        }
    }

    #[tokio::test]
    async fn a_final_answer_call_goes_out_with_the_calls_beside_it() {
        let calls = [("kv_get", json!({"key": "a"}), None), (FINAL_TOOL, json!({"answer": "1"}), None)];
        let mut a = agent(vec![turn_of(None, &calls)], true);
        let p = propose(&mut a, &[first_observation()]).await.unwrap();
        let names: Vec<&str> = p.calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["kv_get", FINAL_TOOL]);
    }

    #[tokio::test]
    async fn a_text_answer_becomes_the_final_answer() {
        let mut a = agent(vec![turn_of(Some("3"), &[])], false);
        let p = propose(&mut a, &[first_observation()]).await.unwrap();
        assert_eq!(p.calls.len(), 1);
        assert_eq!(p.calls[0].name, FINAL_TOOL);
        assert_eq!(p.calls[0].arguments, json!({"answer": "3"}));
    }

    #[tokio::test]
    async fn when_final_answer_is_required_a_text_answer_earns_a_reminder() {
        let mut a = agent(vec![turn_of(Some("3"), &[])], true);
        let p = propose(&mut a, &[first_observation()]).await.unwrap();
        assert!(p.calls.is_empty());
        assert_eq!(a.transcript().last(), Some(&Message::User { content: FINAL_ANSWER_REMINDER.into() }));
    }

    #[tokio::test]
    async fn call_ids_are_unique_in_the_episode() {
        let turn = turn_of(
            None,
            &[
                ("run_command", json!({}), Some("x")),
                ("run_command", json!({}), Some("x")),
                ("run_command", json!({}), None),
            ],
        );
        let mut a = agent(vec![turn], false);
        let p = propose(&mut a, &[first_observation()]).await.unwrap();
        let ids: Vec<&str> = p.calls.iter().map(|c| c.call_id.as_str()).collect();
        assert_eq!(ids[0], "x");
        let unique: std::collections::HashSet<&str> = ids.iter().copied().collect();
        assert_eq!(unique.len(), 3, "ids {ids:?} repeat");
    }

    #[tokio::test]
    async fn observations_enter_the_transcript_as_tool_results() {
        let turns = vec![turn_of(None, &[("run_command", json!({"command": "ls"}), None)]), turn_of(Some("done"), &[])];
        let mut a = agent(turns, false);
        let p = propose(&mut a, &[first_observation()]).await.unwrap();
        let failed = Observation::of_error(&p.calls[0].call_id, ToolError::new(ErrorType::TimeoutError, "too slow"));
        propose(&mut a, &[failed]).await.unwrap();
        let tool_message = a.transcript().iter().find(|m| matches!(m, Message::Tool { .. })).unwrap();
        let Message::Tool { call_id, name, content, is_error } = tool_message else { unreachable!() };
        assert!(is_error);
        assert_eq!((call_id.as_str(), name.as_str()), ("c_1", "run_command"));
        let content: Value = serde_json::from_str(content).unwrap();
        assert_eq!(content["error"]["type"], "TimeoutError");
    }

    /// A world where the given files changed, for the main agent only.
    struct Changed(Vec<String>);

    #[async_trait]
    impl WorldView for Changed {
        async fn changed_files(&self, actor: &Actor) -> Vec<String> {
            if actor.is_main() { self.0.clone() } else { Vec::new() }
        }

        async fn run_subagent(
            &self,
            agent: &mut dyn Agent,
            goal: &str,
            tools: &[ToolSpec],
            episode: &Arc<EpisodeState>,
            recorder: &Recorder,
        ) -> ActorEnding {
            NoFiles.run_subagent(agent, goal, tools, episode, recorder).await
        }
    }

    /// A world that runs every call it gets (the final answer as the environment does) and
    /// remembers who called what. Its subagents take their turns in a loop as small as these
    /// tests need; the environment's own loop is tested with the environment.
    #[derive(Default)]
    struct Acting(std::sync::Mutex<Vec<(String, String)>>);

    impl Acting {
        fn acted(&self) -> Vec<(String, String)> {
            self.0.lock().unwrap().clone()
        }
    }

    #[async_trait]
    impl WorldView for Acting {
        async fn changed_files(&self, _actor: &Actor) -> Vec<String> {
            Vec::new()
        }

        async fn run_subagent(
            &self,
            agent: &mut dyn Agent,
            goal: &str,
            tools: &[ToolSpec],
            episode: &Arc<EpisodeState>,
            recorder: &Recorder,
        ) -> ActorEnding {
            let mut ending = ActorEnding::new(Termination::MaxSteps);
            let mut observations = vec![Observation::of_messages(vec![goal.to_owned()])];
            while let Some(step) = episode.take_step() {
                let turn = Turn {
                    observations: &observations,
                    tools,
                    allowance: episode.allowance(step),
                    recorder,
                    world: self,
                    episode,
                };
                let proposal = match agent.propose(turn).await {
                    Ok(proposal) => proposal,
                    Err(fault) => {
                        ending.fault = Some(fault);
                        return ending;
                    }
                };
                observations = Vec::new();
                for call in proposal.calls {
                    recorder.emit(&Event::ActionDispatched { step, call: call.clone() });
                    let obs = if tools.iter().any(|t| t.name == call.name) {
                        self.act(&call)
                    } else {
                        let error = ToolError::new(ErrorType::ToolNotFound, format!("`{}` was not given", call.name));
                        Observation::of_error(&call.call_id, error)
                    };
                    recorder.emit(&Event::Observation { step, observation: obs.clone() });
                    if obs.done {
                        ending.termination = Termination::FinalAnswer;
                        ending.answer = Some(obs.answer_text());
                        return ending;
                    }
                    observations.push(obs);
                }
            }
            ending
        }
    }

    impl Acting {
        fn act(&self, call: &ToolCall) -> Observation {
            self.0.lock().unwrap().push((call.actor.to_string(), call.name.clone()));
            if call.name == FINAL_TOOL {
                let mut obs = Observation::of_result(&call.call_id, json!({"answer": call.arguments["answer"]}));
                obs.done = true;
                return obs;
            }
            Observation::of_result(&call.call_id, json!("ok"))
        }
    }

    /// Subagents whose models play the scripts given per actor (none: no turns at all).
    fn subagents(scripts: Vec<(&str, Vec<MockTurn>)>, max_children: u32, max_depth: u32) -> Arc<Subagents> {
        let scripts: HashMap<String, Vec<MockTurn>> = scripts.into_iter().map(|(a, t)| (a.to_owned(), t)).collect();
        let models: ModelFor = Arc::new(move |actor| {
            let turns = scripts.get(&actor.to_string()).cloned().unwrap_or_default();
            Arc::new(MockModel::new(turns.into())) as Arc<dyn LanguageModel>
        });
        Arc::new(Subagents {
            system: "you are a helper".into(),
            max_children,
            max_depth,
            models,
            model_name: "mock".into(),
            require_final_answer: true,
        })
    }

    fn answers(text: &str) -> MockTurn {
        turn_of(None, &[(FINAL_TOOL, json!({"answer": text}), None)])
    }

    fn actions(events: &[Value]) -> Vec<&Value> {
        events.iter().filter(|e| e["type"] == "agent_action").collect()
    }

    #[tokio::test]
    async fn physical_calls_go_to_the_loop_a_delegation_never_reaches_the_world_but_its_childs_calls_do() {
        let main_turn = turn_of(
            None,
            &[
                ("run_command", json!({"command": "ls"}), None),
                (DELEGATE_TOOL, json!({"goal": "count the files"}), None),
                (FINAL_TOOL, json!({"answer": "done"}), None),
            ],
        );
        let child = vec![turn_of(None, &[("run_command", json!({"command": "ls | wc -l"}), None)]), answers("3 files")];
        let mut a = agent(vec![main_turn], false).with_subagents(subagents(vec![("main.1", child)], 3, 2));
        let world = Acting::default();
        let (proposal, events) = propose_in(&mut a, &[first_observation()], &world).await;
        // The loop gets the main agent's physical calls and its final answer, in order.
        let names: Vec<String> = proposal.unwrap().calls.iter().map(|c| c.name.clone()).collect();
        assert_eq!(names, ["run_command", FINAL_TOOL]);
        // The world got the child's calls, as the child's, and nothing named delegate_task.
        let child_calls =
            [("main.1".to_owned(), "run_command".to_owned()), ("main.1".to_owned(), FINAL_TOOL.to_owned())];
        assert_eq!(world.acted(), child_calls);
        let logged = actions(&events);
        assert_eq!(logged.len(), 1, "{events:?}");
        assert_eq!(logged[0]["name"], DELEGATE_TOOL);
        assert_eq!(logged[0]["class"], "cognitive");
        assert!(logged[0].get("actor").is_none(), "the main agent delegated: {}", logged[0]);
        assert_eq!(logged[0]["result"], json!({"actor": "main.1", "answer": "3 files", "files_written": []}));
        // The child's answer is the delegation's tool result in the main transcript.
        let result = a.transcript().iter().find_map(|m| match m {
            Message::Tool { name, content, is_error: false, .. } if name == DELEGATE_TOOL => Some(content.clone()),
            _ => None,
        });
        assert!(result.unwrap().contains("3 files"));
        // The child's calls were dispatched under its actor, with ids of its own.
        let dispatched: Vec<&Value> = events.iter().filter(|e| e["type"] == "action_dispatched").collect();
        assert_eq!(dispatched.len(), 2, "{events:?}");
        assert!(dispatched.iter().all(|e| e["call"]["actor"] == "main.1"));
        assert_eq!(dispatched[0]["call"]["call_id"], "main_1_c_1");
    }

    #[tokio::test]
    async fn a_turn_of_delegations_alone_proposes_no_calls_and_earns_no_reminder() {
        let main_turn = turn_of(None, &[(DELEGATE_TOOL, json!({"goal": "g"}), None)]);
        let mut a = agent(vec![main_turn], true).with_subagents(subagents(vec![("main.1", vec![answers("x")])], 3, 2));
        let (proposal, _) = propose_in(&mut a, &[first_observation()], &Acting::default()).await;
        assert!(proposal.unwrap().calls.is_empty());
        assert!(!a.transcript().iter().any(|m| *m == Message::User { content: FINAL_ANSWER_REMINDER.into() }));
    }

    #[tokio::test]
    async fn without_subagents_a_delegation_is_refused_by_the_agent() {
        let mut a = agent(vec![turn_of(None, &[(DELEGATE_TOOL, json!({"goal": "g"}), None)])], false);
        assert!(a.own_tools.is_empty(), "delegate_task is offered only with subagents");
        let world = Acting::default();
        let (proposal, events) = propose_in(&mut a, &[first_observation()], &world).await;
        assert!(proposal.unwrap().calls.is_empty());
        assert!(world.acted().is_empty());
        let logged = actions(&events);
        assert_eq!(logged[0]["error"]["type"], "ToolNotFound", "{}", logged[0]);
        assert!(logged[0]["error"]["message"].as_str().unwrap().contains("agent.subagent"));
    }

    #[tokio::test]
    async fn delegations_past_max_children_in_one_turn_are_refused() {
        let main_turn =
            turn_of(None, &[(DELEGATE_TOOL, json!({"goal": "a"}), None), (DELEGATE_TOOL, json!({"goal": "b"}), None)]);
        let scripts = vec![("main.1", vec![answers("a")]), ("main.2", vec![answers("b")])];
        let mut a = agent(vec![main_turn], false).with_subagents(subagents(scripts, 1, 2));
        let world = Acting::default();
        let (_, events) = propose_in(&mut a, &[first_observation()], &world).await;
        assert_eq!(world.acted(), [("main.1".to_owned(), FINAL_TOOL.to_owned())]);
        let logged = actions(&events);
        assert_eq!(logged.len(), 2);
        assert_eq!(logged[0]["result"]["answer"], "a");
        assert_eq!(logged[1]["error"]["type"], "ExecutionError");
        assert!(logged[1]["error"]["message"].as_str().unwrap().contains("at most 1 subagents"), "{}", logged[1]);
    }

    #[tokio::test]
    async fn a_child_at_the_depth_limit_is_not_offered_delegate_task_and_is_refused_it() {
        let main_turn = turn_of(None, &[(DELEGATE_TOOL, json!({"goal": "a"}), None)]);
        let child = vec![turn_of(None, &[(DELEGATE_TOOL, json!({"goal": "deeper"}), None)]), answers("alone")];
        let scripts = vec![("main.1", child), ("main.1.1", vec![answers("never")])];
        let mut a = agent(vec![main_turn], false).with_subagents(subagents(scripts, 3, 1));
        assert_eq!(a.own_tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), [DELEGATE_TOOL]);
        let world = Acting::default();
        let (_, events) = propose_in(&mut a, &[first_observation()], &world).await;
        let logged = actions(&events);
        assert_eq!(logged.len(), 2, "{events:?}");
        assert_eq!(logged[0]["actor"], "main.1");
        assert_eq!(logged[0]["error"]["type"], "ToolNotFound");
        assert_eq!(logged[1]["result"]["answer"], "alone");
        assert!(world.acted().iter().all(|(actor, _)| actor == "main.1"));
    }

    #[tokio::test]
    async fn a_childs_tools_are_a_subset_and_a_tool_it_was_not_given_never_reaches_the_world() {
        let goal = json!({"goal": "g", "tools": []});
        let main_turn = turn_of(None, &[(DELEGATE_TOOL, goal, None)]);
        let child = vec![turn_of(None, &[("run_command", json!({"command": "rm -rf x"}), None)]), answers("ok")];
        let mut a = agent(vec![main_turn], false).with_subagents(subagents(vec![("main.1", child)], 3, 2));
        let world = Acting::default();
        let (_, events) = propose_in(&mut a, &[first_observation()], &world).await;
        assert_eq!(world.acted(), [("main.1".to_owned(), FINAL_TOOL.to_owned())]);
        let refused = events.iter().find(|e| e["type"] == "observation" && e["observation"]["call_id"] == "main_1_c_1");
        assert_eq!(refused.unwrap()["observation"]["error"]["type"], "ToolNotFound");
        let bad = json!({"goal": "g", "tools": ["format_disk"]});
        let mut a = agent(vec![turn_of(None, &[(DELEGATE_TOOL, bad, None)])], false).with_subagents(subagents(
            Vec::new(),
            3,
            2,
        ));
        let (_, events) = propose_in(&mut a, &[first_observation()], &Acting::default()).await;
        assert_eq!(actions(&events)[0]["error"]["type"], "ValidationError");
    }

    #[tokio::test]
    async fn in_plan_mode_a_delegation_is_refused_like_a_write() {
        let turns = vec![
            turn_of(None, &[("enter_plan_mode", json!({}), None)]),
            turn_of(None, &[(DELEGATE_TOOL, json!({"goal": "write it"}), None)]),
        ];
        let child = vec![answers("never")];
        let mut a = agent(turns, false).with_plan_mode().with_subagents(subagents(vec![("main.1", child)], 3, 2));
        let world = Acting::default();
        propose_in(&mut a, &[first_observation()], &world).await.0.unwrap();
        let (proposal, events) = propose_in(&mut a, &[], &world).await;
        assert!(proposal.unwrap().calls.is_empty());
        assert!(world.acted().is_empty(), "no child started: {:?}", world.acted());
        let refused = actions(&events);
        assert_eq!(refused[0]["name"], DELEGATE_TOOL);
        assert_eq!(refused[0]["error"]["type"], "PermissionError", "{}", refused[0]);
    }

    #[tokio::test]
    async fn a_childs_fault_is_the_parents_and_its_tool_errors_are_its_own() {
        let main_turn = turn_of(None, &[(DELEGATE_TOOL, json!({"goal": "g"}), None)]);
        // main.1 has no script: its first model call finds it run out.
        let mut a = agent(vec![main_turn], false).with_subagents(subagents(Vec::new(), 3, 2));
        let (proposal, events) = propose_in(&mut a, &[first_observation()], &Acting::default()).await;
        let fault = proposal.unwrap_err();
        assert_eq!(fault.cause, "mock_exhausted");
        assert!(fault.message.starts_with("subagent main.1: "), "{}", fault.message);
        assert_eq!(actions(&events)[0]["error"]["type"], "ExecutionError");
    }

    #[tokio::test]
    async fn changed_files_are_named_in_a_reminder_before_the_model_is_asked_and_logged() {
        let mut a = agent(vec![turn_of(None, &[("run_command", json!({"command": "ls"}), None)])], false);
        let world = Changed(vec!["a.txt".into(), "sub/b.txt".into()]);
        let (proposal, events) = propose_in(&mut a, &[first_observation()], &world).await;
        proposal.unwrap();
        let reminder = stale_files_reminder(&["a.txt".into(), "sub/b.txt".into()]);
        assert!(reminder.contains("a.txt, sub/b.txt") && reminder.contains("Read them again"), "{reminder}");
        // System, task, reminder, then the model's answer: the model saw the reminder.
        assert_eq!(a.transcript()[2], Message::User { content: reminder.clone() });
        assert!(matches!(a.transcript()[3], Message::Assistant { .. }), "{:?}", a.transcript());
        let logged: Vec<&Value> = events.iter().filter(|e| e["type"] == "reminder").collect();
        assert_eq!(logged.len(), 1, "{events:?}");
        assert_eq!(logged[0]["kind"], "stale_files");
        assert_eq!(logged[0]["paths"], json!(["a.txt", "sub/b.txt"]));
        assert_eq!(logged[0]["text"], reminder.as_str());
        assert_eq!(logged[0]["step"], 1);
    }

    #[tokio::test]
    async fn no_change_no_reminder() {
        let mut a = agent(vec![turn_of(None, &[("run_command", json!({"command": "ls"}), None)])], false);
        let (_, events) = propose_in(&mut a, &[first_observation()], &Changed(Vec::new())).await;
        assert!(events.iter().all(|e| e["type"] != "reminder"), "{events:?}");
        assert_eq!(a.transcript().len(), 3);
    }

    /// A world with a tool that reads and one that writes, the user's, and the final answer.
    fn plan_world() -> Vec<ToolSpec> {
        use crate::contract::ToolAnnotations;
        let object = json!({"type": "object"});
        vec![
            ToolSpec::new("kv_get", "reads", object.clone()).annotated(ToolAnnotations::READ_ONLY),
            ToolSpec::new("kv_set", "writes", object.clone()),
            ToolSpec::new("ask_user", "asks", object.clone()).annotated(ToolAnnotations::READ_ONLY),
            ToolSpec::new(FINAL_TOOL, "ends", object),
        ]
    }

    /// One turn of `agent` over `observations` in the plan world: what reached the world,
    /// the events, and the tools the model was offered.
    async fn plan_turn(
        agent: &mut ToolCallingAgent,
        observations: &[Observation],
        step: u32,
    ) -> (Vec<String>, Vec<Value>) {
        let dir = tempfile::tempdir().unwrap();
        let (log, writer) = EventLog::create(&dir.path().join("e.jsonl"), "r").unwrap();
        let recorder = log.recorder("ep");
        let tools = plan_world();
        let episode = Arc::new(EpisodeState::new(EpisodeLimits::new(20, std::time::Duration::from_secs(30))));
        let allowance =
            crate::budget::Allowance { step, steps_left: 5, deadline: episode.deadline.clone(), tokens_left: None };
        let turn =
            Turn { observations, tools: &tools, allowance, recorder: &recorder, world: &NoFiles, episode: &episode };
        let proposal = agent.propose(turn).await.unwrap();
        drop((recorder, log));
        writer.close().unwrap();
        let text = std::fs::read_to_string(dir.path().join("e.jsonl")).unwrap();
        let events = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        (proposal.calls.iter().map(|c| c.name.clone()).collect(), events)
    }

    #[tokio::test]
    async fn in_plan_mode_only_reads_reach_the_world_until_the_user_approves() {
        let turns = vec![
            turn_of(None, &[("enter_plan_mode", json!({}), None)]),
            // A write and a read in one turn: the write is refused by the agent, the read goes out.
            turn_of(None, &[("kv_set", json!({"key": "a"}), None), ("kv_get", json!({"key": "a"}), None)]),
            turn_of(None, &[("exit_plan_mode", json!({"plan": "set a"}), None)]),
            turn_of(None, &[("kv_set", json!({"key": "a"}), None)]),
            turn_of(None, &[("exit_plan_mode", json!({"plan": "set a, carefully"}), None)]),
            turn_of(None, &[("kv_set", json!({"key": "a"}), None)]),
        ];
        let mut a = agent(turns, false).with_plan_mode();
        let (sent, events) = plan_turn(&mut a, &[first_observation()], 1).await;
        assert!(sent.is_empty(), "entering plan mode never reaches the world: {sent:?}");
        let action = events.iter().find(|e| e["type"] == "agent_action").unwrap();
        assert_eq!((action["name"].as_str(), action["class"].as_str()), (Some("enter_plan_mode"), Some("cognitive")));

        let (sent, events) = plan_turn(&mut a, &[], 2).await;
        assert_eq!(sent, ["kv_get"]);
        let refused = events.iter().find(|e| e["type"] == "agent_action").unwrap();
        assert_eq!(refused["name"], "kv_set");
        assert_eq!(refused["error"]["type"], "PermissionError");
        let reminder = events.iter().find(|e| e["type"] == "reminder").unwrap();
        assert_eq!(reminder["kind"], "plan_mode");
        // The refusal is in the transcript as the call's result, an error.
        assert!(a.transcript().iter().any(
            |m| matches!(m, Message::Tool { name, is_error: true, content, .. } if name == "kv_set" && content.contains("PermissionError"))
        ));

        let read = Observation::of_result("c_3", json!({"value": null}));
        let (sent, _) = plan_turn(&mut a, &[read], 3).await;
        assert_eq!(sent, ["exit_plan_mode"], "the plan goes to the world, which asks the user");

        let rejected = Observation::of_result("c_4", json!({"approved": false, "feedback": "be careful"}));
        let (sent, events) = plan_turn(&mut a, &[rejected], 4).await;
        assert!(sent.is_empty(), "still in plan mode: the write is refused");
        let hybrid = events.iter().find(|e| e["type"] == "agent_action" && e["class"] == "hybrid").unwrap();
        assert_eq!(hybrid["result"], json!({"approved": false, "plan_mode": true}));

        let (sent, _) = plan_turn(&mut a, &[], 5).await;
        assert_eq!(sent, ["exit_plan_mode"]);
        let approved = Observation::of_result("c_6", json!({"approved": true, "feedback": "approve"}));
        let (sent, events) = plan_turn(&mut a, &[approved], 6).await;
        assert_eq!(sent, ["kv_set"], "approved: the write goes to the world");
        let hybrid = events.iter().find(|e| e["type"] == "agent_action" && e["class"] == "hybrid").unwrap();
        assert_eq!(hybrid["result"], json!({"approved": true, "plan_mode": false}));
    }

    #[tokio::test]
    async fn plan_mode_offers_only_read_only_tools_to_the_model() {
        let mut a = agent(vec![turn_of(None, &[("enter_plan_mode", json!({}), None)])], false).with_plan_mode();
        let names = |a: &ToolCallingAgent| {
            let plan = a.plan.as_ref().unwrap();
            plan.offer(&plan_world()).into_iter().map(|t| t.name).collect::<Vec<_>>()
        };
        assert_eq!(names(&a), ["kv_get", "kv_set", "ask_user", FINAL_TOOL, "enter_plan_mode"]);
        plan_turn(&mut a, &[first_observation()], 1).await;
        assert_eq!(names(&a), ["kv_get", "ask_user", FINAL_TOOL, "exit_plan_mode"]);
    }

    #[tokio::test]
    async fn without_plan_mode_the_plan_tools_go_to_the_world_and_nothing_is_refused() {
        let calls = [("enter_plan_mode", json!({}), None), ("kv_set", json!({"key": "a"}), None)];
        let mut a = agent(vec![turn_of(None, &calls)], false);
        let (sent, events) = plan_turn(&mut a, &[first_observation()], 1).await;
        assert_eq!(sent, ["enter_plan_mode", "kv_set"]);
        assert!(events.iter().all(|e| e["type"] != "agent_action"), "{events:?}");
    }

    #[tokio::test]
    async fn exit_plan_mode_outside_plan_mode_is_refused_by_the_agent() {
        let mut a =
            agent(vec![turn_of(None, &[("exit_plan_mode", json!({"plan": "x"}), None)])], false).with_plan_mode();
        let (sent, events) = plan_turn(&mut a, &[first_observation()], 1).await;
        assert!(sent.is_empty());
        let action = events.iter().find(|e| e["type"] == "agent_action").unwrap();
        assert_eq!(action["error"]["type"], "ExecutionError");
    }

    #[tokio::test]
    async fn in_a_conversation_text_goes_to_the_user_not_to_the_final_answer() {
        let mut a = agent(vec![turn_of(Some("How many people?"), &[])], true).in_conversation();
        let p = propose(&mut a, &[first_observation()]).await.unwrap();
        assert!(p.calls.is_empty());
        assert_eq!(p.to_user.as_deref(), Some("How many people?"));
        assert!(a.transcript().iter().all(|m| m != &Message::User { content: FINAL_ANSWER_REMINDER.into() }));
    }

    fn with_memory(turns: Vec<MockTurn>, entries: notes::Entries) -> (ToolCallingAgent, SharedStores) {
        let stores = notes::Stores::new(&notes::NotesConfig::default(), entries).shared();
        (agent(turns, false).with_memory(stores.clone()), stores)
    }

    #[tokio::test]
    async fn the_memory_is_in_the_system_prompt_with_its_usage_and_its_tool_is_offered_last() {
        let entries =
            notes::Entries { memory: vec!["the build needs make".into()], user: vec!["is called Ada".into()] };
        let (a, _) = with_memory(vec![], entries);
        let Message::System { content } = &a.transcript()[0] else { panic!("{:?}", a.transcript()) };
        // 20 chars of 2,200 and 13 of 1,375: both under 1%.
        let expected = "be careful\n\nMEMORY (your notes) [0% — 20/2,200 chars]\nthe build needs make\n\n\
                        USER PROFILE (what you know about the user) [0% — 13/1,375 chars]\nis called Ada\n\n\
                        Keep them with the `memory` tool: add, replace or remove an entry, or read a store.";
        assert_eq!(content, expected);
        assert_eq!(a.own_tools.last().map(|t| t.name.as_str()), Some(MEMORY_TOOL));
        assert_eq!(a.transcript().len(), 1, "one system message, not two");
    }

    #[tokio::test]
    async fn a_memory_call_is_answered_by_the_agent_and_never_reaches_the_world() {
        let turns = vec![turn_of(
            None,
            &[
                (MEMORY_TOOL, json!({"action": "add", "target": "memory", "content": "x is 4"}), None),
                (MEMORY_TOOL, json!({"action": "add", "target": "memory", "content": "x is 4"}), None),
            ],
        )];
        let (mut a, stores) = with_memory(turns, notes::Entries::default());
        let (proposal, events) = propose_logged(&mut a, &[first_observation()]).await;
        let proposal = proposal.unwrap();
        assert!(proposal.calls.is_empty(), "the world got {:?}", proposal.calls);
        assert_eq!(stores.lock().unwrap().entries().memory, ["x is 4"]);
        let actions: Vec<&Value> = events.iter().filter(|e| e["type"] == "agent_action").collect();
        assert_eq!(actions.len(), 2, "{events:?}");
        assert_eq!(actions[0]["class"], "cognitive");
        assert_eq!(actions[0]["result"]["usage"], "[0% — 6/2,200 chars]");
        assert!(actions[1]["error"]["message"].as_str().unwrap().contains("already in `memory`"), "{}", actions[1]);
        // Both answers are in the transcript, the refusal marked as an error.
        let answers: Vec<bool> = a
            .transcript()
            .iter()
            .filter_map(|m| match m {
                Message::Tool { name, is_error, .. } if name == MEMORY_TOOL => Some(*is_error),
                _ => None,
            })
            .collect();
        assert_eq!(answers, [false, true]);
    }

    #[tokio::test]
    async fn without_memory_a_memory_call_goes_to_the_world() {
        let mut a = agent(vec![turn_of(None, &[(MEMORY_TOOL, json!({"action": "read"}), None)])], false);
        let p = propose(&mut a, &[first_observation()]).await.unwrap();
        assert_eq!(p.calls.len(), 1);
        assert_eq!(p.calls[0].name, MEMORY_TOOL);
    }

    #[tokio::test]
    async fn a_model_failure_is_an_agent_fault_with_its_cause() {
        let mut a = agent(vec![], false);
        let fault = propose(&mut a, &[first_observation()]).await.unwrap_err();
        assert_eq!(fault.cause, "mock_exhausted");
    }
}
