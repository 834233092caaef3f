//! Per-key request caps for calls to the payment provider: `rate` requests a second per key (a
//! merchant), bursts of up to `rate`, timed by the caller's clock (the database's, or a manual one
//! in tests), never by the host's.
//!
//! The rule is the generic cell rate algorithm (GCRA; ATM Forum, *Traffic Management
//! Specification 4.0*, 1996), which is a token bucket of capacity `rate` refilled at `rate` a
//! second, kept as one number per key: the theoretical arrival time (`tat`) of the next
//! request. Two uses:
//! - [`RateCap::take`]: a request now, or none (status queries: one over the cap is not made);
//! - [`RateCap::reserve`]: the earliest instant a request may be made, booking that slot
//!   (close-payment and refunds: one over the cap runs later, at its slot, in order).

use std::collections::HashMap;
use std::sync::Mutex;

/// Requests a second per key, with bursts of up to the same number.
#[derive(Debug)]
pub struct RateCap {
    /// Milliseconds between two requests at the sustained rate (1000 / rate).
    interval_ms: f64,
    /// How far ahead of now `tat` may run and still admit a request now: (burst − 1) × interval.
    tolerance_ms: f64,
    tat: Mutex<HashMap<String, f64>>,
}

impl RateCap {
    /// A cap of `per_second` requests a second per key (0 is taken as 1).
    pub fn new(per_second: u32) -> Self {
        let rate = f64::from(per_second.max(1));
        let interval_ms = 1000.0 / rate;
        RateCap {
            interval_ms,
            tolerance_ms: (rate - 1.0) * interval_ms,
            tat: Mutex::default(),
        }
    }

    /// Takes one request of `key`'s budget at `now_ms`; false (nothing taken) when it is spent.
    pub fn take(&self, key: &str, now_ms: i64) -> bool {
        let now = now_ms as f64;
        let mut tats = self.tat.lock().expect("rate cap lock poisoned");
        let tat = tats.get(key).copied().unwrap_or(now).max(now);
        if tat - now > self.tolerance_ms {
            return false;
        }
        tats.insert(key.to_string(), tat + self.interval_ms);
        true
    }

    /// Books `key`'s next request slot at or after `now_ms` and returns it (epoch ms): `now_ms`
    /// itself while the budget lasts, later ones spaced by the sustained rate after that. A
    /// booked slot is spent whether or not the request is made.
    pub fn reserve(&self, key: &str, now_ms: i64) -> i64 {
        let now = now_ms as f64;
        let mut tats = self.tat.lock().expect("rate cap lock poisoned");
        let tat = tats.get(key).copied().unwrap_or(now).max(now);
        tats.insert(key.to_string(), tat + self.interval_ms);
        (tat - self.tolerance_ms).max(now).ceil() as i64
    }
}

#[cfg(test)]
mod tests {
    use super::RateCap;

    #[test]
    fn take_admits_a_burst_then_the_sustained_rate() {
        let cap = RateCap::new(4);
        let admitted = (0..10).filter(|_| cap.take("m", 1_000)).count();
        assert_eq!(admitted, 4, "a burst of the rate");
        assert!(
            !cap.take("m", 1_100),
            "nothing refilled after 100 ms at 4/s"
        );
        assert!(cap.take("m", 1_250), "one refilled after 250 ms");
        assert!(cap.take("other", 1_250), "each key has its own budget");
    }

    #[test]
    fn reserve_books_the_burst_now_and_spaces_the_rest() {
        let cap = RateCap::new(4);
        let slots: Vec<i64> = (0..8).map(|_| cap.reserve("m", 1_000)).collect();
        assert_eq!(
            slots,
            [1_000, 1_000, 1_000, 1_000, 1_250, 1_500, 1_750, 2_000]
        );
        assert_eq!(
            cap.reserve("m", 5_000),
            5_000,
            "idle long enough: now again"
        );
        let taken = (0..4).filter(|_| cap.take("m", 5_000)).count();
        assert_eq!(taken, 3, "take and reserve share one budget");
    }
}
