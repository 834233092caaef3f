//! The `rest` provider: timeoutd's own HTTP shape, for a shop's translating service.
//!
//! The protocol [`HttpPaymentGateway`] speaks:
//! - `GET {base_url}/v1/payments/{ref}` → `200 {"status": "unpaid" | "paid" | "closed" |
//!   "not_found", "paid_at_ms"?: epoch ms, "amount_cents"?: cents}`; `404` is `not_found`;
//! - `POST {base_url}/v1/payments/{ref}/close` → `200 {"status":"closed"}` (a 2xx whose JSON
//!   `status` is anything else is not a close: retried), or
//!   `409 {"status":"already_paid"}` when the buyer's payment went through; "nothing to close"
//!   answers — `404` (no such payment: the buyer never opened the cashier) and
//!   `409 {"status":"already_closed"}` — settle the close as done, noted;
//! - `POST {base_url}/v1/payments/{ref}/refund` → `200`;
//! - every request carries `Authorization` when configured; close and refund carry the
//!   effect's idempotency key (header `payment.idempotency_header`), and the provider answers a
//!   repeated key as it answered the first time;
//! - each request times out after `payment.timeout`, body included; 408, 429, 5xx, redirects
//!   (never followed: [`crate::outbound`]) and connection errors are transient (retried
//!   `payment.attempts` times quickly, then by the ledger or the caller; a `Retry-After` is
//!   honoured by the ledger), other 4xx permanent.

use std::time::Duration;

use futures_util::future::BoxFuture;
use timeoutd_runtime::model::{Payment, PaymentStatus};

use super::{CloseOutcome, GatewayFuture, PaymentGateway};
use crate::config::PaymentConfig;
use crate::effects::EffectError;
use crate::retry::Backoff;

/// The HTTP adapter.
#[derive(Debug, Clone)]
pub struct HttpPaymentGateway {
    client: reqwest::Client,
    config: PaymentConfig,
}

impl HttpPaymentGateway {
    /// An adapter for the provider `config` names.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(config: &PaymentConfig) -> Result<Self, String> {
        let client = crate::outbound::client("payment", config.timeout)?;
        Ok(HttpPaymentGateway {
            client,
            config: config.clone(),
        })
    }

    /// POSTs to `/v1/payments/{ref}/{action}` (`action` empty: GETs `/v1/payments/{ref}`),
    /// retrying transient failures a few times quickly (the ledger reschedules beyond that).
    /// Returns the status and body; 404 and 409 are returned, not classified.
    async fn post(
        &self,
        payment_ref: &str,
        action: &str,
        key: &str,
    ) -> Result<(reqwest::StatusCode, String), EffectError> {
        let base = self.config.base_url.trim_end_matches('/');
        let url = if action.is_empty() {
            format!("{base}/v1/payments/{}", urlencode(payment_ref))
        } else {
            format!("{base}/v1/payments/{}/{action}", urlencode(payment_ref))
        };
        let backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        let mut failures = 0;
        loop {
            let mut request = if action.is_empty() {
                self.client.get(&url)
            } else {
                self.client
                    .post(&url)
                    .header(self.config.idempotency_header.as_str(), key)
            };
            if let Some(auth) = &self.config.authorization {
                request = request.header("Authorization", auth);
            }
            let result = match request.send().await {
                Ok(response) => {
                    let status = response.status();
                    let judged = EffectError::of_answer(&url, status, response.headers());
                    // A body cut off by the deadline (a peer trickling bytes) is no answer.
                    match response.text().await {
                        Ok(body) if matches!(status.as_u16(), 404 | 409) => {
                            return Ok((status, body));
                        }
                        Ok(body) => judged.map(|()| (status, body)),
                        Err(e) => Err(EffectError::Transient(format!(
                            "{url}: HTTP {status}, body not read: {e}"
                        ))),
                    }
                }
                Err(e) => Err(EffectError::Transient(format!("{url}: {e}"))),
            };
            match result {
                Err(EffectError::Transient(e)) if failures + 1 < self.config.attempts => {
                    failures += 1;
                    tracing::debug!(error = %e, failures, "payment provider call failed; retrying");
                    tokio::time::sleep(backoff.delay(failures)).await;
                }
                other => return other,
            }
        }
    }
}

impl PaymentGateway for HttpPaymentGateway {
    fn query<'a>(&'a self, payment_ref: &'a str) -> GatewayFuture<'a, Payment> {
        Box::pin(async move {
            let (status, body) = self.post(payment_ref, "", "").await?;
            if status.as_u16() == 404 {
                return Ok(Payment {
                    status: PaymentStatus::NotFound,
                    ..Payment::default()
                });
            }
            let unreadable = || {
                EffectError::Permanent(format!(
                    "query {payment_ref}: HTTP {status}, unreadable body {body}"
                ))
            };
            if status.as_u16() == 409 {
                return Err(unreadable());
            }
            let v: serde_json::Value = serde_json::from_str(&body).map_err(|_| unreadable())?;
            let status = match v["status"].as_str() {
                Some("unpaid") => PaymentStatus::Unpaid,
                Some("paid") => PaymentStatus::Paid,
                Some("closed") => PaymentStatus::Closed,
                Some("not_found") => PaymentStatus::NotFound,
                _ => return Err(unreadable()),
            };
            let paid = status == PaymentStatus::Paid;
            Ok(Payment {
                status,
                queried_at_ms: None,
                paid_at_ms: v["paid_at_ms"].as_i64().filter(|_| paid),
                paid_cents: v["amount_cents"].as_i64().filter(|_| paid),
            })
        })
    }

    fn close<'a>(&'a self, payment_ref: &'a str, key: &'a str) -> GatewayFuture<'a, CloseOutcome> {
        Box::pin(async move {
            let (status, body) = self.post(payment_ref, "close", key).await?;
            match status.as_u16() {
                404 => Ok(CloseOutcome::NothingToClose),
                409 if body.contains("already_paid") => Ok(CloseOutcome::AlreadyPaid),
                409 if body.contains("already_closed") => Ok(CloseOutcome::NothingToClose),
                409 => Err(EffectError::Permanent(format!(
                    "close {payment_ref}: HTTP 409 {body}"
                ))),
                // A 2xx: closed, unless its body says otherwise (a JSON `status` other than
                // `closed`); an empty or non-JSON body is the protocol's bare 200.
                _ => match serde_json::from_str::<serde_json::Value>(&body)
                    .ok()
                    .and_then(|v| v["status"].as_str().map(str::to_owned))
                    .as_deref()
                {
                    None | Some("closed") => Ok(CloseOutcome::Closed),
                    Some("already_paid") => Ok(CloseOutcome::AlreadyPaid),
                    Some("already_closed") => Ok(CloseOutcome::NothingToClose),
                    Some(other) => Err(EffectError::Transient(format!(
                        "close {payment_ref}: HTTP {status} answered status `{other}`, not `closed`: {body}"
                    ))),
                },
            }
        })
    }

    fn refund<'a>(&'a self, payment_ref: &'a str, key: &'a str) -> GatewayFuture<'a, ()> {
        Box::pin(async move {
            let (status, body) = self.post(payment_ref, "refund", key).await?;
            if matches!(status.as_u16(), 404 | 409) {
                return Err(EffectError::Permanent(format!(
                    "refund {payment_ref}: HTTP 409 {body}"
                )));
            }
            Ok(())
        })
    }
}

/// The `rest` adapter alone is dispatch's port too (the providers of [`super::Providers`] are
/// what the daemon hands in) for asking a payment's state before a close.
impl crate::dispatch::PaymentQuery for HttpPaymentGateway {
    fn query<'a>(
        &'a self,
        _merchant: &'a str,
        payment_ref: &'a str,
    ) -> BoxFuture<'a, Result<Payment, String>> {
        Box::pin(async move {
            PaymentGateway::query(self, payment_ref)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// Percent-encodes a path segment (payment references are opaque).
fn urlencode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
