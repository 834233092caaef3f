//! A `wait` decision: schedule the next phase and record the reminder, in one transaction. The
//! rules shared with the group of waits ([`super::group`]) live here: when the next phase is due,
//! the reminder's ledger row and the decision's detail.

use timeoutd_runtime::model::{Decision, Notice};

use super::{Decided, Dispatcher, Outcome};
use crate::db::ledger;
use crate::db::{DbError, journal, orders, outbox};
use crate::kinds::LedgerKind;

/// When a wait's next phase is due: `after_ms` from the decision's database time.
pub(super) fn next_due_ms(now_ms: i64, after_ms: u64) -> i64 {
    now_ms.saturating_add(i64::try_from(after_ms).unwrap_or(i64::MAX))
}

/// The `decision_log.detail` of a wait.
pub(super) fn wait_detail(
    after_ms: u64,
    next_phase: u32,
    reminder: &Option<Notice>,
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

impl<'a> Decided<'a> {
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
    /// Carries out a `wait` the guard permitted: the next phase's row (with the wait's state),
    /// the reminder's ledger row, the decision log and this trigger's row, in one transaction.
    pub(super) async fn wait(
        &self,
        d: &Decided<'_>,
        decision: &Decision,
    ) -> Result<Outcome, DbError> {
        let Decision::Wait {
            after_ms,
            next_phase,
            reminder,
            state,
            poll_payment,
        } = decision
        else {
            unreachable!("wait is called with a wait decision");
        };
        let (after_ms, next_phase) = (*after_ms, *next_phase);
        let due_ms = next_due_ms(d.now_ms, after_ms);
        let mut tx = self.db.begin().await?;
        outbox::schedule_phase(
            &mut tx,
            self.db.backend(),
            &d.order.id,
            next_phase,
            due_ms,
            state,
            *poll_payment,
        )
        .await?;
        let status = orders::status_of(&mut tx, &d.order.id).await?;
        if status.as_deref() != Some("PENDING") {
            tx.rollback().await?;
            return Ok(Outcome::NoOp {
                reason: format!("order is {} now", status.unwrap_or_else(|| "gone".into())),
            });
        }
        if let Some(notice) = reminder {
            ledger::record(
                &mut tx,
                self.db.backend(),
                &d.reminder_entry(notice),
                d.now_ms,
            )
            .await?;
        }
        let detail = wait_detail(after_ms, next_phase, reminder, state);
        journal::log_decision(&mut tx, &d.record("wait", "waiting", detail)).await?;
        if let Some(row) = d.trigger.row() {
            outbox::finish(&mut tx, row, d.now_ms, None).await?;
        }
        tx.commit().await?;
        if reminder.is_some() {
            self.after_commit(&[&d.order.id]).await;
        }
        Ok(Outcome::Waiting { next_phase, due_ms })
    }
}
