//! The outbox timer: claims due `order_timeout_msg` rows in batches and dispatches them.
//!
//! It does not poll on a fixed period. After each round it asks for the next due time and
//! sleeps until then, waking early when this process writes a row (the [`Waker`]) and at
//! least every `outbox.idle_recheck` (rows written by other programs, lapsed leases). Rows due
//! within `outbox.prefetch` are claimed and loaded ahead and decided when due ([`prefetch`]).

use std::sync::Arc;
use std::time::Duration;

use timeoutd_runtime::model::TriggerKind;
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::prefetch::{self, Prefetch};
use crate::config::OutboxConfig;
use crate::context::Context;
use crate::db::outbox::{self, DueRow, RowSource};
use crate::dispatch::{Dispatcher, Outcome, Trigger};

/// Wakes the outbox timer when this process has written a row that may be due soon.
pub type Waker = Arc<Notify>;

/// The trigger a claimed row stands for: its `source` says who fired it ([`Trigger::of_row`]:
/// `Err` for a row that cannot be a trigger, with the reason).
pub fn trigger_of(row: &DueRow) -> Result<Trigger, Box<crate::dispatch::BadRow>> {
    let kind = match RowSource::of(&row.source) {
        RowSource::Sweep => TriggerKind::Sweep,
        RowSource::Manual => TriggerKind::Manual,
        RowSource::OrderService | RowSource::Wait | RowSource::Poll => TriggerKind::Outbox,
    };
    Trigger::of_row(row, kind)
}

/// Runs the timer over `ctx`'s dispatcher until `ctx.shutdown` turns true; a batch in flight is finished first. With a
/// broker (`sent_grace` = `rocketmq.fallback_after`), rows relayed to it (SENT) are taken back
/// once they are that overdue.
pub async fn run(ctx: Context, config: OutboxConfig, sent_grace: Option<Duration>) {
    let Context {
        dispatcher,
        waker,
        mut shutdown,
        ..
    } = ctx;
    let db = dispatcher.db().clone();
    let lease_ms = config.lease.as_millis() as i64;
    let group = config.group_commit.max(1) as usize;
    let permits = Arc::new(Semaphore::new(config.concurrency as usize));
    let mut in_flight = JoinSet::new();
    // The prefetch (`outbox.prefetch`) waits on the host's timer, so not under a test's manual
    // clock.
    let prefetch_ms = if dispatcher.clock().advances_by_itself() {
        config.prefetch.as_millis() as i64
    } else {
        0
    };
    let (prefetch, released) = prefetch::channel(config.prefetch_max as usize);
    let releaser =
        tokio::spawn(released.run(dispatcher.clone(), permits.clone(), group, shutdown.clone()));
    loop {
        while in_flight.try_join_next().is_some() {}
        if crate::shutdown::is_stopping(&shutdown) {
            break;
        }
        let now_ms = match dispatcher.clock().now_ms(&db).await {
            Ok(now) => now,
            Err(e) => {
                tracing::warn!(error = %e, "outbox timer cannot read the clock");
                if crate::shutdown::sleep_or_shutdown(config.idle_recheck, &mut shutdown).await {
                    break;
                }
                continue;
            }
        };
        let read_at = Instant::now();
        let sent_grace_ms = sent_grace.map(|g| g.as_millis() as i64);
        let sent_before = sent_grace_ms.map(|g| now_ms - g);
        match outbox::claim_due_with_sent(&db, now_ms, sent_before, config.batch, lease_ms).await {
            Ok(rows) if !rows.is_empty() => {
                // Groups run while the next rows are claimed: the claim never waits for the
                // slowest group, only for a free permit.
                dispatch_groups(
                    &dispatcher,
                    rows,
                    config.lease,
                    group,
                    &permits,
                    &mut in_flight,
                )
                .await;
                continue;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "outbox claim failed"),
        }
        // The early look: rows not yet due that no one has looked at, for plugins that decide
        // before the deadline (API 0.2.0). Off unless such a plugin is configured.
        if dispatcher.asks_before_deadline() {
            match outbox::claim_unseen(&db, now_ms, config.batch, lease_ms).await {
                Ok(rows) if !rows.is_empty() => {
                    dispatch_groups(
                        &dispatcher,
                        rows,
                        config.lease,
                        group,
                        &permits,
                        &mut in_flight,
                    )
                    .await;
                    continue;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "outbox early look failed"),
            }
        }
        // The prefetch: rows due soon, claimed and loaded now, decided when due.
        let room = prefetch.room().min(config.batch as usize) as u32;
        let ahead_ms = if room > 0 { prefetch_ms } else { 0 };
        if ahead_ms > 0 {
            match outbox::claim_soon_due(&db, now_ms, now_ms + ahead_ms, room, lease_ms).await {
                Ok(rows) if !rows.is_empty() => {
                    prefetch_rows(
                        &dispatcher,
                        rows,
                        (read_at, now_ms),
                        config.lease,
                        &prefetch,
                        &mut in_flight,
                    )
                    .await;
                    continue;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "outbox prefetch claim failed"),
            }
        }
        let sleep = match outbox::next_due_ms_with_sent(&db, now_ms, sent_grace_ms).await {
            Ok(Some(due)) => Duration::from_millis((due - ahead_ms - now_ms).max(0) as u64),
            Ok(None) => config.idle_recheck,
            Err(e) => {
                tracing::warn!(error = %e, "outbox next-due query failed");
                config.idle_recheck
            }
        }
        .min(config.idle_recheck);
        if sleep.is_zero() {
            // Due rows that are all held: by our own groups in flight, or by another daemon.
            tokio::select! {
                _ = in_flight.join_next(), if !in_flight.is_empty() => {}
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = waker.notified() => {}
            _ = prefetch.room_freed(), if prefetch_ms > 0 && room == 0 => {}
            _ = crate::shutdown::stopping(&mut shutdown) => {}
        }
    }
    // A batch in flight is finished first; the releaser finishes its groups and gives back the
    // rows it still held, then their claims' renewers end.
    drop(prefetch);
    if let Err(e) = releaser.await {
        tracing::warn!(error = %e, "the prefetch releaser failed");
    }
    while in_flight.join_next().await.is_some() {}
    tracing::info!("outbox timer stopped");
}

/// Splits claimed rows into groups of at most `group` and starts each on its own task once a
/// permit is free; a row that cannot be a trigger is dead-lettered on its own. One renewer
/// keeps the claim's lease alive from the claim until its last group is done, so groups still
/// waiting for a permit keep their rows too.
async fn dispatch_groups(
    dispatcher: &Arc<Dispatcher>,
    rows: Vec<DueRow>,
    lease: Duration,
    group: usize,
    permits: &Arc<Semaphore>,
    in_flight: &mut JoinSet<()>,
) {
    let alive = keep_alive(dispatcher, &rows, lease, in_flight);
    for chunk in rows.chunks(group) {
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .expect("semaphore never closed");
        let dispatcher = dispatcher.clone();
        let chunk = chunk.to_vec();
        let alive = alive.clone();
        in_flight.spawn(async move {
            let _alive = alive;
            let mut triggers = Vec::with_capacity(chunk.len());
            for row in &chunk {
                match trigger_of(row) {
                    Ok(trigger) => triggers.push(trigger),
                    Err(bad) => {
                        let outcome = dispatcher.reject(&bad.trigger, &bad.reason).await;
                        tracing::warn!(?outcome, "outbox row dead-lettered");
                    }
                }
            }
            for outcome in dispatcher.handle_group(&triggers).await {
                if let Outcome::DeadLettered { reason } = &outcome {
                    tracing::warn!(reason, "outbox row dead-lettered");
                }
            }
            drop(permit);
        });
    }
}

/// Starts the renewer of the claim `rows` were taken under ([`prefetch::keep_alive`]) on
/// `in_flight`.
fn keep_alive(
    dispatcher: &Arc<Dispatcher>,
    rows: &[DueRow],
    lease: Duration,
    in_flight: &mut JoinSet<()>,
) -> mpsc::Sender<()> {
    let tokens = rows.first().and_then(|row| row.claim_token.clone());
    let (alive, renewer) = prefetch::keep_alive(dispatcher, tokens.into_iter().collect(), lease);
    in_flight.spawn(renewer);
    alive
}

/// Hands prefetched `rows` (claimed when the database clock read `now_ms`, just before the
/// host instant `read_at`) to the prefetch with their orders loaded in one go; a row that
/// cannot be a trigger is dead-lettered now.
async fn prefetch_rows(
    dispatcher: &Arc<Dispatcher>,
    rows: Vec<DueRow>,
    clock_read: (Instant, i64),
    lease: Duration,
    prefetch: &Prefetch,
    in_flight: &mut JoinSet<()>,
) {
    let alive = keep_alive(dispatcher, &rows, lease, in_flight);
    let mut triggers = Vec::with_capacity(rows.len());
    for row in &rows {
        match trigger_of(row) {
            Ok(trigger) => triggers.push(trigger),
            Err(bad) => {
                let outcome = dispatcher.reject(&bad.trigger, &bad.reason).await;
                tracing::warn!(?outcome, "outbox row dead-lettered");
            }
        }
    }
    prefetch
        .load_and_hold(dispatcher, triggers, clock_read, &alive)
        .await;
}
