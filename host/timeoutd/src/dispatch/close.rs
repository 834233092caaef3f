//! The close: one transaction holding the compare-and-set, the stock and coupon changes, the
//! ledger rows, the decision log and the outbox rows, for one order or a group of them
//! ([`super::group`] gathers the groups; a trigger handled alone is a group of one). Its rules
//! live here: the stamp, what each effect does inside the transaction, the reason a lost
//! compare-and-set gives, and each effect's ledger row.

use std::collections::{BTreeMap, HashSet};

use timeoutd_runtime::model::{Decision, Effect};

use super::{Decided, Dispatcher, Outcome, Ready};
use crate::config::StockMode;
use crate::db::shop::mapped::PointsBack;
use crate::db::{DbError, WriteTx, journal, ledger, lock_order, orders, outbox, stock_journal};
use crate::events::{Event, emit};
use crate::kinds::LedgerKind;

/// What the close transaction does with one effect. Exhaustive over [`Effect`]: a new kind of
/// effect does not compile until it is given its part here, and [`crate::kinds::home`] says the
/// same (`tests::every_effect_is_in_the_transaction_where_its_kind_is_at_home`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum InClose<'e> {
    /// `quantity` units of `sku` back to `sku_stock`: updated in the transaction, or appended
    /// to the stock journal (`[dispatch.stock] mode`).
    Stock {
        /// The SKU.
        sku: &'e str,
        /// Units.
        quantity: u32,
    },
    /// The coupon back to AVAILABLE, if this order locked it.
    Coupon {
        /// The coupon id.
        coupon: &'e str,
    },
    /// Carried out after the commit by the ledger executor: recorded PENDING.
    External,
}

/// [`InClose`] of `effect`.
pub(super) fn in_close(effect: &Effect) -> InClose<'_> {
    match effect {
        Effect::RestoreStock { sku, quantity } => InClose::Stock {
            sku,
            quantity: *quantity,
        },
        Effect::ReleaseCoupon { coupon } => InClose::Coupon { coupon },
        Effect::RestoreFlashStock { .. }
        | Effect::ReleaseFlashSlot { .. }
        | Effect::ClosePayment { .. }
        | Effect::Notify(_) => InClose::External,
    }
}

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
                let (status, note) = match in_close(effect) {
                    InClose::External => (ledger::PENDING, None),
                    InClose::Stock { sku, .. } if !applied(index, effect) => (
                        ledger::FAILED,
                        Some(format!("no sku_stock row for `{sku}`")),
                    ),
                    InClose::Coupon { coupon } if !applied(index, effect) => (
                        ledger::DONE,
                        Some(format!(
                            "coupon `{coupon}` was not locked by this order; left alone"
                        )),
                    ),
                    InClose::Stock { .. } | InClose::Coupon { .. } => (ledger::DONE, None),
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

    /// The ledger row of the points a close gave back (`return-points`, a host kind carried out
    /// in the close transaction), after the plugin's effects (`index`).
    pub(super) fn points_entry(&self, index: usize, back: &PointsBack) -> ledger::NewEntry<'a> {
        let (status, note) = match back.applied {
            true => (ledger::DONE, None),
            false => (
                ledger::FAILED,
                Some(format!("no points row for buyer `{}`", back.member)),
            ),
        };
        ledger::NewEntry {
            order_id: &self.order.id,
            merchant_id: &self.order.merchant,
            phase: self.trigger.phase,
            index: index as u32,
            kind: LedgerKind::ReturnPoints.as_str(),
            payload: serde_json::json!({
                "kind": LedgerKind::ReturnPoints.as_str(),
                "member": back.member,
                "points": back.points,
            })
            .to_string(),
            status,
            note,
            key: None,
        }
    }
}

/// Whether `effect` is carried out outside the database (by the ledger executor).
pub(super) fn is_external(effect: &Effect) -> bool {
    in_close(effect) == InClose::External
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

    /// Closes `group`, permitted cancels (one, or many decided together), in one transaction;
    /// outcomes in the same order. Effects inside the database are applied in the transaction
    /// and recorded DONE; effects outside it (notices, payment, Redis) are recorded PENDING and
    /// carried out from the ledger after the commit ([`Dispatcher::after_commit`]). An order
    /// that left PENDING before the lock (paid, F12; closed by a duplicate, F9) is a no-op with
    /// its decision logged; one a payment attempt's lease holds waits for the lease.
    ///
    /// # Errors
    /// [`DbError`] when any statement fails; the transaction is rolled back and nothing of the
    /// group is applied (a group's caller then closes each order alone).
    pub(super) async fn close(&self, group: &[&Ready]) -> Result<Vec<Outcome>, DbError> {
        let now_ms = group.iter().map(|r| r.now_ms).max().unwrap_or_default();
        let decided: Vec<_> = group.iter().map(|r| r.decided()).collect();
        let cancels: Vec<(&str, &[Effect])> = group
            .iter()
            .map(|r| match &r.decision {
                Decision::Cancel { reason, effects } => (reason.as_str(), effects.as_slice()),
                Decision::Wait { .. } | Decision::Ignore { .. } => {
                    unreachable!("only cancels are closed")
                }
            })
            .collect();
        let ids: Vec<&str> = group.iter().map(|r| r.order.id.as_str()).collect();
        let backend = self.db.backend();
        let schema = self.db.schema();
        let mut tx = self.db.begin().await?;
        let locked: HashSet<String> = orders::lock_pending(&mut tx, schema, &ids, Some(now_ms))
            .await?
            .into_iter()
            .collect();
        // Which orders of the group this transaction closes, by position; those a payment
        // attempt holds wait for its lease to lapse.
        let won: Vec<bool> = ids.iter().map(|id| locked.contains(*id)).collect();
        let lost: Vec<&str> = (0..group.len())
            .filter(|&k| !won[k])
            .map(|k| ids[k])
            .collect();
        let leases = orders::live_leases(&mut tx, schema, &lost, now_ms).await?;
        let held = |k: usize| leases.get(ids[k]).copied();
        let closing = || (0..group.len()).filter(|&k| won[k]);
        let mut stock: Vec<(&str, i64)> = Vec::new();
        let mut coupons: Vec<(&str, &str, &str)> = Vec::new();
        // Orders giving back each SKU (the stock journal's row says how many).
        let mut givers: BTreeMap<&str, HashSet<usize>> = BTreeMap::new();
        for k in closing() {
            for effect in cancels[k].1 {
                match in_close(effect) {
                    InClose::Stock { sku, quantity } => {
                        stock.push((sku, i64::from(quantity)));
                        givers.entry(sku).or_default().insert(k);
                    }
                    InClose::Coupon { coupon } => {
                        coupons.push((coupon, ids[k], group[k].order.user.as_str()))
                    }
                    InClose::External => {}
                }
            }
        }
        let per_sku = lock_order::units_per_sku(stock);
        let mut missing_skus: HashSet<&str> = HashSet::new();
        // Direct: one statement per SKU, in SKU order (`lock_order::units_per_sku`: no two of
        // our transactions deadlock on stock rows). Before the orders' update, so that a group
        // waiting for a hot SKU's row lock (a flash sale's groups all touch the same few) is
        // stamped after the wait: the orders it won are already locked by `lock_pending`.
        match self.config.stock.mode {
            StockMode::Direct => {
                for (&sku, &units) in &per_sku {
                    if !orders::restore_units(&mut tx, schema, sku, units).await? {
                        missing_skus.insert(sku);
                    }
                }
            }
            // Appended after the stamp, below.
            StockMode::Journal => {}
        }
        // The close's stamp: when it is written, not when the group was decided. Staged groups
        // queue for the writer (SQLite) or for the hot rows; a stamp read before that said an
        // order closed up to a second before it did.
        let written_ms = self.written_at(&mut tx, now_ms).await?;
        // Journal: one insert, which waits for no stock row; a fold adds the units to
        // `sku_stock` after this commit (`db::stock_journal`).
        match self.config.stock.mode {
            StockMode::Direct => {}
            StockMode::Journal => {
                let releases: Vec<stock_journal::Release<'_>> = per_sku
                    .iter()
                    .map(|(&sku, &units)| stock_journal::Release {
                        sku,
                        units,
                        orders: givers.get(sku).map_or(0, |g| g.len() as i64),
                    })
                    .collect();
                missing_skus = stock_journal::append(&mut tx, &releases, written_ms).await?;
            }
        }
        let stamps: Vec<(&str, orders::CloseStamp<'_>)> = closing()
            .map(|k| (ids[k], decided[k].close_stamp(cancels[k].0)))
            .collect();
        let changed = orders::close_many(&mut tx, schema, &stamps, written_ms).await?;
        if changed != stamps.len() as u64 {
            return Err(DbError::BadRow {
                table: "orders",
                detail: format!(
                    "group close changed {changed} of {} locked orders",
                    stamps.len()
                ),
            });
        }
        let released = orders::release_coupons(&mut tx, schema, &coupons).await?;
        let closed_ids: Vec<&str> = closing().map(|k| ids[k]).collect();
        let points = orders::return_points(&mut tx, schema, &closed_ids).await?;
        let applied = |_: usize, e: &Effect| match in_close(e) {
            InClose::Stock { sku, .. } => !missing_skus.contains(sku),
            InClose::Coupon { coupon } => released.contains(coupon),
            InClose::External => false,
        };
        let entries: Vec<_> = closing()
            .flat_map(|k| {
                let back = points.iter().find(|p| p.order == ids[k]);
                let mut rows = decided[k].ledger_entries(cancels[k].1, applied);
                rows.extend(back.map(|p| decided[k].points_entry(cancels[k].1.len(), p)));
                rows
            })
            .collect();
        ledger::record_many(&mut tx, backend, &entries, written_ms).await?;
        let records: Vec<journal::DecisionRecord<'_>> = (0..group.len())
            .map(|k| match (won[k], held(k)) {
                (true, _) => decided[k].record(
                    "cancel",
                    "closed",
                    closed_detail(cancels[k].0, cancels[k].1),
                ),
                (false, Some(until_ms)) => {
                    decided[k].record("cancel", "deferred", held_detail(until_ms))
                }
                (false, None) => decided[k].record("cancel", "noop", noop_detail()),
            })
            .collect();
        journal::log_decisions(&mut tx, &records).await?;
        let rows = |closed: bool| -> Vec<outbox::RowRef<'_>> {
            (0..group.len())
                .filter(|&k| won[k] == closed && (closed || held(k).is_none()))
                .filter_map(|k| group[k].trigger.row())
                .collect()
        };
        for k in (0..group.len()).filter(|&k| !won[k]) {
            if let (Some(until_ms), Some(row)) = (held(k), group[k].trigger.row()) {
                outbox::defer_in(&mut tx, row, until_ms, "held: a payment attempt's lease").await?;
            }
        }
        outbox::finish_many(&mut tx, &rows(true), written_ms, None).await?;
        outbox::finish_many(&mut tx, &rows(false), written_ms, Some(CAS_LOST)).await?;
        tx.commit().await?;
        let outcomes: Vec<Outcome> = (0..group.len())
            .map(|k| match won[k] {
                true => {
                    let lateness_ms = written_ms - decided[k].close_due_ms();
                    emit(Event::Closed {
                        source: group[k].trigger.kind.as_str(),
                        lateness_ms: written_ms - group[k].order.deadline_ms,
                        trigger_lateness_ms: lateness_ms,
                        effects: cancels[k].1.len(),
                    });
                    Outcome::Closed { lateness_ms }
                }
                false => match held(k) {
                    Some(until_ms) => Outcome::Deferred { until_ms },
                    None => Outcome::NoOp {
                        reason: CAS_LOST.to_string(),
                    },
                },
            })
            .collect();
        let external: Vec<&str> = closing()
            .filter(|&k| cancels[k].1.iter().any(is_external))
            .map(|k| ids[k])
            .collect();
        if !external.is_empty() {
            self.after_commit(&external).await;
        }
        Ok(outcomes)
    }
}

#[cfg(test)]
mod tests {
    use timeoutd_runtime::model::{EffectKind, Notice};

    use super::*;

    /// An effect of `kind` (exhaustive: a new kind is added here too).
    fn sample(kind: EffectKind) -> Effect {
        let s = || "x".to_string();
        match kind {
            EffectKind::RestoreStock => Effect::RestoreStock {
                sku: s(),
                quantity: 1,
            },
            EffectKind::RestoreFlashStock => Effect::RestoreFlashStock {
                activity: s(),
                quantity: 1,
            },
            EffectKind::ReleaseFlashSlot => Effect::ReleaseFlashSlot {
                activity: s(),
                user: s(),
            },
            EffectKind::ReleaseCoupon => Effect::ReleaseCoupon { coupon: s() },
            EffectKind::ClosePayment => Effect::ClosePayment { payment_ref: s() },
            EffectKind::Notify => Effect::Notify(Notice {
                channel: s(),
                template: s(),
                params: Vec::new(),
            }),
        }
    }

    #[test]
    fn every_effect_is_in_the_transaction_where_its_kind_is_at_home() {
        for &kind in EffectKind::ALL {
            let effect = sample(kind);
            assert_eq!(effect.kind(), kind);
            assert_eq!(
                is_external(&effect),
                LedgerKind::Effect(kind).is_external(),
                "{kind:?}: the close transaction and kinds::home disagree"
            );
        }
    }
}
