//! `GET /v1/merchants/{merchant}/shadow`: what a merchant's shadow plugin said beside its live
//! one ([`crate::shadow`]): counts by outcome and by part that differs, agree and differ per
//! minute, and the latest orders where they did not agree, both answers side by side.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{AdminState, ApiError, ApiResult};
use crate::db::shadow;

/// `?since_ms=` (epoch ms; default an hour before now) and `?latest=` (default 20, at most
/// 200).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Window {
    since_ms: Option<i64>,
    latest: Option<u32>,
}

/// How far back the view reaches when `since_ms` is left out, ms.
const DEFAULT_WINDOW_MS: i64 = 60 * 60 * 1000;

/// `GET /v1/merchants/{merchant}/shadow`. 404 for a merchant with no plugin here. `shadow` is
/// the candidate now configured (plugin, digest, sample) or null; the counts cover every
/// comparison recorded since `since_ms`, whichever candidate made them.
pub async fn summary(
    State(s): State<AdminState>,
    Path(merchant): Path<String>,
    Query(window): Query<Window>,
) -> ApiResult<Value> {
    if s.policies.get(&merchant).is_none() && s.policies.held(&merchant).is_none() {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no merchant `{merchant}` here"),
        ));
    }
    let now = s.clock.now_ms(&s.db).await?;
    let since_ms = window.since_ms.unwrap_or(now - DEFAULT_WINDOW_MS);
    let latest = window.latest.unwrap_or(20).clamp(1, 200);
    let summary = shadow::summary(&s.db, &merchant, since_ms, latest)
        .await
        .map_err(ApiError::query)?;
    let candidate = s.policies.shadow(&merchant).map(
        |c| json!({ "plugin": c.plugin.name(), "digest": c.plugin.digest(), "sample": c.sample }),
    );
    let counts = |pairs: &[(String, i64)]| -> Value {
        pairs
            .iter()
            .map(|(k, n)| (k.clone(), json!(n)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    // Both answers as JSON objects, not strings, so a reader sees them side by side.
    let latest: Vec<Value> = summary
        .latest
        .iter()
        .map(|r| {
            let parse = |t: &str| serde_json::from_str::<Value>(t).unwrap_or_else(|_| json!(t));
            json!({
                "order_id": r.order_id, "phase": r.phase, "trigger_kind": r.trigger_kind,
                "decided_at_ms": r.decided_at_ms, "outcome": r.outcome,
                "differences": r.differences.split(',').filter(|d| !d.is_empty()).collect::<Vec<_>>(),
                "live": parse(&r.live), "shadow": parse(&r.shadow),
                "shadow_digest": r.shadow_digest, "latency_us": r.latency_us,
            })
        })
        .collect();
    Ok(axum::Json(json!({
        "merchant": merchant,
        "shadow": candidate,
        "since_ms": since_ms,
        "outcomes": counts(&summary.outcomes),
        "differences": counts(&summary.differences),
        "minutes": summary.minutes,
        "latest": latest,
    })))
}
