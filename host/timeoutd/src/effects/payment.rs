//! The payment provider: asking a payment's state before a close, closing an order's payment,
//! and refunding one that succeeded after the close.
//!
//! HTTP protocol (what [`HttpPaymentGateway`] speaks; a provider with another protocol is
//! another [`PaymentGateway`]):
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

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use timeoutd_runtime::model::{Effect, Payment, PaymentStatus};

use super::executor::{Done, EffectError, Executor, Job};
use crate::clock::Clock;
use crate::config::{Config, PaidAfterClose, PaymentConfig};
use crate::db::{Db, DbError, payments};
use crate::kinds::{LedgerKind, Section};
use crate::ratecap::RateCap;
use crate::retry::Backoff;

/// A boxed future, for the object-safe gateway trait.
pub type GatewayFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, EffectError>> + Send + 'a>>;

/// What closing a payment found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseOutcome {
    /// Closed: the buyer can no longer pay.
    Closed,
    /// Nothing to close: the provider has no such payment, or it was closed already.
    NothingToClose,
    /// The buyer's payment succeeded first: the order is paid-after-close.
    AlreadyPaid,
}

/// A payment provider adapter.
pub trait PaymentGateway: Send + Sync {
    /// The payment `payment_ref` as the provider has it now (`queried_at_ms` is left `None`:
    /// the caller stamps it with the database clock).
    ///
    /// # Errors
    /// [`EffectError::Transient`] when the provider cannot be reached or answers 5xx after the
    /// quick retries; permanent for an answer it cannot read.
    fn query<'a>(&'a self, payment_ref: &'a str) -> GatewayFuture<'a, Payment> {
        let _ = payment_ref;
        Box::pin(async {
            Err(EffectError::Permanent(
                "this provider cannot be queried".into(),
            ))
        })
    }
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

/// The executor of `close-payment` and `refund-payment` rows: the provider's adapter, what
/// each merchant does with a payment found paid at close (`on_paid_after_close`), and the
/// merchant's request cap (`payment.max_calls_per_second`): a row over the cap is deferred to
/// the slot it booked, not run and not failed, so a 10,000-order flash sale reaches the
/// provider at the cap's rate, in ledger order.
#[derive(Clone)]
pub struct PaymentEffects {
    gateway: Arc<dyn PaymentGateway>,
    db: Db,
    clock: Clock,
    resolutions: Arc<HashMap<String, PaidAfterClose>>,
    calls: Arc<RateCap>,
    /// Slots booked by deferred rows (ledger id → epoch ms), honoured when the row comes back
    /// instead of booking another. Per daemon, in memory: after a restart a row books afresh.
    booked: Arc<std::sync::Mutex<HashMap<i64, i64>>>,
}

/// Booked slots kept before the ones long past are pruned (rows another daemon finished).
const BOOKED_PRUNE_AT: usize = 100_000;

impl PaymentEffects {
    /// The executor over `gateway`; `resolutions` is each merchant's `on_paid_after_close`
    /// ([`resolutions`]), the default for a merchant not in it; `calls_per_second` caps each
    /// merchant's close and refund requests (bursts of as many).
    pub fn new(
        gateway: Arc<dyn PaymentGateway>,
        db: Db,
        clock: Clock,
        resolutions: Arc<HashMap<String, PaidAfterClose>>,
        calls_per_second: u32,
    ) -> Self {
        PaymentEffects {
            gateway,
            db,
            clock,
            resolutions,
            calls: Arc::new(RateCap::new(calls_per_second)),
            booked: Arc::default(),
        }
    }

    /// Admits `job` to the provider now, or defers it to the slot its merchant's cap books for
    /// it (the slot it booked before, when it comes back).
    fn admit(&self, job: &Job<'_>) -> Result<(), EffectError> {
        let mut booked = self.booked.lock().expect("booked slots lock poisoned");
        let slot = booked
            .remove(&job.row.id)
            .unwrap_or_else(|| self.calls.reserve(&job.row.merchant_id, job.now_ms));
        if slot <= job.now_ms {
            return Ok(());
        }
        if booked.len() >= BOOKED_PRUNE_AT {
            booked.retain(|_, at| *at > job.now_ms - 600_000);
        }
        booked.insert(job.row.id, slot);
        Err(EffectError::Deferred {
            until_ms: slot,
            reason: "provider request cap (payment.max_calls_per_second) spent".into(),
        })
    }

    /// Closes the payment; "already paid" records the order as paid-after-close and raises a
    /// refund (or a manual review), which the runner then runs.
    async fn close(&self, job: Job<'_>, payment_ref: &str) -> Result<Done, EffectError> {
        let row = job.row;
        match self.gateway.close(payment_ref, &row.key).await? {
            CloseOutcome::Closed => Ok(Done::plain()),
            CloseOutcome::NothingToClose => Ok(Done::noted(
                "provider: nothing to close (no such payment, or closed already)",
            )),
            CloseOutcome::AlreadyPaid => {
                let resolution = self
                    .resolutions
                    .get(&row.merchant_id)
                    .copied()
                    .unwrap_or_default();
                record_paid_after_close(
                    &self.db,
                    &self.clock,
                    &row.order_id,
                    &row.merchant_id,
                    Some(payment_ref),
                    "close-payment",
                    resolution,
                )
                .await?;
                Ok(Done {
                    note: Some(format!("provider: already paid; {}", resolution.as_str())),
                    raised: true,
                })
            }
        }
    }
}

impl Executor for PaymentEffects {
    fn section(&self) -> Section {
        Section::Payment
    }

    fn execute<'a>(&'a self, job: Job<'a>) -> BoxFuture<'a, Result<Done, EffectError>> {
        Box::pin(async move {
            self.admit(&job)?;
            match job.kind {
                LedgerKind::Refund => {
                    let payment_ref = serde_json::from_str::<serde_json::Value>(&job.row.payload)
                        .ok()
                        .and_then(|v| v["payment_ref"].as_str().map(str::to_string))
                        .ok_or_else(|| job.unreadable())?;
                    self.gateway
                        .refund(&payment_ref, &job.row.key)
                        .await
                        .map(|()| Done::plain())
                }
                _ => match serde_json::from_str::<Effect>(&job.row.payload) {
                    Ok(Effect::ClosePayment { payment_ref }) => self.close(job, &payment_ref).await,
                    _ => Err(job.unreadable()),
                },
            }
        })
    }
}

/// Each merchant's `on_paid_after_close`, by merchant id.
pub fn resolutions(config: &Config) -> Arc<HashMap<String, PaidAfterClose>> {
    let map = config
        .merchants
        .iter()
        .map(|(id, m)| (id.clone(), m.on_paid_after_close))
        .collect();
    Arc::new(map)
}

/// Records a paid-after-close order (found by close-payment or told by a payment callback),
/// with the refund it raises when `resolution` is `refund`, in one transaction. Returns false
/// when it was already recorded.
///
/// # Errors
/// [`DbError`] when the record cannot be written.
pub async fn record_paid_after_close(
    db: &Db,
    clock: &Clock,
    order_id: &str,
    merchant_id: &str,
    payment_ref: Option<&str>,
    source: &str,
    resolution: PaidAfterClose,
) -> Result<bool, DbError> {
    let now = clock.now_ms(db).await?;
    let mut tx = db.begin().await?;
    let new = payments::record_paid_after_close(
        &mut tx,
        order_id,
        merchant_id,
        payment_ref,
        source,
        resolution.as_str(),
        now,
    )
    .await?;
    tx.commit().await?;
    Ok(new)
}

/// The gateway is dispatch's port for asking a payment's state before a close.
impl crate::dispatch::PaymentQuery for HttpPaymentGateway {
    fn query<'a>(&'a self, payment_ref: &'a str) -> BoxFuture<'a, Result<Payment, String>> {
        Box::pin(async move {
            PaymentGateway::query(self, payment_ref)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// `dispatcher` asking `config`'s `[payment]` provider before closes (unchanged without one).
///
/// # Errors
/// When the provider's HTTP client cannot be built.
pub fn with_provider(
    dispatcher: crate::dispatch::Dispatcher,
    config: &Config,
) -> Result<crate::dispatch::Dispatcher, String> {
    Ok(match &config.payment {
        Some(p) => dispatcher.with_payments(Arc::new(HttpPaymentGateway::new(p)?), p),
        None => dispatcher,
    })
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
