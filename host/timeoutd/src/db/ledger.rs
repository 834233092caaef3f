//! `effect_ledger`: one row per effect of a decision, the single record of what has been done.

use sqlx::{AnyConnection, Row};

use super::{Backend, Db, DbError};

/// Effect status: recorded, not yet carried out.
pub const PENDING: &str = "PENDING";
/// Effect status: carried out (or found to be already so).
pub const DONE: &str = "DONE";
/// Effect status: cannot be carried out; needs an operator.
pub const FAILED: &str = "FAILED";

/// One effect to record.
#[derive(Debug, Clone)]
pub struct NewEntry<'a> {
    /// Order.
    pub order_id: &'a str,
    /// Merchant.
    pub merchant_id: &'a str,
    /// Phase of the decision.
    pub phase: u32,
    /// Position of the effect in the decision.
    pub index: u32,
    /// Effect kind (`restore-stock`, `notify`, `remind`, …).
    pub kind: &'a str,
    /// The effect, JSON.
    pub payload: String,
    /// `PENDING`, `DONE` or `FAILED`.
    pub status: &'a str,
    /// Why it failed, or a note.
    pub note: Option<String>,
}

impl NewEntry<'_> {
    /// The idempotency key: `merchant/order/phase/index`. It depends only on the trigger and the
    /// decision, never on time, so a replayed decision maps onto the same rows.
    pub fn idempotency_key(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.merchant_id, self.order_id, self.phase, self.index
        )
    }
}

/// Records an effect. A row with the same idempotency key is left as it is (returns false).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn record(
    conn: &mut AnyConnection,
    backend: Backend,
    e: &NewEntry<'_>,
    now_ms: i64,
) -> Result<bool, DbError> {
    let done = sqlx::query(sqlx::AssertSqlSafe(format!(
        "{} INTO effect_ledger (idempotency_key, order_id, merchant_id, phase, effect_index, kind, \
         payload, status, attempts, last_error, created_at_ms, updated_at_ms) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?)",
        backend.insert_ignore()
    )))
    .bind(e.idempotency_key())
    .bind(e.order_id)
    .bind(e.merchant_id)
    .bind(i64::from(e.phase))
    .bind(i64::from(e.index))
    .bind(e.kind)
    .bind(&e.payload)
    .bind(e.status)
    .bind(&e.note)
    .bind(now_ms)
    .bind(now_ms)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// A recorded effect still to be carried out.
#[derive(Debug, Clone)]
pub struct PendingEffect {
    /// Row id.
    pub id: i64,
    /// Idempotency key.
    pub key: String,
    /// Order.
    pub order_id: String,
    /// Merchant.
    pub merchant_id: String,
    /// Kind.
    pub kind: String,
    /// JSON payload.
    pub payload: String,
    /// Attempts so far.
    pub attempts: u32,
}

/// PENDING effects of the given kinds — of one order when `order_id` is given — last touched at
/// or before `touched_before_ms`, oldest first.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn pending(
    db: &Db,
    kinds: &[&str],
    order_id: Option<&str>,
    touched_before_ms: i64,
    limit: u32,
) -> Result<Vec<PendingEffect>, DbError> {
    let marks = vec!["?"; kinds.len().max(1)].join(", ");
    let order_filter = if order_id.is_some() {
        "AND order_id = ?"
    } else {
        ""
    };
    let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT id, idempotency_key, order_id, merchant_id, kind, payload, attempts FROM effect_ledger \
         WHERE status = 'PENDING' AND kind IN ({marks}) {order_filter} AND updated_at_ms <= ? \
         ORDER BY id LIMIT ?"
    )));
    for k in kinds {
        q = q.bind(*k);
    }
    if kinds.is_empty() {
        q = q.bind("");
    }
    if let Some(order_id) = order_id {
        q = q.bind(order_id);
    }
    let rows = q
        .bind(touched_before_ms)
        .bind(i64::from(limit))
        .fetch_all(db.pool())
        .await?;
    rows.iter()
        .map(|r| {
            Ok(PendingEffect {
                id: r.try_get("id")?,
                key: r.try_get("idempotency_key")?,
                order_id: r.try_get("order_id")?,
                merchant_id: r.try_get("merchant_id")?,
                kind: r.try_get("kind")?,
                payload: r.try_get("payload")?,
                attempts: r.try_get::<i64, _>("attempts")?.clamp(0, u32::MAX as i64) as u32,
            })
        })
        .collect()
}

/// Moves a PENDING effect to `status` (DONE or FAILED), counting the attempt. Returns false when
/// it was no longer PENDING (another executor finished it).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn settle(
    db: &Db,
    id: i64,
    status: &str,
    note: Option<&str>,
    now_ms: i64,
) -> Result<bool, DbError> {
    let _gate = db.write_gate().await;
    let done = sqlx::query(
        "UPDATE effect_ledger SET status = ?, last_error = ?, attempts = attempts + 1, updated_at_ms = ? \
         WHERE id = ? AND status = 'PENDING'",
    )
    .bind(status)
    .bind(note)
    .bind(now_ms)
    .bind(id)
    .execute(db.pool())
    .await?;
    Ok(done.rows_affected() == 1)
}
