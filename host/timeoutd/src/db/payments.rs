//! `paid_after_close`: payments that succeeded after timeoutd closed their order (F13), and what
//! a payment callback reads of the order.

use sqlx::{AnyConnection, Row};

use super::{Backend, Db, DbError, ledger};
use crate::kinds::LedgerKind;

/// The `paid_after_close.resolution` that raises a refund (the other is `manual-review`;
/// `config::PaidAfterClose::as_str` names both).
pub const REFUND: &str = "refund";

/// Records that a closed order's payment succeeded, once per order, and — when `resolution` is
/// [`REFUND`] — raises one `refund-payment` effect in the ledger (key `merchant/order/refund`).
/// Stock and coupons are not touched: the close already gave them back. Returns false when the
/// order was already recorded (a second callback, a replayed close-payment).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
#[allow(clippy::too_many_arguments)]
pub async fn record_paid_after_close(
    conn: &mut AnyConnection,
    order_id: &str,
    merchant_id: &str,
    payment_ref: Option<&str>,
    source: &str,
    resolution: &str,
    now_ms: i64,
) -> Result<bool, DbError> {
    let backend = Backend::of(conn);
    let (insert, on_conflict) = backend.insert_ignore();
    let done = backend
        .query_owned(format!(
            "{insert} INTO paid_after_close (order_id, merchant_id, payment_ref, source, resolution, \
             detected_at_ms) VALUES (?, ?, ?, ?, ?, ?){on_conflict}"
        ))
        .bind(order_id)
        .bind(merchant_id)
        .bind(payment_ref)
        .bind(source)
        .bind(resolution)
        .bind(now_ms)
        .execute(&mut *conn)
        .await?;
    if done.rows_affected() == 0 {
        return Ok(false);
    }
    if resolution == REFUND {
        let payload =
            serde_json::json!({ "kind": LedgerKind::Refund.as_str(), "payment_ref": payment_ref })
                .to_string();
        let entry = ledger::NewEntry {
            order_id,
            merchant_id,
            phase: 0,
            index: REFUND_INDEX,
            kind: LedgerKind::Refund.as_str(),
            payload,
            status: ledger::PENDING,
            note: None,
            key: Some(format!("{merchant_id}/{order_id}/refund")),
        };
        ledger::record(conn, backend, &entry, now_ms).await?;
    }
    tracing::warn!(
        order = order_id,
        source,
        resolution,
        "payment succeeded after the order was closed"
    );
    Ok(true)
}

/// Effect index of the refund row (outside any decision's effect list, which holds at most 64).
pub const REFUND_INDEX: u32 = 10_000;

/// What a payment callback needs of an order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderPayment {
    /// `PENDING`, `PAID` or `CLOSED`, as stored.
    pub status: String,
    /// Merchant id.
    pub merchant_id: String,
    /// The provider's payment reference, if the order has one.
    pub payment_ref: Option<String>,
    /// The order's total, cents (a provider's notice is checked against it).
    pub total_cents: i64,
}

/// Order `order_id`'s status, merchant and payment reference, or `None` when there is no such
/// order.
///
/// # Errors
/// [`DbError::Sql`] when the query fails or a column cannot be read.
pub async fn order_payment(db: &Db, order_id: &str) -> Result<Option<OrderPayment>, DbError> {
    if db.schema().mapped().is_some() {
        let mut conn = db.pool().acquire().await?;
        let order = super::orders::load(&mut conn, db.schema(), order_id).await?;
        return Ok(order.map(|o| OrderPayment {
            status: o.status.as_str().to_string(),
            merchant_id: o.merchant,
            payment_ref: o.payment_ref,
            total_cents: o.total_cents,
        }));
    }
    let Some(row) = db
        .backend()
        .query("SELECT status, merchant_id, payment_ref, total_cents FROM orders WHERE id = ?")
        .bind(order_id)
        .fetch_optional(db.pool())
        .await?
    else {
        return Ok(None);
    };
    Ok(Some(OrderPayment {
        status: row.try_get(0)?,
        merchant_id: row.try_get(1)?,
        payment_ref: row.try_get(2)?,
        total_cents: row.try_get(3)?,
    }))
}
