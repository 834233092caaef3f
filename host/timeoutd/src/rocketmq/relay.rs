//! The outbox relay: publishes PENDING `order_timeout_msg` rows due later than
//! `rocketmq.relay_lead` as delay/timer messages and marks them SENT.
//!
//! The table stays the truth. A send that fails leaves the row PENDING with the error, counted,
//! and retried with backoff (F7); the outbox timer still closes the order on time. A SENT row
//! whose message never comes is taken back by the outbox timer `rocketmq.fallback_after` past
//! its due time (F1, F6). `wait` decisions' next phases are relayed the same way.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::client::{Scheduled, Transport};
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
    let mut set = JoinSet::new();
    for row in rows {
        let (db, transport, token, backoff) =
            (db.clone(), transport.clone(), token.clone(), *backoff);
        set.spawn(async move { publish(&db, &transport, &token, &backoff, row, now_ms).await });
    }
    // The round's sent rows are marked together: a few statements per round, not one per row.
    let mut sent = Vec::with_capacity(handled);
    while let Some(published) = set.join_next().await {
        if let Ok(Some(row)) = published {
            sent.push(row);
        }
    }
    if let Err(e) = relay::mark_sent(db, &token, now_ms, &sent).await {
        // Their rows stay PENDING under the claim; once it lapses they are relayed again, and
        // the duplicate messages are no-ops (F9).
        tracing::warn!(error = %e, rows = sent.len(), "relay could not mark its sent rows; the claim lapses");
    }
    Ok(handled)
}

/// Publishes one row's message. Returns `(row id, message id)` when it was sent (marked SENT
/// with the round's others); a failure or a row due too soon is recorded on the row here.
async fn publish(
    db: &Db,
    transport: &Transport,
    token: &str,
    backoff: &Backoff,
    row: DueRow,
    now_ms: i64,
) -> Option<(i64, String)> {
    let message = TimeoutMessage {
        order_id: row.order_id.clone(),
        phase: u32::try_from(row.phase).unwrap_or(0),
        due_ms: Some(row.due_ms),
        row_id: Some(row.id),
        hop: 0,
    };
    let result = match transport.schedule(&message, now_ms).await {
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
