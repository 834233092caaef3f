//! The chaos run on a shop's own tables (`scripts/chaos --schema mall`): three `timeoutd run`
//! daemons closing macrozheng/mall's orders through the shipped profile, on MariaDB (or, with
//! `--backend postgres`, PostgreSQL: mall's tables in a schema of their own) behind a
//! proxy, while a daemon is SIGKILLed every 5–15 s and restarted and the database is cut off for
//! 10 s once. The shop places orders as mall's `generateOrder` does, each falling due a few
//! seconds into the run; 40 % are paid as mall pays (status 0 → 1, a compare-and-set racing the
//! close), half of the rest are armed in timeoutd's outbox by the order service, the others are
//! left to the sweep. Then an audit over mall's tables: every order paid or closed, never both;
//! each closed order's locks, coupon row and points given back exactly once, and never before
//! it was due; each paid order's kept.
//!
//! Knobs: `TIMEOUTD_CHAOS_SECONDS` (default 120), `TIMEOUTD_CHAOS_ORDERS` (default 1500),
//! `TIMEOUTD_CHAOS_SETTLE_SECONDS` (default 180), `TIMEOUTD_CHAOS_MALL_BACKEND` (`mariadb`, the
//! default, or `postgres`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::Row;
use tokio::process::{Child, Command};

use crate::fakes::Proxy;
use timeoutd::db::Backend;

use crate::shop::{Mall, Placed, profile_path};
use crate::support::timeoutd_bin;

/// mall's window in the fixture (`normal_order_overtime`, 15 minutes), ms.
const WINDOW_MS: i64 = 15 * 60_000;
/// SKUs the orders draw on.
const SKUS: i64 = 8;

fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What the shop did with an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Never paid.
    Abandoned,
    /// Paid: mall's status 0 → 1 took (the order was still pending).
    Paid,
    /// A payment came, but the order had been closed first (its 0 → 1 found no pending row).
    TooLate,
}

/// An order placed: its lines and fate.
#[derive(Debug, Clone)]
struct Placement {
    lines: Vec<(i64, i64)>,
    due_ms: i64,
    fate: Fate,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "the mall chaos run: scripts/chaos --schema mall"]
async fn mall() {
    let seconds = knob("TIMEOUTD_CHAOS_SECONDS", 120);
    let orders = knob("TIMEOUTD_CHAOS_ORDERS", 1_500) as i64;
    let settle = Duration::from_secs(knob("TIMEOUTD_CHAOS_SETTLE_SECONDS", 180));
    let backend = match std::env::var("TIMEOUTD_CHAOS_MALL_BACKEND").as_deref() {
        Ok("postgres") => Backend::Postgres,
        _ => Backend::MySql,
    };
    let mall = Arc::new(Mall::on(backend).await);
    let skus: Vec<i64> = (1..=SKUS).collect();
    mall.stock_up(&skus, 1_000_000).await;
    for member in 0..orders {
        mall.member(100_000 + member, 10, &[77]).await;
    }

    let upstream = match backend {
        Backend::Postgres => "127.0.0.1:5432",
        _ => "127.0.0.1:3306",
    };
    let proxy = Proxy::start(upstream).await;
    let through = mall
        .env
        .url
        .replacen(upstream, &format!("127.0.0.1:{}", proxy.port), 1);
    assert_ne!(
        through, mall.env.url,
        "the test database's URL names {upstream}"
    );
    let dir = mall.env.dir.path().to_path_buf();
    let config = format!(
        "[database]\nurl = \"{through}\"\nmax_connections = 8\n\
         [database.shop]\nprofile = \"{}\"\ndatabase = \"{}\"\n\
         [outbox]\nbatch = 256\nlease = \"5s\"\nidle_recheck = \"200ms\"\ngroup_commit = 64\n\
         [sweep]\ninterval = \"1s\"\ngrace = \"2s\"\nbatch = 500\n\
         [merchants.mall]\nplugin = \"builtin:single-phase\"\n\
         [merchants.mall.settings]\nchannel = \"log\"\nclosed_template = \"order-closed\"\n",
        profile_path().display(),
        mall.name
    );
    let file = dir.join("mall-chaos.toml");
    std::fs::write(&file, config).unwrap();
    let start = |i: usize| -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("daemon-{i}.log")))
            .unwrap();
        Command::new(timeoutd_bin())
            .args(["run", "--config"])
            .arg(&file)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    };
    let mut daemons: Vec<Option<Child>> = (0..3).map(|i| Some(start(i))).collect();
    eprintln!(
        "chaos (mall, {backend:?}): {orders} orders over {seconds} s of faults, 3 daemons (logs in {})",
        dir.display()
    );

    // The shop: orders over 60 % of the faulted time, each due 2–20 s after it is placed.
    let started = Instant::now();
    let placed: Arc<Mutex<BTreeMap<i64, Placement>>> = Arc::default();
    let shop = {
        let mall = mall.clone();
        let placed = placed.clone();
        tokio::spawn(async move {
            let gap = Duration::from_secs(seconds) * 3 / 5 / orders.max(1) as u32;
            let mut next = tokio::time::Instant::now();
            let mut payments = tokio::task::JoinSet::new();
            for n in 0..orders {
                tokio::time::sleep_until(next).await;
                next += gap;
                let now = mall.env.db.now_ms().await.unwrap();
                let id = 1_000_000 + n;
                let due_in = fastrand::i64(2_000..20_000);
                let lines: Vec<(i64, i64)> = (0..fastrand::i64(1..=3))
                    .map(|_| (fastrand::i64(1..=SKUS), fastrand::i64(1..=3)))
                    .collect();
                let priced: Vec<(i64, i64, &'static str)> =
                    lines.iter().map(|(s, q)| (*s, *q, "19.90")).collect();
                mall.place(&Placed {
                    id,
                    member: 100_000 + n,
                    coupon: Some(77),
                    points: Some(10),
                    lines: &priced,
                    created_ms: now + due_in - WINDOW_MS,
                    status: 0,
                    deleted: 0,
                })
                .await;
                // `created_ms` is written to the second: the order is due then.
                let due_ms = (now + due_in - WINDOW_MS).div_euclid(1000) * 1000 + WINDOW_MS;
                if fastrand::bool() {
                    // Armed in timeoutd's outbox by the order service; the rest wait for the
                    // sweep, as mall itself writes no rows.
                    backend
                        .query(
                            "INSERT INTO order_timeout_msg (order_id, due_ms, phase, status) \
                             VALUES (?, ?, 0, 'PENDING')",
                        )
                        .bind(id.to_string())
                        .bind(due_ms)
                        .execute(mall.env.db.pool())
                        .await
                        .unwrap();
                }
                placed.lock().unwrap().insert(
                    id,
                    Placement {
                        lines,
                        due_ms,
                        fate: Fate::Abandoned,
                    },
                );
                if fastrand::u8(0..10) < 4 {
                    // Paid somewhere in the window, or right at its end, racing the close.
                    let pay_in = match fastrand::bool() {
                        true => fastrand::i64(0..due_in),
                        false => due_in + fastrand::i64(-300..=300),
                    };
                    let (mall, placed) = (mall.clone(), placed.clone());
                    payments.spawn(async move {
                        tokio::time::sleep(Duration::from_millis(pay_in.max(0) as u64)).await;
                        let took = loop {
                            let paid = backend
                                .query(
                                    "UPDATE oms_order SET status = 1, payment_time = NOW() \
                                     WHERE id = ? AND status = 0",
                                )
                                .bind(id)
                                .execute(mall.shop.pool())
                                .await;
                            if let Ok(done) = paid {
                                break done.rows_affected() == 1;
                            }
                        };
                        placed.lock().unwrap().get_mut(&id).unwrap().fate =
                            if took { Fate::Paid } else { Fate::TooLate };
                    });
                }
            }
            while payments.join_next().await.is_some() {}
        })
    };

    // Faults: a daemon SIGKILLed every 5–15 s and restarted; the database cut off once.
    let faults_until = started + Duration::from_secs(seconds);
    let cut_at = started + Duration::from_secs(seconds / 2);
    let mut cut_done = false;
    let mut kills = 0;
    let mut next_kill = Instant::now() + Duration::from_secs(fastrand::u64(5..=15));
    while Instant::now() < faults_until {
        if Instant::now() >= next_kill {
            let i = fastrand::usize(0..3);
            if let Some(mut child) = daemons[i].take() {
                let _ = child.kill().await;
                kills += 1;
            }
            tokio::time::sleep(Duration::from_millis(fastrand::u64(500..2_000))).await;
            daemons[i] = Some(start(i));
            next_kill = Instant::now() + Duration::from_secs(fastrand::u64(5..=15));
        }
        if !cut_done && Instant::now() >= cut_at {
            proxy.set_cut(true);
            tokio::time::sleep(Duration::from_secs(10)).await;
            proxy.set_cut(false);
            cut_done = true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    shop.await.unwrap();
    eprintln!(
        "chaos (mall): faults over after {:.0} s; settling",
        started.elapsed().as_secs_f64()
    );
    let settle_start = Instant::now();
    loop {
        let open: i64 = sqlx::query("SELECT COUNT(*) FROM oms_order WHERE status = 0")
            .fetch_one(mall.shop.pool())
            .await
            .map(|r| r.get(0))
            .unwrap_or(i64::MAX);
        if open == 0 || settle_start.elapsed() > settle {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let settled_s = settle_start.elapsed().as_secs_f64();
    for child in daemons.iter_mut().filter_map(Option::take) {
        let mut child = child;
        let _ = child.kill().await;
    }

    let placed = placed.lock().unwrap().clone();
    let (violations, figures) = audit(&mall, &placed).await;
    println!(
        "{}",
        json!({ "chaos": {
            "schema": "mall",
            "backend": format!("{backend:?}"),
            "orders": orders,
            "faulted_seconds": seconds,
            "settled_seconds": (settled_s * 10.0).round() / 10.0,
            "daemon_kills": kills,
            "figures": figures,
            "violations": violations,
        }})
    );
    if violations.is_empty() {
        Arc::try_unwrap(mall)
            .unwrap_or_else(|_| panic!("the shop still holds the databases"))
            .cleanup()
            .await;
    }
    assert!(
        violations.is_empty(),
        "mall chaos audit failed (daemon logs and databases kept in {}):\n{}",
        dir.display(),
        violations.join("\n")
    );
}

/// The audit over mall's tables and timeoutd's ledger and decision log.
async fn audit(mall: &Mall, placed: &BTreeMap<i64, Placement>) -> (Vec<String>, serde_json::Value) {
    let mut v = Vec::new();
    let shop = mall.shop.pool();
    let status: BTreeMap<i64, i64> = mall
        .query("SELECT id, CAST(status AS SIGNED) FROM oms_order")
        .fetch_all(shop)
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let decisions = sqlx::query(
        "SELECT order_id, COUNT(*), MIN(decided_at_ms) FROM decision_log WHERE outcome = 'closed' \
         GROUP BY order_id",
    )
    .fetch_all(mall.env.db.pool())
    .await
    .unwrap();
    let closes: BTreeMap<i64, (i64, i64)> = decisions
        .iter()
        .map(|r| {
            let id: String = r.get(0);
            (id.parse().unwrap(), (r.get(1), r.get(2)))
        })
        .collect();
    let ledger: BTreeMap<(String, String), i64> = sqlx::query(
        "SELECT order_id, kind, COUNT(*) FROM effect_ledger WHERE status = 'DONE' GROUP BY order_id, kind",
    )
    .fetch_all(mall.env.db.pool())
    .await
    .unwrap()
    .iter()
    .map(|r| ((r.get(0), r.get(1)), r.get(2)))
    .collect();
    let members: BTreeMap<i64, (i64, i64)> = mall
        .query(
            "SELECT m.id, CAST(m.integration AS SIGNED), CAST(COALESCE(SUM(h.use_status), 0) AS SIGNED) \
             FROM ums_member m LEFT JOIN sms_coupon_history h ON h.member_id = m.id GROUP BY m.id",
        )
    .fetch_all(shop)
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), (r.get(1), r.get(2))))
    .collect();
    let mut locked_want: BTreeMap<i64, i64> = BTreeMap::new();
    let (mut closed, mut paid, mut too_late) = (0, 0, 0);
    for (id, p) in placed {
        let member = 100_000 + (id - 1_000_000);
        let st = status.get(id).copied().unwrap_or(-1);
        let close = closes.get(id).copied();
        let (points, coupon_used) = members.get(&member).copied().unwrap_or((-1, -1));
        match (p.fate, st) {
            (Fate::Paid, 1) => {
                paid += 1;
                for (sku, q) in &p.lines {
                    *locked_want.entry(*sku).or_default() += q;
                }
                if close.is_some() {
                    v.push(format!("{id}: paid, yet a close was decided"));
                }
                if (points, coupon_used) != (0, 1) {
                    v.push(format!("{id}: paid, but points {points} (want 0), coupon used {coupon_used} (want 1)"));
                }
            }
            (Fate::Abandoned | Fate::TooLate, 4) => {
                closed += 1;
                if p.fate == Fate::TooLate {
                    too_late += 1;
                }
                match close {
                    Some((1, at)) if at >= p.due_ms => {}
                    Some((1, at)) => v.push(format!(
                        "{id}: closed at {at}, {} ms before it was due",
                        p.due_ms - at
                    )),
                    other => v.push(format!(
                        "{id}: closed, with {other:?} close decisions (want one)"
                    )),
                }
                let count = |kind: &str| {
                    ledger
                        .get(&(id.to_string(), kind.to_string()))
                        .copied()
                        .unwrap_or(0)
                };
                let lines = p.lines.len() as i64;
                if (
                    count("restore-stock"),
                    count("release-coupon"),
                    count("return-points"),
                ) != (lines, 1, 1)
                {
                    v.push(format!(
                        "{id}: ledger restore-stock {} (want {lines}), release-coupon {}, return-points {} (want 1 each)",
                        count("restore-stock"), count("release-coupon"), count("return-points")
                    ));
                }
                if (points, coupon_used) != (10, 0) {
                    v.push(format!("{id}: closed, but points {points} (want 10 back), coupon used {coupon_used} (want 0)"));
                }
            }
            (fate, st) => v.push(format!("{id}: fate {fate:?} but status {st}")),
        }
    }
    for sku in 1..=SKUS {
        let got = mall.locked(sku).await;
        let want = locked_want.get(&sku).copied().unwrap_or(0);
        if got != want {
            v.push(format!(
                "sku {sku}: lock_stock {got}, want {want} (the paid orders' units)"
            ));
        }
    }
    let figures = json!({ "closed": closed, "paid": paid, "paid_too_late": too_late });
    (v, figures)
}
