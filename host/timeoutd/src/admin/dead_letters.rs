//! `/v1/dead-letters…`: list, inspect, re-drive.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use sqlx::Row;

use super::{AdminState, ApiError, ApiResult};
use crate::db::outbox::{self, Orphan, SOURCE_MANUAL};

/// `?status=OPEN|REDRIVEN|DISMISSED&limit=`.
#[derive(Debug, Deserialize)]
pub struct Filter {
    status: Option<String>,
    limit: Option<u32>,
}

pub(super) async fn rows(
    s: &AdminState,
    order_id: Option<&str>,
    status: Option<&str>,
    limit: i64,
) -> Result<Vec<Value>, sqlx::Error> {
    let mut sql = String::from(
        "SELECT id, source, order_id, reason, payload, attempts, status, created_at_ms FROM dead_letter WHERE 1 = 1",
    );
    if order_id.is_some() {
        sql += " AND order_id = ?";
    }
    if status.is_some() {
        sql += " AND status = ?";
    }
    sql += " ORDER BY id DESC LIMIT ?";
    let mut q = s.db.backend().query_owned(sql);
    if let Some(o) = order_id {
        q = q.bind(o.to_string());
    }
    if let Some(st) = status {
        q = q.bind(st.to_string());
    }
    q.bind(limit)
        .fetch_all(s.db.pool())
        .await?
        .iter()
        .map(|r| {
            Ok(json!({
                "id": r.try_get::<i64, _>(0)?, "source": r.try_get::<String, _>(1)?,
                "order_id": r.try_get::<Option<String>, _>(2)?, "reason": r.try_get::<String, _>(3)?,
                "payload": r.try_get::<String, _>(4)?, "attempts": r.try_get::<i64, _>(5)?,
                "status": r.try_get::<String, _>(6)?, "created_at_ms": r.try_get::<i64, _>(7)?,
            }))
        })
        .collect()
}

/// `GET /v1/dead-letters`: newest first (default: OPEN ones).
pub async fn list(State(s): State<AdminState>, Query(f): Query<Filter>) -> ApiResult<Value> {
    let status = f.status.unwrap_or_else(|| "OPEN".into());
    let limit = i64::from(f.limit.unwrap_or(100).clamp(1, 1000));
    Ok(Json(
        json!({ "dead_letters": rows(&s, None, Some(&status), limit).await? }),
    ))
}

/// `GET /v1/dead-letters/{id}`.
pub async fn inspect(State(s): State<AdminState>, Path(id): Path<i64>) -> ApiResult<Value> {
    one(&s, id).await.map(Json)
}

async fn one(s: &AdminState, id: i64) -> Result<Value, ApiError> {
    let row =
        s.db.backend()
            .query("SELECT order_id, status, reason FROM dead_letter WHERE id = ?")
            .bind(id)
            .fetch_optional(s.db.pool())
            .await?
            .ok_or_else(|| {
                ApiError(
                    StatusCode::NOT_FOUND,
                    format!("dead letter {id} does not exist"),
                )
            })?;
    Ok(json!({
        "id": id, "order_id": row.try_get::<Option<String>, _>(0)?,
        "status": row.try_get::<String, _>(1)?, "reason": row.try_get::<String, _>(2)?,
    }))
}

/// `POST /v1/dead-letters/{id}/redrive`: marks an OPEN dead letter REDRIVEN and re-arms its
/// order (latest phase, due now, attempts reset); the outbox timer takes it from there. 409 when
/// it is not OPEN or names no order.
pub async fn redrive(State(s): State<AdminState>, Path(id): Path<i64>) -> ApiResult<Value> {
    let letter = one(&s, id).await?;
    let Some(order_id) = letter["order_id"].as_str().map(str::to_string) else {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("dead letter {id} names no order to re-drive"),
        ));
    };
    let now = s.clock.now_ms(&s.db).await?;
    let mut tx = s.db.begin().await?;
    let marked = crate::db::Backend::of(&tx)
        .query("UPDATE dead_letter SET status = 'REDRIVEN' WHERE id = ? AND status = 'OPEN'")
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    tx.commit().await?;
    if marked == 0 {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("dead letter {id} is no longer OPEN"),
        ));
    }
    let orphan = Orphan {
        order_id: order_id.clone(),
        phase: outbox::latest_phase(&s.db, &order_id).await?,
        deadline_ms: now,
    };
    outbox::rearm_as(&s.db, &orphan, now, SOURCE_MANUAL).await?;
    s.waker.notify_one();
    Ok(Json(
        json!({ "redriven": id, "order_id": order_id, "phase": orphan.phase }),
    ))
}
