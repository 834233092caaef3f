//! The close: one transaction holding the compare-and-set, the stock and coupon changes, the
//! ledger rows, the decision log and the outbox row. The rules shared by the single close and
//! the group close ([`super::group`]) live here: the stamp, the reason a lost compare-and-set
//! gives, and each effect's ledger row.

use timeoutd_runtime::model::Effect;

use super::{Decided, Dispatcher, Outcome};
use crate::db::{DbError, WriteTx, journal, ledger, orders, outbox};
use crate::kinds::LedgerKind;

/// Why a close that lost its compare-and-set did nothing (paid in between, F12; a concurrent
/// duplicate, F9).
pub(super) const CAS_LOST: &str = "compare-and-set lost: the order left PENDING before the close";

impl<'a> Decided<'a> {
    /// When the close was due: the deadline, or the closing phase's due time when later.
    pub(super) fn close_due_ms(&self) -> i64 {
        self.trigger
            .due_ms
            .unwrap_or(self.order.deadline_ms)
            .max(self.order.deadline_ms)
    }

    /// What the close records on the order.
    pub(super) fn close_stamp(&self, reason: &'a str) -> orders::CloseStamp<'a> {
        orders::CloseStamp {
            now_ms: self.now_ms,
            due_ms: self.close_due_ms(),
            closed_by: self.trigger.kind.as_str(),
            reason,
        }
    }

    /// The ledger rows of `effects`, in order (`index` is the position, part of the
    /// idempotency key). An effect inside the database is DONE when `applied(index)` says it took
    /// (a stock row was there, the coupon was locked by this order) — a missing SKU is FAILED, a
    /// coupon not this order's is left alone and noted — and an effect outside it (notices,
    /// payment, Redis) is PENDING for the ledger executor.
    pub(super) fn ledger_entries(
        &self,
        effects: &[Effect],
        applied: impl Fn(usize, &Effect) -> bool,
    ) -> Vec<ledger::NewEntry<'a>> {
        effects
            .iter()
            .enumerate()
            .map(|(index, effect)| {
                let (status, note) = match effect {
                    _ if is_external(effect) => (ledger::PENDING, None),
                    Effect::RestoreStock { sku, .. } if !applied(index, effect) => (
                        ledger::FAILED,
                        Some(format!("no sku_stock row for `{sku}`")),
                    ),
                    Effect::ReleaseCoupon { coupon } if !applied(index, effect) => (
                        ledger::DONE,
                        Some(format!(
                            "coupon `{coupon}` was not locked by this order; left alone"
                        )),
                    ),
                    _ => (ledger::DONE, None),
                };
                ledger::NewEntry {
                    order_id: &self.order.id,
                    merchant_id: &self.order.merchant,
                    phase: self.trigger.phase,
                    index: index as u32,
                    kind: effect.kind().as_str(),
                    payload: serde_json::to_string(effect).expect("effect serialises"),
                    status,
                    note,
                    key: None,
                }
            })
            .collect()
    }
}

/// Whether `effect` is carried out outside the database (by the ledger executor).
pub(super) fn is_external(effect: &Effect) -> bool {
    LedgerKind::Effect(effect.kind()).is_external()
}

/// The `decision_log.detail` of a close.
pub(super) fn closed_detail(reason: &str, effects: &[Effect]) -> String {
    serde_json::json!({ "decision": "cancel", "reason": reason, "effects": effects }).to_string()
}

/// The `decision_log.detail` of a close held back by a payment attempt's lease.
pub(super) fn held_detail(until_ms: i64) -> String {
    serde_json::json!({ "decision": "cancel", "held": "a payment attempt holds the order", "until_ms": until_ms })
        .to_string()
}

/// The `decision_log.detail` of a close that lost its compare-and-set.
pub(super) fn noop_detail() -> String {
    serde_json::json!({ "decision": "cancel", "noop": CAS_LOST }).to_string()
}

impl Dispatcher {
    /// When a close is written: the clock read now on the write transaction's own connection,
    /// and never before `decided_ms` (the clock the close was decided by, which also bounds the
    /// compare-and-set's `deadline_ms <= now`).
    ///
    /// # Errors
    /// [`DbError`] when the clock cannot be read (on PostgreSQL that aborts the transaction).
    pub(super) async fn written_at(
        &self,
        tx: &mut WriteTx,
        decided_ms: i64,
    ) -> Result<i64, DbError> {
        Ok(self.clock.now_ms_on(&self.db, tx).await?.max(decided_ms))
    }

    /// Closes the order with `effects` (already checked against it). Effects inside the
    /// database are applied in the transaction and recorded DONE; effects outside it (notices,
    /// payment, Redis) are recorded PENDING and carried out from the ledger after the commit
    /// ([`Dispatcher::after_commit`]). The one-order form of the group close.
    pub(super) async fn close(
        &self,
        d: &Decided<'_>,
        reason: &str,
        effects: &[Effect],
    ) -> Result<Outcome, DbError> {
        let order = d.order;
        let backend = self.db.backend();
        let mut tx = self.db.begin().await?;
        // Stamped when written: on SQLite the transaction may have queued for the writer.
        let stamp = orders::CloseStamp {
            now_ms: self.written_at(&mut tx, d.now_ms).await?,
            ..d.close_stamp(reason)
        };
        if !orders::compare_and_close(&mut tx, &order.id, &stamp).await? {
            tx.rollback().await?;
            let mut tx = self.db.begin().await?;
            let leases = orders::live_leases(&mut tx, &[order.id.as_str()], d.now_ms).await?;
            if let Some(&until_ms) = leases.get(&order.id) {
                // A payment attempt holds the order: the close waits for it to lapse.
                journal::log_decision(
                    &mut tx,
                    &d.record("cancel", "deferred", held_detail(until_ms)),
                )
                .await?;
                if let Some(row) = d.trigger.row() {
                    outbox::defer_in(&mut tx, row, until_ms, "held: a payment attempt's lease")
                        .await?;
                }
                tx.commit().await?;
                tracing::info!(
                    until_ms,
                    "a payment attempt holds the order; the close waits"
                );
                return Ok(Outcome::Deferred { until_ms });
            }
            journal::log_decision(&mut tx, &d.record("cancel", "noop", noop_detail())).await?;
            if let Some(row) = d.trigger.row() {
                outbox::finish(&mut tx, row, d.now_ms, Some(CAS_LOST)).await?;
            }
            tx.commit().await?;
            tracing::info!("close lost the compare-and-set; no effect applied");
            return Ok(Outcome::NoOp {
                reason: CAS_LOST.to_string(),
            });
        }
        let mut applied = vec![false; effects.len()];
        for (index, effect) in effects.iter().enumerate() {
            applied[index] = match effect {
                Effect::RestoreStock { sku, quantity } => {
                    orders::restore_stock(&mut tx, sku, *quantity).await?
                }
                Effect::ReleaseCoupon { coupon } => {
                    orders::release_coupon(&mut tx, coupon, &order.id).await?
                }
                _ => false,
            };
        }
        for entry in d.ledger_entries(effects, |i, _| applied[i]) {
            ledger::record(&mut tx, backend, &entry, stamp.now_ms).await?;
        }
        journal::log_decision(
            &mut tx,
            &d.record("cancel", "closed", closed_detail(reason, effects)),
        )
        .await?;
        if let Some(row) = d.trigger.row() {
            outbox::finish(&mut tx, row, stamp.now_ms, None).await?;
        }
        tx.commit().await?;
        let lateness_ms = stamp.now_ms - stamp.due_ms;
        crate::events::emit(crate::events::Event::Closed {
            source: d.trigger.kind.as_str(),
            lateness_ms: stamp.now_ms - order.deadline_ms,
            trigger_lateness_ms: lateness_ms,
            effects: effects.len(),
        });
        if effects.iter().any(is_external) {
            self.after_commit(&[&order.id]).await;
        }
        Ok(Outcome::Closed { lateness_ms })
    }
}
