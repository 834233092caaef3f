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
//!
//! `POST /v1/providers/stripe/webhook` — Stripe's signed `payment_intent.succeeded` events
//! ([`stripe`]), applied as the paid callback is.
//!
//! `POST /v1/providers/alipay/notify/{order}` — Alipay's signed asynchronous notifications
//! ([`alipay`]), applied as the paid callback is and answered `success`.
//!
//! `POST /v1/providers/wechatpay/notify/{order}` — WeChat Pay's signed, encrypted payment
//! notifications ([`wechatpay`]), applied as the paid callback is.
//!
//! `POST /v1/orders/{order}/payment-attempts` — an aggregated cashier about to take the buyer's
//! money serializes the payment with the close: the order is held against its close for
//! `http.payment_lease`, or the answer says why it cannot be paid ([`orders::take_payment_lease`]).

mod alipay;
mod notice;
mod stripe;
mod wechatpay;

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::config::{Config, PaidAfterClose, Routing};
use crate::db::{Db, orders};
use crate::dispatch::AfterCommit;
use crate::effects::EffectRunner;
use crate::paid::Applied;

/// What the handlers share.
#[derive(Clone)]
pub struct HttpState {
    /// The order database: one, or the shards of `[[database.shards]]` in order, each with its
    /// name and its effect runner.
    shards: Arc<Vec<(String, Db, EffectRunner)>>,
    routing: Routing,
    resolutions: Arc<HashMap<String, PaidAfterClose>>,
    token: Option<String>,
    lease_ms: i64,
    stripe: Option<Arc<stripe::StripeWebhook>>,
    alipay: Option<Arc<alipay::AlipayNotify>>,
    wechatpay: Option<Arc<wechatpay::WechatpayNotify>>,
    /// Where a paid notice that raised a refund hands its order: the daemon's ledger worker
    /// (as after any commit, and as the paid topic does); `None` runs it with the shard's
    /// effect runner (tests, and a sharded front whose shards' workers may be elsewhere).
    after_commit: Option<Arc<dyn AfterCommit>>,
}

impl HttpState {
    /// State for `config`'s merchants over one database.
    pub fn new(db: Db, effects: EffectRunner, config: &Config) -> Self {
        Self::sharded(vec![(String::new(), db, effects)], config)
    }

    /// State over the shards of `[[database.shards]]` (name, database, effect runner, in the
    /// list's order): each request goes to its order's shard by `database.routing`.
    pub fn sharded(shards: Vec<(String, Db, EffectRunner)>, config: &Config) -> Self {
        HttpState {
            shards: Arc::new(shards),
            routing: config.database.routing,
            resolutions: crate::effects::resolutions(config),
            token: config.http.as_ref().and_then(|h| h.callback_token.clone()),
            lease_ms: config
                .http
                .as_ref()
                .map_or(120_000, |h| h.payment_lease.as_millis() as i64),
            stripe: stripe::StripeWebhook::from_config(config).map(Arc::new),
            alipay: alipay::AlipayNotify::from_config(config).map(Arc::new),
            wechatpay: wechatpay::WechatpayNotify::from_config(config).map(Arc::new),
            after_commit: None,
        }
    }

    /// This state, handing the orders of paid notices that raised a refund to `port` (the
    /// daemon's ledger worker) instead of running them on the request.
    pub fn with_after_commit(mut self, port: Arc<dyn AfterCommit>) -> Self {
        self.after_commit = Some(port);
        self
    }

    /// What follows a paid notice's commit, the same for every endpoint and for the paid topic:
    /// a refund it raised ([`Applied::raised_refund`]) is handed to the after-commit path.
    async fn after_paid(&self, effects: &EffectRunner, order_id: &str, applied: Applied) {
        if !applied.raised_refund() {
            return;
        }
        match &self.after_commit {
            Some(port) => port.committed(&[order_id]).await,
            None => effects.committed(&[order_id]).await,
        }
    }

    /// The database and effect runner holding `order_id`; with shards, `400` naming the id when
    /// the routing rule cannot place it.
    #[allow(clippy::result_large_err)]
    fn shard(&self, order_id: &str) -> Result<(&Db, &EffectRunner), (StatusCode, Json<Value>)> {
        let at = match self.shards.len() {
            1 => 0,
            n => crate::config::routing::shard_of(self.routing, order_id, n).map_err(|e| {
                (
                    StatusCode::BAD_REQUEST,
                    Json(json!({ "error": e.to_string() })),
                )
            })?,
        };
        let (_, db, effects) = &self.shards[at];
        Ok((db, effects))
    }
}

/// The routes.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/v1/payments/{order}/paid", post(paid_callback))
        .route("/v1/orders/{order}/payment-attempts", post(payment_attempt))
        .route("/v1/providers/stripe/webhook", post(stripe::webhook))
        .route("/v1/providers/alipay/notify/{order}", post(alipay::notify))
        .route(
            "/v1/providers/wechatpay/notify/{order}",
            post(wechatpay::notify),
        )
        .fallback(no_route)
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
/// a failure is logged naming `what` (the daemon's HTTP listeners all stop this way). Every
/// request runs to completion ([`run_to_completion`]), whatever its client does.
pub async fn serve_until(
    listener: tokio::net::TcpListener,
    app: Router,
    mut shutdown: watch::Receiver<bool>,
    what: &str,
) {
    let app = app.layer(axum::middleware::from_fn(run_to_completion));
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            crate::shutdown::stopping(&mut shutdown).await;
        })
        .await;
    if let Err(e) = served {
        tracing::error!(error = %e, "{what} failed");
    }
}

/// Runs each request's handler in a task of its own. A client that disconnects mid-request
/// drops the connection's future, and with it any handler polled inside it; a handler in its
/// own task is not cancelled, so its database work runs to its end — commit, or rollback on
/// error — and is never stopped half-way, nor inside `BEGIN`: sqlx 0.9.0 (the newest release,
/// checked 2026-12-01) returns a PostgreSQL connection to the pool still inside a transaction
/// when a `begin()` is cancelled (transact-rs/sqlx#4393, fixed after the release by #4394).
async fn run_to_completion(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    use tracing::Instrument;
    let span = tracing::info_span!(
        "http",
        method = %request.method(),
        path = %request.uri().path(),
        status = tracing::field::Empty
    );
    crate::telemetry::continue_trace(
        &span,
        request
            .headers()
            .get("traceparent")
            .and_then(|v| v.to_str().ok()),
    );
    let response = match tokio::spawn(next.run(request).instrument(span.clone())).await {
        Ok(response) => response,
        Err(e) => {
            tracing::error!(error = %e, "HTTP handler panicked");
            (StatusCode::INTERNAL_SERVER_ERROR, "handler failed").into_response()
        }
    };
    span.record("status", response.status().as_u16());
    json_errors(response).await
}

/// `404 {"error": "no route for GET /v1/nope"}`: the fallback of every router.
pub async fn no_route(
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> (StatusCode, Json<Value>) {
    (
        StatusCode::NOT_FOUND,
        Json(json!({ "error": format!("no route for {method} {}", uri.path()) })),
    )
}

/// Every 4xx and 5xx answer has a JSON body `{"error": "…"}`: one whose body is not JSON —
/// axum's own rejections (a path segment that is not a number, a malformed JSON body, an
/// unknown route, a wrong method) — gets its text wrapped, or the status's reason when it
/// had none.
async fn json_errors(response: axum::response::Response) -> axum::response::Response {
    use axum::response::IntoResponse;
    let status = response.status();
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let error = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_lowercase()
    } else {
        text
    };
    let mut wrapped = (status, Json(json!({ "error": error }))).into_response();
    for (name, value) in &parts.headers {
        if name != axum::http::header::CONTENT_TYPE && name != axum::http::header::CONTENT_LENGTH {
            wrapped.headers_mut().append(name.clone(), value.clone());
        }
    }
    wrapped
}

/// `401` unless the request carries `http.callback_token` (when one is set).
fn authorized(state: &HttpState, headers: &HeaderMap) -> Result<(), (StatusCode, Json<Value>)> {
    if let Some(token) = &state.token {
        let given = headers.get("authorization").and_then(|v| v.to_str().ok());
        if given != Some(format!("Bearer {token}").as_str()) {
            return Err((
                StatusCode::UNAUTHORIZED,
                Json(json!({ "error": "missing or wrong bearer token" })),
            ));
        }
    }
    Ok(())
}

/// `POST /v1/orders/{order}/payment-attempts` (seed 002's aggregated payment): a cashier about
/// to take the buyer's money asks first. `200 {"lease_until_ms"}`: the order is PENDING and not
/// past its deadline, and its close now waits until the lease lapses (`http.payment_lease`);
/// `409 {"status", "deadline_ms"}`: it cannot be paid (closed, paid, or its window lapsed);
/// `404`: no such order.
async fn payment_attempt(
    State(state): State<HttpState>,
    Path(order_id): Path<String>,
    headers: HeaderMap,
) -> (StatusCode, Json<Value>) {
    if let Err(refused) = authorized(&state, &headers) {
        return refused;
    }
    let (db, effects) = match state.shard(&order_id) {
        Ok(shard) => shard,
        Err(refused) => return refused,
    };
    let attempt = async {
        let now_ms = effects.clock().now_ms(db).await?;
        // One transaction: on a schema profile the lease is written while the shop's order
        // row is held locked (`db::shop::mapped::lease`).
        let mut tx = db.begin().await?;
        let attempt = orders::take_payment_lease(
            &mut tx,
            db.schema(),
            &order_id,
            now_ms,
            now_ms + state.lease_ms,
        )
        .await?;
        tx.commit().await?;
        Ok::<_, crate::db::DbError>(attempt)
    };
    match attempt.await {
        Ok(orders::Attempt::Held { until_ms }) => {
            (StatusCode::OK, Json(json!({ "lease_until_ms": until_ms })))
        }
        Ok(orders::Attempt::Refused {
            status,
            deadline_ms,
        }) => (
            StatusCode::CONFLICT,
            Json(json!({
                "error": format!("order `{order_id}` cannot be paid now"),
                "status": status, "deadline_ms": deadline_ms,
            })),
        ),
        Ok(orders::Attempt::Missing) => (
            StatusCode::NOT_FOUND,
            Json(json!({ "error": format!("order `{order_id}` does not exist") })),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({ "error": e.to_string() })),
        ),
    }
}

async fn paid_callback(
    State(state): State<HttpState>,
    Path(order_id): Path<String>,
    headers: HeaderMap,
) -> (StatusCode, Json<Value>) {
    if let Err(refused) = authorized(&state, &headers) {
        return refused;
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
    let (db, effects) = match state.shard(order_id) {
        Ok(shard) => shard,
        Err(refused) => return Ok(refused),
    };
    let clock = effects.clock();
    match crate::paid::apply(db, clock, &state.resolutions, order_id, "callback").await? {
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
        applied @ Applied::AfterClose { resolution, new } => {
            state.after_paid(effects, order_id, applied).await;
            Ok((
                StatusCode::ACCEPTED,
                Json(
                    json!({ "status": "paid_after_close", "resolution": resolution.as_str(), "new": new }),
                ),
            ))
        }
    }
}
