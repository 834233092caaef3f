//! The consumer of the timeout topic (clustering mode: daemons in one consumer group share its
//! queues).
//!
//! A message is a fast wake-up for one outbox row (or, from timeoutd's relay, several rows due
//! within a second: [`super::codec::rows`]), never the only record of a timeout:
//! 1. decode it ([`super::codec`]); a malformed one is dead-lettered at once with its raw body
//!    (it can never succeed) and acknowledged — it never blocks the queue (F14). A message that
//!    wakes several rows hops as one (step 2), then each of its rows goes on as a message of its
//!    own would (held, or handled, its outcome counted); the message is acknowledged once each
//!    of its rows is held or committed, and redelivered whole when one could not be;
//! 2. a hop of a chain not yet due is re-sent towards its due time ([`super::planner`]); a
//!    message due within `rocketmq.timer_lead` plus a second has its row claimed and its order
//!    loaded at once, is acknowledged, and is decided when the row falls due
//!    ([`crate::sources::prefetch`], at most `rocketmq.max_held` at once); beyond that it is
//!    waited out here. A burst's due messages (a merged group of at least
//!    `rocketmq.consume_batch`, as when the broker releases a flash sale after its due time)
//!    are held the same way and released at once, in the outbox prefetch's full groups,
//!    instead of each group claiming, loading, deciding and closing in turn;
//! 3. it takes the row it stands for (its `TIMEOUTD_ROW`, or the `(order, phase)` row, adopted
//!    when an order service sent the message without one) under a lease, and hands the trigger
//!    to the dispatcher. A row already PROCESSED makes the message a no-op (F9, F10);
//! 4. it acknowledges only once the outcome is committed; when even that could not be written
//!    (the database is down) it answers `ReconsumeLater`, and the broker redelivers on its
//!    backoff schedule, then to `%DLQ%<group>` ([`super::dlq`] drains that).

use std::sync::Arc;
use std::time::Duration;

use timeoutd_runtime::model::TriggerKind;
use tracing::Instrument;

use super::client::{Scheduled, Transport};
use super::codec::{self, TimeoutMessage, Wakeup};
pub use super::received::Received;
use crate::db::journal::{self, DeadLetter};
use crate::db::relay::{self, RowClaim};
use crate::db::{Db, DbError};
use crate::dispatch::{Dispatcher, Outcome, Trigger};
use crate::events::{Event, emit};
use crate::sources::prefetch::{self, Prefetch};

/// Dead-letter `source` of malformed broker messages.
pub const SOURCE_ROCKETMQ: &str = crate::db::journal::SOURCE_ROCKETMQ;
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
    /// Its row is held but cannot be a trigger (a bad phase): dead-lettered, like the outbox
    /// timer's.
    Reject(Trigger, String),
}

/// What the hop step made of a decoded message.
enum Hop {
    /// Settled without its row (re-sent towards its due time, or the re-send failed).
    Settled(Ack, &'static str),
    /// Due: take its row now.
    Take(TimeoutMessage),
    /// Due in `wait`: take its row ahead and hold it, or wait it out.
    Early(TimeoutMessage, Duration),
}

/// The messages at `positions`, not handled: the database failed (`error`); the broker
/// redelivers them.
fn later(positions: impl Iterator<Item = usize>, error: &DbError) -> Vec<(usize, Taken)> {
    tracing::warn!(%error, "messages not handled; the broker will redeliver them");
    positions
        .map(|i| (i, Taken::Settled(Ack::Later, "later")))
        .collect()
}

/// A message is acknowledged once its outcome is committed: every outcome but
/// [`Outcome::Unrecorded`] (redeliver it).
fn ack_of(outcome: &Outcome) -> Ack {
    match outcome {
        Outcome::Unrecorded { .. } => Ack::Later,
        _ => Ack::Done,
    }
}

/// Records the acknowledgement of (one row of) message `i` and counts its
/// `timeoutd_broker_messages_total` outcome. A message that wakes several rows is
/// [`Ack::Later`] once any of its rows is.
fn settle(acks: &mut [Ack], i: usize, ack: Ack, outcome: &'static str) {
    emit(Event::Consumed { outcome });
    if ack == Ack::Later {
        acks[i] = Ack::Later;
    }
}

/// A row whose message has come and needs no further hop: [`Hop::Early`] until its own due time
/// (`message.due_ms`), taken at once when that has passed or is unknown.
fn due_hop(message: TimeoutMessage, now_ms: i64) -> Hop {
    match message.due_ms {
        Some(due_ms) if due_ms > now_ms => {
            Hop::Early(message, Duration::from_millis((due_ms - now_ms) as u64))
        }
        _ => Hop::Take(message),
    }
}

/// Handles timeout messages. Shared by the listener threads.
pub struct TimeoutConsumer {
    dispatcher: Arc<Dispatcher>,
    transport: Arc<Transport>,
    lease_ms: i64,
    ahead: Option<Prefetch>,
    /// Due messages in one merged group from which they are held too (a burst).
    burst: usize,
    /// Most rows one statement claims or loads, and one group decides and commits
    /// (`rocketmq.group_commit`): a merged group of rows messages can name thousands of rows.
    chunk: usize,
    /// The last database clock read (host instant, epoch ms), for [`TimeoutConsumer::all_early`].
    last_read: std::sync::Mutex<Option<(tokio::time::Instant, i64)>>,
}

impl TimeoutConsumer {
    /// A consumer dispatching through `dispatcher`, re-sending hops through `transport`, holding
    /// a row for `lease` while it handles it.
    pub fn new(dispatcher: Arc<Dispatcher>, transport: Arc<Transport>, lease: Duration) -> Self {
        let chunk = transport.config().group_commit.max(1) as usize;
        TimeoutConsumer {
            chunk,
            dispatcher,
            transport,
            lease_ms: lease.as_millis() as i64,
            ahead: None,
            burst: usize::MAX,

            last_read: std::sync::Mutex::new(None),
        }
    }

    /// Claims the rows of messages that come before their due time at once, loads their orders
    /// and hands them to `ahead` to be decided when due, instead of waiting them out inside
    /// their listener call; so too the due messages of a group with at least `burst` of them
    /// (released at once, in `ahead`'s groups).
    pub fn with_hold(mut self, ahead: Prefetch, burst: usize) -> Self {
        self.ahead = Some(ahead);
        self.burst = burst.max(1);
        self
    }

    fn db(&self) -> &Db {
        self.dispatcher.db()
    }

    /// Whether every one of `messages` carries a due time ([`codec::PROP_DUE_MS`]) at least
    /// `margin` after now, by the last database clock read carried forward on the host's
    /// monotonic clock. `false` before the first read, on a clock that does not advance by
    /// itself (a test's manual clock), and for a message without a due time or one that does
    /// not parse (the consumer decodes it properly).
    pub fn all_early<'a>(
        &self,
        mut messages: impl Iterator<Item = &'a Received>,
        margin: Duration,
    ) -> bool {
        if !self.dispatcher.clock().advances_by_itself() {
            return false;
        }
        let Some((read_at, now_ms)) = *self.last_read.lock().expect("not poisoned") else {
            return false;
        };
        let horizon = now_ms + (read_at.elapsed() + margin).as_millis() as i64;
        messages.all(|m| {
            m.properties
                .get(codec::PROP_DUE_MS)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|due| due >= horizon)
        })
    }

    /// Reads the database clock and keeps the reading for [`TimeoutConsumer::all_early`].
    async fn read_clock(&self) -> Result<(tokio::time::Instant, i64), DbError> {
        let now_ms = self.dispatcher.clock().now_ms(self.db()).await?;
        let read = (tokio::time::Instant::now(), now_ms);
        *self.last_read.lock().expect("not poisoned") = Some(read);
        Ok(read)
    }

    /// Handles one message to an [`Ack`].
    pub async fn handle(&self, received: &Received) -> Ack {
        self.handle_batch(std::slice::from_ref(received)).await
    }

    /// Handles a batch of messages to one [`Ack`]: [`Ack::Later`] when any message's outcome
    /// could not be committed (the batch is redelivered; the messages that were committed are
    /// then no-ops).
    pub async fn handle_batch(&self, batch: &[Received]) -> Ack {
        if self.handle_each(batch).await.contains(&Ack::Later) {
            Ack::Later
        } else {
            Ack::Done
        }
    }

    /// Handles a batch of messages to one [`Ack`] per message, in order. The batch costs one
    /// clock read, one row claim for all its rows ([`relay::claim_rows`]) and one group
    /// ([`Dispatcher::handle_group`]: decided together, closes committed in one transaction);
    /// decoding, hops and the wait for the last sub-second run side by side.
    pub async fn handle_each(&self, batch: &[Received]) -> Vec<Ack> {
        // One span per message, continuing the producer's trace (a `traceparent` property),
        // open while the batch is handled and closed with the message's acknowledgement.
        let spans: Vec<tracing::Span> = batch
            .iter()
            .map(|r| {
                let span = tracing::info_span!(
                    "trigger",
                    kind = "delay-message",
                    order = r.keys.as_deref().unwrap_or_default(),
                    message = %r.message_id,
                    ack = tracing::field::Empty
                );
                crate::telemetry::continue_trace(
                    &span,
                    r.properties.get("traceparent").map(String::as_str),
                );
                span
            })
            .collect();
        let acks = self.handle_each_inner(batch).await;
        for (span, ack) in spans.iter().zip(&acks) {
            span.record("ack", tracing::field::debug(ack));
        }
        acks
    }

    async fn handle_each_inner(&self, batch: &[Received]) -> Vec<Ack> {
        let mut acks = vec![Ack::Done; batch.len()];
        let mut decoded = Vec::new();
        for (i, received) in batch.iter().enumerate() {
            let message = codec::decode_wakeup(&received.body, received.keys.as_deref(), |k| {
                received.properties.get(k).cloned()
            });
            match message {
                Ok(m) => decoded.push((i, m)),
                Err(reason) => {
                    let ack = self.poison(received, &reason).await;
                    settle(
                        &mut acks,
                        i,
                        ack,
                        if ack == Ack::Done { "poison" } else { "later" },
                    );
                }
            }
        }
        if decoded.is_empty() {
            return acks;
        }
        let taken = self.take_all(batch, decoded).await;
        let mut triggers = Vec::new();
        let mut owners = Vec::new();
        for (i, t) in taken {
            match t {
                Taken::Settled(ack, outcome) => settle(&mut acks, i, ack, outcome),
                Taken::Reject(trigger, reason) => {
                    let outcome = self.dispatcher.reject(&trigger, &reason).await;
                    tracing::warn!(?outcome, "message's outbox row dead-lettered");
                    let ack = ack_of(&outcome);
                    settle(
                        &mut acks,
                        i,
                        ack,
                        if ack == Ack::Done { "poison" } else { "later" },
                    );
                }
                Taken::Trigger(trigger) => {
                    triggers.push(trigger);
                    owners.push(i);
                }
            }
        }
        // The group's rows share one claim token, but a re-adopted row has its own: every token
        // of the group is renewed while it is handled.
        let mut tokens: Vec<String> = triggers.iter().filter_map(|t| t.claim.clone()).collect();
        tokens.sort();
        tokens.dedup();
        let lease = Duration::from_millis(self.lease_ms.max(0) as u64);
        // At most `chunk` triggers a group: one transaction each, in turn.
        let all_groups = async {
            let mut outcomes = Vec::with_capacity(triggers.len());
            for group in triggers.chunks(self.chunk) {
                outcomes.extend(self.dispatcher.handle_group(group).await);
            }
            outcomes
        };
        let outcomes = crate::lease::renewing(all_groups, lease, || async {
            for token in &tokens {
                crate::sources::prefetch::renew_rows(&self.dispatcher, Some(token), lease).await;
            }
        })
        .await;
        for (i, outcome) in owners.into_iter().zip(outcomes) {
            let ack = ack_of(&outcome);
            settle(
                &mut acks,
                i,
                ack,
                if ack == Ack::Done { "handled" } else { "later" },
            );
        }
        acks
    }

    /// Re-sends the hops not yet due; takes the rows of the messages due within the lead ahead
    /// and holds them (as many as the hold has room for), waits out the rest; then takes the
    /// rows of the due ones in one claim. In a burst (`self.burst` due rows or more) the
    /// due ones are held as well, while there is room. When the database cannot be read or
    /// written, the messages not yet settled are left to be redelivered ([`Ack::Later`]).
    async fn take_all(
        &self,
        batch: &[Received],
        decoded: Vec<(usize, Wakeup)>,
    ) -> Vec<(usize, Taken)> {
        let (read_at, now_ms) = match self.read_clock().await {
            Ok(read) => read,
            Err(e) => return later(decoded.iter().map(|(i, _)| *i), &e),
        };
        // A message that wakes several rows gives a hop step for each of them, all under its
        // index.
        let scheduled: Vec<(usize, Hop)> = futures_util::future::join_all(
            decoded
                .into_iter()
                .map(|(i, m)| async move { (i, self.schedule(&batch[i], m, now_ms).await) }),
        )
        .await
        .into_iter()
        .flat_map(|(i, hops)| hops.into_iter().map(move |hop| (i, hop)))
        .collect();
        let due = scheduled
            .iter()
            .filter(|(_, s)| matches!(s, Hop::Take(_)))
            .count();
        let burst = due >= self.burst;
        let mut out = Vec::new();
        let mut ready = Vec::new();
        // Held: the early ones, and a burst's due ones.
        let mut held = Vec::new();
        let mut wait = Duration::ZERO;
        let mut room = self.ahead.as_ref().map_or(0, Prefetch::room);
        for (i, s) in scheduled {
            match s {
                Hop::Settled(ack, outcome) => out.push((i, Taken::Settled(ack, outcome))),
                Hop::Take(m) if burst && room > 0 => {
                    room -= 1;
                    held.push((i, m));
                }
                Hop::Take(m) => ready.push((i, m)),
                Hop::Early(m, _) if room > 0 => {
                    room -= 1;
                    held.push((i, m));
                }
                Hop::Early(m, rest) => {
                    wait = wait.max(rest);
                    ready.push((i, m));
                }
            }
        }
        if let (Some(ahead), false) = (&self.ahead, held.is_empty()) {
            out.extend(self.hold_ahead(ahead, &held, (read_at, now_ms)).await);
        }
        if ready.is_empty() {
            return out;
        }
        // The hold is full: the rest until the latest due time (under `timer_lead` plus two
        // seconds for a rows message's last row) is waited out here, and the claim reads the
        // clock again.
        let claim_at = if wait.is_zero() {
            Some(now_ms)
        } else {
            tokio::time::sleep(wait).await;
            None
        };
        match self.claim(&ready, claim_at).await {
            Ok(claims) => out.extend(ready.iter().map(|(i, _)| *i).zip(claims)),
            Err(e) => out.extend(later(ready.iter().map(|(i, _)| *i), &e)),
        }
        out
    }

    /// Takes the rows of messages that came before their due time (or of a burst's due ones)
    /// in one claim, loads their orders and holds them ([`Prefetch::load_and_hold`]) under a
    /// renewed lease until they are decided; each held message is acknowledged now (`held`). A
    /// message whose row is taken already, or done, is settled as any other.
    async fn hold_ahead(
        &self,
        ahead: &Prefetch,
        held: &[(usize, TimeoutMessage)],
        clock_read: (tokio::time::Instant, i64),
    ) -> Vec<(usize, Taken)> {
        let claims = match self.claim(held, Some(clock_read.1)).await {
            Ok(claims) => claims,
            Err(e) => return later(held.iter().map(|(i, _)| *i), &e),
        };
        let mut out = Vec::with_capacity(held.len());
        let mut triggers = Vec::new();
        for ((i, _), taken) in held.iter().zip(claims) {
            match taken {
                Taken::Trigger(trigger) => {
                    triggers.push(trigger);
                    out.push((*i, Taken::Settled(Ack::Done, "held")));
                }
                other => out.push((*i, other)),
            }
        }
        if triggers.is_empty() {
            return out;
        }
        let tokens = triggers.iter().filter_map(|t| t.claim.clone()).collect();
        let lease = Duration::from_millis(self.lease_ms.max(0) as u64);
        let (alive, renewer) = prefetch::keep_alive(&self.dispatcher, tokens, lease);
        tokio::spawn(renewer);
        let mut triggers = triggers.into_iter().peekable();
        while triggers.peek().is_some() {
            let group: Vec<Trigger> = triggers.by_ref().take(self.chunk).collect();
            ahead
                .load_and_hold(&self.dispatcher, group, clock_read, &alive)
                .await;
        }
        out
    }

    /// Takes the rows of `ready` in one claim per `chunk` rows (adopting a row for each message that names none,
    /// or whose row is gone), at `now_ms` or, after a wait, a fresh clock read.
    async fn claim(
        &self,
        ready: &[(usize, TimeoutMessage)],
        now_ms: Option<i64>,
    ) -> Result<Vec<Taken>, DbError> {
        let now_ms = match now_ms {
            Some(now) => now,
            None => self.read_clock().await?.1,
        };
        let mut ids = Vec::with_capacity(ready.len());
        for (_, m) in ready {
            ids.push(match m.row_id {
                Some(id) => id,
                None => self.adopt(m, now_ms).await?,
            });
        }
        let mut claims = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(self.chunk) {
            claims.extend(relay::claim_rows(self.db(), chunk, now_ms, self.lease_ms).await?);
        }
        for (k, (_, m)) in ready.iter().enumerate() {
            if claims[k] == RowClaim::Missing && m.row_id.is_some() {
                // The row named by the message is gone (an operator deleted it): adopt a new one.
                let id = self.adopt(m, now_ms).await?;
                claims[k] = relay::claim_rows(self.db(), &[id], now_ms, self.lease_ms)
                    .await?
                    .pop()
                    .unwrap_or(RowClaim::Missing);
            }
        }
        Ok(claims
            .into_iter()
            .map(|claim| match claim {
                RowClaim::Claimed(row) => match Trigger::of_row(&row, TriggerKind::DelayMessage) {
                    Ok(trigger) => Taken::Trigger(trigger),
                    Err(bad) => Taken::Reject(bad.trigger, bad.reason),
                },
                RowClaim::Processed => Taken::Settled(Ack::Done, "duplicate"),
                RowClaim::Busy => Taken::Settled(Ack::Done, "busy"),
                RowClaim::Missing => Taken::Settled(Ack::Later, "later"),
            })
            .collect())
    }

    /// A hop not yet due is re-sent towards its due time (a message that wakes several rows as
    /// one); otherwise each row it wakes due within the lead plus a second is [`Hop::Early`]
    /// (held, or waited out) and each one due now is taken.
    async fn schedule(&self, received: &Received, message: Wakeup, now_ms: i64) -> Vec<Hop> {
        let Some(due_ms) = message.due_ms() else {
            return message.into_messages().into_iter().map(Hop::Take).collect();
        };
        let first = &message.messages()[0];
        let span = tracing::info_span!("message", order = %first.order_id, phase = first.phase, rows = message.messages().len(), id = %received.message_id);
        match self
            .transport
            .schedule(&message, now_ms)
            .instrument(span)
            .await
        {
            Ok(Scheduled::Sent { .. }) => vec![Hop::Settled(Ack::Done, "hop")],
            Ok(Scheduled::Now { .. }) => message
                .into_messages()
                .into_iter()
                .map(|m| due_hop(m, now_ms))
                .collect(),
            Err(e) => {
                // The rows are SENT; the outbox timer takes them back at due + fallback_after.
                tracing::warn!(error = %e, due_ms, order = %first.order_id, "re-sending a hop failed");
                vec![Hop::Settled(Ack::Later, "later")]
            }
        }
    }

    async fn adopt(&self, message: &TimeoutMessage, now_ms: i64) -> Result<i64, DbError> {
        relay::adopt(
            self.db(),
            &message.order_id,
            message.phase,
            message.due_ms.unwrap_or(now_ms),
        )
        .await
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
            .await?;
            conn.commit().await?;
            Ok::<_, DbError>(())
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
