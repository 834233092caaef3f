//! `/v1/pauses`, `/v1/merchants/{merchant}/pause|resume`, `/v1/orders/{id}/pause|resume`: an
//! operator holds a merchant's orders, or one order, back from every close and reminder, and
//! lets them go again (`db::pauses`; docs/operators.md, "Pausing a merchant or an order").
//! Every call is audited like any other (`admin_audit`); the pause row names the token's name.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Actor, AdminState, ApiError, ApiResult};
use crate::db::pauses::{self, NotPausable, Scope};

/// The optional body of a pause: `{"reason": "…"}` (at most [`REASON_MAX`] characters).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PauseBody {
    #[serde(default)]
    reason: String,
}

/// The longest reason kept, in characters.
pub const REASON_MAX: usize = 500;

/// `GET /v1/pauses`: every pause in force.
pub async fn list(State(s): State<AdminState>) -> ApiResult<Value> {
    let pauses = pauses::list(&s.db).await.map_err(ApiError::query)?;
    Ok(Json(json!({ "pauses": pauses })))
}

/// `POST /v1/merchants/{merchant}/pause`: 404 for a merchant this daemon has no plugin for.
pub async fn pause_merchant(
    State(s): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path(merchant): Path<String>,
    body: Bytes,
) -> ApiResult<Value> {
    if s.policies.get(&merchant).is_none() {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!(
                "merchant `{merchant}` is not configured here (merchants: {})",
                s.policies
                    .all()
                    .iter()
                    .map(|p| p.merchant.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    pause(&s, &actor, Scope::Merchant, &merchant, &body).await
}

/// `POST /v1/orders/{id}/pause`: 404 for an order that does not exist, 409 for one that is not
/// PENDING (nothing is left to hold).
pub async fn pause_order(
    State(s): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Value> {
    match pauses::pausable_order(&s.db, &id)
        .await
        .map_err(ApiError::query)?
    {
        Ok(()) => {}
        Err(why) => {
            let status = match why {
                NotPausable::Missing => StatusCode::NOT_FOUND,
                NotPausable::Settled(_) => StatusCode::CONFLICT,
                NotPausable::Unreadable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            };
            return Err(ApiError(status, format!("order `{id}` {why}")));
        }
    }
    pause(&s, &actor, Scope::Order, &id, &body).await
}

/// `POST /v1/merchants/{merchant}/resume`.
pub async fn resume_merchant(
    State(s): State<AdminState>,
    Path(merchant): Path<String>,
) -> ApiResult<Value> {
    resume(&s, Scope::Merchant, &merchant).await
}

/// `POST /v1/orders/{id}/resume`.
pub async fn resume_order(State(s): State<AdminState>, Path(id): Path<String>) -> ApiResult<Value> {
    resume(&s, Scope::Order, &id).await
}

/// Pauses `target`: `{"pause": …, "new": bool}` (`new` false when it was paused already; the
/// first pause stands). 400 for a body that is not `{"reason": "…"}`.
async fn pause(
    s: &AdminState,
    actor: &Actor,
    scope: Scope,
    target: &str,
    body: &[u8],
) -> ApiResult<Value> {
    let body: PauseBody = if body.iter().all(u8::is_ascii_whitespace) {
        PauseBody::default()
    } else {
        serde_json::from_slice(body).map_err(|e| {
            ApiError(
                StatusCode::BAD_REQUEST,
                format!("body: expected {{\"reason\": \"…\"}} or nothing: {e}"),
            )
        })?
    };
    if body.reason.chars().count() > REASON_MAX {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("reason: at most {REASON_MAX} characters"),
        ));
    }
    let now = s.clock.now_ms(&s.db).await?;
    let (pause, new) = pauses::pause(&s.db, scope, target, now, &actor.0, &body.reason)
        .await
        .map_err(ApiError::query)?;
    tracing::warn!(target: "timeoutd::audit", scope = scope.as_str(), target, actor = %actor.0, reason = %body.reason, "paused: no close or reminder until resumed");
    Ok(Json(json!({ "pause": pause, "new": new })))
}

/// Resumes `target`: `{"resumed": {scope, target}, "woken": n}` (`n` held triggers made due
/// now); 409 when it is not paused.
async fn resume(s: &AdminState, scope: Scope, target: &str) -> ApiResult<Value> {
    let now = s.clock.now_ms(&s.db).await?;
    let Some(woken) = pauses::resume(&s.db, scope, target, now)
        .await
        .map_err(ApiError::query)?
    else {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("{} `{target}` is not paused", scope.as_str()),
        ));
    };
    s.waker.notify_one();
    tracing::warn!(target: "timeoutd::audit", scope = scope.as_str(), target, woken, "resumed: held triggers are decided again");
    Ok(Json(json!({
        "resumed": { "scope": scope, "target": target },
        "woken": woken,
    })))
}
