//! The one backoff rule, used by the daemon's trigger retries, its ledger executor and HTTP
//! adapters, and by the plugin harness's timeline, which replays the daemon's retries; and the
//! daemon's default retry settings (`[dispatch]` `max_attempts`, `retry_initial`, `retry_max`),
//! kept here so the harness and the daemon can never disagree.

use std::time::Duration;

/// Default `dispatch.max_attempts`: a failing or ignoring trigger is tried this many times, then
/// dead-lettered.
pub const DISPATCH_MAX_ATTEMPTS: u32 = 8;

/// Default backoff of a retried trigger (`dispatch.retry_initial` 1 s, `dispatch.retry_max` 5 min).
pub const DISPATCH_BACKOFF: Backoff = Backoff {
    initial: Duration::from_secs(1),
    max: Duration::from_secs(300),
};

/// Exponential backoff without jitter (deterministic, so tests can name the next due time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay before the first retry.
    pub initial: Duration,
    /// Longest delay.
    pub max: Duration,
}

impl Backoff {
    /// Delay after `failures` failed attempts (1 = after the first): `initial · 2^(failures−1)`,
    /// at most `max`.
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(30);
        self.initial.saturating_mul(1u32 << doublings).min(self.max)
    }

    /// [`Backoff::delay`] in whole milliseconds.
    pub fn delay_ms(&self, failures: u32) -> i64 {
        i64::try_from(self.delay(failures).as_millis()).unwrap_or(i64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_initial_up_to_max() {
        let b = Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(5),
        };
        let delays: Vec<u64> = (1..=5).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 5, 5]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(5));
    }
}
