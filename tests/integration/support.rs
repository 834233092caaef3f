//! Shared fixtures: a migrated database per test (SQLite file or a fresh MariaDB database),
//! dispatchers configured like a daemon, orders, and row readers.

use std::path::PathBuf;
use std::sync::Arc;

use sqlx::Row;
use timeoutd::clock::Clock;
use timeoutd::config::Config;
use timeoutd::db::{Backend, Db, outbox};
use timeoutd::dispatch::{Dispatcher, Outcome, Trigger};
use timeoutd::effects::EffectRunner;
use timeoutd_runtime::model::{Order, OrderItem, OrderStatus};

/// The misbehaving test plugin, built by `build.rs`.
pub const HOSTILE_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hostile.wasm"));

/// The same plugin built without Rust's `std` (the SDK's allocator and panic handler).
pub const HOSTILE_NO_STD_WASM: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/hostile_no_std.wasm"));

/// A plugin stamped `timeout:policy@9.0.0` (`plugins/future-api`), built by `build.rs`.
pub const FUTURE_API_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/future_api.wasm"));

/// The API 0.2.0 example plugin (`plugins/tea-house`), built by `build.rs`.
pub const TEA_HOUSE_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/tea_house.wasm"));

/// A 0.2.0 plugin that cancels or ignores at its first look (`plugins/eager`), built by
/// `build.rs`.
pub const EAGER_WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/eager.wasm"));

/// Runs `$body` once per backend: `mod $name { sqlite, mariadb, postgres }`.
macro_rules! each_backend {
    ($(#[$m:meta])* async fn $name:ident($env:ident) $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            async fn run($env: &crate::support::Env) $body
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                let env = crate::support::Env::new(timeoutd::db::Backend::Sqlite).await;
                run(&env).await;
                env.cleanup().await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn mariadb() {
                let env = crate::support::Env::new(timeoutd::db::Backend::MySql).await;
                run(&env).await;
                env.cleanup().await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                let env = crate::support::Env::new(timeoutd::db::Backend::Postgres).await;
                run(&env).await;
                env.cleanup().await;
            }
        }
    };
}
pub(crate) use each_backend;

/// A merchant for [`Env::config`]: `(id, plugin, settings)`; plugin `hostile` is the test
/// plugin, `eager` the 0.2.0 one that answers at first sight, `tea-house` the API 0.2.0 example (`tea-house-js`, `tea-house-py`: its JavaScript and
/// Python components, from `scripts/build-polyglot-plugins`).
pub type MerchantSpec<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);

/// The MariaDB server the tests use.
pub fn mysql_server_url() -> String {
    std::env::var("TIMEOUTD_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_string())
}

/// The PostgreSQL server the tests use (a database on it that the user may create databases
/// from).
pub fn postgres_server_url() -> String {
    std::env::var("TIMEOUTD_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string())
}

/// The server URL of a backend with a database name to replace.
pub fn server_url(backend: Backend) -> String {
    match backend {
        Backend::MySql => mysql_server_url(),
        _ => postgres_server_url(),
    }
}

/// A migrated database of one backend, private to one test.
pub struct Env {
    /// The database.
    pub db: Db,
    /// Its URL.
    pub url: String,
    /// Scratch directory (SQLite file, plugin files).
    pub dir: tempfile::TempDir,
    /// The server's URL and the database made on it.
    server_database: Option<(String, String)>,
}

/// The table prefix this test process runs with: `TIMEOUTD_TEST_TABLE_PREFIX` (default none),
/// made the process's on first use, so the suite can be run by hand with every test's tables
/// prefixed (`TIMEOUTD_TEST_TABLE_PREFIX=t_ cargo test --test integration -- shop`); the
/// configs [`Env::config`] writes carry it to in-process daemons and to the binary.
pub fn table_prefix() -> &'static str {
    static PREFIX: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PREFIX.get_or_init(|| {
        let prefix = std::env::var("TIMEOUTD_TEST_TABLE_PREFIX").unwrap_or_default();
        timeoutd::db::names::serve(&prefix).unwrap();
        prefix
    })
}

impl Env {
    /// A fresh, migrated database.
    pub async fn new(backend: Backend) -> Env {
        Self::new_with(backend, "").await
    }

    /// A fresh, migrated database created with `create_options` appended to its `CREATE
    /// DATABASE` (e.g. ` CHARACTER SET latin1`); ignored on SQLite.
    pub async fn new_with(backend: Backend, create_options: &str) -> Env {
        Self::new_on(backend, &server_url(backend), create_options).await
    }

    /// As [`Env::new_with`], on the server at `server` (a URL naming a database the user may
    /// create databases from): a Galera node, a Patroni cluster's HAProxy.
    pub async fn new_on(backend: Backend, server: &str, create_options: &str) -> Env {
        table_prefix();
        let dir = tempfile::tempdir().unwrap();
        let (url, server_database) = match backend {
            Backend::Sqlite => (format!("sqlite://{}/t.db", dir.path().display()), None),
            Backend::MySql | Backend::Postgres => {
                let name = format!("timeoutd_t_{:016x}", fastrand::u64(..));
                let server = server.to_string();
                let admin = Db::connect(&server, 1)
                    .await
                    .unwrap_or_else(|e| panic!("{server} must be reachable: {e}"));
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "CREATE DATABASE {name}{create_options}"
                )))
                .execute(admin.pool())
                .await
                .unwrap();
                admin.close().await;
                let base = server.rsplit_once('/').map_or(server.as_str(), |(b, _)| b);
                (format!("{base}/{name}"), Some((server.clone(), name)))
            }
        };
        let db = Db::connect(&url, 8).await.unwrap();
        db.migrate().await.unwrap();
        Env {
            db,
            url,
            dir,
            server_database,
        }
    }

    /// Drops a server test database. On PostgreSQL, sessions still open on it (a dispatcher's
    /// pool the test has not dropped yet) are ended first (`WITH (FORCE)`, PostgreSQL 13+):
    /// MySQL drops a database whoever is connected.
    pub async fn cleanup(self) {
        self.db.close().await;
        if let Some((server, name)) = self.server_database {
            let admin = Db::connect(&server, 1).await.unwrap();
            let force = match admin.backend() {
                Backend::Postgres => " WITH (FORCE)",
                _ => "",
            };
            sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {name}{force}")))
                .execute(admin.pool())
                .await
                .unwrap();
            admin.close().await;
        }
    }

    /// A config over this database with `merchants`, `extra` TOML prepended.
    pub fn config(&self, merchants: &[MerchantSpec<'_>], extra: &str) -> Config {
        self.config_for(merchants, "", extra)
    }

    /// As [`Env::config`], with `merchant_keys` (TOML lines such as
    /// `on_plugin_error = "fallback"`) added to every merchant's table.
    pub fn config_for(
        &self,
        merchants: &[MerchantSpec<'_>],
        merchant_keys: &str,
        extra: &str,
    ) -> Config {
        let mut toml = format!(
            "{}\n[database]\nurl = \"{}\"\ntable_prefix = \"{}\"\n",
            generous_deadline(extra),
            self.url,
            table_prefix()
        );
        for (id, plugin, settings) in merchants {
            let plugin = match *plugin {
                "hostile" => self.hostile_wasm().display().to_string(),
                "tea-house" => self.plugin_file("tea-house.wasm", TEA_HOUSE_WASM),
                "eager" => self.plugin_file("eager.wasm", EAGER_WASM),
                "tea-house-js" | "tea-house-py" => {
                    crate::polyglot::polyglot_wasm(plugin).display().to_string()
                }
                other => other.to_string(),
            };
            toml += &format!(
                "[merchants.{id}]\nplugin = \"{plugin}\"\n{merchant_keys}\n[merchants.{id}.settings]\n"
            );
            for (k, v) in *settings {
                toml += &format!("{k} = \"{v}\"\n");
            }
        }
        Config::from_toml(&toml, self.dir.path(), &|_| None).unwrap()
    }

    /// The hostile test plugin written as a file in the scratch directory; its path.
    pub fn hostile_wasm(&self) -> PathBuf {
        let path = self.dir.path().join("hostile.wasm");
        std::fs::write(&path, HOSTILE_WASM).unwrap();
        path
    }

    /// A test plugin's component written as `name` in the scratch directory (when a merchant
    /// of the config names it); its path as config text.
    fn plugin_file(&self, name: &str, wasm: &[u8]) -> String {
        let path = self.dir.path().join(name);
        std::fs::write(&path, wasm).unwrap();
        path.display().to_string()
    }

    /// An effect runner like a daemon's, over its own pool.
    pub async fn runner(&self, config: &Config, clock: Clock) -> EffectRunner {
        let db = Db::connect(&self.url, 8)
            .await
            .unwrap()
            .with_schema(config.schema().unwrap());
        EffectRunner::from_config(db, clock, config).await.unwrap()
    }

    /// A dispatcher like a daemon's, over its own pool (a second one is a second daemon).
    pub async fn dispatcher(&self, config: &Config, clock: Clock) -> Arc<Dispatcher> {
        self.dispatcher_on(&self.url, config, clock).await
    }

    /// As [`Env::dispatcher`], reaching this database at `url` (another node of a cluster).
    pub async fn dispatcher_on(&self, url: &str, config: &Config, clock: Clock) -> Arc<Dispatcher> {
        let policies = timeoutd::policies::load(config).unwrap();
        // Orders in the tables `[database.shop]` maps, or timeoutd's own.
        let db = Db::connect(url, 8)
            .await
            .unwrap()
            .with_schema(config.schema().unwrap());
        let effects = EffectRunner::from_config(db.clone(), clock.clone(), config)
            .await
            .unwrap();
        let d = Dispatcher::new(
            db,
            clock,
            policies,
            config.dispatch.clone(),
            Arc::new(effects),
        );
        Arc::new(timeoutd::effects::with_provider(d, config).unwrap())
    }

    /// Inserts stock rows.
    pub async fn stock_up(&self, skus: &[(&str, i64)]) {
        for (sku, n) in skus {
            self.db
                .backend()
                .query("INSERT INTO sku_stock (sku, available) VALUES (?, ?)")
                .bind(*sku)
                .bind(*n)
                .execute(self.db.pool())
                .await
                .unwrap();
        }
    }

    /// Creates an order through the reference order service (stock and coupon locked, phase-0
    /// outbox row due at the deadline), creating its coupon first.
    pub async fn create(&self, order: &Order) {
        if let Some(c) = &order.coupon {
            self.db
                .backend()
                .query("INSERT INTO coupons (id, user_id, status) VALUES (?, ?, 'AVAILABLE')")
                .bind(c)
                .bind(&order.user)
                .execute(self.db.pool())
                .await
                .unwrap();
        }
        let mut tx = self.db.begin().await.unwrap();
        timeoutd::db::orders::create(&mut tx, order).await.unwrap();
        tx.commit().await.unwrap();
    }

    /// Pays an order (reference order service).
    pub async fn pay(&self, id: &str, at_ms: i64) -> bool {
        let mut tx = self.db.begin().await.unwrap();
        let paid = timeoutd::db::orders::pay(
            &mut tx,
            &timeoutd::db::shop::Schema::Canonical,
            id,
            at_ms,
            at_ms,
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        paid
    }

    /// `name` in this environment's folder: a config for the `timeoutd` binary on this
    /// database with merchant `acme` on `builtin:single-phase` and nothing else (no admin or
    /// HTTP port).
    pub fn single_phase_config_file(&self, name: &str) -> PathBuf {
        let file = self.dir.path().join(name);
        std::fs::write(
            &file,
            format!(
                "[database]\nurl = \"{}\"\ntable_prefix = \"{}\"\n[merchants.acme]\nplugin = \"builtin:single-phase\"\n",
                self.url,
                table_prefix()
            ),
        )
        .unwrap();
        file
    }

    /// Waits until a transaction of this test's database waits for a row lock, whatever its
    /// statement: PostgreSQL `pg_stat_activity`, MariaDB `INNODB_TRX` (`LOCK WAIT`). Polled
    /// every 150 ms: InnoDB refreshes the `INNODB_TRX` cache only when it was last read more
    /// than 100 ms ago (`CACHE_MIN_IDLE_TIME_US` in `trx0i_s.cc`), so polling faster keeps
    /// showing the first reading forever.
    pub async fn until_waiting_on_a_lock(&self) {
        let database = self.url.rsplit('/').next().unwrap().to_string();
        let sql = match self.db.backend() {
            Backend::Postgres => {
                "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = ?"
            }
            _ => {
                "SELECT COUNT(*) FROM information_schema.INNODB_TRX t \
                 JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id \
                 WHERE t.trx_state = 'LOCK WAIT' AND p.DB = ?"
            }
        };
        let started = std::time::Instant::now();
        while self.int(sql, &database).await < 1 {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(30),
                "nothing ever waited on the held row"
            );
            tokio::time::sleep(std::time::Duration::from_millis(150)).await;
        }
    }

    /// One integer from `sql` (with `?` bound to `arg`).
    pub async fn int(&self, sql: &'static str, arg: &str) -> i64 {
        let row = self
            .db
            .backend()
            .query(sql)
            .bind(arg)
            .fetch_one(self.db.pool())
            .await
            .unwrap();
        row.try_get::<Option<i64>, _>(0).unwrap().unwrap_or(0)
    }

    /// Every row's first column, as integers, from `sql` (with `?` bound to `arg`).
    pub async fn ints(&self, sql: &'static str, arg: &str) -> Vec<i64> {
        let rows = self
            .db
            .backend()
            .query(sql)
            .bind(arg)
            .fetch_all(self.db.pool())
            .await
            .unwrap();
        rows.iter()
            .map(|r| r.try_get::<i64, _>(0).unwrap())
            .collect()
    }

    /// One text from `sql` (with `?` bound to `arg`).
    pub async fn text(&self, sql: &'static str, arg: &str) -> String {
        let row = self
            .db
            .backend()
            .query(sql)
            .bind(arg)
            .fetch_one(self.db.pool())
            .await
            .unwrap();
        row.try_get::<Option<String>, _>(0)
            .unwrap()
            .unwrap_or_default()
    }

    /// Every row of every table the daemon reads or writes, each rendered as text, by table:
    /// what "nothing was written" is checked against (an in-place `UPDATE` shows too).
    pub async fn dump(&self) -> std::collections::BTreeMap<&'static str, Vec<String>> {
        let mut tables = std::collections::BTreeMap::new();
        for table in [
            "orders",
            "order_items",
            "order_timeout_msg",
            "effect_ledger",
            "decision_log",
            "dead_letter",
            "paid_after_close",
            "sku_stock",
            "coupons",
        ] {
            let rows = self
                .db
                .backend()
                .query_owned(format!("SELECT * FROM {table}"))
                .fetch_all(self.db.pool())
                .await
                .unwrap();
            let mut rendered: Vec<String> = rows
                .iter()
                .map(|row| {
                    (0..row.len())
                        .map(|i| {
                            row.try_get::<Option<i64>, _>(i)
                                .map(|v| format!("{v:?}"))
                                .or_else(|_| {
                                    row.try_get::<Option<String>, _>(i)
                                        .map(|v| format!("{v:?}"))
                                })
                                .or_else(|_| {
                                    row.try_get::<Option<f64>, _>(i).map(|v| format!("{v:?}"))
                                })
                                .or_else(|_| {
                                    row.try_get::<Option<Vec<u8>>, _>(i)
                                        .map(|v| format!("{v:?}"))
                                })
                                .unwrap_or_else(|e| panic!("{table} column {i}: {e}"))
                        })
                        .collect::<Vec<_>>()
                        .join(" | ")
                })
                .collect();
            rendered.sort();
            tables.insert(table, rendered);
        }
        tables
    }

    /// Available units of `sku`.
    pub async fn stock(&self, sku: &str) -> i64 {
        self.int("SELECT available FROM sku_stock WHERE sku = ?", sku)
            .await
    }

    /// Status of order `id`.
    pub async fn status(&self, id: &str) -> String {
        self.text("SELECT status FROM orders WHERE id = ?", id)
            .await
    }

    /// Status of coupon `id`.
    pub async fn coupon(&self, id: &str) -> String {
        self.text("SELECT status FROM coupons WHERE id = ?", id)
            .await
    }

    /// Claims every row due at `now_ms` and returns their triggers.
    pub async fn claim(&self, now_ms: i64) -> Vec<Trigger> {
        outbox::claim_due(&self.db, now_ms, 1000, 30_000)
            .await
            .unwrap()
            .iter()
            .map(|row| timeoutd::sources::outbox::trigger_of(row).expect("a valid row"))
            .collect()
    }

    /// Claims and handles every row due at `now_ms`, one after another.
    pub async fn process(&self, d: &Dispatcher, now_ms: i64) -> Vec<Outcome> {
        let mut outcomes = Vec::new();
        for t in self.claim(now_ms).await {
            outcomes.push(d.handle(&t).await);
        }
        outcomes
    }
}

/// A trigger of `kind` for `order_id`'s phase 0 that came from no row (as the sweep's and an
/// operator's reach the dispatcher when handed in directly).
pub fn trigger(
    order_id: &str,
    kind: timeoutd_runtime::model::TriggerKind,
) -> timeoutd::dispatch::Trigger {
    timeoutd::dispatch::Trigger {
        order_id: order_id.to_string(),
        kind,
        phase: 0,
        attempt: 0,
        due_ms: None,
        row_id: None,
        claim: None,
        state: Vec::new(),
        poll: false,
    }
}

/// A decision-log record of `order_id` closed by a trigger of `trigger_kind` (merchant acme,
/// single-phase), decided at [`T0`]: what a close writes beside its compare-and-set.
pub fn closed_record<'a>(
    order_id: &'a str,
    trigger_kind: &'a str,
) -> timeoutd::db::journal::DecisionRecord<'a> {
    timeoutd::db::journal::DecisionRecord {
        order_id,
        merchant_id: "acme",
        plugin: "single-phase",
        plugin_digest: "-",
        trigger_kind,
        phase: 0,
        attempt: 0,
        decision: "cancel",
        outcome: "closed",
        detail: "{}".to_string(),
        latency_us: 0,
        decided_at_ms: T0,
        input: None,
        answer: None,
    }
}

/// An order of `merchant` due at `deadline_ms`: 2 × `sku-a`, 1 × `sku-b`, coupon `cpn-<id>`,
/// payment `pay-<id>`, no flash sale.
pub fn order(id: &str, merchant: &str, deadline_ms: i64) -> Order {
    Order {
        id: id.to_string(),
        merchant: merchant.to_string(),
        user: format!("user-of-{id}"),
        status: OrderStatus::Pending,
        created_at_ms: deadline_ms - 15 * 60_000,
        deadline_ms,
        total_cents: 2 * 1_250 + 990,
        items: vec![
            OrderItem {
                sku: "sku-a".into(),
                quantity: 2,
                unit_price_cents: 1_250,
            },
            OrderItem {
                sku: "sku-b".into(),
                quantity: 1,
                unit_price_cents: 990,
            },
        ],
        coupon: Some(format!("cpn-{id}")),
        flash_activity: None,
        payment_ref: Some(format!("pay-{id}")),
    }
}

/// A free loopback port (bound, read, released).
///
/// Drawn at random below Linux's ephemeral range (32768–60999): a port the kernel hands out for
/// `bind(0)` is also what it gives outgoing connections, and under load (the soak's shop) one of
/// them took a daemon's port between this call and the daemon's bind.
pub fn free_port() -> u16 {
    loop {
        let port = fastrand::u16(20_000..32_768);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Fixed epoch ms the manual-clock tests start from (2026-11-29T10:00:00Z).
pub const T0: i64 = 1_795_946_400_000;

/// `extra` with a plugin deadline of 2 s unless it sets one: the suite runs many debug-build
/// tests at once on two cores, where a 50 ms wall-clock deadline can be hit by a healthy plugin
/// that was merely descheduled. (The sandbox tests set their own deadlines.)
pub fn generous_deadline(extra: &str) -> String {
    if extra.contains("deadline =") {
        extra.to_string()
    } else if extra.contains("[runtime]\n") {
        extra.replacen("[runtime]\n", "[runtime]\ndeadline = \"2s\"\n", 1)
    } else {
        format!("{extra}\n[runtime]\ndeadline = \"2s\"\n")
    }
}

/// Every daemon config we ship: each `config/*.toml`, sorted, listed from the folder so a config
/// added later is covered (`config/rocketmq/` holds the broker's own files, not daemon configs).
pub fn shipped_configs() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join("config"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    assert!(
        files.iter().any(|p| p.ends_with("rocketmq.toml")) && files.len() >= 5,
        "{files:?}"
    );
    files
}

/// The `timeoutd` binary: `$TIMEOUTD_BIN`, or next to this test binary's `deps/` directory.
pub fn timeoutd_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TIMEOUTD_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().unwrap().parent().unwrap().join("timeoutd");
    assert!(
        bin.is_file(),
        "{} is missing: build it first with `cargo build --bin timeoutd` (scripts/test does)",
        bin.display()
    );
    bin
}

/// Polls `check` every 100 ms until it holds; panics naming `what` once `limit` has passed.
pub async fn eventually<F, Fut>(limit: std::time::Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if check().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("after {limit:?}: {what}");
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `timeoutd run --config file` with `envs`, its stderr in `log`, once it logged that it
/// started (within 60 s); killed when dropped.
pub async fn started_daemon(
    file: &std::path::Path,
    envs: &[(&str, &str)],
    log: &std::path::Path,
) -> tokio::process::Child {
    started_daemon_with(&[], file, envs, log).await
}

/// [`started_daemon`] with `flags` before `run` (`--log-format json`).
pub async fn started_daemon_with(
    flags: &[&str],
    file: &std::path::Path,
    envs: &[(&str, &str)],
    log: &std::path::Path,
) -> tokio::process::Child {
    let daemon = tokio::process::Command::new(timeoutd_bin())
        .args(flags)
        .args(["run", "--config"])
        .arg(file)
        .envs(envs.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    crate::support::eventually(
        std::time::Duration::from_secs(60),
        "the daemon starts",
        || async {
            std::fs::read_to_string(log)
                .unwrap_or_default()
                .contains("timeoutd started")
        },
    )
    .await;
    daemon
}

/// Sends SIGTERM to `daemon` and waits at most `limit` for it to exit.
pub async fn sigterm(
    daemon: &mut tokio::process::Child,
    limit: std::time::Duration,
) -> std::process::ExitStatus {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &daemon.id().unwrap().to_string()])
        .status();
    tokio::time::timeout(limit, daemon.wait())
        .await
        .expect("stopped after SIGTERM")
        .unwrap()
}

/// `timeoutd doctor --config file`: its exit code and its report (stdout).
pub async fn doctor(file: PathBuf) -> (Option<i32>, String) {
    let out = tokio::process::Command::new(timeoutd_bin())
        .args(["doctor", "--config"])
        .arg(&file)
        .output()
        .await
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Captures what `tracing` logs while its [`LogCapture::subscriber`] is the default (a thread's,
/// with `tracing::subscriber::with_default`), as the daemon's plain-text log would show it.
#[derive(Clone, Default)]
pub struct LogCapture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl LogCapture {
    /// A plain-text subscriber writing into this capture, every level.
    pub fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + use<> {
        let sink = self.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || sink.clone())
            .finish()
    }

    /// Everything captured so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for LogCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `command` to its end and returns its stdout; panics with its exit status, stdout and
/// stderr when it fails.
pub async fn stdout_of_success(command: &mut tokio::process::Command) -> String {
    let out = command.output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "exit {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The value of the sample `series` (name and labels exactly as exported, e.g.
/// `timeoutd_decisions_total{merchant="m",decision="cancel"}`) in a Prometheus text page;
/// `None` when the page has no such sample.
pub fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}
