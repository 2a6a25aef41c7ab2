//! A per-model limit on requests in flight that adapts to 429s: halve on a rate limit,
//! grow back by one after a window of successes (AIMD), never above the configured limit.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

pub struct Limiter {
    max: usize,
    state: Mutex<State>,
    freed: Notify,
}

struct State {
    limit: usize,
    in_flight: usize,
    successes: usize,
    last_cut: Option<Instant>,
}

/// A slot; freed when dropped.
pub struct Slot<'a> {
    limiter: &'a Limiter,
}

impl Limiter {
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        Limiter {
            max,
            state: Mutex::new(State { limit: max, in_flight: 0, successes: 0, last_cut: None }),
            freed: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub async fn acquire(&self) -> Slot<'_> {
        loop {
            let notified = self.freed.notified();
            {
                let mut s = self.state();
                if s.in_flight < s.limit {
                    s.in_flight += 1;
                    return Slot { limiter: self };
                }
            }
            notified.await;
        }
    }

    /// The current limit.
    pub fn limit(&self) -> usize {
        self.state().limit
    }

    /// A rate limit: halve the limit, once per second at most, so that a burst of 429s
    /// from requests sent together counts once.
    pub fn rate_limited(&self) {
        let mut s = self.state();
        let now = Instant::now();
        if s.last_cut.is_none_or(|t| now.duration_since(t) > Duration::from_secs(1)) {
            s.limit = (s.limit / 2).max(1);
            s.successes = 0;
            s.last_cut = Some(now);
        }
    }

    /// A success: after `limit` successes in a row, allow one more in flight.
    pub fn succeeded(&self) {
        let grew = {
            let mut s = self.state();
            s.successes += 1;
            if s.limit < self.max && s.successes >= s.limit {
                s.limit += 1;
                s.successes = 0;
                true
            } else {
                false
            }
        };
        if grew {
            self.freed.notify_one();
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.limiter.state().in_flight -= 1;
        self.limiter.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halves_on_rate_limit_and_recovers_with_successes() {
        let l = Limiter::new(8);
        l.rate_limited();
        assert_eq!(l.limit(), 4);
        l.rate_limited(); // within a second of the last cut: the same burst
        assert_eq!(l.limit(), 4);
        for _ in 0..4 {
            l.succeeded();
        }
        assert_eq!(l.limit(), 5);
        for _ in 0..100 {
            l.succeeded();
        }
        assert_eq!(l.limit(), 8, "never above the configured limit");
    }

    #[tokio::test]
    async fn never_lets_more_than_the_limit_in_flight() {
        let l = std::sync::Arc::new(Limiter::new(2));
        let a = l.acquire().await;
        let _b = l.acquire().await;
        let l2 = l.clone();
        let third = tokio::spawn(async move {
            let _c = l2.acquire().await;
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!third.is_finished(), "a third request got in with a limit of 2");
        drop(a);
        tokio::time::timeout(Duration::from_secs(5), third).await.unwrap().unwrap();
    }
}
