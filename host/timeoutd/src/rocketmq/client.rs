//! The RocketMQ client as timeoutd uses it: one client runtime on its own thread, one producer
//! for timeout hops and notices, the push consumers, and bounded sends.
//!
//! `rocketmq-client-rust` runs on a Tokio runtime it is given through a `RuntimeOwner`; timeoutd
//! builds that owner on a dedicated thread and runs every client call there
//! ([`Transport::on_client`]), so the daemon's own runtime and the client's never block each
//! other. Its blocking lanes (where push-consumer listeners run) are widened: the defaults for
//! 2 cores queue 16 tasks, and a full queue bounces messages into the retry path under load.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rocketmq_client_rust::{
    ClientConfig, ClientRuntime, ClientRuntimeConfig, DefaultMQProducer, DefaultMQPushConsumer,
    MQPushConsumer, MessageListenerConcurrently, SendStatus,
};
use rocketmq_model::common::message::message_single::Message;
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};
use tokio::runtime::Handle;
use tokio::sync::Semaphore;

use super::codec::{self, PROP_DUE_MS, PROP_HOP, PROP_ROW, PROP_ROWS, Wakeup};
use super::planner::{Hop, Planner};
use crate::config::{ConsumeFrom, RocketMqConfig};
use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;

/// Tag of timeout messages timeoutd publishes.
pub const TAG_TIMEOUT: &str = "timeout";
/// Tag of transactional arming messages.
pub const TAG_ARM: &str = "arm";

/// A failure talking to the broker.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransportError {
    /// The client could not be built or started (bad name server address, …).
    #[error("rocketmq client: {0}")]
    Start(String),
    /// A send failed or was refused. The broker's own reason is in its log (the client only
    /// reports a generic error).
    #[error("rocketmq send to `{topic}` failed: {detail}")]
    Send {
        /// Topic.
        topic: String,
        /// What the client said.
        detail: String,
    },
    /// A message could not be built (a reserved property, …).
    #[error("rocketmq message: {0}")]
    Message(String),
}

/// `auto` mode: after the broker refuses a timer message, hops go as delay levels for this
/// long, ms (10 minutes), then timers are tried again. The client reports a refusal only as a
/// failed send, so a transient failure also switches; this bounds what such a switch costs (more
/// hops, levels' 1 s tick), and a broker without the timer wheel costs one refused send per
/// period.
pub const TIMER_REPROBE_MS: i64 = 10 * 60_000;

/// Where a hop went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheduled {
    /// Published; the broker's message id.
    Sent {
        /// Message id.
        message_id: String,
        /// The hop sent.
        hop: Hop,
    },
    /// Due within `rocketmq.timer_lead` plus a second: nothing published, handle it after
    /// `wait_ms`.
    Now {
        /// Milliseconds to wait first.
        wait_ms: u64,
    },
}

/// The broker connection shared by the relay, the consumer, arming and the notice sink.
pub struct Transport {
    config: RocketMqConfig,
    planner: Planner,
    handle: Handle,
    client_runtime: Arc<ClientRuntime>,
    producer: Arc<DefaultMQProducer>,
    consumers: tokio::sync::Mutex<Vec<DefaultMQPushConsumer>>,
    in_flight: Arc<Semaphore>,
    /// `auto` mode: hops go as delay levels until this epoch ms (0: timers), set
    /// [`TIMER_REPROBE_MS`] ahead when the broker refuses a timer message.
    levels_until_ms: AtomicI64,
    last_send_ok: AtomicBool,
    instance: String,
    owner_stop: Mutex<Option<std::sync::mpsc::Sender<()>>>,
    owner_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

static INSTANCES: AtomicU64 = AtomicU64::new(0);

/// The name of the client runtime's threads (its Tokio workers and blocking threads).
pub const CLIENT_THREADS: &str = "rocketmq-client";

impl Transport {
    /// Builds the client runtime (threads named [`CLIENT_THREADS`]) and starts the producer.
    ///
    /// # Errors
    /// [`TransportError::Start`] when the runtime or the producer cannot start.
    pub async fn start(config: &RocketMqConfig) -> Result<Arc<Transport>, TransportError> {
        Self::start_named(config, CLIENT_THREADS).await
    }

    /// As [`Transport::start`], the client runtime's threads named `threads` (Linux keeps the
    /// first 15 bytes), so a process with two clients can tell their CPU apart: the bench's
    /// watching group is not the daemon.
    ///
    /// # Errors
    /// As [`Transport::start`].
    pub async fn start_named(
        config: &RocketMqConfig,
        threads: &'static str,
    ) -> Result<Arc<Transport>, TransportError> {
        let instance = config.instance.clone().unwrap_or_else(|| {
            format!(
                "timeoutd-{}-{}",
                std::process::id(),
                INSTANCES.fetch_add(1, Ordering::Relaxed)
            )
        });
        let (name, consume_threads) = (instance.clone(), config.consume_threads as usize);
        let (handle, client_runtime, stop, thread) = tokio::task::spawn_blocking(move || {
            spawn_client_runtime(&name, threads, consume_threads)
        })
        .await
        .map_err(|e| TransportError::Start(format!("client runtime thread: {e}")))??;
        let mut producer = DefaultMQProducer::builder(client_runtime.clone())
            .producer_group(config.producer_group.as_str())
            .name_server_addr(config.namesrv.as_str())
            .client_config(client_config(config, &instance)?)
            .send_msg_timeout(config.send_timeout.as_millis().min(u32::MAX as u128) as u32)
            .retry_times_when_send_failed(1)
            .build();
        // The DLQ drain's topic too: until the broker dead-letters a first message it has no
        // route, and the client warns about it on every rebalance.
        let topics = if config.create_topics {
            let mut topics = vec![config.topic.clone(), config.notification_topic.clone()];
            if config.consume && config.drain_dlq {
                topics.push(super::dlq::dlq_topic(&config.consumer_group));
            }
            topics
        } else {
            Vec::new()
        };
        let started = handle
            .spawn(async move {
                producer.start().await?;
                // Create the topics (4 queues) so consumers find their routes at start; a broker
                // that refuses (auto-creation off, topics made by operators) is fine.
                for topic in topics {
                    if let Err(e) = producer
                        .create_topic("TBW102", &topic, 4, Default::default())
                        .await
                    {
                        tracing::debug!(topic, error = %e, "topic not created");
                    }
                }
                Ok::<_, rocketmq_client_rust::ClientError>(producer)
            })
            .await
            .map_err(|e| TransportError::Start(format!("producer start task: {e}")))?;
        let producer = match started {
            Ok(p) => p,
            Err(e) => {
                let _ = stop.send(());
                return Err(TransportError::Start(format!("producer start: {e}")));
            }
        };
        Ok(Arc::new(Transport {
            planner: Planner {
                mode: config.delay_mode,
                timer_max: config.timer_max,
                lead: config.timer_lead,
            },
            config: config.clone(),
            handle,
            client_runtime,
            producer: Arc::new(producer),
            consumers: tokio::sync::Mutex::new(Vec::new()),
            in_flight: Arc::new(Semaphore::new(config.max_in_flight as usize)),
            levels_until_ms: AtomicI64::new(0),
            last_send_ok: AtomicBool::new(true),
            instance,
            owner_stop: Mutex::new(Some(stop)),
            owner_thread: Mutex::new(Some(thread)),
        }))
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &RocketMqConfig {
        &self.config
    }

    /// The client runtime (for transactional producers).
    pub(super) fn client_runtime(&self) -> Arc<ClientRuntime> {
        self.client_runtime.clone()
    }

    /// Sends the client's heartbeat to every broker it knows now, so a producer group started
    /// since the last one is known to the brokers at once.
    ///
    /// A broker sends a transaction check-back only to a channel of the half message's producer
    /// group, and learns the group's channels from heartbeats. The Java client heartbeats at
    /// the end of `DefaultMQProducerImpl.start()`; `rocketmq-client-rust` 1.0.0 does not, so a
    /// transaction producer started on a running client was unknown until the client's next
    /// scheduled heartbeat (every `heartbeatBrokerInterval`, 30 s), and every check-back before
    /// it was dropped by the broker ("producer session is unavailable") while still counting
    /// toward `transactionCheckMax`. Returns whether a heartbeat went out (it is skipped when
    /// the client's scheduled one holds the heartbeat lock; the caller retries).
    ///
    /// # Errors
    /// [`TransportError::Start`] when the client config is refused by the client pool.
    pub(super) async fn announce(&self) -> Result<bool, TransportError> {
        let runtime = self.client_runtime.clone();
        let config = self.client_config()?;
        self.on_client(async move {
            let pool = runtime.pool();
            let client = pool
                .get_or_create(config, None)
                .map_err(|e| TransportError::Start(format!("client instance: {e}")))?;
            let (instance, lease) = client.into_parts();
            let sent = instance.send_heartbeat_to_all_broker_with_lock().await;
            pool.release(lease).await;
            Ok(sent)
        })
        .await?
    }

    /// The client config every producer and consumer of this transport uses.
    pub(super) fn client_config(&self) -> Result<ClientConfig, TransportError> {
        client_config(&self.config, &self.instance)
    }

    /// Whether the last send succeeded (readiness).
    pub fn healthy(&self) -> bool {
        self.last_send_ok.load(Ordering::Relaxed)
    }

    /// Runs `future` on the client's runtime.
    pub(super) async fn on_client<F, T>(&self, future: F) -> Result<T, TransportError>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        self.handle
            .spawn(future)
            .await
            .map_err(|e| TransportError::Start(format!("client task failed: {e}")))
    }

    /// Sends `message`, at most `rocketmq.max_in_flight` at once, and returns its message id.
    ///
    /// # Errors
    /// [`TransportError::Send`] when the client fails or the broker does not answer `SEND_OK`.
    pub async fn send(&self, message: Message) -> Result<String, TransportError> {
        self.send_all(vec![message])
            .await
            .pop()
            .expect("one result per message")
    }

    /// Sends each of `messages` (any topics), at most `rocketmq.max_in_flight` at once across
    /// the process: each one's message id or error, in order. The sends run side by side in one
    /// task on the client's runtime, so a batch crosses between the daemon's runtime and the
    /// client's once each way, not once per message (each crossing is a thread wake-up, which
    /// cost as much CPU as the send itself: `perf` of the relay's burst).
    ///
    /// # Errors
    /// Per message, as [`Transport::send`].
    pub async fn send_all(&self, messages: Vec<Message>) -> Vec<Result<String, TransportError>> {
        let count = messages.len();
        if count == 0 {
            return Vec::new();
        }
        let (producer, in_flight) = (self.producer.clone(), self.in_flight.clone());
        let timeout = self.config.send_timeout.as_millis() as u64;
        let sent = self
            .on_client(async move {
                futures_util::future::join_all(messages.into_iter().map(|message| {
                    let (producer, in_flight) = (producer.clone(), in_flight.clone());
                    async move {
                        let topic = message.topic().to_string();
                        let _permit = in_flight.acquire_owned().await.expect("never closed");
                        let answer = producer
                            .send_with_timeout(message, timeout)
                            .await
                            .map(|r| r.map(|r| (r.send_status, r.msg_id.map(|m| m.to_string()))))
                            .map_err(|e| e.to_string());
                        send_outcome(topic, answer)
                    }
                }))
                .await
            })
            .await;
        let outcomes = match sent {
            Ok(outcomes) => outcomes,
            Err(e) => {
                let detail = e.to_string();
                (0..count)
                    .map(|_| Err(TransportError::Start(detail.clone())))
                    .collect()
            }
        };
        let all_ok = outcomes.iter().all(Result::is_ok);
        self.last_send_ok.store(all_ok, Ordering::Relaxed);
        outcomes
    }

    /// Publishes the next hop of `message` towards its due time ([`Wakeup::due_ms`], now when
    /// absent) at `now_ms`: a timer message, a delay level, or nothing when it is due within a
    /// second. A message that wakes several rows hops as one. In `auto` mode a refused timer
    /// message switches this process to levels for [`TIMER_REPROBE_MS`] and the hop is re-sent
    /// as a level.
    ///
    /// # Errors
    /// [`TransportError`] when the send fails.
    pub async fn schedule(
        &self,
        message: &Wakeup,
        now_ms: i64,
    ) -> Result<Scheduled, TransportError> {
        self.schedule_all(std::slice::from_ref(message), now_ms)
            .await
            .pop()
            .expect("one result per message")
    }

    /// [`Transport::schedule`] for each of `messages`, their sends together
    /// ([`Transport::send_all`]): each one's result, in order. The relay publishes its round
    /// this way.
    ///
    /// # Errors
    /// Per message, as [`Transport::schedule`].
    pub async fn schedule_all(
        &self,
        messages: &[Wakeup],
        now_ms: i64,
    ) -> Vec<Result<Scheduled, TransportError>> {
        let mut results: Vec<Option<Result<Scheduled, TransportError>>> =
            messages.iter().map(|_| None).collect();
        // At most two passes: in `auto` mode the timer messages the broker refused are planned
        // again, as levels, and sent together once more.
        let mut pending: Vec<usize> = (0..messages.len()).collect();
        while !pending.is_empty() {
            let refused = now_ms < self.levels_until_ms.load(Ordering::Relaxed);
            let (mut places, mut hops, mut batch) = (Vec::new(), Vec::new(), Vec::new());
            for i in pending.drain(..) {
                let message = &messages[i];
                let hop =
                    self.planner
                        .next_hop(now_ms, message.due_ms().unwrap_or(now_ms), refused);
                if let Hop::Now { wait_ms } = hop {
                    results[i] = Some(Ok(Scheduled::Now { wait_ms }));
                    continue;
                }
                match self.hop_message(message, hop) {
                    Ok(built) => {
                        places.push(i);
                        hops.push(hop);
                        batch.push(built);
                    }
                    Err(e) => results[i] = Some(Err(e)),
                }
            }
            let sent = self.send_all(batch).await;
            for ((i, hop), outcome) in places.into_iter().zip(hops).zip(sent) {
                results[i] = Some(match outcome {
                    Ok(message_id) => Ok(Scheduled::Sent { message_id, hop }),
                    Err(e)
                        if matches!(hop, Hop::Timer(_))
                            && self.config.delay_mode == crate::config::DelayMode::Auto =>
                    {
                        let until_ms = now_ms + TIMER_REPROBE_MS;
                        if self.levels_until_ms.swap(until_ms, Ordering::Relaxed) <= now_ms {
                            tracing::warn!(error = %e, retry_in_s = TIMER_REPROBE_MS / 1000, "timer message refused; using delay levels, and trying timers again later");
                        }
                        pending.push(i);
                        continue;
                    }
                    Err(e) => Err(e),
                });
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every message has a result"))
            .collect()
    }

    /// Publishes one notice on `rocketmq.notification_topic`, keyed by its idempotency key (so
    /// a notice re-sent after a crash can be recognised downstream), tagged with its template.
    ///
    /// # Errors
    /// [`TransportError`] when the send fails.
    pub async fn publish_notice(
        &self,
        idempotency_key: &str,
        template: &str,
        body: String,
    ) -> Result<String, TransportError> {
        let tag: String = template
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let message = Message::builder()
            .topic(self.config.notification_topic.as_str())
            .tags(tag)
            .key(idempotency_key)
            .body(body.into_bytes())
            .build()
            .map_err(|e| TransportError::Message(e.to_string()))?;
        self.send(message).await
    }

    /// The broker message for one hop of `message` (its format: [`codec`]).
    fn hop_message(&self, message: &Wakeup, hop: Hop) -> Result<Message, TransportError> {
        let bad = |e| TransportError::Message(format!("{e}"));
        let builder = Message::builder()
            .topic(self.config.topic.as_str())
            .tags(TAG_TIMEOUT);
        let mut builder = match message {
            Wakeup::Order(order) => {
                let builder = builder
                    .key(order.order_id.as_str())
                    .body(codec::encode_body(order));
                match order.row_id {
                    Some(row) => builder
                        .raw_property(PROP_ROW, row.to_string())
                        .map_err(bad)?,
                    None => builder,
                }
            }
            Wakeup::Rows { rows, .. } => builder
                .body(codec::rows::encode(rows))
                .raw_property(PROP_ROWS, rows.len().to_string())
                .map_err(bad)?,
        }
        .raw_property(PROP_HOP, message.hop().saturating_add(1).to_string())
        .map_err(bad)?;
        if let Some(due) = message.due_ms() {
            builder = builder
                .raw_property(PROP_DUE_MS, due.to_string())
                .map_err(bad)?;
        }
        builder = match hop {
            Hop::Level(level) => builder.delay_level(i32::from(level)),
            Hop::Timer(at_ms) => builder.deliver_time_ms(at_ms.max(0) as u64),
            Hop::Now { .. } => builder,
        };
        builder.build().map_err(bad)
    }

    /// Starts a clustering push consumer of `topic` in `group` with `listener`; it is shut
    /// down with the transport.
    ///
    /// # Errors
    /// [`TransportError::Start`] when subscribing or starting fails.
    pub async fn start_consumer<L>(
        &self,
        group: &str,
        topic: &str,
        listener: L,
    ) -> Result<(), TransportError>
    where
        L: MessageListenerConcurrently + 'static,
    {
        let mut consumer = DefaultMQPushConsumer::builder(self.client_runtime.clone())
            .consumer_group(group)
            .name_server_addr(self.config.namesrv.as_str())
            .client_config(self.client_config()?)
            // rocketmq-client-rust 1.0.0 runs at most `consume_thread_min` listener calls at once
            // (its consume semaphore; `consume_thread_max` only sizes the scheduler's workers,
            // consume_message_concurrently_service.rs). With 1, a burst's calls ran one at a time:
            // nothing for the coalescer to merge, one commit per small pull result.
            .consume_thread_min(self.config.consume_threads)
            .consume_thread_max(self.config.consume_threads)
            .consume_message_batch_max_size(self.config.consume_batch.max(1))
            .max_reconsume_times(self.config.max_reconsume as i32)
            // On shutdown, messages being handled get this long to commit and be acknowledged
            // (and the consume service's own tasks stop cleanly instead of being aborted).
            .await_termination_millis_when_shutdown(CONSUMER_DRAIN.as_millis() as u64)
            .consume_from_where(match self.config.consume_from {
                ConsumeFrom::Last => ConsumeFromWhere::ConsumeFromLastOffset,
                ConsumeFrom::First => ConsumeFromWhere::ConsumeFromFirstOffset,
            })
            .build();
        let topic = topic.to_string();
        // The group's retry topic (RocketMQ's `MixAll.getRetryTopic`): the client subscribes to
        // it too, and until the broker makes it (at the group's first reconsumed message) the
        // client warns on every route refresh that it has no route. Created as the others are
        // in `start_named` (1 queue, as the broker makes it); a refusal is fine.
        let retry = self
            .config
            .create_topics
            .then(|| (format!("%RETRY%{group}"), (*self.producer).clone()));
        let started = self
            .on_client(async move {
                if let Some((retry, mut producer)) = retry
                    && let Err(e) = producer
                        .create_topic("TBW102", &retry, 1, Default::default())
                        .await
                {
                    tracing::debug!(topic = retry, error = %e, "retry topic not created");
                }
                consumer.subscribe(topic.as_str(), "*").await?;
                consumer.register_message_listener_concurrently(listener);
                consumer.start().await?;
                Ok::<_, rocketmq_client_rust::ClientError>(consumer)
            })
            .await?
            .map_err(|e| TransportError::Start(format!("consumer of `{group}`: {e}")))?;
        self.consumers.lock().await.push(started);
        Ok(())
    }

    /// Stops the consumers, the producer and the client runtime. Idempotent.
    pub async fn shutdown(&self) {
        let consumers: Vec<_> = self.consumers.lock().await.drain(..).collect();
        for mut consumer in consumers {
            let _ = self
                .on_client(async move { consumer.shutdown().await })
                .await;
        }
        // The producer stops its own tasks (route refresh, fault detection); left to the client
        // runtime's shutdown, they run until its deadline and are aborted.
        let mut producer = (*self.producer).clone();
        let _ = self
            .on_client(async move { producer.shutdown().await })
            .await;
        let client_runtime = self.client_runtime.clone();
        if let Ok(report) = self
            .on_client(async move { client_runtime.shutdown().await })
            .await
            && report.timed_out > 0
        {
            tracing::debug!(
                aborted = report.timed_out,
                "rocketmq client tasks aborted at shutdown"
            );
        }
        if let Some(stop) = self.owner_stop.lock().expect("not poisoned").take() {
            let _ = stop.send(());
        }
        let thread = self.owner_thread.lock().expect("not poisoned").take();
        if let Some(thread) = thread {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }
}

fn client_config(config: &RocketMqConfig, instance: &str) -> Result<ClientConfig, TransportError> {
    ClientConfig::builder()
        .namesrv_addr(config.namesrv.as_str())
        .instance_name(instance)
        .poll_name_server_interval(config.route_refresh.as_millis().min(u32::MAX as u128) as u32)
        .build()
        .map_err(|e| TransportError::Start(format!("client config: {e}")))
}

/// How long the client runtime (and then its Tokio runtime) may take to stop once every consumer
/// and producer has been shut down; a backstop only. Before the producers were shut down
/// explicitly, their route-refresh and fault-detector tasks ran until the client's default
/// deadline of 30 s (`ClientRuntimeConfig::shutdown_timeout`) and were aborted there, so every
/// SIGTERM took 30 s. What still runs after this deadline is aborted.
const CLIENT_SHUTDOWN: Duration = Duration::from_millis(1500);

/// How long a consumer's shutdown waits for the messages it is handling (a close transaction
/// each, milliseconds) before it stops.
const CONSUMER_DRAIN: Duration = Duration::from_secs(2);

pub(super) type Spawned = (
    Handle,
    Arc<ClientRuntime>,
    std::sync::mpsc::Sender<()>,
    std::thread::JoinHandle<()>,
);

/// Builds the client's `RuntimeOwner` on its own thread and hands back its handle; the thread
/// keeps the owner until told to stop, then shuts it down. That thread and the runtime's are
/// named `threads`; `name` is the client instance the log lines name.
pub(super) fn spawn_client_runtime(
    name: &str,
    threads: &'static str,
    consume_threads: usize,
) -> Result<Spawned, TransportError> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let name = name.to_string();
    let thread = std::thread::Builder::new()
        .name(threads.into())
        .spawn(move || {
            let built = (|| {
                // Three consumers (timeouts, paid callbacks, the DLQ drain) may each block
                // `consume_threads` listener calls at once.
                let mut config = RuntimeConfig::for_parallelism(threads, 2)
                    .with_max_blocking_threads(consume_threads.max(4) * 3 + 16)
                    .map_err(|e| format!("runtime config: {e:?}"))?;
                // Listeners and transaction callbacks run on the metadata-io lane.
                let lane = &mut config.blocking_lane_policies.metadata_io;
                lane.max_concurrency = consume_threads.max(4) * 3 + 8;
                lane.max_queue_depth = 65_536;
                lane.queue_timeout = Duration::from_secs(60);
                lane.task_timeout = Duration::from_secs(120);
                let owner = RuntimeOwner::plan(config)
                    .map_err(|e| format!("runtime plan: {e:?}"))?
                    .build()
                    .map_err(|e| format!("runtime: {e}"))?;
                let telemetry = rocketmq_observability::TelemetryRuntimeGuard::noop();
                let client_runtime = ClientRuntime::try_new(
                    owner.root_context().component("timeoutd"),
                    ClientRuntimeConfig {
                        shutdown_timeout: CLIENT_SHUTDOWN,
                        ..ClientRuntimeConfig::default()
                    },
                    telemetry.handle(),
                )
                .map_err(|e| format!("client runtime: {e}"))?;
                let handle = owner.block_on(async { Handle::current() });
                Ok::<_, String>((owner, telemetry, handle, client_runtime))
            })();
            match built {
                Ok((owner, telemetry, handle, client_runtime)) => {
                    let _ = ready_tx.send(Ok((handle, client_runtime)));
                    let _ = stop_rx.recv();
                    if let Err(e) =
                        owner.shutdown_runtime_blocking_with_timeout(CLIENT_SHUTDOWN)
                    {
                        tracing::warn!(client = %name, error = %e, "rocketmq client runtime shutdown");
                    }
                    drop(telemetry);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })
        .map_err(|e| TransportError::Start(format!("thread: {e}")))?;
    let (handle, client_runtime) = ready_rx
        .recv()
        .map_err(|_| TransportError::Start("client runtime thread died".into()))?
        .map_err(TransportError::Start)?;
    Ok((handle, client_runtime, stop_tx, thread))
}

/// What a send's answer (`(status, message id)`, or the client's error) means: the message id
/// when the broker answered `SEND_OK`.
fn send_outcome(
    topic: String,
    answer: Result<Option<(SendStatus, Option<String>)>, String>,
) -> Result<String, TransportError> {
    match answer {
        Ok(Some((SendStatus::SendOk, id))) => Ok(id.unwrap_or_default()),
        Ok(Some((status, _))) => Err(TransportError::Send {
            topic,
            detail: format!("broker answered {status:?}"),
        }),
        Ok(None) => Err(TransportError::Send {
            topic,
            detail: "no send result".into(),
        }),
        Err(detail) => Err(TransportError::Send { topic, detail }),
    }
}
