//! `/v1/orders/…`: overdue orders, one order's timeline, manual close.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use sqlx::Row;
use timeoutd_runtime::model::{OrderStatus, TriggerKind};

use super::{AdminState, ApiError, ApiResult};
use crate::db::orders;
use crate::dispatch::Trigger;

/// `?limit=` (default 100, at most 1000).
#[derive(Debug, Deserialize)]
pub struct Limit {
    limit: Option<u32>,
}

impl Limit {
    pub(super) fn get(&self) -> i64 {
        i64::from(self.limit.unwrap_or(100).clamp(1, 1000))
    }
}

/// `GET /v1/orders/overdue`: open orders past their deadline by more than `admin.overdue_margin`,
/// most overdue first, with the reason of an open dead letter when there is one.
pub async fn overdue(State(s): State<AdminState>, Query(limit): Query<Limit>) -> ApiResult<Value> {
    let now = s.clock.now_ms(&s.db).await?;
    let rows = s
        .db
        .backend()
        .query(
            "SELECT o.id, o.merchant_id, o.user_id, o.deadline_ms, \
             (SELECT MAX(d.reason) FROM dead_letter d WHERE d.order_id = o.id AND d.status = 'OPEN') \
             FROM orders o WHERE o.status = 'PENDING' AND o.deadline_ms <= ? ORDER BY o.deadline_ms LIMIT ?",
        )
        .bind(now - s.overdue_margin_ms)
        .bind(limit.get())
        .fetch_all(s.db.pool())
        .await?;
    let orders = rows
        .iter()
        .map(|r| {
            let deadline: i64 = r.try_get(3)?;
            Ok(json!({
                "id": r.try_get::<String, _>(0)?, "merchant": r.try_get::<String, _>(1)?,
                "user": r.try_get::<String, _>(2)?, "deadline_ms": deadline, "overdue_ms": now - deadline,
                "dead_letter": r.try_get::<Option<String>, _>(4)?,
            }))
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok(Json(json!({ "now_ms": now, "orders": orders })))
}

/// `GET /v1/orders/{id}`: the order, its triggers, decisions (with plugin digests), effects,
/// dead letters and any paid-after-close record.
pub async fn timeline(State(s): State<AdminState>, Path(id): Path<String>) -> ApiResult<Value> {
    let order = {
        let mut conn = s.db.pool().acquire().await?;
        orders::load(&mut conn, &id).await?
    }
    .ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            format!("order `{id}` does not exist"),
        )
    })?;
    let b = s.db.backend();
    let pool = s.db.pool();
    let triggers = b
        .query("SELECT id, phase, due_ms, status, source, attempts, last_error, processed_at_ms FROM order_timeout_msg WHERE order_id = ? ORDER BY phase, id")
        .bind(&id).fetch_all(pool).await?.iter().map(|r| Ok(json!({
            "id": r.try_get::<i64, _>(0)?, "phase": r.try_get::<i64, _>(1)?, "due_ms": r.try_get::<i64, _>(2)?,
            "status": r.try_get::<String, _>(3)?, "source": r.try_get::<String, _>(4)?,
            "attempts": r.try_get::<i64, _>(5)?, "note": r.try_get::<Option<String>, _>(6)?,
            "processed_at_ms": r.try_get::<Option<i64>, _>(7)?,
        }))).collect::<Result<Vec<_>, sqlx::Error>>()?;
    let decisions = b
        .query("SELECT decided_at_ms, trigger_kind, phase, attempt, plugin, plugin_digest, decision, outcome, detail, latency_us FROM decision_log WHERE order_id = ? ORDER BY id")
        .bind(&id).fetch_all(pool).await?.iter().map(|r| Ok(json!({
            "at_ms": r.try_get::<i64, _>(0)?, "trigger": r.try_get::<String, _>(1)?, "phase": r.try_get::<i64, _>(2)?,
            "attempt": r.try_get::<i64, _>(3)?, "plugin": r.try_get::<String, _>(4)?, "plugin_digest": r.try_get::<String, _>(5)?,
            "decision": r.try_get::<String, _>(6)?, "outcome": r.try_get::<String, _>(7)?,
            "detail": serde_json::from_str::<Value>(&r.try_get::<String, _>(8)?).unwrap_or(Value::Null),
            "latency_us": r.try_get::<i64, _>(9)?,
        }))).collect::<Result<Vec<_>, sqlx::Error>>()?;
    let effects = b
        .query("SELECT id, idempotency_key, kind, status, attempts, last_error, payload FROM effect_ledger WHERE order_id = ? ORDER BY phase, effect_index")
        .bind(&id).fetch_all(pool).await?.iter().map(|r| Ok(json!({
            "id": r.try_get::<i64, _>(0)?, "key": r.try_get::<String, _>(1)?, "kind": r.try_get::<String, _>(2)?,
            "status": r.try_get::<String, _>(3)?, "attempts": r.try_get::<i64, _>(4)?,
            "note": r.try_get::<Option<String>, _>(5)?,
            "payload": serde_json::from_str::<Value>(&r.try_get::<String, _>(6)?).unwrap_or(Value::Null),
        }))).collect::<Result<Vec<_>, sqlx::Error>>()?;
    let dead_letters = super::dead_letters::rows(&s, Some(&id), None, 100).await?;
    let paid_after_close = b
        .query("SELECT source, resolution, detected_at_ms FROM paid_after_close WHERE order_id = ?")
        .bind(&id)
        .fetch_optional(pool)
        .await?
        .map(|r| {
            Ok::<_, sqlx::Error>(json!({
                "source": r.try_get::<String, _>(0)?, "resolution": r.try_get::<String, _>(1)?,
                "detected_at_ms": r.try_get::<i64, _>(2)?,
            }))
        })
        .transpose()?;
    Ok(Json(json!({
        "order": order, "triggers": triggers, "decisions": decisions, "effects": effects,
        "dead_letters": dead_letters, "paid_after_close": paid_after_close,
    })))
}

/// `POST /v1/orders/{id}/close`: a `manual` trigger through the dispatcher — the merchant's
/// plugin decides, the guard checks, the compare-and-set closes. 409 when the order is not
/// PENDING or its deadline has not passed.
pub async fn close(State(s): State<AdminState>, Path(id): Path<String>) -> ApiResult<Value> {
    let order = {
        let mut conn = s.db.pool().acquire().await?;
        orders::load(&mut conn, &id).await.map_err(|e| match e {
            crate::db::DbError::BadRow { detail, .. } => {
                ApiError(StatusCode::UNPROCESSABLE_ENTITY, detail)
            }
            other => other.into(),
        })?
    }
    .ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            format!("order `{id}` does not exist"),
        )
    })?;
    if order.status != OrderStatus::Pending {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("order `{id}` is {}", order.status.as_str()),
        ));
    }
    let now = s.clock.now_ms(&s.db).await?;
    if now < order.deadline_ms {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "order `{id}`'s deadline is {} ms away; it cannot be closed yet",
                order.deadline_ms - now
            ),
        ));
    }
    let phase = crate::db::outbox::latest_phase(&s.db, &id).await?;
    let trigger = Trigger {
        order_id: id,
        kind: TriggerKind::Manual,
        phase,
        attempt: 0,
        due_ms: None,
        row_id: None,
        state: Vec::new(),
    };
    let outcome = s.dispatcher.handle(&trigger).await;
    Ok(Json(
        serde_json::to_value(outcome).expect("outcome serialises"),
    ))
}
