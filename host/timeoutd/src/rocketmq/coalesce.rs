//! Group commit for the broker path: the messages of concurrent listener calls are merged into
//! one group, so a burst costs one clock read, one row claim and one close transaction per
//! group instead of per message — as the outbox timer's claimed batches do.
//!
//! The client hands each listener thread a batch of at most `rocketmq.consume_batch` messages,
//! and a timer burst released a few messages at a time makes those batches small. Here the
//! calls queue;
//! while `rocketmq.groups_in_flight` groups are being handled, the queue fills, and the next
//! free slot takes everything queued (up to `rocketmq.group_commit` rows; a message of the
//! relay's may wake several, [`Received::rows`]) as one group.
//! An idle daemon handles a lone message at once: a message due now never waits for company.
//! A group whose messages all come early (a timer burst the broker delivers `timer_lead`
//! ahead, to be held until due) waits up to `rocketmq.early_linger` for more calls, since the
//! hold makes the wait free for them: the burst then costs a claim and a load per full group
//! instead of one per two or three messages.
//! Each caller gets its own messages' acknowledgements back, so one message that could not be
//! committed makes only its own batch `ReconsumeLater`.

use std::sync::Arc;
use std::time::Duration;

use rocketmq_client_rust::{
    ClientResult, ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus,
    MessageListenerConcurrently,
};
use rocketmq_model::common::message::message_ext::MessageExt;
use tokio::runtime::Handle;
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::consumer::{Ack, TimeoutConsumer};
use super::received::{Received, consume_blocking};

/// One listener call waiting for its acknowledgements.
struct Call {
    messages: Vec<Received>,
    reply: oneshot::Sender<Vec<Ack>>,
}

impl Call {
    /// The rows its messages wake.
    fn rows(&self) -> usize {
        self.messages.iter().map(Received::rows).sum()
    }
}

/// Merges listener calls into groups; cheap to share (the listener threads hold one).
pub struct Coalescer {
    calls: mpsc::UnboundedSender<Call>,
}

impl Coalescer {
    /// Starts the merging task on `app`: groups of at most `group` rows (a call is never
    /// split, so one call larger than that is its own group), at most `in_flight` at once; a
    /// group of early messages waits up to `linger` for more calls. The task ends when the
    /// coalescer is dropped and the queued calls are answered.
    pub fn start(
        app: &Handle,
        consumer: Arc<TimeoutConsumer>,
        group: usize,
        in_flight: usize,
        linger: Duration,
    ) -> Coalescer {
        let (calls, queue) = mpsc::unbounded_channel();
        let shape = Shape {
            group: group.max(1),
            in_flight: in_flight.max(1),
            linger,
        };
        app.spawn(merge(consumer, queue, shape));
        Coalescer { calls }
    }

    /// Handles `messages` within a group and returns their [`Ack`]: [`Ack::Later`] when any of
    /// them could not be committed (or the group's task failed).
    pub async fn handle(&self, messages: Vec<Received>) -> Ack {
        let (reply, answer) = oneshot::channel();
        if self.calls.send(Call { messages, reply }).is_err() {
            return Ack::Later;
        }
        match answer.await {
            Ok(acks) if !acks.contains(&Ack::Later) => Ack::Done,
            _ => Ack::Later,
        }
    }
}

/// How calls are merged.
struct Shape {
    /// Most rows in one group.
    group: usize,
    /// Groups handled at once.
    in_flight: usize,
    /// Longest wait of a group of early messages for more calls.
    linger: Duration,
}

/// How far past now every message of a lingering group must be due besides the linger: room
/// for the group's claim and load before the first of them falls due.
const LINGER_MARGIN: Duration = Duration::from_millis(100);

async fn merge(
    consumer: Arc<TimeoutConsumer>,
    mut queue: mpsc::UnboundedReceiver<Call>,
    shape: Shape,
) {
    let group = shape.group;
    let slots = Arc::new(Semaphore::new(shape.in_flight));
    let margin = shape.linger + LINGER_MARGIN;
    let early = |call: &Call| consumer.all_early(call.messages.iter(), margin);
    while let Some(first) = queue.recv().await {
        // Waiting for a slot is what lets the queue fill under a burst.
        let slot = slots.clone().acquire_owned().await.expect("never closed");
        let mut size = first.rows();
        let mut calls = vec![first];
        while size < group {
            match queue.try_recv() {
                Ok(call) => {
                    size += call.rows();
                    calls.push(call);
                }
                Err(_) => break,
            }
        }
        if !shape.linger.is_zero() && size < group && calls.iter().all(early) {
            let until = tokio::time::Instant::now() + shape.linger;
            while size < group {
                let Ok(Some(call)) = tokio::time::timeout_at(until, queue.recv()).await else {
                    break;
                };
                let still_early = early(&call);
                size += call.rows();
                calls.push(call);
                if !still_early {
                    break;
                }
            }
        }
        let consumer = consumer.clone();
        tokio::spawn(async move {
            let lengths: Vec<usize> = calls.iter().map(|c| c.messages.len()).collect();
            let all: Vec<Received> = calls
                .iter_mut()
                .flat_map(|c| std::mem::take(&mut c.messages))
                .collect();
            let started = std::time::Instant::now();
            let mut acks = consumer.handle_each(&all).await.into_iter();
            tracing::debug!(
                messages = all.len(),
                calls = lengths.len(),
                elapsed_ms = started.elapsed().as_millis() as u64,
                "broker message group handled"
            );
            for (call, len) in calls.into_iter().zip(lengths) {
                // A caller gone (its listener thread stopped) needs no answer.
                let _ = call.reply.send(acks.by_ref().take(len).collect());
            }
            drop(slot);
        });
    }
}

/// The client's listener: hands each call's messages to the [`Coalescer`] (on the daemon's
/// runtime), blocking the client's listener thread until their outcomes are committed.
pub struct Listener {
    /// The daemon's runtime.
    pub app: Handle,
    /// What merges the calls into groups and handles them.
    pub groups: Arc<Coalescer>,
}

impl MessageListenerConcurrently for Listener {
    fn consume_message(
        &self,
        messages: &[&MessageExt],
        _context: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        let groups = self.groups.clone();
        consume_blocking(&self.app, messages, |received| async move {
            groups.handle(received).await == Ack::Done
        })
    }
}
