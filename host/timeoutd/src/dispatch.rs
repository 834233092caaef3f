//! From a trigger to a committed outcome: load the order (the database is the truth), ask the
//! merchant's plugin, and carry out its decision in one transaction.
//!
//! The rules, each in one place:
//! - a trigger carries only an order id, a phase and a hint; everything else is re-read;
//! - not PENDING → the trigger is a no-op ([`Outcome::NoOp`]);
//! - the order or its merchant paused by an operator → held, the plugin not asked
//!   ([`Outcome::Paused`], `db::pauses`);
//! - before the deadline (database clock) → deferred to the deadline, the plugin is not asked
//!   ([`Outcome::Deferred`], F2);
//! - `cancel` → [`close`]: one compare-and-set PENDING→CLOSED with stock, coupon and ledger rows
//!   in the same transaction; losing the compare-and-set (paid in between, F12; a concurrent
//!   duplicate, F9) changes nothing;
//! - `wait` → [`wait`]: the next phase's outbox row and the reminder, in one transaction;
//! - effects beyond the order, or of a kind the merchant did not grant, are refused ([`guard`])
//!   and the decision dead-lettered;
//! - a plugin failure follows the merchant's `on_plugin_error`: retry with backoff up to
//!   `dispatch.max_attempts`, then dead-letter (`retry`, [`failure`]); the built-in
//!   close-at-deadline policy ([`fallback`]); or dead-letter at once (`dead_letter`).

pub mod align;
mod ask;
mod close;
mod failure;
pub mod fallback;
mod group;
pub mod guard;
mod wait;

use std::sync::Arc;

use serde::Serialize;
use timeoutd_runtime::model::{Context, Decision, Order, OrderStatus, TriggerKind};

use timeoutd_runtime::DecideError;
use tracing::Instrument;

use crate::clock::Clock;
pub use align::PaymentQuery;
use ask::{Answered, Asking, Staged};

use crate::config::{DispatchConfig, OnPluginError, PaymentConfig};
use crate::db::{Db, DbError, journal, orders, outbox, pauses};
use crate::events::{Event, emit};
use crate::policies::{MerchantPolicy, Policies};

/// One reason to look at one order.
#[derive(Debug, Clone, Serialize)]
pub struct Trigger {
    /// Order id.
    pub order_id: String,
    /// What fired.
    pub kind: TriggerKind,
    /// Phase to decide.
    pub phase: u32,
    /// Earlier attempts of this trigger.
    pub attempt: u32,
    /// When it was due, epoch ms (for lateness); the deadline when absent.
    pub due_ms: Option<i64>,
    /// The `order_timeout_msg` row it came from, if any.
    pub row_id: Option<i64>,
    /// The claim token that row is held under: its completion is fenced by it
    /// ([`outbox::RowRef`]). `None` for a row handled without a claim.
    #[serde(skip)]
    pub claim: Option<String>,
    /// The state the previous phase's `wait` handed to this one (API 0.2.0 on); empty for none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub state: Vec<u8>,
    /// The previous phase's `wait` asked for the payment provider to be polled: this trigger
    /// asks it even before the deadline.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub poll: bool,
}

impl Trigger {
    /// Its row, as completions name it (id and claim token), if it came from one.
    pub fn row(&self) -> Option<outbox::RowRef<'_>> {
        self.row_id.map(|id| outbox::RowRef {
            id,
            claim: self.claim.as_deref(),
        })
    }

    /// The trigger a claimed `order_timeout_msg` row stands for, fired by `kind` (the outbox
    /// timer, a sweep's or an operator's row, a broker message). A row whose phase is outside
    /// `0..=u32::MAX`, or whose state is not hex, cannot be one: `Err` carries the trigger
    /// (phase 0, no state), to dead-letter it with, and the reason naming the row and the value.
    pub fn of_row(row: &outbox::DueRow, kind: TriggerKind) -> Result<Trigger, Box<BadRow>> {
        let trigger = |phase, state| Trigger {
            order_id: row.order_id.clone(),
            kind,
            phase,
            attempt: row.attempts,
            due_ms: Some(row.due_ms),
            row_id: Some(row.id),
            claim: row.claim_token.clone(),
            state,
            poll: outbox::RowSource::of(&row.source) == outbox::RowSource::Poll,
        };
        let Ok(phase) = u32::try_from(row.phase) else {
            let reason = format!(
                "order_timeout_msg row {} has phase {}, outside 0..={}",
                row.id,
                row.phase,
                u32::MAX
            );
            return Err(Box::new(BadRow {
                trigger: trigger(0, Vec::new()),
                reason,
            }));
        };
        match row.state.as_deref().map(hex::decode).transpose() {
            Ok(state) => Ok(trigger(phase, state.unwrap_or_default())),
            Err(e) => {
                let reason = format!(
                    "order_timeout_msg row {} has a state that is not hex ({e})",
                    row.id
                );
                Err(Box::new(BadRow {
                    trigger: trigger(phase, Vec::new()),
                    reason,
                }))
            }
        }
    }
}

/// A row that cannot be a trigger ([`Trigger::of_row`]): the trigger to dead-letter it with,
/// and why.
#[derive(Debug, Clone)]
pub struct BadRow {
    /// Phase 0 (or the row's), no state.
    pub trigger: Trigger,
    /// Names the row and the value.
    pub reason: String,
}

/// What handling a trigger came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum Outcome {
    /// This trigger closed the order, `lateness_ms` after the trigger was due (or after the
    /// deadline, if that is later). The lateness against the order's own deadline is
    /// `closed_at_ms − deadline_ms` in the table and `timeoutd_close_lateness_seconds`.
    Closed {
        /// Close time − the trigger's due time, ms.
        lateness_ms: i64,
    },
    /// The plugin asked to wait; `next_phase` is scheduled at `due_ms`.
    Waiting {
        /// Next phase.
        next_phase: u32,
        /// When, epoch ms.
        due_ms: i64,
    },
    /// The plugin chose to do nothing now; it is asked again later, with backoff.
    Ignored,
    /// Nothing to do: the order is not PENDING (or stopped being so before the close).
    NoOp {
        /// Why.
        reason: String,
    },
    /// The provider said the order was paid: aligned to PAID, not closed.
    Aligned {
        /// When the buyer paid, epoch ms (the provider's, else the alignment's).
        paid_at_ms: i64,
    },
    /// Too early: moved to the order's deadline.
    Deferred {
        /// New due time, epoch ms.
        until_ms: i64,
    },
    /// The merchant's plugin is tripped (failed repeatedly), or did not load at start
    /// (`policies::load_serving`): the trigger waits until then.
    Tripped {
        /// When the trip ends, epoch ms.
        until_ms: i64,
    },
    /// The order or its merchant is paused by an operator: the trigger is held until then
    /// (its row deferred by `dispatch.pause_recheck`, woken at once on resume) and decided again.
    Paused {
        /// Which pause holds it.
        scope: pauses::Scope,
        /// When it is looked at again, epoch ms.
        until_ms: i64,
    },
    /// The decision exceeded the order and was refused (dead-lettered).
    Refused {
        /// Every violation.
        reason: String,
    },
    /// Failed; will be tried again at `due_ms`.
    Retry {
        /// When, epoch ms.
        due_ms: i64,
        /// Why it failed.
        error: String,
    },
    /// Can never succeed as it is; dead-lettered for an operator.
    DeadLettered {
        /// Why.
        reason: String,
    },
    /// Failed, and not even the failure could be written (the database is unreachable):
    /// nothing durable happened. An outbox row's lease lapses and it is claimed again; a broker
    /// message is answered `ReconsumeLater` and redelivered.
    Unrecorded {
        /// Why it failed, and why that could not be recorded.
        error: String,
    },
}

/// Handles triggers. Shared by every source; cheap to share behind an `Arc`.
pub struct Dispatcher {
    db: Db,
    clock: Clock,
    policies: Arc<Policies>,
    /// `[dispatch]`: retries, the plausible window, how stock is given back.
    config: DispatchConfig,
    effects: Arc<dyn AfterCommit>,
    provider: Option<align::Provider>,
    /// Plugin calls running at once, at most: one per core. A decision is CPU work (about
    /// 10 µs); a burst's groups starting together once asked for hundreds at once, each on its
    /// own blocking thread with its own live instance, which bought no speed and cost memory.
    deciders: Arc<tokio::sync::Semaphore>,
    /// The deciders' permits: the most blocking calls a group's asks are split into ([`ask`]).
    decider_count: usize,
    /// Merchants' shadow plugins, asked beside the live decisions and never acting.
    shadows: crate::shadow::Shadows,
}

/// The ledger executor's side of a commit: told which orders a transaction just recorded
/// PENDING external effects for. The daemon's worker is woken ([`tokio::sync::Notify`]: the
/// trigger's work ends at its commit); tests and tools run the effects right there
/// (`effects::EffectRunner`). Dispatch names only this port, never the executor.
pub trait AfterCommit: Send + Sync {
    /// Effects of `order_ids` were committed; runs or schedules them. Never fails: what it
    /// cannot do now stays PENDING for the backlog.
    fn committed<'a>(&'a self, order_ids: &'a [&'a str])
    -> futures_util::future::BoxFuture<'a, ()>;
}

impl AfterCommit for tokio::sync::Notify {
    fn committed<'a>(&'a self, _: &'a [&'a str]) -> futures_util::future::BoxFuture<'a, ()> {
        self.notify_one();
        Box::pin(std::future::ready(()))
    }
}

/// What a plugin said, with what is needed to log it.
struct Decided<'a> {
    policy: &'a MerchantPolicy,
    order: &'a Order,
    trigger: &'a Trigger,
    now_ms: i64,
    latency_us: i64,
    /// The call's input and the plugin's answer, JSON, as `decision_log.input` / `answer`.
    input: &'a str,
    answer: &'a str,
}

/// A trigger taken as far as its decision ([`Dispatcher::prepare`]), owning what carrying it out
/// needs.
struct Ready {
    policy: Arc<MerchantPolicy>,
    order: Order,
    trigger: Trigger,
    now_ms: i64,
    latency_us: i64,
    input: String,
    answer: String,
    decision: Decision,
}

impl Ready {
    fn decided(&self) -> Decided<'_> {
        Decided {
            policy: &self.policy,
            order: &self.order,
            trigger: &self.trigger,
            now_ms: self.now_ms,
            latency_us: self.latency_us,
            input: &self.input,
            answer: &self.answer,
        }
    }
}

/// How far [`Dispatcher::prepare`] took a trigger.
enum Step {
    /// It ended there (dead-lettered, deferred, tripped, a plugin failure handled).
    Done(Outcome),
    /// The order is no longer PENDING: the trigger is a no-op; its row is to be finished.
    NotPending {
        /// Why, e.g. `order is PAID`.
        reason: String,
    },
    /// The plugin decided; the decision is to be carried out.
    Ready(Box<Ready>),
}

impl Decided<'_> {
    fn record<'s>(
        &'s self,
        decision: &'s str,
        outcome: &'s str,
        detail: String,
    ) -> journal::DecisionRecord<'s> {
        journal::DecisionRecord {
            order_id: &self.order.id,
            merchant_id: &self.order.merchant,
            plugin: self.policy.plugin.name(),
            plugin_digest: self.policy.plugin.digest(),
            trigger_kind: self.trigger.kind.as_str(),
            phase: self.trigger.phase,
            attempt: self.trigger.attempt,
            decision,
            outcome,
            detail,
            latency_us: self.latency_us,
            decided_at_ms: self.now_ms,
            input: Some(self.input),
            answer: Some(self.answer),
        }
    }
}

impl Dispatcher {
    /// A dispatcher over `db`, reading time from `clock`, telling `effects` after each commit
    /// that recorded external effects ([`AfterCommit`]).
    pub fn new(
        db: Db,
        clock: Clock,
        policies: Arc<Policies>,
        config: DispatchConfig,
        effects: Arc<dyn AfterCommit>,
    ) -> Self {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        Dispatcher {
            shadows: crate::shadow::Shadows::new(db.clone()),
            db,
            clock,
            policies,
            config,
            effects,
            provider: None,
            deciders: Arc::new(tokio::sync::Semaphore::new(cores)),
            decider_count: cores,
        }
    }

    /// Asks `query` about an order's payment before deciding it at or after its deadline, by
    /// the rules of `config` ([`align`]): an order found paid is aligned to PAID, not closed.
    pub fn with_payments(mut self, query: Arc<dyn PaymentQuery>, config: &PaymentConfig) -> Self {
        if config.query_before_close {
            self.provider = Some(align::Provider::new(query, config));
        }
        self
    }

    /// The database.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The clock.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The payment provider it asks before closes, if any (the check-back asks it too).
    pub fn payment_query(&self) -> Option<Arc<dyn PaymentQuery>> {
        self.provider.as_ref().map(|p| p.query.clone())
    }

    /// Whether any merchant's plugin is asked before the deadline (API 0.2.0 on): then the
    /// outbox timer looks at new rows early ([`outbox::claim_unseen`]).
    pub fn asks_before_deadline(&self) -> bool {
        self.policies
            .all()
            .iter()
            .any(|p| p.plugin.asks_before_deadline())
    }

    /// Handles one trigger to a committed outcome. Never panics on bad input: database failures
    /// become [`Outcome::Retry`] (or a dead letter once attempts run out).
    pub async fn handle(&self, trigger: &Trigger) -> Outcome {
        let span = tracing::info_span!("trigger", order = %trigger.order_id, kind = trigger.kind.as_str(), phase = trigger.phase);
        emit(Event::TriggerReceived {
            source: trigger.kind.as_str(),
        });
        async {
            let outcome = match self.try_handle(trigger).await {
                Ok(outcome) => outcome,
                Err(e) => self.failed_on(trigger, e).await,
            };
            tracing::debug!(?outcome, "trigger handled");
            outcome
        }
        .instrument(span)
        .await
    }

    async fn try_handle(&self, trigger: &Trigger) -> Result<Outcome, DbError> {
        let now_ms = self.clock.now_ms(&self.db).await?;
        let paused = pauses::in_force(&self.db).await?;
        let loaded = {
            let mut conn = self.db.pool().acquire().await?;
            orders::load(&mut conn, self.db.schema(), &trigger.order_id).await
        };
        match self.prepare(trigger, now_ms, &paused, loaded).await? {
            Step::Done(outcome) => Ok(outcome),
            Step::NotPending { reason } => {
                self.finish_row(trigger, now_ms, &reason).await?;
                Ok(Outcome::NoOp { reason })
            }
            Step::Ready(ready) => self.carry_out(&ready).await,
        }
    }

    /// Takes a trigger as far as the plugin's decision: the order's state, the deadline, the
    /// merchant's plugin and breaker, the call, and what a plugin failure means. Everything that
    /// ends a trigger before a decision is carried out ends here. A group does the same in three
    /// steps, its plugin calls batched ([`ask`]).
    async fn prepare(
        &self,
        trigger: &Trigger,
        now_ms: i64,
        paused: &pauses::Paused,
        loaded: Result<Option<Order>, DbError>,
    ) -> Result<Step, DbError> {
        match self.stage(trigger, now_ms, paused, loaded).await? {
            Staged::Ended(step) => Ok(step),
            Staged::Ask(asking) => {
                let (asking, answered) = self
                    .ask_all(vec![*asking])
                    .await
                    .pop()
                    .expect("one answer per ask");
                self.conclude(trigger, asking, answered).await
            }
        }
    }

    /// The part of [`Dispatcher::prepare`] before the plugin call: everything that ends a
    /// trigger without asking its plugin, else what the call needs. `paused` is the pauses in
    /// force, read once for the trigger or its group.
    async fn stage(
        &self,
        trigger: &Trigger,
        now_ms: i64,
        paused: &pauses::Paused,
        loaded: Result<Option<Order>, DbError>,
    ) -> Result<Staged, DbError> {
        let order = match loaded {
            Ok(Some(order)) => order,
            Ok(None) => {
                let reason = format!("order `{}` does not exist", trigger.order_id);
                return Ok(Staged::Ended(Step::Done(
                    self.dead_letter(trigger, now_ms, &reason).await?,
                )));
            }
            Err(DbError::BadRow { detail, .. }) => {
                return Ok(Staged::Ended(Step::Done(
                    self.dead_letter(trigger, now_ms, &detail).await?,
                )));
            }
            Err(e) => return Err(e),
        };
        if order.status != OrderStatus::Pending {
            let reason = format!("order is {}", order.status.as_str());
            return Ok(Staged::Ended(Step::NotPending { reason }));
        }
        if let Some((field, reason)) =
            implausible(&order, self.config.max_window.as_millis() as i64)
        {
            tracing::error!(order = %order.id, field, %reason, "quarantined: implausible times; nothing closed");
            emit(Event::Quarantined { field });
            return Ok(Staged::Ended(Step::Done(
                self.dead_letter(trigger, now_ms, &reason).await?,
            )));
        }
        if let Some((field, reason)) = implausible_row(&order, trigger) {
            // The order's own times are believable: it closes at its deadline whatever this
            // row says. The row's value is set aside for the operator, and the row held to the
            // order's deadline.
            tracing::error!(order = %order.id, field, %reason, "quarantined a trigger row: no clock's reading; the order keeps its own deadline");
            emit(Event::Quarantined { field });
            self.quarantine_row(trigger, now_ms, &reason).await?;
            return Ok(Staged::Ended(Step::Done(
                self.hold(trigger, &order, now_ms, "quarantined row")
                    .await?,
            )));
        }
        if let Some(scope) = paused.holds(&order.merchant, &order.id) {
            return Ok(Staged::Ended(Step::Done(
                self.pause(trigger, &order, now_ms, scope).await?,
            )));
        }
        let early = trigger.kind != TriggerKind::Manual && now_ms < order.deadline_ms;
        let policy = self.policies.get(&order.merchant);
        if early
            && !policy
                .as_ref()
                .is_some_and(|p| p.plugin.asks_before_deadline())
        {
            // A 0.1.0 plugin is asked at the deadline, not before.
            return Ok(Staged::Ended(Step::Done(
                self.hold(trigger, &order, now_ms, "trigger").await?,
            )));
        }
        if policy.is_none()
            && let Some((reason, recheck_ms)) = self.policies.held(&order.merchant)
        {
            // The merchant's plugin did not load at start: its triggers wait for a good file,
            // as a tripped plugin's do; other merchants' orders go on.
            let until_ms = now_ms + recheck_ms.max(1_000);
            if let Some(row) = trigger.row() {
                outbox::defer(
                    &self.db,
                    row,
                    until_ms,
                    &format!("held: the merchant's plugin did not load: {reason}"),
                )
                .await?;
            }
            tracing::debug!(merchant = %order.merchant, until_ms, "plugin not loaded; trigger waits");
            return Ok(Staged::Ended(Step::Done(Outcome::Tripped { until_ms })));
        }
        let Some(policy) = policy else {
            let reason = format!(
                "merchant `{}` of order `{}` has no plugin configured",
                order.merchant, order.id
            );
            return Ok(Staged::Ended(Step::Done(
                self.dead_letter(trigger, now_ms, &reason).await?,
            )));
        };
        if let Some(until_ms) = policy.breaker.open_until(now_ms) {
            if let Some(row) = trigger.row() {
                outbox::defer(
                    &self.db,
                    row,
                    until_ms,
                    "held: the merchant's plugin is tripped",
                )
                .await?;
            }
            tracing::debug!(merchant = %order.merchant, until_ms, "plugin tripped; trigger waits");
            return Ok(Staged::Ended(Step::Done(Outcome::Tripped { until_ms })));
        }
        let payment = match self.consult(trigger, &order, now_ms, early).await? {
            align::Consulted::Decide(payment) => payment,
            align::Consulted::Done(outcome) => return Ok(Staged::Ended(Step::Done(outcome))),
        };
        let ctx = Context {
            now_ms,
            trigger: trigger.kind,
            phase: trigger.phase,
            attempt: trigger.attempt,
            settings: policy.settings.clone(),
            state: trigger.state.clone(),
            payment,
        };
        let input = serde_json::json!({ "order": &order, "context": &ctx }).to_string();
        Ok(Staged::Ask(Box::new(Asking {
            policy,
            order,
            ctx,
            early,
            input,
        })))
    }

    /// The part of [`Dispatcher::prepare`] after the plugin call: the breaker, the metrics, what a
    /// failure means, an early answer held until the deadline, else the decision to carry out.
    async fn conclude(
        &self,
        trigger: &Trigger,
        asking: Asking,
        (answer, latency_us): Answered,
    ) -> Result<Step, DbError> {
        let Asking {
            policy,
            order,
            ctx,
            early,
            input,
        } = asking;
        let now_ms = ctx.now_ms;
        if policy.breaker.record(answer.is_ok(), now_ms) {
            emit(Event::PluginTripped {
                merchant: &order.merchant,
                plugin: policy.plugin.name(),
            });
        }
        emit(Event::Decided {
            merchant: &order.merchant,
            decision: answer.as_ref().map_or("error", |d| d.kind()),
            latency_us,
        });
        if let Err(DecideError::Trap { kind, .. }) = &answer {
            emit(Event::PluginTrap {
                plugin: policy.plugin.name(),
                kind: kind.as_str(),
            });
        }
        let answer_json = match &answer {
            Ok(decision) => serde_json::to_string(decision).expect("a decision serialises"),
            Err(e) => serde_json::json!({ "error": e.to_string() }).to_string(),
        };
        let decision = match answer {
            Ok(decision) => decision,
            Err(e) => {
                let decided = Decided {
                    policy: &policy,
                    order: &order,
                    trigger,
                    now_ms,
                    latency_us,
                    input: &input,
                    answer: &answer_json,
                };
                match policy.on_plugin_error {
                    OnPluginError::Retry => {
                        let transient = e.is_transient();
                        return Ok(Step::Done(
                            self.failed(trigger, Some(&decided), e.to_string(), transient)
                                .await,
                        ));
                    }
                    OnPluginError::DeadLetter => {
                        return Ok(Step::Done(self.give_up(&decided, &e.to_string()).await?));
                    }
                    OnPluginError::Fallback => {
                        tracing::warn!(merchant = %order.merchant, error = %e, "plugin failed; deciding with the fallback policy");
                        fallback::decide(&order, now_ms, trigger.phase, &e)
                    }
                }
            }
        };
        if early && !matches!(decision, Decision::Wait { .. }) {
            // Asked before the deadline (a 0.2.0 plugin): a wait goes ahead, but a cancel or
            // an ignore is held until the deadline, when the plugin is asked again. Only the
            // close is bound to the deadline.
            let what = decision.kind();
            return Ok(Step::Done(self.hold(trigger, &order, now_ms, what).await?));
        }
        Ok(Step::Ready(Box::new(Ready {
            policy,
            order,
            trigger: trigger.clone(),
            now_ms,
            latency_us,
            input,
            answer: answer_json,
            decision,
        })))
    }

    /// Holds a trigger that came before its order's deadline until the deadline: its row is
    /// deferred to it (a trigger without a row is dropped: the order's own row comes then).
    /// `what` names what was held (`trigger`, or the early decision: `cancel`, `ignore`).
    async fn hold(
        &self,
        trigger: &Trigger,
        order: &Order,
        now_ms: i64,
        what: &str,
    ) -> Result<Outcome, DbError> {
        let early_ms = order.deadline_ms - now_ms;
        match (trigger.row(), trigger.due_ms) {
            // The outbox timer's early look at a row due at or after the deadline: it keeps
            // its time and status (a relayed row stays SENT, its message still to come) — the
            // usual case for a 0.1.0 merchant's row, so not worth an info line. A broker
            // message that came early is deferred like any other early trigger.
            (Some(row), Some(due_ms))
                if due_ms >= order.deadline_ms && trigger.kind == TriggerKind::Outbox =>
            {
                outbox::release(&self.db, row).await?;
                tracing::debug!(order = %order.id, early_ms, held = what, "early look; asked at the deadline");
            }
            (Some(row), _) => {
                outbox::defer(&self.db, row, order.deadline_ms, "held until the deadline").await?;
                tracing::info!(order = %order.id, early_ms, held = what, "before the deadline; held until it");
            }
            (None, _) => {}
        }
        Ok(Outcome::Deferred {
            until_ms: order.deadline_ms,
        })
    }

    /// Holds a trigger of a paused order (`scope` says which pause) without asking its plugin:
    /// its row is deferred by `dispatch.pause_recheck` (to the deadline at the earliest) and
    /// noted so that resuming wakes it ([`pauses::held_note`]); a trigger without a row is
    /// dropped (the order's own row is held the same way, and the sweep re-arms one that has
    /// none).
    async fn pause(
        &self,
        trigger: &Trigger,
        order: &Order,
        now_ms: i64,
        scope: pauses::Scope,
    ) -> Result<Outcome, DbError> {
        // Not before the order's deadline: an early look (a 0.2.0 plugin's, a broker message
        // that came early) has nothing to decide until then while paused.
        let until_ms =
            (now_ms + self.config.pause_recheck.as_millis() as i64).max(order.deadline_ms);
        let target = match scope {
            pauses::Scope::Merchant => order.merchant.as_str(),
            pauses::Scope::Order => order.id.as_str(),
        };
        if let Some(row) = trigger.row() {
            outbox::defer(&self.db, row, until_ms, &pauses::held_note(scope, target)).await?;
        }
        emit(Event::TriggerPaused {
            merchant: &order.merchant,
            scope: scope.as_str(),
        });
        tracing::debug!(order = %order.id, merchant = %order.merchant, scope = scope.as_str(), until_ms, "paused; trigger held");
        Ok(Outcome::Paused { scope, until_ms })
    }

    /// Carries out one decision on its own: the guard, then its transaction.
    async fn carry_out(&self, ready: &Ready) -> Result<Outcome, DbError> {
        let decided = ready.decided();
        let (policy, order, trigger, now_ms) =
            (&ready.policy, &ready.order, &ready.trigger, ready.now_ms);
        match ready.decision.clone() {
            Decision::Ignore { reason } => {
                let mut tx = self.db.begin().await?;
                let detail = serde_json::json!({ "decision": "ignore", "reason": reason });
                journal::log_decision(
                    &mut tx,
                    &decided.record("ignore", "ignored", detail.to_string()),
                )
                .await?;
                tx.commit().await?;
                // The order stays open: ask again later, backing off up to `retry_max`, so an
                // ignored order neither vanishes nor is re-swept (and re-logged) every interval.
                if let Some(row) = trigger.row() {
                    let due_ms = now_ms + self.backoff().delay_ms(trigger.attempt + 1);
                    outbox::retry_later(&self.db, row, due_ms, &format!("ignored: {reason}"))
                        .await?;
                }
                Ok(Outcome::Ignored)
            }
            decision => match permitted(policy, order, trigger.phase, now_ms, &decision) {
                Err(problems) => self.refuse(&decided, &decision, problems.join("; ")).await,
                Ok(()) => {
                    // A group of one: the same transaction a group of triggers shares.
                    let mut outcomes = match &decision {
                        Decision::Cancel { .. } => self.close(&[ready]).await?,
                        Decision::Wait { .. } => self.wait(&[ready]).await?,
                        Decision::Ignore { .. } => unreachable!("ignore is carried out above"),
                    };
                    Ok(outcomes.pop().expect("one outcome per decision"))
                }
            },
        }
    }

    /// After a commit that recorded PENDING ledger rows for `order_ids`.
    pub(crate) async fn after_commit(&self, order_ids: &[&str]) {
        self.effects.committed(order_ids).await;
    }

    async fn finish_row(&self, trigger: &Trigger, now_ms: i64, note: &str) -> Result<(), DbError> {
        if let Some(row) = trigger.row() {
            let mut tx = self.db.begin().await?;
            outbox::finish(&mut tx, row, now_ms, Some(note)).await?;
            tx.commit().await?;
        }
        Ok(())
    }
}

/// The earliest time, epoch ms, an order or a trigger row may carry: 2000-01-01T00:00:00Z,
/// before any shop running timeoutd existed. An earlier value is no clock's reading: seconds
/// written where milliseconds belong land in January 1970.
pub const PLAUSIBLE_FROM_MS: i64 = 946_684_800_000;

/// `" (it looks like seconds, not milliseconds)"` for a value in the range epoch seconds take
/// (1e9..1e11, 2001–5138 as seconds, January 1970 to March 1973 as ms); else empty.
fn seconds_hint(value: i64) -> &'static str {
    if (1_000_000_000..100_000_000_000).contains(&value) {
        " (it looks like seconds, not milliseconds)"
    } else {
        ""
    }
}

/// Why an order's own times cannot be believed, if they cannot: a creation time or deadline
/// before [`PLAUSIBLE_FROM_MS`], a deadline before the order's creation or more than
/// `max_window_ms` after it — typically seconds written where milliseconds belong. Such an
/// order is never closed on those times; it is quarantined (dead-lettered) with the field and
/// value named, and the sweep leaves it to an operator. Returns the field
/// (`orders.deadline_ms`, `orders.created_at_ms`) and the reason.
///
/// Ordinary clock skew is not corruption: both times come from the order service's clock, so a
/// skewed clock moves them together and they stay believable.
fn implausible(order: &Order, max_window_ms: i64) -> Option<(&'static str, String)> {
    let (created, deadline) = (order.created_at_ms, order.deadline_ms);
    if deadline < created {
        return Some((
            "orders.deadline_ms",
            format!(
                "orders.deadline_ms = {deadline} of order `{}` is before its created_at_ms = {created}{}",
                order.id,
                seconds_hint(deadline)
            ),
        ));
    }
    if deadline - created > max_window_ms {
        let field = if seconds_hint(created).is_empty() {
            "orders.deadline_ms"
        } else {
            "orders.created_at_ms"
        };
        return Some((
            field,
            format!(
                "orders.deadline_ms = {deadline} of order `{}` is {} ms after its created_at_ms = {created}, more than dispatch.max_window ({max_window_ms} ms){}",
                order.id,
                deadline - created,
                seconds_hint(created)
            ),
        ));
    }
    if created < PLAUSIBLE_FROM_MS {
        return Some((
            "orders.created_at_ms",
            format!(
                "orders.created_at_ms = {created} of order `{}` is before 2000-01-01 ({PLAUSIBLE_FROM_MS}): no clock's reading{}",
                order.id,
                seconds_hint(created)
            ),
        ));
    }
    None
}

/// Why a trigger's row cannot be believed, if it cannot: due before [`PLAUSIBLE_FROM_MS`], a
/// value no clock could produce (seconds for milliseconds). A row due before its order was
/// created, or long after its deadline, is ordinary skew between the order service's clock and
/// the database's: taken as it is (an early row waits for the deadline, a late one is
/// overtaken by the sweep). Returns the field (`order_timeout_msg.due_ms`) and the reason.
fn implausible_row(order: &Order, trigger: &Trigger) -> Option<(&'static str, String)> {
    match (trigger.due_ms, trigger.row_id) {
        (Some(due), Some(row)) if due < PLAUSIBLE_FROM_MS => Some((
            "order_timeout_msg.due_ms",
            format!(
                "order_timeout_msg.due_ms = {due} (row {row}) of order `{}` is before 2000-01-01 ({PLAUSIBLE_FROM_MS}): no clock's reading{}; the order is held to its own deadline_ms = {}",
                order.id,
                seconds_hint(due),
                order.deadline_ms
            ),
        )),
        _ => None,
    }
}

/// The guard's review of `decision` for `order` at `phase`, asked for at `now_ms`
/// ([`guard::review`]): the merchant's grants and the plugin's manifest; every problem.
fn permitted(
    policy: &MerchantPolicy,
    order: &Order,
    phase: u32,
    now_ms: i64,
    decision: &Decision,
) -> Result<(), Vec<String>> {
    guard::review(
        decision,
        guard::Review {
            order,
            phase,
            now_ms,
            granted: policy.granted_effects.as_deref(),
            manifest: policy.plugin.manifest(),
        },
    )
}
