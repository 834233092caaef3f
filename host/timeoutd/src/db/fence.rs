//! The write fence: on MariaDB/MySQL a write transaction commits only as the transaction it
//! began as, or not at all.
//!
//! # Why
//!
//! When MariaDB or MySQL ends a transaction on its own — a deadlock victim (`1213`), a Galera
//! node aborting a local transaction to apply another node's write set — the session is left
//! outside any transaction. With `autocommit = 1` (the default, and sqlx's `BEGIN`
//! transactions run on it) a statement the client sends after that commits *by itself*. A
//! close that carried on past such an abort would leave its order PENDING while its later
//! statements — ledger rows, close records, finished outbox rows, stock given back — commit one
//! by one. timeoutd never sends a statement after an error it sees; the fence is for the error
//! it does not see (docs/scaling.md, "The Galera double close of 2026-12-02": a `1213` lost
//! between server and client has happened in MariaDB before, MDEV-24255).
//!
//! PostgreSQL refuses every statement of an aborted transaction until it ends (`25P02`), and
//! SQLite never aborts a transaction under a writer: neither needs a fence.
//!
//! # How
//!
//! A fenced transaction runs with `autocommit = 0`, so a statement sent after an abort opens a
//! new implicit transaction instead of committing. Its first write inserts a row with a random
//! token into `write_fence` (migration 12); the commit first deletes that row and commits only
//! if the delete found it. After an abort the row went with the aborted transaction, so the
//! delete finds nothing: everything sent since is rolled back and the commit fails with
//! [`DbError::Aborted`]. The table stays empty: every row is deleted by the transaction that
//! wrote it. Cost: one round trip per transaction (the delete); `BEGIN` becomes
//! `SET autocommit = 0; INSERT …` and `COMMIT` becomes `COMMIT; SET autocommit = 1`, one round
//! trip each as before.
//!
//! A fenced transaction dropped without [`Fenced::commit`] or [`Fenced::rollback`] (an error
//! returned with `?`, a cancelled future) rolls back and restores `autocommit = 1` on a task
//! of its own before the connection goes back to the pool (as sqlx's own `PoolConnection`
//! returns itself); if that fails the connection is closed, never reused with
//! `autocommit = 0`.

use std::ops::{Deref, DerefMut};

use sqlx::pool::PoolConnection;
use sqlx::{Any, AnyConnection, AnyPool, AssertSqlSafe, raw_sql};

use super::DbError;

/// Ends a fenced transaction without its writes and restores the session's autocommit.
const ROLLBACK: &str = "ROLLBACK; SET autocommit = 1";

/// A MariaDB/MySQL write transaction that commits only as the transaction it began as.
/// Dereferences to its connection.
pub struct Fenced {
    /// `None` once ended (committed or rolled back, autocommit restored).
    conn: Option<PoolConnection<Any>>,
    /// This transaction's row in `write_fence`.
    token: i64,
}

impl Fenced {
    /// Takes a connection of `pool` and begins: `autocommit = 0` and this transaction's fence
    /// row, in one round trip.
    ///
    /// # Errors
    /// [`DbError::Sql`] when no connection can be had or the fence row cannot be written (the
    /// `write_fence` table is missing: the database is not migrated).
    pub async fn begin(pool: &AnyPool) -> Result<Fenced, DbError> {
        let conn = pool.acquire().await?;
        let token = fastrand::i64(1..i64::MAX);
        let mut tx = Fenced {
            conn: Some(conn),
            token,
        };
        // The token is a number this process made: nothing from outside is in the text.
        let begin = format!(
            "SET autocommit = 0; INSERT INTO {} (token) VALUES ({token})",
            super::names::table("write_fence")
        );
        raw_sql(AssertSqlSafe(begin)).execute(tx.conn_mut()).await?;
        Ok(tx)
    }

    /// Commits if this is still the transaction [`Fenced::begin`] began; otherwise rolls back
    /// what was sent since it ended.
    ///
    /// # Errors
    /// [`DbError::Aborted`] when the server had ended the transaction before (nothing written
    /// since its start is kept); [`DbError::Sql`] when a statement or the commit fails (Galera
    /// certification answers `1213` here): nothing was written.
    pub async fn commit(mut self) -> Result<(), DbError> {
        let token = self.token;
        let fence = super::Backend::MySql
            .query("DELETE FROM write_fence WHERE token = ?")
            .bind(token);
        let found = fence.execute(self.conn_mut()).await?.rows_affected();
        if found != 1 {
            self.end(ROLLBACK).await?;
            return Err(DbError::Aborted {
                detail: format!(
                    "write fence {token} was gone at commit: the server ended the transaction \
                     earlier (a deadlock, or Galera applying another node's write) and its error \
                     never reached this client; everything sent since was rolled back"
                ),
            });
        }
        self.end("COMMIT; SET autocommit = 1").await
    }

    /// Rolls back.
    ///
    /// # Errors
    /// [`DbError::Sql`] when the connection fails (the server rolls back anyway; the
    /// connection is closed, not reused).
    pub async fn rollback(mut self) -> Result<(), DbError> {
        self.end(ROLLBACK).await
    }

    /// Runs `sql` (ending the transaction and restoring autocommit); on success the connection
    /// goes back to the pool as it came, on failure [`Drop`] cleans it up.
    async fn end(&mut self, sql: &'static str) -> Result<(), DbError> {
        raw_sql(sql).execute(self.conn_mut()).await?;
        self.conn = None;
        Ok(())
    }

    fn conn_mut(&mut self) -> &mut AnyConnection {
        self.conn
            .as_mut()
            .expect("a fenced transaction is used only until it ends")
    }
}

impl Drop for Fenced {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(e) = raw_sql(ROLLBACK).execute(&mut *conn).await {
                        tracing::debug!(error = %e, "closing a connection whose fenced transaction could not be rolled back");
                        let _ = conn.close().await;
                    }
                });
            }
            // No runtime to clean up on: the server rolls back when the connection closes.
            Err(_) => conn.close_on_drop(),
        }
    }
}

impl Deref for Fenced {
    type Target = AnyConnection;
    fn deref(&self) -> &AnyConnection {
        self.conn
            .as_ref()
            .expect("a fenced transaction is used only until it ends")
    }
}

impl DerefMut for Fenced {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        self.conn_mut()
    }
}
