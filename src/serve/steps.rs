//! The step API, as OpenEnv's: the caller is the policy. `reset` starts an episode of a
//! task whose agent's model is the caller — each time the agent would ask its model, the
//! observation (the new messages: the task at first, then the tools' results, and the tool
//! specs) goes to the caller, and the caller's action (tool calls, or a text answer) comes
//! back as the model's answer. Everything else is an episode as any: its world, sandbox,
//! limits, log and scorers; its reward comes when it ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Service;
use super::episodes::{Entry, EpisodeRequest, Phase, STEPS_MODEL};
use super::http::ApiError;
use super::journal::Policy;
use crate::model::limiter::Deadline;
use crate::model::{Backend, LanguageModel, Message, ModelError, ModelRequest, ModelResponse, ProposedCall};

/// One session: an episode the caller steps.
pub struct StepSession {
    pub entry: Arc<Entry>,
    io: tokio::sync::Mutex<Io>,
    steps: AtomicU32,
}

struct Io {
    actions: mpsc::Sender<ModelResponse>,
    /// Each observation the agent's model is asked with; closed when the episode ends.
    observed: mpsc::Receiver<Value>,
    /// The answer once the episode has ended.
    ended: Option<Arc<Value>>,
}

/// The model of a stepped episode: the caller, through two channels.
struct Caller {
    observed: mpsc::Sender<Value>,
    actions: tokio::sync::Mutex<mpsc::Receiver<ModelResponse>>,
    /// How long a caller may take to act before its episode is cancelled.
    idle: Duration,
    stop: CancellationToken,
}

#[async_trait]
impl LanguageModel for Caller {
    fn name(&self) -> &str {
        STEPS_MODEL
    }

    async fn respond(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        // The caller's time to decide is not the episode's: its clock stands meanwhile.
        let _paused = request.deadline.map(Deadline::pause);
        let observation = observation_of(request);
        let mut actions = self.actions.lock().await;
        if self.observed.send(observation).await.is_ok()
            && let Ok(Some(action)) = tokio::time::timeout(self.idle, actions.recv()).await
        {
            return Ok(action);
        }
        // The caller is gone or idle past its time: the episode is cancelled (the loop
        // sees the stop and ends it; this call never answers).
        self.stop.cancel();
        std::future::pending().await
    }
}

/// The observation of one turn: the messages since the agent's last answer (the system
/// prompt and the task at first, then each tool's result), and the tools it may call.
fn observation_of(request: &ModelRequest<'_>) -> Value {
    let since = request.messages.iter().rposition(|m| matches!(m, Message::Assistant { .. })).map_or(0, |i| i + 1);
    json!({"messages": &request.messages[since..], "tools": request.tools})
}

/// Reads an action: `{tool_calls: [{name, arguments, call_id?}], text?}`, `{text}`, or one
/// call `{name, arguments}`.
pub fn read_action(action: Option<&Value>) -> Result<ModelResponse, ApiError> {
    let expected = "`action` must be {tool_calls: [{name, arguments}]}, {text: \"…\"}, or one call {name, arguments}";
    let Some(Value::Object(action)) = action else { return Err(ApiError::field("action", expected)) };
    let text = match action.get("text") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::field("action.text", "`text` must be a string")),
    };
    let whole = Value::Object(action.clone());
    let calls: Vec<(String, &Value)> = match (action.get("tool_calls"), action.get("name")) {
        (Some(Value::Array(calls)), _) => {
            calls.iter().enumerate().map(|(i, c)| (format!("action.tool_calls[{i}]"), c)).collect()
        }
        (Some(_), _) => return Err(ApiError::field("action.tool_calls", "`tool_calls` must be a list")),
        // One call, written as the action itself.
        (None, Some(_)) => vec![("action".to_owned(), &whole)],
        (None, None) if text.is_some() => Vec::new(),
        (None, None) => return Err(ApiError::field("action", expected)),
    };
    let mut tool_calls = Vec::new();
    for (at, call) in calls {
        let name = match call.get("name") {
            Some(Value::String(n)) if !n.trim().is_empty() => n.clone(),
            _ => return Err(ApiError::field(&format!("{at}.name"), "each call needs a `name`, a non-empty string")),
        };
        let arguments = match call.get("arguments") {
            None | Some(Value::Null) => json!({}),
            // As OpenAI writes them: a JSON string.
            Some(Value::String(s)) => serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())),
            Some(v) => v.clone(),
        };
        let id = call.get("call_id").and_then(Value::as_str).map(String::from);
        tool_calls.push(ProposedCall { id, name, arguments });
    }
    Ok(ModelResponse { text, tool_calls, ..ModelResponse::default() })
}

impl Service {
    /// `reset`: starts a stepped episode of the task `body` names; its first observation.
    pub async fn reset(self: &Arc<Self>, body: &Value) -> Result<(Arc<StepSession>, Value), ApiError> {
        let (suite, task) = self.find_task(body, "")?;
        let epoch = match body.get("epoch").and_then(Value::as_u64) {
            Some(e) if e >= 1 && e <= u64::from(u32::MAX) => Some(e as u32),
            _ => None,
        };
        let permit = self.bound.clone().try_acquire_owned().map_err(|_| ApiError::busy(self.jobs))?;
        let (observed_tx, observed) = mpsc::channel(1);
        let (actions, actions_rx) = mpsc::channel(1);
        let stop = CancellationToken::new();
        let caller = Caller {
            observed: observed_tx,
            actions: tokio::sync::Mutex::new(actions_rx),
            idle: self.session_idle,
            stop: stop.clone(),
        };
        let backend = Arc::new(Backend::lent(STEPS_MODEL, Arc::new(caller), self.backend_options.clone()));
        let asked = EpisodeRequest { suite, task, epoch, policy: Policy::Steps, api_key: None };
        let entry = self.admit_with(asked, backend, permit, stop)?.entry;
        let session = Arc::new(StepSession {
            entry,
            io: tokio::sync::Mutex::new(Io { actions, observed, ended: None }),
            steps: AtomicU32::new(0),
        });
        let id = session.entry.admitted.episode_id.clone();
        super::lock(&self.sessions).insert(id, session.clone());
        let first = self.next(&session, None).await;
        Ok((session, first))
    }

    /// The session `id`: open, or why not (unknown, or its episode ended).
    pub fn session(&self, id: Option<&str>) -> Result<Arc<StepSession>, ApiError> {
        let Some(id) = id.filter(|s| !s.is_empty()) else {
            return Err(ApiError::field("session_id", "`session_id` is missing: the one `reset` gave"));
        };
        if let Some(session) = super::lock(&self.sessions).get(id) {
            return Ok(session.clone());
        }
        match super::lock(&self.registry).get(id) {
            Some(_) => Err(ApiError::conflict(
                "session_id",
                format!("the episode of session {id} has ended; reset for a new one"),
            )),
            None => Err(ApiError::not_found("session_id", format!("no session {id}"))),
        }
    }

    /// `step`: the caller's action in, the next observation (or the end, with the reward) out.
    pub async fn step(&self, session: &StepSession, action: Option<&Value>) -> Result<Value, ApiError> {
        let action = read_action(action)?;
        Ok(self.next(session, Some(action)).await)
    }

    /// Sends `action` (none at reset) and waits for what the episode does next.
    async fn next(&self, session: &StepSession, action: Option<ModelResponse>) -> Value {
        let mut io = session.io.lock().await;
        if let Some(answer) = &io.ended {
            return ended(answer, true);
        }
        let sent = match action {
            Some(action) => io.actions.send(action).await.is_ok(),
            None => true,
        };
        if sent && let Some(observation) = io.observed.recv().await {
            session.steps.fetch_add(1, Ordering::Relaxed);
            let id = &session.entry.admitted.episode_id;
            return json!({"observation": observation, "reward": null, "done": false, "session_id": id, "episode_id": id});
        }
        // The episode ended (its agent asked nothing more): wait for its answer.
        let mut phase = session.entry.phase.subscribe();
        let answer = match phase.wait_for(|p| matches!(p, Phase::Ended(_))).await.map(|p| p.clone()) {
            Ok(Phase::Ended(answer)) => answer,
            _ => Arc::new(json!({"status": "ended", "outcome": {"status": "cancelled"}, "masked": true})),
        };
        io.ended = Some(answer.clone());
        super::lock(&self.sessions).remove(&session.entry.admitted.episode_id);
        ended(&answer, false)
    }

    /// `state`: where the session's episode is.
    pub fn state(&self, session: &StepSession) -> Value {
        let a = &session.entry.admitted;
        let done = matches!(*session.entry.phase.borrow(), Phase::Ended(_));
        json!({"episode_id": a.episode_id, "session_id": a.episode_id, "step_count": session.steps.load(Ordering::Relaxed),
               "suite": a.suite, "task": a.task, "epoch": a.epoch, "done": done})
    }
}

impl StepSession {
    /// Cancels the session's episode (its caller went away).
    pub fn cancel(&self) {
        self.entry.stop.cancel();
    }
}

/// The last step's answer: the reward when the episode was scored, none (and `masked`)
/// when it was not; the episode's outcome and scores in `info`.
fn ended(answer: &Value, again: bool) -> Value {
    let mut info = json!({
        "episode_id": answer["episode_id"], "outcome": answer["outcome"], "masked": answer["masked"],
        "says": answer["says"], "scores": answer["scores"], "termination": answer["termination"],
    });
    if again {
        info["note"] = json!("the episode had already ended");
    }
    json!({"observation": {"messages": [], "tools": [], "outcome": answer["outcome"]}, "reward": answer["reward"],
           "done": true, "info": info, "session_id": answer["episode_id"], "episode_id": answer["episode_id"]})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_action_is_calls_or_text_and_a_bad_one_names_its_field() {
        let r = read_action(Some(&json!({"tool_calls": [{"name": "set", "arguments": "{\"k\": 1}"}]}))).unwrap();
        assert_eq!(r.tool_calls[0].arguments, json!({"k": 1}));
        let r = read_action(Some(&json!({"name": "get", "arguments": {"k": "a"}}))).unwrap();
        assert_eq!((r.tool_calls.len(), r.tool_calls[0].name.as_str()), (1, "get"));
        assert_eq!(read_action(Some(&json!({"text": "4"}))).unwrap().text.as_deref(), Some("4"));
        for (bad, field) in [
            (json!({"tool_calls": [{"arguments": {}}]}), "action.tool_calls[0].name"),
            (json!({"tool_calls": {}}), "action.tool_calls"),
            (json!({"text": 4}), "action.text"),
            (json!({}), "action"),
            (json!([]), "action"),
        ] {
            assert_eq!(read_action(Some(&bad)).unwrap_err().field.as_deref(), Some(field), "{bad}");
        }
    }
}
