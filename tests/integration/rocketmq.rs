//! The RocketMQ transport against the real broker (`scripts/rocketmq start`, name server at
//! `$TIMEOUTD_ROCKETMQ_NAMESRV`, default 127.0.0.1:19876), on SQLite, MariaDB and PostgreSQL.
//!
//! Broker tests take one process-wide lock: one of them stops the broker for 30 s. Each test
//! uses its own topic and groups (the broker auto-creates them), so nothing leaks between runs.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rocketmq_client_rust::{
    ClientResult, ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus,
    MessageListenerConcurrently,
};
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_single::Message;
use timeoutd::clock::Clock;
use timeoutd::config::Config;
use timeoutd::daemon::Daemon;
use timeoutd::rocketmq::Transport;
use timeoutd::rocketmq::arming::{ArmListener, Armed, Arming};
use timeoutd::rocketmq::coalesce::Coalescer;
use timeoutd::rocketmq::codec::PROP_DUE_MS;
use timeoutd::rocketmq::consumer::{Ack, Received, TimeoutConsumer};
use timeoutd_runtime::model::CheckVerdict;

use crate::support::{Env, eventually, order, repo_root};

static BROKER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The name server the tests use.
fn namesrv() -> String {
    std::env::var("TIMEOUTD_ROCKETMQ_NAMESRV").unwrap_or_else(|_| "127.0.0.1:19876".into())
}

/// Takes the broker lock and checks the name server answers.
pub(crate) async fn broker() -> tokio::sync::MutexGuard<'static, ()> {
    let guard = BROKER.lock().await;
    let addr = namesrv();
    if tokio::net::TcpStream::connect(&addr).await.is_err() {
        panic!(
            "no RocketMQ name server at {addr}: start one with `scripts/rocketmq install && \
             scripts/rocketmq start` (scripts/test does), or set TIMEOUTD_ROCKETMQ_NAMESRV"
        );
    }
    guard
}

/// `(topic, consumer group)` private to one test run.
fn names(test: &str) -> (String, String) {
    let tag = format!("{:08x}", fastrand::u32(..));
    (format!("TT_{test}_{tag}"), format!("TG_{test}_{tag}"))
}

/// A `[rocketmq]` section for `topic`/`group`, `extra` keys appended.
fn section(topic: &str, group: &str, extra: &str) -> String {
    format!(
        "[rocketmq]\nnamesrv = \"{ns}\"\ntopic = \"{topic}\"\nconsumer_group = \"{group}\"\n\
         producer_group = \"{group}_P\"\ntransaction_group = \"{group}_TX\"\n\
         notification_topic = \"{topic}_N\"\nroute_refresh = \"10s\"\nconsume_from = \"first\"\n\
         send_timeout = \"5s\"\n{extra}\n",
        ns = namesrv()
    )
}

/// A producer-only transport for the test to send raw messages with.
async fn sender(config: &Config) -> Arc<Transport> {
    sender_as(config, "TEST").await
}

/// [`sender`] in a producer group of its own (`<producer_group>_<suffix>`): a second process.
async fn sender_as(config: &Config, suffix: &str) -> Arc<Transport> {
    let mut c = config.rocketmq.clone().unwrap();
    c.producer_group = format!("{}_{suffix}", c.producer_group);
    Transport::start(&c).await.unwrap()
}

/// A raw message as an order service would send it.
fn raw(topic: &str, key: &str, body: &[u8]) -> Message {
    Message::builder()
        .topic(topic)
        .key(key)
        .body(body.to_vec())
        .build()
        .unwrap()
}

/// Sends, retrying while the broker auto-creates the topic.
async fn send(t: &Transport, m: Message) {
    let mut last = None;
    for _ in 0..10 {
        match t.send(m.clone()).await {
            Ok(_) => return,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("send failed (see the broker log under the store dir): {last:?}");
}

/// Deletes the orders' outbox rows: these order services rely on their own messages.
async fn without_rows(env: &Env) {
    env.db
        .backend()
        .query("DELETE FROM order_timeout_msg WHERE phase >= ?")
        .bind(0i64)
        .execute(env.db.pool())
        .await
        .unwrap();
}

/// A counter of the daemon's metrics by its one label, read from this process's metrics
/// recorder (installed on first use): `timeoutd_broker_messages_total` (handled, duplicate,
/// busy, …), `timeoutd_relay_total` (sent, failed), `timeoutd_arms_total` (committed, …) or
/// `timeoutd_check_backs_total` (by verdict).
#[derive(Debug)]
struct Outcomes(HashMap<String, u64>);

impl Outcomes {
    fn of(counter: &str) -> Outcomes {
        let prefix = format!("{counter}{{");
        let text = timeoutd::events::metrics_handle().render();
        Outcomes(
            text.lines()
                .filter_map(|l| l.strip_prefix(prefix.as_str()))
                .filter_map(|rest| {
                    let (_label, rest) = rest.split_once("=\"")?;
                    let (outcome, value) = rest.split_once("\"} ")?;
                    Some((
                        outcome.to_string(),
                        value.trim().parse::<f64>().ok()? as u64,
                    ))
                })
                .collect(),
        )
    }

    /// Deliveries of the timeout topic by outcome.
    fn broker() -> Outcomes {
        Outcomes::of("timeoutd_broker_messages_total")
    }

    /// Relay sends by outcome.
    fn relay() -> Outcomes {
        Outcomes::of("timeoutd_relay_total")
    }

    fn get(&self, outcome: &str) -> u64 {
        self.0.get(outcome).copied().unwrap_or(0)
    }

    /// How much `outcome` grew since `before`.
    fn since(&self, before: &Outcomes, outcome: &str) -> u64 {
        self.get(outcome) - before.get(outcome)
    }
}

async fn closes(env: &Env, id: &str) -> i64 {
    env.int(
        "SELECT COUNT(*) FROM decision_log WHERE order_id = ? AND outcome = 'closed'",
        id,
    )
    .await
}

/// Runs `$body` on SQLite, MariaDB and PostgreSQL with the broker lock held.
macro_rules! with_broker {
    (async fn $name:ident($env:ident) $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            async fn run($env: &crate::support::Env) $body
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                let _broker = super::broker().await;
                let env = crate::support::Env::new(timeoutd::db::Backend::Sqlite).await;
                run(&env).await;
                env.cleanup().await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn mariadb() {
                let _broker = super::broker().await;
                let env = crate::support::Env::new(timeoutd::db::Backend::MySql).await;
                run(&env).await;
                env.cleanup().await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                let _broker = super::broker().await;
                let env = crate::support::Env::new(timeoutd::db::Backend::Postgres).await;
                run(&env).await;
                env.cleanup().await;
            }
        }
    };
}

const ACME: &[crate::support::MerchantSpec<'static>] = &[("acme", "builtin:single-phase", &[])];

with_broker!(
    async fn seed_formats_close_their_orders_and_a_paid_order_is_a_no_op(env) {
        let (topic, group) = names("seed");
        let config = env.config(
            ACME,
            &format!(
                "[outbox]\nenabled = false\n[sweep]\nenabled = false\n{}",
                section(&topic, &group, "")
            ),
        );
        env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
        let now = env.db.now_ms().await.unwrap();
        for id in ["text-1", "json-1", "paid-1"] {
            env.create(&order(id, "acme", now - 1_000)).await;
        }
        without_rows(env).await;
        assert!(env.pay("paid-1", now).await);
        let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
        let tx = sender(&config).await;
        send(&tx, raw(&topic, "text-1", b"text-1")).await;
        let json = br#"{"orderId":"json-1","activityId":null,"userId":"user-of-json-1","createTime":1,"phase":0}"#;
        send(&tx, raw(&topic, "json-1", json)).await;
        send(&tx, raw(&topic, "paid-1", b"paid-1")).await;
        eventually(Duration::from_secs(60), "both messages close their orders", || async {
            env.status("text-1").await == "CLOSED" && env.status("json-1").await == "CLOSED"
        })
        .await;
        eventually(Duration::from_secs(30), "the paid order's message is handled", || async {
            env.text(
                "SELECT status FROM order_timeout_msg WHERE order_id = ?",
                "paid-1",
            )
            .await
                == "PROCESSED"
        })
        .await;
        assert_eq!(env.status("paid-1").await, "PAID");
        assert_eq!(env.coupon("cpn-paid-1").await, "USED");
        // 3 orders took 2 + 2 + 2 of sku-a; the two closed gave theirs back.
        assert_eq!(env.stock("sku-a").await, 98);
        assert_eq!(env.stock("sku-b").await, 99);
        assert_eq!(
            env.text("SELECT closed_by FROM orders WHERE id = ?", "text-1").await,
            "delay-message"
        );
        tx.shutdown().await;
        daemon.stop().await;
    }
);

/// The fixture bodies of `tests/data/java-messages`: `(file name, body)`, sorted by name.
fn java_messages() -> Vec<(String, Vec<u8>)> {
    let dir = repo_root().join("tests/data/java-messages");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    files.sort();
    assert!(files.len() >= 8, "fixtures missing in {}", dir.display());
    files
}

/// The `orderId` of a fixture, read from its text (never through a double).
fn fixture_order_id(body: &[u8]) -> String {
    let text = std::str::from_utf8(body).unwrap();
    let at = text.find("\"orderId\":").unwrap() + "\"orderId\":".len();
    text[at..]
        .trim_start_matches('"')
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '-')
        .collect()
}

with_broker!(
    async fn java_encodings_of_the_seed_message_close_their_orders(env) {
        let (topic, group) = names("java");
        let config = env.config(
            ACME,
            &format!(
                "[outbox]\nenabled = false\n[sweep]\nenabled = false\n{}",
                section(&topic, &group, "")
            ),
        );
        let fixtures = java_messages();
        env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
        let now = env.db.now_ms().await.unwrap();
        let (refused, accepted): (Vec<_>, Vec<_>) =
            fixtures.iter().partition(|(name, _)| name.starts_with("refused-"));
        for (_, body) in &accepted {
            env.create(&order(&fixture_order_id(body), "acme", now - 1_000)).await;
        }
        without_rows(env).await;
        let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
        let tx = sender(&config).await;
        for (name, body) in &fixtures {
            // As rocketmq-spring sends it: delay level 2 (5 s), the order id as the key.
            let m = Message::builder()
                .topic(&topic)
                .key(fixture_order_id(body))
                .body(body.clone())
                .delay_level(2)
                .build()
                .unwrap_or_else(|e| panic!("{name}: {e:?}"));
            send(&tx, m).await;
        }
        for (name, body) in &accepted {
            let id = fixture_order_id(body);
            eventually(Duration::from_secs(60), &format!("{name} closes order {id}"), || async {
                env.status(&id).await == "CLOSED"
            })
            .await;
            assert_eq!(
                env.text("SELECT closed_by FROM orders WHERE id = ?", &id).await,
                "delay-message",
                "{name}"
            );
        }
        eventually(Duration::from_secs(30), "the refused bodies are dead-lettered", || async {
            env.int(
                "SELECT COUNT(*) FROM dead_letter WHERE source = ? AND status = 'OPEN'",
                "rocketmq",
            )
            .await
                == refused.len() as i64
        })
        .await;
        let reason = env
            .text("SELECT reason FROM dead_letter WHERE source = ?", "rocketmq")
            .await;
        assert!(
            reason.contains("orderId") && reason.contains("1.79e18") && reason.contains("exponent"),
            "{reason}"
        );
        tx.shutdown().await;
        daemon.stop().await;
    }
);

/// An order due in 12 s, relayed to the broker in `delay_mode`, is closed by the broker's message:
/// never before its deadline, and by `delay-message`. The outbox timer would take the row back
/// only 20 s late, so a lost or late message shows as `closed_by = outbox`. (Lateness is printed,
/// not asserted: it is a bench figure, and this machine is busy.)
async fn relayed_order_closes_by_the_brokers_message(env: &Env, delay_mode: &str) {
    relayed_order_closes_by_the_brokers_message_with(env, delay_mode, "").await;
}

/// [`relayed_order_closes_by_the_brokers_message`] with `extra` `[rocketmq]` keys.
async fn relayed_order_closes_by_the_brokers_message_with(
    env: &Env,
    delay_mode: &str,
    extra: &str,
) {
    let (topic, group) = names(delay_mode);
    let config = env.config(
        ACME,
        &section(
            &topic,
            &group,
            &format!("delay_mode = \"{delay_mode}\"\nfallback_after = \"20s\"\n{extra}"),
        ),
    );
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    let before = Outcomes::broker();
    let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
    let now = env.db.now_ms().await.unwrap();
    let deadline = now + 12_000;
    let id = format!("relayed-{delay_mode}");
    env.create(&order(&id, "acme", deadline)).await;
    eventually(
        Duration::from_secs(10),
        "the relay publishes the row",
        || async {
            env.text(
                "SELECT status FROM order_timeout_msg WHERE order_id = ?",
                &id,
            )
            .await
                == "SENT"
        },
    )
    .await;
    eventually(Duration::from_secs(60), "the order closes", || async {
        env.status(&id).await == "CLOSED"
    })
    .await;
    assert_eq!(
        env.text("SELECT closed_by FROM orders WHERE id = ?", &id)
            .await,
        "delay-message",
        "{delay_mode}: the broker's message must close it, not the outbox fallback"
    );
    let late = env
        .int("SELECT closed_at_ms FROM orders WHERE id = ?", &id)
        .await
        - deadline;
    assert!(
        late >= 0,
        "{delay_mode}: closed {} ms before the deadline",
        -late
    );
    assert_eq!(
        (env.stock("sku-a").await, env.stock("sku-b").await),
        (10, 10)
    );
    // The last hop is due back `timer_lead` (2 s) early: the message came before the deadline
    // and was held for it, not handled late behind the broker's release.
    let held = Outcomes::broker().since(&before, "held");
    assert!(
        held >= 1,
        "{delay_mode}: the last hop was not held: {:?}",
        Outcomes::broker()
    );
    eprintln!("{delay_mode}: closed {late} ms after the deadline");
    daemon.stop().await;
}

/// Whether order `id`'s first row is claimed (a claim token set).
async fn claimed(env: &Env, id: &str) -> bool {
    env.int(
        "SELECT COUNT(*) FROM order_timeout_msg WHERE order_id = ? AND phase = 0 \
         AND claim_token IS NOT NULL",
        id,
    )
    .await
        == 1
}

/// A daemon whose message for one order, due back 6 s before the deadline, is held: the order
/// is created and the message has come (`held` counted). Returns the daemon, its config and the
/// deadline.
async fn held_message(env: &Env, id: &str) -> (Daemon, Config, i64) {
    let (topic, group) = names("held");
    let config = env.config(
        ACME,
        &section(
            &topic,
            &group,
            "timer_lead = \"6s\"\nrelay_lead = \"8s\"\nfallback_after = \"2s\"",
        ),
    );
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    let before = Outcomes::broker();
    let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
    let deadline = env.db.now_ms().await.unwrap() + 14_000;
    env.create(&order(id, "acme", deadline)).await;
    eventually(
        Duration::from_secs(14),
        "the message comes early and is held",
        || async { Outcomes::broker().since(&before, "held") >= 1 },
    )
    .await;
    (daemon, config, deadline)
}

/// A held message is acknowledged when it is held, with its row claimed and its order loaded
/// ahead (the claim renewed while it waits); its row, still SENT, is the record. A daemon that
/// stops while holding it gives the claim back and loses only promptness: the next daemon's
/// outbox timer takes the row back `fallback_after` past the due time and closes the order
/// once, never early, and the broker does not deliver the acknowledged message again. (SQLite
/// only: the hold and the broker's acknowledgement are the same on every backend.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_message_held_by_a_daemon_that_stops_is_closed_by_the_outbox_fallback() {
    let _broker = broker().await;
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    let (daemon, config, deadline) = held_message(&env, "held-1").await;
    assert!(
        claimed(&env, "held-1").await,
        "the held message's row is claimed ahead of its due time"
    );
    let at_stop = env.db.now_ms().await.unwrap();
    daemon.stop().await;
    assert!(
        at_stop < deadline,
        "the daemon stopped after the deadline: no test"
    );
    assert_eq!(env.status("held-1").await, "PENDING");
    assert_eq!(
        env.text(
            "SELECT status FROM order_timeout_msg WHERE order_id = ?",
            "held-1"
        )
        .await,
        "SENT",
        "the held message's row is still the record"
    );
    assert!(
        !claimed(&env, "held-1").await,
        "the stopping daemon gives the held row's claim back"
    );
    let restarted = Daemon::start(&config, Clock::Database).await.unwrap();
    eventually(Duration::from_secs(30), "the order closes", || async {
        env.status("held-1").await == "CLOSED"
    })
    .await;
    assert_eq!(
        env.text("SELECT closed_by FROM orders WHERE id = ?", "held-1")
            .await,
        "outbox",
        "the acknowledged message came back, or the stopped daemon's hold closed it"
    );
    let closed_at = env
        .int("SELECT closed_at_ms FROM orders WHERE id = ?", "held-1")
        .await;
    assert!(
        closed_at >= deadline + 2_000,
        "closed {} ms after the deadline, before the fallback",
        closed_at - deadline
    );
    assert_eq!(closes(&env, "held-1").await, 1);
    assert_eq!(
        (env.stock("sku-a").await, env.stock("sku-b").await),
        (10, 10)
    );
    restarted.stop().await;
    env.cleanup().await;
}

/// A payment that lands while the order's message is held (its row claimed and the order
/// loaded ahead) wins: at the due time the close's compare-and-set finds the order PAID, so it
/// stays PAID with its coupon used and its stock kept, and its row is finished, not closed
/// (F12). (SQLite only, as above.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_while_the_message_is_held_wins() {
    let _broker = broker().await;
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    let (daemon, _config, deadline) = held_message(&env, "held-paid").await;
    assert!(
        claimed(&env, "held-paid").await,
        "the held message's row is claimed ahead of its due time"
    );
    assert!(
        env.pay("held-paid", deadline - 1_000).await,
        "paid while its message is held"
    );
    eventually(Duration::from_secs(20), "the row is finished", || async {
        env.text(
            "SELECT status FROM order_timeout_msg WHERE order_id = ? AND phase = 0",
            "held-paid",
        )
        .await
            == "PROCESSED"
    })
    .await;
    assert_eq!(env.status("held-paid").await, "PAID");
    assert_eq!(closes(&env, "held-paid").await, 0);
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM effect_ledger WHERE order_id = ?",
            "held-paid"
        )
        .await,
        0,
        "no effect of a close was recorded"
    );
    // The order locked 2 + 1 units when it was created; a paid order's stay sold.
    assert_eq!(
        (env.stock("sku-a").await, env.stock("sku-b").await),
        (10 - 2, 10 - 1),
        "a paid order's stock stays sold"
    );
    assert_eq!(
        env.coupon("cpn-held-paid").await,
        "USED",
        "the paid order keeps its coupon"
    );
    daemon.stop().await;
    env.cleanup().await;
}

with_broker!(
    async fn a_twelve_second_chain_of_levels_closes_by_the_message(env) {
        relayed_order_closes_by_the_brokers_message(env, "levels").await;
    }
);

with_broker!(
    async fn a_timer_message_closes_its_order_by_the_message(env) {
        // `timer` is what `auto`, the default, uses on a broker with the timer wheel on.
        relayed_order_closes_by_the_brokers_message(env, "timer").await;
    }
);

/// F8 on the real broker: with `timer_max = 4s`, a 12 s delay is three timer messages; each
/// early one is re-sent towards the due time (a hop), the last closes the order. (SQLite only:
/// the chain is the planner's and the broker's, the database sees one close either way.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delay_past_the_timer_maximum_is_chained_through_the_broker_and_closes_once() {
    let _broker = broker().await;
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    let before = Outcomes::broker();
    relayed_order_closes_by_the_brokers_message_with(&env, "timer", "timer_max = \"4s\"").await;
    let hops = Outcomes::broker().since(&before, "hop");
    assert!(hops >= 2, "{hops} hop(s): the delay was not chained");
    assert_eq!(closes(&env, "relayed-timer").await, 1);
    env.cleanup().await;
}

with_broker!(
    async fn the_same_message_twice_to_two_consumers_closes_once(env) {
        let (topic, group) = names("dup");
        let config = env.config(
            ACME,
            &format!(
                "[outbox]\nenabled = false\n[sweep]\nenabled = false\n{}",
                section(&topic, &group, "")
            ),
        );
        env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
        let now = env.db.now_ms().await.unwrap();
        let ids: Vec<String> = (0..10).map(|i| format!("dup-{i}")).collect();
        for id in &ids {
            env.create(&order(id, "acme", now - 1_000)).await;
        }
        without_rows(env).await;
        // Deliveries are counted by the daemons' own metric (the broker lock keeps every other
        // consumer in this process quiet): before, then after.
        let before = Outcomes::broker();
        let a = Daemon::start(&config, Clock::Database).await.unwrap();
        let b = Daemon::start(&config, Clock::Database).await.unwrap();
        let tx = sender(&config).await;
        for id in &ids {
            for _ in 0..2 {
                send(&tx, raw(&topic, id, id.as_bytes())).await;
            }
        }
        eventually(Duration::from_secs(60), "every order closes", || async {
            let mut all = true;
            for id in &ids {
                all &= env.status(id).await == "CLOSED";
            }
            all
        })
        .await;
        // Every copy was delivered and handled: one closing each order, the other a no-op
        // (`duplicate`, or `busy` while the first held the row).
        eventually(Duration::from_secs(60), "both copies of every message are consumed", || async {
            let now = Outcomes::broker();
            ["handled", "duplicate", "busy"].iter().map(|o| now.since(&before, o)).sum::<u64>() >= 20
        })
        .await;
        let after = Outcomes::broker();
        assert_eq!(after.since(&before, "handled"), 10, "{after:?}");
        assert_eq!(after.since(&before, "duplicate") + after.since(&before, "busy"), 10, "{after:?}");
        for id in &ids {
            assert_eq!(closes(env, id).await, 1, "{id} closed once");
            assert_eq!(
                env.int(
                    "SELECT COUNT(*) FROM effect_ledger WHERE order_id = ? AND kind = 'notify'",
                    id
                )
                .await,
                1
            );
        }
        assert_eq!(env.stock("sku-a").await, 100);
        assert_eq!(env.stock("sku-b").await, 100);
        tx.shutdown().await;
        a.stop().await;
        b.stop().await;
    }
);

/// A message as the broker hands it over: order id as body and key, a fresh message id.
fn received(topic: &str, id: &str) -> Received {
    Received {
        message_id: format!("{id}-{:08x}", fastrand::u32(..)),
        topic: topic.to_string(),
        keys: Some(id.to_string()),
        body: id.as_bytes().to_vec(),
        properties: HashMap::new(),
        reconsume_times: 0,
    }
}

// A burst the broker releases after its due time (a merged group of at least
// `consume_batch` due messages) is held: its rows claimed and orders loaded, acknowledged,
// and released at once in the prefetch's full groups. Held here with the releaser given no
// permit, so the orders are still open when the call returns; a smaller group is closed
// inside its call as before. Each order then closes once, stock exact.
with_broker!(
    async fn a_late_burst_is_held_and_released_in_full_groups(env) {
        let (topic, group) = names("burst");
        let config = env.config(
            ACME,
            &format!(
                "[outbox]\nenabled = false\n[sweep]\nenabled = false\n{}",
                section(&topic, &group, "consume = false\nconsume_batch = 8")
            ),
        );
        env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
        let now = env.db.now_ms().await.unwrap();
        let burst: Vec<String> = (0..12).map(|k| format!("burst-{k}")).collect();
        let few: Vec<String> = (0..3).map(|k| format!("few-{k}")).collect();
        for id in burst.iter().chain(&few) {
            env.create(&order(id, "acme", now - 1_000)).await;
        }
        let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
        let dispatcher = daemon.dispatcher().clone();
        let (ahead, released) = timeoutd::sources::prefetch::channel(1_000);
        let permits = Arc::new(tokio::sync::Semaphore::new(0));
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let releaser = tokio::spawn(released.run(dispatcher.clone(), permits.clone(), 512, stopping));
        let consumer = TimeoutConsumer::new(
            dispatcher,
            daemon.broker().unwrap().transport.clone(),
            Duration::from_secs(30),
        )
        .with_hold(ahead, 8);

        let batch: Vec<Received> = burst.iter().map(|id| received(&topic, id)).collect();
        assert!(consumer.handle_each(&batch).await.iter().all(|a| *a == Ack::Done));
        for id in &burst {
            assert_eq!(env.status(id).await, "PENDING", "{id}: held, not closed in the call");
            assert!(claimed(env, id).await, "{id}: its row is claimed while held");
        }
        let batch: Vec<Received> = few.iter().map(|id| received(&topic, id)).collect();
        assert!(consumer.handle_each(&batch).await.iter().all(|a| *a == Ack::Done));
        for id in &few {
            assert_eq!(env.status(id).await, "CLOSED", "{id}: a small group closes in its call");
        }

        permits.add_permits(1);
        eventually(Duration::from_secs(20), "the held burst closes", || async {
            env.int("SELECT COUNT(*) FROM orders WHERE id LIKE ? AND status = 'CLOSED'", "burst-%").await == 12
        })
        .await;
        for id in burst.iter().chain(&few) {
            assert_eq!(closes(env, id).await, 1, "{id}: closed once");
            assert_eq!(
                env.text("SELECT status FROM order_timeout_msg WHERE order_id = ? AND phase = 0", id).await,
                "PROCESSED"
            );
        }
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (100, 100), "stock back once per order");
        stop.send(true).unwrap();
        drop(consumer);
        releaser.await.unwrap();
        daemon.stop().await;
    }
);

/// [`received`], carrying its due time as timeoutd's own messages do.
fn received_due(topic: &str, id: &str, due_ms: i64) -> Received {
    let mut r = received(topic, id);
    r.properties
        .insert(PROP_DUE_MS.to_string(), due_ms.to_string());
    r
}

// Listener calls of early messages (a timer burst delivered `timer_lead` ahead) that come one
// after another wait for each other (`rocketmq.early_linger`, here 20 s) and
// are claimed as one group: one claim token for all their rows. A call with a due message ends
// the wait at once: it closes its order, and the early ones are held, still open.
with_broker!(
    async fn early_calls_linger_into_one_group_until_a_due_one_comes(env) {
        let (topic, group) = names("linger");
        let config = env.config(
            ACME,
            &format!(
                "[outbox]\nenabled = false\n[sweep]\nenabled = false\n{}",
                // Messages due within timer_lead + 1 s are held (an earlier one is re-sent).
                section(&topic, &group, "consume = false\nrelay_lead = \"120s\"\ntimer_lead = \"90s\"")
            ),
        );
        env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
        let now = env.db.now_ms().await.unwrap();
        let early: Vec<String> = (0..3).map(|k| format!("early-{k}")).collect();
        for id in &early {
            env.create(&order(id, "acme", now + 60_000)).await;
        }
        for id in ["first-0", "due-0"] {
            env.create(&order(id, "acme", now - 1_000)).await;
        }
        let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
        let dispatcher = daemon.dispatcher().clone();
        let (ahead, released) = timeoutd::sources::prefetch::channel(1_000);
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let permits = Arc::new(tokio::sync::Semaphore::new(0));
        let releaser = tokio::spawn(released.run(dispatcher.clone(), permits, 512, stopping));
        let consumer = TimeoutConsumer::new(
            dispatcher,
            daemon.broker().unwrap().transport.clone(),
            Duration::from_secs(30),
        )
        .with_hold(ahead, 8);
        let linger = Duration::from_secs(20);
        let groups = Arc::new(Coalescer::start(
            &tokio::runtime::Handle::current(),
            Arc::new(consumer),
            256,
            4,
            linger,
        ));
        // The first call reads the clock: before any read nothing counts as early.
        let first = received_due(&topic, "first-0", now - 1_000);
        assert_eq!(groups.handle(vec![first]).await, Ack::Done);
        assert_eq!(env.status("first-0").await, "CLOSED");

        let mut calls = Vec::new();
        for id in &early {
            let (groups, message) = (groups.clone(), received_due(&topic, id, now + 60_000));
            calls.push(tokio::spawn(async move { groups.handle(vec![message]).await }));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Held alone, an early call returns within milliseconds; lingering, it waits the 20 s
        // for company. Still waiting after 3 s is lingering, however slow the machine.
        let last = calls.last_mut().unwrap();
        let waited = tokio::time::timeout(Duration::from_secs(3), &mut *last).await;
        assert!(waited.is_err(), "the last early call waits for company");
        assert!(calls.iter().all(|c| !c.is_finished()), "the early calls wait for company");
        for id in &early {
            assert!(!claimed(env, id).await, "{id}: not claimed while its group waits");
        }
        let due = received_due(&topic, "due-0", now - 1_000);
        let answer = tokio::time::timeout(Duration::from_secs(10), groups.handle(vec![due]));
        assert_eq!(answer.await.expect("a due message ends the wait"), Ack::Done);
        for call in calls {
            assert_eq!(call.await.unwrap(), Ack::Done, "held and acknowledged");
        }
        assert_eq!(env.status("due-0").await, "CLOSED");
        for id in &early {
            assert_eq!(env.status(id).await, "PENDING", "{id}: held until due");
        }
        assert_eq!(
            env.int(
                "SELECT COUNT(DISTINCT claim_token) FROM order_timeout_msg WHERE order_id LIKE ? \
                 AND claim_token IS NOT NULL",
                "early-%"
            )
            .await,
            1,
            "the three calls' rows were claimed as one group"
        );
        stop.send(true).unwrap();
        drop(groups);
        releaser.await.unwrap();
        daemon.stop().await;
    }
);

// The relay marks a round's sent rows SENT together, a few statements per round: every row of
// a round larger than one statement's chunk (64) is SENT with its own message id and its claim
// dropped; a row whose claim another took meanwhile is left alone. (A message per row:
// `rows_per_message = 1`.)
with_broker!(
    async fn a_relay_round_marks_each_sent_row_with_its_own_message_id(env) {
        let (topic, group) = names("relayround");
        let config = env.config(
            ACME,
            &format!("[outbox]\nenabled = false\n[sweep]\nenabled = false\n{}", section(&topic, &group, "consume = false\nrows_per_message = 1")),
        );
        env.stock_up(&[("sku-a", 1_000), ("sku-b", 1_000)]).await;
        let now = env.db.now_ms().await.unwrap();
        for k in 0..70 {
            env.create(&order(&format!("round-{k}"), "acme", now + 120_000)).await;
        }
        let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
        eventually(Duration::from_secs(30), "the relay publishes every row", || async {
            env.int("SELECT COUNT(*) FROM order_timeout_msg WHERE status = 'SENT' AND order_id LIKE ?", "round-%").await == 70
        })
        .await;
        daemon.stop().await;
        assert_eq!(
            env.int(
                "SELECT COUNT(DISTINCT message_id) FROM order_timeout_msg WHERE order_id LIKE ? \
                 AND message_id IS NOT NULL AND claim_token IS NULL AND sent_at_ms IS NOT NULL",
                "round-%"
            )
            .await,
            70,
            "each row SENT with its own message id, its claim dropped"
        );

        env.create(&order("stolen-0", "acme", now + 120_000)).await;
        let id = env.int("SELECT id FROM order_timeout_msg WHERE order_id = ?", "stolen-0").await;
        let claims = timeoutd::db::relay::claim_rows(&env.db, &[id], now, 30_000).await.unwrap();
        assert!(matches!(claims[0], timeoutd::db::relay::RowClaim::Claimed(_)));
        timeoutd::db::relay::mark_sent(&env.db, "another-token", now, &[(id, "m-1".into())]).await.unwrap();
        assert_eq!(env.text("SELECT status FROM order_timeout_msg WHERE order_id = ?", "stolen-0").await, "PENDING");
        assert!(claimed(env, "stolen-0").await, "the other claim stands");
    }
);

/// `count` orders `burst-<k>` due together `ahead_ms` from now, created before a daemon with
/// `extra` `[rocketmq]` keys starts (so its relay's first round claims them all), closed by the
/// broker's messages (the outbox fallback only 20 s late). Checks each order closed once, by
/// `delay-message`, never early, stock back; returns how many distinct message ids the rows
/// were sent with.
async fn burst_closes_by_shared_messages(
    env: &Env,
    count: usize,
    ahead_ms: i64,
    extra: &str,
) -> i64 {
    let (topic, group) = names("shared");
    let config = env.config(
        ACME,
        &section(
            &topic,
            &group,
            &format!("fallback_after = \"20s\"\n{extra}"),
        ),
    );
    env.stock_up(&[("sku-a", 1_000), ("sku-b", 1_000)]).await;
    let deadline = env.db.now_ms().await.unwrap() + ahead_ms;
    for k in 0..count {
        env.create(&order(&format!("burst-{k}"), "acme", deadline))
            .await;
    }
    let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
    eventually(
        Duration::from_secs(60),
        "every order of the burst closes",
        || async {
            env.int(
                "SELECT COUNT(*) FROM orders WHERE status = 'CLOSED' AND id LIKE ?",
                "burst-%",
            )
            .await
                == count as i64
        },
    )
    .await;
    daemon.stop().await;
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM orders WHERE id LIKE ? AND closed_by = 'delay-message' \
             AND closed_at_ms >= deadline_ms",
            "burst-%"
        )
        .await,
        count as i64,
        "each order closed by its rows message, none before its deadline"
    );
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM decision_log WHERE order_id LIKE ? AND outcome = 'closed'",
            "burst-%"
        )
        .await,
        count as i64,
        "one close per order"
    );
    assert_eq!(
        (env.stock("sku-a").await, env.stock("sku-b").await),
        (1_000, 1_000),
        "stock back exactly once"
    );
    env.int(
        "SELECT COUNT(DISTINCT message_id) FROM order_timeout_msg WHERE order_id LIKE ? AND phase = 0",
        "burst-%",
    )
    .await
}

// Rows due together share relayed messages (`rows_per_message`): 40 rows of one deadline,
// claimed in one round, are 3 messages (16, 16, 8), and each message's rows are held until
// their due time and closed by it, each once. A consumer that took only a message's first row
// would leave the rest to the outbox fallback (`closed_by = outbox`). With `group_commit = 5`
// the consumer claims, loads and commits a message's rows 5 at a time.
with_broker!(
    async fn a_burst_relayed_in_shared_messages_closes_each_order_once_by_its_message(env) {
        let messages =
            burst_closes_by_shared_messages(env, 40, 10_000, "rows_per_message = 16\ngroup_commit = 5").await;
        assert_eq!(messages, 3, "40 rows of one deadline in messages of at most 16");
    }
);

/// A rows message too far ahead for one timer message (`timer_max = 4s`, due in 14 s) is
/// chained through the broker as one message: each hop re-sends the message, not its rows one
/// by one. 24 rows in messages of 8 are 3 messages; their 2 hops each count 6 re-sends, where a
/// message split into its rows at the first hop would count 24 or more at the second. (SQLite
/// only: the chain is the planner's and the broker's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rows_message_past_the_timer_maximum_is_chained_as_one_message() {
    let _broker = broker().await;
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    let before = Outcomes::broker();
    let messages = burst_closes_by_shared_messages(
        &env,
        24,
        14_000,
        "delay_mode = \"timer\"\ntimer_max = \"4s\"\nrows_per_message = 8",
    )
    .await;
    assert_eq!(
        messages, 3,
        "24 rows of one deadline in messages of at most 8"
    );
    let hops = Outcomes::broker().since(&before, "hop");
    assert!(
        (3..=9).contains(&hops),
        "{hops} hop(s): 3 messages, each chained as one ({:?})",
        Outcomes::broker()
    );
    env.cleanup().await;
}

/// Handles each message with a [`TimeoutConsumer`], then the first time "crashes" before the
/// acknowledgement (answers `ReconsumeLater`), so the broker delivers it again.
struct CrashBeforeAck {
    app: tokio::runtime::Handle,
    consumer: Arc<TimeoutConsumer>,
    seen: Arc<std::sync::Mutex<HashMap<String, u32>>>,
    acks: Arc<AtomicU32>,
}

impl MessageListenerConcurrently for CrashBeforeAck {
    fn consume_message(
        &self,
        messages: &[&MessageExt],
        _context: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        let r = Received::of(messages[0]);
        let consumer = self.consumer.clone();
        let ack = self.app.block_on(async move { consumer.handle(&r).await });
        let key = messages[0]
            .message_inner()
            .keys()
            .unwrap_or_default()
            .join(" ");
        let mut seen = self.seen.lock().unwrap();
        let n = seen.entry(key).or_insert(0);
        *n += 1;
        if *n == 1 {
            return Ok(ConsumeConcurrentlyStatus::ReconsumeLater);
        }
        if ack == Ack::Done {
            self.acks.fetch_add(1, Ordering::SeqCst);
        }
        Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
    }
}

with_broker!(
    async fn a_redelivery_after_commit_without_ack_is_a_no_op(env) {
        let (topic, group) = names("redeliver");
        let config = env.config(
            ACME,
            &format!(
                "[outbox]\nenabled = false\n[sweep]\nenabled = false\n{}",
                section(&topic, &group, "consume = false")
            ),
        );
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let now = env.db.now_ms().await.unwrap();
        env.create(&order("redo-1", "acme", now - 1_000)).await;
        without_rows(env).await;
        let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
        let transport = daemon.broker().unwrap().transport.clone();
        let consumer = Arc::new(TimeoutConsumer::new(
            daemon.dispatcher().clone(),
            transport.clone(),
            Duration::from_secs(30),
        ));
        let seen = Arc::new(std::sync::Mutex::new(HashMap::new()));
        let acks = Arc::new(AtomicU32::new(0));
        transport
            .start_consumer(
                &group,
                &topic,
                CrashBeforeAck {
                    app: tokio::runtime::Handle::current(),
                    consumer,
                    seen: seen.clone(),
                    acks: acks.clone(),
                },
            )
            .await
            .unwrap();
        send(&transport, raw(&topic, "redo-1", b"redo-1")).await;
        eventually(Duration::from_secs(60), "the message is redelivered and acknowledged", || async {
            acks.load(Ordering::SeqCst) == 1
        })
        .await;
        assert_eq!(seen.lock().unwrap().get("redo-1"), Some(&2));
        assert_eq!(env.status("redo-1").await, "CLOSED");
        assert_eq!(closes(env, "redo-1").await, 1);
        assert_eq!(env.stock("sku-a").await, 10);
        assert_eq!(env.coupon("cpn-redo-1").await, "AVAILABLE");
        daemon.stop().await;
    }
);

with_broker!(
    async fn arming_commits_rolls_back_and_check_backs_only_read(env) {
        let (topic, group) = names("arm");
        let config = env.config(
            ACME,
            &format!(
                "[sweep]\nenabled = false\n{}",
                section(&topic, &group, "fallback_after = \"20s\"")
            ),
        );
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let now = env.db.now_ms().await.unwrap();
        let deadline = now + 6_000;
        env.create(&order("arm-1", "acme", deadline)).await;
        without_rows(env).await;
        // A consumer group of its own on the timeout topic sees what the broker delivers.
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let watcher = sender(&config).await;
        watcher.start_consumer(&format!("{group}_WATCH"), &topic, Recorder(seen.clone())).await.unwrap();
        let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
        let arming = daemon.broker().unwrap().arming.clone();
        // Commit: the local transaction inserted the phase-0 row, due at the deadline.
        assert_eq!(arming.arm("arm-1").await.unwrap(), Armed::Committed);
        assert_eq!(
            env.int("SELECT due_ms FROM order_timeout_msg WHERE order_id = ?", "arm-1")
                .await,
            deadline
        );
        assert_eq!(
            env.text("SELECT source FROM order_timeout_msg WHERE order_id = ?", "arm-1")
                .await,
            "arm"
        );
        // Rollback: no such order, nothing armed.
        assert_eq!(arming.arm("no-such-order").await.unwrap(), Armed::RolledBack);
        assert_eq!(
            env.int(
                "SELECT COUNT(*) FROM order_timeout_msg WHERE order_id = ?",
                "no-such-order"
            )
            .await,
            0
        );
        // The committed arm closes the order at, never before, its deadline (F15).
        eventually(Duration::from_secs(40), "the armed order closes", || async {
            env.status("arm-1").await == "CLOSED"
        })
        .await;
        let closed_at = env.int("SELECT closed_at_ms FROM orders WHERE id = ?", "arm-1").await;
        assert!(closed_at >= deadline, "closed {} ms early", deadline - closed_at);
        // The armed row went through the broker: relayed, and closed by its message, not by the
        // outbox timer 20 s late.
        assert_eq!(
            env.text("SELECT closed_by FROM orders WHERE id = ?", "arm-1").await,
            "delay-message"
        );
        assert_eq!(closes(env, "arm-1").await, 1);
        // F15: the committed half message was delivered as the transactional message it was,
        // with no delay of any kind (a delay on a half message loops between the broker's
        // internal topics); the rolled-back one was never delivered.
        let arm_seen = || seen.lock().unwrap().iter().any(|m| m.properties.get("TAGS").map(String::as_str) == Some("arm"));
        eventually(Duration::from_secs(30), "the committed arm message is delivered", || async { arm_seen() }).await;
        let armed: Vec<Received> = seen.lock().unwrap().iter()
            .filter(|m| m.properties.get("TAGS").map(String::as_str) == Some("arm"))
            .cloned()
            .collect();
        assert_eq!(armed.len(), 1, "one arm message, for arm-1: {armed:?}");
        assert_eq!(armed[0].keys.as_deref(), Some("arm-1"));
        let props = &armed[0].properties;
        let tx_group = config.rocketmq.as_ref().unwrap().transaction_group.as_str();
        assert_eq!(props.get("PGROUP").map(String::as_str), Some(tx_group), "{props:?}");
        assert!(props.contains_key("__transactionId__"), "{props:?}");
        for delay in ["DELAY", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS", "__STARTDELIVERTIME"] {
            assert!(!props.contains_key(delay), "the half message carried `{delay}`: {props:?}");
        }
        watcher.shutdown().await;
        daemon.stop().await;
    }
);

with_broker!(
    async fn check_backs_answer_from_the_database_and_a_storm_writes_nothing(env) {
        let (topic, group) = names("check");
        let config = env.config(ACME, &section(&topic, &group, "consume = false\nrelay = false"));
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let now = env.db.now_ms().await.unwrap();
        env.create(&order("due-1", "acme", now - 1_000)).await;
        env.create(&order("later-1", "acme", now + 600_000)).await;
        env.create(&order("paid-1", "acme", now + 600_000)).await;
        assert!(env.pay("paid-1", now).await);
        let policies = timeoutd::policies::load(&config).unwrap();
        let listener = ArmListener::new(
            tokio::runtime::Handle::current(),
            env.db.clone(),
            Clock::Database,
            policies,
        );
        let before = env.dump().await;
        assert_eq!(listener.check_back("due-1", 1).await, CheckVerdict::Commit);
        assert_eq!(listener.check_back("missing", 1).await, CheckVerdict::Rollback);
        assert_eq!(listener.check_back("paid-1", 1).await, CheckVerdict::Rollback);
        // A pending order before its deadline stays unknown until the check count says commit
        // (two-phase/single-phase `max_checks` default 3).
        assert_eq!(listener.check_back("later-1", 1).await, CheckVerdict::Unknown);
        for n in 1..=15 {
            let v = listener.check_back("later-1", n).await;
            assert!(v == CheckVerdict::Unknown || v == CheckVerdict::Commit);
        }
        assert_eq!(env.dump().await, before, "check-backs wrote nothing");

        // A real check-back from the broker: the local transaction answers unknown, the broker
        // asks the producer group, the database says commit, and the committed message arms
        // the order, which the daemon then closes.
        env.create(&order("due-2", "acme", now - 1_000)).await;
        env.db
            .backend()
            .query("DELETE FROM order_timeout_msg WHERE order_id = ?")
            .bind("due-2")
            .execute(env.db.pool())
            .await
            .unwrap();
        let daemon_config = env.config(
            ACME,
            &format!("[sweep]\nenabled = false\n{}", section(&topic, &group, "")),
        );
        let daemon = Daemon::start(&daemon_config, Clock::Database).await.unwrap();
        // Another process's producer in the same transaction group (its own client instance).
        let other = sender(&daemon_config).await;
        let unknown = Arming::start(
            other.clone(),
            UnknownFirst(ArmListener::new(
                tokio::runtime::Handle::current(),
                env.db.clone(),
                Clock::Database,
                timeoutd::policies::load(&daemon_config).unwrap(),
            )),
        )
        .await
        .unwrap();
        assert_eq!(unknown.arm("due-2").await.unwrap(), Armed::Unknown);
        eventually(
            Duration::from_secs(90),
            "the broker checks back, commits, and the order closes",
            || async { env.status("due-2").await == "CLOSED" },
        )
        .await;
        assert_eq!(closes(env, "due-2").await, 1);
        other.shutdown().await;
        daemon.stop().await;
    }
);

/// A local transaction whose outcome is lost (unknown); check-backs go to the real listener.
struct UnknownFirst(ArmListener);

impl rocketmq_client_rust::TransactionListener for UnknownFirst {
    fn execute_local_transaction(
        &self,
        _msg: &dyn rocketmq_model::common::message::MessageTrait,
        _arg: Option<&(dyn std::any::Any + Send + Sync)>,
    ) -> rocketmq_client_rust::LocalTransactionState {
        rocketmq_client_rust::LocalTransactionState::Unknown
    }

    fn check_local_transaction(
        &self,
        msg: &MessageExt,
    ) -> rocketmq_client_rust::LocalTransactionState {
        self.0.check_local_transaction(msg)
    }
}

/// A producer of its own transaction group (`<group>_TX_<suffix>`), so no daemon's listener
/// answers the broker for its half messages.
async fn lone_transaction_producer(
    config: &Config,
    suffix: &str,
    listener: impl rocketmq_client_rust::TransactionListener,
) -> (Arc<Transport>, Arming) {
    let mut lone = config.clone();
    let rocketmq = lone.rocketmq.as_mut().unwrap();
    rocketmq.transaction_group = format!("{}_{suffix}", rocketmq.transaction_group);
    let transport = sender(&lone).await;
    let arming = Arming::start(transport.clone(), listener).await.unwrap();
    (transport, arming)
}

/// Arms `id`, retrying a half message the broker refuses while it auto-creates the topic (as
/// [`send`] does).
async fn arm(arming: &Arming, id: &str) -> Armed {
    let mut last = None;
    for _ in 0..10 {
        match arming.arm(id).await {
            Ok(armed) => return armed,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("arming {id} failed: {last:?}");
}

/// F6: the local transaction commits the row, but its outcome never reaches the broker and no
/// check-back ever resolves it (the broker asks, is told unknown, gives up after
/// `transactionCheckMax` = 5 checks and discards the half message). Nothing depends on it: the
/// committed row is relayed and its message closes the order, once, never early; the unknown
/// arming is counted.
struct NeverResolved {
    listener: ArmListener,
    checks: Arc<AtomicU32>,
}

impl rocketmq_client_rust::TransactionListener for NeverResolved {
    fn execute_local_transaction(
        &self,
        msg: &dyn rocketmq_model::common::message::MessageTrait,
        arg: Option<&(dyn std::any::Any + Send + Sync)>,
    ) -> rocketmq_client_rust::LocalTransactionState {
        // The row commits; the answer is lost.
        let _ = self.listener.execute_local_transaction(msg, arg);
        rocketmq_client_rust::LocalTransactionState::Unknown
    }

    fn check_local_transaction(
        &self,
        _msg: &MessageExt,
    ) -> rocketmq_client_rust::LocalTransactionState {
        self.checks.fetch_add(1, Ordering::SeqCst);
        rocketmq_client_rust::LocalTransactionState::Unknown
    }
}

with_broker!(
    async fn a_half_message_never_resolved_is_discarded_and_its_row_still_closes_the_order(env) {
        let (topic, group) = names("f6");
        let config = env.config(
            ACME,
            &format!(
                "[sweep]\nenabled = false\n{}",
                section(&topic, &group, "fallback_after = \"20s\"")
            ),
        );
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let deadline = env.db.now_ms().await.unwrap() + 4_000;
        env.create(&order("f6-1", "acme", deadline)).await;
        without_rows(env).await;
        let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
        let checks = Arc::new(AtomicU32::new(0));
        let listener = NeverResolved {
            listener: ArmListener::new(
                tokio::runtime::Handle::current(),
                env.db.clone(),
                Clock::Database,
                timeoutd::policies::load(&config).unwrap(),
            ),
            checks: checks.clone(),
        };
        let (transport, arming) = lone_transaction_producer(&config, "LOST", listener).await;
        let before = Outcomes::of("timeoutd_arms_total");
        assert_eq!(arm(&arming, "f6-1").await, Armed::Unknown);
        assert_eq!(
            Outcomes::of("timeoutd_arms_total").since(&before, "unknown"),
            1,
            "the unresolved arming is counted"
        );
        assert_eq!(
            env.text("SELECT source FROM order_timeout_msg WHERE order_id = ?", "f6-1").await,
            "arm",
            "the local transaction committed the row"
        );
        // transactionCheckMax (5) checks, one per scan (every 2 s), after transactionTimeout
        // (1 s): about 12 s alone. Each scan reads the whole half-message queue, earlier tests'
        // messages too, and one that waits for their operation records can hold a scan for up
        // to a minute (rocketmq-broker 1.0.0's MAX_PROCESS_TIME_LIMIT), so a busy broker's five
        // scans take longer. Every check reaches this producer: its group was announced to the
        // broker when it started (`Transport::announce`), not at the client's next heartbeat.
        eventually(
            Duration::from_secs(120),
            "the broker asks transactionCheckMax (5) times, each reaching the producer",
            || async { checks.load(Ordering::SeqCst) >= 5 },
        )
        .await;
        eventually(Duration::from_secs(30), "the order closes", || async {
            env.status("f6-1").await == "CLOSED"
        })
        .await;
        assert_eq!(
            env.text("SELECT closed_by FROM orders WHERE id = ?", "f6-1").await,
            "delay-message",
            "the relayed row's message closes it, not the outbox timer 20 s late"
        );
        let closed_at = env.int("SELECT closed_at_ms FROM orders WHERE id = ?", "f6-1").await;
        assert!(closed_at >= deadline, "closed {} ms early", deadline - closed_at);
        assert_eq!(closes(env, "f6-1").await, 1);
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (10, 10));
        Arc::new(arming).shutdown().await;
        transport.shutdown().await;
        daemon.stop().await;
    }
);

with_broker!(
    async fn a_storm_of_broker_check_backs_answers_each_from_the_database_and_writes_nothing(env) {
        let (topic, group) = names("storm");
        let config = env.config(ACME, &section(&topic, &group, "consume = false\nrelay = false"));
        env.stock_up(&[("sku-a", 1_000), ("sku-b", 1_000)]).await;
        let now = env.db.now_ms().await.unwrap();
        let mut ids = Vec::new();
        for i in 0..10 {
            for (kind, deadline) in [("due", now - 1_000), ("later", now + 600_000), ("paid", now + 600_000)] {
                let id = format!("{kind}-{i}");
                env.create(&order(&id, "acme", deadline)).await;
                if kind == "paid" {
                    assert!(env.pay(&id, now).await);
                }
                ids.push(id);
            }
            ids.push(format!("missing-{i}"));
        }
        let listener = UnknownFirst(ArmListener::new(
            tokio::runtime::Handle::current(),
            env.db.clone(),
            Clock::Database,
            timeoutd::policies::load(&config).unwrap(),
        ));
        let (transport, arming) = lone_transaction_producer(&config, "STORM", listener).await;
        let before = env.dump().await;
        let verdicts = || Outcomes::of("timeoutd_check_backs_total");
        let asked = verdicts();
        for id in &ids {
            assert_eq!(arm(&arming, id).await, Armed::Unknown, "{id}");
        }
        // Each due order commits at its first check, each paid or missing one rolls back at its
        // first; each later one stays unknown until the plugin's `max_checks` (3) says commit.
        let by_verdict = |v: &str| {
            let now = Outcomes::of("timeoutd_check_backs_total");
            now.since(&asked, v)
        };
        // One check-service scan reads the whole half queue, earlier tests' half messages
        // included, and a message waiting for its operation records can hold a scan up to the
        // broker's MAX_PROCESS_TIME_LIMIT (60 s): the later orders need three scans.
        eventually(Duration::from_secs(180), "the broker checks every half message back until each is resolved", || async {
            by_verdict("commit") >= 20 && by_verdict("rollback") >= 20 && by_verdict("unknown") >= 20
        })
        .await;
        eprintln!("check-backs by verdict: {:?}", verdicts());
        assert_eq!(env.dump().await, before, "the storm of check-backs wrote nothing");
        Arc::new(arming).shutdown().await;
        transport.shutdown().await;
    }
);

with_broker!(
    async fn a_poison_message_is_dead_lettered_and_others_flow(env) {
        let (topic, group) = names("poison");
        // The outbox's own rows removed and the sweep off while the messages are consumed, and
        // the admin API to look at and re-drive dead letters; a second daemon sweeps afterwards
        // (F14: an identifiable order still closes by the sweep).
        let config = env.config(
            ACME,
            &format!(
                "[sweep]\nenabled = false\n[admin]\nlisten = \"127.0.0.1:0\"\n\
                 [admin.tokens]\nops = \"{}\"\n{}",
                crate::admin::TOKEN,
                section(&topic, &group, "")
            ),
        );
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let now = env.db.now_ms().await.unwrap();
        env.create(&order("ok-1", "acme", now - 1_000)).await;
        env.create(&order("p-1", "acme", now - 1_000)).await;
        without_rows(env).await;
        let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
        let tx = sender(&config).await;
        send(&tx, raw(&topic, "p-1", b"{\"orderId\": ")).await;
        send(&tx, raw(&topic, "p-2", b"two words")).await;
        send(&tx, raw(&topic, "ok-1", b"ok-1")).await;
        eventually(Duration::from_secs(60), "the good message closes its order", || async {
            env.status("ok-1").await == "CLOSED"
        })
        .await;
        eventually(Duration::from_secs(30), "both poison messages are dead-lettered", || async {
            env.int(
                "SELECT COUNT(*) FROM dead_letter WHERE source = ? AND status = 'OPEN'",
                "rocketmq",
            )
            .await
                == 2
        })
        .await;
        let reason = env
            .text("SELECT reason FROM dead_letter WHERE order_id = ?", "p-1")
            .await;
        assert!(reason.contains("not a timeout JSON"), "{reason}");
        let payload = env
            .text("SELECT payload FROM dead_letter WHERE order_id = ?", "p-2")
            .await;
        assert!(payload.contains("two words"), "{payload}");
        assert_eq!(env.status("p-1").await, "PENDING", "its message could not be read");
        assert_ne!(env.text("SELECT closed_by FROM orders WHERE id = ?", "ok-1").await, "sweep", "closed by its message");
        // The poisoned message's order closes anyway, by the sweep, once.
        let sweeper = Daemon::start(
            &env.config(ACME, "[sweep]\ninterval = \"200ms\"\ngrace = \"1s\"\n"),
            Clock::Database,
        )
        .await
        .unwrap();
        eventually(Duration::from_secs(30), "the sweep closes the poisoned message's order", || async {
            env.status("p-1").await == "CLOSED"
        })
        .await;
        assert_eq!(env.text("SELECT closed_by FROM orders WHERE id = ?", "p-1").await, "sweep");
        // Operators see it whole and can re-drive it; its order being closed, that changes
        // nothing but the letter's status.
        let api = crate::admin::Api::of(&daemon);
        let id = env.int("SELECT id FROM dead_letter WHERE order_id = ?", "p-1").await;
        let (code, letter) = api.call("GET", &format!("/v1/dead-letters/{id}"), None).await;
        assert_eq!(code, 200, "{letter}");
        assert_eq!(
            (letter["order_id"].as_str(), letter["source"].as_str(), letter["status"].as_str()),
            (Some("p-1"), Some("rocketmq"), Some("OPEN")),
            "{letter}"
        );
        assert_eq!(letter["reason"].as_str(), Some(reason.as_str()), "{letter}");
        assert!(letter["payload"].as_str().is_some_and(|p| p.contains("orderId")), "{letter}");
        assert!(letter["attempts"].as_i64().is_some_and(|n| n >= 1) && letter["created_at_ms"].as_i64().is_some(), "{letter}");
        let (code, redriven) = api.call("POST", &format!("/v1/dead-letters/{id}/redrive"), None).await;
        assert_eq!((code, redriven["order_id"].as_str()), (200, Some("p-1")), "{redriven}");
        eventually(Duration::from_secs(30), "the re-driven trigger is handled", || async {
            env.int("SELECT COUNT(*) FROM order_timeout_msg WHERE status <> 'PROCESSED' AND order_id = ?", "p-1").await == 0
        })
        .await;
        assert_eq!(closes(env, "p-1").await, 1, "closed once");
        assert_eq!(env.text("SELECT status FROM dead_letter WHERE order_id = ?", "p-1").await, "REDRIVEN");
        assert_eq!(api.call("POST", &format!("/v1/dead-letters/{id}/redrive"), None).await.0, 409, "no longer OPEN");
        tx.shutdown().await;
        sweeper.stop().await;
        daemon.stop().await;
    }
);

/// Always answers `ReconsumeLater`: a message that never succeeds.
struct NeverSucceeds;

impl MessageListenerConcurrently for NeverSucceeds {
    fn consume_message(
        &self,
        _messages: &[&MessageExt],
        _context: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        Ok(ConsumeConcurrentlyStatus::ReconsumeLater)
    }
}

with_broker!(
    async fn the_brokers_dlq_is_drained_into_the_dead_letter_table(env) {
        let (topic, group) = names("dlq");
        let config = env.config(
            ACME,
            &format!(
                "[outbox]\nenabled = false\n[sweep]\nenabled = false\n{}",
                section(&topic, &group, "consume = false\nmax_reconsume = 1")
            ),
        );
        let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
        let transport = daemon.broker().unwrap().transport.clone();
        transport
            .start_consumer(&group, &topic, NeverSucceeds)
            .await
            .unwrap();
        let drain = timeoutd::rocketmq::dlq::DlqListener {
            app: tokio::runtime::Handle::current(),
            db: env.db.clone(),
            clock: Clock::Database,
        };
        transport
            .start_consumer(
                &timeoutd::rocketmq::dlq::drain_group(&group),
                &timeoutd::rocketmq::dlq::dlq_topic(&group),
                drain,
            )
            .await
            .unwrap();
        send(&transport, raw(&topic, "stuck-1", b"stuck-1")).await;
        eventually(Duration::from_secs(90), "the DLQ message reaches the table", || async {
            env.int(
                "SELECT COUNT(*) FROM dead_letter WHERE source = ?",
                "rocketmq-dlq",
            )
            .await
                == 1
        })
        .await;
        assert_eq!(
            env.text("SELECT order_id FROM dead_letter WHERE source = ?", "rocketmq-dlq")
                .await,
            "stuck-1"
        );
        daemon.stop().await;
    }
);

/// `scripts/rocketmq <verb>`, which must succeed.
/// Records every message a test consumer group gets.
struct Recorder(Arc<std::sync::Mutex<Vec<Received>>>);

impl MessageListenerConcurrently for Recorder {
    fn consume_message(
        &self,
        messages: &[&MessageExt],
        _context: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        self.0.lock().unwrap().extend(Received::all(messages));
        Ok(ConsumeConcurrentlyStatus::ConsumeSuccess)
    }
}

/// A notice channel of kind `rocketmq`: a closed order's notice is published once on
/// `rocketmq.notification_topic`, keyed by the ledger row's idempotency key and tagged with its
/// template, and the ledger row is DONE.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_closed_orders_notice_is_published_on_the_notification_topic_keyed_by_its_ledger_row() {
    let _broker = broker().await;
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    let (topic, group) = names("notice");
    let config = env.config(
        &[("acme", "builtin:single-phase", &[("channel", "broker")])],
        &format!(
            "[sweep]\nenabled = false\n[notify.channels.broker]\nkind = \"rocketmq\"\n{}",
            section(&topic, &group, "consume = false\nrelay = false")
        ),
    );
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let watcher = sender(&config).await;
    watcher
        .start_consumer(
            &format!("{group}_NOTICES"),
            &format!("{topic}_N"),
            Recorder(seen.clone()),
        )
        .await
        .unwrap();
    let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
    env.create(&order(
        "noticed",
        "acme",
        env.db.now_ms().await.unwrap() - 1_000,
    ))
    .await;
    let key_sql =
        "SELECT idempotency_key FROM effect_ledger WHERE kind = 'notify' AND order_id = ?";
    eventually(
        Duration::from_secs(60),
        "the notice reaches the notification topic",
        || async { !seen.lock().unwrap().is_empty() },
    )
    .await;
    daemon.stop().await;
    let key = env.text(key_sql, "noticed").await;
    assert_eq!(
        env.text(
            "SELECT status FROM effect_ledger WHERE kind = 'notify' AND order_id = ?",
            "noticed"
        )
        .await,
        "DONE"
    );
    let messages = seen.lock().unwrap().clone();
    assert_eq!(messages.len(), 1, "{messages:?}");
    let notice = &messages[0];
    assert_eq!(notice.topic, format!("{topic}_N"));
    assert_eq!(
        notice.keys.as_deref(),
        Some(key.as_str()),
        "keyed by the ledger row's idempotency key"
    );
    assert_eq!(
        notice.properties.get("TAGS").map(String::as_str),
        Some("order-closed"),
        "{:?}",
        notice.properties
    );
    let body: serde_json::Value = serde_json::from_slice(&notice.body).unwrap();
    assert!(body.to_string().contains("noticed"), "{body}");
    watcher.shutdown().await;
    env.cleanup().await;
}

/// `timeoutd arm` as an operator runs it: a PENDING order is armed (its phase-0 row, source
/// `arm`, due at its deadline), a paid and a missing one are rolled back and get no row; one
/// line per order, exit 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_arm_command_arms_a_pending_order_and_rolls_back_the_rest() {
    let _broker = broker().await;
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    let (topic, group) = names("armcli");
    let now = env.db.now_ms().await.unwrap();
    env.create(&order("cli-pending", "acme", now + 600_000))
        .await;
    env.create(&order("cli-paid", "acme", now + 600_000)).await;
    assert!(env.pay("cli-paid", now).await);
    without_rows(&env).await;
    let file = env.dir.path().join("arm.toml");
    std::fs::write(
        &file,
        format!(
            "[database]\nurl = \"{}\"\n[merchants.acme]\nplugin = \"builtin:single-phase\"\n{}",
            env.url,
            section(&topic, &group, "")
        ),
    )
    .unwrap();
    let stdout = crate::support::stdout_of_success(
        tokio::process::Command::new(crate::support::timeoutd_bin())
            .args(["arm", "--config"])
            .arg(&file)
            .args(["cli-pending", "cli-paid", "cli-missing"]),
    )
    .await;
    assert_eq!(
        stdout.lines().collect::<Vec<_>>(),
        vec![
            "cli-pending: Committed",
            "cli-paid: RolledBack",
            "cli-missing: RolledBack"
        ]
    );
    let row = "SELECT due_ms FROM order_timeout_msg WHERE source = 'arm' AND order_id = ?";
    assert_eq!(env.int(row, "cli-pending").await, now + 600_000);
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM order_timeout_msg WHERE order_id <> ?",
            "cli-pending"
        )
        .await,
        0
    );
    env.cleanup().await;
}

fn broker_script(verb: &str) {
    let status = std::process::Command::new(repo_root().join("scripts/rocketmq"))
        .arg(verb)
        .status()
        .unwrap();
    assert!(status.success(), "scripts/rocketmq {verb} failed");
}

/// Starts the broker again when dropped (`start-broker` does nothing when it runs), so a test
/// that fails while the broker is down does not leave it down for the tests after it.
struct RestartBrokerOnDrop;

impl Drop for RestartBrokerOnDrop {
    fn drop(&mut self) {
        let _ = std::process::Command::new(repo_root().join("scripts/rocketmq"))
            .arg("start-broker")
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_broker_down_the_outbox_closes_on_time_and_late_messages_are_no_ops_mariadb() {
    with_the_broker_down(timeoutd::db::Backend::MySql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_broker_down_the_outbox_closes_on_time_and_late_messages_are_no_ops_postgres() {
    with_the_broker_down(timeoutd::db::Backend::Postgres).await;
}

async fn with_the_broker_down(backend: timeoutd::db::Backend) {
    let _broker = broker().await;
    let env = Env::new(backend).await;
    let (topic, group) = names("down");
    let config = env.config(
        ACME,
        &format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n[admin.tokens]\nops = \"down-token-0123456789\"\n{}",
            section(
                &topic,
                &group,
                "fallback_after = \"2s\"\nrelay_lead = \"2s\"\ntimer_lead = \"1s\"",
            )
        ),
    );
    env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
    let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
    let readyz = format!("http://{}/readyz", daemon.admin_addr().unwrap());
    // `/readyz` reports the broker (`ok` / `failing`) without making the daemon unready:
    // closes never depend on it.
    let ready = || async {
        let answer: serde_json::Value = reqwest::get(&readyz).await.unwrap().json().await.unwrap();
        (
            answer["ready"].as_bool().unwrap_or(false),
            answer["broker"].as_str().unwrap_or_default().to_string(),
        )
    };
    let now = env.db.now_ms().await.unwrap();
    let ids: Vec<String> = (0..5).map(|i| format!("down-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        env.create(&order(id, "acme", now + 8_000 + 1_000 * i as i64))
            .await;
    }
    eventually(
        Duration::from_secs(10),
        "the relay publishes every row",
        || async {
            env.int(
                "SELECT COUNT(*) FROM order_timeout_msg WHERE status = 'SENT' AND order_id LIKE ?",
                "down-%",
            )
            .await
                == 5
        },
    )
    .await;
    broker_script("kill-broker");
    let _restart = RestartBrokerOnDrop;
    let down_at = Instant::now();
    // F7: an order armed while the broker is down. Its relay send fails: the row stays PENDING
    // (counted, with the error, retried with backoff) and the outbox timer closes it on time.
    let relay_before = Outcomes::relay();
    let late_deadline = env.db.now_ms().await.unwrap() + 6_000;
    env.create(&order("down-late", "acme", late_deadline)).await;
    eventually(
        Duration::from_secs(30),
        "the outbox closes every order",
        || async {
            let mut all = true;
            for id in &ids {
                all &= env.status(id).await == "CLOSED";
            }
            all
        },
    )
    .await;
    for id in &ids {
        let late = env
            .int(
                "SELECT closed_at_ms - deadline_ms FROM orders WHERE id = ?",
                id,
            )
            .await;
        assert!((0..=3_500).contains(&late), "{id} closed {late} ms late");
        assert_eq!(
            env.text("SELECT closed_by FROM orders WHERE id = ?", id)
                .await,
            "outbox"
        );
    }
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(down_at.elapsed())).await;
    eventually(
        Duration::from_secs(30),
        "the order armed while down closes",
        || async { env.status("down-late").await == "CLOSED" },
    )
    .await;
    assert_eq!(
        env.text("SELECT closed_by FROM orders WHERE id = ?", "down-late")
            .await,
        "outbox"
    );
    let late = env
        .int("SELECT closed_at_ms FROM orders WHERE id = ?", "down-late")
        .await
        - late_deadline;
    assert!(late >= 0, "closed {} ms early", -late);
    assert!(
        env.int(
            "SELECT relay_attempts FROM order_timeout_msg WHERE order_id = ?",
            "down-late"
        )
        .await
            >= 1,
        "the relay never tried (and failed) to publish it"
    );
    assert!(
        Outcomes::relay().since(&relay_before, "failed") > 0,
        "a failed send was not counted"
    );
    assert_eq!(
        ready().await,
        (true, "failing".to_string()),
        "/readyz while the broker is down"
    );
    let before = Outcomes::broker();
    broker_script("start-broker");
    // The broker delivers its late timer messages: each finds its row processed. Counted by
    // delivery, so the test fails if none is ever delivered (then it would prove nothing).
    eventually(
        Duration::from_secs(60),
        "a late message is delivered and handled as a no-op",
        || async { Outcomes::broker().since(&before, "duplicate") >= 1 },
    )
    .await;
    let after = Outcomes::broker();
    assert_eq!(
        after.since(&before, "handled"),
        0,
        "a late message closed something: {after:?}"
    );
    for id in &ids {
        assert_eq!(closes(&env, id).await, 1, "{id} closed once");
    }
    assert_eq!(env.stock("sku-a").await, 100);
    assert_eq!(env.stock("sku-b").await, 100);
    // The next order's row is relayed through the restarted broker: `/readyz` says ok again.
    env.create(&order(
        "down-after",
        "acme",
        env.db.now_ms().await.unwrap() + 600_000,
    ))
    .await;
    eventually(
        Duration::from_secs(30),
        "/readyz reports the broker ok after a send",
        || async { ready().await == (true, "ok".to_string()) },
    )
    .await;
    daemon.stop().await;
    env.cleanup().await;
}

// Seed 003: the payment system's "cancel the timeout" messages on the paid topic. A PENDING
// order becomes PAID once (a duplicate changes nothing), a CLOSED one is a paid-after-close
// recorded once, and a message naming no order or an unknown one is dead-lettered with its
// reason — the queue keeps flowing.
with_broker!(
    async fn paid_messages_align_pending_orders_record_closed_ones_and_dead_letter_the_rest(env) {
        let (topic, group) = names("paid");
        let paid_topic = format!("{topic}_PAID");
        // A merchant of this run alone, so its paid-notice counters count only these messages
        // (on this process's recorder, installed before the daemon emits anything).
        let merchant = format!("paid-{:08x}", fastrand::u32(..));
        let recorder = timeoutd::events::metrics_handle();
        let config = env.config(
            &[(merchant.as_str(), "builtin:single-phase", &[])],
            &format!(
                "[outbox]\nenabled = false\n[sweep]\nenabled = false\n{}",
                section(&topic, &group, &format!("paid_topic = \"{paid_topic}\""))
            ),
        );
        env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
        let now = env.db.now_ms().await.unwrap();
        for id in ["p-text", "p-json", "p-closed"] {
            env.create(&order(id, &merchant, now + 3_600_000)).await;
        }
        without_rows(env).await;
        env.db
            .backend()
            .query("UPDATE orders SET status = 'CLOSED' WHERE id = ?")
            .bind("p-closed")
            .execute(env.db.pool())
            .await
            .unwrap();
        let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
        let tx = sender(&config).await;
        send(&tx, raw(&paid_topic, "p-text", b"p-text")).await;
        let bean = br#"{"orderId":"p-json","activityId":null,"userId":"user-of-p-json","createTime":1}"#;
        send(&tx, raw(&paid_topic, "p-json", bean)).await;
        send(&tx, raw(&paid_topic, "p-text", b"p-text")).await;
        send(&tx, raw(&paid_topic, "p-closed", b"p-closed")).await;
        send(&tx, raw(&paid_topic, "nobody", b"nobody")).await;
        send(&tx, raw(&paid_topic, "junk", b"{\"orderId\": ")).await;
        let dead = "SELECT COUNT(*) FROM dead_letter WHERE source = 'rocketmq-paid' AND reason <> ?";
        eventually(Duration::from_secs(60), "every paid message is applied or dead-lettered", || async {
            env.status("p-text").await == "PAID"
                && env.status("p-json").await == "PAID"
                && env.int("SELECT COUNT(*) FROM paid_after_close WHERE order_id = ?", "p-closed").await == 1
                && env.int(dead, "").await == 2
        })
        .await;
        assert_eq!(env.coupon("cpn-p-text").await, "USED");
        assert_eq!(env.text("SELECT source FROM paid_after_close WHERE order_id = ?", "p-closed").await, "paid-message");
        assert_eq!(env.text("SELECT reason FROM dead_letter WHERE source = 'rocketmq-paid' AND order_id = ?", "nobody").await, "paid notice for order `nobody`, which does not exist");
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (94, 97), "paid orders keep their stock");
        assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE order_id <> ?", "").await, 0, "no timeout decided anything");
        // The repeated p-text message was consumed too, and found the order paid: counted as a
        // duplicate, beside the two alignments and the paid-after-close (each exactly once; a
        // batch the broker delivers again after a transient failure adds only duplicates and
        // repeats).
        let counted = |outcome: &str| {
            let series = format!("timeoutd_paid_notices_total{{merchant=\"{merchant}\",source=\"paid-message\",outcome=\"{outcome}\"}}");
            crate::support::sample(&recorder.render(), &series)
        };
        eventually(Duration::from_secs(30), "the repeated paid message is consumed", || async {
            counted("duplicate").is_some_and(|n| n >= 1.0)
        })
        .await;
        assert_eq!(["aligned", "after-close"].map(counted), [Some(2.0), Some(1.0)]);
        assert_eq!(env.status("p-text").await, "PAID", "the repeat changed nothing");
        assert_eq!(env.int("SELECT COUNT(*) FROM paid_after_close WHERE order_id <> ?", "").await, 1);
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (94, 97));
        tx.shutdown().await;
        daemon.stop().await;
    }
);

// Seed 003's race, on the real broker, 1,000 times per backend: for each lapsed order the
// timeout message and the payment system's paid message are sent at once, from two producers.
// Whatever order they arrive in, every order ends PAID or CLOSED, a PAID order was never
// closed, a CLOSED one was closed once and — when its paid message lost the race — recorded
// once as paid-after-close; SQL stock is exactly conserved.
with_broker!(
    async fn a_paid_message_racing_the_timeout_message_never_closes_a_paid_order(env) {
    const N: usize = 1_000;
    let (topic, group) = names("race");
    let paid_topic = format!("{topic}_PAID");
    let config = env.config(
        ACME,
        &format!(
            "[outbox]\nenabled = false\n[sweep]\nenabled = false\n{}",
            section(&topic, &group, &format!("paid_topic = \"{paid_topic}\""))
        ),
    );
    env.stock_up(&[("sku-a", 10 * N as i64), ("sku-b", 10 * N as i64)])
        .await;
    let now = env.db.now_ms().await.unwrap();
    let ids: Vec<String> = (0..N).map(|i| format!("race-{i:04}")).collect();
    for id in &ids {
        env.create(&order(id, "acme", now - 1_000)).await;
    }
    without_rows(env).await;
    let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
    let (timeouts, paid) = (sender(&config).await, sender_as(&config, "PAYER").await);
    let send_all = |t: Arc<Transport>, topic: String, ids: Vec<String>| async move {
        for id in ids {
            send(&t, raw(&topic, &id, id.as_bytes())).await;
        }
    };
    // The payer sends in reverse order, so early orders mostly lose the race and late ones win.
    let mut reversed = ids.clone();
    reversed.reverse();
    tokio::join!(
        send_all(timeouts.clone(), topic.clone(), ids.clone()),
        send_all(paid.clone(), paid_topic.clone(), reversed),
    );
    eventually(
        Duration::from_secs(180),
        "every order is settled",
        || async {
            env.int(
                "SELECT COUNT(*) FROM orders WHERE status = 'PENDING' AND id <> ?",
                "",
            )
            .await
                == 0
                && env
                    .int(
                        "SELECT COUNT(*) FROM paid_after_close WHERE order_id <> ?",
                        "",
                    )
                    .await
                    == env
                        .int(
                            "SELECT COUNT(*) FROM orders WHERE status = 'CLOSED' AND id <> ?",
                            "",
                        )
                        .await
        },
    )
    .await;
    let count = |sql: &'static str| env.int(sql, "");
    let paid_orders = count("SELECT COUNT(*) FROM orders WHERE status = 'PAID' AND id <> ?").await;
    let closed = count("SELECT COUNT(*) FROM orders WHERE status = 'CLOSED' AND id <> ?").await;
    assert_eq!(paid_orders + closed, N as i64);
    assert_eq!(
        count("SELECT COUNT(*) FROM decision_log d JOIN orders o ON o.id = d.order_id WHERE o.status = 'PAID' AND d.outcome = 'closed' AND d.order_id <> ?").await,
        0,
        "a PAID order was never closed"
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM decision_log WHERE outcome = 'closed' AND order_id <> ?").await,
        closed,
        "each CLOSED order closed once"
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM (SELECT order_id FROM paid_after_close GROUP BY order_id HAVING COUNT(*) > 1) x WHERE order_id <> ?").await,
        0
    );
    assert_eq!(
        count("SELECT COUNT(*) FROM dead_letter WHERE order_id <> ?").await,
        0
    );
    // Every order took 2 × sku-a and 1 × sku-b; only the closed gave theirs back.
    assert_eq!(env.stock("sku-a").await, 10 * N as i64 - 2 * paid_orders);
    assert_eq!(env.stock("sku-b").await, 10 * N as i64 - paid_orders);
    eprintln!("race: {paid_orders} paid first, {closed} closed first (then paid after close)");
    timeouts.shutdown().await;
    paid.shutdown().await;
    daemon.stop().await;
    }
);

/// Seed 002's check-back as the payment poller, through the real broker: half messages whose
/// outcome is lost are checked back by the broker, and each check asks the provider. The order
/// the provider says is paid is rolled back at its first check; the unpaid one is unknown until
/// the plugin's maximum of checks (3), then committed — the provider asked at every check.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_check_backs_poll_the_payment_provider() {
    let _broker = broker().await;
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    let (topic, group) = names("cbpay");
    let provider = crate::fakes::Provider::start().await;
    provider
        .books
        .lock()
        .unwrap()
        .paid
        .insert("pay-cb-paid".into());
    let config = env.config(
        ACME,
        &format!(
            "[payment]\nbase_url = \"{}\"\nattempts = 1\n{}",
            provider.base_url,
            section(&topic, &group, "")
        ),
    );
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    let now = env.db.now_ms().await.unwrap();
    for id in ["cb-paid", "cb-unpaid"] {
        env.create(&order(id, "acme", now + 600_000)).await;
    }
    let gateway =
        timeoutd::effects::HttpPaymentGateway::new(config.payment.as_ref().unwrap()).unwrap();
    let query: Arc<dyn timeoutd::dispatch::PaymentQuery> = Arc::new(gateway);
    let listener = UnknownFirst(
        ArmListener::new(
            tokio::runtime::Handle::current(),
            env.db.clone(),
            Clock::Database,
            timeoutd::policies::load(&config).unwrap(),
        )
        .with_payments(Some(query)),
    );
    let before = Outcomes::of("timeoutd_check_backs_total");
    let (transport, arming) = lone_transaction_producer(&config, "PAY", listener).await;
    for id in ["cb-paid", "cb-unpaid"] {
        assert_eq!(arm(&arming, id).await, Armed::Unknown);
    }
    let queries = |r: &str| provider.books.lock().unwrap().calls_for("query", r);
    eventually(
        Duration::from_secs(120),
        "the broker checks both back until each is resolved",
        || async {
            let now = Outcomes::of("timeoutd_check_backs_total");
            now.since(&before, "rollback") >= 1 && now.since(&before, "commit") >= 1
        },
    )
    .await;
    assert_eq!(
        queries("pay-cb-paid"),
        1,
        "paid at its first check: rolled back"
    );
    let after = Outcomes::of("timeoutd_check_backs_total");
    let unknown = after.since(&before, "unknown");
    assert!(unknown >= 2, "unknown until the maximum: {after:?}");
    assert_eq!(
        queries("pay-cb-unpaid") as u64,
        unknown + 1,
        "the provider asked at every check, the committing one too"
    );
    assert_eq!(
        env.status("cb-paid").await,
        "PENDING",
        "a check-back writes nothing"
    );
    transport.shutdown().await;
    env.cleanup().await;
}

/// A timeout message carrying a W3C `traceparent` property continues the producer's trace:
/// `timeoutd run` with `[tracing]` exports the message's trigger span to the collector under
/// the producer's trace id.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_messages_traceparent_continues_its_trace_into_the_trigger_span() {
    let _broker = broker().await;
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    let (topic, group) = names("traced");
    let collector = crate::fakes::Collector::start().await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    let now = env.db.now_ms().await.unwrap();
    env.create(&order("traced-1", "acme", now - 1_000)).await;
    without_rows(&env).await;
    let file = env.dir.path().join("traced.toml");
    std::fs::write(
        &file,
        format!(
            "[database]\nurl = \"{}\"\n[outbox]\nenabled = false\n[sweep]\nenabled = false\n{}\
             [tracing]\notlp_endpoint = \"{}\"\n[merchants.acme]\nplugin = \"builtin:single-phase\"\n",
            env.url,
            section(&topic, &group, ""),
            collector.url
        ),
    )
    .unwrap();
    let log = env.dir.path().join("timeoutd.log");
    let mut daemon = crate::support::started_daemon(&file, &[], &log).await;
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let config = env.config(ACME, &section(&topic, &group, ""));
    let tx = sender(&config).await;
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let m = Message::builder()
        .topic(&topic)
        .key("traced-1")
        .body(b"traced-1".to_vec())
        .raw_property("traceparent", format!("00-{trace_id}-b7ad6b7169203331-01"))
        .unwrap()
        .build()
        .unwrap();
    send(&tx, m).await;
    eventually(
        Duration::from_secs(60),
        "the message closes its order",
        || async { env.status("traced-1").await == "CLOSED" },
    )
    .await;
    tx.shutdown().await;
    let exit = crate::support::sigterm(&mut daemon, Duration::from_secs(15)).await;
    assert!(exit.success(), "{exit:?}\n{}", read());
    // The trigger span is the producer's span's child, in the producer's trace: not a new root.
    let spans = collector.spans(trace_id);
    assert!(
        spans
            .iter()
            .any(|s| s.name.contains("trigger") && s.parent_span_id == "b7ad6b7169203331"),
        "no trigger span under the producer's span: {spans:#?}\nlog:\n{}",
        read()
    );
    env.cleanup().await;
}

/// `timeoutd doctor` reads the broker: with a daemon consuming topic T1 in group G, a config
/// that would consume T2 in the same group G is an error (a consumer group's members must share
/// one subscription), and T2, never created, has no route; the daemon's own config is fine.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn doctor_finds_a_consumer_group_shared_with_another_subscription() {
    let _broker = broker().await;
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    let (topic, group) = names("doctor");
    let daemon_config = env.config(ACME, &section(&topic, &group, ""));
    let daemon = Daemon::start(&daemon_config, Clock::Database)
        .await
        .unwrap();
    let write = |name: &str, topic: &str| {
        let file = env.dir.path().join(name);
        std::fs::write(
            &file,
            format!(
                "[database]\nurl = \"{}\"\n{}[merchants.acme]\nplugin = \"builtin:single-phase\"\n",
                env.url,
                section(topic, &group, "")
            ),
        )
        .unwrap();
        file
    };
    let run = crate::support::doctor;
    // The daemon's consumer joins its group within a rebalance or two.
    let own = write("own.toml", &topic);
    let mut report = String::new();
    for _ in 0..30 {
        report = run(own.clone()).await.1;
        if report.contains("client(s), all subscribed") {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        report.contains(&format!(
            "ok    rocketmq.consumer_group: {group}: 1 client(s), all subscribed to {topic} (*)"
        )),
        "{report}"
    );
    assert!(
        report.contains(&format!("ok    rocketmq.topics: {topic}: ")),
        "{report}"
    );
    let other_topic = format!("{topic}_OTHER");
    let (code, report) = run(write("shared.toml", &other_topic)).await;
    assert_eq!(code, Some(1), "{report}");
    assert!(report.contains(&format!("error rocketmq.consumer_group: {group}: 1 client(s) share the group, subscribed to {topic} (*)")), "{report}");
    assert!(
        report.contains(&format!("warn  rocketmq.topics: {other_topic}: no route")),
        "{report}"
    );
    daemon.stop().await;
    env.cleanup().await;
}

/// `delay_mode = "auto"` on a broker that refuses a timer message. The broker here refuses a
/// delay past its `timerMaxDelaySec` (3 days, `config/rocketmq/broker.toml`), so with
/// `timer_max = "10d"` a message due in 4 days is a real refusal: in `timer` mode the send
/// fails; in `auto` mode the same message is re-sent as the longest delay level (18, 2 h), and
/// the process keeps to levels for `TIMER_REPROBE_MS` (10 minutes), then tries timers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_mode_falls_back_to_delay_levels_when_the_broker_refuses_a_timer_message() {
    use timeoutd::rocketmq::Scheduled;
    use timeoutd::rocketmq::codec::{TimeoutMessage, Wakeup};
    use timeoutd::rocketmq::planner::Hop;
    let _broker = broker().await;
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    let (topic, group) = names("auto");
    let config = |mode: &str| {
        env.config(
            ACME,
            &section(
                &topic,
                &group,
                &format!("delay_mode = \"{mode}\"\ntimer_max = \"10d\"\n"),
            ),
        )
    };
    let now = env.db.now_ms().await.unwrap();
    let (near, far) = (now + 60_000, now + 4 * 24 * 3_600_000);
    let message = |due_ms: i64| {
        Wakeup::Order(TimeoutMessage {
            order_id: "auto-1".to_string(),
            phase: 0,
            due_ms: Some(due_ms),
            row_id: None,
            hop: 0,
        })
    };
    let hop = |scheduled: Result<Scheduled, _>| match scheduled {
        Ok(Scheduled::Sent { hop, .. }) => Ok(hop),
        other => Err(format!("{other:?}")),
    };
    let auto = sender_as(&config("auto"), "AUTO").await;
    // Accepted as a timer while the broker takes timers (retried while the topic is created).
    let mut first = Err(String::new());
    for _ in 0..10 {
        first = hop(auto.schedule(&message(near), now).await);
        if first.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        matches!(first, Ok(Hop::Timer(_))),
        "a near message goes as a timer message: {first:?}"
    );
    let timer = sender_as(&config("timer"), "TIMER").await;
    assert!(
        timer.schedule(&message(far), now).await.is_err(),
        "the broker refuses a timer message past its timerMaxDelaySec"
    );
    assert_eq!(
        hop(auto.schedule(&message(far), now).await),
        Ok(Hop::Level(18)),
        "auto: the refused timer message is re-sent as the longest level"
    );
    assert!(
        matches!(
            hop(auto.schedule(&message(near), now).await),
            Ok(Hop::Level(_))
        ),
        "auto keeps to levels once a timer message was refused"
    );
    let later = now + timeoutd::rocketmq::client::TIMER_REPROBE_MS;
    assert!(
        matches!(
            hop(auto.schedule(&message(later + 60_000), later).await),
            Ok(Hop::Timer(_))
        ),
        "auto tries timers again once the re-probe period is over"
    );
    env.cleanup().await;
}

/// Seed 000's and seed 001's timeout messages on mall's own tables (`[database.shop]`): the
/// text body `3002` and the JSON bean `{"orderId": 3001, …}` (mall's `Long` id) each close
/// their mall order once through the broker; the same message again changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seed_messages_carrying_malls_long_ids_close_malls_own_orders() {
    use crate::shop::{Mall, Placed};
    let _broker = broker().await;
    let mall = Mall::new().await;
    let now = mall.env.db.now_ms().await.unwrap();
    mall.stock_up(&[601], 100).await;
    for (id, member) in [(3001, 31), (3002, 32)] {
        mall.member(member, 5, &[]).await;
        mall.place(&Placed {
            id,
            member,
            coupon: None,
            points: Some(5),
            lines: &[(601, 2, "6.00")],
            created_ms: now - 16 * 60_000,
            status: 0,
            deleted: 0,
        })
        .await;
    }
    let (topic, group) = names("mall");
    let config = mall.config(&format!(
        "[outbox]\nenabled = false\n[sweep]\nenabled = false\n{}",
        section(&topic, &group, "")
    ));
    let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
    let tx = sender(&config).await;
    let json = format!(
        r#"{{"orderId":3001,"userId":31,"createTime":{}}}"#,
        now - 16 * 60_000
    );
    for (key, body) in [("3001", json.as_bytes()), ("3002", b"3002".as_slice())] {
        send(&tx, raw(&topic, key, body)).await;
    }
    eventually(
        Duration::from_secs(60),
        "both mall orders closed",
        || async { mall.status(3001).await == 4 && mall.status(3002).await == 4 },
    )
    .await;
    send(&tx, raw(&topic, "3001", json.as_bytes())).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        mall.locked(601).await,
        0,
        "both orders' 2 units released once"
    );
    assert_eq!(
        (mall.points(31).await, mall.points(32).await),
        (5, 5),
        "the 5 points each spent are back, once"
    );
    assert_eq!(
        mall.env
            .int(
                "SELECT COUNT(*) FROM decision_log WHERE outcome = ?",
                "closed"
            )
            .await,
        2
    );
    daemon.stop().await;
    mall.cleanup().await;
}
