//! `admin_audit`: every authenticated call of the admin API.

use super::{Db, DbError};

/// Appends one call to `admin_audit` in its own write transaction: at `at_ms` (epoch ms) `actor`
/// (the token's name) called `method path` and was answered `status`.
///
/// # Errors
/// [`DbError::Sql`] when the transaction cannot begin, the insert fails or the commit fails.
pub async fn record(
    db: &Db,
    at_ms: i64,
    actor: &str,
    method: &str,
    path: &str,
    status: u16,
) -> Result<(), DbError> {
    let mut tx = db.begin().await?;
    super::Backend::of(&tx)
        .query(
            "INSERT INTO admin_audit (at_ms, actor, method, path, status) VALUES (?, ?, ?, ?, ?)",
        )
        .bind(at_ms)
        .bind(actor)
        .bind(method)
        .bind(path)
        .bind(i64::from(status))
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}
