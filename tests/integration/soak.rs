//! The soak (`scripts/soak`; ignored in the normal suite): three `timeoutd run` daemons on one
//! database under steady load, with no faults, for long enough that anything growing without
//! bound shows. The shop of the chaos run ([`crate::chaos::spawn_shop`]: coupons, flash-sale
//! slots taken in Redis, about 40 % of buyers paying through the paid callback or only at the
//! provider, the rest lapsing 4–12 s after creation) places `RATE` orders a second; the daemons
//! close the lapsed ones, give Redis stock back, tell a webhook receiver (failing 2 % of
//! requests) and close payments at a provider stub. Retention runs every minute: a window of
//! `RETAIN` seconds on the outbox, the decision log and dead letters, and of an hour on the
//! ledger (the floor config validation sets it: `redis.marker_ttl`).
//!
//! Every `REPORT` seconds it reads, per daemon: resident memory, threads, open file
//! descriptors and CPU (`/proc`), live tokio tasks and pooled connections (`/metrics`); and from
//! the database: its connections, the rows of each table, and the lateness of the orders
//! closed in the interval (`closed_at_ms − close_due_ms`). A reading also checks that every
//! daemon is alive and answering, that the shop kept its rate, and that each CLOSED order due
//! within the retention window has its decision. After the run it settles, runs the chaos run's
//! exactly-once audit, and judges growth ([`judge`]: medians of the first and last thirds of the
//! readings after a retention window). It fails on any fault, violation or growth. The readings
//! go to stdout (one JSON line per interval, then the summary), `soak.json` and a plot,
//! `soak.svg`, in `TIMEOUTD_SOAK_OUT` (default: a new directory under the system's temp dir).
//!
//! Knobs (environment): `TIMEOUTD_SOAK_MINUTES` (default 75: the ledger's hour-long window and
//! three readings after it), `TIMEOUTD_SOAK_RATE` (orders a second, default 300),
//! `TIMEOUTD_SOAK_REPORT_SECONDS` (default 300), `TIMEOUTD_SOAK_RETAIN_SECONDS` (default 300),
//! `TIMEOUTD_SOAK_OUT`; `TIMEOUTD_BIN` names the daemon binary (scripts/soak --release).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::json;
use timeoutd::db::Backend;

use crate::chaos::{
    Daemons, FLASH_ACTIVITY, FLASH_UNITS, SKUS, Shop, UNITS_PER_SKU, audit, daemon_config,
    decision_violations, knob, percentile, settle, shop_pools, spawn_shop, start_receiver,
};
use crate::fakes::Provider;
use crate::redis_server::PrivateRedis;
use crate::support::{Env, free_port};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the soak: scripts/soak"]
async fn mariadb() {
    run(Backend::MySql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the soak: scripts/soak --backend postgres"]
async fn postgres() {
    run(Backend::Postgres).await;
}

/// timeoutd's own tables, which retention (or, for the stock journal, the fold) keeps bounded
/// (the shop's `orders` grows by design).
const OWN_TABLES: [&str; 5] = [
    "order_timeout_msg",
    "effect_ledger",
    "decision_log",
    "dead_letter",
    "stock_journal",
];

/// The ledger's retention window, seconds: `redis.marker_ttl`'s floor of an hour, below which
/// config validation refuses it (a retried effect must find its idempotency marker), and
/// `retention.ledger` may not be shorter. The ledger grows through a run's first hour by design.
const LEDGER_RETAIN_S: u64 = 3_600;

/// The shop's concurrent writers (each with a connection of its own: [`shop_pools`]).
const SHOP_WRITERS: usize = 32;

/// One daemon at one reading (`/proc/PID` and its `/metrics`).
#[derive(Debug, Clone, Default, serde::Serialize)]
struct DaemonReading {
    /// Resident memory (`VmRSS`), MiB.
    rss_mib: f64,
    /// OS threads.
    threads: u64,
    /// Open file descriptors (sockets included).
    fds: u64,
    /// CPU over the interval, core-seconds (user + system).
    cpu_s: f64,
    /// Live tokio tasks (`timeoutd_runtime_alive_tasks`).
    tasks: f64,
    /// The database pool's connections, open and of those in use (`open − idle`), capped by
    /// `database.max_connections`.
    pool_open: f64,
    pool_in_use: f64,
}

/// One interval's reading.
#[derive(Debug, Clone, Default, serde::Serialize)]
struct Reading {
    /// Seconds since the load began.
    at_s: u64,
    daemons: Vec<DaemonReading>,
    /// The database server's connections to the run's database, less the soak's and the shop's
    /// own pools.
    db_connections: i64,
    /// Rows per table.
    rows: BTreeMap<&'static str, i64>,
    /// Ledger effects waiting for the executor (`timeoutd_ledger_pending`, the first daemon's
    /// sample of the database-wide count): an executor behind its producers shows here first.
    ledger_pending: f64,
    /// Orders created, closed in the interval.
    created: i64,
    closed: i64,
    /// Lateness of the interval's closes, ms: `closed_at_ms − close_due_ms` (the deadline, or
    /// the closing phase's due time for a two-phase policy).
    lateness_p50_ms: i64,
    lateness_p99_ms: i64,
    lateness_max_ms: i64,
    /// The shop's writes in the interval, ms from an order's turn on the schedule to its commit
    /// (waiting for a writer included).
    shop_write_p99_ms: i64,
    shop_write_max_ms: i64,
    /// The whole machine over the interval, % of all cores' time (`/proc/stat`): busy (neither
    /// idle nor waiting on I/O), and waiting on I/O.
    machine_busy_pct: f64,
    machine_iowait_pct: f64,
    /// What went wrong at this reading: a daemon gone or not answering, the shop behind its
    /// rate, a decision missing (checked while retention still keeps it).
    faults: Vec<String>,
}

async fn run(backend: Backend) {
    let minutes = knob("TIMEOUTD_SOAK_MINUTES", 75);
    let rate = knob("TIMEOUTD_SOAK_RATE", 300).max(1);
    let report = Duration::from_secs(knob("TIMEOUTD_SOAK_REPORT_SECONDS", 300).max(5));
    let retain = knob("TIMEOUTD_SOAK_RETAIN_SECONDS", 300).max(60);
    let seconds = minutes * 60;
    let out = std::env::var("TIMEOUTD_SOAK_OUT").map_or_else(
        |_| {
            tempfile::Builder::new()
                .prefix("timeoutd-soak-")
                .tempdir()
                .unwrap()
                .keep()
        },
        PathBuf::from,
    );
    std::fs::create_dir_all(&out).unwrap();

    let env = Env::new(backend).await;
    let dir = env.dir.path().to_path_buf();
    let skus: Vec<(String, i64)> = (0..SKUS)
        .map(|s| (format!("sku-{s:02}"), UNITS_PER_SKU))
        .collect();
    let sku_refs: Vec<(&str, i64)> = skus.iter().map(|(s, n)| (s.as_str(), *n)).collect();
    env.stock_up(&sku_refs).await;
    let redis_dir = dir.join("redis");
    std::fs::create_dir_all(&redis_dir).unwrap();
    let redis = PrivateRedis::start(&redis_dir).await;
    let _: () = redis
        .conn()
        .await
        .set(format!("activity:{{{FLASH_ACTIVITY}}}:stock"), FLASH_UNITS)
        .await
        .unwrap();
    let provider = Provider::start().await;
    let (receiver_url, inbox) = start_receiver(2, 0).await;
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
    let mut admin_ports = Vec::new();
    for i in 0..3 {
        let (port, admin) = (free_port(), free_port());
        let file = dir.join(format!("daemon-{i}.toml"));
        // The ledger's window is the marker TTL's floor, 1 h (config validation: a retried
        // effect must still find its Redis idempotency marker).
        let extra = format!(
            "marker_ttl = \"{LEDGER_RETAIN_S}s\"\n\
             [retention]\ninterval = \"1m\"\noutbox = \"{retain}s\"\ndecision_log = \"{retain}s\"\n\
             ledger = \"{LEDGER_RETAIN_S}s\"\ndead_letters = \"{retain}s\"\n\
             [admin]\nlisten = \"127.0.0.1:{admin}\"\nsample_interval = \"5s\"\n\
             [admin.tokens]\nsoak = \"soak-reader-token-0001\"\n"
        );
        std::fs::write(
            &file,
            daemon_config(
                &format!("url = \"{}\"\n", env.url),
                &redis.url(),
                &provider.base_url,
                &receiver_url,
                port,
                &swap_plugin,
                &extra,
            ),
        )
        .unwrap();
        daemons.configs.push(file);
        daemons.http_ports.push(port);
        daemons.children.push(None);
        daemons.start(i);
        admin_ports.push(admin);
    }
    eprintln!(
        "soak: {backend:?}, {rate} orders/s for {minutes} min, 3 daemons ({}), a reading every {} s, \
         retention window {retain} s (daemon logs in {}, readings to {})",
        crate::support::timeoutd_bin().display(),
        report.as_secs(),
        dir.display(),
        out.display()
    );

    let env = Arc::new(vec![env]);
    let fates = Arc::new(Mutex::new(BTreeMap::new()));
    let write_ms: Arc<Mutex<Vec<i64>>> = Arc::default();
    let pools = shop_pools(&env, SHOP_WRITERS).await;
    let shop = spawn_shop(Shop {
        pools: pools.clone(),
        fates: fates.clone(),
        books: provider.books.clone(),
        ports: daemons.http_ports.clone(),
        redis: redis::Client::open(redis.url()).unwrap(),
        orders: (rate * seconds) as usize,
        over: Duration::from_secs(seconds),
        writers: SHOP_WRITERS,
        write_ms: write_ms.clone(),
    });

    let pids: Vec<u32> = daemons
        .children
        .iter()
        .map(|c| c.as_ref().and_then(tokio::process::Child::id).unwrap())
        .collect();
    let ticks = clock_ticks();
    let http = reqwest::Client::new();
    let started = Instant::now();
    let mut readings: Vec<Reading> = Vec::new();
    let mut cpu_before: Vec<u64> = pids.iter().map(|p| cpu_ticks(*p)).collect();
    let mut window_start = env[0].db.now_ms().await.unwrap();
    let mut machine_before = machine_ticks();
    let mut created_so_far = 0i64;
    let mut next = started + report;
    while next <= started + Duration::from_secs(seconds) {
        tokio::time::sleep_until(next.into()).await;
        next += report;
        let now_ms = env[0].db.now_ms().await.unwrap();
        let mut reading = Reading {
            at_s: started.elapsed().as_secs(),
            ..Reading::default()
        };
        for (i, pid) in pids.iter().enumerate() {
            // A daemon that exited (a leak ends in the OOM killer) or stopped answering is a
            // fault, never a reading of zero.
            let exited = daemons.children[i]
                .as_mut()
                .is_none_or(|c| !matches!(c.try_wait(), Ok(None)));
            let cpu = cpu_ticks(*pid);
            let metrics = scrape(&http, admin_ports[i]).await;
            let sample = (
                status_field(*pid, "VmRSS:"),
                status_field(*pid, "Threads:"),
                metric(&metrics, "timeoutd_runtime_alive_tasks "),
                metric(&metrics, "timeoutd_db_pool_connections{state=\"open\"} "),
                metric(&metrics, "timeoutd_db_pool_connections{state=\"idle\"} "),
            );
            let (Some(rss_kib), Some(threads), Some(tasks), Some(open), Some(idle)) = sample else {
                reading.faults.push(format!(
                    "daemon {i} {} at {} s",
                    if exited {
                        "exited"
                    } else {
                        "did not answer /proc or /metrics"
                    },
                    reading.at_s
                ));
                reading.daemons.push(DaemonReading::default());
                continue;
            };
            if i == 0 {
                reading.ledger_pending =
                    metric(&metrics, "timeoutd_ledger_pending ").unwrap_or(0.0);
            }
            reading.daemons.push(DaemonReading {
                rss_mib: rss_kib as f64 / 1024.0,
                threads,
                fds: std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64),
                cpu_s: cpu.saturating_sub(cpu_before[i]) as f64 / ticks,
                tasks,
                pool_open: open,
                pool_in_use: open - idle,
            });
            cpu_before[i] = cpu;
        }
        database_reading(&env[0], window_start, now_ms, &mut reading).await;
        reading.db_connections -= i64::from(pools[0].pool().size());
        window_start = now_ms;
        let machine = machine_ticks();
        (reading.machine_busy_pct, reading.machine_iowait_pct) =
            machine_shares(machine_before, machine);
        machine_before = machine;
        let mut writes = std::mem::take(&mut *write_ms.lock().unwrap());
        writes.sort_unstable();
        reading.shop_write_p99_ms = percentile(&writes, 0.99);
        reading.shop_write_max_ms = writes.last().copied().unwrap_or(0);
        // The load is what the run claims: the shop kept up with its rate (within 10 %, counted
        // from the start, so an order held up across a reading's boundary counts where it lands).
        // And no interval collapsed (at least 75 % of its own share): late in a long run the
        // count from the start would hide a shop that had stopped.
        created_so_far += reading.created;
        let due = rate as f64 * started.elapsed().as_secs_f64().min(seconds as f64);
        let interval_due = rate as f64 * report.as_secs_f64();
        let mut short = Vec::new();
        if (reading.created as f64) < interval_due * 0.75 {
            short.push(format!(
                "the shop's rate collapsed in the interval ending at {} s: {} orders created, \
                 {interval_due:.0} due",
                reading.at_s, reading.created
            ));
        }
        if (created_so_far as f64) < due * 0.9 {
            short.push(format!(
                "the shop fell behind at {} s: {created_so_far} orders created so far, {due:.0} due",
                reading.at_s
            ));
        }
        for what in short {
            reading.faults.push(format!(
                "{what} (its writes: p99 {} ms, max {} ms; the machine {:.0} % busy, {:.0} % \
                 waiting on I/O)",
                reading.shop_write_p99_ms,
                reading.shop_write_max_ms,
                reading.machine_busy_pct,
                reading.machine_iowait_pct
            ));
        }
        // Every order due within the retention window that is CLOSED has its decision (the
        // final audit sees only the last window; this sees each one while it is kept).
        for fault in decision_violations(&env, now_ms - retain as i64 * 1_000).await {
            reading
                .faults
                .push(format!("{fault} (at {} s)", reading.at_s));
        }
        let line = json!({ "soak_reading": &reading });
        println!("{line}");
        eprintln!("{}", row(&reading));
        readings.push(reading);
    }
    shop.await.unwrap();
    eprintln!(
        "soak: load over after {:.0} s; settling",
        started.elapsed().as_secs_f64()
    );
    let settled_s = settle(&env, Duration::from_secs(300)).await;
    daemons.stop_all().await;

    // Retention deletes decisions older than its window (the daemons are stopped: no pass runs
    // after this reading of the clock); no order closes before its deadline, so every order due
    // since the clock less the window still has its decision.
    let retained_since = env[0].db.now_ms().await.unwrap() - retain as i64 * 1_000;
    let fates = fates.lock().unwrap().clone();
    let mut audited = audit(&env, &redis, &provider, &inbox, &fates, retained_since).await;
    audited
        .violations
        .extend(readings.iter().flat_map(|r| r.faults.iter().cloned()));
    let growth = judge(&readings, retain + 120, LEDGER_RETAIN_S + 120);
    let summary = json!({
        "soak": {
            "backend": format!("{backend:?}"),
            "daemon": crate::support::timeoutd_bin().display().to_string(),
            "minutes": minutes,
            "rate": rate,
            "orders": fates.len(),
            "settled_seconds": (settled_s * 10.0).round() / 10.0,
            "figures": audited.figures,
            "violations": audited.violations,
            "growth": growth,
        }
    });
    println!("{summary}");
    println!("{}", audited.table());
    std::fs::write(
        out.join("soak.json"),
        serde_json::to_string_pretty(&json!({ "summary": summary, "readings": readings })).unwrap(),
    )
    .unwrap();
    plot(&readings, &out.join("soak.svg")).unwrap();
    eprintln!("soak: readings and plot in {}", out.display());
    let grew: Vec<&String> = growth.iter().filter(|g| g.starts_with("GREW")).collect();
    let clean = audited.violations.is_empty() && grew.is_empty();
    let env = Arc::try_unwrap(env).unwrap_or_else(|_| panic!("the shop still holds the database"));
    for env in env {
        if clean {
            env.cleanup().await;
        } else {
            let _ = env.dir.keep();
        }
    }
    assert!(
        audited.violations.is_empty(),
        "soak audit failed (daemon logs kept in {}):\n{}",
        dir.display(),
        audited.violations.join("\n")
    );
    assert!(grew.is_empty(), "soak: grew without bound: {grew:?}");
}

/// The database's part of a reading: its connections, rows per table, and the orders created and
/// closed in `[from_ms, to_ms)` with their lateness.
async fn database_reading(env: &Env, from_ms: i64, to_ms: i64, reading: &mut Reading) {
    let one = |sql: &'static str| async move {
        let row = env
            .db
            .backend()
            .query(sql)
            .fetch_one(env.db.pool())
            .await
            .unwrap();
        sqlx::Row::get::<i64, _>(&row, 0)
    };
    reading.db_connections = match env.db.backend() {
        Backend::MySql => {
            one("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE()").await
        }
        Backend::Postgres => {
            one("SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database()").await
        }
        Backend::Sqlite => 0,
    } - i64::from(env.db.pool().size());
    for table in ["orders"].into_iter().chain(OWN_TABLES) {
        let sql = format!("SELECT COUNT(*) FROM {table}");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_one(env.db.pool())
            .await
            .unwrap();
        reading
            .rows
            .insert(table, sqlx::Row::get::<i64, _>(&row, 0));
    }
    let created = env
        .db
        .backend()
        .query("SELECT COUNT(*) FROM orders WHERE created_at_ms >= ? AND created_at_ms < ?")
        .bind(from_ms)
        .bind(to_ms)
        .fetch_one(env.db.pool())
        .await
        .unwrap();
    reading.created = sqlx::Row::get(&created, 0);
    let closed = env
        .db
        .backend()
        .query(
            "SELECT closed_at_ms - COALESCE(close_due_ms, deadline_ms) FROM orders \
             WHERE closed_at_ms >= ? AND closed_at_ms < ?",
        )
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(env.db.pool())
        .await
        .unwrap();
    let mut lateness: Vec<i64> = closed.iter().map(|r| sqlx::Row::get(r, 0)).collect();
    lateness.sort_unstable();
    reading.closed = lateness.len() as i64;
    reading.lateness_p50_ms = percentile(&lateness, 0.5);
    reading.lateness_p99_ms = percentile(&lateness, 0.99);
    reading.lateness_max_ms = lateness.last().copied().unwrap_or(0);
}

/// The judgement on growth over the steady readings (those at or after `steady_s` seconds; for
/// the ledger, `ledger_steady_s`): a line per figure, `GREW …` for one whose median over the last
/// third of its steady readings exceeds 1.2 × the median over the first third plus a slack in
/// the figure's own unit (MiB, descriptors, threads, tasks, connections, rows), so one noisy
/// reading neither hides nor fakes growth. Lateness p99 may not more than double (nor pass
/// 100 ms). Fewer than three steady readings: too short to judge, said so. The pools are capped
/// by `database.max_connections` and not judged; the server's connection count is.
fn judge(readings: &[Reading], steady_s: u64, ledger_steady_s: u64) -> Vec<String> {
    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }
    /// The medians of the first and the last third of `series`.
    fn ends(series: &[f64]) -> (f64, f64) {
        let third = (series.len() / 3).max(1);
        (
            median(series[..third].to_vec()),
            median(series[series.len() - third..].to_vec()),
        )
    }
    let verdict = |what: String, series: &[f64], slack: f64| {
        let (from, to) = ends(series);
        let word = if to > from * 1.2 + slack {
            "GREW"
        } else {
            "flat"
        };
        format!("{word} {what}: {from:.1} → {to:.1} (medians of the first and last thirds)")
    };
    let steady: Vec<&Reading> = readings.iter().filter(|r| r.at_s >= steady_s).collect();
    if steady.len() < 3 {
        return vec![format!(
            "too short to judge growth: {} readings after {steady_s} s (3 needed)",
            steady.len()
        )];
    }
    let mut out = Vec::new();
    for i in 0..steady[0].daemons.len() {
        let of = |f: &dyn Fn(&DaemonReading) -> f64| -> Vec<f64> {
            steady.iter().map(|r| f(&r.daemons[i])).collect()
        };
        out.push(verdict(
            format!("daemon {i} RSS MiB"),
            &of(&|d| d.rss_mib),
            8.0,
        ));
        out.push(verdict(
            format!("daemon {i} fds"),
            &of(&|d| d.fds as f64),
            8.0,
        ));
        out.push(verdict(
            format!("daemon {i} threads"),
            &of(&|d| d.threads as f64),
            4.0,
        ));
        out.push(verdict(
            format!("daemon {i} tasks"),
            &of(&|d| d.tasks),
            32.0,
        ));
    }
    let connections: Vec<f64> = steady.iter().map(|r| r.db_connections as f64).collect();
    out.push(verdict("database connections".into(), &connections, 2.0));
    for table in OWN_TABLES {
        let since = if table == "effect_ledger" {
            ledger_steady_s
        } else {
            steady_s
        };
        let rows: Vec<f64> = readings
            .iter()
            .filter(|r| r.at_s >= since)
            .map(|r| r.rows[table] as f64)
            .collect();
        if rows.len() >= 3 {
            out.push(verdict(format!("{table} rows"), &rows, 1_000.0));
        } else {
            out.push(format!(
                "NOT JUDGED {table} rows: fewer than 3 readings from {since} s on (its retention \
                 window and a pass); run longer"
            ));
        }
    }
    let p99: Vec<f64> = steady.iter().map(|r| r.lateness_p99_ms as f64).collect();
    let (from, to) = ends(&p99);
    out.push(format!(
        "{} lateness p99 ms: {from:.0} → {to:.0} (medians of the first and last thirds)",
        if to > (from * 2.0).max(100.0) {
            "GREW"
        } else {
            "flat"
        }
    ));
    out
}

/// One reading as a table row on stderr.
fn row(r: &Reading) -> String {
    let per = |f: &dyn Fn(&DaemonReading) -> String| {
        r.daemons.iter().map(f).collect::<Vec<_>>().join("/")
    };
    format!(
        "soak {:>5} s  created {:>6} closed {:>6}  late p50/p99/max {}/{}/{} ms  shop write p99/max {}/{} ms  \
         machine busy/iowait {:.0}/{:.0} %  RSS {} MiB  fds {}  threads {}  tasks {}  pool {}  cpu {} s  \
         db conns {}  ledger pending {:.0}  rows {}",
        r.at_s,
        r.created,
        r.closed,
        r.lateness_p50_ms,
        r.lateness_p99_ms,
        r.lateness_max_ms,
        r.shop_write_p99_ms,
        r.shop_write_max_ms,
        r.machine_busy_pct,
        r.machine_iowait_pct,
        per(&|d| format!("{:.0}", d.rss_mib)),
        per(&|d| d.fds.to_string()),
        per(&|d| d.threads.to_string()),
        per(&|d| format!("{:.0}", d.tasks)),
        per(&|d| format!("{:.0}", d.pool_open)),
        per(&|d| format!("{:.1}", d.cpu_s)),
        r.db_connections,
        r.ledger_pending,
        r.rows
            .iter()
            .map(|(t, n)| format!("{t}={n}"))
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// The clock ticks per second `/proc/PID/stat` counts CPU in (`getconf CLK_TCK`; 100 on Linux
/// unless told otherwise).
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// User plus system CPU of `pid`, clock ticks (`/proc/PID/stat` fields 14 and 15, counted
/// after the command name's closing parenthesis; proc(5)).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After ")": field 3 (state) is index 0, so fields 14 and 15 are indexes 11 and 12.
    fields
        .get(11..13)
        .map_or(0, |f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum())
}

/// The machine's CPU time so far, in clock ticks over all cores (`/proc/stat`'s `cpu` line):
/// (total, idle, iowait).
fn machine_ticks() -> (u64, u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let total = fields.iter().take(8).sum();
    (
        total,
        fields.get(3).copied().unwrap_or(0),
        fields.get(4).copied().unwrap_or(0),
    )
}

/// Between two [`machine_ticks`]: the % of all cores' time busy and the % waiting on I/O.
fn machine_shares(before: (u64, u64, u64), after: (u64, u64, u64)) -> (f64, f64) {
    let total = after.0.saturating_sub(before.0).max(1) as f64;
    let idle = after.1.saturating_sub(before.1) as f64;
    let iowait = after.2.saturating_sub(before.2) as f64;
    (
        100.0 * (total - idle - iowait) / total,
        100.0 * iowait / total,
    )
}

/// A `Name:  value kB`-style number of `/proc/PID/status` (`None`: the process is gone, or a
/// zombie, which has no `VmRSS`).
fn status_field(pid: u32, name: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// The daemon's Prometheus page (empty when it does not answer).
async fn scrape(http: &reqwest::Client, admin_port: u16) -> String {
    match http
        .get(format!("http://127.0.0.1:{admin_port}/metrics"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
    {
        Ok(answer) => answer.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// The value of the sample line starting with `prefix` (name, labels and a space); `None` when
/// the page has none (the daemon did not answer).
fn metric(page: &str, prefix: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// Four charts over the run's minutes: resident memory per daemon, open file descriptors and
/// live tasks per daemon, lateness p50 and p99, and the rows of timeoutd's own tables.
fn plot(readings: &[Reading], file: &Path) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = SVGBackend::new(file, (1200, 800)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((2, 2));
    let minutes = |r: &Reading| r.at_s as f64 / 60.0;
    let x_max = readings.last().map_or(1.0, minutes).max(1.0);
    let colours = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];
    let draw = |panel: &DrawingArea<SVGBackend, plotters::coord::Shift>,
                title: &str,
                series: Vec<(String, Vec<(f64, f64)>)>|
     -> Result<(), Box<dyn std::error::Error>> {
        let y_max = series
            .iter()
            .flat_map(|(_, s)| s.iter().map(|p| p.1))
            .fold(1.0_f64, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(panel)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
        chart
            .configure_mesh()
            .x_desc("minutes")
            .light_line_style(WHITE)
            .draw()?;
        for (i, (name, points)) in series.into_iter().enumerate() {
            let colour = colours[i % colours.len()];
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(2)))?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        Ok(())
    };
    let per_daemon = |f: &dyn Fn(&DaemonReading) -> f64, what: &str| {
        (0..readings.first().map_or(0, |r| r.daemons.len()))
            .map(|i| {
                (
                    format!("{what} {i}"),
                    readings
                        .iter()
                        .map(|r| (minutes(r), f(&r.daemons[i])))
                        .collect(),
                )
            })
            .collect::<Vec<_>>()
    };
    draw(
        &panels[0],
        "resident memory, MiB",
        per_daemon(&|d| d.rss_mib, "daemon"),
    )?;
    let mut handles = per_daemon(&|d| d.fds as f64, "fds");
    handles.extend(per_daemon(&|d| d.tasks, "tasks"));
    draw(&panels[1], "open fds and live tasks", handles)?;
    draw(
        &panels[2],
        "lateness of the interval's closes, ms",
        vec![
            (
                "p50".into(),
                readings
                    .iter()
                    .map(|r| (minutes(r), r.lateness_p50_ms as f64))
                    .collect(),
            ),
            (
                "p99".into(),
                readings
                    .iter()
                    .map(|r| (minutes(r), r.lateness_p99_ms as f64))
                    .collect(),
            ),
        ],
    )?;
    draw(
        &panels[3],
        "rows of timeoutd's own tables (retention on)",
        OWN_TABLES
            .iter()
            .map(|t| {
                (
                    (*t).to_string(),
                    readings
                        .iter()
                        .map(|r| (minutes(r), r.rows[t] as f64))
                        .collect(),
                )
            })
            .collect(),
    )?;
    root.present()?;
    Ok(())
}
