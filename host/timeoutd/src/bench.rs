//! `timeoutd bench`: a flash-sale burst through the real daemon path, measured against this
//! machine's own limit taken in the same run.
//!
//! One run, on a fresh database of the configured backend (`timeoutd_bench` on MariaDB and
//! PostgreSQL, a temporary file on SQLite):
//! 1. seeds 3 × N orders as an order service writes them — lines, locked stock on a few hot
//!    SKUs, a coupon on one order in five, a flash-sale activity on every other order, a
//!    payment reference, and (path `outbox`) the phase-0 `order_timeout_msg` row ([`seed`]);
//! 2. **baselines** ([`baseline`]), over as many connections as the daemon dispatches on:
//!    - the *client loop* closes the first N, per order one transaction with the same writes
//!      the daemon makes (compare-and-set, stock back per line, coupon, one ledger row per
//!      effect, one `decision_log` row, outbox row PROCESSED): this machine's
//!      one-order-per-commit limit for this backend;
//!    - the *set-based* one closes the second N in groups of `outbox.group_commit`, one
//!      transaction per group with the group close's statements (one per table, stock one per
//!      SKU): the database's own limit for these writes, which #48's targets are stated
//!      against;
//! 3. starts the real daemon in this process (or several, `--daemons`, each with its own pool
//!    and sources, as separate hosts would run on one database), moves the other N orders' deadline to one instant
//!    a few seconds ahead, and waits until every one is closed;
//! 4. reports closes/s, the ratio to each baseline, lateness p50/p99/max from the database
//!    (`closed_at_ms − deadline_ms`), the notices' delivery latency p50/p95/p99 (each close to
//!    its notice's 2xx at a loopback webhook of the bench's, [`notices`]), CPU seconds per
//!    1,000 closes, peak RSS, commits and
//!    statements per close ([`counters`]), where the drain's CPU went and what bounded it
//!    ([`bottleneck`]), the plans of the hot queries, and an exactly-once audit ([`report`]).
//!
//! Options: `--spread D` puts the deadlines D apart instead of at one instant (`--orders 100
//! --spread 200ms`: a single order at a time on an idle daemon); `--history N` first fills the
//! tables with N PAID/CLOSED orders and their PROCESSED outbox rows, and the report times the
//! sweep's query over them; `--plot FILE.svg` draws the run ([`plot`]).
//!
//! Lateness under a burst is drain time: with N orders sharing one deadline and a sustained
//! rate R, p99 ≥ 0.99·N/R (the "drain floor", reported beside p99).

mod baseline;
mod bottleneck;
mod counters;
pub mod fairness;
mod notices;
mod plot;
mod report;
mod seed;
mod watch;

use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;

pub use report::Report;

use crate::clock::Clock;
use crate::config::{Config, StockMode};
use crate::daemon::Daemon;
use crate::db::{Backend, Db};

/// Which trigger path the burst goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BenchPath {
    /// Each order has its phase-0 `order_timeout_msg` row; the outbox timer closes it.
    Outbox,
    /// No outbox rows: the sweep (interval 1 s, grace 0 for the bench) finds and closes them.
    Sweep,
    /// Outbox rows due `--lead` ahead (at least 15 s, and 4 ms per order), relayed by the
    /// config's `[rocketmq]` transport as timer (or delay-level) messages; the broker's delivery
    /// closes them, the outbox timer takes back what is late. The report counts closes by who made them. The
    /// bench uses topics and groups of its own (the config's names with `_BENCH`).
    Broker,
    /// As `broker`, with `rocketmq.delay_mode = "levels"`: the 18 fixed delay levels, chained
    /// hop by hop (brokers without the timer wheel).
    BrokerLevels,
}

impl BenchPath {
    fn is_broker(self) -> bool {
        matches!(self, BenchPath::Broker | BenchPath::BrokerLevels)
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchArgs {
    /// The daemon's configuration; its database URL names the server (a fresh database is
    /// made on it), its `[outbox]`, `[dispatch]` and merchants are used as they are.
    pub config: Config,
    /// Trigger path.
    pub path: BenchPath,
    /// Orders in the burst (the baseline closes as many again).
    pub orders: u32,
    /// SKUs the orders' lines draw on (at least 1; 1 is a flash sale on one stock row).
    pub skus: u32,
    /// How the daemon's closes give stock back; `None`: as the config's `[dispatch.stock]`.
    pub stock: Option<crate::config::StockMode>,
    /// How far ahead of the start the shared deadline is put, ms.
    pub lead_ms: i64,
    /// Merchant whose plugin decides (default: the first configured).
    pub merchant: Option<String>,
    /// Daemons draining the burst together (scale-out), each with its own pool and sources, in
    /// this process.
    pub daemons: u32,
    /// Deadlines this far apart, ms (0: one shared instant). Order k is due at the first
    /// deadline + k × spread.
    pub spread_ms: i64,
    /// PAID/CLOSED orders with PROCESSED outbox rows seeded first ([`seed::history`]).
    pub history: u32,
    /// Run a retention pass ([`crate::retention::pass`]) over the history while the burst
    /// drains.
    pub clean_history: bool,
    /// Where to draw the run as an SVG ([`plot`]), if anywhere.
    pub plot: Option<std::path::PathBuf>,
}

/// Runs the bench and returns its report (also printed as a table and one JSON line by the
/// command). Progress goes to stderr.
///
/// # Errors
/// Anything that stops the run: the server unreachable, the daemon not starting, the burst not
/// draining within its time limit (max(120 s, N / 20 s)).
pub async fn run(args: BenchArgs) -> anyhow::Result<Report> {
    let merchant = match &args.merchant {
        Some(m) if args.config.merchants.contains_key(m) => m.clone(),
        Some(m) => anyhow::bail!("--merchant {m}: no such merchant in the config"),
        None => args
            .config
            .merchants
            .keys()
            .next()
            .cloned()
            .context("the config has no merchants")?,
    };
    let (url, _tempdir) = seed::fresh_database(&args.config.database.url).await?;
    let max_connections = args.config.database.pool_size(&url);
    let db = Db::connect(&url, max_connections).await?;
    db.migrate().await?;
    let backend = db.backend();
    let n = args.orders;
    progress(format_args!("seeding 3 × {n} orders on {backend:?}"));
    let with_rows = args.path != BenchPath::Sweep;
    let shape = seed::seed(&db, &merchant, n, args.skus, with_rows).await?;
    if args.history > 0 {
        progress(format_args!(
            "history: {} PAID/CLOSED orders with PROCESSED outbox rows",
            args.history
        ));
        seed::history(&db, &merchant, args.history).await?;
    }

    let connections = match backend {
        Backend::Sqlite => 1,
        _ => args.config.outbox.concurrency.min(max_connections).max(1),
    };
    progress(format_args!(
        "baseline: {n} closes, one transaction each, {connections} connection(s)"
    ));
    let before = counters::Counters::read(&db).await;
    let baseline = baseline::run(&db, &merchant, n, args.skus, connections).await?;
    let after = counters::Counters::read(&db).await;
    let baseline_counts = after.since(&before, n);
    let group = args.config.outbox.group_commit.max(1);
    progress(format_args!(
        "set-based baseline: {n} closes in groups of {group}, {connections} connection(s)"
    ));
    let before = counters::Counters::read(&db).await;
    let set_based =
        baseline::run_set_based(&db, &merchant, n, args.skus, connections, group).await?;
    let after = counters::Counters::read(&db).await;
    let set_based_counts = after.since(&before, n);
    db.close().await;

    let mut config = args.config.clone();
    if let Some(mode) = args.stock {
        config.dispatch.stock.mode = mode;
    }
    config.database.url = url.clone();
    config.database.migrate = false;
    config.http = None;
    config.admin = None;
    config.alerts = None;
    // The merchant's notices go to the bench's own webhook, timed from each close to its 2xx.
    let receiver = {
        let db = Db::connect(&url, 1).await?;
        let receiver = notices::Receiver::start(&db).await;
        db.close().await;
        receiver
    }
    .context("starting the notice receiver")?;
    config.notify.channels.insert(
        notices::CHANNEL.to_string(),
        crate::config::ChannelConfig::Webhook {
            url: receiver.url.clone(),
            authorization: None,
            timeout: Duration::from_secs(5),
        },
    );
    if let Some(m) = config.merchants.get_mut(&merchant) {
        m.settings
            .insert("channel".to_string(), notices::CHANNEL.to_string());
    }
    let mut lead_ms = args.lead_ms;
    if args.path.is_broker() {
        anyhow::ensure!(
            config.rocketmq.is_some(),
            "--path broker needs a config with [rocketmq] (config/rocketmq.toml)"
        );
        // The relay publishes rows due later than relay_lead; leave it time to send them all,
        // and the broker time to put them in its timer wheel: rocketmq-rust 1.0.0's release
        // build takes about 17 s for 10,000 (a burst sent 15 s ahead came back 1.2-2.5 s late
        // whatever the lead; sent 40 s ahead, all before the due time). A shop's orders are
        // sent minutes ahead.
        lead_ms = lead_ms.max(15_000).max(4 * i64::from(n));
        // Topics and groups of the bench's own, so no daemon on the config's topic ever sees
        // the bench's orders' messages (nor the bench theirs).
        if let Some(r) = config.rocketmq.as_mut() {
            r.topic = format!("{}_BENCH", r.topic);
            r.consumer_group = format!("{}_BENCH", r.consumer_group);
            r.producer_group = format!("{}_BENCH", r.producer_group);
            r.transaction_group = format!("{}_BENCH", r.transaction_group);
            r.notification_topic = format!("{}_BENCH", r.notification_topic);
            if args.path == BenchPath::BrokerLevels {
                r.delay_mode = crate::config::DelayMode::Levels;
            }
        }
    } else {
        config.rocketmq = None;
    }
    if args.path == BenchPath::Sweep {
        config.sweep.enabled = true;
        config.sweep.interval = Duration::from_secs(1);
        config.sweep.grace = Duration::ZERO;
    }
    let watch = match &config.rocketmq {
        Some(r) => Some(
            watch::Watch::start(r)
                .await
                .context("starting the bench's watching consumer group")?,
        ),
        None => None,
    };
    // Broker paths: the deadline is set before the daemons start. Their relay publishes every
    // row due within `timer_max` at once, so rows still at the seed's day-ahead due time would
    // go out as day-ahead timer messages (and come back only through the fallback); the lead
    // (at least 15 s) covers the start. The outbox path sets it after, so the start does not
    // eat into its 3 s lead.
    let db = Db::connect(&url, 2).await?;
    let put_deadline = || async {
        let deadline_ms = db.now_ms().await? + lead_ms;
        seed::set_deadline(&db, deadline_ms, args.spread_ms).await?;
        anyhow::Ok(deadline_ms)
    };
    let set_early = if args.path.is_broker() {
        Some(put_deadline().await?)
    } else {
        None
    };
    // The daemon phase's own peak RSS: what the seeding and the baseline reached is read
    // first, then the peak is reset to the current size.
    let setup_peak_rss_mib = counters::peak_rss_mib();
    let peak_reset = counters::reset_peak_rss();
    let mut daemons = Vec::new();
    for _ in 0..args.daemons.max(1) {
        daemons.push(
            Daemon::start(&config, Clock::Database)
                .await
                .context("starting the daemon")?,
        );
    }
    let deadline_ms = match set_early {
        Some(set) => set,
        None => put_deadline().await?,
    };
    for daemon in &daemons {
        daemon.waker().notify_one();
    }
    if args.spread_ms == 0 {
        progress(format_args!(
            "{} daemon(s): {n} orders due at one instant, {lead_ms} ms from now",
            daemons.len()
        ));
    } else {
        progress(format_args!(
            "{} daemon(s): {n} orders due {} ms apart, the first {lead_ms} ms from now",
            daemons.len(),
            args.spread_ms
        ));
    }
    let cleaning = args.clean_history.then(|| {
        let (url, retention) = (url.clone(), config.retention.clone());
        tokio::spawn(async move {
            let db = Db::connect(&url, 2).await?;
            // Into the burst: the pass starts a second before the deadline.
            tokio::time::sleep(Duration::from_millis(
                lead_ms.saturating_sub(1_000).max(0) as u64
            ))
            .await;
            let started = std::time::Instant::now();
            let deleted =
                crate::retention::pass(&db, &Clock::Database, &retention, "bench", None).await?;
            let total: u64 = deleted.iter().flatten().map(|(_, n)| n).sum();
            progress(format_args!(
                "retention: {total} rows deleted in {:.1} s, from a second before the deadline",
                started.elapsed().as_secs_f64()
            ));
            db.close().await;
            anyhow::Ok(total)
        })
    });
    let last_due_ms = deadline_ms + args.spread_ms * i64::from(n.saturating_sub(1));
    let before = counters::Counters::read(&db).await;
    let cpu_before = counters::cpu_seconds();
    let watcher_cpu_before = counters::thread_cpu_seconds(watch::WATCHER_THREADS);
    let limit_ms = (i64::from(n) * 50).max(120_000);
    // The drain starts at the deadline: the CPU readings start there.
    let lead_left_ms = deadline_ms - db.now_ms().await?;
    if lead_left_ms > 0 {
        tokio::time::sleep(Duration::from_millis(lead_left_ms as u64)).await;
    }
    let drain_start = bottleneck::Snapshot::take();
    // Polled every 100 ms, so the drain's end (and its CPU readings) is seen within 100 ms;
    // progress every 500 ms.
    let mut polls = Vec::new();
    for poll in 1u64.. {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let open = seed::open_orders(&db).await?;
        let now = db.now_ms().await?;
        let closed = u64::from(n).saturating_sub(open);
        polls.push((now - deadline_ms, closed));
        let since = now - last_due_ms;
        if now >= deadline_ms && (poll % 5 == 0 || open == 0) {
            progress(format_args!(
                "{closed} / {n} closed, {:.1} s after the (first) deadline",
                (now - deadline_ms) as f64 / 1000.0
            ));
        }
        if open == 0 {
            break;
        }
        anyhow::ensure!(
            since < limit_ms,
            "{open} of {n} orders still open {} s after the (last) deadline",
            since / 1000
        );
    }
    // The watching group is the bench's instrument, not the daemon: its threads' CPU is taken
    // out (what its exited threads used stays in, so the daemon's figure is an upper bound).
    let watcher_cpu_s = watch
        .as_ref()
        .map(|_| counters::thread_cpu_seconds(watch::WATCHER_THREADS) - watcher_cpu_before);
    let cpu_s = counters::cpu_seconds() - cpu_before - watcher_cpu_s.unwrap_or(0.0);
    let stock_back_ms = match config.dispatch.stock.mode {
        StockMode::Direct => None,
        StockMode::Journal => Some(stock_back(&db, deadline_ms, limit_ms).await?),
    };
    let daemon_peak_rss_mib = peak_reset.then(counters::peak_rss_mib);
    let drain_end = bottleneck::Snapshot::take();
    let bottleneck =
        bottleneck::Bottleneck::between(&drain_start, &drain_end, backend == Backend::Sqlite);
    if let Some(cleaning) = cleaning {
        cleaning.await.context("the retention pass")??;
    }
    progress(format_args!("waiting for the burst's notices"));
    let notice_latency = receiver
        .measure(&db, Duration::from_secs(60))
        .await
        .context("measuring the notices")?;
    for daemon in daemons {
        daemon.stop().await;
    }
    let released = match watch {
        Some(w) => {
            let released = w.released();
            w.stop().await;
            Some(released)
        }
        None => None,
    };
    let after = counters::Counters::read(&db).await;
    let daemon_counts = after.since(&before, n);
    let closes = report::Closes::read(&db, deadline_ms).await?;
    let report = report::collect(
        &db,
        &closes,
        report::Inputs {
            backend,
            path: args.path,
            daemons: args.daemons.max(1),
            orders: n,
            skus: args.skus,
            stock: config.dispatch.stock.mode,
            stock_back_ms,
            deadline_ms,
            spread_ms: args.spread_ms,
            history: args.history,
            baseline,
            baseline_counts,
            set_based,
            set_based_counts,
            set_based_group: group,
            daemon_counts,
            cpu_s,
            watcher_cpu_s,
            setup_peak_rss_mib,
            daemon_peak_rss_mib,
            bottleneck,
            notice_latency,
            polls,
            released,
            shape,
            database: url,
        },
    )
    .await?;
    if let Some(file) = &args.plot {
        plot::draw(&closes, file).with_context(|| format!("--plot {}", file.display()))?;
        progress(format_args!("plot written to {}", file.display()));
    }
    db.close().await;
    Ok(report)
}

/// Polls the stock journal every 20 ms until it is empty; returns when, ms after `deadline_ms`
/// (database clock).
///
/// # Errors
/// A query failing, or units still in the journal `limit_ms` after the deadline.
async fn stock_back(db: &Db, deadline_ms: i64, limit_ms: i64) -> anyhow::Result<i64> {
    loop {
        let pending = crate::db::stock_journal::units_pending(db, None).await?;
        let now = db.now_ms().await?;
        if pending == 0 {
            progress(format_args!(
                "every stock unit folded back {:.2} s after the deadline",
                (now - deadline_ms) as f64 / 1e3
            ));
            return Ok(now - deadline_ms);
        }
        anyhow::ensure!(
            now - deadline_ms < limit_ms,
            "{pending} stock units still in the journal {} s after the deadline",
            (now - deadline_ms) / 1000
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn progress(line: std::fmt::Arguments<'_>) {
    eprintln!("bench: {line}");
}
