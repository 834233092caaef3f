//! `order_timeout_msg`, the local message table: claiming due rows under a lease, and moving a
//! row on (processed, deferred, retried), and the rows that decisions and the sweep add.

use sqlx::{AnyConnection, Row};

use super::{Backend, Db, DbError};

/// Who put a row in `order_timeout_msg` (its `source` column): decides the trigger kind the
/// plugin sees ([`crate::sources::outbox::trigger_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowSource {
    /// The shop's order service: the column's default `order-service`, and any name timeoutd
    /// does not write itself (a shop may name its writers as it likes).
    OrderService,
    /// A `wait` decision's next phase ([`SOURCE_WAIT`]).
    Wait,
    /// A `wait` that asked for the payment provider to be polled ([`SOURCE_POLL`]).
    Poll,
    /// Re-armed by the sweep ([`SOURCE_SWEEP`]).
    Sweep,
    /// Re-armed by an operator ([`SOURCE_MANUAL`]).
    Manual,
}

impl RowSource {
    /// The `source` value timeoutd writes for it (`order-service` for the shop's rows, the
    /// column's default).
    pub const fn as_str(self) -> &'static str {
        match self {
            RowSource::OrderService => "order-service",
            RowSource::Wait => "wait",
            RowSource::Poll => "wait-poll",
            RowSource::Sweep => "sweep",
            RowSource::Manual => "manual",
        }
    }

    /// The source a row's `source` value names: timeoutd's own names, and
    /// [`RowSource::OrderService`] for every other (the one place that rule lives).
    pub fn of(name: &str) -> RowSource {
        [
            RowSource::Wait,
            RowSource::Poll,
            RowSource::Sweep,
            RowSource::Manual,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
        .unwrap_or(RowSource::OrderService)
    }
}

/// Rows of a `wait` decision's next phase.
pub const SOURCE_WAIT: &str = RowSource::Wait.as_str();
/// Rows of a phase whose `wait` asked for the payment provider to be polled (`poll_payment`):
/// their trigger asks the provider even before the deadline.
pub const SOURCE_POLL: &str = RowSource::Poll.as_str();
/// Rows re-armed by the sweep.
pub const SOURCE_SWEEP: &str = RowSource::Sweep.as_str();
/// Rows re-armed by an operator (a re-driven dead letter).
pub const SOURCE_MANUAL: &str = RowSource::Manual.as_str();

/// A claimed, due outbox row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueRow {
    /// Row id.
    pub id: i64,
    /// Order it is for.
    pub order_id: String,
    /// Phase to decide, as stored (a value outside 0..=u32::MAX is a bad row).
    pub phase: i64,
    /// Earlier attempts.
    pub attempts: u32,
    /// When it was due, epoch ms.
    pub due_ms: i64,
    /// `order-service`, `wait` or `sweep`.
    pub source: String,
    /// The state its phase was scheduled with (hex, as stored), `None` for none.
    pub state: Option<String>,
    /// The claim token it is held under.
    pub claim_token: Option<String>,
}

/// A claimed row as its completion names it: the id, and the claim token it was taken under
/// (`None` for a row handled without a claim). A completion under a token is fenced: it
/// changes the row only while that token still holds it, else it fails with
/// [`DbError::StaleClaim`] (and the caller's transaction, if any, rolls back): a holder whose
/// lease lapsed while it worked cannot finish, defer or retry what another holder now has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowRef<'a> {
    /// Row id.
    pub id: i64,
    /// Claim token, when the row was claimed.
    pub claim: Option<&'a str>,
}

impl<'a> RowRef<'a> {
    /// A row named by id alone (no fence).
    pub fn unclaimed(id: i64) -> Self {
        RowRef { id, claim: None }
    }

    /// `WHERE` text fencing by the claim (`AND claim_token = ?`), or nothing.
    fn fence(&self) -> &'static str {
        if self.claim.is_some() {
            " AND claim_token = ?"
        } else {
            ""
        }
    }

    /// Binds the row's id and then, when fenced, its claim token.
    fn bind<'q>(
        &self,
        q: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>,
    ) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments> {
        let q = q.bind(self.id);
        match self.claim {
            Some(token) => q.bind(token.to_string()),
            None => q,
        }
    }

    /// `Err(StaleClaim)` when a fenced statement changed nothing.
    fn held(&self, affected: u64) -> Result<(), DbError> {
        if self.claim.is_some() && affected == 0 {
            crate::events::emit(crate::events::Event::StaleClaim {
                table: "order_timeout_msg",
            });
            return Err(DbError::StaleClaim {
                table: "order_timeout_msg",
                id: self.id,
            });
        }
        Ok(())
    }
}

/// Claims up to `batch` PENDING rows due at `now_ms` that nobody holds, for `lease_ms`.
///
/// On MySQL/MariaDB the candidates are locked with `FOR UPDATE SKIP LOCKED`, so two daemons
/// claiming at once take disjoint rows; SQLite has one writer, and claims with a single
/// `UPDATE`. A claim that is not finished within the lease (the daemon died) lapses and the row
/// is claimed again.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn claim_due(
    db: &Db,
    now_ms: i64,
    batch: u32,
    lease_ms: i64,
) -> Result<Vec<DueRow>, DbError> {
    claim_due_with_sent(db, now_ms, None, batch, lease_ms).await
}

/// [`claim_due`], also taking back SENT rows (published to the broker by the relay) that are
/// due at or before `sent_due_before_ms` and still unprocessed: the broker's message is late or
/// lost, so the outbox timer acts on the row directly.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn claim_due_with_sent(
    db: &Db,
    now_ms: i64,
    sent_due_before_ms: Option<i64>,
    batch: u32,
    lease_ms: i64,
) -> Result<Vec<DueRow>, DbError> {
    let token = super::claim_token("");
    let until_ms = now_ms + lease_ms;
    let batch = i64::from(batch);
    // The late broker rows first (they are the older), then due PENDING rows up to the batch:
    // one status per statement, so each reads its index in due order and stops at its LIMIT
    // ([`PENDING_DUE`]).
    let mut taken = 0;
    if let Some(cutoff) = sent_due_before_ms {
        taken = mark(db, SENT_DUE, &[cutoff, now_ms, batch], &token, until_ms).await?;
    }
    if taken < batch {
        mark(
            db,
            PENDING_DUE,
            &[now_ms, now_ms, batch - taken],
            &token,
            until_ms,
        )
        .await?;
    }
    held_by(db, &token).await
}

/// The due claim's candidates: PENDING rows due by `?` that nobody holds at `?`, earliest first,
/// `LIMIT ?`. One status, so the `(status, due_ms)` index gives the rows already in due order:
/// the server reads (and, `FOR UPDATE SKIP LOCKED`, locks) only the rows it returns. The
/// earlier form took PENDING and SENT rows in one `OR`, whose two index ranges MariaDB merged
/// with a filesort: it read and locked every due row (about 40,000 record locks for a claim of
/// 256 among 20,000 due rows, #48) and a second daemon's concurrent claim found none free.
pub const PENDING_DUE: &str = "SELECT id FROM order_timeout_msg WHERE status = 'PENDING' \
     AND due_ms <= ? AND (claim_until_ms IS NULL OR claim_until_ms < ?) ORDER BY due_ms LIMIT ?";

/// As [`PENDING_DUE`] for SENT rows (relayed to the broker) due by `?`: their message is late
/// or lost, so the outbox timer takes them back.
pub const SENT_DUE: &str = "SELECT id FROM order_timeout_msg WHERE status = 'SENT' \
     AND due_ms <= ? AND (claim_until_ms IS NULL OR claim_until_ms < ?) ORDER BY due_ms LIMIT ?";

/// Claims up to `batch` PENDING rows nobody holds that fall due after `now_ms` and at or before
/// `horizon_ms`, for `lease_ms` from now, earliest first: the outbox timer's prefetch
/// ([`crate::sources::prefetch`]), which loads their orders ahead and decides them when due.
/// SENT rows (the broker's) are not taken: their message comes first.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn claim_soon_due(
    db: &Db,
    now_ms: i64,
    horizon_ms: i64,
    batch: u32,
    lease_ms: i64,
) -> Result<Vec<DueRow>, DbError> {
    let token = super::claim_token("pre-");
    claim(
        db,
        "SELECT id FROM order_timeout_msg WHERE status = 'PENDING' AND due_ms > ? \
         AND due_ms <= ? AND (claim_until_ms IS NULL OR claim_until_ms < ?) \
         ORDER BY due_ms LIMIT ?",
        &[now_ms, horizon_ms, now_ms, i64::from(batch)],
        &token,
        now_ms + lease_ms,
    )
    .await
}

/// Gives up every unfinished row held under `token` (claimed and not yet worked on, e.g.
/// prefetched rows when the daemon stops), so another holder can take them at once instead of
/// after the lease. Returns how many it gave up.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn release_held(db: &Db, token: &str) -> Result<u64, DbError> {
    let _gate = db.write_gate().await;
    let done = db
        .backend()
        .query(
            "UPDATE order_timeout_msg SET claim_token = NULL, claim_until_ms = NULL \
             WHERE claim_token = ? AND status IN ('PENDING', 'SENT')",
        )
        .bind(token.to_string())
        .execute(db.pool())
        .await?;
    Ok(done.rows_affected())
}

/// Claims up to `batch` phase-0 rows (an order's first, the order service's) not yet due that
/// the daemon has never looked at (`seen_at_ms` NULL), PENDING or relayed (SENT), for
/// `lease_ms`, and marks them seen at `now_ms`: the early
/// look that lets an API 0.2.0 plugin decide an order's first phase before its deadline. A
/// row is looked at once; a 0.1.0 merchant's row is released unchanged
/// ([`release`]).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn claim_unseen(
    db: &Db,
    now_ms: i64,
    batch: u32,
    lease_ms: i64,
) -> Result<Vec<DueRow>, DbError> {
    let token = super::claim_token("seen-");
    let rows = claim(
        db,
        "SELECT id FROM order_timeout_msg WHERE seen_at_ms IS NULL AND phase = 0 \
         AND status IN ('PENDING', 'SENT') AND due_ms > ? \
         AND (claim_until_ms IS NULL OR claim_until_ms < ?) ORDER BY id LIMIT ?",
        &[now_ms, now_ms, i64::from(batch)],
        &token,
        now_ms + lease_ms,
    )
    .await?;
    if !rows.is_empty() {
        let _gate = db.write_gate().await;
        db.backend()
            .query("UPDATE order_timeout_msg SET seen_at_ms = ? WHERE claim_token = ?")
            .bind(now_ms)
            .bind(token)
            .execute(db.pool())
            .await?;
    }
    Ok(rows)
}

/// An operator's trigger for `order_id`: the row of its `phase`, made PENDING and due now as
/// `manual` (attempts reset, its phase's state kept; inserted when the order has none) and
/// claimed for `lease_ms`, in one transaction, so no other claimer can take it in between.
/// `None` when another holder has the row under a live lease.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn claim_for_operator(
    db: &Db,
    order_id: &str,
    phase: u32,
    now_ms: i64,
    lease_ms: i64,
) -> Result<Option<DueRow>, DbError> {
    let backend = db.backend();
    let token = super::claim_token("manual-");
    let until_ms = now_ms + lease_ms;
    let mut tx = db.begin().await?;
    let inserted = backend
        .query_owned(format!(
            "{insert} INTO order_timeout_msg \
             (order_id, due_ms, phase, status, source, claim_token, claim_until_ms) \
             VALUES (?, ?, ?, 'PENDING', ?, ?, ?){on_conflict}",
            insert = backend.insert_ignore().0,
            on_conflict = backend.insert_ignore().1,
        ))
        .bind(order_id)
        .bind(now_ms)
        .bind(i64::from(phase))
        .bind(SOURCE_MANUAL)
        .bind(token.clone())
        .bind(until_ms)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if inserted == 0 {
        backend
            .query(
                "UPDATE order_timeout_msg SET status = 'PENDING', \
                 due_ms = CASE WHEN due_ms > ? THEN ? ELSE due_ms END, source = ?, attempts = 0, \
                 claim_token = ?, claim_until_ms = ? \
                 WHERE order_id = ? AND phase = ? AND (claim_until_ms IS NULL OR claim_until_ms < ?)",
            )
            .bind(now_ms)
            .bind(now_ms)
            .bind(SOURCE_MANUAL)
            .bind(token.clone())
            .bind(until_ms)
            .bind(order_id)
            .bind(i64::from(phase))
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(held_by(db, &token).await?.into_iter().next())
}

/// Gives up a claim on row `id` and changes nothing else (its due time and status stay): an
/// early-looked row that is not to be decided yet.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn release(db: &Db, row: RowRef<'_>) -> Result<(), DbError> {
    let _gate = db.write_gate().await;
    let q = db.backend().query_owned(format!(
        "UPDATE order_timeout_msg SET claim_token = NULL, claim_until_ms = NULL \
         WHERE id = ?{} AND status <> 'PROCESSED'",
        row.fence()
    ));
    let done = row.bind(q).execute(db.pool()).await?;
    row.held(done.rows_affected())
}

/// Extends the lease of every unfinished row held under `token` to `until_ms` (the holder is
/// still working on them). Returns how many it still holds.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn renew(db: &Db, token: &str, until_ms: i64) -> Result<u64, DbError> {
    let _gate = db.write_gate().await;
    let done = db
        .backend()
        .query(
            "UPDATE order_timeout_msg SET claim_until_ms = ? \
             WHERE claim_token = ? AND status IN ('PENDING', 'SENT')",
        )
        .bind(until_ms)
        .bind(token.to_string())
        .execute(db.pool())
        .await?;
    Ok(done.rows_affected())
}

/// Claims the rows `candidates` selects (a `SELECT id … LIMIT ?` over `order_timeout_msg`, its
/// placeholders bound to `binds` in order) for `token` until `until_ms`, and returns them: one
/// `UPDATE` on SQLite (one writer), `FOR UPDATE SKIP LOCKED` on MySQL/PostgreSQL so concurrent
/// claimers take disjoint rows. The one claim rule of the outbox timer and the relay.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub(crate) async fn claim(
    db: &Db,
    candidates: &str,
    binds: &[i64],
    token: &str,
    until_ms: i64,
) -> Result<Vec<DueRow>, DbError> {
    mark(db, candidates, binds, token, until_ms).await?;
    held_by(db, token).await
}

/// The work of [`claim`] without reading the rows back: returns how many rows it claimed.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
async fn mark(
    db: &Db,
    candidates: &str,
    binds: &[i64],
    token: &str,
    until_ms: i64,
) -> Result<i64, DbError> {
    let claimed = match db.backend() {
        Backend::Sqlite => {
            let _gate = db.write_gate().await;
            let mut q = db
                .backend()
                .query_owned(format!(
                    "UPDATE order_timeout_msg SET claim_token = ?, claim_until_ms = ? \
                     WHERE id IN ({candidates})"
                ))
                .bind(token.to_string())
                .bind(until_ms);
            for b in binds {
                q = q.bind(*b);
            }
            q.execute(db.pool()).await?.rows_affected()
        }
        Backend::MySql | Backend::Postgres => {
            let mut tx = db.begin().await?;
            let mut q = db
                .backend()
                .query_owned(format!("{candidates} FOR UPDATE SKIP LOCKED"));
            for b in binds {
                q = q.bind(*b);
            }
            let ids: Vec<i64> = q
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(|r| r.try_get::<i64, _>(0))
                .collect::<Result<_, _>>()?;
            if ids.is_empty() {
                tx.rollback().await?;
                return Ok(0);
            }
            let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",");
            db.backend()
                .query_owned(format!(
                    "UPDATE order_timeout_msg SET claim_token = ?, claim_until_ms = ? \
                     WHERE id IN ({list})"
                ))
                .bind(token.to_string())
                .bind(until_ms)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            ids.len() as u64
        }
    };
    Ok(i64::try_from(claimed).unwrap_or(i64::MAX))
}

/// The rows claimed under `token`, by due time.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub(crate) async fn held_by(db: &Db, token: &str) -> Result<Vec<DueRow>, DbError> {
    let rows = db
        .backend()
        .query(
            "SELECT id, order_id, phase, attempts, due_ms, source, state, claim_token \
         FROM order_timeout_msg WHERE claim_token = ? ORDER BY due_ms",
        )
        .bind(token.to_string())
        .fetch_all(db.pool())
        .await?;
    rows.iter()
        .map(|r| {
            Ok(DueRow {
                id: r.try_get("id")?,
                order_id: r.try_get("order_id")?,
                phase: r.try_get::<i64, _>("phase")?,
                attempts: r.try_get::<i64, _>("attempts")?.clamp(0, u32::MAX as i64) as u32,
                due_ms: r.try_get("due_ms")?,
                source: r.try_get("source")?,
                state: r.try_get("state")?,
                claim_token: r.try_get("claim_token")?,
            })
        })
        .collect()
}

/// The earliest due time among PENDING rows nobody holds at `now_ms`.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn next_due_ms(db: &Db, now_ms: i64) -> Result<Option<i64>, DbError> {
    next_due_ms_with_sent(db, now_ms, None).await
}

/// [`next_due_ms`], counting a SENT row as due `sent_grace_ms` after its due time (when the
/// outbox timer would take it back from the broker).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn next_due_ms_with_sent(
    db: &Db,
    now_ms: i64,
    sent_grace_ms: Option<i64>,
) -> Result<Option<i64>, DbError> {
    let pending: Option<i64> = db
        .backend()
        .query(
            "SELECT MIN(due_ms) FROM order_timeout_msg WHERE status = 'PENDING' \
         AND (claim_until_ms IS NULL OR claim_until_ms < ?)",
        )
        .bind(now_ms)
        .fetch_one(db.pool())
        .await?
        .try_get(0)?;
    let Some(grace) = sent_grace_ms else {
        return Ok(pending);
    };
    let sent: Option<i64> = db
        .backend()
        .query(
            "SELECT MIN(due_ms) FROM order_timeout_msg WHERE status = 'SENT' \
         AND (claim_until_ms IS NULL OR claim_until_ms < ?)",
        )
        .bind(now_ms)
        .fetch_one(db.pool())
        .await?
        .try_get(0)?;
    Ok(match (pending, sent.map(|d| d.saturating_add(grace))) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    })
}

/// Marks a row processed (with an optional note, e.g. why it was a no-op) and drops its claim.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn finish(
    conn: &mut AnyConnection,
    row: RowRef<'_>,
    now_ms: i64,
    note: Option<&str>,
) -> Result<(), DbError> {
    let q = Backend::of(conn)
        .query_owned(format!(
            "UPDATE order_timeout_msg SET status = 'PROCESSED', processed_at_ms = ?, last_error = ?, \
             claim_token = NULL, claim_until_ms = NULL WHERE id = ?{}",
            row.fence()
        ))
        .bind(now_ms)
        .bind(note.map(str::to_string));
    let done = row.bind(q).execute(&mut *conn).await?;
    row.held(done.rows_affected())
}

/// [`finish`] for a group's rows, all with the same `note`: one statement for the claimed rows
/// and one for any unclaimed ones, however many claims the rows were taken under. Each claimed
/// row is fenced by its own claim token: by `claim_token = ?` when the rows share one (the
/// outbox timer's batches), by `claim_token = CASE id WHEN ? THEN ? … END` when they do not (a
/// broker burst's held messages were claimed a listener call at a time). One statement per claim
/// held the group's hot stock rows locked through a hundred round trips: a 10,000-message
/// burst closed at 800/s instead of thousands.
///
/// # Errors
/// [`DbError::Sql`] on query failure; [`DbError::StaleClaim`] when a claimed row's claim went
/// stale (which one is not known from the count: the group is split and each row finds out
/// alone).
pub async fn finish_many(
    conn: &mut AnyConnection,
    rows: &[RowRef<'_>],
    now_ms: i64,
    note: Option<&str>,
) -> Result<(), DbError> {
    let (claimed, unclaimed): (Vec<&RowRef<'_>>, Vec<&RowRef<'_>>) =
        rows.iter().partition(|row| row.claim.is_some());
    for part in [claimed, unclaimed] {
        let Some(first) = part.first() else { continue };
        let marks = super::orders::marks(part.len());
        let shared = part.iter().all(|row| row.claim == first.claim);
        let fence = match first.claim {
            None => String::new(),
            Some(_) if shared => " AND claim_token = ?".to_string(),
            Some(_) => format!(
                " AND claim_token = {}",
                super::orders::case_by_id(part.len())
            ),
        };
        let mut q = Backend::of(conn).query_owned(format!(
            "UPDATE order_timeout_msg SET status = 'PROCESSED', processed_at_ms = ?, last_error = ?, \
             claim_token = NULL, claim_until_ms = NULL WHERE id IN ({marks}){fence}"
        ));
        q = q.bind(now_ms).bind(note.map(str::to_string));
        for row in &part {
            q = q.bind(row.id);
        }
        match first.claim {
            None => {}
            Some(token) if shared => q = q.bind(token.to_string()),
            Some(_) => {
                for row in &part {
                    q = q.bind(row.id).bind(row.claim.map(str::to_string));
                }
            }
        }
        let done = q.execute(&mut *conn).await?;
        if first.claim.is_some() && done.rows_affected() < part.len() as u64 {
            first.held(0)?;
        }
    }
    Ok(())
}

/// Moves a row's due time to `due_ms` (an early trigger waits for the deadline, a tripped
/// plugin's trigger for the trip's end, a held order's for its payment lease) and drops the
/// claim; attempts are not counted, `why` is noted in `last_error` (so a row timeoutd deferred
/// is told from one the order service wrote due late: [`find_orphans`]). A SENT row becomes
/// PENDING again (its message has been consumed), so the relay or the outbox timer schedules it
/// anew.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn defer(db: &Db, row: RowRef<'_>, due_ms: i64, why: &str) -> Result<(), DbError> {
    let _gate = db.write_gate().await;
    let q = db
        .backend()
        .query_owned(defer_sql(row))
        .bind(due_ms)
        .bind(why.to_string());
    let done = row.bind(q).execute(db.pool()).await?;
    row.held(done.rows_affected())
}

fn defer_sql(row: RowRef<'_>) -> String {
    format!(
        "UPDATE order_timeout_msg SET due_ms = ?, last_error = ?, status = 'PENDING', \
         claim_token = NULL, claim_until_ms = NULL WHERE id = ?{} AND status <> 'PROCESSED'",
        row.fence()
    )
}

/// [`defer`] inside the caller's transaction `conn`.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn defer_in(
    conn: &mut AnyConnection,
    row: RowRef<'_>,
    due_ms: i64,
    why: &str,
) -> Result<(), DbError> {
    let q = Backend::of(conn)
        .query_owned(defer_sql(row))
        .bind(due_ms)
        .bind(why.to_string());
    let done = row.bind(q).execute(&mut *conn).await?;
    row.held(done.rows_affected())
}

/// Counts a failed attempt, records why, and makes the row due again at `due_ms` (PENDING: a
/// SENT row's message has been consumed).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn retry_later(
    db: &Db,
    row: RowRef<'_>,
    due_ms: i64,
    error: &str,
) -> Result<(), DbError> {
    let _gate = db.write_gate().await;
    let q = db
        .backend()
        .query_owned(format!(
            "UPDATE order_timeout_msg SET attempts = attempts + 1, due_ms = ?, last_error = ?, \
             status = 'PENDING', claim_token = NULL, claim_until_ms = NULL \
             WHERE id = ?{} AND status <> 'PROCESSED'",
            row.fence()
        ))
        .bind(due_ms)
        .bind(error.to_string());
    let done = row.bind(q).execute(db.pool()).await?;
    row.held(done.rows_affected())
}

/// One next phase a `wait` decision schedules ([`schedule_phases`]).
#[derive(Debug, Clone, Copy)]
pub struct NextPhase<'a> {
    /// The order.
    pub order_id: &'a str,
    /// The phase to schedule.
    pub phase: u32,
    /// When it is due, epoch ms.
    pub due_ms: i64,
    /// The state the wait hands to it (stored as hex; empty is none).
    pub state: &'a [u8],
    /// A polling phase ([`SOURCE_POLL`]): its trigger asks the payment provider even before
    /// the deadline.
    pub poll: bool,
}

/// Schedules each of `phases` (the `wait` decisions of a group; one for a single wait), in
/// multi-row statements. A row for a phase that already exists is left as it is, so a replayed
/// decision schedules nothing twice. Returns how many rows were inserted.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn schedule_phases(
    conn: &mut AnyConnection,
    backend: Backend,
    phases: &[NextPhase<'_>],
) -> Result<u64, DbError> {
    let mut inserted = 0;
    for chunk in phases.chunks(super::ledger::ROWS_PER_INSERT) {
        let values = vec!["(?, ?, ?, 'PENDING', ?, ?)"; chunk.len()].join(", ");
        let mut q = backend.query_owned(format!(
            "{insert} INTO order_timeout_msg (order_id, due_ms, phase, status, source, state) \
             VALUES {values}{on_conflict}",
            insert = backend.insert_ignore().0,
            on_conflict = backend.insert_ignore().1,
        ));
        for next in chunk {
            let source = if next.poll { SOURCE_POLL } else { SOURCE_WAIT };
            q = q
                .bind(next.order_id.to_string())
                .bind(next.due_ms)
                .bind(i64::from(next.phase))
                .bind(source)
                .bind((!next.state.is_empty()).then(|| hex::encode(next.state)));
        }
        inserted += q.execute(&mut *conn).await?.rows_affected();
    }
    Ok(inserted)
}

/// Inserts the PENDING row for `(order_id, phase)` due at `due_ms` with `source`, unless one
/// exists (then it is left as it is).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn insert_row(
    conn: &mut AnyConnection,
    backend: Backend,
    order_id: &str,
    phase: u32,
    due_ms: i64,
    source: &str,
) -> Result<(), DbError> {
    insert_rows(conn, backend, &[(order_id, phase, due_ms)], source).await?;
    Ok(())
}

/// [`insert_row`] for many `(order, phase, due_ms)` rows with one `source`, in multi-row
/// statements: how many were inserted (rows whose `(order_id, phase)` existed are left as they
/// are and not counted).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn insert_rows(
    conn: &mut AnyConnection,
    backend: Backend,
    rows: &[(&str, u32, i64)],
    source: &str,
) -> Result<u64, DbError> {
    let mut inserted = 0;
    for chunk in rows.chunks(super::ledger::ROWS_PER_INSERT) {
        let values = vec!["(?, ?, ?, 'PENDING', ?)"; chunk.len()].join(", ");
        let mut q = backend.query_owned(format!(
            "{insert} INTO order_timeout_msg (order_id, due_ms, phase, status, source) \
             VALUES {values}{on_conflict}",
            insert = backend.insert_ignore().0,
            on_conflict = backend.insert_ignore().1,
        ));
        for (order, phase, due_ms) in chunk {
            q = q
                .bind(order.to_string())
                .bind(*due_ms)
                .bind(i64::from(*phase))
                .bind(source.to_string());
        }
        inserted += q.execute(&mut *conn).await?.rows_affected();
    }
    Ok(inserted)
}

/// `EXISTS (…)` on an `order_timeout_msg` row's order: it is still pending, in `orders` or in
/// the shop's table; with the shop's fragment, whose values are bound after the statement's
/// own markers before it.
fn order_still_pending(db: &Db) -> (String, Option<super::shop::mapped::Stmt>) {
    match db
        .schema()
        .mapped()
        .map(|m| m.pending_exists("order_timeout_msg.order_id"))
    {
        Some(exists) => (exists.sql.clone(), Some(exists)),
        None => (
            "EXISTS (SELECT 1 FROM orders o WHERE o.id = order_timeout_msg.order_id \
             AND o.status = 'PENDING')"
                .to_string(),
            None,
        ),
    }
}

/// A trigger row as a caller read it: [`arm_order`] changes the row only while it still is so.
#[derive(Debug, Clone, Copy)]
pub struct Seen<'a> {
    /// `PENDING`, `SENT`, `PROCESSED`, …
    pub status: &'a str,
    /// When it was due, epoch ms.
    pub due_ms: i64,
    /// Who armed it.
    pub source: &'a str,
}

/// Arms `order_id`'s `phase` row as `source`, PENDING and due at `due_ms`, with a fresh
/// attempt budget and its phase's state kept: a compare-and-set on the row as the caller saw
/// it (`seen`: same status, due time and source, held under no live lease, its order still
/// pending), or, when the caller saw no row (`None`), an insert that an existing row makes a
/// no-op. `true` when a row was changed or inserted: a row a daemon took, decided or re-armed
/// since the caller's read is left alone, so arming the same order twice changes it once (the
/// bulk order operations, `crate::bulk::orders`). A row inserted for an order paid in between
/// is a trigger that finds it paid and does nothing.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn arm_order(
    db: &Db,
    order_id: &str,
    phase: u32,
    due_ms: i64,
    now_ms: i64,
    source: &str,
    seen: Option<Seen<'_>>,
) -> Result<bool, DbError> {
    let backend = db.backend();
    let Some(seen) = seen else {
        let mut tx = db.begin().await?;
        let inserted = insert_rows(&mut tx, backend, &[(order_id, phase, due_ms)], source).await?;
        tx.commit().await?;
        return Ok(inserted > 0);
    };
    let (pending, mapped) = order_still_pending(db);
    let mut q = backend
        .query_owned(format!(
            "UPDATE order_timeout_msg SET status = 'PENDING', due_ms = ?, source = ?, \
             attempts = 0, claim_token = NULL, claim_until_ms = NULL \
             WHERE order_id = ? AND phase = ? AND status = ? AND due_ms = ? AND source = ? \
             AND (claim_until_ms IS NULL OR claim_until_ms < ?) AND {pending}"
        ))
        .bind(due_ms)
        .bind(source.to_string())
        .bind(order_id.to_string())
        .bind(i64::from(phase))
        .bind(seen.status.to_string())
        .bind(seen.due_ms)
        .bind(seen.source.to_string())
        .bind(now_ms);
    if let Some(exists) = mapped {
        q = exists.bind_onto(q);
    }
    let _gate = db.write_gate().await;
    Ok(q.execute(db.pool()).await?.rows_affected() > 0)
}

/// The latest phase scheduled for `order_id` (0 when it has no outbox row), the phase an
/// operator's trigger for it decides.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn latest_phase(db: &Db, order_id: &str) -> Result<u32, DbError> {
    let phase: Option<i64> = db
        .backend()
        .query("SELECT MAX(phase) FROM order_timeout_msg WHERE order_id = ?")
        .bind(order_id)
        .fetch_one(db.pool())
        .await?
        .try_get(0)?;
    Ok(phase.unwrap_or(0).clamp(0, i64::from(u32::MAX)) as u32)
}

/// An overdue open order with no live trigger, found by the sweep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    /// Order id.
    pub order_id: String,
    /// Latest phase scheduled for it (0 when it has no outbox row at all).
    pub phase: u32,
    /// Its deadline, epoch ms.
    pub deadline_ms: i64,
}

/// PENDING orders past `deadline + grace` that have no live trigger — no PENDING row due later
/// than `now - grace`, none held under a lease, none already re-armed by a sweep — and no open
/// dead letter (those wait for an operator), oldest deadline first.
///
/// The order's own deadline rules over a row the order service wrote due late (its clock runs
/// ahead): a phase-0 row timeoutd never deferred or retried (`attempts = 0`, no `last_error`:
/// [`defer`] and [`retry_later`] note theirs) due later than `deadline + grace` is no live
/// trigger, and the order is swept at `deadline + grace`. Rows timeoutd pushed later itself —
/// a tripped plugin, backoff, a payment lease — keep their times, and later phases are the
/// plugin's own waits. A dead letter about a trigger or message rather than the order
/// ([`super::journal::NOT_ABOUT_THE_ORDER`]: a quarantined row, a poison message) does not
/// hold the order back either: the order's own times are believable, and it can be closed.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn find_orphans(
    db: &Db,
    now_ms: i64,
    grace_ms: i64,
    batch: u32,
) -> Result<Vec<Orphan>, DbError> {
    if let Some(m) = db.schema().mapped() {
        let sources = [SOURCE_SWEEP, SOURCE_MANUAL];
        let due = m
            .find_orphans(
                db,
                now_ms,
                grace_ms,
                batch,
                sources,
                &super::journal::NOT_ABOUT_THE_ORDER,
            )
            .await?;
        return Ok(due
            .into_iter()
            .map(|d| Orphan {
                order_id: d.order_id,
                phase: d.phase.unwrap_or(0).clamp(0, u32::MAX as i64) as u32,
                deadline_ms: d.deadline_ms,
            })
            .collect());
    }
    let cutoff = now_ms - grace_ms;
    let not_about_the_order = &super::journal::NOT_ABOUT_THE_ORDER;
    let mut q = db
        .backend()
        .query_owned(format!(
            "SELECT o.id, (SELECT MAX(m.phase) FROM order_timeout_msg m WHERE m.order_id = o.id) AS phase, \
             o.deadline_ms \
             FROM orders o WHERE o.status = 'PENDING' AND o.deadline_ms <= ? \
             AND NOT EXISTS (SELECT 1 FROM order_timeout_msg m WHERE m.order_id = o.id \
                 AND m.status IN ('PENDING', 'SENT') AND ((m.due_ms > ? AND NOT (m.phase = 0 AND m.attempts = 0 \
                     AND m.last_error IS NULL AND m.due_ms > o.deadline_ms + ?)) \
                     OR m.claim_until_ms >= ? OR m.source IN (?, ?))) \
             AND NOT EXISTS (SELECT 1 FROM dead_letter d WHERE d.order_id = o.id AND d.status = 'OPEN' \
                 AND d.source NOT IN ({})) \
             ORDER BY o.deadline_ms LIMIT ?",
            super::orders::marks(not_about_the_order.len())
        ))
        .bind(cutoff)
        .bind(cutoff)
        .bind(grace_ms)
        .bind(now_ms)
        .bind(SOURCE_SWEEP)
        .bind(SOURCE_MANUAL);
    for source in not_about_the_order {
        q = q.bind(*source);
    }
    let rows = q.bind(i64::from(batch)).fetch_all(db.pool()).await?;
    rows.iter()
        .map(|r| {
            Ok(Orphan {
                order_id: r.try_get(0)?,
                phase: r
                    .try_get::<Option<i64>, _>(1)?
                    .unwrap_or(0)
                    .clamp(0, u32::MAX as i64) as u32,
                deadline_ms: r.try_get(2)?,
            })
        })
        .collect()
}

/// Re-arms orphans: each one's latest phase becomes a claimable PENDING row with source
/// `sweep` (inserted, due at the deadline, if the order has no row at all). A row keeps the due
/// time it had when that is already past, so close lateness is still measured from when the
/// close was really due. A row held under a live lease is left alone, and so is the row of an
/// order that was closed or paid since the sweep found it (it stays PROCESSED). Several sweepers
/// re-arming the same order converge on the one row.
///
/// One transaction for the whole batch, in multi-row statements: an insert of every orphan's
/// row (existing rows are left as they are), then, only when some row already existed, an update
/// per phase of the batch's rows. A burst of orders that never had a row costs one statement
/// per [`super::ledger::ROWS_PER_INSERT`] orphans, not one per orphan.
///
/// # Errors
/// [`DbError::Sql`] on query failure; nothing of the batch is written then.
pub async fn rearm(db: &Db, orphans: &[Orphan], now_ms: i64) -> Result<(), DbError> {
    rearm_as(db, orphans, now_ms, SOURCE_SWEEP).await
}

/// [`rearm`] with the rows' `source` (`sweep`, or `manual` for an operator's re-drive, which
/// also resets the attempt count). A batch that loses a lock conflict (a deadlock with another
/// sweeper) runs again whole, up to [`REARM_RETRIES`] times.
///
/// # Errors
/// [`DbError::Sql`] on query failure; nothing of the batch is written then.
pub async fn rearm_as(
    db: &Db,
    orphans: &[Orphan],
    now_ms: i64,
    source: &str,
) -> Result<(), DbError> {
    // Two sweepers re-arming the same orders can still deadlock on InnoDB when those orders'
    // rows were deleted and not yet purged: each insert takes a shared next-key lock on the
    // delete-marked record, then waits for the other's to insert (F11, seen once in 472 CI
    // tests). The victim wrote nothing, and re-arming is idempotent: it runs again whole.
    let mut lost = 0;
    loop {
        match rearm_once(db, orphans, now_ms, source).await {
            Err(e) if e.is_lock_conflict() && lost < REARM_RETRIES => {
                lost += 1;
                tokio::time::sleep(std::time::Duration::from_millis(
                    5 * lost + fastrand::u64(..10),
                ))
                .await;
            }
            done => return done,
        }
    }
}

/// Times [`rearm_as`] runs again after losing a lock conflict.
const REARM_RETRIES: u64 = 3;

async fn rearm_once(db: &Db, orphans: &[Orphan], now_ms: i64, source: &str) -> Result<(), DbError> {
    if orphans.is_empty() {
        return Ok(());
    }
    // In key order, so that two sweepers re-arming the same orders lock them in the same order
    // and one waits for the other instead of deadlocking (their queries break ties of the
    // deadline as they find them).
    let mut orphans: Vec<&Orphan> = orphans.iter().collect();
    orphans.sort_unstable_by(|a, b| (&a.order_id, a.phase).cmp(&(&b.order_id, b.phase)));
    let backend = db.backend();
    let mut tx = db.begin().await?;
    let rows: Vec<(&str, u32, i64)> = orphans
        .iter()
        .map(|o| (o.order_id.as_str(), o.phase, o.deadline_ms.min(now_ms)))
        .collect();
    let inserted = insert_rows(&mut tx, backend, &rows, source).await?;
    if inserted < orphans.len() as u64 {
        // Some rows existed: re-open them. Rows this batch just inserted match too, and are
        // left as they are (PENDING, due by now, unleased, attempts 0).
        let mut phases: Vec<u32> = orphans.iter().map(|o| o.phase).collect();
        phases.sort_unstable();
        phases.dedup();
        for phase in phases {
            let ids: Vec<&str> = orphans
                .iter()
                .filter(|o| o.phase == phase)
                .map(|o| o.order_id.as_str())
                .collect();
            for chunk in ids.chunks(super::ledger::ROWS_PER_INSERT) {
                let (pending, mapped) = order_still_pending(db);
                let mut q = backend
                    .query_owned(format!(
                        "UPDATE order_timeout_msg SET status = 'PENDING', \
                         due_ms = CASE WHEN due_ms > ? THEN ? ELSE due_ms END, source = ?, \
                         attempts = CASE WHEN ? = 'manual' THEN 0 ELSE attempts END, \
                         claim_token = NULL, claim_until_ms = NULL \
                         WHERE phase = ? AND order_id IN ({}) \
                         AND (claim_until_ms IS NULL OR claim_until_ms < ?) AND {pending}",
                        super::orders::marks(chunk.len())
                    ))
                    .bind(now_ms)
                    .bind(now_ms)
                    .bind(source.to_string())
                    .bind(source.to_string())
                    .bind(i64::from(phase));
                for id in chunk {
                    q = q.bind(id.to_string());
                }
                q = q.bind(now_ms);
                if let Some(exists) = mapped {
                    q = exists.bind_onto(q);
                }
                q.execute(&mut *tx).await?;
            }
        }
    }
    tx.commit().await
}
