//! Operations on a filtered set, a page at a time, for operators (the admin API's bulk routes
//! and the CLI): dead letters re-driven ([`dead_letters`]), FAILED ledger effects retried
//! ([`effects`]), PENDING orders closed or re-armed ([`orders`]). What they share lives here: a page of at most [`PAGE_MAX`] rows read in id
//! order after a cursor (a run stopped half-way resumes after the last id it saw), a dry run
//! that only lists, and a pace (`per_second`) so a thousand rows do not land on the dispatcher
//! or the effect executor at once. Each operation moves a row only from the state it filters
//! on (a compare-and-set), so running the same set twice changes nothing the second time, save
//! rows that came back to that state meanwhile (an effect retried and FAILED again, a new
//! dead letter of a re-driven order).

pub mod dead_letters;
pub mod effects;
pub mod orders;

use std::time::Duration;

/// The most rows one page reads.
pub const PAGE_MAX: u32 = 1_000;

/// How a bulk page runs.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Rows read at most (1..=[`PAGE_MAX`]).
    pub limit: u32,
    /// Changes per second at most (at least 1).
    pub per_second: u32,
    /// Match only: nothing is changed.
    pub dry_run: bool,
}

impl Pace {
    /// Waits before the `i`-th change of a page (0-based): nothing before the first, then
    /// `1 s / per_second` before each next one.
    pub async fn wait_turn(&self, i: usize) {
        if i > 0 {
            tokio::time::sleep(Duration::from_secs(1) / self.per_second.max(1)).await;
        }
    }
}

/// The cursor after a page that read `read` rows of at most `limit`, the last with id
/// `last_id`: `None` when the page was not full (the end was reached).
pub(crate) fn next_after<T>(read: usize, limit: u32, last_id: Option<T>) -> Option<T> {
    (read as u64 == u64::from(limit))
        .then_some(last_id)
        .flatten()
}
