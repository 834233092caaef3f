//! Embedded schema migrations, one set per backend, and the rules that let builds of different
//! ages share one database.
//!
//! # The compatibility window
//!
//! A build's *schema version* is its newest migration ([`latest`]). When a build migrates a
//! database it records, in the one-row table `timeoutd_schema` (migration 11), its version and
//! `compatible_from`: the oldest schema version a build may have and still run against this
//! database — the newest migration marked [`Change::Breaking`]. Every migration after that one
//! is additive, so an older build reads and writes what it always did.
//!
//! At start a build compares ([`assess`]):
//! - database version = its own: nothing to do;
//! - lower: it applies its pending migrations;
//! - higher, and its own version ≥ `compatible_from` (inside the window): it starts without
//!   applying anything, logging one warning naming both versions — a rolled-back daemon beside
//!   a newer one keeps working;
//! - higher, outside the window: [`SchemaError::TooNew`], one line naming both versions and the
//!   build to run; `timeoutd run` exits [`crate::cli::EXIT_SCHEMA`], which the systemd unit does
//!   not restart.
//!
//! A build older than migration 11 does not read the window (sqlx refuses any migration it does
//! not know), which is why migrations 1–11 count as breaking.
//!
//! # Writing migration 12 and later
//!
//! Within a window migrations are **additive**: a new table, a new nullable (or defaulted)
//! column, a new index, a wider type — never a drop, a rename, a narrowed type, a new `NOT NULL`
//! without default, or a change of what a value means. Mark it [`Change::Additive`] and older
//! builds keep running beside it. A migration that cannot be additive is
//! [`Change::Breaking`]: it moves `compatible_from` up to itself, and every older build then
//! refuses to start against it (roll such a release out with the old daemons stopped: one
//! already running is not stopped by it). Split a breaking change where you can: add in one
//! release, stop using the old shape, drop it in a later, breaking one.
//!
//! # A half-applied migration
//!
//! MariaDB/MySQL DDL is not transactional: a migration that fails after its first statement
//! leaves part of its DDL applied and its `_sqlx_migrations` row with `success = 0`. timeoutd
//! applies a MariaDB/MySQL migration one statement at a time and keeps, in that row's
//! `execution_time`, the statement it is on (`RESUME_MARK`): a migration stopped by a lock
//! wait, a crash or a cancelled start is resumed there by the next start. Any other
//! half-applied row (an error other than a lock wait; a row sqlx wrote) stops start-up
//! ([`SchemaError::HalfApplied`]) naming the version and the recovery, and `timeoutd doctor`
//! names it as an error; nothing is guessed.
//!
//! # Lock waits
//!
//! DDL waits for every transaction using its table, and on MariaDB/MySQL and PostgreSQL every
//! later query of that table queues behind the waiting DDL: a long transaction of the order
//! service would stall the order service itself. So the connection that migrates sets a short
//! lock wait first ([`DDL_LOCK_WAIT`]: `lock_wait_timeout` and `innodb_lock_wait_timeout` on
//! MariaDB/MySQL, `lock_timeout` on PostgreSQL); a statement that times out is retried with
//! backoff up to [`DDL_ATTEMPTS`] times, each logged, so others' queries wait at most the short
//! wait at a time. On MariaDB/MySQL each statement of a migration is run and retried alone (a
//! statement that timed out did nothing; the ones before it stay applied); on PostgreSQL and
//! SQLite a migration is one transaction and is retried whole. The connection is closed after,
//! never returned to the pool with the short waits on it. The migrator's own lock (one daemon
//! migrates at a time) is taken before the short wait: it blocks only other migrators.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use sqlx::migrate::{Migrate, MigrateError, Migration, MigrationType};
use sqlx::{AnyConnection, AssertSqlSafe, Row, SqlSafeStr};

use super::{Backend, Db, DbError};

/// Whether older builds may keep running against a migration (the module's rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Only adds: a build that predates it runs beside it unchanged.
    Additive,
    /// Changes what an older build relies on: builds older than it refuse to start.
    Breaking,
}

/// One migration: `(version, description, sql, change)`.
type Step = (i64, &'static str, &'static str, Change);

/// The table sqlx records applied migrations in (with this process's table prefix).
fn table() -> String {
    super::names::table("_sqlx_migrations")
}

/// How long a DDL statement (or the window's row) waits for a lock before it gives up and is
/// retried: the longest the order service's queries of a table can queue behind it.
pub const DDL_LOCK_WAIT: Duration = Duration::from_secs(2);

/// How many times a statement that timed out waiting for a lock is tried in all.
pub const DDL_ATTEMPTS: u32 = 6;

/// The first backoff after a lock-wait timeout; doubled each time, up to [`DDL_BACKOFF_MAX`].
const DDL_BACKOFF: Duration = Duration::from_millis(500);
/// The longest backoff.
const DDL_BACKOFF_MAX: Duration = Duration::from_secs(8);

/// `(version, description, sql, change)` per backend, in order. Migrations 1–11 are breaking:
/// a build before 11 refuses any migration it does not know, so none of them has a window.
/// From 12 on, mark each as the module's rule says.
const SQLITE: &[Step] = &[
    (
        1,
        "schema",
        include_str!("../../migrations/sqlite/0001_schema.sql"),
        Change::Breaking,
    ),
    (
        2,
        "external effects",
        include_str!("../../migrations/sqlite/0002_external_effects.sql"),
        Change::Breaking,
    ),
    (
        3,
        "admin audit",
        include_str!("../../migrations/sqlite/0003_admin_audit.sql"),
        Change::Breaking,
    ),
    (
        4,
        "rocketmq",
        include_str!("../../migrations/sqlite/0004_rocketmq.sql"),
        Change::Breaking,
    ),
    (
        5,
        "decision input",
        include_str!("../../migrations/sqlite/0005_decision_input.sql"),
        Change::Breaking,
    ),
    (
        6,
        "ledger claim token",
        include_str!("../../migrations/sqlite/0006_ledger_claim_token.sql"),
        Change::Breaking,
    ),
    (
        7,
        "phase state",
        include_str!("../../migrations/sqlite/0007_phase_state.sql"),
        Change::Breaking,
    ),
    (
        8,
        "payment lease",
        include_str!("../../migrations/sqlite/0008_payment_lease.sql"),
        Change::Breaking,
    ),
    (
        10,
        "retention",
        include_str!("../../migrations/sqlite/0010_retention.sql"),
        Change::Breaking,
    ),
    (
        11,
        "schema window",
        include_str!("../../migrations/sqlite/0011_schema_window.sql"),
        Change::Breaking,
    ),
    (
        13,
        "payment leases",
        include_str!("../../migrations/sqlite/0013_payment_leases.sql"),
        Change::Additive,
    ),
    (
        14,
        "coupons by order",
        include_str!("../../migrations/sqlite/0014_coupons_by_order.sql"),
        Change::Additive,
    ),
    (
        15,
        "ledger by claim",
        include_str!("../../migrations/sqlite/0015_ledger_by_claim.sql"),
        Change::Additive,
    ),
    (
        16,
        "stock journal",
        include_str!("../../migrations/sqlite/0016_stock_journal.sql"),
        Change::Additive,
    ),
    (
        17,
        "pauses",
        include_str!("../../migrations/sqlite/0017_pauses.sql"),
        Change::Additive,
    ),
    (
        18,
        "shadow decisions",
        include_str!("../../migrations/sqlite/0018_shadow_decisions.sql"),
        Change::Additive,
    ),
];
const MYSQL: &[Step] = &[
    (
        1,
        "schema",
        include_str!("../../migrations/mysql/0001_schema.sql"),
        Change::Breaking,
    ),
    (
        2,
        "external effects",
        include_str!("../../migrations/mysql/0002_external_effects.sql"),
        Change::Breaking,
    ),
    (
        3,
        "admin audit",
        include_str!("../../migrations/mysql/0003_admin_audit.sql"),
        Change::Breaking,
    ),
    (
        4,
        "rocketmq",
        include_str!("../../migrations/mysql/0004_rocketmq.sql"),
        Change::Breaking,
    ),
    (
        5,
        "decision input",
        include_str!("../../migrations/mysql/0005_decision_input.sql"),
        Change::Breaking,
    ),
    (
        6,
        "ledger claim token",
        include_str!("../../migrations/mysql/0006_ledger_claim_token.sql"),
        Change::Breaking,
    ),
    (
        7,
        "phase state",
        include_str!("../../migrations/mysql/0007_phase_state.sql"),
        Change::Breaking,
    ),
    (
        8,
        "payment lease",
        include_str!("../../migrations/mysql/0008_payment_lease.sql"),
        Change::Breaking,
    ),
    (
        9,
        "utf8mb4",
        include_str!("../../migrations/mysql/0009_utf8mb4.sql"),
        Change::Breaking,
    ),
    (
        10,
        "retention",
        include_str!("../../migrations/mysql/0010_retention.sql"),
        Change::Breaking,
    ),
    (
        11,
        "schema window",
        include_str!("../../migrations/mysql/0011_schema_window.sql"),
        Change::Breaking,
    ),
    (
        12,
        "write fence",
        include_str!("../../migrations/mysql/0012_write_fence.sql"),
        Change::Additive,
    ),
    (
        13,
        "payment leases",
        include_str!("../../migrations/mysql/0013_payment_leases.sql"),
        Change::Additive,
    ),
    (
        14,
        "coupons by order",
        include_str!("../../migrations/mysql/0014_coupons_by_order.sql"),
        Change::Additive,
    ),
    (
        15,
        "ledger by claim",
        include_str!("../../migrations/mysql/0015_ledger_by_claim.sql"),
        Change::Additive,
    ),
    (
        16,
        "stock journal",
        include_str!("../../migrations/mysql/0016_stock_journal.sql"),
        Change::Additive,
    ),
    (
        17,
        "pauses",
        include_str!("../../migrations/mysql/0017_pauses.sql"),
        Change::Additive,
    ),
    (
        18,
        "shadow decisions",
        include_str!("../../migrations/mysql/0018_shadow_decisions.sql"),
        Change::Additive,
    ),
];
const POSTGRES: &[Step] = &[
    (
        1,
        "schema",
        include_str!("../../migrations/postgres/0001_schema.sql"),
        Change::Breaking,
    ),
    (
        2,
        "external effects",
        include_str!("../../migrations/postgres/0002_external_effects.sql"),
        Change::Breaking,
    ),
    (
        3,
        "admin audit",
        include_str!("../../migrations/postgres/0003_admin_audit.sql"),
        Change::Breaking,
    ),
    (
        4,
        "rocketmq",
        include_str!("../../migrations/postgres/0004_rocketmq.sql"),
        Change::Breaking,
    ),
    (
        5,
        "decision input",
        include_str!("../../migrations/postgres/0005_decision_input.sql"),
        Change::Breaking,
    ),
    (
        6,
        "ledger claim token",
        include_str!("../../migrations/postgres/0006_ledger_claim_token.sql"),
        Change::Breaking,
    ),
    (
        7,
        "phase state",
        include_str!("../../migrations/postgres/0007_phase_state.sql"),
        Change::Breaking,
    ),
    (
        8,
        "payment lease",
        include_str!("../../migrations/postgres/0008_payment_lease.sql"),
        Change::Breaking,
    ),
    (
        10,
        "retention",
        include_str!("../../migrations/postgres/0010_retention.sql"),
        Change::Breaking,
    ),
    (
        11,
        "schema window",
        include_str!("../../migrations/postgres/0011_schema_window.sql"),
        Change::Breaking,
    ),
    (
        13,
        "payment leases",
        include_str!("../../migrations/postgres/0013_payment_leases.sql"),
        Change::Additive,
    ),
    (
        14,
        "coupons by order",
        include_str!("../../migrations/postgres/0014_coupons_by_order.sql"),
        Change::Additive,
    ),
    (
        15,
        "ledger by claim",
        include_str!("../../migrations/postgres/0015_ledger_by_claim.sql"),
        Change::Additive,
    ),
    (
        16,
        "stock journal",
        include_str!("../../migrations/postgres/0016_stock_journal.sql"),
        Change::Additive,
    ),
    (
        17,
        "pauses",
        include_str!("../../migrations/postgres/0017_pauses.sql"),
        Change::Additive,
    ),
    (
        18,
        "shadow decisions",
        include_str!("../../migrations/postgres/0018_shadow_decisions.sql"),
        Change::Additive,
    ),
];

fn steps(backend: Backend) -> &'static [Step] {
    match backend {
        Backend::Sqlite => SQLITE,
        Backend::MySql => MYSQL,
        Backend::Postgres => POSTGRES,
    }
}

/// The schema version this build migrates `backend` to (its newest migration).
pub fn latest(backend: Backend) -> i64 {
    steps(backend).last().map_or(0, |&(version, ..)| version)
}

/// The oldest schema version a build may have and still run against this build's schema: its
/// newest [`Change::Breaking`] migration (recorded as `compatible_from` when it migrates).
pub fn compatible_from(backend: Backend) -> i64 {
    steps(backend)
        .iter()
        .rev()
        .find(|&&(.., change)| change == Change::Breaking)
        .map_or(0, |&(version, ..)| version)
}

/// What a database's schema is: `_sqlx_migrations` and the window in `timeoutd_schema`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaState {
    /// The newest migration applied in full; `None` when none is.
    pub applied: Option<i64>,
    /// The oldest migration recorded with `success = 0`, if any.
    pub half_applied: Option<HalfApplied>,
    /// The window the newest migrating build recorded (`None` before migration 11).
    pub window: Option<Window>,
}

/// A migration recorded with `success = 0`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HalfApplied {
    /// Its version.
    pub version: i64,
    /// Its description.
    pub description: String,
    /// When timeoutd was applying it statement by statement (MariaDB/MySQL) and stopped — gave
    /// up on a lock, crashed, its start was cancelled — the 0-based index of the statement it
    /// was on (every one before it is applied), where the next start resumes it. `None` when
    /// nothing says how far it got (sqlx's marker, or an error other than a lock wait): an
    /// operator must look.
    pub resume_at: Option<usize>,
}

/// The compatibility window recorded in `timeoutd_schema`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// The schema version of the build that wrote it.
    pub version: i64,
    /// The oldest schema version a build may have and run against this database.
    pub compatible_from: i64,
    /// That build (`timeoutd --version`).
    pub written_by: String,
}

/// How this build's schema fits a database's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fit {
    /// The same version.
    Current,
    /// Older than this build's (`None`: never migrated): migrating brings it up.
    Behind(Option<i64>),
    /// Newer than this build's, inside its window: this build runs without migrating.
    Newer {
        /// The database's schema version.
        database: i64,
        /// The window's floor.
        compatible_from: i64,
        /// The build that migrated it.
        written_by: String,
    },
}

/// Why this build will not run against a database's schema, or could not migrate it. Shown as
/// one line: [`SchemaError::finding`], then [`SchemaError::recovery`].
#[derive(Debug)]
pub enum SchemaError {
    /// The database was migrated past this build's compatibility window.
    TooNew {
        /// The database's schema version.
        database: i64,
        /// This build's.
        build: i64,
        /// The window's floor.
        compatible_from: i64,
        /// The build that migrated it.
        written_by: String,
    },
    /// A migration is recorded with `success = 0` and nothing says how far it got.
    HalfApplied {
        /// Its version.
        version: i64,
        /// Its description.
        description: String,
        /// The migrations directory of the backend.
        dir: &'static str,
    },
    /// A migration's statement kept timing out waiting for a lock: a long transaction holds a
    /// table it changes. Transient: a later start tries again (and resumes where it stopped).
    LockWait {
        /// The migration.
        version: i64,
        /// The statement that timed out, 1-based (1 on PostgreSQL and SQLite: the transaction).
        statement: usize,
        /// How many times it was tried.
        attempts: u32,
        /// The lock wait of each try, seconds.
        wait_s: u64,
        /// What of it is applied, and what the next start does.
        resume: String,
    },
}

impl SchemaError {
    /// Whether only an operator can fix it (a restart cannot): `timeoutd run` then exits
    /// [`crate::cli::EXIT_SCHEMA`], which the systemd unit does not restart.
    pub fn needs_operator(&self) -> bool {
        !matches!(self, SchemaError::LockWait { .. })
    }

    /// What is wrong, naming the versions.
    pub fn finding(&self) -> String {
        match self {
            SchemaError::TooNew {
                database,
                build,
                compatible_from,
                written_by,
            } => format!(
                "database schema version {database} (migrated by timeoutd {written_by}) needs a \
                 timeoutd whose schema version is at least {compatible_from}; this build's is \
                 {build}"
            ),
            SchemaError::HalfApplied {
                version,
                description,
                ..
            } => format!(
                "migration {version} ({description}) is half-applied (_sqlx_migrations.success = \
                 0: it failed or was stopped part-way, and MariaDB/MySQL DDL is not \
                 transactional, so part of it may be in place)"
            ),
            SchemaError::LockWait {
                version,
                statement,
                attempts,
                wait_s,
                resume,
            } => format!(
                "migration {version} statement {statement} waited {wait_s} s for a lock \
                 {attempts} times and gave up{resume}: a long transaction holds a table it \
                 changes, and timeoutd does not queue the order service's queries behind its DDL"
            ),
        }
    }

    /// What to run.
    pub fn recovery(&self) -> String {
        match self {
            SchemaError::TooNew {
                compatible_from, ..
            } => format!(
                "upgrade this daemon to a build with migration {compatible_from} or later (the \
                 one that migrated it will do), or restore the database from before migration \
                 {compatible_from} to roll back"
            ),
            SchemaError::HalfApplied { version, dir, .. } => format!(
                "compare host/timeoutd/migrations/{dir}/{version:04}_*.sql with the tables, then \
                 either revert what it applied and DELETE FROM _sqlx_migrations WHERE version = \
                 {version} (the next start applies it whole), or finish its remaining statements \
                 by hand and UPDATE _sqlx_migrations SET success = TRUE WHERE version = {version}"
            ),
            SchemaError::LockWait { .. } => "end that transaction (MariaDB: SHOW PROCESSLIST, \
                 information_schema.INNODB_TRX; PostgreSQL: pg_stat_activity) or start again \
                 when it is done"
                .to_string(),
        }
    }
}

impl std::fmt::Display for SchemaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.finding(), self.recovery())
    }
}

impl std::error::Error for SchemaError {}

fn dir(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => "sqlite",
        Backend::MySql => "mysql",
        Backend::Postgres => "postgres",
    }
}

/// How a database's schema (`state`, `None` never migrated) fits this build's for `backend`.
///
/// # Errors
/// [`SchemaError::HalfApplied`] for a half-applied migration timeoutd cannot resume;
/// [`SchemaError::TooNew`] for a schema outside this build's window (or newer with no window).
pub fn assess(state: Option<&SchemaState>, backend: Backend) -> Result<Fit, SchemaError> {
    let build = latest(backend);
    let Some(state) = state else {
        return Ok(Fit::Behind(None));
    };
    if let Some(h) = &state.half_applied {
        let ours = steps(backend).iter().any(|&(v, ..)| v == h.version);
        if h.resume_at.is_none() || !ours {
            return Err(SchemaError::HalfApplied {
                version: h.version,
                description: h.description.clone(),
                dir: dir(backend),
            });
        }
    }
    match state.applied {
        Some(v) if v > build => match &state.window {
            Some(w) if w.compatible_from <= build => Ok(Fit::Newer {
                database: v,
                compatible_from: w.compatible_from,
                written_by: w.written_by.clone(),
            }),
            Some(w) => Err(SchemaError::TooNew {
                database: v,
                build,
                compatible_from: w.compatible_from,
                written_by: w.written_by.clone(),
            }),
            None => Err(SchemaError::TooNew {
                database: v,
                build,
                compatible_from: v,
                written_by: "unknown (no timeoutd_schema row)".to_string(),
            }),
        },
        Some(v) if v == build => Ok(Fit::Current),
        other => Ok(Fit::Behind(other)),
    }
}

/// The database's schema state; `None` when it was never migrated.
///
/// # Errors
/// [`DbError::Sql`] on a query failure other than a missing table.
pub async fn schema_state(db: &Db) -> Result<Option<SchemaState>, DbError> {
    let mut conn = db.pool().acquire().await?;
    read_state(&mut conn).await
}

/// For a daemon that does not migrate (`database.migrate = false`): refuses a schema this build
/// cannot run on, and warns when it runs inside the window. A schema behind this build's is
/// left to the doctor (it says how to migrate).
///
/// # Errors
/// [`DbError::Schema`] as [`assess`] refuses; [`DbError::Sql`] when it cannot be read.
pub async fn check(db: &Db) -> Result<(), DbError> {
    let state = schema_state(db).await?;
    if let Fit::Newer {
        database,
        compatible_from,
        written_by,
    } = assess(state.as_ref(), db.backend())?
    {
        warn_newer(database, db.backend(), compatible_from, &written_by);
    }
    Ok(())
}

fn warn_newer(database: i64, backend: Backend, compatible_from: i64, written_by: &str) {
    tracing::warn!(
        database_schema = database,
        build_schema = latest(backend),
        compatible_from,
        "database schema version {database} (migrated by timeoutd {written_by}) is newer than \
         this build's {}; inside its compatibility window (from {compatible_from}), so this \
         build runs without migrating: upgrade it when you can",
        latest(backend)
    );
}

fn missing_table(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d)
        if d.message().contains("no such table")
            || d.message().contains("doesn't exist")
            || d.message().contains("does not exist"))
}

/// Read on the daemon's own pool too (`check`, the doctor): its statements are unnamed behind a
/// transaction-mode pooler, as [`super::Backend::query`]'s are.
async fn read_state(conn: &mut AnyConnection) -> Result<Option<SchemaState>, DbError> {
    let applied = match Backend::of(conn)
        .query("SELECT MAX(version) FROM _sqlx_migrations WHERE success = TRUE")
        .fetch_one(&mut *conn)
        .await
    {
        Ok(row) => row.try_get::<Option<i64>, _>(0)?,
        Err(e) if missing_table(&e) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let half_applied = Backend::of(conn)
        .query(
            "SELECT version, description, execution_time FROM _sqlx_migrations \
             WHERE success = FALSE ORDER BY version",
        )
        .fetch_optional(&mut *conn)
        .await?
        .map(|row| -> Result<HalfApplied, DbError> {
            let marker = row.try_get::<i64, _>(2)?;
            Ok(HalfApplied {
                version: row.try_get(0)?,
                description: row.try_get(1)?,
                resume_at: (marker <= -RESUME_MARK)
                    .then(|| usize::try_from(-RESUME_MARK - marker).unwrap_or(0)),
            })
        })
        .transpose()?;
    let window = match Backend::of(conn)
        .query("SELECT version, compatible_from, written_by FROM timeoutd_schema WHERE id = 1")
        .fetch_optional(&mut *conn)
        .await
    {
        Ok(row) => row
            .map(|row| -> Result<Window, DbError> {
                Ok(Window {
                    version: row.try_get(0)?,
                    compatible_from: row.try_get(1)?,
                    written_by: row.try_get(2)?,
                })
            })
            .transpose()?,
        Err(e) if missing_table(&e) => None,
        Err(e) => return Err(e.into()),
    };
    if applied.is_none() && half_applied.is_none() {
        return Ok(None);
    }
    Ok(Some(SchemaState {
        applied,
        half_applied,
        window,
    }))
}

/// `execution_time` of a row timeoutd is applying statement by statement (MariaDB/MySQL) is
/// `-(RESUME_MARK + i)`, `i` the statement it runs (every one before it is applied): where the
/// next start resumes if this one stops. sqlx's own marker, and timeoutd's after an error other
/// than a lock wait, is `-1`: nothing says how far it got.
const RESUME_MARK: i64 = 1_000;

fn migration(version: i64, description: &'static str, sql: Cow<'static, str>) -> Migration {
    let sql = match sql {
        Cow::Borrowed(sql) => sql.into_sql_str(),
        Cow::Owned(sql) => AssertSqlSafe(sql).into_sql_str(),
    };
    Migration::new(
        version,
        Cow::Borrowed(description),
        MigrationType::Simple,
        sql,
        false,
    )
}

/// Every migration's SQL for `backend`, in order, as written (unprefixed).
#[cfg(test)]
pub(super) fn sources(backend: Backend) -> impl Iterator<Item = &'static str> {
    steps(backend).iter().map(|&(_, _, sql, _)| sql)
}

/// Applies this backend's pending migrations as the module describes: on one connection, under
/// the migrator's lock and short lock waits, refusing a schema this build cannot run on, then
/// records the window.
pub(super) async fn run(db: &Db) -> Result<(), DbError> {
    let mut conn = db.pool().acquire().await?;
    let result = match conn.lock().await {
        Ok(()) => {
            let migrated = migrate_locked(&mut conn, db.backend()).await;
            let unlocked = conn.unlock().await;
            migrated.and(unlocked.map_err(DbError::from))
        }
        Err(e) => Err(e.into()),
    };
    // Closed, not returned to the pool: its session keeps the short lock waits (SQLite's has
    // none, and an in-memory database lives only as long as its connections).
    if db.backend() != Backend::Sqlite {
        let _ = conn.close().await;
    }
    result
}

async fn migrate_locked(conn: &mut AnyConnection, backend: Backend) -> Result<(), DbError> {
    let wait_s = DDL_LOCK_WAIT.as_secs();
    match backend {
        Backend::MySql => {
            sqlx::raw_sql(AssertSqlSafe(format!(
                "SET SESSION lock_wait_timeout = {wait_s}; \
                 SET SESSION innodb_lock_wait_timeout = {wait_s}"
            )))
            .execute(&mut *conn)
            .await?;
        }
        Backend::Postgres => {
            sqlx::raw_sql(AssertSqlSafe(format!("SET lock_timeout = '{wait_s}s'")))
                .execute(&mut *conn)
                .await?;
        }
        // One writer, transactional DDL, a 5 s busy timeout: nothing queues behind it.
        Backend::Sqlite => {}
    }
    conn.ensure_migrations_table(&table()).await?;
    let state = read_state(conn).await?;
    let fit = assess(state.as_ref(), backend)?;
    let set = steps(backend);
    let build = latest(backend);
    let applied: HashMap<i64, Vec<u8>> = conn
        .list_applied_migrations(&table())
        .await?
        .into_iter()
        .map(|m| (m.version, m.checksum.into_owned()))
        .collect();
    // sqlx's check, within this build's versions (newer ones are the window's business).
    if let Some(&v) = applied
        .keys()
        .filter(|&&v| v <= build && !set.iter().any(|&(s, ..)| s == v))
        .min()
    {
        return Err(MigrateError::VersionMissing(v).into());
    }
    let resume = state
        .as_ref()
        .and_then(|s| s.half_applied.as_ref())
        .and_then(|h| Some((h.version, h.resume_at?)));
    for &(version, description, sql, _) in set {
        let sql = super::names::migration(backend, sql);
        let m = migration(version, description, sql.clone());
        match (applied.get(&version), resume) {
            (Some(sum), _) if sum.as_slice() != &*m.checksum => {
                return Err(MigrateError::VersionMismatch(version).into());
            }
            (Some(_), Some((v, at))) if v == version => {
                tracing::warn!(
                    version,
                    statement = at + 1,
                    "resuming migration {version} at statement {}, where a lock-wait timeout stopped it",
                    at + 1
                );
                apply_statements(conn, &m, &sql, Some(at)).await?;
            }
            (Some(_), _) => {}
            (None, _) if backend == Backend::MySql => {
                apply_statements(conn, &m, &sql, None).await?
            }
            (None, _) => apply_whole(conn, &m).await?,
        }
    }
    match fit {
        Fit::Newer {
            database,
            compatible_from,
            written_by,
        } => warn_newer(database, backend, compatible_from, &written_by),
        Fit::Current | Fit::Behind(_) => write_window(conn, backend).await?,
    }
    Ok(())
}

/// Whether `e` is a lock wait that timed out (MariaDB/MySQL 1205, PostgreSQL 55P03).
fn lock_wait_timed_out(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(d) = e else {
        return false;
    };
    d.code().as_deref() == Some("55P03")
        || d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|m| m.number() == 1205)
        || d.message().contains("Lock wait timeout exceeded")
}

/// The wait before try `attempt + 1` (1-based `attempt`): doubling from [`DDL_BACKOFF`], up to
/// [`DDL_BACKOFF_MAX`], with up to a quarter more at random so daemons do not retry in step.
fn backoff(attempt: u32) -> Duration {
    let base = DDL_BACKOFF
        .saturating_mul(1 << attempt.saturating_sub(1).min(8))
        .min(DDL_BACKOFF_MAX);
    base + base.mul_f64(fastrand::f64() / 4.0)
}

fn log_retry(version: i64, statement: usize, attempt: u32, wait: Duration) {
    tracing::warn!(
        version,
        statement,
        attempt,
        "migration {version} statement {statement} waited {} s for a lock and gave up (try \
         {attempt} of {DDL_ATTEMPTS}); others' queries are not held behind it: trying again in {} ms",
        DDL_LOCK_WAIT.as_secs(),
        wait.as_millis()
    );
}

/// PostgreSQL and SQLite: the migration in one transaction (sqlx's), retried whole after a
/// lock-wait timeout (which rolled it back).
async fn apply_whole(conn: &mut AnyConnection, m: &Migration) -> Result<(), DbError> {
    let mut attempt = 1;
    loop {
        match conn.apply(&table(), m).await {
            Ok(_) => return Ok(()),
            Err(MigrateError::ExecuteMigration(e, _) | MigrateError::Execute(e))
                if lock_wait_timed_out(&e) =>
            {
                if attempt >= DDL_ATTEMPTS {
                    return Err(SchemaError::LockWait {
                        version: m.version,
                        statement: 1,
                        attempts: attempt,
                        wait_s: DDL_LOCK_WAIT.as_secs(),
                        resume: " (its transaction rolled back: nothing of it is applied)"
                            .to_string(),
                    }
                    .into());
                }
                let wait = backoff(attempt);
                log_retry(m.version, 1, attempt, wait);
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// MariaDB/MySQL: the migration's statements one at a time from `from` (0-based), each retried
/// alone after a lock-wait timeout, under sqlx's bookkeeping (its row written `success = 0`
/// first, `success = 1` at the end). A statement that timed out did nothing, so when one gives
/// up the row records where to resume (or is removed when nothing was applied).
async fn apply_statements(
    conn: &mut AnyConnection,
    m: &Migration,
    sql: &str,
    resume_at: Option<usize>,
) -> Result<(), DbError> {
    let started = Instant::now();
    let version = m.version;
    let resume_mark = |i: usize| -RESUME_MARK - i64::try_from(i).unwrap_or(0);
    let from = match resume_at {
        Some(at) => at,
        None => {
            Backend::MySql
                .query(
                    "INSERT INTO _sqlx_migrations (version, description, success, checksum, \
                 execution_time) VALUES (?, ?, FALSE, ?, ?)",
                )
                .bind(version)
                .bind(&*m.description)
                .bind(m.checksum.to_vec())
                .bind(resume_mark(0))
                .execute(&mut *conn)
                .await?;
            0
        }
    };
    for (i, statement) in crate::db::statements::split(sql)
        .into_iter()
        .enumerate()
        .skip(from)
    {
        // Where to resume if this process stops here (a crash, a cancelled start, a give-up):
        // at this statement. Had it completed after all, running it again fails, and the row
        // is then left for an operator (below).
        if i > from {
            Backend::MySql
                .query("UPDATE _sqlx_migrations SET execution_time = ? WHERE version = ?")
                .bind(resume_mark(i))
                .bind(version)
                .execute(&mut *conn)
                .await?;
        }
        let mut attempt = 1;
        loop {
            let failed = match sqlx::raw_sql(AssertSqlSafe(statement.to_string()))
                .execute(&mut *conn)
                .await
            {
                Ok(_) => break,
                Err(e) => e,
            };
            let timed_out = lock_wait_timed_out(&failed);
            if timed_out && attempt < DDL_ATTEMPTS {
                let wait = backoff(attempt);
                log_retry(version, i + 1, attempt, wait);
                tokio::time::sleep(wait).await;
                attempt += 1;
                continue;
            }
            // Statement `i` did nothing (InnoDB DDL is atomic per statement): nothing of the
            // migration is applied when it is the first. Else, after a lock wait, the row keeps
            // saying where to resume; after any other error (which a retry would likely meet
            // again) it says nothing (sqlx's -1), so start-up refuses it and an operator looks.
            let marker = if i == 0 {
                Some("DELETE FROM _sqlx_migrations WHERE version = ?")
            } else if timed_out {
                None
            } else {
                Some("UPDATE _sqlx_migrations SET execution_time = -1 WHERE version = ?")
            };
            if let Some(marker) = marker {
                Backend::MySql
                    .query(marker)
                    .bind(version)
                    .execute(&mut *conn)
                    .await?;
            }
            if !timed_out {
                return Err(MigrateError::ExecuteMigration(failed, version).into());
            }
            return Err(SchemaError::LockWait {
                version,
                statement: i + 1,
                attempts: attempt,
                wait_s: DDL_LOCK_WAIT.as_secs(),
                resume: if i == 0 {
                    " (nothing of it is applied)".to_string()
                } else {
                    format!(
                        " (statements 1–{i} are applied; the next start resumes at {})",
                        i + 1
                    )
                },
            }
            .into());
        }
    }
    let elapsed = i64::try_from(started.elapsed().as_nanos()).unwrap_or(i64::MAX);
    Backend::MySql
        .query("UPDATE _sqlx_migrations SET success = TRUE, execution_time = ? WHERE version = ?")
        .bind(elapsed)
        .bind(version)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Records this build's window; called only when no applied migration is newer than this build
/// (a newer build's row stands), under the migrator's lock, so no newer build migrates
/// meanwhile. Retried as DDL is after a lock-wait timeout.
async fn write_window(conn: &mut AnyConnection, backend: Backend) -> Result<(), DbError> {
    let now: i64 = sqlx::query(backend.now_sql())
        .fetch_one(&mut *conn)
        .await?
        .try_get(0)?;
    let build = latest(backend);
    let mut attempt = 1;
    loop {
        let written = backend
            .query(
                "UPDATE timeoutd_schema SET version = ?, compatible_from = ?, written_by = ?, \
                 updated_at_ms = ? WHERE id = 1",
            )
            .bind(build)
            .bind(compatible_from(backend))
            .bind(crate::build_info::version())
            .bind(now)
            .execute(&mut *conn)
            .await;
        match written {
            Ok(_) => return Ok(()),
            Err(e) if lock_wait_timed_out(&e) && attempt < DDL_ATTEMPTS => {
                let wait = backoff(attempt);
                tracing::warn!(
                    attempt,
                    "timeoutd_schema is locked; trying again in {} ms",
                    wait.as_millis()
                );
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(applied: i64, window: Option<(i64, i64)>) -> SchemaState {
        SchemaState {
            applied: Some(applied),
            half_applied: None,
            window: window.map(|(version, compatible_from)| Window {
                version,
                compatible_from,
                written_by: "0.2.0".to_string(),
            }),
        }
    }

    #[test]
    fn every_mysql_migration_splits_into_its_statements() {
        let counts: Vec<usize> = MYSQL
            .iter()
            .map(|&(_, _, sql, _)| crate::db::statements::split(sql).len())
            .collect();
        // Counted by hand: the lines ending a statement, outside comments.
        assert_eq!(
            counts,
            [13, 3, 1, 6, 2, 1, 3, 1, 11, 5, 2, 1, 1, 1, 2, 1, 1, 1]
        );
        for &(version, _, sql, _) in MYSQL {
            for s in crate::db::statements::split(sql) {
                assert!(!s.contains("--") && !s.ends_with(';'), "{version}: {s}");
            }
        }
    }

    #[test]
    fn a_newer_schema_runs_inside_its_window_and_is_refused_outside() {
        // MariaDB/MySQL's 12 (the write fence) and every backend's 13 (payment leases), 14
        // (coupons by order), 15 (ledger by claim), 16 (stock journal), 17 (pauses) and 18 (shadow decisions) are additive: the window
        // still starts at 11.
        assert_eq!(latest(Backend::MySql), 18);
        assert_eq!(compatible_from(Backend::MySql), 11);
        assert_eq!(
            assess(Some(&state(18, Some((18, 11)))), Backend::MySql).unwrap(),
            Fit::Current
        );
        assert_eq!(
            assess(Some(&state(11, Some((11, 11)))), Backend::MySql).unwrap(),
            Fit::Behind(Some(11))
        );
        let build = latest(Backend::Postgres);
        assert_eq!(build, 18);
        assert_eq!(compatible_from(Backend::Postgres), 11);
        assert_eq!(
            assess(Some(&state(18, Some((18, 11)))), Backend::Postgres).unwrap(),
            Fit::Current
        );
        assert_eq!(
            assess(Some(&state(10, None)), Backend::Postgres).unwrap(),
            Fit::Behind(Some(10))
        );
        assert_eq!(assess(None, Backend::Postgres).unwrap(), Fit::Behind(None));
        assert!(matches!(
            assess(Some(&state(19, Some((19, 11)))), Backend::Postgres),
            Ok(Fit::Newer {
                database: 19,
                compatible_from: 11,
                ..
            })
        ));
        let refused = assess(Some(&state(19, Some((19, 19)))), Backend::Postgres).unwrap_err();
        assert!(refused.needs_operator());
        let line = refused.to_string();
        assert!(!line.contains('\n'), "{line}");
        for part in [
            "version 19",
            "at least 19",
            "this build's is 18",
            "upgrade this daemon",
        ] {
            assert!(line.contains(part), "{part}: {line}");
        }
        assert!(matches!(
            assess(Some(&state(19, None)), Backend::Postgres),
            Err(SchemaError::TooNew {
                compatible_from: 19,
                ..
            })
        ));
    }

    #[test]
    fn a_half_applied_migration_is_refused_unless_timeoutd_knows_where_to_resume() {
        let mut s = state(9, Some((9, 9)));
        s.half_applied = Some(HalfApplied {
            version: 10,
            description: "retention".to_string(),
            resume_at: None,
        });
        let line = assess(Some(&s), Backend::MySql).unwrap_err().to_string();
        for part in [
            "migration 10 (retention) is half-applied",
            "migrations/mysql/0010_*.sql",
            "DELETE FROM _sqlx_migrations WHERE version = 10",
        ] {
            assert!(line.contains(part), "{part}: {line}");
        }
        s.half_applied.as_mut().unwrap().resume_at = Some(3);
        assert_eq!(
            assess(Some(&s), Backend::MySql).unwrap(),
            Fit::Behind(Some(9))
        );
        s.half_applied.as_mut().unwrap().version = 19;
        assert!(matches!(
            assess(Some(&s), Backend::MySql),
            Err(SchemaError::HalfApplied { version: 19, .. })
        ));
    }
}
