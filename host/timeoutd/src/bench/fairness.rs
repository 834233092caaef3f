//! `timeoutd bench-fairness`: does one merchant's trouble stay that merchant's? (#46 part 1)
//!
//! Two phases in one run, each on a fresh database of the config's server, with the real
//! daemon in this process and the config's `[effects]`, `[outbox]` and `[dispatch]` as they
//! are:
//! 1. **idle**: merchant B's `--quiet-orders` orders (default 100) fall due at one instant,
//!    alone;
//! 2. **busy**: the same, while merchant A's `--busy-orders` orders (default 10,000) fall due
//!    at the same instant and A's webhook misbehaves (`--fault hang`: it never answers, each
//!    call ends at the channel's 5 s timeout; `--fault unavailable`: 503 at once, retried).
//!
//! Every order of both merchants is in a flash-sale activity of its merchant, so each close
//! records a notice (A's to the faulty webhook, B's to a loopback receiver of the bench's)
//! and a Redis stock restore. For B's orders the bench reports, per phase, p50 / p99 / max of:
//! - **close**: `closed_at_ms − deadline_ms`;
//! - **notice**: close to the receiver's 2xx ([`super::notices`]);
//! - **stock back**: deadline to the `restore-flash-stock` ledger row settled DONE, and checks
//!   that B's Redis stock counter holds every unit back.
//!
//! and the ratio of the busy phase's p99 to the idle one's: 1.0 is perfect isolation. Both
//! merchants run `builtin:two-phase` with no grace (a close at the deadline that gives the
//! flash-sale units back), with the rest of the config's first merchant's table.

use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;

use super::notices::{self, NoticeLatency};
use super::seed;
use crate::clock::Clock;
use crate::config::{ChannelConfig, Config, RedisConfig};
use crate::daemon::Daemon;
use crate::db::{Backend, Db, fixtures};

/// The busy merchant's id.
pub const BUSY: &str = "fair-a";
/// The quiet merchant's id.
pub const QUIET: &str = "fair-b";
/// Both merchants' plugin, with `grace = "0s"`: it closes at the deadline and gives a
/// flash-sale order's units back to its activity.
const PLUGIN: &str = "builtin:two-phase";
/// The busy merchant's webhook channel.
const FAULTY: &str = "bench-faulty";
/// The busy merchant's webhook timeout: a hanging call holds its slot this long.
const FAULTY_TIMEOUT: Duration = Duration::from_secs(5);

/// How the busy merchant's webhook misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// Accepts and never answers: every call ends at its 5 s timeout.
    Hang,
    /// Answers 503 Service Unavailable at once (retried with backoff).
    Unavailable,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct FairnessArgs {
    /// The daemon's configuration (its database URL names the server).
    pub config: Config,
    /// Merchant A's orders in the busy phase.
    pub busy_orders: u32,
    /// Merchant B's orders in each phase.
    pub quiet_orders: u32,
    /// A's webhook.
    pub fault: Fault,
    /// How far ahead of the daemon's start the shared deadline is put, ms.
    pub lead_ms: i64,
    /// The Redis the flash-sale stock lives in (the config's `[redis]` is replaced).
    pub redis_url: String,
}

/// p50 / p99 / max, ms, of one measure over B's orders.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Spread {
    /// Orders measured.
    pub count: usize,
    /// Median.
    pub p50: i64,
    /// 99th percentile.
    pub p99: i64,
    /// Largest.
    pub max: i64,
}

impl Spread {
    fn of(mut values: Vec<i64>) -> Spread {
        values.sort_unstable();
        let pick = |q: f64| crate::lateness::nearest_rank(&values, q);
        Spread {
            count: values.len(),
            p50: pick(0.50),
            p99: pick(0.99),
            max: values.last().copied().unwrap_or(0),
        }
    }
}

/// One phase's figures for merchant B.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// A's orders due with B's (0: idle).
    pub busy_orders: u32,
    /// B's close lateness.
    pub close: Spread,
    /// B's notices, close to 2xx.
    pub notice: NoticeLatency,
    /// B's Redis stock, deadline to DONE.
    pub stock_back: Spread,
    /// Units B's Redis stock counter got back (expected: one per order).
    pub stock_units_back: i64,
    /// A's orders closed by the time B's were all done.
    pub busy_closed: usize,
}

/// The run's report.
#[derive(Debug, Clone, Serialize)]
pub struct FairnessReport {
    /// The database server: `sqlite`, `mysql` or `postgres`.
    pub backend: String,
    /// A's webhook.
    pub fault: Fault,
    /// `effects.concurrency` and `effects.merchant_slots` as run.
    pub slots: (u32, u32),
    /// B alone.
    pub idle: Phase,
    /// B beside A's burst.
    pub busy: Phase,
}

impl FairnessReport {
    /// busy p99 / idle p99 for close, notice and stock back (1.0: A's trouble cost B nothing).
    pub fn ratios(&self) -> (f64, f64, f64) {
        let r = |busy: i64, idle: i64| busy.max(1) as f64 / idle.max(1) as f64;
        (
            r(self.busy.close.p99, self.idle.close.p99),
            r(self.busy.notice.p99, self.idle.notice.p99),
            r(self.busy.stock_back.p99, self.idle.stock_back.p99),
        )
    }

    /// Whether every one of B's orders closed, notified and got its stock back in both phases.
    pub fn complete(&self) -> bool {
        [&self.idle, &self.busy].iter().all(|p| {
            let n = p.close.count;
            n > 0
                && p.stock_back.count == n
                && p.notice.notices == n
                && p.stock_units_back == n as i64
        })
    }

    /// The report as a table.
    pub fn table(&self) -> String {
        let (close, notice, stock) = self.ratios();
        let row = |name: &str, idle: (i64, i64, i64), busy: (i64, i64, i64), ratio: f64| {
            format!(
                "{name:<22} {:>7} {:>7} {:>7}   {:>7} {:>7} {:>7}   {ratio:>6.2}\n",
                idle.0, idle.1, idle.2, busy.0, busy.1, busy.2
            )
        };
        let s = |x: &Spread| (x.p50, x.p99, x.max);
        let n = |x: &NoticeLatency| (x.p50, x.p99, x.max);
        let mut out = format!(
            "fairness on {}: B's {} orders alone, then beside A's {} with A's webhook {:?} \
             ({} slots, at most {} per merchant)\n",
            self.backend,
            self.idle.close.count,
            self.busy.busy_orders,
            self.fault,
            self.slots.0,
            self.slots.1
        );
        out.push_str(&format!(
            "{:<22} {:>7} {:>7} {:>7}   {:>7} {:>7} {:>7}   {:>6}\n",
            "B, ms", "idle50", "idle99", "max", "busy50", "busy99", "max", "p99 ×"
        ));
        out.push_str(&row(
            "close lateness",
            s(&self.idle.close),
            s(&self.busy.close),
            close,
        ));
        out.push_str(&row(
            "notice (close → 2xx)",
            n(&self.idle.notice),
            n(&self.busy.notice),
            notice,
        ));
        out.push_str(&row(
            "Redis stock back",
            s(&self.idle.stock_back),
            s(&self.busy.stock_back),
            stock,
        ));
        out.push_str(&format!(
            "A's orders closed by the time B's were done: {} of {}; B's units back in Redis: \
             {} and {}\n",
            self.busy.busy_closed,
            self.busy.busy_orders,
            self.idle.stock_units_back,
            self.busy.stock_units_back
        ));
        out
    }
}

/// Runs both phases.
///
/// # Errors
/// Anything that stops a phase: the server or Redis unreachable, the daemon not starting, B's
/// orders not all done within 120 s of their deadline.
pub async fn run(args: FairnessArgs) -> anyhow::Result<FairnessReport> {
    let template = args
        .config
        .merchants
        .values()
        .next()
        .cloned()
        .context("the config has no merchants")?;
    let mut config = args.config.clone();
    config.merchants.clear();
    for (id, channel) in [(BUSY, FAULTY), (QUIET, notices::CHANNEL)] {
        let mut m = template.clone();
        m.plugin = PLUGIN.to_string();
        m.settings = [("grace", "0s"), ("channel", channel)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        config.merchants.insert(id.to_string(), m);
    }
    config.redis = Some(RedisConfig {
        url: Some(args.redis_url.clone()),
        cluster: Vec::new(),
        marker_ttl: Duration::from_secs(86_400),
    });
    config.rocketmq = None;
    config.http = None;
    config.admin = None;
    config.alerts = None;
    config.database.migrate = false;
    let idle = phase(&args, &config, 0).await.context("the idle phase")?;
    let busy = phase(&args, &config, args.busy_orders)
        .await
        .context("the busy phase")?;
    Ok(FairnessReport {
        backend: format!("{:?}", Backend::of_url(&args.config.database.url)?).to_lowercase(),
        fault: args.fault,
        slots: (config.effects.concurrency, config.effects.merchant_slots()),
        idle,
        busy,
    })
}

/// One phase: B's orders, and A's `busy` orders, due at one instant.
async fn phase(args: &FairnessArgs, base: &Config, busy: u32) -> anyhow::Result<Phase> {
    let (url, _tempdir) = seed::fresh_database(&base.database.url).await?;
    let db = Db::connect(&url, 2).await?;
    db.migrate().await?;
    let quiet = args.quiet_orders;
    super::progress(format_args!(
        "fairness: seeding {busy} orders of {BUSY}, then {quiet} of {QUIET}"
    ));
    // A's first: its rows are the older, ahead of B's in every id and due order.
    seed_orders(&db, BUSY, "a-", busy).await?;
    seed_orders(&db, QUIET, "d-", quiet).await?;
    let keys = flash_keys(base);
    let mut redis = redis::Client::open(args.redis_url.as_str())?
        .get_multiplexed_async_connection()
        .await
        .context("connecting to Redis")?;
    for (merchant, stock) in [BUSY, QUIET].iter().zip(&keys) {
        clear_activity(&mut redis, merchant).await?;
        redis::cmd("SET")
            .arg(stock)
            .arg(0)
            .query_async::<()>(&mut redis)
            .await?;
    }

    let mut config = base.clone();
    config.database.url = url.clone();
    let receiver = notices::Receiver::start(&db).await?;
    let faulty = faulty_webhook(args.fault).await?;
    config.notify.channels.insert(
        notices::CHANNEL.to_string(),
        ChannelConfig::Webhook {
            url: receiver.url.clone(),
            authorization: None,
            timeout: Duration::from_secs(5),
        },
    );
    config.notify.channels.insert(
        FAULTY.to_string(),
        ChannelConfig::Webhook {
            url: faulty.0.clone(),
            authorization: None,
            timeout: FAULTY_TIMEOUT,
        },
    );
    let daemon = Daemon::start(&config, Clock::Database)
        .await
        .context("starting the daemon")?;
    let deadline_ms = db.now_ms().await? + args.lead_ms;
    fixtures::set_deadlines(&db, "d-", deadline_ms, 0).await?;
    fixtures::set_deadlines(&db, "a-", deadline_ms, 0).await?;
    daemon.waker().notify_one();
    super::progress(format_args!(
        "fairness: every order due {} ms from now",
        args.lead_ms
    ));
    let stamps = loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let stamps = crate::db::bench::stamps(&db, "d-", "restore-flash-stock").await?;
        let done = stamps.iter().filter(|s| s.done_at_ms.is_some()).count();
        let now = db.now_ms().await?;
        if done == stamps.len() {
            break stamps;
        }
        anyhow::ensure!(
            now - deadline_ms < 120_000,
            "{} of {QUIET}'s {} orders without their stock back 120 s after the deadline",
            stamps.len() - done,
            stamps.len()
        );
    };
    let busy_closed = crate::db::bench::stamps(&db, "a-", "restore-flash-stock")
        .await?
        .iter()
        .filter(|s| s.closed_at_ms.is_some())
        .count();
    let notice = receiver.measure(&db, Duration::from_secs(30)).await?;
    let close = Spread::of(
        stamps
            .iter()
            .filter_map(|s| s.closed_at_ms.map(|c| c - s.deadline_ms))
            .collect(),
    );
    let stock_back = Spread::of(
        stamps
            .iter()
            .filter_map(|s| s.done_at_ms.map(|d| d - s.deadline_ms))
            .collect(),
    );
    let stock_units_back: i64 = redis::cmd("GET")
        .arg(&keys[1])
        .query_async::<Option<i64>>(&mut redis)
        .await?
        .unwrap_or(0);
    daemon.stop_within(Duration::from_secs(10)).await;
    faulty.1.abort();
    db.close().await;
    super::progress(format_args!(
        "fairness: {QUIET} p99 close {} ms, notice {} ms, stock back {} ms",
        close.p99, notice.p99, stock_back.p99
    ));
    Ok(Phase {
        busy_orders: busy,
        close,
        notice,
        stock_back,
        stock_units_back,
        busy_closed,
    })
}

/// Deletes every key of `activity`'s hash tag (`…{activity}…`): its stock, its buyers and the
/// idempotency markers of the last phase's effects (the same orders' keys), so each phase
/// starts from nothing.
async fn clear_activity(
    redis: &mut redis::aio::MultiplexedConnection,
    activity: &str,
) -> anyhow::Result<()> {
    let pattern = format!("*{{{activity}}}*");
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1_000)
            .query_async(&mut *redis)
            .await?;
        if !keys.is_empty() {
            redis::cmd("DEL")
                .arg(&keys)
                .query_async::<()>(&mut *redis)
                .await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// The Redis stock counters of A's and B's activities, in that order.
fn flash_keys(config: &Config) -> [String; 2] {
    [BUSY, QUIET].map(|m| config.merchants[m].flash_stock_key.replace("<activity>", m))
}

/// Seeds `n` PENDING orders of `merchant` (ids `prefix` and a number, due a day ahead until
/// [`fixtures::set_deadlines`] moves them): one unit of `sku-0` each, in the merchant's
/// flash-sale activity (named as the merchant), with their phase-0 outbox rows.
async fn seed_orders(db: &Db, merchant: &str, prefix: &str, n: u32) -> anyhow::Result<()> {
    let far = db.now_ms().await? + 86_400_000;
    let ids: Vec<String> = (0..n).map(|i| format!("{prefix}{i:07}")).collect();
    for chunk in ids.chunks(400) {
        let orders: Vec<fixtures::PendingOrder> = chunk
            .iter()
            .map(|id| fixtures::PendingOrder {
                id: id.clone(),
                user_id: format!("u-{id}"),
                created_at_ms: far - 900_000,
                deadline_ms: far,
                total_cents: 1_990,
                coupon_id: None,
                activity_id: Some(merchant.to_string()),
                payment_ref: format!("pay-{id}"),
            })
            .collect();
        let lines: Vec<fixtures::Line> = chunk
            .iter()
            .map(|id| fixtures::Line {
                order_id: id.clone(),
                line_no: 0,
                sku: "sku-0".to_string(),
                quantity: 1,
            })
            .collect();
        let rows: Vec<(String, i64)> = chunk.iter().map(|id| (id.clone(), far)).collect();
        let mut tx = db.begin().await?;
        fixtures::insert_pending_orders(&mut tx, merchant, &orders).await?;
        fixtures::insert_lines(&mut tx, &lines).await?;
        fixtures::insert_pending_outbox_rows(&mut tx, &rows).await?;
        tx.commit().await?;
    }
    if merchant == BUSY {
        let mut tx = db.begin().await?;
        fixtures::add_stock(&mut tx, "sku-0", 1_000_000).await?;
        tx.commit().await?;
    }
    Ok(())
}

/// A loopback webhook that fails as `fault` says: its URL and its task.
async fn faulty_webhook(fault: Fault) -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
    let app = axum::Router::new().route(
        "/faulty",
        axum::routing::post(move || async move {
            match fault {
                Fault::Hang => {
                    tokio::time::sleep(Duration::from_secs(3_600)).await;
                    axum::http::StatusCode::OK
                }
                Fault::Unavailable => axum::http::StatusCode::SERVICE_UNAVAILABLE,
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/faulty", listener.local_addr()?);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((url, task))
}
