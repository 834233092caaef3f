//! Closing or re-arming a set of PENDING orders, page by page (`POST /v1/orders/close`,
//! `POST /v1/orders/rearm`, `timeoutd close-orders`, `timeoutd rearm-orders`).
//!
//! Both hand each order to the outbox timer as a trigger row; neither closes anything itself.
//! The merchant's plugin still decides, the guard still checks, and the close is still the one
//! compare-and-set, taken in groups like any burst:
//! - **close** ([`Op::Close`]) queues an operator's (`manual`) trigger, due at once, on every
//!   matched order past its deadline, also one whose trigger waits for a later phase; the
//!   single `POST /v1/orders/{id}/close` is the same trigger, decided in the request.
//! - **re-arm** ([`Op::Rearm`]) gives an order with no live trigger (its broker message lost,
//!   its row given up) the row the order service would have written: source `order-service`,
//!   due at the deadline, so an order not yet due is decided on time (held until then like any early
//!   trigger) instead of by the sweep after its grace.
//!
//! Skipped, with the reason: an order with an OPEN dead letter about it (re-drive the letter),
//! one whose trigger a daemon holds now, a paused one (close only: a paused order's trigger is
//! held anyway), one not due (close only), one already queued or armed. Each change is a
//! compare-and-set on the trigger row as the page read it ([`outbox::arm_order`]): a row a
//! daemon took, decided or re-armed since is left alone ([`Skip::Changed`]), so running the
//! same set twice changes nothing the second time; an order closed meanwhile is no longer
//! PENDING and is not read again.

use serde::{Deserialize, Serialize};

use super::{PAGE_MAX, Pace};
use crate::db::outbox::{self, RowSource, SOURCE_MANUAL, Seen};
use crate::db::pauses::{self, Paused};
use crate::db::shop::OpenOrderQuery;
use crate::db::views::{self, OpenOrder};
use crate::db::{Db, DbError};

/// The most order ids one filter names.
pub const IDS_MAX: usize = PAGE_MAX as usize;

/// Which PENDING orders a bulk order operation takes. Every field narrows; none given is every
/// PENDING order (and, for a close, every one past its deadline).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Filter {
    /// Only this merchant's orders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merchant: Option<String>,
    /// Only these orders (at most [`IDS_MAX`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order_ids: Option<Vec<String>>,
    /// Only orders due at or after this time, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_from_ms: Option<i64>,
    /// Only orders due before this time, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_to_ms: Option<i64>,
}

impl Filter {
    /// What is wrong with this filter, naming the field: too many ids, an empty range.
    pub fn problem(&self) -> Option<String> {
        if let Some(ids) = &self.order_ids
            && ids.len() > IDS_MAX
        {
            return Some(format!(
                "order_ids: {} ids; at most {IDS_MAX} a call",
                ids.len()
            ));
        }
        match (self.deadline_from_ms, self.deadline_to_ms) {
            (Some(from), Some(to)) if from >= to => Some(format!(
                "deadline_from_ms ({from}) is not before deadline_to_ms ({to})"
            )),
            _ => None,
        }
    }
}

/// The operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// Queue a `manual` trigger, due at once, on each order past its deadline.
    Close,
    /// Give each order with no live trigger its row back, due at its deadline.
    Rearm,
}

impl Op {
    /// `close`, `rearm`.
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Close => "close",
            Op::Rearm => "rearm",
        }
    }
}

/// Why an order was left as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Skip {
    /// It has an OPEN dead letter about it: re-drive the letter instead.
    DeadLettered,
    /// A daemon holds its trigger now (it is being decided).
    Busy,
    /// Close: it or its merchant is paused (resume first).
    Paused,
    /// Close: its deadline has not passed.
    NotDue,
    /// Close: an operator's trigger is already queued for it (PENDING `manual`, due now or
    /// later after a retry's backoff, whose attempt budget a second close does not reset).
    AlreadyQueued,
    /// Re-arm: it has a live trigger (a PENDING row, or a message in the broker not yet due).
    AlreadyArmed,
    /// Its trigger or status changed between the read and the write (a daemon took it, it was
    /// paid or closed): nothing was written.
    Changed,
}

/// What the operation did with one order (on a dry run: would do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum Done {
    /// Close: a `manual` trigger of `phase` queued, due at `due_ms` (its deadline, already
    /// past, so close lateness is still measured from when the close was due).
    Queued {
        /// Order id.
        order_id: String,
        /// The phase decided (its latest).
        phase: u32,
        /// When due, epoch ms.
        due_ms: i64,
    },
    /// Re-arm: its `phase` row armed as the order service's (`order-service`), due at
    /// `due_ms` (its deadline).
    Rearmed {
        /// Order id.
        order_id: String,
        /// The phase armed (its latest).
        phase: u32,
        /// When due, epoch ms.
        due_ms: i64,
    },
    /// Left as it is.
    Skipped {
        /// Order id.
        order_id: String,
        /// Why.
        why: Skip,
    },
}

impl Done {
    /// Whether the order's trigger was (or on a dry run would be) changed.
    pub fn changed(&self) -> bool {
        !matches!(self, Done::Skipped { .. })
    }
}

/// What `op` does with `order` at `now_ms` given the pauses in force: `Ok((phase, due_ms))`
/// to arm, or why not. One rule for the page and its dry run.
pub fn plan(op: Op, order: &OpenOrder, paused: &Paused, now_ms: i64) -> Result<(u32, i64), Skip> {
    let trigger = order.trigger.as_ref();
    if order.dead_letter.is_some() {
        return Err(Skip::DeadLettered);
    }
    if trigger.is_some_and(|t| t.claim_until_ms.is_some_and(|until| until >= now_ms)) {
        return Err(Skip::Busy);
    }
    let phase = trigger.map_or(0, |t| t.phase.clamp(0, i64::from(u32::MAX)) as u32);
    let pending = |t: &&views::TriggerState| t.status == "PENDING";
    match op {
        Op::Close => {
            if order.deadline_ms > now_ms {
                return Err(Skip::NotDue);
            }
            if paused.holds(&order.merchant, &order.id).is_some() {
                return Err(Skip::Paused);
            }
            // Queued before, whenever due: a manual trigger in backoff keeps its budget.
            if trigger
                .filter(pending)
                .is_some_and(|t| t.source == SOURCE_MANUAL)
            {
                return Err(Skip::AlreadyQueued);
            }
        }
        Op::Rearm => {
            if trigger
                .is_some_and(|t| t.status == "PENDING" || (t.status == "SENT" && t.due_ms > now_ms))
            {
                return Err(Skip::AlreadyArmed);
            }
        }
    }
    Ok((phase, order.deadline_ms))
}

/// One page of a bulk order operation.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Page {
    /// Nothing was changed: `done` says what would have been.
    pub dry_run: bool,
    /// The PENDING orders the filter matched, in id order, each with its latest trigger and
    /// dead letter.
    pub matched: Vec<OpenOrder>,
    /// What the operation did with each matched order, in the same order.
    pub done: Vec<Done>,
    /// The cursor of the next page (`after_id`, an order id), `None` when this page reached
    /// the end.
    pub next_after_id: Option<String>,
}

/// Reads the PENDING orders after `after_id` (at most `pace.limit`) that `filter` matches and,
/// for a close, whose deadline has passed; plans each ([`plan`]); and unless `pace.dry_run`
/// arms the planned ones at most `pace.per_second` a second. `now` gives the time (the
/// database clock): once for the page's read and plan, again for each write.
///
/// # Errors
/// [`DbError`] when a read or a write fails (the orders before it are done; running the same
/// `after_id` again skips them as already queued or armed).
pub async fn page<F, Fut>(
    db: &Db,
    op: Op,
    filter: &Filter,
    after_id: Option<&str>,
    pace: Pace,
    now: F,
) -> Result<Page, DbError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<i64, DbError>>,
{
    let limit = pace.limit.clamp(1, PAGE_MAX);
    let now_ms = now().await?;
    let ids: Option<Vec<&str>> = filter
        .order_ids
        .as_ref()
        .map(|ids| ids.iter().map(String::as_str).collect());
    let deadline_to_ms = match op {
        // Only orders past their deadline: those before it would be skipped one by one.
        Op::Close => Some(
            filter
                .deadline_to_ms
                .map_or(now_ms + 1, |t| t.min(now_ms + 1)),
        ),
        Op::Rearm => filter.deadline_to_ms,
    };
    let matched = views::open_orders_after(
        db,
        &OpenOrderQuery {
            after: after_id,
            merchant: filter.merchant.as_deref(),
            ids: ids.as_deref(),
            deadline_from_ms: filter.deadline_from_ms,
            deadline_to_ms,
            limit: i64::from(limit),
        },
    )
    .await?;
    let paused = match op {
        Op::Close => pauses::in_force(db).await?,
        Op::Rearm => Paused::none(),
    };
    let next_after_id =
        super::next_after(matched.len(), limit, matched.last().map(|o| o.id.clone()));
    let mut done = Vec::with_capacity(matched.len());
    let mut changes = 0;
    for order in &matched {
        let order_id = order.id.clone();
        let (phase, due_ms) = match plan(op, order, &paused, now_ms) {
            Ok(planned) => planned,
            Err(why) => {
                done.push(Done::Skipped { order_id, why });
                continue;
            }
        };
        let armed = if pace.dry_run {
            true
        } else {
            pace.wait_turn(changes).await;
            changes += 1;
            let source = match op {
                Op::Close => SOURCE_MANUAL,
                Op::Rearm => RowSource::OrderService.as_str(),
            };
            let seen = order.trigger.as_ref().map(|t| Seen {
                status: &t.status,
                due_ms: t.due_ms,
                source: &t.source,
            });
            outbox::arm_order(db, &order.id, phase, due_ms, now().await?, source, seen).await?
        };
        done.push(match (armed, op) {
            (false, _) => Done::Skipped {
                order_id,
                why: Skip::Changed,
            },
            (true, Op::Close) => Done::Queued {
                order_id,
                phase,
                due_ms,
            },
            (true, Op::Rearm) => Done::Rearmed {
                order_id,
                phase,
                due_ms,
            },
        });
    }
    Ok(Page {
        dry_run: pace.dry_run,
        matched,
        done,
        next_after_id,
    })
}
