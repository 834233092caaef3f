//! Waiting in the daemon's loops: the one place that decides what a closed channel means.
//!
//! Every loop that waits on a `watch` either stops (the shutdown flag) or keeps going (any
//! other knob). A `watch::Receiver::changed` whose sender is gone returns `Err` at once, every
//! time; a loop that only ignores the result spins a core (the sweep did, in every config
//! without `[admin]`). So:
//! - the shutdown flag's sender being gone *is* a shutdown ([`stopping`], [`sleep_or_shutdown`]);
//! - any other `watch` whose sender is gone can never change again ([`changed_or_never`]).

use std::time::Duration;

/// How long a stopping daemon lets work in flight finish — a batch's transaction, the effect
/// chunk in hand, HTTP requests being answered — before it abandons what is left and says what
/// (`crate::daemon::Daemon::stop`). With the pool's close and the runtime's own this keeps a
/// SIGTERM's stop within 5 s whatever hangs (a webhook or alert receiver that never answers, a
/// statement waiting on a lock): systemd's `TimeoutStopSec` (90 s) or Kubernetes'
/// `terminationGracePeriodSeconds` (30 s) never has to SIGKILL it. Nothing is lost by
/// abandoning: an aborted transaction rolls back and whatever was claimed comes back when its
/// lease lapses.
pub const DRAIN: Duration = Duration::from_millis(3_500);

/// How long the process waits, after the daemon stopped, for blocking work it cannot abort (a
/// plugin call ends at its own deadline) before it exits anyway.
pub const RUNTIME_EXIT: Duration = Duration::from_millis(500);

use tokio::sync::watch;

/// Resolves once shutdown is signalled: the flag turns true, or its sender is gone.
pub async fn stopping(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// Whether shutdown is signalled now (the flag is true, or its sender is gone).
pub fn is_stopping(shutdown: &watch::Receiver<bool>) -> bool {
    *shutdown.borrow() || shutdown.has_changed().is_err()
}

/// Sleeps `d`, or returns early (true) when shutdown is signalled; true also when it already was.
pub async fn sleep_or_shutdown(d: Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    if is_stopping(shutdown) {
        return true;
    }
    tokio::select! {
        _ = tokio::time::sleep(d) => is_stopping(shutdown),
        _ = stopping(shutdown) => true,
    }
}

/// Resolves on the next change of `rx`; never once its sender is gone (nothing can change it).
pub async fn changed_or_never<T>(rx: &mut watch::Receiver<T>) {
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_dropped_shutdown_sender_stops_and_a_dropped_knob_never_fires() {
        let (tx, mut rx) = watch::channel(false);
        let (knob_tx, mut knob) = watch::channel(1u32);
        drop(knob_tx);
        // A knob whose sender is gone never fires (a spinning loop would see it fire at once).
        tokio::select! {
            _ = changed_or_never(&mut knob) => panic!("a knob without a sender changed"),
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        assert!(!sleep_or_shutdown(Duration::from_millis(10), &mut rx).await);
        drop(tx);
        assert!(is_stopping(&rx));
        // The shutdown flag's sender gone is a shutdown: no hour-long sleep.
        let started = std::time::Instant::now();
        assert!(sleep_or_shutdown(Duration::from_secs(3600), &mut rx).await);
        stopping(&mut rx).await;
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
