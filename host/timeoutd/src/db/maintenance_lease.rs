//! `maintenance_lease`: named leases that one daemon at a time holds, each a row (`name`,
//! `holder`, `until_ms`) taken and renewed by a conditional `UPDATE` whose affected rows are
//! checked — exclusive on every backend, and on Galera too, where certification keeps a
//! conditional update exclusive across nodes (row locks and `GET_LOCK` are node-local there;
//! docs/scaling.md). Used by retention (`retention`), and by sharding (`shard`, one per shard
//! database, and `daemon:<id>`, each daemon's presence).

use sqlx::Row;

use super::{Db, DbError};

/// Takes (or keeps) the lease `name` for `holder` until `until_ms`, when it is free or lapsed
/// at `now_ms` or already `holder`'s. Returns whether `holder` holds it now.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn take_lease(
    db: &Db,
    name: &str,
    holder: &str,
    now_ms: i64,
    until_ms: i64,
) -> Result<bool, DbError> {
    let _gate = db.write_gate().await;
    let taken = db
        .backend()
        .query(
            "UPDATE maintenance_lease SET holder = ?, until_ms = ? \
             WHERE name = ? AND (until_ms < ? OR holder = ?)",
        )
        .bind(holder.to_string())
        .bind(until_ms)
        .bind(name.to_string())
        .bind(now_ms)
        .bind(holder.to_string())
        .execute(db.pool())
        .await?
        .rows_affected();
    if taken == 1 {
        return Ok(true);
    }
    // No row yet: the first daemon to insert it holds it (a racing one gets a key conflict).
    let exists = db
        .backend()
        .query("SELECT COUNT(*) FROM maintenance_lease WHERE name = ?")
        .bind(name.to_string())
        .fetch_one(db.pool())
        .await?
        .try_get::<i64, _>(0)?;
    if exists > 0 {
        return Ok(false);
    }
    let inserted = db
        .backend()
        .query("INSERT INTO maintenance_lease (name, holder, until_ms) VALUES (?, ?, ?)")
        .bind(name.to_string())
        .bind(holder.to_string())
        .bind(until_ms)
        .execute(db.pool())
        .await;
    Ok(inserted.is_ok())
}

/// Gives the lease `name` up, if `holder` holds it.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn release_lease(db: &Db, name: &str, holder: &str) -> Result<(), DbError> {
    let _gate = db.write_gate().await;
    db.backend()
        .query("UPDATE maintenance_lease SET until_ms = 0 WHERE name = ? AND holder = ?")
        .bind(name.to_string())
        .bind(holder.to_string())
        .execute(db.pool())
        .await?;
    Ok(())
}

/// Distinct holders of unlapsed leases whose name starts with `prefix` at `now_ms` (the daemons
/// present, from their `daemon:<id>` rows).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn live_holders(db: &Db, prefix: &str, now_ms: i64) -> Result<i64, DbError> {
    Ok(db
        .backend()
        .query(
            "SELECT COUNT(DISTINCT holder) FROM maintenance_lease \
             WHERE name LIKE ? AND until_ms >= ?",
        )
        .bind(format!("{prefix}%"))
        .bind(now_ms)
        .fetch_one(db.pool())
        .await?
        .try_get::<i64, _>(0)?)
}

/// Deletes the lease `name` if `holder` holds it (a daemon's presence row at shutdown).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn delete_lease(db: &Db, name: &str, holder: &str) -> Result<(), DbError> {
    let _gate = db.write_gate().await;
    db.backend()
        .query("DELETE FROM maintenance_lease WHERE name = ? AND holder = ?")
        .bind(name.to_string())
        .bind(holder.to_string())
        .execute(db.pool())
        .await?;
    Ok(())
}

/// Deletes leases named `prefix…` that lapsed before `before_ms` (presence rows of daemons
/// that died); returns how many.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn prune(db: &Db, prefix: &str, before_ms: i64) -> Result<u64, DbError> {
    let _gate = db.write_gate().await;
    Ok(db
        .backend()
        .query("DELETE FROM maintenance_lease WHERE name LIKE ? AND until_ms < ?")
        .bind(format!("{prefix}%"))
        .bind(before_ms)
        .execute(db.pool())
        .await?
        .rows_affected())
}
