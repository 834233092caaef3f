//! A provider's paid notice once its signature is believed (Stripe's webhook, Alipay's async
//! notify, WeChat Pay's notification): the checks against the order and its application, and
//! the clock a signed timestamp is held against, shared by every provider's endpoint, which
//! keeps only its own reading of the request and its own answer's shape.

use std::collections::HashMap;

use axum::Json;
use axum::http::StatusCode;
use serde_json::Value;

use super::HttpState;
use crate::config::{Config, ProviderKind};
use crate::db::payments;
use crate::effects::Refusal;
use crate::paid::Applied;

/// Which merchants of `config` pay through `kind` (merchant id → whether).
pub(super) fn merchants_on(config: &Config, kind: ProviderKind) -> HashMap<String, bool> {
    config
        .merchants
        .keys()
        .map(|id| (id.clone(), config.payment_provider_of(id) == kind))
        .collect()
}

/// The database clock, epoch seconds: a notice's signed timestamp is held against it (the
/// first database's; every shard's clock is the same kind).
///
/// # Errors
/// The database's error, for a 503 the provider retries.
pub(super) async fn now_s(state: &HttpState) -> Result<i64, String> {
    let (_, db, effects) = &state.shards[0];
    effects
        .clock()
        .now_ms(db)
        .await
        .map(|ms| ms.div_euclid(1000))
        .map_err(|e| e.to_string())
}

/// What a believed notice says: the order it names, the provider's reference of the payment,
/// the amount received (cents), and how to name it in a refusal (`trade T on Alipay`).
pub(super) struct Notice<'a> {
    /// The order id the notice names.
    pub order_id: &'a str,
    /// The provider's payment reference, which must be the order's `payment_ref`.
    pub payment_ref: &'a str,
    /// The amount received, cents (`None` when the notice has none readable).
    pub cents: Option<i64>,
    /// The payment as a refusal names it, e.g. `PaymentIntent pi_1 on Stripe`.
    pub described: String,
    /// The paid notice's source as recorded (`stripe-webhook`, `alipay-notify`).
    pub source: &'static str,
}

/// Why a believed notice was not applied.
pub(super) enum NotApplied {
    /// No shard can hold the order id: the routing's own answer.
    NoShard((StatusCode, Json<Value>)),
    /// Refused, nothing recorded: the reason counted, the status, what was wrong.
    Refused(Refusal, StatusCode, String),
    /// The database failed: a 5xx, which the provider retries.
    Unavailable(String),
}

impl NotApplied {
    /// Why nothing was applied, for an endpoint that answers every refusal in its provider's own
    /// shape (Alipay, WeChat Pay): `Ok` the refusal (an order no shard can hold is an unknown
    /// order, with the routing's status), `Err` the database's failure for a 5xx.
    pub(super) fn refusal(self, order_id: &str) -> Result<(Refusal, StatusCode, String), String> {
        match self {
            NotApplied::NoShard((status, _)) => Ok((
                Refusal::UnknownOrder,
                status,
                format!("no shard holds order `{order_id}`"),
            )),
            NotApplied::Refused(reason, status, what) => Ok((reason, status, what)),
            NotApplied::Unavailable(e) => Err(e),
        }
    }
}

/// Checks `notice` against its order — it exists, carries the notice's payment reference,
/// belongs to a merchant on this provider (`on_provider`), and totals what was received — and
/// applies it through [`crate::paid::apply`] (PENDING → PAID; CLOSED → paid-after-close,
/// whose refund then runs). Returns what the application found, committed.
///
/// # Errors
/// [`NotApplied`] naming why nothing was applied.
pub(super) async fn apply(
    state: &HttpState,
    on_provider: &HashMap<String, bool>,
    notice: Notice<'_>,
) -> Result<Applied, NotApplied> {
    let order_id = notice.order_id;
    let (db, effects) = state.shard(order_id).map_err(NotApplied::NoShard)?;
    let missing = || {
        NotApplied::Refused(
            Refusal::UnknownOrder,
            StatusCode::NOT_FOUND,
            format!("order `{order_id}` does not exist"),
        )
    };
    let order = payments::order_payment(db, order_id)
        .await
        .map_err(|e| NotApplied::Unavailable(e.to_string()))?
        .ok_or_else(missing)?;
    if order.payment_ref.as_deref() != Some(notice.payment_ref)
        || !on_provider
            .get(&order.merchant_id)
            .copied()
            .unwrap_or(false)
    {
        return Err(NotApplied::Refused(
            Refusal::Misaddressed,
            StatusCode::CONFLICT,
            format!(
                "order `{order_id}` is not paid through {}",
                notice.described
            ),
        ));
    }
    if notice.cents != Some(order.total_cents) {
        return Err(NotApplied::Refused(
            Refusal::Amount,
            StatusCode::CONFLICT,
            format!(
                "received {:?} cents, the order totals {}",
                notice.cents, order.total_cents
            ),
        ));
    }
    let applied = crate::paid::apply(
        db,
        effects.clock(),
        &state.resolutions,
        order_id,
        notice.source,
    )
    .await
    .map_err(|e| {
        tracing::error!(order = %order_id, source = notice.source, error = %e, "paid notice failed");
        NotApplied::Unavailable(e.to_string())
    })?;
    match applied {
        Applied::Missing => Err(missing()),
        Applied::AfterClose { .. } | Applied::AlreadyPaid | Applied::Aligned => {
            state.after_paid(effects, order_id, applied).await;
            Ok(applied)
        }
    }
}
