//! Seeding for the demo and the bench: a fresh bench database, stock rows, coupons, and orders
//! written in bulk as an order service would write them (with their lines, coupons and outbox
//! rows), and the bench's move of its daemon orders' deadlines. Never used by the daemon itself.
//! Times are epoch ms, amounts cents.

use sqlx::AnyConnection;

use super::{Backend, Db, DbError};

/// Drops database `name` if it exists and creates it anew (`utf8mb4` on MariaDB/MySQL), on the
/// server `db` is connected to. `name` is spliced into the statements: it must be one of
/// timeoutd's own identifiers, never input.
///
/// # Errors
/// [`DbError::Sql`] when either statement fails (e.g. no privilege, a session still using it).
pub async fn recreate_database(db: &Db, name: &str) -> Result<(), DbError> {
    let drop = format!("DROP DATABASE IF EXISTS {name}");
    sqlx::query(sqlx::AssertSqlSafe(drop))
        .execute(db.pool())
        .await?;
    let create = match db.backend() {
        Backend::MySql => format!("CREATE DATABASE {name} CHARACTER SET utf8mb4"),
        Backend::Sqlite | Backend::Postgres => format!("CREATE DATABASE {name}"),
    };
    sqlx::query(sqlx::AssertSqlSafe(create))
        .execute(db.pool())
        .await?;
    Ok(())
}

/// Adds SKU `sku` to `sku_stock` with `units` available.
///
/// # Errors
/// [`DbError::Sql`] on query failure (e.g. the SKU exists already).
pub async fn add_stock(conn: &mut AnyConnection, sku: &str, units: i64) -> Result<(), DbError> {
    Backend::of(conn)
        .query("INSERT INTO sku_stock (sku, available) VALUES (?, ?)")
        .bind(sku)
        .bind(units)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Adds an AVAILABLE coupon `id` of `user_id`, in a statement of its own (holding the write
/// gate on SQLite).
///
/// # Errors
/// [`DbError::Sql`] on query failure (e.g. the coupon exists already).
pub async fn add_coupon(db: &Db, id: &str, user_id: &str) -> Result<(), DbError> {
    let _gate = db.write_gate().await;
    db.backend()
        .query("INSERT INTO coupons (id, user_id, status) VALUES (?, ?, 'AVAILABLE')")
        .bind(id)
        .bind(user_id)
        .execute(db.pool())
        .await?;
    Ok(())
}

/// A PENDING order to seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingOrder {
    /// Order id.
    pub id: String,
    /// User id.
    pub user_id: String,
    /// Creation time, epoch ms.
    pub created_at_ms: i64,
    /// Payment deadline, epoch ms.
    pub deadline_ms: i64,
    /// Total, cents.
    pub total_cents: i64,
    /// The coupon it holds, if any.
    pub coupon_id: Option<String>,
    /// Its flash-sale activity, if any.
    pub activity_id: Option<String>,
    /// Payment reference.
    pub payment_ref: String,
}

/// Inserts `orders` of `merchant_id` as PENDING, in one multi-row statement (nothing for none).
///
/// # Errors
/// [`DbError::Sql`] on query failure (e.g. an id exists already).
pub async fn insert_pending_orders(
    conn: &mut AnyConnection,
    merchant_id: &str,
    orders: &[PendingOrder],
) -> Result<(), DbError> {
    if orders.is_empty() {
        return Ok(());
    }
    let marks = vec!["(?, ?, ?, 'PENDING', ?, ?, ?, ?, ?, ?)"; orders.len()].join(", ");
    let mut q = Backend::of(conn).query_owned(format!(
        "INSERT INTO orders (id, merchant_id, user_id, status, created_at_ms, deadline_ms, \
         total_cents, coupon_id, activity_id, payment_ref) VALUES {marks}"
    ));
    for o in orders {
        q = q
            .bind(o.id.clone())
            .bind(merchant_id.to_string())
            .bind(o.user_id.clone())
            .bind(o.created_at_ms)
            .bind(o.deadline_ms)
            .bind(o.total_cents)
            .bind(o.coupon_id.clone())
            .bind(o.activity_id.clone())
            .bind(o.payment_ref.clone());
    }
    q.execute(&mut *conn).await?;
    Ok(())
}

/// One order line to seed, at the bench's unit price of 1990 cents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// Its order.
    pub order_id: String,
    /// Position in the order, from 0.
    pub line_no: i64,
    /// SKU.
    pub sku: String,
    /// Units.
    pub quantity: i64,
}

/// Inserts `lines` into `order_items` at 1990 cents a unit, in one multi-row statement
/// (nothing for none).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn insert_lines(conn: &mut AnyConnection, lines: &[Line]) -> Result<(), DbError> {
    if lines.is_empty() {
        return Ok(());
    }
    let marks = vec!["(?, ?, ?, ?, 1990)"; lines.len()].join(", ");
    let mut q = Backend::of(conn).query_owned(format!(
        "INSERT INTO order_items (order_id, line_no, sku, quantity, unit_price_cents) \
         VALUES {marks}"
    ));
    for l in lines {
        q = q
            .bind(l.order_id.clone())
            .bind(l.line_no)
            .bind(l.sku.clone())
            .bind(l.quantity);
    }
    q.execute(&mut *conn).await?;
    Ok(())
}

/// Inserts LOCKED coupons, each `(coupon id, user id, order id)` holding it, in one multi-row
/// statement (nothing for none).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn insert_locked_coupons(
    conn: &mut AnyConnection,
    coupons: &[(String, String, String)],
) -> Result<(), DbError> {
    if coupons.is_empty() {
        return Ok(());
    }
    let marks = vec!["(?, ?, 'LOCKED', ?)"; coupons.len()].join(", ");
    let mut q = Backend::of(conn).query_owned(format!(
        "INSERT INTO coupons (id, user_id, status, order_id) VALUES {marks}"
    ));
    for (c, user, id) in coupons {
        q = q.bind(c.clone()).bind(user.clone()).bind(id.clone());
    }
    q.execute(&mut *conn).await?;
    Ok(())
}

/// Inserts PENDING phase-0 outbox rows, each `(order id, due epoch ms)`, in one multi-row
/// statement (nothing for none).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn insert_pending_outbox_rows(
    conn: &mut AnyConnection,
    rows: &[(String, i64)],
) -> Result<(), DbError> {
    if rows.is_empty() {
        return Ok(());
    }
    let marks = vec!["(?, ?, 0, 'PENDING')"; rows.len()].join(", ");
    let mut q = Backend::of(conn).query_owned(format!(
        "INSERT INTO order_timeout_msg (order_id, due_ms, phase, status) VALUES {marks}"
    ));
    for (id, due_ms) in rows {
        q = q.bind(id.clone()).bind(*due_ms);
    }
    q.execute(&mut *conn).await?;
    Ok(())
}

/// Moves every bench daemon order's (`d-<k>`) deadline to `deadline_ms + k × spread_ms` (its
/// creation 900 000 ms, 15 min, before) and its outbox rows' due time with it, in one write
/// transaction. With `spread_ms` 0 they all fall due at `deadline_ms`.
///
/// # Errors
/// [`DbError::Sql`] when the transaction or either statement fails (nothing is moved).
pub async fn set_daemon_deadlines(
    db: &Db,
    deadline_ms: i64,
    spread_ms: i64,
) -> Result<(), DbError> {
    set_deadlines(db, "d-", deadline_ms, spread_ms).await
}

/// [`set_daemon_deadlines`] for the orders whose ids are `prefix` (two characters, e.g. `a-`)
/// and a number: the fairness bench's two merchants (`bench::fairness`).
///
/// # Errors
/// [`DbError::Sql`] when the transaction or either statement fails (nothing is moved).
pub async fn set_deadlines(
    db: &Db,
    prefix: &str,
    deadline_ms: i64,
    spread_ms: i64,
) -> Result<(), DbError> {
    debug_assert_eq!(prefix.len(), 2, "the number starts at the third character");
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
            "UPDATE orders SET deadline_ms = {d}, created_at_ms = {d} - 900000 WHERE id LIKE ?",
            d = due("id")
        ))
        .bind(deadline_ms)
        .bind(spread_ms)
        .bind(deadline_ms)
        .bind(spread_ms)
        .bind(format!("{prefix}%"))
        .execute(&mut *tx)
        .await?;
    backend
        .query_owned(format!(
            "UPDATE order_timeout_msg SET due_ms = {} WHERE order_id LIKE ?",
            due("order_id")
        ))
        .bind(deadline_ms)
        .bind(spread_ms)
        .bind(format!("{prefix}%"))
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// A settled order of the past to seed, at 1990 cents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PastOrder {
    /// Order id.
    pub id: String,
    /// User id.
    pub user_id: String,
    /// `PAID` or `CLOSED`.
    pub status: &'static str,
    /// Creation time, epoch ms.
    pub created_at_ms: i64,
    /// Payment deadline, epoch ms.
    pub deadline_ms: i64,
    /// When it was closed, epoch ms (`None` for a PAID order).
    pub closed_at_ms: Option<i64>,
    /// Payment reference.
    pub payment_ref: String,
}

/// Inserts `orders` of `merchant_id` (total 1990 cents each), in one multi-row statement
/// (nothing for none).
///
/// # Errors
/// [`DbError::Sql`] on query failure (e.g. an id exists already).
pub async fn insert_past_orders(
    conn: &mut AnyConnection,
    merchant_id: &str,
    orders: &[PastOrder],
) -> Result<(), DbError> {
    if orders.is_empty() {
        return Ok(());
    }
    let marks = vec!["(?, ?, ?, ?, ?, ?, ?, 1990, ?)"; orders.len()].join(", ");
    let mut q = Backend::of(conn).query_owned(format!(
        "INSERT INTO orders (id, merchant_id, user_id, status, created_at_ms, deadline_ms, \
         closed_at_ms, total_cents, payment_ref) VALUES {marks}"
    ));
    for o in orders {
        q = q
            .bind(o.id.clone())
            .bind(merchant_id.to_string())
            .bind(o.user_id.clone())
            .bind(o.status)
            .bind(o.created_at_ms)
            .bind(o.deadline_ms)
            .bind(o.closed_at_ms)
            .bind(o.payment_ref.clone());
    }
    q.execute(&mut *conn).await?;
    Ok(())
}

/// Inserts PROCESSED phase-0 outbox rows, each `(order id, due epoch ms, processed epoch ms)`,
/// in one multi-row statement (nothing for none).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn insert_processed_outbox_rows(
    conn: &mut AnyConnection,
    rows: &[(String, i64, i64)],
) -> Result<(), DbError> {
    if rows.is_empty() {
        return Ok(());
    }
    let marks = vec!["(?, ?, 0, 'PROCESSED', ?)"; rows.len()].join(", ");
    let mut q = Backend::of(conn).query_owned(format!(
        "INSERT INTO order_timeout_msg (order_id, due_ms, phase, status, processed_at_ms) \
         VALUES {marks}"
    ));
    for (id, due_ms, processed_at_ms) in rows {
        q = q.bind(id.clone()).bind(*due_ms).bind(*processed_at_ms);
    }
    q.execute(&mut *conn).await?;
    Ok(())
}
