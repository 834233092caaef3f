//! The outbox relay: publishes PENDING `order_timeout_msg` rows due later than
//! `rocketmq.relay_lead` as delay/timer messages and marks them SENT.
//!
//! The table stays the truth. A send that fails leaves the row PENDING with the error, counted,
//! and retried with backoff (F7); the outbox timer still closes the order on time. A SENT row
//! whose message never comes is taken back by the outbox timer `rocketmq.fallback_after` past
//! its due time (F1, F6). `wait` decisions' next phases are relayed the same way.
//!
//! Rows of a round due within [`rows::SPAN_MS`] of each other share one message (at most
//! `rocketmq.rows_per_message` each; [`super::codec::rows`]): a flash sale's 10,000 rows due in
//! the same second are a few hundred messages, not 10,000, each costing the relay a send and
//! the consumer a pull and an acknowledgement. A shared message is due at its earliest row;
//! when it comes back (`timer_lead` early) each of its rows is held until its own due time.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::watch;

use super::client::{Scheduled, Transport, TransportError};
use super::codec::{self, TimeoutMessage, Wakeup, rows};
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
    let shares = shares(&rows, config.rows_per_message.max(1) as usize);
    let messages: Vec<Wakeup> = shares
        .iter()
        .map(|share| wakeup_of(&rows[share.clone()]))
        .collect();
    let scheduled = transport.schedule_all(&messages, now_ms).await;
    // Each row settles with its message's result.
    let results = shares
        .iter()
        .zip(scheduled)
        .flat_map(|(share, result)| std::iter::repeat_n(result, share.len()));
    let settled = join_all(
        rows.into_iter()
            .zip(results)
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

/// How `rows` (sorted by due time, as claimed) share messages: consecutive runs of at most
/// `per_message` rows, each due within [`rows::SPAN_MS`] of the run's first. A row whose order
/// id a consumer would refuse goes alone, so it is dead-lettered by itself instead of with the
/// rows it would have shared a message with. Index ranges into `rows`, in order, covering every
/// row once.
fn shares(rows: &[DueRow], per_message: usize) -> Vec<std::ops::Range<usize>> {
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    let mut open = false;
    for (k, row) in rows.iter().enumerate() {
        let shareable = codec::check_order_id(&row.order_id).is_ok();
        match out.last_mut() {
            Some(run)
                if open
                    && shareable
                    && run.len() < per_message
                    && (row.due_ms - rows[run.start].due_ms) < rows::SPAN_MS
                    && row.due_ms >= rows[run.start].due_ms =>
            {
                run.end = k + 1;
            }
            _ => out.push(k..k + 1),
        }
        open = shareable;
    }
    out
}

/// The message for a share of rows: the row's own for one, a rows message for more.
fn wakeup_of(share: &[DueRow]) -> Wakeup {
    match share {
        [row] => Wakeup::Order(message_of(row)),
        rows => Wakeup::Rows {
            rows: rows.iter().map(message_of).collect(),
            hop: 0,
        },
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, due_ms: i64) -> DueRow {
        DueRow {
            id,
            order_id: format!("O-{id}"),
            phase: 0,
            attempts: 0,
            due_ms,
            source: "order-service".into(),
            state: None,
            claim_token: None,
        }
    }

    #[test]
    fn rows_share_a_message_only_within_a_second_of_its_earliest_and_up_to_the_limit() {
        let rows: Vec<DueRow> = [0, 10, 20, 999, 1_000, 1_001, 5_000]
            .iter()
            .enumerate()
            .map(|(k, due)| row(k as i64, *due))
            .collect();
        assert_eq!(shares(&rows, 64), vec![0..4, 4..6, 6..7]);
        assert_eq!(shares(&rows, 2), vec![0..2, 2..4, 4..6, 6..7]);
        assert_eq!(
            shares(&rows, 1),
            (0..7).map(|k| k..k + 1).collect::<Vec<_>>()
        );
        assert!(shares(&[], 64).is_empty());
    }

    #[test]
    fn a_row_whose_order_id_would_be_refused_goes_alone() {
        let mut rows: Vec<DueRow> = (0..4).map(|k| row(k, 100)).collect();
        rows[1].order_id = "two words".into();
        assert_eq!(shares(&rows, 64), vec![0..1, 1..2, 2..4]);
    }

    #[test]
    fn a_share_of_one_row_is_that_orders_message_and_more_is_a_rows_message() {
        let rows = [row(1, 100), row(2, 150)];
        match wakeup_of(&rows[..1]) {
            Wakeup::Order(m) => assert_eq!((m.row_id, m.due_ms), (Some(1), Some(100))),
            other => panic!("{other:?}"),
        }
        let both = wakeup_of(&rows);
        assert!(matches!(both, Wakeup::Rows { .. }));
        assert_eq!(both.due_ms(), Some(100));
        assert_eq!(both.messages().len(), 2);
    }
}
