//! The outbox relay: publishes PENDING `order_timeout_msg` rows due later than
//! `rocketmq.relay_lead` as delay/timer messages and marks them SENT.
//!
//! The table stays the truth. A send that fails leaves the row PENDING with the error, counted,
//! and retried with backoff (F7); the outbox timer still closes the order on time. A SENT row
//! whose message never comes is taken back by the outbox timer `rocketmq.fallback_after` past
//! its due time (F1, F6). `wait` decisions' next phases are relayed the same way.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::watch;

use super::client::{Scheduled, Transport, TransportError};
use super::codec::TimeoutMessage;
use crate::clock::Clock;
use crate::db::outbox::DueRow;
use crate::db::{Db, relay};
use crate::events::{Event, emit};
use crate::retry::Backoff;

/// How often the relay looks for rows when it found none.
const IDLE: Duration = Duration::from_millis(250);

/// Runs the relay until `shutdown` turns true.
pub async fn run(
    db: Db,
    clock: Clock,
    transport: Arc<Transport>,
    mut shutdown: watch::Receiver<bool>,
) {
    let config = transport.config().clone();
    let backoff = Backoff {
        initial: Duration::from_secs(1),
        max: config.relay_retry_max,
    };
    loop {
        if crate::shutdown::is_stopping(&shutdown) {
            break;
        }
        let sent = match relay_once(&db, &clock, &transport, &backoff).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "outbox relay round failed");
                0
            }
        };
        if sent == 0 && crate::shutdown::sleep_or_shutdown(IDLE, &mut shutdown).await {
            break;
        }
    }
    tracing::info!("outbox relay stopped");
}

/// One round: claims a batch and publishes it. Returns the rows handled.
///
/// # Errors
/// A database error of the claim.
pub async fn relay_once(
    db: &Db,
    clock: &Clock,
    transport: &Arc<Transport>,
    backoff: &Backoff,
) -> Result<usize, crate::db::DbError> {
    let config = transport.config();
    let now_ms = clock.now_ms(db).await?;
    let (token, rows) = relay::claim_for_relay(
        db,
        now_ms,
        config.relay_lead.as_millis() as i64,
        config.relay_batch,
        // Held no longer than the lead: a row whose send hangs is the outbox timer's when due.
        config.relay_lead.as_millis() as i64,
    )
    .await?;
    let handled = rows.len();
    // The round's messages go out together (one hand-off to the client's runtime for the
    // round), and its sent rows are marked together: a few statements per round, not one per row.
    let messages: Vec<TimeoutMessage> = rows.iter().map(message_of).collect();
    let scheduled = transport.schedule_all(&messages, now_ms).await;
    let settled = join_all(
        rows.into_iter()
            .zip(scheduled)
            .map(|(row, result)| settle(db, &token, backoff, row, result, now_ms)),
    )
    .await;
    let sent: Vec<(i64, String)> = settled.into_iter().flatten().collect();
    if let Err(e) = relay::mark_sent(db, &token, now_ms, &sent).await {
        // Their rows stay PENDING under the claim; once it lapses they are relayed again, and
        // the duplicate messages are no-ops (F9).
        tracing::warn!(error = %e, rows = sent.len(), "relay could not mark its sent rows; the claim lapses");
    }
    Ok(handled)
}

/// The message a row stands for: its first hop.
fn message_of(row: &DueRow) -> TimeoutMessage {
    TimeoutMessage {
        order_id: row.order_id.clone(),
        phase: u32::try_from(row.phase).unwrap_or(0),
        due_ms: Some(row.due_ms),
        row_id: Some(row.id),
        hop: 0,
    }
}

/// What one row's publication came to. Returns `(row id, message id)` when it was sent (marked
/// SENT with the round's others); a failure or a row due too soon is recorded on the row here.
async fn settle(
    db: &Db,
    token: &str,
    backoff: &Backoff,
    row: DueRow,
    scheduled: Result<Scheduled, TransportError>,
    now_ms: i64,
) -> Option<(i64, String)> {
    let result = match scheduled {
        Ok(Scheduled::Sent { message_id, .. }) => {
            emit(Event::Relayed {
                outcome: "sent",
                error: None,
            });
            return Some((row.id, message_id));
        }
        Ok(Scheduled::Now { .. }) => {
            // Due within the timer lead plus a second after all: the outbox timer has it.
            relay::relay_failed(
                db,
                row.id,
                token,
                "due within rocketmq.timer_lead plus a second; left to the outbox timer",
                row.due_ms,
            )
            .await
        }
        Err(e) => {
            let error = e.to_string();
            emit(Event::Relayed {
                outcome: "failed",
                error: Some(&error),
            });
            let attempts = relay::relay_attempts(db, row.id).await.unwrap_or(0);
            let retry_at = now_ms + backoff.delay_ms(attempts + 1);
            relay::relay_failed(db, row.id, token, &error, retry_at).await
        }
    };
    if let Err(e) = result {
        tracing::warn!(error = %e, row = row.id, "relay could not record a failed send; the claim lapses");
    }
    None
}
