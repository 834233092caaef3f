//! The `stripe` provider: an order's `payment_ref` is a PaymentIntent id (`pi_…`).
//!
//! - Query: `GET /v1/payment_intents/{id}`. `succeeded` and `requires_capture` (funds held for
//!   a manual capture) are paid, the order aligned; `requires_payment_method`,
//!   `requires_confirmation`, `requires_action` are unpaid; `canceled` is closed; 404
//!   (`resource_missing`) is not found; `processing` (a bank debit in flight) is no answer yet:
//!   retried like a provider that did not answer (`payment.on_unknown`).
//! - Close: `POST /v1/payment_intents/{id}/cancel` (`cancellation_reason`, the ledger row's key
//!   as `Idempotency-Key`). A refused cancel (400, e.g. `payment_intent_unexpected_state`) is
//!   read through the intent's status — from the error's `payment_intent`, else asked again:
//!   `succeeded` → already paid (paid-after-close, then refund or review); `canceled` →
//!   nothing to close; `processing` → retried; anything else refused. 404 → nothing to close.
//! - Refund: `POST /v1/refunds` with `payment_intent` and the ledger row's key as
//!   `Idempotency-Key` (Stripe answers a repeated key as it answered the first time);
//!   `charge_already_refunded` is done.
//! - Amounts: Stripe's minor units of the intent's currency, turned into the cents timeoutd
//!   stores ([`to_cents`]: zero-decimal currencies such as JPY ×100, three-decimal ones ÷10).
//! - Errors: 408, 409 (a concurrent request with the same key), 429, 5xx, redirects and
//!   `Stripe-Should-Retry: true` are retried; 401/403 (a wrong or restricted key) and other 4xx
//!   refused. The API key is sent as a bearer token and never written into an error.
//! - Webhooks: [`verify_signature`] checks `Stripe-Signature` (HMAC-SHA256 over `{t}.{body}`,
//!   `v1` signatures, the timestamp within the tolerance); `crate::http` serves the endpoint.

use std::path::Path;
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use timeoutd_runtime::model::{Payment, PaymentStatus};

use super::{CloseOutcome, GatewayFuture, PaymentGateway};
use crate::config::{PaymentConfig, Secret};
use crate::effects::EffectError;
use crate::retry::Backoff;

/// The Stripe adapter.
pub struct StripeGateway {
    client: reqwest::Client,
    base_url: String,
    api_key: Secret,
    cancellation_reason: String,
    attempts: u32,
}

impl StripeGateway {
    /// The adapter `[payment.stripe]` describes (`base_dir`: the config file's folder).
    ///
    /// # Errors
    /// No `[payment.stripe]`, an API key that cannot be read, or no HTTP client.
    pub fn from_config(payment: &PaymentConfig, base_dir: &Path) -> Result<Self, String> {
        let stripe = payment
            .stripe
            .as_ref()
            .ok_or("payment.stripe: missing, and a merchant uses provider `stripe`")?;
        let api_key = stripe
            .api_key
            .resolve(base_dir)
            .map_err(|e| format!("payment.stripe.api_key: {e}"))?;
        Ok(StripeGateway {
            client: crate::outbound::client("payment.stripe", payment.timeout)?,
            base_url: stripe.base_url.trim_end_matches('/').to_string(),
            api_key,
            cancellation_reason: stripe.cancellation_reason.clone(),
            attempts: payment.attempts.max(1),
        })
    }

    /// `text` with the API key blanked, should a peer ever echo it.
    fn redact(&self, text: &str) -> String {
        text.replace(self.api_key.expose(), "[redacted]")
    }

    /// One call, retrying transient failures a few times quickly (the ledger or the caller
    /// retries beyond that). Returns the status and JSON body of a 2xx, 400, 402 or 404; other
    /// answers are classified.
    async fn call(
        &self,
        method: Method,
        path: &str,
        form: &[(&str, &str)],
        key: Option<&str>,
    ) -> Result<(StatusCode, Value), EffectError> {
        let url = format!("{}{path}", self.base_url);
        let backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        let mut failures = 0;
        loop {
            let mut request = self
                .client
                .request(method.clone(), &url)
                .bearer_auth(self.api_key.expose());
            if !form.is_empty() {
                request = request.form(form);
            }
            if let Some(key) = key {
                request = request.header("Idempotency-Key", key);
            }
            let result = match request.send().await {
                Ok(response) => {
                    let status = response.status();
                    let should_retry = response
                        .headers()
                        .get("stripe-should-retry")
                        .and_then(|v| v.to_str().ok())
                        .map(|v| v == "true");
                    let judged = EffectError::of_answer(&url, status, response.headers());
                    match response.text().await {
                        Err(e) => Err(EffectError::Transient(format!(
                            "{url}: HTTP {status}, body not read: {e}"
                        ))),
                        Ok(body) => {
                            let json = serde_json::from_str::<Value>(&body).unwrap_or(Value::Null);
                            let message = || {
                                let m = json["error"]["message"].as_str().unwrap_or(&body);
                                self.redact(&format!("{url}: HTTP {status}: {m}"))
                            };
                            match (status.as_u16(), should_retry) {
                                (_, Some(true)) if !status.is_success() => {
                                    Err(EffectError::Transient(message()))
                                }
                                (200..=299 | 400 | 402 | 404, _) => return Ok((status, json)),
                                (409, _) => Err(EffectError::Transient(message())),
                                _ => judged.and(Err(EffectError::Permanent(message()))),
                            }
                        }
                    }
                }
                Err(e) => Err(EffectError::Transient(self.redact(&format!("{url}: {e}")))),
            };
            match result {
                Err(EffectError::Transient(e)) if failures + 1 < self.attempts => {
                    failures += 1;
                    tracing::debug!(error = %e, failures, "stripe call failed; retrying");
                    tokio::time::sleep(backoff.delay(failures)).await;
                }
                other => return other,
            }
        }
    }

    async fn retrieve(&self, intent: &str) -> Result<(StatusCode, Value), EffectError> {
        let path = format!("/v1/payment_intents/{}", segment(intent)?);
        self.call(Method::GET, &path, &[], None).await
    }
}

/// An intent id as a path segment: Stripe's ids are `[A-Za-z0-9_]`; anything else is refused
/// before it reaches a URL.
fn segment(intent: &str) -> Result<&str, EffectError> {
    if !intent.is_empty()
        && intent
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        Ok(intent)
    } else {
        Err(EffectError::Permanent(format!(
            "`{intent}` is not a Stripe PaymentIntent id"
        )))
    }
}

/// What an intent's status means for timeoutd.
fn payment_of(intent: &Value) -> Result<Payment, EffectError> {
    let id = intent["id"].as_str().unwrap_or("?");
    let status = match intent["status"].as_str() {
        Some("succeeded" | "requires_capture") => PaymentStatus::Paid,
        Some("requires_payment_method" | "requires_confirmation" | "requires_action") => {
            PaymentStatus::Unpaid
        }
        Some("canceled") => PaymentStatus::Closed,
        Some("processing") => {
            return Err(EffectError::Transient(format!(
                "PaymentIntent {id} is processing: paid or not is not known yet"
            )));
        }
        other => {
            return Err(EffectError::Permanent(format!(
                "PaymentIntent {id}: unknown status {other:?}"
            )));
        }
    };
    let paid = status == PaymentStatus::Paid;
    let minor = intent["amount_received"]
        .as_i64()
        .filter(|a| *a > 0)
        .or(intent["amount"].as_i64());
    let cents = match (minor, intent["currency"].as_str()) {
        (Some(minor), Some(currency)) if paid => to_cents(minor, currency),
        _ => None,
    };
    Ok(Payment {
        status,
        queried_at_ms: None,
        paid_at_ms: None,
        paid_cents: cents,
    })
}

/// Stripe's zero-decimal currencies (an amount of 1000 JPY is ¥1000).
const ZERO_DECIMAL: &[&str] = &[
    "bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga", "pyg", "rwf", "ugx", "vnd", "vuv",
    "xaf", "xof", "xpf",
];
/// Stripe's three-decimal currencies (amounts in thousandths).
const THREE_DECIMAL: &[&str] = &["bhd", "jod", "kwd", "omr", "tnd"];

/// An amount in `currency`'s minor units (Stripe's `amount`) as cents, hundredths of the
/// currency's unit (timeoutd's `total_cents`): ×100 for zero-decimal currencies, ÷10 for
/// three-decimal ones (`None` when not a whole cent), as it is for the rest.
pub fn to_cents(minor: i64, currency: &str) -> Option<i64> {
    let currency = currency.to_ascii_lowercase();
    if ZERO_DECIMAL.contains(&currency.as_str()) {
        minor.checked_mul(100)
    } else if THREE_DECIMAL.contains(&currency.as_str()) {
        (minor % 10 == 0).then_some(minor / 10)
    } else {
        Some(minor)
    }
}

impl PaymentGateway for StripeGateway {
    fn query<'a>(&'a self, payment_ref: &'a str) -> GatewayFuture<'a, Payment> {
        Box::pin(async move {
            let (status, body) = self.retrieve(payment_ref).await?;
            match status.as_u16() {
                404 => Ok(Payment {
                    status: PaymentStatus::NotFound,
                    ..Payment::default()
                }),
                200..=299 => payment_of(&body),
                _ => Err(EffectError::Permanent(self.redact(&format!(
                    "retrieve {payment_ref}: HTTP {status}: {body}"
                )))),
            }
        })
    }

    fn close<'a>(&'a self, payment_ref: &'a str, key: &'a str) -> GatewayFuture<'a, CloseOutcome> {
        Box::pin(async move {
            let path = format!("/v1/payment_intents/{}/cancel", segment(payment_ref)?);
            let form: &[(&str, &str)] = if self.cancellation_reason.is_empty() {
                &[]
            } else {
                &[("cancellation_reason", self.cancellation_reason.as_str())]
            };
            let (status, body) = self.call(Method::POST, &path, form, Some(key)).await?;
            let intent =
                match status.as_u16() {
                    404 => return Ok(CloseOutcome::NothingToClose),
                    200..=299 => body.clone(),
                    // Refused: the intent's state says why (Stripe puts it in the error; ask
                    // again when it does not, as fakes do not).
                    _ => match body["error"]["payment_intent"].clone() {
                        Value::Object(intent) => Value::Object(intent),
                        _ => {
                            let (again, intent) = self.retrieve(payment_ref).await?;
                            if again.as_u16() == 404 {
                                return Ok(CloseOutcome::NothingToClose);
                            }
                            if !again.is_success() {
                                return Err(EffectError::Permanent(self.redact(&format!(
                                    "cancel {payment_ref}: HTTP {status}: {body}"
                                ))));
                            }
                            intent
                        }
                    },
                };
            match intent["status"].as_str() {
                Some("canceled") if status.is_success() => Ok(CloseOutcome::Closed),
                Some("canceled") => Ok(CloseOutcome::NothingToClose),
                Some("succeeded") => Ok(CloseOutcome::AlreadyPaid),
                Some("processing") => Err(EffectError::Transient(format!(
                    "cancel {payment_ref}: the payment is processing; asked again later"
                ))),
                other => Err(EffectError::Permanent(self.redact(&format!(
                    "cancel {payment_ref}: HTTP {status}, intent status {other:?}: {}",
                    body["error"]["message"].as_str().unwrap_or_default()
                )))),
            }
        })
    }

    fn refund<'a>(&'a self, payment_ref: &'a str, key: &'a str) -> GatewayFuture<'a, ()> {
        Box::pin(async move {
            segment(payment_ref)?;
            let form = [("payment_intent", payment_ref)];
            let (status, body) = self
                .call(Method::POST, "/v1/refunds", &form, Some(key))
                .await?;
            if status.is_success() || body["error"]["code"] == "charge_already_refunded" {
                return Ok(());
            }
            Err(EffectError::Permanent(self.redact(&format!(
                "refund {payment_ref}: HTTP {status}: {}",
                body["error"]["message"].as_str().unwrap_or_default()
            ))))
        })
    }
}

pub use super::Refusal;

/// Checks a webhook's `Stripe-Signature` `header` over the raw `body` with the endpoint's
/// `secret`, as Stripe documents: the header's `t` and its `v1` signatures (others, such as
/// test-mode `v0`, ignored); HMAC-SHA256 of `{t}.{body}` must equal one of them (compared in
/// constant time), and `t` must be within `tolerance_s` of `now_s`.
///
/// # Errors
/// [`Refusal::Unsigned`], [`Refusal::Signature`] or [`Refusal::Stale`].
pub fn verify_signature(
    header: Option<&str>,
    body: &[u8],
    secret: &Secret,
    now_s: i64,
    tolerance_s: i64,
) -> Result<(), Refusal> {
    let header = header.ok_or(Refusal::Unsigned)?;
    let mut timestamp = None;
    let mut signatures = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", t)) => timestamp = Some(t),
            Some(("v1", sig)) => signatures.push(sig),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(Refusal::Unsigned)?;
    let t: i64 = timestamp.parse().map_err(|_| Refusal::Unsigned)?;
    if signatures.is_empty() {
        return Err(Refusal::Unsigned);
    }
    let mut mac = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret.expose().as_bytes())
        .expect("HMAC takes a key of any length");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    let good = signatures
        .iter()
        .any(|sig| hex::decode(sig).is_ok_and(|sig| mac.clone().verify_slice(&sig).is_ok()));
    if !good {
        return Err(Refusal::Signature);
    }
    if (now_s - t).abs() > tolerance_s {
        return Err(Refusal::Stale);
    }
    Ok(())
}

/// A `payment_intent.succeeded` event's intent: its id, `metadata.order_id` and the amount
/// received in cents. `Ok(None)` for any other event type (acknowledged, ignored).
///
/// # Errors
/// [`Refusal::Malformed`] for a body that is not such an event.
pub fn succeeded_intent(body: &[u8]) -> Result<Option<SucceededIntent>, Refusal> {
    let event: Value = serde_json::from_slice(body).map_err(|_| Refusal::Malformed)?;
    if event["type"].as_str().ok_or(Refusal::Malformed)? != "payment_intent.succeeded" {
        return Ok(None);
    }
    let intent = &event["data"]["object"];
    let id = intent["id"].as_str().ok_or(Refusal::Malformed)?;
    if intent["status"].as_str() != Some("succeeded") {
        return Err(Refusal::Malformed);
    }
    let payment = payment_of(intent).map_err(|_| Refusal::Malformed)?;
    Ok(Some(SucceededIntent {
        id: id.to_string(),
        order_id: intent["metadata"]["order_id"].as_str().map(str::to_string),
        cents: payment.paid_cents,
    }))
}

/// What a `payment_intent.succeeded` event says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SucceededIntent {
    /// The intent's id (the order's `payment_ref`).
    pub id: String,
    /// `metadata.order_id`, set by the shop when it created the intent.
    pub order_id: Option<String>,
    /// The amount received, in cents.
    pub cents: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(secret: &str, t: i64, body: &str) -> String {
        let mut mac = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(format!("{t}.{body}").as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    #[test]
    fn minor_units_become_cents_per_currency() {
        assert_eq!(to_cents(1999, "usd"), Some(1999));
        assert_eq!(to_cents(1000, "JPY"), Some(100_000));
        assert_eq!(to_cents(1234, "kwd"), None);
        assert_eq!(to_cents(1230, "kwd"), Some(123));
    }

    #[test]
    fn a_signature_is_checked_over_timestamp_and_body_within_the_tolerance() {
        let secret = Secret::for_tests("whsec_test");
        let body = r#"{"type":"payment_intent.succeeded"}"#;
        let good = format!("t=1000,v1=00,v1={}", sign("whsec_test", 1000, body));
        let ok = |h: &str, b: &str, now| verify_signature(Some(h), b.as_bytes(), &secret, now, 300);
        assert_eq!(ok(&good, body, 1100), Ok(()));
        assert_eq!(
            ok(&good, &body.replace("succeeded", "failed"), 1100),
            Err(Refusal::Signature)
        );
        assert_eq!(ok(&good, body, 1301), Err(Refusal::Stale));
        let other = format!("t=1000,v1={}", sign("whsec_other", 1000, body));
        assert_eq!(ok(&other, body, 1000), Err(Refusal::Signature));
        // The timestamp is signed: moving it forward breaks the signature.
        assert_eq!(
            ok(&good.replace("t=1000", "t=1200"), body, 1200),
            Err(Refusal::Signature)
        );
        assert_eq!(ok("v1=abc", body, 1000), Err(Refusal::Unsigned));
        assert_eq!(
            verify_signature(None, b"", &secret, 0, 300),
            Err(Refusal::Unsigned)
        );
    }
}
