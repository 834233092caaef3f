//! Carrying out recorded effects that live outside the database, from the ledger.
//!
//! The close transaction records every effect; this module runs the PENDING ones and settles
//! each row exactly once (`PENDING → DONE` is itself a compare-and-set, so two runners cannot
//! both settle it). In this release the notice sink is the log: a reminder or closed notice is
//! one structured line on target `timeoutd::notice` carrying its idempotency key, so a
//! downstream consumer can de-duplicate the rare line repeated by a crash between writing it
//! and settling it. `close-payment` and the Redis flash-sale effects stay PENDING until their
//! executors exist.

use serde_json::Value;
use sqlx::Row;
use timeoutd_runtime::model::{Effect, Notice};

use crate::clock::Clock;
use crate::db::{Db, DbError, ledger};
use crate::dispatch::REMIND;

/// Ledger kinds this runner carries out.
pub const RUNNABLE: &[&str] = &["notify", REMIND];

/// Runs PENDING notice effects from the ledger.
#[derive(Clone, Debug)]
pub struct EffectRunner {
    db: Db,
    clock: Clock,
}

impl EffectRunner {
    /// A runner over `db`.
    pub fn new(db: Db, clock: Clock) -> Self {
        EffectRunner { db, clock }
    }

    /// Runs the PENDING effects of one order (right after its transaction committed).
    /// Failures are logged and left PENDING for [`EffectRunner::run_backlog`].
    pub async fn run_for_order(&self, order_id: &str) {
        if let Err(e) = self.run(Some(order_id), i64::MAX).await {
            tracing::warn!(order = order_id, error = %e, "effects left pending");
        }
    }

    /// Runs PENDING effects untouched for `min_age_ms` (those whose daemon died between commit
    /// and execution). Returns how many were settled.
    ///
    /// # Errors
    /// [`DbError`] when the ledger cannot be read.
    pub async fn run_backlog(&self, min_age_ms: i64) -> Result<usize, DbError> {
        let now = self.clock.now_ms(&self.db).await?;
        self.run(None, now - min_age_ms).await
    }

    async fn run(&self, order_id: Option<&str>, touched_before_ms: i64) -> Result<usize, DbError> {
        let pending = ledger::pending(&self.db, RUNNABLE, order_id, touched_before_ms, 500).await?;
        let mut settled = 0;
        for effect in pending {
            let now = self.clock.now_ms(&self.db).await?;
            let (status, note) = self.execute(&effect).await?;
            if ledger::settle(&self.db, effect.id, status, note.as_deref(), now).await? {
                settled += 1;
            }
        }
        Ok(settled)
    }

    async fn execute(
        &self,
        effect: &ledger::PendingEffect,
    ) -> Result<(&'static str, Option<String>), DbError> {
        let notice = match effect.kind.as_str() {
            REMIND => serde_json::from_str::<Notice>(&effect.payload).ok(),
            _ => match serde_json::from_str::<Effect>(&effect.payload) {
                Ok(Effect::Notify(n)) => Some(n),
                _ => None,
            },
        };
        let Some(notice) = notice else {
            return Ok((
                ledger::FAILED,
                Some(format!("unreadable {} payload", effect.kind)),
            ));
        };
        let (status, user) = order_status_and_user(&self.db, &effect.order_id).await?;
        if effect.kind == REMIND && status.as_deref() != Some("PENDING") {
            return Ok((
                ledger::DONE,
                Some(format!("not sent: order is {}", status.unwrap_or_default())),
            ));
        }
        let params = Value::Object(
            notice
                .params
                .iter()
                .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                .collect(),
        );
        tracing::info!(
            target: "timeoutd::notice",
            idempotency_key = %effect.key,
            kind = %effect.kind,
            order = %effect.order_id,
            merchant = %effect.merchant_id,
            user = %user.unwrap_or_default(),
            channel = %notice.channel,
            template = %notice.template,
            params = %params,
            "notice"
        );
        Ok((ledger::DONE, None))
    }
}

async fn order_status_and_user(
    db: &Db,
    order_id: &str,
) -> Result<(Option<String>, Option<String>), DbError> {
    let row = sqlx::query("SELECT status, user_id FROM orders WHERE id = ?")
        .bind(order_id)
        .fetch_optional(db.pool())
        .await?;
    Ok(match row {
        Some(r) => (Some(r.try_get(0)?), Some(r.try_get(1)?)),
        None => (None, None),
    })
}
