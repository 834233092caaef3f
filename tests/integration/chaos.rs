//! The chaos run (`scripts/chaos`; ignored in the normal suite). Three `timeoutd run` daemons
//! on one database, reached through a TCP proxy the run can cut; a private Redis with its
//! append-only file on (so a restart keeps what it acknowledged); a webhook receiver that fails
//! 20 % of requests and hangs on 5 %; a payment-provider stub answering 503 in bursts. An order
//! generator makes a flash-sale mix — coupons, flash-sale slots, about 40 % paid at random
//! moments and right at the deadline, some through the paid callback and some only at the
//! provider — for three merchants (single-phase, two-phase, and one whose plugin file is
//! swapped mid-run). Meanwhile: a daemon is SIGKILLed every 5–15 s and restarted, Redis is
//! SIGKILLed and restarted once, the database is cut off for 10 s once. Then every daemon runs
//! fault-free until the work settles, and the audit fails the run on any violation.
//!
//! With `TIMEOUTD_CHAOS_BROKER=1` (`scripts/chaos --broker`) the daemons also relay their rows
//! as RocketMQ timer messages and consume them (a topic and consumer group of the run's own, on
//! the broker at `$TIMEOUTD_ROCKETMQ_NAMESRV`), and the broker is SIGKILLed once and restarted
//! (`scripts/rocketmq kill-broker`, `start-broker`).
//!
//! Knobs (environment): `TIMEOUTD_CHAOS_SECONDS` (faulted time, default 120),
//! `TIMEOUTD_CHAOS_ORDERS` (default 3000), `TIMEOUTD_CHAOS_SETTLE_SECONDS` (default 180),
//! `TIMEOUTD_CHAOS_BROKER` (0 or 1, default 0).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use redis::AsyncCommands;
use serde_json::{Value, json};
use timeoutd::db::{Backend, Db};
use timeoutd_runtime::model::{Order, OrderItem, OrderStatus};
use tokio::process::{Child, Command};

use crate::fakes::{Provider, Proxy};
use crate::redis_server::PrivateRedis;
use crate::support::{Env, free_port, timeoutd_bin};

pub(crate) const SKUS: usize = 20;
pub(crate) const UNITS_PER_SKU: i64 = 1_000_000;
pub(crate) const FLASH_ACTIVITY: &str = "chaos-sale";
pub(crate) const FLASH_UNITS: i64 = 1_000_000;
/// The two-phase merchants' grace (`flashy`, and `swap` once swapped).
const GRACE_MS: i64 = 2_000;

pub(crate) fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the chaos run: scripts/chaos"]
async fn mariadb() {
    run(Backend::MySql, Topology::Single("127.0.0.1:3306")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the chaos run: scripts/chaos"]
async fn postgres() {
    run(Backend::Postgres, Topology::Single("127.0.0.1:5432")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the chaos run: scripts/chaos --backend shards"]
async fn shards() {
    run(Backend::MySql, Topology::Shards("127.0.0.1:3306")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the chaos run: scripts/chaos --backend galera"]
async fn galera() {
    run(Backend::MySql, Topology::Galera).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the chaos run: scripts/chaos --backend patroni"]
async fn patroni() {
    run(Backend::Postgres, Topology::Patroni).await;
}

// ---------------------------------------------------------------------------------------------
// Where the database is, and how it fails.

/// The database the run's daemons use, and the one database fault the run injects.
#[derive(Debug, Clone, Copy)]
enum Topology {
    /// One server (`host:port`) behind a [`Proxy`]; the fault: cut off for 10 s.
    Single(&'static str),
    /// Two databases on one server (`host:port`, behind a [`Proxy`]) as the two shards of one
    /// order database (`[[database.shards]]`, `hash_mod`): every daemon runs the sharded
    /// config, the shop writes each order to its shard, the audit runs across both; the fault:
    /// cut off for 10 s (both shards at once).
    Shards(&'static str),
    /// A three-node MariaDB Galera cluster (`scripts/galera`, its directory in
    /// `TIMEOUTD_GALERA_DIR`), daemon i on node i + 1 (127.0.0.1:3411…3413), the shop and the
    /// audit on node 1; the fault: node 3 SIGKILLed (a crashed host) and restarted 10 s later,
    /// rejoining by IST.
    Galera,
    /// PostgreSQL under Patroni (`scripts/patroni`, its directory in `TIMEOUTD_PATRONI_DIR`):
    /// a primary and a synchronous replica behind HAProxy (127.0.0.1:5440), which every daemon
    /// and the shop use; the fault: the primary's host crashes (Patroni and PostgreSQL
    /// SIGKILLed), the replica is promoted, and the old primary rejoins as a replica later.
    Patroni,
}

/// A Galera node's or the Patroni HAProxy's address.
const GALERA_NODES: [&str; 3] = ["127.0.0.1:3411", "127.0.0.1:3412", "127.0.0.1:3413"];
const PATRONI_HAPROXY: &str = "127.0.0.1:5440";

impl Topology {
    /// The server the run's database is made on.
    fn server_url(self, backend: Backend) -> String {
        match self {
            Topology::Single(_) | Topology::Shards(_) => crate::support::server_url(backend),
            Topology::Galera => format!("mysql://root@{}/test", GALERA_NODES[0]),
            Topology::Patroni => format!("postgres://postgres@{PATRONI_HAPROXY}/postgres"),
        }
    }

    /// The cluster's directory (scripts/galera or scripts/patroni), from the environment
    /// scripts/chaos sets.
    fn dir(self) -> String {
        let var = match self {
            Topology::Single(_) | Topology::Shards(_) => return String::new(),
            Topology::Galera => "TIMEOUTD_GALERA_DIR",
            Topology::Patroni => "TIMEOUTD_PATRONI_DIR",
        };
        std::env::var(var).unwrap_or_else(|_| {
            panic!("{var} is not set: scripts/chaos --backend {self:?} starts the cluster")
        })
    }

    /// `scripts/galera|patroni VERB DIR [ARGS]`, asserted to succeed.
    async fn script(self, verb: &str, args: &[&str]) {
        let name = match self {
            Topology::Single(_) | Topology::Shards(_) => return,
            Topology::Galera => "galera",
            Topology::Patroni => "patroni",
        };
        let ok = Command::new(crate::support::repo_root().join("scripts").join(name))
            .arg(verb)
            .arg(self.dir())
            .args(args)
            .stdout(std::process::Stdio::null())
            .status()
            .await
            .is_ok_and(|s| s.success());
        assert!(ok, "scripts/{name} {verb} failed");
    }
}

// ---------------------------------------------------------------------------------------------
// The database, behind a proxy that can be cut.

// ---------------------------------------------------------------------------------------------
// The webhook receiver: 20 % fail, 5 % hang.

#[derive(Default)]
pub(crate) struct Deliveries {
    /// Share of requests answered 500, percent.
    fail_percent: u8,
    /// Share of requests left hanging for 5 s and then answered 503, percent.
    hang_percent: u8,
    /// Requests answered 2xx, by idempotency key: how many times.
    accepted: HashMap<String, u32>,
    /// Logical notices accepted: (order, template) → the distinct keys they came under.
    notices: HashMap<(String, String), BTreeSet<String>>,
    failed: u32,
    hung: u32,
}

pub(crate) type Inbox = Arc<Mutex<Deliveries>>;

/// A webhook receiver on a free loopback port that fails `fail_percent` of requests and hangs
/// on `hang_percent`; returns its URL and what it accepted.
pub(crate) async fn start_receiver(fail_percent: u8, hang_percent: u8) -> (String, Inbox) {
    let inbox: Inbox = Arc::new(Mutex::new(Deliveries {
        fail_percent,
        hang_percent,
        ..Deliveries::default()
    }));
    let app = Router::new()
        .route("/hook", post(flaky_hook))
        .with_state(inbox.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}/hook"), inbox)
}

async fn flaky_hook(
    State(inbox): State<Inbox>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> StatusCode {
    let roll = fastrand::u8(0..100);
    let (hang, fail) = {
        let d = inbox.lock().unwrap();
        (
            d.hang_percent,
            d.hang_percent.saturating_add(d.fail_percent),
        )
    };
    if roll < hang {
        inbox.lock().unwrap().hung += 1;
        tokio::time::sleep(Duration::from_secs(5)).await;
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    let mut d = inbox.lock().unwrap();
    if roll < fail {
        d.failed += 1;
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    *d.accepted.entry(key.clone()).or_default() += 1;
    let order = body["order"].as_str().unwrap_or_default().to_string();
    let template = body["template"].as_str().unwrap_or_default().to_string();
    d.notices.entry((order, template)).or_default().insert(key);
    StatusCode::NO_CONTENT
}

// ---------------------------------------------------------------------------------------------
// The daemons.

pub(crate) struct Daemons {
    pub(crate) configs: Vec<PathBuf>,
    pub(crate) http_ports: Vec<u16>,
    pub(crate) children: Vec<Option<Child>>,
    pub(crate) logs: PathBuf,
    pub(crate) kills: u32,
}

impl Daemons {
    pub(crate) fn start(&mut self, i: usize) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.logs.join(format!("daemon-{i}.log")))
            .unwrap();
        let child = Command::new(timeoutd_bin())
            .args(["run", "--config"])
            .arg(&self.configs[i])
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        self.children[i] = Some(child);
    }

    async fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.children[i].take() {
            let _ = child.kill().await;
            self.kills += 1;
        }
    }

    pub(crate) async fn stop_all(&mut self) {
        for child in self.children.iter_mut().filter_map(Option::take) {
            if let Some(pid) = child.id() {
                let _ = std::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status();
            }
            let mut child = child;
            if tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
    }
}

/// The `[rocketmq]` section of a broker run: a topic and groups of this run's own; rows due more
/// than 2 s ahead are relayed as timer messages, the outbox timer takes back a relayed row 3 s
/// past its due time.
fn broker_section(namesrv: &str, tag: &str) -> String {
    format!(
        "[rocketmq]\nnamesrv = \"{namesrv}\"\ntopic = \"CHAOS_{tag}\"\n\
         consumer_group = \"CHAOS_{tag}_G\"\nproducer_group = \"CHAOS_{tag}_P\"\n\
         transaction_group = \"CHAOS_{tag}_TX\"\nnotification_topic = \"CHAOS_{tag}_N\"\n\
         relay_lead = \"2s\"\ntimer_lead = \"1s\"\nfallback_after = \"3s\"\nconsume_from = \"first\"\n\
         send_timeout = \"3s\"\n"
    )
}

/// `scripts/rocketmq VERB` (the broker's store and ports from the environment scripts/chaos set).
async fn broker_script(verb: &str) -> bool {
    Command::new(crate::support::repo_root().join("scripts/rocketmq"))
        .arg(verb)
        .stdout(std::process::Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}

/// A daemon's config: `database` (its `url` line or shard tables), the run's Redis, provider
/// and webhook receiver, its HTTP port, the three merchants (`swap` on the file
/// `swap_plugin`), then `extra`: more `[redis]` keys up to its first header, then sections (a
/// broker's; the soak's marker TTL, retention and admin).
#[allow(clippy::too_many_arguments)]
pub(crate) fn daemon_config(
    database: &str,
    redis_url: &str,
    provider: &str,
    receiver: &str,
    http_port: u16,
    swap_plugin: &Path,
    extra: &str,
) -> String {
    format!(
        r#"[database]
max_connections = 8
migrate = false
{database}[outbox]
lease = "5s"
idle_recheck = "200ms"
[sweep]
interval = "2s"
grace = "3s"
[effects]
retry_initial = "100ms"
retry_max = "1s"
max_attempts = 60
lease = "5s"
[dispatch]
retry_initial = "100ms"
retry_max = "1s"
{stock}[payment]
base_url = "{provider}"
timeout = "1s"
unknown_max_wait = "5s"
[notify.channels.hook]
kind = "webhook"
url = "{receiver}"
timeout = "1s"
[http]
listen = "127.0.0.1:{http_port}"
[runtime]
deadline = "2s"
watch_plugins = "1s"
[merchants.solo]
plugin = "builtin:single-phase"
[merchants.solo.settings]
channel = "hook"
[merchants.flashy]
plugin = "builtin:two-phase"
[merchants.flashy.settings]
grace = "2s"
channel = "hook"
[merchants.swap]
plugin = "{swap}"
[merchants.swap.settings]
grace = "2s"
channel = "hook"
[redis]
url = "{redis_url}"
{extra}"#,
        swap = swap_plugin.display(),
        stock = stock_mode_table()
    )
}

/// `[dispatch.stock]` as `TIMEOUTD_STOCK_MODE` asks (`journal`; `scripts/chaos --stock journal`,
/// `scripts/soak --stock journal`), else nothing: the default, `direct`.
fn stock_mode_table() -> String {
    match std::env::var("TIMEOUTD_STOCK_MODE").as_deref() {
        Ok("journal") => "[dispatch.stock]\nmode = \"journal\"\n".to_string(),
        Ok("direct") | Err(_) => String::new(),
        Ok(other) => panic!("TIMEOUTD_STOCK_MODE is `direct` or `journal`, not `{other}`"),
    }
}

// ---------------------------------------------------------------------------------------------
// The orders.

/// How an order's buyer behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Paid through the paid callback at a random moment in the window.
    CallbackEarly,
    /// Paid through the paid callback right at the deadline, racing the close.
    CallbackAtDeadline,
    /// Paid at the provider only; the daemon must find it there.
    AtProvider,
    /// Never paid.
    Abandon,
}

pub(crate) fn fate() -> Fate {
    match fastrand::u8(0..100) {
        0..22 => Fate::CallbackEarly,
        22..30 => Fate::CallbackAtDeadline,
        30..40 => Fate::AtProvider,
        _ => Fate::Abandon,
    }
}

pub(crate) fn new_order(n: usize, now: i64) -> Order {
    let merchant = ["solo", "flashy", "swap"][n % 3];
    let flash = merchant == "flashy" && fastrand::bool();
    let id = format!("c-{n:06}");
    let items: Vec<OrderItem> = (0..fastrand::usize(1..=2))
        .map(|_| OrderItem {
            sku: format!("sku-{:02}", fastrand::usize(0..SKUS)),
            quantity: fastrand::u32(1..=3),
            unit_price_cents: fastrand::i64(100..=5_000),
        })
        .collect();
    Order {
        total_cents: items
            .iter()
            .map(|i| i.unit_price_cents * i64::from(i.quantity))
            .sum(),
        // A flash-sale buyer buys once: one user per flash order keeps the buyer set exact.
        user: if flash {
            format!("fu-{n:06}")
        } else {
            format!("u-{:04}", fastrand::u32(0..500))
        },
        coupon: (fastrand::u8(0..10) < 3).then(|| format!("cpn-{id}")),
        flash_activity: flash.then(|| FLASH_ACTIVITY.to_string()),
        payment_ref: Some(format!("pay-{id}")),
        merchant: merchant.to_string(),
        status: OrderStatus::Pending,
        created_at_ms: now,
        deadline_ms: now + fastrand::i64(4_000..=12_000),
        items,
        id,
    }
}

/// The order service's part for a flash-sale order: take the buyer's slot and the units in
/// Redis before the order exists, as one Lua script that takes the units only when the slot is
/// new. Retried across a Redis restart, and a retry must not take the units twice: with
/// `appendfsync always` a script can be applied and persisted and its reply lost to the SIGKILL
/// (a plain `DECRBY` retried that way left the stock 5 units low in one chaos run).
pub(crate) async fn reserve_flash(redis: &redis::Client, order: &Order) {
    const RESERVE_ONCE: &str = r"
if redis.call('SADD', KEYS[2], ARGV[1]) == 1 then
  redis.call('DECRBY', KEYS[1], ARGV[2])
end
return 1
";
    let units: i64 = order.items.iter().map(|i| i64::from(i.quantity)).sum();
    let script = redis::Script::new(RESERVE_ONCE);
    for _ in 0..100 {
        if let Ok(mut c) = redis.get_multiplexed_async_connection().await {
            let done: redis::RedisResult<i64> = script
                .key(format!("activity:{{{FLASH_ACTIVITY}}}:stock"))
                .key(format!("activity:{{{FLASH_ACTIVITY}}}:users"))
                .arg(&order.user)
                .arg(units)
                .invoke_async(&mut c)
                .await;
            if done.is_ok() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("Redis never came back for {}", order.id);
}

/// Writes the order as the order service does — its coupon, the order, its stock and its phase-0
/// outbox row, in one transaction — straight to the database (not through the proxy: the shop
/// is not what is under test), retried for up to a minute as an order service must: when the
/// database picks it as a deadlock victim (its stock rows against a close giving the same SKUs
/// back; on Galera, a certification conflict), and while a Galera node or a Patroni primary is
/// replaced. A commit whose answer was lost may have landed: a retry first looks for the order.
pub(crate) async fn create(db: &Db, order: &Order) {
    let mut last = None;
    let until = Instant::now() + Duration::from_secs(60);
    let mut attempt = 0u64;
    while Instant::now() < until {
        if attempt > 0 {
            let found = db
                .backend()
                .query("SELECT COUNT(*) FROM orders WHERE id = ?")
                .bind(&order.id)
                .fetch_one(db.pool())
                .await
                .map(|r| sqlx::Row::get::<i64, _>(&r, 0));
            if matches!(found, Ok(1)) {
                return;
            }
        }
        let written = async {
            let mut tx = db.begin().await?;
            if let Some(c) = &order.coupon {
                db.backend()
                    .query("INSERT INTO coupons (id, user_id, status) VALUES (?, ?, 'AVAILABLE')")
                    .bind(c)
                    .bind(&order.user)
                    .execute(&mut *tx)
                    .await?;
            }
            timeoutd::db::orders::create(&mut tx, order).await?;
            tx.commit().await?;
            Ok::<(), timeoutd::db::DbError>(())
        }
        .await;
        match written {
            Ok(()) => return,
            Err(e) => last = Some(e),
        }
        attempt += 1;
        tokio::time::sleep(Duration::from_millis((10 * attempt).min(500))).await;
    }
    panic!(
        "the shop could not write {} in a minute: {last:?}",
        order.id
    );
}

/// The database clock, retried for up to a minute (across a Galera node's or a primary's
/// replacement).
pub(crate) async fn db_now(db: &Db) -> i64 {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        match db.now_ms().await {
            Ok(now) => return now,
            Err(e) if Instant::now() > until => panic!("the database clock: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The payment system's paid callback to any live daemon, retried until one answers.
pub(crate) async fn paid_callback(http: &reqwest::Client, ports: &[u16], id: &str) {
    for round in 0..200 {
        let port = ports[(round + fastrand::usize(..)) % ports.len()];
        let answer = http
            .post(format!("http://127.0.0.1:{port}/v1/payments/{id}/paid"))
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        if answer.is_ok_and(|a| a.status().is_success()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("chaos: the paid callback of {id} was never answered");
}

// ---------------------------------------------------------------------------------------------
// The run.

async fn run(backend: Backend, topology: Topology) {
    let seconds = knob("TIMEOUTD_CHAOS_SECONDS", 120);
    let orders = knob("TIMEOUTD_CHAOS_ORDERS", 3_000) as usize;
    let settle_limit = Duration::from_secs(knob("TIMEOUTD_CHAOS_SETTLE_SECONDS", 180));
    let with_broker = knob("TIMEOUTD_CHAOS_BROKER", 0) == 1;
    let broker = if with_broker {
        let namesrv =
            std::env::var("TIMEOUTD_ROCKETMQ_NAMESRV").unwrap_or_else(|_| "127.0.0.1:19876".into());
        assert!(
            tokio::net::TcpStream::connect(&namesrv).await.is_ok(),
            "no RocketMQ name server at {namesrv}: scripts/chaos --broker starts one"
        );
        broker_section(&namesrv, &format!("{:08x}", fastrand::u32(..)))
    } else {
        String::new()
    };
    let mut shards = vec![Env::new_on(backend, &topology.server_url(backend), "").await];
    if let Topology::Shards(_) = topology {
        shards.push(Env::new_on(backend, &topology.server_url(backend), "").await);
    }
    let env = &shards[0];
    let dir = env.dir.path().to_path_buf();
    let skus: Vec<(String, i64)> = (0..SKUS)
        .map(|s| (format!("sku-{s:02}"), UNITS_PER_SKU))
        .collect();
    let sku_refs: Vec<(&str, i64)> = skus.iter().map(|(s, n)| (s.as_str(), *n)).collect();
    for shard in &shards {
        shard.stock_up(&sku_refs).await;
    }

    // Each daemon's `[database]`: through the proxy (to one database or to both shards), to
    // its own Galera node, or to HAProxy.
    let url = |url: &str| format!("url = \"{url}\"\n");
    let (proxy, databases) = match topology {
        Topology::Single(upstream) | Topology::Shards(upstream) => {
            let proxy = Proxy::start(upstream).await;
            let through = |env: &Env| {
                let db_url = env
                    .url
                    .replacen(upstream, &format!("127.0.0.1:{}", proxy.port), 1);
                assert_ne!(db_url, env.url, "the database URL names {upstream}");
                db_url
            };
            let database = if shards.len() == 1 {
                url(&through(env))
            } else {
                shards
                    .iter()
                    .enumerate()
                    .map(|(i, env)| {
                        format!(
                            "[[database.shards]]\nname = \"ds_{i}\"\nurl = \"{}\"\n",
                            through(env)
                        )
                    })
                    .collect::<String>()
            };
            (Some(proxy), vec![database; 3])
        }
        Topology::Galera => (
            None,
            GALERA_NODES
                .iter()
                .map(|node| url(&env.url.replacen(GALERA_NODES[0], node, 1)))
                .collect(),
        ),
        Topology::Patroni => (None, vec![url(&env.url); 3]),
    };
    let redis_dir = dir.join("redis");
    std::fs::create_dir_all(&redis_dir).unwrap();
    let mut redis = PrivateRedis::start(&redis_dir).await;
    let _: () = redis
        .conn()
        .await
        .set(format!("activity:{{{FLASH_ACTIVITY}}}:stock"), FLASH_UNITS)
        .await
        .unwrap();
    let provider = Provider::start().await;
    let (receiver_url, inbox) = start_receiver(20, 5).await;
    let swap_plugin = dir.join("swap.wasm");
    std::fs::write(
        &swap_plugin,
        timeoutd::policies::builtin("single-phase").unwrap(),
    )
    .unwrap();
    let mut daemons = Daemons {
        configs: Vec::new(),
        http_ports: Vec::new(),
        children: Vec::new(),
        logs: dir.clone(),
        kills: 0,
    };
    for (i, database) in databases.iter().enumerate() {
        let port = free_port();
        let file = dir.join(format!("daemon-{i}.toml"));
        std::fs::write(
            &file,
            daemon_config(
                database,
                &redis.url(),
                &provider.base_url,
                &receiver_url,
                port,
                &swap_plugin,
                &broker,
            ),
        )
        .unwrap();
        daemons.configs.push(file);
        daemons.http_ports.push(port);
        daemons.children.push(None);
        daemons.start(i);
    }
    eprintln!(
        "chaos: {backend:?} ({topology:?}){}, {orders} orders over {seconds} s of faults, 3 daemons (logs in {})",
        if with_broker { " with the broker" } else { "" },
        dir.display()
    );

    // The shop: orders evenly over 60 % of the faulted time, fates played out.
    let started = Instant::now();
    let faults_until = started + Duration::from_secs(seconds);
    let creation = Duration::from_secs(seconds) * 3 / 5;
    let fates: Arc<Mutex<BTreeMap<String, Fate>>> = Arc::default();
    let shards = Arc::new(shards);
    let shop = spawn_shop(Shop {
        pools: shop_pools(&shards, 1).await,
        fates: fates.clone(),
        books: provider.books.clone(),
        ports: daemons.http_ports.clone(),
        redis: redis::Client::open(redis.url()).unwrap(),
        orders,
        over: creation,
        writers: 1,
        write_ms: Arc::default(),
    });

    // The faults, on a schedule relative to the faulted time.
    let at = |share: f64| started + Duration::from_secs_f64(seconds as f64 * share);
    let (redis_at, swap_at, cut_at, broker_at) = (at(0.3), at(0.4), at(0.5), at(0.7));
    let (mut redis_done, mut swap_done, mut cut_done) = (false, false, false);
    let mut broker_done = !with_broker;
    let mut next_kill = Instant::now() + Duration::from_secs(fastrand::u64(5..=15));
    let mut next_burst = Instant::now() + Duration::from_secs(10);
    let mut events: Vec<String> = Vec::new();
    while Instant::now() < faults_until {
        let now = Instant::now();
        let t = now.duration_since(started).as_secs_f64();
        if now >= next_kill {
            let i = fastrand::usize(0..3);
            daemons.kill(i).await;
            tokio::time::sleep(Duration::from_millis(fastrand::u64(500..2_000))).await;
            daemons.start(i);
            next_kill = Instant::now() + Duration::from_secs(fastrand::u64(5..=15));
        }
        if now >= next_burst {
            provider.books.lock().unwrap().down_for = 30;
            next_burst = now + Duration::from_secs(10);
        }
        if !redis_done && now >= redis_at {
            redis.restart().await;
            events.push(format!("{t:.0}s redis SIGKILLed and restarted"));
            redis_done = true;
        }
        if !swap_done && now >= swap_at {
            let next = dir.join("swap.wasm.next");
            std::fs::write(&next, timeoutd::policies::builtin("two-phase").unwrap()).unwrap();
            std::fs::rename(&next, &swap_plugin).unwrap();
            events.push(format!(
                "{t:.0}s swap's plugin replaced (single-phase → two-phase)"
            ));
            swap_done = true;
        }
        if !cut_done && now >= cut_at {
            events.push(database_fault(topology, proxy.as_ref(), t).await);
            cut_done = true;
        }
        if !broker_done && now >= broker_at {
            assert!(
                broker_script("kill-broker").await,
                "scripts/rocketmq kill-broker"
            );
            tokio::time::sleep(Duration::from_secs(5)).await;
            let up = broker_script("start-broker").await;
            events.push(format!(
                "{t:.0}s broker SIGKILLed, restarted 5 s later{}",
                if up { "" } else { " (FAILED to come back)" }
            ));
            assert!(up, "scripts/rocketmq start-broker");
            broker_done = true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shop.await.unwrap();
    for i in 0..daemons.children.len() {
        if daemons.children[i].is_none() {
            daemons.start(i);
        }
    }
    eprintln!(
        "chaos: faults over after {:.0} s; settling",
        started.elapsed().as_secs_f64()
    );

    // Settle: every daemon up, no faults, until nothing is left to do.
    let settled_s = settle(&shards, settle_limit).await;
    daemons.stop_all().await;

    let fates = fates.lock().unwrap().clone();
    let report = audit(&shards, &redis, &provider, &inbox, &fates, 0).await;
    let summary = json!({
        "chaos": {
            "backend": format!("{backend:?}"),
            "topology": format!("{topology:?}"),
            "orders": orders,
            "faulted_seconds": seconds,
            "broker": with_broker,
            "settled_seconds": (settled_s * 10.0).round() / 10.0,
            "daemon_kills": daemons.kills,
            "events": events,
            "figures": report.figures,
            "violations": report.violations,
        }
    });
    println!("{summary}");
    println!("{}", report.table());
    let shards =
        Arc::try_unwrap(shards).unwrap_or_else(|_| panic!("the shop still holds the shards"));
    if report.violations.is_empty() {
        for env in shards {
            env.cleanup().await;
        }
    } else {
        // Keep the daemon logs for a look (a `TempDir` deletes itself when dropped, and the
        // panic below would drop it); the databases are kept too.
        for env in shards {
            let _ = env.dir.keep();
        }
    }
    assert!(
        report.violations.is_empty(),
        "chaos audit failed (daemon logs kept in {}):\n{}",
        dir.display(),
        report.violations.join("\n")
    );
}

/// The shop's side of a run: `orders` orders placed evenly over `over` (each written by one of
/// at most `writers` concurrent writers, over `pools`: see [`shop_pools`]), their flash-sale
/// slots taken first, and each buyer's fate ([`fate`]) played out; every order's fate lands in
/// `fates`, and each order's time from its turn on the schedule to its commit in `write_ms`.
/// Ends when every order is written and every payment made.
pub(crate) struct Shop {
    /// The shop's connections to each shard, in shard order.
    pub(crate) pools: Arc<Vec<Db>>,
    pub(crate) fates: Arc<Mutex<BTreeMap<String, Fate>>>,
    pub(crate) books: Arc<Mutex<crate::fakes::Books>>,
    /// The daemons' HTTP ports, for paid callbacks.
    pub(crate) ports: Vec<u16>,
    pub(crate) redis: redis::Client,
    pub(crate) orders: usize,
    pub(crate) over: Duration,
    pub(crate) writers: usize,
    /// Each order's time from its turn to its commit, ms (waiting for a writer included): a
    /// shop that falls behind its rate shows why here.
    pub(crate) write_ms: Arc<Mutex<Vec<i64>>>,
}

/// The shop's own connections to each of `shards`: one per writer and one for the clock. The
/// shop once shared the test's pool of 8; that capped 32 writers at 8, and slow commits on a
/// busy machine then held the load below its rate.
pub(crate) async fn shop_pools(shards: &[Env], writers: usize) -> Arc<Vec<Db>> {
    let mut pools = Vec::with_capacity(shards.len());
    for env in shards {
        pools.push(
            Db::connect(&env.url, writers.max(1) as u32 + 1)
                .await
                .unwrap(),
        );
    }
    Arc::new(pools)
}

/// Starts `shop` (see [`Shop`]).
pub(crate) fn spawn_shop(shop: Shop) -> tokio::task::JoinHandle<()> {
    let Shop {
        pools,
        fates,
        books,
        ports,
        redis,
        orders,
        over,
        writers,
        write_ms,
    } = shop;
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        let writers = Arc::new(tokio::sync::Semaphore::new(writers.max(1)));
        let mut lives = tokio::task::JoinSet::new();
        let gap = over / orders.max(1) as u32;
        let mut next = tokio::time::Instant::now();
        for n in 0..orders {
            tokio::time::sleep_until(next).await;
            let turn = next;
            next += gap;
            let writer = writers.clone().acquire_owned().await.unwrap();
            let (pools, fates, books) = (pools.clone(), fates.clone(), books.clone());
            let (http, ports, redis) = (http.clone(), ports.clone(), redis.clone());
            let write_ms = write_ms.clone();
            lives.spawn(async move {
                let now = db_now(&pools[0]).await;
                let order = new_order(n, now);
                if order.flash_activity.is_some() {
                    reserve_flash(&redis, &order).await;
                }
                // Where the order service puts it (the daemons route by the same rule).
                let at = timeoutd::config::routing::shard_of(
                    timeoutd::config::Routing::HashMod,
                    &order.id,
                    pools.len(),
                )
                .unwrap();
                create(&pools[at], &order).await;
                drop(writer);
                write_ms
                    .lock()
                    .unwrap()
                    .push(turn.elapsed().as_millis() as i64);
                let f = fate();
                fates.lock().unwrap().insert(order.id.clone(), f);
                let window = order.deadline_ms - now;
                let pay_in = match f {
                    Fate::Abandon => return,
                    Fate::CallbackEarly | Fate::AtProvider => fastrand::i64(100..window - 100),
                    Fate::CallbackAtDeadline => window + fastrand::i64(-30..=30),
                };
                let reference = order.payment_ref.clone().unwrap();
                tokio::time::sleep(Duration::from_millis(pay_in as u64)).await;
                // A provider refuses a payment it has closed. Under load this task can wake
                // after the daemon closed the order and its payment; the buyer then never
                // paid (before, the books took the payment anyway and the audit found a
                // paid-at-the-provider order closed unseen).
                if !books.lock().unwrap().pay(&reference, now + pay_in) {
                    fates.lock().unwrap().insert(order.id, Fate::Abandon);
                    return;
                }
                if f != Fate::AtProvider {
                    paid_callback(&http, &ports, &order.id).await;
                }
            });
            // Finished lives are reaped as the shop goes (an hour's soak places a million); a
            // life that panicked (an order the shop could not write) fails the run.
            while let Some(life) = lives.try_join_next() {
                life.unwrap();
            }
        }
        while let Some(life) = lives.join_next().await {
            life.unwrap();
        }
    })
}

/// Waits until no order is PENDING, no ledger row PENDING and every outbox row PROCESSED on
/// every shard, or `limit` passed; returns the seconds waited.
pub(crate) async fn settle(shards: &[Env], limit: Duration) -> f64 {
    let start = Instant::now();
    loop {
        let mut left = 0i64;
        for env in shards {
            left = left.saturating_add(
                env.db
                    .backend()
                    .query(
                        "SELECT (SELECT COUNT(*) FROM orders WHERE status = 'PENDING') \
                         + (SELECT COUNT(*) FROM effect_ledger WHERE status = 'PENDING') \
                         + (SELECT COUNT(*) FROM order_timeout_msg WHERE status <> 'PROCESSED')",
                    )
                    .fetch_one(env.db.pool())
                    .await
                    .map(|r| sqlx::Row::get::<i64, _>(&r, 0))
                    .unwrap_or(i64::MAX),
            );
        }
        if left == 0 || start.elapsed() > limit {
            return start.elapsed().as_secs_f64();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The run's one database fault; returns the event line.
async fn database_fault(topology: Topology, proxy: Option<&Proxy>, t: f64) -> String {
    match topology {
        Topology::Single(_) | Topology::Shards(_) => {
            let proxy = proxy.expect("a single server is behind the proxy");
            proxy.set_cut(true);
            tokio::time::sleep(Duration::from_secs(10)).await;
            proxy.set_cut(false);
            format!("{t:.0}s database cut off for 10 s")
        }
        Topology::Galera => {
            topology.script("kill-node", &["3"]).await;
            tokio::time::sleep(Duration::from_secs(10)).await;
            let back = Instant::now();
            topology.script("restart-node", &["3"]).await;
            format!(
                "{t:.0}s Galera node 3 SIGKILLed, restarted 10 s later (synced {:.1} s after)",
                back.elapsed().as_secs_f64()
            )
        }
        Topology::Patroni => {
            let crash = Instant::now();
            topology.script("failover", &[]).await;
            let took = crash.elapsed().as_secs_f64();
            tokio::time::sleep(Duration::from_secs(5)).await;
            topology.script("rejoin", &[]).await;
            format!(
                "{t:.0}s Patroni primary crashed, replica promoted and routed in {took:.1} s; old primary rejoined"
            )
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The audit.

pub(crate) struct Report {
    pub(crate) figures: BTreeMap<&'static str, Value>,
    pub(crate) violations: Vec<String>,
}

impl Report {
    pub(crate) fn table(&self) -> String {
        let mut out = String::from("chaos audit\n");
        for (k, v) in &self.figures {
            out += &format!("  {k:<34} {v}\n");
        }
        if self.violations.is_empty() {
            out += "  no violations\n";
        }
        for v in &self.violations {
            out += &format!("  VIOLATION: {v}\n");
        }
        out
    }
}

/// `sql`'s rows from every shard (one database but for [`Topology::Shards`]), one after another.
pub(crate) async fn rows(shards: &[Env], sql: &'static str) -> Vec<sqlx::any::AnyRow> {
    let mut out = Vec::new();
    for env in shards {
        out.extend(
            env.db
                .backend()
                .query(sql)
                .fetch_all(env.db.pool())
                .await
                .unwrap(),
        );
    }
    out
}

/// A `COUNT(*)`-like `sql` with one `?`, bound to `since`, summed over the shards.
async fn count_since(shards: &[Env], sql: &'static str, since: i64) -> i64 {
    let mut n = 0;
    for env in shards {
        let row = env
            .db
            .backend()
            .query(sql)
            .bind(since)
            .fetch_one(env.db.pool())
            .await
            .unwrap();
        n += sqlx::Row::get::<i64, _>(&row, 0);
    }
    n
}

/// A `COUNT(*)`-like `sql`, summed over the shards.
pub(crate) async fn count(shards: &[Env], sql: &'static str) -> i64 {
    rows(shards, sql)
        .await
        .iter()
        .map(|r| sqlx::Row::get::<i64, _>(r, 0))
        .sum()
}

pub(crate) fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Each CLOSED order whose deadline is at or after `deadline_since_ms` has its closed decision,
/// and no closed decision names an order that is not CLOSED (or no order at all); a violation
/// line for each kind found. Retention deletes decisions older than its window; no order is
/// closed before its deadline (manual closes aside, which these runs do not make), so with
/// `deadline_since_ms` = the clock less the window every order checked still has its decision.
/// 0: every order.
pub(crate) async fn decision_violations(env: &[Env], deadline_since_ms: i64) -> Vec<String> {
    let mut v = Vec::new();
    let undecided = count_since(
        env,
        "SELECT COUNT(*) FROM orders o WHERE o.status = 'CLOSED' AND o.deadline_ms >= ? \
         AND NOT EXISTS (SELECT 1 FROM decision_log d \
                         WHERE d.order_id = o.id AND d.outcome = 'closed')",
        deadline_since_ms,
    )
    .await;
    if undecided > 0 {
        v.push(format!(
            "{undecided} CLOSED orders without a closed decision"
        ));
    }
    let decided_open = count(
        env,
        "SELECT COUNT(DISTINCT d.order_id) FROM decision_log d \
         LEFT JOIN orders o ON o.id = d.order_id \
         WHERE d.outcome = 'closed' AND (o.id IS NULL OR o.status <> 'CLOSED')",
    )
    .await;
    if decided_open > 0 {
        v.push(format!(
            "{decided_open} closed decisions name an order that is not CLOSED"
        ));
    }
    v
}

/// The exactly-once audit of a run over `env` (its shards), after it settled: each violation
/// named, with the run's figures. Decisions are checked whole for orders due at or after
/// `retained_since_ms` ([`decision_violations`]; 0: every order).
pub(crate) async fn audit(
    env: &[Env],
    redis: &PrivateRedis,
    provider: &Provider,
    inbox: &Inbox,
    fates: &BTreeMap<String, Fate>,
    retained_since_ms: i64,
) -> Report {
    let mut v = Vec::new();
    let mut f: BTreeMap<&'static str, Value> = BTreeMap::new();
    // Every order PAID or CLOSED; closed at most once; never before its deadline.
    let statuses = rows(
        env,
        "SELECT id, status, deadline_ms, closed_at_ms, merchant_id FROM orders",
    )
    .await;
    let mut status: HashMap<String, String> = HashMap::new();
    let mut lateness = Vec::new();
    for r in &statuses {
        let id: String = sqlx::Row::get(r, 0);
        let s: String = sqlx::Row::get(r, 1);
        let deadline: i64 = sqlx::Row::get(r, 2);
        let closed_at: Option<i64> = sqlx::Row::get(r, 3);
        let merchant: String = sqlx::Row::get(r, 4);
        if let Some(at) = closed_at {
            if at < deadline {
                v.push(format!(
                    "{id} closed {} ms before its deadline",
                    deadline - at
                ));
            }
            // Lateness over the policy's own close instant (swap's moved with its plugin).
            match merchant.as_str() {
                "solo" => lateness.push(at - deadline),
                "flashy" => lateness.push(at - deadline - GRACE_MS),
                _ => {}
            }
        }
        status.insert(id, s);
    }
    let open = status
        .values()
        .filter(|s| *s != "PAID" && *s != "CLOSED")
        .count();
    if open > 0 {
        v.push(format!("{open} orders neither PAID nor CLOSED"));
    }
    let paid = status.values().filter(|s| *s == "PAID").count();
    let closed = status.values().filter(|s| *s == "CLOSED").count();
    f.insert("orders", json!(status.len()));
    // Summed over the shards.
    let mut by_kind: BTreeMap<String, i64> = BTreeMap::new();
    for r in rows(
        env,
        "SELECT trigger_kind, COUNT(*) FROM decision_log WHERE outcome = 'closed' \
         GROUP BY trigger_kind ORDER BY trigger_kind",
    )
    .await
    {
        *by_kind.entry(sqlx::Row::get(&r, 0)).or_default() += sqlx::Row::get::<i64, _>(&r, 1);
    }
    let by_trigger: Vec<String> = by_kind.iter().map(|(k, n)| format!("{k} {n}")).collect();
    f.insert("closed by trigger", json!(by_trigger.join(", ")));
    f.insert("orders PAID / CLOSED", json!(format!("{paid} / {closed}")));
    let doubled = count(
        env,
        "SELECT COUNT(*) FROM (SELECT order_id FROM decision_log WHERE outcome = 'closed' \
         GROUP BY order_id HAVING COUNT(*) > 1) d",
    )
    .await;
    if doubled > 0 {
        v.push(format!("{doubled} orders closed more than once"));
    }
    v.extend(decision_violations(env, retained_since_ms).await);
    // Paid at the provider: aligned, or closed only as a paid-after-close with its refund.
    let late_paid: BTreeSet<String> = rows(env, "SELECT order_id FROM paid_after_close")
        .await
        .iter()
        .map(|r| sqlx::Row::get(r, 0))
        .collect();
    let at_provider: Vec<&String> = fates
        .iter()
        .filter(|(_, f)| **f == Fate::AtProvider)
        .map(|(id, _)| id)
        .collect();
    let aligned = at_provider
        .iter()
        .filter(|id| status.get(**id).is_some_and(|s| s == "PAID"))
        .count();
    let closed_unseen = at_provider
        .iter()
        .filter(|id| status.get(**id).is_some_and(|s| s == "CLOSED") && !late_paid.contains(**id))
        .count();
    if closed_unseen > 0 {
        v.push(format!(
            "{closed_unseen} orders paid at the provider were closed with no paid-after-close record"
        ));
    }
    f.insert(
        "paid at the provider: aligned",
        json!(format!("{aligned} of {}", at_provider.len())),
    );
    f.insert("paid after close (refunded)", json!(late_paid.len()));

    // SQL stock and coupons exactly conserved, shard by shard: what its PAID orders hold, and
    // nothing else (each shard was stocked with UNITS_PER_SKU of every SKU).
    let mut stock_off = 0;
    for (at, shard) in env.iter().enumerate() {
        let shard = std::slice::from_ref(shard);
        let mut held: HashMap<String, i64> = HashMap::new();
        for r in rows(
            shard,
            "SELECT i.sku, i.quantity FROM order_items i JOIN orders o ON o.id = i.order_id \
             WHERE o.status = 'PAID'",
        )
        .await
        {
            *held.entry(sqlx::Row::get(&r, 0)).or_default() += sqlx::Row::get::<i64, _>(&r, 1);
        }
        // Units a journal-mode close appended and no fold has added yet are stock too.
        let mut journal: HashMap<String, i64> = HashMap::new();
        for r in rows(shard, "SELECT sku, units FROM stock_journal").await {
            *journal.entry(sqlx::Row::get(&r, 0)).or_default() += sqlx::Row::get::<i64, _>(&r, 1);
        }
        for r in rows(shard, "SELECT sku, available FROM sku_stock").await {
            let sku: String = sqlx::Row::get(&r, 0);
            let available: i64 =
                sqlx::Row::get::<i64, _>(&r, 1) + journal.get(&sku).copied().unwrap_or(0);
            let want = UNITS_PER_SKU - held.get(&sku).copied().unwrap_or(0);
            if available != want {
                stock_off += 1;
                v.push(format!(
                    "shard {at}: {sku}: {available} units available, want {want}"
                ));
            }
        }
    }
    f.insert(
        "SQL stock",
        json!(if stock_off == 0 { "exact" } else { "OFF" }),
    );
    let coupons_wrong = count(
        env,
        "SELECT COUNT(*) FROM orders o JOIN coupons c ON c.id = o.coupon_id \
         WHERE (o.status = 'CLOSED' AND c.status <> 'AVAILABLE') \
            OR (o.status = 'PAID' AND c.status = 'AVAILABLE')",
    )
    .await;
    if coupons_wrong > 0 {
        v.push(format!(
            "{coupons_wrong} coupons in the wrong state for their order"
        ));
    }
    f.insert(
        "coupons",
        json!(if coupons_wrong == 0 { "exact" } else { "OFF" }),
    );

    // Redis flash stock and buyers exactly conserved.
    let mut flash_units = 0;
    let mut buyers = BTreeSet::new();
    for r in rows(
        env,
        "SELECT o.user_id, i.quantity FROM orders o JOIN order_items i ON i.order_id = o.id \
         WHERE o.status = 'PAID' AND o.activity_id IS NOT NULL",
    )
    .await
    {
        buyers.insert(sqlx::Row::get::<String, _>(&r, 0));
        flash_units += sqlx::Row::get::<i64, _>(&r, 1);
    }
    let mut c = redis.conn().await;
    let stock: i64 = c
        .get(format!("activity:{{{FLASH_ACTIVITY}}}:stock"))
        .await
        .unwrap();
    let members: BTreeSet<String> = c
        .smembers(format!("activity:{{{FLASH_ACTIVITY}}}:users"))
        .await
        .unwrap();
    if stock != FLASH_UNITS - flash_units {
        v.push(format!(
            "Redis flash stock {stock}, want {}",
            FLASH_UNITS - flash_units
        ));
    }
    if members != buyers {
        let extra = members.difference(&buyers).count();
        let missing = buyers.difference(&members).count();
        v.push(format!(
            "Redis buyer set: {extra} buyers not of a PAID order, {missing} PAID buyers missing"
        ));
    }
    f.insert(
        "Redis flash stock / buyers",
        json!(if stock == FLASH_UNITS - flash_units && members == buyers {
            "exact"
        } else {
            "OFF"
        }),
    );

    // External effects: never one logical effect under two keys; every DONE one received.
    // DONE with a note is a reminder rightly not sent (its order was paid or closed since).
    let done_notices = rows(
        env,
        "SELECT idempotency_key, payload FROM effect_ledger WHERE kind IN ('notify', 'remind') \
         AND status = 'DONE' AND last_error IS NULL",
    )
    .await;
    {
        let d = inbox.lock().unwrap();
        let twice: usize = d.notices.values().filter(|keys| keys.len() > 1).count();
        if twice > 0 {
            v.push(format!(
                "{twice} notices delivered under more than one idempotency key"
            ));
        }
        let undelivered = done_notices
            .iter()
            .filter(|r| {
                let key: String = sqlx::Row::get(*r, 0);
                let payload: Value =
                    serde_json::from_str(&sqlx::Row::get::<String, _>(*r, 1)).unwrap();
                // The webhook's notices (the paid-alignment notice goes to the `log` channel).
                payload["channel"] == "hook" && !d.accepted.contains_key(&key)
            })
            .count();
        if undelivered > 0 {
            v.push(format!(
                "{undelivered} DONE notices the receiver never accepted"
            ));
        }
        f.insert(
            "webhook: accepted / failed / hung",
            json!(format!("{} / {} / {}", d.accepted.len(), d.failed, d.hung)),
        );
        let redelivered = d.accepted.values().filter(|n| **n > 1).count();
        f.insert("webhook: same key accepted again", json!(redelivered));
    }
    let provider_keys: BTreeSet<String> = {
        let b = provider.books.lock().unwrap();
        let mut keys_per_ref: HashMap<(&str, &str), BTreeSet<&str>> = HashMap::new();
        for (action, reference, key) in &b.calls {
            if action == "close" || action == "refund" {
                keys_per_ref
                    .entry((action.as_str(), reference.as_str()))
                    .or_default()
                    .insert(key.as_str());
            }
        }
        let doubled_calls = keys_per_ref.values().filter(|k| k.len() > 1).count();
        if doubled_calls > 0 {
            v.push(format!(
                "{doubled_calls} payments closed or refunded under more than one idempotency key"
            ));
        }
        let refunds: BTreeSet<&str> = b.refunds.iter().map(|(r, _)| r.as_str()).collect();
        f.insert(
            "provider: closes / refunds / calls",
            json!(format!(
                "{} / {} / {}",
                b.closes.len(),
                refunds.len(),
                b.requests
            )),
        );
        b.calls.iter().map(|(_, _, k)| k.clone()).collect()
    };
    let mut unsent = 0;
    for r in rows(
        env,
        "SELECT idempotency_key FROM effect_ledger WHERE kind IN ('close-payment', 'refund-payment') AND status = 'DONE'",
    )
    .await
    {
        if !provider_keys.contains(&sqlx::Row::get::<String, _>(&r, 0)) {
            unsent += 1;
        }
    }
    if unsent > 0 {
        v.push(format!(
            "{unsent} DONE payment effects the provider never received"
        ));
    }

    // Nothing stuck without a reason.
    let outbox_left = count(
        env,
        "SELECT COUNT(*) FROM order_timeout_msg WHERE status <> 'PROCESSED'",
    )
    .await;
    let ledger_pending = count(
        env,
        "SELECT COUNT(*) FROM effect_ledger WHERE status = 'PENDING'",
    )
    .await;
    let ledger_failed = count(
        env,
        "SELECT COUNT(*) FROM effect_ledger WHERE status = 'FAILED'",
    )
    .await;
    let failed_silent = count(
        env,
        "SELECT COUNT(*) FROM effect_ledger WHERE status = 'FAILED' AND (last_error IS NULL OR last_error = '')",
    )
    .await;
    let dead = count(env, "SELECT COUNT(*) FROM dead_letter").await;
    let dead_silent = count(env, "SELECT COUNT(*) FROM dead_letter WHERE reason = ''").await;
    for (n, what) in [
        (outbox_left, "outbox rows not PROCESSED"),
        (ledger_pending, "ledger rows still PENDING"),
        (failed_silent, "FAILED ledger rows without a reason"),
        (dead_silent, "dead letters without a reason"),
    ] {
        if n > 0 {
            v.push(format!("{n} {what}"));
        }
    }
    f.insert(
        "ledger FAILED (with reason) / dead letters",
        json!(format!("{ledger_failed} / {dead}")),
    );
    lateness.sort_unstable();
    f.insert(
        "lateness ms p50 / p99 / max",
        json!(format!(
            "{} / {} / {}",
            percentile(&lateness, 0.5),
            percentile(&lateness, 0.99),
            lateness.last().copied().unwrap_or(0)
        )),
    );
    Report {
        figures: f,
        violations: v,
    }
}
