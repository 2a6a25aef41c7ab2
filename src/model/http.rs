//! The HTTP backends: one client per model, requests encoded in the provider's wire format,
//! faults retried and attributed. 429s, 5xx, timeouts and broken connections are retried
//! with exponential backoff and jitter (honouring `Retry-After`), then end the episode
//! unscored (`rate_limited` or `provider_error`); 429s, 503s and timeouts also lower the
//! model's requests in flight. 400/401/403/404, and a 5xx that says our request did not
//! parse, are configuration errors: not retried, and when no call of a model has ever
//! succeeded the run stops early. So does a refused connection before any call succeeded:
//! nothing listens there (a wrong port, a server not started), and retrying would only
//! delay saying so.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Map, Value};

use super::config::{Api, Price, Provider};
use super::limiter::{Deadline, Limiter};
use super::{Exchange, FailedAttempt, LanguageModel, ModelError, ModelRequest, ModelResponse, anthropic, openai};
use crate::log::UnscoredCause;

pub struct HttpModel {
    /// `openai/gpt-4o-mini`: the name in logs and episode ids.
    name: String,
    /// `gpt-4o-mini`: the name the provider knows.
    model: String,
    provider: Provider,
    url: String,
    /// Secret: sent in a header, never logged, scrubbed from error messages.
    key: Option<String>,
    client: reqwest::Client,
    limiter: Limiter,
    price: Option<Price>,
    successes: AtomicU64,
    config_failures: AtomicU64,
    auth_failures: AtomicU64,
    last_config_error: Mutex<Option<String>>,
    /// A caller's own endpoint (`runner serve`): a refused connection is an outage of the
    /// caller's, never a misconfiguration that stops anything.
    callers: bool,
}

/// One attempt that did not produce an answer.
struct Failure {
    cause: UnscoredCause,
    /// 401, 403, 404: the key or the model is wrong for every call.
    auth: bool,
    message: String,
    retryable: bool,
    retry_after: Option<Duration>,
    response: Option<Value>,
}

impl Failure {
    fn transient(cause: UnscoredCause, message: String) -> Self {
        Failure { cause, auth: false, message, retryable: true, retry_after: None, response: None }
    }
}

impl HttpModel {
    pub fn new(name: &str, model: &str, provider: Provider, price: Option<Price>) -> Result<Self, String> {
        let base = provider.resolve_base_url()?;
        let key = provider.resolve_key()?;
        let url = match provider.api {
            Api::Openai => openai::endpoint(&base),
            Api::Anthropic => anthropic::endpoint(&base),
        };
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs_f64(provider.timeout_s.clamp(0.001, 30.0)))
            .pool_max_idle_per_host(provider.max_concurrency)
            .build()
            .map_err(|e| format!("failed to build an HTTP client: {e}"))?;
        Ok(HttpModel {
            name: name.to_owned(),
            model: model.to_owned(),
            limiter: Limiter::new(provider.max_concurrency),
            provider,
            url,
            key,
            client,
            price,
            successes: AtomicU64::new(0),
            config_failures: AtomicU64::new(0),
            auth_failures: AtomicU64::new(0),
            last_config_error: Mutex::new(None),
            callers: false,
        })
    }

    /// A caller's endpoint, asked with the caller's key (kept from every log): a refused
    /// connection is an outage (`provider_error`), whether or not a call has succeeded.
    pub fn for_caller(mut self, key: Option<String>) -> Self {
        if let Some(key) = &key {
            crate::log::secrets::register(key);
        }
        self.key = key.filter(|k| !k.trim().is_empty());
        self.callers = true;
        self
    }

    /// Whether the config gives the model a price.
    pub fn priced(&self) -> bool {
        self.price.is_some()
    }

    /// Why the run should stop: no call ever succeeded, and one was refused for its key or
    /// model (401, 403, 404), or three were refused as bad requests (400 and the like,
    /// which one long prompt can also cause).
    pub fn broken(&self) -> Option<String> {
        let refused =
            self.auth_failures.load(Ordering::Relaxed) > 0 || self.config_failures.load(Ordering::Relaxed) >= 3;
        if self.successes.load(Ordering::Relaxed) == 0 && refused {
            self.last_config_error.lock().unwrap_or_else(|p| p.into_inner()).clone()
        } else {
            None
        }
    }

    /// The request body, with `sampling` (the provider's, or an episode's over it) merged in.
    fn encode(&self, request: &ModelRequest<'_>, sampling: &Map<String, Value>) -> Value {
        let mut body = match self.provider.api {
            Api::Openai => openai::encode(&self.model, request, &self.provider),
            Api::Anthropic => anthropic::encode(&self.model, request, &self.provider),
        };
        if let Value::Object(fields) = &mut body {
            for (key, value) in sampling {
                fields.insert(key.clone(), value.clone());
            }
        }
        body
    }

    fn decode(&self, body: &Value) -> Result<ModelResponse, String> {
        match self.provider.api {
            Api::Openai => openai::decode(body),
            Api::Anthropic => anthropic::decode(body),
        }
    }

    /// Removes the key from text that came back from the provider.
    fn scrub(&self, text: &str) -> String {
        match &self.key {
            Some(key) if key.len() >= 4 => text.replace(key.as_str(), "[REDACTED]"),
            _ => text.to_owned(),
        }
    }

    /// Removes the key from every string of a body that is about to be logged.
    fn scrub_value(&self, value: Value) -> Value {
        match value {
            Value::String(s) => Value::String(self.scrub(&s)),
            Value::Array(items) => Value::Array(items.into_iter().map(|v| self.scrub_value(v)).collect()),
            Value::Object(map) => {
                Value::Object(map.into_iter().map(|(k, v)| (self.scrub(&k), self.scrub_value(v))).collect())
            }
            other => other,
        }
    }

    /// The endpoint as logs show it: without credentials in the URL.
    pub(crate) fn shown_url(&self) -> String {
        match reqwest::Url::parse(&self.url) {
            Ok(mut url) if !url.username().is_empty() || url.password().is_some() => {
                let _ = url.set_username("");
                let _ = url.set_password(None);
                url.to_string()
            }
            _ => self.url.clone(),
        }
    }

    /// One request and its answer: the response's body, or the failure it was.
    async fn attempt(&self, body: &Value, deadline: Option<&Deadline>) -> Result<Value, Failure> {
        // Waiting for a slot is runner's doing: the episode's clock stands meanwhile.
        let _slot = {
            let _paused = deadline.map(Deadline::pause);
            self.limiter.acquire().await
        };
        let deadline = deadline.map(Deadline::at);
        let (status, headers, bytes) = self.send(self.request(body), deadline).await?;
        let parsed: Result<Value, _> = serde_json::from_slice(&bytes);
        if status.is_success() {
            return parsed.map_err(|e| {
                let head = head_of(&self.scrub(&String::from_utf8_lossy(&bytes)), 200);
                Failure::transient(UnscoredCause::ProviderError, format!("the response is not JSON ({e}): {head:?}"))
            });
        }
        Err(self.refusal(status, &headers, parsed.ok(), &bytes))
    }

    /// The POST of `body`, with the authentication and headers the provider's API asks for.
    fn request(&self, body: &Value) -> reqwest::RequestBuilder {
        let mut request = self.client.post(&self.url).json(body);
        match (self.provider.api, &self.key) {
            (Api::Openai, Some(key)) => request = request.bearer_auth(key),
            (Api::Anthropic, key) => {
                request = request.header("anthropic-version", anthropic::VERSION);
                if let Some(key) = key {
                    request = request.header("x-api-key", key);
                }
            }
            (Api::Openai, None) => {}
        }
        request
    }

    /// Sends the request and reads its whole answer within the provider's timeout and
    /// what is left of the episode's time.
    async fn send(
        &self,
        request: reqwest::RequestBuilder,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<(StatusCode, HeaderMap, Vec<u8>), Failure> {
        let exchange = async {
            let response = request.send().await?;
            let status = response.status();
            let headers = response.headers().clone();
            let bytes = response.bytes().await?;
            Ok::<_, reqwest::Error>((status, headers, Vec::from(bytes)))
        };
        let timeout = Duration::from_secs_f64(self.provider.timeout_s);
        let left = deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
        match tokio::time::timeout(left.map_or(timeout, |l| l.min(timeout)), exchange).await {
            Err(_) => Err(self.timed_out(left.is_some_and(|l| l < timeout), timeout)),
            Ok(Err(e)) => Err(self.not_answered(&e)),
            Ok(Ok(parts)) => Ok(parts),
        }
    }

    /// The failure of a request that got no complete answer in time, `by_deadline` when
    /// the episode's time ran out before the provider's timeout.
    fn timed_out(&self, by_deadline: bool, timeout: Duration) -> Failure {
        // A model that has answered this run is slow, not down: the episode ran out of
        // time (scored, as when the time runs out between calls). One that never has
        // may be down: the provider's fault, unscored.
        if by_deadline && self.successes.load(Ordering::Relaxed) > 0 {
            let message = "the model had not finished its answer when the episode's time ran out (it answers, slowly: raise `limits.time_s`, or pass --time-s or --time-factor)".to_owned();
            return Failure { retryable: false, ..Failure::transient(UnscoredCause::ModelTooSlow, message) };
        }
        if by_deadline {
            let message = "no complete response before the episode's time ran out".to_owned();
            return Failure { retryable: false, ..Failure::transient(UnscoredCause::ProviderError, message) };
        }
        // A server that cannot answer in time is overloaded: send it less at once.
        self.limiter.overloaded();
        Failure::transient(
            UnscoredCause::ProviderError,
            format!("no complete response within {}s", timeout.as_secs_f64()),
        )
    }

    /// The failure of a request that could not be sent or whose answer broke off.
    fn not_answered(&self, e: &reqwest::Error) -> Failure {
        if is_refused(e) && self.successes.load(Ordering::Relaxed) == 0 && !self.callers {
            let message = format!(
                "{}: connection refused at {}: is the server running, and is the port right?",
                self.name,
                self.shown_url()
            );
            return Failure {
                auth: true,
                retryable: false,
                ..Failure::transient(UnscoredCause::ConfigurationError, self.scrub(&message))
            };
        }
        let what = if e.is_connect() {
            "could not connect"
        } else if e.is_body() || e.is_decode() {
            "the response broke off"
        } else {
            "the request failed"
        };
        Failure::transient(UnscoredCause::ProviderError, self.scrub(&format!("{what}: {}", error_chain(e))))
    }

    /// The failure an error status means, with the provider's own words: rate limited, the
    /// provider's fault (retried), or a request it will always refuse.
    fn refusal(&self, status: StatusCode, headers: &HeaderMap, response: Option<Value>, bytes: &[u8]) -> Failure {
        let detail = response
            .as_ref()
            .and_then(|v| match self.provider.api {
                Api::Openai => openai::error_message(v),
                Api::Anthropic => anthropic::error_message(v),
            })
            .unwrap_or_else(|| String::from_utf8_lossy(bytes).into_owned());
        // Scrubbed whole, then cut: a key cut in two would no longer be found.
        let detail = head_of(&self.scrub(&detail), 300);
        let retry_after = retry_after(headers, self.provider.retry_max_s);
        match status {
            StatusCode::TOO_MANY_REQUESTS => {
                self.limiter.overloaded();
                Failure {
                    retry_after,
                    response,
                    ..Failure::transient(UnscoredCause::RateLimited, format!("rate limited (429): {detail}"))
                }
            }
            // The same request would be refused again: ours is at fault, not the server.
            s if s.is_server_error() && refuses_our_request(&detail) => Failure {
                retryable: false,
                response,
                ..Failure::transient(UnscoredCause::ConfigurationError, self.explain(s, &detail))
            },
            s if s.is_server_error() || s == StatusCode::REQUEST_TIMEOUT || s.as_u16() == 529 => {
                // Overloaded, unavailable, or timed out behind a gateway: send less at once.
                if matches!(s.as_u16(), 408 | 503 | 504 | 529) {
                    self.limiter.overloaded();
                }
                Failure {
                    retry_after,
                    response,
                    ..Failure::transient(UnscoredCause::ProviderError, format!("the provider failed ({s}): {detail}"))
                }
            }
            s => Failure {
                auth: matches!(s.as_u16(), 401 | 403 | 404),
                retryable: false,
                response,
                ..Failure::transient(UnscoredCause::ConfigurationError, self.explain(s, &detail))
            },
        }
    }

    fn explain(&self, status: StatusCode, detail: &str) -> String {
        let key = self.provider.key_env.as_deref().unwrap_or("the provider's key variable");
        match status.as_u16() {
            401 => format!("{}: the API key was refused (401), check {key}: {detail}", self.name),
            403 => format!("{}: forbidden (403), the key may lack access to `{}`: {detail}", self.name, self.model),
            404 => format!(
                "{}: not found (404), check the model name `{}` and the endpoint {}: {detail}",
                self.name,
                self.model,
                self.shown_url()
            ),
            _ => format!("{}: the request was refused ({status}): {detail}", self.name),
        }
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let exp = self.provider.retry_base_s * 2f64.powi(attempt.saturating_sub(1).min(20) as i32);
        let capped = exp.min(self.provider.retry_max_s);
        // Equal jitter: at least half the delay, so concurrent retries spread without collapsing to 0.
        Duration::from_secs_f64(capped * (0.5 + fastrand::f64() * 0.5))
    }
}

#[async_trait]
impl LanguageModel for HttpModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn sampling(&self) -> Map<String, Value> {
        self.provider.sampling.clone()
    }

    fn endpoint(&self) -> Option<&str> {
        Some(&self.url)
    }

    async fn respond(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        self.respond_sampled(request, &self.provider.sampling).await
    }
}

/// A provider's model lent to one episode's agents with their own sampling settings (a
/// suite's or a variant's `agent.sampling`) over the provider's: sent in each request body,
/// and, through [`LanguageModel::sampling`], part of the cache key, the request digest and
/// the `model_call` event.
pub struct Sampled {
    model: Arc<HttpModel>,
    /// The provider's settings with the episode's over them.
    sampling: Map<String, Value>,
}

impl Sampled {
    pub fn new(model: Arc<HttpModel>, over: &Map<String, Value>) -> Self {
        let mut sampling = model.provider.sampling.clone();
        sampling.extend(over.iter().map(|(k, v)| (k.clone(), v.clone())));
        Sampled { model, sampling }
    }
}

#[async_trait]
impl LanguageModel for Sampled {
    fn name(&self) -> &str {
        &self.model.name
    }

    fn sampling(&self) -> Map<String, Value> {
        self.sampling.clone()
    }

    fn endpoint(&self) -> Option<&str> {
        Some(&self.model.url)
    }

    async fn respond(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        self.model.respond_sampled(request, &self.sampling).await
    }
}

impl HttpModel {
    /// Asks the model with `sampling` in the request body, retrying as the provider allows.
    async fn respond_sampled(
        &self,
        request: &ModelRequest<'_>,
        sampling: &Map<String, Value>,
    ) -> Result<ModelResponse, ModelError> {
        let body = self.encode(request, sampling);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let began = std::time::Instant::now();
            let failure = match self.attempt(&body, request.deadline).await {
                Ok(raw) => match self.decode(&raw) {
                    Ok(mut response) => {
                        self.limiter.succeeded();
                        self.successes.fetch_add(1, Ordering::Relaxed);
                        response.attempts = attempts;
                        response.cost_usd = self.price.map(|p| p.cost(&response.usage));
                        response.exchange = Some(Exchange {
                            url: self.shown_url(),
                            request: self.scrub_value(body),
                            response: self.scrub_value(raw),
                        });
                        return Ok(response);
                    }
                    Err(message) => Failure {
                        response: Some(raw),
                        ..Failure::transient(UnscoredCause::ProviderError, self.scrub(&message))
                    },
                },
                Err(failure) => failure,
            };
            if !failure.retryable || attempts > self.provider.max_retries {
                if failure.cause == UnscoredCause::ConfigurationError {
                    let counter = if failure.auth { &self.auth_failures } else { &self.config_failures };
                    counter.fetch_add(1, Ordering::Relaxed);
                    *self.last_config_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(failure.message.clone());
                }
                let message = if failure.retryable {
                    format!("{} (after {attempts} attempts)", failure.message)
                } else {
                    failure.message
                };
                let exchange = failure.response.map(|response| Exchange {
                    url: self.shown_url(),
                    request: self.scrub_value(body),
                    response: self.scrub_value(response),
                });
                return Err(ModelError { cause: failure.cause, message, attempts, exchange });
            }
            let wait = failure.retry_after.unwrap_or_else(|| self.backoff(attempts));
            if request.deadline.is_some_and(|d| tokio::time::Instant::now() + wait >= d.at()) {
                // The provider's fault stands: the time ran out while waiting on it.
                return Err(ModelError {
                    cause: failure.cause,
                    message: format!(
                        "{} (after {attempts} attempts; the episode's time ran out before the next)",
                        failure.message
                    ),
                    attempts,
                    exchange: None,
                });
            }
            if let Some(watch) = request.watch {
                let (cause, message) = (failure.cause.clone(), failure.message.clone());
                watch.retried(&FailedAttempt { attempt: attempts, cause, message, wall: began.elapsed() });
            }
            tokio::time::sleep(wait).await;
        }
    }
}

/// `retry-after-ms`, or `Retry-After` in seconds or as an HTTP date, capped at `max_s`.
fn retry_after(headers: &HeaderMap, max_s: f64) -> Option<Duration> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    let seconds = if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        ms / 1e3
    } else {
        let value = get("retry-after")?;
        match value.parse::<f64>() {
            Ok(seconds) => seconds,
            Err(_) => {
                let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
                (at.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_milliseconds() as f64 / 1e3
            }
        }
    };
    // A provider's header is not trusted with the range of a Duration.
    (!seconds.is_nan()).then(|| Duration::from_secs_f64(seconds.clamp(0.0, max_s)))
}

/// Whether a server error's message says the server could not parse our request (llama.cpp
/// answers `500 Failed to parse tool call arguments as JSON`): a deterministic refusal,
/// which retrying cannot cure.
fn refuses_our_request(detail: &str) -> bool {
    let detail = detail.to_ascii_lowercase();
    // A gateway that could not parse what the server behind it sent is an outage.
    let theirs = ["upstream", "response"].iter().any(|word| detail.contains(word));
    let unparsed =
        ["failed to parse", "could not parse", "cannot parse", "unable to parse", "parse error", "invalid json"]
            .iter()
            .any(|phrase| detail.contains(phrase));
    unparsed && !theirs
}

/// Whether nothing listened at the address: the OS refused the connection.
fn is_refused(e: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused) {
            return true;
        }
        source = s.source();
    }
    false
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The first `max` bytes of `text`, cut on a character boundary.
fn head_of(text: &str, max: usize) -> String {
    let cut = (0..=text.len().min(max)).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    text[..cut].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;
    use wiremock::matchers::method;
    use wiremock::{Mock, MockServer, ResponseTemplate};

    /// A model of a local server answering every request with `response`: four requests
    /// in flight at most, no retries.
    async fn local(response: ResponseTemplate, timeout_s: f64) -> (HttpModel, MockServer) {
        let server = MockServer::start().await;
        Mock::given(method("POST")).respond_with(response).mount(&server).await;
        let provider = Provider {
            name: "local".into(),
            api: Api::Openai,
            base_url: Some(format!("{}/v1", server.uri())),
            base_url_env: None,
            key_env: None,
            max_concurrency: 4,
            timeout_s,
            max_retries: 0,
            retry_base_s: 0.01,
            retry_max_s: 0.01,
            sampling: Map::new(),
            parallel_tool_calls: None,
            budget: Default::default(),
        };
        (HttpModel::new("local/tiny", "tiny", provider, None).unwrap(), server)
    }

    /// A model of a server answering every request with `response`, retrying up to four
    /// times, and the number of requests it got for one call.
    async fn attempts_for(response: ResponseTemplate) -> usize {
        let server = MockServer::start().await;
        Mock::given(method("POST")).respond_with(response).mount(&server).await;
        let (model, _unused) = local(ResponseTemplate::new(200), 5.0).await;
        let provider = Provider {
            base_url: Some(format!("{}/v1", server.uri())),
            max_retries: 4,
            retry_base_s: 0.001,
            retry_max_s: 0.001,
            ..model.provider
        };
        let model = HttpModel::new("local/tiny", "tiny", provider, None).unwrap();
        let messages = [super::super::Message::User { content: "hi".into() }];
        let request = ModelRequest::new(&messages, &[]);
        assert!(model.respond(&request).await.is_err());
        server.received_requests().await.unwrap().len()
    }

    #[tokio::test]
    async fn a_refusal_of_our_request_is_sent_once_and_an_outage_is_retried() {
        let bad_request = ResponseTemplate::new(400).set_body_json(serde_json::json!({"error": {"message": "bad"}}));
        assert_eq!(attempts_for(bad_request).await, 1, "a 400 is not retried");
        let unparsed = ResponseTemplate::new(500).set_body_json(
            serde_json::json!({"error": {"code": 500, "message": "Failed to parse tool call arguments as JSON"}}),
        );
        assert_eq!(attempts_for(unparsed).await, 1, "a 500 that says our request did not parse is not retried");
        assert_eq!(attempts_for(ResponseTemplate::new(500)).await, 5, "an outage is retried");
    }

    /// Four requests at once, each failing.
    async fn four_at_once(model: &HttpModel) {
        let messages = [super::super::Message::User { content: "hi".into() }];
        let request = ModelRequest::new(&messages, &[]);
        let results = futures::future::join_all((0..4).map(|_| model.respond(&request))).await;
        assert!(results.iter().all(Result::is_err), "{results:?}");
    }

    #[tokio::test]
    async fn timeouts_lower_the_requests_in_flight() {
        let slow = ResponseTemplate::new(200).set_delay(Duration::from_secs(5));
        let (model, _server) = local(slow, 0.2).await;
        four_at_once(&model).await;
        assert_eq!(model.limiter.limit(), 2, "four timeouts together halve the limit once");
    }

    #[tokio::test]
    async fn an_overloaded_server_lowers_the_requests_in_flight() {
        let (model, _server) = local(ResponseTemplate::new(503), 5.0).await;
        four_at_once(&model).await;
        assert_eq!(model.limiter.limit(), 2);
    }

    #[tokio::test]
    async fn a_server_error_that_is_not_overload_leaves_the_limit() {
        let (model, _server) = local(ResponseTemplate::new(500), 5.0).await;
        four_at_once(&model).await;
        assert_eq!(model.limiter.limit(), 4);
    }

    #[test]
    fn retry_after_reads_seconds_milliseconds_and_dates() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("2"));
        assert_eq!(retry_after(&h, 60.0), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", HeaderValue::from_static("150"));
        assert_eq!(retry_after(&h, 60.0), Some(Duration::from_millis(150)));
        let mut h = HeaderMap::new();
        let later = (chrono::Utc::now() + chrono::Duration::seconds(30)).to_rfc2822();
        h.insert("retry-after", HeaderValue::from_str(&later).unwrap());
        let wait = retry_after(&h, 60.0).unwrap();
        assert!(wait > Duration::from_secs(25) && wait <= Duration::from_secs(30), "{wait:?}");
        h.insert("retry-after", HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h, 60.0), None);
    }

    /// Regression: these panicked converting to a Duration.
    #[test]
    fn absurd_retry_after_values_are_capped_not_fatal() {
        for (name, value) in
            [("retry-after-ms", "inf"), ("retry-after", "1e20"), ("retry-after", "-5"), ("retry-after-ms", "NaN")]
        {
            let mut h = HeaderMap::new();
            h.insert(name, HeaderValue::from_static(value));
            let wait = retry_after(&h, 60.0);
            assert!(wait.is_none_or(|w| w <= Duration::from_secs(60)), "{name}: {value} gave {wait:?}");
        }
    }
}
