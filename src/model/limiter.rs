//! A per-model limit on requests in flight that adapts to the provider: halve when it is
//! overloaded (a 429, a 503, a request that timed out), grow back by one after a window of
//! successes (AIMD), never above the configured limit. A local server with one slot that is
//! sent eight requests at once times them all out; halving lets it catch up.
//!
//! Also the episode's [`Deadline`]: time an episode spends queued for one of these slots is
//! runner's doing, not the agent's, so the deadline moves later by it.

use std::sync::{Arc, Mutex};
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

    /// A sign of overload (a rate limit, a 503, a timeout): halve the limit, once per
    /// second at most, so that a burst of failures from requests sent together counts once.
    pub fn overloaded(&self) {
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

/// When an episode's time runs out: its start plus its time limit plus the time it spent
/// queued behind runner's own limit on requests in flight (while queued, the clock stands).
#[derive(Clone)]
pub struct Deadline(Arc<Clock>);

struct Clock {
    base: tokio::time::Instant,
    queue: Mutex<Queue>,
    resumed: Notify,
}

#[derive(Default)]
struct Queue {
    queued: Duration,
    /// Requests of the episode waiting for a slot now, and since when one has been.
    waiting: usize,
    since: Option<tokio::time::Instant>,
}

/// The episode's clock stands while this lives: a request waiting for a slot.
pub struct Paused<'a> {
    deadline: &'a Deadline,
}

impl std::fmt::Debug for Deadline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deadline").field("base", &self.0.base).field("queued", &self.queued()).finish()
    }
}

impl Deadline {
    /// A deadline `limit` from now.
    pub fn after(limit: Duration) -> Self {
        let base = tokio::time::Instant::now() + limit;
        Deadline(Arc::new(Clock { base, queue: Mutex::new(Queue::default()), resumed: Notify::new() }))
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.0.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The time spent queued so far (a wait still going on included).
    pub fn queued(&self) -> Duration {
        let q = self.queue();
        q.queued + q.since.map_or(Duration::ZERO, |since| since.elapsed())
    }

    /// When the time runs out, as things stand now.
    pub fn at(&self) -> tokio::time::Instant {
        self.0.base + self.queued()
    }

    /// Stops the clock until the returned guard is dropped.
    pub fn pause(&self) -> Paused<'_> {
        let mut q = self.queue();
        q.waiting += 1;
        if q.since.is_none() {
            q.since = Some(tokio::time::Instant::now());
        }
        Paused { deadline: self }
    }

    /// Whether `passed(grace)` would end at once: no request is waiting for a slot, and the
    /// time is past `grace` after the deadline.
    pub fn is_passed(&self, grace: Duration) -> bool {
        let q = self.queue();
        q.waiting == 0 && tokio::time::Instant::now() >= self.0.base + q.queued + grace
    }

    /// Waits until `grace` after the deadline, however far waiting for slots moves it.
    pub async fn passed(&self, grace: Duration) {
        loop {
            let resumed = self.0.resumed.notified();
            let waiting = self.queue().waiting > 0;
            if waiting {
                resumed.await;
                continue;
            }
            let until = self.at() + grace;
            if tokio::time::Instant::now() >= until {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(until) => {}
                // A pause that starts and ends during the sleep moves the deadline too.
                _ = resumed => {}
            }
        }
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        let mut q = self.deadline.queue();
        q.waiting -= 1;
        if q.waiting == 0
            && let Some(since) = q.since.take()
        {
            q.queued += since.elapsed();
            drop(q);
            self.deadline.0.resumed.notify_waiters();
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
        l.overloaded();
        assert_eq!(l.limit(), 4);
        l.overloaded(); // within a second of the last cut: the same burst
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
    async fn a_deadline_stands_still_while_a_request_waits_for_a_slot() {
        let deadline = Deadline::after(Duration::from_millis(200));
        let first = deadline.at();
        let pause = deadline.pause();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let waiter = {
            let deadline = deadline.clone();
            tokio::spawn(async move { deadline.passed(Duration::ZERO).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished(), "the deadline passed while the episode was queued");
        drop(pause);
        assert!(deadline.at() >= first + Duration::from_millis(600), "the wait did not move the deadline");
        tokio::time::timeout(Duration::from_secs(10), waiter).await.unwrap().unwrap();
        assert!(tokio::time::Instant::now() >= first + Duration::from_millis(600), "passed before the moved deadline");
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
