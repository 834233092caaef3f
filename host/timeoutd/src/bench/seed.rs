//! The bench's database and orders: a fresh database on the configured server, and 3 × N orders
//! written as an order service writes them (`b-…` for the client-loop baseline, `s-…` for the
//! set-based one, `d-…` for the daemon).

use crate::db::{Backend, Db, fixtures};

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
    /// Order lines over the three sets.
    pub lines: u64,
    /// Orders holding a coupon, over the three sets.
    pub coupons: u64,
    /// Orders in a flash-sale activity, over the three sets.
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
        Backend::MySql | Backend::Postgres => {
            let admin = Db::connect(url, 1).await?;
            fixtures::recreate_database(&admin, DATABASE).await?;
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

/// Seeds the SKUs and 3 × `n` PENDING orders of `merchant` (the baselines' overdue, the
/// daemon's due a day from now until [`set_deadline`]): ids `b-<i>`, `s-<i>` and `d-<i>`, one or two lines on the
/// `skus` hot SKUs, a LOCKED coupon on every fifth, an activity on every other, a payment
/// reference on each, and with `outbox` their phase-0 outbox row.
///
/// # Errors
/// A statement fails.
pub(super) async fn seed(
    db: &Db,
    merchant: &str,
    n: u32,
    skus: u32,
    outbox: bool,
) -> anyhow::Result<Shape> {
    let now = db.now_ms().await?;
    let far = now + 86_400_000;
    // The baseline's orders are overdue already (it runs before the daemon starts); the
    // daemon's wait a day until `set_deadline` puts them all at one instant.
    let baseline = |id: &str| id.starts_with("b-") || id.starts_with("s-");
    let due_of = |id: &str| {
        if baseline(id) { now - 60_000 } else { far }
    };
    let mut shape = Shape {
        initial_units: i64::from(skus) * UNITS_PER_SKU,
        ..Shape::default()
    };
    let mut locked = vec![0i64; skus as usize];
    let ids: Vec<String> = (0..n)
        .map(|i| format!("b-{i:07}"))
        .chain((0..n).map(|i| format!("s-{i:07}")))
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
            let order_lines = lines_of(i, skus);
            let total: i64 = order_lines.iter().map(|(_, q)| q * 1_990).sum();
            for (line_no, (sku, qty)) in order_lines.iter().enumerate() {
                locked[*sku] += qty;
                lines.push(fixtures::Line {
                    order_id: id.clone(),
                    line_no: line_no as i64,
                    sku: sku_name(*sku),
                    quantity: *qty,
                });
            }
            shape.lines += order_lines.len() as u64;
            shape.coupons += u64::from(coupon.is_some());
            shape.flash += u64::from(activity.is_some());
            if let Some(c) = &coupon {
                coupons.push((c.clone(), format!("u-{i}"), id.clone()));
            }
            orders.push(fixtures::PendingOrder {
                id: id.clone(),
                user_id: format!("u-{i}"),
                created_at_ms: due_of(id) - 900_000,
                deadline_ms: due_of(id),
                total_cents: total,
                coupon_id: coupon,
                activity_id: activity.map(str::to_string),
                payment_ref: format!("pay-{id}"),
            });
        }
        let mut tx = db.begin().await?;
        fixtures::insert_pending_orders(&mut tx, merchant, &orders).await?;
        fixtures::insert_lines(&mut tx, &lines).await?;
        fixtures::insert_locked_coupons(&mut tx, &coupons).await?;
        // The baselines' orders always have their row: they mark it PROCESSED like the daemon.
        let rows: Vec<(String, i64)> = chunk
            .iter()
            .filter(|id| outbox || baseline(id))
            .map(|id| (id.clone(), due_of(id)))
            .collect();
        fixtures::insert_pending_outbox_rows(&mut tx, &rows).await?;
        tx.commit().await?;
    }
    let mut tx = db.begin().await?;
    for (sku, units) in locked.iter().enumerate() {
        fixtures::add_stock(&mut tx, &sku_name(sku), UNITS_PER_SKU - units).await?;
    }
    tx.commit().await?;
    Ok(shape)
}

/// The lines of order number `i` over `skus` SKUs: (SKU index, quantity), one line, or two on
/// every fourth (the next SKU, or the same one again when there is only one).
pub(super) fn lines_of(i: u32, skus: u32) -> Vec<(usize, i64)> {
    let first = (i % skus) as usize;
    let mut lines = vec![(first, 1 + i64::from(i % 3))];
    if i.is_multiple_of(4) {
        lines.push(((first + 1) % skus as usize, 1));
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
    fixtures::set_daemon_deadlines(db, deadline_ms, spread_ms).await?;
    Ok(())
}

/// Seeds `n` orders of months past (`h-…`), half PAID and half CLOSED, each with its PROCESSED
/// phase-0 outbox row: the tables as a shop that has traded for a while leaves them, under
/// which the sweep's and the claim's queries must stay fast.
///
/// # Errors
/// A statement fails.
pub(super) async fn history(db: &Db, merchant: &str, n: u32) -> anyhow::Result<()> {
    let long_ago = db.now_ms().await? - 90 * 86_400_000;
    let mut written = 0u32;
    while written < n {
        let count = (n - written).min(CHUNK as u32 * 2);
        let orders: Vec<fixtures::PastOrder> = (written..written + count)
            .map(|k| {
                let deadline = long_ago + i64::from(k);
                fixtures::PastOrder {
                    id: format!("h-{k:07}"),
                    user_id: format!("u-{k}"),
                    status: if k % 2 == 0 { "PAID" } else { "CLOSED" },
                    created_at_ms: deadline - 900_000,
                    deadline_ms: deadline,
                    closed_at_ms: (k % 2 == 1).then_some(deadline + 5),
                    payment_ref: format!("pay-h-{k}"),
                }
            })
            .collect();
        let rows: Vec<(String, i64, i64)> = orders
            .iter()
            .map(|o| (o.id.clone(), o.deadline_ms, o.deadline_ms + 5))
            .collect();
        let mut tx = db.begin().await?;
        fixtures::insert_past_orders(&mut tx, merchant, &orders).await?;
        fixtures::insert_processed_outbox_rows(&mut tx, &rows).await?;
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
    let open = crate::db::bench::open_daemon_orders(db).await?;
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
