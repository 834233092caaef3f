//! Wiring: database, plugins, dispatcher and the trigger sources, started and stopped together.

use std::sync::Arc;

use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;

use crate::clock::Clock;
use crate::config::Config;
use crate::context::Context;
use crate::db::{Db, DbError};
use crate::dispatch::Dispatcher;
use crate::effects::EffectRunner;
use crate::sources::{self, outbox::Waker};

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The database is unreachable or its schema could not be applied.
    #[error(transparent)]
    Db(DbError),
    /// The database's schema is one this build will not run on — migrated past this build's
    /// compatibility window, or a migration half-applied — in one line naming the versions and
    /// what to run (`timeoutd run` exits [`crate::cli::EXIT_SCHEMA`]); or a migration gave up
    /// waiting for a lock (transient) ([`crate::db::migrate`]).
    #[error(transparent)]
    Schema(crate::db::migrate::SchemaError),
    /// The database server cannot run timeoutd safely (a Spider or non-InnoDB table, an engine
    /// without `SKIP LOCKED`): every reason, one per line ([`crate::db::engine`]).
    #[error("the database cannot run timeoutd safely:\n  {}", .0.join("\n  "))]
    Unsafe(Vec<String>),
    /// The database URL is behind a pooler that shares server connections between clients
    /// (PgBouncer `pool_mode = transaction`) and `database.pool_mode` does not say so: one line
    /// naming the key and what to set ([`crate::db::pooler::advice`]).
    #[error("{0}")]
    Pooler(String),
    /// A shard of `[[database.shards]]` could not be set up: its name and why.
    #[error("shard {0}: {1}")]
    Shard(String, String),
    /// The engine could not be built or a plugin could not be loaded.
    #[error(transparent)]
    Policies(#[from] crate::policies::SetupError),
    /// An effect executor (Redis, payment provider, channels) could not be set up.
    #[error("effects: {0}")]
    Effects(String),
    /// The RocketMQ transport could not start.
    #[error(transparent)]
    Broker(#[from] crate::rocketmq::TransportError),
    /// The admin API's token could not be read or made (`admin.token_file`).
    #[error("{0}")]
    Admin(String),
    /// The schema profile of `[database.shop]` does not fit the live schema (a missing table or
    /// column, a type it cannot read): every problem, one per line
    /// ([`crate::db::shop::check`]).
    #[error("database.shop: the schema profile does not fit the database:\n  {}", .0.join("\n  "))]
    Shop(Vec<String>),
    /// An HTTP endpoint could not listen: the config key (`http.listen` or `admin.listen`), the
    /// address and why (e.g. "Address already in use").
    #[error("{0} {1}: {2}")]
    Listen(&'static str, std::net::SocketAddr, std::io::Error),
}

impl From<DbError> for StartError {
    fn from(e: DbError) -> StartError {
        match e {
            DbError::Schema(e) => StartError::Schema(e),
            e => StartError::Db(e),
        }
    }
}

/// How [`prepare`] migrates: not at all, through the daemon's own pool, or through a URL of its
/// own (`database.migrate_url`: behind a transaction-mode pooler the migrator's session-level
/// lock needs a session).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Migrate<'a> {
    /// `database.migrate = false`.
    No,
    /// Through the pool checked.
    OnPool,
    /// Through this URL, on a connection of its own.
    Via(&'a str),
}

impl<'a> Migrate<'a> {
    /// What `migrate` and a database's `migrate_url` say.
    pub(crate) fn of(migrate: bool, migrate_url: Option<&'a str>) -> Migrate<'a> {
        match (migrate, migrate_url) {
            (false, _) => Migrate::No,
            (true, None) => Migrate::OnPool,
            (true, Some(url)) => Migrate::Via(url),
        }
    }
}

/// Checks that the database can run timeoutd safely ([`crate::db::engine`]) and, on
/// PostgreSQL with `database.pool_mode = "session"`, that its server connections are not shared
/// between clients ([`crate::db::pooler`]); applies the migrations as `migrate` says, and
/// checks again: refused before any DDL reaches, say, a Spider front, and refused after when a
/// migration made it so. Logs the engine's warnings. Without migrating it still refuses a
/// schema this build cannot run on ([`crate::db::migrate::check`]).
///
/// # Errors
/// [`StartError::Unsafe`] with every reason; [`StartError::Pooler`] behind an undeclared
/// transaction-mode pooler (also when a statement fails the way one makes it fail);
/// [`StartError::Schema`] for a schema outside this build's window or half-applied;
/// [`StartError::Db`] when the database cannot be read or migrated.
pub(crate) async fn prepare(db: &Db, migrate: Migrate<'_>) -> Result<(), StartError> {
    prepare_checked(db, migrate)
        .await
        .map_err(|e| pooler_refusal(e, db.pool_mode()))
}

/// A start-up error a pooler caused, as the one line saying what to set
/// ([`StartError::Pooler`]): named statements failing the way a shared server connection makes
/// them fail (when the probe was lucky, and only with `pool_mode = "session"`: with
/// "transaction" declared the error stands as it is), or a start-up parameter the pooler
/// refuses. Any other error as it is.
fn pooler_refusal(e: StartError, mode: crate::db::PoolMode) -> StartError {
    match e {
        StartError::Db(e)
            if e.is_shared_server_connection() && mode == crate::db::PoolMode::Session =>
        {
            StartError::Pooler(crate::db::pooler::advice("database.url"))
        }
        StartError::Db(e) => match e.refused_startup_parameter() {
            Some(p) => StartError::Pooler(crate::db::pooler::startup_parameter_advice(
                "database.url",
                &p,
            )),
            None => StartError::Db(e),
        },
        e => e,
    }
}

async fn prepare_checked(db: &Db, migrate: Migrate<'_>) -> Result<(), StartError> {
    if db.pool_mode() == crate::db::PoolMode::Transaction {
        tracing::info!(
            "database.pool_mode = \"transaction\": statements are prepared unnamed, each inside a transaction; migrations go through database.migrate_url"
        );
    }
    if db.pool_mode() == crate::db::PoolMode::Session
        && let crate::db::pooler::Sharing::Shared(seen) = crate::db::pooler::probe(db).await?
    {
        tracing::error!(%seen, "server connections are shared between clients");
        return Err(StartError::Pooler(crate::db::pooler::advice(
            "database.url",
        )));
    }
    let check = async || -> Result<crate::db::engine::Engine, StartError> {
        let engine = crate::db::engine::inspect(db).await?;
        let refusals = engine.refusals();
        if refusals.is_empty() {
            Ok(engine)
        } else {
            Err(StartError::Unsafe(refusals))
        }
    };
    let mut engine = check().await?;
    match migrate {
        Migrate::No => crate::db::migrate::check(db).await?,
        Migrate::OnPool => {
            db.migrate().await?;
            engine = check().await?;
        }
        Migrate::Via(url) => {
            // The migrator's advisory lock is a session's: refused on a shared URL too.
            let direct = Db::connect(url, 1).await?;
            let sharing = crate::db::pooler::probe(&direct).await;
            direct.close().await;
            if let crate::db::pooler::Sharing::Shared(_) = sharing? {
                return Err(StartError::Pooler(
                    crate::db::pooler::MIGRATE_URL_SHARED.to_string(),
                ));
            }
            db.migrate_through(Some(url)).await?;
            engine = check().await?;
        }
    }
    for warning in engine.warnings() {
        tracing::warn!("{warning}");
    }
    if let Some(g) = &engine.galera {
        tracing::info!(cluster_size = g.cluster_size, state = %g.state, "database is a Galera node; reads are causal (wsrep_sync_wait = 1)");
    }
    Ok(())
}

/// The pool over `database.url` every command that works on orders starts from (`run`, `arm`):
/// connected, then checked and migrated by [`prepare`] as `database.migrate` and
/// `database.migrate_url` say, so no command can skip the engine, pooler or schema checks.
///
/// # Errors
/// As [`prepare`]; the pool is closed first.
pub(crate) async fn open_database(config: &Config) -> Result<Db, StartError> {
    crate::db::names::serve(&config.database.table_prefix)?;
    let db = Db::connect_with(
        &config.database.url,
        config.database.pool_size(&config.database.url),
        config.database.pool_mode,
    )
    .await
    .map_err(|e| pooler_refusal(e.into(), config.database.pool_mode))?;
    let migrate = Migrate::of(
        config.database.migrate,
        config.database.migrate_url.as_deref(),
    );
    if let Err(e) = prepare(&db, migrate).await {
        db.close().await;
        return Err(e);
    }
    let db = db.with_schema(config.schema().map_err(StartError::Shop)?);
    if let Err(e) = check_shop(&db).await {
        db.close().await;
        return Err(e);
    }
    Ok(db)
}

/// A shop's schema profile checked against the live tables: refused with every problem, the
/// sweep's missing index logged as a warning with the statement that creates it.
///
/// # Errors
/// [`StartError::Shop`] listing the problems; [`StartError::Db`] when the catalog cannot be
/// read.
pub(crate) async fn check_shop(db: &Db) -> Result<(), StartError> {
    let Some(mapped) = db.schema().mapped() else {
        return Ok(());
    };
    let report = crate::db::shop::check::check(db, mapped).await?;
    if !report.problems.is_empty() {
        return Err(StartError::Shop(report.problems));
    }
    for advice in &report.advice {
        tracing::warn!("{advice}");
    }
    tracing::info!(
        profile = mapped.name(),
        "orders are the shop's own tables, through a schema profile"
    );
    Ok(())
}

/// Opens `http.listen`, when configured, serving the payment callbacks with `state()`; returns
/// the address bound (port 0 resolved).
///
/// # Errors
/// [`StartError::Listen`] when the address cannot be bound.
pub(crate) async fn serve_http(
    config: &Config,
    state: impl FnOnce() -> crate::http::HttpState,
    tasks: &mut JoinSet<()>,
    shutdown: &watch::Receiver<bool>,
) -> Result<Option<std::net::SocketAddr>, StartError> {
    let Some(http) = &config.http else {
        return Ok(None);
    };
    let listener = tokio::net::TcpListener::bind(http.listen)
        .await
        .map_err(|e| StartError::Listen("http.listen", http.listen, e))?;
    let addr = listener.local_addr().ok();
    tasks.spawn(crate::http::serve(listener, state(), shutdown.clone()));
    Ok(addr)
}

/// How long a stopping daemon waits for its database pool to close, after [`crate::shutdown::DRAIN`]
/// (a connection stuck in a statement is not waited for).
const POOL_CLOSE: std::time::Duration = std::time::Duration::from_millis(500);

/// A running daemon.
pub struct Daemon {
    db: Db,
    dispatcher: Arc<Dispatcher>,
    waker: Waker,
    shutdown: watch::Sender<bool>,
    tasks: JoinSet<()>,
    /// What each of `tasks` is, for the line that says what a stop abandoned (the HTTP
    /// listener's and the broker's tasks are not named one by one).
    names: std::collections::HashMap<tokio::task::Id, &'static str>,
    /// The ledger executor ([`crate::effects::worker::run`]).
    effects_worker: JoinSet<()>,
    http_addr: Option<std::net::SocketAddr>,
    admin_addr: Option<std::net::SocketAddr>,
    broker: Option<crate::rocketmq::Broker>,
}

impl Daemon {
    /// Connects, migrates (unless disabled), loads plugins and starts the outbox timer, the
    /// sweep and the ledger backlog runner, as configured.
    ///
    /// # Errors
    /// [`StartError`] naming what could not be set up.
    pub async fn start(config: &Config, clock: Clock) -> Result<Daemon, StartError> {
        // A merchant whose plugin does not load is held, the others served (`load_serving`).
        let (policies, _held) = crate::policies::load_serving(config)?;
        Self::start_with(config, clock, policies).await
    }

    /// As [`Daemon::start`], with the merchants' plugins already loaded: a sharded process
    /// ([`crate::shards`]) loads them once and starts a daemon per shard it takes, at once.
    ///
    /// # Errors
    /// [`StartError`] naming what could not be set up.
    pub async fn start_with(
        config: &Config,
        clock: Clock,
        policies: Arc<crate::policies::Policies>,
    ) -> Result<Daemon, StartError> {
        for warning in crate::effects::unexecuted(config) {
            tracing::warn!("{warning}");
        }
        let db = open_database(config).await?;
        Self::start_prepared(config, clock, policies, db).await
    }

    /// As [`Daemon::start_with`], on `db`, a pool of its own over a database already checked
    /// (and migrated) by [`prepare`]: a shard's worker starts the shard's daemon this way, with
    /// no round trip before its sources run.
    ///
    /// # Errors
    /// [`StartError`] naming what could not be set up.
    pub(crate) async fn start_prepared(
        config: &Config,
        clock: Clock,
        policies: Arc<crate::policies::Policies>,
        db: Db,
    ) -> Result<Daemon, StartError> {
        let transport = match &config.rocketmq {
            Some(r) => Some(crate::rocketmq::Transport::start(r).await?),
            None => None,
        };
        let mut effects = EffectRunner::from_config(db.clone(), clock.clone(), config)
            .await
            .map_err(StartError::Effects)?;
        if let Some(t) = &transport {
            effects = effects.with_rocketmq(t.clone());
        }
        let effects_wake = Arc::new(Notify::new());
        // The trigger's work ends at its commit: the ledger worker is woken to run effects.
        let dispatcher = Dispatcher::new(
            db.clone(),
            clock.clone(),
            policies.clone(),
            config.dispatch.clone(),
            effects_wake.clone(),
        );
        let dispatcher = Arc::new(
            crate::effects::with_provider(dispatcher, config).map_err(StartError::Effects)?,
        );
        // Metrics and the backlog sample serve the admin API and the alert rules.
        let observed = config.admin.is_some() || config.alerts.is_some();
        if observed {
            // Before any source runs: an event emitted before the recorder exists is not
            // counted (a daemon's first triggers were missing from `timeoutd_triggers_total`).
            crate::events::metrics_handle();
            crate::events::zero_series();
        }
        let waker: Waker = Arc::new(Notify::new());
        let (shutdown, rx) = watch::channel(false);
        // What every source and worker below shares, built once.
        let ctx = Context {
            db: db.clone(),
            clock: clock.clone(),
            policies: policies.clone(),
            dispatcher: dispatcher.clone(),
            waker: waker.clone(),
            shutdown: rx.clone(),
        };
        let mut tasks = JoinSet::new();
        let mut names = std::collections::HashMap::new();
        let sweep_tuning = watch::Sender::new(sources::sweep::SweepTuning::of(&config.sweep));
        if config.outbox.enabled {
            let task = tasks.spawn(sources::outbox::run(
                ctx.clone(),
                config.outbox.clone(),
                config.rocketmq.as_ref().map(|r| r.fallback_after),
            ));
            names.insert(task.id(), "the outbox timer");
        }
        let broker = match transport {
            Some(transport) => Some(
                crate::rocketmq::Broker::start(
                    transport,
                    &ctx,
                    crate::effects::resolutions(config),
                    &config.outbox,
                    &mut tasks,
                )
                .await?,
            ),
            None => None,
        };
        if config.sweep.enabled {
            let task = tasks.spawn(sources::sweep::run(
                ctx.clone(),
                config.sweep.clone(),
                sweep_tuning.subscribe(),
            ));
            names.insert(task.id(), "the sweep");
        }
        if config.retention.enabled {
            let task = tasks.spawn(crate::retention::run(
                db.clone(),
                clock.clone(),
                config.retention.clone(),
                rx.clone(),
            ));
            names.insert(task.id(), "the retention pass");
        }
        // The stock journal's fold (with `mode = "direct"`: one fold of what a journal-mode run
        // left behind).
        let task = tasks.spawn(crate::stock_fold::run(
            db.clone(),
            clock.clone(),
            config.dispatch.stock.clone(),
            rx.clone(),
        ));
        names.insert(task.id(), "the stock journal's fold");
        let http_addr = serve_http(
            config,
            || {
                crate::http::HttpState::new(db.clone(), effects.clone(), config)
                    .with_after_commit(effects_wake.clone())
            },
            &mut tasks,
            &rx,
        )
        .await?;
        let (sample_tx, sample_rx) = watch::channel(crate::gauges::Sample::default());
        if observed {
            let intervals = [
                config
                    .admin
                    .as_ref()
                    .map(|a| (a.sample_interval, a.overdue_margin)),
                config
                    .alerts
                    .as_ref()
                    .map(|a| (a.interval, a.overdue_margin)),
            ];
            let alerts = match config.alerts.clone() {
                Some(a) => {
                    let (feed, task) = crate::alerts::Alerts::new(a)
                        .map_err(StartError::Effects)?
                        .spawn(&mut tasks, rx.clone());
                    names.insert(task, "the alert notices");
                    Some(feed)
                }
                None => None,
            };
            let (every, margin) = intervals
                .into_iter()
                .flatten()
                .min()
                .expect("one is configured");
            let task = tasks.spawn(crate::gauges::run(
                ctx.clone(),
                every,
                margin,
                config.merchants.keys().cloned().collect(),
                sample_tx,
                alerts,
            ));
            names.insert(task.id(), "the backlog sampling");
        }
        let mut admin_addr = None;
        if let Some(admin) = &config.admin {
            let listener = tokio::net::TcpListener::bind(admin.listen)
                .await
                .map_err(|e| StartError::Listen("admin.listen", admin.listen, e))?;
            admin_addr = listener.local_addr().ok();
            let (tokens, file) = crate::admin::tokens(admin).map_err(StartError::Admin)?;
            if let Some(file) = file {
                tracing::info!(path = %file.display(), "admin console token (name `console`) is in this file");
            }
            let state = crate::admin::AdminState::new(
                &ctx,
                effects.clone(),
                sweep_tuning.clone(),
                sample_rx,
                admin,
                &tokens,
            );
            let task = tasks.spawn(crate::admin::serve(listener, state, rx.clone()));
            names.insert(task.id(), "the admin API");
        }
        let task = tasks.spawn(crate::policies::watch(policies.clone(), config, rx.clone()));
        names.insert(task.id(), "the plugin file watcher");
        // A set of its own: [`Daemon::stop`] waits for it before the transports it sends through
        // (and, as `tasks`, it is aborted when the daemon is dropped unstopped).
        let mut effects_worker = JoinSet::new();
        effects_worker.spawn(crate::effects::worker::run(effects, effects_wake, rx));
        tracing::info!(merchants = config.merchants.len(), backend = ?db.backend(), "timeoutd started");
        Ok(Daemon {
            db,
            dispatcher,
            waker,
            shutdown,
            tasks,
            names,
            effects_worker,
            http_addr,
            admin_addr,
            broker,
        })
    }

    /// The RocketMQ transport, when `[rocketmq]` is configured.
    pub fn broker(&self) -> Option<&crate::rocketmq::Broker> {
        self.broker.as_ref()
    }

    /// The database.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The dispatcher (for triggers from outside the built-in sources).
    pub fn dispatcher(&self) -> &Arc<Dispatcher> {
        &self.dispatcher
    }

    /// Where the HTTP endpoint listens (with the port chosen when `http.listen` asked for 0).
    pub fn http_addr(&self) -> Option<std::net::SocketAddr> {
        self.http_addr
    }

    /// Where the admin API listens.
    pub fn admin_addr(&self) -> Option<std::net::SocketAddr> {
        self.admin_addr
    }

    /// Wakes the outbox timer after writing a row in this process.
    pub fn waker(&self) -> Waker {
        self.waker.clone()
    }

    /// Stops every source, letting batches in flight finish, then closes the pool, all within
    /// [`crate::shutdown::DRAIN`] ([`Daemon::stop_within`]). The ledger executor stops first (the
    /// chunk in hand finished, the rest left PENDING), before the RocketMQ transport its notices
    /// go through: a burst's backlog sent into a client that is shutting down only failed, and
    /// each failure cost a ledger write.
    pub async fn stop(self) {
        self.stop_within(crate::shutdown::DRAIN).await;
    }

    /// [`Daemon::stop`], abandoning whatever has not finished within `limit` (a webhook or
    /// provider that hangs, a statement waiting on a lock): its tasks are aborted, their open
    /// transactions roll back and what they claimed comes back when its lease lapses. One line
    /// names what was abandoned.
    pub async fn stop_within(mut self, limit: std::time::Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        let _ = self.shutdown.send(true);
        let mut abandoned: Vec<&'static str> = Vec::new();
        let worker = async { while self.effects_worker.join_next().await.is_some() {} };
        if tokio::time::timeout_at(deadline, worker).await.is_err() {
            self.effects_worker.abort_all();
            abandoned.push("the ledger executor's effects in flight");
        }
        if let Some(broker) = self.broker.take()
            && tokio::time::timeout_at(deadline, broker.shutdown())
                .await
                .is_err()
        {
            abandoned.push("the RocketMQ client's shutdown");
        }
        loop {
            match tokio::time::timeout_at(deadline, self.tasks.join_next_with_id()).await {
                Ok(Some(Ok((id, ())))) => {
                    self.names.remove(&id);
                }
                Ok(Some(Err(e))) => {
                    self.names.remove(&e.id());
                }
                Ok(None) => break,
                Err(_) => {
                    let mut left: Vec<&'static str> = self.names.drain().map(|(_, n)| n).collect();
                    let unnamed = self.tasks.len().saturating_sub(left.len());
                    left.sort_unstable();
                    abandoned.extend(left);
                    if unnamed > 0 {
                        abandoned.push("the HTTP callbacks or RocketMQ tasks");
                    }
                    self.tasks.abort_all();
                    break;
                }
            }
        }
        if tokio::time::timeout(POOL_CLOSE, self.db.close())
            .await
            .is_err()
        {
            abandoned.push("database connections still in use");
        }
        if abandoned.is_empty() {
            tracing::info!("timeoutd stopped");
        } else {
            tracing::warn!(
                abandoned = %abandoned.join(", "),
                "timeoutd stopped after {limit:?}; abandoned work in flight (its transactions roll back; what it claimed comes back when its lease lapses)"
            );
        }
    }
}
