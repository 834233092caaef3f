//! The bench's reads: the baseline's outbox rows, the server's commit and statement counters,
//! the daemon's closes read back, the exactly-once audit's tallies, and `EXPLAIN` of the hot
//! queries. Never used by the daemon itself. Times are epoch ms.

use std::collections::HashMap;

use sqlx::Row;

use super::{Backend, Db, DbError};

/// The outbox rows of the orders whose ids start with `prefix` (a baseline's: `b-` for the
/// client loop, `s-` for the set-based one): order id → row id.
///
/// # Errors
/// [`DbError::Sql`] when the query fails or a column cannot be read.
pub async fn baseline_outbox_rows(db: &Db, prefix: &str) -> Result<HashMap<String, i64>, DbError> {
    Ok(db
        .backend()
        .query("SELECT order_id, id FROM order_timeout_msg WHERE order_id LIKE ?")
        .bind(format!("{prefix}%"))
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<_, sqlx::Error>>()?)
}

/// The server's counters at one instant; `None` where the backend has none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerCounters {
    /// Commits (MariaDB/MySQL `Com_commit`: explicit COMMITs; PostgreSQL
    /// `pg_stat_database.xact_commit`: every transaction). `None` on SQLite, or when PostgreSQL's
    /// value cannot be read.
    pub commits: Option<i64>,
    /// Statements (MariaDB/MySQL `Questions`); `None` on PostgreSQL and SQLite.
    pub statements: Option<i64>,
    /// Row lock waits and the time spent in them, ms (MariaDB/MySQL `Innodb_row_lock_waits`,
    /// `Innodb_row_lock_time`); `None` on PostgreSQL (no such counter) and SQLite.
    pub lock_waits: Option<(i64, i64)>,
}

/// Reads the server's counters (nothing is read on SQLite, which has none: all `None`).
/// PostgreSQL's statistics snapshot is cleared first, so the figure is current.
///
/// # Errors
/// [`DbError::Sql`] when a statement fails or a column cannot be read (e.g. no privilege).
pub async fn server_counters(db: &Db) -> Result<ServerCounters, DbError> {
    match db.backend() {
        Backend::Sqlite => Ok(ServerCounters::default()),
        Backend::MySql => {
            let rows = sqlx::query(
                "SHOW GLOBAL STATUS WHERE Variable_name IN ('Com_commit', 'Questions', \
                 'Innodb_row_lock_waits', 'Innodb_row_lock_time')",
            )
            .fetch_all(db.pool())
            .await?;
            let mut c = ServerCounters::default();
            let (mut waits, mut wait_ms) = (None, None);
            for r in rows {
                let name: String = r.try_get(0)?;
                let value: String = r.try_get(1)?;
                let value = value.parse().ok();
                match name.as_str() {
                    "Com_commit" => c.commits = value,
                    "Questions" => c.statements = value,
                    "Innodb_row_lock_waits" => waits = value,
                    "Innodb_row_lock_time" => wait_ms = value,
                    _ => {}
                }
            }
            c.lock_waits = waits.zip(wait_ms);
            Ok(c)
        }
        Backend::Postgres => {
            sqlx::query("SELECT pg_stat_clear_snapshot()")
                .execute(db.pool())
                .await?;
            let row = sqlx::query(
                "SELECT CAST(xact_commit AS BIGINT) FROM pg_stat_database \
                 WHERE datname = current_database()",
            )
            .fetch_one(db.pool())
            .await?;
            Ok(ServerCounters {
                commits: row.try_get(0).ok(),
                statements: None,
                lock_waits: None,
            })
        }
    }
}

/// The CLOSED bench daemon orders (`d-…`): each one's `(closed_at_ms, closed_at_ms −
/// deadline_ms)`, epoch ms and ms, in no particular order.
///
/// # Errors
/// [`DbError::Sql`] when the query fails or a column cannot be read.
pub async fn daemon_closes(db: &Db) -> Result<Vec<(i64, i64)>, DbError> {
    let rows = db
        .backend()
        .query(
            "SELECT closed_at_ms, closed_at_ms - deadline_ms FROM orders \
             WHERE id LIKE 'd-%' AND status = 'CLOSED'",
        )
        .fetch_all(db.pool())
        .await?;
    Ok(rows
        .iter()
        .map(|r| Ok((r.try_get::<i64, _>(0)?, r.try_get::<i64, _>(1)?)))
        .collect::<Result<_, sqlx::Error>>()?)
}

/// How many CLOSED bench daemon orders (`d-…`) each `closed_by` closed, by `closed_by` (`""`
/// for none).
///
/// # Errors
/// [`DbError::Sql`] when the query fails or a column cannot be read.
pub async fn closed_by(db: &Db) -> Result<Vec<(String, i64)>, DbError> {
    let rows = db
        .backend()
        .query(
            "SELECT closed_by, COUNT(*) FROM orders WHERE id LIKE 'd-%' AND status = 'CLOSED' \
             GROUP BY closed_by ORDER BY closed_by",
        )
        .fetch_all(db.pool())
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            Ok((
                r.try_get::<Option<String>, _>(0)?.unwrap_or_default(),
                r.try_get(1)?,
            ))
        })
        .collect::<Result<_, sqlx::Error>>()?)
}

/// Bench daemon orders (`d-…`) still PENDING.
///
/// # Errors
/// [`DbError::Sql`] when the query fails or the column cannot be read.
pub async fn open_daemon_orders(db: &Db) -> Result<i64, DbError> {
    scalar(
        db,
        "SELECT COUNT(*) FROM orders WHERE status = 'PENDING' AND id LIKE 'd-%'",
    )
    .await
}

/// What the exactly-once audit counts after the burst.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditCounts {
    /// CLOSED bench orders: both baselines' (`b-…`, `s-…`) and the daemon's (`d-…`).
    pub closed: i64,
    /// Daemon orders closed before their deadline.
    pub closed_early: i64,
    /// `closed` decisions logged for daemon orders.
    pub closed_decisions: i64,
    /// Stock units over all SKUs: available, plus the stock journal's units not yet folded.
    pub stock_units: i64,
    /// Coupons not AVAILABLE.
    pub coupons_held: i64,
    /// Ledger rows of daemon orders.
    pub ledger_rows: i64,
    /// Outbox rows not PROCESSED.
    pub outbox_unsettled: i64,
}

/// Counts the audit's figures, one query each in the order of [`AuditCounts`]'s fields.
///
/// # Errors
/// [`DbError::Sql`] when a query fails or a column cannot be read (the first failure ends it).
pub async fn audit_counts(db: &Db) -> Result<AuditCounts, DbError> {
    let closed = scalar(
        db,
        "SELECT COUNT(*) FROM orders WHERE status = 'CLOSED' \
         AND (id LIKE 'b-%' OR id LIKE 's-%' OR id LIKE 'd-%')",
    )
    .await?;
    let closed_early = scalar(
        db,
        "SELECT COUNT(*) FROM orders WHERE id LIKE 'd-%' AND closed_at_ms < deadline_ms",
    )
    .await?;
    let closed_decisions = scalar(
        db,
        "SELECT COUNT(*) FROM decision_log WHERE outcome = 'closed' AND order_id LIKE 'd-%'",
    )
    .await?;
    // The stock journal's units not yet folded are stock too (`[dispatch.stock] mode =
    // "journal"`): exactly once is `available` plus the journal.
    let units = match db.backend() {
        Backend::MySql => {
            "SELECT CAST(SUM(available) + (SELECT COALESCE(SUM(units), 0) FROM stock_journal) \
             AS SIGNED) FROM sku_stock"
        }
        Backend::Sqlite | Backend::Postgres => {
            "SELECT CAST(SUM(available) + (SELECT COALESCE(SUM(units), 0) FROM stock_journal) \
             AS BIGINT) FROM sku_stock"
        }
    };
    let stock_units = scalar(db, units).await?;
    let coupons_held = scalar(
        db,
        "SELECT COUNT(*) FROM coupons WHERE status <> 'AVAILABLE'",
    )
    .await?;
    let ledger_rows = scalar(
        db,
        "SELECT COUNT(*) FROM effect_ledger WHERE order_id LIKE 'd-%'",
    )
    .await?;
    let outbox_unsettled = scalar(
        db,
        "SELECT COUNT(*) FROM order_timeout_msg WHERE status <> 'PROCESSED'",
    )
    .await?;
    Ok(AuditCounts {
        closed,
        closed_early,
        closed_decisions,
        stock_units,
        coupons_held,
        ledger_rows,
        outbox_unsettled,
    })
}

async fn scalar(db: &Db, sql: &'static str) -> Result<i64, DbError> {
    Ok(db
        .backend()
        .query(sql)
        .fetch_one(db.pool())
        .await?
        .try_get(0)?)
}

/// `EXPLAIN` (`EXPLAIN QUERY PLAN` on SQLite) of the group close's compare-and-set, the outbox
/// claim at `now_ms` (epoch ms) and the order load: `(name, plan)` each, the plan's rows
/// flattened to one line (`" | "` between rows). Never fails: a plan that cannot be had reads
/// `(no plan: <error>)`.
pub async fn explain_hot_queries(db: &Db, now_ms: i64) -> Vec<(String, String)> {
    let explain = match db.backend() {
        Backend::Sqlite => "EXPLAIN QUERY PLAN",
        Backend::MySql | Backend::Postgres => "EXPLAIN",
    };
    let queries = [
        (
            "outbox claim",
            format!(
                "{explain} {}",
                inline(super::outbox::PENDING_DUE, &[now_ms, now_ms, 256])
            ),
        ),
        (
            "order load",
            format!("{explain} SELECT id, status, deadline_ms FROM orders WHERE id = 'd-0000001'"),
        ),
    ];
    let mut out = Vec::new();
    // The group's compare-and-set, for two orders: each a lookup by primary key, not a scan.
    let stamp = |id| {
        let stamp = super::orders::CloseStamp {
            now_ms,
            due_ms: now_ms,
            closed_by: "outbox",
            reason: "plan",
        };
        (id, stamp)
    };
    let closes = [stamp("d-0000001"), stamp("d-0000002")];
    let group_close = super::orders::close_many_query(db.backend(), explain, &closes, now_ms)
        .fetch_all(db.pool())
        .await;
    out.push(("group close".to_string(), flatten(group_close)));
    for (name, sql) in queries {
        let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(super::names::own(&sql).into_owned()))
            .fetch_all(db.pool())
            .await;
        out.push((name.to_string(), flatten(rows)));
    }
    out
}

/// A plan's rows on one line (`" | "` between rows), or `(no plan: <error>)`.
fn flatten(rows: Result<Vec<sqlx::any::AnyRow>, sqlx::Error>) -> String {
    match rows {
        Ok(rows) => rows
            .iter()
            .map(|r| {
                (0..r.columns().len())
                    .filter_map(|c| {
                        r.try_get::<String, _>(c)
                            .ok()
                            .or_else(|| r.try_get::<i64, _>(c).ok().map(|v| v.to_string()))
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect::<Vec<_>>()
            .join(" | "),
        Err(e) => format!("(no plan: {e})"),
    }
}

/// `sql` with its `?` placeholders replaced by `values` in order (integers only: for `EXPLAIN`
/// of a statement the daemon binds).
fn inline(sql: &str, values: &[i64]) -> String {
    let mut values = values.iter();
    sql.chars()
        .map(|c| match c {
            '?' => values.next().map_or("?".to_string(), i64::to_string),
            c => c.to_string(),
        })
        .collect()
}

/// The CLOSED bench daemon orders' (`d-…`) close stamps by order id (epoch ms, database
/// clock), and how many of their ledger rows are notices (`notify`, `remind`): what the
/// bench's notice receiver should get, and when each order's notice was due to start.
///
/// # Errors
/// [`DbError::Sql`] when a query fails or a column cannot be read.
pub async fn daemon_notices(db: &Db) -> Result<(HashMap<String, i64>, i64), DbError> {
    let closed = db
        .backend()
        .query("SELECT id, closed_at_ms FROM orders WHERE id LIKE 'd-%' AND status = 'CLOSED'")
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<i64, _>(1)?)))
        .collect::<Result<HashMap<_, _>, sqlx::Error>>()?;
    let notices: i64 = db
        .backend()
        .query(
            "SELECT COUNT(*) FROM effect_ledger WHERE order_id LIKE 'd-%' \
             AND kind IN ('notify', 'remind')",
        )
        .fetch_one(db.pool())
        .await?
        .try_get(0)?;
    Ok((closed, notices))
}

/// One fairness-bench order (`bench::fairness`): its deadline and close stamp, and when its
/// effect of the measured kind was settled DONE (epoch ms, database clock; `None`: not yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamps {
    /// Order id.
    pub order_id: String,
    /// `orders.deadline_ms`.
    pub deadline_ms: i64,
    /// `orders.closed_at_ms`, once CLOSED.
    pub closed_at_ms: Option<i64>,
    /// `effect_ledger.updated_at_ms` of its DONE row of the kind asked for.
    pub done_at_ms: Option<i64>,
}

/// [`Stamps`] of every order whose id starts with `prefix`, with the DONE time of its `kind`
/// ledger row (e.g. `restore-flash-stock`: the Redis stock back).
///
/// # Errors
/// [`DbError::Sql`] when a query fails or a column cannot be read.
pub async fn stamps(db: &Db, prefix: &str, kind: &str) -> Result<Vec<Stamps>, DbError> {
    let like = format!("{prefix}%");
    let done: HashMap<String, i64> = db
        .backend()
        .query(
            "SELECT order_id, MAX(updated_at_ms) FROM effect_ledger WHERE order_id LIKE ? \
             AND kind = ? AND status = 'DONE' GROUP BY order_id",
        )
        .bind(like.clone())
        .bind(kind.to_string())
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<i64, _>(1)?)))
        .collect::<Result<_, sqlx::Error>>()?;
    let rows = db
        .backend()
        .query("SELECT id, deadline_ms, closed_at_ms FROM orders WHERE id LIKE ? ORDER BY id")
        .bind(like)
        .fetch_all(db.pool())
        .await?;
    rows.iter()
        .map(|r| {
            let order_id: String = r.try_get(0)?;
            Ok(Stamps {
                done_at_ms: done.get(&order_id).copied(),
                deadline_ms: r.try_get(1)?,
                closed_at_ms: r.try_get(2)?,
                order_id,
            })
        })
        .collect()
}
