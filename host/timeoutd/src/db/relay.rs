//! The outbox rows' side of the RocketMQ transport: the relay's claims (PENDING → SENT, or a
//! counted failure with backoff), and the consumer's claim of the one row a message stands for.

use std::collections::{HashMap, HashSet};

use sqlx::Row;

use super::outbox::{self, DueRow};
use super::{Db, DbError};

/// Rows put in the table by the consumer for a message that named no row (an order service
/// sending its own delay messages): the row makes every later step durable.
pub const SOURCE_MESSAGE: &str = "message";

/// Claims up to `batch` PENDING rows due later than `now_ms + lead_ms` whose relay backoff has
/// passed and that nobody holds, for `lease_ms`. On MySQL/PostgreSQL with `SKIP LOCKED`, like the
/// outbox timer's claim.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn claim_for_relay(
    db: &Db,
    now_ms: i64,
    lead_ms: i64,
    batch: u32,
    lease_ms: i64,
) -> Result<(String, Vec<DueRow>), DbError> {
    let token = super::claim_token("r");
    let rows = outbox::claim(
        db,
        "SELECT id FROM order_timeout_msg WHERE status = 'PENDING' \
         AND due_ms > ? AND (relay_after_ms IS NULL OR relay_after_ms <= ?) \
         AND (claim_until_ms IS NULL OR claim_until_ms < ?) ORDER BY due_ms LIMIT ?",
        &[now_ms + lead_ms, now_ms, now_ms, i64::from(batch)],
        &token,
        now_ms + lease_ms,
    )
    .await?;
    Ok((token, rows))
}

/// Most rows one [`mark_sent`] statement marks: its `CASE` list is compared row by row, so it is
/// kept short; a relay round of 256 rows costs 4 statements instead of 256.
const MARK_SENT_CHUNK: usize = 64;

/// The relay published these rows, `(row id, message id)`: each is SENT at `now_ms` with its
/// message id and its claim dropped, its `last_error` cleared unless it notes a pause (which
/// the resume and the sweep read: [`super::pauses::KEEP_HELD_NOTE`]), in statements of at
/// most [`MARK_SENT_CHUNK`] rows (`message_id = CASE id WHEN ? THEN ? … END`). A row whose claim `token` was lost meanwhile
/// (a consumer or the outbox timer has it now) is left alone.
///
/// # Errors
/// [`DbError::Sql`] on query failure; the rows of the chunks before it are marked.
pub async fn mark_sent(
    db: &Db,
    token: &str,
    now_ms: i64,
    sent: &[(i64, String)],
) -> Result<(), DbError> {
    let _gate = db.write_gate().await;
    for chunk in sent.chunks(MARK_SENT_CHUNK) {
        let case = super::orders::case_by_id(chunk.len());
        let marks = super::orders::marks(chunk.len());
        let mut q = db.backend().query_owned(format!(
            "UPDATE order_timeout_msg SET status = 'SENT', sent_at_ms = ?, \
             message_id = {case}, last_error = {kept}, claim_token = NULL, \
             claim_until_ms = NULL WHERE id IN ({marks}) AND claim_token = ? AND status = 'PENDING'",
            kept = super::pauses::KEEP_HELD_NOTE
        ));
        q = q.bind(now_ms);
        for (id, message_id) in chunk {
            q = q.bind(*id).bind(message_id.clone());
        }
        for (id, _) in chunk {
            q = q.bind(*id);
        }
        q.bind(token.to_string()).execute(db.pool()).await?;
    }
    Ok(())
}

/// The relay's send of row `id` failed: the row stays PENDING (the outbox timer still closes on
/// time), the failure is counted and recorded, and the relay leaves it alone until
/// `retry_at_ms` (F7).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn relay_failed(
    db: &Db,
    id: i64,
    token: &str,
    error: &str,
    retry_at_ms: i64,
) -> Result<(), DbError> {
    let _gate = db.write_gate().await;
    db.backend()
        .query(
            "UPDATE order_timeout_msg SET relay_attempts = relay_attempts + 1, \
             relay_after_ms = ?, last_error = ?, claim_token = NULL, claim_until_ms = NULL \
             WHERE id = ? AND claim_token = ?",
        )
        .bind(retry_at_ms)
        .bind(error)
        .bind(id)
        .bind(token)
        .execute(db.pool())
        .await?;
    Ok(())
}

/// Relay attempts of row `id` so far (for the backoff).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn relay_attempts(db: &Db, id: i64) -> Result<u32, DbError> {
    let n: Option<i64> = db
        .backend()
        .query("SELECT relay_attempts FROM order_timeout_msg WHERE id = ?")
        .bind(id)
        .fetch_optional(db.pool())
        .await?
        .map(|r| r.try_get(0))
        .transpose()?;
    Ok(n.unwrap_or(0).clamp(0, i64::from(u32::MAX)) as u32)
}

/// What the consumer found when it tried to take the row a message stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RowClaim {
    /// Claimed for the lease: handle it.
    Claimed(DueRow),
    /// Already PROCESSED: the message is a duplicate or late (a no-op).
    Processed,
    /// Held by another handler right now (the outbox timer, another consumer); it finishes it.
    Busy,
    /// No such row.
    Missing,
}

/// Claims the rows `ids` for `lease_ms` where they are open (PENDING or SENT) and nobody holds
/// them: one `UPDATE … WHERE id IN (…)` and one read of what it took, plus one status read for
/// the rest. Returns one [`RowClaim`] per entry of `ids`, in order; an id listed twice is
/// claimed once (its later entries are [`RowClaim::Busy`]: the first one holds it).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn claim_rows(
    db: &Db,
    ids: &[i64],
    now_ms: i64,
    lease_ms: i64,
) -> Result<Vec<RowClaim>, DbError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut distinct = ids.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    let token = super::claim_token("c");
    let marks = super::orders::marks(distinct.len());
    let claimed = {
        let _gate = db.write_gate().await;
        let mut q = db.backend().query_owned(format!(
            "UPDATE order_timeout_msg SET claim_token = ?, claim_until_ms = ? \
             WHERE id IN ({marks}) AND status IN ('PENDING', 'SENT') \
             AND (claim_until_ms IS NULL OR claim_until_ms < ?)"
        ));
        q = q.bind(token.clone()).bind(now_ms + lease_ms);
        for id in &distinct {
            q = q.bind(*id);
        }
        q.bind(now_ms).execute(db.pool()).await?.rows_affected()
    };
    let mut held: HashMap<i64, DueRow> = HashMap::new();
    if claimed > 0 {
        held = outbox::held_by(db, &token)
            .await?
            .into_iter()
            .map(|row| (row.id, row))
            .collect();
    }
    let mut status: HashMap<i64, String> = HashMap::new();
    if held.len() < distinct.len() {
        let rest: Vec<i64> = distinct
            .iter()
            .copied()
            .filter(|id| !held.contains_key(id))
            .collect();
        let mut q = db.backend().query_owned(format!(
            "SELECT id, status FROM order_timeout_msg WHERE id IN ({})",
            super::orders::marks(rest.len())
        ));
        for id in &rest {
            q = q.bind(*id);
        }
        for row in q.fetch_all(db.pool()).await? {
            status.insert(row.try_get(0)?, row.try_get(1)?);
        }
    }
    // An id listed twice is claimed by its first entry; the later ones find it held.
    let mut given = HashSet::new();
    Ok(ids
        .iter()
        .map(|id| match held.get(id) {
            Some(row) if given.insert(*id) => RowClaim::Claimed(row.clone()),
            Some(_) => RowClaim::Busy,
            None => match status.get(id).map(String::as_str) {
                None => RowClaim::Missing,
                Some("PROCESSED") => RowClaim::Processed,
                Some(_) => RowClaim::Busy,
            },
        })
        .collect())
}

/// The row for `(order_id, phase)`, inserted PENDING at `due_ms` with source `message` when the
/// order has none: a message from an order service that names no row is adopted, so its
/// retries, deferrals and completion are as durable as the outbox's own.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn adopt(db: &Db, order_id: &str, phase: u32, due_ms: i64) -> Result<i64, DbError> {
    {
        let _gate = db.write_gate().await;
        let backend = db.backend();
        backend
            .query_owned(format!(
                "{insert} INTO order_timeout_msg (order_id, due_ms, phase, status, source) \
                 VALUES (?, ?, ?, 'PENDING', '{SOURCE_MESSAGE}'){on_conflict}",
                insert = backend.insert_ignore().0,
                on_conflict = backend.insert_ignore().1,
            ))
            .bind(order_id)
            .bind(due_ms)
            .bind(i64::from(phase))
            .execute(db.pool())
            .await?;
    }
    let id: i64 = db
        .backend()
        .query("SELECT id FROM order_timeout_msg WHERE order_id = ? AND phase = ?")
        .bind(order_id)
        .bind(i64::from(phase))
        .fetch_one(db.pool())
        .await?
        .try_get(0)?;
    Ok(id)
}
