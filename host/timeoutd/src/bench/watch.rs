//! Path `broker`: a second consumer group on the bench's topic that only records when the
//! broker released each message, against the due time the message carries — so the report
//! tells the broker's own release rate from the daemon's close rate, and says which of the two
//! held the burst back.

use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use rocketmq_client_rust::{
    ClientResult, ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus,
    MessageListenerConcurrently,
};
use rocketmq_model::common::message::message_ext::MessageExt;

use crate::config::RocketMqConfig;
use crate::rocketmq::codec;
use crate::rocketmq::received::Received;
use crate::rocketmq::{Transport, TransportError};

/// The name of the watching client's threads: the bench takes their CPU out of the daemon's.
pub(super) const WATCHER_THREADS: &str = "bench-watcher";

/// The watching group and what it saw.
pub(super) struct Watch {
    transport: Arc<Transport>,
    released: Arc<Mutex<Vec<i64>>>,
}

impl Watch {
    /// Subscribes group `<consumer_group>_WATCH` to the daemon's topic (acknowledging every
    /// message; the daemon's group gets its own copy).
    ///
    /// # Errors
    /// The transport or the consumer cannot start.
    pub(super) async fn start(config: &RocketMqConfig) -> Result<Watch, TransportError> {
        let mut config = config.clone();
        config.consumer_group = format!("{}_WATCH", config.consumer_group);
        config.producer_group = format!("{}_WATCH", config.producer_group);
        config.instance = None;
        let transport = Transport::start_named(&config, WATCHER_THREADS).await?;
        let released = Arc::new(Mutex::new(Vec::new()));
        transport
            .start_consumer(
                &config.consumer_group,
                &config.topic,
                Recorder {
                    released: released.clone(),
                    earliest_ms: -(config.timer_lead.as_millis() as i64) - 1000,
                },
            )
            .await?;
        Ok(Watch {
            transport,
            released,
        })
    }

    /// Each message's release time minus its due time (host clock), ms, sorted.
    pub(super) fn released(&self) -> Vec<i64> {
        let mut released = self.released.lock().expect("not poisoned").clone();
        released.sort_unstable();
        released
    }

    /// Stops the group and its transport.
    pub(super) async fn stop(self) {
        self.transport.shutdown().await;
    }
}

struct Recorder {
    released: Arc<Mutex<Vec<i64>>>,
    /// The earliest a last hop comes, against its due time, ms: `rocketmq.timer_lead` plus the
    /// second of the planner's window before it (negative).
    earliest_ms: i64,
}

impl MessageListenerConcurrently for Recorder {
    fn consume_message(
        &self,
        messages: &[&MessageExt],
        _context: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        // The broker's release instant as this host saw it, compared with the deadline the
        // bench seeded from the same host's clock: a measurement, not a decision.
        #[expect(
            clippy::disallowed_methods,
            reason = "the watcher times the broker's releases on this host's clock"
        )]
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let mut released = self.released.lock().expect("not poisoned");
        for r in Received::all(messages) {
            let decoded =
                codec::decode_wakeup(&r.body, r.keys.as_deref(), |k| r.properties.get(k).cloned());
            // A hop of a chain, released earlier than a last hop can be (aimed `timer_lead`
            // early) to be re-sent towards its due time, is not the release of the burst. A
            // message that wakes several rows releases each of them, against its own due time.
            if let Ok(message) = decoded
                && let Some(due_ms) = message.due_ms()
                && now_ms - due_ms >= self.earliest_ms
            {
                released.extend(
                    message
                        .messages()
                        .iter()
                        .map(|m| now_ms - m.due_ms.unwrap_or(due_ms)),
                );
            }
        }
        Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
    }
}
