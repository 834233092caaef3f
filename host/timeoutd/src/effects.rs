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
//!
//! Each section of kinds has one [`Executor`] (`notify.rs`, `flash.rs`, `payment.rs`);
//! [`crate::kinds::home`] says which kind goes to which. A kind whose executor is not configured
//! is not even read: its rows wait PENDING for a daemon that has it.

pub mod caps;
mod executor;
pub mod fair;
mod flash;
mod notify;
mod payment;
mod pool;
pub mod work;
pub mod worker;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use tokio::sync::watch;

pub use executor::{Done, EffectError, Executor, Job};
pub use flash::{FlashEffects, FlashSale};
pub use notify::Notifier;
pub use payment::{
    CloseOutcome, HttpPaymentGateway, PaymentEffects, PaymentGateway, Providers, Refusal, alipay,
    gateway_of, record_paid_after_close, resolutions, rsa, stripe, wechatpay, with_provider,
};

use crate::clock::Clock;
use crate::config::{Config, EffectsConfig};
use crate::db::{Db, DbError, ledger};
use crate::kinds::{Home, LedgerKind, Section};
use crate::retry::Backoff;

/// One warning per merchant whose plugin may ask for effects that no configured executor runs
/// (its `granted_effects`, or every kind when unset): e.g. `merchants.flashy: its plugin may
/// ask for restore-flash-stock, release-flash-slot, but [redis] is not configured; those ledger
/// rows stay PENDING until a daemon with [redis] runs them`. Empty when everything is covered.
pub fn unexecuted(config: &Config) -> Vec<String> {
    let configured = |section: Section| match section {
        Section::Notify => true,
        Section::Redis => config.redis.is_some(),
        Section::Payment => config.payment.is_some(),
    };
    let mut warnings = Vec::new();
    for (id, merchant) in &config.merchants {
        let kinds: Vec<LedgerKind> = match &merchant.granted_effects {
            Some(granted) => granted
                .iter()
                .filter_map(|k| LedgerKind::parse(k))
                .collect(),
            None => timeoutd_runtime::model::EffectKind::ALL
                .iter()
                .map(|&k| LedgerKind::Effect(k))
                .collect(),
        };
        let mut missing: Vec<(Section, Vec<&str>)> = Vec::new();
        for kind in kinds {
            let Home::Executor(section) = kind.home() else {
                continue;
            };
            if configured(section) {
                continue;
            }
            match missing.iter_mut().find(|(s, _)| *s == section) {
                Some((_, ks)) => ks.push(kind.as_str()),
                None => missing.push((section, vec![kind.as_str()])),
            }
        }
        for (section, kinds) in missing {
            let section = section.as_str();
            warnings.push(format!(
                "merchants.{id}: its plugin may ask for {}, but [{section}] is not configured; \
                 those ledger rows stay PENDING until a daemon with [{section}] runs them \
                 (or narrow what the merchant may ask for: merchants.{id}.granted_effects, and \
                 a 0.2.0 plugin's declared effects with it)",
                kinds.join(", ")
            ));
        }
    }
    warnings
}

/// Runs PENDING ledger rows. Cheap to clone.
#[derive(Clone)]
pub struct EffectRunner {
    db: Db,
    clock: Clock,
    notifier: Notifier,
    flash: Option<FlashEffects>,
    payments: Option<PaymentEffects>,
    /// Each merchant's caps per effect kind and channel (`[caps]`); `None`: none set.
    caps: Option<Arc<caps::Caps>>,
    config: EffectsConfig,
    /// Each merchant's weight in the slots' shares (`merchants.<id>.weight`; 1 when unnamed).
    weights: Arc<std::collections::HashMap<String, u32>>,
    /// When the rows deferred to a booked slot fall due, soonest first, for the worker's wakes.
    deferred: Arc<std::sync::Mutex<BinaryHeap<Reverse<std::time::Instant>>>>,
    /// The one section whose kinds this runner reads ([`EffectRunner::only`]); `None`: all.
    section: Option<Section>,
    /// Woken when an execution raised rows that another section's runner carries out.
    others: Option<Arc<tokio::sync::Notify>>,
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
            caps: None,
            config: EffectsConfig::default(),
            weights: Arc::default(),
            deferred: Arc::default(),
            section: None,
            others: None,
        }
    }

    /// The sections this runner has an executor for (notices always; Redis and payments when
    /// configured).
    pub fn sections(&self) -> Vec<Section> {
        Section::ALL
            .into_iter()
            .filter(|s| self.executor(*s).is_some())
            .collect()
    }

    /// This runner restricted to `section`'s kinds, with slots of its own; `others` is woken
    /// when an execution raises rows of other sections (a refund's notice). The ledger worker
    /// runs one per section, side by side, so a peer that hangs holds up only its own
    /// section's rows ([`worker::run`]).
    pub fn only(&self, section: Section, others: Arc<tokio::sync::Notify>) -> EffectRunner {
        EffectRunner {
            section: Some(section),
            others: Some(others),
            deferred: Arc::default(),
            ..self.clone()
        }
    }

    /// The clock it reads.
    pub fn clock(&self) -> &Clock {
        &self.clock
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
        let payments = match (&config.payment, Providers::from_config(config)?) {
            (Some(_), Some(providers)) => Some(PaymentEffects::new(
                providers,
                db.clone(),
                clock.clone(),
                resolutions(config),
            )),
            _ => None,
        };
        Ok(EffectRunner {
            caps: caps::Caps::from_config(config).await?.map(Arc::new),
            notifier: Notifier::from_config(&config.notify)?,
            flash: FlashEffects::from_config(config).await?,
            payments,
            config: config.effects.clone(),
            weights: Arc::new(
                config
                    .merchants
                    .iter()
                    .map(|(id, m)| (id.clone(), m.weight))
                    .collect(),
            ),
            deferred: Arc::default(),
            section: None,
            others: None,
            db,
            clock,
        })
    }

    /// Whether Redis answers: `None` when no `[redis]` is configured.
    pub async fn redis_ready(&self) -> Option<Result<(), String>> {
        match &self.flash {
            Some(flash) => Some(flash.ping().await),
            None => None,
        }
    }

    /// The instant the next row deferred to a booked slot falls due (the worker sleeps no
    /// longer than that); slots that fell due before `ran_at`, the start of the last run, were
    /// run by it and are forgotten.
    pub fn next_deferred(&self, ran_at: std::time::Instant) -> Option<std::time::Instant> {
        let mut deferred = self.deferred.lock().expect("deferred lock poisoned");
        while deferred.peek().is_some_and(|Reverse(at)| *at <= ran_at) {
            deferred.pop();
        }
        deferred.peek().map(|Reverse(at)| *at)
    }

    /// Notes that a deferred row falls due `delay_ms` from now.
    fn wake_by(&self, delay_ms: i64) {
        let at = std::time::Instant::now()
            + std::time::Duration::from_millis(u64::try_from(delay_ms).unwrap_or(0) + 5);
        let mut deferred = self.deferred.lock().expect("deferred lock poisoned");
        deferred.push(Reverse(at));
    }

    /// The executor of `section`, when this runner has one. Exhaustive: a new section is a
    /// field here and an arm.
    fn executor(&self, section: Section) -> Option<&dyn Executor> {
        match section {
            Section::Notify => Some(&self.notifier),
            Section::Redis => self.flash.as_ref().map(|e| e as &dyn Executor),
            Section::Payment => self.payments.as_ref().map(|e| e as &dyn Executor),
        }
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

    /// Runs every PENDING effect whose time has come, fresh ones included, until none is left.
    /// Returns how many were settled.
    ///
    /// # Errors
    /// [`DbError`] when the ledger cannot be read.
    pub async fn run_fresh(&self) -> Result<usize, DbError> {
        self.run_fresh_until(None).await
    }

    /// [`EffectRunner::run_fresh`] as the ledger executor runs it when a commit wakes it
    /// ([`worker::run`]), its slots shared fairly among merchants (`pool.rs`, `fair.rs`): once
    /// `shutdown` is signalled no further order is started, so a stopping daemon finishes the
    /// orders in hand (at most `effects.concurrency`) and leaves the rest PENDING, unclaimed,
    /// for the next executor, instead of carrying out a burst's backlog while the transports
    /// it sends through shut down.
    ///
    /// # Errors
    /// [`DbError`] when the ledger cannot be read.
    pub async fn run_fresh_until(
        &self,
        shutdown: Option<&watch::Receiver<bool>>,
    ) -> Result<usize, DbError> {
        self.drain(None, i64::MAX, shutdown).await
    }

    async fn run(&self, order_id: Option<&str>, fresh_before_ms: i64) -> Result<usize, DbError> {
        self.drain(order_id, fresh_before_ms, None).await
    }

    /// The kinds this runner has an executor for. The others (Redis effects without `[redis]`,
    /// payments without `[payment]`) are not even read: they wait in the ledger, PENDING and
    /// untouched, for a daemon configured to carry them out.
    fn kinds(&self) -> Vec<&'static str> {
        LedgerKind::all()
            .filter(|kind| match kind.home() {
                Home::Executor(section) => {
                    self.executor(section).is_some()
                        && self.section.is_none_or(|only| only == section)
                }
                Home::CloseTransaction => false,
            })
            .map(LedgerKind::as_str)
            .collect()
    }

    async fn settle(
        &self,
        token: &str,
        row: &ledger::PendingEffect,
        result: Result<Done, EffectError>,
        now: i64,
    ) -> Result<bool, DbError> {
        let attempts = row.attempts + 1;
        let outcome = match &result {
            Ok(_) => "done",
            Err(EffectError::Deferred { .. }) => "deferred",
            Err(e) if e.is_transient() && attempts < self.config.max_attempts => "retry",
            Err(_) => "failed",
        };
        crate::events::emit(crate::events::Event::Effect {
            kind: &row.kind,
            outcome,
        });
        match result {
            Ok(done) => {
                ledger::settle(
                    &self.db,
                    token,
                    row.id,
                    ledger::DONE,
                    done.note.as_deref(),
                    now,
                )
                .await
            }
            Err(EffectError::Deferred { until_ms, reason }) => {
                tracing::debug!(key = %row.key, kind = %row.kind, until_ms, %reason, "effect deferred");
                ledger::defer(&self.db, token, row.id, &reason, now, until_ms).await?;
                self.wake_by(until_ms - now);
                Ok(false)
            }
            Err(e) if e.is_transient() && attempts < self.config.max_attempts => {
                let backoff = Backoff {
                    initial: self.config.retry_initial,
                    max: self.config.retry_max,
                };
                // The peer's Retry-After, when longer than the backoff.
                let asked = match &e {
                    EffectError::RetryAfter { after, .. } => after.as_millis() as i64,
                    _ => 0,
                };
                let next = now + backoff.delay_ms(attempts).max(asked);
                let e = e.to_string();
                tracing::warn!(key = %row.key, kind = %row.kind, attempts, error = %e, next_attempt_ms = next, "effect failed; will retry");
                ledger::reschedule(&self.db, token, row.id, &e, now, next).await?;
                Ok(false)
            }
            Err(e) => {
                let reason = match e {
                    e @ (EffectError::Transient(_) | EffectError::RetryAfter { .. }) => {
                        format!("gave up after {attempts} attempts: {e}")
                    }
                    EffectError::Permanent(e) => e,
                    EffectError::Deferred { .. } => unreachable!("deferred rows are settled above"),
                };
                tracing::error!(key = %row.key, kind = %row.kind, order = %row.order_id, %reason, "effect FAILED; needs an operator");
                ledger::settle(&self.db, token, row.id, ledger::FAILED, Some(&reason), now).await
            }
        }
    }

    /// Hands one row to its kind's executor; `order` is its order's (status, buyer), read with
    /// its chunk. A kind this runner has no executor for was not read ([`Self::kinds`]), so the
    /// error arms are for a row changed under it.
    async fn execute(
        &self,
        row: &ledger::PendingEffect,
        order: Option<&(String, String)>,
        now_ms: i64,
    ) -> Result<Done, EffectError> {
        let kind = LedgerKind::parse(&row.kind)
            .ok_or_else(|| EffectError::Permanent(format!("unknown effect kind `{}`", row.kind)))?;
        let Home::Executor(section) = kind.home() else {
            return Err(EffectError::Permanent(format!(
                "{kind:?} is applied inside the close transaction, not by the executor"
            )));
        };
        let executor = self.executor(section).ok_or_else(|| {
            EffectError::Transient(format!("no [{}] configured", section.as_str()))
        })?;
        let job = Job {
            row,
            kind,
            order_status: order.map(|(status, _)| status.as_str()),
            user: order.map(|(_, user)| user.as_str()).unwrap_or_default(),
            now_ms,
        };
        if let Some(caps) = &self.caps {
            caps.admit(&job).await?;
        }
        executor.execute(job).await
    }

    // What an execution raised runs now; boxed because it recurses through `run`.
    fn run_for_order_boxed(
        &self,
        order_id: String,
    ) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move { self.run_for_order(&order_id).await })
    }
}
