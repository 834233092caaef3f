//! Timeout triggers. Every source turns "look at order O, phase P" into a
//! [`crate::dispatch::Trigger`] for the one dispatcher.
//!
//! - [`outbox`]: the outbox timer over `order_timeout_msg`, sleeping until the next due row;
//! - [`sweep`]: the backstop that re-arms overdue open orders whose triggers were lost.

pub mod outbox;
pub mod sweep;

use std::time::Duration;

use tokio::sync::watch;

/// Sleeps `d`, or returns early (true) when shutdown is signalled.
pub(crate) async fn sleep_or_shutdown(d: Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    if *shutdown.borrow() {
        return true;
    }
    tokio::select! {
        _ = tokio::time::sleep(d) => *shutdown.borrow(),
        _ = shutdown.changed() => true,
    }
}
