//! Application-level sharding (`[[database.shards]]`): one daemon process serving an order
//! database split over several databases, as ShardingSphere-JDBC users and the seeds' order
//! service split it.
//!
//! Each shard is a whole timeoutd database (orders, stock, coupons, outbox, ledger), so a close
//! stays one local transaction. Work is divided by **shard leases**: a row `shard` in each
//! shard's own `maintenance_lease`, taken by a conditional update and renewed every third of
//! `database.shard_lease`. The holder runs that shard's outbox timer, sweep, retention and
//! ledger executor (a [`Daemon`] over the shard's URL). A shard whose holder dies is taken by
//! another daemon when its lease lapses, so none is left without one; and a holder that cannot
//! renew stops its own work before the lease can lapse (**self-fencing**: fenced a round before
//! the lease's end, timed on the monotonic clock from before its last successful renewal, with
//! every call and the drain bounded so the work is gone by then), so no shard is worked — or
//! swept — by two daemons beyond a moment of clock skew. The claims and the compare-and-set
//! still decide what happens, so even that moment can only cost a lost claim or an order found
//! already closed.
//!
//! Each shard has a **worker task** of its own in every process, so a shard that is down or slow
//! delays only its own worker: every database call is bounded by a third of a renewal round,
//! and a shard's daemon is given a bounded time to drain when it stops (then its tasks are
//! aborted; their transactions roll back).
//!
//! Daemons share the shards fairly: each announces itself with a `daemon:<id>` row in every shard
//! it reaches, the workers read how many daemons are present, and a process holds at most
//! ⌈shards ÷ daemons⌉ shards, handing a surplus over (its work stopped first, then the lease
//! released). A worker takes nothing on its first round, so daemons starting together see each
//! other before taking. Orders addressed by id (the HTTP endpoint's paid callback and payment
//! attempts) are routed to their shard by `database.routing` ([`crate::config::routing`]), whoever holds it.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::clock::{Clock, Stopwatch};
use crate::config::Config;
use crate::daemon::{Daemon, StartError};
use crate::db::{Db, maintenance_lease};
use crate::effects::EffectRunner;
use crate::policies::Policies;

/// The lease each shard's worker holds (a row of the shard's `maintenance_lease`).
const SHARD_LEASE: &str = "shard";
/// The prefix of each daemon's presence row.
const PRESENCE: &str = "daemon:";

/// A running sharded daemon.
pub struct Sharded {
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
    http_addr: Option<std::net::SocketAddr>,
    pool: Arc<Share>,
    dbs: Vec<Db>,
}

/// What one process's shard workers share.
struct Share {
    shards: usize,
    /// Shards this process works now.
    held: AtomicUsize,
    /// Per shard, the daemons its presence rows showed at its worker's last round (0: unknown).
    seen: Mutex<Vec<i64>>,
    /// The names of the shards held, for [`Sharded::held`].
    names: Mutex<BTreeSet<String>>,
}

impl Share {
    /// ⌈shards ÷ daemons present⌉, the daemons counted as the most any shard showed.
    fn fair(&self) -> usize {
        let daemons = self.seen.lock().unwrap().iter().copied().max().unwrap_or(1);
        self.shards
            .div_ceil(usize::try_from(daemons).unwrap_or(1).max(1))
    }

    /// Books one more shard if this process is under its fair share.
    fn reserve(&self) -> bool {
        let fair = self.fair();
        self.held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |h| {
                (h < fair).then_some(h + 1)
            })
            .is_ok()
    }

    /// Gives one shard up if this process is over its fair share.
    fn surplus(&self) -> bool {
        let fair = self.fair();
        self.held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |h| {
                (h > fair).then(|| h - 1)
            })
            .is_ok()
    }

    fn release(&self) {
        self.held.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One shard as its worker sees it.
struct Shard {
    index: usize,
    name: String,
    /// The worker's pool (lazy: a shard down at start-up is retried).
    db: Db,
    /// The shard's own config: `database.url` set to the shard's, no listeners.
    config: Config,
    migrate: bool,
}

/// Who this process is in the lease rows.
#[derive(Clone)]
struct Me {
    /// `host-pidN-xxxxxxxx` (the `holder` column).
    holder: String,
    /// `daemon:<16 hex>` (the presence row's name; short, for `name VARCHAR(64)`).
    presence: String,
}

impl Sharded {
    /// Loads the plugins, opens a lazy pool per shard and checks every shard it reaches (a
    /// shard the engine check refuses stops start-up; one that is down is retried by its
    /// worker), opens the HTTP endpoint routing by order id, and starts a worker per shard that
    /// takes, keeps and shares it.
    ///
    /// # Errors
    /// [`StartError`] naming the shard that could not be set up (`shard ds_1: …`).
    pub async fn start(config: &Config, clock: Clock) -> Result<Sharded, StartError> {
        crate::db::names::serve(&config.database.table_prefix)?;
        // Every merchant's plugin loads once, before any shard is taken, so a shard taken
        // over later starts deciding at once (no compile); a merchant whose file does not load
        // is held, the others served (`load_serving`).
        let (policies, _held) = crate::policies::load_serving(config)?;
        let lease = config.database.shard_lease;
        let mut shards = Vec::new();
        let mut front = Vec::new();
        for (index, s) in config.database.shards.iter().enumerate() {
            let named = |e: String| StartError::Shard(s.name.clone(), e);
            // Its orders: timeoutd's own tables, or its part of the shop's (`shop_database`).
            let schema = config
                .shard_schema(s)
                .map_err(|problems| named(problems.join("; ")))?;
            let db = Db::connect_lazy(
                &s.url,
                config.database.pool_size(&s.url),
                config.database.pool_mode,
            )
            .await
            .map_err(|e| named(e.to_string()))?
            .with_schema(schema);
            let migrate = match tokio::time::timeout(
                lease,
                crate::daemon::prepare(
                    &db,
                    crate::daemon::Migrate::of(config.database.migrate, s.migrate_url.as_deref()),
                ),
            )
            .await
            {
                Ok(Ok(())) => match crate::daemon::check_shop(&db).await {
                    Ok(()) => false,
                    Err(e @ StartError::Shop(_)) => return Err(named(e.to_string())),
                    Err(e) => {
                        tracing::error!(shard = %s.name, error = %e, "shard's shop tables not readable at start; its worker retries");
                        config.database.migrate
                    }
                },
                Ok(Err(e @ StartError::Unsafe(_))) => return Err(named(e.to_string())),
                // Still a pooler refusal (its own exit status), naming the shard.
                Ok(Err(StartError::Pooler(line))) => {
                    return Err(StartError::Pooler(format!("shard {}: {line}", s.name)));
                }
                // Outside the schema's compatibility window, or half-applied: no retry helps,
                // an operator must act (exit 78, as for one database).
                Ok(Err(StartError::Schema(e))) if e.needs_operator() => {
                    tracing::error!(shard = %s.name, "{e}");
                    return Err(StartError::Schema(e));
                }
                Ok(Err(e)) => {
                    tracing::error!(shard = %s.name, error = %e, "shard not reachable at start; its worker retries");
                    config.database.migrate
                }
                Err(_) => {
                    tracing::error!(shard = %s.name, "shard did not answer within database.shard_lease at start; its worker retries");
                    config.database.migrate
                }
            };
            let mut own = config.clone();
            own.database.url = s.url.clone();
            own.database.migrate_url = s.migrate_url.clone();
            own.database.shards = Vec::new();
            if let (Some(shop), Some(database)) = (own.database.shop.as_mut(), &s.shop_database) {
                shop.database = Some(database.clone());
            }
            // Checked and migrated by the worker; the listeners are the process's.
            own.database.migrate = false;
            own.http = None;
            // One plugin watcher for the process (below), not one per shard.
            own.runtime.watch_plugins = Duration::ZERO;
            let effects = EffectRunner::from_config(db.clone(), clock.clone(), &own)
                .await
                .map_err(|e| named(format!("effects: {e}")))?;
            front.push((s.name.clone(), db.clone(), effects));
            shards.push(Shard {
                index,
                name: s.name.clone(),
                db,
                config: own,
                migrate,
            });
        }
        let dbs = shards.iter().map(|s| s.db.clone()).collect();
        let (shutdown, rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let http_addr = crate::daemon::serve_http(
            config,
            || crate::http::HttpState::sharded(front, config),
            &mut tasks,
            &rx,
        )
        .await?;
        tasks.spawn(crate::policies::watch(policies.clone(), config, rx.clone()));
        let host: String = hostname().chars().take(48).collect();
        let me = Me {
            holder: format!("{host}-pid{}-{:08x}", std::process::id(), fastrand::u32(..)),
            presence: format!("{PRESENCE}{:016x}", fastrand::u64(..)),
        };
        let pool = Arc::new(Share {
            shards: shards.len(),
            held: AtomicUsize::new(0),
            seen: Mutex::new(vec![0; shards.len()]),
            names: Mutex::new(BTreeSet::new()),
        });
        for shard in shards {
            tasks.spawn(work(
                shard,
                pool.clone(),
                policies.clone(),
                me.clone(),
                clock.clone(),
                lease,
                rx.clone(),
            ));
        }
        tracing::info!(
            shards = config.database.shards.len(),
            routing = ?config.database.routing,
            holder = %me.holder,
            "timeoutd started (sharded)"
        );
        Ok(Sharded {
            shutdown,
            tasks,
            http_addr,
            pool,
            dbs,
        })
    }

    /// Where the HTTP endpoint listens.
    pub fn http_addr(&self) -> Option<std::net::SocketAddr> {
        self.http_addr
    }

    /// The names of the shards this process works now.
    pub fn held(&self) -> Vec<String> {
        self.pool.names.lock().unwrap().iter().cloned().collect()
    }

    /// Stops every worker (each held shard's daemon drained and its lease released, this
    /// daemon's presence removed) and the HTTP endpoint.
    pub async fn stop(mut self) {
        let _ = self.shutdown.send(true);
        // Each shard's worker stops its daemon within DRAIN; a worker stuck past that (a
        // shard's database call that hangs) is abandoned.
        let limit = crate::shutdown::DRAIN + Duration::from_millis(500);
        let drained = tokio::time::timeout(limit, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!("a shard's worker did not stop within {limit:?}; abandoned");
            self.tasks.abort_all();
        }
        for db in &self.dbs {
            let _ = tokio::time::timeout(Duration::from_millis(500), db.close()).await;
        }
        tracing::info!("timeoutd stopped (sharded)");
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".to_string())
}

/// One shard's worker: every third of the lease, announce this daemon in the shard, then renew
/// the shard if held (stopping its work before the lease can lapse when renewals fail, and
/// handing it over when this process holds more than its share), or take it if free and this
/// process is under its share.
async fn work(
    shard: Shard,
    pool: Arc<Share>,
    policies: Arc<Policies>,
    me: Me,
    clock: Clock,
    lease: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let tick = crate::lease::renew_every(lease);
    // Each database call (and a fenced shard's drain) gets a third of a round, so a round with
    // a failed renewal ends, and a fenced shard's work is stopped, by ⅔ of a round past the
    // fence: a lease of three rounds, renewed at 0, is fenced at 2 rounds and stopped by 2⅓,
    // before it can lapse at 3.
    let call = tick / 3;
    let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
    let tick_ms = i64::try_from(tick.as_millis()).unwrap_or(i64::MAX);
    // Take or renew the shard's lease (by the shard's own clock); give it up.
    let hold = || async {
        bounded(&shard.name, call, "shard lease", async {
            let now = clock.now_ms(&shard.db).await?;
            maintenance_lease::take_lease(&shard.db, SHARD_LEASE, &me.holder, now, now + lease_ms)
                .await
        })
        .await
            == Some(true)
    };
    let let_go = || async {
        bounded(
            &shard.name,
            call,
            "shard lease release",
            maintenance_lease::release_lease(&shard.db, SHARD_LEASE, &me.holder),
        )
        .await;
    };
    let mut migrate = shard.migrate;
    let mut ready = !migrate;
    let mut running: Option<Daemon> = None;
    // Started before the last successful renewal's request: the lease runs from no earlier.
    let mut renewed = Stopwatch::start();
    let mut first = true;
    loop {
        if let Some(n) = bounded(
            &shard.name,
            call,
            "presence",
            heartbeat(&shard.db, &me, &clock, lease_ms),
        )
        .await
        {
            pool.seen.lock().unwrap()[shard.index] = n;
        }
        if !ready {
            let how =
                crate::daemon::Migrate::of(migrate, shard.config.database.migrate_url.as_deref());
            match tokio::time::timeout(lease, crate::daemon::prepare(&shard.db, how)).await {
                Ok(Ok(())) => (ready, migrate) = (true, false),
                Ok(Err(e)) => {
                    tracing::error!(shard = %shard.name, error = %e, "shard cannot be worked yet")
                }
                Err(_) => {
                    tracing::warn!(shard = %shard.name, "shard check: no answer within {lease:?}")
                }
            }
        }
        if let Some(daemon) = running.take() {
            let asked = Stopwatch::start();
            let kept = hold().await;
            if kept {
                renewed = asked;
            }
            if !kept && renewed.elapsed_ms() >= lease_ms - tick_ms {
                // One more failed round and the lease may lapse under another holder.
                tracing::warn!(shard = %shard.name, "shard lease not renewed; stopping its work before it lapses");
                stop(daemon, call).await;
                pool.release();
                pool.names.lock().unwrap().remove(&shard.name);
            } else if kept && pool.surplus() {
                // Handed over: the lease was just renewed, so the drain has most of a lease.
                stop(daemon, lease / 2).await;
                let_go().await;
                pool.names.lock().unwrap().remove(&shard.name);
                tracing::info!(shard = %shard.name, "shard handed over (over this daemon's fair share)");
            } else {
                running = Some(daemon);
            }
        } else if !first && ready && pool.reserve() {
            let asked = Stopwatch::start();
            let taken = hold().await;
            let started = if taken {
                renewed = asked;
                // Checked by `prepare` above: a pool of the daemon's own (lazy, no round trip),
                // and the start bounded by the fence point of the lease just taken.
                let until_fence = Duration::from_millis(
                    u64::try_from(lease_ms - tick_ms - renewed.elapsed_ms()).unwrap_or(0),
                );
                let start = async {
                    let db = Db::connect_lazy(
                        &shard.config.database.url,
                        shard.config.database.pool_size(&shard.config.database.url),
                        shard.config.database.pool_mode,
                    )
                    .await?
                    .with_schema(shard.db.schema().clone());
                    Daemon::start_prepared(&shard.config, clock.clone(), policies.clone(), db).await
                };
                match tokio::time::timeout(until_fence, start).await {
                    Ok(Ok(d)) => Some(d),
                    Ok(Err(e)) => {
                        tracing::error!(shard = %shard.name, error = %e, "shard taken but its work could not start; freeing it");
                        None
                    }
                    Err(_) => {
                        tracing::error!(shard = %shard.name, "shard's work did not start before its lease's fence point; freeing it");
                        None
                    }
                }
            } else {
                None
            };
            match started {
                Some(d) => {
                    tracing::info!(shard = %shard.name, "shard taken");
                    pool.names.lock().unwrap().insert(shard.name.clone());
                    running = Some(d);
                }
                None => {
                    pool.release();
                    if taken {
                        let_go().await;
                    }
                }
            }
        }
        first = false;
        if crate::shutdown::sleep_or_shutdown(tick, &mut shutdown).await {
            break;
        }
    }
    if let Some(daemon) = running.take() {
        // Renewed at most a round ago: half a lease to drain stays inside it.
        stop(daemon, lease / 2).await;
        pool.release();
        let_go().await;
    }
    let _ = bounded(
        &shard.name,
        tick,
        "presence removal",
        maintenance_lease::delete_lease(&shard.db, &me.presence, &me.holder),
    )
    .await;
}

/// `f`, given at most `tick`: its value, or `None` after logging why not.
async fn bounded<T, E: std::fmt::Display>(
    shard: &str,
    tick: Duration,
    what: &str,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Option<T> {
    match tokio::time::timeout(tick, f).await {
        Ok(Ok(v)) => Some(v),
        Ok(Err(e)) => {
            tracing::warn!(shard, error = %e, "{what} failed");
            None
        }
        Err(_) => {
            tracing::warn!(shard, "{what}: no answer within {tick:?}");
            None
        }
    }
}

/// Stops a shard's daemon, waiting at most `limit` (and never longer than
/// [`crate::shutdown::DRAIN`]) for it to drain; past that its tasks are aborted (their open
/// transactions roll back; their claims lapse with their leases) and the line says what.
async fn stop(daemon: Daemon, limit: Duration) {
    daemon.stop_within(limit.min(crate::shutdown::DRAIN)).await;
}

/// Announces this daemon in the shard for a lease, prunes presence rows lapsed for ten leases,
/// and returns how many daemons are present.
async fn heartbeat(
    db: &Db,
    me: &Me,
    clock: &Clock,
    lease_ms: i64,
) -> Result<i64, crate::db::DbError> {
    let now = clock.now_ms(db).await?;
    maintenance_lease::take_lease(db, &me.presence, &me.holder, now, now + lease_ms).await?;
    maintenance_lease::prune(db, PRESENCE, now - 10 * lease_ms).await?;
    maintenance_lease::live_holders(db, PRESENCE, now).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(shards: usize) -> Share {
        Share {
            shards,
            held: AtomicUsize::new(0),
            seen: Mutex::new(vec![0; shards]),
            names: Mutex::new(BTreeSet::new()),
        }
    }

    #[test]
    fn a_process_takes_up_to_its_fair_share_and_hands_over_the_surplus() {
        let s = share(5);
        // Alone (no presence read yet counts as one daemon): all five.
        assert_eq!(s.fair(), 5);
        for _ in 0..5 {
            assert!(s.reserve());
        }
        assert!(!s.reserve(), "never more than the fair share");
        // A second daemon shows up in any shard's presence rows: ⌈5 ÷ 2⌉ = 3.
        s.seen.lock().unwrap()[3] = 2;
        assert!(s.surplus());
        assert!(s.surplus());
        assert!(!s.surplus(), "keeps its fair share");
        assert_eq!(s.held.load(Ordering::SeqCst), 3);
        // Three daemons: ⌈5 ÷ 3⌉ = 2; and 2 × 3 ≥ 5, so no shard is left over.
        s.seen.lock().unwrap()[0] = 3;
        assert_eq!(s.fair(), 2);
        assert!(s.surplus());
        assert!(!s.reserve());
        s.release();
        assert!(s.reserve(), "a shard given back frees a place");
    }
}
