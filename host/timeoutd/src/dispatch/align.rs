//! Payment alignment (seeds 002, 003): before an order with a payment reference is decided at
//! or after its deadline, the provider is asked. Found paid, the order is aligned to PAID in one
//! transaction (compare-and-set PENDING → PAID with the provider's `paid_at_ms`, the coupon
//! used, a forward `order-paid` notice in the ledger, the decision log, the trigger's row) and
//! never closed. Unpaid, not found or closed, the plugin decides as usual, seeing the answer in
//! its context (API 0.2.0). Unreachable, the merchant-wide `payment.on_unknown` rule applies,
//! bounded by `payment.unknown_max_wait`.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use timeoutd_runtime::model::{Effect, Notice, Order, Payment, PaymentStatus};

use super::{Dispatcher, Outcome, Trigger};
use crate::config::{OnPaymentUnknown, PaymentConfig};
use crate::db::{DbError, journal, ledger, orders, outbox};
use crate::kinds::LedgerKind;
use crate::ratecap::RateCap;

/// Ledger index of the forward notice of an order found paid (beside the plugin's effects,
/// numbered from 0, and the refund's 10 000): key `merchant/order/phase/10001`.
pub const PAID_NOTICE_INDEX: u32 = 10_001;

/// The payment provider as dispatch sees it: a payment's state now. A port: the daemon hands
/// in the effects' adapters (`effects::Providers`); tests may hand in anything.
pub trait PaymentQuery: Send + Sync {
    /// The payment `payment_ref` of `merchant`'s order as the provider has it now
    /// (`queried_at_ms` unset); the merchant says which provider to ask.
    ///
    /// # Errors
    /// Why the provider could not answer (after its quick retries).
    fn query<'a>(
        &'a self,
        merchant: &'a str,
        payment_ref: &'a str,
    ) -> BoxFuture<'a, Result<Payment, String>>;
}

/// The provider and the rules for asking it.
#[derive(Clone)]
pub(super) struct Provider {
    pub(super) query: Arc<dyn PaymentQuery>,
    on_unknown: OnPaymentUnknown,
    unknown_max_wait_ms: i64,
    paid_channel: String,
    cap: Arc<RateCap>,
}

impl Provider {
    pub(super) fn new(query: Arc<dyn PaymentQuery>, config: &PaymentConfig) -> Self {
        Provider {
            query,
            on_unknown: config.on_unknown,
            unknown_max_wait_ms: config.unknown_max_wait.as_millis() as i64,
            paid_channel: config.paid_channel.clone(),
            cap: Arc::new(RateCap::new(config.max_queries_per_second)),
        }
    }
}

/// What asking the provider came to.
pub(super) enum Consulted {
    /// Decide with this payment in the context.
    Decide(Option<Payment>),
    /// The trigger ended here (aligned to PAID, or waiting for the provider).
    Done(Outcome),
}

impl Dispatcher {
    /// Asks the provider about `order`'s payment when a close may follow — at or after the
    /// deadline, or on an operator's trigger — or when the phase was scheduled to poll
    /// (`wait.poll-payment`), with a provider configured and a payment reference on the order,
    /// within the merchant's `payment.max_queries_per_second`. Otherwise the context carries
    /// the payment as unknown.
    pub(super) async fn consult(
        &self,
        trigger: &Trigger,
        order: &Order,
        now_ms: i64,
        early: bool,
    ) -> Result<Consulted, DbError> {
        let Some(payment_ref) = &order.payment_ref else {
            return Ok(Consulted::Decide(None));
        };
        let Some(provider) = self.provider.as_ref().filter(|_| !early || trigger.poll) else {
            return Ok(Consulted::Decide(Some(Payment::default())));
        };
        if !provider.cap.take(&order.merchant, now_ms) {
            crate::events::emit(crate::events::Event::PaymentUnknown { outcome: "capped" });
            return Ok(Consulted::Decide(Some(Payment::default())));
        }
        match provider.query.query(&order.merchant, payment_ref).await {
            Ok(mut payment) => {
                payment.queried_at_ms = Some(now_ms);
                if payment.status == PaymentStatus::Paid {
                    let outcome = self.align_paid(provider, trigger, order, &payment, now_ms);
                    return Ok(Consulted::Done(outcome.await?));
                }
                Ok(Consulted::Decide(Some(payment)))
            }
            Err(error) => {
                let held_ms = now_ms - order.deadline_ms;
                let wait = provider.on_unknown == OnPaymentUnknown::Wait
                    && held_ms < provider.unknown_max_wait_ms
                    && trigger.row_id.is_some();
                tracing::warn!(order = %order.id, %error, wait, held_ms, "payment provider did not answer");
                crate::events::emit(crate::events::Event::PaymentUnknown {
                    outcome: if wait { "wait" } else { "decide" },
                });
                if !wait {
                    let unknown = Payment {
                        queried_at_ms: Some(now_ms),
                        ..Payment::default()
                    };
                    return Ok(Consulted::Decide(Some(unknown)));
                }
                let row = trigger.row().expect("checked above");
                let until = order.deadline_ms + provider.unknown_max_wait_ms;
                let due_ms = (now_ms + self.backoff().delay_ms(trigger.attempt + 1)).min(until);
                let error = format!("payment provider: {error}");
                outbox::retry_later(&self.db, row, due_ms, &error).await?;
                Ok(Consulted::Done(Outcome::Retry { due_ms, error }))
            }
        }
    }

    /// Aligns an order the provider says is paid: PENDING → PAID (the provider's `paid_at_ms`,
    /// else now), the coupon used, the forward notice, the decision log and the trigger's row,
    /// in one transaction. Stock and coupon are not given back: the buyer has them.
    async fn align_paid(
        &self,
        provider: &Provider,
        trigger: &Trigger,
        order: &Order,
        payment: &Payment,
        now_ms: i64,
    ) -> Result<Outcome, DbError> {
        let paid_at_ms = payment.paid_at_ms.unwrap_or(now_ms);
        if self
            .db
            .schema()
            .mapped()
            .is_some_and(|m| !m.records_payments())
        {
            // The shop's own payment service records the payment on its tables (the profile
            // has no `[paid]`); the order is not closed. The sweep asks again if it stays
            // pending.
            let reason = "the provider says paid: left to the shop's payment service".to_string();
            if let Some(row) = trigger.row() {
                let mut tx = self.db.begin().await?;
                outbox::finish(&mut tx, row, now_ms, Some(&reason)).await?;
                tx.commit().await?;
            }
            return Ok(Outcome::NoOp { reason });
        }
        let mut tx = self.db.begin().await?;
        if !orders::pay(&mut tx, self.db.schema(), &order.id, paid_at_ms, now_ms).await? {
            tx.rollback().await?;
            let reason = "order left PENDING before it could be aligned".to_string();
            if let Some(row) = trigger.row() {
                let mut tx = self.db.begin().await?;
                outbox::finish(&mut tx, row, now_ms, Some(&reason)).await?;
                tx.commit().await?;
            }
            return Ok(Outcome::NoOp { reason });
        }
        let mut params = vec![("paid_at_ms".to_string(), paid_at_ms.to_string())];
        if let Some(cents) = payment.paid_cents {
            params.push(("amount_cents".to_string(), cents.to_string()));
        }
        let notice = Effect::Notify(Notice {
            channel: provider.paid_channel.clone(),
            template: "order-paid".to_string(),
            params,
        });
        let entry = ledger::NewEntry {
            order_id: &order.id,
            merchant_id: &order.merchant,
            phase: trigger.phase,
            index: PAID_NOTICE_INDEX,
            kind: LedgerKind::Effect(notice.kind()).as_str(),
            payload: serde_json::to_string(&notice).expect("a notice serialises"),
            status: ledger::PENDING,
            note: None,
            key: None,
        };
        ledger::record(&mut tx, self.db.backend(), &entry, now_ms).await?;
        let detail = serde_json::json!({
            "decision": "align", "provider": "paid", "paid_at_ms": paid_at_ms,
            "amount_cents": payment.paid_cents,
        });
        let plugin = self.policies.get(&order.merchant);
        journal::log_decision(
            &mut tx,
            &journal::DecisionRecord {
                order_id: &order.id,
                merchant_id: &order.merchant,
                plugin: plugin.as_ref().map_or("", |p| p.plugin.name()),
                plugin_digest: plugin.as_ref().map_or("", |p| p.plugin.digest()),
                trigger_kind: trigger.kind.as_str(),
                phase: trigger.phase,
                attempt: trigger.attempt,
                decision: "align",
                outcome: "paid",
                detail: detail.to_string(),
                latency_us: 0,
                decided_at_ms: now_ms,
                input: None,
                answer: None,
            },
        )
        .await?;
        if let Some(row) = trigger.row() {
            outbox::finish(&mut tx, row, now_ms, Some(ALIGNED)).await?;
        }
        tx.commit().await?;
        tracing::info!(order = %order.id, paid_at_ms, "paid at the provider; aligned to PAID, not closed");
        crate::events::emit(crate::events::Event::Aligned);
        self.after_commit(&[&order.id]).await;
        Ok(Outcome::Aligned { paid_at_ms })
    }
}

/// The note on the row of a trigger whose order was found paid.
pub const ALIGNED: &str = "paid at the provider; aligned to PAID";
