//! The `alipay` provider: Alipay's OpenAPI gateway, the `alipay.trade.*` methods macrozheng/mall
//! calls around face-to-face payment (当面付, seed 002). An order's `payment_ref` is its trade's
//! `out_trade_no`.
//!
//! - Every request is a form POST to `payment.alipay.gateway` with the common parameters
//!   (`app_id`, `method`, `format=JSON`, `charset=utf-8`, `sign_type=RSA2`, `timestamp` as
//!   `yyyy-MM-dd HH:mm:ss` in Asia/Shanghai, `version=1.0`) and `biz_content` (JSON), signed
//!   RSA2 as Alipay documents ([`sign_content`]: every parameter but `sign` and the empty ones,
//!   sorted by key, `k=v` joined by `&`, raw values in UTF-8; SHA256withRSA, PKCS#1 v1.5,
//!   base64) with the app's private key.
//! - Every answer is believed only once its `sign` verifies with Alipay's public key over the
//!   exact text of its `alipay_trade_*_response` object, as the answer carried it (never
//!   re-serialized). An unsigned or unverifiable answer is an error — retried like a provider
//!   that did not answer, its `code`/`sub_code` in the error for the operator, its content never
//!   acted on.
//! - `code` 10000 is success. `20000` (`isp.unknow-error`), any `isp.*` and `ACQ.SYSTEM_ERROR`
//!   are retried; `ACQ.TRADE_NOT_EXIST` is not found (the buyer never scanned the pre-order's
//!   code, so Alipay has no trade yet) and, for a close, nothing to close; other business errors
//!   are refused with Alipay's `sub_code` and `sub_msg`.
//! - Query (`alipay.trade.query`): `WAIT_BUYER_PAY` unpaid, `TRADE_SUCCESS` and `TRADE_FINISHED`
//!   paid (`total_amount`, a yuan string, taken to cents exactly: [`yuan_to_cents`]; `send_pay_date`
//!   as the time paid), `TRADE_CLOSED` closed.
//! - Close (`alipay.trade.close`): success is closed; `ACQ.TRADE_STATUS_ERROR` (the trade is
//!   paid, or closed already) is read through a query — paid → already paid (paid-after-close,
//!   then refund or review), closed or gone → nothing to close.
//! - Refund (`alipay.trade.refund`): the trade's `total_amount` (asked first, as Alipay states
//!   it) refunded in full under `out_request_no` = the ledger row's key, which Alipay makes
//!   idempotent: a repeat is answered success without moving money again.
//! - Notifications ([`verify_notice`], [`paid_notice`]): the form's `sign` verified over the
//!   other parameters without `sign` and `sign_type`; `crate::http` serves the endpoint.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use serde_json::value::RawValue;
use timeoutd_runtime::model::{Payment, PaymentStatus};

use super::rsa::{PrivateKey, PublicKey};
use super::{CloseOutcome, GatewayFuture, PaymentGateway, Refusal, rsa};
use crate::config::PaymentConfig;
use crate::effects::EffectError;
use crate::retry::Backoff;

/// Asia/Shanghai's offset from UTC (no daylight saving since 1991), ms.
const SHANGHAI_MS: i64 = 8 * 3_600_000;

/// The Alipay adapter.
pub struct AlipayGateway {
    client: reqwest::Client,
    gateway: String,
    app_id: String,
    app_key: PrivateKey,
    alipay_key: PublicKey,
    attempts: u32,
}

impl AlipayGateway {
    /// The adapter `[payment.alipay]` describes (`base_dir`: the config file's folder).
    ///
    /// # Errors
    /// No `[payment.alipay]`, a key that cannot be read or is no RSA key of the kind needed, or
    /// no HTTP client. The message names the key, never its content.
    pub fn from_config(payment: &PaymentConfig, base_dir: &Path) -> Result<Self, String> {
        let alipay = payment
            .alipay
            .as_ref()
            .ok_or("payment.alipay: missing, and a merchant uses provider `alipay`")?;
        let app_key = alipay
            .app_private_key
            .resolve(base_dir)
            .and_then(|s| rsa::private_key(&s))
            .map_err(|e| format!("payment.alipay.app_private_key: {e}"))?;
        let alipay_key = alipay
            .alipay_public_key
            .resolve(base_dir)
            .and_then(|s| rsa::public_key(&s))
            .map_err(|e| format!("payment.alipay.alipay_public_key: {e}"))?;
        Ok(AlipayGateway {
            client: crate::outbound::client("payment.alipay", payment.timeout)?,
            gateway: alipay.gateway.clone(),
            app_id: alipay.app_id.clone(),
            app_key,
            alipay_key,
            attempts: payment.attempts.max(1),
        })
    }

    /// The signed form of one request: the common parameters and `biz_content`, with `sign`.
    fn signed_form(&self, method: &str, biz: &Value, now_ms: i64) -> Vec<(&'static str, String)> {
        let mut form: Vec<(&'static str, String)> = vec![
            ("app_id", self.app_id.clone()),
            ("method", method.to_string()),
            ("format", "JSON".into()),
            ("charset", "utf-8".into()),
            ("sign_type", "RSA2".into()),
            ("timestamp", shanghai_time(now_ms)),
            ("version", "1.0".into()),
            ("biz_content", biz.to_string()),
        ];
        let content = sign_content(form.iter().map(|(k, v)| (*k, v.as_str())), &["sign"]);
        let sign = self.app_key.sign(content.as_bytes());
        form.push(("sign", sign));
        form
    }

    /// One call of `method` with `biz`, retrying transient failures a few times quickly (the
    /// ledger or the caller retries beyond that). Returns the verified response object of a
    /// success (`Ok(Ok)`) or of a business error (`Ok(Err)`); retryable answers, unsigned or
    /// unverifiable ones and transport failures are errors.
    async fn call(&self, method: &str, biz: &Value) -> Result<Result<Value, Refused>, EffectError> {
        let backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        let mut failures = 0;
        loop {
            let form = self.signed_form(method, biz, crate::clock::wall_ms());
            let result = match self.client.post(&self.gateway).form(&form).send().await {
                Ok(response) => {
                    let status = response.status();
                    let judged = EffectError::of_answer(&self.gateway, status, response.headers());
                    match response.text().await {
                        Err(e) => Err(EffectError::Transient(format!(
                            "{method}: HTTP {status}, body not read: {e}"
                        ))),
                        Ok(body) => match judged {
                            Err(e) => Err(e),
                            Ok(()) => self.believe(method, &body).and_then(classify),
                        },
                    }
                }
                Err(e) => Err(EffectError::Transient(format!("{method}: {e}"))),
            };
            match result {
                Err(EffectError::Transient(e)) if failures + 1 < self.attempts => {
                    failures += 1;
                    tracing::debug!(error = %e, failures, "alipay call failed; retrying");
                    tokio::time::sleep(backoff.delay(failures)).await;
                }
                other => return other.map_err(|e| named(e, method)),
            }
        }
    }

    /// The response object of `method`'s answer `body`, once its signature verifies.
    fn believe(&self, method: &str, body: &str) -> Result<Value, EffectError> {
        let (object, signature) = response_parts(method, body).map_err(EffectError::Transient)?;
        let read = serde_json::from_str::<Value>(object.get()).unwrap_or(Value::Null);
        let Some(signature) = signature else {
            return Err(EffectError::Transient(format!(
                "an unsigned answer, not believed (code {}, sub_code {}: {})",
                read["code"], read["sub_code"], read["sub_msg"]
            )));
        };
        if !self
            .alipay_key
            .verifies(object.get().as_bytes(), &signature)
        {
            return Err(EffectError::Transient(
                "the answer's signature does not verify with payment.alipay.alipay_public_key; \
                 not believed"
                    .into(),
            ));
        }
        Ok(read)
    }

    async fn query_trade(&self, out_trade_no: &str) -> Result<Result<Value, Refused>, EffectError> {
        self.call(
            "alipay.trade.query",
            &serde_json::json!({ "out_trade_no": out_trade_no }),
        )
        .await
    }
}

/// `e` with `method` before its message.
fn named(e: EffectError, method: &str) -> EffectError {
    match e {
        EffectError::Transient(m) if !m.starts_with(method) => {
            EffectError::Transient(format!("{method}: {m}"))
        }
        EffectError::Permanent(m) if !m.starts_with(method) => {
            EffectError::Permanent(format!("{method}: {m}"))
        }
        other => other,
    }
}

/// A business error Alipay answered (signed): `code`, `sub_code`, `sub_msg`.
#[derive(Debug)]
struct Refused {
    code: String,
    sub_code: String,
    sub_msg: String,
}

impl Refused {
    fn is(&self, sub_code: &str) -> bool {
        self.sub_code == sub_code
    }

    fn refused(&self, what: &str) -> EffectError {
        EffectError::Permanent(format!("{what}: refused by Alipay: {self}"))
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "code {} {} ({})", self.code, self.sub_code, self.sub_msg)
    }
}

/// A verified response object: success, a business error, or a retryable answer.
fn classify(object: Value) -> Result<Result<Value, Refused>, EffectError> {
    let text = |k: &str| object[k].as_str().unwrap_or_default().to_string();
    let (code, sub_code) = (text("code"), text("sub_code"));
    if code == "10000" {
        return Ok(Ok(object));
    }
    let sub_msg = match text("sub_msg") {
        m if m.is_empty() => text("msg"),
        m => m,
    };
    let refused = Refused {
        code,
        sub_code,
        sub_msg,
    };
    if refused.code == "20000"
        || refused.is("ACQ.SYSTEM_ERROR")
        || refused.sub_code.starts_with("isp.")
    {
        return Err(EffectError::Transient(format!(
            "Alipay answered a retryable error: {refused}"
        )));
    }
    Ok(Err(refused))
}

/// The raw response object (`{method with _ for .}_response`, else `error_response`) and the
/// `sign` beside it, from an answer's `body`.
fn response_parts(method: &str, body: &str) -> Result<(Box<RawValue>, Option<String>), String> {
    let mut top: std::collections::HashMap<String, Box<RawValue>> = serde_json::from_str(body)
        .map_err(|_| "the answer is not a JSON object; not believed".to_string())?;
    let name = format!("{}_response", method.replace('.', "_"));
    let object = top
        .remove(&name)
        .or_else(|| top.remove("error_response"))
        .ok_or_else(|| format!("the answer has no `{name}`; not believed"))?;
    let signature = match top.remove("sign") {
        Some(raw) => serde_json::from_str::<String>(raw.get())
            .ok()
            .filter(|s| !s.is_empty()),
        None => None,
    };
    Ok((object, signature))
}

/// What a trade's state (a verified `alipay.trade.query` answer) means for timeoutd.
fn payment_of(trade: &Value) -> Result<Payment, EffectError> {
    let status = match trade["trade_status"].as_str() {
        Some("TRADE_SUCCESS" | "TRADE_FINISHED") => PaymentStatus::Paid,
        Some("WAIT_BUYER_PAY") => PaymentStatus::Unpaid,
        Some("TRADE_CLOSED") => PaymentStatus::Closed,
        other => {
            return Err(EffectError::Permanent(format!(
                "trade {}: unknown trade_status {other:?}",
                trade["out_trade_no"]
            )));
        }
    };
    if status != PaymentStatus::Paid {
        return Ok(Payment {
            status,
            ..Payment::default()
        });
    }
    let cents = trade["total_amount"].as_str().and_then(yuan_to_cents);
    if cents.is_none() {
        return Err(EffectError::Permanent(format!(
            "trade {}: total_amount {} is not an amount in yuan",
            trade["out_trade_no"], trade["total_amount"]
        )));
    }
    Ok(Payment {
        status,
        queried_at_ms: None,
        paid_at_ms: trade["send_pay_date"].as_str().and_then(shanghai_ms),
        paid_cents: cents,
    })
}

/// An amount in yuan as Alipay writes it (`"88.88"`, `"88.8"`, `"88"`) in cents, exactly;
/// `None` for anything else (a sign, a third decimal, an exponent, no digits).
pub fn yuan_to_cents(yuan: &str) -> Option<i64> {
    let (whole, fraction) = yuan.split_once('.').unwrap_or((yuan, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(fraction) || fraction.len() > 2 {
        return None;
    }
    if yuan.contains('.') && fraction.is_empty() {
        return None;
    }
    let cents = format!("{fraction:0<2}").parse::<i64>().ok()?;
    whole
        .parse::<i64>()
        .ok()?
        .checked_mul(100)?
        .checked_add(cents)
}

/// Epoch ms as Alipay's `timestamp`: `yyyy-MM-dd HH:mm:ss` in Asia/Shanghai.
pub fn shanghai_time(epoch_ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(epoch_ms + SHANGHAI_MS)
        .map(|t| t.naive_utc().format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_default()
}

/// Alipay's `yyyy-MM-dd HH:mm:ss` in Asia/Shanghai as epoch ms.
fn shanghai_ms(text: &str) -> Option<i64> {
    chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S")
        .ok()
        .map(|t| t.and_utc().timestamp_millis() - SHANGHAI_MS)
}

/// The text Alipay signs: the parameters but those named in `without` and those with an empty
/// value, sorted by key, as `k=v` joined by `&`, values as they are (not URL-encoded). Requests
/// leave out `sign`; notifications `sign` and `sign_type`.
pub fn sign_content<'a>(
    params: impl IntoIterator<Item = (&'a str, &'a str)>,
    without: &[&str],
) -> String {
    let mut kept: Vec<(&str, &str)> = params
        .into_iter()
        .filter(|(k, v)| !k.is_empty() && !v.is_empty() && !without.contains(k))
        .collect();
    kept.sort_unstable();
    kept.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

impl PaymentGateway for AlipayGateway {
    fn query<'a>(&'a self, payment_ref: &'a str) -> GatewayFuture<'a, Payment> {
        Box::pin(async move {
            match self.query_trade(payment_ref).await? {
                Ok(trade) => payment_of(&trade),
                Err(r) if r.is("ACQ.TRADE_NOT_EXIST") => Ok(Payment {
                    status: PaymentStatus::NotFound,
                    ..Payment::default()
                }),
                Err(r) => Err(r.refused(&format!("query {payment_ref}"))),
            }
        })
    }

    fn close<'a>(&'a self, payment_ref: &'a str, _key: &'a str) -> GatewayFuture<'a, CloseOutcome> {
        Box::pin(async move {
            let biz = serde_json::json!({ "out_trade_no": payment_ref });
            match self.call("alipay.trade.close", &biz).await? {
                Ok(_) => Ok(CloseOutcome::Closed),
                Err(r) if r.is("ACQ.TRADE_NOT_EXIST") => Ok(CloseOutcome::NothingToClose),
                // Paid, or closed already: the trade's state says which.
                Err(r) if r.is("ACQ.TRADE_STATUS_ERROR") => {
                    match self.query(payment_ref).await?.status {
                        PaymentStatus::Paid => Ok(CloseOutcome::AlreadyPaid),
                        PaymentStatus::Closed | PaymentStatus::NotFound => {
                            Ok(CloseOutcome::NothingToClose)
                        }
                        PaymentStatus::Unpaid | PaymentStatus::Unknown => {
                            Err(EffectError::Transient(format!(
                                "close {payment_ref}: Alipay refused the close ({r}) of a trade it reports unpaid; asked again later"
                            )))
                        }
                    }
                }
                Err(r) => Err(r.refused(&format!("close {payment_ref}"))),
            }
        })
    }

    fn refund<'a>(&'a self, payment_ref: &'a str, key: &'a str) -> GatewayFuture<'a, ()> {
        Box::pin(async move {
            // The amount Alipay took, as Alipay states it: refunded in full.
            let trade = match self.query_trade(payment_ref).await? {
                Ok(trade) => trade,
                Err(r) => return Err(r.refused(&format!("refund {payment_ref}: query"))),
            };
            let amount = trade["total_amount"]
                .as_str()
                .filter(|a| yuan_to_cents(a).is_some())
                .ok_or_else(|| {
                    EffectError::Permanent(format!(
                        "refund {payment_ref}: the trade's total_amount {} is not an amount in yuan",
                        trade["total_amount"]
                    ))
                })?;
            let biz = serde_json::json!({
                "out_trade_no": payment_ref,
                "refund_amount": amount,
                "out_request_no": key,
            });
            match self.call("alipay.trade.refund", &biz).await? {
                Ok(_) => Ok(()),
                Err(r) => Err(r.refused(&format!("refund {payment_ref}"))),
            }
        })
    }
}

/// A notification's parameters, once its `sign` verifies with Alipay's public `key` over the
/// others without `sign` and `sign_type` ([`sign_content`]).
///
/// # Errors
/// [`Refusal::Malformed`] (not a form, a repeated parameter, a charset other than UTF-8),
/// [`Refusal::Unsigned`] (no `sign`), [`Refusal::Signature`] (forged or altered, or not RSA2).
pub fn verify_notice(body: &[u8], key: &PublicKey) -> Result<Vec<(String, String)>, Refusal> {
    let params: Vec<(String, String)> =
        serde_urlencoded::from_bytes(body).map_err(|_| Refusal::Malformed)?;
    let mut names: Vec<&str> = params.iter().map(|(k, _)| k.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return Err(Refusal::Malformed);
    }
    let get = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    if get("charset").is_some_and(|c| !c.eq_ignore_ascii_case("utf-8")) {
        return Err(Refusal::Malformed);
    }
    let signature = get("sign")
        .filter(|s| !s.is_empty())
        .ok_or(Refusal::Unsigned)?;
    if get("sign_type").is_some_and(|t| t != "RSA2") {
        return Err(Refusal::Signature);
    }
    let content = sign_content(
        params.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        &["sign", "sign_type"],
    );
    if !key.verifies(content.as_bytes(), signature) {
        return Err(Refusal::Signature);
    }
    Ok(params)
}

/// What a verified notification says of its trade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// `app_id`: the app the trade belongs to.
    pub app_id: String,
    /// `seller_id`, when given.
    pub seller_id: Option<String>,
    /// `out_trade_no` (the order's `payment_ref`).
    pub out_trade_no: String,
    /// Whether `trade_status` says paid (`TRADE_SUCCESS`, `TRADE_FINISHED`).
    pub paid: bool,
    /// `total_amount` in cents.
    pub cents: Option<i64>,
}

/// The trade a verified notification (its `params`) speaks of.
///
/// # Errors
/// [`Refusal::Malformed`] without `app_id`, `out_trade_no` or `trade_status`, or with a paid
/// status and a `total_amount` that is no amount in yuan.
pub fn paid_notice(params: &[(String, String)]) -> Result<Notice, Refusal> {
    let get = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty())
    };
    let status = get("trade_status").ok_or(Refusal::Malformed)?;
    let paid = matches!(status.as_str(), "TRADE_SUCCESS" | "TRADE_FINISHED");
    let cents = get("total_amount").and_then(|a| yuan_to_cents(&a));
    if paid && cents.is_none() {
        return Err(Refusal::Malformed);
    }
    Ok(Notice {
        app_id: get("app_id").ok_or(Refusal::Malformed)?,
        seller_id: get("seller_id"),
        out_trade_no: get("out_trade_no").ok_or(Refusal::Malformed)?,
        paid,
        cents,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yuan_become_cents_exactly() {
        assert_eq!(yuan_to_cents("34.90"), Some(3490));
        assert_eq!(yuan_to_cents("34.9"), Some(3490));
        assert_eq!(yuan_to_cents("34"), Some(3400));
        assert_eq!(yuan_to_cents("0.01"), Some(1));
        assert_eq!(yuan_to_cents("19999999.99"), Some(1_999_999_999));
        for bad in [
            "", ".5", "1.", "1.234", "-1.00", "1e2", " 1.00", "1,00", "+1",
        ] {
            assert_eq!(yuan_to_cents(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_signed_text_is_sorted_without_sign_and_empty_values() {
        let params = [
            ("sign", "xyz"),
            ("method", "alipay.trade.query"),
            ("app_id", "2021"),
            ("notify_url", ""),
            ("biz_content", "{\"out_trade_no\":\"a b&c\"}"),
            ("sign_type", "RSA2"),
        ];
        assert_eq!(
            sign_content(params, &["sign"]),
            "app_id=2021&biz_content={\"out_trade_no\":\"a b&c\"}&method=alipay.trade.query&sign_type=RSA2"
        );
        assert_eq!(
            sign_content(params, &["sign", "sign_type"]),
            "app_id=2021&biz_content={\"out_trade_no\":\"a b&c\"}&method=alipay.trade.query"
        );
    }

    #[test]
    fn times_are_written_and_read_in_shanghai() {
        // 2026-11-29T10:00:00Z is 18:00 in Shanghai.
        assert_eq!(shanghai_time(1_795_946_400_000), "2026-11-29 18:00:00");
        assert_eq!(shanghai_ms("2026-11-29 18:00:00"), Some(1_795_946_400_000));
    }

    #[test]
    fn the_response_object_is_taken_as_the_answer_wrote_it() {
        let body =
            r#"{"alipay_trade_query_response": {"code": "10000", "msg": "Success"},"sign":"c2ln"}"#;
        let (object, sign) = response_parts("alipay.trade.query", body).unwrap();
        assert_eq!(object.get(), r#"{"code": "10000", "msg": "Success"}"#);
        assert_eq!(sign.as_deref(), Some("c2ln"));
        let (object, sign) = response_parts(
            "alipay.trade.close",
            r#"{"error_response":{"code":"40002"}}"#,
        )
        .unwrap();
        assert_eq!(object.get(), r#"{"code":"40002"}"#);
        assert_eq!(sign, None);
        assert!(response_parts("alipay.trade.close", "<html>").is_err());
    }

    #[test]
    fn answers_are_classified_by_code_and_sub_code() {
        let answer = |code: &str, sub: &str| {
            classify(serde_json::json!({ "code": code, "sub_code": sub, "msg": "m" }))
        };
        assert!(matches!(answer("10000", ""), Ok(Ok(_))));
        assert!(
            matches!(answer("40004", "ACQ.TRADE_NOT_EXIST"), Ok(Err(r)) if r.is("ACQ.TRADE_NOT_EXIST"))
        );
        for (code, sub) in [
            ("40004", "ACQ.SYSTEM_ERROR"),
            ("20000", "isp.unknow-error"),
            ("40004", "isp.anything"),
        ] {
            assert!(
                matches!(answer(code, sub), Err(EffectError::Transient(_))),
                "{code} {sub}"
            );
        }
        assert!(matches!(
            answer("40002", "isv.invalid-signature"),
            Ok(Err(_))
        ));
    }
}
