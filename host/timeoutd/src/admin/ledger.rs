//! `/v1/ledger…`: failed effects and their retry.

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde_json::{Value, json};

use super::orders::Limit;
use super::{AdminState, ApiError, ApiResult};
use crate::db::{ledger, views};

/// `GET /v1/ledger/failed`: FAILED effects, newest first, with their reason.
pub async fn failed(State(s): State<AdminState>, Query(limit): Query<Limit>) -> ApiResult<Value> {
    let effects = views::failed_effects(&s.db, limit.get())
        .await
        .map_err(ApiError::query)?;
    Ok(Json(json!({ "effects": effects })))
}

/// `POST /v1/ledger/{id}/retry`: a FAILED external effect goes back to PENDING with a fresh
/// attempt budget; the ledger executor's next round runs it (with its original idempotency key,
/// so the target still recognises a repeat). 409 when it is not FAILED, or is an effect the
/// close transaction applies (stock, coupon), which the executor cannot redo.
pub async fn retry(State(s): State<AdminState>, Path(id): Path<i64>) -> ApiResult<Value> {
    let kind = views::effect_kind(&s.db, id)
        .await
        .map_err(ApiError::query)?;
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
    let retrying = ledger::retry_failed(&mut tx, id)
        .await
        .map_err(ApiError::query)?;
    tx.commit().await?;
    if !retrying {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("ledger row {id} is not FAILED"),
        ));
    }
    Ok(Json(json!({ "retrying": id })))
}
