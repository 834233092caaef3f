//! `/v1/dead-letters…`: list, inspect, re-drive one, re-drive every one a filter matches.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};

use super::bulk::{self, Asked};
use super::{Actor, AdminState, ApiError, ApiResult};
use crate::bulk::dead_letters::{self as redrive, Redriven};
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
/// One rule for this and the bulk re-drive: [`crate::bulk::dead_letters::one`].
pub async fn redrive(State(s): State<AdminState>, Path(id): Path<i64>) -> ApiResult<Value> {
    let letter = one(&s, id).await?;
    let now = s.clock.now_ms(&s.db).await?;
    match redrive::one(&s.db, &letter, now).await? {
        Redriven::Rearmed {
            order_id,
            phase,
            due_ms,
            ..
        } => {
            s.waker.notify_one();
            Ok(Json(
                json!({ "redriven": id, "order_id": order_id, "rearmed": true, "phase": phase, "due_ms": due_ms }),
            ))
        }
        Redriven::LeftToDeadline {
            order_id, due_ms, ..
        } => Ok(Json(json!({
            "redriven": id, "order_id": order_id, "rearmed": false, "due_ms": due_ms,
        }))),
        Redriven::NoOrder { .. } => Err(ApiError(
            StatusCode::CONFLICT,
            format!("dead letter {id} names no order to re-drive"),
        )),
        Redriven::NotOpen { .. } => Err(ApiError(
            StatusCode::CONFLICT,
            format!("dead letter {id} is no longer OPEN"),
        )),
    }
}

/// `POST /v1/dead-letters/redrive`: one page of a bulk re-drive
/// ([`crate::bulk::dead_letters::page`]): `{scanned, matched, redriven, next_after_id}`. Call
/// again with `after_id = next_after_id` until it is null; `dry_run` first to see what would
/// go. What it did is audited beside the call (method `BULK`, the filter and the counts).
pub async fn redrive_many(
    State(s): State<AdminState>,
    Extension(actor): Extension<Actor>,
    body: Bytes,
) -> ApiResult<Value> {
    let (asked, pace) = Asked::<redrive::Filter>::read(
        &body,
        "merchant, source, reason_contains, since_ms, until_ms",
    )?;
    let page = redrive::page(&s.db, &asked.filter, asked.after_id, pace, || {
        s.clock.now_ms(&s.db)
    })
    .await
    .map_err(ApiError::query)?;
    if page
        .redriven
        .iter()
        .any(|r| matches!(r, Redriven::Rearmed { .. }))
    {
        s.waker.notify_one();
    }
    let what = format!(
        "redrive dead letters filter={} after_id={} dry_run={} matched={} redriven={}",
        serde_json::to_string(&asked.filter).expect("a filter serialises"),
        asked.after_id,
        pace.dry_run,
        page.matched.len(),
        page.redriven.iter().filter(|r| r.changed()).count()
    );
    bulk::audit(&s, &actor, &what).await?;
    Ok(Json(serde_json::to_value(page).expect("a page serialises")))
}
