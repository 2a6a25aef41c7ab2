//! A local response cache (`--cache`): re-runs of unchanged prompts are served from disk
//! until the entries expire. One file per request digest; a request asked again by the
//! same episode (a grader's samples) has its own file per repetition, so that the samples
//! stay as many answers as the model gave.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use serde_json::{Map, Value};
use sha2::Digest;

use super::{LanguageModel, ModelError, ModelRequest, ModelResponse, request_digest};

#[derive(Debug, Clone)]
pub struct CacheOptions {
    pub dir: PathBuf,
    pub ttl: Duration,
}

impl CacheOptions {
    /// `$XDG_CACHE_HOME/runner/responses`, else `~/.cache/runner/responses`.
    pub fn default_dir() -> PathBuf {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(|| PathBuf::from(".cache"));
        base.join("runner").join("responses")
    }
}

/// One episode's model (or its grader's) behind the cache.
pub struct Cached {
    inner: Arc<dyn LanguageModel>,
    options: Arc<CacheOptions>,
    /// How many times this episode has asked each request.
    asked: Mutex<HashMap<String, u32>>,
    /// The episode's epoch, when its entries are its own (not shared by the epochs).
    epoch: Option<u32>,
}

impl Cached {
    pub fn new(inner: Arc<dyn LanguageModel>, options: Arc<CacheOptions>) -> Self {
        Cached { inner, options, asked: Mutex::new(HashMap::new()), epoch: None }
    }

    /// Keys the entries by `epoch` too. Epoch 1 keeps the keys entries had before epochs
    /// were part of them, so an older cache still serves a run's first epoch.
    pub fn in_epoch(mut self, epoch: Option<u32>) -> Self {
        self.epoch = epoch;
        self
    }

    fn lookup(&self, path: &std::path::Path) -> Option<ModelResponse> {
        let age =
            std::fs::metadata(path).ok()?.modified().ok().and_then(|t| SystemTime::now().duration_since(t).ok())?;
        if age > self.options.ttl {
            return None;
        }
        serde_json::from_slice(&std::fs::read(path).ok()?).ok()
    }
}

#[async_trait]
impl LanguageModel for Cached {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn sampling(&self) -> Map<String, Value> {
        self.inner.sampling()
    }

    fn endpoint(&self) -> Option<&str> {
        self.inner.endpoint()
    }

    async fn respond(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let digest = request_digest(self, &self.sampling(), request);
        let repeat = {
            let mut asked = self.asked.lock().unwrap_or_else(|p| p.into_inner());
            let n = asked.entry(digest.clone()).or_default();
            *n += 1;
            *n - 1
        };
        // The first asking keeps the key entries always had.
        let key = match (self.inner.endpoint(), repeat) {
            (None, 0) => digest,
            (Some(endpoint), 0) => hex::encode(sha2::Sha256::digest(format!("{digest}\n{endpoint}").as_bytes())),
            (endpoint, n) => hex::encode(sha2::Sha256::digest(
                format!("{digest}\n{}\n#{n}", endpoint.unwrap_or_default()).as_bytes(),
            )),
        };
        let key = match self.epoch {
            Some(epoch) if epoch > 1 => hex::encode(sha2::Sha256::digest(format!("{key}\nepoch {epoch}").as_bytes())),
            _ => key,
        };
        let path = self.options.dir.join(format!("{key}.json"));
        if let Some(hit) = self.lookup(&path) {
            let mut hit = request.run_own.restored(&hit);
            hit.cache_hit = true;
            hit.attempts = 1;
            hit.cost_usd = Some(0.0);
            return Ok(hit);
        }
        let response = self.inner.respond(request).await?;
        // A cache that cannot be written only costs speed; the answer stands.
        if std::fs::create_dir_all(&self.options.dir).is_ok()
            && let Ok(bytes) = serde_json::to_vec(&request.run_own.normalised(&response.recorded()))
        {
            let tmp = path.with_extension(format!("tmp{}", fastrand::u64(..)));
            if std::fs::write(&tmp, crate::log::secrets::scrub_bytes(&bytes)).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        }
        Ok(response)
    }
}
