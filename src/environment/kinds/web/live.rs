//! Live pages: real HTTP requests made by the runner process itself, to the hosts of an
//! allow-list only, with a timeout, a size cap, a user agent, bounded redirects and a
//! least interval between requests to one host. The search endpoint speaks a small JSON
//! contract (see `docs/src/environments/web.md`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use reqwest::Url;
use serde::{Deserialize, Serialize};

/// The `live:` settings of a `web` environment file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LiveSettings {
    /// Hosts that may be fetched; each allows itself and its subdomains.
    pub allow: Vec<String>,
    /// Where `search` asks: `GET <endpoint>?q=<query>&limit=<n>`, answered with
    /// `{"results": [{"url", "title", "snippet"}]}`. No search without it.
    pub search_endpoint: Option<String>,
    /// The longest one request may take, body included.
    pub timeout_s: f64,
    /// The most bytes of a body; a larger page is refused.
    pub max_bytes: u64,
    pub max_redirects: usize,
    pub user_agent: String,
    /// The least time between two requests to one host, across the run's episodes.
    pub min_interval_s: f64,
}

impl Default for LiveSettings {
    fn default() -> Self {
        LiveSettings {
            allow: Vec::new(),
            search_endpoint: None,
            timeout_s: 10.0,
            max_bytes: 2 * 1024 * 1024,
            max_redirects: 5,
            user_agent: format!(
                "runner/{} (agent evaluation; fetches pages an agent asks for)",
                env!("CARGO_PKG_VERSION")
            ),
            min_interval_s: 0.0,
        }
    }
}

/// Why a live request gave no page.
#[derive(Debug, Clone, PartialEq)]
pub enum FetchError {
    /// Not on the allow-list, or not `http(s)`.
    Refused(String),
    Timeout(String),
    /// Everything else: a redirect loop, too large, not text, the network.
    Failed(String),
}

/// An HTTP response as the tools use it (and as the run's cache keeps it). A response
/// with an error status keeps no body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// Where it was found, after redirects.
    pub url: String,
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

/// A search result as the endpoint answers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchResult {
    pub url: String,
    #[serde(default)]
    pub title: String,
    #[serde(default)]
    pub snippet: String,
}

#[derive(Deserialize)]
struct SearchAnswer {
    results: Vec<SearchResult>,
}

/// A redirect the allow-list refuses, told apart from other redirect errors.
#[derive(Debug)]
struct RedirectRefused(String);

impl std::fmt::Display for RedirectRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RedirectRefused {}

pub struct Live {
    client: reqwest::Client,
    settings: LiveSettings,
    /// When each host may next be asked.
    next_turn: Mutex<HashMap<String, Instant>>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl Live {
    pub fn new(settings: LiveSettings) -> Result<Live, String> {
        let allow = settings.allow.clone();
        let max_redirects = settings.max_redirects;
        let policy = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().iter().any(|u| u == attempt.url()) {
                let error = format!("a redirect loop: {} was visited before", attempt.url());
                return attempt.error(error);
            }
            if attempt.previous().len() > max_redirects {
                return attempt.error(format!("more than {max_redirects} redirects"));
            }
            if let Err(why) = allowed(&allow, attempt.url()) {
                let error = RedirectRefused(format!("redirected to {}: {why}", attempt.url()));
                return attempt.error(error);
            }
            attempt.follow()
        });
        let timeout = Duration::from_secs_f64(settings.timeout_s);
        let client = reqwest::Client::builder()
            .user_agent(settings.user_agent.clone())
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(policy)
            .build()
            .map_err(|e| format!("failed to build an HTTP client: {e}"))?;
        Ok(Live { client, settings, next_turn: Mutex::new(HashMap::new()) })
    }

    pub fn can_search(&self) -> bool {
        self.settings.search_endpoint.is_some()
    }

    /// GETs `url` if the allow-list lets it. An error status is a response (no body); a
    /// success must be text no larger than the cap.
    pub async fn get(&self, url: &str) -> Result<Response, FetchError> {
        let parsed = Url::parse(url).map_err(|e| FetchError::Failed(format!("`{url}` is not a URL: {e}")))?;
        allowed(&self.settings.allow, &parsed).map_err(FetchError::Refused)?;
        self.wait_turn(&parsed).await;
        let response = self.client.get(parsed).send().await.map_err(|e| self.failure(url, e))?;
        let status = response.status();
        let final_url = response.url().to_string();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        if !status.is_success() {
            return Ok(Response { url: final_url, status: status.as_u16(), content_type, body: String::new() });
        }
        if !content_type.is_empty() && super::format_of_type(&content_type).is_none() {
            return Err(FetchError::Failed(format!(
                "{final_url} is not a text page: its content type is `{content_type}`"
            )));
        }
        let body = self.read_body(&final_url, response).await?;
        Ok(Response { url: final_url, status: status.as_u16(), content_type, body })
    }

    /// Asks the search endpoint for `query`; at most `limit` results.
    pub async fn search(&self, query: &str, limit: usize) -> Result<Vec<SearchResult>, FetchError> {
        let Some(endpoint) = &self.settings.search_endpoint else {
            return Err(FetchError::Failed("this environment has no search endpoint".into()));
        };
        let mut url = Url::parse(endpoint).map_err(|e| FetchError::Failed(format!("the search endpoint: {e}")))?;
        url.query_pairs_mut().append_pair("q", query).append_pair("limit", &limit.to_string());
        self.wait_turn(&url).await;
        let response = self.client.get(url).send().await.map_err(|e| self.failure(endpoint, e))?;
        let status = response.status();
        if !status.is_success() {
            return Err(FetchError::Failed(format!("the search endpoint answered HTTP {status}")));
        }
        let body = self.read_body(endpoint, response).await?;
        let answer: SearchAnswer = serde_json::from_str(&body).map_err(|e| {
            FetchError::Failed(format!(
                "the search endpoint's answer is not {{\"results\": [{{url, title, snippet}}]}}: {e}"
            ))
        })?;
        Ok(answer.results.into_iter().take(limit).collect())
    }

    async fn read_body(&self, url: &str, mut response: reqwest::Response) -> Result<String, FetchError> {
        let cap = self.settings.max_bytes;
        let too_large = || FetchError::Failed(format!("{url} is larger than the cap of {cap} bytes"));
        if response.content_length().is_some_and(|n| n > cap) {
            return Err(too_large());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| self.failure(url, e))? {
            if (body.len() + chunk.len()) as u64 > cap {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        if body.contains(&0) {
            return Err(FetchError::Failed(format!("{url} is binary, not a text page")));
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    fn failure(&self, url: &str, e: reqwest::Error) -> FetchError {
        if e.is_timeout() {
            return FetchError::Timeout(format!("{url} did not answer within {}s", self.settings.timeout_s));
        }
        // The cause is deepest in the chain: ours for a redirect, the system's otherwise.
        let mut causes = Vec::new();
        let mut refused = None;
        let mut source: Option<&dyn std::error::Error> = Some(&e);
        while let Some(cause) = source {
            if let Some(r) = cause.downcast_ref::<RedirectRefused>() {
                refused = Some(r.0.clone());
            }
            causes.push(cause.to_string());
            source = cause.source();
        }
        match refused {
            Some(why) => FetchError::Refused(why),
            None => FetchError::Failed(format!("failed to fetch {url}: {}", causes.join(": "))),
        }
    }

    /// Waits until `url`'s host may be asked again, and books the next turn.
    async fn wait_turn(&self, url: &Url) {
        if self.settings.min_interval_s <= 0.0 {
            return;
        }
        let host = url.host_str().unwrap_or_default().to_owned();
        let wait = {
            // A poisoned lock only means another request panicked; the times are intact.
            let mut next = self.next_turn.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            let turn = next.get(&host).copied().filter(|t| *t > now).unwrap_or(now);
            next.insert(host, turn + Duration::from_secs_f64(self.settings.min_interval_s));
            turn - now
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// Whether the allow-list lets `url` be fetched: `http(s)`, and a host that is an entry or
/// a subdomain of one.
pub fn allowed(allow: &[String], url: &Url) -> Result<(), String> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("only http and https pages can be fetched, not `{}:`", url.scheme()));
    }
    let host = url.host_str().unwrap_or_default().trim_end_matches('.').to_ascii_lowercase();
    let listed = allow.iter().any(|entry| {
        let entry = entry.trim_end_matches('.').to_ascii_lowercase();
        host == entry || host.ends_with(&format!(".{entry}"))
    });
    if listed { Ok(()) } else { Err(format!("the host `{host}` is not on the allow-list ({})", allow.join(", "))) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(url: &str) -> Result<(), String> {
        allowed(&["example.org".into(), "127.0.0.1".into()], &Url::parse(url).unwrap())
    }

    #[tokio::test]
    async fn requests_to_one_host_wait_their_turn_and_other_hosts_do_not() {
        let settings = LiveSettings { min_interval_s: 0.2, ..LiveSettings::default() };
        let live = Live::new(settings).unwrap();
        let (a, b) = (Url::parse("http://a.test/1").unwrap(), Url::parse("http://b.test/1").unwrap());
        let start = Instant::now();
        live.wait_turn(&a).await;
        live.wait_turn(&b).await;
        // The first request to each host is not held back (a generous bound, not a speed).
        assert!(start.elapsed() < Duration::from_millis(150), "{:?}", start.elapsed());
        live.wait_turn(&a).await;
        live.wait_turn(&a).await;
        // The second and third requests to a.test come at least 0.2 s apart each.
        assert!(start.elapsed() >= Duration::from_millis(400), "{:?}", start.elapsed());
    }

    #[test]
    fn the_allow_list_takes_hosts_and_their_subdomains_only() {
        assert!(check("https://example.org/a").is_ok());
        assert!(check("http://docs.example.org/a").is_ok());
        assert!(check("http://127.0.0.1:8080/").is_ok());
        // A name that merely ends in the same letters is another host.
        assert!(check("https://badexample.org/").unwrap_err().contains("`badexample.org`"));
        assert!(check("https://example.org.evil.test/").is_err());
        assert!(check("file:///etc/passwd").unwrap_err().contains("only http and https"));
    }
}
