//! The RocketMQ transport: timeoutd as a first-class RocketMQ citizen.
//!
//! - [`client`]: the client runtime, the producer and bounded sends;
//! - [`planner`]: delays with millisecond precision over 18 fixed levels or timer messages;
//! - [`codec`]: the message formats (the seeds' text and JSON bodies, timeoutd's properties);
//! - [`consumer`]: the timeout topic's consumer (ack after commit, poison to the dead-letter
//!   table), its listener calls merged into groups by [`coalesce`], messages that come early
//!   claimed and loaded ahead and decided at their due time ([`crate::sources::prefetch`]);
//! - [`relay`]: the outbox relay (PENDING rows → delay/timer messages → SENT);
//! - [`arming`]: transactional arming with check-back;
//! - [`dlq`]: the broker's `%DLQ%` topic drained into the dead-letter table.
//!
//! The broker makes closes prompt; it is never needed for them. Every message stands for an
//! outbox row, and the outbox timer takes back what the broker does not deliver in time.

pub mod arming;
pub mod client;
pub mod coalesce;
pub mod codec;
pub mod consumer;
pub mod dlq;
pub mod inspect;
pub mod paid;
pub mod planner;
pub mod received;
pub mod relay;

use std::sync::Arc;

use tokio::task::JoinSet;

pub use client::{Scheduled, Transport, TransportError};

use crate::context::Context;

/// The transport's running parts, as the daemon starts them.
pub struct Broker {
    /// The connection.
    pub transport: Arc<Transport>,
    /// Transactional arming (it also answers check-backs).
    pub arming: Arc<arming::Arming>,
}

impl Broker {
    /// Stops arming's transaction producer, then the consumers, the producer and the client
    /// runtime; each stops its own background work, so nothing waits for the runtime's deadline.
    pub async fn shutdown(self) {
        self.arming.shutdown().await;
        self.transport.shutdown().await;
    }

    /// Starts the transport; the consumer, the DLQ drain and arming as configured; and spawns
    /// the relay and the hold's releaser into `tasks`. Held messages are released as the outbox
    /// timer's prefetched rows are: in groups of `outbox.group_commit`, `outbox.concurrency` at
    /// once (`outbox`).
    ///
    /// # Errors
    /// [`TransportError::Start`] when a part cannot start.
    pub async fn start(
        transport: Arc<Transport>,
        ctx: &Context,
        resolutions: Arc<std::collections::HashMap<String, crate::config::PaidAfterClose>>,
        outbox: &crate::config::OutboxConfig,
        tasks: &mut JoinSet<()>,
    ) -> Result<Broker, TransportError> {
        let Context {
            db,
            clock,
            policies,
            dispatcher,
            shutdown,
            ..
        } = ctx.clone();
        let config = transport.config().clone();
        let app = tokio::runtime::Handle::current();
        let arming = arming::Arming::start(
            transport.clone(),
            arming::ArmListener::new(app.clone(), db.clone(), clock.clone(), policies)
                .with_payments(dispatcher.payment_query()),
        )
        .await?;
        if let Some(topic) = &config.paid_topic {
            let group = config
                .paid_group
                .clone()
                .unwrap_or_else(|| paid::default_group(&config.consumer_group));
            let listener = paid::PaidListener {
                app: app.clone(),
                db: db.clone(),
                clock: clock.clone(),
                resolutions,
                dispatcher: dispatcher.clone(),
            };
            transport.start_consumer(&group, topic, listener).await?;
            tracing::info!(topic = %topic, group = %group, "paid notices consumed");
        }
        if config.consume {
            // Early messages' rows, claimed and loaded, wait here for their due time. When they
            // fall due they are full groups, like the outbox timer's prefetched rows, and go as
            // those do (the listener calls' small groups keep `rocketmq.groups_in_flight`: more
            // of them at once queue on the hot SKUs' stock rows). A merged group of at least
            // `consume_batch` due messages (a burst the broker released late) is held and
            // released at once the same way.
            let (ahead, released) = crate::sources::prefetch::channel(config.max_held as usize);
            tasks.spawn(released.run(
                dispatcher.clone(),
                Arc::new(tokio::sync::Semaphore::new(
                    outbox.concurrency.max(1) as usize
                )),
                outbox.group_commit as usize,
                shutdown.clone(),
            ));
            let consumer = Arc::new(
                consumer::TimeoutConsumer::new(dispatcher, transport.clone(), outbox.lease)
                    .with_hold(ahead, config.consume_batch as usize),
            );
            let groups = Arc::new(coalesce::Coalescer::start(
                &app,
                consumer,
                config.group_commit as usize,
                config.groups_in_flight as usize,
                config.early_linger,
            ));
            transport
                .start_consumer(
                    &config.consumer_group,
                    &config.topic,
                    coalesce::Listener {
                        app: app.clone(),
                        groups,
                    },
                )
                .await?;
            if config.drain_dlq {
                let listener = dlq::DlqListener {
                    app: app.clone(),
                    db: db.clone(),
                    clock: clock.clone(),
                };
                let group = dlq::drain_group(&config.consumer_group);
                let topic = dlq::dlq_topic(&config.consumer_group);
                if let Err(e) = transport.start_consumer(&group, &topic, listener).await {
                    tracing::warn!(error = %e, topic, "the DLQ drain did not start");
                }
            }
        }
        if config.relay {
            tasks.spawn(relay::run(db, clock, transport.clone(), shutdown));
        }
        tracing::info!(namesrv = %config.namesrv, topic = %config.topic, group = %config.consumer_group, "rocketmq transport started");
        Ok(Broker {
            transport,
            arming: Arc::new(arming),
        })
    }
}
