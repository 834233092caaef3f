//! `orders`, `order_items`, `sku_stock`, `coupons`: loading an order, the close compare-and-set
//! with its stock and coupon changes, and the reference order service (create, pay) that the
//! demo and the tests use exactly as an order service would.

use sqlx::{AnyConnection, Row};
use timeoutd_runtime::model::{Order, OrderItem, OrderStatus};

use super::shop::Schema;
use super::{Backend, DbError};

/// Loads an order and its lines; `None` when there is no such order.
///
/// # Errors
/// [`DbError::Sql`] on query failure; [`DbError::BadRow`] when the row holds an unknown status.
pub async fn load(
    conn: &mut AnyConnection,
    schema: &Schema,
    id: &str,
) -> Result<Option<Order>, DbError> {
    if let Some(m) = schema.mapped() {
        return Ok(m.load_many(conn, &[id]).await?.into_values().next());
    }
    let Some(row) = Backend::of(conn)
        .query_owned(format!("SELECT {ORDER_COLUMNS} FROM orders WHERE id = ?"))
        .bind(id.to_string())
        .fetch_optional(&mut *conn)
        .await?
    else {
        return Ok(None);
    };
    let status: String = row.try_get("status")?;
    let status = OrderStatus::parse(&status).ok_or_else(|| DbError::BadRow {
        table: "orders",
        detail: format!("order `{id}` has status `{status}` (want PENDING, PAID or CLOSED)"),
    })?;
    let items = Backend::of(conn).query(
        "SELECT sku, quantity, unit_price_cents FROM order_items WHERE order_id = ? ORDER BY line_no",
    )
    .bind(id)
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .map(|r| {
        let quantity: i64 = r.try_get("quantity")?;
        Ok(OrderItem {
            sku: r.try_get("sku")?,
            quantity: u32::try_from(quantity).ok().filter(|q| *q > 0).ok_or_else(|| DbError::BadRow {
                table: "order_items",
                detail: format!("order `{id}` has a line with quantity {quantity}"),
            })?,
            unit_price_cents: r.try_get("unit_price_cents")?,
        })
    })
    .collect::<Result<Vec<_>, DbError>>()?;
    Ok(Some(order_of(&row, status, items)?))
}

/// The order a row of [`ORDER_COLUMNS`] holds, with its `status` already read and its `items`.
fn order_of(
    row: &sqlx::any::AnyRow,
    status: OrderStatus,
    items: Vec<OrderItem>,
) -> Result<Order, sqlx::Error> {
    Ok(Order {
        id: row.try_get("id")?,
        merchant: row.try_get("merchant_id")?,
        user: row.try_get("user_id")?,
        status,
        created_at_ms: row.try_get("created_at_ms")?,
        deadline_ms: row.try_get("deadline_ms")?,
        total_cents: row.try_get("total_cents")?,
        items,
        coupon: row.try_get("coupon_id")?,
        flash_activity: row.try_get("activity_id")?,
        payment_ref: row.try_get("payment_ref")?,
    })
}

/// The columns of `orders` an [`Order`] is read from.
const ORDER_COLUMNS: &str = "id, merchant_id, user_id, status, created_at_ms, deadline_ms, \
     total_cents, coupon_id, activity_id, payment_ref";

/// Loads the orders among `ids` with their lines in two statements, by id. Orders that do not
/// exist or hold something unreadable are left out: the caller takes those one at a time through
/// [`load`], which names what is wrong.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn load_many(
    conn: &mut AnyConnection,
    schema: &Schema,
    ids: &[&str],
) -> Result<std::collections::HashMap<String, Order>, DbError> {
    if let Some(m) = schema.mapped() {
        return m.load_many(conn, ids).await;
    }
    let backend = Backend::of(conn);
    let mut found = std::collections::HashMap::new();
    if ids.is_empty() {
        return Ok(found);
    }
    let mut q = backend.query_owned(format!(
        "SELECT {ORDER_COLUMNS} FROM orders WHERE id IN ({})",
        marks(ids.len())
    ));
    for id in ids {
        q = q.bind(id.to_string());
    }
    for row in q.fetch_all(&mut *conn).await? {
        let status: String = row.try_get("status")?;
        let Some(status) = OrderStatus::parse(&status) else {
            continue;
        };
        let order = order_of(&row, status, Vec::new())?;
        found.insert(order.id.clone(), order);
    }
    let mut q = backend.query_owned(format!(
        "SELECT order_id, sku, quantity, unit_price_cents FROM order_items \
         WHERE order_id IN ({}) ORDER BY order_id, line_no",
        marks(ids.len())
    ));
    for id in ids {
        q = q.bind(id.to_string());
    }
    let mut unreadable = Vec::new();
    for r in q.fetch_all(&mut *conn).await? {
        let order_id: String = r.try_get("order_id")?;
        let quantity: i64 = r.try_get("quantity")?;
        let Some(order) = found.get_mut(&order_id) else {
            continue;
        };
        match u32::try_from(quantity).ok().filter(|q| *q > 0) {
            Some(quantity) => order.items.push(OrderItem {
                sku: r.try_get("sku")?,
                quantity,
                unit_price_cents: r.try_get("unit_price_cents")?,
            }),
            None => unreadable.push(order_id),
        }
    }
    for id in unreadable {
        found.remove(&id);
    }
    Ok(found)
}

/// Status and buyer of each of `ids` that exists, by id (what the ledger executor needs to send
/// a notice or skip a reminder), in one statement.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn status_and_user(
    db: &super::Db,
    ids: &[&str],
) -> Result<std::collections::HashMap<String, (String, String)>, DbError> {
    if ids.is_empty() {
        return Ok(Default::default());
    }
    if let Some(m) = db.schema().mapped() {
        let mut conn = db.pool().acquire().await?;
        return Ok(m
            .load_many(&mut conn, ids)
            .await?
            .into_iter()
            .map(|(id, o)| (id, (o.status.as_str().to_string(), o.user)))
            .collect());
    }
    let mut q = db.backend().query_owned(format!(
        "SELECT id, status, user_id FROM orders WHERE id IN ({})",
        marks(ids.len())
    ));
    for id in ids {
        q = q.bind(id.to_string());
    }
    q.fetch_all(db.pool())
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, (r.try_get(1)?, r.try_get(2)?))))
        .collect()
}

/// The status of order `id` as this transaction sees it; `None` when there is no such order.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn status_of(conn: &mut AnyConnection, id: &str) -> Result<Option<String>, DbError> {
    Ok(Backend::of(conn)
        .query("SELECT status FROM orders WHERE id = ?")
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?
        .map(|r| r.try_get(0))
        .transpose()?)
}

/// What a close records about itself.
#[derive(Debug, Clone)]
pub struct CloseStamp<'a> {
    /// Database time of the close, epoch ms.
    pub now_ms: i64,
    /// When the close was due (deadline, or the closing phase's due time), epoch ms.
    pub due_ms: i64,
    /// Trigger kind that closed it.
    pub closed_by: &'a str,
    /// The plugin's reason.
    pub reason: &'a str,
}

/// The compare-and-set PENDING → CLOSED, guarded by the deadline and by a live payment lease
/// against the database clock. Returns false when the order is no longer PENDING (paid in
/// between, closed by a concurrent trigger), its deadline has not passed, or a payment attempt
/// holds it ([`live_leases`] tells which): the caller must then roll back and do nothing.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn compare_and_close(
    conn: &mut AnyConnection,
    id: &str,
    stamp: &CloseStamp<'_>,
) -> Result<bool, DbError> {
    let done = Backend::of(conn).query(
        "UPDATE orders SET status = 'CLOSED', closed_at_ms = ?, close_due_ms = ?, closed_by = ?, \
         close_reason = ? WHERE id = ? AND status = 'PENDING' AND deadline_ms <= ? \
         AND (payment_lease_until_ms IS NULL OR payment_lease_until_ms <= ?)",
    )
    .bind(stamp.now_ms)
    .bind(stamp.due_ms)
    .bind(stamp.closed_by)
    .bind(stamp.reason)
    .bind(id)
    .bind(stamp.now_ms)
    .bind(stamp.now_ms)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// The orders among `ids` that are PENDING (and, with `deadline_by`, whose deadline has passed
/// by then and that no payment attempt holds then), locked for this transaction (`FOR UPDATE` on MySQL/PostgreSQL, in id order so two groups never
/// deadlock on each other; SQLite's `BEGIN IMMEDIATE` already holds the only write lock). These
/// are exactly the orders [`close_many`] then closes (or a group of waits schedules): nobody can
/// pay or close them in between.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn lock_pending(
    conn: &mut AnyConnection,
    schema: &Schema,
    ids: &[&str],
    deadline_by: Option<i64>,
) -> Result<Vec<String>, DbError> {
    if let Some(m) = schema.mapped() {
        return m.lock_pending(conn, ids, deadline_by).await;
    }
    let backend = Backend::of(conn);
    let lock = match backend {
        Backend::Sqlite => "",
        Backend::MySql | Backend::Postgres => " FOR UPDATE",
    };
    let mut q = backend.query_owned(format!(
        "SELECT id FROM orders WHERE id IN ({}) AND status = 'PENDING' AND deadline_ms <= ? \
         AND (payment_lease_until_ms IS NULL OR payment_lease_until_ms <= ?) ORDER BY id{lock}",
        marks(ids.len())
    ));
    for id in ids {
        q = q.bind(id.to_string());
    }
    let by = deadline_by.unwrap_or(i64::MAX);
    let rows = q.bind(by).bind(by).fetch_all(&mut *conn).await?;
    rows.iter()
        .map(|r| Ok(r.try_get::<String, _>(0)?))
        .collect()
}

/// The compare-and-set of a group: closes every order of `closes` (locked by
/// [`lock_pending`]) with its own stamp, in one statement. Returns how many rows changed, which
/// the caller checks against `closes.len()`.
///
/// On SQLite (≥ 3.33) and PostgreSQL the stamps are joined in as a table of `(id, due_ms,
/// closed_by, reason)` rows (`UPDATE … FROM (VALUES …)`), one lookup per order. MariaDB keeps
/// a `CASE id WHEN ? THEN ? …` list per column (see [`close_many_query`]), which compares each
/// row against every id of the group: quadratic, 44 µs per row in statements of 512 on SQLite
/// against 8 µs joined (SQLite 3.40, 20,000 rows, in one run).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn close_many(
    conn: &mut AnyConnection,
    schema: &Schema,
    closes: &[(&str, CloseStamp<'_>)],
    now_ms: i64,
) -> Result<u64, DbError> {
    if closes.is_empty() {
        return Ok(0);
    }
    if let Some(m) = schema.mapped() {
        // A shop's table has no columns for timeoutd's stamps: the decision log keeps them.
        let ids: Vec<&str> = closes.iter().map(|(id, _)| *id).collect();
        return m.close_many(conn, &ids, now_ms).await;
    }
    let q = close_many_query(Backend::of(conn), "", closes, now_ms);
    Ok(q.execute(&mut *conn).await?.rows_affected())
}

/// [`close_many`]'s statement for `backend`, its values bound, after `prefix` (`""`, or
/// `EXPLAIN` for the bench's plan of it). `closes` must not be empty.
pub(crate) fn close_many_query<'q>(
    backend: Backend,
    prefix: &str,
    closes: &[(&str, CloseStamp<'_>)],
    now_ms: i64,
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
    match backend {
        Backend::Sqlite | Backend::Postgres => {
            // The group's ids drive the join, a primary-key lookup each: status and deadline
            // are wrapped (`COALESCE`, `+ 0`) so no index on them can be chosen instead. Left
            // bare, SQLite (which keeps no statistics here) planned a scan of every PENDING due
            // order with the whole VALUES list per row, and PostgreSQL does the same while its
            // statistics still say few orders are PENDING: quadratic in a burst, the very case
            // this statement is for. VALUES names its columns column1, column2, … on both.
            let rows = vec!["(?, ?, ?, ?)"; closes.len()].join(", ");
            let mut q = backend
                .query_owned(format!(
                    "{prefix} UPDATE orders SET status = 'CLOSED', closed_at_ms = ?, \
                     close_due_ms = v.column2, closed_by = v.column3, close_reason = v.column4 \
                     FROM (VALUES {rows}) AS v \
                     WHERE orders.id = v.column1 AND COALESCE(orders.status, '') = 'PENDING' \
                     AND orders.deadline_ms + 0 <= ?"
                ))
                .bind(now_ms);
            for (id, stamp) in closes {
                q = q
                    .bind(id.to_string())
                    .bind(stamp.due_ms)
                    .bind(stamp.closed_by.to_string())
                    .bind(stamp.reason.to_string());
            }
            q.bind(now_ms)
        }
        Backend::MySql => {
            // MariaDB keeps the CASE lists (quadratic per group, but the statement every
            // Galera chaos run has audited since one run with the stamps joined through a
            // derived table audited 106 orders closed twice). Measured since (docs/scaling.md, "The
            // Galera double close of 2026-12-02"; tests/integration/galera.rs): both statements
            // lock, match and count the same rows, and what keeps a close once on Galera holds
            // for either — this statement writes every row it claims (so certification commits
            // only the first of two closes of an order), counts found rows (sqlx sets
            // CLIENT_FOUND_ROWS: an order named twice, already closed or not due is not
            // counted, so `changed != closes.len()` fails the group), and fails with 1213 once
            // Galera has aborted its transaction. The symptom fits close records committed
            // after such an abort, which no statement shape prevents and the write fence does
            // (db/fence.rs: nothing sent after an abort commits).
            let case = case_by_id(closes.len());
            let mut q = backend
                .query_owned(format!(
                    "{prefix} UPDATE orders SET status = 'CLOSED', closed_at_ms = ?, \
                     close_due_ms = {case}, closed_by = {case}, close_reason = {case} \
                     WHERE id IN ({}) AND status = 'PENDING' AND deadline_ms <= ?",
                    marks(closes.len())
                ))
                .bind(now_ms);
            for (id, stamp) in closes {
                q = q.bind(id.to_string()).bind(stamp.due_ms);
            }
            for (id, stamp) in closes {
                q = q.bind(id.to_string()).bind(stamp.closed_by.to_string());
            }
            for (id, stamp) in closes {
                q = q.bind(id.to_string()).bind(stamp.reason.to_string());
            }
            for (id, _) in closes {
                q = q.bind(id.to_string());
            }
            q.bind(now_ms)
        }
    }
}

/// Releases the coupons of `pairs` (coupon, order, buyer) that are LOCKED by that very order, in
/// two statements for the whole group, and returns the coupons released. A coupon locked by
/// another order, or no longer locked, is left alone (and not returned). On a shop's schema the
/// buyer's first row of the coupon still locked is freed (`[coupon]` of the profile).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn release_coupons(
    conn: &mut AnyConnection,
    schema: &Schema,
    pairs: &[(&str, &str, &str)],
) -> Result<std::collections::HashSet<String>, DbError> {
    let mut released = std::collections::HashSet::new();
    if pairs.is_empty() {
        return Ok(released);
    }
    if let Some(m) = schema.mapped() {
        return m.release_coupons(conn, pairs).await;
    }
    let backend = Backend::of(conn);
    let lock = match backend {
        Backend::Sqlite => "",
        Backend::MySql | Backend::Postgres => " FOR UPDATE",
    };
    let mut q = backend.query_owned(format!(
        "SELECT id, order_id FROM coupons WHERE id IN ({}) AND status = 'LOCKED' ORDER BY id{lock}",
        marks(pairs.len())
    ));
    for (coupon, _, _) in pairs {
        q = q.bind(coupon.to_string());
    }
    for r in q.fetch_all(&mut *conn).await? {
        let coupon: String = r.try_get(0)?;
        let holder: Option<String> = r.try_get(1)?;
        if pairs
            .iter()
            .any(|(c, o, _)| *c == coupon && holder.as_deref() == Some(*o))
        {
            released.insert(coupon);
        }
    }
    if released.is_empty() {
        return Ok(released);
    }
    let mut q = backend.query_owned(format!(
        "UPDATE coupons SET status = 'AVAILABLE', order_id = NULL \
         WHERE id IN ({}) AND status = 'LOCKED'",
        marks(released.len())
    ));
    for coupon in &released {
        q = q.bind(coupon.clone());
    }
    q.execute(&mut *conn).await?;
    Ok(released)
}

/// `n` comma-separated `?` markers (at least one).
pub(crate) fn marks(n: usize) -> String {
    vec!["?"; n.max(1)].join(", ")
}

/// `CASE id WHEN ? THEN ? … END` with `n` arms (at least one): a value per row of an
/// `UPDATE … WHERE id IN (…)`, bound as `(id, value)` pairs. Each row is compared with every
/// arm, so keep `n` to a statement's group.
pub(crate) fn case_by_id(n: usize) -> String {
    format!("CASE id {} END", vec!["WHEN ? THEN ?"; n.max(1)].join(" "))
}

/// Gives `quantity` units of `sku` back. Returns false when the SKU has no stock row.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn restore_stock(
    conn: &mut AnyConnection,
    sku: &str,
    quantity: u32,
) -> Result<bool, DbError> {
    restore_units(conn, &Schema::Canonical, sku, i64::from(quantity)).await
}

/// Gives `units` of `sku` back in one statement (a group's total for that SKU). Returns false
/// when the SKU has no stock row (or, on a shop's schema that releases a lock, the lock holds
/// fewer units).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn restore_units(
    conn: &mut AnyConnection,
    schema: &Schema,
    sku: &str,
    units: i64,
) -> Result<bool, DbError> {
    if let Some(m) = schema.mapped() {
        return m.restore_units(conn, sku, units).await;
    }
    let done = Backend::of(conn)
        .query("UPDATE sku_stock SET available = available + ? WHERE sku = ?")
        .bind(units)
        .bind(sku)
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Makes `coupon` available again if `order` holds it locked. Returns false when it does not
/// (already released, used, or locked by another order — which is then left alone).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn release_coupon(
    conn: &mut AnyConnection,
    coupon: &str,
    order: &str,
) -> Result<bool, DbError> {
    let done = Backend::of(conn)
        .query(
            "UPDATE coupons SET status = 'AVAILABLE', order_id = NULL \
         WHERE id = ? AND order_id = ? AND status = 'LOCKED'",
        )
        .bind(coupon)
        .bind(order)
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Gives the points each of `ids` (closed in this transaction) spent back to its buyer, on a
/// shop's schema with `[points]`; nothing on the canonical tables, which hold no points.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn return_points(
    conn: &mut AnyConnection,
    schema: &Schema,
    ids: &[&str],
) -> Result<Vec<super::shop::mapped::PointsBack>, DbError> {
    match schema.mapped() {
        Some(m) => m.return_points(conn, ids).await,
        None => Ok(Vec::new()),
    }
}

/// The reference order service's create: in one transaction, insert the order and its lines,
/// lock (subtract) the lines' stock, one statement per SKU in ascending SKU order, lock the
/// coupon, and insert the order's first outbox row (phase 0, due at the deadline). That row
/// alone is enough for timeoutd to close the order on time.
///
/// Row locks are taken in the close's order (stock rows by ascending SKU, [`super::lock_order`], then the coupon:
/// [`crate::dispatch`]'s group close), so a create and a close never deadlock on them. Taken in
/// line order, they did: in an hour's soak at 150 orders a second over 8 SKUs, creates and group
/// closes deadlocked about 15 times a minute, and each deadlocked group was then closed one
/// order at a time, more transactions on the same hot rows, until at minute 10 the deadlocks
/// ran at 300 a minute and the shop fell behind (docs/performance.md, 2026-12-07).
///
/// # Errors
/// [`DbError::Sql`] when any statement fails (the transaction is rolled back).
/// The order's `status` is ignored: it is always created PENDING.
pub async fn create(conn: &mut AnyConnection, o: &Order) -> Result<(), DbError> {
    Backend::of(conn).query(
        "INSERT INTO orders (id, merchant_id, user_id, status, created_at_ms, deadline_ms, \
         total_cents, coupon_id, activity_id, payment_ref) VALUES (?, ?, ?, 'PENDING', ?, ?, ?, ?, ?, ?)",
    )
    .bind(&o.id)
    .bind(&o.merchant)
    .bind(&o.user)
    .bind(o.created_at_ms)
    .bind(o.deadline_ms)
    .bind(o.total_cents)
    .bind(&o.coupon)
    .bind(&o.flash_activity)
    .bind(&o.payment_ref)
    .execute(&mut *conn)
    .await?;
    for (line, item) in o.items.iter().enumerate() {
        Backend::of(conn).query(
            "INSERT INTO order_items (order_id, line_no, sku, quantity, unit_price_cents) VALUES (?, ?, ?, ?, ?)",
        )
        .bind(&o.id)
        .bind(line as i64)
        .bind(&item.sku)
        .bind(i64::from(item.quantity))
        .bind(item.unit_price_cents)
        .execute(&mut *conn)
        .await?;
    }
    let lines = o
        .items
        .iter()
        .map(|i| (i.sku.as_str(), i64::from(i.quantity)));
    for (sku, units) in super::lock_order::units_per_sku(lines) {
        Backend::of(conn)
            .query("UPDATE sku_stock SET available = available - ? WHERE sku = ?")
            .bind(units)
            .bind(sku)
            .execute(&mut *conn)
            .await?;
    }
    if let Some(coupon) = &o.coupon {
        Backend::of(conn).query("UPDATE coupons SET status = 'LOCKED', order_id = ? WHERE id = ? AND status = 'AVAILABLE'")
            .bind(&o.id)
            .bind(coupon)
            .execute(&mut *conn)
            .await?;
    }
    Backend::of(conn).query("INSERT INTO order_timeout_msg (order_id, due_ms, phase, status) VALUES (?, ?, 0, 'PENDING')")
        .bind(&o.id)
        .bind(o.deadline_ms)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// A paid order's locked coupon marked used, found by the order's id (one `?`: the order id).
/// Index `coupons_order` (migration 14) serves it: without it every payment read the whole
/// `coupons` table (`orders::a_payment_finds_its_coupon_by_index`).
pub const COUPON_USED: &str =
    "UPDATE coupons SET status = 'USED' WHERE order_id = ? AND status = 'LOCKED'";

/// A payment made at `paid_at_ms`, recorded at `now_ms` (epoch ms): PENDING → PAID (a
/// compare-and-set of its own) and the coupon marked USED; on a shop's schema, what the
/// profile's `[paid]` says ([`crate::db::shop::Mapped::pay`]). Returns false when the order was
/// no longer pending (closed or paid first).
///
/// # Errors
/// [`DbError::Sql`] on query failure; on a shop's schema, [`DbError::Config`] when its profile
/// leaves payments to the shop and [`DbError::BadRow`] when a line's units cannot be sold (the
/// transaction must roll back).
pub async fn pay(
    conn: &mut AnyConnection,
    schema: &Schema,
    id: &str,
    paid_at_ms: i64,
    now_ms: i64,
) -> Result<bool, DbError> {
    if let Some(m) = schema.mapped() {
        return m.pay(conn, id, paid_at_ms, now_ms).await;
    }
    let done = Backend::of(conn)
        .query(
            "UPDATE orders SET status = 'PAID', paid_at_ms = ? WHERE id = ? AND status = 'PENDING'",
        )
        .bind(paid_at_ms)
        .bind(id)
        .execute(&mut *conn)
        .await?;
    if done.rows_affected() != 1 {
        return Ok(false);
    }
    Backend::of(conn)
        .query(COUPON_USED)
        .bind(id)
        .execute(&mut *conn)
        .await?;
    Ok(true)
}

/// The PENDING orders among `ids` that a payment attempt holds at `now_ms`, with when each
/// lease lapses (epoch ms): the closes they lost are deferred until then, not dropped.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn live_leases(
    conn: &mut AnyConnection,
    schema: &Schema,
    ids: &[&str],
    now_ms: i64,
) -> Result<std::collections::HashMap<String, i64>, DbError> {
    if ids.is_empty() {
        return Ok(Default::default());
    }
    if let Some(m) = schema.mapped() {
        return m.live_leases(conn, ids, now_ms).await;
    }
    let backend = Backend::of(conn);
    let mut q = backend.query_owned(format!(
        "SELECT id, payment_lease_until_ms FROM orders WHERE id IN ({}) AND status = 'PENDING' \
         AND payment_lease_until_ms > ?",
        marks(ids.len())
    ));
    for id in ids {
        q = q.bind(id.to_string());
    }
    let rows = q.bind(now_ms).fetch_all(&mut *conn).await?;
    rows.iter()
        .map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<i64, _>(1)?)))
        .collect()
}

/// What a payment attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The order is held for the payment until `until_ms` (epoch ms).
    Held {
        /// When the lease lapses.
        until_ms: i64,
    },
    /// The order cannot be paid: its status and deadline (a CLOSED or PAID order, or a PENDING
    /// one past its deadline).
    Refused {
        /// `PENDING`, `PAID` or `CLOSED`.
        status: String,
        /// Its deadline, epoch ms.
        deadline_ms: i64,
    },
    /// No such order.
    Missing,
}

/// A payment attempt on `id` at `now_ms`: holds a PENDING order not past its deadline until
/// `until_ms` (a live lease is extended, never shortened), so its close waits for the payment.
/// Run it in a write transaction ([`crate::db::Db::begin`]): on a schema profile the lease is
/// a row of `payment_leases` written while the shop's order row is locked
/// ([`crate::db::shop::Mapped::take_payment_lease`]).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn take_payment_lease(
    conn: &mut AnyConnection,
    schema: &Schema,
    id: &str,
    now_ms: i64,
    until_ms: i64,
) -> Result<Attempt, DbError> {
    if let Some(m) = schema.mapped() {
        return Ok(
            match m.take_payment_lease(conn, id, now_ms, until_ms).await? {
                None => Attempt::Missing,
                Some(found) => match found.held_until_ms {
                    Some(until_ms) => Attempt::Held { until_ms },
                    None => Attempt::Refused {
                        status: found.status.as_str().to_string(),
                        deadline_ms: found.deadline_ms,
                    },
                },
            },
        );
    }
    let backend = Backend::of(conn);
    let done = backend
        .query(
            "UPDATE orders SET payment_lease_until_ms = ? WHERE id = ? AND status = 'PENDING' \
             AND deadline_ms > ? AND (payment_lease_until_ms IS NULL OR payment_lease_until_ms < ?)",
        )
        .bind(until_ms)
        .bind(id)
        .bind(now_ms)
        .bind(until_ms)
        .execute(&mut *conn)
        .await?;
    let row = backend
        .query("SELECT status, deadline_ms, payment_lease_until_ms FROM orders WHERE id = ?")
        .bind(id)
        .fetch_optional(&mut *conn)
        .await?;
    let Some(row) = row else {
        return Ok(Attempt::Missing);
    };
    let status: String = row.try_get(0)?;
    let deadline_ms: i64 = row.try_get(1)?;
    let lease: Option<i64> = row.try_get(2)?;
    Ok(match lease {
        Some(until_ms)
            if done.rows_affected() == 1
                || (status == "PENDING" && deadline_ms > now_ms && until_ms > now_ms) =>
        {
            Attempt::Held { until_ms }
        }
        _ => Attempt::Refused {
            status,
            deadline_ms,
        },
    })
}
