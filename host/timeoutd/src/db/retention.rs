//! Retention's statements: which rows of each table are settled and old enough to delete
//! ([`RULES`], the one place that says so), deleting them by id in bounded batches, the lease
//! that lets one daemon at a time do it, and table sizes for the gauges.

use sqlx::Row;

use super::{Db, DbError};

/// Rows of an order still PENDING are never deleted, whatever their age.
const NOT_OF_A_PENDING_ORDER: &str =
    "NOT EXISTS (SELECT 1 FROM orders o WHERE o.id = t.order_id AND o.status = 'PENDING')";

/// One table's rule: its name and the condition (on alias `t`, one `?` for the cutoff in epoch
/// ms) that a row is settled and old.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// Table.
    pub table: &'static str,
    /// `[retention]` key giving its age.
    pub key: &'static str,
    condition: &'static str,
    /// Whether its rows belong to an order (and are kept while the order is PENDING).
    of_order: bool,
}

/// Every table retention cleans. Not in it: `orders` and their items, stock, coupons (the
/// shop's own data), `paid_after_close` (money owed back), and anything unsettled.
pub const RULES: &[Rule] = &[
    Rule {
        table: "order_timeout_msg",
        key: "retention.outbox",
        condition: "t.status = 'PROCESSED' AND t.processed_at_ms < ?",
        of_order: true,
    },
    Rule {
        table: "effect_ledger",
        key: "retention.ledger",
        condition: "t.status = 'DONE' AND t.updated_at_ms < ?",
        of_order: true,
    },
    Rule {
        table: "decision_log",
        key: "retention.decision_log",
        condition: "t.decided_at_ms < ?",
        of_order: true,
    },
    // A shadow's comparisons age with the decisions they shadow.
    Rule {
        table: "shadow_decisions",
        key: "retention.decision_log",
        condition: "t.decided_at_ms < ?",
        of_order: false,
    },
    Rule {
        table: "admin_audit",
        key: "retention.audit",
        condition: "t.at_ms < ?",
        of_order: false,
    },
    Rule {
        table: "payment_leases",
        key: "retention.payment_leases",
        condition: "t.until_ms < ?",
        of_order: false,
    },
    Rule {
        table: "dead_letter",
        key: "retention.dead_letters",
        condition: "t.status IN ('REDRIVEN', 'DISMISSED') AND t.created_at_ms < ?",
        of_order: false,
    },
];

/// Deletes up to `batch` rows of `rule`'s table that are settled and older than `cutoff_ms`
/// (oldest ids first): one read of their ids, one `DELETE … WHERE id IN (…)`. Returns how many
/// it deleted (0: nothing left to do).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn delete_batch(
    db: &Db,
    rule: &Rule,
    cutoff_ms: i64,
    batch: u32,
) -> Result<u64, DbError> {
    // On a shop's schema the order is the shop's row: the profile says what pending means.
    let mapped = db.schema().mapped().map(|m| m.pending_exists("t.order_id"));
    let pending = match (rule.of_order, &mapped) {
        (false, _) => String::new(),
        (true, None) => format!(" AND {NOT_OF_A_PENDING_ORDER}"),
        (true, Some(exists)) => format!(" AND NOT {}", exists.sql),
    };
    let mut q = db
        .backend()
        .query_owned(format!(
            "SELECT t.id FROM {} t WHERE {}{pending} ORDER BY t.id LIMIT ?",
            rule.table, rule.condition
        ))
        .bind(cutoff_ms);
    if let (true, Some(exists)) = (rule.of_order, mapped) {
        q = exists.bind_onto(q);
    }
    let ids: Vec<i64> = q
        .bind(i64::from(batch))
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(|r| r.try_get::<i64, _>(0))
        .collect::<Result<_, _>>()?;
    if ids.is_empty() {
        return Ok(0);
    }
    let _gate = db.write_gate().await;
    let mut q = db.backend().query_owned(format!(
        "DELETE FROM {} WHERE id IN ({})",
        rule.table,
        super::orders::marks(ids.len())
    ));
    for id in &ids {
        q = q.bind(*id);
    }
    Ok(q.execute(db.pool()).await?.rows_affected())
}

/// Rows in `table` now (`COUNT(*)`; for the table-size gauges, taken once per pass).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn table_rows(db: &Db, table: &str) -> Result<i64, DbError> {
    let row = db
        .backend()
        .query_owned(format!("SELECT COUNT(*) FROM {table}"))
        .fetch_one(db.pool())
        .await?;
    Ok(row.try_get::<i64, _>(0)?)
}
