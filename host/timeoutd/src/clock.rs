//! The one place timeoutd reads time.
//!
//! Decisions and the close compare-and-set use the *database* clock, never the local clock or a
//! message's timestamp, so several daemons on different hosts agree on what is overdue. Tests
//! inject a [`Clock::Manual`] to put "now" where they need it (one second before a deadline, an
//! hour after). Elapsed-time measurements go through [`Stopwatch`]; `std::time::Instant` is not
//! used anywhere else.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::db::{Db, DbError, WriteTx};

/// Where "now" comes from.
#[derive(Debug, Clone, Default)]
pub enum Clock {
    /// The database server's clock (production).
    #[default]
    Database,
    /// A value the test sets, epoch ms.
    Manual(Arc<AtomicI64>),
}

impl Clock {
    /// A manual clock reading `now_ms`, and the handle that moves it.
    pub fn manual(now_ms: i64) -> (Clock, Arc<AtomicI64>) {
        let cell = Arc::new(AtomicI64::new(now_ms));
        (Clock::Manual(cell.clone()), cell)
    }

    /// Whether this clock moves on while the host waits: the outbox's prefetch sleeps on the
    /// host's timer until a row falls due, which only makes sense on a clock that advances by
    /// itself (`false` for a [`Clock::Manual`], which moves only when a test moves it).
    pub fn advances_by_itself(&self) -> bool {
        matches!(self, Clock::Database)
    }

    /// Now, epoch ms.
    ///
    /// # Errors
    /// [`DbError`] when the database clock cannot be read.
    pub async fn now_ms(&self, db: &Db) -> Result<i64, DbError> {
        match self {
            Clock::Database => db.now_ms().await,
            Clock::Manual(cell) => Ok(cell.load(Ordering::SeqCst)),
        }
    }

    /// As [`Clock::now_ms`], the database clock read on `tx`'s connection (no second pool
    /// connection is taken while the transaction holds one).
    ///
    /// # Errors
    /// [`DbError`] when the database clock cannot be read.
    pub async fn now_ms_on(&self, db: &Db, tx: &mut WriteTx) -> Result<i64, DbError> {
        match self {
            Clock::Database => db.now_ms_on(tx).await,
            Clock::Manual(cell) => Ok(cell.load(Ordering::SeqCst)),
        }
    }
}

/// The host's wall clock, epoch ms — only for a stamp a peer checks against its own clock (a
/// request's `timestamp` to Alipay's gateway), never for a decision, which takes
/// [`Clock::now_ms`].
pub fn wall_ms() -> i64 {
    #[expect(
        clippy::disallowed_methods,
        reason = "a peer (Alipay's gateway) checks the stamp against its own wall clock, not the database's"
    )]
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Measures elapsed wall time (plugin latency, sweep duration).
#[derive(Debug, Clone, Copy)]
pub struct Stopwatch(std::time::Instant);

impl Stopwatch {
    /// Starts now.
    pub fn start() -> Self {
        Stopwatch(std::time::Instant::now())
    }

    /// Microseconds since start.
    pub fn elapsed_us(&self) -> i64 {
        i64::try_from(self.0.elapsed().as_micros()).unwrap_or(i64::MAX)
    }

    /// Milliseconds since start.
    pub fn elapsed_ms(&self) -> i64 {
        i64::try_from(self.0.elapsed().as_millis()).unwrap_or(i64::MAX)
    }
}
