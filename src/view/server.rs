//! The viewer's HTTP server (hyper 1, as the model gateway's): the page and its assets,
//! embedded in the binary, and the JSON API over the catalog's runs. Reading runs is
//! blocking work, done off the connections' tasks.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use super::api::{self, CompareQuery, EpisodeQuery};
use super::catalog::{Catalog, Missing};
use super::labels;

type Body = BoxBody<Bytes, Infallible>;

/// The page and its parts, served as they were built into the binary.
const ASSETS: [(&str, &str, &str); 5] = [
    ("/", "text/html; charset=utf-8", include_str!("assets/index.html")),
    ("/assets/view.js", "text/javascript; charset=utf-8", include_str!("assets/view.js")),
    ("/assets/view.css", "text/css; charset=utf-8", include_str!("assets/view.css")),
    ("/assets/page.css", "text/css; charset=utf-8", crate::report::html::PAGE_CSS),
    ("/assets/trajectory.js", "text/javascript; charset=utf-8", crate::report::html::TRAJECTORY_JS),
];

/// The largest request body read (a label).
const MAX_BODY: usize = 64 * 1024;

/// What every request shares.
pub struct Viewer {
    pub catalog: Catalog,
    /// The host names a request may name (`Host:`): the address it listens on, and
    /// `localhost` with its port. Another name is a page of another site reaching the
    /// viewer through DNS rebinding.
    /// `None` on an address that is not loopback.
    pub hosts: Option<Vec<String>>,
    /// Who labels by default: the user running the viewer.
    pub user: String,
    /// One label written at a time.
    pub writing: Mutex<()>,
}

/// Serves until the process ends.
pub async fn serve(listener: TcpListener, viewer: Arc<Viewer>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        let viewer = viewer.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let viewer = viewer.clone();
                async move { Ok::<_, Infallible>(answer(viewer, request).await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
        });
    }
}

async fn answer(viewer: Arc<Viewer>, request: Request<Incoming>) -> Response<Body> {
    let host = request.headers().get(hyper::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    if let Some(hosts) = &viewer.hosts
        && !hosts.iter().any(|h| h == host)
    {
        return error(StatusCode::FORBIDDEN, format!("unknown host {host:?}: open the address the viewer printed"));
    }
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let query = query(request.uri().query().unwrap_or_default());
    if method == Method::GET
        && let Some((_, kind, text)) =
            ASSETS.iter().copied().find(|(p, _, _)| *p == path || (*p == "/" && path == "/index.html"))
    {
        return respond(StatusCode::OK, kind, Bytes::from_static(text.as_bytes()));
    }
    let parts: Vec<String> = path.trim_start_matches('/').split('/').map(decode).collect();
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    if let (&Method::GET, ["api", "runs", key, "live"]) = (&method, parts.as_slice()) {
        return live(&viewer, key, &query).await;
    }
    let body = if method == Method::POST {
        // A page of another site cannot send JSON here without asking first (CORS), and
        // the viewer never says yes.
        let json = request
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .is_some_and(|t| t.as_bytes().starts_with(b"application/json"));
        if !json {
            return error(StatusCode::UNSUPPORTED_MEDIA_TYPE, "send the label as application/json");
        }
        match http_body_util::Limited::new(request.into_body(), MAX_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return error(StatusCode::PAYLOAD_TOO_LARGE, format!("failed to read the request: {e}")),
        }
    } else {
        Bytes::new()
    };
    let owned: Vec<String> = parts.iter().map(|s| s.to_string()).collect();
    let worker = viewer.clone();
    let result = tokio::task::spawn_blocking(move || {
        let parts: Vec<&str> = owned.iter().map(String::as_str).collect();
        route(&worker, &method, &parts, &query, &body)
    })
    .await;
    match result {
        Ok(Ok(value)) => respond(StatusCode::OK, "application/json", Bytes::from(value.to_string())),
        Ok(Err((status, message))) => error(status, message),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("the request failed: {e}")),
    }
}

type Answer = Result<Value, (StatusCode, String)>;

fn route(viewer: &Viewer, method: &Method, parts: &[&str], query: &HashMap<String, String>, body: &[u8]) -> Answer {
    let bad = |m: String| (StatusCode::BAD_REQUEST, m);
    let load = |key: &str| {
        viewer.catalog.load(key).map_err(|m| match m {
            Missing::Run => (StatusCode::NOT_FOUND, format!("no run {key:?}")),
            Missing::Unreadable(e) => (StatusCode::INTERNAL_SERVER_ERROR, e),
        })
    };
    let labels_of =
        |l: &super::catalog::Loaded| labels::read(&l.dir).map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e));
    match (method, parts) {
        (&Method::GET, ["api", "runs"]) => {
            let mut runs = Vec::new();
            for (key, _) in viewer.catalog.runs() {
                match viewer.catalog.load(&key) {
                    Ok(l) => runs.push(api::run_item(&l)),
                    Err(Missing::Unreadable(e)) => runs.push(json!({"key": key, "error": e})),
                    Err(Missing::Run) => {}
                }
            }
            // Newest first; RFC 3339 times of one writer sort as text.
            runs.sort_by(|a, b| b["started"].as_str().cmp(&a["started"].as_str()));
            Ok(json!({"runs": runs, "user": viewer.user}))
        }
        (&Method::GET, ["api", "runs", key]) => {
            let l = load(key)?;
            let mut head = api::run_head(&l, &labels_of(&l)?).map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e))?;
            head["user"] = json!(viewer.user);
            Ok(head)
        }
        (&Method::GET, ["api", "runs", key, "episodes"]) => {
            let l = load(key)?;
            let q = EpisodeQuery::from_pairs(query).map_err(bad)?;
            Ok(api::episodes(&l, &q, &labels_of(&l)?))
        }
        (&Method::GET, ["api", "runs", key, "episodes", id]) => {
            let l = load(key)?;
            api::episode(&l, id, &labels_of(&l)?).map_err(|e| (StatusCode::NOT_FOUND, e))
        }
        (&Method::GET, ["api", "runs", key, "labels"]) => Ok(json!({"labels": labels_of(&*load(key)?)?})),
        (&Method::POST, ["api", "runs", key, "labels"]) => {
            let l = load(key)?;
            let new: labels::NewLabel = serde_json::from_slice(body).map_err(|e| bad(format!("not a label: {e}")))?;
            if !l.starts().map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e))?.contains_key(&new.episode_id) {
                return Err((StatusCode::NOT_FOUND, format!("no episode {} in run {key}", new.episode_id)));
            }
            let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
            let line = labels::line(&new, &now).map_err(bad)?;
            let _one = viewer.writing.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            labels::append(&l.dir, &line).map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e))?;
            Ok(line)
        }
        (&Method::GET, ["api", "compare"]) => {
            let keys: Vec<&str> =
                query.get("runs").map(|r| r.split(',').filter(|k| !k.is_empty()).collect()).unwrap_or_default();
            if keys.is_empty() {
                return Err(bad("`runs`: name the runs to compare, the baseline first (runs=A,B)".into()));
            }
            let runs = keys.iter().map(|k| load(k)).collect::<Result<Vec<_>, _>>()?;
            let q = CompareQuery::from_pairs(query).map_err(bad)?;
            Ok(api::compare(&runs, &q))
        }
        (&Method::GET, ["api", "align"]) => {
            let get = |k: &str| query.get(k).map(String::as_str).ok_or_else(|| bad(format!("`{k}`: missing")));
            let (a, b) = (load(get("a")?)?, load(get("b")?)?);
            api::align(&a, get("ea")?, &b, get("eb")?).map_err(|e| (StatusCode::NOT_FOUND, e))
        }
        _ => Err((StatusCode::NOT_FOUND, format!("no such page: /{}", parts.join("/")))),
    }
}

/// The live events of run `key` from `from` (the byte its page's copy ended at).
async fn live(viewer: &Viewer, key: &str, query: &HashMap<String, String>) -> Response<Body> {
    let Some((_, dir)) = viewer.catalog.runs().into_iter().find(|(k, _)| k == key) else {
        return error(StatusCode::NOT_FOUND, format!("no run {key:?}"));
    };
    let from = query.get("from").and_then(|f| f.parse().ok()).unwrap_or(0);
    let stream = super::live::events(dir.join("events.jsonl"), from);
    let mut response = Response::new(StreamBody::new(stream).boxed());
    let headers = response.headers_mut();
    headers.insert(hyper::header::CONTENT_TYPE, http::HeaderValue::from_static("text/event-stream"));
    headers.insert(hyper::header::CACHE_CONTROL, http::HeaderValue::from_static("no-store"));
    response
}

fn respond(status: StatusCode, kind: &str, body: Bytes) -> Response<Body> {
    let mut response = Response::new(Full::new(body).boxed());
    *response.status_mut() = status;
    let headers = response.headers_mut();
    if let Ok(kind) = http::HeaderValue::from_str(kind) {
        headers.insert(hyper::header::CONTENT_TYPE, kind);
    }
    headers.insert(hyper::header::CACHE_CONTROL, http::HeaderValue::from_static("no-store"));
    // Nothing but the viewer's own parts, and no network beyond it.
    headers.insert(
        hyper::header::CONTENT_SECURITY_POLICY,
        http::HeaderValue::from_static("default-src 'self'; img-src data:; style-src 'self' 'unsafe-inline'"),
    );
    response
}

fn error(status: StatusCode, message: impl Into<String>) -> Response<Body> {
    respond(status, "application/json", Bytes::from(json!({"error": message.into()}).to_string()))
}

/// A query string's pairs, decoded.
fn query(text: &str) -> HashMap<String, String> {
    text.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(&k.replace('+', " ")), decode(&v.replace('+', " ")))
        })
        .collect()
}

/// Percent-decoding; a malformed escape is kept as it is.
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = text.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_and_paths_are_decoded() {
        let q = query("runs=a%2Cb,c&q=two+words&bad=%zz");
        assert_eq!(q["runs"], "a,b,c");
        assert_eq!(q["q"], "two words");
        assert_eq!(q["bad"], "%zz");
        assert_eq!(decode("caf%C3%A9"), "café");
    }
}
