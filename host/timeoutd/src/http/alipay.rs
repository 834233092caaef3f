//! `POST /v1/providers/alipay/notify/{order}`: Alipay's asynchronous notification (异步通知), the
//! paid notice of a merchant on the `alipay` provider (served with `[payment.alipay]`). The shop
//! gives this URL, with the order's id, as the `notify_url` of the order's pre-order
//! (`alipay.trade.precreate`).
//!
//! A form POST (`application/x-www-form-urlencoded`, UTF-8), believed only when its `sign`
//! verifies with Alipay's public key over the other parameters without `sign` and `sign_type`
//! ([`alipay::verify_notice`]); then its `app_id` must be `payment.alipay.app_id` (and its
//! `seller_id`, when `payment.alipay.seller_id` is set, that seller), and the order in the path
//! must exist, carry `out_trade_no` as its `payment_ref`, belong to a merchant on Alipay and
//! total `total_amount`. Each refusal is a 4xx (`{"error", "reason"}`), records nothing and is
//! counted (`timeoutd_payment_notices_refused_total{provider="alipay", reason}`). A believed
//! `TRADE_SUCCESS` or `TRADE_FINISHED` is applied through [`crate::paid::apply`] (PENDING →
//! PAID; CLOSED → paid-after-close, once) and answered with the plain text `success` — which
//! stops Alipay's retries — only once that has committed; a duplicate is a no-op and answered
//! `success` too; a database failure is a 503, which Alipay retries (up to 8 times over 25
//! hours). Other trade statuses are acknowledged (`success`) and ignored.

use std::collections::HashMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::HttpState;
use crate::config::{Config, ProviderKind};

use crate::effects::Refusal;
use crate::effects::{alipay, rsa};

/// What the endpoint needs: Alipay's public key, the app (and seller), each merchant's provider.
pub(super) struct AlipayNotify {
    key: rsa::PublicKey,
    app_id: String,
    seller_id: Option<String>,
    on_alipay: HashMap<String, bool>,
}

impl AlipayNotify {
    /// The endpoint of `config` (`None` without `[payment.alipay]`). A key that cannot be read
    /// leaves it unserved, logged (start-up refuses that config before).
    pub(super) fn from_config(config: &Config) -> Option<Self> {
        let a = config.payment.as_ref()?.alipay.as_ref()?;
        let key = match a
            .alipay_public_key
            .resolve(&config.base_dir)
            .and_then(|s| rsa::public_key(&s))
        {
            Ok(key) => key,
            Err(e) => {
                tracing::error!(error = %e, "payment.alipay.alipay_public_key: Alipay notifications are not served");
                return None;
            }
        };
        Some(AlipayNotify {
            key,
            app_id: a.app_id.clone(),
            seller_id: a.seller_id.clone(),
            on_alipay: super::notice::merchants_on(config, ProviderKind::Alipay),
        })
    }
}

/// The plain text that tells Alipay the notification is applied (or needs nothing): it stops
/// retrying. Anything else is retried.
fn success() -> Response {
    (StatusCode::OK, "success").into_response()
}

fn refuse(reason: Refusal, status: StatusCode, what: String) -> Response {
    crate::events::emit(crate::events::Event::NoticeRefused {
        provider: "alipay",
        reason: reason.as_str(),
    });
    (
        status,
        Json(json!({ "error": what, "reason": reason.as_str() })),
    )
        .into_response()
}

fn unavailable(e: impl std::fmt::Display) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({ "error": e.to_string() })),
    )
        .into_response()
}

pub(super) async fn notify(
    State(state): State<HttpState>,
    Path(order_id): Path<String>,
    body: Bytes,
) -> Response {
    let Some(hook) = state.alipay.as_deref() else {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({ "error": "Alipay notifications are not configured ([payment.alipay])" })),
        )
            .into_response();
    };
    let params = match alipay::verify_notice(&body, &hook.key) {
        Ok(params) => params,
        Err(reason) => {
            let what = match reason {
                Refusal::Unsigned => "no sign",
                Refusal::Malformed => "not a UTF-8 form of distinct parameters",
                _ => "the signature does not verify with Alipay's public key",
            };
            return refuse(reason, StatusCode::BAD_REQUEST, what.into());
        }
    };
    let notice = match alipay::paid_notice(&params) {
        Ok(notice) => notice,
        Err(reason) => {
            return refuse(
                reason,
                StatusCode::BAD_REQUEST,
                "no app_id, out_trade_no, trade_status or amount".into(),
            );
        }
    };
    if notice.app_id != hook.app_id
        || hook
            .seller_id
            .as_ref()
            .is_some_and(|s| notice.seller_id.as_ref() != Some(s))
    {
        return refuse(
            Refusal::Misaddressed,
            StatusCode::CONFLICT,
            "the notice is for another app or seller".into(),
        );
    }
    if !notice.paid {
        // WAIT_BUYER_PAY, TRADE_CLOSED: nothing to apply; acknowledged so Alipay stops.
        return success();
    }
    let paid = super::notice::Notice {
        order_id: &order_id,
        payment_ref: &notice.out_trade_no,
        cents: notice.cents,
        described: format!("trade {} on Alipay", notice.out_trade_no),
        source: "alipay-notify",
    };
    match super::notice::apply(&state, &hook.on_alipay, paid).await {
        Ok(_) => success(),
        Err(not_applied) => match not_applied.refusal(&order_id) {
            Ok((reason, status, what)) => refuse(reason, status, what),
            Err(e) => unavailable(e),
        },
    }
}
