//! `timeoutd plugin replay`'s reads: the plugin calls recorded in `decision_log`.

use sqlx::Row;

use super::{Db, DbError};

/// One recorded plugin call, as read from `decision_log`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedCall {
    /// Row id.
    pub id: i64,
    /// Order.
    pub order_id: String,
    /// Merchant.
    pub merchant_id: String,
    /// Plugin SHA-256, hex.
    pub plugin_digest: String,
    /// Trigger kind (`outbox`, `sweep`, …).
    pub trigger_kind: String,
    /// Phase decided (`u32::MAX` when the stored value does not fit).
    pub phase: u32,
    /// Attempt of this phase (`u32::MAX` when the stored value does not fit).
    pub attempt: u32,
    /// `wait`, `cancel`, `ignore` or `error`.
    pub decision: String,
    /// The decision or error, JSON (or the error text).
    pub detail: String,
    /// Database time of the decision, epoch ms.
    pub decided_at_ms: i64,
    /// What the plugin was given, JSON (`None` on rows older than migration 0005).
    pub input: Option<String>,
    /// What it answered, JSON (`None` on rows older than migration 0005).
    pub answer: Option<String>,
}

/// The recorded calls, newest first, at most `limit`: of `merchant` only when given.
///
/// # Errors
/// [`DbError::Sql`] when the query fails or a column cannot be read.
pub async fn recorded_calls(
    db: &Db,
    merchant: Option<&str>,
    limit: u32,
) -> Result<Vec<RecordedCall>, DbError> {
    let sql = match merchant {
        Some(_) => {
            "SELECT id, order_id, merchant_id, plugin_digest, trigger_kind, phase, attempt, \
                    decision, detail, decided_at_ms, input, answer FROM decision_log \
                    WHERE merchant_id = ? ORDER BY id DESC LIMIT ?"
        }
        None => {
            "SELECT id, order_id, merchant_id, plugin_digest, trigger_kind, phase, attempt, \
                 decision, detail, decided_at_ms, input, answer FROM decision_log \
                 ORDER BY id DESC LIMIT ?"
        }
    };
    let mut query = db.backend().query(sql);
    if let Some(m) = merchant {
        query = query.bind(m);
    }
    let rows = query.bind(i64::from(limit)).fetch_all(db.pool()).await?;
    rows.iter().map(call_of).collect()
}

fn call_of(r: &sqlx::any::AnyRow) -> Result<RecordedCall, DbError> {
    let phase: i64 = r.try_get("phase")?;
    let attempt: i64 = r.try_get("attempt")?;
    Ok(RecordedCall {
        id: r.try_get("id")?,
        order_id: r.try_get("order_id")?,
        merchant_id: r.try_get("merchant_id")?,
        plugin_digest: r.try_get("plugin_digest")?,
        trigger_kind: r.try_get("trigger_kind")?,
        phase: u32::try_from(phase).unwrap_or(u32::MAX),
        attempt: u32::try_from(attempt).unwrap_or(u32::MAX),
        decision: r.try_get("decision")?,
        detail: r.try_get("detail")?,
        decided_at_ms: r.try_get("decided_at_ms")?,
        input: r.try_get("input")?,
        answer: r.try_get("answer")?,
    })
}

/// What `timeoutd plugin whatif` reads of one recorded call: no more than it decides with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedInput {
    /// Row id.
    pub id: i64,
    /// Order.
    pub order_id: String,
    /// What the plugin was given, JSON (`None` on rows older than migration 0005).
    pub input: Option<String>,
    /// What it answered, JSON (`None` on rows older than migration 0005).
    pub answer: Option<String>,
}

/// One page of `merchant`'s recorded inputs and answers decided at or after `since_ms`, with
/// an id above `after_id`, oldest id first, at most `page`: what `timeoutd plugin whatif`
/// streams, a page at a time.
///
/// # Errors
/// [`DbError::Sql`] when the query fails or a column cannot be read.
pub async fn inputs_since(
    db: &Db,
    merchant: &str,
    since_ms: i64,
    after_id: i64,
    page: u32,
) -> Result<Vec<RecordedInput>, DbError> {
    db.backend()
        .query(
            "SELECT id, order_id, input, answer FROM decision_log \
             WHERE merchant_id = ? AND decided_at_ms >= ? AND id > ? ORDER BY id LIMIT ?",
        )
        .bind(merchant)
        .bind(since_ms)
        .bind(after_id)
        .bind(i64::from(page))
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(|r| {
            Ok(RecordedInput {
                id: r.try_get(0)?,
                order_id: r.try_get(1)?,
                input: r.try_get(2)?,
                answer: r.try_get(3)?,
            })
        })
        .collect()
}
