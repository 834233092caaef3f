//! Retrying FAILED ledger effects: one by id (`POST /v1/ledger/{id}/retry`), or every one a
//! filter matches, page by page (`POST /v1/ledger/retry`, `timeoutd retry-effects`).
//!
//! A retry moves a FAILED external effect back to PENDING with a fresh attempt budget (a
//! compare-and-set on FAILED, so asking for the same set again retries nothing the first ask
//! retried, unless it has FAILED again since); the effect executor's next round carries it out under its original idempotency key,
//! so the receiver still recognises a repeat. An effect the close transaction applies (stock,
//! coupon, points) is never retried here: the executor cannot redo it, an operator corrects
//! the data by hand.

use serde::{Deserialize, Serialize};

use super::{PAGE_MAX, Pace};
use crate::db::views::{self, FailedEffect};
use crate::db::{Db, DbError, ledger};
use crate::kinds::LedgerKind;

/// Which FAILED effects a bulk retry takes. Every field narrows; none given is every FAILED
/// effect.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Filter {
    /// Only this merchant's effects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merchant: Option<String>,
    /// Only effects of this kind (`notify`, `restore-flash-stock`, `close-payment`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Only effects whose last error contains this text (case-sensitive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_contains: Option<String>,
    /// Only effects that failed at or after this time, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_ms: Option<i64>,
    /// Only effects that failed before this time, epoch ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_ms: Option<i64>,
}

/// What retrying one effect came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum Retried {
    /// PENDING again; the executor runs it next.
    Retrying {
        /// Ledger row id.
        id: i64,
    },
    /// Not retried: a `kind` the close transaction applies (or one this build does not know).
    InTransaction {
        /// Ledger row id.
        id: i64,
        /// Its kind.
        kind: String,
    },
    /// Not retried: it was no longer FAILED (retried meanwhile).
    NotFailed {
        /// Ledger row id.
        id: i64,
    },
}

/// Retries ledger row `id` of kind `kind`: see the module's doc.
///
/// # Errors
/// [`DbError::Sql`] when the statement fails.
pub async fn one(db: &Db, id: i64, kind: &str) -> Result<Retried, DbError> {
    if !LedgerKind::parse(kind).is_some_and(|k| k.is_external()) {
        return Ok(Retried::InTransaction {
            id,
            kind: kind.to_string(),
        });
    }
    let mut tx = db.begin().await?;
    let retrying = ledger::retry_failed(&mut tx, id).await?;
    tx.commit().await?;
    Ok(if retrying {
        Retried::Retrying { id }
    } else {
        Retried::NotFailed { id }
    })
}

/// One page of a bulk retry.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Page {
    /// FAILED effects read in this page (before the reason filter).
    pub scanned: usize,
    /// The effects the filter matched: what a run takes (one applied in the close is then
    /// skipped, as its outcome says).
    pub matched: Vec<FailedEffect>,
    /// What retrying each matched effect came to (empty on a dry run).
    pub retried: Vec<Retried>,
    /// The cursor of the next page (`after_id`), `None` when this page reached the end.
    pub next_after_id: Option<i64>,
}

/// Reads the FAILED effects after `after_id` (at most `pace.limit`), keeps those `filter`
/// matches, and unless `pace.dry_run` retries them ([`one`]) at most `pace.per_second` a
/// second.
///
/// # Errors
/// [`DbError`] when a read or a retry fails (the effects before it are retried; running the
/// same page again retries the rest, an effect already PENDING is `NotFailed`).
pub async fn page(db: &Db, filter: &Filter, after_id: i64, pace: Pace) -> Result<Page, DbError> {
    let limit = pace.limit.clamp(1, PAGE_MAX);
    let effects = views::failed_effects_after(
        db,
        after_id,
        filter.merchant.as_deref(),
        filter.kind.as_deref(),
        filter.since_ms,
        filter.until_ms,
        i64::from(limit),
    )
    .await?;
    let next_after_id = super::next_after(effects.len(), limit, effects.last().map(|e| e.id));
    let scanned = effects.len();
    let matched: Vec<FailedEffect> = effects
        .into_iter()
        .filter(|e| {
            filter.reason_contains.as_ref().is_none_or(|t| {
                e.reason
                    .as_deref()
                    .is_some_and(|reason| reason.contains(t.as_str()))
            })
        })
        .collect();
    let mut retried = Vec::new();
    if !pace.dry_run {
        for (i, effect) in matched.iter().enumerate() {
            pace.wait_turn(i).await;
            retried.push(one(db, effect.id, &effect.kind).await?);
        }
    }
    Ok(Page {
        scanned,
        matched,
        retried,
        next_after_id,
    })
}
