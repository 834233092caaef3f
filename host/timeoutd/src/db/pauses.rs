//! `pauses` (migration 17): merchants and single orders an operator has paused. A paused
//! order is neither closed nor reminded; its triggers are held (their outbox rows deferred by
//! `dispatch.pause_recheck`) and decided again, against the database clock, once resumed. Paid
//! notices still apply while paused. One row per pause; resuming deletes it (who paused and
//! resumed, and when, is in `admin_audit`).

use std::collections::HashSet;

use serde::Serialize;
use sqlx::Row;
use timeoutd_runtime::model::OrderStatus;

use super::{Backend, Db, DbError};

/// What a pause covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Every order of one merchant (`target` is the merchant's id).
    Merchant,
    /// One order (`target` is the order's id).
    Order,
}

impl Scope {
    /// The name stored in `pauses.scope` and used in the API: `merchant`, `order`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Merchant => "merchant",
            Scope::Order => "order",
        }
    }

    fn parse(text: &str) -> Result<Scope, DbError> {
        match text {
            "merchant" => Ok(Scope::Merchant),
            "order" => Ok(Scope::Order),
            other => Err(DbError::BadRow {
                table: "pauses",
                detail: format!("unknown scope `{other}` (expected `merchant` or `order`)"),
            }),
        }
    }
}

/// One pause, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pause {
    /// What it covers.
    pub scope: Scope,
    /// The merchant's id or the order's id.
    pub target: String,
    /// When it was paused, epoch ms (database clock).
    pub paused_at_ms: i64,
    /// Who paused it: the admin token's name, or `cli:<user>`.
    pub paused_by: String,
    /// The operator's words (may be empty).
    pub reason: String,
}

/// The pauses in force at one reading: what dispatch consults before asking a plugin, and the
/// backlog sample before counting an overdue order as one to page about.
#[derive(Debug, Clone, Default)]
pub struct Paused {
    merchants: HashSet<String>,
    orders: HashSet<String>,
}

impl Paused {
    /// Nothing paused.
    pub fn none() -> Paused {
        Paused::default()
    }

    /// Whether an order of `merchant` with id `order_id` is paused, and by which pause (the
    /// order's own first).
    pub fn holds(&self, merchant: &str, order_id: &str) -> Option<Scope> {
        if self.orders.contains(order_id) {
            Some(Scope::Order)
        } else if self.merchants.contains(merchant) {
            Some(Scope::Merchant)
        } else {
            None
        }
    }

    /// Whether the merchant as a whole is paused.
    pub fn merchant(&self, merchant: &str) -> bool {
        self.merchants.contains(merchant)
    }

    /// The ids of the orders paused one by one.
    pub fn orders(&self) -> impl Iterator<Item = &str> {
        self.orders.iter().map(String::as_str)
    }

    /// Nothing is paused.
    pub fn is_empty(&self) -> bool {
        self.merchants.is_empty() && self.orders.is_empty()
    }
}

/// The note a held trigger's outbox row carries in `last_error`: how [`resume`] finds the rows
/// a pause held (every note ends in `is paused`: [`KEEP_HELD_NOTE`]).
pub fn held_note(scope: Scope, target: &str) -> String {
    match scope {
        Scope::Merchant => format!("held: merchant `{target}` is paused"),
        Scope::Order => "held: the order is paused".to_string(),
    }
}

/// `last_error`'s new value, as SQL, when the relay marks a row SENT: a pause's note is kept
/// (a held row due past `rocketmq.relay_lead` is relayed like any other), anything else
/// cleared. The resume finds a relayed held row by it, and the sweep keeps seeing the row as
/// live (`db::outbox::find_orphans`).
pub const KEEP_HELD_NOTE: &str =
    "CASE WHEN last_error LIKE 'held: %is paused' THEN last_error ELSE NULL END";

/// Held rows one [`resume`] statement wakes at most.
const WAKE_CHUNK: usize = 500;

/// Pauses `target` at `now_ms` (epoch ms), recording `by` and `reason`. Returns the pause in
/// force and whether this call made it: `false` when `target` was paused already (pausing
/// twice changes nothing; the first pause stands).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn pause(
    db: &Db,
    scope: Scope,
    target: &str,
    now_ms: i64,
    by: &str,
    reason: &str,
) -> Result<(Pause, bool), DbError> {
    let mut tx = db.begin().await?;
    let inserted = Backend::of(&tx)
        .query(
            "INSERT INTO pauses (scope, target, paused_at_ms, paused_by, reason) \
             VALUES (?, ?, ?, ?, ?)",
        )
        .bind(scope.as_str())
        .bind(target)
        .bind(now_ms)
        .bind(by)
        .bind(reason)
        .execute(&mut *tx)
        .await;
    let new = match inserted {
        Ok(_) => {
            tx.commit().await?;
            true
        }
        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
            drop(tx);
            false
        }
        Err(e) => return Err(e.into()),
    };
    let pause = find(db, scope, target)
        .await?
        .ok_or_else(|| DbError::BadRow {
            table: "pauses",
            detail: format!(
                "the pause of {} `{target}` was resumed as it was made",
                scope.as_str()
            ),
        })?;
    Ok((pause, new))
}

/// Ends the pause of `target` and wakes the triggers it held: their outbox rows (PENDING, or
/// SENT by the relay, noted [`held_note`], held by nobody) become PENDING and due at `now_ms`.
/// Returns `None` when `target` was not paused, else how many rows were woken. The pause ends
/// in its own transaction; the rows are then found with a plain read and woken by id, at most
/// [`WAKE_CHUNK`] a statement, so no range of the outbox is locked against the order service's
/// inserts. A held row this misses (a crash in between, a row claimed at that instant) comes
/// back by itself within `dispatch.pause_recheck`; a relayed one woken here finds its message
/// a no-op when it comes.
///
/// # Errors
/// [`DbError::Sql`] on query failure (the pause may have ended; its rows come back as above).
pub async fn resume(
    db: &Db,
    scope: Scope,
    target: &str,
    now_ms: i64,
) -> Result<Option<u64>, DbError> {
    let mut tx = db.begin().await?;
    let ended = Backend::of(&tx)
        .query("DELETE FROM pauses WHERE scope = ? AND target = ?")
        .bind(scope.as_str())
        .bind(target)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if ended == 0 {
        return Ok(None);
    }
    tx.commit().await?;
    let note = held_note(scope, target);
    let backend = db.backend();
    let held: Vec<i64> = match scope {
        Scope::Merchant => backend
            .query(
                "SELECT id FROM order_timeout_msg WHERE status IN ('PENDING', 'SENT') \
                 AND due_ms > ? AND last_error = ?",
            )
            .bind(now_ms)
            .bind(&note),
        Scope::Order => backend
            .query(
                "SELECT id FROM order_timeout_msg WHERE order_id = ? \
                 AND status IN ('PENDING', 'SENT') AND due_ms > ? AND last_error = ?",
            )
            .bind(target)
            .bind(now_ms)
            .bind(&note),
    }
    .fetch_all(db.pool())
    .await?
    .iter()
    .map(|row| row.try_get::<i64, _>(0))
    .collect::<Result<_, _>>()?;
    let mut woken = 0;
    for chunk in held.chunks(WAKE_CHUNK) {
        let mut tx = db.begin().await?;
        let mut q = Backend::of(&tx)
            .query_owned(format!(
                "UPDATE order_timeout_msg SET status = 'PENDING', due_ms = ?, \
                 claim_token = NULL, claim_until_ms = NULL WHERE id IN ({}) \
                 AND status IN ('PENDING', 'SENT') AND last_error = ? \
                 AND (claim_until_ms IS NULL OR claim_until_ms < ?)",
                super::orders::marks(chunk.len())
            ))
            .bind(now_ms);
        for id in chunk {
            q = q.bind(*id);
        }
        woken += q
            .bind(&note)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
    }
    Ok(Some(woken))
}

/// Every pause in force, merchants first, then by target.
///
/// # Errors
/// [`DbError::Sql`] on query failure; [`DbError::BadRow`] for a scope this build does not know.
pub async fn list(db: &Db) -> Result<Vec<Pause>, DbError> {
    db.backend()
        .query(
            "SELECT scope, target, paused_at_ms, paused_by, reason FROM pauses \
             ORDER BY scope, target",
        )
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(|row| {
            Ok(Pause {
                scope: Scope::parse(&row.try_get::<String, _>(0)?)?,
                target: row.try_get(1)?,
                paused_at_ms: row.try_get(2)?,
                paused_by: row.try_get(3)?,
                reason: row.try_get(4)?,
            })
        })
        .collect()
}

/// The pause of `target`, if any.
///
/// # Errors
/// As [`list`].
pub async fn find(db: &Db, scope: Scope, target: &str) -> Result<Option<Pause>, DbError> {
    Ok(list(db)
        .await?
        .into_iter()
        .find(|p| p.scope == scope && p.target == target))
}

/// The pauses in force now: one read of the (small) table, made once per trigger or group
/// before any plugin is asked.
///
/// # Errors
/// As [`list`].
pub async fn in_force(db: &Db) -> Result<Paused, DbError> {
    let mut paused = Paused::none();
    for p in list(db).await? {
        match p.scope {
            Scope::Merchant => paused.merchants.insert(p.target),
            Scope::Order => paused.orders.insert(p.target),
        };
    }
    Ok(paused)
}

/// Why an order cannot be paused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotPausable {
    /// No such order.
    Missing,
    /// It is no longer PENDING (named: `PAID`, `CLOSED`): nothing is left to hold.
    Settled(&'static str),
    /// Its row cannot be read (the reason names the column).
    Unreadable(String),
}

impl std::fmt::Display for NotPausable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotPausable::Missing => f.write_str("does not exist"),
            NotPausable::Settled(status) => write!(f, "is {status}: nothing is left to pause"),
            NotPausable::Unreadable(detail) => write!(f, "cannot be read: {detail}"),
        }
    }
}

/// Whether order `id` can be paused: it exists and is PENDING. The admin API and the CLI both
/// ask this before [`pause`] with [`Scope::Order`].
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn pausable_order(db: &Db, id: &str) -> Result<Result<(), NotPausable>, DbError> {
    let mut conn = db.pool().acquire().await?;
    Ok(
        match super::orders::load(&mut conn, db.schema(), id).await {
            Ok(Some(order)) if order.status == OrderStatus::Pending => Ok(()),
            Ok(Some(order)) => Err(NotPausable::Settled(order.status.as_str())),
            Ok(None) => Err(NotPausable::Missing),
            Err(DbError::BadRow { detail, .. }) => Err(NotPausable::Unreadable(detail)),
            Err(e) => return Err(e),
        },
    )
}
