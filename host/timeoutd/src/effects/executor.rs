//! The one shape every ledger executor has: the notices, the Redis flash-sale effects and the
//! payment provider each implement [`Executor`] for the [`Section`] of kinds
//! [`crate::kinds::home`] gives it. The runner ([`super::EffectRunner`]) reads only the kinds
//! whose executor is configured, hands each claimed row to its executor, and settles the
//! outcome (DONE, retry with backoff, FAILED with the reason). A new external kind is a
//! `home` entry and an arm in its section's executor; a new section is one file here.

use futures_util::future::BoxFuture;

use crate::db::ledger::PendingEffect;
use crate::kinds::{LedgerKind, Section};

/// Why an effect did not happen this time.
#[derive(Debug, thiserror::Error)]
pub enum EffectError {
    /// May pass: try again later (timeouts, 5xx, connection refused).
    #[error("{0}")]
    Transient(String),
    /// Will not pass by retrying (4xx, bad payload).
    #[error("{0}")]
    Permanent(String),
    /// Transient, and the peer said when to come back (`Retry-After` on a 429 or 503,
    /// [`crate::outbound::retry_after`]): retried as a transient error (an attempt counted),
    /// no sooner than `after`.
    #[error("{reason} (retry after {after:?})")]
    RetryAfter {
        /// `{url}: HTTP 429 …`, for the row's `last_error`.
        reason: String,
        /// The least wait the peer asked for.
        after: std::time::Duration,
    },
    /// Not now, through no fault of the effect: run it again at `until_ms` (epoch ms, the
    /// runner's clock) without counting an attempt. A cap of the merchant's (`[caps]`,
    /// `super::caps`; the payment provider's `payment.max_calls_per_second`) was spent, and
    /// this is the row's booked slot.
    #[error("{reason}; booked for {until_ms}")]
    Deferred {
        /// When to run it (epoch ms).
        until_ms: i64,
        /// Why, for the row's `last_error`.
        reason: String,
    },
}

impl EffectError {
    /// The error of an HTTP answer that was not a 2xx ([`crate::outbound::judge`]); `Ok` for
    /// a 2xx.
    ///
    /// # Errors
    /// A redirect, 408, 429 or 5xx is transient (with the peer's `Retry-After`); any other
    /// answer permanent.
    pub fn of_answer(
        url: &str,
        status: reqwest::StatusCode,
        headers: &reqwest::header::HeaderMap,
    ) -> Result<(), EffectError> {
        match crate::outbound::judge(url, status, headers) {
            crate::outbound::Verdict::Delivered => Ok(()),
            crate::outbound::Verdict::Retry {
                reason,
                after: Some(after),
            } => Err(EffectError::RetryAfter { reason, after }),
            crate::outbound::Verdict::Retry {
                reason,
                after: None,
            } => Err(EffectError::Transient(reason)),
            crate::outbound::Verdict::Refused(reason) => Err(EffectError::Permanent(reason)),
        }
    }

    /// Whether trying again may pass ([`EffectError::Transient`], [`EffectError::RetryAfter`]).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            EffectError::Transient(_) | EffectError::RetryAfter { .. }
        )
    }
}

impl From<crate::db::DbError> for EffectError {
    fn from(e: crate::db::DbError) -> Self {
        EffectError::Transient(e.to_string())
    }
}

/// What a successful execution left behind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Done {
    /// Noted on the ledger row (`already applied (marker …)`, `not sent: order is PAID`).
    pub note: Option<String>,
    /// The execution recorded further ledger rows for the same order (the refund of a
    /// payment found paid at close); the runner runs them right after settling this one.
    pub raised: bool,
}

impl Done {
    /// Done, nothing to note.
    pub fn plain() -> Self {
        Done::default()
    }

    /// Done, with `note` on the row.
    pub fn noted(note: impl Into<String>) -> Self {
        Done {
            note: Some(note.into()),
            raised: false,
        }
    }
}

/// One claimed ledger row, with what the runner read about its order in the same chunk.
#[derive(Debug, Clone, Copy)]
pub struct Job<'a> {
    /// The row: idempotency key, kind, payload (JSON), merchant, order.
    pub row: &'a PendingEffect,
    /// Its kind, parsed.
    pub kind: LedgerKind,
    /// The order's status now (`PENDING`, `PAID`, `CLOSED`); `None` when the order is gone.
    pub order_status: Option<&'a str>,
    /// The order's buyer; empty when the order is gone.
    pub user: &'a str,
    /// When the runner claimed the row (epoch ms, its clock: the database's in the daemon).
    pub now_ms: i64,
}

impl Job<'_> {
    /// The error for a payload this kind's executor cannot read (permanent: retrying reads the
    /// same bytes).
    pub fn unreadable(&self) -> EffectError {
        EffectError::Permanent(format!(
            "unreadable {} payload: {}",
            self.kind.as_str(),
            self.row.payload
        ))
    }
}

/// Carries out ledger rows of one section's kinds, under each row's idempotency key.
pub trait Executor: Send + Sync {
    /// The section whose kinds this executor runs.
    fn section(&self) -> Section;

    /// Carries out `job` once. A transient error reschedules it with backoff; a permanent one
    /// marks it FAILED with the message.
    fn execute<'a>(&'a self, job: Job<'a>) -> BoxFuture<'a, Result<Done, EffectError>>;
}
