//! Re-driving dead letters: one by id (`POST /v1/dead-letters/{id}/redrive`), or every OPEN one
//! a filter matches, page by page (`POST /v1/dead-letters/redrive`, `timeoutd redrive`).
//!
//! A re-drive marks the letter REDRIVEN (a compare-and-set on OPEN, so a letter is re-driven
//! once however often the same set is asked for; an order dead-lettered again gets a new
//! letter) and re-arms its order's latest outbox row as a
//! `manual` trigger, due now, with a fresh attempt budget; the outbox timer takes it from there,
//! through the merchant's plugin and the guard like any trigger. An order not yet due is left
//! to its own row at its deadline, a letter that names no order (a poison message's) is
//! skipped and stays OPEN. A bulk run paces its re-arms (`per_second`) so a thousand letters do
//! not land on the dispatcher at once, and reads OPEN letters in id order after a cursor, so a
//! run stopped half-way resumes where it left off.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::{PAGE_MAX, Pace};
use crate::db::outbox::{self, Orphan, SOURCE_MANUAL};
use crate::db::views::{self, DeadLetterRow};
use crate::db::{Db, DbError, journal, orders};

/// Which OPEN dead letters a bulk re-drive takes. Every field narrows; none given is every
/// OPEN letter.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Filter {
    /// Only letters whose order belongs to this merchant (a letter naming no order never
    /// matches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merchant: Option<String>,
    /// Only letters of this source (`outbox`, `rocketmq`, `quarantined-row`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Only letters whose reason contains this text (case-sensitive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_contains: Option<String>,
    /// Only letters dead-lettered at or after this time, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
    /// Only letters dead-lettered before this time, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<i64>,
}

/// What re-driving one letter came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum Redriven {
    /// Marked REDRIVEN; its order's row re-armed, due at `due_ms` (epoch ms), `phase` its
    /// latest phase.
    Rearmed {
        /// Letter id.
        id: i64,
        /// Its order.
        order_id: String,
        /// Phase re-armed.
        phase: u32,
        /// When due, epoch ms.
        due_ms: i64,
    },
    /// Marked REDRIVEN; its order is not due until `due_ms`, so its own row closes it then.
    LeftToDeadline {
        /// Letter id.
        id: i64,
        /// Its order.
        order_id: String,
        /// The order's deadline, epoch ms.
        due_ms: i64,
    },
    /// Not re-driven: it names no order. It stays OPEN.
    NoOrder {
        /// Letter id.
        id: i64,
    },
    /// Not re-driven: it was no longer OPEN (re-driven or dismissed meanwhile).
    NotOpen {
        /// Letter id.
        id: i64,
    },
}

impl Redriven {
    /// Whether the letter was marked REDRIVEN (re-armed, or left to its order's deadline).
    pub fn changed(&self) -> bool {
        match self {
            Redriven::Rearmed { .. } | Redriven::LeftToDeadline { .. } => true,
            Redriven::NoOrder { .. } | Redriven::NotOpen { .. } => false,
        }
    }
}

/// Re-drives OPEN letter `letter` at `now_ms` (epoch ms): see the module's doc.
///
/// # Errors
/// [`DbError`] when a statement fails; a letter marked REDRIVEN whose re-arm then failed is
/// left to the sweep, which re-arms an overdue order with no live row by itself.
pub async fn one(db: &Db, letter: &DeadLetterRow, now_ms: i64) -> Result<Redriven, DbError> {
    let id = letter.id;
    let Some(order_id) = letter.order_id.clone() else {
        return Ok(Redriven::NoOrder { id });
    };
    let mut tx = db.begin().await?;
    let marked = journal::mark_redriven(&mut tx, id).await?;
    tx.commit().await?;
    if !marked {
        return Ok(Redriven::NotOpen { id });
    }
    // An order not yet due is not re-armed: a re-driven trigger is an operator's (`manual`),
    // which is not held for the deadline, and a letter about a message (a poison body) can
    // name such an order. Its own row, or the sweep, closes it at its deadline.
    let deadline = {
        let mut conn = db.pool().acquire().await?;
        orders::load(&mut conn, db.schema(), &order_id)
            .await?
            .map(|o| o.deadline_ms)
    };
    if let Some(due_ms) = deadline.filter(|d| *d > now_ms) {
        return Ok(Redriven::LeftToDeadline {
            id,
            order_id,
            due_ms,
        });
    }
    let orphan = Orphan {
        order_id: order_id.clone(),
        phase: outbox::latest_phase(db, &order_id).await?,
        deadline_ms: now_ms,
    };
    outbox::rearm_as(db, std::slice::from_ref(&orphan), now_ms, SOURCE_MANUAL).await?;
    Ok(Redriven::Rearmed {
        id,
        order_id,
        phase: orphan.phase,
        due_ms: now_ms,
    })
}

/// One page of a bulk re-drive.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Page {
    /// OPEN letters read in this page (before the merchant and reason filters).
    pub scanned: usize,
    /// The letters the filter matched, by id: what a run takes (a letter naming no order is
    /// then skipped, as its outcome says).
    pub matched: Vec<Matched>,
    /// What re-driving each matched letter came to (empty on a dry run).
    pub redriven: Vec<Redriven>,
    /// The cursor of the next page (`after_id`), `None` when this page reached the end.
    pub next_after_id: Option<i64>,
}

/// A letter a filter matched.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Matched {
    /// Letter id.
    pub id: i64,
    /// Its order, if it names one.
    pub order_id: Option<String>,
    /// Its order's merchant, when the order exists.
    pub merchant: Option<String>,
    /// Its source.
    pub source: String,
    /// Why it was dead-lettered.
    pub reason: String,
}

/// Reads the OPEN letters after `after_id` (at most `pace.limit`), keeps those `filter`
/// matches, and unless `pace.dry_run` re-drives them ([`one`]) at most `pace.per_second` a
/// second. `now` gives the time of each re-drive (the database clock).
///
/// # Errors
/// [`DbError`] when a read fails, or a re-drive's statement fails (the letters before it are
/// re-driven and the page's cursor is lost: run the same `after_id` again, a letter already
/// REDRIVEN is no longer OPEN and is not read again).
pub async fn page<F, Fut>(
    db: &Db,
    filter: &Filter,
    after_id: i64,
    pace: Pace,
    now: F,
) -> Result<Page, DbError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<i64, DbError>>,
{
    let limit = pace.limit.clamp(1, PAGE_MAX);
    let letters = views::open_dead_letters_after(
        db,
        after_id,
        filter.source.as_deref(),
        filter.since_ms,
        filter.until_ms,
        i64::from(limit),
    )
    .await?;
    let ids: Vec<&str> = letters
        .iter()
        .filter_map(|l| l.order_id.as_deref())
        .collect();
    let merchants: HashMap<String, String> = if ids.is_empty() {
        HashMap::new()
    } else {
        let mut conn = db.pool().acquire().await?;
        orders::load_many(&mut conn, db.schema(), &ids)
            .await?
            .into_iter()
            .map(|(id, order)| (id, order.merchant))
            .collect()
    };
    let mut out = Page {
        scanned: letters.len(),
        next_after_id: super::next_after(letters.len(), limit, letters.last().map(|l| l.id)),
        ..Page::default()
    };
    let chosen: Vec<&DeadLetterRow> = letters
        .iter()
        .filter(|l| {
            let merchant = l.order_id.as_ref().and_then(|o| merchants.get(o));
            filter.merchant.as_ref().is_none_or(|m| merchant == Some(m))
                && filter
                    .reason_contains
                    .as_ref()
                    .is_none_or(|t| l.reason.contains(t.as_str()))
        })
        .collect();
    out.matched = chosen
        .iter()
        .map(|l| Matched {
            id: l.id,
            order_id: l.order_id.clone(),
            merchant: l.order_id.as_ref().and_then(|o| merchants.get(o)).cloned(),
            source: l.source.clone(),
            reason: l.reason.clone(),
        })
        .collect();
    if pace.dry_run {
        return Ok(out);
    }
    for (i, letter) in chosen.into_iter().enumerate() {
        pace.wait_turn(i).await;
        out.redriven.push(one(db, letter, now().await?).await?);
    }
    Ok(out)
}
