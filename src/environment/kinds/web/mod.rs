//! `web`: search, fetch and extract over a fixed corpus (offline, BM25-ranked, the same in
//! every run) or over live HTTP (an allow-list of hosts, pages cached in the run folder).
//! An episode has a request budget; every failure is an observation.
//!
//! The definition's `web:` settings are read once, when the environment file is loaded:
//! the corpus is indexed then and its index is shared, read-only, by every episode.

mod cache;
pub mod corpus;
pub mod live;
pub mod page;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{EnvironmentKind, KindKeys, KindSettings};
use crate::config::decode::{ConfigError, Source, check_seconds};
use crate::config::yaml::Position;
use crate::contract::{Actor, ErrorType, ToolAnnotations};
use crate::domain::{MAX_EPISODE_S, Task};
use crate::environment::tool::{self, Tool, ToolDecl};
use crate::environment::{Definition, SetupContext, SetupError, ToolFailure, World, decode_arguments};
use cache::{KeyLocks, PageCache};
use corpus::Corpus;
use live::{FetchError, Live, LiveSettings};
use page::{Format, Page};

/// The kind `web`.
pub struct Web;

/// The most results one search may ask for.
const MAX_LIMIT: u64 = 20;
/// The folder of the run's page cache, in the run folder.
pub const CACHE_FOLDER: &str = "web-cache";

#[async_trait]
impl EnvironmentKind for Web {
    fn name(&self) -> &'static str {
        "web"
    }

    fn tools(&self) -> Vec<ToolDecl> {
        tool::offer(TOOLS)
    }

    /// `web:`, what it browses: a corpus or live HTTP ([`WebSetup`]).
    fn keys(&self) -> &'static [&'static str] {
        &["web"]
    }

    fn decode_settings(&self, keys: &KindKeys<'_>) -> Result<KindSettings, ConfigError> {
        let Some(value) = keys.get("web") else {
            return Err(keys.source.error("kind", format!("a `web` environment needs `web:`, {WHAT_TO_BROWSE}")));
        };
        Ok(KindSettings::Web(Some(Arc::new(WebSetup::load(keys.source, value)?))))
    }

    fn needs_a_file(&self, name: &str) -> Option<String> {
        Some(format!(
            "the `web` kind needs to know what to browse: write environments/{name}.yaml with `kind: web` and `web:`, {WHAT_TO_BROWSE}"
        ))
    }

    fn builtin_settings(&self) -> KindSettings {
        KindSettings::Web(None)
    }

    fn refuse_key(&self, key: &str, other: &str) -> String {
        format!("only the `web` kind browses; kind `{other}` takes no `{key}:`")
    }

    async fn setup(
        &self,
        definition: &Definition,
        _task: &Task,
        context: &SetupContext<'_>,
    ) -> Result<Box<dyn World>, SetupError> {
        let failed = |message: String| SetupError { name: definition.name.clone(), message };
        let KindSettings::Web(Some(setup)) = &definition.settings else {
            return Err(failed(
                "a `web` environment needs a file that says what to browse: `web: {corpus: …}` or `web: {live: …}`"
                    .into(),
            ));
        };
        let source = match &setup.pages {
            Pages::Corpus(corpus) => Browsing::Corpus(corpus.clone()),
            Pages::Live(live) => {
                let dir = context.run_dir.unwrap_or(context.work_root).join(CACHE_FOLDER);
                let cache = PageCache::open(&dir, setup.locks.clone())
                    .map_err(|e| failed(format!("failed to make the page cache {}: {e}", dir.display())))?;
                Browsing::Live(live.clone(), cache)
            }
        };
        let (budget, left) = (setup.budget, AtomicU32::new(setup.budget));
        Ok(Box::new(WebWorld { source, budget, left, cap: definition.limits.output_cap_bytes }))
    }
}

/// The two ways to say what a `web` environment browses, for messages.
const WHAT_TO_BROWSE: &str = "`{corpus: FOLDER}` (offline pages) or `{live: {allow: [HOST…]}}` (HTTP)";

/// The `web:` mapping of an environment file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WebFile {
    /// A folder of pages or a JSONL file, relative to the environment file.
    corpus: Option<PathBuf>,
    /// Where a folder corpus's files are served.
    #[serde(default = "default_base_url")]
    base_url: String,
    live: Option<LiveSettings>,
    /// Requests (searches, fetches, extracts) one episode may make.
    #[serde(default = "default_budget")]
    budget: u32,
}

fn default_base_url() -> String {
    "https://corpus.local/".into()
}

fn default_budget() -> u32 {
    20
}

/// What a definition browses, read once and shared by its worlds.
#[derive(Debug)]
pub struct WebSetup {
    pages: Pages,
    budget: u32,
    locks: Arc<KeyLocks>,
}

#[derive(Debug)]
enum Pages {
    Corpus(Arc<Corpus>),
    Live(Arc<Live>),
}

impl WebSetup {
    /// Reads the `web:` mapping at `web` of `source` (an environment file); a corpus is
    /// read and indexed now. A relative corpus path is the file's.
    pub fn load(source: &Source, value: &Value) -> Result<WebSetup, ConfigError> {
        let file: WebFile = source.decode("web", value)?;
        if file.budget == 0 {
            return Err(source.error("web.budget", "must be at least 1"));
        }
        match reqwest::Url::parse(&file.base_url) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.host_str().is_some() => {}
            _ => {
                let message = format!("`{}` is not an http(s) URL (write `https://{}`)", file.base_url, file.base_url);
                return Err(source.error("web.base_url", message));
            }
        }
        let pages = match (file.corpus, file.live) {
            (Some(corpus), None) => {
                let dir = source.file.parent().unwrap_or(Path::new("."));
                let path = dir.join(&corpus);
                if !path.exists() {
                    let message = format!("no file or folder {} (read relative to this file)", path.display());
                    return Err(source.error("web.corpus", message));
                }
                let corpus = Corpus::load(&path, &file.base_url).map_err(|e| {
                    let message = format!("the corpus of web.corpus: {}", e.message);
                    match e.line {
                        Some(line) => ConfigError::at(&e.file, Position { line, column: 1 }, message),
                        None => ConfigError::whole(&e.file, message),
                    }
                })?;
                Pages::Corpus(Arc::new(corpus))
            }
            (None, Some(live)) => {
                check_live(source, &live)?;
                Pages::Live(Arc::new(Live::new(live).map_err(|e| source.error("web.live", e))?))
            }
            _ => return Err(source.error("web", "give exactly one of `corpus:` (offline pages) or `live:` (HTTP)")),
        };
        Ok(WebSetup { pages, budget: file.budget, locks: Arc::default() })
    }
}

fn check_live(source: &Source, live: &LiveSettings) -> Result<(), ConfigError> {
    if live.allow.is_empty() {
        return Err(source.error("web.live.allow", "name at least one host that may be fetched"));
    }
    for (i, host) in live.allow.iter().enumerate() {
        if host.is_empty() || host.contains(['/', ':', '*', ' ']) {
            let message = format!("`{host}` is not a host name (write `example.org`: it allows its subdomains too)");
            return Err(source.error(&format!("web.live.allow[{i}]"), message));
        }
    }
    check_seconds(source, "web.live.timeout_s", live.timeout_s, 0.001, MAX_EPISODE_S)?;
    if live.max_bytes == 0 {
        return Err(source.error("web.live.max_bytes", "must be at least 1"));
    }
    if !(live.min_interval_s.is_finite() && (0.0..=3600.0).contains(&live.min_interval_s)) {
        return Err(source.error("web.live.min_interval_s", "must be between 0 and 3600 seconds"));
    }
    if let Some(endpoint) = &live.search_endpoint {
        match reqwest::Url::parse(endpoint) {
            Ok(url) if matches!(url.scheme(), "http" | "https") => {}
            _ => return Err(source.error("web.live.search_endpoint", format!("`{endpoint}` is not an http(s) URL"))),
        }
    }
    Ok(())
}

/// How a page of `content_type` is read: HTML, or text shown as it is; `None` for
/// anything that is not a page (images, archives, PDFs).
pub fn format_of_type(content_type: &str) -> Option<Format> {
    let media = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    match media.as_str() {
        "text/html" | "application/xhtml+xml" => Some(Format::Html),
        "text/plain" | "text/markdown" | "text/x-markdown" | "application/json" => Some(Format::Text),
        _ => None,
    }
}

/// The tools of `web`, in the order models are shown them.
pub const TOOLS: &[&dyn Tool<WebWorld>] = &[&Search, &Fetch, &Extract];

pub struct WebWorld {
    source: Browsing,
    budget: u32,
    /// Requests left of the budget.
    left: AtomicU32,
    cap: usize,
}

/// What one world browses: the shared corpus, or live pages through the run's cache.
enum Browsing {
    Corpus(Arc<Corpus>),
    Live(Arc<Live>, PageCache),
}

impl WebWorld {
    /// Takes one request from the budget; the number left after it.
    fn spend(&self) -> Result<u32, ToolFailure> {
        match self.left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)) {
            Ok(before) => Ok(before - 1),
            Err(_) => Err(ToolFailure::new(
                ErrorType::PermissionError,
                format!("the request budget of {} is spent: no more searches, fetches or extracts", self.budget),
            )
            .suggest("answer with what you have found (final_answer)")),
        }
    }

    /// The page at `url`: from the corpus, or from the run's cache or the network.
    async fn page(&self, url: &str) -> Result<Page, ToolFailure> {
        match &self.source {
            Browsing::Corpus(corpus) => corpus.page(url).cloned().ok_or_else(|| {
                ToolFailure::new(ErrorType::ExecutionError, format!("HTTP 404: no page at {url} in the corpus"))
                    .suggest("search, then fetch a URL from the results")
            }),
            Browsing::Live(live, cache) => {
                // A page is kept only once it was read: a page that cannot be read would
                // otherwise fail again in every episode, and in the run resumed.
                let mut read = None;
                let response = cache
                    .get_or(url, async {
                        let response = live.get(url).await.map_err(fetch_failure)?;
                        if (200..300).contains(&response.status) {
                            read = Some(read_page(&response).await?);
                        }
                        Ok::<_, ToolFailure>(response)
                    })
                    .await?;
                let status = response.status;
                if (300..400).contains(&status) {
                    // Redirects are followed; one that is still here had nowhere to go (no
                    // `Location`, or a `300` offering choices).
                    let message = format!("HTTP {status}: {url} answered with a redirect that was not followed");
                    return Err(ToolFailure::new(ErrorType::ExecutionError, message));
                }
                if !(200..300).contains(&status) {
                    let message = format!("HTTP {status}: {url} could not be fetched");
                    return Err(ToolFailure::new(ErrorType::ExecutionError, message));
                }
                match read {
                    Some(page) => Ok(page),
                    None => read_page(&response).await,
                }
            }
        }
    }
}

/// The stack of the thread that reads a page: the Markdown converter recurses once per
/// level of nesting, and [`page::bounded`] keeps the levels few.
const READER_STACK_BYTES: usize = 256 * 1024 * 1024;
/// The longest a page may take to read.
const READ_DEADLINE: Duration = Duration::from_secs(20);

/// `response` read as a page.
async fn read_page(response: &live::Response) -> Result<Page, ToolFailure> {
    let format = format_of_type(&response.content_type).unwrap_or_else(|| sniff(&response.body));
    let (url, body) = (response.url.clone(), response.body.clone());
    off_the_runtime(move || Page::of(&url, body, format, None)).await
}

/// Runs `parse` (HTML parsing, which takes a while for a large page) on a thread of its
/// own with a known large stack. Past the deadline it is not waited for, and nothing waits
/// for it when the run ends.
async fn off_the_runtime<T: Send + 'static>(parse: impl FnOnce() -> T + Send + 'static) -> Result<T, ToolFailure> {
    let failed = |why: String| ToolFailure::new(ErrorType::ExecutionError, format!("failed to read the page: {why}"));
    let (send, receive) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("page-reader".into())
        .stack_size(READER_STACK_BYTES)
        .spawn(move || {
            let _ = send.send(parse());
        })
        .map_err(|e| failed(format!("no thread to read it on: {e}")))?;
    match tokio::time::timeout(READ_DEADLINE, receive).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(_)) => Err(failed("the reader crashed".into())),
        Err(_) => Err(failed(format!("it took longer than {}s (is it nested very deep?)", READ_DEADLINE.as_secs()))),
    }
}

/// A body without a content type: HTML when it starts like markup.
fn sniff(body: &str) -> Format {
    if body.trim_start().starts_with('<') { Format::Html } else { Format::Text }
}

fn fetch_failure(e: FetchError) -> ToolFailure {
    match e {
        FetchError::Refused(message) => {
            ToolFailure::new(ErrorType::PermissionError, message).suggest("fetch pages of the allowed hosts only")
        }
        FetchError::Timeout(message) => ToolFailure::new(ErrorType::TimeoutError, message),
        FetchError::Failed(message) => ToolFailure::new(ErrorType::ExecutionError, message),
    }
}

fn url_schema() -> Value {
    json!({"type": "string", "minLength": 1, "description": "An absolute URL, as search results give them."})
}

struct Search;

#[derive(Deserialize)]
struct SearchArgs {
    query: String,
    #[serde(default = "default_limit")]
    limit: usize,
}

fn default_limit() -> usize {
    5
}

#[async_trait]
impl Tool<WebWorld> for Search {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::READ_ONLY)
    }

    fn name(&self) -> &'static str {
        "search"
    }

    fn description(&self) -> &'static str {
        "Search the web for pages about a query; the best first, each with its url, title and a snippet. \
         Costs one request of the budget."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 5}
            },
            "required": ["query"], "additionalProperties": false})
    }

    async fn call(&self, world: &WebWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let SearchArgs { query, limit } = decode_arguments(arguments)?;
        if let Browsing::Live(live, _) = &world.source
            && !live.can_search()
        {
            return Err(ToolFailure::new(ErrorType::ExecutionError, "this environment has no search endpoint")
                .suggest("fetch a URL you know"));
        }
        let left = world.spend()?;
        let results: Vec<Value> = match &world.source {
            Browsing::Corpus(corpus) => corpus
                .search(&query, limit)
                .map_err(|e| ToolFailure::new(ErrorType::ExecutionError, e))?
                .into_iter()
                .map(|h| json!({"url": h.url, "title": h.title, "snippet": h.snippet}))
                .collect(),
            Browsing::Live(live, cache) => {
                let key = format!("search {limit} {query}");
                cache
                    .get_or(&key, live.search(&query, limit))
                    .await
                    .map_err(fetch_failure)?
                    .into_iter()
                    .map(|r| json!({"url": r.url, "title": r.title, "snippet": r.snippet}))
                    .collect()
            }
        };
        Ok(json!({"query": query, "results": results, "requests_left": left}))
    }
}

struct Fetch;

#[derive(Deserialize)]
struct FetchArgs {
    url: String,
}

#[async_trait]
impl Tool<WebWorld> for Fetch {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::READ_ONLY)
    }

    fn name(&self) -> &'static str {
        "fetch"
    }

    fn description(&self) -> &'static str {
        "Fetch a page and read it as Markdown (long pages are cut). Costs one request of the budget."
    }

    fn parameters(&self) -> Value {
        json!({"type": "object", "properties": {"url": url_schema()}, "required": ["url"], "additionalProperties": false})
    }

    async fn call(&self, world: &WebWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let FetchArgs { url } = decode_arguments(arguments)?;
        let left = world.spend()?;
        let page = world.page(&url).await?;
        let (content, truncated) = page::cut(&page.text, world.cap);
        let mut result = json!({"url": page.url, "title": page.title, "content": content, "requests_left": left});
        if truncated {
            result["truncated"] = Value::Bool(true);
        }
        Ok(result)
    }
}

struct Extract;

#[derive(Deserialize)]
struct ExtractArgs {
    url: String,
    selector: String,
}

#[async_trait]
impl Tool<WebWorld> for Extract {
    fn annotations(&self) -> Option<ToolAnnotations> {
        Some(ToolAnnotations::READ_ONLY)
    }

    fn name(&self) -> &'static str {
        "extract"
    }

    fn description(&self) -> &'static str {
        "The text of the elements of an HTML page that a CSS selector matches (`table td`, `h2`, `#price`). \
         Costs one request of the budget."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"url": url_schema(), "selector": {"type": "string", "minLength": 1}},
            "required": ["url", "selector"], "additionalProperties": false})
    }

    async fn call(&self, world: &WebWorld, _actor: &Actor, arguments: Value) -> Result<Value, ToolFailure> {
        let ExtractArgs { url, selector } = decode_arguments(arguments)?;
        // A selector that cannot match anything costs nothing.
        page::select("", &selector).map_err(|e| ToolFailure::new(ErrorType::ValidationError, e))?;
        let left = world.spend()?;
        let page = world.page(&url).await?;
        let Some(html) = &page.html else {
            return Err(ToolFailure::new(ErrorType::ExecutionError, format!("{} is not an HTML page", page.url))
                .suggest("fetch it to read its text"));
        };
        let (html, wanted) = (html.clone(), selector.clone());
        let found = off_the_runtime(move || page::select(&html, &wanted))
            .await?
            .map_err(|e| ToolFailure::new(ErrorType::ValidationError, e))?;
        let total = found.len();
        // Whole matches while they fit the cap; the one that crosses it is cut.
        let mut matches = Vec::new();
        let mut room = world.cap;
        for text in found {
            if room == 0 {
                break;
            }
            let (shown, cut) = page::cut(&text, room);
            room = if cut { 0 } else { room - text.len() };
            matches.push(shown);
        }
        let shown = matches.len();
        let mut result = json!({
            "url": page.url, "selector": selector, "count": total, "matches": matches, "requests_left": left});
        if shown < total {
            result["truncated"] = Value::String(format!("showing {shown} of {total} matches"));
        }
        Ok(result)
    }
}

#[async_trait]
impl World for WebWorld {
    async fn call(&self, actor: &Actor, name: &str, arguments: Value) -> Result<Value, ToolFailure> {
        tool::call(TOOLS, Web.name(), self, actor, name, arguments).await
    }

    fn describe(&self) -> Map<String, Value> {
        let pages = match &self.source {
            Browsing::Corpus(corpus) => json!({"corpus_pages": corpus.len()}),
            Browsing::Live(..) => json!({"live": true}),
        };
        let mut info = Map::new();
        info.insert("web".into(), pages);
        info.insert("requests_left".into(), json!(self.left.load(Ordering::SeqCst)));
        info
    }
}

#[cfg(test)]
mod tests;
