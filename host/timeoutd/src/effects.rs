//! The ledger executor: carries out the recorded effects that live outside the database.
//!
//! The close transaction records every effect of a decision in `effect_ledger`; effects inside
//! the database are applied there and then. This module runs the rest — notices, the Redis
//! flash-sale effects, payment close and refunds — and settles each row once:
//! - a row is taken under a lease (`claim_until_ms`), so two executors never run it at once;
//! - every effect carries its idempotency key to where it lands (a Redis marker set in the same
//!   Lua script, the provider's `Idempotency-Key`, the webhook's header), so a replay after a
//!   crash between doing and settling changes nothing;
//! - a transient failure (timeout, 5xx, Redis down) reschedules the row with backoff, across
//!   restarts; a permanent one (4xx, unreadable payload) or too many attempts marks it FAILED
//!   with the reason, logged at error level for the on-call.

mod flash;
mod notify;
mod payment;
pub mod worker;

use std::sync::Arc;

use timeoutd_runtime::model::{Effect, Notice};

pub use flash::FlashSale;
pub use notify::Notifier;
pub use payment::{CloseOutcome, HttpPaymentGateway, PaymentGateway};

use crate::clock::Clock;
use crate::config::{Config, EffectsConfig, PaidAfterClose};
use crate::db::ledger::REMIND;
use crate::db::payments::{self, REFUND};
use crate::db::{Db, DbError, ledger, orders};
use crate::retry::Backoff;

/// Ledger rows read per page.
const PAGE: u32 = 500;

/// Ledger kinds the executor carries out.
pub const RUNNABLE: &[&str] = &[
    "notify",
    REMIND,
    "restore-flash-stock",
    "release-flash-slot",
    "close-payment",
    REFUND,
];

/// The config section whose executor carries out ledger rows of `kind`, when one is needed
/// beyond the always-present notifier: `"redis"` for the flash-sale effects, `"payment"` for
/// payment close and refunds. The one place this rule lives: [`EffectRunner`] reads only the
/// kinds it can run, and [`unexecuted`] warns about the others.
pub fn executor_section(kind: &str) -> Option<&'static str> {
    match kind {
        "restore-flash-stock" | "release-flash-slot" => Some("redis"),
        "close-payment" | REFUND => Some("payment"),
        _ => None,
    }
}

/// One warning per merchant whose plugin may ask for effects that no configured executor runs
/// (its `granted_effects`, or every kind when unset): e.g. `merchants.flashy: its plugin may
/// ask for restore-flash-stock, release-flash-slot, but [redis] is not configured; those ledger
/// rows stay PENDING until a daemon with [redis] runs them`. Empty when everything is covered.
pub fn unexecuted(config: &Config) -> Vec<String> {
    let configured = |section: &str| match section {
        "redis" => config.redis.is_some(),
        "payment" => config.payment.is_some(),
        _ => true,
    };
    let mut warnings = Vec::new();
    for (id, merchant) in &config.merchants {
        let kinds: Vec<&str> = match &merchant.granted_effects {
            Some(granted) => granted.iter().map(String::as_str).collect(),
            None => timeoutd_runtime::guard::EFFECT_KINDS.to_vec(),
        };
        let mut missing: Vec<(&str, Vec<&str>)> = Vec::new();
        for kind in kinds {
            let Some(section) = executor_section(kind).filter(|s| !configured(s)) else {
                continue;
            };
            match missing.iter_mut().find(|(s, _)| *s == section) {
                Some((_, ks)) => ks.push(kind),
                None => missing.push((section, vec![kind])),
            }
        }
        for (section, kinds) in missing {
            warnings.push(format!(
                "merchants.{id}: its plugin may ask for {}, but [{section}] is not configured; \
                 those ledger rows stay PENDING until a daemon with [{section}] runs them \
                 (or narrow merchants.{id}.granted_effects)",
                kinds.join(", ")
            ));
        }
    }
    warnings
}

/// Why an effect did not happen this time.
#[derive(Debug, thiserror::Error)]
pub enum EffectError {
    /// May pass: try again later (timeouts, 5xx, connection refused).
    #[error("{0}")]
    Transient(String),
    /// Will not pass by retrying (4xx, bad payload).
    #[error("{0}")]
    Permanent(String),
}

/// What a successful execution noted.
type Done = Option<String>;

/// Per-merchant facts the executor needs.
#[derive(Debug, Clone)]
struct MerchantEffects {
    flash_stock_key: String,
    flash_users_key: String,
    on_paid_after_close: PaidAfterClose,
}

/// Runs PENDING ledger rows. Cheap to clone.
#[derive(Clone)]
pub struct EffectRunner {
    db: Db,
    clock: Clock,
    notifier: Notifier,
    flash: Option<FlashSale>,
    payments: Option<Arc<dyn PaymentGateway>>,
    merchants: Arc<std::collections::HashMap<String, MerchantEffects>>,
    config: EffectsConfig,
}

impl std::fmt::Debug for EffectRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EffectRunner")
            .field("redis", &self.flash.is_some())
            .field("payments", &self.payments.is_some())
            .finish()
    }
}

impl crate::dispatch::AfterCommit for EffectRunner {
    fn committed<'a>(
        &'a self,
        order_ids: &'a [&'a str],
    ) -> futures_util::future::BoxFuture<'a, ()> {
        Box::pin(async move {
            for id in order_ids {
                self.run_for_order(id).await;
            }
        })
    }
}

impl EffectRunner {
    /// A runner with only the log channel and default retries (tests, the demo).
    pub fn new(db: Db, clock: Clock) -> Self {
        EffectRunner {
            db,
            clock,
            notifier: Notifier::log_only(),
            flash: None,
            payments: None,
            merchants: Arc::default(),
            config: EffectsConfig::default(),
        }
    }

    /// The broker's state for `/readyz`: `None` without one, else whether its last send worked.
    pub fn broker_ready(&self) -> Option<bool> {
        self.notifier.broker_ready()
    }

    /// Publishes notices of `kind = "rocketmq"` channels through `transport`.
    pub fn with_rocketmq(mut self, transport: Arc<crate::rocketmq::Transport>) -> Self {
        self.notifier = self.notifier.with_rocketmq(transport);
        self
    }

    /// A runner as `config` describes: channels, Redis, payment provider, per-merchant keys.
    ///
    /// # Errors
    /// A message naming what could not be set up (a Redis URL that does not parse, …).
    pub async fn from_config(db: Db, clock: Clock, config: &Config) -> Result<Self, String> {
        let flash = match &config.redis {
            Some(r) => Some(FlashSale::connect(r).await?),
            None => None,
        };
        let payments = match &config.payment {
            Some(p) => Some(Arc::new(HttpPaymentGateway::new(p)?) as Arc<dyn PaymentGateway>),
            None => None,
        };
        let merchants = config
            .merchants
            .iter()
            .map(|(id, m)| {
                (
                    id.clone(),
                    MerchantEffects {
                        flash_stock_key: m.flash_stock_key.clone(),
                        flash_users_key: m.flash_users_key.clone(),
                        on_paid_after_close: m.on_paid_after_close,
                    },
                )
            })
            .collect();
        Ok(EffectRunner {
            db,
            clock,
            notifier: Notifier::from_config(&config.notify)?,
            flash,
            payments,
            merchants: Arc::new(merchants),
            config: config.effects.clone(),
        })
    }

    /// Whether Redis answers: `None` when no `[redis]` is configured.
    pub async fn redis_ready(&self) -> Option<Result<(), String>> {
        match &self.flash {
            Some(flash) => Some(flash.ping().await),
            None => None,
        }
    }

    /// Uses `gateway` for `close-payment` and refunds.
    pub fn with_payments(mut self, gateway: Arc<dyn PaymentGateway>) -> Self {
        self.payments = Some(gateway);
        self
    }

    /// Runs the PENDING effects of one order (right after its transaction committed).
    /// As the dispatcher's [`crate::dispatch::AfterCommit`] (tests, tools), each committed
    /// order's effects run this way.
    /// Failures are logged and left to the backlog.
    pub async fn run_for_order(&self, order_id: &str) {
        if let Err(e) = self.run(Some(order_id), i64::MAX).await {
            tracing::warn!(order = order_id, error = %e, "effects left pending");
        }
    }

    /// Runs every PENDING effect whose time has come: retries, and effects never attempted that
    /// were recorded at least `min_age_ms` ago (their daemon died before running them). Returns
    /// how many were settled (DONE or FAILED).
    ///
    /// # Errors
    /// [`DbError`] when the ledger cannot be read.
    pub async fn run_backlog(&self, min_age_ms: i64) -> Result<usize, DbError> {
        let now = self.clock.now_ms(&self.db).await?;
        self.run(None, now - min_age_ms).await
    }

    /// Runs every PENDING effect whose time has come, fresh ones included: what the ledger
    /// executor does when a commit wakes it ([`worker::run`]). Reads the ledger in pages of
    /// [`PAGE`] until a page comes back short. Returns how many were settled.
    ///
    /// # Errors
    /// [`DbError`] when the ledger cannot be read.
    pub async fn run_fresh(&self) -> Result<usize, DbError> {
        let mut settled = 0;
        loop {
            let (fetched, done) = self.run_page(None, i64::MAX).await?;
            settled += done;
            if fetched < PAGE as usize {
                return Ok(settled);
            }
        }
    }

    async fn run(&self, order_id: Option<&str>, fresh_before_ms: i64) -> Result<usize, DbError> {
        Ok(self.run_page(order_id, fresh_before_ms).await?.1)
    }

    /// One page of runnable rows, in chunks of `effects.concurrency` rows (so a chunk is done well
    /// within its lease). Returns (rows read, rows settled).
    async fn run_page(
        &self,
        order_id: Option<&str>,
        fresh_before_ms: i64,
    ) -> Result<(usize, usize), DbError> {
        let now = self.clock.now_ms(&self.db).await?;
        let rows = ledger::runnable(
            &self.db,
            &self.kinds(),
            order_id,
            now,
            fresh_before_ms,
            PAGE,
        )
        .await?;
        let mut settled = 0;
        for chunk in rows.chunks(self.config.concurrency.max(1) as usize) {
            settled += self.run_chunk(chunk).await?;
        }
        Ok((rows.len(), settled))
    }

    /// One chunk: claimed in one statement, its orders' status and buyer read in one, each
    /// order's rows carried out one after another in ledger order (orders side by side), and the
    /// plain successes settled in one statement.
    async fn run_chunk(&self, rows: &[ledger::PendingEffect]) -> Result<usize, DbError> {
        let lease_ms = self.config.lease.as_millis() as i64;
        let now = self.clock.now_ms(&self.db).await?;
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        let claimed: std::collections::HashSet<i64> =
            ledger::claim_many(&self.db, &ids, now, now + lease_ms)
                .await?
                .into_iter()
                .collect();
        let mut by_order: Vec<Vec<&ledger::PendingEffect>> = Vec::new();
        for row in rows.iter().filter(|r| claimed.contains(&r.id)) {
            match by_order.iter_mut().find(|g| g[0].order_id == row.order_id) {
                Some(group) => group.push(row),
                None => by_order.push(vec![row]),
            }
        }
        if by_order.is_empty() {
            return Ok(0);
        }
        let order_ids: Vec<&str> = by_order.iter().map(|g| g[0].order_id.as_str()).collect();
        let facts = orders::status_and_user(&self.db, &order_ids).await?;
        let done = futures_util::future::join_all(by_order.into_iter().map(|group| {
            let facts = &facts;
            async move {
                let mut out = Vec::with_capacity(group.len());
                for row in group {
                    out.push((row, self.execute(row, facts.get(&row.order_id)).await));
                }
                out
            }
        }))
        .await;
        let now = self.clock.now_ms(&self.db).await?;
        let mut plain = Vec::new();
        let mut settled = 0;
        for (row, result) in done.into_iter().flatten() {
            if matches!(result, Ok(None)) {
                crate::events::emit(crate::events::Event::Effect {
                    kind: &row.kind,
                    outcome: "done",
                });
                plain.push(row.id);
            } else {
                settled += usize::from(self.settle(row, result, now).await?);
            }
        }
        settled += ledger::settle_many(&self.db, &plain, ledger::DONE, now).await? as usize;
        Ok(settled)
    }

    /// The kinds this runner has an executor for. The others (Redis effects without `[redis]`,
    /// payments without `[payment]`) are not even read: they wait in the ledger, PENDING and
    /// untouched, for a daemon configured to carry them out.
    fn kinds(&self) -> Vec<&'static str> {
        RUNNABLE
            .iter()
            .copied()
            .filter(|kind| match executor_section(kind) {
                Some("redis") => self.flash.is_some(),
                Some("payment") => self.payments.is_some(),
                _ => true,
            })
            .collect()
    }

    async fn settle(
        &self,
        row: &ledger::PendingEffect,
        result: Result<Done, EffectError>,
        now: i64,
    ) -> Result<bool, DbError> {
        let attempts = row.attempts + 1;
        let outcome = match &result {
            Ok(_) => "done",
            Err(EffectError::Transient(_)) if attempts < self.config.max_attempts => "retry",
            Err(_) => "failed",
        };
        crate::events::emit(crate::events::Event::Effect {
            kind: &row.kind,
            outcome,
        });
        match result {
            Ok(note) => ledger::settle(&self.db, row.id, ledger::DONE, note.as_deref(), now).await,
            Err(EffectError::Transient(e)) if attempts < self.config.max_attempts => {
                let backoff = Backoff {
                    initial: self.config.retry_initial,
                    max: self.config.retry_max,
                };
                let next = now + backoff.delay_ms(attempts);
                tracing::warn!(key = %row.key, kind = %row.kind, attempts, error = %e, next_attempt_ms = next, "effect failed; will retry");
                ledger::reschedule(&self.db, row.id, &e, now, next).await?;
                Ok(false)
            }
            Err(e) => {
                let reason = match e {
                    EffectError::Transient(e) => format!("gave up after {attempts} attempts: {e}"),
                    EffectError::Permanent(e) => e,
                };
                tracing::error!(key = %row.key, kind = %row.kind, order = %row.order_id, %reason, "effect FAILED; needs an operator");
                ledger::settle(&self.db, row.id, ledger::FAILED, Some(&reason), now).await
            }
        }
    }

    /// Carries out one effect; `order` is its order's (status, buyer), read with its chunk.
    async fn execute(
        &self,
        row: &ledger::PendingEffect,
        order: Option<&(String, String)>,
    ) -> Result<Done, EffectError> {
        let bad = |what: &str| {
            EffectError::Permanent(format!("unreadable {what} payload: {}", row.payload))
        };
        match row.kind.as_str() {
            REMIND => {
                let notice: Notice =
                    serde_json::from_str(&row.payload).map_err(|_| bad("remind"))?;
                if let Some((status, _)) = order
                    && status != "PENDING"
                {
                    return Ok(Some(format!("not sent: order is {status}")));
                }
                self.notify(row, &notice, order).await
            }
            REFUND => {
                let payment_ref = serde_json::from_str::<serde_json::Value>(&row.payload)
                    .ok()
                    .and_then(|v| v["payment_ref"].as_str().map(str::to_string))
                    .ok_or_else(|| bad("refund"))?;
                let gateway = self.payments.as_ref().ok_or_else(|| {
                    EffectError::Permanent("no [payment] provider configured".into())
                })?;
                gateway.refund(&payment_ref, &row.key).await.map(|()| None)
            }
            _ => match serde_json::from_str::<Effect>(&row.payload).map_err(|_| bad(&row.kind))? {
                Effect::Notify(notice) => self.notify(row, &notice, order).await,
                Effect::RestoreFlashStock { activity, quantity } => {
                    let (flash, keys) = self.flash_for(row)?;
                    let key = keys.flash_stock_key.replace("<activity>", &activity);
                    flash.restore_stock(&key, quantity, &row.key).await
                }
                Effect::ReleaseFlashSlot { activity, user } => {
                    let (flash, keys) = self.flash_for(row)?;
                    let key = keys.flash_users_key.replace("<activity>", &activity);
                    flash.release_slot(&key, &user, &row.key).await
                }
                Effect::ClosePayment { payment_ref } => self.close_payment(row, &payment_ref).await,
                other => Err(EffectError::Permanent(format!(
                    "{} is applied inside the close transaction, not by the executor",
                    other.kind()
                ))),
            },
        }
    }

    fn flash_for(
        &self,
        row: &ledger::PendingEffect,
    ) -> Result<(&FlashSale, &MerchantEffects), EffectError> {
        let flash = self
            .flash
            .as_ref()
            .ok_or_else(|| EffectError::Permanent("no [redis] configured".into()))?;
        let keys = self.merchants.get(&row.merchant_id).ok_or_else(|| {
            EffectError::Permanent(format!("merchant `{}` is not configured", row.merchant_id))
        })?;
        Ok((flash, keys))
    }

    async fn notify(
        &self,
        row: &ledger::PendingEffect,
        notice: &Notice,
        order: Option<&(String, String)>,
    ) -> Result<Done, EffectError> {
        let user = order.map(|(_, user)| user.clone()).unwrap_or_default();
        self.notifier
            .send(
                &row.key,
                &row.kind,
                &row.order_id,
                &row.merchant_id,
                &user,
                notice,
            )
            .await
            .map(|()| None)
    }

    /// Closes the payment; "already paid" records the order as paid-after-close and raises a
    /// refund (or a manual review) in the same transaction as settling this effect's outcome.
    async fn close_payment(
        &self,
        row: &ledger::PendingEffect,
        payment_ref: &str,
    ) -> Result<Done, EffectError> {
        let gateway = self
            .payments
            .as_ref()
            .ok_or_else(|| EffectError::Permanent("no [payment] provider configured".into()))?;
        match gateway.close(payment_ref, &row.key).await? {
            CloseOutcome::Closed => Ok(None),
            CloseOutcome::AlreadyPaid => {
                let resolution = self
                    .merchants
                    .get(&row.merchant_id)
                    .map(|m| m.on_paid_after_close)
                    .unwrap_or_default();
                self.paid_after_close(
                    &row.order_id,
                    &row.merchant_id,
                    Some(payment_ref),
                    "close-payment",
                    resolution,
                )
                .await
                .map_err(|e| EffectError::Transient(e.to_string()))?;
                self.run_for_order_boxed(row.order_id.clone()).await;
                Ok(Some(format!(
                    "provider: already paid; {}",
                    resolution.as_str()
                )))
            }
        }
    }

    // The refund just recorded runs now; boxed because it recurses through `run`.
    fn run_for_order_boxed(
        &self,
        order_id: String,
    ) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            // The close-payment row is still held by us; `run` skips it and takes the refund.
            self.run_for_order(&order_id).await
        })
    }

    /// Records a paid-after-close order (from the executor or a payment callback) and runs the
    /// refund it raises. Returns false when it was already recorded.
    ///
    /// # Errors
    /// [`DbError`] when the record cannot be written.
    pub async fn paid_after_close(
        &self,
        order_id: &str,
        merchant_id: &str,
        payment_ref: Option<&str>,
        source: &str,
        resolution: PaidAfterClose,
    ) -> Result<bool, DbError> {
        let now = self.clock.now_ms(&self.db).await?;
        let mut tx = self.db.begin().await?;
        let new = payments::record_paid_after_close(
            &mut tx,
            order_id,
            merchant_id,
            payment_ref,
            source,
            resolution,
            now,
        )
        .await?;
        tx.commit().await?;
        Ok(new)
    }
}

impl From<DbError> for EffectError {
    fn from(e: DbError) -> Self {
        EffectError::Transient(e.to_string())
    }
}
