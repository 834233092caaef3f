//! A `wait` decision: schedule the next phase and record the reminder, in one transaction, for
//! one order or a group of them ([`super::group`] gathers the groups; a trigger handled alone is
//! a group of one). Its rules live here: when the next phase is due, the reminder's ledger row
//! and the decision's detail.

use std::collections::HashSet;

use timeoutd_runtime::model::{Decision, Notice};

use super::{Dispatcher, Outcome, Ready};
use crate::db::ledger;
use crate::db::{DbError, journal, orders, outbox};
use crate::kinds::LedgerKind;

/// When a wait's next phase is due: `after_ms` from the decision's database time.
pub(super) fn next_due_ms(now_ms: i64, after_ms: u64) -> i64 {
    now_ms.saturating_add(i64::try_from(after_ms).unwrap_or(i64::MAX))
}

/// A permitted `wait` decision, borrowed from its [`Ready`].
struct Waiting<'r> {
    after_ms: u64,
    next_phase: u32,
    /// When the next phase is due ([`next_due_ms`] from the decision's database time).
    due_ms: i64,
    reminder: Option<&'r Notice>,
    state: &'r [u8],
    poll: bool,
}

impl<'r> Waiting<'r> {
    fn of(ready: &'r Ready) -> Self {
        match &ready.decision {
            Decision::Wait {
                after_ms,
                next_phase,
                reminder,
                state,
                poll_payment,
            } => Waiting {
                after_ms: *after_ms,
                next_phase: *next_phase,
                due_ms: next_due_ms(ready.now_ms, *after_ms),
                reminder: reminder.as_ref(),
                state,
                poll: *poll_payment,
            },
            Decision::Cancel { .. } | Decision::Ignore { .. } => {
                unreachable!("only waits are carried out as waits")
            }
        }
    }
}

/// The `decision_log.detail` of a wait.
pub(super) fn wait_detail(
    after_ms: u64,
    next_phase: u32,
    reminder: Option<&Notice>,
    state: &[u8],
) -> String {
    let mut detail = serde_json::json!({
        "decision": "wait", "after_ms": after_ms, "next_phase": next_phase, "reminder": reminder,
    });
    if !state.is_empty() {
        detail["state"] = serde_json::Value::String(hex::encode(state));
    }
    detail.to_string()
}

impl<'a> super::Decided<'a> {
    /// The ledger row of a wait's reminder (kind `remind`, index 0 of the deciding phase),
    /// PENDING for the ledger executor, which skips it if the order is no longer PENDING.
    pub(super) fn reminder_entry(&self, notice: &Notice) -> ledger::NewEntry<'a> {
        ledger::NewEntry {
            order_id: &self.order.id,
            merchant_id: &self.order.merchant,
            phase: self.trigger.phase,
            index: 0,
            kind: LedgerKind::Remind.as_str(),
            payload: serde_json::to_string(notice).expect("notice serialises"),
            status: ledger::PENDING,
            note: None,
            key: None,
        }
    }
}

impl Dispatcher {
    /// Carries out `group`, permitted waits (one, or many decided together), in one
    /// transaction: each still-PENDING order gets its next phase's row (with the state the wait
    /// hands on, as a polling phase when it asked for one) and its reminder; an order that left
    /// PENDING meanwhile is a no-op, its row finished with the reason. Outcomes in the same
    /// order.
    ///
    /// # Errors
    /// [`DbError`] when any statement fails; nothing of the group is applied.
    pub(super) async fn wait(&self, group: &[&Ready]) -> Result<Vec<Outcome>, DbError> {
        let now_ms = group.iter().map(|r| r.now_ms).max().unwrap_or_default();
        let decided: Vec<_> = group.iter().map(|r| r.decided()).collect();
        let waits: Vec<Waiting<'_>> = group.iter().map(|r| Waiting::of(r)).collect();
        let ids: Vec<&str> = group.iter().map(|r| r.order.id.as_str()).collect();
        let backend = self.db.backend();
        let mut tx = self.db.begin().await?;
        let pending: HashSet<String> = orders::lock_pending(&mut tx, self.db.schema(), &ids, None)
            .await?
            .into_iter()
            .collect();
        let open: Vec<usize> = (0..group.len())
            .filter(|&k| pending.contains(ids[k]))
            .collect();
        let phases: Vec<outbox::NextPhase<'_>> = open
            .iter()
            .map(|&k| outbox::NextPhase {
                order_id: ids[k],
                phase: waits[k].next_phase,
                due_ms: waits[k].due_ms,
                state: waits[k].state,
                poll: waits[k].poll,
            })
            .collect();
        outbox::schedule_phases(&mut tx, backend, &phases).await?;
        let mut reminded: Vec<&str> = Vec::new();
        let mut entries = Vec::new();
        for &k in &open {
            if let Some(notice) = waits[k].reminder {
                entries.push(decided[k].reminder_entry(notice));
                reminded.push(ids[k]);
            }
        }
        ledger::record_many(&mut tx, backend, &entries, now_ms).await?;
        let records: Vec<journal::DecisionRecord<'_>> = open
            .iter()
            .map(|&k| {
                let wait = &waits[k];
                decided[k].record(
                    "wait",
                    "waiting",
                    wait_detail(wait.after_ms, wait.next_phase, wait.reminder, wait.state),
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
                        next_phase: waits[k].next_phase,
                        due_ms: waits[k].due_ms,
                    }
                } else {
                    Outcome::NoOp {
                        reason: "order left PENDING before the wait".to_string(),
                    }
                }
            })
            .collect())
    }
}
