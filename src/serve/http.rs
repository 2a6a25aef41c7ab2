//! The HTTP side of the server: its one body type, JSON answers and errors that name the
//! field at fault, the key check, bodies read within a cap.

use std::convert::Infallible;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};

/// Every answer's body: whole, or streamed (a batch's results, server-sent events).
pub type AnswerBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// The largest request body the server reads.
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// A request refused: its status, the field at fault (a JSON path, or the header or path
/// part), and what was wrong, in words.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub field: Option<String>,
    pub message: String,
    /// Seconds to wait before asking again (429).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, field: Option<&str>, message: impl Into<String>) -> Self {
        ApiError { status, field: field.map(String::from), message: message.into(), retry_after: None }
    }

    /// 400: a field of the request is missing or wrong.
    pub fn field(field: &str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, Some(field), message)
    }

    pub fn not_found(field: &str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, Some(field), message)
    }

    pub fn conflict(field: &str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::CONFLICT, Some(field), message)
    }

    /// 429: as many episodes and sessions run as the server takes at once.
    pub fn busy(bound: usize) -> Self {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                None,
                format!(
                    "{bound} episode(s) and session(s) already run at once, as many as this server takes (-j); retry after the Retry-After seconds"
                ),
            )
        }
    }

    /// The error as JSON: `{"error": {"status", "field", "message"}}`.
    pub fn body(&self) -> Value {
        json!({"error": {"status": self.status.as_u16(), "field": self.field, "message": self.message}})
    }

    pub fn response(&self) -> Response<AnswerBody> {
        let mut response = json_response(self.status, &self.body());
        if let Some(s) = self.retry_after
            && let Ok(value) = hyper::header::HeaderValue::from_str(&s.to_string())
        {
            response.headers_mut().insert(hyper::header::RETRY_AFTER, value);
        }
        response
    }
}

pub fn full(bytes: impl Into<Bytes>) -> AnswerBody {
    Full::new(bytes.into()).boxed()
}

pub fn json_response(status: StatusCode, value: &Value) -> Response<AnswerBody> {
    let mut bytes = serde_json::to_vec(value).unwrap_or_default();
    bytes.push(b'\n');
    let mut response = Response::new(full(bytes));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    response
}

pub fn ok(value: &Value) -> Response<AnswerBody> {
    json_response(StatusCode::OK, value)
}

/// Whether the request carries the server's key: `Authorization: Bearer KEY`, or Basic
/// with the key as the password (what a WebSocket client sends for `ws://user:KEY@host`).
pub fn authorized<B>(request: &Request<B>, key: Option<&str>) -> bool {
    let Some(key) = key else { return true };
    let Some(header) = request.headers().get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let given = if let Some(token) = header.strip_prefix("Bearer ") {
        token.trim().to_owned()
    } else if let Some(basic) = header.strip_prefix("Basic ") {
        use base64::Engine as _;
        let decoded = base64::engine::general_purpose::STANDARD.decode(basic.trim()).unwrap_or_default();
        let text = String::from_utf8_lossy(&decoded).into_owned();
        text.split_once(':').map(|(_, password)| password.to_owned()).unwrap_or(text)
    } else {
        return false;
    };
    constant_time_eq(given.as_bytes(), key.as_bytes())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Reads a request's body as a JSON object (an empty body is `{}`); bad JSON names the
/// line and column.
pub async fn read_json(body: Incoming) -> Result<Value, ApiError> {
    let limited = http_body_util::Limited::new(body, MAX_BODY_BYTES);
    let bytes = match limited.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                Some("body"),
                format!("the request body is larger than the server reads ({MAX_BODY_BYTES} bytes)"),
            ));
        }
        Err(e) => return Err(ApiError::field("body", format!("the request body could not be read: {e}"))),
    };
    parse_json(&bytes)
}

/// A body's bytes as a JSON object.
pub fn parse_json(bytes: &[u8]) -> Result<Value, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::field("body", format!("the body is not JSON: {e} (line {}, column {})", e.line(), e.column()))
    })?;
    if !value.is_object() {
        return Err(ApiError::field("body", "the body must be a JSON object"));
    }
    Ok(value)
}

/// The query string's value of `name`, percent-decoded.
pub fn query<B>(request: &Request<B>, name: &str) -> Option<String> {
    let query = request.uri().query()?;
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| percent_decode(v))
    })
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"), 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_taken_as_a_bearer_token_or_a_basic_password_and_nothing_else() {
        let with = |header: &str| Request::builder().header("authorization", header).body(()).unwrap();
        assert!(authorized(&with("Bearer sekrit"), Some("sekrit")));
        // base64("runner:sekrit")
        assert!(authorized(&with("Basic cnVubmVyOnNla3JpdA=="), Some("sekrit")));
        assert!(!authorized(&with("Bearer sekrit2"), Some("sekrit")));
        assert!(!authorized(&with("sekrit"), Some("sekrit")));
        assert!(!authorized(&Request::new(()), Some("sekrit")));
        assert!(authorized(&Request::new(()), None));
    }

    #[test]
    fn bad_json_names_where_it_broke_and_a_non_object_is_refused() {
        let e = parse_json(b"{\"task\": 1,\n}").unwrap_err();
        assert_eq!((e.status, e.field.as_deref()), (StatusCode::BAD_REQUEST, Some("body")));
        assert!(e.message.contains("line 2"), "{}", e.message);
        assert!(parse_json(b"[1]").unwrap_err().message.contains("JSON object"));
        assert_eq!(parse_json(b"  ").unwrap(), json!({}));
    }

    #[test]
    fn a_query_value_is_percent_decoded() {
        let request = Request::builder().uri("/v1/tasks?x=1&split=held%20out").body(()).unwrap();
        assert_eq!(query(&request, "split").as_deref(), Some("held out"));
        assert_eq!(query(&request, "y"), None);
    }
}
