//! Holding a claim while the work it covers runs: rows are claimed under a lease
//! (`claim_until_ms`) so that a dead holder's rows come back; a live holder renews the lease
//! while it works, so a slow endpoint or a row lock held by another program never lets a
//! second holder take the same rows. Completions are fenced by the claim token as well
//! (`db::outbox::RowRef`, `db::ledger::settle`), for a holder that stalled past its lease anyway.

use std::future::Future;
use std::time::Duration;

/// How often a lease of `lease` is renewed: every third of it (at least every 10 ms).
pub fn renew_every(lease: Duration) -> Duration {
    (lease / 3).max(Duration::from_millis(10))
}

/// Runs `work`, calling `renew` every [`renew_every`]`(lease)` until it is done, and returns
/// its output. The renewal is polled beside the work, never instead of it: a renewal waiting
/// for something the work holds (SQLite's write gate, a row the work's transaction has
/// locked) waits while the work goes on and lets go. `renew` logs its own failures: a renewal
/// that fails leaves the lease to lapse, and the fence refuses the late completion.
pub async fn renewing<T, R, Fut>(work: impl Future<Output = T>, lease: Duration, renew: R) -> T
where
    R: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    let every = renew_every(lease);
    let renewer = async {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            renew().await;
        }
    };
    tokio::pin!(work);
    tokio::pin!(renewer);
    tokio::select! {
        out = &mut work => out,
        never = &mut renewer => never,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    /// The work holds a lock the renewal needs across a tick: the renewal waits beside the work
    /// instead of freezing it, and runs once the work lets go.
    #[tokio::test]
    async fn a_renewal_waiting_for_the_works_lock_does_not_freeze_the_work() {
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        let renewals = Arc::new(AtomicU32::new(0));
        let work = {
            let gate = gate.clone();
            async move {
                let held = gate.lock().await;
                tokio::time::sleep(Duration::from_millis(150)).await;
                drop(held);
                tokio::time::sleep(Duration::from_millis(100)).await;
                "done"
            }
        };
        let renew = || {
            let (gate, renewals) = (gate.clone(), renewals.clone());
            async move {
                let _g = gate.lock().await;
                renewals.fetch_add(1, Ordering::SeqCst);
            }
        };
        let out = tokio::time::timeout(
            Duration::from_secs(5),
            super::renewing(work, Duration::from_millis(90), renew),
        )
        .await
        .expect("the work finished instead of freezing behind the renewal");
        assert_eq!(out, "done");
        assert!(
            renewals.load(Ordering::SeqCst) >= 1,
            "and the renewal ran once the lock was free"
        );
    }
}
