//! A [`Profile`] compiled for one database: its names quoted and qualified once, and every
//! statement a close, a load, the sweep and the gauges need on the shop's tables. Values are
//! always bound (`?`, numbered `$n` on PostgreSQL), never written into the text.
//!
//! Two dialects, MariaDB/MySQL and PostgreSQL (a profile on SQLite is refused at start-up):
//! - names are quoted with backticks or double quotes; `database.shop.database` names another
//!   database of the same MySQL server, or another schema of the same PostgreSQL database;
//! - values read are cast to text (`CHAR` / `TEXT`) or 64-bit integers (`SIGNED` / `BIGINT`),
//!   wall times bound as `DATETIME` / `TIMESTAMP`;
//! - keys read from the shop's rows (SKUs, coupons, members) are bound as text. MySQL converts
//!   them to the column's type itself; PostgreSQL compares only values of one type, so there
//!   each is cast to its column's own type, learned once from the catalog ([`Mapped`]'s
//!   key types), which keeps the column's index usable;
//! - an `UPDATE` names the columns it sets unqualified (PostgreSQL refuses `SET a.x`).

use std::collections::{HashMap, HashSet};

use sqlx::{AnyConnection, Row};
use timeoutd_runtime::model::{Order, OrderItem, OrderStatus};

use super::convert::{MoneyForm, Stored, TimeForm, cents_of_decimal};
use super::profile::{
    Deadline, IdType, MerchantSpec, Profile, StatusValue, StockRelease, is_identifier,
};
use crate::db::{Backend, Db, DbError};

mod lease;
mod pay;

pub use lease::Found;

/// A value bound to a `?`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bind {
    /// An integer.
    Int(i64),
    /// Text.
    Text(String),
}

impl From<&StatusValue> for Bind {
    fn from(v: &StatusValue) -> Bind {
        match v {
            StatusValue::Int(n) => Bind::Int(*n),
            StatusValue::Text(s) => Bind::Text(s.clone()),
        }
    }
}

impl From<Stored> for Bind {
    fn from(v: Stored) -> Bind {
        match v {
            Stored::Int(n) => Bind::Int(n),
            Stored::Text(s) => Bind::Text(s),
        }
    }
}

/// A statement being written: its text with `?` markers and the values they bind, in order.
#[derive(Debug, Clone)]
pub struct Stmt {
    /// The SQL.
    pub sql: String,
    /// The values of its markers.
    pub binds: Vec<Bind>,
    /// The backend it runs on (how its markers are numbered).
    backend: Backend,
}

impl Stmt {
    /// Appends SQL text (timeoutd's own fragments and quoted names only).
    pub fn push(&mut self, sql: &str) -> &mut Stmt {
        self.sql.push_str(sql);
        self
    }

    /// Appends one `?` bound to `value`.
    pub fn bind(&mut self, value: impl Into<Bind>) -> &mut Stmt {
        self.sql.push('?');
        self.binds.push(value.into());
        self
    }

    /// Appends one `?` bound to `value`, cast to the SQL type `ty` (`CAST(? AS ty)`) unless
    /// `ty` is empty.
    fn bind_as(&mut self, value: impl Into<Bind>, ty: &str) -> &mut Stmt {
        if ty.is_empty() {
            return self.bind(value);
        }
        self.push("CAST(").bind(value).push(&format!(" AS {ty})"))
    }

    /// Appends `(?, ?, …)` bound to `values` (`(NULL)` when empty, which matches nothing).
    fn bind_list(&mut self, values: impl IntoIterator<Item = Bind>) -> &mut Stmt {
        self.bind_list_as(values, "")
    }

    /// [`Stmt::bind_list`], each marker as [`Stmt::bind_as`] binds it.
    fn bind_list_as(&mut self, values: impl IntoIterator<Item = Bind>, ty: &str) -> &mut Stmt {
        let mut any = false;
        for v in values {
            self.push(if any { ", " } else { "(" });
            self.bind_as(v, ty);
            any = true;
        }
        self.push(if any { ")" } else { "(NULL)" })
    }

    /// Binds this fragment's values onto `q`, whose text holds this fragment's markers next.
    pub fn bind_onto<'q>(
        self,
        mut q: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
        for b in self.binds {
            q = match b {
                Bind::Int(n) => q.bind(n),
                Bind::Text(s) => q.bind(s),
            };
        }
        q
    }

    /// The statement with its values bound, ready to run.
    pub fn query<'q>(self) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
        let q = self.backend.query_owned(self.sql.clone());
        self.bind_onto(q)
    }
}

impl From<i64> for Bind {
    fn from(n: i64) -> Bind {
        Bind::Int(n)
    }
}

impl From<&str> for Bind {
    fn from(s: &str) -> Bind {
        Bind::Text(s.to_string())
    }
}

/// `name` quoted for `backend` (profiles allow only plain identifiers, so no escaping is
/// needed).
fn quote_for(backend: Backend, name: &str) -> String {
    debug_assert!(is_identifier(name), "{name}");
    match backend {
        Backend::Postgres => format!("\"{name}\""),
        Backend::MySql | Backend::Sqlite => format!("`{name}`"),
    }
}

/// The SQL types of the key columns whose values are bound as text ([`Mapped::key_types`]):
/// empty on MySQL (the server converts), the column's own type on PostgreSQL.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeyTypes {
    /// `stock.sku`.
    sku: String,
    /// `coupon.holder`.
    holder: String,
    /// `coupon.coupon`.
    coupon: String,
    /// `points.member`.
    member: String,
}

/// A compiled profile.
#[derive(Debug, Clone)]
pub struct Mapped {
    profile: Profile,
    /// The database holding the shop's tables, when not the one the URL names.
    database: Option<String>,
    time: TimeForm,
    money: MoneyForm,
    deadline: Deadline,
    /// `` `db`.`oms_order` `` and the other tables, qualified when the shop's tables live in
    /// another database than timeoutd's.
    orders: String,
    items: String,
    stock: String,
    coupon: Option<String>,
    points: Option<String>,
    settings: Option<String>,
    /// The backend the statements are written for (MySQL or PostgreSQL).
    backend: Backend,
    /// The key columns' types, learned from the catalog on first use ([`Mapped::key_types`]).
    key_types: std::sync::OnceLock<KeyTypes>,
}

impl Mapped {
    /// Compiles `profile` for a database of `backend`, its tables in `database` (another
    /// database of the same server) or, when `None`, in the one the URL names.
    ///
    /// # Errors
    /// Every problem of the profile, or that `backend` is SQLite (a shop's order database is
    /// MariaDB/MySQL or PostgreSQL).
    pub fn compile(
        profile: Profile,
        database: Option<&str>,
        backend: Backend,
    ) -> Result<Mapped, Vec<String>> {
        let mut problems = profile.problems();
        if backend == Backend::Sqlite {
            problems.push(format!(
                "schema profile `{}`: a shop's own tables are read on MariaDB/MySQL or \
                 PostgreSQL; database.url is SQLite",
                profile.name
            ));
        }
        if let Some(db) = database
            && !is_identifier(db)
        {
            problems.push(format!(
                "`database.shop.database` = `{db}` is not a plain database (MySQL) or schema \
                 (PostgreSQL) name"
            ));
        }
        if database.is_none() {
            // The shop's tables in timeoutd's own database: none may be one of timeoutd's.
            for table in profile.tables() {
                if crate::db::names::TABLES
                    .iter()
                    .any(|t| crate::db::names::table(t).eq_ignore_ascii_case(table))
                {
                    problems.push(format!(
                        "schema profile `{}`: the shop's table `{table}` has the name of one of \
                         timeoutd's own tables; give timeoutd's tables a prefix \
                         (`database.table_prefix`, e.g. `timeoutd_`) or a database of their own \
                         and name the shop's in `database.shop.database`",
                        profile.name
                    ));
                }
            }
        }
        let (Ok(time), Ok(deadline)) = (profile.time_form(), profile.deadline()) else {
            return Err(problems);
        };
        if !problems.is_empty() {
            return Err(problems);
        }
        let quote = |name: &str| quote_for(backend, name);
        let table = |t: &str| match database {
            Some(db) => format!("{}.{}", quote(db), quote(t)),
            None => quote(t),
        };
        Ok(Mapped {
            orders: table(&profile.orders.table),
            items: table(&profile.items.table),
            stock: table(&profile.stock.table),
            coupon: profile.coupon.as_ref().map(|c| table(&c.table)),
            points: profile.points.as_ref().map(|p| table(&p.table)),
            settings: profile.deadline.settings.as_ref().map(|s| table(&s.table)),
            database: database.map(str::to_string),
            money: profile.money_form(),
            time,
            deadline,
            profile,
            backend,
            key_types: std::sync::OnceLock::new(),
        })
    }

    /// A statement for this backend, starting with `sql`.
    fn stmt(&self, sql: impl Into<String>) -> Stmt {
        Stmt {
            sql: sql.into(),
            binds: Vec::new(),
            backend: self.backend,
        }
    }

    /// `name` quoted for this backend.
    fn quote(&self, name: &str) -> String {
        quote_for(self.backend, name)
    }

    /// A column of alias `a` (the table's alias in every statement here), quoted.
    fn col(&self, name: &str) -> String {
        format!("a.{}", self.quote(name))
    }

    /// The types of the key columns bound as text, learned from PostgreSQL's catalog once
    /// (`format_type` of each column); empty on MySQL.
    ///
    /// # Errors
    /// [`DbError::Config`] naming a key column the catalog does not have (start-up's
    /// [`super::check::check`] names it first); [`DbError::Sql`] on query failure.
    pub(crate) async fn key_types(&self, conn: &mut AnyConnection) -> Result<&KeyTypes, DbError> {
        if let Some(types) = self.key_types.get() {
            return Ok(types);
        }
        let mut types = KeyTypes::default();
        if self.backend == Backend::Postgres {
            let p = &self.profile;
            let mut wanted: Vec<(&mut String, &str, &str)> =
                vec![(&mut types.sku, &self.stock, &p.stock.sku)];
            if let (Some(c), Some(table)) = (&p.coupon, &self.coupon) {
                wanted.push((&mut types.holder, table, &c.holder));
                wanted.push((&mut types.coupon, table, &c.coupon));
            }
            if let (Some(pt), Some(table)) = (&p.points, &self.points) {
                wanted.push((&mut types.member, table, &pt.member));
            }
            for (slot, table, column) in wanted {
                let found: Option<String> = self
                    .backend
                    .query(
                        "SELECT format_type(a.atttypid, NULL) FROM pg_attribute a \
                         WHERE a.attrelid = to_regclass(?) AND a.attname = ? AND NOT a.attisdropped",
                    )
                    .bind(table.to_string())
                    .bind(column.to_string())
                    .fetch_optional(&mut *conn)
                    .await?
                    .map(|r| r.try_get(0))
                    .transpose()?;
                *slot = found.ok_or_else(|| {
                    DbError::Config(format!(
                        "schema profile `{}`: table {table} has no column `{column}`",
                        self.profile.name
                    ))
                })?;
            }
        }
        Ok(self.key_types.get_or_init(|| types))
    }

    /// The profile's name.
    pub fn name(&self) -> &str {
        &self.profile.name
    }

    /// The profile.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// The database holding the shop's tables, when not the one the URL names.
    pub fn database(&self) -> Option<&str> {
        self.database.as_deref()
    }

    /// How the deadline is found.
    pub fn deadline(&self) -> &Deadline {
        &self.deadline
    }

    /// The qualified order-line table, as statements name it.
    pub fn items_table(&self) -> &str {
        &self.items
    }

    /// The qualified order table, as statements name it.
    pub fn orders_table(&self) -> &str {
        &self.orders
    }

    /// An order id as bound: an integer for `BIGINT` ids; `None` when `id` is not one (no such
    /// order can exist).
    fn id_bind(&self, id: &str) -> Option<Bind> {
        match self.profile.orders.id_type {
            IdType::Bigint => id.trim().parse::<i64>().ok().map(Bind::Int),
            IdType::Text => Some(Bind::Text(id.to_string())),
        }
    }

    /// `expr` read as text.
    fn text(&self, expr: &str) -> String {
        match self.backend {
            Backend::Postgres => format!("CAST({expr} AS TEXT)"),
            Backend::MySql | Backend::Sqlite => format!("CAST({expr} AS CHAR)"),
        }
    }

    /// `expr` read as a 64-bit integer.
    fn int(&self, expr: &str) -> String {
        match self.backend {
            Backend::Postgres => format!("CAST({expr} AS BIGINT)"),
            Backend::MySql | Backend::Sqlite => format!("CAST({expr} AS SIGNED)"),
        }
    }

    /// The order's id as text (what triggers, the outbox and the ledger hold).
    fn id_text(&self) -> String {
        self.text(&self.col(&self.profile.orders.id))
    }

    /// A time column read for [`Mapped::read_time`].
    fn time_read(&self, expr: &str) -> String {
        if self.time.is_text() {
            self.text(expr)
        } else {
            self.int(expr)
        }
    }

    /// A money column read for [`Mapped::read_money`].
    fn money_read(&self, expr: &str) -> String {
        match self.money {
            MoneyForm::DecimalYuan => self.text(expr),
            MoneyForm::Cents => self.int(expr),
        }
    }

    fn read_time(&self, row: &sqlx::any::AnyRow, name: &str) -> Result<Option<i64>, DbError> {
        let bad = |detail: String| DbError::BadRow {
            table: "orders (schema profile)",
            detail,
        };
        if self.time.is_text() {
            let text: Option<String> = row.try_get(name)?;
            text.map(|t| self.time.read_text(&t).map_err(bad))
                .transpose()
        } else {
            let n: Option<i64> = row.try_get(name)?;
            Ok(n.map(|n| self.time.read_int(n)))
        }
    }

    fn read_money(&self, row: &sqlx::any::AnyRow, name: &str) -> Result<i64, DbError> {
        Ok(match self.money {
            MoneyForm::DecimalYuan => {
                let text: Option<String> = row.try_get(name)?;
                match text {
                    Some(t) => cents_of_decimal(&t).map_err(|detail| DbError::BadRow {
                        table: "orders (schema profile)",
                        detail,
                    })?,
                    None => 0,
                }
            }
            MoneyForm::Cents => row.try_get::<Option<i64>, _>(name)?.unwrap_or(0),
        })
    }

    /// `expr op ms` (`<=`, `>=`, `<`): a time column compared with `ms` in the column's form.
    fn time_cmp(&self, s: &mut Stmt, expr: &str, op: &str, ms: i64) {
        s.push(expr).push(&format!(" {op} "));
        self.bind_time(s, ms);
    }

    /// `ms` bound in the form of the profile's time columns.
    fn bind_time(&self, s: &mut Stmt, ms: i64) {
        match self.time.store(ms) {
            Stored::Text(t) => {
                let ty = match self.backend {
                    Backend::Postgres => "TIMESTAMP",
                    Backend::MySql | Backend::Sqlite => "DATETIME",
                };
                s.push("CAST(")
                    .bind(Bind::Text(t))
                    .push(&format!(" AS {ty})"))
            }
            Stored::Int(n) => s.bind(n),
        };
    }

    /// The time column due orders are found and ordered by: the deadline column, or the
    /// created time (the sweep's index leads with the status, then this).
    pub fn due_column(&self) -> &str {
        match &self.deadline {
            Deadline::Column(c) => c,
            Deadline::Window(_) | Deadline::Settings(_) => &self.profile.orders.created,
        }
    }

    /// The payment window in ms (`None` when the deadline is a column): fixed, or read from the
    /// settings row now.
    ///
    /// # Errors
    /// [`DbError::BadRow`] when the settings row or its value is missing or not positive.
    pub async fn window_ms(&self, conn: &mut AnyConnection) -> Result<Option<i64>, DbError> {
        match &self.deadline {
            Deadline::Column(_) => Ok(None),
            Deadline::Window(ms) => Ok(Some(*ms)),
            Deadline::Settings(w) => {
                let mut s = self.stmt(format!(
                    "SELECT {} FROM {} WHERE {} = ",
                    self.int(&self.quote(&w.column)),
                    self.settings.as_deref().unwrap_or_default(),
                    self.quote(&w.key)
                ));
                s.bind(&w.key_value);
                let value: Option<i64> = match s.query().fetch_optional(&mut *conn).await? {
                    Some(row) => row.try_get(0)?,
                    None => None,
                };
                match value {
                    Some(n) if n > 0 => Ok(Some(n * w.unit.ms())),
                    other => Err(DbError::BadRow {
                        table: "deadline.settings",
                        detail: format!(
                            "{}.{} where {} = {} is {other:?}: the payment window must be a positive number",
                            w.table,
                            w.column,
                            w.key,
                            w.key_value.as_text()
                        ),
                    }),
                }
            }
        }
    }

    /// ` AND <status> IN (pending…) [AND <live>]`.
    fn pending(&self, s: &mut Stmt) {
        let o = &self.profile.orders;
        s.push(" AND ").push(&self.col(&o.status)).push(" IN ");
        s.bind_list(o.pending.iter().map(Bind::from));
        self.live(s);
    }

    /// ` AND <soft-delete column> = live` (nothing without a soft delete).
    fn live(&self, s: &mut Stmt) {
        if let Some(d) = &self.profile.orders.soft_delete {
            s.push(" AND ")
                .push(&self.col(&d.column))
                .push(" = ")
                .bind(&d.live);
        }
    }

    /// ` AND <due at ms>`: the deadline column, or the created time plus `window`.
    fn due(&self, s: &mut Stmt, ms: i64, window: Option<i64>) {
        self.due_cmp(s, "<=", ms, window);
    }

    /// ` AND <due> op ms`: [`Mapped::due`] with any comparison (`>=`, `<`).
    fn due_cmp(&self, s: &mut Stmt, op: &str, ms: i64, window: Option<i64>) {
        s.push(" AND ");
        match (&self.deadline, window) {
            (Deadline::Column(c), _) => self.time_cmp(s, &self.col(c), op, ms),
            (_, Some(w)) => self.time_cmp(s, &self.col(&self.profile.orders.created), op, ms - w),
            (_, None) => unreachable!("a window deadline is read before it is compared"),
        }
    }

    /// ` AND <id> IN (…)` for `ids` (those that cannot be ids match nothing).
    fn id_in(&self, s: &mut Stmt, ids: &[&str]) {
        s.push(" AND ")
            .push(&self.col(&self.profile.orders.id))
            .push(" IN ");
        s.bind_list(ids.iter().filter_map(|id| self.id_bind(id)));
    }

    /// The SELECT list of an order: `id, user_id, merchant_id, status, created, deadline, total,
    /// coupon_id, payment_ref, points`.
    fn order_columns(&self) -> String {
        let o = &self.profile.orders;
        let opt_text = |c: &Option<String>| match c {
            Some(c) => self.text(&self.col(c)),
            None => "NULL".to_string(),
        };
        let merchant = match &o.merchant {
            MerchantSpec::Column(c) => self.text(&self.col(c)),
            MerchantSpec::Fixed(_) => "NULL".to_string(),
        };
        let deadline = match &self.deadline {
            Deadline::Column(c) => self.time_read(&self.col(c)),
            Deadline::Window(_) | Deadline::Settings(_) => "NULL".to_string(),
        };
        let points = match &o.points {
            Some(c) => self.int(&self.col(c)),
            None => "NULL".to_string(),
        };
        format!(
            "{} AS id, {} AS user_id, {merchant} AS merchant_id, {} AS status, {} AS created, \
             {deadline} AS deadline, {} AS total, {} AS coupon_id, {} AS payment_ref, \
             {points} AS points",
            self.id_text(),
            self.text(&self.col(&o.user)),
            self.text(&self.col(&o.status)),
            self.time_read(&self.col(&o.created)),
            self.money_read(&self.col(&o.total)),
            opt_text(&o.coupon),
            opt_text(&o.payment_ref),
        )
    }

    /// The status a stored value reads as: pending, paid, or (anything else) closed.
    fn status_of(&self, text: &str) -> OrderStatus {
        let o = &self.profile.orders;
        if o.pending.iter().any(|v| v.as_text() == text) {
            OrderStatus::Pending
        } else if o.paid.iter().any(|v| v.as_text() == text) {
            OrderStatus::Paid
        } else {
            OrderStatus::Closed
        }
    }

    /// An order of a row of [`Mapped::order_columns`], without its lines.
    fn order_of(&self, row: &sqlx::any::AnyRow, window: Option<i64>) -> Result<Order, DbError> {
        let id: String = row.try_get("id")?;
        let created = self
            .read_time(row, "created")?
            .ok_or_else(|| DbError::BadRow {
                table: "orders (schema profile)",
                detail: format!("order `{id}` has no {}", self.profile.orders.created),
            })?;
        let deadline = match window {
            Some(w) => created + w,
            None => self
                .read_time(row, "deadline")?
                .ok_or_else(|| DbError::BadRow {
                    table: "orders (schema profile)",
                    detail: format!("order `{id}` has no deadline"),
                })?,
        };
        let status: Option<String> = row.try_get("status")?;
        let merchant = match &self.profile.orders.merchant {
            MerchantSpec::Fixed(m) => m.clone(),
            MerchantSpec::Column(_) => row
                .try_get::<Option<String>, _>("merchant_id")?
                .unwrap_or_default(),
        };
        Ok(Order {
            status: self.status_of(status.as_deref().unwrap_or_default()),
            merchant,
            user: row
                .try_get::<Option<String>, _>("user_id")?
                .unwrap_or_default(),
            created_at_ms: created,
            deadline_ms: deadline,
            total_cents: self.read_money(row, "total")?,
            items: Vec::new(),
            coupon: row.try_get("coupon_id")?,
            flash_activity: None,
            payment_ref: row.try_get("payment_ref")?,
            id,
        })
    }

    /// The orders among `ids` with their lines (by id); ids that are no order (or a
    /// soft-deleted one) are left out.
    ///
    /// # Errors
    /// [`DbError::Sql`] on query failure; [`DbError::BadRow`] for a row the profile cannot read
    /// (a time that is not one, an amount with fractions of a cent, a line of no units).
    pub async fn load_many(
        &self,
        conn: &mut AnyConnection,
        ids: &[&str],
    ) -> Result<HashMap<String, Order>, DbError> {
        let mut found = HashMap::new();
        if ids.iter().all(|id| self.id_bind(id).is_none()) {
            return Ok(found);
        }
        let window = self.window_ms(conn).await?;
        let mut s = self.stmt(format!(
            "SELECT {} FROM {} a WHERE 1 = 1",
            self.order_columns(),
            self.orders
        ));
        self.id_in(&mut s, ids);
        self.live(&mut s);
        for row in s.query().fetch_all(&mut *conn).await? {
            let order = self.order_of(&row, window)?;
            found.insert(order.id.clone(), order);
        }
        if found.is_empty() {
            return Ok(found);
        }
        let i = &self.profile.items;
        let order_col = self.col(&i.order);
        let mut s = self.stmt(format!(
            "SELECT {} AS order_id, {} AS sku, {} AS quantity, {} AS price FROM {} a WHERE {order_col} IN ",
            self.text(&order_col),
            self.text(&self.col(&i.sku)),
            self.int(&self.col(&i.quantity)),
            self.money_read(&self.col(&i.unit_price)),
            self.items,
        ));
        s.bind_list(found.keys().filter_map(|id| self.id_bind(id)));
        s.push(&format!(" ORDER BY {order_col}, {}", self.col(&i.line)));
        for r in s.query().fetch_all(&mut *conn).await? {
            let order_id: String = r.try_get("order_id")?;
            let quantity: Option<i64> = r.try_get("quantity")?;
            let Some(order) = found.get_mut(&order_id) else {
                continue;
            };
            let quantity = quantity
                .and_then(|q| u32::try_from(q).ok())
                .filter(|q| *q > 0)
                .ok_or_else(|| DbError::BadRow {
                    table: "items (schema profile)",
                    detail: format!("order `{order_id}` has a line with quantity {quantity:?}"),
                })?;
            order.items.push(OrderItem {
                sku: r.try_get::<Option<String>, _>("sku")?.unwrap_or_default(),
                quantity,
                unit_price_cents: self.read_money(&r, "price")?,
            });
        }
        Ok(found)
    }

    /// The pending orders among `ids` (due by `deadline_by` when given, and then not held by a
    /// payment attempt's lease at that time), locked `FOR UPDATE` in id order: exactly those the
    /// close then moves. A held order's row stays locked too, so its lease cannot change before
    /// the caller commits ([`Mapped::locked_leases`]).
    ///
    /// # Errors
    /// [`DbError::Sql`] on query failure.
    pub async fn lock_pending(
        &self,
        conn: &mut AnyConnection,
        ids: &[&str],
        deadline_by: Option<i64>,
    ) -> Result<Vec<String>, DbError> {
        let mut s = self.stmt(format!(
            "SELECT {} FROM {} a WHERE 1 = 1",
            self.id_text(),
            self.orders
        ));
        self.id_in(&mut s, ids);
        self.pending(&mut s);
        if let Some(by) = deadline_by {
            let window = self.window_ms(conn).await?;
            self.due(&mut s, by, window);
        }
        s.push(&format!(
            " ORDER BY {} FOR UPDATE",
            self.col(&self.profile.orders.id)
        ));
        let rows = s.query().fetch_all(&mut *conn).await?;
        let mut locked: Vec<String> = rows
            .iter()
            .map(|r| r.try_get::<String, _>(0))
            .collect::<Result<_, _>>()?;
        if let Some(by) = deadline_by {
            let ids: Vec<&str> = locked.iter().map(String::as_str).collect();
            let held = self.locked_leases(conn, &ids, by).await?;
            locked.retain(|id| !held.contains_key(id));
        }
        Ok(locked)
    }

    /// The compare-and-set of a group: `status` pending → closed (and the `modified` stamp)
    /// where still pending, live and due at `now_ms`. Returns the rows matched.
    ///
    /// # Errors
    /// [`DbError::Sql`] on query failure.
    pub async fn close_many(
        &self,
        conn: &mut AnyConnection,
        ids: &[&str],
        now_ms: i64,
    ) -> Result<u64, DbError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let window = self.window_ms(conn).await?;
        let o = &self.profile.orders;
        let mut s = self.stmt(format!(
            "UPDATE {} a SET {} = ",
            self.orders,
            self.quote(&o.status)
        ));
        s.bind(&o.closed);
        if let Some(m) = &o.modified {
            s.push(&format!(", {} = ", self.quote(m)));
            self.bind_time(&mut s, now_ms);
        }
        s.push(" WHERE 1 = 1");
        self.id_in(&mut s, ids);
        self.pending(&mut s);
        self.due(&mut s, now_ms, window);
        Ok(s.query().execute(&mut *conn).await?.rows_affected())
    }

    /// Gives `units` of `sku` back as `[stock]` says: `column - units` never below zero
    /// (`unlock`), or `column + units` (`add`). Returns false when no row changed (no such SKU,
    /// or the lock holds fewer units).
    ///
    /// # Errors
    /// [`DbError::Sql`] on query failure.
    pub async fn restore_units(
        &self,
        conn: &mut AnyConnection,
        sku: &str,
        units: i64,
    ) -> Result<bool, DbError> {
        let st = &self.profile.stock;
        let sku_type = &self.key_types(conn).await?.sku;
        let (set, c) = (self.quote(&st.column), self.col(&st.column));
        let sign = match st.release {
            StockRelease::Unlock => "-",
            StockRelease::Add => "+",
        };
        let mut s = self.stmt(format!(
            "UPDATE {} a SET {set} = COALESCE({c}, 0) {sign} ",
            self.stock
        ));
        s.bind(units)
            .push(&format!(" WHERE {} = ", self.col(&st.sku)));
        s.bind_as(sku, sku_type);
        if st.release == StockRelease::Unlock {
            s.push(&format!(" AND COALESCE({c}, 0) >= ")).bind(units);
        }
        Ok(s.query().execute(&mut *conn).await?.rows_affected() >= 1)
    }

    /// Frees each `(coupon, order, holder)`: the holder's first row of the coupon still
    /// `locked` becomes `available` (an order's own row: two orders of one holder with the
    /// same coupon free two rows). Returns the coupons freed; one with no such row left is left
    /// alone. Two statements for the whole group: the candidate rows locked in id order, then
    /// one update by id.
    ///
    /// # Errors
    /// [`DbError::Sql`] on query failure.
    pub async fn release_coupons(
        &self,
        conn: &mut AnyConnection,
        releases: &[(&str, &str, &str)],
    ) -> Result<HashSet<String>, DbError> {
        let mut freed = HashSet::new();
        let (Some(c), Some(table)) = (&self.profile.coupon, &self.coupon) else {
            return Ok(freed);
        };
        if releases.is_empty() {
            return Ok(freed);
        }
        let distinct = |values: Vec<&str>| {
            let mut v = values;
            v.sort_unstable();
            v.dedup();
            v.into_iter().map(Bind::from).collect::<Vec<_>>()
        };
        let types = self.key_types(conn).await?;
        let mut s = self.stmt(format!(
            "SELECT {} AS row_id, {} AS coupon, {} AS holder FROM {table} a WHERE {} IN ",
            self.int(&self.col(&c.row)),
            self.text(&self.col(&c.coupon)),
            self.text(&self.col(&c.holder)),
            self.col(&c.holder),
        ));
        s.bind_list_as(
            distinct(releases.iter().map(|r| r.2).collect()),
            &types.holder,
        );
        s.push(&format!(" AND {} IN ", self.col(&c.coupon)));
        s.bind_list_as(
            distinct(releases.iter().map(|r| r.0).collect()),
            &types.coupon,
        );
        s.push(&format!(" AND {} = ", self.col(&c.status)))
            .bind(&c.locked)
            .push(&format!(" ORDER BY {} FOR UPDATE", self.col(&c.row)));
        // Each (coupon, holder)'s rows in id order: the first goes to the first order asking.
        let mut rows: HashMap<(String, String), Vec<i64>> = HashMap::new();
        for r in s.query().fetch_all(&mut *conn).await? {
            let key = (
                r.try_get::<Option<String>, _>("coupon")?
                    .unwrap_or_default(),
                r.try_get::<Option<String>, _>("holder")?
                    .unwrap_or_default(),
            );
            rows.entry(key).or_default().push(r.try_get("row_id")?);
        }
        let mut ids = Vec::new();
        for (coupon, _order, holder) in releases {
            if let Some(free) = rows.get_mut(&(coupon.to_string(), holder.to_string()))
                && !free.is_empty()
            {
                ids.push(free.remove(0));
                freed.insert(coupon.to_string());
            }
        }
        if ids.is_empty() {
            return Ok(freed);
        }
        let mut s = self.stmt(format!("UPDATE {table} a SET {} = ", self.quote(&c.status)));
        s.bind(&c.available)
            .push(&format!(" WHERE {} IN ", self.col(&c.row)))
            .bind_list(ids.into_iter().map(Bind::Int));
        s.query().execute(&mut *conn).await?;
        Ok(freed)
    }

    /// Returns the points each of `ids` spent to its buyer (`[points]`), reading the amounts
    /// under this transaction's locks. One [`PointsBack`] per order that spent any. Two
    /// statements for the whole group: the amounts with whether each buyer's row exists, then
    /// one update adding each buyer's sum.
    ///
    /// # Errors
    /// [`DbError::Sql`] on query failure.
    pub async fn return_points(
        &self,
        conn: &mut AnyConnection,
        ids: &[&str],
    ) -> Result<Vec<PointsBack>, DbError> {
        let (Some(spent), Some(p), Some(table)) = (
            &self.profile.orders.points,
            &self.profile.points,
            &self.points,
        ) else {
            return Ok(Vec::new());
        };
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let user = self.col(&self.profile.orders.user);
        let known = self.int(&format!(
            "CASE WHEN EXISTS (SELECT 1 FROM {table} m WHERE m.{} = {user}) THEN 1 ELSE 0 END",
            self.quote(&p.member)
        ));
        let mut s = self.stmt(format!(
            "SELECT {} AS id, {} AS member, {} AS points, {known} AS known \
             FROM {} a WHERE 1 = 1",
            self.id_text(),
            self.text(&user),
            self.int(&self.col(spent)),
            self.orders
        ));
        self.id_in(&mut s, ids);
        let mut back = Vec::new();
        let mut per_member: std::collections::BTreeMap<String, i64> = Default::default();
        for row in s.query().fetch_all(&mut *conn).await? {
            let points: Option<i64> = row.try_get("points")?;
            let Some(points) = points.filter(|p| *p > 0) else {
                continue;
            };
            let member: String = row
                .try_get::<Option<String>, _>("member")?
                .unwrap_or_default();
            let applied = row.try_get::<i64, _>("known")? == 1;
            if applied {
                *per_member.entry(member.clone()).or_default() += points;
            }
            back.push(PointsBack {
                order: row.try_get("id")?,
                member,
                points,
                applied,
            });
        }
        if per_member.is_empty() {
            return Ok(back);
        }
        // One statement for the group: each buyer's sum, by a CASE over the buyers (in key
        // order, so two groups lock buyer rows in the same order).
        let member_type = &self.key_types(conn).await?.member;
        let (set, c) = (self.quote(&p.column), self.col(&p.column));
        let key = self.col(&p.member);
        let mut s = self.stmt(format!(
            "UPDATE {table} a SET {set} = COALESCE({c}, 0) + CASE {key}"
        ));
        for (member, points) in &per_member {
            s.push(" WHEN ");
            s.bind_as(member.as_str(), member_type);
            s.push(" THEN ").bind(*points);
        }
        s.push(&format!(" ELSE 0 END WHERE {key} IN "));
        s.bind_list_as(
            per_member.keys().map(|m| Bind::from(m.as_str())),
            member_type,
        );
        s.query().execute(&mut *conn).await?;
        Ok(back)
    }

    /// Pending, live orders due by `now - grace` with no live trigger in timeoutd's outbox
    /// and no open dead letter but those whose source is in `not_about_the_order` (the sweep's
    /// rule, `db::outbox::find_orphans`, on the shop's table), oldest first. A row the order
    /// service wrote due late counts as live here: shops on a profile write no outbox rows of
    /// their own. `sources` are the outbox row sources that count as live whatever their due
    /// time (the sweep's and an operator's).
    ///
    /// # Errors
    /// [`DbError::Sql`] on query failure.
    pub async fn find_orphans(
        &self,
        db: &Db,
        now_ms: i64,
        grace_ms: i64,
        batch: u32,
        sources: [&str; 2],
        not_about_the_order: &[&str],
    ) -> Result<Vec<Due>, DbError> {
        let mut conn = db.pool().acquire().await?;
        let window = self.window_ms(&mut conn).await?;
        let cutoff = now_ms - grace_ms;
        let id = self.id_text();
        let mut s = self.stmt(format!(
            "SELECT {id} AS id, {} AS phase, {} AS created, {} AS deadline FROM {} a WHERE 1 = 1",
            self.int(&format!(
                "(SELECT MAX(m.phase) FROM order_timeout_msg m WHERE m.order_id = {id})"
            )),
            self.time_read(&self.col(&self.profile.orders.created)),
            match &self.deadline {
                Deadline::Column(c) => self.time_read(&self.col(c)),
                _ => "NULL".into(),
            },
            self.orders
        ));
        self.pending(&mut s);
        self.due(&mut s, cutoff, window);
        s.push(&format!(
            " AND NOT EXISTS (SELECT 1 FROM order_timeout_msg m WHERE m.order_id = {id} \
             AND m.status IN ('PENDING', 'SENT') AND (m.due_ms > "
        ));
        s.bind(cutoff)
            .push(" OR m.claim_until_ms >= ")
            .bind(now_ms)
            .push(" OR m.source IN (")
            .bind(sources[0])
            .push(", ")
            .bind(sources[1])
            .push(")))");
        s.push(&format!(
            " AND NOT EXISTS (SELECT 1 FROM dead_letter d WHERE d.order_id = {id} \
             AND d.status = 'OPEN' AND d.source NOT IN "
        ));
        s.bind_list(not_about_the_order.iter().map(|source| Bind::from(*source)));
        s.push(")");
        let order_by = self.col(self.due_column());
        s.push(&format!(" ORDER BY {order_by} LIMIT "))
            .bind(i64::from(batch));
        let rows = s.query().fetch_all(&mut *conn).await?;
        rows.iter()
            .map(|r| {
                let created = self.read_time(r, "created")?.unwrap_or_default();
                let deadline_ms = match window {
                    Some(w) => created + w,
                    None => self.read_time(r, "deadline")?.unwrap_or_default(),
                };
                Ok(Due {
                    order_id: r.try_get("id")?,
                    phase: r.try_get::<Option<i64>, _>("phase")?,
                    deadline_ms,
                })
            })
            .collect()
    }

    /// Pending, live orders due by `before_ms`, counted per merchant.
    ///
    /// # Errors
    /// [`DbError::Sql`] on query failure.
    pub async fn overdue_by_merchant(
        &self,
        db: &Db,
        before_ms: i64,
    ) -> Result<Vec<(String, i64)>, DbError> {
        let mut conn = db.pool().acquire().await?;
        let window = self.window_ms(&mut conn).await?;
        let merchant = match &self.profile.orders.merchant {
            MerchantSpec::Column(c) => self.text(&self.col(c)),
            MerchantSpec::Fixed(_) => "''".to_string(),
        };
        let mut s = self.stmt(format!(
            "SELECT {merchant} AS merchant, COUNT(*) AS n FROM {} a WHERE 1 = 1",
            self.orders
        ));
        self.pending(&mut s);
        self.due(&mut s, before_ms, window);
        s.push(" GROUP BY 1 ORDER BY 1");
        let rows = s.query().fetch_all(&mut *conn).await?;
        rows.iter()
            .map(|r| {
                let merchant = match &self.profile.orders.merchant {
                    MerchantSpec::Fixed(m) => m.clone(),
                    MerchantSpec::Column(_) => {
                        r.try_get::<Option<String>, _>(0)?.unwrap_or_default()
                    }
                };
                Ok((merchant, r.try_get::<i64, _>(1)?))
            })
            .collect()
    }

    /// Pending, live orders due by `now - margin`, most overdue first, at most `limit` (without
    /// their lines), each with the reason of its open dead letter, if any.
    ///
    /// # Errors
    /// [`DbError::Sql`] on query failure.
    pub async fn overdue_orders(
        &self,
        db: &Db,
        now_ms: i64,
        margin_ms: i64,
        limit: i64,
    ) -> Result<Vec<(Order, Option<String>)>, DbError> {
        let mut conn = db.pool().acquire().await?;
        let window = self.window_ms(&mut conn).await?;
        let id = self.id_text();
        let mut s = self.stmt(format!(
            "SELECT {}, (SELECT MAX(d.reason) FROM dead_letter d WHERE d.order_id = {id} \
             AND d.status = 'OPEN') AS dead_letter FROM {} a WHERE 1 = 1",
            self.order_columns(),
            self.orders
        ));
        self.pending(&mut s);
        self.due(&mut s, now_ms - margin_ms, window);
        let order_by = self.col(self.due_column());
        s.push(&format!(" ORDER BY {order_by} LIMIT ")).bind(limit);
        let rows = s.query().fetch_all(&mut *conn).await?;
        rows.iter()
            .map(|r| Ok((self.order_of(r, window)?, r.try_get("dead_letter")?)))
            .collect()
    }

    /// Pending, live orders in the id order of the shop's table (numeric for a `BIGINT` id)
    /// after `find.after` (its first page without), narrowed by `find`, at most `find.limit`
    /// (without their lines): the bulk order operations' page (`crate::bulk::orders`). A
    /// merchant filter on a profile with one fixed merchant matches all or nothing; ids and a
    /// cursor that cannot be ids of this table match nothing.
    ///
    /// # Errors
    /// [`DbError::Sql`] on query failure; [`DbError::BadRow`] for a row the profile cannot read.
    pub async fn open_orders_after(
        &self,
        db: &Db,
        find: &super::OpenOrderQuery<'_>,
    ) -> Result<Vec<Order>, DbError> {
        let mut conn = db.pool().acquire().await?;
        let window = self.window_ms(&mut conn).await?;
        let id_col = self.col(&self.profile.orders.id);
        let mut s = self.stmt(format!(
            "SELECT {} FROM {} a WHERE 1 = 1",
            self.order_columns(),
            self.orders
        ));
        self.pending(&mut s);
        if let Some(after) = find.after {
            match self.id_bind(after) {
                Some(b) => s.push(&format!(" AND {id_col} > ")).bind(b),
                None => return Ok(Vec::new()),
            };
        }
        if let Some(merchant) = find.merchant {
            match &self.profile.orders.merchant {
                MerchantSpec::Column(c) => s
                    .push(&format!(" AND {} = ", self.col(c)))
                    .bind(Bind::Text(merchant.to_string())),
                MerchantSpec::Fixed(m) if m == merchant => &mut s,
                MerchantSpec::Fixed(_) => return Ok(Vec::new()),
            };
        }
        if let Some(ids) = find.ids {
            self.id_in(&mut s, ids);
        }
        if let Some(from) = find.deadline_from_ms {
            self.due_cmp(&mut s, ">=", from, window);
        }
        if let Some(to) = find.deadline_to_ms {
            self.due_cmp(&mut s, "<", to, window);
        }
        s.push(&format!(" ORDER BY {id_col} LIMIT "))
            .bind(find.limit);
        let rows = s.query().fetch_all(&mut *conn).await?;
        rows.iter().map(|r| self.order_of(r, window)).collect()
    }

    /// `EXISTS (…)`: the order whose id (as text) is `outer` is pending and live (what the
    /// sweep's re-arm and retention ask of an order). On PostgreSQL a `BIGINT` id is compared
    /// with `outer` read as a number, so the id's index is used; text that is no 64-bit number
    /// (checked before the cast, which would otherwise fail the statement) matches nothing.
    pub fn pending_exists(&self, outer: &str) -> Stmt {
        let key = match (self.backend, self.profile.orders.id_type) {
            (Backend::Postgres, IdType::Bigint) => format!(
                "CASE WHEN {outer} ~ '^-?[0-9]{{1,19}}$' AND CAST({outer} AS NUMERIC) \
                 BETWEEN {min} AND {max} THEN CAST({outer} AS BIGINT) END",
                min = i64::MIN,
                max = i64::MAX
            ),
            _ => outer.to_string(),
        };
        let mut s = self.stmt(format!(
            "EXISTS (SELECT 1 FROM {} a WHERE {} = {key}",
            self.orders,
            self.col(&self.profile.orders.id)
        ));
        self.pending(&mut s);
        s.push(")");
        s
    }
}

/// A pending order the sweep found due with no live trigger ([`Mapped::find_orphans`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// Order id, as text.
    pub order_id: String,
    /// Latest phase in timeoutd's outbox for it, if it has a row.
    pub phase: Option<i64>,
    /// Its deadline, epoch ms.
    pub deadline_ms: i64,
}

/// Points an order spent, given back to its buyer by a close.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PointsBack {
    /// The order.
    pub order: String,
    /// The buyer (`points.member`).
    pub member: String,
    /// Points.
    pub points: i64,
    /// Whether the buyer's row was there to take them.
    pub applied: bool,
}
