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
    CanonicalRequest {
        model: model.name().to_owned(),
        sampling: model.sampling(),
        messages: request.messages.to_vec(),
        tools: request.tools.iter().map(ToolSpec::as_offered).collect(),
    }
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
    };
    (result, event)
}

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
            return hex_digest(offered_bytes(model, sampling, request, &mut Vec::new(), &mut OfferedTools::default()));
        };
        let (bytes, tools) = &mut *scratch;
        bytes.clear();
        let digest = hex_digest(offered_bytes(model, sampling, request, bytes, tools));
        // A long transcript's buffer is not kept for the short ones after it.
        if bytes.capacity() > KEPT_SCRATCH_BYTES {
            *bytes = Vec::new();
        }
        digest
    })
}

/// The most a thread keeps of its buffer for digests between calls.
const KEPT_SCRATCH_BYTES: usize = 256 * 1024;

/// The JSON of [`CanonicalRequest`] for `request` (a struct's fields in order, compact):
/// `{"model":…,"sampling":…,"messages":[…],"tools":[…]}`, into `out`.
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
        let request = ModelRequest { messages: &messages, tools: &tools, deadline: None };
        assert_eq!(request_digest(&model, &Map::new(), &request), digest(&canonical_request(&model, &request)));
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
            let request = ModelRequest { messages: &messages, tools, deadline: None };
            let borrowed = request_digest(&model, &Map::new(), &request);
            assert_eq!(borrowed, digest(&canonical_request(&model, &request)), "{tools:?}");
            seen.push(borrowed);
        }
        assert_eq!((seen[0] == seen[2], seen[1] == seen[5]), (true, true));
        assert_ne!(seen[0], seen[1], "the schema is part of the key");
        // Regression: a thread whose first request offered no tools keyed it without them.
        let first = std::thread::spawn(move || {
            let request = ModelRequest { messages: &messages, tools: &[], deadline: None };
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
            let body = |messages: &[Message], tools: &[ToolSpec]| {
                encode("m", &ModelRequest { messages, tools, deadline: None }, provider)
            };
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
            let request = ModelRequest { messages: &messages, tools, deadline: None };
            (request_digest(&model, &Map::new(), &request), digest(&canonical_request(&model, &request)))
        };
        let (borrowed, canonical) = key(&annotated);
        assert_eq!(borrowed, canonical);
        assert_eq!((borrowed, canonical), key(&plain));
    }
}
