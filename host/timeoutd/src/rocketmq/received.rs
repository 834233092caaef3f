//! A broker message as timeoutd handles it: copied out of the client's types once, so the
//! consumer, the DLQ drain and the bench's watcher share one shape and one dead-letter payload;
//! and [`consume_blocking`], the one way a listener call hands its messages to the daemon's
//! runtime.

use std::collections::HashMap;
use std::future::Future;

use rocketmq_client_rust::{ClientResult, ConsumeConcurrentlyStatus};
use rocketmq_model::common::message::message_ext::MessageExt;
use serde_json::json;
use tokio::runtime::Handle;

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

/// Runs `handle` over a listener call's messages on the daemon's runtime `app`, blocking the
/// client's listener thread until it answers: `true` acknowledges the call
/// (`ConsumeSuccess`), `false` has the broker deliver it again (`ReconsumeLater`).
pub fn consume_blocking<F, Fut>(
    app: &Handle,
    messages: &[&MessageExt],
    handle: F,
) -> ClientResult<ConsumeConcurrentlyStatus>
where
    F: FnOnce(Vec<Received>) -> Fut,
    Fut: Future<Output = bool>,
{
    let done = app.block_on(handle(Received::all(messages)));
    Ok(if done {
        ConsumeConcurrentlyStatus::ConsumeSuccess
    } else {
        ConsumeConcurrentlyStatus::ReconsumeLater
    })
}

impl Received {
    /// Copies a listener call's messages.
    pub fn all(messages: &[&MessageExt]) -> Vec<Received> {
        messages.iter().map(|m| Received::of(m)).collect()
    }

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

    /// How many outbox rows it wakes: its [`super::codec::PROP_ROWS`] (a message of timeoutd's
    /// relay for several rows), else 1. A count that does not parse is 1 here; the consumer's
    /// decoding refuses it.
    pub fn rows(&self) -> usize {
        self.properties
            .get(super::codec::PROP_ROWS)
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(1)
            .max(1)
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
