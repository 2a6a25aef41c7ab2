//! The model gateway: for an episode whose agent is a program, an HTTP server on
//! 127.0.0.1 that speaks the wire APIs outside agents use — OpenAI Chat Completions
//! (`chat.rs`), OpenAI Responses (`responses.rs`) and Anthropic Messages (`messages.rs`),
//! streaming and not, plus `/v1/models` — and answers each request with the episode's
//! model. Every call is a `model_call` of the episode made by `respond_logged`, taken from
//! the episode's limits through its [`Ledger`]; cache, cassette and replay are the lent
//! model's. A request the gateway refuses (a wrong key, a limit reached, a shape it does not
//! speak) gets the provider's error shape and a `gateway_refused` event.
//!
//! Why a server per episode: the key, the limits, the log and the `mock:` script are the
//! episode's, so nothing needs routing, and the program cannot reach another episode.

mod chat;
mod connections;
mod messages;
mod responses;
mod shape;
mod trajectory;
mod wire;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Map, Value, json};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::contract::fit::fit_text;
use crate::contract::{Actor, ToolCall};
use crate::log::{Event, Recorder, Termination, Usage};
use crate::model::limiter::Deadline;
use crate::model::{
    CallUnderWay, Caller, LanguageModel, Message, ModelError, ModelRequest, ModelResponse, RunOwn, respond_logged,
};
pub use connections::Patience;
use connections::{Connection, Connections};
use shape::{Asked, Refusal};
use wire::Wire;

/// The episode's limits as the gateway spends them. The episode's budget implements it
/// (`agent/budget.rs`), so that a program's model calls are counted like the built-in agent's.
pub trait Ledger: Send + Sync {
    /// Takes the step of one model call: its number, or the limit that refuses it.
    fn admit(&self) -> Result<u32, Termination>;
    /// Counts what one call used.
    fn spend(&self, usage: Usage, cost_usd: Option<f64>);
    /// When the episode's time runs out: a backend stops waiting then.
    fn deadline(&self) -> &Deadline;
    /// Adds a tool call derived from the traffic to the episode's trajectory.
    fn dispatched(&self, call: &ToolCall);
}

/// What one episode's gateway answers with and reports to.
pub struct Gateway {
    /// The episode's model, as `Backend::lend` gives it (mock script, cache, cassette, replay).
    pub model: Arc<dyn LanguageModel>,
    /// Its name, as `model_call` events carry it.
    pub model_name: String,
    pub ledger: Arc<dyn Ledger>,
    pub recorder: Recorder,
    /// What in the requests is the run's own (the episode's folder): the gateway adds its
    /// address, its key and the day.
    pub run_own: RunOwn,
    /// Derive the trajectory from the traffic: the tool calls a response asks for become
    /// `action_dispatched` events, their results in a later request `observation`s. For a
    /// program that runs its own tools (`cli`); an `external` agent's tools are the world's.
    pub derive_trajectory: bool,
}

/// Why the episode ends, as the gateway saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum GatewayEnd {
    /// A request came past a limit (steps, tokens, cost, time): refused, and the episode
    /// ends as the built-in agent's would.
    Limit(Termination),
    /// The model failed behind the gateway (an outage after retries, a replay miss, a mock
    /// script run out): the episode is unscored with its cause, never the agent's failure.
    Fault(ModelError),
}

/// A running gateway. Dropping it stops the server.
pub struct GatewayHandle {
    addr: SocketAddr,
    key: String,
    state: Arc<State>,
    ended: watch::Receiver<Option<GatewayEnd>>,
    server: tokio::task::JoinHandle<()>,
}

struct State {
    key: String,
    gateway: Gateway,
    ending: watch::Sender<Option<GatewayEnd>>,
    closed: AtomicBool,
    /// Model calls go one at a time: a script's turns, and a transcript, have one order.
    turn: tokio::sync::Mutex<()>,
    /// The KiB of request bodies held at once ([`connections::BODY_KIB`]).
    bodies: tokio::sync::Semaphore,
    connections: Connections,
    patience: Patience,
    derived: Mutex<trajectory::Derived>,
    refusals: Mutex<Refusals>,
    /// The ignored fields and dropped tools logged so far: each is logged once.
    noted: Mutex<std::collections::BTreeSet<String>>,
    /// The episode's last Responses answers, for `previous_response_id`: the transcript
    /// each ended, by id, oldest first.
    kept: Mutex<std::collections::VecDeque<(String, Vec<Message>)>>,
}

/// How many Responses answers an episode's gateway keeps for `previous_response_id`.
const KEPT_RESPONSES: usize = 64;

/// How many refusals of one episode's gateway are logged one by one; later ones are
/// counted, so that requests nobody needs a key to send cannot fill the log.
const REFUSALS_LOGGED: u32 = 16;
/// What of a refused request's path, of its field at fault and of the refusal's message a
/// `gateway_refused` event keeps: the request chooses them (a path runs to 64 KiB).
const REFUSED_PATH_BYTES: usize = 256;
const REFUSED_FIELD_BYTES: usize = 256;
const REFUSED_MESSAGE_BYTES: usize = 1024;

/// The refusals not logged one by one, by status.
#[derive(Default)]
struct Refusals {
    logged: u32,
    counted: BTreeMap<u16, u64>,
}

impl Refusals {
    /// Whether a refusal of `status` is logged; if not, it is counted.
    fn logs(&mut self, status: u16) -> bool {
        if self.logged < REFUSALS_LOGGED {
            self.logged += 1;
            return true;
        }
        *self.counted.entry(status).or_default() += 1;
        false
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every change under these locks is one count: a panic cannot leave one half-done.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Gateway {
    /// Starts serving on a free port of 127.0.0.1 with a new random key.
    pub async fn start(self) -> std::io::Result<GatewayHandle> {
        self.start_with(Patience::default()).await
    }

    /// [`Gateway::start`], waiting for what clients send as `patience` says.
    pub async fn start_with(mut self, patience: Patience) -> std::io::Result<GatewayHandle> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let key = new_key()?;
        self.run_own.add(&addr.to_string(), "gateway");
        self.run_own.add(&format!("localhost:{}", addr.port()), "gateway");
        self.run_own.add(&key, "key");
        self.run_own.add(&chrono::Utc::now().format("%Y-%m-%d").to_string(), "date");
        let (ending, ended) = watch::channel(None);
        let state = Arc::new(State {
            key: key.clone(),
            gateway: self,
            ending,
            closed: AtomicBool::new(false),
            turn: tokio::sync::Mutex::new(()),
            bodies: tokio::sync::Semaphore::new(connections::BODY_KIB),
            connections: Connections::default(),
            patience,
            derived: Mutex::default(),
            refusals: Mutex::default(),
            noted: Mutex::default(),
            kept: Mutex::default(),
        });
        let server = tokio::spawn(connections::serve(listener, state.clone()));
        Ok(GatewayHandle { addr, key, state, ended, server })
    }
}

/// The bytes of randomness in a key: 256 bits, written as 64 hex digits after `rk-`.
const KEY_BYTES: usize = 32;

/// A new episode key from the kernel's random source. Not from a generator seeded in this
/// process (`fastrand` seeds from the clock and the thread): a program that can guess when
/// the gateway started must not be able to guess another episode's key.
fn new_key() -> std::io::Result<String> {
    let mut bytes = [0u8; KEY_BYTES];
    let mut filled = 0;
    while filled < bytes.len() {
        let rest = &mut bytes[filled..];
        // SAFETY: getrandom writes at most `rest.len()` bytes into `rest`.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n >= 0 {
            filled += n as usize;
            continue;
        }
        let error = std::io::Error::last_os_error();
        if error.kind() != std::io::ErrorKind::Interrupted {
            return Err(std::io::Error::new(error.kind(), format!("no random key: getrandom: {error}")));
        }
    }
    Ok(format!("rk-{}", hex::encode(bytes)))
}

impl GatewayHandle {
    /// The root, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The episode's key; every request must carry it.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// `OPENAI_BASE_URL`: the root with `/v1`, as the OpenAI SDKs expect it.
    pub fn openai_base_url(&self) -> String {
        format!("{}/v1", self.url())
    }

    /// `ANTHROPIC_BASE_URL`: the root; the Anthropic SDKs add `/v1/messages`.
    pub fn anthropic_base_url(&self) -> String {
        self.url()
    }

    /// The variables a program's SDK reads to reach the gateway.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("OPENAI_BASE_URL", self.openai_base_url()),
            ("OPENAI_API_KEY", self.key.clone()),
            ("ANTHROPIC_BASE_URL", self.anthropic_base_url()),
            ("ANTHROPIC_API_KEY", self.key.clone()),
            ("RUNNER_GATEWAY_URL", self.url()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// `context` (a task's template values) with `gateway`: `openai_base_url`,
    /// `anthropic_base_url`, `url` and `key`, for a command that takes its endpoint from its
    /// arguments (`{{ gateway.openai_base_url }}`).
    pub fn template_context(&self, mut context: Map<String, Value>) -> Map<String, Value> {
        let gateway = json!({
            "openai_base_url": self.openai_base_url(),
            "anthropic_base_url": self.anthropic_base_url(),
            "url": self.url(),
            "key": self.key,
        });
        context.insert("gateway".into(), gateway);
        context
    }

    /// Why the episode must end, once a request has said so.
    pub fn ending(&self) -> Option<GatewayEnd> {
        self.ended.borrow().clone()
    }

    /// Waits until a request says the episode must end.
    pub async fn ended(&self) -> GatewayEnd {
        let mut ended = self.ended.clone();
        let ending = ended.wait_for(Option::is_some).await.map(|ending| ending.clone());
        match ending {
            Ok(Some(ending)) => ending,
            // The sender lives in the state this handle holds: never dropped first.
            _ => std::future::pending().await,
        }
    }

    /// Ends the episode's key: every later request is refused (401) and logged.
    pub fn close(&self) {
        self.state.closed.store(true, Ordering::SeqCst);
    }
}

impl Drop for GatewayHandle {
    /// Stops the server and logs the refusals that were only counted.
    fn drop(&mut self) {
        self.server.abort();
        let by_status = std::mem::take(&mut lock(&self.state.refusals).counted);
        if !by_status.is_empty() {
            let count = by_status.values().sum();
            self.state.gateway.recorder.emit(&Event::GatewayRefusals { count, by_status });
        }
    }
}

/// One request on `connection`, answered.
async fn answer(state: &State, connection: &Connection, request: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = request.uri().path().trim_end_matches('/').to_owned();
    let wire = match path.as_str() {
        "/v1/chat/completions" | "/chat/completions" => Some(Wire::Chat),
        "/v1/responses" | "/responses" => Some(Wire::Responses),
        "/v1/messages" | "/messages" => Some(Wire::Messages),
        _ => None,
    };
    // An Anthropic client says so in its headers; its errors get Anthropic's shape.
    let anthropic = request.headers().contains_key("anthropic-version") || wire == Some(Wire::Messages);
    let errors = if anthropic { Wire::Messages } else { Wire::Chat };
    // A client's check that the endpoint is up (`HEAD /`): nothing to refuse or log.
    if path.is_empty() && matches!(*request.method(), Method::HEAD | Method::GET) {
        return json_response(StatusCode::OK, json!({"gateway": "runner"}));
    }
    if let Err(refusal) = authorise(state, &request) {
        return refuse(state, errors, &path, refusal);
    }
    connection.keyed(state).await;
    match (request.method(), wire) {
        (&Method::GET, None) if path == "/v1/models" || path == "/models" => {
            json_response(StatusCode::OK, models(&state.gateway.model_name, anthropic))
        }
        (&Method::POST, Some(wire)) => {
            let body = match connections::read_body(state, request.into_body()).await {
                Ok(body) => body,
                Err(refusal) => return refuse(state, wire, &path, refusal),
            };
            match call(state, wire, &path, &body.bytes).await {
                Ok(response) => response,
                Err(refusal) => refuse(state, wire, &path, refusal),
            }
        }
        _ => {
            let refusal = Refusal::new(
                StatusCode::NOT_FOUND,
                format!(
                    "the gateway serves POST /v1/chat/completions, /v1/responses, /v1/messages and GET /v1/models, not {} {path}",
                    request.method()
                ),
            );
            refuse(state, errors, &path, refusal)
        }
    }
}

/// Whether the episode is over for the gateway: its key closed, a request ended it, or its
/// time is up.
fn is_over(state: &State) -> bool {
    state.closed.load(Ordering::SeqCst)
        || state.ending.borrow().is_some()
        || tokio::time::Instant::now() >= state.gateway.ledger.deadline().at()
}

fn authorise(state: &State, request: &Request<Incoming>) -> Result<(), Refusal> {
    let headers = request.headers();
    let bearer =
        headers.get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    let api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    let given = bearer.or(api_key).map(str::trim);
    if state.closed.load(Ordering::SeqCst) {
        return Err(Refusal::unauthorised("the episode has ended: its gateway key no longer answers"));
    }
    match given {
        Some(key) if key == state.key => Ok(()),
        Some(_) => Err(Refusal::unauthorised("wrong API key: this gateway answers only its episode's key")),
        None => Err(Refusal::unauthorised(
            "no API key: send the episode's key as `Authorization: Bearer KEY` or `x-api-key: KEY`",
        )),
    }
}

/// A model call: decoded, admitted by the limits, asked, counted, answered in `wire`'s shape.
/// A shape the gateway does not speak ends the episode unscored (`gateway_unsupported`).
async fn call(state: &State, wire: Wire, path: &str, body: &[u8]) -> Result<Response<Full<Bytes>>, Refusal> {
    let body: Value = serde_json::from_slice(body)
        .map_err(|e| Refusal::bad_request(None, format!("the request body is not JSON: {e}")))?;
    let mut asked = wire.decode(&body).inspect_err(|refusal| {
        if let Some(gap) = refusal.gap() {
            state.ending.send_replace(Some(GatewayEnd::Fault(gap)));
        }
    })?;
    note(state, path, &asked);
    let gateway = &state.gateway;
    let _turn = state.turn.lock().await;
    // The episode may have ended while this request was read or waited its turn.
    if state.closed.load(Ordering::SeqCst) {
        return Err(Refusal::unauthorised("the episode has ended: its gateway key no longer answers"));
    }
    if let Some(ending) = state.ending.borrow().clone() {
        return Err(Refusal::ended(&ending));
    }
    continue_previous(state, &mut asked)?;
    let step = match gateway.ledger.admit() {
        Ok(step) => step,
        Err(termination) => {
            let ending = GatewayEnd::Limit(termination);
            let refusal = Refusal::ended(&ending);
            state.ending.send_replace(Some(ending));
            return Err(refusal);
        }
    };
    if gateway.derive_trajectory {
        trajectory::lock(&state.derived).observed(&asked.messages, step, &gateway.recorder);
    }
    let request = ModelRequest {
        messages: &asked.messages,
        tools: &asked.tools,
        deadline: Some(gateway.ledger.deadline()),
        directives: &asked.directives,
        run_own: &gateway.run_own,
        watch: None,
    };
    let caller = Caller::Actor(Actor::Main);
    let mut in_flight =
        CallUnderWay::new(gateway.model.as_ref(), &gateway.model_name, &request, (step, caller), &gateway.recorder);
    let watched = in_flight.watching(&request);
    let (result, mut event) =
        respond_logged(gateway.model.as_ref(), &gateway.model_name, &watched, step, Caller::Actor(Actor::Main)).await;
    in_flight.landed(&mut event);
    gateway.recorder.emit(&event);
    let mut response = match result {
        Ok(response) => response,
        Err(error) => {
            let refusal = Refusal::fault(&error);
            state.ending.send_replace(Some(GatewayEnd::Fault(error)));
            return Err(refusal);
        }
    };
    gateway.ledger.spend(response.usage, response.cost_usd);
    for (i, call) in response.tool_calls.iter_mut().enumerate() {
        if call.id.is_none() {
            call.id = Some(wire.call_id(step, i));
        }
    }
    if gateway.derive_trajectory {
        trajectory::lock(&state.derived).asked_for(&response.tool_calls, step, gateway);
    }
    if wire == Wire::Responses {
        keep(state, &asked, &response, step);
    }
    let reply = wire.encode(&asked, &response, step);
    let content_type = if asked.stream { "text/event-stream" } else { "application/json" };
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(http::header::CONTENT_TYPE, content_type)
        .header(http::header::CACHE_CONTROL, "no-cache")
        .body(Full::new(Bytes::from(reply)))
        .unwrap_or_default())
}

/// Logs the fields a request carried that the gateway let be, and the tools it dropped,
/// the first time each is seen in the episode.
fn note(state: &State, path: &str, asked: &Asked) {
    let mut noted = lock(&state.noted);
    let mut new = |items: &[String], prefix: &str| -> Vec<String> {
        items.iter().filter(|item| noted.insert(format!("{prefix}{item}"))).cloned().collect()
    };
    let fields = new(&asked.ignored, "field:");
    // A dropped tool is named by its kind, whatever its place in the list.
    let dropped_tools = new(&asked.dropped, "tool:");
    if fields.is_empty() && dropped_tools.is_empty() {
        return;
    }
    state.gateway.recorder.emit(&Event::GatewayIgnored {
        path: fit_text(path, REFUSED_PATH_BYTES).0,
        fields,
        dropped_tools,
    });
}

/// A Responses request that continues an earlier response of the episode: that response's
/// transcript goes before its input (after its own instructions).
fn continue_previous(state: &State, asked: &mut Asked) -> Result<(), Refusal> {
    let Some(previous) = asked.previous.as_deref() else { return Ok(()) };
    let kept = lock(&state.kept);
    let Some((_, earlier)) = kept.iter().find(|(id, _)| id == previous) else {
        return Err(Refusal::bad_request(
            Some("previous_response_id".into()),
            format!(
                "no response `{previous}` in this episode: the gateway keeps the episode's last {KEPT_RESPONSES} responses"
            ),
        ));
    };
    let at = usize::from(asked.instructed);
    asked.messages.splice(at..at, earlier.iter().cloned());
    shape::name_results(&mut asked.messages);
    Ok(())
}

/// Keeps a Responses answer's transcript (without its instructions) for a later
/// `previous_response_id`, whether or not the client asked to `store` it: the episode's
/// own, gone with it.
fn keep(state: &State, asked: &Asked, response: &ModelResponse, step: u32) {
    let mut transcript = asked.messages[usize::from(asked.instructed)..].to_vec();
    let calls = response
        .tool_calls
        .iter()
        .map(|c| ToolCall::new(c.id.clone().unwrap_or_default(), c.name.clone(), c.arguments.clone()))
        .collect();
    transcript.push(Message::Assistant { content: response.text.clone(), tool_calls: calls });
    let mut kept = lock(&state.kept);
    if kept.len() == KEPT_RESPONSES {
        kept.pop_front();
    }
    kept.push_back((responses::response_id(step), transcript));
}

/// A refusal, answered in the shape `wire`'s SDK reads, and logged (its parts cut) or
/// counted (see [`REFUSALS_LOGGED`]).
fn refuse(state: &State, wire: Wire, path: &str, refusal: Refusal) -> Response<Full<Bytes>> {
    if lock(&state.refusals).logs(refusal.status.as_u16()) {
        state.gateway.recorder.emit(&Event::GatewayRefused {
            status: refusal.status.as_u16(),
            path: fit_text(path, REFUSED_PATH_BYTES).0,
            field: refusal.field.as_deref().map(|field| fit_text(field, REFUSED_FIELD_BYTES).0),
            message: fit_text(&refusal.message, REFUSED_MESSAGE_BYTES).0,
        });
    }
    json_response(refusal.status, wire.error_body(&refusal))
}

fn json_response(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap_or_default()
}

/// `/v1/models`: the episode's one model, in the shape of the client that asks.
fn models(name: &str, anthropic: bool) -> Value {
    if anthropic {
        json!({"data": [{"type": "model", "id": name, "display_name": name, "created_at": "1970-01-01T00:00:00Z"}],
               "has_more": false, "first_id": name, "last_id": name})
    } else {
        json!({"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "runner"}]})
    }
}

#[cfg(test)]
mod tests;
