//! Record and replay. `--record FILE` appends every model response to a cassette, keyed by
//! the digest of the canonical request; `--model replay:FILE` (or `replay:RUN`, a run's
//! own log) serves them back: free, deterministic prompt regression tests. A request that
//! was never recorded is a loud miss that names the nearest recorded request and the
//! difference.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{
    LanguageModel, Message, ModelError, ModelRequest, ModelResponse, canonical_request, digest, request_digest,
};
use crate::contract::ToolSpec;
use crate::log::reader::for_each_event_of;
use crate::log::{Event, LoggedEvent};

/// One line of a cassette.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Entry {
    pub digest: String,
    pub request: CanonicalRequest,
    pub response: ModelResponse,
}

/// The request as its digest sees it: the same for every backend of one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CanonicalRequest {
    pub model: String,
    #[serde(default)]
    pub sampling: Map<String, Value>,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
}

/// Appends entries to a cassette file as responses arrive.
pub struct CassetteWriter {
    file: Mutex<std::io::BufWriter<std::fs::File>>,
}

impl CassetteWriter {
    pub fn create(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::File::options().create(true).append(true).open(path)?;
        Ok(CassetteWriter { file: Mutex::new(std::io::BufWriter::new(file)) })
    }

    pub fn append(&self, entry: &Entry) -> std::io::Result<()> {
        let mut line = crate::log::secrets::scrub_bytes(&serde_json::to_vec(entry)?).into_owned();
        line.push(b'\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.write_all(&line)?;
        file.flush()
    }
}

/// Wraps a model and records every answer it gives.
pub struct Recording {
    pub inner: Arc<dyn LanguageModel>,
    pub cassette: Arc<CassetteWriter>,
}

#[async_trait]
impl LanguageModel for Recording {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn endpoint(&self) -> Option<&str> {
        self.inner.endpoint()
    }

    fn sampling(&self) -> Map<String, Value> {
        self.inner.sampling()
    }

    async fn respond(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let response = self.inner.respond(request).await?;
        let canonical = canonical_request(self, request);
        let entry = Entry { digest: digest(&canonical), request: canonical, response: response.recorded() };
        self.cassette
            .append(&entry)
            .map_err(|e| ModelError::new("record_error", format!("failed to write the cassette: {e}")))?;
        Ok(response)
    }
}

/// Serves recorded responses. Shared by every episode of a run.
pub struct Replay {
    name: String,
    sampling: Map<String, Value>,
    source: PathBuf,
    /// Responses per digest, served in recorded order.
    queues: Mutex<HashMap<String, VecDeque<ModelResponse>>>,
    /// How many responses each digest had, to tell "used up" from "never recorded".
    recorded: HashMap<String, usize>,
    /// Recorded requests, for explaining a miss (cassettes only; logs keep digests).
    requests: Vec<CanonicalRequest>,
}

impl Replay {
    /// Opens a cassette file, or a run (its folder or its `events.jsonl`).
    pub fn open(path: &Path) -> Result<Self, String> {
        let events = if path.is_dir() { path.join("events.jsonl") } else { path.to_owned() };
        let mut entries = Vec::new();
        if is_event_log(&events)? {
            for_each_event_of(&events, Some(&["model_call"]), |e: LoggedEvent| {
                if let Some(Event::ModelCall { model, request_digest, sampling, response, error: None, .. }) = e.event()
                    && let Ok(response) = serde_json::from_value::<ModelResponse>(response)
                {
                    entries.push((model, sampling, request_digest, None, response));
                }
            })
            .map_err(|e| e.to_string())?;
        } else {
            let file = std::fs::File::open(&events)
                .map_err(|e| format!("failed to open the cassette {}: {e}", events.display()))?;
            for (i, line) in BufReader::new(file).lines().enumerate() {
                let line = line.map_err(|e| format!("failed to read {}: {e}", events.display()))?;
                if line.trim().is_empty() {
                    continue;
                }
                let entry: Entry = serde_json::from_str(&line)
                    .map_err(|e| format!("{}:{}: not a cassette entry: {e}", events.display(), i + 1))?;
                entries.push((
                    entry.request.model.clone(),
                    entry.request.sampling.clone(),
                    entry.digest,
                    Some(entry.request),
                    entry.response,
                ));
            }
        }
        let Some((name, sampling, ..)) = entries.first().cloned() else {
            return Err(format!("{} holds no recorded model responses", events.display()));
        };
        if let Some((other, ..)) = entries.iter().find(|e| e.0 != name) {
            return Err(format!(
                "{} holds responses of several models ({name}, {other}); replay one model per file",
                events.display()
            ));
        }
        let mut queues: HashMap<String, VecDeque<ModelResponse>> = HashMap::new();
        let mut requests = Vec::new();
        for (_, _, digest, request, response) in entries {
            queues.entry(digest).or_default().push_back(response);
            requests.extend(request);
        }
        let recorded = queues.iter().map(|(d, q)| (d.clone(), q.len())).collect();
        Ok(Replay { name, sampling, source: events, queues: Mutex::new(queues), recorded, requests })
    }

    fn explain_miss(&self, wanted: &CanonicalRequest, digest: &str) -> String {
        if let Some(n) = self.recorded.get(digest) {
            return format!("this request was recorded {n} time(s) and every recorded response has been served");
        }
        let nearest = self.requests.iter().max_by_key(|r| {
            (r.tools == wanted.tools, r.messages.iter().zip(&wanted.messages).take_while(|(a, b)| a == b).count())
        });
        let Some(nearest) = nearest else {
            return format!("no recorded request has digest {digest} ({} holds digests only)", self.source.display());
        };
        if nearest.tools != wanted.tools {
            let names = |t: &[ToolSpec]| t.iter().map(|t| t.name.as_str()).collect::<Vec<_>>().join(", ");
            if names(&nearest.tools) != names(&wanted.tools) {
                return format!(
                    "the tools differ: recorded [{}], now [{}]",
                    names(&nearest.tools),
                    names(&wanted.tools)
                );
            }
            return "a tool's description or schema differs from the recording".into();
        }
        let same = nearest.messages.iter().zip(&wanted.messages).take_while(|(a, b)| a == b).count();
        match (nearest.messages.get(same), wanted.messages.get(same)) {
            (Some(was), Some(now)) => {
                let (was, now) = (render(was), render(now));
                let at = was.chars().zip(now.chars()).take_while(|(a, b)| a == b).count();
                format!(
                    "the nearest recorded request differs at message {} ({}): recorded {:?}, now {:?}",
                    same + 1,
                    role(&wanted.messages[same]),
                    excerpt(&was, at),
                    excerpt(&now, at)
                )
            }
            _ => format!(
                "the nearest recorded request has {} messages and this one {}, the same up to there",
                nearest.messages.len(),
                wanted.messages.len()
            ),
        }
    }
}

#[async_trait]
impl LanguageModel for Replay {
    fn name(&self) -> &str {
        &self.name
    }

    fn sampling(&self) -> Map<String, Value> {
        self.sampling.clone()
    }

    async fn respond(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let key = request_digest(self, &self.sampling, request);
        let served = self.queues.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&key).and_then(VecDeque::pop_front);
        match served {
            Some(mut response) => {
                response.cache_hit = true;
                response.attempts = 1;
                Ok(response)
            }
            None => {
                let canonical = canonical_request(self, request);
                let why = self.explain_miss(&canonical, &key);
                Err(ModelError::new("replay_miss", format!("no recorded response: {why}")))
            }
        }
    }
}

fn is_event_log(path: &Path) -> Result<bool, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("failed to open {}: {e}", path.display()))?;
    let mut first = String::new();
    BufReader::new(file).read_line(&mut first).map_err(|e| format!("failed to read {}: {e}", path.display()))?;
    let head: Value = serde_json::from_str(first.trim()).unwrap_or(Value::Null);
    Ok(head.get("run_id").is_some() && head.get("seq").is_some())
}

fn role(m: &Message) -> &'static str {
    match m {
        Message::System { .. } => "system",
        Message::User { .. } => "user",
        Message::Assistant { .. } => "assistant",
        Message::Tool { .. } => "tool",
    }
}

fn render(m: &Message) -> String {
    match m {
        Message::System { content } | Message::User { content } | Message::Tool { content, .. } => content.clone(),
        Message::Assistant { .. } => serde_json::to_string(m).unwrap_or_default(),
    }
}

/// Forty characters around where two texts part ways.
fn excerpt(text: &str, at: usize) -> String {
    let start = at.saturating_sub(20);
    let piece: String = text.chars().skip(start).take(40).collect();
    let lead = if start > 0 { "…" } else { "" };
    let tail = if text.chars().count() > start + 40 { "…" } else { "" };
    format!("{lead}{piece}{tail}")
}
