//! The prefetch: outbox rows due within `outbox.prefetch` are claimed and their orders loaded
//! ahead of time, held in memory, and handed to the group dispatch the moment they fall due.
//!
//! Under a flash sale, thousands of rows share one due time and lateness is drain time. Without
//! the prefetch the drain starts with claiming the rows and loading their orders; with it, that
//! work is done before the deadline and the drain is only the decisions and the closes. This is
//! the "load soon-due rows into memory shortly before their deadline" lever of the schedulers
//! in `../shared/PERFORMANCE.md` (db-scheduler's and Quartz's look-ahead fetch).
//!
//! - The rows are claimed under a lease like any other ([`outbox::claim_soon_due`]), renewed
//!   while they wait; a daemon that crashes with rows held loses only their promptness: the
//!   lease lapses and any daemon takes them.
//! - The decision is made at the due time, with the time then: the plugin is never asked early
//!   because of the prefetch. The wait is the host's monotonic timer, started after the database
//!   clock was read and 1 ms past the due time (the clock counts whole ms), so a row is released
//!   at or after its due time by that clock; were it early anyway, the dispatcher holds it until
//!   the deadline as any early trigger.
//! - An order paid or closed while its row waited is still caught: the close's compare-and-set
//!   reads the status under the row lock (F12), so it is left out.
//! - A group is formed when a permit is free, from every row due by then (up to
//!   `outbox.group_commit`): at a burst, groups are full; on a quiet day a row goes at once.
//! - At most `outbox.prefetch_max` rows are held; a stopping daemon finishes the groups it
//!   started and gives back the claims of the rows still held ([`outbox::release_held`]).
//!
//! The broker's consumer holds its early messages the same way (`rocketmq.max_held`,
//! [`crate::rocketmq::consumer`]): a timer message due back `rocketmq.timer_lead` before its
//! row has the row claimed and the order loaded when it arrives, and is decided when the row
//! falls due — so a flash sale's broker path drains as the outbox path does. Each source has its
//! own [`channel`], permits and group size.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use timeoutd_runtime::model::Order;
use tokio::sync::{Notify, Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::db::outbox;
use crate::dispatch::{Dispatcher, Outcome, Trigger};

/// One prefetched row: its trigger, its order (`None` when the load failed: loaded when due),
/// and the claim's keep-alive (the lease is renewed until every row of the claim is dropped).
struct Entry {
    trigger: Trigger,
    order: Option<Order>,
    alive: mpsc::Sender<()>,
}

/// Where a source (the outbox timer, the broker's consumer) hands prefetched rows. Not `Clone`
/// on purpose: a stopping releasing half waits for this one sender to be dropped (at most
/// [`SENDER_GRACE`]) before it gives back the claims of the rows it still holds.
pub struct Prefetch {
    tx: mpsc::UnboundedSender<(Instant, Entry)>,
    held: Arc<AtomicUsize>,
    max: usize,
    room: Arc<Notify>,
}

/// The releasing half: [`Released::run`] hands the rows to the dispatcher when due.
pub struct Released {
    rx: mpsc::UnboundedReceiver<(Instant, Entry)>,
    held: Arc<AtomicUsize>,
    room: Arc<Notify>,
}

/// A prefetch holding at most `max` rows, and the half that releases them.
pub fn channel(max: usize) -> (Prefetch, Released) {
    let (tx, rx) = mpsc::unbounded_channel();
    let held = Arc::new(AtomicUsize::new(0));
    let room = Arc::new(Notify::new());
    (
        Prefetch {
            tx,
            held: held.clone(),
            max,
            room: room.clone(),
        },
        Released { rx, held, room },
    )
}

/// How long a stopping releasing half waits for its [`Prefetch`] to be dropped, so rows its
/// source was still claiming are given back too. The outbox timer drops it as it stops; the
/// broker's consumer when the client lets its listener go. Rows handed over later keep their
/// claim until the lease lapses, and are then taken as any overdue row.
pub const SENDER_GRACE: Duration = Duration::from_secs(5);

/// The host instant at which a row due at `due_ms` is released, when the database clock read
/// `now_ms` just before `read_at`: 1 ms past it, never before.
pub fn release_at(read_at: Instant, now_ms: i64, due_ms: i64) -> Instant {
    read_at + Duration::from_millis((due_ms - now_ms).max(0) as u64 + 1)
}

impl Prefetch {
    /// How many more rows may be held now.
    pub fn room(&self) -> usize {
        self.max.saturating_sub(self.held.load(Ordering::Acquire))
    }

    /// Resolves when rows held leave (a group went to the dispatcher).
    pub async fn room_freed(&self) {
        self.room.notified().await
    }

    /// Holds `rows` (trigger and the instant it falls due, from [`release_at`]) with the orders
    /// loaded for them (`orders`, by id; an order missing there is loaded when due). `alive` is
    /// the claim's keep-alive. Rows beyond the room are still held (the caller asked for at most
    /// the room); rows the releasing half no longer takes are dropped, their lease lapses.
    pub fn hold(
        &self,
        rows: Vec<(Instant, Trigger)>,
        mut orders: HashMap<String, Order>,
        alive: &mpsc::Sender<()>,
    ) {
        for (at, trigger) in rows {
            // A second row for the same order goes without: it is loaded when due.
            let order = orders.remove(&trigger.order_id);
            let entry = Entry {
                trigger,
                order,
                alive: alive.clone(),
            };
            self.held.fetch_add(1, Ordering::AcqRel);
            if self.tx.send((at, entry)).is_err() {
                self.held.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Loads the orders of `triggers` (claimed when the database clock read `now_ms`, just
    /// before the host instant `read_at`; each carries its row's due time) in one go and holds
    /// them until due. If the load fails, each order is loaded when due.
    pub async fn load_and_hold(
        &self,
        dispatcher: &Dispatcher,
        triggers: Vec<Trigger>,
        (read_at, now_ms): (Instant, i64),
        alive: &mpsc::Sender<()>,
    ) {
        let orders = match dispatcher.load_group(&triggers).await {
            Ok(orders) => orders,
            Err(e) => {
                tracing::warn!(error = %e, "loading prefetched orders failed; each is loaded when due");
                HashMap::new()
            }
        };
        let held = triggers
            .into_iter()
            .map(|t| {
                let due_ms = t.due_ms.unwrap_or(now_ms);
                (release_at(read_at, now_ms, due_ms), t)
            })
            .collect();
        self.hold(held, orders, alive);
    }
}

/// The renewer of the claims `tokens` name, and its keep-alive: the returned future extends
/// their lease every [`crate::lease::renew_every`]`(lease)` until every clone of the sender is
/// dropped (every group holding some of the rows is done). The caller spawns the future.
pub fn keep_alive(
    dispatcher: &Arc<Dispatcher>,
    mut tokens: Vec<String>,
    lease: Duration,
) -> (mpsc::Sender<()>, impl Future<Output = ()> + Send + 'static) {
    tokens.sort();
    tokens.dedup();
    let (alive, mut done) = mpsc::channel::<()>(1);
    let dispatcher = dispatcher.clone();
    let renewer = async move {
        let every = crate::lease::renew_every(lease);
        loop {
            tokio::select! {
                _ = done.recv() => break,
                _ = tokio::time::sleep(every) => {
                    for token in &tokens {
                        renew_rows(&dispatcher, Some(token), lease).await;
                    }
                }
            }
        }
    };
    (alive, renewer)
}

/// Extends the lease of the rows held under `token` while their group is being handled
/// (the prefetch's holds, and the broker consumer's claims while it works).
pub(crate) async fn renew_rows(dispatcher: &Dispatcher, token: Option<&str>, lease: Duration) {
    let Some(token) = token else { return };
    let db = dispatcher.db();
    let renewed = async {
        let now_ms = dispatcher.clock().now_ms(db).await?;
        outbox::renew(db, token, now_ms + lease.as_millis() as i64).await
    }
    .await;
    match renewed {
        Ok(held) => tracing::debug!(token, held, "outbox lease renewed while working"),
        Err(e) => tracing::warn!(error = %e, "outbox lease renewal failed; the lease may lapse"),
    }
}

impl Released {
    /// Releases held rows as they fall due, in groups of at most `group`, each handled on its
    /// own task once one of `permits` (shared with the outbox timer) is free. Runs until
    /// `shutdown`: the groups started are finished and, once the outbox timer has dropped its
    /// [`Prefetch`], the claims of the rows still held are given back.
    pub async fn run(
        mut self,
        dispatcher: Arc<Dispatcher>,
        permits: Arc<Semaphore>,
        group: usize,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let group = group.max(1);
        let mut waiting: BTreeMap<(Instant, u64), Entry> = BTreeMap::new();
        let mut seq = 0u64;
        let mut in_flight = JoinSet::new();
        'run: loop {
            while in_flight.try_join_next().is_some() {}
            let next = waiting.keys().next().map(|(at, _)| *at);
            tokio::select! {
                received = self.rx.recv() => match received {
                    Some((at, entry)) => {
                        waiting.insert((at, seq), entry);
                        seq += 1;
                    }
                    None => break 'run,
                },
                () = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                    // A permit first, then every row due by then: while the permits are busy,
                    // rows falling due gather into fuller groups.
                    let permit = tokio::select! {
                        permit = permits.clone().acquire_owned() => permit.expect("semaphore never closed"),
                        () = crate::shutdown::stopping(&mut shutdown) => break 'run,
                    };
                    while let Ok((at, entry)) = self.rx.try_recv() {
                        waiting.insert((at, seq), entry);
                        seq += 1;
                    }
                    let now = Instant::now();
                    let mut due = Vec::with_capacity(group);
                    while due.len() < group {
                        match waiting.first_entry() {
                            Some(first) if first.key().0 <= now => due.push(first.remove()),
                            _ => break,
                        }
                    }
                    self.held.fetch_sub(due.len(), Ordering::AcqRel);
                    self.room.notify_one();
                    let dispatcher = dispatcher.clone();
                    in_flight.spawn(async move {
                        handle(&dispatcher, due).await;
                        drop(permit);
                    });
                }
                () = crate::shutdown::stopping(&mut shutdown) => break 'run,
            }
        }
        while in_flight.join_next().await.is_some() {}
        // Rows the source claimed as it stopped come until it drops its half.
        let _ = tokio::time::timeout(SENDER_GRACE, async {
            while let Some((at, entry)) = self.rx.recv().await {
                waiting.insert((at, seq), entry);
                seq += 1;
            }
        })
        .await;
        self.rx.close();
        while let Ok((at, entry)) = self.rx.try_recv() {
            waiting.insert((at, seq), entry);
            seq += 1;
        }
        let tokens: BTreeSet<String> = waiting
            .values()
            .filter_map(|e| e.trigger.claim.clone())
            .collect();
        let mut given_back = 0;
        for token in &tokens {
            match outbox::release_held(dispatcher.db(), token).await {
                Ok(n) => given_back += n,
                Err(e) => {
                    tracing::warn!(error = %e, "giving back prefetched rows failed; their lease lapses")
                }
            }
        }
        self.held.store(0, Ordering::Release);
        if !waiting.is_empty() {
            tracing::info!(
                held = waiting.len(),
                given_back,
                "prefetched rows given back as their source stops"
            );
        }
    }
}

/// Decides and carries out one released group on the orders loaded ahead; the rows' claims are
/// kept alive until it is done.
async fn handle(dispatcher: &Dispatcher, due: Vec<Entry>) {
    let mut orders = HashMap::with_capacity(due.len());
    let mut triggers = Vec::with_capacity(due.len());
    let mut alive = Vec::with_capacity(due.len());
    for entry in due {
        if let Some(order) = entry.order {
            orders.insert(order.id.clone(), order);
        }
        triggers.push(entry.trigger);
        alive.push(entry.alive);
    }
    for outcome in dispatcher.handle_loaded(&triggers, orders).await {
        if let Outcome::DeadLettered { reason } = &outcome {
            tracing::warn!(reason, "outbox row dead-lettered");
        }
    }
    drop(alive);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_released_one_ms_past_its_due_time_by_the_clock_read_never_before() {
        let read_at = Instant::now();
        assert_eq!(
            release_at(read_at, 1_000, 3_000),
            read_at + Duration::from_millis(2_001)
        );
        assert_eq!(
            release_at(read_at, 1_000, 900),
            read_at + Duration::from_millis(1),
            "due already: at once"
        );
    }
}
