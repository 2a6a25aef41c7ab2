//! The episode API: a request read into what it asks (a task, an epoch, who plays the
//! agent), admitted within the server's bound and its queue, run by the batch's episode
//! runner, and answered with a typed outcome — scored, or unscored and masked, or cancelled —
//! its reward, scores, trajectory and events.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{Map, Value, json};
use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio_util::sync::CancellationToken;

use super::Service;
use super::http::ApiError;
use super::journal::{Admitted, Policy};
use crate::batch::{EpisodeReport, EpisodeSpec, episode_id};
use crate::log::Outcome;
use crate::model::{Backend, CallerEndpoint};

/// How many ended episodes' answers are kept for `GET`; older ones are in the run's log.
const KEPT_ANSWERS: usize = 4096;
/// How many of the latest keep their events and trajectory too (an episode's log runs to
/// megabytes); the others keep their outcome, reward and scores.
const WHOLE_ANSWERS: usize = 64;

/// Where an episode is.
#[derive(Clone)]
pub enum Phase {
    Running,
    Ended(Arc<Value>),
    /// Admitted before the server last ended, and never ended.
    Interrupted,
}

pub struct Entry {
    pub admitted: Admitted,
    pub phase: watch::Sender<Phase>,
    pub stop: CancellationToken,
}

/// The episodes the server knows: running, interrupted, and the latest ended ones; and the
/// highest epoch served of each task and model, so that each request gets a new episode.
#[derive(Default)]
pub struct ServedEpisodes {
    entries: HashMap<String, Arc<Entry>>,
    ended: VecDeque<String>,
    epochs: HashMap<(String, String, String), u32>,
}

impl ServedEpisodes {
    pub fn get(&self, id: &str) -> Option<Arc<Entry>> {
        self.entries.get(id).cloned()
    }

    /// Counts an epoch as served (from the log or the queue, at start).
    pub fn served(&mut self, suite: &str, task: &str, model: &str, epoch: u32) {
        let highest = self.epochs.entry((suite.to_owned(), task.to_owned(), model.to_owned())).or_default();
        *highest = (*highest).max(epoch);
    }

    pub fn insert(&mut self, admitted: Admitted, phase: Phase, stop: CancellationToken) -> Arc<Entry> {
        let entry = Arc::new(Entry { admitted, phase: watch::Sender::new(phase), stop });
        self.entries.insert(entry.admitted.episode_id.clone(), entry.clone());
        entry
    }

    /// Marks an episode ended: the answer [`WHOLE_ANSWERS`] back loses its events and
    /// trajectory, and the oldest answers beyond [`KEPT_ANSWERS`] are let go.
    pub fn ended(&mut self, id: &str) {
        self.ended.push_back(id.to_owned());
        if let Some(older) = self.ended.len().checked_sub(WHOLE_ANSWERS + 1).and_then(|i| self.ended.get(i))
            && let Some(entry) = self.entries.get(older)
        {
            let slim = match &*entry.phase.borrow() {
                Phase::Ended(answer) if answer.get("events").is_some() => Some(slimmed(answer)),
                _ => None,
            };
            if let Some(slim) = slim {
                entry.phase.send_replace(Phase::Ended(Arc::new(slim)));
            }
        }
        while self.ended.len() > KEPT_ANSWERS {
            let Some(old) = self.ended.pop_front() else { break };
            // One retried since is running again: kept.
            if self.entries.get(&old).is_some_and(|e| matches!(*e.phase.borrow(), Phase::Ended(_))) {
                self.entries.remove(&old);
            }
        }
    }

    /// The ids of the episodes running and interrupted.
    pub fn open(&self) -> Vec<(String, &'static str)> {
        let mut open: Vec<(String, &'static str)> = self
            .entries
            .iter()
            .filter_map(|(id, e)| match *e.phase.borrow() {
                Phase::Running => Some((id.clone(), "running")),
                Phase::Interrupted => Some((id.clone(), "interrupted")),
                Phase::Ended(_) => None,
            })
            .collect();
        open.sort();
        open
    }
}

/// An answer without its events and trajectory, saying where they are.
fn slimmed(answer: &Value) -> Value {
    let mut slim: Map<String, Value> = answer
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, _)| !matches!(k.as_str(), "events" | "trajectory"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    slim.insert("events_in".into(), json!("the run's events.jsonl (answers kept here drop them after a while)"));
    Value::Object(slim)
}

/// What a request asks for, read and checked.
pub struct EpisodeRequest {
    pub suite: usize,
    pub task: usize,
    pub epoch: Option<u32>,
    pub policy: Policy,
    /// The caller's key for its endpoint: used, never written.
    pub api_key: Option<String>,
}

/// Reads `{task, suite?, epoch?, seed?, model}`; `at` prefixes the fields an error names
/// (`episodes[3].`).
pub fn read_request(service: &Service, body: &Value, at: &str) -> Result<EpisodeRequest, ApiError> {
    let field = |name: &str| format!("{at}{name}");
    let (suite, task) = service.find_task(body, at)?;
    let epoch = match body.get("epoch") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64().filter(|n| (1..=u64::from(u32::MAX)).contains(n)) {
            Some(n) => Some(n as u32),
            None => return Err(ApiError::field(&field("epoch"), "`epoch` must be a whole number from 1")),
        },
    };
    let seed = match body.get("seed") {
        None | Some(Value::Null) => None,
        Some(v) if v.is_u64() || v.is_i64() => Some(v.clone()),
        Some(_) => return Err(ApiError::field(&field("seed"), "`seed` must be a whole number")),
    };
    let (policy, api_key) = read_model(body.get("model"), &field("model"))?;
    let policy = match (policy, seed) {
        (Policy::Endpoint { base_url, model, mut sampling }, Some(seed)) => {
            sampling.insert("seed".into(), seed);
            Policy::Endpoint { base_url, model, sampling }
        }
        (policy, _) => policy,
    };
    Ok(EpisodeRequest { suite, task, epoch, policy, api_key })
}

/// `model`: a name runner opens (`"mock"`), or the caller's endpoint
/// `{base_url, api_key?, model, sampling?}`.
pub fn read_model(model: Option<&Value>, field: &str) -> Result<(Policy, Option<String>), ApiError> {
    let expected =
        "`model` must be a model's name (`mock`) or the caller's endpoint {base_url, model, api_key?, sampling?}";
    let object = match model {
        None | Some(Value::Null) => return Err(ApiError::field(field, format!("missing: {expected}"))),
        Some(Value::String(name)) if !name.trim().is_empty() => {
            return Ok((Policy::Named { model: name.trim().to_owned() }, None));
        }
        Some(Value::Object(object)) => object,
        Some(_) => return Err(ApiError::field(field, expected)),
    };
    let text = |key: &str, required: bool| -> Result<Option<String>, ApiError> {
        match object.get(key) {
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.trim().to_owned())),
            None | Some(Value::Null) if !required => Ok(None),
            _ => Err(ApiError::field(&format!("{field}.{key}"), format!("`{key}` must be a non-empty string"))),
        }
    };
    if let Some(unknown) = object.keys().find(|k| !["base_url", "api_key", "model", "sampling"].contains(&k.as_str())) {
        return Err(ApiError::field(
            &format!("{field}.{unknown}"),
            "unknown key: the endpoint takes base_url, model, api_key and sampling",
        ));
    }
    let base_url = text("base_url", true)?.unwrap_or_default();
    match reqwest::Url::parse(&base_url) {
        Ok(url) if matches!(url.scheme(), "http" | "https") && url.has_host() => {}
        _ => {
            return Err(ApiError::field(
                &format!("{field}.base_url"),
                format!("`{base_url}` is not an http(s) URL; write it whole, e.g. http://127.0.0.1:8000/v1"),
            ));
        }
    }
    let name = text("model", true)?.unwrap_or_default();
    let sampling = match object.get("sampling") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(s)) => s.clone(),
        Some(_) => return Err(ApiError::field(&format!("{field}.sampling"), "`sampling` must be an object")),
    };
    crate::model::config::check_sampling(&sampling)
        .map_err(|(key, why)| ApiError::field(&format!("{field}.sampling.{key}"), why))?;
    Ok((
        Policy::Endpoint { base_url: base_url.trim_end_matches('/').to_owned(), model: name, sampling },
        text("api_key", false)?,
    ))
}

/// The name episodes of a policy are logged and identified under.
pub fn model_name(policy: &Policy) -> String {
    match policy {
        Policy::Named { model } => model.clone(),
        Policy::Endpoint { model, .. } => format!("openai-compatible/{model}"),
        Policy::Steps => STEPS_MODEL.to_owned(),
    }
}

/// The model name of the episodes the caller steps itself.
pub const STEPS_MODEL: &str = "caller";

/// An episode admitted and started.
pub struct Started {
    pub entry: Arc<Entry>,
}

impl Service {
    /// The backend that plays `policy`, opened once per model and endpoint.
    pub fn backend(&self, policy: &Policy, api_key: Option<String>) -> Result<Arc<Backend>, ApiError> {
        let key = match policy {
            Policy::Named { model } => format!("named\0{model}"),
            Policy::Endpoint { base_url, model, sampling } => {
                use sha2::Digest as _;
                let secret = hex::encode(sha2::Sha256::digest(api_key.as_deref().unwrap_or_default()));
                format!("endpoint\0{base_url}\0{model}\0{}\0{secret}", Value::Object(sampling.clone()))
            }
            Policy::Steps => {
                return Err(ApiError::field("model", "the caller's own steps run through /reset and /step"));
            }
        };
        let mut backends = super::lock(&self.backends);
        if let Some(backend) = backends.get(&key) {
            return Ok(backend.clone());
        }
        let opened = match policy {
            Policy::Named { model } => Backend::open(model, &self.config, self.backend_options.clone()),
            Policy::Endpoint { base_url, model, sampling } => {
                let endpoint = CallerEndpoint {
                    base_url: base_url.clone(),
                    api_key,
                    sampling: sampling.clone(),
                    max_retries: self.endpoint_retries,
                };
                Backend::caller(&model_name(policy), model, endpoint, &self.config, self.backend_options.clone())
            }
            Policy::Steps => Err("the caller's own steps run through /reset and /step".to_owned()),
        };
        let backend = Arc::new(opened.map_err(|e| ApiError::field("model", e))?);
        // Many keys and endpoints over a long life: the oldest clients go, not the memory.
        if backends.len() >= 256 {
            backends.clear();
        }
        backends.insert(key, backend.clone());
        Ok(backend)
    }

    /// Admits an episode of `asked` under `permit` (a place within the bound): its epoch
    /// and id, a line in the queue, then its run on a task of its own.
    pub fn admit(self: &Arc<Self>, asked: EpisodeRequest, permit: OwnedSemaphorePermit) -> Result<Started, ApiError> {
        let backend = self.backend(&asked.policy, asked.api_key.clone())?;
        self.admit_with(asked, backend, permit, CancellationToken::new())
    }

    /// [`Service::admit`] with the backend that plays its agent, and its stop.
    pub fn admit_with(
        self: &Arc<Self>,
        asked: EpisodeRequest,
        backend: Arc<Backend>,
        permit: OwnedSemaphorePermit,
        stop: CancellationToken,
    ) -> Result<Started, ApiError> {
        let suite = &self.suites[asked.suite];
        let task = &suite.tasks[asked.task];
        let model = model_name(&asked.policy);
        let (entry, admitted) = {
            let mut registry = super::lock(&self.registry);
            let slot = (suite.name.clone(), task.id.clone(), model.clone());
            let highest = registry.epochs.get(&slot).copied().unwrap_or(0);
            let epoch = match asked.epoch {
                None => highest + 1,
                Some(e) if e > highest => e,
                Some(e) => {
                    let id = episode_id(&suite.name, &task.id, &task.digest, &model, e, None);
                    return Err(ApiError::conflict(
                        "epoch",
                        format!(
                            "epoch {e} of task `{}` with `{model}` was served already (as {id}; the highest is {highest}): omit `epoch` for the next, or retry that one by id",
                            task.id
                        ),
                    ));
                }
            };
            registry.served(&suite.name, &task.id, &model, epoch);
            let id = episode_id(&suite.name, &task.id, &task.digest, &model, epoch, None);
            let admitted = Admitted {
                episode_id: id,
                suite: suite.name.clone(),
                task: task.id.clone(),
                epoch,
                policy: asked.policy,
            };
            (registry.insert(admitted.clone(), Phase::Running, stop), admitted)
        };
        self.start(entry.clone(), admitted, backend, permit)?;
        Ok(Started { entry })
    }

    /// Runs an admitted episode again under its own id (its epoch kept).
    pub fn readmit(
        self: &Arc<Self>,
        admitted: Admitted,
        api_key: Option<String>,
        permit: OwnedSemaphorePermit,
    ) -> Result<Started, ApiError> {
        let backend = self.backend(&admitted.policy, api_key)?;
        let entry = super::lock(&self.registry).insert(admitted.clone(), Phase::Running, CancellationToken::new());
        self.start(entry.clone(), admitted, backend, permit)?;
        Ok(Started { entry })
    }

    /// Writes the admission to the queue and starts the episode; its answer is made when
    /// it ends, and the queue told.
    fn start(
        self: &Arc<Self>,
        entry: Arc<Entry>,
        admitted: Admitted,
        backend: Arc<Backend>,
        permit: OwnedSemaphorePermit,
    ) -> Result<(), ApiError> {
        let (suite, task) = self.find(&admitted.suite, &admitted.task).ok_or_else(|| {
            ApiError::not_found("task", format!("no task `{}` in suite `{}`", admitted.task, admitted.suite))
        })?;
        if let Err(e) = self.journal.admitted(&admitted) {
            super::lock(&self.registry).entries.remove(&admitted.episode_id);
            return Err(ApiError::new(hyper::StatusCode::INTERNAL_SERVER_ERROR, None, e));
        }
        let spec = EpisodeSpec {
            id: admitted.episode_id.clone(),
            suite: self.suites[suite].clone(),
            task,
            model: backend,
            epoch: admitted.epoch,
            variant: None,
        };
        let live = super::lock(&self.watch).start(&admitted.episode_id);
        let service = self.clone();
        let stop = entry.stop.clone();
        tokio::spawn(async move {
            let report = service.run.run(spec, stop).await;
            drop(permit);
            super::lock(&service.watch).stop(&admitted.episode_id);
            let answer = Arc::new(answer(&admitted, &report, &live.all()));
            if let Err(e) = service.journal.ended(&admitted.episode_id, &report.outcome) {
                eprintln!("warning: {e}");
            }
            entry.phase.send_replace(Phase::Ended(answer));
            super::lock(&service.registry).ended(&admitted.episode_id);
            // A stepped episode's session goes with it (one its caller left idle, too).
            super::lock(&service.sessions).remove(&admitted.episode_id);
        });
        Ok(())
    }
}

/// The answer of an ended episode.
pub fn answer(admitted: &Admitted, report: &EpisodeReport, events: &[Arc<Value>]) -> Value {
    let (reward, passed, masked) = match &report.outcome {
        Outcome::Scored { score, passed } => (json!(score), json!(passed), false),
        _ => (Value::Null, Value::Null, true),
    };
    let scores: Vec<Value> = events
        .iter()
        .filter(|e| e["type"] == "score")
        .map(|e| json!({"scorer": e["scorer"], "value": e["value"], "passed": e["passed"], "explanation": e["explanation"]}))
        .collect();
    json!({
        "episode_id": admitted.episode_id,
        "status": "ended",
        "suite": admitted.suite,
        "task": admitted.task,
        "epoch": admitted.epoch,
        "model": report.model,
        "outcome": report.outcome,
        "masked": masked,
        "says": says(&report.outcome),
        "reward": reward,
        "passed": passed,
        "scores": scores,
        "termination": report.termination,
        "steps": report.steps,
        "wall_ms": report.wall_ms,
        "trajectory": super::trajectory::of(events),
        "events": events,
    })
}

/// The answer of an episode known only from the log (it ended before a restart).
pub fn logged_answer(admitted: &Admitted, outcome: &Outcome) -> Value {
    let (reward, passed) = match outcome {
        Outcome::Scored { score, passed } => (json!(score), json!(passed)),
        _ => (Value::Null, Value::Null),
    };
    json!({
        "episode_id": admitted.episode_id, "status": "ended", "suite": admitted.suite, "task": admitted.task,
        "epoch": admitted.epoch, "model": model_name(&admitted.policy), "outcome": outcome,
        "masked": !matches!(outcome, Outcome::Scored { .. }), "says": says(outcome), "reward": reward, "passed": passed,
        "scores": [], "events": [],
    })
}

/// The outcome in words, for a person reading a trainer's log.
pub fn says(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Scored { score, passed } => {
            format!("scored: reward {score} ({})", if *passed { "passed" } else { "not passed" })
        }
        Outcome::Unscored { cause, message } => format!(
            "unscored ({cause}): {message}. This is not a reward of 0: nobody's answer was judged, mask this episode out (masked: true)"
        ),
        Outcome::Cancelled => {
            "cancelled: the episode was stopped before its end; mask it out (masked: true)".to_owned()
        }
    }
}

/// What `GET /v1/episodes/{id}` says of an episode that has not ended.
pub fn status(entry: &Entry) -> Value {
    let a = &entry.admitted;
    let base = json!({"episode_id": a.episode_id, "suite": a.suite, "task": a.task, "epoch": a.epoch, "masked": true});
    let mut base = base;
    match &*entry.phase.borrow() {
        Phase::Ended(answer) => return (**answer).clone(),
        Phase::Running => {
            base["status"] = json!("running");
            base["says"] = json!("running: its events stream at GET /v1/episodes/{id}/events");
        }
        Phase::Interrupted => {
            base["status"] = json!("interrupted");
            base["says"] = json!(format!(
                "interrupted: the server ended while this episode ran; POST /v1/episodes/{}/retry runs it again",
                a.episode_id
            ));
        }
    }
    base
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_is_a_name_or_an_endpoint_and_each_wrong_part_is_named() {
        let (policy, key) =
            read_model(Some(&json!({"base_url": "http://h:1/v1/", "model": "m", "api_key": "k"})), "model").unwrap();
        assert_eq!(
            policy,
            Policy::Endpoint { base_url: "http://h:1/v1".into(), model: "m".into(), sampling: Map::new() }
        );
        assert_eq!(key.as_deref(), Some("k"));
        assert_eq!(read_model(Some(&json!("mock")), "model").unwrap().0, Policy::Named { model: "mock".into() });
        for (bad, field) in [
            (json!({"model": "m"}), "model.base_url"),
            (json!({"base_url": "h:1/v1", "model": "m"}), "model.base_url"),
            (json!({"base_url": "http://h/v1"}), "model.model"),
            (json!({"base_url": "http://h/v1", "model": "m", "sampling": 3}), "model.sampling"),
            (json!({"base_url": "http://h/v1", "model": "m", "url": "x"}), "model.url"),
            (json!(7), "model"),
        ] {
            let e = read_model(Some(&bad), "model").unwrap_err();
            assert_eq!(e.field.as_deref(), Some(field), "{bad}: {}", e.message);
        }
        assert_eq!(read_model(None, "episodes[2].model").unwrap_err().field.as_deref(), Some("episodes[2].model"));
    }

    #[test]
    fn old_answers_lose_their_events_then_go_and_memory_stays_bounded() {
        let mut registry = ServedEpisodes::default();
        let answer =
            |id: &str| Phase::Ended(Arc::new(json!({"episode_id": id, "reward": 1.0, "events": [{"type": "x"}]})));
        for i in 0..KEPT_ANSWERS + 10 {
            let id = format!("ep_{i}");
            let admitted = Admitted {
                episode_id: id.clone(),
                suite: "s".into(),
                task: "t".into(),
                epoch: 1,
                policy: Policy::Steps,
            };
            registry.insert(admitted, answer(&id), CancellationToken::new());
            registry.ended(&id);
        }
        assert_eq!(registry.entries.len(), KEPT_ANSWERS);
        assert!(registry.get("ep_9").is_none(), "the oldest are let go");
        let events_of = |id: &str| match &*registry.get(id).unwrap().phase.borrow() {
            Phase::Ended(a) => (a.get("events").is_some(), a["reward"].clone()),
            _ => panic!("not ended"),
        };
        assert_eq!(events_of("ep_10"), (false, json!(1.0)), "an old answer keeps its reward, not its events");
        assert_eq!(events_of(&format!("ep_{}", KEPT_ANSWERS + 9)), (true, json!(1.0)), "the latest keeps all");
    }

    #[test]
    fn only_a_scored_episode_has_a_reward_and_the_others_say_they_are_masked() {
        assert!(says(&Outcome::Scored { score: 1.0, passed: true }).starts_with("scored: reward 1"));
        let unscored = Outcome::Unscored { cause: crate::log::UnscoredCause::ProviderError, message: "down".into() };
        let words = says(&unscored);
        assert!(words.contains("provider_error") && words.contains("not a reward of 0"), "{words}");
    }
}
