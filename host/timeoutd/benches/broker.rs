//! N timeouts through the real broker into closes on MariaDB: N orders share one deadline a few
//! seconds ahead (F1's burst), the outbox relay publishes each as a timer (or delay-level)
//! message, the consumer closes them. Prints closes/s (from the deadline to the last close) and
//! close lateness p50/p99/max.
//!
//! Needs the broker (`scripts/rocketmq start`) and MariaDB:
//! `cargo bench -p timeoutd --bench broker -- [N] [levels|timer]` (default 2000, timer).
//! `$TIMEOUTD_ROCKETMQ_NAMESRV` and `$TIMEOUTD_TEST_MYSQL_URL` override the addresses.

use std::time::{Duration, Instant};

use sqlx::Row;
use timeoutd::clock::Clock;
use timeoutd::config::Config;
use timeoutd::daemon::Daemon;
use timeoutd::db::Db;
use timeoutd_runtime::model::{Order, OrderItem, OrderStatus};

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let n: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let mode = args.get(1).cloned().unwrap_or_else(|| "timer".into());
    let namesrv =
        std::env::var("TIMEOUTD_ROCKETMQ_NAMESRV").unwrap_or_else(|_| "127.0.0.1:19876".into());
    let server = std::env::var("TIMEOUTD_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let tag = format!("{:08x}", fastrand::u32(..));
    let name = format!("timeoutd_bench_{tag}");
    let admin = Db::connect(&server, 1).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(admin.pool())
        .await?;
    let url = format!(
        "{}/{name}",
        server.rsplit_once('/').map_or(server.as_str(), |(b, _)| b)
    );
    let toml = format!(
        "[database]\nurl = \"{url}\"\nmax_connections = 32\n\
         [sweep]\nenabled = false\n[runtime]\ndeadline = \"2s\"\n\
         [rocketmq]\nnamesrv = \"{namesrv}\"\ntopic = \"BENCH_{tag}\"\nconsumer_group = \"BENCH_G_{tag}\"\n\
         producer_group = \"BENCH_P_{tag}\"\ntransaction_group = \"BENCH_TX_{tag}\"\n\
         route_refresh = \"10s\"\nconsume_from = \"first\"\ndelay_mode = \"{mode}\"\n\
         fallback_after = \"60s\"\nconsume_threads = 32\n\
         [merchants.acme]\nplugin = \"builtin:single-phase\"\n"
    );
    let config = Config::from_toml(&toml, std::path::Path::new("."), &|_| None)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let daemon = Daemon::start(&config, Clock::Database).await?;
    let db = daemon.db().clone();
    db.backend()
        .query("INSERT INTO sku_stock (sku, available) VALUES ('sku-a', ?)")
        .bind(n as i64 * 10)
        .execute(db.pool())
        .await?;
    // Everyone's deadline: far enough ahead for the relay to publish all rows first.
    let deadline = db.now_ms().await? + 8_000 + n as i64 * 2;
    let created = Instant::now();
    for chunk in (0..n).collect::<Vec<_>>().chunks(200) {
        let mut tx = db.begin().await?;
        for i in chunk {
            let order = Order {
                id: format!("b-{i}"),
                merchant: "acme".into(),
                user: format!("u-{i}"),
                status: OrderStatus::Pending,
                created_at_ms: deadline - 900_000,
                deadline_ms: deadline,
                total_cents: 1_000,
                items: vec![OrderItem {
                    sku: "sku-a".into(),
                    quantity: 1,
                    unit_price_cents: 1_000,
                }],
                coupon: None,
                flash_activity: None,
                payment_ref: None,
            };
            timeoutd::db::orders::create(&mut tx, &order).await?;
        }
        tx.commit().await?;
    }
    eprintln!(
        "{n} orders created in {:?}; deadline in {} ms",
        created.elapsed(),
        deadline - db.now_ms().await?
    );
    let limit = Instant::now() + Duration::from_secs(120 + n as u64 / 50);
    loop {
        let open: i64 = db
            .backend()
            .query("SELECT COUNT(*) FROM orders WHERE status = 'PENDING'")
            .fetch_one(db.pool())
            .await?
            .try_get(0)?;
        if open == 0 || Instant::now() > limit {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let rows = db
        .backend()
        .query("SELECT closed_at_ms, closed_by FROM orders WHERE status = 'CLOSED'")
        .fetch_all(db.pool())
        .await?;
    let mut lateness: Vec<i64> = Vec::with_capacity(rows.len());
    let mut by_message = 0;
    for r in &rows {
        lateness.push(r.try_get::<i64, _>(0)? - deadline);
        if r.try_get::<String, _>(1)? == "delay-message" {
            by_message += 1;
        }
    }
    lateness.sort_unstable();
    let pct = |p: f64| lateness[((lateness.len() as f64 - 1.0) * p) as usize];
    let span_ms = lateness.last().copied().unwrap_or(0).max(1);
    println!(
        "broker bench ({mode}): {} of {n} closed ({by_message} by message); {:.0} closes/s; \
         lateness p50 {} ms, p99 {} ms, max {} ms",
        rows.len(),
        rows.len() as f64 * 1000.0 / span_ms as f64,
        pct(0.50),
        pct(0.99),
        span_ms
    );
    daemon.stop().await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {name}")))
        .execute(admin.pool())
        .await?;
    Ok(())
}
