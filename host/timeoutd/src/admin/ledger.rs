//! `/v1/ledger…`: failed effects and their retry.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde_json::{Value, json};
use sqlx::Row;

use super::orders::Limit;
use super::{AdminState, ApiError, ApiResult};

/// `GET /v1/ledger/failed`: FAILED effects, newest first, with their reason.
pub async fn failed(State(s): State<AdminState>, Query(limit): Query<Limit>) -> ApiResult<Value> {
    let rows = s
        .db
        .backend()
        .query(
            "SELECT id, idempotency_key, order_id, kind, attempts, last_error, updated_at_ms FROM effect_ledger \
             WHERE status = 'FAILED' ORDER BY id DESC LIMIT ?",
        )
        .bind(limit.get())
        .fetch_all(s.db.pool())
        .await?;
    let effects = rows
        .iter()
        .map(|r| {
            Ok(json!({
                "id": r.try_get::<i64, _>(0)?, "key": r.try_get::<String, _>(1)?,
                "order_id": r.try_get::<String, _>(2)?, "kind": r.try_get::<String, _>(3)?,
                "attempts": r.try_get::<i64, _>(4)?, "reason": r.try_get::<Option<String>, _>(5)?,
                "failed_at_ms": r.try_get::<i64, _>(6)?,
            }))
        })
        .collect::<Result<Vec<_>, sqlx::Error>>()?;
    Ok(Json(json!({ "effects": effects })))
}

/// `POST /v1/ledger/{id}/retry`: a FAILED external effect goes back to PENDING with a fresh
/// attempt budget; the ledger executor's next round runs it (with its original idempotency key,
/// so the target still recognises a repeat). 409 when it is not FAILED, or is an effect the
/// close transaction applies (stock, coupon), which the executor cannot redo.
pub async fn retry(State(s): State<AdminState>, Path(id): Path<i64>) -> ApiResult<Value> {
    let kind: Option<String> =
        s.db.backend()
            .query("SELECT kind FROM effect_ledger WHERE id = ?")
            .bind(id)
            .fetch_optional(s.db.pool())
            .await?
            .map(|r| r.try_get(0))
            .transpose()?;
    match kind.as_deref() {
        None => {
            return Err(ApiError(
                StatusCode::NOT_FOUND,
                format!("ledger row {id} does not exist"),
            ));
        }
        Some(k) if !crate::kinds::LedgerKind::parse(k).is_some_and(|k| k.is_external()) => {
            return Err(ApiError(
                StatusCode::CONFLICT,
                format!(
                    "ledger row {id} is a `{k}` effect, applied inside the close transaction; fix the data and correct it by hand"
                ),
            ));
        }
        Some(_) => {}
    }
    let mut tx = s.db.begin().await?;
    let done = crate::db::Backend::of(&tx)
        .query(
            "UPDATE effect_ledger SET status = 'PENDING', attempts = 0, next_attempt_ms = 0, \
             claim_until_ms = NULL, updated_at_ms = 0 WHERE id = ? AND status = 'FAILED'",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    tx.commit().await?;
    if done == 0 {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("ledger row {id} is not FAILED"),
        ));
    }
    Ok(Json(json!({ "retrying": id })))
}
