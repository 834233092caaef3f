//! The payment port: asking a payment's state before a close, closing an order's payment,
//! and refunding one that succeeded after the close ([`PaymentGateway`]), one adapter per
//! provider protocol (`rest.rs`, `stripe.rs`, `alipay.rs`, `wechatpay.rs`), chosen per merchant
//! ([`Providers`]).
//!
//! Every adapter maps its provider's answers onto the same outcomes: paid (the order is
//! aligned), unpaid / closed / not found (the plugin decides; a close follows), nothing to
//! close, already paid (the paid-after-close path), retryable ([`EffectError::Transient`]) and
//! refused ([`EffectError::Permanent`]). Each speaks through [`crate::outbound`]: a deadline on
//! every request, redirects never followed.

pub mod alipay;
mod rest;
pub mod rsa;
pub mod stripe;
pub mod wechatpay;

pub use rest::HttpPaymentGateway;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use timeoutd_runtime::model::Payment;

use super::executor::{Done, EffectError, Executor, Job};
use super::work::PaymentWork;
use crate::clock::Clock;
use crate::config::{Config, PaidAfterClose, PaymentConfig, ProviderKind};
use crate::db::{Db, DbError, payments};
use crate::kinds::Section;

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

/// Why a provider's payment notice (a Stripe webhook, an Alipay or WeChat Pay notification) was
/// refused (the metric's `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No signature (`Stripe-Signature`, Alipay's `sign`, `Wechatpay-Signature`), or one that
    /// cannot be read.
    Unsigned,
    /// The signature does not match the notice (forged or altered).
    Signature,
    /// The signed timestamp is outside the tolerance (a replay, or a clock far off; Stripe,
    /// WeChat Pay).
    Stale,
    /// Signed, but its resource does not decrypt with the APIv3 key (WeChat Pay: the key
    /// configured is not the one set on the merchant platform).
    Undecryptable,
    /// The body is not a notice timeoutd can read.
    Malformed,
    /// The notice names no order timeoutd has.
    UnknownOrder,
    /// The order exists but its `payment_ref` is another payment, or its merchant is not on
    /// this provider, or the notice is for another app or seller (Alipay) or merchant
    /// (WeChat Pay's `mchid`, `appid`).
    Misaddressed,
    /// The amount paid is not the order's total.
    Amount,
}

impl Refusal {
    /// The label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Unsigned => "unsigned",
            Refusal::Signature => "signature",
            Refusal::Stale => "stale",
            Refusal::Undecryptable => "undecryptable",
            Refusal::Malformed => "malformed",
            Refusal::UnknownOrder => "unknown_order",
            Refusal::Misaddressed => "misaddressed",
            Refusal::Amount => "amount",
        }
    }
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

/// The executor of `close-payment` and `refund-payment` rows: the provider's adapter, and what
/// each merchant does with a payment found paid at close (`on_paid_after_close`). The
/// merchant's request cap (`payment.max_calls_per_second`, or its `payment` cap) is the
/// runner's, like every cap (`super::caps`): a row over it is deferred to the slot it booked,
/// so a 10,000-order flash sale reaches the provider at the cap's rate, in ledger order.
#[derive(Clone)]
pub struct PaymentEffects {
    providers: Providers,
    db: Db,
    clock: Clock,
    resolutions: Arc<HashMap<String, PaidAfterClose>>,
}

impl PaymentEffects {
    /// The executor over `providers`; `resolutions` is each merchant's `on_paid_after_close`
    /// ([`resolutions`]), the default for a merchant not in it.
    pub fn new(
        providers: Providers,
        db: Db,
        clock: Clock,
        resolutions: Arc<HashMap<String, PaidAfterClose>>,
    ) -> Self {
        PaymentEffects {
            providers,
            db,
            clock,
            resolutions,
        }
    }

    /// Closes the payment; "already paid" records the order as paid-after-close and raises a
    /// refund (or a manual review), which the runner then runs.
    async fn close(&self, job: Job<'_>, payment_ref: &str) -> Result<Done, EffectError> {
        let row = job.row;
        let gateway = self.providers.of(&row.merchant_id);
        match gateway.close(payment_ref, &row.key).await? {
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
            match job.payment_work()? {
                PaymentWork::Refund { payment_ref } => self
                    .providers
                    .of(&job.row.merchant_id)
                    .refund(&payment_ref, &job.row.key)
                    .await
                    .map(|()| Done::plain()),
                PaymentWork::Close { payment_ref } => self.close(job, &payment_ref).await,
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

/// The adapter of each merchant's payments: `payment.provider` unless the merchant names its
/// own `payment_provider`; one adapter per provider, shared by its merchants.
#[derive(Clone)]
pub struct Providers {
    default: Arc<dyn PaymentGateway>,
    merchants: Arc<HashMap<String, Arc<dyn PaymentGateway>>>,
}

impl Providers {
    /// `gateway` for every merchant.
    pub fn single(gateway: Arc<dyn PaymentGateway>) -> Self {
        Providers {
            default: gateway,
            merchants: Arc::default(),
        }
    }

    /// The adapters `config`'s `[payment]` names (`None` without one).
    ///
    /// # Errors
    /// When an adapter cannot be built (an HTTP client, a secret that cannot be read); the
    /// message never holds a secret.
    pub fn from_config(config: &Config) -> Result<Option<Self>, String> {
        let Some(payment) = &config.payment else {
            return Ok(None);
        };
        let mut built: HashMap<ProviderKind, Arc<dyn PaymentGateway>> = HashMap::new();
        for kind in config.payment_providers() {
            let gateway = gateway_of(kind, payment, &config.base_dir)?;
            built.insert(kind, gateway);
        }
        let default = built[&payment.provider].clone();
        let merchants = config
            .merchants
            .iter()
            .filter_map(|(id, m)| Some((id.clone(), built[&m.payment_provider?].clone())))
            .collect();
        Ok(Some(Providers {
            default,
            merchants: Arc::new(merchants),
        }))
    }

    /// The adapter of `merchant`'s payments.
    pub fn of(&self, merchant: &str) -> &dyn PaymentGateway {
        self.merchants
            .get(merchant)
            .unwrap_or(&self.default)
            .as_ref()
    }
}

/// The adapter of provider `kind` as `payment` describes it (`base_dir`: the config file's
/// folder).
///
/// # Errors
/// When it cannot be built (its table missing, a key that cannot be read or parsed, no HTTP
/// client); the message names the key, never its content.
pub fn gateway_of(
    kind: ProviderKind,
    payment: &PaymentConfig,
    base_dir: &std::path::Path,
) -> Result<Arc<dyn PaymentGateway>, String> {
    Ok(match kind {
        ProviderKind::Rest => Arc::new(HttpPaymentGateway::new(payment)?),
        ProviderKind::Stripe => Arc::new(stripe::StripeGateway::from_config(payment, base_dir)?),
        ProviderKind::Alipay => Arc::new(alipay::AlipayGateway::from_config(payment, base_dir)?),
        ProviderKind::Wechatpay => {
            Arc::new(wechatpay::WechatpayGateway::from_config(payment, base_dir)?)
        }
    })
}

/// The providers are dispatch's port for asking a payment's state before a close.
impl crate::dispatch::PaymentQuery for Providers {
    fn query<'a>(
        &'a self,
        merchant: &'a str,
        payment_ref: &'a str,
    ) -> BoxFuture<'a, Result<Payment, String>> {
        Box::pin(async move {
            self.of(merchant)
                .query(payment_ref)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// `dispatcher` asking `config`'s `[payment]` providers before closes (unchanged without one).
///
/// # Errors
/// When an adapter cannot be built.
pub fn with_provider(
    dispatcher: crate::dispatch::Dispatcher,
    config: &Config,
) -> Result<crate::dispatch::Dispatcher, String> {
    Ok(match (&config.payment, Providers::from_config(config)?) {
        (Some(p), Some(providers)) => dispatcher.with_payments(Arc::new(providers), p),
        _ => dispatcher,
    })
}
