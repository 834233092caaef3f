//! `stock_journal`: the units closes gave back, waiting to be added to `sku_stock`
//! (`[dispatch.stock] mode = "journal"`, [`crate::config::StockMode::Journal`]).
//!
//! A flash sale's closes all give back the same one or few SKUs. Updating the SKU's row in the
//! close transaction makes every close of that SKU wait for the row lock until the previous
//! holder commits (a close, or the order service's create), so the hot row sets the pace of the
//! whole burst (docs/performance.md, "one hot SKU"). Stock changes commute, so the close appends
//! them instead ([`append`]: one insert, no lock another close waits for), and a fold adds many
//! closes' units with one update per SKU ([`fold`]), holding the row lock from that update to
//! its commit only. A journal row is deleted by the fold that adds its units, in the same
//! transaction: each unit comes back once, whichever daemon folds, however many fold at once.
//!
//! What a reader of `sku_stock.available` sees: a closed order's units from the fold's commit,
//! at most about `fold_interval` plus one fold after the close's commit; never before the close
//! commits. In between, `available` under-counts by the journal's units (a buyer may briefly be
//! told "sold out"; nothing is ever sold twice). Exact stock at any instant is
//! `available + SUM(units) of the journal for that SKU` ([`units_pending`]).

use std::collections::{BTreeMap, HashSet};

use sqlx::{AnyConnection, Row};

use super::journal::{self, DeadLetter};
use super::shop::Schema;
use super::{Backend, Db, DbError, orders};

/// One SKU's part of a close transaction: `units` given back by `orders` orders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release<'a> {
    /// The SKU.
    pub sku: &'a str,
    /// Units, summed over the transaction's orders.
    pub units: i64,
    /// How many orders gave them (for the journal row; the ledger has each order's effect).
    pub orders: i64,
}

/// Appends `releases` to the journal in one statement, stamped `now_ms` (the close's written
/// time), and returns the SKUs that have no `sku_stock` row: nothing is appended for them (the
/// close records their effects FAILED, as the direct update does). The check is a plain read,
/// which takes no lock on the stock rows.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn append<'a>(
    conn: &mut AnyConnection,
    releases: &[Release<'a>],
    now_ms: i64,
) -> Result<HashSet<&'a str>, DbError> {
    if releases.is_empty() {
        return Ok(HashSet::new());
    }
    let backend = Backend::of(conn);
    let mut q = backend.query_owned(format!(
        "SELECT sku FROM sku_stock WHERE sku IN ({})",
        orders::marks(releases.len())
    ));
    for r in releases {
        q = q.bind(r.sku);
    }
    let present: HashSet<String> = q
        .fetch_all(&mut *conn)
        .await?
        .iter()
        .map(|row| row.try_get::<String, _>(0))
        .collect::<Result<_, _>>()?;
    let missing: HashSet<&str> = releases
        .iter()
        .map(|r| r.sku)
        .filter(|sku| !present.contains(*sku))
        .collect();
    let rows: Vec<&Release<'_>> = releases
        .iter()
        .filter(|r| !missing.contains(r.sku))
        .collect();
    if rows.is_empty() {
        return Ok(missing);
    }
    let mut q = backend.query_owned(format!(
        "INSERT INTO stock_journal (sku, units, orders, created_at_ms) VALUES {}",
        vec!["(?, ?, ?, ?)"; rows.len()].join(", ")
    ));
    for r in rows {
        q = q.bind(r.sku).bind(r.units).bind(r.orders).bind(now_ms);
    }
    q.execute(&mut *conn).await?;
    Ok(missing)
}

/// What one [`fold`] gave back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Folded {
    /// Journal rows folded (and deleted).
    pub rows: u64,
    /// Units added to `sku_stock`, over all SKUs.
    pub units: i64,
    /// The oldest folded row's `created_at_ms` (its close's written time), epoch ms.
    pub oldest_ms: Option<i64>,
    /// SKUs whose `sku_stock` row was gone by the fold, with their units: dead-lettered
    /// (source [`journal::SOURCE_STOCK_JOURNAL`]), not lost.
    pub missing: Vec<(String, i64)>,
}

/// Folds up to `batch` of the oldest journal rows into `sku_stock`, one transaction per SKU (in
/// SKU order): the SKU's rows are locked (`FOR UPDATE
/// SKIP LOCKED` on MySQL/PostgreSQL, whose sessions run at READ COMMITTED: a concurrent fold takes
/// others, and no gap is locked, so the closes' inserts never wait for a fold) and deleted, then
/// its units are added with one update, last, and committed. So a fold holds one hot row at a
/// time, from its update to its commit: a fold of eight SKUs in one transaction held each row it
/// had updated while it queued for the next one behind the order service's creates, and the
/// creates queued behind it (the 2026-12-07 soak). A SKU whose row is gone is dead-lettered with
/// its units and journal ids.
///
/// # Errors
/// [`DbError`] when a statement fails; that SKU's transaction rolls back and its rows stay for
/// the next fold (the SKUs folded before it stay folded).
pub async fn fold(db: &Db, now_ms: i64, batch: u32) -> Result<Folded, DbError> {
    // The candidates, read without a lock; an idle journal costs this one read, not a write
    // transaction (SQLite's writer, a fence).
    let candidates: Vec<(i64, String)> = db
        .backend()
        .query("SELECT id, sku FROM stock_journal ORDER BY id LIMIT ?")
        .bind(i64::from(batch.max(1)))
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .collect::<Result<_, sqlx::Error>>()?;
    let mut per_sku: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for (id, sku) in &candidates {
        per_sku.entry(sku.as_str()).or_default().push(*id);
    }
    let mut folded = Folded::default();
    for (sku, ids) in per_sku {
        fold_sku(db, sku, &ids, now_ms, &mut folded).await?;
    }
    Ok(folded)
}

/// One SKU's part of [`fold`]: its rows among `ids` that no other fold holds, in one
/// transaction, added to `folded`.
async fn fold_sku(
    db: &Db,
    sku: &str,
    ids: &[i64],
    now_ms: i64,
    folded: &mut Folded,
) -> Result<(), DbError> {
    let backend = db.backend();
    let lock = match backend {
        Backend::Sqlite => "",
        Backend::MySql | Backend::Postgres => " FOR UPDATE SKIP LOCKED",
    };
    let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
    let mut tx = db.begin().await?;
    let rows: Vec<(i64, i64, i64)> = backend
        .query_owned(format!(
            "SELECT id, units, created_at_ms FROM stock_journal WHERE id IN ({list}){lock}"
        ))
        .fetch_all(&mut *tx)
        .await?
        .iter()
        .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?)))
        .collect::<Result<_, sqlx::Error>>()?;
    if rows.is_empty() {
        tx.rollback().await?;
        return Ok(());
    }
    let taken: Vec<String> = rows.iter().map(|r| r.0.to_string()).collect();
    backend
        .query_owned(format!(
            "DELETE FROM stock_journal WHERE id IN ({})",
            taken.join(",")
        ))
        .execute(&mut *tx)
        .await?;
    let units: i64 = rows.iter().map(|r| r.1).sum();
    let restored = orders::restore_units(&mut tx, &Schema::Canonical, sku, units).await?;
    if !restored {
        let reason = format!(
            "no sku_stock row for `{sku}`: {units} units of the stock journal could not be given back"
        );
        let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
        journal::dead_letter(
            &mut tx,
            &DeadLetter {
                source: journal::SOURCE_STOCK_JOURNAL,
                order_id: None,
                reason: &reason,
                payload: serde_json::json!({ "sku": sku, "units": units, "journal_ids": ids })
                    .to_string(),
                attempts: 1,
            },
            now_ms,
        )
        .await?;
    }
    tx.commit().await?;
    folded.rows += rows.len() as u64;
    let oldest = rows.iter().map(|r| r.2).min();
    folded.oldest_ms = folded.oldest_ms.into_iter().chain(oldest).min();
    match restored {
        true => folded.units += units,
        false => folded.missing.push((sku.to_string(), units)),
    }
    Ok(())
}

/// Units in the journal not yet folded, for `sku` (all SKUs when `None`): what a reader of
/// `sku_stock.available` does not see yet.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn units_pending(db: &Db, sku: Option<&str>) -> Result<i64, DbError> {
    let cast = match db.backend() {
        Backend::MySql => "SIGNED",
        Backend::Sqlite | Backend::Postgres => "BIGINT",
    };
    let sql = format!(
        "SELECT CAST(COALESCE(SUM(units), 0) AS {cast}) FROM stock_journal{}",
        if sku.is_some() { " WHERE sku = ?" } else { "" }
    );
    let mut q = db.backend().query_owned(sql);
    if let Some(sku) = sku {
        q = q.bind(sku.to_string());
    }
    Ok(q.fetch_one(db.pool()).await?.try_get(0)?)
}
