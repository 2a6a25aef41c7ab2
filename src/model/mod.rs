//! Language models: messages and tool specs in, a response out. Backends are named as
//! `provider/model` (`openai/…`, `anthropic/…`, `ollama/…`, `openai-compatible/…`, or a
//! provider from `runner.yaml`), `mock` (each task's scripted turns) and `replay:PATH`.

pub mod anthropic;
pub mod cache;
pub mod config;
pub mod echo;
pub mod embedding;
pub mod endpoint;
pub mod http;
pub mod limiter;
pub mod mock;
pub mod openai;
pub mod recalled;
pub mod replay;
pub mod role;

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::contract::ToolSpec;
use crate::log::{UnscoredCause, Usage};
use cache::CacheOptions;
use config::ModelConfig;
use replay::{CanonicalRequest, CassetteWriter, Replay};
pub use role::{Role, lend_beside, open_beside};

/// One message of a transcript, in a provider-neutral shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    System {
        content: String,
    },
    User {
        content: String,
    },
    Assistant {
        content: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<crate::contract::ToolCall>,
    },
    Tool {
        call_id: String,
        name: String,
        content: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

/// What a backend is asked.
#[derive(Debug)]
pub struct ModelRequest<'a> {
    pub messages: &'a [Message],
    pub tools: &'a [ToolSpec],
    /// When the episode's time runs out: a backend stops waiting and retrying then, and
    /// says so, so that an outage is not mistaken for the agent running out of time. A
    /// backend pauses it while waiting for runner's own request slots.
    pub deadline: Option<&'a limiter::Deadline>,
    /// What the caller asked of the answer beyond its messages and tools (a program's
    /// client through the gateway): each backend maps it to its own fields.
    pub directives: &'a Directives,
    /// What in the request is the run's own and not the model's input (an episode's folder,
    /// the gateway's address and key): left out of the request's digest, so that a recorded
    /// call replays in another run's folder.
    pub run_own: &'a RunOwn,
    /// Told of each attempt that failed before a retry, as it ends: kept as evidence even
    /// when the call is dropped later (a Ctrl-C while the retry is under way).
    pub watch: Option<&'a dyn AttemptWatch>,
}

/// An attempt of a call that failed (or timed out) and was retried.
#[derive(Debug, Clone)]
pub struct FailedAttempt {
    /// 1 for the call's first attempt.
    pub attempt: u32,
    pub cause: UnscoredCause,
    pub message: String,
    pub wall: std::time::Duration,
}

/// What hears of a call's retried attempts: the log's guard of a call under way
/// ([`CallUnderWay`]) and the cassette ([`replay::Recording`]). A backend that retries
/// tells it of each attempt before the next; a replay serves recorded ones the same way.
pub trait AttemptWatch: Send + Sync {
    fn retried(&self, attempt: &FailedAttempt);
}

impl std::fmt::Debug for dyn AttemptWatch + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AttemptWatch")
    }
}

impl<'a> ModelRequest<'a> {
    /// A request of `messages` and `tools`: no deadline, nothing asked of the answer beyond
    /// them, nothing of the run's own to leave out of its digest.
    pub fn new(messages: &'a [Message], tools: &'a [ToolSpec]) -> Self {
        ModelRequest { messages, tools, deadline: None, directives: &NO_DIRECTIVES, run_own: &NO_RUN_OWN, watch: None }
    }
}

static NO_DIRECTIVES: Directives = Directives::NONE;
static NO_RUN_OWN: RunOwn = RunOwn::NONE;

/// Values of a request that are the run's own — an episode's folder and scratch paths, the
/// gateway's address and key, the day — each with the placeholder that stands for it in a
/// request's digest and in what a cassette keeps. A response recorded with placeholders is
/// given the replaying run's values back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunOwn {
    /// (value, placeholder), the longest value first: a folder's is replaced before its
    /// parent's.
    pairs: Vec<(String, String)>,
    /// Whether a program's own tool reports vary from run to run ([`VOLATILE`]): left out
    /// of the digest too.
    volatile: bool,
}

/// What a program agent's own tools report that differs in every run — a timing, a random
/// id — though the program did the same: Codex's `exec_command` reports `Wall time: 0.0012
/// seconds` and `Chunk ID: 2411e0`. Left out of the digest of a program's requests, never
/// changed in what the model is sent.
const VOLATILE: &[(&str, &str)] = &[
    (r"Wall time: [0-9.]+ seconds", "Wall time: <runner:volatile> seconds"),
    (r"Chunk ID: [0-9a-f]+", "Chunk ID: <runner:volatile>"),
];

fn volatile_patterns() -> &'static [(regex::Regex, &'static str)] {
    static PATTERNS: std::sync::OnceLock<Vec<(regex::Regex, &'static str)>> = std::sync::OnceLock::new();
    PATTERNS.get_or_init(|| {
        VOLATILE.iter().filter_map(|(pattern, with)| Some((regex::Regex::new(pattern).ok()?, *with))).collect()
    })
}

impl RunOwn {
    pub const NONE: RunOwn = RunOwn { pairs: Vec::new(), volatile: false };

    /// Leaves what a program's own tools report differently in every run out of the digest.
    pub fn with_volatile_reports(mut self) -> Self {
        self.volatile = true;
        self
    }

    /// Adds `value` (as JSON writes it inside a string) under `<runner:NAME>`. Values shorter
    /// than 8 bytes are left out: they could match the model's own words.
    pub fn add(&mut self, value: &str, name: &str) {
        let escaped = serde_json::to_string(value).unwrap_or_default();
        let escaped = escaped.trim_matches('"');
        if escaped.len() < 8 || self.pairs.iter().any(|(v, _)| v == escaped) {
            return;
        }
        self.pairs.push((escaped.to_owned(), format!("<runner:{name}>")));
        self.pairs.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty() && !self.volatile
    }

    /// JSON text with the run's values as placeholders.
    pub fn normalise(&self, json: &str) -> String {
        self.pairs.iter().fold(json.to_owned(), |text, (value, placeholder)| text.replace(value, placeholder))
    }

    /// A request's JSON as its digest sees it: the run's values as placeholders, and what
    /// a program's tools report differently in every run left out.
    pub fn keyed(&self, json: &str) -> String {
        let text = self.normalise(json);
        if !self.volatile {
            return text;
        }
        volatile_patterns().iter().fold(text, |text, (pattern, with)| pattern.replace_all(&text, *with).into_owned())
    }

    /// JSON text with the placeholders as this run's values.
    pub fn restore(&self, json: &str) -> String {
        self.pairs.iter().fold(json.to_owned(), |text, (value, placeholder)| text.replace(placeholder, value))
    }

    /// `value` through its JSON with `change` applied; itself when nothing is to change or
    /// the changed text does not read back.
    fn through<T: Serialize + serde::de::DeserializeOwned + Clone>(
        &self,
        value: &T,
        change: impl Fn(&str) -> String,
    ) -> T {
        if self.is_empty() {
            return value.clone();
        }
        serde_json::to_string(value)
            .ok()
            .and_then(|text| serde_json::from_str(&change(&text)).ok())
            .unwrap_or_else(|| value.clone())
    }

    pub fn normalised<T: Serialize + serde::de::DeserializeOwned + Clone>(&self, value: &T) -> T {
        self.through(value, |text| self.normalise(text))
    }

    /// A request as its digest sees it ([`RunOwn::keyed`]).
    pub fn keyed_value<T: Serialize + serde::de::DeserializeOwned + Clone>(&self, value: &T) -> T {
        self.through(value, |text| self.keyed(text))
    }

    pub fn restored<T: Serialize + serde::de::DeserializeOwned + Clone>(&self, value: &T) -> T {
        self.through(value, |text| self.restore(text))
    }
}

/// What a client may ask of an answer besides messages and tools, in a provider-neutral
/// shape. Part of the request's digest when any is set: it changes the answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Directives {
    /// How hard a reasoning model thinks: `minimal`, `low`, `medium`, `high`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    /// A JSON answer: `{"type": "json_object"}` or `{"type": "json_schema", "json_schema":
    /// {"name", "schema", "strict"}}`, as Chat Completions' `response_format` spells it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
}

impl Directives {
    /// Nothing asked: the backend's own settings.
    pub const NONE: Directives = Directives {
        reasoning_effort: None,
        response_format: None,
        tool_choice: None,
        parallel_tool_calls: None,
        max_output_tokens: None,
    };

    pub fn is_none(&self) -> bool {
        *self == Directives::NONE
    }
}

/// Which tools the model may or must call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    Auto,
    /// No tool: a text answer.
    None,
    /// Some tool, the model's choice.
    Required,
    /// This tool.
    Named(String),
}

/// A tool call as the model wrote it; the agent gives it a call id when it has none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProposedCall {
    pub id: Option<String>,
    pub name: String,
    /// A JSON object, or the text the model wrote when it was not valid JSON.
    pub arguments: Value,
}

/// The request as sent and the response as received, secrets left out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exchange {
    pub url: String,
    pub request: Value,
    pub response: Value,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    pub text: Option<String>,
    pub tool_calls: Vec<ProposedCall>,
    pub usage: Usage,
    pub finish_reason: Option<String>,
    #[serde(default, skip_serializing)]
    pub attempts: u32,
    /// `None` when the model has no price in the config.
    #[serde(default, skip_serializing)]
    pub cost_usd: Option<f64>,
    /// Served from a cassette or the cache.
    #[serde(default, skip_serializing)]
    pub cache_hit: bool,
    #[serde(default, skip_serializing)]
    pub exchange: Option<Exchange>,
}

impl ModelResponse {
    /// What a cassette or the cache keeps of a response.
    pub fn recorded(&self) -> ModelResponse {
        ModelResponse {
            text: self.text.clone(),
            tool_calls: self.tool_calls.clone(),
            usage: self.usage,
            finish_reason: self.finish_reason.clone(),
            ..ModelResponse::default()
        }
    }
}

/// A model call that produced no answer. `cause` becomes the episode's unscored cause.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ModelError {
    pub cause: UnscoredCause,
    pub message: String,
    pub attempts: u32,
    pub exchange: Option<Exchange>,
}

impl ModelError {
    pub fn new(cause: UnscoredCause, message: impl Into<String>) -> Self {
        ModelError { cause, message: message.into(), attempts: 1, exchange: None }
    }
}

#[async_trait]
pub trait LanguageModel: Send + Sync {
    /// The model's full name, as in episode ids and logs.
    fn name(&self) -> &str;

    /// Sampling parameters sent with every request; part of the canonical request.
    fn sampling(&self) -> Map<String, Value> {
        Map::new()
    }

    /// What, besides the request, decides the answer: the endpoint. Part of the cache key,
    /// so that one model name served from two places is cached apart.
    fn endpoint(&self) -> Option<&str> {
        None
    }

    async fn respond(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError>;
}

/// The request as replay and caching key it: model, sampling, messages, tools.
pub fn canonical_request(model: &dyn LanguageModel, request: &ModelRequest<'_>) -> CanonicalRequest {
    let canonical = CanonicalRequest {
        model: model.name().to_owned(),
        sampling: model.sampling(),
        messages: request.messages.to_vec(),
        tools: request.tools.iter().map(ToolSpec::as_offered).collect(),
        directives: (!request.directives.is_none()).then(|| request.directives.clone()),
    };
    request.run_own.keyed_value(&canonical)
}

pub fn digest(request: &CanonicalRequest) -> String {
    hex::encode(Sha256::digest(serde_json::to_vec(request).unwrap_or_default()))
}

/// Who made a model call, as its `model_call` event says: an actor of the episode (the
/// agents, the user), or a scorer (a grader's calls are nobody's in the episode).
#[derive(Debug, Clone)]
pub enum Caller {
    Actor(crate::contract::Actor),
    Scorer(String),
}

/// Asks `model` and makes the `model_call` event of the call, answered or not, logged under
/// `name` at `step`: the one way the agents, the graders and a simulated user record what
/// they asked and what came back.
pub async fn respond_logged(
    model: &dyn LanguageModel,
    name: &str,
    request: &ModelRequest<'_>,
    step: u32,
    caller: Caller,
) -> (Result<ModelResponse, ModelError>, crate::log::Event) {
    let started = std::time::Instant::now();
    let result = model.respond(request).await;
    let latency_ms = started.elapsed().as_secs_f64() * 1e3;
    let sampling = model.sampling();
    let request_digest = request_digest(model, &sampling, request);
    let (response, usage, attempts, cache_hit, cost_usd, error, cause, exchange) = match &result {
        Ok(r) => (
            // What `recorded` keeps is what serialises: no copy of the response is made.
            serde_json::to_value(r).unwrap_or_default(),
            r.usage,
            r.attempts,
            r.cache_hit,
            r.cost_usd,
            None,
            None,
            r.exchange.clone(),
        ),
        Err(e) => (
            Value::Null,
            Usage::default(),
            e.attempts,
            false,
            None,
            Some(e.message.clone()),
            Some(e.cause.clone()),
            e.exchange.clone(),
        ),
    };
    let (url, request_body, raw_response) = match exchange {
        Some(x) => (Some(x.url), Some(x.request), Some(x.response)),
        None => (None, None, None),
    };
    let (actor, scorer) = match caller {
        Caller::Actor(actor) => (actor, None),
        Caller::Scorer(scorer) => (crate::contract::Actor::default(), Some(scorer)),
    };
    let status = Some(call_status(&result).to_owned());
    let event = crate::log::Event::ModelCall {
        model: name.to_owned(),
        step,
        request_digest,
        sampling,
        response,
        usage,
        latency_ms,
        attempts,
        cache_hit,
        cost_usd,
        error,
        cause,
        url,
        request: request_body,
        raw_response,
        scorer,
        actor,
        status,
        attempt: None,
        retried: false,
    };
    (result, event)
}

/// How a call ended, as its `model_call` event says.
fn call_status(result: &Result<ModelResponse, ModelError>) -> &'static str {
    match result {
        Ok(_) => "answered",
        Err(e) => failure_status(&e.cause, &e.message),
    }
}

/// How a call or an attempt that brought no answer ended.
fn failure_status(cause: &UnscoredCause, message: &str) -> &'static str {
    match cause {
        _ if cause.as_str() == CANCELLED => CANCELLED,
        UnscoredCause::ModelTooSlow => "cut",
        _ if message.contains("the episode's time ran out") => "cut",
        _ if message.contains("no complete response within") => "timed_out",
        _ => "failed",
    }
}

/// How an attempt without an answer ended, for its `model_call` event.
struct Unanswered {
    cause: UnscoredCause,
    message: String,
    /// Set when the call took more than one attempt.
    attempt: Option<u32>,
    retried: bool,
}

/// The `model_call` event of an attempt that brought no answer: one that failed before a
/// retry, or the one under way when the call was dropped (the episode ended — its program
/// exited, a limit, the run stopped by Ctrl-C — while the model was answering). Kept as
/// evidence: what was asked, how it ended, and for how long it waited.
fn unanswered_call(
    name: &str,
    step: u32,
    (request_digest, sampling): (String, Map<String, Value>),
    waited: std::time::Duration,
    caller: Caller,
    ended: Unanswered,
) -> crate::log::Event {
    let (actor, scorer) = match caller {
        Caller::Actor(actor) => (actor, None),
        Caller::Scorer(scorer) => (crate::contract::Actor::default(), Some(scorer)),
    };
    let status = failure_status(&ended.cause, &ended.message);
    crate::log::Event::ModelCall {
        model: name.to_owned(),
        step,
        request_digest,
        sampling,
        response: Value::Null,
        usage: Usage::default(),
        latency_ms: waited.as_secs_f64() * 1e3,
        attempts: 1,
        cache_hit: false,
        cost_usd: None,
        error: Some(ended.message),
        cause: Some(ended.cause),
        url: None,
        request: None,
        raw_response: None,
        scorer,
        actor,
        status: Some(status.to_owned()),
        attempt: ended.attempt,
        retried: ended.retried,
    }
}

/// A model call under way: each attempt that fails before a retry leaves its own
/// `model_call` event as it ends ([`CallUnderWay::watching`]), and the call dropped before
/// it lands (a program exited, the episode's time ran out, the run was stopped with
/// Ctrl-C) leaves a `cancelled` one.
pub struct CallUnderWay<'a> {
    recorder: &'a crate::log::Recorder,
    name: &'a str,
    step: u32,
    caller: Option<Caller>,
    /// The request's digest and sampling, until the call lands.
    asked: Option<(String, Map<String, Value>)>,
    /// When the call's current attempt began: its start, or the end of the last retried one.
    since: std::sync::Mutex<std::time::Instant>,
    /// How many attempts failed before a retry.
    retried: std::sync::atomic::AtomicU32,
}

impl<'a> CallUnderWay<'a> {
    pub fn new(
        model: &dyn LanguageModel,
        name: &'a str,
        request: &ModelRequest<'_>,
        (step, caller): (u32, Caller),
        recorder: &'a crate::log::Recorder,
    ) -> Self {
        let sampling = model.sampling();
        let digest = request_digest(model, &sampling, request);
        CallUnderWay {
            recorder,
            name,
            step,
            caller: Some(caller),
            asked: Some((digest, sampling)),
            since: std::sync::Mutex::new(std::time::Instant::now()),
            retried: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// `request`, its retried attempts told to this call's log as they end.
    pub fn watching<'r>(&'r self, request: &ModelRequest<'r>) -> ModelRequest<'r> {
        ModelRequest { watch: Some(self), ..*request }
    }

    /// The call came back (answered or not) with `event`: after retried attempts, the
    /// event is its last attempt's, numbered and timed as such.
    pub fn landed(&mut self, event: &mut crate::log::Event) {
        self.asked = None;
        let retried = *self.retried.get_mut();
        if let (crate::log::Event::ModelCall { attempt, latency_ms, .. }, true) = (event, retried > 0) {
            *attempt = Some(retried + 1);
            *latency_ms = self.since().elapsed().as_secs_f64() * 1e3;
        }
    }

    fn since(&self) -> std::time::Instant {
        *self.since.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The number of the attempt under way, when an earlier one was retried.
    fn attempt_under_way(&self) -> Option<u32> {
        let retried = self.retried.load(std::sync::atomic::Ordering::SeqCst);
        (retried > 0).then_some(retried + 1)
    }
}

impl AttemptWatch for CallUnderWay<'_> {
    fn retried(&self, failed: &FailedAttempt) {
        let (Some(asked), Some(caller)) = (&self.asked, &self.caller) else { return };
        let ended = Unanswered {
            cause: failed.cause.clone(),
            message: failed.message.clone(),
            attempt: Some(failed.attempt),
            retried: true,
        };
        self.recorder.emit(&unanswered_call(self.name, self.step, asked.clone(), failed.wall, caller.clone(), ended));
        self.retried.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        *self.since.lock().unwrap_or_else(|p| p.into_inner()) = std::time::Instant::now();
    }
}

impl Drop for CallUnderWay<'_> {
    fn drop(&mut self) {
        if let (Some(asked), Some(caller)) = (self.asked.take(), self.caller.take()) {
            let ended = Unanswered {
                cause: UnscoredCause::Other(CANCELLED.to_owned()),
                message: CANCELLED_MESSAGE.to_owned(),
                attempt: self.attempt_under_way(),
                retried: false,
            };
            let event = unanswered_call(self.name, self.step, asked, self.since().elapsed(), caller, ended);
            self.recorder.emit(&event);
        }
    }
}

/// What a call the episode's end cut short says.
pub const CANCELLED_MESSAGE: &str = "cancelled: the episode ended while the model was answering";

/// The status (and the cause) of a model call the episode's end cut short.
pub const CANCELLED: &str = "cancelled";

/// The digest of `request` as `model` would send it, without copying the transcript: the
/// same bytes as [`CanonicalRequest`] serialises to, written piece by piece into a buffer the
/// thread keeps. Every model call of a run is keyed, and its tools are most often the ones
/// the thread's previous call offered: their bytes are kept and compared instead of
/// serialised again (their JSON schemas are most of a short request).
pub fn request_digest(model: &dyn LanguageModel, sampling: &Map<String, Value>, request: &ModelRequest<'_>) -> String {
    use std::cell::RefCell;
    thread_local! {
        static SCRATCH: RefCell<(Vec<u8>, OfferedTools)> = RefCell::default();
    }
    SCRATCH.with(|scratch| {
        let Ok(mut scratch) = scratch.try_borrow_mut() else {
            // Only a digest taken while this thread takes one (never) would get here.
            let bytes = offered_bytes(model, sampling, request, &mut Vec::new(), &mut OfferedTools::default()).to_vec();
            return normalised_digest(&bytes, request.run_own);
        };
        let (bytes, tools) = &mut *scratch;
        bytes.clear();
        let digest = normalised_digest(offered_bytes(model, sampling, request, bytes, tools), request.run_own);
        // A long transcript's buffer is not kept for the short ones after it.
        if bytes.capacity() > KEPT_SCRATCH_BYTES {
            *bytes = Vec::new();
        }
        digest
    })
}

/// The digest of a request's JSON with the run's own values as placeholders.
fn normalised_digest(bytes: &[u8], run_own: &RunOwn) -> String {
    if run_own.is_empty() {
        return hex_digest(bytes);
    }
    hex_digest(run_own.keyed(&String::from_utf8_lossy(bytes)).as_bytes())
}

/// The most a thread keeps of its buffer for digests between calls.
const KEPT_SCRATCH_BYTES: usize = 256 * 1024;

/// The JSON of [`CanonicalRequest`] for `request` (a struct's fields in order, compact):
/// `{"model":…,"sampling":…,"messages":[…],"tools":[…]}` (and `"directives":{…}` when
/// any is set), into `out`.
fn offered_bytes<'o>(
    model: &dyn LanguageModel,
    sampling: &Map<String, Value>,
    request: &ModelRequest<'_>,
    out: &'o mut Vec<u8>,
    tools: &mut OfferedTools,
) -> &'o [u8] {
    // Writing JSON into a Vec fails only on a map key that is not a string: none here.
    out.extend_from_slice(b"{\"model\":");
    let _ = serde_json::to_writer(&mut *out, model.name());
    out.extend_from_slice(b",\"sampling\":");
    let _ = serde_json::to_writer(&mut *out, sampling);
    out.extend_from_slice(b",\"messages\":");
    let _ = serde_json::to_writer(&mut *out, request.messages);
    out.extend_from_slice(b",\"tools\":");
    out.extend_from_slice(tools.bytes_of(request.tools));
    // Absent when nothing is asked, so that requests without any keep their digests.
    if !request.directives.is_none() {
        out.extend_from_slice(b",\"directives\":");
        let _ = serde_json::to_writer(&mut *out, request.directives);
    }
    out.push(b'}');
    out
}

/// The tools of a thread's last request and their JSON as offered to a provider (without
/// annotations, as [`ToolSpec::as_offered`]).
#[derive(Default)]
struct OfferedTools {
    tools: Vec<(String, String, Value)>,
    bytes: Vec<u8>,
}

impl OfferedTools {
    fn bytes_of(&mut self, tools: &[ToolSpec]) -> &[u8] {
        // Nothing kept yet is no match, even for no tools (their bytes are `[]`).
        let same = !self.bytes.is_empty()
            && self.tools.len() == tools.len()
            && self.tools.iter().zip(tools).all(|((name, description, parameters), t)| {
                *name == t.name && *description == t.description && *parameters == t.parameters
            });
        if !same {
            #[derive(Serialize)]
            struct OfferedTool<'a> {
                name: &'a str,
                description: &'a str,
                parameters: &'a Value,
            }
            let offered: Vec<OfferedTool<'_>> = tools
                .iter()
                .map(|t| OfferedTool { name: &t.name, description: &t.description, parameters: &t.parameters })
                .collect();
            self.bytes.clear();
            let _ = serde_json::to_writer(&mut self.bytes, &offered);
            self.tools = tools.iter().map(|t| (t.name.clone(), t.description.clone(), t.parameters.clone())).collect();
        }
        &self.bytes
    }
}

/// The SHA-256 of `bytes` in lowercase hex.
fn hex_digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A caller's endpoint, as `runner serve` is given it with a request.
#[derive(Debug, Clone)]
pub struct CallerEndpoint {
    /// `http://host:port/v1`.
    pub base_url: String,
    pub api_key: Option<String>,
    pub sampling: Map<String, Value>,
    /// Retries after the first attempt, for 429, 5xx, timeouts and broken connections.
    pub max_retries: u32,
}

/// What wraps every backend of a run.
#[derive(Default, Clone)]
pub struct BackendOptions {
    pub record: Option<Arc<CassetteWriter>>,
    pub cache: Option<Arc<CacheOptions>>,
    /// `mock` only: milliseconds each call waits (low, high).
    pub mock_delay_ms: Option<(u64, u64)>,
}

enum Source {
    Mock,
    Echo,
    Http(Arc<http::HttpModel>),
    /// An HTTP endpoint of a promptfoo config's `http` provider.
    Endpoint(Arc<endpoint::EndpointModel>),
    Replay(Arc<Replay>),
    /// One model lent as it is to every episode (`runner serve`'s step sessions, whose
    /// policy is the caller).
    Lent(Arc<dyn LanguageModel>),
}

/// One model of a run (a `--model`, a grader, a simulated user's): opened once, lent to
/// each episode by role ([`Role`], `role.rs`).
pub struct Backend {
    name: String,
    source: Source,
    options: BackendOptions,
}

impl Backend {
    /// Opens `spec`: `mock`, `replay:PATH`, or `provider/model`.
    pub fn open(spec: &str, config: &ModelConfig, options: BackendOptions) -> Result<Self, String> {
        let (name, source) = if spec == "mock" {
            ("mock".to_owned(), Source::Mock)
        } else if spec == "echo" {
            ("echo".to_owned(), Source::Echo)
        } else if let Some(configured) = config.endpoints.get(spec) {
            (spec.to_owned(), Source::Endpoint(Arc::new(endpoint::EndpointModel::new(spec, configured.clone())?)))
        } else if let Some(path) = spec.strip_prefix("replay:") {
            let replay = Replay::open(std::path::Path::new(path))?;
            (replay.name().to_owned(), Source::Replay(Arc::new(replay)))
        } else if let Some((provider, model)) = spec.split_once('/').filter(|(p, m)| !p.is_empty() && !m.is_empty()) {
            let Some(p) = config.providers.get(provider) else {
                let known: Vec<&str> = config.providers.keys().map(String::as_str).collect();
                return Err(format!(
                    "unknown provider `{provider}` in `{spec}`: expected one of {}, or one added in runner.yaml",
                    known.join(", ")
                ));
            };
            let model = http::HttpModel::new(spec, model, p.clone(), config.prices.get(spec).copied())?;
            (spec.to_owned(), Source::Http(Arc::new(model)))
        } else {
            return Err(format!(
                "unknown model `{spec}`: expected `provider/model` (e.g. openai/gpt-4o-mini), `mock`, `echo`, or `replay:PATH`"
            ));
        };
        Ok(Backend { name, source, options })
    }

    /// A caller's OpenAI-compatible endpoint as a model (`runner serve`): `name` in logs and
    /// episode ids, `model` as the endpoint knows it, the caller's key and sampling.
    pub fn caller(
        name: &str,
        model: &str,
        endpoint: CallerEndpoint,
        config: &ModelConfig,
        options: BackendOptions,
    ) -> Result<Self, String> {
        let mut provider = config.providers.get("openai-compatible").cloned().ok_or("no openai-compatible provider")?;
        provider.base_url = Some(endpoint.base_url);
        provider.base_url_env = None;
        provider.key_env = None;
        provider.sampling = endpoint.sampling;
        provider.max_retries = endpoint.max_retries;
        // The caller bounds its own server's load (`-j`): runner adds no cap of its own.
        provider.max_concurrency = 1024;
        provider.retry_base_s = 0.5;
        let model = http::HttpModel::new(name, model, provider, None)?.for_caller(endpoint.api_key);
        Ok(Backend { name: name.to_owned(), source: Source::Http(Arc::new(model)), options })
    }

    /// One model lent as it is to every episode and role it is asked for, named `name`.
    pub fn lent(name: &str, model: Arc<dyn LanguageModel>, options: BackendOptions) -> Self {
        Backend { name: name.to_owned(), source: Source::Lent(model), options }
    }

    /// The model's name: a replay takes the name of the model it recorded, so that its
    /// episodes have the same ids as the recorded run's.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The sampling settings its provider adds to every request (none for `mock`, `echo`,
    /// replays and endpoints).
    pub fn provider_sampling(&self) -> Map<String, Value> {
        match &self.source {
            Source::Http(m) => m.sampling(),
            _ => Map::new(),
        }
    }

    /// Whether its calls have a cost: a provider's model with a price in the config, or
    /// `echo`, whose calls cost nothing (as promptfoo's). `mock` and replays have none.
    pub fn priced(&self) -> bool {
        matches!(&self.source, Source::Echo) || matches!(&self.source, Source::Http(m) if m.priced())
    }

    /// Why the run should stop early: the backend is misconfigured (every call refused).
    pub fn broken(&self) -> Option<String> {
        match &self.source {
            Source::Http(m) => m.broken(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A `model_call` event logs the response as it serialises, which must be what a
    /// cassette keeps of it (`recorded`): what is the call's own (attempts, price, cache,
    /// exchange) stays out.
    #[test]
    fn a_response_serialises_as_what_a_cassette_keeps() {
        let response = ModelResponse {
            text: Some("done".into()),
            tool_calls: vec![ProposedCall { id: Some("c1".into()), name: "f".into(), arguments: json!({"a": [1]}) }],
            usage: Usage { input_tokens: 3, output_tokens: 4, ..Usage::default() },
            finish_reason: Some("stop".into()),
            attempts: 3,
            cost_usd: Some(0.5),
            cache_hit: true,
            exchange: Some(Exchange { url: "u".into(), request: json!({"q": 1}), response: json!({"r": 2}) }),
        };
        let logged = serde_json::to_value(&response).unwrap();
        assert_eq!(logged, serde_json::to_value(response.recorded()).unwrap());
        assert_eq!(logged.as_object().unwrap().len(), 4, "{logged}");
    }

    #[test]
    fn the_borrowed_digest_equals_the_canonical_one() {
        let model = mock::MockModel::new(Vec::new().into());
        let messages = vec![Message::User { content: "hi".into() }];
        let tools = vec![ToolSpec::new("f", "does f", json!({"type": "object"}))];
        let request = ModelRequest::new(&messages, &tools);
        assert_eq!(request_digest(&model, &Map::new(), &request), digest(&canonical_request(&model, &request)));
    }

    /// Two episodes in different folders ask the same: one digest, equal to the canonical
    /// request's; what they ask of the answer makes another; a response keeps the folder as
    /// a placeholder and gets the replaying episode's back.
    #[test]
    fn the_runs_own_values_leave_the_digest_and_the_asks_enter_it() {
        let model = mock::MockModel::new(Vec::new().into());
        let digest_in = |folder: &str, directives: &Directives| {
            let messages = vec![Message::User { content: format!("cwd: {folder}/work, key rk-0123456789") }];
            let mut own = RunOwn::default();
            own.add(folder, "folder");
            own.add("rk-0123456789", "key");
            let request = ModelRequest {
                messages: &messages,
                tools: &[],
                deadline: None,
                directives,
                run_own: &own,
                watch: None,
            };
            let borrowed = request_digest(&model, &Map::new(), &request);
            assert_eq!(borrowed, digest(&canonical_request(&model, &request)));
            (borrowed, own)
        };
        let (first, own) = digest_in("/tmp/run-a/episodes/e1", &Directives::NONE);
        let (second, replaying) = digest_in("/srv/other/run-b/episodes/e1", &Directives::NONE);
        assert_eq!(first, second);
        let effort = Directives { reasoning_effort: Some("high".into()), ..Directives::default() };
        assert_ne!(digest_in("/tmp/run-a/episodes/e1", &effort).0, first);
        let unplaced_messages =
            [Message::User { content: "cwd: /tmp/run-a/episodes/e1/work, key rk-0123456789".into() }];
        let unplaced = ModelRequest::new(&unplaced_messages, &[]);
        assert_ne!(request_digest(&model, &Map::new(), &unplaced), first, "no values, no placeholders");
        let answer = ModelResponse {
            tool_calls: vec![ProposedCall {
                id: None,
                name: "Write".into(),
                arguments: json!({"file_path": "/tmp/run-a/episodes/e1/a.txt"}),
            }],
            ..ModelResponse::default()
        };
        let kept = own.normalised(&answer);
        assert_eq!(kept.tool_calls[0].arguments["file_path"], "<runner:folder>/a.txt");
        let replayed = replaying.restored(&kept);
        assert_eq!(replayed.tool_calls[0].arguments["file_path"], "/srv/other/run-b/episodes/e1/a.txt");
    }

    /// The tools' bytes are kept between calls: a change of any part of them (here only
    /// the schema) must change the digest as the canonical request does.
    #[test]
    fn the_digest_follows_the_tools_from_call_to_call() {
        let model = mock::MockModel::new(Vec::new().into());
        let messages = vec![Message::User { content: "hi \"there\"".into() }];
        let a = vec![ToolSpec::new("f", "does f", json!({"type": "object"}))];
        let b = vec![ToolSpec::new("f", "does f", json!({"type": "object", "required": ["x"]}))];
        let two = vec![a[0].clone(), ToolSpec::new("g", "does g", json!({}))];
        let mut seen = Vec::new();
        for tools in [&a, &b, &a, &two, &Vec::new(), &b] {
            let request = ModelRequest::new(&messages, tools);
            let borrowed = request_digest(&model, &Map::new(), &request);
            assert_eq!(borrowed, digest(&canonical_request(&model, &request)), "{tools:?}");
            seen.push(borrowed);
        }
        assert_eq!((seen[0] == seen[2], seen[1] == seen[5]), (true, true));
        assert_ne!(seen[0], seen[1], "the schema is part of the key");
        // Regression: a thread whose first request offered no tools keyed it without them.
        let first = std::thread::spawn(move || {
            let request = ModelRequest::new(&messages, &[]);
            (request_digest(&model, &Map::new(), &request), digest(&canonical_request(&model, &request)))
        });
        let (borrowed, canonical) = first.join().unwrap();
        assert_eq!(borrowed, canonical);
    }

    #[test]
    fn annotations_and_actors_never_reach_a_provider() {
        use crate::contract::{Actor, ToolAnnotations, ToolCall};
        let plain = vec![ToolSpec::new("f", "does f", json!({"type": "object"}))];
        let annotated = vec![plain[0].clone().annotated(ToolAnnotations::DESTRUCTIVE)];
        let transcript = |actor: Actor| {
            let call = ToolCall { actor, ..ToolCall::new("t1", "f", json!({"a": 1})) };
            vec![Message::User { content: "hi".into() }, Message::Assistant { content: None, tool_calls: vec![call] }]
        };
        let (main, subagent) = (transcript(Actor::Main), transcript(Actor::Subagent(vec![1])));
        let config = ModelConfig::default();
        for (provider, encode) in [
            ("openai", openai::encode as fn(&str, &ModelRequest<'_>, &config::Provider) -> Value),
            ("anthropic", anthropic::encode),
        ] {
            let provider = &config.providers[provider];
            let body =
                |messages: &[Message], tools: &[ToolSpec]| encode("m", &ModelRequest::new(messages, tools), provider);
            assert_eq!(body(&main, &plain), body(&subagent, &annotated), "{}", provider.name);
        }
    }

    #[test]
    fn annotations_are_no_part_of_the_request_key() {
        let model = mock::MockModel::new(Vec::new().into());
        let messages = vec![Message::User { content: "hi".into() }];
        let plain = vec![ToolSpec::new("f", "does f", json!({"type": "object"}))];
        let annotated = vec![plain[0].clone().annotated(crate::contract::ToolAnnotations::READ_ONLY)];
        let key = |tools: &[ToolSpec]| {
            let request = ModelRequest::new(&messages, tools);
            (request_digest(&model, &Map::new(), &request), digest(&canonical_request(&model, &request)))
        };
        let (borrowed, canonical) = key(&annotated);
        assert_eq!(borrowed, canonical);
        assert_eq!((borrowed, canonical), key(&plain));
    }
}
