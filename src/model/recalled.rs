//! A grader's answers recalled from an earlier run: when an episode of that run is scored
//! again (`eval --since` regrading it), each grader request it made then, asked again
//! unchanged, is answered from its log instead of by the grader; a request that changed
//! (another rubric, another answer to judge, another grader) goes to the grader.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use serde_json::{Map, Value};

use super::{LanguageModel, ModelError, ModelRequest, ModelResponse, request_digest};
use crate::log::reader::for_each_event_of;
use crate::log::{Event, LoggedEvent};

/// The answered grader calls of some episodes of a run, by episode and request digest, in
/// the order they were made.
#[derive(Default)]
pub struct Recalled {
    calls: Mutex<HashMap<(String, String), VecDeque<ModelResponse>>>,
    served: AtomicU64,
}

impl Recalled {
    /// The grader calls the log at `events` recorded for `episodes` that were answered.
    pub fn of_log(events: &Path, episodes: &HashSet<&str>) -> Result<Recalled, String> {
        let mut calls: HashMap<(String, String), VecDeque<ModelResponse>> = HashMap::new();
        for_each_event_of(events, Some(&["model_call"]), |e: LoggedEvent| {
            let Some(episode) = e.episode_id.clone().filter(|id| episodes.contains(id.as_str())) else { return };
            let Some(Event::ModelCall { request_digest, response, error: None, scorer: Some(_), .. }) = e.event()
            else {
                return;
            };
            if let Ok(response) = serde_json::from_value::<ModelResponse>(response) {
                calls.entry((episode, request_digest)).or_default().push_back(response);
            }
        })
        .map_err(|e| e.to_string())?;
        Ok(Recalled { calls: Mutex::new(calls), served: AtomicU64::new(0) })
    }

    /// `grader` for the episode `from` of the earlier run, answering from what it recorded.
    pub fn grader(self: &Arc<Self>, from: &str, grader: Arc<dyn LanguageModel>) -> Arc<dyn LanguageModel> {
        Arc::new(Recalling { recalled: self.clone(), from: from.to_owned(), grader })
    }

    /// How many requests were answered from the log.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Relaxed)
    }

    fn take(&self, from: &str, digest: &str) -> Option<ModelResponse> {
        let mut calls = self.calls.lock().unwrap_or_else(PoisonError::into_inner);
        let response = calls.get_mut(&(from.to_owned(), digest.to_owned()))?.pop_front()?;
        self.served.fetch_add(1, Ordering::Relaxed);
        Some(response)
    }
}

/// A grader that answers first from an earlier run's log.
struct Recalling {
    recalled: Arc<Recalled>,
    from: String,
    grader: Arc<dyn LanguageModel>,
}

#[async_trait]
impl LanguageModel for Recalling {
    fn name(&self) -> &str {
        self.grader.name()
    }

    fn endpoint(&self) -> Option<&str> {
        self.grader.endpoint()
    }

    fn sampling(&self) -> Map<String, Value> {
        self.grader.sampling()
    }

    async fn respond(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        // Keyed as the call's `model_call` event keys it.
        let digest = request_digest(self.grader.as_ref(), &self.grader.sampling(), request);
        match self.recalled.take(&self.from, &digest) {
            Some(mut response) => {
                response.cache_hit = true;
                response.attempts = 1;
                response.cost_usd = Some(0.0);
                Ok(response)
            }
            None => self.grader.respond(request).await,
        }
    }
}
