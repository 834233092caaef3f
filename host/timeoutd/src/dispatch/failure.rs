//! Failed, refused and hopeless triggers: retry with backoff, or dead-letter with the reason.

use timeoutd_runtime::model::Decision;

use super::{Decided, Dispatcher, Outcome, Trigger};
use crate::db::{DbError, journal, outbox};
use crate::retry::Backoff;

impl Dispatcher {
    /// Backoff between attempts of a trigger (`dispatch.retry_initial` doubling to `retry_max`).
    pub(crate) fn backoff(&self) -> Backoff {
        Backoff {
            initial: self.config.retry_initial,
            max: self.config.retry_max,
        }
    }

    /// A database error ending a trigger: a stale claim (the row's lease lapsed and another
    /// holder took it) ends it with nothing written — the new holder's work stands; anything
    /// else is a transient [`Self::failed`].
    pub(super) async fn failed_on(&self, trigger: &Trigger, e: DbError) -> Outcome {
        if let DbError::StaleClaim { .. } = e {
            tracing::warn!(order = %trigger.order_id, error = %e, "completion refused: the row's lease lapsed and another holder has it");
            return Outcome::NoOp {
                reason: e.to_string(),
            };
        }
        self.failed(trigger, None, e.to_string(), true).await
    }

    /// A failure: retried with backoff while attempts remain (and it may pass), else
    /// dead-lettered. Never fails itself: if even that cannot be written, the row's lease
    /// lapses and the trigger comes back.
    pub(super) async fn failed(
        &self,
        trigger: &Trigger,
        decided: Option<&Decided<'_>>,
        error: String,
        transient: bool,
    ) -> Outcome {
        let attempts = trigger.attempt + 1;
        let exhausted = attempts >= self.config.max_attempts;
        let result = async {
            let now_ms = match decided {
                Some(d) => d.now_ms,
                None => self.clock.now_ms(&self.db).await?,
            };
            if let Some(d) = decided {
                let outcome = if exhausted { "dead-lettered" } else { "retry" };
                let detail = serde_json::json!({ "error": error, "transient": transient });
                let mut tx = self.db.begin().await?;
                journal::log_decision(&mut tx, &d.record("error", outcome, detail.to_string()))
                    .await?;
                tx.commit().await?;
            }
            match (exhausted, trigger.row()) {
                (false, Some(row)) => {
                    let due_ms = now_ms + self.backoff().delay_ms(attempts);
                    outbox::retry_later(&self.db, row, due_ms, &error).await?;
                    tracing::warn!(%error, attempts, due_ms, "trigger failed; will retry");
                    Ok::<_, DbError>(Outcome::Retry {
                        due_ms,
                        error: error.clone(),
                    })
                }
                _ => {
                    let reason = format!("gave up after {attempts} attempt(s): {error}");
                    self.dead_letter(trigger, now_ms, &reason).await
                }
            }
        }
        .await;
        match result {
            Ok(outcome) => outcome,
            Err(e @ DbError::StaleClaim { .. }) => Outcome::NoOp {
                reason: e.to_string(),
            },
            Err(e) => {
                tracing::error!(%error, db_error = %e, "trigger failed and the failure could not be recorded; its lease will lapse");
                Outcome::Unrecorded {
                    error: format!("{error}; recording the failure: {e}"),
                }
            }
        }
    }

    /// A plugin failure under `on_plugin_error = "dead_letter"`: the call is logged and the
    /// trigger dead-lettered at once, without retries.
    pub(super) async fn give_up(&self, d: &Decided<'_>, error: &str) -> Result<Outcome, DbError> {
        let detail = serde_json::json!({ "error": error, "on_plugin_error": "dead_letter" });
        let mut tx = self.db.begin().await?;
        journal::log_decision(
            &mut tx,
            &d.record("error", "dead-lettered", detail.to_string()),
        )
        .await?;
        tx.commit().await?;
        let reason = format!("plugin failed (on_plugin_error = dead_letter): {error}");
        self.dead_letter(d.trigger, d.now_ms, &reason).await
    }

    /// Dead-letters a trigger found malformed before dispatch (a bad outbox row).
    pub async fn reject(&self, trigger: &Trigger, reason: &str) -> Outcome {
        let result = async {
            let now_ms = self.clock.now_ms(&self.db).await?;
            self.dead_letter(trigger, now_ms, reason).await
        }
        .await;
        match result {
            Ok(outcome) => outcome,
            // Another holder has the row now: its handling stands.
            Err(e @ DbError::StaleClaim { .. }) => Outcome::NoOp {
                reason: e.to_string(),
            },
            Err(e) => Outcome::Unrecorded {
                error: format!("dead-lettering `{reason}`: {e}"),
            },
        }
    }

    /// Dead-letters a trigger that cannot succeed as it is (missing order, unknown merchant,
    /// attempts exhausted), and retires its outbox row.
    pub(super) async fn dead_letter(
        &self,
        trigger: &Trigger,
        now_ms: i64,
        reason: &str,
    ) -> Result<Outcome, DbError> {
        self.record_dead_letter(trigger, now_ms, reason, trigger.kind.as_str(), true)
            .await?;
        Ok(Outcome::DeadLettered {
            reason: reason.to_string(),
        })
    }

    /// Sets aside a trigger row whose value no clock could produce (`reason` names it): an OPEN
    /// dead letter of source [`journal::SOURCE_QUARANTINED_ROW`] with the trigger, for an
    /// operator. The row itself is left to the caller, which holds it to the order's deadline.
    pub(super) async fn quarantine_row(
        &self,
        trigger: &Trigger,
        now_ms: i64,
        reason: &str,
    ) -> Result<(), DbError> {
        self.record_dead_letter(
            trigger,
            now_ms,
            reason,
            journal::SOURCE_QUARANTINED_ROW,
            false,
        )
        .await
    }

    /// `trigger`'s OPEN dead letter under `source`, and its outbox row retired when `retire`,
    /// in one transaction; then the event.
    async fn record_dead_letter(
        &self,
        trigger: &Trigger,
        now_ms: i64,
        reason: &str,
        source: &'static str,
        retire: bool,
    ) -> Result<(), DbError> {
        let mut tx = self.db.begin().await?;
        journal::dead_letter(
            &mut tx,
            &journal::DeadLetter {
                source,
                order_id: Some(&trigger.order_id),
                reason,
                payload: serde_json::to_string(trigger).expect("trigger serialises"),
                attempts: trigger.attempt + 1,
            },
            now_ms,
        )
        .await?;
        if retire && let Some(row) = trigger.row() {
            outbox::finish(
                &mut tx,
                row,
                now_ms,
                Some(&format!("dead-lettered: {reason}")),
            )
            .await?;
        }
        tx.commit().await?;
        crate::events::emit(crate::events::Event::DeadLettered { source, reason });
        Ok(())
    }

    /// Refuses a decision whose effects exceed the order: nothing is applied, the decision is
    /// dead-lettered with every violation, and the order stays open for an operator.
    pub(super) async fn refuse(
        &self,
        d: &Decided<'_>,
        decision: &Decision,
        reason: String,
    ) -> Result<Outcome, DbError> {
        let mut tx = self.db.begin().await?;
        let detail = serde_json::json!({ "decision": decision, "refused": reason });
        journal::log_decision(
            &mut tx,
            &d.record(decision.kind(), "refused", detail.to_string()),
        )
        .await?;
        journal::dead_letter(
            &mut tx,
            &journal::DeadLetter {
                source: "refused-decision",
                order_id: Some(&d.order.id),
                reason: &format!(
                    "plugin `{}` decision refused: {reason}",
                    d.policy.plugin.name()
                ),
                payload: serde_json::to_string(decision).expect("decision serialises"),
                attempts: d.trigger.attempt + 1,
            },
            d.now_ms,
        )
        .await?;
        if let Some(row) = d.trigger.row() {
            outbox::finish(&mut tx, row, d.now_ms, Some("decision refused")).await?;
        }
        tx.commit().await?;
        crate::events::emit(crate::events::Event::DeadLettered {
            source: "refused-decision",
            reason: &reason,
        });
        Ok(Outcome::Refused { reason })
    }
}
