//! A circuit breaker per merchant plugin: after `trip_after` failed decisions in a row (traps,
//! policy errors, oversized answers) the plugin is not called for `trip_for`; its triggers wait
//! instead of spinning through retries. The next decision after that is a trial: success closes
//! the breaker, failure opens it again.

use std::sync::Mutex;

/// Whether calls go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BreakerState {
    /// Calls go through.
    Closed,
    /// Calls wait until the trip ends.
    Open,
}

#[derive(Debug, Default)]
struct Inner {
    failures: u32,
    open_until_ms: i64,
}

/// One merchant's breaker.
#[derive(Debug)]
pub struct Breaker {
    trip_after: u32,
    trip_for_ms: i64,
    inner: Mutex<Inner>,
}

impl Breaker {
    /// Trips after `trip_after` failures in a row, for `trip_for_ms`.
    pub fn new(trip_after: u32, trip_for_ms: i64) -> Self {
        Breaker {
            trip_after: trip_after.max(1),
            trip_for_ms,
            inner: Mutex::default(),
        }
    }

    /// The state at `now_ms`.
    pub fn state(&self, now_ms: i64) -> BreakerState {
        if now_ms < self.inner.lock().expect("breaker lock").open_until_ms {
            BreakerState::Open
        } else {
            BreakerState::Closed
        }
    }

    /// When the current trip ends (epoch ms), if open at `now_ms`.
    pub fn open_until(&self, now_ms: i64) -> Option<i64> {
        let until = self.inner.lock().expect("breaker lock").open_until_ms;
        (now_ms < until).then_some(until)
    }

    /// Records a decision; returns true when this failure tripped the breaker.
    pub fn record(&self, ok: bool, now_ms: i64) -> bool {
        let mut inner = self.inner.lock().expect("breaker lock");
        if ok {
            inner.failures = 0;
            return false;
        }
        inner.failures += 1;
        if inner.failures >= self.trip_after {
            inner.failures = 0;
            inner.open_until_ms = now_ms + self.trip_for_ms;
            return true;
        }
        false
    }

    /// How long it stays open once tripped, ms (`runtime.trip_for`).
    pub fn trip_for_ms(&self) -> i64 {
        self.trip_for_ms
    }

    /// Closes the breaker (a new plugin version was loaded).
    pub fn reset(&self) {
        *self.inner.lock().expect("breaker lock") = Inner::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trips_after_consecutive_failures_and_closes_after_the_trip() {
        let b = Breaker::new(3, 1_000);
        assert!(!b.record(false, 0));
        assert!(!b.record(true, 1), "a success resets the count");
        assert!(!b.record(false, 2));
        assert!(!b.record(false, 3));
        assert!(b.record(false, 4));
        assert_eq!(b.state(500), BreakerState::Open);
        assert_eq!(b.open_until(500), Some(1_004));
        assert_eq!(b.state(1_004), BreakerState::Closed);
    }

    #[test]
    fn a_trip_ends_at_its_end_and_a_reset_ends_it_at_once() {
        let b = Breaker::new(1, 1_000);
        assert!(b.record(false, 0));
        assert_eq!(
            (b.open_until(999), b.open_until(1_000)),
            (Some(1_000), None)
        );
        assert!(b.record(false, 2_000));
        b.reset();
        assert_eq!(
            (b.state(2_001), b.open_until(2_001)),
            (BreakerState::Closed, None)
        );
    }
}
