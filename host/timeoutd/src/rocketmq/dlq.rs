//! Drains the broker's dead-letter topic for our consumer group (`%DLQ%<consumer_group>`, where
//! the broker puts a message after `rocketmq.max_reconsume` deliveries) into the `dead_letter`
//! table, once per message, so operators see and re-drive them like every other dead letter.

use rocketmq_client_rust::{
    ClientResult, ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus,
    MessageListenerConcurrently,
};
use rocketmq_model::common::message::message_ext::MessageExt;
use tokio::runtime::Handle;

use super::codec;
use super::received::{Received, consume_blocking};
use crate::clock::Clock;
use crate::db::journal::{self, DeadLetter};
use crate::db::{Db, DbError};
use crate::events::{Event, emit};

/// Dead-letter `source` of messages drained from the broker's DLQ.
pub const SOURCE_DLQ: &str = crate::db::journal::SOURCE_ROCKETMQ_DLQ;

/// The DLQ topic of consumer group `group` (RocketMQ's `MixAll.getDLQTopic`).
pub fn dlq_topic(group: &str) -> String {
    format!("%DLQ%{group}")
}

/// The consumer group that drains `group`'s DLQ.
pub fn drain_group(group: &str) -> String {
    format!("{group}-DLQ-DRAIN")
}

/// Records one DLQ message.
///
/// # Errors
/// [`DbError`] when the row cannot be written (the message is then redelivered).
pub async fn record(db: &Db, clock: &Clock, received: &Received) -> Result<(), DbError> {
    let now_ms = clock.now_ms(db).await?;
    let order = codec::decode(&received.body, None, |_| None)
        .ok()
        .map(|m| m.order_id);
    let reason = format!(
        "the broker gave up after {} deliveries and moved it to {}",
        received.reconsume_times + 1,
        received.topic
    );
    let mut conn = db.pool().acquire().await?;
    let added = journal::dead_letter_message(
        &mut conn,
        &DeadLetter {
            source: SOURCE_DLQ,
            order_id: order.as_deref(),
            reason: &reason,
            payload: received.payload(),
            attempts: received.reconsume_times + 1,
        },
        &format!("dlq:{}", received.message_id),
        now_ms,
    )
    .await?;
    conn.commit().await?;
    if added {
        emit(Event::DeadLettered {
            source: SOURCE_DLQ,
            reason: &reason,
        });
    }
    Ok(())
}

/// The listener of the DLQ topic.
pub struct DlqListener {
    /// The daemon's runtime.
    pub app: Handle,
    /// Database.
    pub db: Db,
    /// Clock.
    pub clock: Clock,
}

impl MessageListenerConcurrently for DlqListener {
    fn consume_message(
        &self,
        messages: &[&MessageExt],
        _context: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        let (db, clock) = (self.db.clone(), self.clock.clone());
        consume_blocking(&self.app, messages, |received| async move {
            for r in &received {
                if let Err(e) = record(&db, &clock, r).await {
                    tracing::warn!(error = %e, "DLQ message not recorded yet");
                    return false;
                }
            }
            true
        })
    }
}
