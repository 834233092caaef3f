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
//! - if a shared transaction loses a lock conflict (a deadlock on hot stock rows), it runs again
//!   whole after a jittered pause, a few times ([`Dispatcher::commit_together`]);
//! - if it fails otherwise, or keeps losing, the group is split: each order is tried alone, a
//!   group of one through the same close ([`super::close`]) or wait ([`super::wait`]), so one
//!   bad order never holds the others back.
//!
//! The lever and its measurement come from graphile-worker, River and db-scheduler (batched
//! completion; see `../shared/PERFORMANCE.md`); `timeoutd bench` measures it against the
//! one-order-per-commit baseline in the same run.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use futures_util::future::join_all;
use timeoutd_runtime::model::{Decision, Order};

use super::{Dispatcher, Outcome, Ready, Step, Trigger, permitted};
use crate::db::{DbError, orders, outbox};
use crate::retry::Backoff;

/// How many times a group's shared transaction that lost a lock conflict runs again whole
/// before the group is split ([`Dispatcher::commit_together`]).
const CONFLICT_RETRIES: u32 = 3;

/// The pause before a lock-conflicted group runs again: 20 ms, doubling, at most 200 ms (before
/// jitter). A deadlock's other side is a group or a shop write of a few ms, so a short pause
/// lets it commit; the retries stay well inside a claim's lease.
const CONFLICT_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(20),
    max: Duration::from_millis(200),
};

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
        ready.now_ms,
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
        orders::load_many(&mut conn, self.db.schema(), &ids).await
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
        let Ok(paused) = crate::db::pauses::in_force(&self.db).await else {
            return self.handle_each(triggers).await;
        };
        // Missing or unreadable orders go alone: `handle` names what is wrong with them.
        let paused = &paused;
        let staged = join_all(triggers.iter().map(|t| {
            let order = found.remove(&t.order_id);
            async move {
                match order {
                    Some(order) => Some(self.stage(t, now_ms, paused, Ok(Some(order))).await),
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
                    Decision::Wait { .. } if passes(&ready) => waits.push((i, ready)),
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
            match self.commit_together(together, &readies).await {
                Ok(done) => {
                    for ((i, _), outcome) in group.iter().zip(done) {
                        outcomes[*i] = Some(outcome);
                    }
                }
                Err(e) => {
                    if !e.is_lock_conflict() {
                        tracing::warn!(error = %e, orders = group.len(), "group transaction failed; carrying out each decision alone");
                    }
                    self.carry_out_each(triggers, group, &mut outcomes).await;
                }
            }
        }
        outcomes
            .into_iter()
            .map(|o| o.expect("every trigger of the group has an outcome"))
            .collect()
    }

    /// Commits `readies` in one shared transaction of `kind`. A lock conflict (a deadlock with
    /// another group or the shop's own writes on hot stock rows, a Galera certification
    /// failure) rolled the whole transaction back, so the group runs again whole, up to
    /// [`CONFLICT_RETRIES`] times after a jittered pause ([`CONFLICT_BACKOFF`], ×0.5–1.5 so
    /// the two sides of a deadlock do not meet again): splitting it into one transaction per
    /// order would put more transactions on the very rows that deadlocked (the soak of
    /// 2026-12-07: deadlocks fed on their own fallback until the shop fell behind). Any other
    /// error, or conflicts past the retries, is returned for the caller to split the group.
    async fn commit_together(
        &self,
        kind: GroupKind,
        readies: &[&Ready],
    ) -> Result<Vec<Outcome>, DbError> {
        let name = match kind {
            GroupKind::Wait => "wait",
            GroupKind::Close => "close",
        };
        let mut conflicts = 0;
        loop {
            let committed = match kind {
                GroupKind::Wait => self.wait(readies).await,
                GroupKind::Close => self.close(readies).await,
            };
            let e = match committed {
                Err(e) if e.is_lock_conflict() => e,
                done => return done,
            };
            conflicts += 1;
            let retry = conflicts <= CONFLICT_RETRIES;
            emit(Event::GroupConflict {
                group: name,
                outcome: if retry { "retried" } else { "split" },
                orders: readies.len(),
                error: &e.to_string(),
            });
            if !retry {
                return Err(e);
            }
            let pause = CONFLICT_BACKOFF
                .delay(conflicts)
                .mul_f64(0.5 + fastrand::f64());
            tokio::time::sleep(pause).await;
        }
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
}
