//! The soak (`scripts/soak`; ignored in the normal suite): three `timeoutd run` daemons on one
//! database under steady load, with no faults, for long enough that anything growing without
//! bound shows. The shop of the chaos run ([`crate::chaos::spawn_shop`]: coupons, flash-sale
//! slots taken in Redis, about 40 % of buyers paying through the paid callback or only at the
//! provider, the rest lapsing 4–12 s after creation) places `RATE` orders a second; the daemons
//! close the lapsed ones, give Redis stock back, tell a webhook receiver (failing 2 % of
//! requests) and close payments at a provider stub. Retention runs every minute with a window of
//! `RETAIN` seconds on every table of timeoutd's own.
//!
//! Every `REPORT` seconds it reads, per daemon: resident memory, threads, open file
//! descriptors and CPU (`/proc`), live tokio tasks and pooled connections (`/metrics`); and from
//! the database: its connections, the rows of each table, and the lateness of the orders
//! closed in the interval (`closed_at_ms − deadline_ms`, over the policy's own close instant).
//! After the run it settles, runs the chaos run's exactly-once audit, and judges growth: from
//! the first reading after a full retention window to the last, no per-daemon figure or own
//! table may grow by more than half (plus a small slack), and lateness p99 may not double. The
//! readings go to stdout (one JSON line per interval, then the summary), `soak.json` and a plot,
//! `soak.svg`, in `TIMEOUTD_SOAK_OUT` (default: a new directory under the system's temp dir).
//!
//! Knobs (environment): `TIMEOUTD_SOAK_MINUTES` (default 60), `TIMEOUTD_SOAK_RATE` (orders a
//! second, default 300), `TIMEOUTD_SOAK_REPORT_SECONDS` (default 300),
//! `TIMEOUTD_SOAK_RETAIN_SECONDS` (default 300), `TIMEOUTD_SOAK_OUT`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::json;
use timeoutd::db::Backend;

use crate::chaos::{
    Daemons, FLASH_ACTIVITY, FLASH_UNITS, GRACE_MS, SKUS, Shop, UNITS_PER_SKU, audit,
    daemon_config, knob, percentile, settle, spawn_shop, start_receiver,
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

/// timeoutd's own tables, which retention keeps bounded (the shop's `orders` grows by design).
const OWN_TABLES: [&str; 4] = [
    "order_timeout_msg",
    "effect_ledger",
    "decision_log",
    "dead_letter",
];

/// The ledger's retention window, seconds: `redis.marker_ttl`'s floor of an hour, below which
/// config validation refuses it (a retried effect must find its idempotency marker), and
/// `retention.ledger` may not be shorter. The ledger grows through a run's first hour by design.
const LEDGER_RETAIN_S: u64 = 3_600;

/// One daemon at one reading.
#[derive(Debug, Clone, Default, serde::Serialize)]
struct DaemonReading {
    rss_mib: f64,
    threads: u64,
    fds: u64,
    /// CPU over the interval, core-seconds.
    cpu_s: f64,
    tasks: f64,
    pool_open: f64,
}

/// One interval's reading.
#[derive(Debug, Clone, Default, serde::Serialize)]
struct Reading {
    /// Seconds since the load began.
    at_s: u64,
    daemons: Vec<DaemonReading>,
    /// The database server's connections to the run's database.
    db_connections: i64,
    /// Rows per table.
    rows: BTreeMap<&'static str, i64>,
    /// Orders created, closed in the interval.
    created: i64,
    closed: i64,
    lateness_p50_ms: i64,
    lateness_p99_ms: i64,
    lateness_max_ms: i64,
}

async fn run(backend: Backend) {
    let minutes = knob("TIMEOUTD_SOAK_MINUTES", 60);
    let rate = knob("TIMEOUTD_SOAK_RATE", 300).max(1);
    let report = Duration::from_secs(knob("TIMEOUTD_SOAK_REPORT_SECONDS", 300).max(5));
    let retain = knob("TIMEOUTD_SOAK_RETAIN_SECONDS", 300).max(60);
    let seconds = minutes * 60;
    let out = std::env::var("TIMEOUTD_SOAK_OUT").map_or_else(
        |_| {
            std::env::temp_dir().join(format!(
                "timeoutd-soak-{}",
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs()
            ))
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
        "soak: {backend:?}, {rate} orders/s for {minutes} min, 3 daemons, a reading every {} s, \
         retention window {retain} s (daemon logs in {}, readings to {})",
        report.as_secs(),
        dir.display(),
        out.display()
    );

    let env = Arc::new(vec![env]);
    let fates = Arc::new(Mutex::new(BTreeMap::new()));
    let shop = spawn_shop(Shop {
        shards: env.clone(),
        fates: fates.clone(),
        books: provider.books.clone(),
        ports: daemons.http_ports.clone(),
        redis: redis::Client::open(redis.url()).unwrap(),
        orders: (rate * seconds) as usize,
        over: Duration::from_secs(seconds),
        writers: 32,
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
            let cpu = cpu_ticks(*pid);
            let metrics = scrape(&http, admin_ports[i]).await;
            reading.daemons.push(DaemonReading {
                rss_mib: status_field(*pid, "VmRSS:") as f64 / 1024.0,
                threads: status_field(*pid, "Threads:"),
                fds: std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64),
                cpu_s: cpu.saturating_sub(cpu_before[i]) as f64 / ticks,
                tasks: metric(&metrics, "timeoutd_runtime_alive_tasks "),
                pool_open: metric(&metrics, "timeoutd_db_pool_connections{state=\"open\"} "),
            });
            cpu_before[i] = cpu;
        }
        database_reading(&env[0], window_start, now_ms, &mut reading).await;
        window_start = now_ms;
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
    // after this reading of the clock). Orders closed before it, less 10 s for a close's stamp
    // and its decision's, are judged by the conservation checks alone.
    let retained_since = env[0].db.now_ms().await.unwrap() - (retain as i64 - 10) * 1_000;
    let fates = fates.lock().unwrap().clone();
    let audited = audit(&env, &redis, &provider, &inbox, &fates, retained_since).await;
    let growth = judge(&readings, retain + 120, LEDGER_RETAIN_S + 120);
    let summary = json!({
        "soak": {
            "backend": format!("{backend:?}"),
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
    };
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
            "SELECT merchant_id, closed_at_ms - deadline_ms FROM orders \
             WHERE closed_at_ms >= ? AND closed_at_ms < ?",
        )
        .bind(from_ms)
        .bind(to_ms)
        .fetch_all(env.db.pool())
        .await
        .unwrap();
    let mut lateness: Vec<i64> = closed
        .iter()
        .map(|r| {
            let merchant: String = sqlx::Row::get(r, 0);
            let late: i64 = sqlx::Row::get(r, 1);
            // `flashy` (two-phase) closes its grace after the deadline.
            if merchant == "flashy" {
                late - GRACE_MS
            } else {
                late
            }
        })
        .collect();
    lateness.sort_unstable();
    reading.closed = lateness.len() as i64;
    reading.lateness_p50_ms = percentile(&lateness, 0.5);
    reading.lateness_p99_ms = percentile(&lateness, 0.99);
    reading.lateness_max_ms = lateness.last().copied().unwrap_or(0);
}

/// The judgement on growth: a line per figure, `GREW …` for one that grew by more than half
/// (plus a slack) from the first reading at or after `steady_s` seconds to the last (for the
/// ledger, `ledger_steady_s`); lateness p99 may not more than double (and stay above 100 ms).
/// Fewer than three steady readings: too short to judge, said so.
fn judge(readings: &[Reading], steady_s: u64, ledger_steady_s: u64) -> Vec<String> {
    let steady: Vec<&Reading> = readings.iter().filter(|r| r.at_s >= steady_s).collect();
    if steady.len() < 3 {
        return vec![format!(
            "too short to judge growth: {} readings after {steady_s} s (3 needed)",
            steady.len()
        )];
    }
    let (first, last) = (steady[0], steady[steady.len() - 1]);
    let mut out = Vec::new();
    let check = |what: String, from: f64, to: f64, slack: f64| {
        let verdict = if to > from * 1.5 + slack {
            "GREW"
        } else {
            "flat"
        };
        format!("{verdict} {what}: {from:.1} → {to:.1}")
    };
    for (i, (a, b)) in first.daemons.iter().zip(&last.daemons).enumerate() {
        out.push(check(
            format!("daemon {i} RSS MiB"),
            a.rss_mib,
            b.rss_mib,
            16.0,
        ));
        out.push(check(
            format!("daemon {i} fds"),
            a.fds as f64,
            b.fds as f64,
            8.0,
        ));
        out.push(check(
            format!("daemon {i} threads"),
            a.threads as f64,
            b.threads as f64,
            4.0,
        ));
        out.push(check(format!("daemon {i} tasks"), a.tasks, b.tasks, 64.0));
        out.push(check(
            format!("daemon {i} pooled connections"),
            a.pool_open,
            b.pool_open,
            2.0,
        ));
    }
    out.push(check(
        "database connections".into(),
        first.db_connections as f64,
        last.db_connections as f64,
        4.0,
    ));
    for table in OWN_TABLES {
        let since = if table == "effect_ledger" {
            ledger_steady_s
        } else {
            steady_s
        };
        match readings.iter().find(|r| r.at_s >= since) {
            Some(from) if last.at_s > from.at_s => out.push(check(
                format!("{table} rows"),
                from.rows[table] as f64,
                last.rows[table] as f64,
                1_000.0,
            )),
            _ => out.push(format!(
                "not judged: {table} rows (its retention window has not passed: judged from {since} s on)"
            )),
        }
    }
    let (p99_first, p99_last) = (first.lateness_p99_ms as f64, last.lateness_p99_ms as f64);
    let verdict = if p99_last > (p99_first * 2.0).max(100.0) {
        "GREW"
    } else {
        "flat"
    };
    out.push(format!(
        "{verdict} lateness p99 ms: {p99_first:.0} → {p99_last:.0}"
    ));
    out
}

/// One reading as a table row on stderr.
fn row(r: &Reading) -> String {
    let per = |f: &dyn Fn(&DaemonReading) -> String| {
        r.daemons.iter().map(f).collect::<Vec<_>>().join("/")
    };
    format!(
        "soak {:>5} s  created {:>6} closed {:>6}  late p50/p99/max {}/{}/{} ms  RSS {} MiB  fds {}  \
         threads {}  tasks {}  pool {}  cpu {} s  db conns {}  rows {}",
        r.at_s,
        r.created,
        r.closed,
        r.lateness_p50_ms,
        r.lateness_p99_ms,
        r.lateness_max_ms,
        per(&|d| format!("{:.0}", d.rss_mib)),
        per(&|d| d.fds.to_string()),
        per(&|d| d.threads.to_string()),
        per(&|d| format!("{:.0}", d.tasks)),
        per(&|d| format!("{:.0}", d.pool_open)),
        per(&|d| format!("{:.1}", d.cpu_s)),
        r.db_connections,
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

/// A `Name:  value kB`-style number of `/proc/PID/status`.
fn status_field(pid: u32, name: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
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

/// The value of the sample line starting with `prefix` (name, labels and a space), 0 when absent.
fn metric(page: &str, prefix: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
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
