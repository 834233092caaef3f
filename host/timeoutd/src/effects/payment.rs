//! The payment provider: closing an order's payment, and refunding one that succeeded after the
//! close.
//!
//! HTTP protocol (what [`HttpPaymentGateway`] speaks):
//! - `POST {base_url}/v1/payments/{ref}/close` → `200 {"status":"closed"}` (also when already
//!   closed), or `409 {"status":"already_paid"}` when the buyer's payment went through;
//! - `POST {base_url}/v1/payments/{ref}/refund` → `200`;
//! - both carry the effect's idempotency key (header `payment.idempotency_header`); the provider
//!   answers a repeated key as it answered the first time;
//! - 408, 429, 5xx and connection errors are transient, other 4xx permanent.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use super::EffectError;
use super::notify::classify_status;
use crate::config::PaymentConfig;
use crate::retry::Backoff;

/// A boxed future, for the object-safe gateway trait.
pub type GatewayFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, EffectError>> + Send + 'a>>;

/// What closing a payment found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseOutcome {
    /// Closed (or it already was): the buyer can no longer pay.
    Closed,
    /// The buyer's payment succeeded first: the order is paid-after-close.
    AlreadyPaid,
}

/// A payment provider adapter.
pub trait PaymentGateway: Send + Sync {
    /// Closes payment `payment_ref`; `idempotency_key` makes a repeat harmless.
    fn close<'a>(
        &'a self,
        payment_ref: &'a str,
        idempotency_key: &'a str,
    ) -> GatewayFuture<'a, CloseOutcome>;
    /// Refunds payment `payment_ref`.
    fn refund<'a>(
        &'a self,
        payment_ref: &'a str,
        idempotency_key: &'a str,
    ) -> GatewayFuture<'a, ()>;
}

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
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .build()
            .map_err(|e| format!("payment http client: {e}"))?;
        Ok(HttpPaymentGateway {
            client,
            config: config.clone(),
        })
    }

    /// POSTs to `/v1/payments/{ref}/{action}`, retrying transient failures a few times quickly
    /// (the ledger reschedules beyond that). Returns the status and body.
    async fn post(
        &self,
        payment_ref: &str,
        action: &str,
        key: &str,
    ) -> Result<(reqwest::StatusCode, String), EffectError> {
        let url = format!(
            "{}/v1/payments/{}/{action}",
            self.config.base_url.trim_end_matches('/'),
            urlencode(payment_ref)
        );
        let backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        let mut failures = 0;
        loop {
            let mut request = self
                .client
                .post(&url)
                .header(self.config.idempotency_header.as_str(), key);
            if let Some(auth) = &self.config.authorization {
                request = request.header("Authorization", auth);
            }
            let result = match request.send().await {
                Ok(response) => {
                    let status = response.status();
                    let body = response.text().await.unwrap_or_default();
                    if status.as_u16() == 409 {
                        return Ok((status, body));
                    }
                    classify_status(&url, status).map(|()| (status, body))
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
    fn close<'a>(&'a self, payment_ref: &'a str, key: &'a str) -> GatewayFuture<'a, CloseOutcome> {
        Box::pin(async move {
            let (status, body) = self.post(payment_ref, "close", key).await?;
            if status.as_u16() == 409 {
                if body.contains("already_paid") {
                    return Ok(CloseOutcome::AlreadyPaid);
                }
                return Err(EffectError::Permanent(format!(
                    "close {payment_ref}: HTTP 409 {body}"
                )));
            }
            Ok(CloseOutcome::Closed)
        })
    }

    fn refund<'a>(&'a self, payment_ref: &'a str, key: &'a str) -> GatewayFuture<'a, ()> {
        Box::pin(async move {
            let (status, body) = self.post(payment_ref, "refund", key).await?;
            if status.as_u16() == 409 {
                return Err(EffectError::Permanent(format!(
                    "refund {payment_ref}: HTTP 409 {body}"
                )));
            }
            Ok(())
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
