//! Retention: tables that only grow are kept to their configured ages (`[retention]`). Every
//! `retention.interval`, one daemon at a time (the `retention` lease in `maintenance_lease`)
//! deletes, table by table, the rows [`crate::db::retention::RULES`] calls settled and old, in
//! batches of `retention.batch` with `retention.pause` between them, so live closes keep the
//! database; and it sets a gauge of each table's size (`timeoutd_table_rows{table}`).

use std::time::Duration;

use tokio::sync::watch;

use crate::clock::Clock;
use crate::config::RetentionConfig;
use crate::db::maintenance_lease;
use crate::db::retention::{self, RULES, Rule};
use crate::db::{Db, DbError};

/// The lease's name in `maintenance_lease`.
const LEASE: &str = "retention";
/// How long a pass holds the lease before it must renew it (it renews every batch).
const LEASE_MS: i64 = 5 * 60_000;
/// The first pass runs this long after start (not during a restart's backlog).
const FIRST_PASS_AFTER: Duration = Duration::from_secs(60);

/// What one pass deleted, by table (tables with nothing to delete included, as 0).
pub type Deleted = Vec<(&'static str, u64)>;

/// Runs retention until `shutdown`: the first pass [`FIRST_PASS_AFTER`] start (or `interval`,
/// if shorter), then every `interval`.
pub async fn run(
    db: Db,
    clock: Clock,
    config: RetentionConfig,
    mut shutdown: watch::Receiver<bool>,
) {
    let holder = format!("pid{}-{:08x}", std::process::id(), fastrand::u32(..));
    let mut wait = FIRST_PASS_AFTER.min(config.interval);
    loop {
        if crate::shutdown::sleep_or_shutdown(wait, &mut shutdown).await {
            break;
        }
        wait = config.interval;
        match pass(&db, &clock, &config, &holder, Some(&shutdown)).await {
            Ok(Some(deleted)) => {
                let total: u64 = deleted.iter().map(|(_, n)| n).sum();
                tracing::info!(total, ?deleted, "retention pass done");
            }
            Ok(None) => tracing::debug!("retention: another daemon holds the lease"),
            Err(e) => tracing::warn!(error = %e, "retention pass failed; the next one retries"),
        }
    }
}

/// One pass as `holder`: `None` when another daemon holds the lease, else what was deleted.
/// Stops early (between batches) once `shutdown` turns true.
///
/// # Errors
/// [`DbError`] when a statement fails (the pass stops there; the lease lapses by itself).
pub async fn pass(
    db: &Db,
    clock: &Clock,
    config: &RetentionConfig,
    holder: &str,
    shutdown: Option<&watch::Receiver<bool>>,
) -> Result<Option<Deleted>, DbError> {
    let now = clock.now_ms(db).await?;
    if !maintenance_lease::take_lease(db, LEASE, holder, now, now + LEASE_MS).await? {
        return Ok(None);
    }
    let stopping = || shutdown.is_some_and(crate::shutdown::is_stopping);
    let mut deleted = Vec::with_capacity(RULES.len());
    for rule in RULES {
        let cutoff = now - age(config, rule).as_millis() as i64;
        let mut total = 0;
        loop {
            let n = retention::delete_batch(db, rule, cutoff, config.batch.max(1)).await?;
            total += n;
            if n < u64::from(config.batch.max(1)) || stopping() {
                break;
            }
            tokio::time::sleep(config.pause).await;
            let now = clock.now_ms(db).await?;
            if !maintenance_lease::take_lease(db, LEASE, holder, now, now + LEASE_MS).await? {
                tracing::warn!("retention lease lost mid-pass; stopping");
                return Ok(Some(deleted));
            }
        }
        let rows = retention::table_rows(db, rule.table).await?;
        crate::events::emit(crate::events::Event::Retained {
            table: rule.table,
            deleted: total,
            rows,
        });
        deleted.push((rule.table, total));
    }
    maintenance_lease::release_lease(db, LEASE, holder).await?;
    Ok(Some(deleted))
}

/// The configured age of `rule`'s table.
fn age(config: &RetentionConfig, rule: &Rule) -> Duration {
    match rule.key {
        "retention.outbox" => config.outbox,
        "retention.ledger" => config.ledger,
        "retention.decision_log" => config.decision_log,
        "retention.audit" => config.audit,
        "retention.dead_letters" => config.dead_letters,
        "retention.payment_leases" => config.payment_leases,
        other => unreachable!("{other} is not a [retention] key"),
    }
}
