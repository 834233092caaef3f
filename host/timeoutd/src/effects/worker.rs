//! The ledger executor as a worker of its own: woken by the commits that record external
//! effects, so a trigger's work ends at its commit and a slow webhook never holds an outbox
//! permit or a broker acknowledgement; and every [`BACKLOG_INTERVAL`] (or sooner, when a row was deferred to a booked slot) for retries and rows a
//! dead daemon left behind.
//!
//! One loop per section (notices, Redis, payments), side by side, each claiming only its own
//! kinds: a peer that hangs — a Redis that accepts and never answers, a provider at its
//! timeout — holds up its own section's rows and never another's (the buyer's notices went
//! out seconds late behind a hung Redis before). Within a section an order's rows still run in
//! ledger order.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};

use super::EffectRunner;

/// How often the backlog (retries whose time has come, rows left by a crash) is looked at when
/// no commit wakes the worker.
pub const BACKLOG_INTERVAL: Duration = Duration::from_secs(5);

/// Runs the executor until `shutdown`: the backlog once at start (rows older than
/// [`BACKLOG_INTERVAL`], which another daemon is not about to run), then every runnable row
/// each time `wake` is notified or the interval passes. Once `shutdown` is signalled the chunk
/// in hand is finished and the rest is left PENDING ([`EffectRunner::run_fresh_until`]).
pub async fn run(runner: EffectRunner, wake: Arc<Notify>, shutdown: watch::Receiver<bool>) {
    let sections = runner.sections();
    let wakes: Vec<Arc<Notify>> = sections.iter().map(|_| Arc::new(Notify::new())).collect();
    let loops = sections.iter().zip(&wakes).map(|(section, own)| {
        run_section(
            runner.only(*section, wake.clone()),
            own.clone(),
            shutdown.clone(),
        )
    });
    // A commit's wake reaches every section's loop.
    let mut stop = shutdown.clone();
    let fan_out = async {
        loop {
            tokio::select! {
                _ = wake.notified() => wakes.iter().for_each(|w| w.notify_one()),
                _ = crate::shutdown::stopping(&mut stop) => break,
            }
        }
    };
    tokio::join!(fan_out, futures_util::future::join_all(loops));
}

/// One section's loop ([`run`]).
async fn run_section(runner: EffectRunner, wake: Arc<Notify>, mut shutdown: watch::Receiver<bool>) {
    if let Err(e) = runner
        .run_backlog(BACKLOG_INTERVAL.as_millis() as i64)
        .await
    {
        tracing::warn!(error = %e, "ledger backlog run failed");
    }
    let mut ran_at = std::time::Instant::now();
    loop {
        // Rows deferred to a booked slot (the provider's request cap) wake the worker at their
        // slot, no sooner than every 50 ms so that a slow drain is taken in chunks.
        let nap = runner.next_deferred(ran_at).map_or(BACKLOG_INTERVAL, |at| {
            at.saturating_duration_since(std::time::Instant::now())
                .clamp(Duration::from_millis(50), BACKLOG_INTERVAL)
        });
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep(nap) => {}
            _ = crate::shutdown::stopping(&mut shutdown) => break,
        }
        ran_at = std::time::Instant::now();
        if let Err(e) = runner.run_fresh_until(Some(&shutdown)).await {
            tracing::warn!(error = %e, "ledger executor run failed; retrying at the next wake");
        }
    }
}
