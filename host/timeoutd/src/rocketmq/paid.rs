//! The consumer of the paid topic (`rocketmq.paid_topic`, seed 003): a payment system's
//! "cancel the timeout" message, applied once through the paid callback's path
//! ([`crate::paid::apply`]). A PENDING order becomes PAID, so its timeout message, arriving
//! before, together with or after it, finds it PAID or loses the compare-and-set; a CLOSED one
//! is a paid-after-close; a duplicate changes nothing. A message that names no order, or an
//! order that does not exist, is dead-lettered with its reason and acknowledged.

use std::collections::HashMap;
use std::sync::Arc;

use rocketmq_client_rust::{
    ClientResult, ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus,
    MessageListenerConcurrently,
};
use rocketmq_model::common::message::message_ext::MessageExt;
use tokio::runtime::Handle;

use super::codec;
use super::received::{Received, consume_blocking};
use crate::clock::Clock;
use crate::config::PaidAfterClose;
use crate::db::journal::{self, DeadLetter};
use crate::db::{Db, DbError};
use crate::dispatch::Dispatcher;
use crate::events::{Event, emit};
use crate::paid::{self, Applied};

/// Dead-letter `source` of malformed paid messages.
pub const SOURCE_PAID: &str = crate::db::journal::SOURCE_ROCKETMQ_PAID;

/// `paid_after_close.source` of paid-after-close orders told by a paid message.
pub const PAID_MESSAGE: &str = "paid-message";

/// The consumer group of the paid topic when `rocketmq.paid_group` is unset.
pub fn default_group(consumer_group: &str) -> String {
    format!("{consumer_group}-PAID")
}

/// The listener of the paid topic.
pub struct PaidListener {
    /// The daemon's runtime.
    pub app: Handle,
    /// Database.
    pub db: Db,
    /// Clock.
    pub clock: Clock,
    /// Each merchant's `on_paid_after_close`.
    pub resolutions: Arc<HashMap<String, PaidAfterClose>>,
    /// Woken when a refund was raised (its ledger row runs off this path).
    pub dispatcher: Arc<Dispatcher>,
}

impl PaidListener {
    /// Applies one paid message.
    ///
    /// # Errors
    /// [`DbError`] when nothing could be recorded; the broker redelivers the message.
    pub async fn handle(&self, r: &Received) -> Result<(), DbError> {
        let decoded = codec::decode(&r.body, r.keys.as_deref(), |k| r.properties.get(k).cloned());
        let order_id = match decoded {
            Ok(m) => m.order_id,
            Err(reason) => return self.dead_letter(r, None, &reason).await,
        };
        let applied = paid::apply(
            &self.db,
            &self.clock,
            &self.resolutions,
            &order_id,
            PAID_MESSAGE,
        )
        .await?;
        match applied {
            Applied::Missing => {
                let reason = format!("paid notice for order `{order_id}`, which does not exist");
                self.dead_letter(r, Some(&order_id), &reason).await
            }
            Applied::Aligned | Applied::AlreadyPaid | Applied::AfterClose { .. } => {
                if applied.raised_refund() {
                    self.dispatcher.after_commit(&[&order_id]).await;
                }
                Ok(())
            }
        }
    }

    async fn dead_letter(
        &self,
        r: &Received,
        order_id: Option<&str>,
        reason: &str,
    ) -> Result<(), DbError> {
        let now_ms = self.clock.now_ms(&self.db).await?;
        let mut conn = self.db.pool().acquire().await?;
        let added = journal::dead_letter_message(
            &mut conn,
            &DeadLetter {
                source: SOURCE_PAID,
                order_id,
                reason,
                payload: r.payload(),
                attempts: r.reconsume_times + 1,
            },
            &format!("paid:{}", r.message_id),
            now_ms,
        )
        .await?;
        conn.commit().await?;
        if added {
            emit(Event::DeadLettered {
                source: SOURCE_PAID,
                reason,
            });
        }
        Ok(())
    }
}

impl MessageListenerConcurrently for PaidListener {
    fn consume_message(
        &self,
        messages: &[&MessageExt],
        _context: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        consume_blocking(&self.app, messages, |received| async move {
            for r in &received {
                if let Err(e) = self.handle(r).await {
                    tracing::warn!(error = %e, "paid message not applied yet; the broker redelivers it");
                    return false;
                }
            }
            true
        })
    }
}
