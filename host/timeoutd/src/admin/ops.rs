//! Probes, metrics, plugins and the sweep's run-time tuning.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde_json::{Value, json};

use super::{AdminState, ApiError, ApiResult};
use crate::sources::sweep::SweepTuning;

/// `GET /readyz`: 200 when the database (and Redis, when configured) answer and plugins are
/// loaded, else 503 naming what is not ready. The broker's state is reported (`ok`, `failing`,
/// `not configured`) but does not make the daemon unready: closes never depend on it.
pub async fn ready(State(s): State<AdminState>) -> impl IntoResponse {
    let database =
        s.db.now_ms()
            .await
            .map(|_| "ok".to_string())
            .unwrap_or_else(|e| e.to_string());
    let redis = match s.effects.redis_ready().await {
        None => "not configured".to_string(),
        Some(Ok(())) => "ok".to_string(),
        Some(Err(e)) => e,
    };
    let broker = match s.effects.broker_ready() {
        None => "not configured",
        Some(true) => "ok",
        Some(false) => "failing",
    };
    let plugins = s.policies.all().len();
    let ready = database == "ok" && plugins > 0 && (redis == "ok" || redis == "not configured");
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(
            json!({ "ready": ready, "database": database, "redis": redis, "broker": broker, "plugins": plugins }),
        ),
    )
}

/// `GET /metrics`: Prometheus text format (backlog gauges as of the last sample).
pub async fn metrics() -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4")],
        crate::events::metrics_handle().render(),
    )
}

/// `GET /v1/backlog`: the latest backlog sample (overdue orders by merchant, open dead letters,
/// pending ledger effects and outbox rows, their ages).
pub async fn backlog(State(s): State<AdminState>) -> ApiResult<crate::gauges::Sample> {
    Ok(Json(s.sample.borrow().clone()))
}

/// `GET /v1/plugins`: per merchant, the plugin's name, API version, SHA-256 and circuit state,
/// and its shadow (plugin, SHA-256, sample) or null. A merchant whose plugin did not load at
/// start is listed with `circuit` `"held"` and `held` its reason (version and digest null).
pub async fn plugins(State(s): State<AdminState>) -> ApiResult<Value> {
    let now = s.clock.now_ms(&s.db).await?;
    let mut plugins: Vec<Value> = s
        .policies
        .all()
        .iter()
        .map(|p| {
            json!({
                "merchant": p.merchant, "plugin": p.plugin.name(),
                "api_version": p.plugin.api_version(), "digest": p.plugin.digest(),
                "circuit": p.breaker.state(now), "tripped_until_ms": p.breaker.open_until(now),
                "shadow": s.policies.shadow(&p.merchant).map(|c| json!({
                    "plugin": c.plugin.name(), "digest": c.plugin.digest(), "sample": c.sample,
                })),
            })
        })
        .collect();
    // A merchant whose plugin did not load at start: held, not deciding, until a good file.
    for (merchant, plugin, reason) in s.policies.held_merchants() {
        plugins.push(json!({
            "merchant": merchant, "plugin": plugin, "api_version": null, "digest": null,
            "circuit": "held", "held": reason, "tripped_until_ms": null,
            "shadow": s.policies.shadow(&merchant).map(|c| json!({
                "plugin": c.plugin.name(), "digest": c.plugin.digest(), "sample": c.sample,
            })),
        }));
    }
    plugins.sort_by(|a, b| a["merchant"].as_str().cmp(&b["merchant"].as_str()));
    Ok(Json(json!({ "plugins": plugins })))
}

/// `POST /v1/plugins/reload`: loads every file plugin anew; a version that does not load is
/// refused (reported) and the old one keeps serving.
pub async fn reload_plugins(State(s): State<AdminState>) -> ApiResult<Value> {
    let policies = s.policies.clone();
    let report = tokio::task::spawn_blocking(move || policies.reload(true))
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(Json(json!({ "plugins": report })))
}

/// `GET /v1/sweep`: the sweep's current tuning.
pub async fn sweep_get(State(s): State<AdminState>) -> ApiResult<SweepTuning> {
    Ok(Json(*s.sweep.borrow()))
}

/// `PUT /v1/sweep` `{"interval_ms": …, "batch": …}`: retunes the running sweep (at least
/// 100 ms, batch 1 to 100 000); takes effect at once, lasts until restart.
pub async fn sweep_put(
    State(s): State<AdminState>,
    Json(t): Json<SweepTuning>,
) -> ApiResult<SweepTuning> {
    if !(100..=86_400_000).contains(&t.interval_ms) || !(1..=100_000).contains(&t.batch) {
        return Err(ApiError(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "interval_ms must be 100..=86400000 and batch 1..=100000 (got {} and {})",
                t.interval_ms, t.batch
            ),
        ));
    }
    s.sweep.send_replace(t);
    tracing::info!(
        interval_ms = t.interval_ms,
        batch = t.batch,
        "sweep retuned by an operator"
    );
    Ok(Json(t))
}
