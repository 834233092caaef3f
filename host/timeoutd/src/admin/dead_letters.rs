//! `/v1/dead-letters…`: list, inspect, re-drive.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{AdminState, ApiError, ApiResult};
use crate::db::journal;
use crate::db::outbox::{self, Orphan, SOURCE_MANUAL};
use crate::db::views::{self, DeadLetterRow};

/// `?status=OPEN|REDRIVEN|DISMISSED&limit=`.
#[derive(Debug, Deserialize)]
pub struct Filter {
    status: Option<String>,
    limit: Option<u32>,
}

/// `GET /v1/dead-letters`: newest first (default: OPEN ones).
pub async fn list(State(s): State<AdminState>, Query(f): Query<Filter>) -> ApiResult<Value> {
    let status = f.status.unwrap_or_else(|| "OPEN".into());
    let limit = i64::from(f.limit.unwrap_or(100).clamp(1, 1000));
    let dead_letters = views::dead_letters(&s.db, None, Some(&status), limit)
        .await
        .map_err(ApiError::query)?;
    Ok(Json(json!({ "dead_letters": dead_letters })))
}

/// `GET /v1/dead-letters/{id}`: the dead letter whole (`id`, `source`, `order_id`, `reason`,
/// `payload` as received, `attempts`, `status`, `created_at_ms`); 404 when there is none.
pub async fn inspect(State(s): State<AdminState>, Path(id): Path<i64>) -> ApiResult<Value> {
    one(&s, id).await.map(|letter| Json(json!(letter)))
}

async fn one(s: &AdminState, id: i64) -> Result<DeadLetterRow, ApiError> {
    views::dead_letter(&s.db, id)
        .await
        .map_err(ApiError::query)?
        .ok_or_else(|| {
            ApiError(
                StatusCode::NOT_FOUND,
                format!("dead letter {id} does not exist"),
            )
        })
}

/// `POST /v1/dead-letters/{id}/redrive`: marks an OPEN dead letter REDRIVEN and re-arms its
/// order (latest phase, due now, attempts reset); the outbox timer takes it from there. An order
/// not yet due is left to its own trigger at its deadline (`rearmed: false`). Answers
/// `{redriven, order_id, rearmed, due_ms[, phase]}`; 409 when it is not OPEN or names no order.
pub async fn redrive(State(s): State<AdminState>, Path(id): Path<i64>) -> ApiResult<Value> {
    let letter = one(&s, id).await?;
    let Some(order_id) = letter.order_id else {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("dead letter {id} names no order to re-drive"),
        ));
    };
    let now = s.clock.now_ms(&s.db).await?;
    let mut tx = s.db.begin().await?;
    let marked = journal::mark_redriven(&mut tx, id)
        .await
        .map_err(ApiError::query)?;
    tx.commit().await?;
    if !marked {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("dead letter {id} is no longer OPEN"),
        ));
    }
    // An order not yet due is not re-armed: a re-driven trigger is an operator's (`manual`),
    // which is not held for the deadline, and a letter about a message (a poison body) can
    // name such an order. Its own row, or the sweep, closes it at its deadline.
    let mut conn =
        s.db.pool()
            .acquire()
            .await
            .map_err(|e| ApiError::query(e.into()))?;
    let deadline = crate::db::orders::load(&mut conn, s.db.schema(), &order_id)
        .await?
        .map(|o| o.deadline_ms);
    drop(conn);
    if let Some(due_ms) = deadline.filter(|d| *d > now) {
        return Ok(Json(json!({
            "redriven": id, "order_id": order_id, "rearmed": false, "due_ms": due_ms,
        })));
    }
    let orphan = Orphan {
        order_id: order_id.clone(),
        phase: outbox::latest_phase(&s.db, &order_id).await?,
        deadline_ms: now,
    };
    outbox::rearm_as(&s.db, std::slice::from_ref(&orphan), now, SOURCE_MANUAL).await?;
    s.waker.notify_one();
    Ok(Json(
        json!({ "redriven": id, "order_id": order_id, "rearmed": true, "phase": orphan.phase, "due_ms": now }),
    ))
}
