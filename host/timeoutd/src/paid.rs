//! A paid notice — the provider's HTTP callback, or seed 003's "cancel the timeout" message on
//! the paid topic — applied once, whatever its order's state:
//! - PENDING: aligned to PAID (compare-and-set, the coupon used); the timeout that comes later
//!   finds it PAID and is a no-op, and a timeout racing it loses the compare-and-set (F12);
//! - PAID: nothing to do (a duplicate);
//! - CLOSED: a paid-after-close (F13), recorded once with its refund or manual review as the
//!   merchant's `on_paid_after_close` says; stock and coupons are not touched again;
//! - missing: reported, for the caller to answer 404 or dead-letter.

use std::collections::HashMap;

use crate::clock::Clock;
use crate::config::PaidAfterClose;
use crate::db::payments::{self, OrderPayment};
use crate::db::{Db, DbError, orders};

/// What a paid notice came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The order was PENDING and is PAID now.
    Aligned,
    /// The order was PAID already.
    AlreadyPaid,
    /// The order was CLOSED: a paid-after-close with its `resolution`; `new` is false when it
    /// was recorded before (a repeated notice). A refund, when raised, is a PENDING ledger row.
    AfterClose {
        /// What the merchant does with it.
        resolution: PaidAfterClose,
        /// Whether this notice recorded it.
        new: bool,
    },
    /// No such order.
    Missing,
}

impl Applied {
    /// Whether this notice recorded a paid-after-close, whose refund (or review) is a new
    /// PENDING ledger row: every caller then hands the order to the after-commit path (the
    /// ledger worker in the daemon), the HTTP endpoints as the paid topic. A repeated notice
    /// raises nothing new; its row is already the worker's.
    pub fn raised_refund(self) -> bool {
        matches!(self, Applied::AfterClose { new: true, .. })
    }
}

/// Applies a paid notice for `order_id` from `source` (`callback`, `paid-message`), reading
/// each merchant's `on_paid_after_close` from `resolutions`. The caller hands the order to its
/// after-commit path when [`Applied::raised_refund`].
///
/// # Errors
/// [`DbError`] when the database cannot be read or written; nothing was applied.
pub async fn apply(
    db: &Db,
    clock: &Clock,
    resolutions: &HashMap<String, PaidAfterClose>,
    order_id: &str,
    source: &str,
) -> Result<Applied, DbError> {
    let applied = apply_once(db, clock, resolutions, order_id, source).await?;
    let (merchant, outcome) = match &applied {
        (_, Applied::Missing) => ("", "missing"),
        (m, Applied::Aligned) => (m.as_str(), "aligned"),
        (m, Applied::AlreadyPaid) => (m.as_str(), "duplicate"),
        (m, Applied::AfterClose { new: true, .. }) => (m.as_str(), "after-close"),
        (m, Applied::AfterClose { new: false, .. }) => (m.as_str(), "after-close-repeat"),
    };
    crate::events::emit(crate::events::Event::PaidNotice {
        merchant,
        source,
        outcome,
    });
    Ok(applied.1)
}

/// [`apply`] without its event: what the notice came to, with the order's merchant.
async fn apply_once(
    db: &Db,
    clock: &Clock,
    resolutions: &HashMap<String, PaidAfterClose>,
    order_id: &str,
    source: &str,
) -> Result<(String, Applied), DbError> {
    let Some(OrderPayment {
        status,
        merchant_id,
        payment_ref,
        ..
    }) = payments::order_payment(db, order_id).await?
    else {
        return Ok((String::new(), Applied::Missing));
    };
    let now_ms = clock.now_ms(db).await?;
    match status.as_str() {
        "PAID" => Ok((merchant_id, Applied::AlreadyPaid)),
        "PENDING" => {
            let mut tx = db.begin().await?;
            let paid = orders::pay(&mut tx, db.schema(), order_id, now_ms, now_ms).await?;
            tx.commit().await?;
            if paid {
                tracing::info!(order = order_id, source, "paid notice: aligned to PAID");
                crate::events::emit(crate::events::Event::Aligned);
                Ok((merchant_id, Applied::Aligned))
            } else {
                // Closed or paid between the read and the compare-and-set: apply it again.
                Box::pin(apply_once(db, clock, resolutions, order_id, source)).await
            }
        }
        _ => {
            let resolution = resolutions.get(&merchant_id).copied().unwrap_or_default();
            let mut tx = db.begin().await?;
            let new = payments::record_paid_after_close(
                &mut tx,
                order_id,
                &merchant_id,
                payment_ref.as_deref(),
                source,
                resolution.as_str(),
                now_ms,
            )
            .await?;
            tx.commit().await?;
            Ok((merchant_id, Applied::AfterClose { resolution, new }))
        }
    }
}
