//! The doctor's reads of the database: the schema's state, character sets, and a write
//! probe (rolled back). What the server is: [`super::engine`].

use sqlx::Row;

use super::{Backend, Db, DbError};

/// The schema's state (applied version, a half-applied migration, the compatibility window),
/// `None` on a database never migrated: [`super::migrate::schema_state`].
///
/// # Errors
/// [`DbError::Sql`] on a query failure other than a missing table.
pub async fn schema_state(db: &Db) -> Result<Option<super::migrate::SchemaState>, DbError> {
    super::migrate::schema_state(db).await
}

/// MySQL/MariaDB: the database's default character set and the tables not in utf8mb4, as
/// (table, collation). Empty on the other backends.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn charsets(db: &Db) -> Result<(String, Vec<(String, String)>), DbError> {
    if db.backend() != Backend::MySql {
        return Ok(("UTF8".to_string(), Vec::new()));
    }
    let default = db
        .backend()
        .query(
            "SELECT DEFAULT_CHARACTER_SET_NAME FROM information_schema.SCHEMATA \
             WHERE SCHEMA_NAME = DATABASE()",
        )
        .fetch_one(db.pool())
        .await?
        .try_get::<String, _>(0)?;
    // timeoutd's own tables only: a shop's beside them (a table prefix) keep their charset;
    // sqlx's bookkeeping table takes the database's default and holds ASCII only.
    let own = super::names::TABLES
        .iter()
        .filter(|t| **t != "_sqlx_migrations")
        .map(|t| format!("'{}'", super::names::table(t)))
        .collect::<Vec<_>>()
        .join(", ");
    let tables = db
        .backend()
        .query_owned(format!(
            "SELECT TABLE_NAME, TABLE_COLLATION FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_TYPE = 'BASE TABLE' \
             AND TABLE_NAME IN ({own}) \
             AND TABLE_COLLATION NOT LIKE 'utf8mb4%' ORDER BY TABLE_NAME"
        ))
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<String, _>(1)?)))
        .collect::<Result<_, DbError>>()?;
    Ok((default, tables))
}

/// Whether this connection may write what the daemon writes: an insert, update and delete on
/// `maintenance_lease` inside a transaction that is rolled back (nothing is left behind).
///
/// # Errors
/// The server's refusal (a missing privilege names itself there).
pub async fn probe_write(db: &Db) -> Result<(), DbError> {
    let mut tx = db.begin().await?;
    for sql in [
        "INSERT INTO maintenance_lease (name, holder, until_ms) VALUES ('doctor-probe', 'doctor', 0)",
        "UPDATE maintenance_lease SET until_ms = 1 WHERE name = 'doctor-probe'",
        "DELETE FROM maintenance_lease WHERE name = 'doctor-probe'",
    ] {
        db.backend().query(sql).execute(&mut *tx).await?;
    }
    tx.rollback().await?;
    Ok(())
}
