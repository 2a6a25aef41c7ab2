//! An HTTP endpoint as a model (promptfoo's `http` provider): each call renders a request
//! from templates over the prompt (`{{ prompt }}`, the last user message) and the task's
//! fields (a promptfoo test's vars), sends it, and reads the answer out of the response
//! with a `transformResponse` path (`json.output`, `json.choices[0].message.content`,
//! `text`, or the same as an arrow function, `(json) => json.output`). Any other JavaScript
//! is refused when the config is read. A failed call is the endpoint's fault: unscored.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use serde_json::{Map, Value};

use super::{Exchange, LanguageModel, ModelError, ModelRequest, ModelResponse, echo};
use crate::config::template;
use crate::log::UnscoredCause;

/// How long a call may take when the config does not say.
const DEFAULT_TIMEOUT_S: f64 = 120.0;

/// One endpoint as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    pub url: String,
    pub method: reqwest::Method,
    /// Header names and their values, each value a template.
    pub headers: Vec<(String, String)>,
    pub body: Option<Body>,
    pub transform: Transform,
    pub timeout_s: f64,
}

/// A request body: a JSON value whose texts are templates, or one template of text.
#[derive(Debug, Clone, PartialEq)]
pub enum Body {
    Json(Value),
    Text(String),
}

/// Where the answer is in a response.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Transform {
    /// No `transformResponse`: a JSON text as itself, other JSON as JSON, else the raw text.
    #[default]
    Whole,
    /// The raw body as text.
    Text,
    /// A path into the parsed body.
    Path(Vec<Step>),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Key(String),
    Index(usize),
}

impl Endpoint {
    /// An endpoint at `url` (http or https), `POST` unless `method` says, no body.
    pub fn new(url: &str, method: Option<&str>) -> Result<Self, String> {
        match reqwest::Url::parse(url) {
            Ok(parsed) if matches!(parsed.scheme(), "http" | "https") && parsed.has_host() => {}
            _ => return Err(format!("`{url}` is not an http(s) URL")),
        }
        let method = match method.map(str::to_ascii_uppercase).as_deref() {
            None => reqwest::Method::POST,
            Some(m @ ("GET" | "POST" | "PUT" | "PATCH" | "DELETE")) => {
                reqwest::Method::from_bytes(m.as_bytes()).map_err(|e| e.to_string())?
            }
            Some(other) => return Err(format!("the method `{other}` is not one of GET, POST, PUT, PATCH, DELETE")),
        };
        Ok(Endpoint {
            url: url.to_owned(),
            method,
            headers: Vec::new(),
            body: None,
            transform: Transform::Whole,
            timeout_s: DEFAULT_TIMEOUT_S,
        })
    }
}

impl Transform {
    /// Reads a `transformResponse`: `json.a.b[0]["c"]` (`data` is `json`), `text`, or an
    /// arrow function whose body is such a path over its parameters (`(json, text) => …`).
    pub fn parse(written: &str) -> Result<Transform, String> {
        let refuse = |why: &str| {
            Err(format!(
                "the transformResponse `{written}` {why}: runner reads a path such as `json.output`, `json.choices[0].message.content`, `text`, or `(json) => json.output`"
            ))
        };
        let written = written.trim();
        if written.starts_with("file://") {
            return refuse("is a file of JavaScript, which runner does not run");
        }
        let (json_name, text_name, expression) = match written.split_once("=>") {
            Some((params, body)) => {
                let params = params.trim().trim_start_matches('(').trim_end_matches(')');
                let mut names = params.split(',').map(str::trim);
                let json = names.next().filter(|n| !n.is_empty()).unwrap_or("json");
                let text = names.next().unwrap_or("text");
                (json, text, body.trim())
            }
            None => ("json", "text", written),
        };
        let mut chars = expression.char_indices().peekable();
        let mut root = String::new();
        while let Some(&(_, c)) = chars.peek() {
            if c.is_alphanumeric() || c == '_' || c == '$' {
                root.push(c);
                chars.next();
            } else {
                break;
            }
        }
        let is_json = root == json_name || (json_name == "json" && root == "data");
        if root == text_name && !is_json {
            return if chars.peek().is_none() { Ok(Transform::Text) } else { refuse("reads into the text") };
        }
        if !is_json {
            return refuse("does not start from the response (`json` or `text`)");
        }
        let rest: String = chars.map(|(_, c)| c).collect();
        let mut steps = Vec::new();
        let mut rest = rest.trim();
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("?.").or_else(|| rest.strip_prefix('.')) {
                if let Some(bracketed) = after.strip_prefix('[') {
                    rest = bracketed;
                    let Some((step, left)) = bracket(rest) else { return refuse("has a bracket runner cannot read") };
                    steps.push(step);
                    rest = left;
                    continue;
                }
                let end = after.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '$')).unwrap_or(after.len());
                if end == 0 {
                    return refuse("has a `.` without a name after it");
                }
                steps.push(Step::Key(after[..end].to_owned()));
                rest = &after[end..];
            } else if let Some(after) = rest.strip_prefix('[') {
                let Some((step, left)) = bracket(after) else { return refuse("has a bracket runner cannot read") };
                steps.push(step);
                rest = left;
            } else {
                return refuse("is more than a path");
            }
        }
        Ok(Transform::Path(steps))
    }

    /// The answer in a response: `Err` when the path finds nothing there.
    pub fn apply(&self, text: &str) -> Result<String, String> {
        let parsed = serde_json::from_str::<Value>(text);
        let shown = |v: &Value| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        match self {
            Transform::Text => Ok(text.to_owned()),
            Transform::Whole => Ok(parsed.map(|v| shown(&v)).unwrap_or_else(|_| text.to_owned())),
            Transform::Path(steps) => {
                let json = parsed.map_err(|e| format!("the response is not JSON ({e})"))?;
                let mut at = &json;
                for step in steps {
                    let next = match step {
                        Step::Key(key) => at.get(key.as_str()),
                        Step::Index(i) => at.get(*i),
                    };
                    at = next.ok_or_else(|| {
                        let step = match step {
                            Step::Key(key) => format!("`{key}`"),
                            Step::Index(i) => format!("[{i}]"),
                        };
                        format!("the response has no {step} where transformResponse looks")
                    })?;
                }
                Ok(shown(at))
            }
        }
    }
}

/// `0]`, `"key"]` or `'key']` after a `[`: the step and what follows the `]`.
fn bracket(after: &str) -> Option<(Step, &str)> {
    let (inside, left) = after.split_once(']')?;
    let inside = inside.trim();
    let step = if let Ok(i) = inside.parse::<usize>() {
        Step::Index(i)
    } else {
        let quoted = inside
            .strip_prefix('"')
            .and_then(|s| s.strip_suffix('"'))
            .or_else(|| inside.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')))?;
        Step::Key(quoted.to_owned())
    };
    Some((step, left))
}

/// The endpoint shared by a run's episodes: one client.
pub struct EndpointModel {
    name: String,
    endpoint: Arc<Endpoint>,
    client: reqwest::Client,
}

impl EndpointModel {
    pub fn new(name: &str, endpoint: Arc<Endpoint>) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs_f64(endpoint.timeout_s.max(0.001)))
            .build()
            .map_err(|e| format!("failed to build an HTTP client: {e}"))?;
        Ok(EndpointModel { name: name.to_owned(), endpoint, client })
    }

    /// The model one episode talks to: its templates see the task's fields.
    pub fn for_task(self: &Arc<Self>, fields: Map<String, Value>) -> LentEndpoint {
        LentEndpoint { shared: self.clone(), fields }
    }
}

/// The endpoint lent to one episode.
pub struct LentEndpoint {
    shared: Arc<EndpointModel>,
    fields: Map<String, Value>,
}

impl LentEndpoint {
    fn refused(&self, message: String) -> ModelError {
        ModelError::new(UnscoredCause::ConfigurationError, format!("{}: {message}", self.shared.name))
    }
}

#[async_trait]
impl LanguageModel for LentEndpoint {
    fn name(&self) -> &str {
        &self.shared.name
    }

    fn endpoint(&self) -> Option<&str> {
        Some(&self.shared.endpoint.url)
    }

    async fn respond(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let endpoint = &self.shared.endpoint;
        let mut context = self.fields.clone();
        context.insert("prompt".into(), Value::String(echo::echoed(request.messages)));
        let render = |text: &str| template::render(text, &context);
        let mut call = self.shared.client.request(endpoint.method.clone(), &endpoint.url);
        let mut typed = false;
        for (name, value) in &endpoint.headers {
            let header =
                HeaderName::from_bytes(name.as_bytes()).map_err(|e| self.refused(format!("header `{name}`: {e}")))?;
            let value = HeaderValue::from_str(&render(value).map_err(|e| self.refused(e))?)
                .map_err(|e| self.refused(format!("header `{name}`: {e}")))?;
            typed |= header == CONTENT_TYPE;
            call = call.header(header, value);
        }
        let sent = match &endpoint.body {
            None => Value::Null,
            Some(Body::Json(value)) => {
                let body = template::render_value(value, &context).map_err(|e| self.refused(e))?;
                if !typed {
                    call = call.header(CONTENT_TYPE, "application/json");
                }
                call = call.body(body.to_string());
                body
            }
            Some(Body::Text(text)) => {
                let body = render(text).map_err(|e| self.refused(e))?;
                if !typed {
                    call = call.header(CONTENT_TYPE, "text/plain");
                }
                call = call.body(body.clone());
                Value::String(body)
            }
        };
        let failed = |cause: UnscoredCause, message: String| {
            ModelError::new(cause, format!("{} ({}): {message}", self.shared.name, endpoint.url))
        };
        let response = call.send().await.map_err(|e| {
            let cause = if e.is_connect() { UnscoredCause::ConfigurationError } else { UnscoredCause::ProviderError };
            failed(cause, format!("the request failed: {e}"))
        })?;
        let status = response.status();
        let text = response
            .text()
            .await
            .map_err(|e| failed(UnscoredCause::ProviderError, format!("the response broke off: {e}")))?;
        let received = serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text.clone()));
        let exchange = Exchange { url: endpoint.url.clone(), request: sent, response: received };
        if !status.is_success() {
            let cause = match status.as_u16() {
                429 => UnscoredCause::RateLimited,
                s if s >= 500 => UnscoredCause::ProviderError,
                _ => UnscoredCause::ConfigurationError,
            };
            let head: String = text.chars().take(300).collect();
            let mut error = failed(cause, format!("answered {status}: {head}"));
            error.exchange = Some(exchange);
            return Err(error);
        }
        let answer = endpoint.transform.apply(&text).map_err(|e| {
            let mut error = failed(UnscoredCause::ProviderError, e);
            error.exchange = Some(exchange.clone());
            error
        })?;
        Ok(ModelResponse {
            text: Some(answer),
            finish_reason: Some("stop".into()),
            attempts: 1,
            exchange: Some(exchange),
            ..ModelResponse::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(steps: &[Step]) -> Transform {
        Transform::Path(steps.to_vec())
    }

    #[test]
    fn transforms_read_the_paths_promptfoo_users_write() {
        let key = |k: &str| Step::Key(k.into());
        assert_eq!(Transform::parse("json.output"), Ok(path(&[key("output")])));
        let choices = path(&[key("choices"), Step::Index(0), key("message"), key("content")]);
        assert_eq!(Transform::parse("json.choices[0].message.content"), Ok(choices.clone()));
        assert_eq!(Transform::parse("(json, text) => json.choices[0].message.content"), Ok(choices.clone()));
        assert_eq!(Transform::parse("data => data.choices[0]?.message['content']"), Ok(choices));
        assert_eq!(Transform::parse("json[\"a b\"]"), Ok(path(&[key("a b")])));
        assert_eq!(Transform::parse("text"), Ok(Transform::Text));
        assert_eq!(Transform::parse("(json, text) => text"), Ok(Transform::Text));
        assert_eq!(Transform::parse("json"), Ok(path(&[])));
        for refused in ["json.output.trim()", "json.a || 'x'", "file://t.js", "response.output", "json.", "text.x"] {
            let e = Transform::parse(refused).unwrap_err();
            assert!(e.contains(refused) && e.contains("runner reads a path"), "{refused}: {e}");
        }
    }

    #[test]
    fn a_transform_finds_the_answer_or_says_where_it_is_missing() {
        let body = r#"{"choices": [{"message": {"content": "Paris"}}], "n": 3}"#;
        let content = Transform::parse("json.choices[0].message.content").unwrap();
        assert_eq!(content.apply(body).unwrap(), "Paris");
        assert_eq!(Transform::parse("json.n").unwrap().apply(body).unwrap(), "3");
        assert_eq!(
            Transform::parse("json.choices[0]").unwrap().apply(body).unwrap(),
            r#"{"message":{"content":"Paris"}}"#
        );
        let missing = Transform::parse("json.choices[1].message").unwrap().apply(body).unwrap_err();
        assert!(missing.contains("[1]"), "{missing}");
        assert_eq!(Transform::Whole.apply("\"hi\"").unwrap(), "hi");
        assert_eq!(Transform::Whole.apply("plain words").unwrap(), "plain words");
        assert!(content.apply("not json").unwrap_err().contains("not JSON"));
    }

    #[test]
    fn an_endpoint_needs_an_http_url_and_a_known_method() {
        assert_eq!(Endpoint::new("http://127.0.0.1:9/x", None).unwrap().method, reqwest::Method::POST);
        assert_eq!(Endpoint::new("https://h/x", Some("get")).unwrap().method, reqwest::Method::GET);
        assert!(Endpoint::new("127.0.0.1:9/x", None).unwrap_err().contains("not an http(s) URL"));
        assert!(Endpoint::new("http://h/x", Some("BREW")).unwrap_err().contains("BREW"));
    }
}
