//! `/v1/orders/…`: overdue orders, one order's timeline, manual close.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use timeoutd_runtime::model::{OrderStatus, TriggerKind};

use super::{AdminState, ApiError, ApiResult};
use crate::db::{orders, views};
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
    let orders = views::overdue_orders(&s.db, now, s.overdue_margin_ms, limit.get())
        .await
        .map_err(ApiError::query)?;
    Ok(Json(json!({ "now_ms": now, "orders": orders })))
}

/// `GET /v1/orders/{id}`: the order, its triggers, decisions (with plugin digests), effects,
/// dead letters and any paid-after-close record.
pub async fn timeline(State(s): State<AdminState>, Path(id): Path<String>) -> ApiResult<Value> {
    let order = {
        let mut conn =
            s.db.pool()
                .acquire()
                .await
                .map_err(|e| ApiError::query(e.into()))?;
        orders::load(&mut conn, &id).await?
    }
    .ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            format!("order `{id}` does not exist"),
        )
    })?;
    let t = views::timeline(&s.db, &id).await.map_err(ApiError::query)?;
    Ok(Json(json!({
        "order": order, "triggers": t.triggers, "decisions": t.decisions, "effects": t.effects,
        "dead_letters": t.dead_letters, "paid_after_close": t.paid_after_close,
    })))
}

/// `POST /v1/orders/{id}/close`: a `manual` trigger through the dispatcher — the merchant's
/// plugin decides, the guard checks, the compare-and-set closes. 409 when the order is not
/// PENDING or its deadline has not passed.
pub async fn close(State(s): State<AdminState>, Path(id): Path<String>) -> ApiResult<Value> {
    let order = {
        let mut conn =
            s.db.pool()
                .acquire()
                .await
                .map_err(|e| ApiError::query(e.into()))?;
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
        claim: None,
        state: Vec::new(),
        poll: false,
    };
    let outcome = s.dispatcher.handle(&trigger).await;
    Ok(Json(
        serde_json::to_value(outcome).expect("outcome serialises"),
    ))
}
