//! `POST /v1/providers/stripe/webhook`: Stripe's `payment_intent.succeeded` event, the paid
//! notice of a merchant on the `stripe` provider (served with `payment.stripe.webhook_secret`).
//!
//! Believed only when its `Stripe-Signature` verifies over the raw body under the endpoint's
//! signing secret, with its signed timestamp within `payment.stripe.webhook_tolerance` of the
//! database clock ([`stripe::verify_signature`]); then its order — `metadata.order_id` of the
//! intent, which the shop sets when it creates the intent — must exist, carry the intent's id
//! as `payment_ref`, belong to a merchant on Stripe, and total what was received. Each refusal
//! is a 4xx, records nothing and is counted by reason
//! (`timeoutd_payment_notices_refused_total{provider="stripe", reason}`). A believed notice is
//! applied through [`crate::paid::apply`] (PENDING → PAID; CLOSED → paid-after-close, once) and
//! answered 2xx only once that has committed; a database failure is a 503, which Stripe
//! retries. Other event types are acknowledged (`200 {"status":"ignored"}`).

use std::collections::HashMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

use super::HttpState;
use super::notice::NotApplied;
use crate::config::{Config, ProviderKind, Secret};
use crate::effects::stripe::{self, Refusal};
use crate::paid::Applied;

/// What the endpoint needs: the signing secret, the tolerance, each merchant's provider.
pub(super) struct StripeWebhook {
    secret: Secret,
    tolerance_s: i64,
    on_stripe: HashMap<String, bool>,
}

impl StripeWebhook {
    /// The endpoint of `config` (`None` without `payment.stripe.webhook_secret`). A secret that
    /// cannot be read leaves it unserved, logged (validation refuses that config before).
    pub(super) fn from_config(config: &Config) -> Option<Self> {
        let stripe = config.payment.as_ref()?.stripe.as_ref()?;
        let secret = match stripe.webhook_secret.as_ref()?.resolve(&config.base_dir) {
            Ok(secret) => secret,
            Err(e) => {
                tracing::error!(error = %e, "payment.stripe.webhook_secret: Stripe webhooks are not served");
                return None;
            }
        };
        Some(StripeWebhook {
            secret,
            tolerance_s: stripe.webhook_tolerance.as_secs() as i64,
            on_stripe: super::notice::merchants_on(config, ProviderKind::Stripe),
        })
    }
}

fn refuse(reason: Refusal, status: StatusCode, what: String) -> (StatusCode, Json<Value>) {
    crate::events::emit(crate::events::Event::NoticeRefused {
        provider: "stripe",
        reason: reason.as_str(),
    });
    (
        status,
        Json(json!({ "error": what, "reason": reason.as_str() })),
    )
}

pub(super) async fn webhook(
    State(state): State<HttpState>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Json<Value>) {
    let Some(hook) = state.stripe.as_deref() else {
        return (
            StatusCode::NOT_FOUND,
            Json(
                json!({ "error": "Stripe webhooks are not configured (payment.stripe.webhook_secret)" }),
            ),
        );
    };
    let now_s = match super::notice::now_s(&state).await {
        Ok(now_s) => now_s,
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "error": e }))),
    };
    let signature = headers
        .get("stripe-signature")
        .and_then(|v| v.to_str().ok());
    if let Err(reason) =
        stripe::verify_signature(signature, &body, &hook.secret, now_s, hook.tolerance_s)
    {
        let what = match reason {
            Refusal::Stale => "the signed timestamp is outside the tolerance",
            Refusal::Unsigned => "no readable Stripe-Signature header",
            _ => "the signature does not match the body",
        };
        return refuse(reason, StatusCode::BAD_REQUEST, what.into());
    }
    let intent = match stripe::succeeded_intent(&body) {
        Ok(Some(intent)) => intent,
        Ok(None) => return (StatusCode::OK, Json(json!({ "status": "ignored" }))),
        Err(reason) => {
            return refuse(
                reason,
                StatusCode::BAD_REQUEST,
                "not a readable event".into(),
            );
        }
    };
    let Some(order_id) = intent.order_id.clone() else {
        return refuse(
            Refusal::UnknownOrder,
            StatusCode::NOT_FOUND,
            format!("PaymentIntent {} has no metadata.order_id", intent.id),
        );
    };
    let notice = super::notice::Notice {
        order_id: &order_id,
        payment_ref: &intent.id,
        cents: intent.cents,
        described: format!("PaymentIntent {} on Stripe", intent.id),
        source: "stripe-webhook",
    };
    match super::notice::apply(&state, &hook.on_stripe, notice).await {
        Ok(Applied::Missing) => unreachable!("a missing order is refused"),
        Ok(Applied::AlreadyPaid) => (
            StatusCode::OK,
            Json(json!({ "status": "paid", "new": false })),
        ),
        Ok(Applied::Aligned) => (
            StatusCode::OK,
            Json(json!({ "status": "paid", "new": true })),
        ),
        Ok(Applied::AfterClose { resolution, new }) => (
            StatusCode::OK,
            Json(
                json!({ "status": "paid_after_close", "resolution": resolution.as_str(), "new": new }),
            ),
        ),
        Err(NotApplied::NoShard(refused)) => refused,
        Err(NotApplied::Refused(reason, status, what)) => refuse(reason, status, what),
        Err(NotApplied::Unavailable(e)) => {
            (StatusCode::SERVICE_UNAVAILABLE, Json(json!({ "error": e })))
        }
    }
}
