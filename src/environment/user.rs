//! The task's user, part of the world (seeds 001 and 004, and the tau2 style of
//! conversational tasks): scripted replies given out in order, or a language model playing
//! a persona from the task's instructions. It answers `ask_user`, `clarify`,
//! `exit_plan_mode` and the permission `ask` rules, and in a conversation it talks with the
//! agent until it says its stop word. A simulated user's model calls are `model_call`
//! events with actor `user`, and their cost is counted apart from the agent's; a failure of
//! that model makes the episode unscored (`user_error`): it is nobody's answer.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::contract::{ASK_USER, Actor, CLARIFY, EXIT_PLAN_MODE, ToolAnnotations, ToolCall, ToolSpec};
use crate::domain::{Task, UserKind};
use crate::log::{Recorder, UnscoredCause, Usage};
use crate::model::{Caller, LanguageModel, Message, ModelRequest, respond_logged};

/// The tools a task with a `user:` offers, whatever the kind of its environment. They only
/// ask, so plan mode allows them; no script may call them (`execute_code`): a question to
/// the user is one visible step of the agent.
pub fn tool_specs() -> Vec<ToolSpec> {
    vec![
        ToolSpec::new(
            ASK_USER,
            "Ask the user a question and wait for the answer.",
            json!({
                "type": "object",
                "properties": {"question": {"type": "string"}},
                "required": ["question"],
                "additionalProperties": false
            }),
        )
        .annotated(ToolAnnotations::READ_ONLY),
        ToolSpec::new(
            CLARIFY,
            "Ask the user to choose among options (and, if allowed, to answer in their own words).",
            json!({
                "type": "object",
                "properties": {
                    "question": {"type": "string"},
                    "choices": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    "allow_freetext": {"type": "boolean", "default": true}
                },
                "required": ["question", "choices"],
                "additionalProperties": false
            }),
        )
        .annotated(ToolAnnotations::READ_ONLY),
    ]
}

/// The user's tools (`exit_plan_mode` included) with their argument validators, compiled
/// once for the process.
pub fn exposed(name: &str) -> Option<&'static super::definition::ExposedTool> {
    static TOOLS: std::sync::LazyLock<Vec<super::definition::ExposedTool>> = std::sync::LazyLock::new(|| {
        tool_specs()
            .into_iter()
            .chain([crate::agent::plan::exit_spec()])
            .map(|spec| {
                let validator = jsonschema::validator_for(&spec.parameters)
                    .unwrap_or_else(|e| panic!("built-in tool schema of `{}` is invalid: {e}", spec.name));
                super::definition::ExposedTool { spec, script_safe: false, validator }
            })
            .collect()
    });
    TOOLS.iter().find(|t| t.spec.name == name)
}

/// Whether `name` is a tool the user answers (`exit_plan_mode` included).
pub fn is_user_tool(name: &str) -> bool {
    matches!(name, ASK_USER | CLARIFY | EXIT_PLAN_MODE)
}

/// What the user is asked.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt<'a> {
    Question(&'a str),
    Choice {
        question: &'a str,
        choices: &'a [String],
        freetext: bool,
    },
    /// A permission `ask` rule matched this call.
    Permission(&'a ToolCall),
    Plan(&'a str),
    /// In a conversation: the agent's text reply.
    Reply(&'a str),
}

impl Prompt<'_> {
    /// The prompt as the user reads it.
    fn text(&self) -> String {
        match self {
            Prompt::Question(question) => format!("The assistant asks you: {question}"),
            Prompt::Choice { question, choices, freetext } => {
                let options: Vec<String> = choices.iter().enumerate().map(|(i, c)| format!("{}. {c}", i + 1)).collect();
                let free = if *freetext { "Pick one, or answer in your own words." } else { "Pick one of them." };
                format!("The assistant asks you: {question}\nThe choices:\n{}\n{free}", options.join("\n"))
            }
            Prompt::Permission(call) => format!(
                "The assistant wants to run `{}` with {}. Reply `yes` to allow it or `no` to refuse.",
                call.name, call.arguments
            ),
            Prompt::Plan(plan) => format!(
                "The assistant proposes this plan:\n{plan}\nReply `approve` to let it go ahead, or `reject` and say what to change."
            ),
            Prompt::Reply(text) => text.to_string(),
        }
    }
}

/// The user failed to answer: the episode is unscored (`user_error`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the task's user failed: {0}")]
pub struct UserFault(pub String);

impl UserFault {
    pub fn cause(&self) -> UnscoredCause {
        UnscoredCause::UserError
    }
}

/// One episode's user.
pub struct User {
    voice: Voice,
    /// Whether the task has a `user:` (and so offers `ask_user` and `clarify`).
    declared: bool,
    conversation: bool,
    stop: String,
    /// What a simulated user's model calls used and cost (`None` once a call had no price).
    spent: Mutex<(Usage, Option<f64>, u32)>,
}

enum Voice {
    /// Nobody: an `ask` rule is denied, a question fails.
    Nobody,
    /// Replies in order; then `then` (or nobody, for a task's bare `answers:`).
    Scripted {
        replies: Mutex<VecDeque<String>>,
        then: Option<String>,
    },
    Simulated(Simulated),
}

struct Simulated {
    /// The model that plays the user (its name is the one logged: `mock` under `--model mock`).
    model: Arc<dyn LanguageModel>,
    /// The user's side of the conversation: what the agent said is `user`, the user's own
    /// replies are `assistant`. One question at a time.
    transcript: tokio::sync::Mutex<Vec<Message>>,
}

impl Default for User {
    fn default() -> Self {
        User::new(Voice::Nobody, false, false, String::new())
    }
}

impl User {
    fn new(voice: Voice, declared: bool, conversation: bool, stop: String) -> Self {
        User { voice, declared, conversation, stop, spent: Mutex::new((Usage::default(), Some(0.0), 0)) }
    }

    /// A task's bare `answers:` (permission `ask` rules only): given out in order, then nobody.
    pub fn answers(answers: &[String]) -> Self {
        if answers.is_empty() {
            return User::default();
        }
        let replies = Mutex::new(answers.iter().cloned().collect());
        User::new(Voice::Scripted { replies, then: None }, false, false, String::new())
    }

    /// The user of one episode of `task`: its `user:`, else its `answers:`. `model` plays a
    /// simulated user; without one, a simulated user cannot be set up.
    pub fn of_task(task: &Task, model: Option<Arc<dyn LanguageModel>>) -> Result<Self, String> {
        let Some(spec) = &task.user else { return Ok(User::answers(&task.answers)) };
        let voice = match &spec.kind {
            UserKind::Scripted { replies, then } => {
                Voice::Scripted { replies: Mutex::new(replies.iter().cloned().collect()), then: Some(then.clone()) }
            }
            UserKind::Simulated { model: name, persona, instructions } => {
                let Some(model) = model else {
                    return Err(format!("the simulated user's model `{name}` is not open in this run"));
                };
                let system = system_prompt(persona, instructions, &task.input, &spec.stop, spec.conversation);
                let transcript = tokio::sync::Mutex::new(vec![Message::System { content: system }]);
                Voice::Simulated(Simulated { model, transcript })
            }
        };
        Ok(User::new(voice, true, spec.conversation, spec.stop.clone()))
    }

    /// Whether the task has a user who can be asked (`ask_user`, `clarify`).
    pub fn is_declared(&self) -> bool {
        self.declared
    }

    /// Whether the agent talks with this user until it says its stop word.
    pub fn is_conversation(&self) -> bool {
        self.conversation
    }

    /// Whether `reply` ends the conversation.
    pub fn says_stop(&self, reply: &str) -> bool {
        !self.stop.is_empty() && reply.contains(&self.stop)
    }

    /// What a simulated user's calls used, and cost (`None` if a call had no price); `None`
    /// when it made none.
    pub fn spent(&self) -> Option<(Usage, Option<f64>)> {
        let spent = self.spent.lock().unwrap_or_else(|p| p.into_inner());
        (spent.2 > 0).then_some((spent.0, spent.1))
    }

    /// The user's answer to `prompt`; `None` when nobody is there to answer.
    pub async fn answer(
        &self,
        prompt: &Prompt<'_>,
        step: u32,
        recorder: &Recorder,
    ) -> Result<Option<String>, UserFault> {
        match &self.voice {
            Voice::Nobody => Ok(None),
            Voice::Scripted { replies, then } => {
                // A poisoned lock only means a call panicked; the queue itself is intact.
                let next = replies.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
                Ok(next.or_else(|| then.clone()))
            }
            Voice::Simulated(sim) => self.simulate(sim, prompt, step, recorder).await.map(Some),
        }
    }

    async fn simulate(
        &self,
        sim: &Simulated,
        prompt: &Prompt<'_>,
        step: u32,
        recorder: &Recorder,
    ) -> Result<String, UserFault> {
        let mut transcript = sim.transcript.lock().await;
        transcript.push(Message::User { content: prompt.text() });
        let request = ModelRequest::new(&transcript, &[]);
        let caller = Caller::Actor(Actor::User);
        let (result, event) = respond_logged(sim.model.as_ref(), sim.model.name(), &request, step, caller).await;
        recorder.emit(&event);
        let response = result.map_err(|e| UserFault(format!("`{}`: {}: {}", sim.model.name(), e.cause, e.message)))?;
        {
            let mut spent = self.spent.lock().unwrap_or_else(|p| p.into_inner());
            spent.0.add(response.usage);
            spent.1 = spent.1.zip(response.cost_usd).map(|(a, b)| crate::log::add_cost(a, b));
            spent.2 += 1;
        }
        let text = response.text.unwrap_or_default();
        if text.trim().is_empty() {
            transcript.pop();
            return Err(UserFault(format!("`{}` answered with no text", sim.model.name())));
        }
        transcript.push(Message::Assistant { content: Some(text.clone()), tool_calls: Vec::new() });
        Ok(text)
    }
}

/// What the model playing the user is told.
fn system_prompt(persona: &str, instructions: &str, input: &str, stop: &str, conversation: bool) -> String {
    let mut text = String::from(
        "You are playing a user who works with an AI assistant. Stay in character and write only what the user \
         would say, briefly, in the first person. Never act as the assistant.\n",
    );
    if !persona.trim().is_empty() {
        text.push_str(&format!("\nWho you are: {}\n", persona.trim()));
    }
    if !instructions.trim().is_empty() {
        text.push_str(&format!("\nYour instructions: {}\n", instructions.trim()));
    }
    text.push_str(&format!("\nYour request to the assistant was: {input}\n"));
    if conversation {
        text.push_str(&format!(
            "\nWhen your request has been dealt with, or the conversation cannot go on, reply with {stop} alone.\n"
        ));
    }
    text
}

#[derive(Deserialize)]
struct Question {
    question: String,
}

#[derive(Deserialize)]
struct Choice {
    question: String,
    choices: Vec<String>,
    #[serde(default = "yes")]
    allow_freetext: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
struct Plan {
    plan: String,
}

/// Whether an answer to `exit_plan_mode` approves the plan: it starts with `approve` or
/// `yes`, in any case.
pub fn approves_plan(answer: &str) -> bool {
    let answer = answer.trim().to_lowercase();
    answer.starts_with("approve") || answer.starts_with("yes")
}

/// What one of the user's tools returns: the user's answer, or why there is none (the
/// tool's failure), or the user's fault.
pub enum Answered {
    Result(Value),
    Failure(super::ToolFailure),
    Fault(UserFault),
}

impl User {
    /// Runs `ask_user`, `clarify` or `exit_plan_mode` (arguments already checked against
    /// their schemas).
    pub async fn run_tool(&self, call: &ToolCall, step: u32, recorder: &Recorder) -> Answered {
        use crate::contract::ErrorType;
        let result = match call.name.as_str() {
            ASK_USER => {
                let q: Question = match super::decode_arguments(call.arguments.clone()) {
                    Ok(q) => q,
                    Err(f) => return Answered::Failure(f),
                };
                self.answer(&Prompt::Question(&q.question), step, recorder)
                    .await
                    .map(|a| a.map(|a| json!({"answer": a})))
            }
            CLARIFY => {
                let c: Choice = match super::decode_arguments(call.arguments.clone()) {
                    Ok(c) => c,
                    Err(f) => return Answered::Failure(f),
                };
                let prompt = Prompt::Choice { question: &c.question, choices: &c.choices, freetext: c.allow_freetext };
                self.answer(&prompt, step, recorder).await.map(|a| a.map(|a| choice_result(&a, &c.choices)))
            }
            _ => {
                let p: Plan = match super::decode_arguments(call.arguments.clone()) {
                    Ok(p) => p,
                    Err(f) => return Answered::Failure(f),
                };
                self.answer(&Prompt::Plan(&p.plan), step, recorder)
                    .await
                    .map(|a| a.map(|a| json!({"approved": approves_plan(&a), "feedback": a})))
            }
        };
        match result {
            Ok(Some(value)) => Answered::Result(value),
            Ok(None) => Answered::Failure(
                super::ToolFailure::new(ErrorType::ExecutionError, "this task has no user to answer")
                    .suggest("decide for yourself, and say what you assumed"),
            ),
            Err(fault) => Answered::Fault(fault),
        }
    }
}

/// A `clarify` answer: the choice it names (by its text, or its number) when it names one.
fn choice_result(answer: &str, choices: &[String]) -> Value {
    let trimmed = answer.trim();
    let chosen = choices
        .iter()
        .position(|c| c.trim().eq_ignore_ascii_case(trimmed))
        .or_else(|| trimmed.parse::<usize>().ok().filter(|n| (1..=choices.len()).contains(n)).map(|n| n - 1));
    match chosen {
        Some(i) => json!({"answer": answer, "choice": choices[i]}),
        None => json!({"answer": answer, "choice": null}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{MockTurn, UserSpec, text::Text};
    use crate::log::EventLog;

    fn task(kind: UserKind, mock: &[&str]) -> Task {
        let mock: Vec<MockTurn> =
            mock.iter().map(|t| MockTurn { text: Some(Text((*t).into())), tool_calls: Vec::new() }).collect();
        Task {
            user: Some(Arc::new(UserSpec { kind, conversation: true, stop: "###STOP###".into(), mock: mock.into() })),
            ..Task::new("t", "Book a table.")
        }
    }

    /// Asks `user` each prompt in turn; the answers, and the events logged.
    async fn ask(user: &User, prompts: &[Prompt<'_>]) -> (Vec<Result<Option<String>, UserFault>>, Vec<Value>) {
        let dir = tempfile::tempdir().unwrap();
        let (log, writer) = EventLog::create(&dir.path().join("e.jsonl"), "r").unwrap();
        let recorder = log.recorder("ep");
        let mut answers = Vec::new();
        for prompt in prompts {
            answers.push(user.answer(prompt, 1, &recorder).await);
        }
        drop((recorder, log));
        writer.close().unwrap();
        let text = std::fs::read_to_string(dir.path().join("e.jsonl")).unwrap();
        (answers, text.lines().map(|l| serde_json::from_str(l).unwrap()).collect())
    }

    #[tokio::test]
    async fn a_scripted_user_replies_in_order_then_its_fixed_reply() {
        let kind = UserKind::Scripted { replies: vec!["blue".into(), "yes".into()], then: "no more".into() };
        let user = User::of_task(&task(kind, &[]), None).unwrap();
        assert!(user.is_declared() && user.is_conversation());
        let (answers, events) =
            ask(&user, &[Prompt::Question("colour?"), Prompt::Reply("ok"), Prompt::Plan("p")]).await;
        assert_eq!(answers, [Ok(Some("blue".into())), Ok(Some("yes".into())), Ok(Some("no more".into()))]);
        assert!(events.is_empty(), "a scripted user calls no model");
        assert_eq!(user.spent(), None);
    }

    #[tokio::test]
    async fn bare_answers_run_out_to_nobody() {
        let user = User::answers(&["yes".into()]);
        assert!(!user.is_declared(), "bare answers offer no user tools");
        let (answers, _) = ask(&user, &[Prompt::Reply("a"), Prompt::Reply("b")]).await;
        assert_eq!(answers, [Ok(Some("yes".into())), Ok(None)]);
        let (answers, _) = ask(&User::default(), &[Prompt::Reply("a")]).await;
        assert_eq!(answers, [Ok(None)]);
    }

    #[tokio::test]
    async fn a_simulated_user_sees_the_conversation_and_its_calls_are_logged_as_the_users() {
        let kind = UserKind::Simulated {
            model: "mock".into(),
            persona: "A terse diner.".into(),
            instructions: "Two at 8.".into(),
        };
        let task = task(kind, &["Two, at 8.", "###STOP###"]);
        let model: Arc<dyn LanguageModel> =
            Arc::new(crate::model::mock::MockModel::new(task.user.as_ref().unwrap().mock.clone()));
        let user = User::of_task(&task, Some(model)).unwrap();
        let (answers, events) = ask(&user, &[Prompt::Question("How many?"), Prompt::Reply("Booked.")]).await;
        assert_eq!(answers, [Ok(Some("Two, at 8.".into())), Ok(Some("###STOP###".into()))]);
        assert!(user.says_stop("###STOP###") && !user.says_stop("Two, at 8."));
        let calls: Vec<&Value> = events.iter().filter(|e| e["type"] == "model_call").collect();
        assert_eq!(calls.len(), 2);
        assert!(calls.iter().all(|c| c["actor"] == "user" && c.get("scorer").is_none()), "{calls:?}");
        let (usage, _) = user.spent().expect("it made calls");
        assert!(usage.input_tokens > 0);
        // The second request held the whole conversation: system, question, answer, reply.
        let transcript = match &user.voice {
            Voice::Simulated(sim) => sim.transcript.lock().await.clone(),
            _ => unreachable!(),
        };
        assert_eq!(transcript.len(), 5);
        let Message::System { content } = &transcript[0] else { panic!("{transcript:?}") };
        assert!(content.contains("A terse diner.") && content.contains("Two at 8.") && content.contains("###STOP###"));
        assert!(content.contains("Book a table."), "the user knows its request");
        assert_eq!(transcript[1], Message::User { content: "The assistant asks you: How many?".into() });
    }

    #[tokio::test]
    async fn a_simulated_user_whose_model_fails_is_a_fault_not_an_answer() {
        let kind = UserKind::Simulated { model: "mock".into(), persona: String::new(), instructions: String::new() };
        let task = task(kind, &[]);
        let model: Arc<dyn LanguageModel> = Arc::new(crate::model::mock::MockModel::new(Vec::new().into()));
        let user = User::of_task(&task, Some(model)).unwrap();
        let (answers, events) = ask(&user, &[Prompt::Reply("hello")]).await;
        let fault = answers[0].clone().unwrap_err();
        assert_eq!(fault.cause(), UnscoredCause::UserError);
        assert!(fault.0.contains("mock_exhausted"), "{fault}");
        assert_eq!(events[0]["cause"], "mock_exhausted", "the failed call is logged too");
        // Without a model, a simulated user cannot be set up.
        let Err(message) = User::of_task(&task, None) else { panic!("set up without a model") };
        assert!(message.contains("`mock` is not open"), "{message}");
    }

    #[test]
    fn a_plan_is_approved_by_approve_or_yes_only() {
        for answer in ["approve", "Approved, go", "yes", " YES please"] {
            assert!(approves_plan(answer), "{answer}");
        }
        for answer in ["reject: keep b", "no", "looks fine but approve later", ""] {
            assert!(!approves_plan(answer), "{answer}");
        }
    }

    #[test]
    fn a_clarify_answer_names_a_choice_by_text_or_number() {
        let choices = ["small".to_string(), "large".into()];
        assert_eq!(choice_result("Large", &choices)["choice"], "large");
        assert_eq!(choice_result("1", &choices)["choice"], "small");
        assert_eq!(choice_result("3", &choices)["choice"], Value::Null);
        assert_eq!(choice_result("medium please", &choices), json!({"answer": "medium please", "choice": null}));
    }

    #[test]
    fn prompts_read_as_the_user_sees_them() {
        let call = ToolCall::new("c", "kv_delete", json!({"key": "a"}));
        assert_eq!(
            Prompt::Permission(&call).text(),
            r#"The assistant wants to run `kv_delete` with {"key":"a"}. Reply `yes` to allow it or `no` to refuse."#
        );
        let choices = ["a".to_string(), "b".into()];
        let text = Prompt::Choice { question: "Which?", choices: &choices, freetext: false }.text();
        assert_eq!(text, "The assistant asks you: Which?\nThe choices:\n1. a\n2. b\nPick one of them.");
    }
}
