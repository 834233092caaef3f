//! `[rocketmq]`: the RocketMQ transport (consumer, outbox relay, transactional arming,
//! notification topic). Absent means no broker: the outbox timer and the sweep do everything.

use std::time::Duration;

use serde::Deserialize;

use super::duration;
use super::validate::ConfigProblems;

/// How the relay and the consumer schedule a delay through the broker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DelayMode {
    /// Only the 18 fixed delay levels (`1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h
    /// 2h`), chained hop by hop; works on every broker.
    Levels,
    /// One timer message (`__STARTDELIVERTIME`, RocketMQ 5 timer wheel) per `timer_max`.
    Timer,
    /// Timer messages, falling back to levels for 10 minutes whenever the broker refuses one
    /// ([`crate::rocketmq::client::TIMER_REPROBE_MS`]), then trying timers again.
    #[default]
    Auto,
}

/// Where a consumer group that has never committed an offset starts on a queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConsumeFrom {
    /// The end of the queue (RocketMQ's `CONSUME_FROM_LAST_OFFSET`).
    #[default]
    Last,
    /// The beginning (`CONSUME_FROM_FIRST_OFFSET`): every retained message is seen; those
    /// already handled are no-ops.
    First,
}

/// `[rocketmq]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RocketMqConfig {
    /// Name server address(es), `HOST:PORT[;HOST:PORT…]`.
    pub namesrv: String,
    /// Topic of timeout messages (consumed, and published by the relay).
    #[serde(default = "defaults::topic")]
    pub topic: String,
    /// Consumer group of the timeout topic (clustering mode: daemons share its queues).
    #[serde(default = "defaults::consumer_group")]
    pub consumer_group: String,
    /// Producer group of relayed and re-sent timeout messages and notices.
    #[serde(default = "defaults::producer_group")]
    pub producer_group: String,
    /// Producer group of transactional arming; the broker's check-backs go to it.
    #[serde(default = "defaults::transaction_group")]
    pub transaction_group: String,
    /// Consume the timeout topic (off: this daemon only relays and arms).
    #[serde(default = "defaults::yes")]
    pub consume: bool,
    /// Publish PENDING outbox rows as delay/timer messages (the outbox relay).
    #[serde(default = "defaults::yes")]
    pub relay: bool,
    /// `levels`, `timer` or `auto`.
    #[serde(default)]
    pub delay_mode: DelayMode,
    /// Longest delay of one timer message (the broker's `timerMaxDelaySec`, 3 days by default);
    /// longer delays are chained.
    #[serde(default = "defaults::timer_max", with = "duration")]
    pub timer_max: Duration,
    /// Rows due sooner than this are left to the local outbox timer (it is more precise than a
    /// 1 s delay level, and the broker rejects a delivery time in the past).
    #[serde(default = "defaults::relay_lead", with = "duration")]
    pub relay_lead: Duration,
    /// How early the broker delivers a row's last hop (timer or delay level): the message is due
    /// back `timer_lead` before the row; the consumer then claims the row, loads the order and
    /// holds both in memory until the row's due time ([`crate::sources::prefetch`]). RocketMQ's timer wheel is only as precise as its slot
    /// (`timerPrecisionMs`, 1 s by default) and releases a burst due in one slot over seconds
    /// (a release-built rocketmq-rust 1.0.0 broker: a 10,000-message slot from about 1 s to 2.3 s
    /// after it; docs/performance.md), so a burst closes on time only if its messages come
    /// early. A held message is acknowledged at once: its row stays SENT under the daemon's
    /// renewed claim; a daemon that stops before the due time gives the claim back (one that
    /// crashes lets its lease lapse), and the outbox timer takes the row back `fallback_after`
    /// past its due time. `0s`
    /// turns the lead off (the last sub-second rest is still held). At most `relay_lead` − 1 s.
    #[serde(default = "defaults::timer_lead", with = "duration")]
    pub timer_lead: Duration,
    /// Most messages held at once, each with its row claimed and its order loaded
    /// ([`crate::sources::prefetch`]); beyond it a message waits out its rest inside its
    /// listener call, as it would with no hold.
    #[serde(default = "defaults::max_held")]
    pub max_held: u32,
    /// A relayed (SENT) row still unprocessed this long after its due time is taken back by the
    /// outbox timer: the broker speeds closes up but is never needed for them.
    #[serde(default = "defaults::fallback_after", with = "duration")]
    pub fallback_after: Duration,
    /// Rows the relay publishes per round.
    #[serde(default = "defaults::relay_batch")]
    pub relay_batch: u32,
    /// Most rows one relayed message wakes: rows of one relay round (`relay_batch`, so at most
    /// that many) due within a second of each other share a message (`rocketmq/codec/rows.rs`), so a flash sale's burst is a few hundred
    /// sends and deliveries, not one per order; each row is still decided at its own due time.
    /// `1` publishes a message per row (seed 001's per-order JSON with timeoutd's properties):
    /// set it while a consumer group still has daemons built before rows messages (commit
    /// `ba433d7`), which dead-letter a rows message (its rows are then closed by the outbox
    /// timer, `fallback_after` late).
    #[serde(default = "defaults::rows_per_message")]
    pub rows_per_message: u32,
    /// Sends in flight at once (the client's queue saturates when unbounded).
    #[serde(default = "defaults::max_in_flight")]
    pub max_in_flight: u32,
    /// Timeout of one send.
    #[serde(default = "defaults::send_timeout", with = "duration")]
    pub send_timeout: Duration,
    /// Longest delay between relay attempts of a row whose sends keep failing.
    #[serde(default = "defaults::relay_retry_max", with = "duration")]
    pub relay_retry_max: Duration,
    /// Listener calls each of this daemon's consumers runs at once (the client's
    /// `consume_thread_min` and `consume_thread_max`); each call blocks a thread until its
    /// messages' group is committed. Calls that queue while `groups_in_flight` groups are busy
    /// are merged into the next group, so more calls make bigger groups under a burst: a
    /// flash sale's hot SKUs are then updated once per group instead of the small groups
    /// queueing on those rows' locks. 16 → 64 took a 10,000-message burst from about 1,800 to
    /// 2,900 closes/s, all closed by message instead of 44 % (docs/performance.md).
    #[serde(default = "defaults::consume_threads")]
    pub consume_threads: u32,
    /// Most messages the broker client hands one listener call
    /// (`consumeMessageBatchMaxSize`); a batch's triggers are decided together and their closes
    /// committed in one transaction, as the outbox timer's groups are. The batch is
    /// acknowledged once every one of its outcomes is committed, and redelivered as a whole if
    /// any could not be (its committed messages are then no-ops). A merged group of at least
    /// this many due messages is a burst (the broker released a flash sale after its due
    /// time): its messages are held as early ones are and released at once in the outbox
    /// prefetch's groups (`outbox.group_commit`, `outbox.concurrency`), acknowledged when held.
    #[serde(default = "defaults::consume_batch")]
    pub consume_batch: u32,
    /// Most rows in one group (a message wakes one row, or several: `rows_per_message`): the
    /// batches of concurrent listener calls are merged (`rocketmq/coalesce.rs`) and decided and
    /// committed together, as the outbox timer's `group_commit`. A lone message on an idle
    /// daemon is handled at once.
    #[serde(default = "defaults::group_commit")]
    pub group_commit: u32,
    /// Groups handled at once; while all are busy, further calls queue and form the next group.
    /// (Held messages falling due are released in the outbox prefetch's groups instead:
    /// `outbox.group_commit`, `outbox.concurrency`.)
    #[serde(default = "defaults::groups_in_flight")]
    pub groups_in_flight: u32,
    /// How long a group of messages that all come early waits for further listener calls
    /// before it is handled (Kafka's `linger.ms`, for the broker path's group commit). An early
    /// message is only held until its due time, so waiting costs it nothing, while the calls of
    /// a burst the broker releases a few messages at a time then share one clock read, one row
    /// claim and one order load instead of a group each. A group waits only while every message
    /// in it is due at least `early_linger` + 100 ms after the last clock read, never longer
    /// than this, and stops waiting at once when a due message or a full group
    /// (`group_commit`) arrives. `0s` turns it off.
    #[serde(default = "defaults::early_linger", with = "duration")]
    pub early_linger: Duration,
    /// Where a new consumer group starts: `last` or `first`.
    #[serde(default)]
    pub consume_from: ConsumeFrom,
    /// Deliveries of one message (`ReconsumeLater` on the broker's 10 s, 30 s, 1 m … schedule)
    /// before the broker moves it to `%DLQ%<consumer_group>`.
    #[serde(default = "defaults::max_reconsume")]
    pub max_reconsume: u32,
    /// Drain `%DLQ%<consumer_group>` into the dead-letter table.
    #[serde(default = "defaults::yes")]
    pub drain_dlq: bool,
    /// Topic a payment system sends paid notices to (seed 003: "cancel the timeout" on
    /// success; body the order id as text, or a JSON bean with `orderId`, as the timeout topic
    /// takes). Off when unset. Each notice is applied once through the paid callback's path
    /// ([`crate::paid`]); a malformed one is dead-lettered.
    #[serde(default)]
    pub paid_topic: Option<String>,
    /// Consumer group of the paid topic; default `<consumer_group>-PAID`.
    #[serde(default)]
    pub paid_group: Option<String>,
    /// Topic notices are published to by `kind = "rocketmq"` channels (one message per notice,
    /// keyed by its idempotency key).
    #[serde(default = "defaults::notification_topic")]
    pub notification_topic: String,
    /// Create the timeout and notification topics at start (4 queues) when the broker allows
    /// it; they may also be created by operators.
    #[serde(default = "defaults::yes")]
    pub create_topics: bool,
    /// How often topic routes are refreshed from the name server (the client's
    /// `pollNameServerInterval`): how soon a new topic or queue is seen.
    #[serde(default = "defaults::route_refresh", with = "duration")]
    pub route_refresh: Duration,
    /// Client instance name (distinct per daemon sharing a host; default from the process id).
    #[serde(default)]
    pub instance: Option<String>,
}

impl RocketMqConfig {
    pub(super) fn validate(&self, p: &mut ConfigProblems) {
        if self.namesrv.split(';').any(|a| !a.contains(':')) {
            p.push(
                "rocketmq.namesrv",
                format!("`{}` is not HOST:PORT[;HOST:PORT…]", self.namesrv),
            );
        }
        for (key, value) in [
            ("rocketmq.topic", &self.topic),
            ("rocketmq.consumer_group", &self.consumer_group),
            ("rocketmq.producer_group", &self.producer_group),
            ("rocketmq.transaction_group", &self.transaction_group),
            ("rocketmq.notification_topic", &self.notification_topic),
        ] {
            // RocketMQ's own rule (TopicValidator / the group check): [%|a-zA-Z0-9_-], ≤ 127.
            let valid = !value.is_empty()
                && value.len() <= 127
                && value
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '%' | '|'));
            if !valid {
                p.push(
                    key,
                    format!("`{value}` is not a RocketMQ name ([A-Za-z0-9_-%|], 1–127 chars)"),
                );
            }
        }
        for (key, value) in [
            ("rocketmq.relay_batch", self.relay_batch),
            ("rocketmq.rows_per_message", self.rows_per_message),
            ("rocketmq.max_in_flight", self.max_in_flight),
            ("rocketmq.consume_threads", self.consume_threads),
            ("rocketmq.consume_batch", self.consume_batch),
            ("rocketmq.group_commit", self.group_commit),
            ("rocketmq.groups_in_flight", self.groups_in_flight),
            ("rocketmq.max_reconsume", self.max_reconsume),
            ("rocketmq.max_held", self.max_held),
        ] {
            if value == 0 {
                p.push(key, "must be at least 1");
            }
        }
        if self.rows_per_message > MAX_ROWS_PER_MESSAGE {
            p.push(
                "rocketmq.rows_per_message",
                format!(
                    "must be at most {MAX_ROWS_PER_MESSAGE}: a message's body lists its rows (up to \
                     about 110 bytes each), and RocketMQ refuses a body over 4 MiB \
                     (`maxMessageSize`)"
                ),
            );
        }
        if self.relay_lead < Duration::from_secs(1) {
            p.push(
                "rocketmq.relay_lead",
                "must be at least 1s (the shortest delay level)",
            );
        }
        if self.timer_lead + Duration::from_secs(1) > self.relay_lead {
            p.push(
                "rocketmq.timer_lead",
                format!(
                    "must be at least 1s shorter than rocketmq.relay_lead ({:?}): a relayed row's \
                     message travels at least one second (the shortest delay level) and is due \
                     back `timer_lead` before the row",
                    self.relay_lead
                ),
            );
        }
        if self.early_linger > Duration::from_secs(1) {
            p.push(
                "rocketmq.early_linger",
                "must be at most 1s (listener calls block their threads while a group waits)",
            );
        }
        if self.timer_max < Duration::from_secs(1) {
            p.push("rocketmq.timer_max", "must be at least 1s");
        }
        // The client's own bounds (ClientConfigValidator): 10 s to 10 min.
        if !(Duration::from_secs(10)..=Duration::from_secs(600)).contains(&self.route_refresh) {
            p.push("rocketmq.route_refresh", "must be between 10s and 10m");
        }
        if self.send_timeout.is_zero() {
            p.push("rocketmq.send_timeout", "must be longer than 0s");
        }
    }
}

/// Most rows one relayed message may wake (`rocketmq.rows_per_message`): 4,096 rows of at most
/// about 110 bytes each keep its body near 450 KiB, well under RocketMQ's 4 MiB
/// `maxMessageSize`.
pub const MAX_ROWS_PER_MESSAGE: u32 = 4096;

mod defaults {
    use std::time::Duration;

    pub fn yes() -> bool {
        true
    }
    pub fn topic() -> String {
        "ORDER_TIMEOUT_TOPIC".into()
    }
    pub fn consumer_group() -> String {
        "ORDER_TIMEOUT_CONSUMER_GROUP".into()
    }
    pub fn producer_group() -> String {
        "ORDER_TIMEOUT_PRODUCER_GROUP".into()
    }
    pub fn transaction_group() -> String {
        "ORDER_TIMEOUT_TX_GROUP".into()
    }
    pub fn notification_topic() -> String {
        "ORDER_NOTICE_TOPIC".into()
    }
    pub fn timer_max() -> Duration {
        Duration::from_secs(3 * 24 * 3600)
    }
    pub fn relay_lead() -> Duration {
        Duration::from_secs(3)
    }
    pub fn timer_lead() -> Duration {
        Duration::from_secs(2)
    }
    pub fn max_held() -> u32 {
        100_000
    }
    pub fn fallback_after() -> Duration {
        Duration::from_secs(5)
    }
    pub fn relay_batch() -> u32 {
        256
    }
    pub fn rows_per_message() -> u32 {
        64
    }
    pub fn max_in_flight() -> u32 {
        64
    }
    pub fn send_timeout() -> Duration {
        Duration::from_secs(3)
    }
    pub fn relay_retry_max() -> Duration {
        Duration::from_secs(60)
    }
    pub fn consume_batch() -> u32 {
        32
    }
    pub fn group_commit() -> u32 {
        256
    }
    pub fn groups_in_flight() -> u32 {
        4
    }
    pub fn early_linger() -> Duration {
        Duration::from_millis(10)
    }
    pub fn consume_threads() -> u32 {
        64
    }
    pub fn route_refresh() -> Duration {
        Duration::from_secs(30)
    }
    pub fn max_reconsume() -> u32 {
        16
    }
}
