//! The database: connection, migrations, the dialect differences, and one module per table or
//! concern. Only this module and its children speak SQL: the rest of the crate calls their
//! typed functions and never names sqlx.
//!
//! All access goes through sqlx's `Any` driver with `?` placeholders; the few statements that
//! differ between SQLite and MySQL/MariaDB are chosen by [`Backend`]. Times are epoch
//! milliseconds (`BIGINT *_ms`).

pub mod audit;
pub mod backlog;
pub mod bench;
pub mod demo;
pub mod doctor;
pub mod engine;
pub mod fence;
pub mod fixtures;
pub mod journal;
pub mod ledger;
pub mod lock_order;
pub mod maintenance_lease;
pub mod migrate;
pub mod names;
pub use migrate::latest as latest_schema_version;
pub mod orders;
pub mod outbox;
pub mod pauses;
pub mod payments;
pub mod pooler;
pub mod relay;
pub mod replay;
pub mod retention;
pub mod shadow;
pub mod shop;
pub mod slowlog;
pub mod statements;
pub mod stock_journal;
pub mod views;

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use tokio::sync::{Mutex, OwnedMutexGuard};

use sqlx::any::{AnyArguments, AnyConnectOptions, AnyPoolOptions, AnyQueryResult, AnyRow};
use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyConnection, AnyPool, ConnectOptions, Either, Execute, Executor, Row};

/// Which SQL dialect a [`Db`] speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// SQLite (the embedded default): single writer, no `SKIP LOCKED`.
    Sqlite,
    /// MySQL 8 / MariaDB 10.6+.
    MySql,
    /// PostgreSQL 12+.
    Postgres,
}

impl Backend {
    /// The backend a URL names.
    ///
    /// # Errors
    /// A message naming the URL's scheme when it is not `sqlite:`, `mysql:` or `mariadb:`.
    pub fn of_url(url: &str) -> Result<Backend, DbError> {
        if url.is_empty() {
            return Err(DbError::Config(
                "no database URL: this command works on one database (database.url); a config \
                 with [[database.shards]] names several, so give it a config naming one shard"
                    .to_string(),
            ));
        }
        let scheme = url.split(':').next().unwrap_or_default();
        match scheme {
            "sqlite" => Ok(Backend::Sqlite),
            "mysql" | "mariadb" => Ok(Backend::MySql),
            "postgres" | "postgresql" => Ok(Backend::Postgres),
            other => Err(DbError::Config(format!(
                "unsupported database scheme `{other}:` (use sqlite:, mysql: or postgres:)"
            ))),
        }
    }

    /// The backend a connection speaks.
    pub fn of(conn: &AnyConnection) -> Backend {
        match conn.backend_name() {
            "PostgreSQL" => Backend::Postgres,
            "MySQL" => Backend::MySql,
            "SQLite" => Backend::Sqlite,
            // sqlx's default drivers (`install_default_drivers`, with this crate's features)
            // are exactly these three; a connection of another could only come from a driver
            // added to the build without a backend here.
            other => unreachable!(
                "a sqlx `{other}` connection: timeoutd speaks SQLite, MySQL and PostgreSQL only"
            ),
        }
    }

    /// A statement written with `?` markers (all of timeoutd's SQL is), its own tables' names
    /// given this process's table prefix ([`names::own`]), with the markers rewritten to `$1`,
    /// `$2`, … for PostgreSQL, whose protocol numbers them. On PostgreSQL the statement is
    /// prepared unnamed while any pool of this process is behind a transaction-mode pooler
    /// ([`PoolMode::Transaction`]).
    pub fn query<'q>(self, sql: &'static str) -> sqlx::query::Query<'q, sqlx::Any, AnyArguments> {
        match (self, names::own(sql)) {
            (Backend::Postgres, sql) => sqlx::query(sqlx::AssertSqlSafe(number_markers(&sql)))
                .persistent(named_statements()),
            (Backend::Sqlite | Backend::MySql, std::borrow::Cow::Borrowed(_)) => sqlx::query(sql),
            (Backend::Sqlite | Backend::MySql, std::borrow::Cow::Owned(sql)) => {
                sqlx::query(sqlx::AssertSqlSafe(sql))
            }
        }
    }

    /// [`Backend::query`] for SQL assembled at run time (never from input: only from timeoutd's
    /// own fragments and numbers).
    pub fn query_owned<'q>(self, sql: String) -> sqlx::query::Query<'q, sqlx::Any, AnyArguments> {
        let sql = match names::own(&sql) {
            std::borrow::Cow::Borrowed(_) => sql,
            std::borrow::Cow::Owned(prefixed) => prefixed,
        };
        match self {
            Backend::Postgres => sqlx::query(sqlx::AssertSqlSafe(number_markers(&sql)))
                .persistent(named_statements()),
            Backend::Sqlite | Backend::MySql => sqlx::query(sqlx::AssertSqlSafe(sql)),
        }
    }

    /// A statement returning the database clock as epoch ms in one BIGINT column.
    fn now_sql(self) -> &'static str {
        match self {
            // julianday('now') has millisecond resolution; 2440587.5 is the Unix epoch.
            Backend::Sqlite => {
                "SELECT CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)"
            }
            Backend::MySql => "SELECT CAST(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) * 1000 AS SIGNED)",
            Backend::Postgres => {
                "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"
            }
        }
    }

    /// `INSERT … INTO table (…) VALUES (…)` that skips a row violating a unique key:
    /// `(prefix, suffix)` around `INTO … VALUES (…)`.
    pub(crate) fn insert_ignore(self) -> (&'static str, &'static str) {
        match self {
            Backend::Sqlite => ("INSERT OR IGNORE", ""),
            Backend::MySql => ("INSERT IGNORE", ""),
            Backend::Postgres => ("INSERT", " ON CONFLICT DO NOTHING"),
        }
    }
}

/// How the server connections behind `database.url` are shared (PgBouncer's `pool_mode`, named
/// the same way). Only PostgreSQL URLs are affected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolMode {
    /// Each client connection keeps one server connection for its life: a direct connection,
    /// or a pooler in session mode. Statements are prepared once per connection and reused.
    #[default]
    Session,
    /// A pooler (PgBouncer `pool_mode = transaction`, Odyssey, PgCat, …) gives a client a server
    /// connection for one transaction at a time. Prepared statements live on a server
    /// connection, so each statement is prepared unnamed, and each one runs inside a
    /// transaction (statements on the pool get one of their own: `BEGIN`, the statement,
    /// `COMMIT`), because the driver prepares and executes in two round trips and the pooler
    /// may hand the second to another server connection between them. Nothing relies on
    /// session state; migrations, which hold a session-level advisory lock, go through
    /// `database.migrate_url`. Costs three more round trips per statement outside a
    /// transaction (`BEGIN`, the prepare, `COMMIT`) and one more inside one (the prepare).
    Transaction,
}

/// Pools of this process behind a transaction-mode pooler, alive now. While any is,
/// [`Backend::query`] prepares PostgreSQL statements unnamed: a statement does not know which
/// pool it will run on, and unnamed statements are correct everywhere (a direct connection only
/// loses the plan reuse).
static UNNAMED_POOLS: AtomicUsize = AtomicUsize::new(0);

/// Whether PostgreSQL statements may be prepared under a name and cached on their connection.
fn named_statements() -> bool {
    UNNAMED_POOLS.load(Ordering::Relaxed) == 0
}

/// One pool behind a transaction-mode pooler, counted in [`UNNAMED_POOLS`] while alive.
#[derive(Debug)]
struct UnnamedPool;

impl UnnamedPool {
    fn new() -> UnnamedPool {
        UNNAMED_POOLS.fetch_add(1, Ordering::SeqCst);
        UnnamedPool
    }
}

impl Drop for UnnamedPool {
    fn drop(&mut self) {
        UNNAMED_POOLS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// sqlx's pool and how a statement on it reaches the server ([`PoolMode`]). Dereferences to
/// the [`AnyPool`]; runs statements as an executor (`.fetch_one(db.pool())`), each in a
/// transaction of its own behind a transaction-mode pooler.
#[derive(Clone, Debug)]
pub struct Pool {
    inner: AnyPool,
    mode: PoolMode,
    _unnamed: Option<Arc<UnnamedPool>>,
}

impl Pool {
    /// Whether statements outside a transaction must be given one (transaction mode).
    fn pinned(&self) -> bool {
        self.mode == PoolMode::Transaction
    }

    /// A connection of the pool. Behind a transaction-mode pooler it is inside a transaction
    /// (so the pooler keeps one server connection under it), rolled back when dropped: a
    /// caller that writes through it calls [`Conn::commit`] (a no-op otherwise).
    ///
    /// # Errors
    /// sqlx's error when no connection can be had.
    pub async fn acquire(&self) -> Result<Conn, sqlx::Error> {
        if self.pinned() {
            Ok(Conn(ConnInner::Pinned(self.inner.begin().await?)))
        } else {
            Ok(Conn(ConnInner::Plain(self.inner.acquire().await?)))
        }
    }
}

impl Deref for Pool {
    type Target = AnyPool;
    fn deref(&self) -> &AnyPool {
        &self.inner
    }
}

impl<'p> Executor<'p> for &'_ Pool {
    type Database = Any;

    fn fetch_many<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxStream<'e, Result<Either<AnyQueryResult, AnyRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Any>,
    {
        if !self.pinned() {
            return (&self.inner).fetch_many(query);
        }
        // The rows are collected before the commit: the transaction is the statement's own.
        let pool = self.inner.clone();
        futures_util::stream::once(async move {
            let mut tx = pool.begin().await?;
            let all: Vec<_> = (&mut *tx).fetch_many(query).try_collect().await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(futures_util::stream::iter(
                all.into_iter().map(Ok::<_, sqlx::Error>),
            ))
        })
        .try_flatten()
        .boxed()
    }

    fn fetch_optional<'e, 'q: 'e, E>(
        self,
        query: E,
    ) -> BoxFuture<'e, Result<Option<AnyRow>, sqlx::Error>>
    where
        'p: 'e,
        E: 'q + Execute<'q, Any>,
    {
        if !self.pinned() {
            return (&self.inner).fetch_optional(query);
        }
        let pool = self.inner.clone();
        Box::pin(async move {
            let mut tx = pool.begin().await?;
            let row = (&mut *tx).fetch_optional(query).await?;
            tx.commit().await?;
            Ok(row)
        })
    }

    fn prepare_with<'e>(
        self,
        sql: sqlx::SqlStr,
        parameters: &'e [sqlx::any::AnyTypeInfo],
    ) -> BoxFuture<'e, Result<sqlx::any::AnyStatement, sqlx::Error>>
    where
        'p: 'e,
    {
        (&self.inner).prepare_with(sql, parameters)
    }
}

/// What sqlx's migrator takes (`db/migrate.rs`): plain connections of the pool. Migrations hold
/// a session-level lock, so behind a transaction-mode pooler they run on `database.migrate_url`.
impl<'a> sqlx::Acquire<'a> for &'_ Pool {
    type Database = Any;
    type Connection = PoolConnection<Any>;

    fn acquire(self) -> BoxFuture<'static, Result<PoolConnection<Any>, sqlx::Error>> {
        Box::pin(self.inner.acquire())
    }

    fn begin(self) -> BoxFuture<'static, Result<sqlx::Transaction<'a, Any>, sqlx::Error>> {
        let pool = self.inner.clone();
        Box::pin(async move { pool.begin().await })
    }
}

/// A connection from [`Pool::acquire`]; dereferences to the connection.
pub struct Conn(ConnInner);

enum ConnInner {
    Plain(PoolConnection<Any>),
    Pinned(sqlx::Transaction<'static, Any>),
}

impl Conn {
    /// Closes the connection instead of returning it to the pool (its session state goes with
    /// it). Behind a transaction-mode pooler the transaction is rolled back and the client
    /// connection returned: the server connection under it was never this client's alone.
    ///
    /// # Errors
    /// sqlx's error when the connection fails while closing.
    pub async fn close(self) -> Result<(), sqlx::Error> {
        match self.0 {
            ConnInner::Plain(c) => c.close().await,
            ConnInner::Pinned(tx) => tx.rollback().await,
        }
    }

    /// Commits what was written through the connection behind a transaction-mode pooler (each
    /// statement committed by itself otherwise: nothing to do).
    ///
    /// # Errors
    /// sqlx's error when the commit fails (nothing was written).
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        match self.0 {
            ConnInner::Plain(_) => Ok(()),
            ConnInner::Pinned(tx) => tx.commit().await,
        }
    }
}

impl Deref for Conn {
    type Target = AnyConnection;
    fn deref(&self) -> &AnyConnection {
        match &self.0 {
            ConnInner::Plain(c) => c,
            ConnInner::Pinned(t) => t,
        }
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        match &mut self.0 {
            ConnInner::Plain(c) => c,
            ConnInner::Pinned(t) => t,
        }
    }
}

/// Database failures, classified for retry decisions.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The configuration names something unusable.
    #[error("database configuration: {0}")]
    Config(String),
    /// A query failed (connection lost, deadlock, constraint). Usually worth retrying.
    #[error("database: {0}")]
    Sql(#[from] sqlx::Error),
    /// A migration failed.
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The schema is one this build will not run on (outside its compatibility window, a
    /// half-applied migration), or a migration kept timing out on a lock ([`migrate`]).
    #[error(transparent)]
    Schema(#[from] migrate::SchemaError),
    /// A completion under a claim token found the row no longer held by it: the lease lapsed
    /// and another holder took the row. The completion is refused (its transaction rolls back);
    /// the new holder's work stands.
    #[error("stale claim on {table} row {id}: its lease lapsed and another holder has it")]
    StaleClaim {
        /// Table.
        table: &'static str,
        /// Row id.
        id: i64,
    },
    /// MariaDB/MySQL ended a write transaction before its commit (a deadlock victim, Galera
    /// applying another node's write) without its error reaching this client; the commit found
    /// the transaction's fence gone and rolled back everything sent since ([`fence`]). Nothing
    /// of the transaction was written; worth retrying, like [`DbError::Sql`].
    #[error("database: transaction aborted by the server: {detail}")]
    Aborted {
        /// What was found, naming the fence.
        detail: String,
    },
    /// A row holds something timeoutd cannot read (e.g. an unknown status).
    #[error("bad row in {table}: {detail}")]
    BadRow {
        /// Table.
        table: &'static str,
        /// What is wrong, naming the row.
        detail: String,
    },
}

impl DbError {
    /// The server said a prepared statement of this client is missing (SQLSTATE 26000,
    /// `prepared statement "sqlx_s_1" does not exist`) or already there (42P05, `… already
    /// exists`): its server connection is shared with other clients between transactions, as
    /// behind PgBouncer in `pool_mode = transaction` ([`PoolMode`]).
    pub fn is_shared_server_connection(&self) -> bool {
        let sql = match self {
            DbError::Sql(e) => e,
            DbError::Migrate(
                sqlx::migrate::MigrateError::Execute(e)
                | sqlx::migrate::MigrateError::ExecuteMigration(e, _),
            ) => e,
            _ => return false,
        };
        matches!(sql, sqlx::Error::Database(e)
            if e.code().is_some_and(|c| c == "26000" || c == "42P05"))
    }

    /// The server ended the transaction over a lock conflict, so nothing of it was written and
    /// running it again whole is safe: a deadlock victim (MariaDB/MySQL error 1213, SQLSTATE
    /// 40001, which Galera also returns for a certification failure; PostgreSQL 40P01), a
    /// serialization failure (PostgreSQL 40001), a lock wait timeout (MariaDB/MySQL 1205,
    /// PostgreSQL `lock_timeout`, 55P03), or a transaction its fence found ended
    /// ([`DbError::Aborted`]).
    pub fn is_lock_conflict(&self) -> bool {
        match self {
            DbError::Aborted { .. } => true,
            DbError::Sql(sqlx::Error::Database(e)) => {
                e.code()
                    .is_some_and(|c| matches!(c.as_ref(), "40001" | "40P01" | "55P03"))
                    || e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                        .is_some_and(|m| matches!(m.number(), 1205 | 1213))
            }
            _ => false,
        }
    }

    /// A pooler refused a start-up parameter the driver sends (PgBouncer: `unsupported startup
    /// parameter: extra_float_digits`, unless its `ignore_startup_parameters` lists it).
    pub fn refused_startup_parameter(&self) -> Option<String> {
        match self {
            DbError::Sql(sqlx::Error::Database(e)) => e
                .message()
                .strip_prefix("unsupported startup parameter: ")
                .map(|p| p.trim().to_string()),
            _ => None,
        }
    }
}

/// A connection pool and its dialect. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Db {
    pool: Pool,
    backend: Backend,
    /// SQLite only: writers of this process queue here, in order, instead of in SQLite's busy
    /// handler (which sleeps 1, 2, 5 … 100 ms between tries and made lateness grow with load).
    write_gate: Arc<Mutex<()>>,
    /// Whose tables hold the orders ([`shop::Schema`]): timeoutd's own unless a schema profile
    /// maps a shop's.
    schema: shop::Schema,
}

/// A write transaction; on SQLite it also holds the process's write gate until it ends, on
/// MariaDB/MySQL it is fenced ([`fence`]: it commits only as the transaction it began as).
/// Dereferences to the connection, so `&mut tx` is what the query functions take.
pub struct WriteTx {
    tx: Tx,
    _gate: Option<OwnedMutexGuard<()>>,
}

/// A write transaction as each backend runs it.
enum Tx {
    /// SQLite and PostgreSQL: sqlx's transaction (PostgreSQL refuses every statement of a
    /// transaction it aborted until it ends, so it needs no fence).
    Plain(sqlx::Transaction<'static, sqlx::Any>),
    /// MariaDB/MySQL.
    Fenced(fence::Fenced),
}

impl WriteTx {
    /// Commits.
    ///
    /// # Errors
    /// [`DbError::Sql`] when the commit fails, [`DbError::Aborted`] when the server had
    /// already ended the transaction (MariaDB/MySQL): nothing was written either way.
    pub async fn commit(self) -> Result<(), DbError> {
        match self.tx {
            Tx::Plain(tx) => Ok(tx.commit().await?),
            Tx::Fenced(tx) => tx.commit().await,
        }
    }

    /// Rolls back.
    ///
    /// # Errors
    /// [`DbError::Sql`] when the connection fails (the server rolls back anyway).
    pub async fn rollback(self) -> Result<(), DbError> {
        match self.tx {
            Tx::Plain(tx) => Ok(tx.rollback().await?),
            Tx::Fenced(tx) => tx.rollback().await,
        }
    }
}

impl Deref for WriteTx {
    type Target = AnyConnection;
    fn deref(&self) -> &AnyConnection {
        match &self.tx {
            Tx::Plain(tx) => tx,
            Tx::Fenced(tx) => tx,
        }
    }
}

impl DerefMut for WriteTx {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        match &mut self.tx {
            Tx::Plain(tx) => tx,
            Tx::Fenced(tx) => tx,
        }
    }
}

impl Db {
    /// Connects to `url` (creating a SQLite file if missing). SQLite gets WAL and a 5 s busy
    /// timeout, so writers queue instead of failing; every write transaction in timeoutd starts
    /// with a write, so none has to upgrade a read lock (which SQLite cannot wait for).
    ///
    /// # Errors
    /// [`DbError`] when the URL is unsupported or the server refuses.
    pub async fn connect(url: &str, max_connections: u32) -> Result<Db, DbError> {
        Self::open(url, max_connections, PoolMode::Session, false).await
    }

    /// As [`Db::connect`], with the server connections behind `url` shared as `mode` says
    /// (`database.pool_mode`).
    ///
    /// # Errors
    /// [`DbError`] when the URL is unsupported or the server refuses.
    pub async fn connect_with(
        url: &str,
        max_connections: u32,
        mode: PoolMode,
    ) -> Result<Db, DbError> {
        Self::open(url, max_connections, mode, false).await
    }

    /// As [`Db::connect`], without connecting: the first query opens the first connection (a
    /// shard that is down at start-up is retried by its worker instead of stopping the process).
    ///
    /// # Errors
    /// [`DbError::Config`] when the URL is unsupported or malformed.
    pub async fn connect_lazy(
        url: &str,
        max_connections: u32,
        mode: PoolMode,
    ) -> Result<Db, DbError> {
        Self::open(url, max_connections, mode, true).await
    }

    async fn open(
        url: &str,
        max_connections: u32,
        mode: PoolMode,
        lazy: bool,
    ) -> Result<Db, DbError> {
        sqlx::any::install_default_drivers();
        let backend = Backend::of_url(url)?;
        let url = match backend {
            Backend::Sqlite if !url.contains("mode=") => {
                let sep = if url.contains('?') { '&' } else { '?' };
                format!("{url}{sep}mode=rwc")
            }
            Backend::MySql => url.replacen("mariadb://", "mysql://", 1),
            Backend::Postgres => url.replacen("postgresql://", "postgres://", 1),
            Backend::Sqlite => url.to_string(),
        };
        if backend == Backend::Sqlite {
            create_sqlite_parent(&url)?;
        }
        // Slow statements at WARN over the configured threshold, counted and summarised by
        // crate::db::slowlog instead of a line each.
        let options = url
            .parse::<AnyConnectOptions>()?
            .log_slow_statements(log::LevelFilter::Warn, crate::db::slowlog::threshold());
        let pool = AnyPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10))
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    match backend {
                        Backend::Sqlite => {
                            // WAL with NORMAL sync (durable at checkpoints, never corrupt);
                            // a 16 MiB page cache per connection. No memory map: each
                            // connection maps the file for itself, so a page read by four
                            // counted four times in the RSS (the 10,000-order bench peaked at
                            // 153-278 MiB with a 256 MiB map, 113-140 MiB without), and since
                            // closes are group-committed the map made the drain no faster.
                            conn.execute(
                                "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 5000; \
                                 PRAGMA mmap_size = 0; PRAGMA cache_size = -16384;",
                            )
                            .await?;
                        }
                        Backend::MySql => {
                            // utf8mb4 on the wire whatever the server's default (latin1 on
                            // many installs), matching the tables (migration 0009).
                            conn.execute(
                                "SET NAMES utf8mb4 COLLATE utf8mb4_bin; \
                                 SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
                            )
                            .await?;
                            // A Galera node: causal reads (engine.rs says why).
                            if engine::galera_on(conn).await? {
                                conn.execute(engine::GALERA_SESSION).await?;
                            }
                        }
                        // READ COMMITTED is PostgreSQL's default.
                        Backend::Postgres => {}
                    }
                    Ok(())
                })
            });
        // Only PostgreSQL is pooled this way (PgBouncer, Odyssey, PgCat speak its protocol).
        let mode = match backend {
            Backend::Postgres => mode,
            Backend::Sqlite | Backend::MySql => PoolMode::Session,
        };
        let unnamed = (mode == PoolMode::Transaction).then(|| Arc::new(UnnamedPool::new()));
        let pool = if lazy {
            pool.connect_lazy_with(options)
        } else {
            pool.connect_with(options).await?
        };
        Ok(Db {
            pool: Pool {
                inner: pool,
                mode,
                _unnamed: unnamed,
            },
            backend,
            write_gate: Arc::new(Mutex::new(())),
            schema: shop::Schema::Canonical,
        })
    }

    /// This pool with its orders in `schema`'s tables (a shop's, through a schema profile).
    pub fn with_schema(mut self, schema: shop::Schema) -> Db {
        self.schema = schema;
        self
    }

    /// Whose tables hold the orders.
    pub fn schema(&self) -> &shop::Schema {
        &self.schema
    }

    /// Applies the schema migrations of this backend (`migrations/<backend>/`), as
    /// [`migrate`] describes (the compatibility window, short lock waits).
    ///
    /// # Errors
    /// [`DbError::Schema`] when this build will not run on the schema; [`DbError::Migrate`]
    /// naming the failing migration.
    pub async fn migrate(&self) -> Result<(), DbError> {
        migrate::run(self).await
    }

    /// As [`Db::migrate`], through `url` when given (`database.migrate_url`, on a connection of
    /// its own: behind a transaction-mode pooler the migrator's session-level lock needs a
    /// session of its own), else through this pool.
    ///
    /// # Errors
    /// [`DbError`] when `url` cannot be reached or a migration fails.
    pub async fn migrate_through(&self, url: Option<&str>) -> Result<(), DbError> {
        let Some(url) = url else {
            return self.migrate().await;
        };
        let direct = Db::connect(url, 1).await?;
        let migrated = direct.migrate().await;
        direct.close().await;
        migrated
    }

    /// Begins a write transaction. On SQLite it is `BEGIN IMMEDIATE`: the write lock is taken
    /// (waiting up to the busy timeout) before anything is read, so the transaction never has
    /// to upgrade a stale read snapshot, which SQLite refuses instead of waiting. On
    /// MariaDB/MySQL it is fenced ([`fence`]).
    ///
    /// # Errors
    /// [`DbError::Sql`] when no connection or lock can be had.
    pub async fn begin(&self) -> Result<WriteTx, DbError> {
        let gate = self.write_gate().await;
        let tx = match self.backend {
            Backend::Sqlite => Tx::Plain(self.pool.begin_with("BEGIN IMMEDIATE").await?),
            Backend::Postgres => Tx::Plain(self.pool.begin().await?),
            Backend::MySql => Tx::Fenced(fence::Fenced::begin(&self.pool.inner).await?),
        };
        Ok(WriteTx { tx, _gate: gate })
    }

    /// On SQLite, waits for this process's turn to write and holds it until the guard drops;
    /// `None` (no wait) on MySQL/MariaDB, which lock rows. Every write outside [`Db::begin`]
    /// takes it.
    pub async fn write_gate(&self) -> Option<OwnedMutexGuard<()>> {
        match self.backend {
            Backend::Sqlite => Some(self.write_gate.clone().lock_owned().await),
            Backend::MySql | Backend::Postgres => None,
        }
    }

    /// The pool: an executor (`.fetch_one(db.pool())`) and [`Pool::acquire`].
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// How the server connections are shared ([`PoolMode::Session`] on MySQL and SQLite).
    pub fn pool_mode(&self) -> PoolMode {
        self.pool.mode
    }

    /// The dialect.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The database clock, epoch ms.
    ///
    /// # Errors
    /// [`DbError::Sql`] when the query fails.
    pub async fn now_ms(&self) -> Result<i64, DbError> {
        let row = self
            .backend
            .query(self.backend.now_sql())
            .fetch_one(self.pool())
            .await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// The database clock read on `conn` (inside a transaction).
    ///
    /// # Errors
    /// [`DbError::Sql`] when the query fails.
    pub async fn now_ms_on(&self, conn: &mut AnyConnection) -> Result<i64, DbError> {
        let row = self
            .backend
            .query(self.backend.now_sql())
            .fetch_one(&mut *conn)
            .await?;
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// Closes the pool, waiting for connections in use.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// A new claim token: `prefix` (who claims: `""` the outbox timer, `r` the relay, `c` the
/// broker consumer, `e` the ledger executor), 16 random hex digits and this process's id as 8
/// hex digits. Rows a claim takes carry it in `claim_token` until their lease lapses.
pub(crate) fn claim_token(prefix: &str) -> String {
    format!(
        "{prefix}{:016x}{:08x}",
        fastrand::u64(..),
        std::process::id()
    )
}

/// Creates the directory a `sqlite://PATH` lives in, so `data/timeoutd.db` works on a fresh
/// checkout.
fn create_sqlite_parent(url: &str) -> Result<(), DbError> {
    let path = url
        .trim_start_matches("sqlite:")
        .trim_start_matches("//")
        .split('?')
        .next()
        .unwrap_or_default();
    if path.is_empty() || path == ":memory:" {
        return Ok(());
    }
    if let Some(dir) = std::path::Path::new(path)
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
    {
        std::fs::create_dir_all(dir)
            .map_err(|e| DbError::Config(format!("cannot create {}: {e}", dir.display())))?;
    }
    Ok(())
}

/// Rewrites `?` markers (outside quoted strings) to `$1`, `$2`, … in order.
fn number_markers(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let (mut n, mut quoted) = (0, false);
    for c in sql.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                out.push(c);
            }
            '?' if !quoted => {
                n += 1;
                out.push('$');
                out.push_str(&n.to_string());
            }
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::number_markers;

    #[test]
    fn markers_are_numbered_outside_strings_only() {
        assert_eq!(
            number_markers("UPDATE t SET a = ?, b = 'why?' WHERE id = ? AND c IN (?, ?)"),
            "UPDATE t SET a = $1, b = 'why?' WHERE id = $2 AND c IN ($3, $4)"
        );
    }

    /// ARCHITECTURE.md's rule, enforced: no file of the daemon outside `db/` names sqlx.
    #[test]
    fn only_db_speaks_sql() {
        fn walk(dir: &std::path::Path, found: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    if path.file_name().is_some_and(|n| n != "db") {
                        walk(&path, found);
                    }
                } else if path.extension().is_some_and(|e| e == "rs")
                    && path.file_name().is_some_and(|n| n != "db.rs")
                {
                    let text = std::fs::read_to_string(&path).unwrap();
                    if text.contains("sqlx::") || text.contains("raw_sql") {
                        found.push(path.display().to_string());
                    }
                }
            }
        }
        let mut found = Vec::new();
        walk(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut found,
        );
        assert!(found.is_empty(), "SQL outside db/: {found:?}");
    }
}
