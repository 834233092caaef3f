//! `shadow_decisions` (migration 18): one row per comparison of a merchant's shadow plugin
//! with its live one ([`crate::shadow`]), and the reads operators look at: counts by outcome and
//! by difference, agree and differ per minute, the latest differing orders with both answers.

use serde::Serialize;
use sqlx::Row;

use super::{Db, DbError};

/// One comparison, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShadowRow {
    /// Merchant.
    pub merchant: String,
    /// Order id.
    pub order_id: String,
    /// The phase both plugins decided.
    pub phase: u32,
    /// The trigger's kind (`delay-message`, `sweep`, …).
    pub trigger_kind: String,
    /// The context's `now_ms` both were asked at, epoch ms.
    pub decided_at_ms: i64,
    /// `agree`, `differ`, `trap`, `timeout`, `error` or `refused` ([`crate::shadow::Outcome`]).
    pub outcome: String,
    /// The parts that differ (`kind`, `wait`, `phase`, `reminder`, `effects`), comma-separated;
    /// empty when they agree or the shadow gave no answer.
    pub differences: String,
    /// The live plugin's answer, JSON.
    pub live: String,
    /// The shadow's answer, JSON (`{"error": …}` when it gave none; `refused` adds the
    /// guard's problems).
    pub shadow: String,
    /// The shadow plugin's digest.
    pub shadow_digest: String,
    /// The shadow call's own time, µs.
    pub latency_us: i64,
}

/// Records `rows` in one insert (nothing for none).
///
/// # Errors
/// [`DbError::Sql`] when the insert fails.
pub async fn record(db: &Db, rows: &[ShadowRow]) -> Result<(), DbError> {
    if rows.is_empty() {
        return Ok(());
    }
    let values = vec!["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"; rows.len()].join(", ");
    let mut q = db.backend().query_owned(format!(
        "INSERT INTO shadow_decisions (merchant_id, order_id, phase, trigger_kind, \
         decided_at_ms, outcome, differences, live, shadow, shadow_digest, latency_us) \
         VALUES {values}"
    ));
    for row in rows {
        q = q
            .bind(row.merchant.clone())
            .bind(row.order_id.clone())
            .bind(i64::from(row.phase))
            .bind(row.trigger_kind.clone())
            .bind(row.decided_at_ms)
            .bind(row.outcome.clone())
            .bind(row.differences.clone())
            .bind(row.live.clone())
            .bind(row.shadow.clone())
            .bind(row.shadow_digest.clone())
            .bind(row.latency_us);
    }
    let _gate = db.write_gate().await;
    q.execute(db.pool()).await?;
    Ok(())
}

/// What a merchant's shadow did since a time: the operators' view (`GET
/// /v1/merchants/{merchant}/shadow`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Comparisons by outcome (`agree`, `differ`, …), each present outcome once.
    pub outcomes: Vec<(String, i64)>,
    /// Comparisons by part that differs (`kind`, `wait`, …): one comparison may count under
    /// several.
    pub differences: Vec<(String, i64)>,
    /// Per minute (`minute_ms`, the minute's start, epoch ms): agree and differ counts (the
    /// other outcomes are in `outcomes`), oldest first.
    pub minutes: Vec<Minute>,
    /// The latest comparisons that did not agree, newest first, with both answers.
    pub latest: Vec<ShadowRow>,
}

/// One minute of a merchant's shadow comparisons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Minute {
    /// The minute's start, epoch ms.
    pub minute_ms: i64,
    /// Comparisons that agreed.
    pub agree: i64,
    /// Comparisons that differed (`differ` and `refused`).
    pub differ: i64,
}

/// `merchant`'s comparisons decided at or after `since_ms`: counts, minutes, and the `latest`
/// (at most that many) that did not agree.
///
/// # Errors
/// [`DbError::Sql`] when a read fails.
pub async fn summary(
    db: &Db,
    merchant: &str,
    since_ms: i64,
    latest: u32,
) -> Result<Summary, DbError> {
    let rows = db
        .backend()
        .query(
            "SELECT outcome, differences, decided_at_ms - (decided_at_ms % 60000), COUNT(*) \
             FROM shadow_decisions WHERE merchant_id = ? AND decided_at_ms >= ? \
             GROUP BY outcome, differences, decided_at_ms - (decided_at_ms % 60000)",
        )
        .bind(merchant)
        .bind(since_ms)
        .fetch_all(db.pool())
        .await?;
    let mut outcomes = std::collections::BTreeMap::<String, i64>::new();
    let mut differences = std::collections::BTreeMap::<String, i64>::new();
    let mut minutes = std::collections::BTreeMap::<i64, Minute>::new();
    for r in &rows {
        let outcome: String = r.try_get(0)?;
        let differs: String = r.try_get(1)?;
        let minute_ms: i64 = r.try_get(2)?;
        let n: i64 = r.try_get(3)?;
        *outcomes.entry(outcome.clone()).or_default() += n;
        for part in differs.split(',').filter(|p| !p.is_empty()) {
            *differences.entry(part.to_string()).or_default() += n;
        }
        let minute = minutes.entry(minute_ms).or_insert(Minute {
            minute_ms,
            agree: 0,
            differ: 0,
        });
        match outcome.as_str() {
            "agree" => minute.agree += n,
            "differ" | "refused" => minute.differ += n,
            _ => {}
        }
    }
    let latest = db
        .backend()
        .query(
            "SELECT merchant_id, order_id, phase, trigger_kind, decided_at_ms, outcome, \
             differences, live, shadow, shadow_digest, latency_us FROM shadow_decisions \
             WHERE merchant_id = ? AND decided_at_ms >= ? AND outcome <> 'agree' \
             ORDER BY decided_at_ms DESC, id DESC LIMIT ?",
        )
        .bind(merchant)
        .bind(since_ms)
        .bind(i64::from(latest))
        .fetch_all(db.pool())
        .await?
        .iter()
        .map(|r| {
            Ok(ShadowRow {
                merchant: r.try_get(0)?,
                order_id: r.try_get(1)?,
                phase: u32::try_from(r.try_get::<i64, _>(2)?).unwrap_or(0),
                trigger_kind: r.try_get(3)?,
                decided_at_ms: r.try_get(4)?,
                outcome: r.try_get(5)?,
                differences: r.try_get(6)?,
                live: r.try_get(7)?,
                shadow: r.try_get(8)?,
                shadow_digest: r.try_get(9)?,
                latency_us: r.try_get(10)?,
            })
        })
        .collect::<Result<Vec<_>, DbError>>()?;
    Ok(Summary {
        outcomes: outcomes.into_iter().collect(),
        differences: differences.into_iter().collect(),
        minutes: minutes.into_values().collect(),
        latest,
    })
}
