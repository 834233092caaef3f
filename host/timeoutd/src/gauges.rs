//! Periodic samples of the backlog: overdue-but-open orders per merchant, open dead letters,
//! and the age of the oldest pending ledger effect and outbox row, read by
//! [`crate::db::backlog::read`] (index reads only, so sampling stays cheap with millions of
//! orders).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use timeoutd_runtime::model::OrderStatus;
use tokio::sync::watch;

use crate::clock::Clock;
use crate::context::Context;
use crate::db::{Db, DbError, backlog, orders, pauses};
use crate::events::gauge_set;

/// One sample.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Sample {
    /// When it was taken, epoch ms by the daemon's clock (0 before the first sample): how fresh
    /// `/v1/backlog` is, and how an observer knows the alert rules were evaluated since.
    pub sampled_at_ms: i64,
    /// PENDING orders past their deadline by more than the overdue margin, by merchant, paused
    /// ones left out: what the overdue alert pages about.
    pub overdue_open: Vec<(String, i64)>,
    /// The overdue orders an operator paused (their merchant, or each order), by merchant:
    /// shown apart so that a pause pages nobody (`timeoutd_overdue_paused_orders`).
    pub overdue_paused: Vec<(String, i64)>,
    /// Open dead letters.
    pub dead_letters_open: i64,
    /// PENDING ledger effects.
    pub ledger_pending: i64,
    /// Age of the oldest PENDING ledger effect, ms (0 when none).
    pub ledger_oldest_pending_ms: i64,
    /// PENDING outbox rows that are due.
    pub outbox_due: i64,
    /// How overdue the oldest due outbox row is, ms (0 when none).
    pub outbox_oldest_due_ms: i64,
    /// Sweeps of this process that failed in a row.
    pub sweep_consecutive_failures: u64,
    /// Merchants whose plugin is tripped.
    pub plugins_tripped: Vec<String>,
}

impl Sample {
    /// Overdue-but-open orders over all merchants.
    pub fn overdue_total(&self) -> i64 {
        self.overdue_open.iter().map(|(_, n)| n).sum()
    }
}

/// Takes a sample; an order counts as overdue once `margin` past its deadline.
///
/// # Errors
/// [`DbError`] when a query fails.
pub async fn sample(
    db: &Db,
    clock: &Clock,
    margin: Duration,
    policies: &crate::policies::Policies,
) -> Result<Sample, DbError> {
    let now = clock.now_ms(db).await?;
    let before_ms = now - margin.as_millis() as i64;
    let backlog = backlog::read(db, now, before_ms).await?;
    let paused = pauses::in_force(db).await?;
    let (overdue_open, overdue_paused) =
        split_paused(db, backlog.overdue_open, &paused, before_ms).await?;
    Ok(Sample {
        sampled_at_ms: now,
        overdue_open,
        overdue_paused,
        dead_letters_open: backlog.dead_letters_open,
        ledger_pending: backlog.ledger_pending,
        ledger_oldest_pending_ms: backlog.ledger_oldest_created_ms.map_or(0, |t| now - t),
        outbox_due: backlog.outbox_due,
        outbox_oldest_due_ms: backlog.outbox_earliest_due_ms.map_or(0, |t| now - t),
        sweep_consecutive_failures: crate::sources::sweep::consecutive_failures(),
        plugins_tripped: policies.tripped(now),
    })
}

/// Splits overdue counts by merchant into those to page about and those paused: a paused
/// merchant's count moves whole; an order paused alone moves from its merchant's count when it
/// is still PENDING and overdue (one read per such order: pauses of single orders are few).
async fn split_paused(
    db: &Db,
    overdue: Vec<(String, i64)>,
    paused: &pauses::Paused,
    before_ms: i64,
) -> Result<(Vec<(String, i64)>, Vec<(String, i64)>), DbError> {
    if paused.is_empty() {
        return Ok((overdue, Vec::new()));
    }
    let (mut open, mut held): (BTreeMap<String, i64>, BTreeMap<String, i64>) = overdue
        .into_iter()
        .partition(|(merchant, _)| !paused.merchant(merchant));
    let mut conn = db.pool().acquire().await?;
    for id in paused.orders() {
        let Ok(Some(order)) = orders::load(&mut conn, db.schema(), id).await else {
            continue;
        };
        let overdue = order.status == OrderStatus::Pending && order.deadline_ms <= before_ms;
        if !overdue || paused.merchant(&order.merchant) {
            continue;
        }
        if let Some(n) = open.get_mut(&order.merchant).filter(|n| **n > 0) {
            *n -= 1;
            *held.entry(order.merchant).or_default() += 1;
        }
    }
    open.retain(|_, n| *n > 0);
    Ok((open.into_iter().collect(), held.into_iter().collect()))
}

/// Publishes `s` as gauges.
pub fn publish(s: &Sample, merchants: &[String]) {
    let count = |by: &[(String, i64)], merchant: &str| {
        by.iter()
            .find(|(m, _)| m == merchant)
            .map_or(0, |(_, n)| *n) as f64
    };
    for merchant in merchants {
        for (name, by) in [
            ("timeoutd_overdue_open_orders", &s.overdue_open),
            ("timeoutd_overdue_paused_orders", &s.overdue_paused),
        ] {
            gauge_set(name, &[("merchant", merchant.clone())], count(by, merchant));
        }
    }
    gauge_set(
        "timeoutd_dead_letters_open",
        &[],
        s.dead_letters_open as f64,
    );
    gauge_set("timeoutd_ledger_pending", &[], s.ledger_pending as f64);
    gauge_set(
        "timeoutd_ledger_oldest_pending_seconds",
        &[],
        s.ledger_oldest_pending_ms as f64 / 1e3,
    );
    gauge_set("timeoutd_outbox_due", &[], s.outbox_due as f64);
    gauge_set(
        "timeoutd_outbox_oldest_due_seconds",
        &[],
        s.outbox_oldest_due_ms as f64 / 1e3,
    );
    gauge_set(
        "timeoutd_sweep_consecutive_failures",
        &[],
        s.sweep_consecutive_failures as f64,
    );
}

/// Publishes what a soak watches for growth, read from this process rather than the database:
/// tokio's live tasks (`timeoutd_runtime_alive_tasks`) and the connections of `db`'s pool
/// (`timeoutd_db_pool_connections{state="open"|"idle"}`: open counts idle ones too). Called on
/// the sampling loop's runtime.
pub fn publish_process(db: &Db) {
    gauge_set(
        "timeoutd_runtime_alive_tasks",
        &[],
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks() as f64,
    );
    let pool = db.pool();
    gauge_set(
        "timeoutd_db_pool_connections",
        &[("state", "open".to_string())],
        f64::from(pool.size()),
    );
    gauge_set(
        "timeoutd_db_pool_connections",
        &[("state", "idle".to_string())],
        pool.num_idle() as f64,
    );
}

/// What looks at each sample besides the gauges and `/v1/backlog`: the alert rules
/// ([`crate::alerts::AlertFeed`], which hands it to the rules' own task and returns at once:
/// a watcher must never hold up the sampling loop).
pub trait Watcher: Send {
    /// Looks at `sample` (taken at its `sampled_at_ms`).
    fn watch(&mut self, sample: &Sample) -> impl Future<Output = ()> + Send;
}

/// Samples `ctx`'s database every `every` and publishes, until `ctx.shutdown`; the latest
/// sample goes to `latest` and to `watcher`. An order counts as overdue `margin` past its
/// deadline.
pub async fn run<W: Watcher>(
    ctx: Context,
    every: Duration,
    margin: Duration,
    merchants: Vec<String>,
    latest: watch::Sender<Sample>,
    mut watcher: Option<W>,
) {
    let Context {
        db,
        clock,
        policies,
        mut shutdown,
        ..
    } = ctx;
    loop {
        publish_process(&db);
        match sample(&db, &clock, margin, &policies).await {
            Ok(s) => {
                publish(&s, &merchants);
                if let Some(watcher) = watcher.as_mut() {
                    watcher.watch(&s).await;
                }
                let _ = latest.send(s);
            }
            Err(e) => tracing::warn!(error = %e, "backlog sample failed"),
        }
        if crate::shutdown::sleep_or_shutdown(every, &mut shutdown).await {
            break;
        }
    }
}
