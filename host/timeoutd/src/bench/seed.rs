//! The bench's database and orders: a fresh database on the configured server, and 2 × N orders
//! written as an order service writes them (`b-…` for the baseline, `d-…` for the daemon).

use sqlx::Row;

use crate::db::{Backend, Db};

/// SKUs of the sale: few, so their stock rows are as hot as on a real flash-sale day.
pub(super) const SKUS: u32 = 8;
/// Units of each SKU before any order locks some.
pub(super) const UNITS_PER_SKU: i64 = 10_000_000;
/// Rows per multi-row INSERT while seeding.
const CHUNK: usize = 400;
/// The name of the bench's database on MariaDB/MySQL and PostgreSQL (dropped and made anew
/// each run, kept afterwards for a look).
pub(super) const DATABASE: &str = "timeoutd_bench";

/// What was seeded, for the audit.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Shape {
    /// Order lines over both sets.
    pub lines: u64,
    /// Orders holding a coupon, over both sets.
    pub coupons: u64,
    /// Orders in a flash-sale activity, over both sets.
    pub flash: u64,
    /// Stock units over all SKUs before any order.
    pub initial_units: i64,
}

/// A fresh, empty database on the server `url` names, and its URL. On SQLite a temporary
/// directory holds it (returned, so it lives as long as the run).
///
/// # Errors
/// The server cannot be reached or the database cannot be made.
pub(super) async fn fresh_database(
    url: &str,
) -> anyhow::Result<(String, Option<tempfile::TempDir>)> {
    match Backend::of_url(url)? {
        Backend::Sqlite => {
            let dir = tempfile::tempdir()?;
            let url = format!("sqlite://{}/bench.db", dir.path().display());
            Ok((url, Some(dir)))
        }
        backend => {
            let admin = Db::connect(url, 1).await?;
            let drop = format!("DROP DATABASE IF EXISTS {DATABASE}");
            sqlx::query(sqlx::AssertSqlSafe(drop))
                .execute(admin.pool())
                .await?;
            let create = match backend {
                Backend::MySql => format!("CREATE DATABASE {DATABASE} CHARACTER SET utf8mb4"),
                _ => format!("CREATE DATABASE {DATABASE}"),
            };
            sqlx::query(sqlx::AssertSqlSafe(create))
                .execute(admin.pool())
                .await?;
            admin.close().await;
            Ok((with_database(url, DATABASE), None))
        }
    }
}

/// `url` with its database (the path) replaced by `name`, query kept.
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let authority_end = base
        .find("://")
        .map(|i| i + 3)
        .and_then(|start| base[start..].find('/').map(|j| start + j))
        .unwrap_or(base.len());
    let mut out = format!("{}/{name}", &base[..authority_end]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

/// Seeds the SKUs and 2 × `n` PENDING orders of `merchant` (the baseline's overdue, the
/// daemon's due a day from now until [`set_deadline`]): ids `b-<i>` and `d-<i>`, one or two lines on the
/// hot SKUs, a LOCKED coupon on every fifth, an activity on every other, a payment reference on
/// each, and with `outbox` their phase-0 outbox row.
///
/// # Errors
/// A statement fails.
pub(super) async fn seed(db: &Db, merchant: &str, n: u32, outbox: bool) -> anyhow::Result<Shape> {
    let backend = db.backend();
    let now = db.now_ms().await?;
    let far = now + 86_400_000;
    // The baseline's orders are overdue already (it runs before the daemon starts); the
    // daemon's wait a day until `set_deadline` puts them all at one instant.
    let due_of = |id: &str| {
        if id.starts_with("b-") {
            now - 60_000
        } else {
            far
        }
    };
    let mut shape = Shape {
        initial_units: i64::from(SKUS) * UNITS_PER_SKU,
        ..Shape::default()
    };
    let mut locked = vec![0i64; SKUS as usize];
    let ids: Vec<String> = (0..n)
        .map(|i| format!("b-{i:07}"))
        .chain((0..n).map(|i| format!("d-{i:07}")))
        .collect();
    for chunk in ids.chunks(CHUNK) {
        let mut orders = Vec::new();
        let mut lines = Vec::new();
        let mut coupons = Vec::new();
        for id in chunk {
            let i: u32 = id[2..].parse().expect("seeded id");
            let coupon = coupon_of(id, i);
            let activity = i.is_multiple_of(2).then_some("flash-bench");
            let order_lines = lines_of(i);
            let total: i64 = order_lines.iter().map(|(_, q)| q * 1_990).sum();
            for (line_no, (sku, qty)) in order_lines.iter().enumerate() {
                locked[*sku] += qty;
                lines.push((id.clone(), line_no as i64, sku_name(*sku), *qty));
            }
            shape.lines += order_lines.len() as u64;
            shape.coupons += u64::from(coupon.is_some());
            shape.flash += u64::from(activity.is_some());
            if let Some(c) = &coupon {
                coupons.push((c.clone(), format!("u-{i}"), id.clone()));
            }
            orders.push((id.clone(), format!("u-{i}"), total, coupon, activity));
        }
        let mut tx = db.begin().await?;
        let marks = vec!["(?, ?, ?, 'PENDING', ?, ?, ?, ?, ?, ?)"; orders.len()].join(", ");
        let mut q = backend.query_owned(format!(
            "INSERT INTO orders (id, merchant_id, user_id, status, created_at_ms, deadline_ms, \
             total_cents, coupon_id, activity_id, payment_ref) VALUES {marks}"
        ));
        for (id, user, total, coupon, activity) in &orders {
            q = q
                .bind(id.clone())
                .bind(merchant.to_string())
                .bind(user.clone())
                .bind(due_of(id) - 900_000)
                .bind(due_of(id))
                .bind(*total)
                .bind(coupon.clone())
                .bind(activity.map(str::to_string))
                .bind(format!("pay-{id}"));
        }
        q.execute(&mut *tx).await?;
        let marks = vec!["(?, ?, ?, ?, 1990)"; lines.len()].join(", ");
        let mut q = backend.query_owned(format!(
            "INSERT INTO order_items (order_id, line_no, sku, quantity, unit_price_cents) \
             VALUES {marks}"
        ));
        for (id, line_no, sku, qty) in &lines {
            q = q
                .bind(id.clone())
                .bind(*line_no)
                .bind(sku.clone())
                .bind(*qty);
        }
        q.execute(&mut *tx).await?;
        if !coupons.is_empty() {
            let marks = vec!["(?, ?, 'LOCKED', ?)"; coupons.len()].join(", ");
            let mut q = backend.query_owned(format!(
                "INSERT INTO coupons (id, user_id, status, order_id) VALUES {marks}"
            ));
            for (c, user, id) in &coupons {
                q = q.bind(c.clone()).bind(user.clone()).bind(id.clone());
            }
            q.execute(&mut *tx).await?;
        }
        // The baseline's orders always have their row: it marks it PROCESSED like the daemon.
        let rows: Vec<&String> = chunk
            .iter()
            .filter(|id| outbox || id.starts_with("b-"))
            .collect();
        if !rows.is_empty() {
            let marks = vec!["(?, ?, 0, 'PENDING')"; rows.len()].join(", ");
            let mut q = backend.query_owned(format!(
                "INSERT INTO order_timeout_msg (order_id, due_ms, phase, status) VALUES {marks}"
            ));
            for id in rows {
                q = q.bind(id.clone()).bind(due_of(id));
            }
            q.execute(&mut *tx).await?;
        }
        tx.commit().await?;
    }
    let mut tx = db.begin().await?;
    for (sku, units) in locked.iter().enumerate() {
        backend
            .query("INSERT INTO sku_stock (sku, available) VALUES (?, ?)")
            .bind(sku_name(sku))
            .bind(UNITS_PER_SKU - units)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(shape)
}

/// The lines of order number `i`: (SKU index, quantity), one line, or two on every fourth.
pub(super) fn lines_of(i: u32) -> Vec<(usize, i64)> {
    let first = (i % SKUS) as usize;
    let mut lines = vec![(first, 1 + i64::from(i % 3))];
    if i.is_multiple_of(4) {
        lines.push(((first + 1) % SKUS as usize, 1));
    }
    lines
}

/// The coupon order `id` (number `i`) holds, on every fifth order.
pub(super) fn coupon_of(id: &str, i: u32) -> Option<String> {
    i.is_multiple_of(5).then(|| format!("c-{id}"))
}

/// The SKU code of SKU index `sku`.
pub(super) fn sku_name(sku: usize) -> String {
    format!("sku-{sku}")
}

/// Moves every daemon order's deadline (and its outbox row's due time) to `deadline_ms`, or
/// with `spread_ms` > 0, order `d-k` to `deadline_ms + k × spread_ms`.
///
/// # Errors
/// A statement fails.
pub(super) async fn set_deadline(db: &Db, deadline_ms: i64, spread_ms: i64) -> anyhow::Result<()> {
    let backend = db.backend();
    // The order's number, from its id `d-0000042`.
    let number = |column: &str| match backend {
        Backend::MySql => format!("CAST(SUBSTR({column}, 3) AS SIGNED)"),
        Backend::Postgres => format!("CAST(SUBSTR({column}, 3) AS BIGINT)"),
        Backend::Sqlite => format!("CAST(SUBSTR({column}, 3) AS INTEGER)"),
    };
    let due = |column: &str| format!("(? + ? * {})", number(column));
    let mut tx = db.begin().await?;
    backend
        .query_owned(format!(
            "UPDATE orders SET deadline_ms = {d}, created_at_ms = {d} - 900000 WHERE id LIKE 'd-%'",
            d = due("id")
        ))
        .bind(deadline_ms)
        .bind(spread_ms)
        .bind(deadline_ms)
        .bind(spread_ms)
        .execute(&mut *tx)
        .await?;
    backend
        .query_owned(format!(
            "UPDATE order_timeout_msg SET due_ms = {} WHERE order_id LIKE 'd-%'",
            due("order_id")
        ))
        .bind(deadline_ms)
        .bind(spread_ms)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Seeds `n` orders of months past (`h-…`), half PAID and half CLOSED, each with its PROCESSED
/// phase-0 outbox row: the tables as a shop that has traded for a while leaves them, under
/// which the sweep's and the claim's queries must stay fast.
///
/// # Errors
/// A statement fails.
pub(super) async fn history(db: &Db, merchant: &str, n: u32) -> anyhow::Result<()> {
    let backend = db.backend();
    let long_ago = db.now_ms().await? - 90 * 86_400_000;
    let mut written = 0u32;
    while written < n {
        let count = (n - written).min(CHUNK as u32 * 2);
        let mut tx = db.begin().await?;
        let marks = vec!["(?, ?, ?, ?, ?, ?, ?, 1990, ?)"; count as usize].join(", ");
        let mut q = backend.query_owned(format!(
            "INSERT INTO orders (id, merchant_id, user_id, status, created_at_ms, deadline_ms, \
             closed_at_ms, total_cents, payment_ref) VALUES {marks}"
        ));
        for k in written..written + count {
            let deadline = long_ago + i64::from(k);
            q = q
                .bind(format!("h-{k:07}"))
                .bind(merchant.to_string())
                .bind(format!("u-{k}"))
                .bind(if k % 2 == 0 { "PAID" } else { "CLOSED" })
                .bind(deadline - 900_000)
                .bind(deadline)
                .bind((k % 2 == 1).then_some(deadline + 5))
                .bind(format!("pay-h-{k}"));
        }
        q.execute(&mut *tx).await?;
        let marks = vec!["(?, ?, 0, 'PROCESSED', ?)"; count as usize].join(", ");
        let mut q = backend.query_owned(format!(
            "INSERT INTO order_timeout_msg (order_id, due_ms, phase, status, processed_at_ms) \
             VALUES {marks}"
        ));
        for k in written..written + count {
            let deadline = long_ago + i64::from(k);
            q = q
                .bind(format!("h-{k:07}"))
                .bind(deadline)
                .bind(deadline + 5);
        }
        q.execute(&mut *tx).await?;
        tx.commit().await?;
        written += count;
        if written % 100_000 < count {
            super::progress(format_args!("history: {written} / {n}"));
        }
    }
    Ok(())
}

/// Daemon orders still PENDING.
///
/// # Errors
/// The query fails.
pub(super) async fn open_orders(db: &Db) -> anyhow::Result<u64> {
    let open: i64 = db
        .backend()
        .query("SELECT COUNT(*) FROM orders WHERE status = 'PENDING' AND id LIKE 'd-%'")
        .fetch_one(db.pool())
        .await?
        .try_get(0)?;
    Ok(open.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn the_database_of_a_url_is_replaced_and_its_query_kept() {
        assert_eq!(
            with_database("mysql://root@127.0.0.1:3306/test", "x"),
            "mysql://root@127.0.0.1:3306/x"
        );
        assert_eq!(
            with_database("postgres://u:p@h:5432/db?sslmode=disable", "x"),
            "postgres://u:p@h:5432/x?sslmode=disable"
        );
        assert_eq!(with_database("mysql://h:3306", "x"), "mysql://h:3306/x");
    }
}
