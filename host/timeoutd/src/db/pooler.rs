//! Whether the server connections behind a PostgreSQL URL are shared between clients from one
//! transaction to the next, as behind PgBouncer in `pool_mode = transaction` (or `statement`).
//! There a prepared statement lives on a server connection that other clients get next, so a
//! driver that names its statements (`sqlx_s_1`) fails with `prepared statement "sqlx_s_1"
//! already exists` (42P05) or `… does not exist` (26000), or runs another client's statement.
//! timeoutd works behind such a pooler when told (`database.pool_mode = "transaction"`,
//! [`super::PoolMode`]); start-up and `timeoutd doctor` ask this probe when it is not told.
//!
//! The probe: client A prepares a statement of a random name (`PREPARE`, plain SQL), then
//! client B executes it, and A executes it again, a few times. On a server of its own B cannot
//! see A's statement and A always can; behind a transaction-mode pooler B is given A's server
//! connection (PgBouncer hands out the server used last), or A another one. The statement is
//! deallocated afterwards where it can be reached; it is named so that nothing else collides
//! with it.

use sqlx::{AnyConnection, Connection};

use super::{Backend, Db, DbError};

/// What the probe saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sharing {
    /// Each client connection kept a server connection of its own (direct, or a session-mode
    /// pooler); also the answer on MySQL and SQLite, which are not probed.
    Private,
    /// Server connections change hands between transactions: what was seen.
    Shared(String),
}

/// Rounds of (B executes A's statement, A executes its own).
const ROUNDS: usize = 4;

/// Probes the server behind `db`'s URL with two connections of its own (not the pool's).
///
/// # Errors
/// [`DbError::Sql`] when a connection cannot be opened or the `PREPARE` fails.
pub async fn probe(db: &Db) -> Result<Sharing, DbError> {
    if db.backend() != Backend::Postgres {
        return Ok(Sharing::Private);
    }
    let options = db.pool().connect_options();
    let mut a = AnyConnection::connect_with(&options).await?;
    let mut b = AnyConnection::connect_with(&options).await?;
    let name = format!("timeoutd_probe_{:016x}", fastrand::u64(..));
    let verdict = async {
        run(&mut a, &format!("PREPARE {name} AS SELECT 1")).await?;
        for _ in 0..ROUNDS {
            if run(&mut b, &format!("EXECUTE {name}")).await.is_ok() {
                return Ok(Sharing::Shared(format!(
                    "a second client connection executed a statement the first had prepared \
                     ({name}): both were given the same server connection"
                )));
            }
            if let Err(e) = run(&mut a, &format!("EXECUTE {name}")).await {
                return Ok(Sharing::Shared(format!(
                    "a client connection lost the statement it had prepared ({e}): it was \
                     given another server connection"
                )));
            }
        }
        Ok::<_, DbError>(Sharing::Private)
    }
    .await;
    // Best effort: the statement goes with its server connection anyway.
    let _ = run(&mut a, &format!("DEALLOCATE {name}")).await;
    let _ = a.close().await;
    let _ = b.close().await;
    verdict
}

/// One statement in the simple protocol (nothing prepared by the driver).
async fn run(conn: &mut AnyConnection, sql: &str) -> Result<(), DbError> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string()))
        .execute(conn)
        .await?;
    Ok(())
}

/// The one line naming `pool_mode` and what to set, for start-up and `timeoutd doctor`.
pub fn advice(key: &str) -> String {
    format!(
        "{key} is behind a pooler that shares server connections between clients from one \
         transaction to the next (PgBouncer pool_mode = transaction): set database.pool_mode = \
         \"transaction\" and database.migrate_url to a direct or session-mode URL for the \
         migrations, or point {key} at a session-mode pool"
    )
}

/// The line for a pooler that refuses the driver's start-up `parameter` (`key`: the URL's).
pub fn startup_parameter_advice(key: &str, parameter: &str) -> String {
    format!(
        "{key}: the pooler refuses the driver's start-up parameter {parameter}: add \
         `ignore_startup_parameters = {parameter}` to pgbouncer.ini ([pgbouncer] section) and \
         reload it"
    )
}

/// The line for a `database.migrate_url` that is itself behind a transaction-mode pooler.
pub const MIGRATE_URL_SHARED: &str = "database.migrate_url is behind a pooler that shares \
     server connections between clients (PgBouncer pool_mode = transaction): point it at the \
     database itself or at a session-mode pool; the migrations hold a session-level lock";
