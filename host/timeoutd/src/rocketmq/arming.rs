//! Transactional arming (the seeds' half-message pattern) and the broker's check-back.
//!
//! [`Arming::arm`] sends a half message for an order (tag `arm`, no delay: a delay on a half
//! message loops between the broker's internal topics, F15), then runs the local transaction —
//! insert the order's phase-0 outbox row, due at its deadline — and commits the half message
//! when that committed, rolls it back when the order does not exist or is no longer PENDING.
//! The timeout itself is scheduled after the commit, by the outbox relay, from that row.
//!
//! When the outcome never reaches the broker, it asks the transaction producer group
//! (`rocketmq.transaction_group`, which every daemon joins) whether to commit. The check-back
//! answers from the database and never writes: no order → rollback; an order → the merchant
//! plugin's `check` export (the seed-002 pattern: a still-unpaid order answers unknown until the
//! check count or the deadline says commit; a paid one rolls back). Nothing depends on the
//! check-back for correctness (F6): the row, or the sweep, closes the order anyway.

use std::any::Any;
use std::sync::Arc;

use rocketmq_client_rust::{LocalTransactionState, TransactionListener, TransactionMQProducer};
use rocketmq_model::common::message::MessageTrait;
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_single::Message;
use timeoutd_runtime::model::{
    CheckVerdict, Context, OrderStatus, Payment, PaymentStatus, TriggerKind,
};
use tokio::runtime::Handle;

use super::client::{TAG_ARM, Transport, TransportError};
use super::codec::{self, TimeoutMessage};
use crate::clock::Clock;
use crate::db::{Db, DbError, orders, outbox};
use crate::dispatch::PaymentQuery;
use crate::events::{Event, emit};
use crate::policies::Policies;

/// Outbox `source` of rows inserted by arming.
pub const SOURCE_ARM: &str = "arm";
/// The broker's property counting check-backs of a half message.
const CHECK_TIMES: &str = "TRANSACTION_CHECK_TIMES";
/// Heartbeats [`Arming::start`] tries (100 ms apart) while the client's scheduled one holds
/// the lock.
const ANNOUNCE_ATTEMPTS: u32 = 5;

/// How an arming ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Armed {
    /// The outbox row is committed and the half message committed.
    Committed,
    /// No such PENDING order: the half message was rolled back, nothing armed.
    RolledBack,
    /// The local transaction's outcome is unknown (database error); the broker will check back.
    Unknown,
}

/// Answers the broker for timeoutd's transactions: runs the local transaction and the
/// check-back on the daemon's runtime.
pub struct ArmListener {
    app: Handle,
    db: Db,
    clock: Clock,
    policies: Arc<Policies>,
    payments: Option<Arc<dyn PaymentQuery>>,
}

impl ArmListener {
    /// A listener over the daemon's database, clock and plugins.
    pub fn new(app: Handle, db: Db, clock: Clock, policies: Arc<Policies>) -> Self {
        ArmListener {
            app,
            db,
            clock,
            policies,
            payments: None,
        }
    }

    /// Consults `payments` at each check-back (seed 002's poller): a payment the provider says
    /// is paid rolls the half message back (nothing to arm; the order's row, if committed, is
    /// aligned at its deadline); otherwise the plugin's `check` sees the answer in
    /// `context.payment`. `None` leaves the check-back to the database and the plugin alone.
    pub fn with_payments(mut self, payments: Option<Arc<dyn PaymentQuery>>) -> Self {
        self.payments = payments;
        self
    }

    /// The local transaction: the order's phase-0 row, due at its deadline, in one transaction.
    pub async fn local_transaction(&self, order_id: &str) -> Armed {
        let result: Result<Armed, DbError> = async {
            let mut tx = self.db.begin().await?;
            let Some(order) = orders::load(&mut tx, self.db.schema(), order_id).await? else {
                tx.rollback().await?;
                return Ok(Armed::RolledBack);
            };
            if order.status != timeoutd_runtime::model::OrderStatus::Pending {
                tx.rollback().await?;
                return Ok(Armed::RolledBack);
            }
            outbox::insert_row(
                &mut tx,
                self.db.backend(),
                order_id,
                0,
                order.deadline_ms,
                SOURCE_ARM,
            )
            .await?;
            tx.commit().await?;
            Ok(Armed::Committed)
        }
        .await;
        result.unwrap_or_else(|e| {
            tracing::warn!(order = order_id, error = %e, "arming's local transaction failed; the broker will check back");
            Armed::Unknown
        })
    }

    /// The check-back: reads only. `checks` is how often the broker has asked.
    pub async fn check_back(&self, order_id: &str, checks: u32) -> CheckVerdict {
        let verdict = async {
            let now_ms = self.clock.now_ms(&self.db).await?;
            let mut conn = self.db.pool().acquire().await?;
            let Some(order) = orders::load(&mut conn, self.db.schema(), order_id).await? else {
                return Ok::<_, DbError>(CheckVerdict::Rollback);
            };
            drop(conn);
            let payment = match (&self.payments, &order.payment_ref) {
                (Some(provider), Some(payment_ref)) if order.status == OrderStatus::Pending => {
                    let mut payment = provider.query(&order.merchant, payment_ref).await.unwrap_or_else(|e| {
                        tracing::warn!(order = order_id, error = %e, "check-back cannot ask the payment provider");
                        Payment::default()
                    });
                    payment.queried_at_ms = Some(now_ms);
                    if payment.status == PaymentStatus::Paid {
                        tracing::info!(order = order_id, checks, "check-back: paid at the provider; nothing to arm");
                        return Ok(CheckVerdict::Rollback);
                    }
                    Some(payment)
                }
                (_, Some(_)) => Some(Payment::default()),
                (_, None) => None,
            };
            let Some(policy) = self.policies.get(&order.merchant) else {
                // No plugin to ask: the order exists, so the timeout must be armed.
                return Ok(CheckVerdict::Commit);
            };
            let ctx = Context {
                now_ms,
                trigger: TriggerKind::CheckBack,
                phase: 0,
                attempt: checks,
                settings: policy.settings.clone(),
                state: Vec::new(),
                payment,
            };
            let plugin = policy.plugin.clone();
            let answer = tokio::task::spawn_blocking(move || plugin.check(&order, &ctx))
                .await
                .expect("plugin call thread panicked");
            Ok(answer.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "plugin check failed; answering unknown");
                CheckVerdict::Unknown
            }))
        }
        .await
        .unwrap_or_else(|e: DbError| {
            tracing::warn!(order = order_id, error = %e, "check-back cannot read the order; answering unknown");
            CheckVerdict::Unknown
        });
        emit(Event::CheckBack {
            verdict: match verdict {
                CheckVerdict::Commit => "commit",
                CheckVerdict::Rollback => "rollback",
                CheckVerdict::Unknown => "unknown",
            },
        });
        verdict
    }
}

fn state_of(verdict: CheckVerdict) -> LocalTransactionState {
    match verdict {
        CheckVerdict::Commit => LocalTransactionState::CommitMessage,
        CheckVerdict::Rollback => LocalTransactionState::RollbackMessage,
        CheckVerdict::Unknown => LocalTransactionState::Unknown,
    }
}

fn order_of<B: AsRef<[u8]>>(keys: Option<Vec<String>>, body: Option<B>) -> Option<String> {
    body.and_then(|b| codec::decode(b.as_ref(), None, |_| None).ok())
        .map(|m| m.order_id)
        .or_else(|| keys.and_then(|k| k.into_iter().next()))
}

impl TransactionListener for ArmListener {
    fn execute_local_transaction(
        &self,
        msg: &dyn MessageTrait,
        _arg: Option<&(dyn Any + Send + Sync)>,
    ) -> LocalTransactionState {
        let keys = msg
            .get_keys()
            .map(|k| k.as_str().split(' ').map(str::to_string).collect());
        let Some(order_id) = order_of(keys, msg.get_body()) else {
            return LocalTransactionState::RollbackMessage;
        };
        match self.app.block_on(self.local_transaction(&order_id)) {
            Armed::Committed => LocalTransactionState::CommitMessage,
            Armed::RolledBack => LocalTransactionState::RollbackMessage,
            Armed::Unknown => LocalTransactionState::Unknown,
        }
    }

    fn check_local_transaction(&self, msg: &MessageExt) -> LocalTransactionState {
        let Some(order_id) = order_of(msg.message_inner().keys(), msg.body()) else {
            return LocalTransactionState::RollbackMessage;
        };
        let checks = msg
            .properties()
            .iter()
            .find(|(k, _)| k.as_str() == CHECK_TIMES)
            .and_then(|(_, v)| v.parse::<u32>().ok())
            .unwrap_or(1);
        state_of(self.app.block_on(self.check_back(&order_id, checks)))
    }
}

/// The transaction producer: arms orders, and answers check-backs while it runs.
pub struct Arming {
    transport: Arc<Transport>,
    producer: Arc<TransactionMQProducer>,
}

impl Arming {
    /// Starts a transaction producer in `rocketmq.transaction_group` answering with `listener`
    /// (an [`ArmListener`]; tests wrap one).
    ///
    /// # Errors
    /// [`TransportError::Start`] when the producer cannot start.
    pub async fn start(
        transport: Arc<Transport>,
        listener: impl TransactionListener,
    ) -> Result<Self, TransportError> {
        let config = transport.config();
        let mut producer = TransactionMQProducer::builder(transport.client_runtime())
            .producer_group(config.transaction_group.as_str())
            .name_server_addr(config.namesrv.as_str())
            .client_config(transport.client_config()?)
            .topics(vec![config.topic.as_str()])
            .send_msg_timeout(config.send_timeout.as_millis().min(u32::MAX as u128) as u32)
            .transaction_listener(listener)
            .build();
        let producer = transport
            .on_client(async move { producer.start().await.map(|()| producer) })
            .await?
            .map_err(|e| TransportError::Start(format!("transaction producer: {e}")))?;
        // Make the group known to the broker now, or its check-backs are dropped until the
        // client's next heartbeat, up to 30 s away (`Transport::announce`).
        for attempt in 0..ANNOUNCE_ATTEMPTS {
            match transport.announce().await {
                Ok(true) => {
                    tracing::debug!(group = %config.transaction_group, "transaction producer announced to the brokers");
                    break;
                }
                Ok(false) if attempt + 1 < ANNOUNCE_ATTEMPTS => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Ok(false) => tracing::warn!(
                    group = %config.transaction_group,
                    "the transaction producer's first heartbeat did not go out; check-backs \
                     reach it after the client's next one (within 30 s)"
                ),
                Err(e) => {
                    tracing::warn!(group = %config.transaction_group, error = %e, "announcing the transaction producer");
                    break;
                }
            }
        }
        Ok(Arming {
            transport,
            producer: Arc::new(producer),
        })
    }

    /// Stops the transaction producer, when this is its last handle (otherwise the client
    /// runtime's bounded shutdown stops it).
    pub async fn shutdown(self: Arc<Self>) {
        let Ok(arming) = Arc::try_unwrap(self) else {
            return;
        };
        if let Ok(mut producer) = Arc::try_unwrap(arming.producer) {
            let _ = arming
                .transport
                .on_client(async move { producer.shutdown().await })
                .await;
        }
    }

    /// Arms `order_id`: half message, local transaction, commit or rollback.
    ///
    /// # Errors
    /// [`TransportError::Send`] when the half message cannot be sent (nothing was armed).
    pub async fn arm(&self, order_id: &str) -> Result<Armed, TransportError> {
        let config = self.transport.config();
        let body = codec::encode_body(&TimeoutMessage {
            order_id: order_id.to_string(),
            phase: 0,
            due_ms: None,
            row_id: None,
            hop: 0,
        });
        let message = Message::builder()
            .topic(config.topic.as_str())
            .tags(TAG_ARM)
            .key(order_id)
            .body(body)
            .build()
            .map_err(|e| TransportError::Message(e.to_string()))?;
        let producer = self.producer.clone();
        let topic = config.topic.clone();
        let result = self
            .transport
            .on_client(async move {
                producer
                    .send_message_in_transaction::<(), _>(message, None)
                    .await
            })
            .await
            .and_then(|sent| {
                sent.map_err(|e| TransportError::Send {
                    topic,
                    detail: e.to_string(),
                })
            });
        let armed = result.map(|sent| match sent.local_transaction_state {
            Some(LocalTransactionState::CommitMessage) => Armed::Committed,
            Some(LocalTransactionState::RollbackMessage) => Armed::RolledBack,
            _ => Armed::Unknown,
        });
        emit(Event::Armed {
            outcome: match armed {
                Ok(Armed::Committed) => "committed",
                Ok(Armed::RolledBack) => "rolled_back",
                Ok(Armed::Unknown) => "unknown",
                Err(_) => "failed",
            },
        });
        armed
    }
}

/// `timeoutd arm`: over `db` (opened and checked as the daemon's is: the command line passes
/// `daemon::open_database`'s pool), connects to the broker named by `config`, arms each order
/// and reports how each ended. Closes `db`.
///
/// # Errors
/// When `[rocketmq]` is missing, or the plugins or broker cannot be reached.
pub async fn arm_orders(
    config: &crate::config::Config,
    db: Db,
    orders: &[String],
) -> anyhow::Result<Vec<(String, Armed)>> {
    let rocketmq = config
        .rocketmq
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("the configuration has no [rocketmq] section"))?;
    let policies = crate::policies::load(config)?;

    let transport = Transport::start(rocketmq).await?;
    let listener = ArmListener::new(Handle::current(), db.clone(), Clock::Database, policies);
    let arming = Arming::start(transport.clone(), listener).await?;
    let mut results = Vec::new();
    for order in orders {
        let armed = arming.arm(order).await;
        results.push((order.clone(), armed.unwrap_or(Armed::Unknown)));
    }
    Arc::new(arming).shutdown().await;
    transport.shutdown().await;
    db.close().await;
    Ok(results)
}
