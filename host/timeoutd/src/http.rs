//! The daemon's HTTP endpoint: payment callbacks.
//!
//! `POST /v1/payments/{order}/paid` — the provider (or the order service) reports that the
//! order's payment succeeded. For a CLOSED order that is a paid-after-close (F13): it is
//! recorded once and a refund is raised (or a manual review queued, per merchant), and stock and
//! coupons are not touched again. A PENDING order is aligned to PAID (its timeout then finds it
//! paid: the provider's notice is as good as the order service's record, seed 002). The same
//! path takes seed 003's paid messages ([`crate::paid`]). Answers: `202` recorded
//! (`{"status":"paid_after_close", "resolution":…, "new":bool}`), `200 {"status":"paid",
//! "new":bool}` the order is PAID (now, or already), `404` no such order, `401` a missing or
//! wrong bearer token when `http.callback_token` is set.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::config::{Config, PaidAfterClose};
use crate::db::Db;
use crate::effects::EffectRunner;
use crate::paid::Applied;

/// What the handlers share.
#[derive(Clone)]
pub struct HttpState {
    db: Db,
    effects: EffectRunner,
    resolutions: Arc<HashMap<String, PaidAfterClose>>,
    token: Option<String>,
}

impl HttpState {
    /// State for `config`'s merchants.
    pub fn new(db: Db, effects: EffectRunner, config: &Config) -> Self {
        HttpState {
            db,
            effects,
            resolutions: crate::effects::resolutions(config),
            token: config.http.as_ref().and_then(|h| h.callback_token.clone()),
        }
    }
}

/// The routes.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/v1/payments/{order}/paid", post(paid_callback))
        .with_state(state)
}

/// Serves the payment callbacks on `listener` until `shutdown` turns true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: HttpState,
    shutdown: watch::Receiver<bool>,
) {
    serve_until(listener, router(state), shutdown, "http endpoint").await;
}

/// Serves `app` on `listener` until `shutdown` turns true, letting requests in flight finish;
/// a failure is logged naming `what` (the daemon's HTTP listeners all stop this way).
pub async fn serve_until(
    listener: tokio::net::TcpListener,
    app: Router,
    mut shutdown: watch::Receiver<bool>,
    what: &str,
) {
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            crate::shutdown::stopping(&mut shutdown).await;
        })
        .await;
    if let Err(e) = served {
        tracing::error!(error = %e, "{what} failed");
    }
}

async fn paid_callback(
    State(state): State<HttpState>,
    Path(order_id): Path<String>,
    headers: HeaderMap,
) -> (StatusCode, Json<Value>) {
    if let Some(token) = &state.token {
        let given = headers.get("authorization").and_then(|v| v.to_str().ok());
        if given != Some(format!("Bearer {token}").as_str()) {
            return (
                StatusCode::UNAUTHORIZED,
                Json(json!({ "error": "missing or wrong bearer token" })),
            );
        }
    }
    match handle_paid(&state, &order_id).await {
        Ok(answer) => answer,
        Err(e) => {
            tracing::error!(order = %order_id, error = %e, "payment callback failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({ "error": e.to_string() })),
            )
        }
    }
}

async fn handle_paid(
    state: &HttpState,
    order_id: &str,
) -> Result<(StatusCode, Json<Value>), crate::db::DbError> {
    let clock = state.effects.clock();
    match crate::paid::apply(&state.db, clock, &state.resolutions, order_id, "callback").await? {
        Applied::Missing => Ok((
            StatusCode::NOT_FOUND,
            Json(json!({ "error": format!("order `{order_id}` does not exist") })),
        )),
        Applied::AlreadyPaid => Ok((
            StatusCode::OK,
            Json(json!({ "status": "paid", "new": false })),
        )),
        Applied::Aligned => Ok((
            StatusCode::OK,
            Json(json!({ "status": "paid", "new": true })),
        )),
        Applied::AfterClose { resolution, new } => {
            state.effects.run_for_order(order_id).await;
            Ok((
                StatusCode::ACCEPTED,
                Json(
                    json!({ "status": "paid_after_close", "resolution": resolution.as_str(), "new": new }),
                ),
            ))
        }
    }
}
