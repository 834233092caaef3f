//! What the bulk routes share (`POST /v1/dead-letters/redrive`, `POST /v1/ledger/retry`,
//! `POST /v1/orders/close`, `POST /v1/orders/rearm`): the body `{filter, after_id, limit,
//! per_second, dry_run}` read into a [`crate::bulk::Pace`] with each bad field named, and the
//! audit row of what a page did.

use axum::http::StatusCode;
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::{Actor, AdminState, ApiError};
use crate::bulk::{PAGE_MAX, Pace};

/// A bulk route's body; every field may be left out. `C` is the cursor's type: a row id
/// (`i64`, default 0) or an order id (`Option<String>`, default none).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Asked<F, C = i64> {
    /// Which rows (every one when absent).
    #[serde(default)]
    pub filter: F,
    /// The cursor: rows with a greater id (default the start).
    #[serde(default)]
    pub after_id: C,
    /// Rows read (default 100, 1..=1000).
    limit: Option<u32>,
    /// Changes per second at most (default 50, at least 1).
    per_second: Option<u32>,
    /// Match only, change nothing (default false).
    #[serde(default)]
    dry_run: bool,
}

impl<F: DeserializeOwned + Default, C: DeserializeOwned + Default> Asked<F, C> {
    /// Reads `body` (empty is every default); `filter_fields` names the filter's fields for the
    /// 400 answer.
    pub fn read(body: &[u8], filter_fields: &str) -> Result<(Asked<F, C>, Pace), ApiError> {
        let asked: Asked<F, C> = if body.iter().all(u8::is_ascii_whitespace) {
            Asked {
                filter: F::default(),
                after_id: C::default(),
                limit: None,
                per_second: None,
                dry_run: false,
            }
        } else {
            serde_json::from_slice(body).map_err(|e| {
                ApiError(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "body: expected {{\"filter\": {{{filter_fields}}}, \"after_id\", \
                         \"limit\", \"per_second\", \"dry_run\"}}: {e}"
                    ),
                )
            })?
        };
        let limit = asked.limit.unwrap_or(100);
        if !(1..=PAGE_MAX).contains(&limit) {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                format!("limit: {limit} is not within 1..={PAGE_MAX}"),
            ));
        }
        let per_second = asked.per_second.unwrap_or(50);
        if per_second == 0 {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                "per_second: must be at least 1".into(),
            ));
        }
        let pace = Pace {
            limit,
            per_second,
            dry_run: asked.dry_run,
        };
        Ok((asked, pace))
    }
}

/// Audits what one page did, beside the call's own row: method `BULK`, `what` (the
/// operation, its filter, cursor and counts).
pub async fn audit(s: &AdminState, actor: &Actor, what: &str) -> Result<(), ApiError> {
    let now = s.clock.now_ms(&s.db).await?;
    crate::db::audit::record(&s.db, now, &actor.0, "BULK", what, 200)
        .await
        .map_err(ApiError::query)
}
