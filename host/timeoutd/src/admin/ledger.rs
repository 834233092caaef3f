//! `/v1/ledger…`: failed effects and their retry, one or a filtered set.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde_json::{Value, json};

use super::bulk::{self, Asked};
use super::orders::Limit;
use super::{Actor, AdminState, ApiError, ApiResult};
use crate::bulk::effects::{self, Retried};
use crate::db::views;

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
/// close transaction applies (stock, coupon), which the executor cannot redo. One rule for this
/// and the bulk retry: [`crate::bulk::effects::one`].
pub async fn retry(State(s): State<AdminState>, Path(id): Path<i64>) -> ApiResult<Value> {
    let Some(kind) = views::effect_kind(&s.db, id)
        .await
        .map_err(ApiError::query)?
    else {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("ledger row {id} does not exist"),
        ));
    };
    match effects::one(&s.db, id, &kind)
        .await
        .map_err(ApiError::query)?
    {
        Retried::Retrying { .. } => Ok(Json(json!({ "retrying": id }))),
        Retried::InTransaction { kind, .. } => Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "ledger row {id} is a `{kind}` effect, applied inside the close transaction; fix the data and correct it by hand"
            ),
        )),
        Retried::NotFailed { .. } => Err(ApiError(
            StatusCode::CONFLICT,
            format!("ledger row {id} is not FAILED"),
        )),
    }
}

/// `POST /v1/ledger/retry`: one page of a bulk retry ([`crate::bulk::effects::page`]) of the
/// FAILED effects a filter matches (`merchant`, `kind`, `reason_contains`, `since_ms`,
/// `until_ms`): `{scanned, matched, retried, next_after_id}`; paged, paced, dry-run and audited
/// as the bulk re-drive is.
pub async fn retry_many(
    State(s): State<AdminState>,
    Extension(actor): Extension<Actor>,
    body: Bytes,
) -> ApiResult<Value> {
    let (asked, pace) = Asked::<effects::Filter>::read(
        &body,
        "merchant, kind, reason_contains, since_ms, until_ms",
    )?;
    let page = effects::page(&s.db, &asked.filter, asked.after_id, pace)
        .await
        .map_err(ApiError::query)?;
    let what = format!(
        "retry failed effects filter={} after_id={} dry_run={} matched={} retried={}",
        serde_json::to_string(&asked.filter).expect("a filter serialises"),
        asked.after_id,
        pace.dry_run,
        page.matched.len(),
        page.retried
            .iter()
            .filter(|r| matches!(r, Retried::Retrying { .. }))
            .count()
    );
    bulk::audit(&s, &actor, &what).await?;
    Ok(Json(serde_json::to_value(page).expect("a page serialises")))
}
