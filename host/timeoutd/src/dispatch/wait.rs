//! A `wait` decision: schedule the next phase and record the reminder, in one transaction.

use sqlx::Row;
use timeoutd_runtime::model::Notice;

use super::{Decided, Dispatcher, Outcome};
use crate::db::{DbError, journal, ledger, outbox};

/// Ledger kind of a reminder sent with a `wait` (a closed notice is a `notify` effect).
pub const REMIND: &str = "remind";

impl Dispatcher {
    pub(super) async fn wait(
        &self,
        d: &Decided<'_>,
        after_ms: u64,
        next_phase: u32,
        reminder: Option<Notice>,
    ) -> Result<Outcome, DbError> {
        let decision = serde_json::json!({
            "decision": "wait", "after_ms": after_ms, "next_phase": next_phase, "reminder": reminder,
        });
        if let Err(reason) =
            timeoutd_runtime::guard::check_wait(d.trigger.phase, after_ms, next_phase)
        {
            let refused = timeoutd_runtime::model::Decision::Wait {
                after_ms,
                next_phase,
                reminder,
            };
            return self.refuse(d, &refused, reason).await;
        }
        let due_ms = d
            .now_ms
            .saturating_add(i64::try_from(after_ms).unwrap_or(i64::MAX));
        let mut tx = self.db.begin().await?;
        outbox::schedule_phase(&mut tx, self.db.backend(), &d.order.id, next_phase, due_ms).await?;
        let status: Option<String> = self
            .db
            .backend()
            .query("SELECT status FROM orders WHERE id = ?")
            .bind(&d.order.id)
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| r.try_get(0))
            .transpose()?;
        if status.as_deref() != Some("PENDING") {
            tx.rollback().await?;
            return Ok(Outcome::NoOp {
                reason: format!("order is {} now", status.unwrap_or_else(|| "gone".into())),
            });
        }
        if let Some(notice) = &reminder {
            let entry = ledger::NewEntry {
                order_id: &d.order.id,
                merchant_id: &d.order.merchant,
                phase: d.trigger.phase,
                index: 0,
                kind: REMIND,
                payload: serde_json::to_string(notice).expect("notice serialises"),
                status: ledger::PENDING,
                note: None,
                key: None,
            };
            ledger::record(&mut tx, self.db.backend(), &entry, d.now_ms).await?;
        }
        journal::log_decision(&mut tx, &d.record("wait", "waiting", decision.to_string())).await?;
        if let Some(id) = d.trigger.row_id {
            outbox::finish(&mut tx, id, d.now_ms, None).await?;
        }
        tx.commit().await?;
        if reminder.is_some() {
            self.after_commit(&[&d.order.id]).await;
        }
        Ok(Outcome::Waiting { next_phase, due_ms })
    }
}
