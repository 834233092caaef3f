//! The consumer of the timeout topic (clustering mode: daemons in one consumer group share its
//! queues).
//!
//! A message is a fast wake-up for one outbox row, never the only record of a timeout:
//! 1. decode it ([`super::codec`]); a malformed one is dead-lettered at once with its raw body
//!    (it can never succeed) and acknowledged — it never blocks the queue (F14);
//! 2. a hop of a chain not yet due is re-sent towards its due time ([`super::planner`]); the
//!    last sub-second rest is waited out here;
//! 3. it takes the row it stands for (its `TIMEOUTD_ROW`, or the `(order, phase)` row, adopted
//!    when an order service sent the message without one) under a lease, and hands the trigger
//!    to the dispatcher. A row already PROCESSED makes the message a no-op (F9, F10);
//! 4. it acknowledges only once the outcome is committed; when even that could not be written
//!    (the database is down) it answers `ReconsumeLater`, and the broker redelivers on its
//!    backoff schedule, then to `%DLQ%<group>` ([`super::dlq`] drains that).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rocketmq_client_rust::{
    ClientResult, ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus,
    MessageListenerConcurrently,
};
use rocketmq_model::common::message::message_ext::MessageExt;
use serde_json::json;
use timeoutd_runtime::model::TriggerKind;
use tokio::runtime::Handle;
use tracing::Instrument;

use super::client::{Scheduled, Transport};
use super::codec::{self, TimeoutMessage};
use crate::db::journal::{self, DeadLetter};
use crate::db::relay::{self, RowClaim};
use crate::db::{Db, DbError};
use crate::dispatch::{Dispatcher, Outcome, Trigger};
use crate::events::{Event, emit};

/// Dead-letter `source` of malformed broker messages.
pub const SOURCE_ROCKETMQ: &str = "rocketmq";
/// The broker's property holding a message's unique client id.
const UNIQ_KEY: &str = "UNIQ_KEY";

/// A message as received, copied out of the client's types.
#[derive(Debug, Clone)]
pub struct Received {
    /// Unique id (the producer's `UNIQ_KEY`, else the broker's message id).
    pub message_id: String,
    /// Topic.
    pub topic: String,
    /// `KEYS`.
    pub keys: Option<String>,
    /// Body bytes.
    pub body: Vec<u8>,
    /// Properties.
    pub properties: HashMap<String, String>,
    /// Earlier deliveries (the broker's reconsume count).
    pub reconsume_times: u32,
}

impl Received {
    /// Copies what timeoutd needs out of a client message.
    pub fn of(m: &MessageExt) -> Received {
        let properties: HashMap<String, String> = m
            .properties()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Received {
            message_id: properties
                .get(UNIQ_KEY)
                .cloned()
                .unwrap_or_else(|| m.msg_id().to_string()),
            topic: m.topic().to_string(),
            keys: properties.get("KEYS").cloned(),
            body: m.body().map(|b| b.to_vec()).unwrap_or_default(),
            properties,
            reconsume_times: m.reconsume_times().max(0) as u32,
        }
    }

    /// The dead-letter payload: topic, ids, keys and the raw body (as text, or hex when it is not
    /// UTF-8).
    pub fn payload(&self) -> String {
        let body = match std::str::from_utf8(&self.body) {
            Ok(text) => json!({ "body": text }),
            Err(_) => json!({ "body_hex": hex::encode(&self.body) }),
        };
        let mut value = json!({
            "topic": self.topic, "message_id": self.message_id, "keys": self.keys,
            "reconsume_times": self.reconsume_times,
        });
        value
            .as_object_mut()
            .expect("object")
            .extend(body.as_object().expect("object").clone());
        value.to_string()
    }
}

/// Whether the broker should consider a message done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    /// Acknowledge: its outcome is committed (or it is a no-op).
    Done,
    /// `ReconsumeLater`: nothing durable happened; deliver it again.
    Later,
}

/// How one message of a batch was taken: settled on its own, or a trigger for the group.
enum Taken {
    /// Nothing to dispatch: acknowledged or not, with its `timeoutd_broker_messages_total`
    /// outcome.
    Settled(Ack, &'static str),
    /// Its row is held; the trigger goes to the batch's group.
    Trigger(Trigger),
}

/// Handles timeout messages. Shared by the listener threads.
pub struct TimeoutConsumer {
    dispatcher: Arc<Dispatcher>,
    transport: Arc<Transport>,
    lease_ms: i64,
}

impl TimeoutConsumer {
    /// A consumer dispatching through `dispatcher`, re-sending hops through `transport`, holding
    /// a row for `lease` while it handles it.
    pub fn new(dispatcher: Arc<Dispatcher>, transport: Arc<Transport>, lease: Duration) -> Self {
        TimeoutConsumer {
            dispatcher,
            transport,
            lease_ms: lease.as_millis() as i64,
        }
    }

    fn db(&self) -> &Db {
        self.dispatcher.db()
    }

    /// Handles one message to an [`Ack`].
    pub async fn handle(&self, received: &Received) -> Ack {
        self.handle_batch(std::slice::from_ref(received)).await
    }

    /// Handles a batch of messages to one [`Ack`]: each is decoded, its hop re-sent or its row
    /// taken (side by side); the triggers of the rows taken are then decided together and their
    /// closes committed in one transaction ([`Dispatcher::handle_group`]). [`Ack::Later`] when
    /// any message's outcome could not be committed (the batch is redelivered; the messages that
    /// were committed are then no-ops).
    pub async fn handle_batch(&self, batch: &[Received]) -> Ack {
        let taken = futures_util::future::join_all(batch.iter().map(|r| self.take(r))).await;
        let mut later = false;
        let mut triggers = Vec::new();
        for t in taken {
            match t {
                Taken::Settled(ack, outcome) => {
                    emit(Event::Consumed { outcome });
                    later |= ack == Ack::Later;
                }
                Taken::Trigger(trigger) => triggers.push(trigger),
            }
        }
        for outcome in self.dispatcher.handle_group(&triggers).await {
            // `Retry { due_ms: i64::MAX }` means even the failure could not be recorded.
            let ack = match outcome {
                Outcome::Retry { due_ms, .. } if due_ms == i64::MAX => Ack::Later,
                _ => Ack::Done,
            };
            emit(Event::Consumed {
                outcome: if ack == Ack::Later {
                    "later"
                } else {
                    "handled"
                },
            });
            later |= ack == Ack::Later;
        }
        if later { Ack::Later } else { Ack::Done }
    }

    /// Decodes a message and takes its row, or says how it was settled without a trigger.
    async fn take(&self, received: &Received) -> Taken {
        let decoded = codec::decode(&received.body, received.keys.as_deref(), |k| {
            received.properties.get(k).cloned()
        });
        let message = match decoded {
            Ok(m) => m,
            Err(reason) => {
                let ack = self.poison(received, &reason).await;
                let outcome = if ack == Ack::Done { "poison" } else { "later" };
                return Taken::Settled(ack, outcome);
            }
        };
        let span = tracing::info_span!("message", order = %message.order_id, phase = message.phase, id = %received.message_id);
        match self.take_decoded(&message).instrument(span).await {
            Ok(taken) => taken,
            Err(e) => {
                tracing::warn!(error = %e, "message not handled; the broker will redeliver it");
                Taken::Settled(Ack::Later, "later")
            }
        }
    }

    async fn take_decoded(&self, message: &TimeoutMessage) -> Result<Taken, DbError> {
        let now_ms = self.dispatcher.clock().now_ms(self.db()).await?;
        if let Some(due_ms) = message.due_ms {
            match self.transport.schedule(message, now_ms).await {
                Ok(Scheduled::Sent { .. }) => return Ok(Taken::Settled(Ack::Done, "hop")),
                Ok(Scheduled::Now { wait_ms }) if wait_ms > 0 => {
                    tokio::time::sleep(Duration::from_millis(wait_ms)).await;
                }
                Ok(Scheduled::Now { .. }) => {}
                Err(e) => {
                    // The row is SENT; the outbox timer takes it back at due + fallback_after.
                    tracing::warn!(error = %e, due_ms, "re-sending a hop failed");
                    return Ok(Taken::Settled(Ack::Later, "later"));
                }
            }
        }
        let now_ms = self.dispatcher.clock().now_ms(self.db()).await?;
        let mut row_id = match message.row_id {
            Some(id) => id,
            None => {
                relay::adopt(
                    self.db(),
                    &message.order_id,
                    message.phase,
                    message.due_ms.unwrap_or(now_ms),
                )
                .await?
            }
        };
        let mut claim = relay::claim_row(self.db(), row_id, now_ms, self.lease_ms).await?;
        if claim == RowClaim::Missing && message.row_id.is_some() {
            // The row named by the message is gone (an operator deleted it): adopt a new one.
            row_id = relay::adopt(
                self.db(),
                &message.order_id,
                message.phase,
                message.due_ms.unwrap_or(now_ms),
            )
            .await?;
            claim = relay::claim_row(self.db(), row_id, now_ms, self.lease_ms).await?;
        }
        Ok(match claim {
            RowClaim::Claimed(row) => Taken::Trigger(Trigger {
                order_id: row.order_id.clone(),
                kind: TriggerKind::DelayMessage,
                phase: u32::try_from(row.phase).unwrap_or(0),
                attempt: row.attempts,
                due_ms: Some(row.due_ms),
                row_id: Some(row.id),
            }),
            RowClaim::Processed => Taken::Settled(Ack::Done, "duplicate"),
            RowClaim::Busy => Taken::Settled(Ack::Done, "busy"),
            RowClaim::Missing => Taken::Settled(Ack::Later, "later"),
        })
    }

    /// Dead-letters a malformed message (once per message id) and acknowledges it; if that
    /// cannot be written, the message is reconsumed later.
    async fn poison(&self, received: &Received, reason: &str) -> Ack {
        let result = async {
            let now_ms = self.dispatcher.clock().now_ms(self.db()).await?;
            let mut conn = self.db().pool().acquire().await?;
            let order = received
                .keys
                .as_deref()
                .filter(|k| !k.is_empty() && k.len() <= 64);
            journal::dead_letter_message(
                &mut conn,
                &DeadLetter {
                    source: SOURCE_ROCKETMQ,
                    order_id: order,
                    reason,
                    payload: received.payload(),
                    attempts: received.reconsume_times + 1,
                },
                &received.message_id,
                now_ms,
            )
            .await
        }
        .await;
        match result {
            Ok(_) => {
                emit(Event::DeadLettered {
                    source: SOURCE_ROCKETMQ,
                    reason,
                });
                Ack::Done
            }
            Err(e) => {
                tracing::warn!(error = %e, reason, "malformed message could not be dead-lettered yet");
                Ack::Later
            }
        }
    }
}

/// The client's listener: runs each message through a [`TimeoutConsumer`] on the daemon's
/// runtime, blocking the client's listener thread until the outcome is committed.
pub struct Listener {
    /// The daemon's runtime.
    pub app: Handle,
    /// What handles each message.
    pub consumer: Arc<TimeoutConsumer>,
}

impl MessageListenerConcurrently for Listener {
    fn consume_message(
        &self,
        messages: &[&MessageExt],
        _context: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        let received: Vec<Received> = messages.iter().map(|m| Received::of(m)).collect();
        let consumer = self.consumer.clone();
        let later = self
            .app
            .block_on(async move { consumer.handle_batch(&received).await == Ack::Later });
        Ok(if later {
            ConsumeConcurrentlyStatus::ReconsumeLater
        } else {
            ConsumeConcurrentlyStatus::ConsumeSuccess
        })
    }
}
