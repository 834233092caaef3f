//! The daemon's configuration file (TOML), its reference documentation and its validation.
//!
//! Loading is three steps, each reporting every problem it finds with its key path:
//! 1. `${VAR}` / `${VAR:-default}` interpolation from the environment ([`interpolate`]);
//! 2. parsing, with unknown keys refused (`deny_unknown_fields`) and durations written with
//!    units (`"500ms"`, `"30s"`, `"15m"`);
//! 3. semantic validation ([`validate`]): plugin files exist, numbers are in range, a URL names a
//!    supported backend.
//!
//! The doc comments on the fields below are the user reference; `config/timeoutd.toml` is the
//! annotated example and is tested to validate.

mod duration;
pub mod interpolate;
mod payment;
mod rocketmq;
pub mod routing;
mod validate;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use payment::{AlipayConfig, ProviderKind, Secret, SecretRef, StripeConfig, WechatpayConfig};
pub use rocketmq::{ConsumeFrom, DelayMode, RocketMqConfig};
pub use validate::ConfigProblems;

/// Exit status of every command given a configuration (or plugin input) that does not
/// validate (`EX_USAGE` of sysexits.h).
pub const EXIT_BAD_CONFIG: u8 = 64;

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where orders, the outbox and the ledger live.
    pub database: DatabaseConfig,
    /// The outbox timer (`order_timeout_msg`).
    #[serde(default)]
    pub outbox: OutboxConfig,
    /// The sweep of overdue pending orders, the backstop for lost triggers.
    #[serde(default)]
    pub sweep: SweepConfig,
    /// `[retention]`: how long settled rows are kept (on by default).
    #[serde(default)]
    pub retention: RetentionConfig,
    /// How triggers are dispatched to plugins.
    #[serde(default)]
    pub dispatch: DispatchConfig,
    /// The plugin sandbox.
    #[serde(default)]
    pub runtime: RuntimeConfig,
    /// The effect ledger executor (external effects: notices, Redis, payments).
    #[serde(default)]
    pub effects: EffectsConfig,
    /// `[caps]`: external effects a second per merchant, by kind and channel
    /// (`effects::caps`); none by default.
    #[serde(default)]
    pub caps: CapsConfig,
    /// Redis for the flash-sale effects; without it those effects wait in the ledger.
    #[serde(default)]
    pub redis: Option<RedisConfig>,
    /// The payment provider; without it `close-payment` effects wait in the ledger.
    #[serde(default)]
    pub payment: Option<PaymentConfig>,
    /// Notification channels by the name plugins use in `notice.channel`. `log` always exists.
    #[serde(default)]
    pub notify: NotifyConfig,
    /// The daemon's HTTP endpoint (payment callbacks); off when absent.
    #[serde(default)]
    pub http: Option<HttpConfig>,
    /// The admin API, metrics and probes; off when absent.
    #[serde(default)]
    pub admin: Option<AdminConfig>,
    /// Threshold alerts delivered to a webhook; off when absent.
    #[serde(default)]
    pub alerts: Option<AlertsConfig>,
    /// The RocketMQ transport; without it the outbox timer and the sweep do everything.
    #[serde(default)]
    pub rocketmq: Option<RocketMqConfig>,
    /// `[tracing]`: trace export over OTLP/HTTP (off without it).
    #[serde(default)]
    pub tracing: Option<TracingConfig>,
    /// Merchants by id: which plugin decides their orders and with which settings.
    pub merchants: BTreeMap<String, MerchantConfig>,
    /// Directory the file was read from; relative plugin paths resolve against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// `[database]`: one database (`url`), or a list of shards (`[[database.shards]]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    /// `sqlite://PATH` (created if missing), `mysql://USER[:PASS]@HOST:PORT/DB` (MySQL 8 or
    /// MariaDB 10.6+, for `SKIP LOCKED`) or `postgres://USER[:PASS]@HOST:PORT/DB`. Leave it out
    /// when `shards` are listed.
    #[serde(default)]
    pub url: String,
    /// Pool size ([`DatabaseConfig::pool_size`]: left out, 8 on a server, 4 on SQLite).
    /// Sharded: per shard for the HTTP endpoint and the shard's lease, and as much again for
    /// each shard this process works. (SQLite has one writer at a time whatever the pool size;
    /// extra connections serve reads.)
    #[serde(default)]
    pub max_connections: Option<u32>,
    /// Apply the schema migrations at start-up (to every shard when sharded).
    #[serde(default = "defaults::yes")]
    pub migrate: bool,
    /// Put before the name of each of timeoutd's own tables and indexes (`""`, the default:
    /// none), so they can share a database with a shop's tables: `"timeoutd_"` makes
    /// `timeoutd_order_timeout_msg`, `timeoutd_effect_ledger`, … (and `timeoutd_orders` for the
    /// canonical order tables). Lowercase letters, digits and `_`, starting with a letter, at
    /// most 24 characters. One per process and the same on every shard; changing it on a
    /// database already migrated starts a new, empty set of tables ([`crate::db::names`]).
    #[serde(default)]
    pub table_prefix: String,
    /// How the server connections behind `url` (and every shard's) are shared, in PgBouncer's
    /// terms: `"session"` (default: a direct connection, or a pooler in session mode) or
    /// `"transaction"` (PgBouncer `pool_mode = transaction`, and any pooler that gives a client
    /// a server connection one transaction at a time). PostgreSQL only. With `"transaction"`
    /// every statement is prepared unnamed and runs inside a transaction, because a named
    /// statement prepared on one server connection is missing, or another client's, on the
    /// next; migrations go through `migrate_url`. Three more round trips per statement run
    /// outside a transaction, one more inside one. Start-up and `timeoutd doctor` refuse a `"session"` URL that turns
    /// out to be shared, naming this key.
    #[serde(default)]
    pub pool_mode: crate::db::PoolMode,
    /// A direct (or session-mode pooled) URL of the same database, used for what needs a
    /// session of its own: the migrations (sqlx's migrator holds a session-level advisory lock
    /// across them). Required when `pool_mode = "transaction"` and `migrate = true`; left out,
    /// migrations run through `url`. Sharded: each shard's `migrate_url`.
    #[serde(default)]
    pub migrate_url: Option<String>,
    /// Application-level sharding, as ShardingSphere-JDBC users and the seeds' order service
    /// split an order database: each shard is a database of its own holding its orders, their
    /// stock and coupons, and timeoutd's tables, so a close stays one local transaction. Each
    /// shard gets its own outbox timer, sweep, retention and ledger executor, run by whichever
    /// daemon holds the shard's lease (`shard_lease`, a row of the shard's own
    /// `maintenance_lease`); the HTTP endpoint routes an order to its shard by `routing`. The
    /// list's order is the shard index the routing rule gives (`ds_0` first).
    #[serde(default)]
    pub shards: Vec<ShardConfig>,
    /// How an order id names its shard (with `shards`): `hash_mod` (default) or `mod`.
    #[serde(default)]
    pub routing: Routing,
    /// How long a daemon's hold on a shard lasts unrenewed (renewed every third of it). A daemon
    /// that dies frees its shards after this; another daemon takes them over.
    #[serde(default = "defaults::shard_lease", with = "duration")]
    pub shard_lease: Duration,
    /// A statement slower than this counts as slow (default 1s): each is recorded in the
    /// histogram `timeoutd_slow_statement_seconds{statement}`, and the log gets one summary line
    /// every 10 s at most (how many, the slowest) instead of a line per statement
    /// ([`crate::db::slowlog`]).
    #[serde(default = "defaults::slow_statement", with = "duration")]
    pub slow_statement: Duration,
    /// `[database.shop]`: the orders live in a shop's own tables (its order service keeps
    /// writing them), read and closed through a schema profile (docs/adoption.md). Left out,
    /// timeoutd's own tables (`orders`, `order_items`, `sku_stock`, `coupons`). MariaDB/MySQL or
    /// PostgreSQL; with `shards`, each shard's part of the shop's tables is in its
    /// `shop_database`.
    #[serde(default)]
    pub shop: Option<ShopConfig>,
}

/// `[database.shop]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShopConfig {
    /// The schema profile file (relative to this file): `profiles/mall.toml`.
    pub profile: PathBuf,
    /// The database (MySQL: on the same server as `database.url`) or schema (PostgreSQL: in
    /// the database `url` names) holding the shop's tables, when timeoutd's own tables live
    /// apart from them (recommended: timeoutd's migrations then never run beside the shop's
    /// tables). Left out, the shop's tables are in the database `url` names (on PostgreSQL,
    /// its current schema).
    #[serde(default)]
    pub database: Option<String>,
}

/// Pool size on a database server when `max_connections` is left out.
pub const SERVER_POOL: u32 = 8;

/// Pool size on SQLite when `max_connections` is left out. SQLite takes one writer at a time
/// and each connection keeps its own page cache (16 MiB at most), so past 4 connections the
/// drain got no faster (`timeoutd bench`, 10,000 orders: 42,000–50,000 closes/s with 4 and 8)
/// while the daemon's peak RSS rose (113–140 MiB with 4, 130–172 MiB with 8).
pub const SQLITE_POOL: u32 = 4;

impl DatabaseConfig {
    /// The pool size for the database at `url` (this config's `url` or a shard's):
    /// `max_connections` when set, else [`SQLITE_POOL`] for a `sqlite:` URL and [`SERVER_POOL`]
    /// for a server.
    pub fn pool_size(&self, url: &str) -> u32 {
        let sqlite = matches!(
            crate::db::Backend::of_url(url),
            Ok(crate::db::Backend::Sqlite)
        );
        self.max_connections
            .unwrap_or(if sqlite { SQLITE_POOL } else { SERVER_POOL })
    }
}

/// `[[database.shards]]`: one shard of a sharded order database.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardConfig {
    /// The shard's name in logs, metrics and errors (`ds_0`, as ShardingSphere names data
    /// sources).
    pub name: String,
    /// The shard's database, as `database.url`.
    pub url: String,
    /// The shard's direct URL for migrations, as `database.migrate_url` (required when
    /// `database.pool_mode = "transaction"` and `database.migrate = true`).
    #[serde(default)]
    pub migrate_url: Option<String>,
    /// With `[database.shop]`: the database (on the shard's server) holding this shard's part
    /// of the shop's tables; left out, `database.shop.database`.
    #[serde(default)]
    pub shop_database: Option<String>,
}

/// `database.routing`: the rule that maps an order id to a shard index in `0..N` (N shards),
/// the same rule the order service shards by, so both put an order in one place.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Routing {
    /// ShardingSphere's `HASH_MOD` on a string sharding value: `abs(id.hashCode()) % N`, with
    /// Java's `String.hashCode` (UTF-16 units, `h = 31·h + c` in 32-bit wrapping arithmetic,
    /// widened to a long before `abs`). Any id. An order service sharding a `BIGINT` column
    /// with `HASH_MOD` hashes a `Long` (`Long.hashCode`), not its decimal text: use `mod` for
    /// integer ids sharded by value.
    #[default]
    HashMod,
    /// ShardingSphere's `MOD` (and the seeds' `ds_${order_id % N}` inline rule): the id read as
    /// a decimal integer, `id % N`. Ids that are not integers are refused (HTTP 400).
    Mod,
}

/// `[outbox]`: claims due `order_timeout_msg` rows under a lease.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxConfig {
    /// Run the outbox timer.
    #[serde(default = "defaults::yes")]
    pub enabled: bool,
    /// Rows claimed per round.
    #[serde(default = "defaults::outbox_batch")]
    pub batch: u32,
    /// How long a claim is held; a daemon that dies mid-batch frees its rows after this.
    #[serde(default = "defaults::lease", with = "duration")]
    pub lease: Duration,
    /// Longest sleep between looks at the table. The timer sleeps until the next due row (or
    /// until this process writes one); this bounds how late a row inserted by another program
    /// with an earlier due time is seen.
    #[serde(default = "defaults::idle_recheck", with = "duration")]
    pub idle_recheck: Duration,
    /// Groups of triggers handled at once (each group on its own connection).
    #[serde(default = "defaults::concurrency")]
    pub concurrency: u32,
    /// Group commit: at most this many claimed rows are decided together and their closes
    /// committed in one transaction (one compare-and-set per order, one statement per table
    /// for the group). 1 turns grouping off: one transaction per close. A group whose
    /// transaction fails is split and each order tried alone, so one bad order never holds the
    /// others back.
    #[serde(default = "defaults::group_commit")]
    pub group_commit: u32,
    /// Prefetch: rows due within this much of now are claimed and their orders loaded ahead of
    /// time, then held in memory and decided the moment they fall due, so a burst sharing one
    /// deadline starts closing at the deadline instead of claiming and loading first
    /// ([`crate::sources::prefetch`]); their lease is renewed while they wait. `0s` turns it
    /// off.
    #[serde(default = "defaults::prefetch", with = "duration")]
    pub prefetch: Duration,
    /// At most this many prefetched rows (and their orders) are held in memory at once; beyond
    /// it, rows are claimed when due, as without prefetch (`0` holds none: prefetch off).
    #[serde(default = "defaults::prefetch_max")]
    pub prefetch_max: u32,
}

/// `[sweep]`: re-arms PENDING orders past deadline + grace that have no live trigger.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepConfig {
    /// Run the sweep.
    #[serde(default = "defaults::yes")]
    pub enabled: bool,
    /// Time between sweeps.
    #[serde(default = "defaults::sweep_interval", with = "duration")]
    pub interval: Duration,
    /// How overdue an order must be (past its deadline, or its pending trigger's due time) before
    /// the sweep takes it over from the timers. A phase-0 row the order service wrote due later
    /// than `deadline + grace` (its clock runs ahead) does not hold the sweep back: the order's
    /// own deadline rules (rows timeoutd deferred itself keep their times).
    #[serde(default = "defaults::grace", with = "duration")]
    pub grace: Duration,
    /// Orders re-armed per sweep.
    #[serde(default = "defaults::sweep_batch")]
    pub batch: u32,
}

/// `[tracing]`: the daemon's spans exported to an OpenTelemetry collector over OTLP/HTTP
/// (protobuf), batched; a `traceparent` on an HTTP request or a RocketMQ message continues its
/// trace ([`crate::telemetry`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingConfig {
    /// The collector's traces URL, e.g. `http://127.0.0.1:4318/v1/traces`.
    pub otlp_endpoint: String,
    /// `service.name` of the spans (default `timeoutd`).
    #[serde(default = "defaults::service_name")]
    pub service_name: String,
}

/// `[retention]`: settled rows older than their table's age are deleted, in batches of `batch`
/// rows with `pause` between them, by one daemon at a time (a lease in `maintenance_lease`),
/// every `interval`. Never touched: anything unsettled (PENDING or SENT outbox rows, PENDING or
/// FAILED ledger rows, OPEN dead letters) and any row of an order still PENDING.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetentionConfig {
    /// Run retention (default true).
    #[serde(default = "defaults::yes")]
    pub enabled: bool,
    /// Time between passes (default 10m); the first pass runs a minute after start.
    #[serde(default = "defaults::retention_interval", with = "duration")]
    pub interval: Duration,
    /// Rows deleted per statement (default 1000).
    #[serde(default = "defaults::retention_batch")]
    pub batch: u32,
    /// Pause between two batches (default 20ms), so live work keeps the database.
    #[serde(default = "defaults::retention_pause", with = "duration")]
    pub pause: Duration,
    /// PROCESSED `order_timeout_msg` rows, by `processed_at_ms` (default 7d).
    #[serde(default = "defaults::seven_days", with = "duration")]
    pub outbox: Duration,
    /// `decision_log` rows, by `decided_at_ms` (default 30d).
    #[serde(default = "defaults::thirty_days", with = "duration")]
    pub decision_log: Duration,
    /// DONE `effect_ledger` rows, by `updated_at_ms` (default 7d, and never less than
    /// `redis.marker_ttl`: within the marker window a replay must still find its row).
    #[serde(default = "defaults::seven_days", with = "duration")]
    pub ledger: Duration,
    /// `admin_audit` rows, by `at_ms` (default 90d).
    #[serde(default = "defaults::ninety_days", with = "duration")]
    pub audit: Duration,
    /// REDRIVEN or DISMISSED `dead_letter` rows, by `created_at_ms` (default 30d).
    #[serde(default = "defaults::thirty_days", with = "duration")]
    pub dead_letters: Duration,
    /// `payment_leases` rows (the payment attempts on a schema profile's orders), by when the
    /// lease lapsed, `until_ms` (default 1d): a lapsed lease holds nothing.
    #[serde(default = "defaults::one_day", with = "duration")]
    pub payment_leases: Duration,
}

/// `[dispatch]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DispatchConfig {
    /// Attempts of one trigger (plugin errors, database errors) before it is dead-lettered.
    #[serde(default = "defaults::max_attempts")]
    pub max_attempts: u32,
    /// Delay before the first retry; doubles per attempt up to `retry_max`.
    #[serde(default = "defaults::retry_initial", with = "duration")]
    pub retry_initial: Duration,
    /// Longest delay between retries.
    #[serde(default = "defaults::retry_max", with = "duration")]
    pub retry_max: Duration,
    /// The longest plausible payment window (`deadline_ms − created_at_ms`, default 30d). An
    /// order whose deadline lies before its creation or further from it than this — a deadline
    /// written in seconds, say — is quarantined: dead-lettered naming the field and its value,
    /// never closed, its stock untouched.
    #[serde(default = "defaults::max_window", with = "duration")]
    pub max_window: Duration,
    /// How long a trigger of a paused merchant or order is held before it is looked at again
    /// (default 5m). Resuming wakes the held triggers at once (`db::pauses::resume`); this is
    /// the bound for one it missed, e.g. a pause ended by deleting its `pauses` row by hand.
    #[serde(default = "defaults::pause_recheck", with = "duration")]
    pub pause_recheck: Duration,
    /// `[dispatch.stock]`: how a close gives stock units back.
    #[serde(default)]
    pub stock: StockConfig,
}

/// `[dispatch.stock]`: how a close gives the units of its `restore-stock` effects back to
/// `sku_stock` (docs/operators.md, "A flash sale: the stock journal").
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StockConfig {
    /// `"direct"` (default) or `"journal"`.
    #[serde(default)]
    pub mode: StockMode,
    /// `"journal"`: time between two folds of the journal into `sku_stock` (default 50ms). The
    /// longest a unit given back stays out of `available` is about this plus one fold.
    #[serde(default = "defaults::stock_fold_interval", with = "duration")]
    pub fold_interval: Duration,
    /// `"journal"`: journal rows one fold transaction takes at most (default 2000); a fold
    /// that takes this many runs again at once.
    #[serde(default = "defaults::stock_fold_batch")]
    pub fold_batch: u32,
}

/// Where a close writes the units it gives back.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum StockMode {
    /// `UPDATE sku_stock SET available = available + ?` in the close transaction, one statement
    /// per SKU: a reader sees the units back at the close's commit. Every close of a SKU takes
    /// its row lock, so closes of one hot SKU commit one after another.
    #[default]
    Direct,
    /// A row per SKU appended to `stock_journal` in the close transaction, added to `sku_stock`
    /// by a fold every `fold_interval` ([`crate::db::stock_journal`]). No close waits for a
    /// stock row lock; a reader of `sku_stock.available` sees the units back at the fold's
    /// commit, never before the close's (an under-count in between, never an over-count).
    /// timeoutd's own tables only: a schema profile's lock release is checked per close.
    Journal,
}

/// `[runtime]`: limits of every plugin call.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Wall time one decision may take before the plugin is trapped.
    #[serde(default = "defaults::plugin_deadline", with = "duration")]
    pub deadline: Duration,
    /// Largest memory a plugin may use, MiB.
    #[serde(default = "defaults::max_memory_mib")]
    pub max_memory_mib: u32,
    /// Failed decisions in a row (traps, plugin errors, oversized answers) that trip a
    /// merchant's plugin: its triggers then wait `trip_for` instead of being retried.
    #[serde(default = "defaults::trip_after")]
    pub trip_after: u32,
    /// How long a tripped plugin is left alone.
    #[serde(default = "defaults::trip_for", with = "duration")]
    pub trip_for: Duration,
    /// How often plugin files are checked for a new version (hot reload); `0s` turns it off.
    #[serde(default = "defaults::watch_plugins", with = "duration")]
    pub watch_plugins: Duration,
    /// Idle warm instances kept for heavy plugins (JavaScript, Python: components of 2 MiB or
    /// more), across all merchants; the least recently used is dropped first. `0` gives every
    /// call a fresh instance.
    #[serde(default = "defaults::warm_instances")]
    pub warm_instances: u32,
    /// Components of at least this many KiB run on warm instances (default 2048: JavaScript
    /// and Python components, which carry a language runtime); smaller ones get a fresh
    /// instance per call. A warm instance serves one merchant only.
    #[serde(default = "defaults::warm_min_component_kib")]
    pub warm_min_component_kib: u32,
    /// Calls one warm instance serves before a fresh one replaces it (an instance is also
    /// dropped after any failed call).
    #[serde(default = "defaults::warm_max_calls")]
    pub warm_max_calls: u32,
    /// Directory for precompiled plugins, created if missing (a relative path is relative to the
    /// working directory, like a SQLite path); without it every start compiles every plugin.
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
}

/// `[caps]`: how many external effects a second each merchant may send, by kind and channel
/// (`crate::effects::caps`: the generic cell rate algorithm, bursts of up to the rate).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapsConfig {
    /// Where the caps' state lives: `process` (default; each daemon its own, and each shard's
    /// worker of a sharded daemon its own) or `redis` (one budget per merchant and cap shared
    /// by every daemon and shard on `[redis]`, for a receiver's cap).
    #[serde(default)]
    pub store: CapStore,
    /// Every merchant's caps unless its own `[merchants.<m>.caps]` says otherwise: cap name
    /// (`notify`, `notify.<channel>`, `redis`, `payment`) → effects a second (at least 1).
    /// `payment` defaults to `payment.max_calls_per_second`.
    #[serde(default)]
    pub per_second: BTreeMap<String, u32>,
}

/// Where the caps' state lives (`caps.store`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CapStore {
    /// In each daemon's memory.
    #[default]
    Process,
    /// In Redis (`[redis]`), shared by every daemon.
    Redis,
}

/// `[effects]`: retries of external effects.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EffectsConfig {
    /// Attempts of an effect that keeps failing transiently before it is marked FAILED.
    #[serde(default = "defaults::effect_attempts")]
    pub max_attempts: u32,
    /// Delay after the first failure; doubles up to `retry_max`.
    #[serde(default = "defaults::retry_initial", with = "duration")]
    pub retry_initial: Duration,
    /// Longest delay between attempts.
    #[serde(default = "defaults::retry_max", with = "duration")]
    pub retry_max: Duration,
    /// How long an executor holds an effect it is carrying out.
    #[serde(default = "defaults::lease", with = "duration")]
    pub lease: Duration,
    /// Effects the executor carries out at once (webhooks, Redis, payment calls in flight):
    /// its slots, one order's rows to a slot, shared among merchants by weight
    /// (`merchants.<id>.weight`, `effects::fair`).
    #[serde(default = "defaults::concurrency")]
    pub concurrency: u32,
    /// The most slots one merchant holds at once (default: three quarters of `concurrency`,
    /// rounded up), so a merchant whose webhook hangs or whose provider answers 503 leaves
    /// slots for the others' effects that arrive meanwhile. At most `concurrency`.
    #[serde(default)]
    pub merchant_slots: Option<u32>,
}

impl EffectsConfig {
    /// `merchant_slots`, or its default: ⌈¾ · concurrency⌉ (at least 1).
    pub fn merchant_slots(&self) -> u32 {
        self.merchant_slots
            .unwrap_or((self.concurrency * 3).div_ceil(4))
            .clamp(1, self.concurrency.max(1))
    }
}

/// `[redis]`: where flash-sale stock and buyer sets live.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// A single Redis, `redis://HOST:PORT[/DB]`.
    #[serde(default)]
    pub url: Option<String>,
    /// Seed nodes of a Redis Cluster (instead of `url`), each `redis://HOST:PORT`.
    #[serde(default)]
    pub cluster: Vec<String>,
    /// Lifetime of an effect's idempotency marker; must outlast any replay of the effect.
    #[serde(default = "defaults::marker_ttl", with = "duration")]
    pub marker_ttl: Duration,
}

/// `[payment]`: the payment provider — its status query, close-payment and refunds — and the
/// rules for asking it. Which adapter speaks to it is `provider` (per merchant:
/// `merchants.<id>.payment_provider`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaymentConfig {
    /// The adapter of merchants that do not name their own `payment_provider`: `rest`
    /// (default: timeoutd's REST shape at `base_url`), `stripe` (`[payment.stripe]`), `alipay`
    /// (`[payment.alipay]`) or `wechatpay` (`[payment.wechatpay]`).
    #[serde(default)]
    pub provider: ProviderKind,
    /// `rest`: base URL, e.g. `https://pay.example.com` (needed when any merchant uses `rest`).
    #[serde(default)]
    pub base_url: String,
    /// Value of the `Authorization` header, e.g. `Bearer ${PAY_TOKEN}`.
    #[serde(default)]
    pub authorization: Option<String>,
    /// Header carrying the effect's idempotency key.
    #[serde(default = "defaults::idempotency_header")]
    pub idempotency_header: String,
    /// Timeout of one request.
    #[serde(default = "defaults::http_timeout", with = "duration")]
    pub timeout: Duration,
    /// Quick attempts within one execution before the ledger reschedules the effect.
    #[serde(default = "defaults::http_attempts")]
    pub attempts: u32,
    /// Ask the provider for the payment's state before deciding an order with a payment
    /// reference at or after its deadline (default true): one found paid is aligned to PAID,
    /// never closed (seed 002).
    #[serde(default = "defaults::yes")]
    pub query_before_close: bool,
    /// What to do when that query cannot be answered (provider down): `wait` (the trigger is
    /// retried with `[dispatch]` backoff, up to `unknown_max_wait` past the deadline, then the
    /// order is decided as unknown) or `close` (decide at once, payment unknown).
    #[serde(default)]
    pub on_unknown: OnPaymentUnknown,
    /// The longest `on_unknown = "wait"` holds an order past its deadline (default 5m).
    #[serde(default = "defaults::unknown_max_wait", with = "duration")]
    pub unknown_max_wait: Duration,
    /// Channel of the forward notice (template `order-paid`) sent when an order is found paid
    /// at the provider, so fulfilment does not depend on the provider's own notification.
    #[serde(default = "defaults::log_channel")]
    pub paid_channel: String,
    /// Status queries per second per merchant at most (default 50): a flash sale's burst of
    /// closes or polls must not hammer the provider. A query over the cap is not made; the
    /// order is decided with the payment unknown (a close then learns "already paid" from
    /// close-payment, F13) and `timeoutd_payment_unknown_total{outcome="capped"}` counts it.
    #[serde(default = "defaults::max_queries_per_second")]
    pub max_queries_per_second: u32,
    /// Close-payment and refund requests per second per merchant at most (default 50, bursts
    /// of as many): a flash sale's 10,000 closes reach the provider at this rate, in ledger
    /// order. A request over the cap is not failed: its ledger row is deferred, without
    /// counting an attempt, to the slot it booked (`last_error` says so,
    /// `timeoutd_effects_total{outcome="deferred"}` and
    /// `timeoutd_effects_capped_total{cap="payment"}` count it). It is the `payment` cap of
    /// `[caps]` (which may set it per merchant): kept in each daemon (each shard's worker) with
    /// `caps.store = "process"`, shared by every daemon with `"redis"`. The provider sees at
    /// most `max_queries_per_second` (each daemon) plus this many requests a second per
    /// merchant.
    #[serde(default = "defaults::max_calls_per_second")]
    pub max_calls_per_second: u32,
    /// `[payment.stripe]`: Stripe's API key, webhook secret and endpoint.
    #[serde(default)]
    pub stripe: Option<StripeConfig>,
    /// `[payment.alipay]`: Alipay's gateway, the app's id and the two RSA keys.
    #[serde(default)]
    pub alipay: Option<AlipayConfig>,
    /// `[payment.wechatpay]`: WeChat Pay API v3, the merchant's id, its key and certificate
    /// serial, the platform's public key and the APIv3 key.
    #[serde(default)]
    pub wechatpay: Option<WechatpayConfig>,
}

/// `payment.on_unknown`: when the provider cannot say whether an order was paid.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnPaymentUnknown {
    /// Retry the trigger with backoff, at most `payment.unknown_max_wait` past the deadline.
    #[default]
    Wait,
    /// Decide at once; the plugin sees the payment as unknown.
    Close,
}

/// `[notify]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyConfig {
    /// `[notify.channels.<name>]`: the sink behind each channel name.
    #[serde(default)]
    pub channels: BTreeMap<String, ChannelConfig>,
}

/// One notification channel.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "kebab-case")]
pub enum ChannelConfig {
    /// One structured log line per notice (target `timeoutd::notice`).
    Log,
    /// `POST url` with the notice as JSON and its idempotency key in `Idempotency-Key`.
    Webhook {
        /// Endpoint.
        url: String,
        /// Value of the `Authorization` header.
        #[serde(default)]
        authorization: Option<String>,
        /// Timeout of one request.
        #[serde(default = "defaults::http_timeout", with = "duration")]
        timeout: Duration,
    },
    /// One message per notice on `rocketmq.notification_topic`, keyed by its idempotency key
    /// (tag = the notice's template); needs `[rocketmq]`.
    Rocketmq,
}

/// `[http]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Address to listen on, e.g. `127.0.0.1:8080`.
    pub listen: std::net::SocketAddr,
    /// Bearer token payment callbacks (and payment attempts) must carry; none means no check
    /// (loopback only!).
    #[serde(default)]
    pub callback_token: Option<String>,
    /// How long a payment attempt (`POST /v1/orders/{id}/payment-attempts`) holds its order
    /// against the close (default 2m).
    #[serde(default = "defaults::payment_lease", with = "duration")]
    pub payment_lease: Duration,
}

/// `[admin]`: the operators' API (`/v1/…`, bearer tokens, every call audited), Prometheus
/// metrics (`/metrics`) and probes (`/healthz`, `/readyz`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Address to listen on, e.g. `127.0.0.1:9090` (port 0 picks a free one).
    pub listen: std::net::SocketAddr,
    /// Bearer tokens by the name audited for them, e.g. `ops = "${TIMEOUTD_ADMIN_TOKEN:-}"`
    /// (at least 16 characters). A token left empty — an unset variable with an empty
    /// fallback — is ignored.
    #[serde(default)]
    pub tokens: BTreeMap<String, String>,
    /// Where the console's token lives when no token is given: read from this file, or
    /// generated into it (32 hex characters, mode 0600) when it is missing; the daemon logs the
    /// path at start. The token is audited as `console`.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// An open order counts as overdue (gauge, list) once this far past its deadline.
    #[serde(default = "defaults::overdue_margin", with = "duration")]
    pub overdue_margin: Duration,
    /// How often the backlog gauges are sampled.
    #[serde(default = "defaults::sample_interval", with = "duration")]
    pub sample_interval: Duration,
}

/// `[alerts]`: threshold rules over the backlog sample, delivered to a webhook as one `firing`
/// notice when a rule has held for its `for`, and one `resolved` notice when it stops holding —
/// no repeats in between.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertsConfig {
    /// Receives `POST` JSON `{"status":"firing"|"resolved","rule","signal","value","threshold",
    /// "text"}` (`text` is what chat webhooks display).
    pub webhook: String,
    /// Value of the `Authorization` header.
    #[serde(default)]
    pub authorization: Option<String>,
    /// How often rules are evaluated (the backlog is sampled at least this often).
    #[serde(default = "defaults::alert_interval", with = "duration")]
    pub interval: Duration,
    /// How long one notice may take, connecting, sending and reading the answer (default
    /// 5s). A receiver slower than that is given up on and the notice sent again at the next
    /// evaluation; it never holds up sampling, the gauges or shutdown.
    #[serde(default = "defaults::alert_timeout", with = "duration")]
    pub timeout: Duration,
    /// An open order counts as overdue once this far past its deadline (when `[admin]` does
    /// not say).
    #[serde(default = "defaults::overdue_margin", with = "duration")]
    pub overdue_margin: Duration,
    /// `[[alerts.rules]]`.
    #[serde(default)]
    pub rules: Vec<AlertRule>,
}

/// One threshold rule: fires when `signal > above` has held for `for`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlertRule {
    /// Name, unique, shown in notices.
    pub name: String,
    /// What is measured.
    pub signal: AlertSignal,
    /// Threshold (the rule holds when the value is greater).
    pub above: f64,
    /// How long it must hold before firing (default 0s: at once).
    #[serde(default, rename = "for", with = "duration::option")]
    pub for_: Option<Duration>,
}

/// Signals a rule can watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertSignal {
    /// Overdue-but-open orders, all merchants.
    OverdueOpenOrders,
    /// Open dead letters.
    DeadLettersOpen,
    /// Age of the oldest PENDING ledger effect, seconds.
    LedgerOldestPendingSeconds,
    /// How overdue the oldest due outbox row is, seconds.
    OutboxOldestDueSeconds,
    /// Sweeps failed in a row.
    SweepConsecutiveFailures,
    /// Merchants whose plugin is tripped.
    PluginsTripped,
}

/// What to do when a closed order's payment turns out to have succeeded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PaidAfterClose {
    /// Ask the provider to refund it (through the ledger, once).
    #[default]
    Refund,
    /// Record it for an operator to decide.
    ManualReview,
}

impl PaidAfterClose {
    /// `refund` or `manual-review`, as stored in `paid_after_close.resolution`.
    pub fn as_str(self) -> &'static str {
        match self {
            PaidAfterClose::Refund => crate::db::payments::REFUND,
            PaidAfterClose::ManualReview => "manual-review",
        }
    }
}

/// What to do with a trigger when the merchant's plugin fails (a trap, its own `policy-error`,
/// an oversized answer or a host problem).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnPluginError {
    /// Retry with `[dispatch]` backoff, then dead-letter when attempts run out.
    #[default]
    Retry,
    /// Decide with the built-in close-at-deadline policy instead: at or after the deadline,
    /// cancel releasing everything the order holds (stock, coupon, flash-sale units and slot,
    /// payment); before it, wait until it. Its effects pass the same guard.
    Fallback,
    /// Dead-letter the trigger at once, for an operator.
    #[serde(alias = "dead-letter")]
    DeadLetter,
}

/// `[merchants.<id>]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MerchantConfig {
    /// The policy component: a path to a `.wasm` component (relative to this file), or
    /// `builtin:single-phase` / `builtin:two-phase` for the example plugins compiled into the
    /// binary.
    pub plugin: String,
    /// The merchant's payment window, used by `timeoutd demo` when it creates orders (an order
    /// service sets `orders.deadline_ms` itself).
    #[serde(default, with = "duration::option")]
    pub payment_window: Option<Duration>,
    /// Key/value settings handed to the plugin in every context, e.g. `grace = "5m"`.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
    /// Redis key of a flash-sale activity's stock counter; `<activity>` is replaced by the
    /// activity id. The braces make a Redis Cluster hash tag: one activity, one slot.
    #[serde(default = "defaults::flash_stock_key")]
    pub flash_stock_key: String,
    /// Redis key of the set of an activity's buyers.
    #[serde(default = "defaults::flash_users_key")]
    pub flash_users_key: String,
    /// A payment that succeeded after the close: `refund` (default) or `manual-review`.
    #[serde(default)]
    pub on_paid_after_close: PaidAfterClose,
    /// The adapter that speaks to this merchant's payment provider, when it differs from
    /// `payment.provider`: `rest`, `stripe`, `alipay` or `wechatpay`.
    #[serde(default)]
    pub payment_provider: Option<ProviderKind>,
    /// When the plugin fails: `retry` (default: backoff, then dead-letter), `fallback` (the
    /// built-in close-at-deadline policy) or `dead_letter` (at once).
    #[serde(default)]
    pub on_plugin_error: OnPluginError,
    /// Effect kinds this merchant's plugin may ask for (`restore-stock`, `restore-flash-stock`,
    /// `release-flash-slot`, `release-coupon`, `close-payment`, `notify`; a reminder counts as
    /// `notify`). Default: all. A decision with an effect of another kind is refused like one
    /// exceeding the order.
    #[serde(default)]
    pub granted_effects: Option<Vec<String>>,
    /// Wall time one call of this merchant's plugin may take, when it differs from
    /// `runtime.deadline` (at most 10s). A JavaScript or Python plugin carries its language
    /// runtime and needs more than a Rust one: give it e.g. `"250ms"`.
    #[serde(default, with = "duration::option")]
    pub plugin_deadline: Option<Duration>,
    /// Memory cap of this merchant's plugin, MiB, when it differs from `runtime.max_memory_mib`
    /// (1–4096). The example JavaScript and Python plugins start at 9–13 MiB; 64 MiB suffices.
    #[serde(default)]
    pub plugin_max_memory_mib: Option<u32>,
    /// This merchant's caps over `caps.per_second`: cap name → effects a second.
    #[serde(default)]
    pub caps: BTreeMap<String, u32>,
    /// This merchant's weight (1–1000, default 1) when several merchants' effects wait for the
    /// effect executor's slots: each waiting merchant is given slots in proportion to its
    /// weight (`effects::fair`). A merchant alone uses them all, up to
    /// `effects.merchant_slots`.
    #[serde(default = "defaults::weight")]
    pub weight: u32,
    /// A candidate policy asked beside this one and never acting (`[merchants.<id>.shadow]`,
    /// [`crate::shadow`]): on a sampled share of triggers it decides on exactly the live
    /// plugin's input, off the close's path, and the two answers are compared and recorded.
    #[serde(default)]
    pub shadow: Option<ShadowConfig>,
}

/// `[merchants.<id>.shadow]`: the candidate plugin a merchant tries in the shadow.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowConfig {
    /// The candidate component: a path (relative to this file) or `builtin:<name>`, as
    /// `merchants.<id>.plugin`. Loaded with the merchant's limits (`plugin_deadline`,
    /// `plugin_max_memory_mib`) and reviewed with its `granted_effects`.
    pub plugin: String,
    /// The candidate's settings; left out, the live plugin's (`[merchants.<id>.settings]`).
    #[serde(default)]
    pub settings: Option<BTreeMap<String, String>>,
    /// The share of triggers the shadow is asked on, more than 0 and at most 1 (default 1:
    /// every trigger). Chosen by the order id's hash, so an order is shadowed on all its
    /// phases or none.
    #[serde(default = "defaults::one")]
    pub sample: f64,
}

/// The dotted key of the `key = value` line holding byte `offset` of `text`, under its
/// nearest `[table]` header (`sweep.interval`, `merchants.shop.payment_window`), so a value
/// the parser refuses is named by its key; `None` when the line is not such a line.
fn key_at(text: &str, offset: usize) -> Option<String> {
    let offset = offset.min(text.len());
    let line_start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[offset..].find('\n').map_or(text.len(), |i| offset + i);
    let (key, _) = text[line_start..line_end].split_once('=')?;
    let key = key.trim().trim_matches('"');
    if key.is_empty() || key.starts_with('[') || key.starts_with('#') {
        return None;
    }
    let table = text[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_string());
    Some(match table {
        Some(t) if !t.is_empty() => format!("{t}.{key}"),
        _ => key.to_string(),
    })
}

impl Config {
    /// Reads, interpolates, parses and validates the file at `path`.
    ///
    /// # Errors
    /// [`ConfigProblems`] listing every problem found, each with its key path.
    pub fn load(path: &Path) -> Result<Config, ConfigProblems> {
        let raw = std::fs::read_to_string(path).map_err(|e| {
            ConfigProblems::one(path.display().to_string(), format!("cannot read: {e}"))
        })?;
        let base = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        Self::from_toml(&raw, &base, &|k| std::env::var(k).ok())
    }

    /// Parses and validates TOML text, resolving `${VAR}` with `env` and relative paths against
    /// `base_dir`.
    ///
    /// # Errors
    /// [`ConfigProblems`] listing every problem found.
    pub fn from_toml(
        raw: &str,
        base_dir: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigProblems> {
        let text = interpolate::interpolate(raw, env)?;
        let mut config: Config = toml::from_str(&text).map_err(|e| {
            let at = e
                .span()
                .map(|s| {
                    let line = text[..s.start].matches('\n').count() + 1;
                    match key_at(&text, s.start) {
                        Some(key) => format!("{key} (line {line})"),
                        None => format!("line {line}"),
                    }
                })
                .unwrap_or_default();
            ConfigProblems::one(at, e.message().to_string())
        })?;
        config.base_dir = base_dir.to_path_buf();
        validate::validate(&config)?;
        Ok(config)
    }

    /// Whose tables hold the orders: the canonical ones, or the shop's through
    /// `[database.shop]`'s profile compiled for `database.url`'s backend.
    ///
    /// # Errors
    /// Every problem of the profile (file, keys, backend), each a sentence naming it.
    pub fn schema(&self) -> Result<crate::db::shop::Schema, Vec<String>> {
        use crate::db::shop::{Mapped, Profile, Schema};
        let Some(shop) = &self.database.shop else {
            return Ok(Schema::Canonical);
        };
        let profile = Profile::load(&self.base_dir.join(&shop.profile))?;
        let backend =
            crate::db::Backend::of_url(&self.database.url).map_err(|e| vec![e.to_string()])?;
        let mapped = Mapped::compile(profile, shop.database.as_deref(), backend)?;
        Ok(Schema::Mapped(std::sync::Arc::new(mapped)))
    }

    /// [`Config::schema`] for shard `s`: the profile compiled for its URL's backend, its tables
    /// in its `shop_database` (else `database.shop.database`).
    ///
    /// # Errors
    /// As [`Config::schema`].
    pub fn shard_schema(&self, s: &ShardConfig) -> Result<crate::db::shop::Schema, Vec<String>> {
        let mut one = self.clone();
        one.database.url = s.url.clone();
        one.database.shards = Vec::new();
        if let (Some(shop), Some(database)) = (one.database.shop.as_mut(), &s.shop_database) {
            shop.database = Some(database.clone());
        }
        one.schema()
    }

    /// Where a merchant's plugin comes from.
    pub fn plugin_source(&self, merchant: &MerchantConfig) -> PluginSource {
        self.source_of(&merchant.plugin)
    }

    /// Where a plugin named as in `merchants.<id>.plugin` comes from: `builtin:<name>`, or a
    /// path relative to this file.
    pub fn source_of(&self, plugin: &str) -> PluginSource {
        match plugin.strip_prefix("builtin:") {
            Some(name) => PluginSource::Builtin(name.to_string()),
            None => PluginSource::File(self.base_dir.join(plugin)),
        }
    }
}

/// Where a plugin's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PluginSource {
    /// One of the example plugins embedded in the binary.
    Builtin(String),
    /// A component file.
    File(PathBuf),
}

pub(crate) mod defaults {
    use std::time::Duration;

    pub fn one() -> f64 {
        1.0
    }

    pub fn yes() -> bool {
        true
    }
    pub fn outbox_batch() -> u32 {
        1024
    }
    pub fn lease() -> Duration {
        Duration::from_secs(30)
    }
    pub fn shard_lease() -> Duration {
        Duration::from_secs(5)
    }
    pub fn idle_recheck() -> Duration {
        Duration::from_millis(250)
    }
    pub fn concurrency() -> u32 {
        16
    }
    pub fn weight() -> u32 {
        1
    }
    pub fn group_commit() -> u32 {
        512
    }
    pub fn prefetch() -> Duration {
        Duration::from_secs(2)
    }
    pub fn prefetch_max() -> u32 {
        20_000
    }
    pub fn service_name() -> String {
        "timeoutd".into()
    }
    pub fn retention_interval() -> Duration {
        Duration::from_secs(600)
    }
    pub fn retention_batch() -> u32 {
        1000
    }
    pub fn retention_pause() -> Duration {
        Duration::from_millis(20)
    }
    pub fn one_day() -> Duration {
        Duration::from_secs(86_400)
    }
    pub fn seven_days() -> Duration {
        Duration::from_secs(7 * 86_400)
    }
    pub fn thirty_days() -> Duration {
        Duration::from_secs(30 * 86_400)
    }
    pub fn ninety_days() -> Duration {
        Duration::from_secs(90 * 86_400)
    }
    pub fn sweep_interval() -> Duration {
        Duration::from_secs(30)
    }
    pub fn grace() -> Duration {
        Duration::from_secs(10)
    }
    pub fn sweep_batch() -> u32 {
        500
    }
    pub fn max_attempts() -> u32 {
        timeoutd_runtime::retry::DISPATCH_MAX_ATTEMPTS
    }
    pub fn retry_initial() -> Duration {
        timeoutd_runtime::retry::DISPATCH_BACKOFF.initial
    }
    pub fn retry_max() -> Duration {
        timeoutd_runtime::retry::DISPATCH_BACKOFF.max
    }
    pub fn plugin_deadline() -> Duration {
        Duration::from_millis(50)
    }
    pub fn max_memory_mib() -> u32 {
        64
    }
    pub fn warm_instances() -> u32 {
        8
    }
    pub fn warm_min_component_kib() -> u32 {
        2048
    }
    pub fn warm_max_calls() -> u32 {
        1000
    }
    pub fn effect_attempts() -> u32 {
        12
    }
    pub fn marker_ttl() -> Duration {
        Duration::from_secs(7 * 24 * 3600)
    }
    pub fn idempotency_header() -> String {
        "Idempotency-Key".into()
    }
    pub fn http_timeout() -> Duration {
        Duration::from_secs(2)
    }
    pub fn http_attempts() -> u32 {
        3
    }
    pub fn max_queries_per_second() -> u32 {
        50
    }
    pub fn max_calls_per_second() -> u32 {
        50
    }
    pub fn max_window() -> Duration {
        Duration::from_secs(30 * 24 * 3600)
    }
    pub fn pause_recheck() -> Duration {
        Duration::from_secs(300)
    }
    pub fn stock_fold_interval() -> Duration {
        Duration::from_millis(50)
    }
    pub fn stock_fold_batch() -> u32 {
        2000
    }
    pub fn payment_lease() -> Duration {
        Duration::from_secs(120)
    }
    pub fn unknown_max_wait() -> Duration {
        Duration::from_secs(300)
    }
    pub fn log_channel() -> String {
        "log".to_string()
    }
    pub fn slow_statement() -> Duration {
        Duration::from_secs(1)
    }
    pub fn alert_timeout() -> Duration {
        Duration::from_secs(5)
    }
    pub fn overdue_margin() -> Duration {
        Duration::from_secs(60)
    }
    pub fn trip_after() -> u32 {
        5
    }
    pub fn trip_for() -> Duration {
        Duration::from_secs(30)
    }
    pub fn watch_plugins() -> Duration {
        Duration::from_secs(2)
    }
    pub fn alert_interval() -> Duration {
        Duration::from_secs(15)
    }
    pub fn sample_interval() -> Duration {
        Duration::from_secs(10)
    }
    pub fn flash_stock_key() -> String {
        "activity:{<activity>}:stock".into()
    }
    pub fn flash_users_key() -> String {
        "activity:{<activity>}:users".into()
    }
}

macro_rules! default_from_serde {
    ($($ty:ty),*) => {$(
        impl Default for $ty {
            fn default() -> Self {
                toml::from_str("").expect("every field has a default")
            }
        }
    )*};
}
default_from_serde!(
    OutboxConfig,
    SweepConfig,
    RetentionConfig,
    DispatchConfig,
    StockConfig,
    RuntimeConfig,
    EffectsConfig
);
