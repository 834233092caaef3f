//! The close: one transaction holding the compare-and-set, the stock and coupon changes, the
//! ledger rows, the decision log and the outbox row.

use timeoutd_runtime::model::Effect;

use super::{Decided, Dispatcher, Outcome};
use crate::db::{DbError, journal, ledger, orders, outbox};

impl Dispatcher {
    /// Closes the order with `effects` (already checked against it). Effects inside the
    /// database are applied in the transaction and recorded DONE; effects outside it (notices,
    /// payment, Redis) are recorded PENDING and carried out from the ledger after the commit.
    pub(super) async fn close(
        &self,
        d: &Decided<'_>,
        reason: &str,
        effects: &[Effect],
    ) -> Result<Outcome, DbError> {
        let order = d.order;
        let due_ms = d
            .trigger
            .due_ms
            .unwrap_or(order.deadline_ms)
            .max(order.deadline_ms);
        let stamp = orders::CloseStamp {
            now_ms: d.now_ms,
            due_ms,
            closed_by: d.trigger.kind.as_str(),
            reason,
        };
        let backend = self.db.backend();
        let mut tx = self.db.begin().await?;
        if !orders::compare_and_close(&mut tx, &order.id, &stamp).await? {
            tx.rollback().await?;
            let reason =
                "compare-and-set lost: the order left PENDING before the close".to_string();
            let mut tx = self.db.begin().await?;
            let detail = serde_json::json!({ "decision": "cancel", "noop": reason });
            journal::log_decision(&mut tx, &d.record("cancel", "noop", detail.to_string())).await?;
            if let Some(id) = d.trigger.row_id {
                outbox::finish(&mut tx, id, d.now_ms, Some(&reason)).await?;
            }
            tx.commit().await?;
            tracing::info!("close lost the compare-and-set; no effect applied");
            return Ok(Outcome::NoOp { reason });
        }
        for (index, effect) in effects.iter().enumerate() {
            let (status, note) = match effect {
                Effect::RestoreStock { sku, quantity } => {
                    if orders::restore_stock(&mut tx, sku, *quantity).await? {
                        (ledger::DONE, None)
                    } else {
                        (
                            ledger::FAILED,
                            Some(format!("no sku_stock row for `{sku}`")),
                        )
                    }
                }
                Effect::ReleaseCoupon { coupon } => {
                    if orders::release_coupon(&mut tx, coupon, &order.id).await? {
                        (ledger::DONE, None)
                    } else {
                        let note =
                            format!("coupon `{coupon}` was not locked by this order; left alone");
                        (ledger::DONE, Some(note))
                    }
                }
                Effect::Notify(_)
                | Effect::ClosePayment { .. }
                | Effect::RestoreFlashStock { .. }
                | Effect::ReleaseFlashSlot { .. } => (ledger::PENDING, None),
            };
            let entry = ledger::NewEntry {
                order_id: &order.id,
                merchant_id: &order.merchant,
                phase: d.trigger.phase,
                index: index as u32,
                kind: effect.kind(),
                payload: serde_json::to_string(effect).expect("effect serialises"),
                status,
                note,
                key: None,
            };
            ledger::record(&mut tx, backend, &entry, d.now_ms).await?;
        }
        let detail =
            serde_json::json!({ "decision": "cancel", "reason": reason, "effects": effects });
        journal::log_decision(&mut tx, &d.record("cancel", "closed", detail.to_string())).await?;
        if let Some(id) = d.trigger.row_id {
            outbox::finish(&mut tx, id, d.now_ms, None).await?;
        }
        tx.commit().await?;
        let lateness_ms = d.now_ms - due_ms;
        crate::events::emit(crate::events::Event::Closed {
            source: d.trigger.kind.as_str(),
            lateness_ms,
            effects: effects.len(),
        });
        self.effects.run_for_order(&order.id).await;
        Ok(Outcome::Closed { lateness_ms })
    }
}
