//! A compiled profile checked against the live schema (`information_schema` on MySQL, the same
//! and `pg_catalog` on PostgreSQL): every table and column it names exists with a type its form
//! can read, and the index the sweep needs is there. Start-up refuses a profile with problems
//! (each named); `timeoutd doctor` reports them and the index advice.

use std::collections::HashMap;

use sqlx::Row;

use super::mapped::Mapped;
use super::profile::{Deadline, IdType, MerchantSpec, MoneyKind, StatusValue, TimeKind};
use crate::db::{Backend, Db, DbError};

/// What the live schema says about a profile.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// What makes the profile unusable here (a missing table or column, a type its form
    /// cannot read), each naming the profile key, table and column.
    pub problems: Vec<String>,
    /// What works but costs (the sweep's index), with the statement that fixes it.
    pub advice: Vec<String>,
}

/// The kinds of column type a profile key accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// Anything.
    Any,
    /// An integer type.
    Integer,
    /// `DATETIME` or `TIMESTAMP` (MySQL), `timestamp without time zone` (PostgreSQL): a wall
    /// time.
    DateTime,
    /// `DECIMAL` / `NUMERIC`.
    Decimal,
    /// `CHAR`, `VARCHAR`, `TEXT`.
    Text,
}

impl Want {
    fn accepts(self, data_type: &str) -> bool {
        let t = data_type.to_ascii_lowercase();
        match self {
            Want::Any => true,
            Want::Integer => t.ends_with("int") || t == "integer",
            Want::DateTime => {
                t == "datetime" || t == "timestamp" || t == "timestamp without time zone"
            }
            Want::Decimal => t == "decimal" || t == "numeric",
            Want::Text => t.contains("char") || t.ends_with("text"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Want::Any => "any type",
            Want::Integer => "an integer type",
            Want::DateTime => "DATETIME or TIMESTAMP (on PostgreSQL: timestamp without time zone)",
            Want::Decimal => "DECIMAL",
            Want::Text => "a character type",
        }
    }
}

/// Checks `m` against the server `db` is connected to.
///
/// # Errors
/// [`DbError::Sql`] when `information_schema` cannot be read.
pub async fn check(db: &Db, m: &Mapped) -> Result<Report, DbError> {
    let p = m.profile();
    let o = &p.orders;
    let time = match p.time.kind {
        TimeKind::Datetime => Want::DateTime,
        TimeKind::EpochS | TimeKind::EpochMs => Want::Integer,
    };
    let money = match p.money.kind {
        MoneyKind::DecimalYuan => Want::Decimal,
        MoneyKind::Cents => Want::Integer,
    };
    let id = match o.id_type {
        IdType::Bigint => Want::Integer,
        IdType::Text => Want::Text,
    };
    let kind = |v: &StatusValue| match v {
        StatusValue::Int(_) => Want::Integer,
        StatusValue::Text(_) => Want::Text,
    };
    let status = kind(&o.closed);
    // A value the profile writes or compares (the soft-delete's live value, a settings key, a
    // coupon state, a `[paid]` value) must be of its column's kind on PostgreSQL, which
    // converts neither way; MySQL converts it, so any column does there.
    let value_of = |v: &StatusValue| match db.backend() {
        Backend::Postgres => kind(v),
        Backend::MySql | Backend::Sqlite => Want::Any,
    };
    // (profile key, table, column, what it must be)
    let mut wanted: Vec<(String, &str, &str, Want)> = vec![
        ("orders.id".into(), &o.table, &o.id, id),
        ("orders.user".into(), &o.table, &o.user, Want::Any),
        ("orders.status".into(), &o.table, &o.status, status),
        ("orders.created".into(), &o.table, &o.created, time),
        ("orders.total".into(), &o.table, &o.total, money),
        (
            "items.order".into(),
            &p.items.table,
            &p.items.order,
            Want::Any,
        ),
        ("items.sku".into(), &p.items.table, &p.items.sku, Want::Any),
        (
            "items.quantity".into(),
            &p.items.table,
            &p.items.quantity,
            Want::Integer,
        ),
        (
            "items.unit_price".into(),
            &p.items.table,
            &p.items.unit_price,
            money,
        ),
        (
            "items.line".into(),
            &p.items.table,
            &p.items.line,
            Want::Any,
        ),
        ("stock.sku".into(), &p.stock.table, &p.stock.sku, Want::Any),
        (
            "stock.column".into(),
            &p.stock.table,
            &p.stock.column,
            Want::Integer,
        ),
    ];
    let optional = [
        ("orders.coupon", &o.coupon, Want::Any),
        ("orders.points", &o.points, Want::Integer),
        ("orders.payment_ref", &o.payment_ref, Want::Any),
        ("orders.modified", &o.modified, time),
    ];
    for (key, column, want) in optional {
        if let Some(c) = column {
            wanted.push((key.into(), &o.table, c, want));
        }
    }
    if let MerchantSpec::Column(c) = &o.merchant {
        wanted.push(("orders.merchant.column".into(), &o.table, c, Want::Any));
    }
    if let Some(d) = &o.soft_delete {
        wanted.push((
            "orders.soft_delete.column".into(),
            &o.table,
            &d.column,
            value_of(&d.live),
        ));
    }
    match m.deadline() {
        Deadline::Column(c) => wanted.push(("deadline.column".into(), &o.table, c, time)),
        Deadline::Settings(s) => {
            wanted.push((
                "deadline.settings.column".into(),
                &s.table,
                &s.column,
                Want::Integer,
            ));
            wanted.push((
                "deadline.settings.key".into(),
                &s.table,
                &s.key,
                value_of(&s.key_value),
            ));
        }
        Deadline::Window(_) => {}
    }
    if let Some(c) = &p.coupon {
        for (k, col, want) in [
            ("row", &c.row, Want::Integer),
            ("coupon", &c.coupon, Want::Any),
            ("holder", &c.holder, Want::Any),
            ("status", &c.status, value_of(&c.locked)),
        ] {
            wanted.push((format!("coupon.{k}"), &c.table, col, want));
        }
    }
    if let Some(pt) = &p.points {
        wanted.push(("points.member".into(), &pt.table, &pt.member, Want::Any));
        wanted.push(("points.column".into(), &pt.table, &pt.column, Want::Integer));
    }
    if let Some(paid) = &p.paid {
        if let Some(t) = &paid.time {
            wanted.push(("paid.time".into(), &o.table, t, time));
        }
        for (column, value) in &paid.set {
            wanted.push((
                format!("paid.set.{column}"),
                &o.table,
                column,
                value_of(value),
            ));
        }
        if let Some(sold) = &paid.stock {
            wanted.push(("paid.stock".into(), &p.stock.table, sold, Want::Integer));
        }
    }

    let database = m.database().map(str::to_string);
    let rows = db
        .backend()
        .query(match db.backend() {
            Backend::Postgres => {
                "SELECT CAST(table_name AS TEXT), CAST(column_name AS TEXT), \
                 CAST(data_type AS TEXT) FROM information_schema.columns \
                 WHERE table_schema = COALESCE(?, current_schema())"
            }
            Backend::MySql | Backend::Sqlite => {
                "SELECT TABLE_NAME, COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = COALESCE(?, DATABASE())"
            }
        })
        .bind(database.clone())
        .fetch_all(db.pool())
        .await?;
    // How a name is matched: exactly on PostgreSQL, where the statements quote every name (an
    // unquoted name in the shop's DDL was folded to lower case, so the profile must say it so);
    // in any case on MySQL, whose column names never depend on case.
    let name = |n: &str| match db.backend() {
        Backend::Postgres => n.to_string(),
        Backend::MySql | Backend::Sqlite => n.to_ascii_lowercase(),
    };
    let mut columns: HashMap<(String, String), String> = HashMap::new();
    for r in &rows {
        let table: String = r.try_get(0)?;
        let column: String = r.try_get(1)?;
        let data_type: String = r.try_get(2)?;
        columns.insert((name(&table), name(&column)), data_type);
    }
    let where_ = match (&database, db.backend()) {
        (Some(d), Backend::Postgres) => format!("schema `{d}`"),
        (Some(d), _) => format!("database `{d}`"),
        (None, Backend::Postgres) => {
            "the current schema of the database database.url names".to_string()
        }
        (None, _) => "the database database.url names".to_string(),
    };
    let mut report = Report::default();
    let mut missing_tables: Vec<&str> = Vec::new();
    for (key, table, column, want) in &wanted {
        let has_table = columns.keys().any(|(t, _)| *t == name(table));
        if !has_table {
            if !missing_tables.contains(table) {
                missing_tables.push(table);
                report
                    .problems
                    .push(format!("table `{table}` (from `{key}`) is not in {where_}"));
            }
            continue;
        }
        match columns.get(&(name(table), name(column))) {
            None => report
                .problems
                .push(format!("`{key}`: table `{table}` has no column `{column}`")),
            Some(t) if !want.accepts(t) && t.eq_ignore_ascii_case("timestamp with time zone") => {
                report.problems.push(format!(
                    "`{key}`: `{table}`.`{column}` is timestamp with time zone; the profile's \
                     `[time]` reads wall times (timestamp without time zone) in a named zone: \
                     not supported in this version"
                ))
            }
            Some(t) if !want.accepts(t) => report.problems.push(format!(
                "`{key}`: `{table}`.`{column}` is {t}, the profile needs {}",
                want.name()
            )),
            Some(_) => {}
        }
    }
    if !report.problems.is_empty() {
        return Ok(report);
    }
    // The sweep's index: the status, then the time it orders and bounds by.
    let time_column = m.due_column();
    let catalog = Catalog {
        db,
        database: database.clone(),
    };
    // PostgreSQL builds an index without blocking writes only when asked to.
    let online = match db.backend() {
        Backend::Postgres => "CREATE INDEX CONCURRENTLY",
        Backend::MySql | Backend::Sqlite => "CREATE INDEX",
    };
    if !catalog
        .has_index(&o.table, &[&o.status, time_column])
        .await?
    {
        let rows = catalog.rows(&o.table).await?;
        report.advice.push(format!(
            "`{table}` has no index on ({status}, {time_column}): each sweep round, overdue \
             gauge and overdue list reads every one of its rows (about {rows} now) to find the \
             few pending ones. Create it once, online: {online} idx_timeoutd_sweep ON {qualified} \
             ({status}, {time_column}) (docs/adoption.md)",
            table = o.table,
            status = o.status,
            qualified = m.orders_table(),
        ));
    }
    // Loading a group's lines looks them up by order.
    let items = &p.items;
    if !catalog.has_index(&items.table, &[&items.order]).await? {
        let rows = catalog.rows(&items.table).await?;
        report.advice.push(format!(
            "`{table}` has no index on ({order}): each close reads every one of its rows (about \
             {rows} now) to find its orders' lines. Create it once, online: {online} \
             idx_timeoutd_lines ON {qualified} ({order}) (docs/adoption.md)",
            table = items.table,
            order = items.order,
            qualified = m.items_table(),
        ));
    }
    Ok(report)
}

/// The catalog of the database holding the shop's tables.
struct Catalog<'a> {
    db: &'a Db,
    /// The shop's database; `None` for the one `database.url` names.
    database: Option<String>,
}

impl Catalog<'_> {
    /// Whether `table` has an index whose leading columns are `columns`, in order.
    async fn has_index(&self, table: &str, columns: &[&str]) -> Result<bool, DbError> {
        let rows = self
            .db
            .backend()
            .query(match self.db.backend() {
                // Each index of the table with its key columns' positions (expressions, whose
                // attnum is 0, match no column).
                Backend::Postgres => {
                    "SELECT CAST(ic.relname AS TEXT), CAST(k.n AS BIGINT), CAST(c.attname AS TEXT) \
                     FROM pg_index x JOIN pg_class ic ON ic.oid = x.indexrelid \
                     JOIN pg_class t ON t.oid = x.indrelid \
                     JOIN pg_namespace ns ON ns.oid = t.relnamespace \
                     CROSS JOIN LATERAL unnest(x.indkey) WITH ORDINALITY AS k(attnum, n) \
                     JOIN pg_attribute c ON c.attrelid = t.oid AND c.attnum = k.attnum \
                     WHERE ns.nspname = COALESCE(?, current_schema()) AND t.relname = ?"
                }
                Backend::MySql | Backend::Sqlite => {
                    "SELECT INDEX_NAME, CAST(SEQ_IN_INDEX AS SIGNED), COLUMN_NAME FROM \
                     information_schema.STATISTICS WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) \
                     AND TABLE_NAME = ?"
                }
            })
            .bind(self.database.clone())
            .bind(table.to_string())
            .fetch_all(self.db.pool())
            .await?;
        let mut by_index: HashMap<String, Vec<(i64, String)>> = HashMap::new();
        for r in &rows {
            by_index
                .entry(r.try_get(0)?)
                .or_default()
                .push((r.try_get(1)?, r.try_get(2)?));
        }
        Ok(by_index.values_mut().any(|cols| {
            cols.sort();
            cols.len() >= columns.len()
                && cols
                    .iter()
                    .zip(columns)
                    .all(|((_, have), want)| have.eq_ignore_ascii_case(want))
        }))
    }

    /// The server's estimate of `table`'s rows (0 when it has none).
    async fn rows(&self, table: &str) -> Result<i64, DbError> {
        Ok(self
            .db
            .backend()
            .query(match self.db.backend() {
                // reltuples is -1 before the table's first VACUUM or ANALYZE.
                Backend::Postgres => {
                    "SELECT CAST(GREATEST(c.reltuples, 0) AS BIGINT) FROM pg_class c \
                     JOIN pg_namespace ns ON ns.oid = c.relnamespace \
                     WHERE ns.nspname = COALESCE(?, current_schema()) AND c.relname = ?"
                }
                Backend::MySql | Backend::Sqlite => {
                    "SELECT CAST(TABLE_ROWS AS SIGNED) FROM information_schema.TABLES \
                     WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) AND TABLE_NAME = ?"
                }
            })
            .bind(self.database.clone())
            .bind(table.to_string())
            .fetch_optional(self.db.pool())
            .await?
            .map(|r| r.try_get::<Option<i64>, _>(0))
            .transpose()?
            .flatten()
            .unwrap_or(0))
    }
}
