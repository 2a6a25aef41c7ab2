//! The `mock` backend: plays a task's scripted `mock:` turns in order. One instance per
//! episode, so concurrency cannot reorder a script.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;

use super::{LanguageModel, Message, ModelError, ModelRequest, ModelResponse, ProposedCall};
use crate::domain::MockTurn;
use crate::log::{UnscoredCause, Usage};

pub struct MockModel {
    turns: Arc<[MockTurn]>,
    next: AtomicUsize,
    /// Each call waits between these many milliseconds, to measure scheduling offline.
    delay_ms: Option<(u64, u64)>,
}

impl MockModel {
    pub fn new(turns: Arc<[MockTurn]>) -> Self {
        MockModel { turns, next: AtomicUsize::new(0), delay_ms: None }
    }

    pub fn with_delay(mut self, delay_ms: Option<(u64, u64)>) -> Self {
        self.delay_ms = delay_ms;
        self
    }
}

/// `20` (always 20 ms) or `10-30` (uniformly between).
pub fn parse_delay(text: &str) -> Result<(u64, u64), String> {
    let bad = || format!("a mock delay is milliseconds, `20` or `10-30`, not `{text}`");
    let (low, high) = match text.split_once('-') {
        Some((a, b)) => (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?),
        None => {
            let ms = text.trim().parse().map_err(|_| bad())?;
            (ms, ms)
        }
    };
    if low > high || high > 3_600_000 {
        return Err(bad());
    }
    Ok((low, high))
}

/// A sleep that ends within tens of microseconds of its deadline. Tokio's timer works in
/// whole milliseconds and rounds up, which adds up to 5% to a 20 ms mock call: too coarse
/// for the latency `--mock-delay-ms` stands in for when scheduling is measured. One thread
/// waits on a condition variable until the earliest deadline and wakes the sleepers due.
mod timer {
    use std::collections::BinaryHeap;
    use std::sync::{Condvar, Mutex, OnceLock};
    use std::time::{Duration, Instant};

    use tokio::sync::oneshot;

    struct Due(Instant, oneshot::Sender<()>);

    impl PartialEq for Due {
        fn eq(&self, other: &Self) -> bool {
            self.0 == other.0
        }
    }
    impl Eq for Due {}
    impl PartialOrd for Due {
        fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for Due {
        /// The earliest deadline is the greatest: `BinaryHeap` pops it first.
        fn cmp(&self, other: &Self) -> std::cmp::Ordering {
            other.0.cmp(&self.0)
        }
    }

    struct Timer {
        due: Mutex<BinaryHeap<Due>>,
        changed: Condvar,
    }

    fn timer() -> Option<&'static Timer> {
        static TIMER: OnceLock<Option<&'static Timer>> = OnceLock::new();
        *TIMER.get_or_init(|| {
            let timer: &'static Timer =
                Box::leak(Box::new(Timer { due: Mutex::new(BinaryHeap::new()), changed: Condvar::new() }));
            let spawned = std::thread::Builder::new().name("mock-timer".into()).spawn(move || run(timer));
            spawned.is_ok().then_some(timer)
        })
    }

    fn run(timer: &Timer) {
        let Ok(mut due) = timer.due.lock() else { return };
        loop {
            let now = Instant::now();
            while due.peek().is_some_and(|d| d.0 <= now) {
                if let Some(Due(_, wake)) = due.pop() {
                    let _ = wake.send(());
                }
            }
            let wait = due.peek().map(|d| d.0 - now);
            due = match wait {
                Some(wait) => match timer.changed.wait_timeout(due, wait) {
                    Ok((guard, _)) => guard,
                    Err(_) => return,
                },
                None => match timer.changed.wait(due) {
                    Ok(guard) => guard,
                    Err(_) => return,
                },
            };
        }
    }

    pub async fn sleep(duration: Duration) {
        let deadline = Instant::now() + duration;
        let (wake, woken) = oneshot::channel();
        let queued = timer().and_then(|t| {
            let mut due = t.due.lock().ok()?;
            let earliest = due.peek().is_none_or(|d| deadline < d.0);
            due.push(Due(deadline, wake));
            if earliest {
                t.changed.notify_one();
            }
            Some(())
        });
        match queued {
            Some(()) => {
                let _ = woken.await;
            }
            // No timer thread: tokio's coarser sleep still waits.
            None => tokio::time::sleep_until(deadline.into()).await,
        }
    }

    #[cfg(test)]
    mod tests {
        #[tokio::test]
        async fn a_sleep_waits_at_least_its_duration_and_sleepers_wake_in_deadline_order() {
            let start = std::time::Instant::now();
            let (a, b) = tokio::join!(
                async {
                    super::sleep(std::time::Duration::from_millis(30)).await;
                    std::time::Instant::now()
                },
                async {
                    super::sleep(std::time::Duration::from_millis(10)).await;
                    std::time::Instant::now()
                }
            );
            assert!(b < a, "the shorter sleep ends first");
            assert!(b - start >= std::time::Duration::from_millis(10));
            assert!(a - start >= std::time::Duration::from_millis(30));
        }
    }
}

#[async_trait]
impl LanguageModel for MockModel {
    fn name(&self) -> &str {
        "mock"
    }

    async fn respond(&self, request: &ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        if let Some((low, high)) = self.delay_ms {
            let ms = if high > low { fastrand::u64(low..=high) } else { low };
            timer::sleep(std::time::Duration::from_millis(ms)).await;
        }
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let Some(turn) = self.turns.get(n) else {
            return Err(ModelError::new(
                UnscoredCause::MockExhausted,
                format!("the task's mock script has {} turns and the agent asked for turn {}", self.turns.len(), n + 1),
            ));
        };
        let text = turn.text.as_ref().map(|t| t.0.clone());
        let tool_calls: Vec<ProposedCall> = turn
            .tool_calls
            .iter()
            .map(|c| ProposedCall { id: c.id.clone(), name: c.name.clone(), arguments: c.arguments.clone() })
            .collect();
        let output_chars = text.as_ref().map_or(0, |t| t.len())
            + tool_calls.iter().map(|c| c.name.len() + c.arguments.to_string().len()).sum::<usize>();
        let usage = Usage {
            input_tokens: estimate_tokens(request.messages),
            output_tokens: (output_chars / 4) as u64,
            cached_tokens: 0,
        };
        let finish_reason = Some(if tool_calls.is_empty() { "stop" } else { "tool_calls" }.to_owned());
        Ok(ModelResponse { text, tool_calls, usage, finish_reason, attempts: 1, ..ModelResponse::default() })
    }
}

/// About four characters a token: enough for token limits to mean something offline.
fn estimate_tokens(messages: &[Message]) -> u64 {
    let chars: usize = messages
        .iter()
        .map(|m| match m {
            Message::System { content } | Message::User { content } => content.len(),
            Message::Assistant { content, tool_calls } => {
                content.as_ref().map_or(0, |c| c.len()) + tool_calls.iter().map(|c| c.name.len() + 16).sum::<usize>()
            }
            Message::Tool { content, .. } => content.len(),
        })
        .sum();
    (chars / 4) as u64
}

#[cfg(test)]
mod tests {
    use super::parse_delay;

    #[test]
    fn delays_are_fixed_or_a_range() {
        assert_eq!(parse_delay("20"), Ok((20, 20)));
        assert_eq!(parse_delay("10-30"), Ok((10, 30)));
        assert!(parse_delay("30-10").is_err());
        assert!(parse_delay("soon").is_err());
    }
}
