//! The admin API's read models: overdue orders, an order's timeline (its outbox rows, decisions,
//! effects, dead letters and paid-after-close record), dead letters and failed effects. Each row
//! struct serialises to exactly the JSON object `/v1/…` answers with (its field names are the
//! JSON keys). Times are epoch ms.

use serde::Serialize;
use serde_json::Value;
use sqlx::Row;

use super::{Db, DbError};

/// An open order past its deadline, as `GET /v1/orders/overdue` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OverdueOrder {
    /// Order id.
    pub id: String,
    /// Merchant id.
    pub merchant: String,
    /// User id.
    pub user: String,
    /// The order's deadline, epoch ms.
    pub deadline_ms: i64,
    /// How long past its deadline the order was at the time asked about, ms.
    pub overdue_ms: i64,
    /// The reason of the order's OPEN dead letter (the greatest when several), if any.
    pub dead_letter: Option<String>,
}

/// PENDING orders whose deadline is at least `margin_ms` before `now_ms` (epoch ms), most
/// overdue first, at most `limit`; `overdue_ms` is measured from `now_ms`.
///
/// # Errors
/// [`DbError::Sql`] when the query fails or a column cannot be read.
pub async fn overdue_orders(
    db: &Db,
    now_ms: i64,
    margin_ms: i64,
    limit: i64,
) -> Result<Vec<OverdueOrder>, DbError> {
    if let Some(m) = db.schema().mapped() {
        let orders = m.overdue_orders(db, now_ms, margin_ms, limit).await?;
        return Ok(orders
            .into_iter()
            .map(|(o, dead_letter)| OverdueOrder {
                overdue_ms: now_ms - o.deadline_ms,
                deadline_ms: o.deadline_ms,
                dead_letter,
                id: o.id,
                merchant: o.merchant,
                user: o.user,
            })
            .collect());
    }
    let rows = db
        .backend()
        .query(
            "SELECT o.id, o.merchant_id, o.user_id, o.deadline_ms, \
             (SELECT MAX(d.reason) FROM dead_letter d WHERE d.order_id = o.id AND d.status = 'OPEN') \
             FROM orders o WHERE o.status = 'PENDING' AND o.deadline_ms <= ? ORDER BY o.deadline_ms LIMIT ?",
        )
        .bind(now_ms - margin_ms)
        .bind(limit)
        .fetch_all(db.pool())
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let deadline_ms: i64 = r.try_get(3)?;
            Ok(OverdueOrder {
                id: r.try_get(0)?,
                merchant: r.try_get(1)?,
                user: r.try_get(2)?,
                deadline_ms,
                overdue_ms: now_ms - deadline_ms,
                dead_letter: r.try_get(4)?,
            })
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?)
}

/// One outbox row (`order_timeout_msg`) of an order's timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TriggerRow {
    /// Row id.
    pub id: i64,
    /// Phase it triggers.
    pub phase: i64,
    /// When it is due, epoch ms.
    pub due_ms: i64,
    /// `PENDING`, `SENT`, `PROCESSED`, …
    pub status: String,
    /// Who armed it (`order-service`, `sweep`, `manual`, …).
    pub source: String,
    /// Attempts so far.
    pub attempts: i64,
    /// Its last error, if any.
    pub note: Option<String>,
    /// When it was processed, epoch ms (none while open).
    pub processed_at_ms: Option<i64>,
}

/// One `decision_log` row of an order's timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecisionRow {
    /// When it was decided, epoch ms.
    pub at_ms: i64,
    /// Trigger kind (`outbox`, `sweep`, …).
    pub trigger: String,
    /// Phase decided.
    pub phase: i64,
    /// Attempt of this phase.
    pub attempt: i64,
    /// Plugin name.
    pub plugin: String,
    /// Plugin SHA-256, hex.
    pub plugin_digest: String,
    /// `wait`, `cancel`, `ignore` or `error`.
    pub decision: String,
    /// What the host made of it (`closed`, `waiting`, …).
    pub outcome: String,
    /// The decision or error as recorded; `null` when the recorded text is not JSON.
    pub detail: Value,
    /// Time spent in the plugin, µs.
    pub latency_us: i64,
}

/// One `effect_ledger` row of an order's timeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EffectRow {
    /// Row id.
    pub id: i64,
    /// Idempotency key.
    pub key: String,
    /// Effect kind (`restore-stock`, `notify`, …).
    pub kind: String,
    /// `PENDING`, `DONE` or `FAILED`.
    pub status: String,
    /// Attempts so far.
    pub attempts: i64,
    /// Its last error or note, if any.
    pub note: Option<String>,
    /// The effect; `null` when the recorded text is not JSON.
    pub payload: Value,
}

/// An order's `paid_after_close` record.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PaidAfterCloseRow {
    /// Who reported the payment (`callback`, `broker`, …).
    pub source: String,
    /// `refund` or `manual-review`.
    pub resolution: String,
    /// When it was detected, epoch ms.
    pub detected_at_ms: i64,
}

/// Everything `GET /v1/orders/{id}` shows besides the order itself.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timeline {
    /// Outbox rows, by phase then id.
    pub triggers: Vec<TriggerRow>,
    /// Plugin decisions, oldest first.
    pub decisions: Vec<DecisionRow>,
    /// Ledger effects, by phase then effect index.
    pub effects: Vec<EffectRow>,
    /// Dead letters, newest first, at most 100.
    pub dead_letters: Vec<DeadLetterRow>,
    /// The paid-after-close record, if the order has one.
    pub paid_after_close: Option<PaidAfterCloseRow>,
}

/// Order `order_id`'s outbox rows, decisions, effects, dead letters and paid-after-close
/// record, read in that order (empty when the order has none).
///
/// # Errors
/// [`DbError::Sql`] when a query fails or a column cannot be read.
pub async fn timeline(db: &Db, order_id: &str) -> Result<Timeline, DbError> {
    let b = db.backend();
    let pool = db.pool();
    let triggers = b
        .query("SELECT id, phase, due_ms, status, source, attempts, last_error, processed_at_ms FROM order_timeout_msg WHERE order_id = ? ORDER BY phase, id")
        .bind(order_id).fetch_all(pool).await?.iter().map(|r| Ok(TriggerRow {
            id: r.try_get(0)?, phase: r.try_get(1)?, due_ms: r.try_get(2)?,
            status: r.try_get(3)?, source: r.try_get(4)?,
            attempts: r.try_get(5)?, note: r.try_get(6)?,
            processed_at_ms: r.try_get(7)?,
        })).collect::<Result<Vec<_>, sqlx::Error>>()?;
    let decisions = b
        .query("SELECT decided_at_ms, trigger_kind, phase, attempt, plugin, plugin_digest, decision, outcome, detail, latency_us FROM decision_log WHERE order_id = ? ORDER BY id")
        .bind(order_id).fetch_all(pool).await?.iter().map(|r| Ok(DecisionRow {
            at_ms: r.try_get(0)?, trigger: r.try_get(1)?, phase: r.try_get(2)?,
            attempt: r.try_get(3)?, plugin: r.try_get(4)?, plugin_digest: r.try_get(5)?,
            decision: r.try_get(6)?, outcome: r.try_get(7)?,
            detail: serde_json::from_str::<Value>(&r.try_get::<String, _>(8)?).unwrap_or(Value::Null),
            latency_us: r.try_get(9)?,
        })).collect::<Result<Vec<_>, sqlx::Error>>()?;
    let effects = b
        .query("SELECT id, idempotency_key, kind, status, attempts, last_error, payload FROM effect_ledger WHERE order_id = ? ORDER BY phase, effect_index")
        .bind(order_id).fetch_all(pool).await?.iter().map(|r| Ok(EffectRow {
            id: r.try_get(0)?, key: r.try_get(1)?, kind: r.try_get(2)?,
            status: r.try_get(3)?, attempts: r.try_get(4)?,
            note: r.try_get(5)?,
            payload: serde_json::from_str::<Value>(&r.try_get::<String, _>(6)?).unwrap_or(Value::Null),
        })).collect::<Result<Vec<_>, sqlx::Error>>()?;
    let dead_letters = dead_letters(db, Some(order_id), None, 100).await?;
    let paid_after_close = b
        .query("SELECT source, resolution, detected_at_ms FROM paid_after_close WHERE order_id = ?")
        .bind(order_id)
        .fetch_optional(pool)
        .await?
        .map(|r| {
            Ok::<_, sqlx::Error>(PaidAfterCloseRow {
                source: r.try_get(0)?,
                resolution: r.try_get(1)?,
                detected_at_ms: r.try_get(2)?,
            })
        })
        .transpose()?;
    Ok(Timeline {
        triggers,
        decisions,
        effects,
        dead_letters,
        paid_after_close,
    })
}

/// One `dead_letter` row, as `GET /v1/dead-letters` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadLetterRow {
    /// Row id.
    pub id: i64,
    /// Where the message came from (`outbox`, `broker`, …).
    pub source: String,
    /// The order it names, if any.
    pub order_id: Option<String>,
    /// Why it could not be processed.
    pub reason: String,
    /// The message as received.
    pub payload: String,
    /// Attempts made before it was dead-lettered.
    pub attempts: i64,
    /// `OPEN`, `REDRIVEN` or `DISMISSED`.
    pub status: String,
    /// When it was dead-lettered, epoch ms.
    pub created_at_ms: i64,
}

/// The columns of a [`DeadLetterRow`], in its fields' order.
const DEAD_LETTER_COLUMNS: &str = "SELECT id, source, order_id, reason, payload, attempts, status, created_at_ms FROM dead_letter";

fn dead_letter_of(r: &sqlx::any::AnyRow) -> Result<DeadLetterRow, sqlx::Error> {
    Ok(DeadLetterRow {
        id: r.try_get(0)?,
        source: r.try_get(1)?,
        order_id: r.try_get(2)?,
        reason: r.try_get(3)?,
        payload: r.try_get(4)?,
        attempts: r.try_get(5)?,
        status: r.try_get(6)?,
        created_at_ms: r.try_get(7)?,
    })
}

/// Dead letters, newest first, at most `limit`: of order `order_id` and in `status` when given.
///
/// # Errors
/// [`DbError::Sql`] when the query fails or a column cannot be read.
pub async fn dead_letters(
    db: &Db,
    order_id: Option<&str>,
    status: Option<&str>,
    limit: i64,
) -> Result<Vec<DeadLetterRow>, DbError> {
    let mut sql = format!("{DEAD_LETTER_COLUMNS} WHERE 1 = 1");
    if order_id.is_some() {
        sql += " AND order_id = ?";
    }
    if status.is_some() {
        sql += " AND status = ?";
    }
    sql += " ORDER BY id DESC LIMIT ?";
    let mut q = db.backend().query_owned(sql);
    if let Some(o) = order_id {
        q = q.bind(o.to_string());
    }
    if let Some(st) = status {
        q = q.bind(st.to_string());
    }
    Ok(q.bind(limit)
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(dead_letter_of)
        .collect::<Result<Vec<_>, sqlx::Error>>()?)
}

/// OPEN dead letters with an id above `after_id`, oldest first, at most `limit`: of `source`
/// when given, dead-lettered in `[since_ms, until_ms)` (epoch ms) when given. A bulk re-drive
/// reads its pages with this (`crate::bulk::dead_letters`), resuming after the last id it saw.
///
/// # Errors
/// [`DbError::Sql`] when the query fails or a column cannot be read.
pub async fn open_dead_letters_after(
    db: &Db,
    after_id: i64,
    source: Option<&str>,
    since_ms: Option<i64>,
    until_ms: Option<i64>,
    limit: i64,
) -> Result<Vec<DeadLetterRow>, DbError> {
    let mut sql = format!("{DEAD_LETTER_COLUMNS} WHERE status = 'OPEN' AND id > ?");
    if source.is_some() {
        sql += " AND source = ?";
    }
    if since_ms.is_some() {
        sql += " AND created_at_ms >= ?";
    }
    if until_ms.is_some() {
        sql += " AND created_at_ms < ?";
    }
    sql += " ORDER BY id LIMIT ?";
    let mut q = db.backend().query_owned(sql).bind(after_id);
    if let Some(source) = source {
        q = q.bind(source.to_string());
    }
    if let Some(t) = since_ms {
        q = q.bind(t);
    }
    if let Some(t) = until_ms {
        q = q.bind(t);
    }
    Ok(q.bind(limit)
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(dead_letter_of)
        .collect::<Result<Vec<_>, sqlx::Error>>()?)
}

/// Dead letter `id` whole (its payload as received, source, attempts), as
/// `GET /v1/dead-letters/{id}` shows it; `None` when there is no such row.
///
/// # Errors
/// [`DbError::Sql`] when the query fails or a column cannot be read.
pub async fn dead_letter(db: &Db, id: i64) -> Result<Option<DeadLetterRow>, DbError> {
    let row = db
        .backend()
        .query_owned(format!("{DEAD_LETTER_COLUMNS} WHERE id = ?"))
        .bind(id)
        .fetch_optional(db.pool())
        .await?;
    Ok(row.as_ref().map(dead_letter_of).transpose()?)
}

/// A FAILED ledger effect, as `GET /v1/ledger/failed` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailedEffect {
    /// Row id.
    pub id: i64,
    /// Idempotency key.
    pub key: String,
    /// Its order.
    pub order_id: String,
    /// Its order's merchant.
    pub merchant: String,
    /// Effect kind.
    pub kind: String,
    /// Attempts made.
    pub attempts: i64,
    /// Why it failed, if recorded.
    pub reason: Option<String>,
    /// When it was last updated (failed), epoch ms.
    pub failed_at_ms: i64,
}

/// FAILED ledger effects, newest first, at most `limit`.
///
/// # Errors
/// [`DbError::Sql`] when the query fails or a column cannot be read.
pub async fn failed_effects(db: &Db, limit: i64) -> Result<Vec<FailedEffect>, DbError> {
    let rows = db
        .backend()
        .query_owned(format!(
            "{FAILED_EFFECT_COLUMNS} WHERE status = 'FAILED' ORDER BY id DESC LIMIT ?"
        ))
        .bind(limit)
        .fetch_all(db.pool())
        .await?;
    Ok(rows
        .iter()
        .map(failed_effect_of)
        .collect::<Result<Vec<_>, sqlx::Error>>()?)
}

/// The columns of a [`FailedEffect`], in its fields' order.
const FAILED_EFFECT_COLUMNS: &str = "SELECT id, idempotency_key, order_id, merchant_id, kind, \
     attempts, last_error, updated_at_ms FROM effect_ledger";

fn failed_effect_of(r: &sqlx::any::AnyRow) -> Result<FailedEffect, sqlx::Error> {
    Ok(FailedEffect {
        id: r.try_get(0)?,
        key: r.try_get(1)?,
        order_id: r.try_get(2)?,
        merchant: r.try_get(3)?,
        kind: r.try_get(4)?,
        attempts: r.try_get(5)?,
        reason: r.try_get(6)?,
        failed_at_ms: r.try_get(7)?,
    })
}

/// FAILED ledger effects with an id above `after_id`, oldest first, at most `limit`: of
/// `merchant` and `kind` when given, failed (last updated) in `[since_ms, until_ms)` (epoch ms)
/// when given. A bulk retry reads its pages with this (`crate::bulk::effects`).
///
/// # Errors
/// [`DbError::Sql`] when the query fails or a column cannot be read.
pub async fn failed_effects_after(
    db: &Db,
    after_id: i64,
    merchant: Option<&str>,
    kind: Option<&str>,
    since_ms: Option<i64>,
    until_ms: Option<i64>,
    limit: i64,
) -> Result<Vec<FailedEffect>, DbError> {
    let mut sql = format!("{FAILED_EFFECT_COLUMNS} WHERE status = 'FAILED' AND id > ?");
    if merchant.is_some() {
        sql += " AND merchant_id = ?";
    }
    if kind.is_some() {
        sql += " AND kind = ?";
    }
    if since_ms.is_some() {
        sql += " AND updated_at_ms >= ?";
    }
    if until_ms.is_some() {
        sql += " AND updated_at_ms < ?";
    }
    sql += " ORDER BY id LIMIT ?";
    let mut q = db.backend().query_owned(sql).bind(after_id);
    for text in [merchant, kind].into_iter().flatten() {
        q = q.bind(text.to_string());
    }
    for t in [since_ms, until_ms].into_iter().flatten() {
        q = q.bind(t);
    }
    Ok(q.bind(limit)
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(failed_effect_of)
        .collect::<Result<Vec<_>, sqlx::Error>>()?)
}

/// The kind of ledger row `id` (`restore-stock`, `notify`, …), or `None` when there is no such
/// row.
///
/// # Errors
/// [`DbError::Sql`] when the query fails or the column cannot be read.
pub async fn effect_kind(db: &Db, id: i64) -> Result<Option<String>, DbError> {
    Ok(db
        .backend()
        .query("SELECT kind FROM effect_ledger WHERE id = ?")
        .bind(id)
        .fetch_optional(db.pool())
        .await?
        .map(|r| r.try_get(0))
        .transpose()?)
}

/// A PENDING order a bulk order operation read, with what decides what the operation does
/// with it: its latest trigger and its dead letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OpenOrder {
    /// Order id.
    pub id: String,
    /// Merchant id.
    pub merchant: String,
    /// The order's deadline, epoch ms.
    pub deadline_ms: i64,
    /// Its latest-phase outbox row, if it has one.
    pub trigger: Option<TriggerState>,
    /// The reason of its OPEN dead letter about the order (the greatest when several; a letter
    /// about one message or row, `journal::NOT_ABOUT_THE_ORDER`, is not counted), if any.
    pub dead_letter: Option<String>,
}

/// An order's latest-phase outbox row as a bulk order operation sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TriggerState {
    /// Phase.
    pub phase: i64,
    /// `PENDING`, `SENT`, `PROCESSED`, `FAILED`, …
    pub status: String,
    /// Who armed it (`outbox`, `sweep`, `manual`, …).
    pub source: String,
    /// When due, epoch ms.
    pub due_ms: i64,
    /// Until when a claimer holds it, epoch ms (`None` when unclaimed).
    pub claim_until_ms: Option<i64>,
}

/// The PENDING orders `find` asks for, in id order, each with its latest trigger and its
/// dead letter: a bulk order operation's page (`crate::bulk::orders`). On a schema profile the
/// orders are read from the shop's table ([`super::shop::Mapped::open_orders_after`]); the
/// triggers and letters are timeoutd's own rows either way.
///
/// # Errors
/// [`DbError::Sql`] when a query fails or a column cannot be read; [`DbError::BadRow`] for a
/// shop's row its profile cannot read.
pub async fn open_orders_after(
    db: &Db,
    find: &super::shop::OpenOrderQuery<'_>,
) -> Result<Vec<OpenOrder>, DbError> {
    let mut orders: Vec<OpenOrder> = match db.schema().mapped() {
        Some(m) => m
            .open_orders_after(db, find)
            .await?
            .into_iter()
            .map(|o| OpenOrder {
                id: o.id,
                merchant: o.merchant,
                deadline_ms: o.deadline_ms,
                trigger: None,
                dead_letter: None,
            })
            .collect(),
        None => {
            let mut sql =
                "SELECT id, merchant_id, deadline_ms FROM orders WHERE status = 'PENDING'"
                    .to_string();
            if find.after.is_some() {
                sql += " AND id > ?";
            }
            if find.merchant.is_some() {
                sql += " AND merchant_id = ?";
            }
            if let Some(ids) = find.ids {
                sql += &format!(" AND id IN ({})", super::orders::marks(ids.len().max(1)));
            }
            if find.deadline_from_ms.is_some() {
                sql += " AND deadline_ms >= ?";
            }
            if find.deadline_to_ms.is_some() {
                sql += " AND deadline_ms < ?";
            }
            sql += " ORDER BY id LIMIT ?";
            let mut q = db.backend().query_owned(sql);
            for text in [find.after, find.merchant].into_iter().flatten() {
                q = q.bind(text.to_string());
            }
            if let Some(ids) = find.ids {
                if ids.is_empty() {
                    q = q.bind(Option::<String>::None);
                }
                for id in ids {
                    q = q.bind(id.to_string());
                }
            }
            for t in [find.deadline_from_ms, find.deadline_to_ms]
                .into_iter()
                .flatten()
            {
                q = q.bind(t);
            }
            q.bind(find.limit)
                .fetch_all(db.pool())
                .await?
                .iter()
                .map(|r| {
                    Ok(OpenOrder {
                        id: r.try_get(0)?,
                        merchant: r.try_get(1)?,
                        deadline_ms: r.try_get(2)?,
                        trigger: None,
                        dead_letter: None,
                    })
                })
                .collect::<Result<Vec<_>, sqlx::Error>>()?
        }
    };
    if orders.is_empty() {
        return Ok(orders);
    }
    let marks = super::orders::marks(orders.len());
    let mut q = db.backend().query_owned(format!(
        "SELECT order_id, phase, status, source, due_ms, claim_until_ms FROM order_timeout_msg \
         WHERE order_id IN ({marks})"
    ));
    for o in &orders {
        q = q.bind(o.id.clone());
    }
    let mut latest: std::collections::HashMap<String, TriggerState> =
        std::collections::HashMap::new();
    for r in q.fetch_all(db.pool()).await? {
        let order_id: String = r.try_get(0)?;
        let row = TriggerState {
            phase: r.try_get(1)?,
            status: r.try_get(2)?,
            source: r.try_get(3)?,
            due_ms: r.try_get(4)?,
            claim_until_ms: r.try_get(5)?,
        };
        if latest.get(&order_id).is_none_or(|t| t.phase < row.phase) {
            latest.insert(order_id, row);
        }
    }
    let not_about_the_order = &super::journal::NOT_ABOUT_THE_ORDER;
    let mut q = db.backend().query_owned(format!(
        "SELECT order_id, MAX(reason) FROM dead_letter WHERE status = 'OPEN' \
         AND source NOT IN ({}) AND order_id IN ({marks}) GROUP BY order_id",
        super::orders::marks(not_about_the_order.len())
    ));
    for source in not_about_the_order {
        q = q.bind(*source);
    }
    for o in &orders {
        q = q.bind(o.id.clone());
    }
    let mut letters: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for r in q.fetch_all(db.pool()).await? {
        letters.insert(r.try_get(0)?, r.try_get(1)?);
    }
    for o in &mut orders {
        o.trigger = latest.remove(&o.id);
        o.dead_letter = letters.remove(&o.id);
    }
    Ok(orders)
}
