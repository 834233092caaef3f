//! `POST /v1/providers/wechatpay/notify/{order}`: WeChat Pay's payment notification (支付通知),
//! the paid notice of a merchant on the `wechatpay` provider (served with
//! `[payment.wechatpay]`). The shop gives this URL, with the order's id, as the `notify_url` of
//! the order's pre-order (`POST /v3/pay/transactions/{native,jsapi,app,h5}`).
//!
//! Believed only when its `Wechatpay-Signature` verifies with the platform's public key over
//! `Wechatpay-Timestamp\nWechatpay-Nonce\nbody\n` (and `Wechatpay-Serial` names the configured
//! key, when its id is given), its `Wechatpay-Timestamp` is within
//! `payment.wechatpay.notify_tolerance` of the database clock, and its `resource` decrypts with
//! the APIv3 key ([`wechatpay::verify_notice`]); then the transaction's `mchid` must be
//! `payment.wechatpay.mchid` (and its `appid` `payment.wechatpay.appid`, when set), and the
//! order in the path must exist, carry `out_trade_no` as its `payment_ref`, belong to a
//! merchant on WeChat Pay and total `amount.total` fen. Each refusal is a 4xx
//! (`{"code":"FAIL","message","reason"}`), records nothing and is counted
//! (`timeoutd_payment_notices_refused_total{provider="wechatpay", reason}`). A believed
//! `TRANSACTION.SUCCESS` is applied through [`crate::paid::apply`] (PENDING → PAID; CLOSED →
//! paid-after-close, once) and answered `200 {"code":"SUCCESS","message":"成功"}` — which stops
//! WeChat Pay's retries — only once that has committed; a duplicate is a no-op and answered the
//! same; a database failure is a 503, which WeChat Pay retries (15 times over 24 hours). Other
//! events are acknowledged and ignored.

use std::collections::HashMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

use super::HttpState;
use crate::config::{Config, ProviderKind, Secret};
use crate::effects::Refusal;
use crate::effects::wechatpay::{self, Platform, SignedHeaders};

/// What the endpoint needs: the platform's key, the APIv3 key, the merchant (and app), the
/// replay window, each merchant's provider.
pub(super) struct WechatpayNotify {
    platform: Platform,
    apiv3_key: Secret,
    mchid: String,
    appid: Option<String>,
    tolerance_s: i64,
    on_wechatpay: HashMap<String, bool>,
}

impl WechatpayNotify {
    /// The endpoint of `config` (`None` without `[payment.wechatpay]`). A key that cannot be
    /// read leaves it unserved, logged (start-up refuses that config before).
    pub(super) fn from_config(config: &Config) -> Option<Self> {
        let w = config.payment.as_ref()?.wechatpay.as_ref()?;
        let keys = Platform::from_config(w, &config.base_dir).and_then(|platform| {
            w.apiv3_key
                .resolve(&config.base_dir)
                .map(|k| (platform, k))
                .map_err(|e| format!("payment.wechatpay.apiv3_key: {e}"))
        });
        let (platform, apiv3_key) = match keys {
            Ok(keys) => keys,
            Err(e) => {
                tracing::error!(error = %e, "WeChat Pay notifications are not served");
                return None;
            }
        };
        Some(WechatpayNotify {
            platform,
            apiv3_key,
            mchid: w.mchid.clone(),
            appid: w.appid.clone(),
            tolerance_s: w.notify_tolerance.as_secs() as i64,
            on_wechatpay: super::notice::merchants_on(config, ProviderKind::Wechatpay),
        })
    }
}

/// The answer that tells WeChat Pay the notification is applied (or needs nothing).
fn success() -> (StatusCode, Json<Value>) {
    (
        StatusCode::OK,
        Json(json!({ "code": "SUCCESS", "message": "成功" })),
    )
}

fn refuse(reason: Refusal, status: StatusCode, what: String) -> (StatusCode, Json<Value>) {
    crate::events::emit(crate::events::Event::NoticeRefused {
        provider: "wechatpay",
        reason: reason.as_str(),
    });
    (
        status,
        Json(json!({ "code": "FAIL", "message": what, "reason": reason.as_str() })),
    )
}

fn unavailable(e: String) -> (StatusCode, Json<Value>) {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({ "code": "FAIL", "message": e })),
    )
}

pub(super) async fn notify(
    State(state): State<HttpState>,
    Path(order_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Json<Value>) {
    let Some(hook) = state.wechatpay.as_deref() else {
        return (
            StatusCode::NOT_FOUND,
            Json(
                json!({ "code": "FAIL", "message": "WeChat Pay notifications are not configured ([payment.wechatpay])" }),
            ),
        );
    };
    let now_s = match super::notice::now_s(&state).await {
        Ok(now_s) => now_s,
        Err(e) => return unavailable(e),
    };
    let notice = match wechatpay::verify_notice(
        &SignedHeaders::of(&headers),
        &body,
        &hook.platform,
        &hook.apiv3_key,
        now_s,
        hook.tolerance_s,
    ) {
        Ok(notice) => notice,
        Err(reason) => {
            let what = match reason {
                Refusal::Unsigned => "no readable Wechatpay-Signature, -Timestamp or -Nonce",
                Refusal::Stale => "Wechatpay-Timestamp is outside the replay window",
                Refusal::Malformed => "not an AEAD_AES_256_GCM encrypt-resource notification",
                Refusal::Undecryptable => {
                    "the resource does not decrypt with payment.wechatpay.apiv3_key"
                }
                _ => "the signature does not verify with WeChat Pay's public key",
            };
            return refuse(reason, StatusCode::BAD_REQUEST, what.into());
        }
    };
    let paid = match notice.paid() {
        Ok(Some(paid)) => paid,
        // Another event, or a transaction not paid: nothing to apply; acknowledged.
        Ok(None) => return success(),
        Err(reason) => {
            return refuse(
                reason,
                StatusCode::BAD_REQUEST,
                "no mchid, out_trade_no or amount.total".into(),
            );
        }
    };
    if paid.mchid != hook.mchid
        || hook
            .appid
            .as_ref()
            .is_some_and(|a| paid.appid.as_ref() != Some(a))
    {
        return refuse(
            Refusal::Misaddressed,
            StatusCode::CONFLICT,
            "the notification is for another merchant (mchid) or app (appid)".into(),
        );
    }
    let applied = super::notice::Notice {
        order_id: &order_id,
        payment_ref: &paid.out_trade_no,
        cents: paid.fen,
        described: format!("transaction {} on WeChat Pay", paid.out_trade_no),
        source: "wechatpay-notify",
    };
    match super::notice::apply(&state, &hook.on_wechatpay, applied).await {
        Ok(_) => success(),
        Err(not_applied) => match not_applied.refusal(&order_id) {
            Ok((reason, status, what)) => refuse(reason, status, what),
            Err(e) => unavailable(e),
        },
    }
}
