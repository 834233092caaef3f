//! Group commit: many triggers decided together and their closes committed in one transaction.
//!
//! A flash sale makes thousands of orders lapse at one instant, and lateness under such a burst
//! is drain time: at R closes/s the last of N closes N/R after the deadline. One transaction per
//! close caps R at the database's commit rate, so claimed triggers are handled as a group:
//! - one clock read and one load (two statements) for the group, and one more clock read when
//!   its closes are written (the stamp: when written, not when decided);
//! - each order decided by its plugin as usual; anything but a permitted `cancel` (a wait, an
//!   ignore, a refusal, a plugin failure) is carried out on its own, exactly as for one trigger;
//! - the cancels share one transaction: the orders are locked (`FOR UPDATE`, in id order), one
//!   statement per SKU gives back the stock of those still PENDING past their deadline (a
//!   flash sale's hot rows, waited for here), then one compare-and-set statement closes them —
//!   each order's own condition, so a payment that landed first simply leaves that order out
//!   (F12) — then two statements for the coupons, multi-row inserts for the ledger and the
//!   decision log, and one update for the outbox rows;
//! - the permitted waits share another: their next phases' rows, reminders and decisions in
//!   multi-row statements, for the orders still PENDING (locked likewise);
//! - if a shared transaction fails, the group is split: each order is tried alone through the
//!   single close, so one bad order never holds the others back.
//!
//! The lever and its measurement come from graphile-worker, River and db-scheduler (batched
//! completion; see `../shared/PERFORMANCE.md`); `timeoutd bench` measures it against the
//! one-order-per-commit baseline in the same run.

use std::collections::{BTreeMap, HashMap, HashSet};

use futures_util::future::join_all;
use timeoutd_runtime::model::{Decision, Effect, Order};

use super::close::{CAS_LOST, closed_detail, held_detail, is_external, noop_detail};
use super::wait::{next_due_ms, wait_detail};
use super::{Dispatcher, Outcome, Ready, Step, Trigger, permitted};
use crate::db::{DbError, journal, ledger, orders, outbox};

/// Which shared transaction a group of decisions goes through.
#[derive(Clone, Copy)]
enum GroupKind {
    Wait,
    Close,
}

/// Whether the guard permits the decision ([`permitted`]).
fn passes(ready: &Ready) -> bool {
    permitted(
        &ready.policy,
        &ready.order,
        ready.trigger.phase,
        &ready.decision,
    )
    .is_ok()
}
use crate::events::{Event, emit};

impl Dispatcher {
    /// Handles `triggers` together: outcomes in the same order. Equivalent to calling
    /// [`Dispatcher::handle`] on each — the same checks, decisions, records and outcomes — with
    /// the closes sharing one transaction. Never panics on bad input.
    pub async fn handle_group(&self, triggers: &[Trigger]) -> Vec<Outcome> {
        if triggers.len() < 2 {
            return self.handle_each(triggers).await;
        }
        match self.load_group(triggers).await {
            Ok(found) => self.handle_loaded(triggers, found).await,
            Err(_) => self.handle_each(triggers).await,
        }
    }

    /// The orders `triggers` name, by id, in one load (two statements); an order that does not
    /// exist is left out. The prefetch loads a group this way before it falls due
    /// ([`crate::sources::prefetch`]).
    ///
    /// # Errors
    /// [`DbError`] when the load fails.
    pub async fn load_group(
        &self,
        triggers: &[Trigger],
    ) -> Result<HashMap<String, Order>, DbError> {
        let ids: Vec<&str> = triggers.iter().map(|t| t.order_id.as_str()).collect();
        let mut conn = self.db.pool().acquire().await?;
        orders::load_many(&mut conn, &ids).await
    }

    /// [`Dispatcher::handle_group`] on orders loaded already (`found`, from
    /// [`Dispatcher::load_group`]): reads the clock, decides and carries out. The close's
    /// compare-and-set still reads each order's status under its lock, so an order paid or
    /// closed since it was loaded is left out, as with a payment landing during any close.
    pub async fn handle_loaded(
        &self,
        triggers: &[Trigger],
        mut found: HashMap<String, Order>,
    ) -> Vec<Outcome> {
        if triggers.len() < 2 {
            return self.handle_each(triggers).await;
        }
        let Ok(now_ms) = self.clock.now_ms(&self.db).await else {
            return self.handle_each(triggers).await;
        };
        // Missing or unreadable orders go alone: `handle` names what is wrong with them.
        let staged = join_all(triggers.iter().map(|t| {
            let order = found.remove(&t.order_id);
            async move {
                match order {
                    Some(order) => Some(self.stage(t, now_ms, Ok(Some(order))).await),
                    None => None,
                }
            }
        }))
        .await;
        let steps = self.conclude_staged(triggers, staged).await;
        let mut outcomes: Vec<Option<Outcome>> = vec![None; triggers.len()];
        let mut alone = Vec::new();
        let mut not_pending = Vec::new();
        let mut closes: Vec<(usize, Box<Ready>)> = Vec::new();
        let mut waits: Vec<(usize, Box<Ready>)> = Vec::new();
        let mut decided: Vec<(usize, Box<Ready>)> = Vec::new();
        for (i, step) in steps.into_iter().enumerate() {
            if step.is_some() {
                emit(Event::TriggerReceived {
                    source: triggers[i].kind.as_str(),
                });
            }
            match step {
                None => alone.push(i),
                Some(Ok(Step::Done(outcome))) => outcomes[i] = Some(outcome),
                Some(Ok(Step::NotPending { reason })) => not_pending.push((i, reason)),
                Some(Ok(Step::Ready(ready))) => match &ready.decision {
                    Decision::Cancel { .. } if passes(&ready) => closes.push((i, ready)),
                    // A wait handing state to its next phase, or polling, goes alone (its row
                    // carries that).
                    Decision::Wait {
                        state,
                        poll_payment,
                        ..
                    } if state.is_empty() && !poll_payment && passes(&ready) => {
                        waits.push((i, ready))
                    }
                    _ => decided.push((i, ready)),
                },
                Some(Err(e)) => outcomes[i] = Some(self.failed_on(&triggers[i], e).await),
            }
        }
        let alone_done = join_all(alone.iter().map(|&i| self.handle(&triggers[i]))).await;
        for (i, outcome) in alone.into_iter().zip(alone_done) {
            outcomes[i] = Some(outcome);
        }
        match self
            .finish_not_pending(triggers, &not_pending, now_ms)
            .await
        {
            Ok(()) => {
                for (i, reason) in not_pending {
                    outcomes[i] = Some(Outcome::NoOp { reason });
                }
            }
            Err(e) => {
                // One row's claim went stale, or the statement failed: each alone finds out.
                tracing::debug!(error = %e, "finishing the group's settled rows failed; each alone");
                for (i, _) in not_pending {
                    outcomes[i] = Some(self.handle(&triggers[i]).await);
                }
            }
        }
        self.carry_out_each(triggers, &decided, &mut outcomes).await;
        for (together, group) in [(GroupKind::Wait, &waits), (GroupKind::Close, &closes)] {
            if group.is_empty() {
                continue;
            }
            let readies: Vec<&Ready> = group.iter().map(|(_, r)| r.as_ref()).collect();
            let committed = match together {
                GroupKind::Wait => self.wait_group(&readies).await,
                GroupKind::Close => self.close_group(&readies).await,
            };
            match committed {
                Ok(done) => {
                    for ((i, _), outcome) in group.iter().zip(done) {
                        outcomes[*i] = Some(outcome);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, orders = group.len(), "group transaction failed; carrying out each decision alone");
                    self.carry_out_each(triggers, group, &mut outcomes).await;
                }
            }
        }
        outcomes
            .into_iter()
            .map(|o| o.expect("every trigger of the group has an outcome"))
            .collect()
    }

    async fn handle_each(&self, triggers: &[Trigger]) -> Vec<Outcome> {
        join_all(triggers.iter().map(|t| self.handle(t))).await
    }

    /// Carries out each of `readies` (position in `triggers`, decision) on its own, side by side,
    /// into `outcomes`.
    async fn carry_out_each(
        &self,
        triggers: &[Trigger],
        readies: &[(usize, Box<Ready>)],
        outcomes: &mut [Option<Outcome>],
    ) {
        let each = join_all(
            readies
                .iter()
                .map(|(i, r)| self.carry_out_or_fail(&triggers[*i], r)),
        )
        .await;
        for ((i, _), outcome) in readies.iter().zip(each) {
            outcomes[*i] = Some(outcome);
        }
    }

    async fn carry_out_or_fail(&self, trigger: &Trigger, ready: &Ready) -> Outcome {
        match self.carry_out(ready).await {
            Ok(outcome) => outcome,
            Err(e) => self.failed_on(trigger, e).await,
        }
    }

    /// Finishes the rows of triggers whose order is no longer PENDING: one transaction, one
    /// statement per distinct reason.
    async fn finish_not_pending(
        &self,
        triggers: &[Trigger],
        not_pending: &[(usize, String)],
        now_ms: i64,
    ) -> Result<(), DbError> {
        let mut by_reason: BTreeMap<&str, Vec<outbox::RowRef<'_>>> = BTreeMap::new();
        for (i, reason) in not_pending {
            if let Some(row) = triggers[*i].row() {
                by_reason.entry(reason).or_default().push(row);
            }
        }
        if by_reason.is_empty() {
            return Ok(());
        }
        let mut tx = self.db.begin().await?;
        for (reason, ids) in by_reason {
            outbox::finish_many(&mut tx, &ids, now_ms, Some(reason)).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Carries out a group of permitted waits in one transaction: each still-PENDING order gets
    /// its next phase's row and its reminder; an order that left PENDING meanwhile is a no-op
    /// (its row finished with the reason). Outcomes in the same order.
    ///
    /// # Errors
    /// [`DbError`] when any statement fails; nothing of the group is applied.
    async fn wait_group(&self, group: &[&Ready]) -> Result<Vec<Outcome>, DbError> {
        let now_ms = group.iter().map(|r| r.now_ms).max().unwrap_or_default();
        let decided: Vec<_> = group.iter().map(|r| r.decided()).collect();
        let waits: Vec<(u64, u32, Option<timeoutd_runtime::model::Notice>)> = group
            .iter()
            .map(|r| match &r.decision {
                Decision::Wait {
                    after_ms,
                    next_phase,
                    reminder,
                    ..
                } => (*after_ms, *next_phase, reminder.clone()),
                _ => unreachable!("only waits are grouped here"),
            })
            .collect();
        let ids: Vec<&str> = group.iter().map(|r| r.order.id.as_str()).collect();
        let backend = self.db.backend();
        let mut tx = self.db.begin().await?;
        let pending: HashSet<String> = orders::lock_pending(&mut tx, &ids, None)
            .await?
            .into_iter()
            .collect();
        let open: Vec<usize> = (0..group.len())
            .filter(|&k| pending.contains(ids[k]))
            .collect();
        let rows: Vec<(&str, u32, i64)> = open
            .iter()
            .map(|&k| (ids[k], waits[k].1, next_due_ms(group[k].now_ms, waits[k].0)))
            .collect();
        outbox::insert_rows(&mut tx, backend, &rows, outbox::SOURCE_WAIT).await?;
        let mut reminded: Vec<&str> = Vec::new();
        let mut entries = Vec::new();
        for &k in &open {
            if let Some(notice) = &waits[k].2 {
                entries.push(decided[k].reminder_entry(notice));
                reminded.push(ids[k]);
            }
        }
        ledger::record_many(&mut tx, backend, &entries, now_ms).await?;
        let records: Vec<journal::DecisionRecord<'_>> = open
            .iter()
            .map(|&k| {
                let (after_ms, next_phase, reminder) = &waits[k];
                decided[k].record(
                    "wait",
                    "waiting",
                    wait_detail(*after_ms, *next_phase, reminder, &[]),
                )
            })
            .collect();
        journal::log_decisions(&mut tx, &records).await?;
        let open_set: HashSet<usize> = open.iter().copied().collect();
        let rows_of = |waiting: bool| -> Vec<outbox::RowRef<'_>> {
            (0..group.len())
                .filter(|k| open_set.contains(k) == waiting)
                .filter_map(|k| group[k].trigger.row())
                .collect()
        };
        outbox::finish_many(&mut tx, &rows_of(true), now_ms, None).await?;
        outbox::finish_many(&mut tx, &rows_of(false), now_ms, Some("order left PENDING")).await?;
        tx.commit().await?;
        if !reminded.is_empty() {
            self.after_commit(&reminded).await;
        }
        Ok((0..group.len())
            .map(|k| {
                if open_set.contains(&k) {
                    Outcome::Waiting {
                        next_phase: waits[k].1,
                        due_ms: next_due_ms(group[k].now_ms, waits[k].0),
                    }
                } else {
                    Outcome::NoOp {
                        reason: "order left PENDING before the wait".to_string(),
                    }
                }
            })
            .collect())
    }

    /// Closes a group of permitted cancels in one transaction; outcomes in the same order.
    /// An order that left PENDING before the lock (paid, closed by another trigger) is a no-op
    /// with its decision logged, exactly as in the single close.
    ///
    /// # Errors
    /// [`DbError`] when any statement fails; the transaction is rolled back and nothing of the
    /// group is applied (the caller then closes each order alone).
    async fn close_group(&self, group: &[&Ready]) -> Result<Vec<Outcome>, DbError> {
        let now_ms = group.iter().map(|r| r.now_ms).max().unwrap_or_default();
        let decided: Vec<_> = group.iter().map(|r| r.decided()).collect();
        let cancels: Vec<(&str, &[Effect])> = group
            .iter()
            .map(|r| match &r.decision {
                Decision::Cancel { reason, effects } => (reason.as_str(), effects.as_slice()),
                _ => unreachable!("only cancels are grouped"),
            })
            .collect();
        let ids: Vec<&str> = group.iter().map(|r| r.order.id.as_str()).collect();
        let backend = self.db.backend();
        let mut tx = self.db.begin().await?;
        let locked: HashSet<String> = orders::lock_pending(&mut tx, &ids, Some(now_ms))
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
        let leases = orders::live_leases(&mut tx, &lost, now_ms).await?;
        let held = |k: usize| leases.get(ids[k]).copied();
        let closing = || (0..group.len()).filter(|&k| won[k]);
        // Stock: one statement per SKU, in SKU order (two groups never deadlock on stock rows).
        // Before the orders' update, so that a group waiting for a hot SKU's row lock (a flash
        // sale's groups all touch the same few) is stamped after the wait: the orders it won
        // are already locked by `lock_pending`.
        let mut per_sku: BTreeMap<&str, i64> = BTreeMap::new();
        let mut coupons: Vec<(&str, &str)> = Vec::new();
        for k in closing() {
            for effect in cancels[k].1 {
                match effect {
                    Effect::RestoreStock { sku, quantity } => {
                        *per_sku.entry(sku).or_default() += i64::from(*quantity)
                    }
                    Effect::ReleaseCoupon { coupon } => coupons.push((coupon, ids[k])),
                    _ => {}
                }
            }
        }
        let mut missing_skus: HashSet<&str> = HashSet::new();
        for (sku, units) in &per_sku {
            if !orders::restore_units(&mut tx, sku, *units).await? {
                missing_skus.insert(sku);
            }
        }
        // The close's stamp: when it is written, not when the group was decided. Staged groups
        // queue for the writer (SQLite) or for the hot rows; a stamp read before that said an
        // order closed up to a second before it did.
        let written_ms = self.written_at(&mut tx, now_ms).await?;
        let stamps: Vec<(&str, orders::CloseStamp<'_>)> = closing()
            .map(|k| (ids[k], decided[k].close_stamp(cancels[k].0)))
            .collect();
        let changed = orders::close_many(&mut tx, &stamps, written_ms).await?;
        if changed != stamps.len() as u64 {
            return Err(DbError::BadRow {
                table: "orders",
                detail: format!(
                    "group close changed {changed} of {} locked orders",
                    stamps.len()
                ),
            });
        }
        let released = orders::release_coupons(&mut tx, &coupons).await?;
        let applied = |_: usize, e: &Effect| match e {
            Effect::RestoreStock { sku, .. } => !missing_skus.contains(sku.as_str()),
            Effect::ReleaseCoupon { coupon } => released.contains(coupon),
            _ => false,
        };
        let entries: Vec<_> = closing()
            .flat_map(|k| decided[k].ledger_entries(cancels[k].1, applied))
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
