//! The hold: timeout messages that came before their row's due time, kept in memory and handed
//! back to the consumer's groups ([`super::coalesce`]) the moment they fall due.
//!
//! The planner aims a row's last hop `rocketmq.timer_lead` early ([`super::planner`]), because a
//! broker releases a burst due in one timer slot over seconds; the lead makes the messages of a
//! flash sale arrive before its deadline, and the hold makes them one burst of groups at the
//! deadline instead of a trickle behind the broker. A held message is acknowledged at once, so it
//! holds no listener thread and no group slot while it waits: its outbox row, still SENT, is the
//! durable record. A daemon stopping or crashing with messages held loses only their promptness:
//! the outbox timer takes their rows back `rocketmq.fallback_after` past the due time (F1).
//!
//! The wait is the host's monotonic timer (`tokio::time`); the close itself still reads the
//! database clock and compares it with the order's deadline, so nothing closes early even if the
//! two clocks drift (a message released a little early is simply held again).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::coalesce::Coalescer;
use super::received::Received;

/// Where early messages are handed to be held: cheap to clone, shared by the consumer's groups.
#[derive(Clone)]
pub struct Hold {
    tx: mpsc::UnboundedSender<(Instant, Received)>,
    held: Arc<AtomicUsize>,
    max: usize,
}

/// The hold's receiving half: [`Held::run`] releases the messages.
pub struct Held {
    rx: mpsc::UnboundedReceiver<(Instant, Received)>,
    held: Arc<AtomicUsize>,
}

/// A hold of at most `max` messages and the half that releases them.
pub fn channel(max: usize) -> (Hold, Held) {
    let (tx, rx) = mpsc::unbounded_channel();
    let held = Arc::new(AtomicUsize::new(0));
    (
        Hold {
            tx,
            held: held.clone(),
            max,
        },
        Held { rx, held },
    )
}

impl Hold {
    /// Holds `message` for `wait`. `false` when `max` messages are held already or the hold has
    /// stopped: the caller then waits it out itself.
    pub fn try_hold(&self, message: &Received, wait: Duration) -> bool {
        if self.held.fetch_add(1, Ordering::AcqRel) >= self.max {
            self.held.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        if self
            .tx
            .send((Instant::now() + wait, message.clone()))
            .is_err()
        {
            self.held.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// Messages held now.
    pub fn len(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Whether no message is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Held {
    /// Releases each held message at its instant into `groups`, in calls of at most `chunk`
    /// messages (the coalescer merges them with live calls into groups of
    /// `rocketmq.group_commit`). Runs until every [`Hold`] is dropped or `groups` is gone (the
    /// consumer stopped); messages still held then are dropped, and their rows' fallback takes
    /// them.
    pub async fn run(mut self, groups: Weak<Coalescer>, chunk: usize) {
        let chunk = chunk.max(1);
        let mut waiting: BTreeMap<(Instant, u64), Received> = BTreeMap::new();
        let mut seq = 0u64;
        let mut dropped = 0;
        loop {
            let next = waiting.keys().next().map(|(at, _)| *at);
            tokio::select! {
                received = self.rx.recv() => match received {
                    Some((at, message)) => {
                        waiting.insert((at, seq), message);
                        seq += 1;
                    }
                    None => break,
                },
                () = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                    let later = waiting.split_off(&(Instant::now(), u64::MAX));
                    let due: Vec<Received> = std::mem::replace(&mut waiting, later).into_values().collect();
                    self.held.fetch_sub(due.len(), Ordering::AcqRel);
                    let Some(groups) = groups.upgrade() else {
                        dropped = due.len();
                        break;
                    };
                    for call in due.chunks(chunk) {
                        groups.submit(call.to_vec());
                    }
                }
            }
        }
        // Still waiting, still in the channel, or due when the consumer was gone.
        let left = self.held.swap(0, Ordering::AcqRel) + dropped;
        if left > 0 {
            tracing::info!(
                held = left,
                "held timeout messages dropped as the consumer stops; their rows stay SENT and the \
                 outbox timer takes them back rocketmq.fallback_after past their due time"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: &str) -> Received {
        Received {
            message_id: id.into(),
            topic: "T".into(),
            keys: Some(id.into()),
            body: id.as_bytes().to_vec(),
            properties: Default::default(),
            reconsume_times: 0,
        }
    }

    #[tokio::test]
    async fn a_full_hold_refuses_and_a_stopped_one_too() {
        let (hold, held) = channel(2);
        let wait = Duration::from_millis(10);
        assert!(hold.try_hold(&message("a"), wait));
        assert!(hold.try_hold(&message("b"), wait));
        assert!(!hold.try_hold(&message("c"), wait), "beyond max_held");
        assert_eq!(hold.len(), 2);
        // The consumer is gone: the due messages are dropped (their rows fall back to the outbox
        // timer), the receiving half ends, and nothing more is taken.
        held.run(Weak::new(), 8).await;
        assert!(!hold.try_hold(&message("d"), wait));
        assert!(hold.is_empty());
    }
}
