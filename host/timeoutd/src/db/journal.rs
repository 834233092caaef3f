//! `decision_log` and `dead_letter`: what was decided, and what could not be processed.

use sqlx::AnyConnection;

use super::{Backend, DbError};

/// One plugin decision and what the host made of it.
#[derive(Debug, Clone)]
pub struct DecisionRecord<'a> {
    /// Order.
    pub order_id: &'a str,
    /// Merchant.
    pub merchant_id: &'a str,
    /// Plugin name.
    pub plugin: &'a str,
    /// Plugin SHA-256, hex.
    pub plugin_digest: &'a str,
    /// Trigger kind (`outbox`, `sweep`, …).
    pub trigger_kind: &'a str,
    /// Phase decided.
    pub phase: u32,
    /// Attempt of this phase.
    pub attempt: u32,
    /// `wait`, `cancel`, `ignore` or `error`.
    pub decision: &'a str,
    /// `closed`, `waiting`, `ignored`, `noop`, `refused`, `retry` or `dead-lettered`.
    pub outcome: &'a str,
    /// The decision or error, JSON.
    pub detail: String,
    /// Time spent in the plugin, µs.
    pub latency_us: i64,
    /// Database time of the decision, epoch ms.
    pub decided_at_ms: i64,
    /// What the plugin was given, JSON `{"order": …, "context": …}` (for `plugin replay`).
    pub input: Option<&'a str>,
    /// What it answered, JSON: a decision (`{"decision": "wait", …}`) or `{"error": "…"}`.
    pub answer: Option<&'a str>,
}

/// Appends to `decision_log`.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn log_decision(conn: &mut AnyConnection, r: &DecisionRecord<'_>) -> Result<(), DbError> {
    Backend::of(conn).query(
        "INSERT INTO decision_log (order_id, merchant_id, plugin, plugin_digest, trigger_kind, phase, \
         attempt, decision, outcome, detail, latency_us, decided_at_ms, input, answer) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(r.order_id)
    .bind(r.merchant_id)
    .bind(r.plugin)
    .bind(r.plugin_digest)
    .bind(r.trigger_kind)
    .bind(i64::from(r.phase))
    .bind(i64::from(r.attempt))
    .bind(r.decision)
    .bind(r.outcome)
    .bind(&r.detail)
    .bind(r.latency_us)
    .bind(r.decided_at_ms)
    .bind(r.input)
    .bind(r.answer)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Appends a group's decisions to `decision_log` in multi-row statements.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn log_decisions(
    conn: &mut AnyConnection,
    records: &[DecisionRecord<'_>],
) -> Result<(), DbError> {
    let backend = Backend::of(conn);
    for chunk in records.chunks(super::ledger::ROWS_PER_INSERT) {
        let values = vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"; chunk.len()].join(", ");
        let mut q = backend.query_owned(format!(
            "INSERT INTO decision_log (order_id, merchant_id, plugin, plugin_digest, \
             trigger_kind, phase, attempt, decision, outcome, detail, latency_us, decided_at_ms, \
             input, answer) VALUES {values}"
        ));
        for r in chunk {
            q = q
                .bind(r.order_id.to_string())
                .bind(r.merchant_id.to_string())
                .bind(r.plugin.to_string())
                .bind(r.plugin_digest.to_string())
                .bind(r.trigger_kind.to_string())
                .bind(i64::from(r.phase))
                .bind(i64::from(r.attempt))
                .bind(r.decision.to_string())
                .bind(r.outcome.to_string())
                .bind(r.detail.clone())
                .bind(r.latency_us)
                .bind(r.decided_at_ms)
                .bind(r.input.map(str::to_string))
                .bind(r.answer.map(str::to_string));
        }
        q.execute(&mut *conn).await?;
    }
    Ok(())
}

/// `dead_letter.source` of a trigger row whose own value was no clock's reading (a due time in
/// seconds) while its order's times were believable: the row is set aside for an operator,
/// the order keeps its own deadline, and the sweep does not leave the order alone for it.
pub const SOURCE_QUARANTINED_ROW: &str = "quarantined-row";

/// `dead_letter.source` of a timeout message the broker consumer could not read
/// ([`crate::rocketmq::consumer`]).
pub const SOURCE_ROCKETMQ: &str = "rocketmq";

/// `dead_letter.source` of a paid-topic message that names no order, or one that does not
/// exist ([`crate::rocketmq::paid`]).
pub const SOURCE_ROCKETMQ_PAID: &str = "rocketmq-paid";

/// `dead_letter.source` of a message the broker gave up redelivering, drained from its own DLQ
/// ([`crate::rocketmq::dlq`]).
pub const SOURCE_ROCKETMQ_DLQ: &str = "rocketmq-dlq";

/// `dead_letter.source` of stock-journal units whose `sku_stock` row was gone when they were
/// folded ([`super::stock_journal::fold`]): the payload names the SKU, the units and the
/// journal rows. It names no order (one journal row holds many orders' units); an operator gives
/// the units back by hand, or dismisses it.
pub const SOURCE_STOCK_JOURNAL: &str = "stock-journal";

/// Dead letters about one trigger row or broker message, not about the order it names (a row
/// due at no clock's time, a message that could not be read or was given up on): an OPEN one does
/// not keep the sweep off its order (FAILURES.md F14: a poison message's order still closes by
/// the sweep). Every other OPEN dead letter of an order (its decision failed, its times were
/// implausible) leaves the order to an operator, so the sweep does not re-arm it in a loop.
pub const NOT_ABOUT_THE_ORDER: [&str; 4] = [
    SOURCE_QUARANTINED_ROW,
    SOURCE_ROCKETMQ,
    SOURCE_ROCKETMQ_PAID,
    SOURCE_ROCKETMQ_DLQ,
];

/// A trigger that cannot succeed as it is.
#[derive(Debug, Clone)]
pub struct DeadLetter<'a> {
    /// Where it came from (`outbox`, `sweep`, `refused-decision`, …).
    pub source: &'a str,
    /// Order, when known.
    pub order_id: Option<&'a str>,
    /// Why, naming what was wrong.
    pub reason: &'a str,
    /// The trigger as received, JSON or raw text.
    pub payload: String,
    /// Attempts made.
    pub attempts: u32,
}

/// Adds an OPEN dead letter. While one is open for an order, the sweep leaves the order to an
/// operator (unless its source is one of [`NOT_ABOUT_THE_ORDER`]: that order can still be closed).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn dead_letter(
    conn: &mut AnyConnection,
    d: &DeadLetter<'_>,
    now_ms: i64,
) -> Result<(), DbError> {
    Backend::of(conn).query(
        "INSERT INTO dead_letter (source, order_id, reason, payload, attempts, status, created_at_ms) \
         VALUES (?, ?, ?, ?, ?, 'OPEN', ?)",
    )
    .bind(d.source)
    .bind(d.order_id)
    .bind(d.reason)
    .bind(&d.payload)
    .bind(i64::from(d.attempts))
    .bind(now_ms)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Adds an OPEN dead letter for broker message `message_id`, once: a redelivery of a message
/// already dead-lettered adds nothing. Returns whether a row was added.
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn dead_letter_message(
    conn: &mut AnyConnection,
    d: &DeadLetter<'_>,
    message_id: &str,
    now_ms: i64,
) -> Result<bool, DbError> {
    let backend = Backend::of(conn);
    let (insert, on_conflict) = backend.insert_ignore();
    let done = backend
        .query_owned(format!(
            "{insert} INTO dead_letter (source, order_id, reason, payload, attempts, status, \
             created_at_ms, message_id) VALUES (?, ?, ?, ?, ?, 'OPEN', ?, ?){on_conflict}"
        ))
        .bind(d.source)
        .bind(d.order_id)
        .bind(d.reason)
        .bind(&d.payload)
        .bind(i64::from(d.attempts))
        .bind(now_ms)
        .bind(message_id)
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// Marks OPEN dead letter `id` REDRIVEN (an operator's re-drive). Returns false when it is no
/// longer OPEN (or does not exist).
///
/// # Errors
/// [`DbError::Sql`] on query failure.
pub async fn mark_redriven(conn: &mut AnyConnection, id: i64) -> Result<bool, DbError> {
    let marked = Backend::of(conn)
        .query("UPDATE dead_letter SET status = 'REDRIVEN' WHERE id = ? AND status = 'OPEN'")
        .bind(id)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    Ok(marked != 0)
}
