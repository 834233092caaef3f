//! The backlog sample's reads: overdue-but-open orders per merchant, PENDING ledger effects,
//! due outbox rows and open dead letters. Every query reads an index (`orders (status,
//! deadline_ms)`, `effect_ledger (status, created_at_ms)`, `order_timeout_msg (status, due_ms)`), so
//! sampling stays cheap with millions of orders.

use sqlx::Row;

use super::{Db, DbError};

/// The backlog as the database holds it at one instant. Times are epoch ms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Backlog {
    /// PENDING orders whose deadline is at or before the cut-off asked about, by merchant
    /// (ordered by merchant id; merchants with none are absent).
    pub overdue_open: Vec<(String, i64)>,
    /// PENDING ledger effects created at or before `now_ms`.
    pub ledger_pending: i64,
    /// When the oldest of them was created, epoch ms (`None` when there are none).
    pub ledger_oldest_created_ms: Option<i64>,
    /// PENDING outbox rows due at or before `now_ms`.
    pub outbox_due: i64,
    /// When the earliest of them was due, epoch ms (`None` when there are none).
    pub outbox_earliest_due_ms: Option<i64>,
    /// OPEN dead letters.
    pub dead_letters_open: i64,
}

/// PENDING ledger effects created at or before a time (bound: epoch ms) and the oldest one's
/// `created_at_ms`: read from the `effect_ledger_status_created` index alone (migration 15),
/// however large the backlog (through `effect_ledger_status` a backlog of 48,000 made MariaDB
/// scan the whole ledger instead).
pub const LEDGER_PENDING: &str = "SELECT COUNT(*), MIN(created_at_ms) FROM effect_ledger WHERE status = 'PENDING' AND created_at_ms <= ?";

/// Reads the backlog at `now_ms` (epoch ms), counting an order as overdue when its deadline is
/// at or before `overdue_before_ms`. Four queries, in the order of [`Backlog`]'s fields.
///
/// # Errors
/// [`DbError::Sql`] when a query fails or a column cannot be read (the first failure ends it).
pub async fn read(db: &Db, now_ms: i64, overdue_before_ms: i64) -> Result<Backlog, DbError> {
    let b = db.backend();
    let overdue_open = match db.schema().mapped() {
        Some(m) => m.overdue_by_merchant(db, overdue_before_ms).await?,
        None => canonical_overdue(db, overdue_before_ms).await?,
    };
    let one = |sql: &'static str| async move {
        let row = b.query(sql).bind(now_ms).fetch_one(db.pool()).await?;
        Ok::<_, DbError>((row.try_get::<i64, _>(0)?, row.try_get::<Option<i64>, _>(1)?))
    };
    let (ledger_pending, ledger_oldest_created_ms) = one(LEDGER_PENDING).await?;
    let (outbox_due, outbox_earliest_due_ms) = one(
        "SELECT COUNT(*), MIN(due_ms) FROM order_timeout_msg WHERE status = 'PENDING' AND due_ms <= ?",
    )
    .await?;
    let dead_letters_open = b
        .query("SELECT COUNT(*) FROM dead_letter WHERE status = 'OPEN'")
        .fetch_one(db.pool())
        .await?
        .try_get::<i64, _>(0)?;
    Ok(Backlog {
        overdue_open,
        ledger_pending,
        ledger_oldest_created_ms,
        outbox_due,
        outbox_earliest_due_ms,
        dead_letters_open,
    })
}

/// Overdue PENDING orders per merchant in timeoutd's own `orders`.
async fn canonical_overdue(db: &Db, before_ms: i64) -> Result<Vec<(String, i64)>, DbError> {
    Ok(db
        .backend()
        .query(
            "SELECT merchant_id, COUNT(*) FROM orders WHERE status = 'PENDING' AND deadline_ms <= ? \
             GROUP BY merchant_id ORDER BY merchant_id",
        )
        .bind(before_ms)
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<i64, _>(1)?)))
        .collect::<Result<Vec<_>, sqlx::Error>>()?)
}
