//! `timeoutd demo`'s reads (its database is always SQLite): orders by status, the orders still
//! open, close lateness, and the tallies its conservation checks compare. Never used by the
//! daemon itself.

use sqlx::Row;

use super::{Db, DbError};

/// Orders by status: `(status, count)`, one pair per status present.
///
/// # Errors
/// [`DbError::Sql`] when the query fails or a column cannot be read.
pub async fn orders_by_status(db: &Db) -> Result<Vec<(String, i64)>, DbError> {
    db.backend()
        .query("SELECT status, COUNT(*) FROM orders GROUP BY status")
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect()
}

/// The ids of the first 20 PENDING orders, by id.
///
/// # Errors
/// [`DbError::Sql`] when the query fails or a column cannot be read.
pub async fn first_open_orders(db: &Db) -> Result<Vec<String>, DbError> {
    db.backend()
        .query("SELECT id FROM orders WHERE status = 'PENDING' ORDER BY id LIMIT 20")
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(|r| Ok(r.try_get(0)?))
        .collect()
}

/// Each CLOSED order's lateness, `closed_at_ms − close_due_ms` in ms, smallest first.
///
/// # Errors
/// [`DbError::Sql`] when the query fails or a column cannot be read.
pub async fn close_lateness_ms(db: &Db) -> Result<Vec<i64>, DbError> {
    Ok(db
        .backend()
        .query("SELECT closed_at_ms - close_due_ms FROM orders WHERE status = 'CLOSED' ORDER BY 1")
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(|r| r.try_get::<i64, _>(0))
        .collect::<Result<_, _>>()?)
}

/// What the demo's conservation checks count at the end (a sum over no rows reads 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tallies {
    /// `restore-stock` ledger rows.
    pub restores: i64,
    /// Lines of CLOSED orders.
    pub closed_lines: i64,
    /// Orders with a `remind` effect DONE without error.
    pub reminded: i64,
    /// CLOSED orders closed before their deadline.
    pub closed_before_deadline: i64,
    /// Stock units available over all SKUs.
    pub stock_units: i64,
    /// Units on the lines of PAID orders.
    pub paid_units: i64,
    /// LOCKED coupons.
    pub coupons_locked: i64,
    /// Coupons of PAID orders not USED plus coupons of CLOSED orders not AVAILABLE.
    pub coupons_misplaced: i64,
    /// `decision_log` rows.
    pub decisions: i64,
    /// OPEN dead letters.
    pub dead_letters: i64,
    /// `notify` and `remind` effects DONE.
    pub effects_done: i64,
    /// PENDING ledger effects.
    pub effects_waiting: i64,
}

/// Counts the [`Tallies`], one query each in the order of its fields.
///
/// # Errors
/// [`DbError::Sql`] when a query fails or a column cannot be read (the first failure ends it).
pub async fn tallies(db: &Db) -> Result<Tallies, DbError> {
    Ok(Tallies {
        restores: scalar(
            db,
            "SELECT COUNT(*) FROM effect_ledger WHERE kind = 'restore-stock'",
        )
        .await?,
        closed_lines: scalar(
            db,
            "SELECT COUNT(*) FROM order_items i JOIN orders o ON o.id = i.order_id WHERE o.status = 'CLOSED'",
        )
        .await?,
        reminded: scalar(
            db,
            "SELECT COUNT(DISTINCT order_id) FROM effect_ledger WHERE kind = 'remind' AND status = 'DONE' AND last_error IS NULL",
        )
        .await?,
        closed_before_deadline: scalar(
            db,
            "SELECT COUNT(*) FROM orders WHERE status = 'CLOSED' AND closed_at_ms < deadline_ms",
        )
        .await?,
        stock_units: scalar(db, "SELECT SUM(available) FROM sku_stock").await?,
        paid_units: scalar(
            db,
            "SELECT SUM(i.quantity) FROM order_items i JOIN orders o ON o.id = i.order_id WHERE o.status = 'PAID'",
        )
        .await?,
        coupons_locked: scalar(db, "SELECT COUNT(*) FROM coupons WHERE status = 'LOCKED'").await?,
        coupons_misplaced: scalar(
            db,
            "SELECT COUNT(*) FROM orders o JOIN coupons c ON c.id = o.coupon_id \
             WHERE (o.status = 'PAID' AND c.status <> 'USED') OR (o.status = 'CLOSED' AND c.status <> 'AVAILABLE')",
        )
        .await?,
        decisions: scalar(db, "SELECT COUNT(*) FROM decision_log").await?,
        dead_letters: scalar(db, "SELECT COUNT(*) FROM dead_letter WHERE status = 'OPEN'").await?,
        effects_done: scalar(
            db,
            "SELECT COUNT(*) FROM effect_ledger WHERE status = 'DONE' AND kind IN ('notify', 'remind')",
        )
        .await?,
        effects_waiting: scalar(db, "SELECT COUNT(*) FROM effect_ledger WHERE status = 'PENDING'").await?,
    })
}

/// One BIGINT (NULL reading 0).
async fn scalar(db: &Db, sql: &'static str) -> Result<i64, DbError> {
    let row = db.backend().query(sql).fetch_one(db.pool()).await?;
    Ok(row.try_get::<Option<i64>, _>(0)?.unwrap_or(0))
}
