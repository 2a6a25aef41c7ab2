//! One connection's requests, each routed to what it asks: the key checked first, then one
//! `match` over method and path.

use std::convert::Infallible;
use std::sync::Arc;

use futures::StreamExt as _;
use http_body_util::StreamBody;
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Service;
use super::episodes::{self, Phase};
use super::http::{self, AnswerBody, ApiError, ok};

/// Serves one connection (HTTP/1.1, upgraded to a WebSocket at `/ws`).
pub async fn connection<S>(stream: S, service: Arc<Service>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let handler = hyper::service::service_fn(move |request| {
        let service = service.clone();
        async move { Ok::<_, Infallible>(answer(service, request).await) }
    });
    let io = hyper_util::rt::TokioIo::new(stream);
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(std::time::Duration::from_secs(30))
        .serve_connection(io, handler)
        .with_upgrades()
        .await;
}

async fn answer(service: Arc<Service>, request: Request<Incoming>) -> Response<AnswerBody> {
    let path = request.uri().path().trim_end_matches('/').to_owned();
    if path == "/health" || path == "/v1/health" {
        return ok(&json!({"status": "healthy"}));
    }
    if !http::authorized(&request, service.key.as_deref()) {
        let e = ApiError::new(
            StatusCode::UNAUTHORIZED,
            Some("authorization"),
            "this server needs its key: send `Authorization: Bearer KEY` (the contents of --key-file)",
        );
        return e.response();
    }
    route(service, request, &path).await.unwrap_or_else(|e| e.response())
}

async fn route(
    service: Arc<Service>,
    request: Request<Incoming>,
    path: &str,
) -> Result<Response<AnswerBody>, ApiError> {
    let parts: Vec<&str> = path.split('/').skip(1).collect();
    let method = request.method().clone();
    match (&method, parts.as_slice()) {
        (&Method::GET, ["metadata"]) => Ok(ok(&metadata(&service))),
        (&Method::GET, ["schema"]) => Ok(ok(&schema())),
        (&Method::GET, ["ws"]) => upgrade(service, request),
        (&Method::POST, ["reset"]) => {
            let body = http::read_json(request.into_body()).await?;
            let (session, mut first) = service.reset(&body).await?;
            first["session_id"] = json!(session.entry.admitted.episode_id);
            Ok(ok(&first))
        }
        (&Method::POST, ["step"]) => {
            let body = http::read_json(request.into_body()).await?;
            let session = service.session(body["session_id"].as_str())?;
            Ok(ok(&service.step(&session, body.get("action")).await?))
        }
        (&Method::GET, ["state"]) => {
            let session = service.session(http::query(&request, "session_id").as_deref())?;
            Ok(ok(&service.state(&session)))
        }
        (&Method::GET, ["v1", "tasks"]) => Ok(ok(&tasks(&service, http::query(&request, "split").as_deref()))),
        (&Method::GET, ["v1", "episodes"]) => {
            let open = super::lock(&service.registry).open();
            let open: Vec<Value> =
                open.into_iter().map(|(id, status)| json!({"episode_id": id, "status": status})).collect();
            Ok(ok(&json!({"episodes": open})))
        }
        (&Method::POST, ["v1", "episodes"]) => run_one(service, request).await,
        (&Method::GET, ["v1", "episodes", id]) => {
            let entry = entry(&service, id)?;
            Ok(ok(&episodes::status(&entry)))
        }
        (&Method::GET, ["v1", "episodes", id, "events"]) => events(&service, id),
        (&Method::DELETE, ["v1", "episodes", id]) => cancel(&service, id),
        (&Method::POST, ["v1", "episodes", id, "retry"]) => retry(service, id, request).await,
        (&Method::POST, ["v1", "batches"]) => batch(service, request).await,
        (_, ["metadata" | "schema" | "ws" | "reset" | "step" | "state"])
        | (_, ["v1", "tasks" | "episodes" | "batches", ..]) => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            Some("method"),
            format!("{method} is not served at {path}"),
        )),
        _ => Err(ApiError::not_found("path", format!("nothing is served at {path}"))),
    }
}

fn entry(service: &Service, id: &str) -> Result<Arc<episodes::Entry>, ApiError> {
    super::lock(&service.registry).get(id).ok_or_else(|| {
        ApiError::not_found(
            "episode_id",
            format!(
                "no episode {id} here (episodes that ended long ago are in {}/events.jsonl)",
                service.run_dir().display()
            ),
        )
    })
}

/// Cancels the episodes when dropped before it is disarmed: the client that waited for
/// them went away.
struct CancelOnDrop(Vec<CancellationToken>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        for stop in self.0.drain(..) {
            stop.cancel();
        }
    }
}

/// `POST /v1/episodes`: admitted at once or refused (429); answered when it ends, or at
/// once with `"wait": false`.
async fn run_one(service: Arc<Service>, request: Request<Incoming>) -> Result<Response<AnswerBody>, ApiError> {
    let body = http::read_json(request.into_body()).await?;
    let asked = episodes::read_request(&service, &body, "")?;
    let wait = body.get("wait").and_then(Value::as_bool).unwrap_or(true);
    let permit = service.bound.clone().try_acquire_owned().map_err(|_| ApiError::busy(service.jobs))?;
    let started = service.admit(asked, permit)?;
    if !wait {
        return Ok(http::json_response(StatusCode::ACCEPTED, &episodes::status(&started.entry)));
    }
    Ok(ok(&wait_for(&started.entry).await))
}

/// The episode's answer, once it ends; the episode is cancelled if the waiting is dropped.
async fn wait_for(entry: &episodes::Entry) -> Value {
    let mut guard = CancelOnDrop(vec![entry.stop.clone()]);
    let mut phase = entry.phase.subscribe();
    let answer = match phase.wait_for(|p| matches!(p, Phase::Ended(_))).await.map(|p| p.clone()) {
        Ok(Phase::Ended(answer)) => (*answer).clone(),
        _ => episodes::status(entry),
    };
    guard.0.clear();
    answer
}

fn cancel(service: &Service, id: &str) -> Result<Response<AnswerBody>, ApiError> {
    let entry = entry(service, id)?;
    if !matches!(*entry.phase.borrow(), Phase::Running) {
        return Err(ApiError::conflict("episode_id", format!("episode {id} is not running")));
    }
    entry.stop.cancel();
    let says = "cancelling: the episode ends as cancelled, its world torn down";
    Ok(http::json_response(StatusCode::ACCEPTED, &json!({"episode_id": id, "status": "cancelling", "says": says})))
}

/// `POST /v1/episodes/{id}/retry`: runs an interrupted or ended episode again under its id.
/// An endpoint's key, never kept, comes again in `{"model": {"api_key": …}}` or `{"api_key"}`.
async fn retry(service: Arc<Service>, id: &str, request: Request<Incoming>) -> Result<Response<AnswerBody>, ApiError> {
    let body = http::read_json(request.into_body()).await?;
    let entry = entry(&service, id)?;
    if matches!(*entry.phase.borrow(), Phase::Running) {
        return Err(ApiError::conflict(
            "episode_id",
            format!("episode {id} is running; DELETE it first to run it anew"),
        ));
    }
    if entry.admitted.policy == super::journal::Policy::Steps {
        return Err(ApiError::conflict("episode_id", "a stepped episode is the caller's to play: reset a new one"));
    }
    let api_key = body["model"]["api_key"].as_str().or(body["api_key"].as_str()).map(String::from);
    let permit = service.bound.clone().try_acquire_owned().map_err(|_| ApiError::busy(service.jobs))?;
    let started = service.readmit(entry.admitted.clone(), api_key, permit)?;
    let wait = body.get("wait").and_then(Value::as_bool).unwrap_or(true);
    if !wait {
        return Ok(http::json_response(StatusCode::ACCEPTED, &episodes::status(&started.entry)));
    }
    Ok(ok(&wait_for(&started.entry).await))
}

/// `GET /v1/episodes/{id}/events`: the episode's events as server-sent events, from its
/// first, until it ends.
fn events(service: &Service, id: &str) -> Result<Response<AnswerBody>, ApiError> {
    let entry = entry(service, id)?;
    let live = super::lock(&service.watch).get(id);
    let (sender, receiver) = mpsc::channel::<Bytes>(64);
    let frame = |v: &Value| Bytes::from(format!("event: {}\ndata: {v}\n\n", v["type"].as_str().unwrap_or("event")));
    match (live, &*entry.phase.borrow()) {
        (_, Phase::Ended(answer)) => {
            let all: Vec<Bytes> = answer["events"].as_array().into_iter().flatten().map(frame).collect();
            tokio::spawn(async move {
                for bytes in all {
                    if sender.send(bytes).await.is_err() {
                        return;
                    }
                }
            });
        }
        (Some(live), _) => {
            tokio::spawn(async move {
                let mut seen = 0;
                loop {
                    let (new, finished) = live.since(seen);
                    seen += new.len();
                    for event in &new {
                        if sender.send(frame(event)).await.is_err() {
                            return;
                        }
                    }
                    if finished {
                        return;
                    }
                    live.changed(seen).await;
                }
            });
        }
        (None, _) => return Err(ApiError::conflict("episode_id", format!("episode {id} is not running"))),
    }
    Ok(stream_response("text/event-stream", receiver))
}

fn stream_response(content_type: &'static str, receiver: mpsc::Receiver<Bytes>) -> Response<AnswerBody> {
    let stream = tokio_stream_of(receiver).map(|bytes| Ok::<_, Infallible>(Frame::data(bytes)));
    let mut response = Response::new(http_body_util::BodyExt::boxed(StreamBody::new(stream)));
    response.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(content_type));
    response.headers_mut().insert(hyper::header::CACHE_CONTROL, hyper::header::HeaderValue::from_static("no-cache"));
    response
}

fn tokio_stream_of(mut receiver: mpsc::Receiver<Bytes>) -> impl futures::Stream<Item = Bytes> + Send + 'static {
    futures::stream::poll_fn(move |cx| receiver.poll_recv(cx))
}

/// `POST /v1/batches {episodes: [request…]}`: every request checked first (an error names
/// `episodes[i].field`), then each run as a place within the bound comes free, and each
/// answer streamed as one JSON line as it ends. A client that goes away cancels the rest.
async fn batch(service: Arc<Service>, request: Request<Incoming>) -> Result<Response<AnswerBody>, ApiError> {
    let body = http::read_json(request.into_body()).await?;
    let Some(list) = body["episodes"].as_array().filter(|l| !l.is_empty()) else {
        return Err(ApiError::field("episodes", "`episodes` must be a non-empty list of episode requests"));
    };
    let asked = list
        .iter()
        .enumerate()
        .map(|(i, one)| episodes::read_request(&service, one, &format!("episodes[{i}].")))
        .collect::<Result<Vec<_>, _>>()?;
    let (sender, receiver) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        let mut guard = CancelOnDrop(Vec::new());
        let mut running = futures::stream::FuturesUnordered::new();
        for (i, one) in asked.into_iter().enumerate() {
            let Ok(permit) = service.bound.clone().acquire_owned().await else { return };
            let line = match service.admit(one, permit) {
                Err(e) => Some(json!({"index": i, "error": e.body()["error"]})),
                Ok(started) => {
                    let entry = started.entry;
                    guard.0.push(entry.stop.clone());
                    running.push(async move {
                        let mut phase = entry.phase.subscribe();
                        let _ = phase.wait_for(|p| matches!(p, Phase::Ended(_))).await;
                        let mut answer = episodes::status(&entry);
                        answer["index"] = json!(i);
                        answer
                    });
                    None
                }
            };
            if let Some(line) = line
                && sender.send(ndjson(&line)).await.is_err()
            {
                return;
            }
            // Answers that came meanwhile go out at once.
            while let Some(Some(answer)) = futures::FutureExt::now_or_never(running.next()) {
                if sender.send(ndjson(&answer)).await.is_err() {
                    return;
                }
            }
        }
        while let Some(answer) = running.next().await {
            if sender.send(ndjson(&answer)).await.is_err() {
                return;
            }
        }
        guard.0.clear();
    });
    Ok(stream_response("application/x-ndjson", receiver))
}

fn ndjson(value: &Value) -> Bytes {
    let mut bytes = serde_json::to_vec(value).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// The WebSocket handshake at `/ws`; the session runs once the connection is upgraded.
fn upgrade(service: Arc<Service>, mut request: Request<Incoming>) -> Result<Response<AnswerBody>, ApiError> {
    let headers = request.headers();
    let wants = headers
        .get(hyper::header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    let key = headers.get(hyper::header::SEC_WEBSOCKET_KEY).map(|k| k.as_bytes().to_vec());
    let (true, Some(key)) = (wants, key) else {
        return Err(ApiError::field("upgrade", "/ws is a WebSocket: connect with a WebSocket client"));
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(&key);
    let upgrading = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        if let Ok(upgraded) = upgrading.await {
            let io = hyper_util::rt::TokioIo::new(upgraded);
            let socket = tokio_tungstenite::WebSocketStream::from_raw_socket(
                io,
                tokio_tungstenite::tungstenite::protocol::Role::Server,
                None,
            )
            .await;
            super::ws::session(service, socket).await;
        }
    });
    let mut response = Response::new(http::full(Bytes::new()));
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = response.headers_mut();
    h.insert(hyper::header::UPGRADE, hyper::header::HeaderValue::from_static("websocket"));
    h.insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("Upgrade"));
    if let Ok(value) = hyper::header::HeaderValue::from_str(&accept) {
        h.insert(hyper::header::SEC_WEBSOCKET_ACCEPT, value);
    }
    Ok(response)
}

/// `GET /v1/tasks?split=`: the tasks served, of one split when asked.
fn tasks(service: &Service, split: Option<&str>) -> Value {
    let tasks: Vec<Value> = service
        .suites
        .iter()
        .flat_map(|s| s.tasks.iter().map(move |t| (s, t)))
        .filter(|(_, t)| split.is_none_or(|want| t.split.as_deref() == Some(want)))
        .map(|(s, t)| {
            json!({"suite": s.name, "task": t.id, "split": t.split, "input": t.input, "tags": t.tags,
                   "environment": s.environment.name})
        })
        .collect();
    json!({"tasks": tasks})
}

/// `GET /metadata`, as OpenEnv's clients read it.
fn metadata(service: &Service) -> Value {
    let names: Vec<&str> = service.suites.iter().map(|s| s.name.as_str()).collect();
    let description =
        service.suites.iter().map(|s| s.description.as_str()).filter(|d| !d.is_empty()).collect::<Vec<_>>();
    json!({
        "name": format!("runner:{}", names.join("+")),
        "description": if description.is_empty() { "runner environments".to_owned() } else { description.join(" ") },
        "version": env!("CARGO_PKG_VERSION"),
        "author": null,
        "documentation_url": null,
        "readme_content": null,
    })
}

/// `GET /schema`: the shapes of an action, an observation and the state.
fn schema() -> Value {
    let call = json!({"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "arguments": {"type": ["object", "string"]}, "call_id": {"type": "string"}}});
    json!({
        "action": {"type": "object", "title": "Action", "properties": {
            "tool_calls": {"type": "array", "items": call}, "text": {"type": "string"},
            "name": {"type": "string"}, "arguments": {"type": ["object", "string"]}}},
        "observation": {"type": "object", "title": "Observation", "properties": {
            "messages": {"type": "array", "items": {"type": "object"}},
            "tools": {"type": "array", "items": {"type": "object"}},
            "outcome": {"type": "object"}}},
        "state": {"type": "object", "title": "State", "properties": {
            "episode_id": {"type": ["string", "null"]}, "step_count": {"type": "integer"},
            "suite": {"type": "string"}, "task": {"type": "string"}, "epoch": {"type": "integer"}, "done": {"type": "boolean"}}},
    })
}
