//! The control loop against a world of test tools and a scripted agent.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::agent::{Agent, AgentFault, Proposal, Turn};
use crate::budget::EpisodeLimits;
use crate::contract::{Actor, ErrorType, Observation, ToolCall, ToolSpec};
use crate::domain::Task;
use crate::environment::definition::{Definition, EnvLimits};
use crate::environment::user::User;
use crate::environment::{Environment, ToolFailure, World};
use crate::log::reader::read_events;
use crate::log::{DecidedBy, Event, EventLog, PermissionDecision, Termination, Usage};

/// Records when each `sleep` ran, and which `hang` calls were dropped unfinished.
#[derive(Default)]
struct Clock {
    spans: Mutex<Vec<(u64, Instant, Instant)>>,
    dropped: Mutex<Vec<String>>,
}

struct TestWorld {
    clock: Arc<Clock>,
}

struct DropFlag(Arc<Clock>, String);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.dropped.lock().unwrap().push(self.1.clone());
    }
}

#[async_trait]
impl World for TestWorld {
    async fn call(&self, _actor: &Actor, name: &str, arguments: Value) -> Result<Value, ToolFailure> {
        match name {
            "sleep" => {
                let ms = arguments["ms"].as_u64().unwrap_or(0);
                let start = Instant::now();
                tokio::time::sleep(Duration::from_millis(ms)).await;
                self.clock.spans.lock().unwrap().push((ms, start, Instant::now()));
                Ok(json!({"slept_ms": ms}))
            }
            "hang" => {
                let _flag = DropFlag(self.clock.clone(), arguments["tag"].as_str().unwrap_or("").to_owned());
                std::future::pending::<()>().await;
                Ok(Value::Null)
            }
            "fail" => Err(ToolFailure::new(ErrorType::ExecutionError, "it failed").suggest("try again")),
            "boom" => panic!("boom went the tool"),
            _ => Err(ToolFailure::new(ErrorType::ToolNotFound, name)),
        }
    }
}

fn specs() -> Vec<ToolSpec> {
    let object = |props: Value| json!({"type": "object", "properties": props, "additionalProperties": false});
    vec![
        ToolSpec::new("sleep", "wait", object(json!({"ms": {"type": "integer"}}))),
        ToolSpec::new("hang", "never ends", object(json!({"tag": {"type": "string"}}))),
        ToolSpec::new("fail", "fails", object(json!({}))),
        ToolSpec::new("boom", "panics", object(json!({}))),
    ]
}

fn env(max_concurrency: usize, tool_timeout_s: f64) -> (Environment, Arc<Clock>) {
    let limits = EnvLimits { max_concurrency, tool_timeout_s, ..EnvLimits::default() };
    let def = Definition::for_world("test", specs(), limits).unwrap();
    let clock = Arc::new(Clock::default());
    (Environment::with_world(Arc::new(def), Box::new(TestWorld { clock: clock.clone() })), clock)
}

fn task() -> Task {
    Task::new("t", "do it")
}

fn call(id: &str, name: &str, arguments: Value) -> ToolCall {
    ToolCall::new(id, name, arguments)
}

/// Proposes a fixed list of turns and remembers what it observed; proposes `repeat` after.
struct ScriptedAgent {
    turns: VecDeque<Vec<ToolCall>>,
    repeat: Option<Vec<ToolCall>>,
    seen: Vec<Vec<Observation>>,
    usage_per_turn: u64,
    fail_at: Option<usize>,
    /// What it says to the user on turns without calls, in order.
    talk: VecDeque<String>,
}

impl ScriptedAgent {
    fn new(turns: Vec<Vec<ToolCall>>) -> Self {
        ScriptedAgent {
            turns: turns.into(),
            repeat: None,
            seen: Vec::new(),
            usage_per_turn: 0,
            fail_at: None,
            talk: VecDeque::new(),
        }
    }
}

#[async_trait]
impl Agent for ScriptedAgent {
    async fn propose(&mut self, turn: Turn<'_>) -> Result<Proposal, AgentFault> {
        self.seen.push(turn.observations.to_vec());
        if self.fail_at == Some(self.seen.len()) {
            return Err(AgentFault { cause: "provider_error".into(), message: "the backend is down".into() });
        }
        let step = self.seen.len();
        let calls = match self.turns.pop_front() {
            Some(calls) => calls,
            None => self
                .repeat
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|mut c| {
                    c.call_id = format!("{}_{step}", c.call_id);
                    c
                })
                .collect(),
        };
        let to_user = if calls.is_empty() { self.talk.pop_front() } else { None };
        Ok(Proposal {
            calls,
            usage: Usage { input_tokens: self.usage_per_turn, ..Usage::default() },
            cost_usd: None,
            to_user,
            failed: None,
        })
    }
}

struct Run {
    ending: Ending,
    agent: ScriptedAgent,
    events: Vec<Event>,
}

async fn run_with(environment: &Environment, task: &Task, mut agent: ScriptedAgent, episode: EpisodeState) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let (log, writer) = EventLog::create(&path, "test-run").unwrap();
    let recorder = log.recorder("ep_test");
    let ending = environment.run(&mut agent, task, &Arc::new(episode), &recorder).await;
    drop((recorder, log));
    writer.close().unwrap();
    let events = read_events(&path).unwrap().events.iter().map(|e| e.event().unwrap()).collect();
    Run { ending, agent, events }
}

fn limits(max_steps: u32) -> EpisodeState {
    EpisodeState::new(EpisodeLimits::new(max_steps, Duration::from_secs(30)))
}

async fn run(environment: &Environment, agent: ScriptedAgent, max_steps: u32) -> Run {
    run_with(environment, &task(), agent, limits(max_steps)).await
}

fn final_call(id: &str) -> ToolCall {
    call(id, "final_answer", json!({"answer": "done"}))
}

fn logged_observations(events: &[Event]) -> Vec<Observation> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Observation { observation, .. } if observation.call_id.is_some() => Some(observation.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn calls_of_one_turn_overlap_in_time() {
    let (environment, clock) = env(4, 10.0);
    let turn = (1..=3).map(|i| call(&format!("c{i}"), "sleep", json!({"ms": 150}))).collect();
    let r = run(&environment, ScriptedAgent::new(vec![turn, vec![final_call("f")]]), 5).await;
    assert_eq!(r.ending.termination, Termination::FinalAnswer);
    let spans = clock.spans.lock().unwrap();
    assert_eq!(spans.len(), 3);
    let last_start = spans.iter().map(|s| s.1).max().unwrap();
    let first_end = spans.iter().map(|s| s.2).min().unwrap();
    assert!(last_start < first_end, "the three calls ran one after another, not at once");
}

#[tokio::test]
async fn max_concurrency_bounds_the_calls_in_flight() {
    let (environment, clock) = env(1, 10.0);
    let turn = (1..=3).map(|i| call(&format!("c{i}"), "sleep", json!({"ms": 30}))).collect();
    run(&environment, ScriptedAgent::new(vec![turn, vec![final_call("f")]]), 5).await;
    let mut spans = clock.spans.lock().unwrap().clone();
    spans.sort_by_key(|s| s.1);
    for pair in spans.windows(2) {
        assert!(pair[1].1 >= pair[0].2, "with max_concurrency 1, a call started before the previous one ended");
    }
}

#[tokio::test]
async fn results_reach_the_agent_in_call_order_whatever_order_they_finish_in() {
    let (environment, _) = env(4, 10.0);
    let turn = vec![
        call("slow", "sleep", json!({"ms": 200})),
        call("fast", "sleep", json!({"ms": 1})),
        call("mid", "sleep", json!({"ms": 80})),
    ];
    let r = run(&environment, ScriptedAgent::new(vec![turn, vec![final_call("f")]]), 5).await;
    let seen: Vec<_> = r.agent.seen[1].iter().map(|o| o.call_id.clone().unwrap()).collect();
    assert_eq!(seen, ["slow", "fast", "mid"]);
    // The log records them as they finished.
    let logged: Vec<_> = logged_observations(&r.events).iter().take(3).map(|o| o.call_id.clone().unwrap()).collect();
    assert_eq!(logged, ["fast", "mid", "slow"]);
}

#[tokio::test]
async fn final_answer_cancels_calls_still_in_flight() {
    let (environment, clock) = env(4, 10.0);
    let turn = vec![call("h", "hang", json!({"tag": "h"})), final_call("f")];
    let r = run(&environment, ScriptedAgent::new(vec![turn]), 5).await;
    assert_eq!(r.ending.termination, Termination::FinalAnswer);
    assert_eq!(r.ending.final_answer.as_deref(), Some("done"));
    assert_eq!(*clock.dropped.lock().unwrap(), ["h"], "the hanging call was not cancelled");
    let cancelled = logged_observations(&r.events).into_iter().find(|o| o.call_id.as_deref() == Some("h")).unwrap();
    assert_eq!(cancelled.info["started"], true, "the hanging call had started: its effects may stand");
    assert_eq!(cancelled.error.unwrap().kind, ErrorType::Cancelled);
    assert!(r.events.iter().any(|e| matches!(e, Event::Final { answer, .. } if answer == "done")));
}

#[tokio::test]
async fn a_call_cancelled_before_it_started_says_it_did_nothing() {
    // One slot: the final answer needs none, the first hang takes the slot, the second waits.
    let (environment, clock) = env(1, 10.0);
    let turn =
        vec![call("h1", "hang", json!({"tag": "h1"})), call("h2", "hang", json!({"tag": "h2"})), final_call("f")];
    let r = run(&environment, ScriptedAgent::new(vec![turn]), 5).await;
    assert_eq!(r.ending.termination, Termination::FinalAnswer);
    let obs = logged_observations(&r.events);
    let by_id = |id: &str| obs.iter().find(|o| o.call_id.as_deref() == Some(id)).unwrap().clone();
    assert_eq!(by_id("h1").info["started"], true);
    assert_eq!(by_id("h2").info["started"], false);
    assert!(by_id("h2").error.unwrap().message.contains("did nothing"));
    assert_eq!(*clock.dropped.lock().unwrap(), ["h1"], "h2 never ran, so it was never dropped while running");
}

#[tokio::test]
async fn max_steps_ends_the_episode() {
    let (environment, _) = env(4, 10.0);
    let mut agent = ScriptedAgent::new(vec![]);
    agent.repeat = Some(vec![call("s", "sleep", json!({"ms": 0}))]);
    let r = run(&environment, agent, 3).await;
    assert_eq!(r.ending.termination, Termination::MaxSteps);
    assert_eq!(r.ending.steps, 3);
    assert_eq!(r.agent.seen.len(), 3);
    assert!(r.ending.final_answer.is_none());
}

#[tokio::test]
async fn the_episode_time_limit_cancels_what_is_running() {
    let (environment, clock) = env(4, 10.0);
    let agent = ScriptedAgent::new(vec![vec![call("h", "hang", json!({"tag": "h"}))]]);
    let limits = EpisodeState::new(EpisodeLimits::new(5, Duration::from_millis(100)));
    let r = run_with(&environment, &task(), agent, limits).await;
    assert_eq!(r.ending.termination, Termination::TimeLimit);
    assert_eq!(*clock.dropped.lock().unwrap(), ["h"]);
    let obs = logged_observations(&r.events);
    assert_eq!(obs.len(), 1);
    assert_eq!(obs[0].error.as_ref().unwrap().kind, ErrorType::Cancelled);
}

#[tokio::test]
async fn a_tool_past_its_timeout_is_an_observation_and_the_episode_goes_on() {
    let (environment, _) = env(4, 0.05);
    let turn = vec![call("h", "hang", json!({"tag": "h"}))];
    let r = run(&environment, ScriptedAgent::new(vec![turn, vec![final_call("f")]]), 5).await;
    assert_eq!(r.ending.termination, Termination::FinalAnswer);
    let error = r.agent.seen[1][0].error.clone().unwrap();
    assert_eq!(error.kind, ErrorType::TimeoutError);
    assert!(error.retryable);
}

#[tokio::test]
async fn the_token_limit_ends_the_episode() {
    let (environment, _) = env(4, 10.0);
    let mut agent = ScriptedAgent::new(vec![]);
    agent.repeat = Some(vec![call("s", "sleep", json!({"ms": 0}))]);
    agent.usage_per_turn = 100;
    let limits = EpisodeState::new(EpisodeLimits::new(10, Duration::from_secs(10)).with_max_tokens(Some(250)));
    let r = run_with(&environment, &task(), agent, limits).await;
    assert_eq!(r.ending.termination, Termination::TokenLimit);
    assert_eq!(r.ending.steps, 3);
    assert_eq!(r.ending.usage.input_tokens, 300);
    // The third turn's call was not run, and the log says so rather than dropping it.
    let last = logged_observations(&r.events).pop().unwrap();
    assert_eq!(last.call_id.as_deref(), Some("s_3"));
    assert_eq!(last.error.unwrap().kind, ErrorType::Cancelled);
    let dispatched = r.events.iter().filter(|e| matches!(e, Event::ActionDispatched { .. })).count();
    assert_eq!(dispatched, 3);
}

#[tokio::test]
async fn stopping_the_run_cancels_the_episode() {
    let (environment, clock) = env(4, 10.0);
    let stop = CancellationToken::new();
    let trigger = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        trigger.cancel();
    });
    let agent = ScriptedAgent::new(vec![vec![call("h", "hang", json!({"tag": "h"}))]]);
    let r = run_with(&environment, &task(), agent, limits(5).stopped_by(stop)).await;
    assert_eq!(r.ending.termination, Termination::UserStop);
    assert_eq!(*clock.dropped.lock().unwrap(), ["h"]);
}

#[tokio::test]
async fn tool_errors_become_observations_with_stable_types() {
    let (environment, _) = env(4, 10.0);
    let turn = vec![
        call("a", "no_such_tool", json!({})),
        call("b", "sleep", json!({"ms": "soon"})),
        call("c", "fail", json!({})),
        call("d", "boom", json!({})),
        call("e", "sleep", json!({"ms": 1})),
    ];
    let r = run(&environment, ScriptedAgent::new(vec![turn, vec![final_call("f")]]), 5).await;
    assert_eq!(r.ending.termination, Termination::FinalAnswer, "a failing tool must not end the episode");
    let kinds: Vec<Option<ErrorType>> = r.agent.seen[1].iter().map(|o| o.error.as_ref().map(|e| e.kind)).collect();
    assert_eq!(
        kinds,
        [
            Some(ErrorType::ToolNotFound),
            Some(ErrorType::ValidationError),
            Some(ErrorType::ExecutionError),
            Some(ErrorType::ExecutionError),
            None
        ]
    );
    let boom = r.agent.seen[1][3].error.clone().unwrap();
    assert!(boom.message.contains("boom went the tool"), "{}", boom.message);
    let not_found = r.agent.seen[1][0].error.clone().unwrap();
    assert!(not_found.suggested_action.unwrap().contains("sleep"));
    assert_eq!(r.ending.trajectory.tool_errors(), 4);
    assert_eq!(r.ending.trajectory.errors[0].call_id, "a");
    assert_eq!(r.ending.trajectory.calls.len(), 6);
}

#[tokio::test]
async fn an_invalid_final_answer_does_not_end_the_episode() {
    let (environment, _) = env(4, 10.0);
    let bad = call("f1", "final_answer", json!({"text": "done"}));
    let r = run(&environment, ScriptedAgent::new(vec![vec![bad], vec![final_call("f2")]]), 5).await;
    assert_eq!(r.ending.termination, Termination::FinalAnswer);
    assert_eq!(r.ending.steps, 2);
    assert_eq!(r.agent.seen[1][0].error.as_ref().unwrap().kind, ErrorType::ValidationError);
}

#[tokio::test]
async fn an_agent_fault_ends_the_episode_with_its_cause() {
    let (environment, _) = env(4, 10.0);
    let mut agent = ScriptedAgent::new(vec![vec![call("s", "sleep", json!({"ms": 0}))]]);
    agent.fail_at = Some(2);
    let r = run(&environment, agent, 5).await;
    assert_eq!(r.ending.termination, Termination::AgentError);
    assert_eq!(r.ending.fault.unwrap().cause, "provider_error");
    assert!(r.events.iter().any(|e| matches!(e, Event::Error { cause, .. } if cause == "provider_error")));
}

#[tokio::test]
async fn the_first_observation_carries_the_task_input() {
    let (environment, _) = env(4, 10.0);
    let r = run(&environment, ScriptedAgent::new(vec![vec![final_call("f")]]), 5).await;
    let first = &r.agent.seen[0];
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].call_id, None);
    assert_eq!(first[0].messages, ["do it"]);
    assert_eq!(first[0].info["environment"], "test");
}

#[tokio::test]
async fn permission_rules_decide_before_any_call_runs_and_each_decision_is_logged() {
    let (environment, clock) = env(4, 10.0);
    let tools = ["sleep", "hang", "fail", "boom", "final_answer"];
    let rules = json!([{"fail": "deny"}, {"sleep": "ask"}]);
    let permissions = crate::environment::permission::parse_rules(&rules, "suite", &tools).unwrap();
    let environment =
        environment.with_user(User::answers(&["yes".into(), "no".into()])).with_permissions(Arc::new(permissions));
    let turn = vec![
        // Refused by its schema first: it is asked about nothing and takes no answer.
        call("bad", "sleep", json!({"ms": "x"})),
        call("c1", "sleep", json!({"ms": 10})),
        call("c2", "sleep", json!({"ms": 20})),
        call("c3", "fail", json!({})),
        call("c4", "sleep", json!({"ms": 30})),
    ];
    let r = run(&environment, ScriptedAgent::new(vec![turn, vec![final_call("f")]]), 5).await;
    assert_eq!(r.ending.termination, Termination::FinalAnswer);
    let ran: Vec<u64> = clock.spans.lock().unwrap().iter().map(|s| s.0).collect();
    assert_eq!(ran, [10], "only the call the user allowed ran");
    let decisions: Vec<(String, Option<String>, PermissionDecision, DecidedBy)> = r
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Permission { call_id, rule, decision, decided_by, .. } => {
                Some((call_id.clone(), rule.clone(), *decision, *decided_by))
            }
            _ => None,
        })
        .collect();
    let ask = Some("sleep: ask".to_string());
    assert_eq!(
        decisions,
        [
            ("c1".into(), ask.clone(), PermissionDecision::Allow, DecidedBy::User),
            ("c2".into(), ask.clone(), PermissionDecision::Deny, DecidedBy::User),
            ("c3".into(), Some("fail: deny".into()), PermissionDecision::Deny, DecidedBy::Rule),
            ("c4".into(), ask, PermissionDecision::Deny, DecidedBy::Default),
        ]
    );
    let observed = logged_observations(&r.events);
    let error_of = |id: &str| {
        let obs = observed.iter().find(|o| o.call_id.as_deref() == Some(id));
        obs.and_then(|o| o.error.clone())
    };
    assert_eq!(error_of("bad").map(|e| e.kind), Some(ErrorType::ValidationError));
    assert_eq!(error_of("c1"), None);
    for id in ["c2", "c3", "c4"] {
        assert_eq!(error_of(id).map(|e| e.kind), Some(ErrorType::PermissionError), "{id}");
    }
    let c3 = error_of("c3").unwrap();
    assert!(c3.message.contains("`fail: deny` (suite permissions[0])"), "{}", c3.message);
}

/// A task whose user is `kind`, in a conversation or not.
fn task_with_user(kind: crate::domain::UserKind, conversation: bool, mock_user: &[&str]) -> Task {
    let mock: Vec<crate::domain::MockTurn> = mock_user
        .iter()
        .map(|t| crate::domain::MockTurn { text: Some(crate::domain::text::Text((*t).into())), tool_calls: Vec::new() })
        .collect();
    let spec = crate::domain::UserSpec { kind, conversation, stop: "###STOP###".into(), mock: mock.into() };
    Task { input: "Hi, book me a table.".into(), user: Some(Arc::new(spec)), ..task() }
}

fn scripted(replies: &[&str]) -> crate::domain::UserKind {
    crate::domain::UserKind::Scripted { replies: replies.iter().map(|r| r.to_string()).collect(), then: "ok".into() }
}

fn simulated() -> crate::domain::UserKind {
    crate::domain::UserKind::Simulated { model: "mock".into(), persona: "terse".into(), instructions: "2 at 8".into() }
}

/// The environment with `task`'s user, played (when simulated) by `mock` over its `mock_user`.
fn env_for(task: &Task) -> Environment {
    let model: Option<Arc<dyn crate::model::LanguageModel>> = task
        .user
        .as_ref()
        .map(|u| Arc::new(crate::model::mock::MockModel::new(u.mock.clone())) as Arc<dyn crate::model::LanguageModel>);
    env(4, 5.0).0.with_user(User::of_task(task, model).unwrap())
}

fn said(events: &[Event]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Said { actor, text, .. } => Some((actor.to_string(), text.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_conversation_goes_on_until_the_user_says_the_stop_word() {
    let task = task_with_user(simulated(), true, &["Two people, at 8.", "Thanks! ###STOP###"]);
    let environment = env_for(&task);
    let mut agent = ScriptedAgent::new(vec![vec![], vec![], vec![]]);
    agent.talk = ["How many people?".to_string(), "Booked for two at 8.".into(), "never said".into()].into();
    let r = run_with(&environment, &task, agent, limits(10)).await;
    assert_eq!(r.ending.termination, Termination::UserEnded);
    assert_eq!(r.ending.steps, 2, "the third turn never came");
    assert_eq!(r.ending.final_answer.as_deref(), Some("Booked for two at 8."), "the agent's last words");
    assert_eq!(r.ending.trajectory.told_user, ["How many people?", "Booked for two at 8."]);
    let conversation = said(&r.events);
    let expected: Vec<(String, String)> = [
        ("user", "Hi, book me a table."),
        ("main", "How many people?"),
        ("user", "Two people, at 8."),
        ("main", "Booked for two at 8."),
        ("user", "Thanks! ###STOP###"),
    ]
    .map(|(a, t)| (a.to_string(), t.to_string()))
    .into();
    assert_eq!(conversation, expected);
    // The user's reply is the agent's next observation, as a message.
    assert_eq!(r.agent.seen[1][0].messages, ["Two people, at 8."]);
    // The user's model calls are logged as the user's, apart from the agent's usage.
    let user_calls = r.events.iter().filter(|e| matches!(e, Event::ModelCall { actor: Actor::User, .. })).count();
    assert_eq!(user_calls, 2);
    assert_eq!(r.ending.usage.total(), 0, "the user's tokens are not the agent's");
    assert!(environment.user().spent().is_some_and(|(usage, _)| usage.total() > 0));
}

#[tokio::test]
async fn a_user_that_cannot_answer_makes_the_episode_unscored_as_user_error() {
    // The mock user has one turn; the agent talks twice.
    let task = task_with_user(simulated(), true, &["Two people."]);
    let environment = env_for(&task);
    let mut agent = ScriptedAgent::new(vec![vec![], vec![]]);
    agent.talk = ["How many?".to_string(), "When?".into()].into();
    let r = run_with(&environment, &task, agent, limits(10)).await;
    assert_eq!(r.ending.termination, Termination::EnvironmentError);
    let fault = r.ending.fault.expect("a fault");
    assert_eq!(fault.cause, crate::log::UnscoredCause::UserError);
    assert!(fault.message.contains("mock_exhausted"), "{}", fault.message);
}

#[tokio::test]
async fn a_failing_user_in_ask_user_is_a_user_error_too() {
    let task = task_with_user(simulated(), false, &[]);
    let environment = env_for(&task);
    let agent = ScriptedAgent::new(vec![vec![call("q", "ask_user", json!({"question": "Which day?"}))]]);
    let r = run_with(&environment, &task, agent, limits(5)).await;
    assert_eq!(r.ending.termination, Termination::EnvironmentError);
    assert_eq!(r.ending.fault.map(|f| f.cause), Some(crate::log::UnscoredCause::UserError));
}

#[tokio::test]
async fn a_scripted_user_answers_the_user_tools_in_order_then_its_fixed_reply() {
    let task = task_with_user(scripted(&["Tuesday", "2"]), false, &[]);
    let environment = env_for(&task);
    let names: Vec<&str> = environment.tools().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names[names.len() - 2..], ["ask_user", "clarify"], "offered after the world's tools");
    let turn = vec![
        call("q", "ask_user", json!({"question": "Which day?"})),
        call("c", "clarify", json!({"question": "Size?", "choices": ["small", "large"]})),
        call("p", "exit_plan_mode", json!({"plan": "do it"})),
        call("bad", "clarify", json!({"question": "no choices"})),
    ];
    let agent = ScriptedAgent::new(vec![turn, vec![final_call("f")]]);
    let r = run_with(&environment, &task, agent, limits(5)).await;
    let results: Vec<Option<Value>> = r.agent.seen[1].iter().map(|o| o.tool_result.clone()).collect();
    assert_eq!(
        results[..3],
        [
            Some(json!({"answer": "Tuesday"})),
            Some(json!({"answer": "2", "choice": "large"})),
            // The script ran out: the fixed reply, which does not approve.
            Some(json!({"approved": false, "feedback": "ok"})),
        ]
    );
    assert_eq!(r.agent.seen[1][3].error.as_ref().map(|e| e.kind), Some(ErrorType::ValidationError));
}

#[tokio::test]
async fn without_a_user_the_user_tools_are_unknown_and_a_plan_has_nobody_to_approve_it() {
    let (environment, _) = env(4, 5.0);
    assert!(environment.tools().iter().all(|t| t.name != "ask_user"));
    let turn = vec![
        call("q", "ask_user", json!({"question": "Which day?"})),
        call("p", "exit_plan_mode", json!({"plan": "x"})),
    ];
    let r = run(&environment, ScriptedAgent::new(vec![turn, vec![final_call("f")]]), 5).await;
    let errors: Vec<Option<ErrorType>> = r.agent.seen[1].iter().map(|o| o.error.as_ref().map(|e| e.kind)).collect();
    assert_eq!(errors, [Some(ErrorType::ToolNotFound), Some(ErrorType::ExecutionError)]);
    assert_eq!(r.ending.termination, Termination::FinalAnswer);
}

/// A model that never answers.
struct Silent;

#[async_trait]
impl crate::model::LanguageModel for Silent {
    fn name(&self) -> &str {
        "silent"
    }

    async fn respond(
        &self,
        _request: &crate::model::ModelRequest<'_>,
    ) -> Result<crate::model::ModelResponse, crate::model::ModelError> {
        std::future::pending().await
    }
}

#[tokio::test]
async fn a_user_who_never_answers_is_cut_by_the_time_limit_in_a_conversation_and_in_an_ask() {
    let task = task_with_user(simulated(), true, &[]);
    let short = || EpisodeState::new(EpisodeLimits::new(5, Duration::from_millis(300)));
    let user = || User::of_task(&task, Some(Arc::new(Silent))).unwrap();

    let environment = env(4, 5.0).0.with_user(user());
    let mut agent = ScriptedAgent::new(vec![vec![]]);
    agent.talk = ["How many?".to_string()].into();
    let bounded = tokio::time::timeout(Duration::from_secs(5), run_with(&environment, &task, agent, short()));
    let r = bounded.await.expect("the time limit cut the silent user off");
    assert_eq!(r.ending.termination, Termination::TimeLimit);
    assert_eq!(r.ending.trajectory.told_user, ["How many?"], "what was said stands");

    // An `ask` rule the silent user must answer: the call never runs, and says so.
    let tools = ["sleep", "hang", "fail", "boom", "final_answer"];
    let rules = crate::environment::permission::parse_rules(&json!([{"sleep": "ask"}]), "suite", &tools).unwrap();
    let environment = env(4, 5.0).0.with_user(user()).with_permissions(Arc::new(rules));
    let agent = ScriptedAgent::new(vec![vec![call("s", "sleep", json!({"ms": 1}))]]);
    let bounded = tokio::time::timeout(Duration::from_secs(5), run_with(&environment, &task, agent, short()));
    let r = bounded.await.expect("the time limit cut the silent user off");
    assert_eq!(r.ending.termination, Termination::TimeLimit);
    let observed = logged_observations(&r.events);
    assert_eq!(observed.len(), 1);
    assert_eq!(observed[0].error.as_ref().map(|e| e.kind), Some(ErrorType::Cancelled));
    assert_eq!(observed[0].info.get("started"), Some(&json!(false)));
}

/// A mock turn that makes `calls`.
fn mock_turn(calls: Vec<(&str, Value)>) -> crate::domain::MockTurn {
    let tool_calls = calls
        .into_iter()
        .map(|(name, arguments)| crate::domain::MockCall { name: name.into(), arguments, id: None })
        .collect();
    crate::domain::MockTurn { text: None, tool_calls }
}

/// A main agent that delegates one task (with `tools`, a list or null for all of its own)
/// and then answers; its child plays `child`.
fn delegating(child: Vec<crate::domain::MockTurn>, tools: Value) -> crate::agent::ToolCallingAgent {
    use crate::agent::kinds::tool_calling::subagents::Subagents;
    use crate::agent::{ModelFor, ToolCallingAgent};
    use crate::model::{LanguageModel, mock::MockModel};
    let main = vec![
        mock_turn(vec![(crate::contract::DELEGATE_TOOL, json!({"goal": "g", "tools": tools}))]),
        mock_turn(vec![("final_answer", json!({"answer": "done"}))]),
    ];
    let child: Arc<[crate::domain::MockTurn]> = child.into();
    let models: ModelFor = Arc::new(move |_| Arc::new(MockModel::new(child.clone())) as Arc<dyn LanguageModel>);
    let subagents = Subagents {
        system: "help".into(),
        max_children: 3,
        max_depth: 1,
        models,
        model_name: "mock".into(),
        require_final_answer: true,
    };
    ToolCallingAgent::new(Arc::new(MockModel::new(main.into())), "mock", None, true).with_subagents(Arc::new(subagents))
}

/// Runs `agent` in `environment` within `episode`'s limits: how it ended, and the events.
async fn run_agent(environment: &Environment, agent: &mut dyn Agent, episode: EpisodeState) -> (Ending, Vec<Event>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let (log, writer) = EventLog::create(&path, "test-run").unwrap();
    let recorder = log.recorder("ep_test");
    let ending = environment.run(agent, &task(), &Arc::new(episode), &recorder).await;
    drop((recorder, log));
    writer.close().unwrap();
    (ending, read_events(&path).unwrap().events.iter().map(|e| e.event().unwrap()).collect())
}

fn observation_of(events: &[Event], call_id: &str) -> Observation {
    let found = logged_observations(events).into_iter().find(|o| o.call_id.as_deref() == Some(call_id));
    found.unwrap_or_else(|| panic!("no observation of {call_id}: {events:?}"))
}

#[tokio::test]
async fn a_subagent_takes_its_turns_in_the_loop_and_its_calls_count_for_the_episode() {
    let (environment, clock) = env(4, 10.0);
    let child =
        vec![mock_turn(vec![("sleep", json!({"ms": 1}))]), mock_turn(vec![("final_answer", json!({"answer": "x"}))])];
    let mut agent = delegating(child, Value::Null);
    let (ending, events) = run_agent(&environment, &mut agent, limits(10)).await;
    assert_eq!(ending.termination, Termination::FinalAnswer);
    assert_eq!(clock.spans.lock().unwrap().len(), 1, "the child's sleep ran");
    assert_eq!(ending.steps, 4, "two turns of main and two of its child");
    let ids: Vec<&str> = ending.trajectory.calls.iter().map(|c| c.call_id.as_str()).collect();
    assert_eq!(ids, ["main_1_c_1", "main_1_c_2", "c_2"], "the child's calls come before its parent's next");
    let finals = events.iter().filter(|e| matches!(e, Event::Final { .. })).count();
    assert_eq!(finals, 1, "only the main agent's final answer is the episode's");
}

#[tokio::test]
async fn a_subagents_call_of_a_tool_it_was_not_given_never_reaches_the_world() {
    let (environment, clock) = env(4, 10.0);
    let child =
        vec![mock_turn(vec![("sleep", json!({"ms": 1}))]), mock_turn(vec![("final_answer", json!({"answer": "x"}))])];
    let mut agent = delegating(child, json!([]));
    let (ending, events) = run_agent(&environment, &mut agent, limits(10)).await;
    assert_eq!(ending.termination, Termination::FinalAnswer);
    assert!(clock.spans.lock().unwrap().is_empty(), "the child's sleep ran");
    let refused = observation_of(&events, "main_1_c_1").error.unwrap();
    assert_eq!(refused.kind, ErrorType::ToolNotFound);
    assert_eq!(refused.message, "`sleep` was not given to you");
    assert!(!events.iter().any(|e| matches!(e, Event::Permission { .. })), "the rules never saw it");
}

#[tokio::test]
async fn a_subagents_call_in_flight_at_the_deadline_is_logged_as_cancelled() {
    let (environment, clock) = env(4, 10.0);
    let mut agent = delegating(vec![mock_turn(vec![("hang", json!({"tag": "child"}))])], Value::Null);
    let (ending, events) =
        run_agent(&environment, &mut agent, EpisodeState::new(EpisodeLimits::new(10, Duration::from_millis(200))))
            .await;
    assert_eq!(ending.termination, Termination::TimeLimit);
    assert_eq!(*clock.dropped.lock().unwrap(), ["child"]);
    let cancelled = observation_of(&events, "main_1_c_1");
    assert_eq!(cancelled.error.unwrap().kind, ErrorType::Cancelled);
    assert_eq!(cancelled.info["started"], true);
}

#[tokio::test]
async fn a_subagents_call_in_flight_when_the_run_stops_is_logged_as_cancelled() {
    let (environment, clock) = env(4, 10.0);
    let stop = CancellationToken::new();
    let trigger = stop.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        trigger.cancel();
    });
    let mut agent = delegating(vec![mock_turn(vec![("hang", json!({"tag": "child"}))])], Value::Null);
    let (ending, events) = run_agent(&environment, &mut agent, limits(10).stopped_by(stop)).await;
    assert_eq!(ending.termination, Termination::UserStop);
    assert_eq!(*clock.dropped.lock().unwrap(), ["child"]);
    let cancelled = observation_of(&events, "main_1_c_1");
    assert_eq!(cancelled.error.unwrap().kind, ErrorType::Cancelled);
    assert_eq!(cancelled.info["started"], true);
}
