//! Application-level sharding (`[[database.shards]]`): one daemon process serving an order
//! database split over several databases, as ShardingSphere-JDBC users and the seeds' order
//! service split it.
//!
//! Each shard is a whole timeoutd database (orders, stock, coupons, outbox, ledger), so a close
//! stays one local transaction. Work is divided by **shard leases**: a row `shard` in each
//! shard's own `maintenance_lease`, taken by a conditional update, renewed every third of
//! `database.shard_lease`. The holder runs that shard's outbox timer, sweep, retention and
//! ledger executor (a [`Daemon`] over the shard's URL); nobody else does, so no shard is swept
//! twice, and a shard whose holder dies is taken by another daemon when its lease lapses, so
//! none is left without one. The shard lease decides who works; the claims and the
//! compare-and-set still decide what happens: a daemon that stalled past its lease and still
//! works a shard for a moment can only lose its claims and find orders already closed.
//!
//! Daemons share the shards fairly: each announces itself with a `daemon:<id>` lease in every
//! shard it reaches, reads how many daemons are present, holds at most ⌈shards ÷ daemons⌉
//! shards and gives up the surplus (its shard daemon stopped first, then the lease released).
//! Orders addressed by id (the HTTP endpoint's paid callback and payment attempts) are routed
//! to their shard by `database.routing` ([`route`]), whoever holds it.

pub mod route;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::clock::Clock;
use crate::config::Config;
use crate::daemon::{Daemon, StartError};
use crate::db::{Db, maintenance_lease};
use crate::effects::EffectRunner;

/// The lease each shard's worker holds (a row of the shard's `maintenance_lease`).
const SHARD_LEASE: &str = "shard";
/// The prefix of each daemon's presence lease.
const PRESENCE: &str = "daemon:";

/// A running sharded daemon.
pub struct Sharded {
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
    http_addr: Option<std::net::SocketAddr>,
    held: watch::Receiver<Vec<String>>,
    dbs: Vec<Db>,
}

/// One shard as the supervisor sees it.
struct Shard {
    name: String,
    db: Db,
    /// The shard's own config: `database.url` set to the shard's, no listeners.
    config: Config,
    /// The shard's daemon while this process holds the shard.
    running: Option<Daemon>,
}

impl Sharded {
    /// Connects to every shard (migrating each when `database.migrate`, and refusing a shard
    /// the engine check refuses), opens the HTTP endpoint routing by order id, and starts the
    /// supervisor that takes, keeps and shares the shards.
    ///
    /// # Errors
    /// [`StartError`] naming the shard that could not be set up (`shard ds_1: …`).
    pub async fn start(config: &Config, clock: Clock) -> Result<Sharded, StartError> {
        // Every merchant's plugin loads once, before any shard is taken: a bad file stops
        // start-up, and a shard taken over later starts deciding at once (no compile).
        let policies = crate::policies::load(config)?;
        let mut shards = Vec::new();
        let mut front = Vec::new();
        for s in &config.database.shards {
            let named = |e: String| StartError::Shard(s.name.clone(), e);
            let db = Db::connect(&s.url, config.database.max_connections)
                .await
                .map_err(|e| named(e.to_string()))?;
            if config.database.migrate {
                db.migrate().await.map_err(|e| named(e.to_string()))?;
            }
            let engine = crate::db::engine::inspect(&db)
                .await
                .map_err(|e| named(e.to_string()))?;
            let refusals = engine.refusals();
            if !refusals.is_empty() {
                return Err(named(StartError::Unsafe(refusals).to_string()));
            }
            let mut own = config.clone();
            own.database.url = s.url.clone();
            own.database.shards = Vec::new();
            // Migrated above, once; the listeners are the process's, not the shard's.
            own.database.migrate = false;
            own.http = None;
            // One watcher for the process (below), not one per shard.
            own.runtime.watch_plugins = Duration::ZERO;
            let effects = EffectRunner::from_config(db.clone(), clock.clone(), &own)
                .await
                .map_err(|e| named(format!("effects: {e}")))?;
            front.push((s.name.clone(), db.clone(), effects));
            shards.push(Shard {
                name: s.name.clone(),
                db,
                config: own,
                running: None,
            });
        }
        let dbs = shards.iter().map(|s| s.db.clone()).collect();
        let (shutdown, rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
        let mut http_addr = None;
        if let Some(http) = &config.http {
            let listener = tokio::net::TcpListener::bind(http.listen)
                .await
                .map_err(|e| StartError::Listen("http.listen", http.listen, e))?;
            http_addr = listener.local_addr().ok();
            let state = crate::http::HttpState::sharded(front, config);
            tasks.spawn(crate::http::serve(listener, state, rx.clone()));
        }
        if !config.runtime.watch_plugins.is_zero() {
            tasks.spawn(crate::policies::watch(
                policies.clone(),
                config.runtime.watch_plugins,
                rx.clone(),
            ));
        }
        let (held_tx, held) = watch::channel(Vec::new());
        let holder = format!(
            "{}-pid{}-{:08x}",
            hostname(),
            std::process::id(),
            fastrand::u32(..)
        );
        tasks.spawn(supervise(
            shards,
            policies,
            holder,
            clock,
            config.database.shard_lease,
            held_tx,
            rx,
        ));
        tracing::info!(
            shards = config.database.shards.len(),
            routing = ?config.database.routing,
            "timeoutd started (sharded)"
        );
        Ok(Sharded {
            shutdown,
            tasks,
            http_addr,
            held,
            dbs,
        })
    }

    /// Where the HTTP endpoint listens.
    pub fn http_addr(&self) -> Option<std::net::SocketAddr> {
        self.http_addr
    }

    /// The names of the shards this process holds now.
    pub fn held(&self) -> Vec<String> {
        self.held.borrow().clone()
    }

    /// Stops the supervisor (each held shard's daemon drained and its lease released) and the
    /// HTTP endpoint.
    pub async fn stop(mut self) {
        let _ = self.shutdown.send(true);
        while self.tasks.join_next().await.is_some() {}
        for db in &self.dbs {
            db.close().await;
        }
        tracing::info!("timeoutd stopped (sharded)");
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "host".to_string())
}

/// The supervisor: every third of the lease, announce this daemon, renew the shards it holds
/// (stopping the work of any it lost), give up a surplus over its fair share, and take free
/// shards up to it.
async fn supervise(
    mut shards: Vec<Shard>,
    policies: Arc<crate::policies::Policies>,
    holder: String,
    clock: Clock,
    lease: Duration,
    held: watch::Sender<Vec<String>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
    let presence = format!("{PRESENCE}{holder}");
    loop {
        // Presence, and how many daemons share the shards.
        let mut daemons = 1;
        for s in &shards {
            let Ok(now) = clock.now_ms(&s.db).await else {
                continue;
            };
            if maintenance_lease::take_lease(&s.db, &presence, &holder, now, now + lease_ms)
                .await
                .is_ok()
                && let Ok(n) = maintenance_lease::live_holders(&s.db, PRESENCE, now).await
            {
                daemons = daemons.max(n);
            }
        }
        let fair = shards
            .len()
            .div_ceil(usize::try_from(daemons).unwrap_or(1).max(1));
        // Renew what is held; a shard whose renewal is refused or fails is no longer ours.
        for s in shards.iter_mut().filter(|s| s.running.is_some()) {
            if !renew(s, &holder, &clock, lease_ms).await {
                tracing::warn!(shard = %s.name, "shard lease lost; stopping its work");
                if let Some(d) = s.running.take() {
                    d.stop().await;
                }
            }
        }
        // Give up the surplus, last shards first: stop the work, then free the lease.
        let mut holding = shards.iter().filter(|s| s.running.is_some()).count();
        for s in shards.iter_mut().rev() {
            if holding <= fair {
                break;
            }
            if let Some(d) = s.running.take() {
                d.stop().await;
                let _ = maintenance_lease::release_lease(&s.db, SHARD_LEASE, &holder).await;
                tracing::info!(shard = %s.name, daemons, "shard handed over (fair share {fair})");
                holding -= 1;
            }
        }
        // Take free shards up to the fair share.
        for s in shards.iter_mut().filter(|s| s.running.is_none()) {
            if holding >= fair {
                break;
            }
            if !renew(s, &holder, &clock, lease_ms).await {
                continue;
            }
            match Daemon::start_with(&s.config, clock.clone(), policies.clone()).await {
                Ok(d) => {
                    tracing::info!(shard = %s.name, "shard taken");
                    s.running = Some(d);
                    holding += 1;
                }
                Err(e) => {
                    tracing::error!(shard = %s.name, error = %e, "shard taken but its work could not start; freeing it");
                    let _ = maintenance_lease::release_lease(&s.db, SHARD_LEASE, &holder).await;
                }
            }
        }
        held.send_replace(
            shards
                .iter()
                .filter(|s| s.running.is_some())
                .map(|s| s.name.clone())
                .collect(),
        );
        if crate::shutdown::sleep_or_shutdown(crate::lease::renew_every(lease), &mut shutdown).await
        {
            break;
        }
    }
    for s in &mut shards {
        if let Some(d) = s.running.take() {
            d.stop().await;
            let _ = maintenance_lease::release_lease(&s.db, SHARD_LEASE, &holder).await;
        }
        let _ = maintenance_lease::release_lease(&s.db, &presence, &holder).await;
    }
}

/// Takes or renews `s`'s shard lease for `holder`, by the shard's own clock.
async fn renew(s: &Shard, holder: &str, clock: &Clock, lease_ms: i64) -> bool {
    let Ok(now) = clock.now_ms(&s.db).await else {
        return false;
    };
    maintenance_lease::take_lease(&s.db, SHARD_LEASE, holder, now, now + lease_ms)
        .await
        .unwrap_or(false)
}
