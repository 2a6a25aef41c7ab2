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
/// for the latency `--mock-delay-ms` stands in for when scheduling is measured. Each sleep
/// is a `timerfd` armed for its deadline and watched by the runtime's reactor, so the
/// thread that waits for it is the one woken, as for a model's answer on a socket: no
/// thread of its own hands the wake-up on (which cost each call two more context switches).
mod timer {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::time::{Duration, Instant};

    use tokio::io::Interest;
    use tokio::io::unix::AsyncFd;

    /// A timer descriptor that becomes readable once `duration` has passed.
    fn armed(duration: Duration) -> std::io::Result<OwnedFd> {
        // SAFETY: timerfd_create makes a new descriptor, owned from here on.
        let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // A zero expiry would disarm the timer: the shortest sleep is a nanosecond.
        let nanos = duration.as_nanos().max(1);
        let value = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec {
                tv_sec: (nanos / 1_000_000_000) as libc::time_t,
                tv_nsec: (nanos % 1_000_000_000) as libc::c_long,
            },
        };
        // SAFETY: the descriptor is a timer, and `value` lives through the call.
        if unsafe { libc::timerfd_settime(fd.as_raw_fd(), 0, &value, std::ptr::null_mut()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(fd)
    }

    pub async fn sleep(duration: Duration) {
        let deadline = Instant::now() + duration;
        let watched = armed(duration).and_then(|fd| {
            // SAFETY: an `OwnedFd` keeps its one descriptor open until the `AsyncFd` drops it.
            unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(|e| e.into_parts().1)
        });
        match watched {
            Ok(timer) => {
                // Readable once expired: the readiness is all that is needed, the count is not read.
                let _ = timer.readable().await;
            }
            // No timer descriptor: tokio's coarser sleep still waits.
            Err(_) => tokio::time::sleep_until(deadline.into()).await,
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
