//! The events of the episodes being served, as the run's log emits them: kept per episode
//! while it runs (its answer carries them; `GET …/events` streams them), dropped when its
//! answer is made, so that memory stays flat however many episodes are served.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;
use tokio::sync::watch;

use crate::log::{Event, Subscriber};

/// One episode's events so far, and a signal of how many there are.
pub struct LiveEvents {
    events: Mutex<Vec<Arc<Value>>>,
    count: watch::Sender<usize>,
}

impl LiveEvents {
    /// The events from `from` on; and whether the episode has finished by the last of them.
    pub fn since(&self, from: usize) -> (Vec<Arc<Value>>, bool) {
        let events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        let new: Vec<Arc<Value>> = events.get(from..).unwrap_or_default().to_vec();
        let finished = events.last().is_some_and(|e| e["type"] == "episode_finished");
        (new, finished)
    }

    /// Waits for more than `seen` events.
    pub async fn changed(&self, seen: usize) {
        let mut count = self.count.subscribe();
        let _ = count.wait_for(|n| *n > seen).await;
    }

    pub fn all(&self) -> Vec<Arc<Value>> {
        self.events.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// The subscriber: episodes watched, by id.
#[derive(Default)]
pub struct Watch {
    live: HashMap<String, Arc<LiveEvents>>,
}

impl Watch {
    /// Starts keeping the events of `episode_id`.
    pub fn start(&mut self, episode_id: &str) -> Arc<LiveEvents> {
        let live = Arc::new(LiveEvents { events: Mutex::default(), count: watch::Sender::new(0) });
        self.live.insert(episode_id.to_owned(), live.clone());
        live
    }

    pub fn get(&self, episode_id: &str) -> Option<Arc<LiveEvents>> {
        self.live.get(episode_id).cloned()
    }

    /// Stops keeping them (those who hold the episode's `LiveEvents` still read what it has).
    pub fn stop(&mut self, episode_id: &str) {
        self.live.remove(episode_id);
    }
}

impl Subscriber for Watch {
    fn event(&mut self, episode_id: Option<&str>, event: &Event) {
        let Some(live) = episode_id.and_then(|id| self.live.get(id)) else { return };
        let value = Arc::new(serde_json::to_value(event).unwrap_or_default());
        let mut events = live.events.lock().unwrap_or_else(PoisonError::into_inner);
        events.push(value);
        live.count.send_replace(events.len());
    }
}
