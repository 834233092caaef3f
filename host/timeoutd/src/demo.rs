//! `timeoutd demo`: the whole product on the embedded default (SQLite), with nothing but the
//! binary. A reference order service creates orders that lapse within seconds, a shopper pays a
//! share of them (some right at the deadline, racing the close), and the daemon runs until every
//! order is PAID or CLOSED. The report checks that stock and coupons were exactly conserved.

mod report;
mod shop;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

pub use report::{DemoReport, Lateness};

use crate::clock::Clock;
use crate::config::Config;
use crate::daemon::Daemon;

/// The demo's configuration (`config/demo.toml`), embedded in the binary.
pub const DEMO_CONFIG: &str = include_str!("../../../config/demo.toml");

/// Runs the demo with `orders` orders, keeping the SQLite database in `data_dir` (a fresh
/// temporary directory, kept afterwards, when `None`). Prints progress on a terminal, then the
/// summary, and with `json` a final line holding the report as one JSON object.
///
/// # Errors
/// When the database or the daemon cannot be set up, or orders are still open long after their
/// deadlines (the message lists them).
pub async fn run(orders: u32, data_dir: Option<PathBuf>, json: bool) -> anyhow::Result<DemoReport> {
    let dir = match data_dir {
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
            dir
        }
        None => tempfile::Builder::new()
            .prefix("timeoutd-demo-")
            .tempdir()?
            .keep(),
    };
    let dir = dir.canonicalize()?;
    let db_path = dir.join("timeoutd.db");
    if db_path.exists() {
        anyhow::bail!(
            "{} already exists; give the demo a fresh --data-dir",
            db_path.display()
        );
    }
    let dir_text = dir.display().to_string();
    let config = Config::from_toml(DEMO_CONFIG, &dir, &|k| {
        (k == "TIMEOUTD_DATA_DIR").then(|| dir_text.clone())
    })
    .map_err(|p| anyhow::anyhow!("config/demo.toml: {p}"))?;

    let daemon = Daemon::start(&config, Clock::Database).await?;
    let db = daemon.db().clone();
    let shop = shop::Shop::open(db.clone(), &config, orders).await?;
    let initial_stock_units = shop.initial_stock_units();
    let longest_ms = shop.longest_close_ms();
    let started_ms = db.now_ms().await?;

    let shopping = tokio::spawn(shop.run(daemon.waker()));
    let progress = std::io::stderr().is_terminal();
    // Counted from the last order created: at 20,000 orders the shop itself (one transaction
    // per order, like an order service) takes longer than the three seconds it aims for.
    let mut give_up_ms = started_ms + longest_ms + 60_000;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let counts = report::counts(&db).await?;
        if progress {
            eprint!(
                "\r  created {:>6}/{orders}   paid {:>6}   closed {:>6}   open {:>6} ",
                counts.total, counts.paid, counts.closed, counts.pending
            );
        }
        if shopping.is_finished() && counts.total == i64::from(orders) && counts.pending == 0 {
            break;
        }
        let now_ms = db.now_ms().await?;
        if !shopping.is_finished() {
            give_up_ms = give_up_ms.max(now_ms + longest_ms + 60_000);
        }
        if now_ms > give_up_ms {
            let open = report::open_orders(&db).await?;
            anyhow::bail!(
                "{} order(s) still open long after their deadlines: {open:?}",
                open.len()
            );
        }
    }
    if progress {
        eprintln!();
    }
    shopping.await.context("shopper task")??;
    daemon.stop().await;

    let db = crate::db::Db::connect(&format!("sqlite://{}", db_path.display()), 1).await?;
    let report = DemoReport::gather(&db, orders, initial_stock_units, &db_path).await?;
    db.close().await;
    println!("{}", report.summary());
    if json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(report)
}
