//! `/v1/orders/…`: overdue orders, one order's timeline, manual close, and a set of orders
//! closed or re-armed (`crate::bulk::orders`).

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};
use timeoutd_runtime::model::OrderStatus;

use super::bulk::{self, Asked};
use super::{Actor, AdminState, ApiError, ApiResult};
use crate::bulk::orders::{self as bulk_orders, Filter, Op};
use crate::db::{orders, outbox, pauses, views};

/// `?limit=` (default 100, at most 1000).
#[derive(Debug, Deserialize)]
pub struct Limit {
    limit: Option<u32>,
}

impl Limit {
    pub(super) fn get(&self) -> i64 {
        i64::from(self.limit.unwrap_or(100).clamp(1, 1000))
    }
}

/// `GET /v1/orders/overdue`: open orders past their deadline by more than `admin.overdue_margin`,
/// most overdue first, with the reason of an open dead letter when there is one and `paused`
/// (`"merchant"`, `"order"` or null) when an operator holds it.
pub async fn overdue(State(s): State<AdminState>, Query(limit): Query<Limit>) -> ApiResult<Value> {
    let now = s.clock.now_ms(&s.db).await?;
    let orders = views::overdue_orders(&s.db, now, s.overdue_margin_ms, limit.get())
        .await
        .map_err(ApiError::query)?;
    let paused = pauses::in_force(&s.db).await.map_err(ApiError::query)?;
    let mut orders = serde_json::to_value(orders).expect("overdue orders serialise");
    for o in orders.as_array_mut().into_iter().flatten() {
        let held = match (o["merchant"].as_str(), o["id"].as_str()) {
            (Some(merchant), Some(id)) => paused.holds(merchant, id),
            _ => None,
        };
        o["paused"] = serde_json::to_value(held).expect("a scope serialises");
    }
    Ok(Json(json!({ "now_ms": now, "orders": orders })))
}

/// `GET /v1/orders/{id}`: the order, its triggers, decisions (with plugin digests), effects,
/// dead letters and any paid-after-close record.
pub async fn timeline(State(s): State<AdminState>, Path(id): Path<String>) -> ApiResult<Value> {
    let order = {
        let mut conn =
            s.db.pool()
                .acquire()
                .await
                .map_err(|e| ApiError::query(e.into()))?;
        orders::load(&mut conn, s.db.schema(), &id).await?
    }
    .ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            format!("order `{id}` does not exist"),
        )
    })?;
    let t = views::timeline(&s.db, &id).await.map_err(ApiError::query)?;
    Ok(Json(json!({
        "order": order, "triggers": t.triggers, "decisions": t.decisions, "effects": t.effects,
        "dead_letters": t.dead_letters, "paid_after_close": t.paid_after_close,
    })))
}

/// `POST /v1/orders/{id}/close`: a `manual` trigger through the dispatcher — the merchant's
/// plugin decides, the guard checks, the compare-and-set closes. 409 when the order is not
/// PENDING, is paused (or its merchant is), or its deadline has not passed.
pub async fn close(State(s): State<AdminState>, Path(id): Path<String>) -> ApiResult<Value> {
    let order = {
        let mut conn =
            s.db.pool()
                .acquire()
                .await
                .map_err(|e| ApiError::query(e.into()))?;
        orders::load(&mut conn, s.db.schema(), &id)
            .await
            .map_err(|e| match e {
                crate::db::DbError::BadRow { detail, .. } => {
                    ApiError(StatusCode::UNPROCESSABLE_ENTITY, detail)
                }
                other => other.into(),
            })?
    }
    .ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            format!("order `{id}` does not exist"),
        )
    })?;
    if order.status != OrderStatus::Pending {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("order `{id}` is {}", order.status.as_str()),
        ));
    }
    if let Some(scope) = pauses::in_force(&s.db)
        .await
        .map_err(ApiError::query)?
        .holds(&order.merchant, &order.id)
    {
        let what = match scope {
            pauses::Scope::Merchant => format!("its merchant `{}` is paused", order.merchant),
            pauses::Scope::Order => "it is paused".to_string(),
        };
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("order `{id}` is not closed: {what}; resume first"),
        ));
    }
    let now = s.clock.now_ms(&s.db).await?;
    if now < order.deadline_ms {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!(
                "order `{id}`'s deadline is {} ms away; it cannot be closed yet",
                order.deadline_ms - now
            ),
        ));
    }
    // A trigger like every other: the order's latest phase row, re-armed as `manual` (it keeps
    // the state its phase was scheduled with) and claimed in one step, then handled as the
    // outbox timer handles a row, its completion fenced by the claim.
    let phase = outbox::latest_phase(&s.db, &id).await?;
    let Some(row) = outbox::claim_for_operator(&s.db, &id, phase, now, MANUAL_LEASE_MS).await?
    else {
        return Err(ApiError(
            StatusCode::CONFLICT,
            format!("a trigger for order `{id}` is being handled now; look again in a moment"),
        ));
    };
    let outcome = match crate::sources::outbox::trigger_of(&row) {
        Ok(trigger) => s.dispatcher.handle(&trigger).await,
        Err(bad) => s.dispatcher.reject(&bad.trigger, &bad.reason).await,
    };
    Ok(Json(
        serde_json::to_value(outcome).expect("outcome serialises"),
    ))
}

/// How long a manual close holds its order's row (ms): the plugin's deadline and one
/// transaction fit well inside; a daemon that dies meanwhile leaves the row to the sweep.
const MANUAL_LEASE_MS: i64 = 30_000;

/// `POST /v1/orders/close`: one page of a bulk close ([`crate::bulk::orders::page`] with
/// [`Op::Close`]): each matched PENDING order past its deadline gets an operator's trigger due
/// at once, which the outbox timer decides through the merchant's plugin.
/// `{dry_run, matched, done, next_after_id}`; call again with `after_id = next_after_id` until
/// it is null. Audited beside the call (method `BULK`, the filter and the counts).
pub async fn close_many(
    State(s): State<AdminState>,
    Extension(actor): Extension<Actor>,
    body: Bytes,
) -> ApiResult<Value> {
    many(s, actor, body, Op::Close).await
}

/// `POST /v1/orders/rearm`: one page of a bulk re-arm ([`crate::bulk::orders::page`] with
/// [`Op::Rearm`]): each matched PENDING order with no live trigger gets its row back, due at
/// its deadline. Paged and audited as `POST /v1/orders/close`.
pub async fn rearm_many(
    State(s): State<AdminState>,
    Extension(actor): Extension<Actor>,
    body: Bytes,
) -> ApiResult<Value> {
    many(s, actor, body, Op::Rearm).await
}

async fn many(s: AdminState, actor: Actor, body: Bytes, op: Op) -> ApiResult<Value> {
    let (asked, pace) = Asked::<Filter, Option<String>>::read(
        &body,
        "merchant, order_ids, deadline_from_ms, deadline_to_ms",
    )?;
    if let Some(problem) = asked.filter.problem() {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            format!("filter: {problem}"),
        ));
    }
    let page = bulk_orders::page(
        &s.db,
        op,
        &asked.filter,
        asked.after_id.as_deref(),
        pace,
        || s.clock.now_ms(&s.db),
    )
    .await
    .map_err(ApiError::query)?;
    let changed = page.done.iter().filter(|d| d.changed()).count();
    if changed > 0 && !pace.dry_run {
        s.waker.notify_one();
    }
    let what = format!(
        "{} orders filter={} after_id={} dry_run={} matched={} changed={changed}",
        op.as_str(),
        serde_json::to_string(&asked.filter).expect("a filter serialises"),
        asked.after_id.as_deref().unwrap_or(""),
        pace.dry_run,
        page.matched.len(),
    );
    bulk::audit(&s, &actor, &what).await?;
    Ok(Json(serde_json::to_value(page).expect("a page serialises")))
}
