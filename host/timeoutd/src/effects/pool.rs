//! The executor's slots at work: runnable rows read a page at a time, oldest first, with the
//! other merchants' oldest rows added when one merchant's backlog fills the page
//! ([`EffectRunner::read_page`]), one order's rows to a slot, the slots shared by weight
//! ([`super::fair`]), and each slot given to the next order the moment its own finishes.
//!
//! Before #46 a page was carried out in chunks of `effects.concurrency` rows, each chunk
//! awaited whole: one webhook hanging for its 5 s timeout held the fifteen other slots idle
//! for those 5 s, chunk after chunk, and a burst's backlog kept every other merchant's rows
//! behind it in id order. Now:
//! - a finished order's slot is refilled at once, so a slow row holds only its own slot;
//! - the rows waiting are re-read every [`REFRESH`] while slots are free (a merchant whose
//!   rows were just committed gets the next free slot instead of waiting for the page to end);
//! - claims and settles are batched: free slots are filled together and finished orders
//!   settled together (DONE rows in one statement per claim) once `effects.concurrency` of
//!   them are in the batch or the first has waited [`LINGER`], so a burst costs about one
//!   claim and one settle per `effects.concurrency` orders, as the chunks did;
//! - each claim's lease is renewed while any of its orders runs, and completions are fenced
//!   by the claim token as before (`db::ledger`).
//!
//! On shutdown no further order is started: the ones running finish and are settled, the rest
//! stay PENDING and unclaimed for the next executor.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinSet;

use super::EffectRunner;
use super::executor::{Done, EffectError};
use super::fair::Shares;
use crate::db::{DbError, ledger, orders};

/// Ledger rows read per page.
pub const PAGE: u32 = 500;

/// How long a finished order waits for others to be settled with it, and a free slot for
/// others to be claimed with it, when the batch is not yet `effects.concurrency` strong.
pub const LINGER: Duration = Duration::from_millis(5);

/// How long a page read stands while slots are free and rows of other merchants may have been
/// committed since: the bound on how long a newly recorded row waits for a free slot. Each
/// re-read costs two reads of a large backlog; at 250 ms they slowed a 10,000-notice drain on
/// SQLite by a third.
pub const REFRESH: Duration = Duration::from_millis(1_000);

/// One order's claimed rows, in ledger order.
type Group = Vec<ledger::PendingEffect>;

/// What a slot reports when its order's rows are done.
struct Finished {
    merchant: String,
    order_id: String,
    token: String,
    results: Vec<(ledger::PendingEffect, Result<Done, EffectError>)>,
}

/// The rows of the last page not yet started: per merchant, one group per order, oldest
/// first.
#[derive(Default)]
struct Waiting(BTreeMap<String, VecDeque<Group>>);

impl Waiting {
    /// `rows` grouped per order and per merchant; rows of an order already running are left
    /// out (they run after it, at a later read).
    fn of(rows: Vec<ledger::PendingEffect>, running: &HashSet<String>) -> Waiting {
        let mut groups: Vec<Group> = Vec::new();
        let mut at: HashMap<String, usize> = HashMap::new();
        for row in rows {
            if running.contains(&row.order_id) {
                continue;
            }
            match at.get(&row.order_id) {
                Some(&i) => groups[i].push(row),
                None => {
                    at.insert(row.order_id.clone(), groups.len());
                    groups.push(vec![row]);
                }
            }
        }
        let mut waiting: BTreeMap<String, VecDeque<Group>> = BTreeMap::new();
        for mut group in groups {
            group.sort_by_key(|r| r.id);
            waiting
                .entry(group[0].merchant_id.clone())
                .or_default()
                .push_back(group);
        }
        for queue in waiting.values_mut() {
            queue.make_contiguous().sort_by_key(|g| g[0].id);
        }
        Waiting(waiting)
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each waiting merchant with the id of its oldest waiting row.
    fn heads(&self) -> impl Iterator<Item = (&str, i64)> {
        self.0
            .iter()
            .filter_map(|(m, q)| q.front().map(|g| (m.as_str(), g[0].id)))
    }

    fn pop(&mut self, merchant: &str) -> Option<Group> {
        let queue = self.0.get_mut(merchant)?;
        let group = queue.pop_front();
        if queue.is_empty() {
            self.0.remove(merchant);
        }
        group
    }
}

/// One run's bookkeeping: the slots, the orders running, the claims they hold.
struct Run {
    shares: Shares,
    waiting: Waiting,
    /// Orders whose rows run now.
    running: HashSet<String>,
    /// Orders running per claim token (renewed while above 0).
    claims: HashMap<String, usize>,
    tasks: JoinSet<Finished>,
    /// Merchant, order and token of each task, for one that panics.
    of_task: HashMap<tokio::task::Id, (String, String, String)>,
}

impl Run {
    /// A slot's order is over (finished or panicked): its slot, its order and its claim's
    /// count are given back.
    fn release(&mut self, merchant: &str, order_id: &str, token: &str) {
        self.shares.give_back(merchant);
        self.running.remove(order_id);
        if let Some(n) = self.claims.get_mut(token) {
            *n -= 1;
            if *n == 0 {
                self.claims.remove(token);
            }
        }
    }
}

impl EffectRunner {
    /// Carries out every runnable row (of `order_id` when given; rows never attempted only
    /// when last touched at or before `fresh_before_ms`) until none is left, or until
    /// `shutdown` is signalled and the orders running are done. Returns how many rows were
    /// settled (DONE or FAILED).
    ///
    /// # Errors
    /// [`DbError`] when the ledger cannot be read, claimed or settled; the orders running
    /// then finish and are settled first.
    pub(super) async fn drain(
        &self,
        order_id: Option<&str>,
        fresh_before_ms: i64,
        shutdown: Option<&watch::Receiver<bool>>,
    ) -> Result<usize, DbError> {
        let mut run = Run {
            shares: Shares::new(
                self.config.concurrency as usize,
                self.config.merchant_slots() as usize,
                self.weights.clone(),
            ),
            waiting: Waiting::default(),
            running: HashSet::new(),
            claims: HashMap::new(),
            tasks: JoinSet::new(),
            of_task: HashMap::new(),
        };
        let every = crate::lease::renew_every(self.config.lease);
        let mut renew = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut read_at: Option<Instant> = None;
        let mut last_len = 0usize;
        let mut settled = 0;
        let mut failed: Option<DbError> = None;
        // Claims and settles are batched: a finished order waits up to LINGER for others to
        // settle with it, and a free slot up to LINGER for others to be claimed with it, unless
        // every slot is already in the batch (as Kafka's `linger.ms`). Without it a burst cost a
        // claim and a settle per order, and on SQLite's one writer the drain of 10,000 notices
        // ran at half the old chunks' rate.
        let batch = (self.config.concurrency as usize).max(1);
        let mut finished: Vec<Finished> = Vec::new();
        let mut finished_since: Option<Instant> = None;
        let mut free_since: Option<Instant> = None;
        loop {
            let stopping = failed.is_some() || shutdown.is_some_and(crate::shutdown::is_stopping);
            let lingered = |since: Option<Instant>| since.is_some_and(|at| at.elapsed() >= LINGER);
            if !finished.is_empty()
                && (finished.len() >= batch
                    || run.tasks.is_empty()
                    || stopping
                    || lingered(finished_since))
            {
                match self.settle_finished(std::mem::take(&mut finished)).await {
                    Ok(n) => settled += n,
                    Err(e) => failed = Some(e),
                }
                finished_since = None;
                continue;
            }
            let stale = read_at.is_none_or(|at| at.elapsed() >= REFRESH)
                || (run.waiting.is_empty() && last_len == PAGE as usize);
            let mut read_now = false;
            if !stopping && run.shares.free() > 0 && stale {
                match self.read_page(order_id, fresh_before_ms).await {
                    Ok(rows) => {
                        last_len = rows.len();
                        run.waiting = Waiting::of(rows, &run.running);
                        read_at = Some(Instant::now());
                        read_now = true;
                    }
                    Err(e) => {
                        failed = Some(e);
                        continue;
                    }
                }
            }
            let may_start =
                run.shares.free() >= batch || run.tasks.is_empty() || lingered(free_since);
            let pickable = run.shares.pick(run.waiting.heads()).is_some();
            if stopping || !pickable {
                free_since = None;
            } else if may_start {
                free_since = None;
                if let Err(e) = self.start(&mut run).await {
                    failed = Some(e);
                    continue;
                }
            } else if free_since.is_none() {
                free_since = Some(Instant::now());
            }
            if run.tasks.is_empty() && finished.is_empty() {
                // Nothing running: done when nothing is left to start, or nothing more may be.
                if stopping || read_now || last_len < PAGE as usize || !run.waiting.is_empty() {
                    break;
                }
                continue;
            }
            let refresh_at = read_at.map(|at| tokio::time::Instant::from_std(at + REFRESH));
            let may_refresh = !stopping && run.shares.free() > 0 && refresh_at.is_some();
            let linger_at = [finished_since, free_since]
                .into_iter()
                .flatten()
                .min()
                .map(|at| tokio::time::Instant::from_std(at + LINGER));
            tokio::select! {
                joined = run.tasks.join_next_with_id(), if !run.tasks.is_empty() => {
                    let mut next = joined;
                    while let Some(joined) = next {
                        match joined {
                            Ok((id, done)) => {
                                run.of_task.remove(&id);
                                run.release(&done.merchant, &done.order_id, &done.token);
                                finished.push(done);
                            }
                            Err(e) => {
                                if let Some((merchant, order, token)) = run.of_task.remove(&e.id()) {
                                    tracing::error!(order = %order, error = %e, "an effect's execution panicked; its rows wait for their lease to lapse");
                                    run.release(&merchant, &order, &token);
                                }
                            }
                        }
                        next = run.tasks.try_join_next_with_id();
                    }
                    if finished_since.is_none() && !finished.is_empty() {
                        finished_since = Some(Instant::now());
                    }
                }
                _ = renew.tick() => self.renew_claims(&run.claims).await,
                _ = tokio::time::sleep_until(linger_at.unwrap_or_else(tokio::time::Instant::now)), if linger_at.is_some() => {}
                _ = tokio::time::sleep_until(refresh_at.unwrap_or_else(tokio::time::Instant::now)), if may_refresh => {}
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(settled),
        }
    }

    /// A page of runnable rows of this runner's kinds, oldest first; when one merchant's
    /// backlog fills it, a second read adds the other merchants' oldest rows
    /// ([`ledger::runnable`]'s `besides`), so their rows get the next free slots however far
    /// back in id order they are.
    async fn read_page(
        &self,
        order_id: Option<&str>,
        fresh_before_ms: i64,
    ) -> Result<Vec<ledger::PendingEffect>, DbError> {
        let now = self.clock.now_ms(&self.db).await?;
        let kinds = self.kinds();
        let mut rows =
            ledger::runnable(&self.db, &kinds, order_id, &[], now, fresh_before_ms, PAGE).await?;
        if rows.len() == PAGE as usize && order_id.is_none() {
            let seen: std::collections::BTreeSet<&str> =
                rows.iter().map(|r| r.merchant_id.as_str()).collect();
            let seen: Vec<&str> = seen.into_iter().collect();
            let others =
                ledger::runnable(&self.db, &kinds, None, &seen, now, fresh_before_ms, PAGE).await?;
            rows.extend(others);
        }
        Ok(rows)
    }

    /// Gives every free slot that [`Shares::pick`] allows an order of the waiting rows: their
    /// rows claimed in one statement, their orders' status and buyer read in one, each order's
    /// rows started in a task of its own, carried out one after another in ledger order. A row
    /// another executor claimed first is left to it.
    async fn start(&self, run: &mut Run) -> Result<(), DbError> {
        let mut picked: Vec<Group> = Vec::new();
        while let Some(merchant) = run.shares.pick(run.waiting.heads()) {
            let merchant = merchant.to_string();
            let Some(group) = run.waiting.pop(&merchant) else {
                break;
            };
            run.shares.take(&merchant);
            picked.push(group);
        }
        if picked.is_empty() {
            return Ok(());
        }
        let lease_ms = self.config.lease.as_millis() as i64;
        let ids: Vec<i64> = picked.iter().flatten().map(|r| r.id).collect();
        let claimed = async {
            let now = self.clock.now_ms(&self.db).await?;
            let (token, claimed) = ledger::claim_many(&self.db, &ids, now, now + lease_ms).await?;
            Ok::<_, DbError>((now, token, claimed))
        }
        .await;
        let (now, token, claimed) = match claimed {
            Ok(claimed) => claimed,
            Err(e) => {
                for group in &picked {
                    run.shares.give_back(&group[0].merchant_id);
                }
                return Err(e);
            }
        };
        let claimed: HashSet<i64> = claimed.into_iter().collect();
        let mut groups = Vec::with_capacity(picked.len());
        for group in picked {
            let merchant = group[0].merchant_id.clone();
            let group: Group = group
                .into_iter()
                .filter(|r| claimed.contains(&r.id))
                .collect();
            if group.is_empty() {
                run.shares.give_back(&merchant);
            } else {
                groups.push(group);
            }
        }
        if groups.is_empty() {
            return Ok(());
        }
        let order_ids: Vec<&str> = groups.iter().map(|g| g[0].order_id.as_str()).collect();
        let facts = match orders::status_and_user(&self.db, &order_ids).await {
            Ok(facts) => facts,
            Err(e) => {
                // Claimed and not started: their lease lapses and another run takes them.
                for group in &groups {
                    run.shares.give_back(&group[0].merchant_id);
                }
                return Err(e);
            }
        };
        run.claims.insert(token.clone(), groups.len());
        for group in groups {
            let (merchant, order_id) = (group[0].merchant_id.clone(), group[0].order_id.clone());
            let order = facts.get(&order_id).cloned();
            let runner = self.clone();
            let finished = Finished {
                merchant: merchant.clone(),
                order_id: order_id.clone(),
                token: token.clone(),
                results: Vec::with_capacity(group.len()),
            };
            let task = run.tasks.spawn(async move {
                let mut finished = finished;
                for row in group {
                    let result = runner.execute(&row, order.as_ref(), now).await;
                    finished.results.push((row, result));
                }
                finished
            });
            run.running.insert(order_id.clone());
            run.of_task
                .insert(task.id(), (merchant, order_id, token.clone()));
        }
        Ok(())
    }

    /// Settles what the finished slots did: plain successes in one statement per claim, the
    /// rest one by one ([`EffectRunner::settle`]: retry with backoff, deferred, FAILED, DONE
    /// with a note); then runs what they raised (a refund's notice). Returns rows settled.
    async fn settle_finished(&self, done: Vec<Finished>) -> Result<usize, DbError> {
        let now = self.clock.now_ms(&self.db).await?;
        let mut plain: BTreeMap<String, Vec<i64>> = BTreeMap::new();
        let mut raised = Vec::new();
        let mut settled = 0;
        for finished in done {
            let token = finished.token;
            for (row, result) in finished.results {
                match result {
                    Ok(d) if d == Done::plain() => {
                        crate::events::emit(crate::events::Event::Effect {
                            kind: &row.kind,
                            outcome: "done",
                        });
                        plain.entry(token.clone()).or_default().push(row.id);
                    }
                    result => {
                        if matches!(&result, Ok(d) if d.raised) {
                            raised.push(row.order_id.clone());
                        }
                        settled += usize::from(self.settle(&token, &row, result, now).await?);
                    }
                }
            }
        }
        for (token, ids) in plain {
            settled +=
                ledger::settle_many(&self.db, &token, &ids, ledger::DONE, now).await? as usize;
        }
        if !raised.is_empty()
            && let Some(others) = &self.others
        {
            others.notify_one();
        }
        for order_id in raised {
            // What the execution raised (a refund) runs now rather than at the next wake.
            self.run_for_order_boxed(order_id).await;
        }
        Ok(settled)
    }

    /// Extends the lease of every claim with an order still running.
    async fn renew_claims(&self, claims: &HashMap<String, usize>) {
        if claims.is_empty() {
            return;
        }
        let lease_ms = self.config.lease.as_millis() as i64;
        let renewed = async {
            let now = self.clock.now_ms(&self.db).await?;
            for token in claims.keys() {
                ledger::renew(&self.db, token, now + lease_ms).await?;
            }
            Ok::<_, DbError>(())
        };
        if let Err(e) = renewed.await {
            tracing::warn!(error = %e, "ledger lease renewal failed; the lease may lapse");
        }
    }
}
