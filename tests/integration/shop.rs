//! A shop's own order tables through a schema profile: macrozheng/mall's, on MariaDB, created
//! as mall creates them (`tests/data/mall/schema.sql`) and written as mall's `generateOrder`
//! writes them; the core of it again on PostgreSQL, the same tables with PostgreSQL's types
//! (`tests/data/mall/schema.postgres.sql`) in a schema of their own. Each close must leave exactly what mall's own `cancelOrder` leaves — status 4,
//! each line's `lock_stock` released, the coupon history row unused again, the points back —
//! once, under a duplicate trigger, a payment racing the close, and two daemons.

use std::sync::Arc;

use sqlx::Row;
use timeoutd::clock::Clock;
use timeoutd::config::Config;
use timeoutd::db::shop::Profile;
use timeoutd::db::shop::convert::{Stored, TimeForm};
use timeoutd::db::{Backend, Db};
use timeoutd::dispatch::{Outcome, Trigger};
use timeoutd::sources::sweep;
use timeoutd_runtime::model::TriggerKind;

use crate::support::{Env, repo_root};

/// mall's payment window (`oms_order_setting.normal_order_overtime` of the fixture), ms.
pub(crate) const WINDOW_MS: i64 = 15 * 60_000;

/// A mall database beside a test's timeoutd database, on the same server.
pub struct Mall {
    /// timeoutd's own database.
    pub env: Env,
    /// The mall database's name.
    pub name: String,
    /// A pool on the mall database (the shop's own order service).
    pub shop: Db,
    /// How mall writes times (Asia/Shanghai wall time).
    time: TimeForm,
}

/// One line of a mall order: SKU id, units, unit price in yuan.
pub type Line = (i64, i64, &'static str);

/// One order as mall's `generateOrder` leaves it.
pub struct Placed<'a> {
    /// `oms_order.id`.
    pub id: i64,
    /// `member_id`.
    pub member: i64,
    /// `coupon_id`, if one was used.
    pub coupon: Option<i64>,
    /// `use_integration`.
    pub points: Option<i64>,
    /// The lines.
    pub lines: &'a [Line],
    /// `create_time`, epoch ms (written as Shanghai wall time).
    pub created_ms: i64,
    /// `status` (0 pending).
    pub status: i64,
    /// `delete_status` (0 live).
    pub deleted: i64,
}

/// A fresh mall database (mall's tables, its order setting of 15 minutes) on `env`'s server:
/// its name and a pool on it. On PostgreSQL a schema of `env`'s database, the pool's
/// `search_path` set to it.
pub async fn shop_database(env: &Env) -> (String, Db) {
    let name = format!("mall_t_{:016x}", fastrand::u64(..));
    let (create, url) = match env.db.backend() {
        Backend::Postgres => (
            format!("CREATE SCHEMA {name}"),
            format!("{}?options=-c%20search_path%3D{name}", env.url),
        ),
        _ => (
            format!("CREATE DATABASE {name} CHARACTER SET utf8"),
            format!("{}/{name}", env.url.rsplit_once('/').unwrap().0),
        ),
    };
    env.db
        .backend()
        .query_owned(create)
        .execute(env.db.pool())
        .await
        .unwrap();
    let shop = Db::connect(&url, 8).await.unwrap();
    apply_schema(&shop).await;
    (name, shop)
}

/// Drops a database (or PostgreSQL schema) of [`shop_database`].
pub async fn drop_shop_database(env: &Env, name: &str, shop: Db) {
    shop.close().await;
    let drop = match env.db.backend() {
        Backend::Postgres => format!("DROP SCHEMA {name} CASCADE"),
        _ => format!("DROP DATABASE {name}"),
    };
    env.db
        .backend()
        .query_owned(drop)
        .execute(env.db.pool())
        .await
        .unwrap();
}

impl Mall {
    /// A fresh timeoutd database on MariaDB and a fresh mall database beside it
    /// ([`shop_database`]).
    pub async fn new() -> Mall {
        Self::on(Backend::MySql).await
    }

    /// As [`Mall::new`], on `backend` (MariaDB or PostgreSQL).
    pub async fn on(backend: Backend) -> Mall {
        let env = Env::new(backend).await;
        let (name, shop) = shop_database(&env).await;
        let profile = Profile::load(&profile_path()).unwrap();
        Mall {
            env,
            name,
            shop,
            time: profile.time_form().unwrap(),
        }
    }

    /// A config over the test database closing mall's orders (`[database.shop]` with the
    /// shipped profile), merchant `mall` on the single-phase policy, with `extra` TOML.
    pub fn config(&self, extra: &str) -> Config {
        self.config_with(&profile_path(), extra)
    }

    /// As [`Mall::config`], through the profile file at `profile`.
    pub fn config_with(&self, profile: &std::path::Path, extra: &str) -> Config {
        let shop = format!(
            "[database.shop]\nprofile = \"{}\"\ndatabase = \"{}\"\n{extra}",
            profile.display(),
            self.name
        );
        self.env.config(
            &[(
                "mall",
                "builtin:single-phase",
                &[("channel", "log"), ("closed_template", "order-closed")],
            )],
            &shop,
        )
    }

    /// The timeoutd pool with the profile's schema (what a daemon's parts use).
    pub fn mapped(&self, config: &Config) -> Db {
        self.env.db.clone().with_schema(config.schema().unwrap())
    }

    /// `ms` as mall writes a time.
    pub fn local(&self, ms: i64) -> String {
        match self.time.store(ms) {
            Stored::Text(t) => t,
            Stored::Int(_) => unreachable!("mall writes DATETIMEs"),
        }
    }

    /// `sql` (written for MariaDB) in the mall database's dialect, its `?` markers numbered on
    /// PostgreSQL: the fixture's few casts renamed (`SIGNED` → `BIGINT`, `CHAR` → `TEXT`,
    /// `DATETIME` → `TIMESTAMP`).
    pub fn query<'q>(
        &self,
        sql: &str,
    ) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
        let sql = match self.shop.backend() {
            Backend::Postgres => sql
                .replace(" AS SIGNED)", " AS BIGINT)")
                .replace(" AS CHAR)", " AS TEXT)")
                .replace(" AS DATETIME)", " AS TIMESTAMP)"),
            _ => sql.to_string(),
        };
        self.shop.backend().query_owned(sql)
    }

    /// SKUs `ids`, each with `stock` units and nothing locked.
    pub async fn stock_up(&self, ids: &[i64], stock: i64) {
        for id in ids {
            self.query(
                "INSERT INTO pms_sku_stock (id, product_id, sku_code, price, stock, lock_stock) \
                 VALUES (?, 1, ?, 10.00, ?, 0)",
            )
            .bind(*id)
            .bind(format!("sku-{id}"))
            .bind(stock)
            .execute(self.shop.pool())
            .await
            .unwrap();
        }
    }

    /// Member `id` with `points`, and `coupons` unused coupon history rows (coupon ids).
    pub async fn member(&self, id: i64, points: i64, coupons: &[i64]) {
        self.query("INSERT INTO ums_member (id, username, phone, integration) VALUES (?, ?, ?, ?)")
            .bind(id)
            .bind(format!("m{id}"))
            .bind(format!("p{id}"))
            .bind(points)
            .execute(self.shop.pool())
            .await
            .unwrap();
        for coupon in coupons {
            self.exec(
                "INSERT INTO sms_coupon_history (coupon_id, member_id, get_type, use_status) VALUES (?, ?, 1, 0)",
                &[*coupon, id],
            )
            .await;
        }
    }

    /// Places `o` as mall's `generateOrder` does, in one transaction: the order and its lines,
    /// each line's `lock_stock` raised, the member's first unused row of the coupon marked used
    /// (1), the points spent taken off the member.
    /// Like mall's own, the transaction locks its lines' stock rows in the cart's order, so it can
    /// deadlock with a close of other orders (which locks them in SKU order); the order service
    /// then places it again, as a buyer retrying would.
    pub async fn place(&self, o: &Placed<'_>) {
        for attempt in 1.. {
            match self.try_place(o).await {
                Ok(()) => return,
                Err(sqlx::Error::Database(e))
                    if matches!(e.code().as_deref(), Some("40001" | "40P01")) && attempt < 20 => {}
                Err(e) => panic!("placing order {}: {e}", o.id),
            }
        }
    }

    async fn try_place(&self, o: &Placed<'_>) -> Result<(), sqlx::Error> {
        let mut tx = self.shop.pool().begin().await?;
        let total: f64 = o
            .lines
            .iter()
            .map(|(_, q, p)| *q as f64 * p.parse::<f64>().unwrap())
            .sum();
        self.query(
            "INSERT INTO oms_order (id, member_id, coupon_id, order_sn, create_time, member_username, \
             total_amount, pay_amount, freight_amount, pay_type, source_type, status, order_type, \
             receiver_name, receiver_phone, note, confirm_status, delete_status, use_integration) \
             VALUES (?, ?, ?, ?, CAST(? AS DATETIME), 'buyer', CAST(? AS DECIMAL(10,2)), \
             CAST(? AS DECIMAL(10,2)), 0, 0, 1, ?, 0, '张三', '18000000000', '请尽快发货', 0, ?, ?)",
        )
        .bind(o.id)
        .bind(o.member)
        .bind(o.coupon)
        .bind(format!("2026120601{:06}", o.id))
        .bind(self.local(o.created_ms))
        .bind(format!("{total:.2}"))
        .bind(format!("{total:.2}"))
        .bind(o.status)
        .bind(o.deleted)
        .bind(o.points)
        .execute(&mut *tx)
        .await?;
        for (sku, quantity, price) in o.lines {
            self.query(
                "INSERT INTO oms_order_item (order_id, product_id, product_price, product_quantity, \
                 product_sku_id, product_name) VALUES (?, 1, CAST(? AS DECIMAL(10,2)), ?, ?, '茶')",
            )
            .bind(o.id)
            .bind(price.to_string())
            .bind(quantity)
            .bind(sku)
            .execute(&mut *tx)
            .await?;
            self.query("UPDATE pms_sku_stock SET lock_stock = lock_stock + ? WHERE id = ?")
                .bind(quantity)
                .bind(sku)
                .execute(&mut *tx)
                .await?;
        }
        if let Some(coupon) = o.coupon {
            self.query(
                "UPDATE sms_coupon_history SET use_status = 1, use_time = NOW() WHERE id = \
                 (SELECT id FROM (SELECT MIN(id) AS id FROM sms_coupon_history \
                  WHERE member_id = ? AND coupon_id = ? AND use_status = 0) AS first_unused)",
            )
            .bind(o.member)
            .bind(coupon)
            .execute(&mut *tx)
            .await?;
        }
        if let Some(points) = o.points {
            self.query("UPDATE ums_member SET integration = integration - ? WHERE id = ?")
                .bind(points)
                .bind(o.member)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await
    }

    /// `n` orders due two minutes ago, ids from `first_id`, each by a member of its own (ids from
    /// `first_member`, 50 points, one unused row of `coupon`) spending `points`, with one
    /// `line`. Returns the database clock they were placed by.
    pub async fn place_due(
        &self,
        n: i64,
        (first_id, first_member): (i64, i64),
        coupon: i64,
        points: i64,
        line: Line,
    ) -> i64 {
        let now = self.env.db.now_ms().await.unwrap();
        for k in 0..n {
            self.member(first_member + k, 50, &[coupon]).await;
            self.place(&Placed {
                id: first_id + k,
                member: first_member + k,
                coupon: Some(coupon),
                points: Some(points),
                lines: &[line],
                created_ms: now - WINDOW_MS - 120_000,
                status: 0,
                deleted: 0,
            })
            .await;
        }
        now
    }

    /// A dispatcher on this mall's config at `now`, after a sweep that re-armed all `n` due
    /// orders (mall writes no outbox rows).
    pub async fn swept(&self, now: i64, n: i64) -> Arc<timeoutd::dispatch::Dispatcher> {
        let config = self.config("");
        let db = self.mapped(&config);
        let (clock, _) = Clock::manual(now);
        let swept = sweep::sweep_once(&db, &clock, &config.sweep).await.unwrap();
        assert_eq!(swept.rearmed, n as usize);
        self.env.dispatcher(&config, clock).await
    }

    /// Runs `sql` ([`Mall::query`]) on the mall database with `values` bound.
    pub async fn exec(&self, sql: &'static str, values: &[i64]) {
        let mut q = self.query(sql);
        for v in values {
            q = q.bind(*v);
        }
        q.execute(self.shop.pool()).await.unwrap();
    }

    /// One text of the mall database ([`Mall::query`], `?` bound to `id`).
    pub async fn text(&self, sql: &'static str, id: i64) -> String {
        self.query(sql)
            .bind(id)
            .fetch_one(self.shop.pool())
            .await
            .unwrap()
            .try_get::<Option<String>, _>(0)
            .unwrap()
            .unwrap_or_default()
    }

    /// One integer of the mall database ([`Mall::query`], `?` bound to `id`).
    pub async fn int(&self, sql: &'static str, id: i64) -> i64 {
        self.query(sql)
            .bind(id)
            .fetch_one(self.shop.pool())
            .await
            .unwrap()
            .try_get::<Option<i64>, _>(0)
            .unwrap()
            .unwrap_or(0)
    }

    /// `oms_order.status` of `id`.
    pub async fn status(&self, id: i64) -> i64 {
        self.int(
            "SELECT CAST(status AS SIGNED) FROM oms_order WHERE id = ?",
            id,
        )
        .await
    }

    /// `pms_sku_stock.lock_stock` of `sku`.
    pub async fn locked(&self, sku: i64) -> i64 {
        self.int(
            "SELECT CAST(lock_stock AS SIGNED) FROM pms_sku_stock WHERE id = ?",
            sku,
        )
        .await
    }

    /// `ums_member.integration` of `member`.
    pub async fn points(&self, member: i64) -> i64 {
        self.int(
            "SELECT CAST(integration AS SIGNED) FROM ums_member WHERE id = ?",
            member,
        )
        .await
    }

    /// Drops both databases.
    pub async fn cleanup(self) {
        drop_shop_database(&self.env, &self.name, self.shop).await;
        self.env.cleanup().await;
    }
}

/// The shipped mall profile.
pub fn profile_path() -> std::path::PathBuf {
    repo_root().join("config/profiles/mall.toml")
}

/// Creates mall's tables (the fixture DDL for `shop`'s backend) on `shop`.
pub async fn apply_schema(shop: &Db) {
    let file = match shop.backend() {
        Backend::Postgres => "tests/data/mall/schema.postgres.sql",
        _ => "tests/data/mall/schema.sql",
    };
    let ddl = std::fs::read_to_string(repo_root().join(file)).unwrap();
    let body: String = ddl
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    for statement in body.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        sqlx::query(sqlx::AssertSqlSafe(statement.to_string()))
            .execute(shop.pool())
            .await
            .unwrap_or_else(|e| panic!("{e}: {statement}"));
    }
}

/// Claims every outbox row due at `now_ms` and handles it with `d`.
/// Claims and handles every outbox row due at `now_ms`, one by one.
pub async fn process(env: &Env, d: &timeoutd::dispatch::Dispatcher, now_ms: i64) -> Vec<Outcome> {
    env.process(d, now_ms).await
}

/// A trigger of `kind` for order `id`, as a duplicate message would carry it.
fn trigger(id: i64, kind: TriggerKind) -> Trigger {
    crate::support::trigger(&id.to_string(), kind)
}

/// mall's `cancelOrder`, done by timeoutd: a due order (two lines of one SKU and one of another,
/// a coupon, 40 points) is found by the sweep (mall writes no outbox rows) and closed once;
/// an order not yet due, a paid one and a soft-deleted one are left as they are. A duplicate
/// trigger (F9) and a second sweep change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mall_order_closes_once_as_malls_own_cancel_would() {
    closes_once_as_malls_own_cancel_would(Backend::MySql).await;
}

/// The same on PostgreSQL: mall's tables with PostgreSQL's types in a schema of their own
/// (`database.shop.database` names the schema), the statements in PostgreSQL's dialect (keys
/// cast to their columns' types, wall times as `timestamp`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mall_order_closes_once_on_postgresql() {
    closes_once_as_malls_own_cancel_would(Backend::Postgres).await;
}

async fn closes_once_as_malls_own_cancel_would(backend: Backend) {
    let mall = Mall::on(backend).await;
    let now = mall.env.db.now_ms().await.unwrap();
    mall.stock_up(&[101, 102], 100).await;
    mall.member(7, 100, &[3, 3]).await;
    mall.member(8, 100, &[]).await;
    let due = now - WINDOW_MS - 60_000;
    let lines: &[Line] = &[(101, 1, "12.50"), (101, 1, "12.50"), (102, 1, "9.90")];
    let orders = [
        (1001, 7, Some(3), Some(40), lines, due, 0, 0),
        (
            1002,
            8,
            None,
            None,
            &[(101, 1, "12.50")][..],
            now - 5 * 60_000,
            0,
            0,
        ),
        (1003, 8, None, None, &[(102, 1, "9.90")][..], due, 1, 0),
        (1004, 8, None, None, &[(102, 1, "9.90")][..], due, 0, 1),
    ];
    for (id, member, coupon, points, lines, created_ms, status, deleted) in orders {
        mall.place(&Placed {
            id,
            member,
            coupon,
            points,
            lines,
            created_ms,
            status,
            deleted,
        })
        .await;
    }
    assert_eq!((mall.locked(101).await, mall.locked(102).await), (3, 3));
    assert_eq!(mall.points(7).await, 60);

    let config = mall.config("[sweep]\ngrace = \"10s\"\n");
    let db = mall.mapped(&config);
    // The overdue gauge (F3's alert) and the admin's overdue list read mall's table.
    let overdue = timeoutd::db::backlog::read(&db, now, now).await.unwrap();
    assert_eq!(overdue.overdue_open, [("mall".to_string(), 1)]);
    let listed = timeoutd::db::views::overdue_orders(&db, now, 0, 10)
        .await
        .unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|o| (o.id.as_str(), o.user.as_str()))
            .collect::<Vec<_>>(),
        [("1001", "7")]
    );
    assert_eq!(listed[0].deadline_ms, due / 1000 * 1000 + WINDOW_MS);
    let (clock, _) = Clock::manual(now);
    let swept = sweep::sweep_once(&db, &clock, &config.sweep).await.unwrap();
    assert_eq!(swept.rearmed, 1, "only 1001 is pending, live and due");
    let d = mall.env.dispatcher(&config, clock.clone()).await;
    let outcomes = process(&mall.env, &d, now).await;
    assert!(
        matches!(&outcomes[..], [Outcome::Closed { .. }]),
        "{outcomes:?}"
    );

    assert_eq!(mall.status(1001).await, 4);
    let overdue = timeoutd::db::backlog::read(&db, now, now).await.unwrap();
    assert!(
        overdue.overdue_open.is_empty(),
        "{:?}",
        overdue.overdue_open
    );
    assert_eq!(
        (mall.locked(101).await, mall.locked(102).await),
        (1, 2),
        "1001's 2 + 1 units released; 1002's, 1003's and 1004's locks held"
    );
    assert_eq!(mall.points(7).await, 100, "the 40 points are back");
    assert_eq!(
        mall.int(
            "SELECT CAST(SUM(use_status) AS SIGNED) FROM sms_coupon_history WHERE member_id = ?",
            7
        )
        .await,
        0,
        "the coupon history row is unused again"
    );
    assert_eq!(
        mall.text(
            "SELECT CAST(modify_time AS CHAR) FROM oms_order WHERE id = ?",
            1001
        )
        .await,
        mall.local(now),
        "modify_time is the close's, in Shanghai time"
    );
    assert_eq!(
        mall.text("SELECT note FROM oms_order WHERE id = ?", 1001)
            .await,
        "请尽快发货",
        "the buyer's note is not touched"
    );
    for (id, status) in [(1002, 0), (1003, 1), (1004, 0)] {
        assert_eq!(mall.status(id).await, status, "order {id}");
    }
    let ledger: Vec<(String, String)> = sqlx::query(
        "SELECT kind, status FROM effect_ledger WHERE order_id = '1001' ORDER BY effect_index",
    )
    .fetch_all(mall.env.db.pool())
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect();
    let kinds: Vec<&str> = ledger.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "restore-stock",
            "restore-stock",
            "restore-stock",
            "release-coupon",
            "close-payment",
            "notify",
            "return-points"
        ]
    );
    for (kind, status) in &ledger {
        if matches!(
            kind.as_str(),
            "restore-stock" | "release-coupon" | "return-points"
        ) {
            assert_eq!(status, "DONE", "{kind}");
        }
    }

    // F9: the same trigger again, by each path, and the sweep again: nothing moves twice.
    for kind in [
        TriggerKind::DelayMessage,
        TriggerKind::Sweep,
        TriggerKind::Manual,
    ] {
        let outcome = d.handle(&trigger(1001, kind)).await;
        assert!(
            matches!(outcome, Outcome::Ignored | Outcome::NoOp { .. }),
            "{kind:?}: {outcome:?}"
        );
    }
    assert_eq!(
        sweep::sweep_once(&db, &clock, &config.sweep)
            .await
            .unwrap()
            .rearmed,
        0
    );
    assert_eq!((mall.locked(101).await, mall.locked(102).await), (1, 2));
    assert_eq!(mall.points(7).await, 100);
    assert_eq!(
        mall.env
            .int(
                "SELECT COUNT(*) FROM effect_ledger WHERE order_id = ?",
                "1001"
            )
            .await,
        7
    );
    mall.cleanup().await;
}

/// On PostgreSQL the order's pending check beside timeoutd's own rows (the sweep's re-arm,
/// retention) reads the row's text id as a number, so `oms_order`'s key is used: every 64-bit
/// id, a 19-digit snowflake id too, finds its order; text that is no 64-bit number (too long,
/// not digits) finds none and fails nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_id_finds_its_bigint_order_on_postgresql() {
    let mall = Mall::on(Backend::Postgres).await;
    let now = mall.env.db.now_ms().await.unwrap();
    mall.stock_up(&[801], 10).await;
    mall.member(81, 0, &[]).await;
    for id in [1001, 1_234_567_890_123_456_789] {
        mall.place(&Placed {
            id,
            member: 81,
            coupon: None,
            points: None,
            lines: &[(801, 1, "1.00")],
            created_ms: now,
            status: 0,
            deleted: 0,
        })
        .await;
    }
    let config = mall.config("");
    let db = mall.mapped(&config);
    let exists = db.schema().mapped().unwrap().pending_exists("t.v");
    for (id, pending) in [
        ("1001", true),
        ("1234567890123456789", true),
        ("1002", false),
        ("9223372036854775807", false),
        ("-9223372036854775808", false),
        ("9223372036854775808", false),
        ("99999999999999999999", false),
        ("1e3", false),
        ("mall-1001", false),
        ("", false),
    ] {
        // The pending check's own markers come first in the text, the id's last.
        let q = db.backend().query_owned(format!(
            "SELECT CASE WHEN {} THEN 1 ELSE 0 END FROM (SELECT CAST(? AS TEXT) AS v) t",
            exists.sql
        ));
        let found: i32 = exists
            .clone()
            .bind_onto(q)
            .bind(id.to_string())
            .fetch_one(db.pool())
            .await
            .unwrap_or_else(|e| panic!("`{id}`: {e}"))
            .get(0);
        assert_eq!(found == 1, pending, "`{id}`");
    }
    mall.cleanup().await;
}

/// F12 on mall's tables: payments (status 0 → 1) race the closes of 60 due orders. Each order
/// ends paid with its lock, coupon and points kept, or closed with all three given back: never
/// both, never half.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_racing_the_close_keeps_or_releases_everything_of_its_order() {
    payment_racing_the_close(Backend::MySql).await;
}

/// F12 on mall's tables on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_racing_a_close_on_postgresql_keeps_or_releases_everything() {
    payment_racing_the_close(Backend::Postgres).await;
}

async fn payment_racing_the_close(backend: Backend) {
    const N: i64 = 60;
    let mall = Mall::on(backend).await;
    mall.stock_up(&[201], 1_000).await;
    let now = mall
        .place_due(N, (5_000, 1_000), 9, 10, (201, 2, "5.00"))
        .await;
    let d = mall.swept(now, N).await;
    let shop = Arc::new(mall.shop.clone());
    let payer = tokio::spawn(async move {
        let mut paid = Vec::new();
        for k in (0..N).rev() {
            let took = shop
                .backend()
                .query(
                    "UPDATE oms_order SET status = 1, payment_time = NOW() WHERE id = ? AND status = 0",
                )
            .bind(5_000 + k)
            .execute(shop.pool())
            .await
            .unwrap()
            .rows_affected()
                == 1;
            if took {
                paid.push(5_000 + k);
            }
        }
        paid
    });
    let outcomes = process(&mall.env, &d, now).await;
    let paid = payer.await.unwrap();
    let closed = outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Closed { .. }))
        .count() as i64;
    assert_eq!(closed + paid.len() as i64, N, "{outcomes:?}");
    // Every trigger either closed its order or found it paid: none failed (a close that could
    // not run would hand every order to the payer and still add up).
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Closed { .. } | Outcome::NoOp { .. })),
        "{outcomes:?}"
    );
    for k in 0..N {
        let id = 5_000 + k;
        let member = 1_000 + k;
        let status = mall.status(id).await;
        let coupon_used = mall
            .int(
                "SELECT CAST(SUM(use_status) AS SIGNED) FROM sms_coupon_history WHERE member_id = ?",
                member,
            )
            .await;
        match status {
            1 => assert_eq!(
                (mall.points(member).await, coupon_used),
                (40, 1),
                "{id} paid"
            ),
            4 => assert_eq!(
                (mall.points(member).await, coupon_used),
                (50, 0),
                "{id} closed"
            ),
            other => panic!("{id} has status {other}"),
        }
    }
    assert_eq!(
        mall.locked(201).await,
        2 * paid.len() as i64,
        "only the paid orders' units stay locked"
    );
    mall.cleanup().await;
}

/// F9 with two daemons on mall's tables: both sweep and both close 120 due orders at once; each
/// order is closed once (one ledger row per effect), the locks all released, every point back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_daemons_close_each_mall_order_once() {
    const N: i64 = 120;
    let mall = Mall::new().await;
    let now = mall.env.db.now_ms().await.unwrap();
    mall.stock_up(&[301, 302], 10_000).await;
    mall.member(77, 0, &[]).await;
    for k in 0..N {
        mall.place(&Placed {
            id: 9_000 + k,
            member: 77,
            coupon: None,
            points: Some(3),
            lines: &[(301, 1, "1.00"), (302, 2, "2.00")],
            created_ms: now - WINDOW_MS - 120_000,
            status: 0,
            deleted: 0,
        })
        .await;
    }
    mall.exec("UPDATE ums_member SET integration = 0 WHERE id = ?", &[77])
        .await;
    let config = mall.config("");
    let (clock, _) = Clock::manual(now);
    let mut daemons = Vec::new();
    for _ in 0..2 {
        let d = mall.env.dispatcher(&config, clock.clone()).await;
        let db = mall.mapped(&config);
        let env = &mall.env;
        let (clock, config) = (clock.clone(), config.clone());
        daemons.push(async move {
            let mut closed = 0;
            for _ in 0..3 {
                sweep::sweep_once(&db, &clock, &config.sweep).await.unwrap();
                closed += env
                    .process(&d, now)
                    .await
                    .iter()
                    .filter(|o| matches!(o, Outcome::Closed { .. }))
                    .count();
            }
            closed
        });
    }
    let closed: usize = futures_util::future::join_all(daemons)
        .await
        .into_iter()
        .sum();
    assert_eq!(
        closed, N as usize,
        "each order closed by exactly one daemon"
    );
    assert_eq!((mall.locked(301).await, mall.locked(302).await), (0, 0));
    assert_eq!(
        mall.points(77).await,
        3 * N,
        "every order's 3 points back once"
    );
    assert_eq!(
        mall.env
            .int(
                "SELECT COUNT(*) FROM effect_ledger WHERE kind IN ('restore-stock', 'return-points') AND order_id LIKE ?",
                "9%"
            )
            .await,
        3 * N,
        "two lines and the points per order, once"
    );
    mall.cleanup().await;
}

/// mall's own `cancelOrder` made a compare-and-set (docs/adoption.md, "While the shop's own
/// cancel job still runs"): its first write takes the order 0 → 4 only where still 0, and it
/// releases the lock, the coupon and the points only when that took.
async fn malls_cancel(shop: &Db, id: i64) -> bool {
    let mut tx = shop.pool().begin().await.unwrap();
    let took = sqlx::query(
        "UPDATE oms_order SET status = 4, modify_time = NOW() WHERE id = ? AND status = 0 AND delete_status = 0",
    )
    .bind(id)
    .execute(&mut *tx)
    .await
    .unwrap()
    .rows_affected()
        == 1;
    if took {
        let order = sqlx::query(
            "SELECT member_id, CAST(coupon_id AS SIGNED), CAST(use_integration AS SIGNED) FROM oms_order WHERE id = ?",
        )
        .bind(id)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        let (member, coupon, points): (i64, Option<i64>, Option<i64>) =
            (order.get(0), order.get(1), order.get(2));
        let lines = sqlx::query(
            "SELECT product_sku_id, CAST(product_quantity AS SIGNED) FROM oms_order_item WHERE order_id = ?",
        )
        .bind(id)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        for line in lines {
            sqlx::query(
                "UPDATE pms_sku_stock SET lock_stock = lock_stock - ? WHERE id = ? AND lock_stock - ? >= 0",
            )
            .bind(line.get::<i64, _>(1))
            .bind(line.get::<i64, _>(0))
            .bind(line.get::<i64, _>(1))
            .execute(&mut *tx)
            .await
            .unwrap();
        }
        if let Some(coupon) = coupon {
            sqlx::query(
                "UPDATE sms_coupon_history SET use_status = 0 WHERE id = (SELECT id FROM (SELECT MIN(id) AS id \
                 FROM sms_coupon_history WHERE member_id = ? AND coupon_id = ? AND use_status = 1) first)",
            )
            .bind(member)
            .bind(coupon)
            .execute(&mut *tx)
            .await
            .unwrap();
        }
        sqlx::query("UPDATE ums_member SET integration = integration + ? WHERE id = ?")
            .bind(points.unwrap_or(0))
            .bind(member)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    took
}

/// The switch-over: mall's own cancel job (made a compare-and-set) runs over 60 due orders while
/// timeoutd closes them. Each order is closed by exactly one of the two, and everything it held
/// comes back once: no member has more points than before the order, every coupon row is unused
/// once, every lock is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malls_own_cancel_made_a_compare_and_set_beside_timeoutd_never_closes_twice() {
    const N: i64 = 60;
    let mall = Mall::new().await;
    mall.stock_up(&[401], 1_000).await;
    let now = mall
        .place_due(N, (7_000, 2_000), 5, 20, (401, 3, "8.80"))
        .await;
    let d = mall.swept(now, N).await;
    let shop = mall.shop.clone();
    let job = tokio::spawn(async move {
        let mut closed = 0;
        for k in 0..N {
            // mall's job walks the orders in the other direction, so the two meet midway.
            if malls_cancel(&shop, 7_000 + N - 1 - k).await {
                closed += 1;
            }
        }
        closed
    });
    let ours = process(&mall.env, &d, now)
        .await
        .iter()
        .filter(|o| matches!(o, Outcome::Closed { .. }))
        .count() as i64;
    let theirs = job.await.unwrap();
    assert_eq!(
        ours + theirs,
        N,
        "timeoutd closed {ours}, mall's job {theirs}"
    );
    assert_eq!(mall.locked(401).await, 0);
    for k in 0..N {
        let member = 2_000 + k;
        assert_eq!(mall.status(7_000 + k).await, 4);
        assert_eq!(
            mall.points(member).await,
            50,
            "member {member}'s points back once"
        );
        assert_eq!(
            mall.int(
                "SELECT CAST(SUM(use_status) AS SIGNED) FROM sms_coupon_history WHERE member_id = ?",
                member
            )
            .await,
            0
        );
    }
    mall.cleanup().await;
}

/// A profile that does not fit the live tables stops `timeoutd run` with exit 64 and every
/// problem named (table, column, profile key); `doctor` names the same as errors. A fitting
/// profile starts, and `doctor` warns that mall has no index for the sweep nor for an order's
/// lines, naming each `CREATE INDEX`, until they are created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_is_checked_against_the_live_tables() {
    profile_checked_against_the_live_tables(Backend::MySql).await;
}

/// The same on PostgreSQL: its catalog (`information_schema`, `pg_index`) read for the
/// schema `database.shop.database` names, PostgreSQL's type names in the problems, and the
/// advice to build each index `CONCURRENTLY`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_profile_is_checked_against_the_live_tables_on_postgresql() {
    profile_checked_against_the_live_tables(Backend::Postgres).await;
}

async fn profile_checked_against_the_live_tables(backend: Backend) {
    let mall = Mall::on(backend).await;
    let dir = mall.env.dir.path();
    let shipped = std::fs::read_to_string(profile_path()).unwrap();
    let broken = shipped
        .replace("total = \"pay_amount\"", "total = \"pay_amount_yuan\"")
        .replace("table = \"ums_member\"", "table = \"ums_members\"")
        .replace("created = \"create_time\"", "created = \"order_sn\"")
        // Text where the column holds integers: MySQL converts it, PostgreSQL would fail
        // every statement comparing it.
        .replace("live = 0 }", "live = \"0\" }")
        // A name in another case: MySQL's columns match in any case; PostgreSQL's statements
        // quote it, and `Status` is not the column `status`.
        .replace("status = \"status\"", "status = \"Status\"");
    assert_ne!(broken, shipped);
    std::fs::write(dir.join("broken.toml"), &broken).unwrap();
    std::fs::write(dir.join("mall.toml"), &shipped).unwrap();
    let config_text = |profile: &str| {
        format!(
            "[database]\nurl = \"{}\"\n[database.shop]\nprofile = \"{profile}\"\ndatabase = \"{}\"\n\
             [merchants.mall]\nplugin = \"builtin:single-phase\"\n",
            mall.env.url, mall.name
        )
    };
    let bad_config = dir.join("bad.toml");
    std::fs::write(&bad_config, config_text("broken.toml")).unwrap();
    let out = std::process::Command::new(crate::support::timeoutd_bin())
        .args(["run", "--config"])
        .arg(&bad_config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    let varchar = match backend {
        Backend::Postgres => "character varying",
        _ => "varchar",
    };
    for want in [
        "`orders.total`: table `oms_order` has no column `pay_amount_yuan`".to_string(),
        "table `ums_members` (from `points.member`)".to_string(),
        format!(
            "`orders.created`: `oms_order`.`order_sn` is {varchar}, the profile needs DATETIME or TIMESTAMP"
        ),
    ] {
        assert!(stderr.contains(&want), "{want} missing from:\n{stderr}");
    }
    let config = Config::from_toml(&config_text("broken.toml"), dir, &|_| None).unwrap();
    let findings = timeoutd::doctor::examine(&config).await;
    let errors: Vec<String> = findings
        .iter()
        .filter(|f| f.what == "database.shop" && f.level == timeoutd::doctor::Level::Error)
        .map(|f| f.found.clone())
        .collect();
    let problems = match backend {
        Backend::Postgres => {
            assert!(
                errors.iter().any(|e| e.contains(
                    "`orders.soft_delete.column`: `oms_order`.`delete_status` is integer, the profile needs a character type"
                )),
                "{errors:#?}"
            );
            assert!(
                errors.iter().any(
                    |e| e.contains("`orders.status`: table `oms_order` has no column `Status`")
                ),
                "{errors:#?}"
            );
            5
        }
        _ => 3,
    };
    assert_eq!(errors.len(), problems, "{errors:#?}");

    let config = Config::from_toml(&config_text("mall.toml"), dir, &|_| None).unwrap();
    let shop_findings =
        |findings: Vec<timeoutd::doctor::Finding>| -> Vec<(timeoutd::doctor::Level, String)> {
            findings
                .into_iter()
                .filter(|f| f.what == "database.shop")
                .map(|f| (f.level, f.found))
                .collect()
        };
    let before = shop_findings(timeoutd::doctor::examine(&config).await);
    let (create, q) = match backend {
        Backend::Postgres => ("CREATE INDEX CONCURRENTLY", '"'),
        _ => ("CREATE INDEX", '`'),
    };
    let name = &mall.name;
    assert!(
        matches!(&before[..], [(timeoutd::doctor::Level::Warn, sweep), (timeoutd::doctor::Level::Warn, lines)]
            if sweep.contains(&format!("{create} idx_timeoutd_sweep ON {q}{name}{q}.{q}oms_order{q} (status, create_time)"))
            && lines.contains(&format!("{create} idx_timeoutd_lines ON {q}{name}{q}.{q}oms_order_item{q} (order_id)"))),
        "{before:#?}"
    );
    for index in [
        "CREATE INDEX idx_timeoutd_sweep ON oms_order (status, create_time)",
        "CREATE INDEX idx_timeoutd_lines ON oms_order_item (order_id)",
    ] {
        sqlx::query(index).execute(mall.shop.pool()).await.unwrap();
    }
    let after = shop_findings(timeoutd::doctor::examine(&config).await);
    assert!(
        matches!(&after[..], [(timeoutd::doctor::Level::Ok, _)]),
        "{after:#?}"
    );
    mall.cleanup().await;
}

/// F10 on mall's tables with the shipped `config/mall.toml` as a daemon: 800 due orders, the
/// daemon SIGKILLed mid-burst, a second one started. Every order closed exactly once (one
/// `closed` decision each, three ledger rows of its own each), every lock released, every point
/// back, every coupon unused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_mall_config_survives_a_kill_mid_burst() {
    const N: i64 = 800;
    let mall = Mall::new().await;
    let now = mall.env.db.now_ms().await.unwrap();
    mall.stock_up(&[501, 502], 100_000).await;
    for k in 0..N {
        mall.member(10_000 + k, 10, &[6]).await;
    }
    for k in 0..N {
        mall.place(&Placed {
            id: 20_000 + k,
            member: 10_000 + k,
            coupon: Some(6),
            points: Some(10),
            lines: &[(501, 1, "3.30"), (502, 2, "1.10")],
            created_ms: now - WINDOW_MS - 120_000,
            status: 0,
            deleted: 0,
        })
        .await;
    }
    let closed = || async {
        sqlx::query("SELECT COUNT(*) FROM oms_order WHERE status = 4")
            .fetch_one(mall.shop.pool())
            .await
            .unwrap()
            .get::<i64, _>(0)
    };
    let start = |log: &str| {
        std::process::Command::new(crate::support::timeoutd_bin())
            .args(["run", "--config"])
            .arg(repo_root().join("config/mall.toml"))
            .env("TIMEOUTD_MYSQL_URL", &mall.env.url)
            .env("TIMEOUTD_SHOP_DATABASE", &mall.name)
            .env("TIMEOUTD_SWEEP_INTERVAL", "500ms")
            .env("TIMEOUTD_SWEEP_GRACE", "1s")
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(mall.env.dir.path().join(log)).unwrap())
            .spawn()
            .unwrap()
    };
    let mut first = start("first.log");
    let started = std::time::Instant::now();
    while closed().await == 0 {
        let log = std::fs::read_to_string(mall.env.dir.path().join("first.log")).unwrap();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(120),
            "no close at all:\n{log}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let by_first = closed().await;
    let mut second = start("second.log");
    let started = std::time::Instant::now();
    while closed().await < N {
        let log = std::fs::read_to_string(mall.env.dir.path().join("second.log")).unwrap();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(180),
            "the second daemon did not finish:\n{log}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    second.kill().unwrap();
    second.wait().unwrap();
    assert_eq!(
        mall.env
            .int(
                "SELECT COUNT(DISTINCT order_id) FROM decision_log WHERE outcome = ?",
                "closed"
            )
            .await,
        N
    );
    assert_eq!(
        mall.env
            .int(
                "SELECT COUNT(*) FROM decision_log WHERE outcome = ?",
                "closed"
            )
            .await,
        N,
        "one close per order"
    );
    assert_eq!(
        mall.env
            .int(
                "SELECT COUNT(*) FROM effect_ledger WHERE kind IN ('restore-stock', 'release-coupon', 'return-points') AND status = ?",
                "DONE"
            )
            .await,
        4 * N,
        "two lines, the coupon and the points of each order, once"
    );
    assert_eq!((mall.locked(501).await, mall.locked(502).await), (0, 0));
    let points: i64 = sqlx::query("SELECT CAST(SUM(integration) AS SIGNED) FROM ums_member")
        .fetch_one(mall.shop.pool())
        .await
        .unwrap()
        .get(0);
    assert_eq!(points, 10 * N, "every member has their 10 points, once");
    let used: i64 =
        sqlx::query("SELECT CAST(COALESCE(SUM(use_status), 0) AS SIGNED) FROM sms_coupon_history")
            .fetch_one(mall.shop.pool())
            .await
            .unwrap()
            .get(0);
    assert_eq!(used, 0);
    eprintln!("SIGKILL after {by_first} of {N} closes");
    mall.cleanup().await;
}

/// Drains `n` due orders through `timeoutd run --config config/<file>` and returns closes per
/// second from the first close to the last (start-up left out), polling `closed()`.
async fn drain_rate<F, Fut>(file: &str, env: &Env, shop_db: &str, n: i64, closed: F) -> f64
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = i64>,
{
    let mut daemon = std::process::Command::new(crate::support::timeoutd_bin())
        .args(["run", "--config"])
        .arg(repo_root().join("config").join(file))
        .env("TIMEOUTD_MYSQL_URL", &env.url)
        .env("TIMEOUTD_POSTGRES_URL", &env.url)
        .env("TIMEOUTD_SHOP_DATABASE", shop_db)
        .env("TIMEOUTD_SWEEP_INTERVAL", "1h")
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut first = None;
    let started = std::time::Instant::now();
    loop {
        let c = closed().await;
        if c > 0 && first.is_none() {
            first = Some((std::time::Instant::now(), c));
        }
        if c >= n {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(300),
            "{file}: {c} of {n}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let end = std::time::Instant::now();
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let (t0, c0) = first.unwrap();
    (n - c0) as f64 / (end - t0).as_secs_f64().max(1e-3)
}

/// Bench, run by hand (`-- --ignored --nocapture shop::bench`): the same burst of due orders
/// (two lines and a coupon each; mall's also spend points) drained by the daemon through the
/// outbox on the canonical tables (`config/mariadb.toml`) and on mall's (`config/mall.toml`),
/// alternately, twice each; prints closes/s and the ratio. `TIMEOUTD_SHOP_BENCH_ORDERS` sets
/// the burst (default 4000); `TIMEOUTD_SHOP_BENCH_BACKEND=postgres` runs it on PostgreSQL
/// (`config/postgres.toml` against `config/mall-postgres.toml`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a bench: prints figures, run by hand"]
async fn bench_the_mall_profile_against_the_canonical_tables() {
    let n: i64 = std::env::var("TIMEOUTD_SHOP_BENCH_ORDERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4_000);
    let (backend, canonical_file, mall_file) =
        match std::env::var("TIMEOUTD_SHOP_BENCH_BACKEND").as_deref() {
            Ok("postgres") => (Backend::Postgres, "postgres.toml", "mall-postgres.toml"),
            _ => (Backend::MySql, "mariadb.toml", "mall.toml"),
        };
    let mut rates = Vec::new();
    for round in 0..2 {
        let env = Env::new(backend).await;
        env.stock_up(&[("sku-a", 10 * n), ("sku-b", 10 * n)]).await;
        let now = env.db.now_ms().await.unwrap();
        for k in 0..n {
            env.create(&crate::support::order(
                &format!("c-{k:06}"),
                "acme",
                now - 1_000,
            ))
            .await;
        }
        let canonical = drain_rate(canonical_file, &env, "", n, || async {
            env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "CLOSED")
                .await
        })
        .await;
        env.cleanup().await;

        let mall = Mall::on(backend).await;
        let now = mall.env.db.now_ms().await.unwrap();
        mall.stock_up(&[701, 702], 10 * n).await;
        for k in 0..n {
            mall.member(40_000 + k, 10, &[8]).await;
            mall.place(&Placed {
                id: 100_000 + k,
                member: 40_000 + k,
                coupon: Some(8),
                points: Some(10),
                lines: &[(701, 2, "12.50"), (702, 1, "9.90")],
                created_ms: now - WINDOW_MS - 1_000,
                status: 0,
                deleted: 0,
            })
            .await;
            // The order service (or `timeoutd arm`) arms each order in timeoutd's outbox.
            backend
                .query(
                    "INSERT INTO order_timeout_msg (order_id, due_ms, phase, status) VALUES (?, ?, 0, 'PENDING')",
                )
                .bind((100_000 + k).to_string())
                .bind(now - 1_000)
                .execute(mall.env.db.pool())
            .await
            .unwrap();
        }
        let shop = mall.shop.clone();
        let mapped = drain_rate(mall_file, &mall.env, &mall.name, n, || async {
            sqlx::query("SELECT COUNT(*) FROM oms_order WHERE status = 4")
                .fetch_one(shop.pool())
                .await
                .unwrap()
                .get::<i64, _>(0)
        })
        .await;
        assert_eq!(mall.locked(701).await, 0);
        mall.cleanup().await;
        eprintln!(
            "round {round}: {n} orders: canonical {canonical:.0} closes/s, mall profile {mapped:.0} closes/s, ratio {:.2}",
            mapped / canonical
        );
        rates.push((canonical, mapped));
    }
}

/// Bench, run by hand (`-- --ignored --nocapture shop::bench`): the sweep's query on mall's
/// `oms_order` holding 10^6 closed orders and 100 due pending ones, without and then with the
/// index `doctor` recommends; prints the time of one sweep round each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a bench: prints figures, run by hand"]
async fn bench_the_sweep_over_a_million_closed_mall_orders() {
    let mall = Mall::new().await;
    let now = mall.env.db.now_ms().await.unwrap();
    let old = mall.local(now - 30 * 86_400_000);
    let t = std::time::Instant::now();
    sqlx::query(
        "INSERT INTO oms_order (id, member_id, create_time, pay_amount, status, receiver_name, receiver_phone, delete_status) \
         SELECT seq, seq % 1000, CAST(? AS DATETIME) + INTERVAL (seq % 86400) SECOND, 9.90, 4, 'n', 'p', 0 FROM seq_1_to_1000000",
    )
    .bind(old)
    .execute(mall.shop.pool())
    .await
    .unwrap();
    eprintln!(
        "10^6 closed orders inserted in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    mall.stock_up(&[801], 1_000).await;
    mall.member(1, 0, &[]).await;
    for k in 0..100 {
        mall.place(&Placed {
            id: 2_000_000 + k,
            member: 1,
            coupon: None,
            points: None,
            lines: &[(801, 1, "1.00")],
            created_ms: now - WINDOW_MS - 120_000,
            status: 0,
            deleted: 0,
        })
        .await;
    }
    sqlx::query("ANALYZE TABLE oms_order")
        .execute(mall.shop.pool())
        .await
        .unwrap();
    let config = mall.config("");
    let db = mall.mapped(&config);
    let round = || async {
        let t = std::time::Instant::now();
        let found = timeoutd::db::outbox::find_orphans(&db, now, 10_000, 500)
            .await
            .unwrap();
        assert_eq!(found.len(), 100);
        t.elapsed().as_secs_f64() * 1000.0
    };
    let mut without = Vec::new();
    for _ in 0..5 {
        without.push(round().await);
    }
    sqlx::query("CREATE INDEX idx_timeoutd_sweep ON oms_order (status, create_time)")
        .execute(mall.shop.pool())
        .await
        .unwrap();
    let mut with = Vec::new();
    for _ in 0..5 {
        with.push(round().await);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    eprintln!(
        "one sweep round over 10^6 closed + 100 due orders: {:.1} ms without the index, {:.2} ms with it (median of 5)",
        median(&mut without),
        median(&mut with)
    );
    mall.cleanup().await;
}

/// mall split over two shard databases (`[[database.shards]]` with `routing = "mod"`, each shard
/// its own `shop_database`): one `timeoutd run` takes both shards and closes each shard's due
/// orders once in that shard's mall tables, by the sweep; the orders not due are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_mall_is_closed_shard_by_shard() {
    let shards = [Mall::new().await, Mall::new().await];
    let now = shards[0].env.db.now_ms().await.unwrap();
    for (at, mall) in shards.iter().enumerate() {
        mall.stock_up(&[901], 100).await;
        for k in 0..20i64 {
            // mall's ids routed by `id % 2`, as ShardingSphere's MOD would put them.
            let id = 50_000 + 2 * k + at as i64;
            mall.member(id, 10, &[]).await;
            mall.place(&Placed {
                id,
                member: id,
                coupon: None,
                points: Some(10),
                lines: &[(901, 1, "2.00")],
                created_ms: if k < 15 {
                    now - WINDOW_MS - 60_000
                } else {
                    now - 60_000
                },
                status: 0,
                deleted: 0,
            })
            .await;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "[database]\nrouting = \"mod\"\nshard_lease = \"2s\"\nmax_connections = 4\n\
         [database.shop]\nprofile = \"{}\"\n\
         [[database.shards]]\nname = \"ds_0\"\nurl = \"{}\"\nshop_database = \"{}\"\n\
         [[database.shards]]\nname = \"ds_1\"\nurl = \"{}\"\nshop_database = \"{}\"\n\
         [sweep]\ninterval = \"500ms\"\ngrace = \"1s\"\n\
         [merchants.mall]\nplugin = \"builtin:single-phase\"\n",
        profile_path().display(),
        shards[0].env.url,
        shards[0].name,
        shards[1].env.url,
        shards[1].name
    );
    let file = dir.path().join("sharded-mall.toml");
    std::fs::write(&file, config).unwrap();
    let log = dir.path().join("daemon.log");
    let mut daemon = std::process::Command::new(crate::support::timeoutd_bin())
        .args(["run", "--config"])
        .arg(&file)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let closed = |mall: &Mall| {
        let shop = mall.shop.clone();
        async move {
            sqlx::query("SELECT COUNT(*) FROM oms_order WHERE status = 4")
                .fetch_one(shop.pool())
                .await
                .unwrap()
                .get::<i64, _>(0)
        }
    };
    crate::support::eventually(
        std::time::Duration::from_secs(60),
        "15 orders closed in each shard",
        || async { closed(&shards[0]).await == 15 && closed(&shards[1]).await == 15 },
    )
    .await;
    // A moment more: nothing else closes (the 5 not yet due in each shard stay pending).
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    for mall in &shards {
        assert_eq!(closed(mall).await, 15, "{text}");
        assert_eq!(
            mall.locked(901).await,
            5,
            "the 5 pending orders' units stay locked"
        );
        assert_eq!(
            mall.env
                .int(
                    "SELECT COUNT(*) FROM decision_log WHERE outcome = ?",
                    "closed"
                )
                .await,
            15,
            "each shard's own decision log holds its closes"
        );
    }
    let [a, b] = shards;
    a.cleanup().await;
    b.cleanup().await;
}

/// `timeoutd validate` checks `[database.shop]` offline with everything else, each problem with
/// its key, exit 64: a profile file that is missing; one that does not parse; one with a bad
/// identifier and a bad zone (both named); a fixed merchant with no `[merchants.X]`; a
/// SQLite URL. The shipped `config/mall.toml` and `config/mall-postgres.toml` validate.
#[test]
fn validate_checks_the_shop_profile_offline() {
    let dir = tempfile::tempdir().unwrap();
    let shipped = std::fs::read_to_string(profile_path()).unwrap();
    std::fs::write(dir.path().join("garbled.toml"), "name = \"x\"\n[orders\n").unwrap();
    std::fs::write(
        dir.path().join("bad.toml"),
        shipped
            .replace("table = \"oms_order\"", "table = \"oms_order`; --\"")
            .replace("Asia/Shanghai", "Asia/Atlantis"),
    )
    .unwrap();
    std::fs::write(dir.path().join("mall.toml"), &shipped).unwrap();
    let run = |config: &str| {
        let file = dir.path().join("config.toml");
        std::fs::write(&file, config).unwrap();
        let out = std::process::Command::new(crate::support::timeoutd_bin())
            .args(["validate", "--config"])
            .arg(&file)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let mysql = "mysql://root@127.0.0.1:3306/test";
    let cases = [
        (mysql, "missing.toml", "mall", "missing.toml: No such file"),
        (
            mysql,
            "garbled.toml",
            "mall",
            "garbled.toml: TOML parse error",
        ),
        (
            mysql,
            "bad.toml",
            "mall",
            "`orders.table` = `oms_order`; --` is not a plain table or column name",
        ),
        (
            mysql,
            "bad.toml",
            "mall",
            "`time.zone` = `Asia/Atlantis` is not an IANA time zone",
        ),
        (
            mysql,
            "mall.toml",
            "acme",
            "merchant `mall`, which has no [merchants.mall] table",
        ),
        (
            "sqlite://shop.db",
            "mall.toml",
            "mall",
            "a shop's own tables are read on MariaDB/MySQL or PostgreSQL; database.url is SQLite",
        ),
    ];
    for (url, profile, merchant, want) in cases {
        let (code, stderr) = run(&format!(
            "[database]\nurl = \"{url}\"\n[database.shop]\nprofile = \"{profile}\"\ndatabase = \"mall\"\n\
             [merchants.{merchant}]\nplugin = \"builtin:single-phase\"\n"
        ));
        assert_eq!(code, Some(64), "{profile}: {stderr}");
        assert!(
            stderr.contains("database.shop") && stderr.contains(want),
            "{want} missing from:\n{stderr}"
        );
    }
    for shipped in ["config/mall.toml", "config/mall-postgres.toml"] {
        let out = std::process::Command::new(crate::support::timeoutd_bin())
            .args(["validate", "--config"])
            .arg(repo_root().join(shipped))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{shipped}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `SHOW CREATE TABLE` of every table in the mall database, by name.
async fn definitions(shop: &Db) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    let tables = sqlx::query("SHOW TABLES")
        .fetch_all(shop.pool())
        .await
        .unwrap();
    for t in tables {
        let name: String = t.get(0);
        let row = sqlx::query(sqlx::AssertSqlSafe(format!("SHOW CREATE TABLE `{name}`")))
            .fetch_one(shop.pool())
            .await
            .unwrap();
        let create: String = row.get(1);
        // The next AUTO_INCREMENT value moves with the shop's own inserts.
        let create = create
            .split_whitespace()
            .filter(|w| !w.starts_with("AUTO_INCREMENT="))
            .collect::<Vec<_>>()
            .join(" ");
        out.insert(name, create);
    }
    out
}

/// `database.table_prefix` (#42 part 3): the shipped `config/mall-shared.toml` runs timeoutd
/// in mall's own database, beside mall's tables and a shop table named like one of timeoutd's
/// (`orders`). As a daemon it closes a due mall order as `cancelOrder` would, once; every
/// table it created is `timeoutd_…` (all of them, none unprefixed); the shop's tables'
/// definitions and the database's default character set are as they were; the shop's own
/// `orders` keeps its row; `timeoutd doctor` on that config passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_prefix_puts_timeoutds_tables_beside_malls_in_malls_database() {
    let mall = Mall::new().await;
    for sql in [
        "CREATE TABLE orders (id BIGINT PRIMARY KEY, note VARCHAR(32)) DEFAULT CHARSET=utf8",
        "INSERT INTO orders VALUES (1, 'the shop''s own')",
    ] {
        sqlx::query(sql).execute(mall.shop.pool()).await.unwrap();
    }
    let charset = || async {
        sqlx::query(
            "SELECT DEFAULT_CHARACTER_SET_NAME FROM information_schema.SCHEMATA \
             WHERE SCHEMA_NAME = DATABASE()",
        )
        .fetch_one(mall.shop.pool())
        .await
        .unwrap()
        .get::<String, _>(0)
    };
    let (before, charset_before) = (definitions(&mall.shop).await, charset().await);
    assert_eq!(charset_before, "utf8mb3", "mall's database is utf8");
    let now = mall.env.db.now_ms().await.unwrap();
    mall.stock_up(&[501, 502], 100).await;
    mall.member(7, 10, &[6]).await;
    mall.place(&Placed {
        id: 30_001,
        member: 7,
        coupon: Some(6),
        points: Some(10),
        lines: &[(501, 1, "3.30"), (502, 2, "1.10")],
        created_ms: now - WINDOW_MS - 60_000,
        status: 0,
        deleted: 0,
    })
    .await;
    let config = repo_root().join("config/mall-shared.toml");
    let mall_url = format!("{}/{}", mall.env.url.rsplit_once('/').unwrap().0, mall.name);
    let log = mall.env.dir.path().join("shared.log");
    let mut daemon = std::process::Command::new(crate::support::timeoutd_bin())
        .args(["run", "--config"])
        .arg(&config)
        .env("TIMEOUTD_MALL_URL", &mall_url)
        .env("TIMEOUTD_SWEEP_INTERVAL", "500ms")
        .env("TIMEOUTD_SWEEP_GRACE", "1s")
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while mall.status(30_001).await != 4 {
        let exited = daemon.try_wait().unwrap();
        assert!(
            exited.is_none() && started.elapsed() < std::time::Duration::from_secs(120),
            "not closed (daemon exit: {exited:?}):\n{}",
            std::fs::read_to_string(&log).unwrap()
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let shop = &mall.shop;
    let count = |sql: &'static str| async move {
        sqlx::query(sql)
            .fetch_one(shop.pool())
            .await
            .unwrap()
            .get::<i64, _>(0)
    };
    let started = std::time::Instant::now();
    while count("SELECT COUNT(*) FROM timeoutd_effect_ledger WHERE status = 'DONE'").await < 4 {
        assert!(started.elapsed() < std::time::Duration::from_secs(60));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    daemon.kill().unwrap();
    daemon.wait().unwrap();
    assert_eq!((mall.locked(501).await, mall.locked(502).await), (0, 0));
    assert_eq!(mall.points(7).await, 10, "the points back, once");
    assert_eq!(
        count("SELECT COUNT(*) FROM timeoutd_decision_log WHERE outcome = 'closed'").await,
        1
    );
    assert_eq!(
        count(
            "SELECT COUNT(*) FROM timeoutd_effect_ledger WHERE status = 'DONE' AND kind IN \
             ('restore-stock', 'release-coupon', 'return-points')"
        )
        .await,
        4,
        "two lines, the coupon and the points, once each"
    );
    assert_eq!(
        count("SELECT CAST(COALESCE(SUM(use_status), 0) AS SIGNED) FROM sms_coupon_history").await,
        0
    );
    let after = definitions(&mall.shop).await;
    let created: Vec<&String> = after.keys().filter(|t| !before.contains_key(*t)).collect();
    let mut expected: Vec<String> = timeoutd::db::names::TABLES
        .iter()
        .map(|t| format!("timeoutd_{t}"))
        .collect();
    expected.sort();
    assert_eq!(
        created,
        expected.iter().collect::<Vec<_>>(),
        "timeoutd created its tables, each prefixed, and nothing else"
    );
    for (table, definition) in &before {
        assert_eq!(
            &after[table], definition,
            "the shop's `{table}` is as it was"
        );
    }
    // sqlx's own bookkeeping table takes the database's default; it holds ASCII only.
    for table in created
        .iter()
        .filter(|t| **t != "timeoutd__sqlx_migrations")
    {
        assert!(
            after[*table].contains("utf8mb4_bin"),
            "timeoutd's own text is utf8mb4 in a utf8 database: {}",
            after[*table]
        );
    }
    assert_eq!(charset().await, charset_before, "the database's default");
    assert_eq!(
        count("SELECT COUNT(*) FROM orders WHERE note = 'the shop''s own'").await,
        1
    );
    let doctor = std::process::Command::new(crate::support::timeoutd_bin())
        .args(["doctor", "--config"])
        .arg(&config)
        .env("TIMEOUTD_MALL_URL", &mall_url)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&doctor.stdout);
    assert!(doctor.status.success(), "doctor:\n{report}");
    assert!(
        report.contains("timeoutd's tables (timeoutd_*) utf8mb4"),
        "{report}"
    );
    mall.cleanup().await;
}

/// Check-backs on mall's own tables (#42 part 5): the broker's question about a half message
/// ("is this order's timeout still wanted?") is answered by loading the order through the
/// profile: a due mall order commits, an unknown id and a paid order (status 1) roll back, an
/// order inside its window stays unknown until the check count says commit. Nothing is
/// written to either database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_backs_answer_from_malls_own_tables() {
    use timeoutd::rocketmq::arming::ArmListener;
    use timeoutd_runtime::model::CheckVerdict;
    let mall = Mall::new().await;
    let now = mall.env.db.now_ms().await.unwrap();
    mall.stock_up(&[701], 100).await;
    for (id, member, created_ms, status) in [
        (4001, 41, now - WINDOW_MS - 60_000, 0),
        (4002, 42, now - 60_000, 0),
        (4003, 43, now - 60_000, 1),
    ] {
        mall.member(member, 5, &[]).await;
        mall.place(&Placed {
            id,
            member,
            coupon: None,
            points: None,
            lines: &[(701, 1, "2.00")],
            created_ms,
            status,
            deleted: 0,
        })
        .await;
    }
    let config = mall.config("");
    let listener = ArmListener::new(
        tokio::runtime::Handle::current(),
        mall.mapped(&config),
        Clock::Database,
        timeoutd::policies::load(&config).unwrap(),
    );
    let shop_before = definitions(&mall.shop).await;
    let own_before = mall.env.dump().await;
    let status_before: Vec<i64> = {
        let mut v = Vec::new();
        for id in [4001, 4002, 4003] {
            v.push(mall.status(id).await);
        }
        v
    };
    assert_eq!(listener.check_back("4001", 1).await, CheckVerdict::Commit);
    assert_eq!(listener.check_back("4999", 1).await, CheckVerdict::Rollback);
    assert_eq!(listener.check_back("4003", 1).await, CheckVerdict::Rollback);
    assert_eq!(listener.check_back("4002", 1).await, CheckVerdict::Unknown);
    assert_eq!(
        listener.check_back("4002", 15).await,
        CheckVerdict::Commit,
        "at the broker's last check the timeout is armed"
    );
    let mut status_after = Vec::new();
    for id in [4001, 4002, 4003] {
        status_after.push(mall.status(id).await);
    }
    assert_eq!(status_after, status_before, "no mall order changed");
    assert_eq!(mall.locked(701).await, 3, "every lock still held");
    assert_eq!(definitions(&mall.shop).await, shop_before);
    assert_eq!(
        mall.env.dump().await,
        own_before,
        "check-backs wrote nothing"
    );
    mall.cleanup().await;
}
