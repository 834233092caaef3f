//! Holding a claim while the work it covers runs: rows are claimed under a lease
//! (`claim_until_ms`) so that a dead holder's rows come back; a live holder renews the lease
//! while it works, so a slow endpoint or a row lock held by another program never lets a
//! second holder take the same rows. Completions are fenced by the claim token as well
//! (`db::outbox::RowRef`, `db::ledger::settle`), for a holder that stalled past its lease anyway.

use std::future::Future;
use std::time::Duration;

/// Runs `work`, calling `renew` every `lease / 3` until it is done, and returns its output.
/// `renew` extends the holder's lease (it logs its own failures: a renewal that fails leaves
/// the lease to lapse, and the fence refuses the late completion).
pub async fn renewing<T, R, Fut>(work: impl Future<Output = T>, lease: Duration, renew: R) -> T
where
    R: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    let every = (lease / 3).max(Duration::from_millis(10));
    tokio::pin!(work);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = tick.tick() => renew().await,
        }
    }
}
