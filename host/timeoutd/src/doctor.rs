//! `timeoutd doctor --config F`: checks what operators get wrong, each finding with how to fix
//! it. It reads and probes (a write rolled back, a Redis `SET` with a TTL, TCP and HTTP
//! connects); it changes nothing. Exit status 1 when any finding is an error.
//!
//! Checked: the database (reachable, server version and `SKIP LOCKED`, schema version, write
//! privileges, character sets, the host clock against the database clock); Redis (writable,
//! an eviction policy that could drop idempotency markers); the broker's name servers
//! (reachable); every merchant's plugin (loads, its WIT stamp accepted); the payment provider
//! and every webhook (reachable); each configured payment provider's keys (parse) and answers
//! (a reference that cannot exist is "not found": [`providers`]).

mod providers;

use std::fmt;
use std::time::Duration;

use crate::config::Config;
use crate::db::migrate::{self, Fit};
use crate::db::{Backend, Db, doctor as probe};

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// As it should be.
    Ok,
    /// Works, but is likely to bite.
    Warn,
    /// Will not work.
    Error,
}

/// One finding: what was checked, what was found, and (unless it is fine) how to fix it.
#[derive(Debug, Clone)]
pub struct Finding {
    /// How bad.
    pub level: Level,
    /// What was checked, e.g. `database`, `redis`, `merchants.acme`.
    pub what: String,
    /// What was found.
    pub found: String,
    /// How to fix it, for a warning or an error.
    pub fix: Option<String>,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.level {
            Level::Ok => "ok   ",
            Level::Warn => "warn ",
            Level::Error => "error",
        };
        write!(f, "{level} {}: {}", self.what, self.found)?;
        if let Some(fix) = &self.fix {
            write!(f, "\n      fix: {fix}")?;
        }
        Ok(())
    }
}

fn ok(what: &str, found: impl Into<String>) -> Finding {
    Finding {
        level: Level::Ok,
        what: what.to_string(),
        found: found.into(),
        fix: None,
    }
}

fn bad(level: Level, what: &str, found: impl Into<String>, fix: impl Into<String>) -> Finding {
    Finding {
        level,
        what: what.to_string(),
        found: found.into(),
        fix: Some(fix.into()),
    }
}

/// Largest disagreement between the host clock and the database clock left unreported, ms.
const CLOCK_SKEW_MS: i64 = 1_000;
/// Timeout of each reachability probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Runs every check for `config`, in the order of the module's list.
pub async fn examine(config: &Config) -> Vec<Finding> {
    let mut findings = Vec::new();
    if config.database.shards.is_empty() {
        findings.extend(database(config).await);
    }
    // Each shard as a database of its own, its findings named `database.shards.<name>…`.
    for shard in &config.database.shards {
        let mut one = config.clone();
        one.database.url = shard.url.clone();
        one.database.migrate_url = shard.migrate_url.clone();
        one.database.shards = Vec::new();
        findings.extend(database(&one).await.into_iter().map(|mut f| {
            f.what = f
                .what
                .replacen("database", &format!("database.shards.{}", shard.name), 1);
            f.what = f
                .what
                .replacen("clock", &format!("database.shards.{}.clock", shard.name), 1);
            f
        }));
    }
    findings.extend(redis(config).await);
    findings.extend(broker(config).await);
    findings.extend(plugins(config));
    findings.extend(endpoints(config).await);
    findings.extend(providers::check(config).await);
    findings
}

async fn database(config: &Config) -> Vec<Finding> {
    let url = redact(&config.database.url);
    // A server that refuses or drops the connection says so at once over plain TCP (the
    // driver's pool would retry until its timeout and report only that).
    if let Some(addr) = server_addr(&config.database.url) {
        let reached =
            tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(&addr)).await;
        let problem = match reached {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(format!("{url}: {addr}: {e}")),
            Err(_) => Some(format!("{url}: {addr}: no answer within {PROBE_TIMEOUT:?}")),
        };
        if let Some(problem) = problem {
            return vec![bad(
                Level::Error,
                "database",
                problem,
                "check database.url, and that the server runs and listens there",
            )];
        }
    }
    let connect = Db::connect_with(&config.database.url, 2, config.database.pool_mode);
    let db = match tokio::time::timeout(PROBE_TIMEOUT * 2, connect).await {
        Ok(Ok(db)) => db,
        Ok(Err(e)) => {
            let fix = match e.refused_startup_parameter() {
                Some(p) => format!(
                    "a pooler (PgBouncer) refuses the driver's start-up parameter {p}: add \
                     `ignore_startup_parameters = {p}` to pgbouncer.ini and reload it"
                ),
                None => "check database.url, that the server runs and listens there, and the \
                         credentials"
                    .to_string(),
            };
            return vec![bad(Level::Error, "database", format!("{url}: {e}"), fix)];
        }
        Err(_) => {
            return vec![bad(
                Level::Error,
                "database",
                format!("{url}: no answer within {:?}", PROBE_TIMEOUT * 2),
                "check database.url and that nothing (a firewall) drops the connection",
            )];
        }
    };
    let mut out = vec![ok("database", format!("{url} reachable"))];
    out.extend(pooling(config, &db).await);
    out.extend(shop(config, &db).await);
    match crate::db::engine::inspect(&db).await {
        Ok(engine) => {
            out.push(server(db.backend(), &engine.version));
            out.extend(engine.refusals().into_iter().map(|r| {
                bad(
                    Level::Error,
                    "database.engine",
                    r,
                    "timeoutd refuses to start on this database (docs/scaling.md, \"Distributed engines\")",
                )
            }));
            out.extend(engine.warnings().into_iter().map(|w| {
                bad(
                    Level::Warn,
                    "database.galera",
                    w,
                    "check the node with SHOW STATUS LIKE 'wsrep%'",
                )
            }));
            if let Some(g) = engine
                .galera
                .as_ref()
                .filter(|_| engine.warnings().is_empty())
            {
                out.push(ok(
                    "database.galera",
                    format!(
                        "a {} node of a {}-node cluster, {}; reads causal (wsrep_sync_wait = {})",
                        g.state, g.cluster_size, g.status, g.sync_wait
                    ),
                ));
            }
        }
        Err(e) => out.push(bad(
            Level::Warn,
            "database.version",
            e.to_string(),
            "grant the daemon's user access to the server's version and information_schema",
        )),
    }
    let latest = crate::db::latest_schema_version(db.backend());
    let schema = probe::schema_state(&db).await;
    let fit = schema
        .as_ref()
        .map(|state| migrate::assess(state.as_ref(), db.backend()));
    let migrated = matches!(fit, Ok(Ok(Fit::Current | Fit::Newer { .. })));
    if let Ok(Some(h)) = schema
        .as_ref()
        .map(|s| s.as_ref().and_then(|s| s.half_applied.as_ref()))
        && let Some(at) = h.resume_at
        && matches!(fit, Ok(Ok(_)))
    {
        out.push(bad(
            Level::Warn,
            "database.schema",
            format!(
                "migration {} ({}) stopped at statement {} on a lock-wait timeout (statements \
                 before it are applied)",
                h.version,
                h.description,
                at + 1
            ),
            "the next start resumes it there; end the long transaction holding its tables first",
        ));
    }
    match fit {
        Ok(Ok(Fit::Current)) => out.push(ok(
            "database.schema",
            format!("version {latest}, as this build expects"),
        )),
        Ok(Ok(Fit::Newer {
            database,
            compatible_from,
            written_by,
        })) => out.push(bad(
            Level::Warn,
            "database.schema",
            format!(
                "version {database} (migrated by timeoutd {written_by}), newer than this \
                 build's {latest}; inside its compatibility window (from {compatible_from}), so \
                 this build runs without migrating"
            ),
            "upgrade this daemon to the build that migrated it when you can",
        )),
        Ok(Ok(Fit::Behind(found))) => out.push(bad(
            if config.database.migrate {
                Level::Warn
            } else {
                Level::Error
            },
            "database.schema",
            format!(
                "version {}, this build migrates to {latest}",
                found.map_or("none".to_string(), |v| v.to_string())
            ),
            if config.database.migrate {
                "the daemon migrates it at start (database.migrate = true)"
            } else {
                "set database.migrate = true, or apply host/timeoutd/migrations by hand"
            },
        )),
        Ok(Err(refused)) => out.push(bad(
            Level::Error,
            "database.schema",
            refused.finding(),
            refused.recovery(),
        )),
        Err(e) => out.push(bad(
            Level::Error,
            "database.schema",
            e.to_string(),
            "grant the daemon's user read access to _sqlx_migrations and timeoutd_schema",
        )),
    }
    if migrated {
        match probe::probe_write(&db).await {
            Ok(()) => out.push(ok(
                "database.privileges",
                "insert, update and delete allowed (probed, rolled back)",
            )),
            Err(e) => out.push(bad(
                Level::Error,
                "database.privileges",
                e.to_string(),
                "grant the daemon's user SELECT, INSERT, UPDATE, DELETE on the database",
            )),
        }
    }
    match probe::charsets(&db).await {
        Ok(_) if db.backend() != Backend::MySql => {
            out.push(ok(
                "database.charset",
                "UTF-8 (the only encoding this backend stores text in)",
            ));
        }
        Ok((default, tables)) if tables.is_empty() && default.starts_with("utf8mb4") => {
            out.push(ok(
                "database.charset",
                format!("{default}, every table utf8mb4"),
            ));
        }
        // Sharing the shop's database (a table prefix): its default is the shop's business.
        Ok((default, tables)) if tables.is_empty() && !crate::db::names::prefix().is_empty() => {
            out.push(ok(
                "database.charset",
                format!(
                    "timeoutd's tables ({}*) utf8mb4; the shop's database default {default} left as the shop set it",
                    crate::db::names::prefix()
                ),
            ));
        }
        Ok((default, tables)) => {
            let list: Vec<String> = tables.iter().map(|(t, c)| format!("{t} ({c})")).collect();
            out.push(bad(
                Level::Error,
                "database.charset",
                format!("database default {default}; not utf8mb4: {}", if list.is_empty() { "none".into() } else { list.join(", ") }),
                "let the daemon migrate (migration 9 converts every table to utf8mb4_bin), or ALTER DATABASE … CHARACTER SET utf8mb4",
            ));
        }
        Err(e) => out.push(bad(
            Level::Warn,
            "database.charset",
            e.to_string(),
            "grant read access to information_schema",
        )),
    }
    match db.now_ms().await {
        Ok(db_now) => {
            let skew = host_now_ms() - db_now;
            if skew.abs() <= CLOCK_SKEW_MS {
                out.push(ok(
                    "clock",
                    format!("host and database agree within {} ms", skew.abs()),
                ));
            } else {
                out.push(bad(
                    Level::Warn,
                    "clock",
                    format!("the host clock is {skew} ms off the database clock"),
                    "run NTP (chrony, systemd-timesyncd) on both; timeoutd times closes by the database clock, but logs and the broker's timers use the host's",
                ));
            }
        }
        Err(e) => out.push(bad(
            Level::Warn,
            "clock",
            e.to_string(),
            "the database clock could not be read",
        )),
    }
    db.close().await;
    out
}

/// The server version and whether it has `SELECT … FOR UPDATE SKIP LOCKED` (MariaDB 10.6,
/// MySQL 8.0.1, PostgreSQL 9.5; SQLite has one writer and needs none). Engines that report a
/// MySQL 8 version without its `SKIP LOCKED` (TiDB, Vitess) are refused by
/// [`crate::db::engine::Engine::refusals`].
/// PostgreSQL: whether the server connections behind `database.url` are shared between clients
/// (a transaction-mode pooler, [`crate::db::pooler`]) and `database.pool_mode` says so, and that
/// `database.migrate_url` is a session of its own.
async fn pooling(config: &Config, db: &Db) -> Vec<Finding> {
    use crate::db::PoolMode;
    use crate::db::pooler::{self, Sharing};
    if db.backend() != Backend::Postgres {
        return Vec::new();
    }
    let mode = config.database.pool_mode;
    let mut out = Vec::new();
    let sharing = tokio::time::timeout(PROBE_TIMEOUT * 2, pooler::probe(db)).await;
    out.push(match (sharing, mode) {
        (Ok(Ok(Sharing::Shared(seen))), PoolMode::Session) => bad(
            Level::Error,
            "database.pool_mode",
            format!(
                "\"session\", but server connections are shared between clients from one \
                 transaction to the next, as behind PgBouncer in pool_mode = transaction ({seen}); \
                 timeoutd's named statements then fail (prepared statement \"sqlx_s_1\" already \
                 exists) or run another client's"
            ),
            "set database.pool_mode = \"transaction\" and database.migrate_url to a direct (or \
             session-mode) URL of the database for the migrations; or point database.url at a \
             session-mode pool",
        ),
        (Ok(Ok(Sharing::Shared(_))), PoolMode::Transaction) => ok(
            "database.pool_mode",
            "\"transaction\": server connections are shared between clients (a transaction-mode \
             pooler); statements are unnamed, each inside a transaction",
        ),
        (Ok(Ok(Sharing::Private)), PoolMode::Session) => ok(
            "database.pool_mode",
            "\"session\": each connection keeps its server connection",
        ),
        (Ok(Ok(Sharing::Private)), PoolMode::Transaction) => ok(
            "database.pool_mode",
            "\"transaction\": statements are unnamed, each inside a transaction (no sharing seen \
             here; \"session\" would save round trips on a direct connection)",
        ),
        (Ok(Err(e)), _) => bad(
            Level::Warn,
            "database.pool_mode",
            format!("could not probe whether server connections are shared: {e}"),
            "check that the database accepts two more connections",
        ),
        (Err(_), _) => bad(
            Level::Warn,
            "database.pool_mode",
            format!(
                "the sharing probe got no answer within {:?}",
                PROBE_TIMEOUT * 2
            ),
            "check the pooler's pool sizes and the server's load",
        ),
    });
    let Some(migrate_url) = &config.database.migrate_url else {
        return out;
    };
    let shown = redact(migrate_url);
    let direct = tokio::time::timeout(PROBE_TIMEOUT * 2, async {
        let direct = Db::connect(migrate_url, 1).await?;
        let sharing = pooler::probe(&direct).await;
        direct.close().await;
        sharing
    })
    .await;
    out.push(match direct {
        Ok(Ok(Sharing::Private)) => ok(
            "database.migrate_url",
            format!("{shown} reachable, a session of its own"),
        ),
        Ok(Ok(Sharing::Shared(seen))) => bad(
            Level::Error,
            "database.migrate_url",
            format!("{shown}: server connections are shared between clients ({seen})"),
            "point database.migrate_url at the database itself or at a session-mode pool: the \
             migrations hold a session-level lock",
        ),
        Ok(Err(e)) => bad(
            Level::Error,
            "database.migrate_url",
            format!("{shown}: {e}"),
            "check database.migrate_url, that the server runs and listens there, and the \
             credentials",
        ),
        Err(_) => bad(
            Level::Error,
            "database.migrate_url",
            format!("{shown}: no answer within {:?}", PROBE_TIMEOUT * 2),
            "check database.migrate_url and that nothing drops the connection",
        ),
    });
    out
}

/// `[database.shop]`: the schema profile against the live tables (every problem an error, the
/// sweep's missing index a warning with its `CREATE INDEX`).
async fn shop(config: &Config, db: &Db) -> Vec<Finding> {
    const WHAT: &str = "database.shop";
    let schema = match config.schema() {
        Ok(schema) => schema,
        Err(problems) => {
            return problems
                .into_iter()
                .map(|p| bad(Level::Error, WHAT, p, "fix the profile (docs/adoption.md)"))
                .collect();
        }
    };
    let Some(mapped) = schema.mapped() else {
        return Vec::new();
    };
    match crate::db::shop::check::check(db, mapped).await {
        Err(e) => vec![bad(
            Level::Error,
            WHAT,
            format!("information_schema could not be read: {e}"),
            "grant the daemon's user SELECT on the shop's tables",
        )],
        Ok(report) if report.problems.is_empty() && report.advice.is_empty() => vec![ok(
            WHAT,
            format!("profile `{}` fits the shop's tables", mapped.name()),
        )],
        Ok(report) => {
            let problems = report.problems.into_iter().map(|p| {
                bad(
                    Level::Error,
                    WHAT,
                    p,
                    "make the profile name the shop's real tables and columns (docs/adoption.md)",
                )
            });
            let advice = report.advice.into_iter().map(|a| {
                bad(
                    Level::Warn,
                    WHAT,
                    a,
                    "create the index named above, once, in a quiet hour",
                )
            });
            problems.chain(advice).collect()
        }
    }
}

fn server(backend: Backend, version: &str) -> Finding {
    let numbers: Vec<u32> = version
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .take(3)
        .filter_map(|s| s.parse().ok())
        .collect();
    let at_least = |want: &[u32]| numbers.as_slice() >= want;
    let (has, needs) = match backend {
        Backend::Sqlite => (true, "none needed"),
        Backend::MySql if version.contains("MariaDB") => (at_least(&[10, 6]), "MariaDB 10.6"),
        Backend::MySql => (at_least(&[8, 0, 1]), "MySQL 8.0.1"),
        Backend::Postgres => (at_least(&[9, 5]), "PostgreSQL 9.5"),
    };
    if has {
        ok(
            "database.version",
            format!(
                "{version} (SKIP LOCKED: {})",
                if backend == Backend::Sqlite {
                    "not needed"
                } else {
                    "yes"
                }
            ),
        )
    } else {
        bad(
            Level::Error,
            "database.version",
            format!("{version}: no SELECT … FOR UPDATE SKIP LOCKED"),
            format!("upgrade to {needs} or newer: several daemons claim rows with SKIP LOCKED"),
        )
    }
}

async fn redis(config: &Config) -> Vec<Finding> {
    let Some(r) = &config.redis else {
        return Vec::new();
    };
    let sale = match crate::effects::FlashSale::connect(r).await {
        Ok(sale) => sale,
        Err(e) => {
            return vec![bad(
                Level::Error,
                "redis",
                e,
                "check redis.url and that Redis runs there",
            )];
        }
    };
    let mut out = Vec::new();
    match tokio::time::timeout(PROBE_TIMEOUT, sale.ping()).await {
        Ok(Ok(())) => out.push(ok("redis", "writable (SET with a TTL)")),
        Ok(Err(e)) => out.push(bad(Level::Error, "redis", e, "point redis.url at the primary (a replica answers READONLY), or wait for the failover to finish")),
        Err(_) => out.push(bad(Level::Error, "redis", format!("no answer within {PROBE_TIMEOUT:?}"), "check redis.url and the network")),
    }
    match sale.eviction_warning().await {
        None => out.push(ok(
            "redis.eviction",
            "the idempotency markers cannot be evicted (noeviction, or no maxmemory)",
        )),
        Some(warning) => out.push(bad(
            Level::Warn,
            "redis.eviction",
            warning,
            "CONFIG SET maxmemory-policy noeviction (and in redis.conf), or give Redis more memory",
        )),
    }
    out
}

async fn broker(config: &Config) -> Vec<Finding> {
    let Some(r) = &config.rocketmq else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for addr in r
        .namesrv
        .split(';')
        .map(str::trim)
        .filter(|a| !a.is_empty())
    {
        match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(_)) => out.push(ok("rocketmq.namesrv", format!("{addr} reachable"))),
            Ok(Err(e)) => out.push(bad(
                Level::Error,
                "rocketmq.namesrv",
                format!("{addr}: {e}"),
                "start the name server (scripts/rocketmq start), or fix rocketmq.namesrv",
            )),
            Err(_) => out.push(bad(
                Level::Error,
                "rocketmq.namesrv",
                format!("{addr}: no answer within {PROBE_TIMEOUT:?}"),
                "check rocketmq.namesrv and the network",
            )),
        }
    }
    if out.iter().any(|f| f.level == Level::Error) {
        return out;
    }
    let inspection =
        match tokio::time::timeout(PROBE_TIMEOUT * 5, crate::rocketmq::inspect::inspect(r)).await {
            Ok(Ok(inspection)) => inspection,
            Ok(Err(e)) => {
                out.push(bad(
                    Level::Error,
                    "rocketmq",
                    e.to_string(),
                    "check that the broker is registered with the name server",
                ));
                return out;
            }
            Err(_) => {
                out.push(bad(
                    Level::Error,
                    "rocketmq",
                    "the admin reads did not finish in time",
                    "check the broker",
                ));
                return out;
            }
        };
    for (topic, queues) in &inspection.topics {
        match queues {
            Some(n) => out.push(ok("rocketmq.topics", format!("{topic}: {n} read queue(s)"))),
            None => out.push(bad(
                Level::Warn,
                "rocketmq.topics",
                format!("{topic}: no route (the topic does not exist yet)"),
                if r.create_topics {
                    "the daemon creates it at start (rocketmq.create_topics = true); a broker with autoCreateTopicEnable = false needs it made by hand (mqadmin updateTopic)".to_string()
                } else {
                    format!("create it: mqadmin updateTopic -n {} -c <cluster> -t {topic} (rocketmq.create_topics is off)", r.namesrv)
                },
            )),
        }
    }
    for ((group, ours), (_, seen)) in crate::rocketmq::inspect::groups(r)
        .iter()
        .zip(&inspection.groups)
    {
        let key = "rocketmq.consumer_group";
        match seen {
            Ok(g) if g.clients == 0 => {
                out.push(ok(key, format!("{group}: no client connected now")))
            }
            Ok(g) => {
                let foreign: Vec<String> = g
                    .subscriptions
                    .iter()
                    .filter(|(topic, expr)| topic != ours || expr != "*")
                    .map(|(topic, expr)| format!("{topic} ({expr})"))
                    .collect();
                if foreign.is_empty() {
                    out.push(ok(
                        key,
                        format!(
                            "{group}: {} client(s), all subscribed to {ours} (*)",
                            g.clients
                        ),
                    ));
                } else {
                    out.push(bad(
                        Level::Error,
                        key,
                        format!("{group}: {} client(s) share the group, subscribed to {} — timeoutd subscribes to {ours} (*)", g.clients, foreign.join(", ")),
                        "give timeoutd a consumer group of its own (rocketmq.consumer_group): a group's members must share one subscription, or RocketMQ hands some of timeoutd's messages to the other clients",
                    ));
                }
            }
            // A group nobody has joined is not online at the broker: nobody shares it.
            Err(e) if e.contains("not online") || e.contains("206") => {
                out.push(ok(key, format!("{group}: no client connected now")))
            }
            Err(e) => out.push(bad(
                Level::Warn,
                key,
                format!("{group}: its connections could not be read: {e}"),
                "check the broker (mqadmin consumerConnection -g GROUP shows the same)",
            )),
        }
    }
    out
}

fn plugins(config: &Config) -> Vec<Finding> {
    match crate::policies::load(config) {
        Ok(policies) => policies
            .all()
            .iter()
            .map(|p| {
                ok(
                    &format!("merchants.{}", p.merchant),
                    format!(
                        "plugin {} loads, timeout:policy@{} accepted",
                        p.plugin.name(),
                        p.plugin.api_version()
                    ),
                )
            })
            .collect(),
        Err(e) => vec![bad(
            Level::Error,
            "plugins",
            e.to_string(),
            "fix or replace the plugin named (timeoutd plugin check FILE says more)",
        )],
    }
}

async fn endpoints(config: &Config) -> Vec<Finding> {
    let mut targets: Vec<(String, String)> = Vec::new();
    if let Some(p) = &config.payment {
        if !p.base_url.is_empty() {
            targets.push(("payment.base_url".into(), p.base_url.clone()));
        }
        if let Some(s) = &p.stripe {
            targets.push(("payment.stripe.base_url".into(), s.base_url.clone()));
        }
        if let Some(a) = &p.alipay {
            targets.push(("payment.alipay.gateway".into(), a.gateway.clone()));
        }
        if let Some(w) = &p.wechatpay {
            targets.push(("payment.wechatpay.base_url".into(), w.base_url.clone()));
        }
    }
    for (name, channel) in &config.notify.channels {
        if let crate::config::ChannelConfig::Webhook { url, .. } = channel {
            targets.push((format!("notify.channels.{name}.url"), url.clone()));
        }
    }
    if let Some(a) = &config.alerts {
        targets.push(("alerts.webhook".into(), a.webhook.clone()));
    }
    // The daemon's own client: a redirect is reported, not followed (crate::outbound).
    let client = match crate::outbound::client("doctor", PROBE_TIMEOUT) {
        Ok(c) => c,
        Err(e) => {
            return vec![bad(
                Level::Error,
                "http",
                e,
                "the HTTP client could not be built",
            )];
        }
    };
    let mut out = Vec::new();
    for (key, url) in targets {
        match client.get(&url).send().await {
            Ok(answer) if answer.status().is_redirection() => {
                let location = answer
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("(no Location header)")
                    .to_string();
                out.push(bad(
                    Level::Warn,
                    &key,
                    format!("{url} redirects (HTTP {}) to {location}", answer.status().as_u16()),
                    "timeoutd never follows a redirect (a redirected POST arrives as a body-less GET), so every effect sent there fails and is retried: set the URL to the endpoint itself",
                ));
            }
            Ok(answer) => out.push(ok(&key, format!("{url} reachable (HTTP {})", answer.status().as_u16()))),
            Err(e) => out.push(bad(Level::Error, &key, format!("{url}: {e}"), "check the URL, DNS and that the service runs; effects to it wait in the ledger until it answers")),
        }
    }
    out
}

/// The host's clock, epoch ms: the doctor compares it with the database's.
#[expect(
    clippy::disallowed_methods,
    reason = "the doctor compares the host clock with the database clock; nothing is timed by it"
)]
fn host_now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// `HOST:PORT` of a MySQL or PostgreSQL URL (`mysql://user:pw@host:3306/db`), with the
/// backend's default port when none is given; `None` for SQLite.
fn server_addr(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let default_port = match scheme {
        "mysql" | "mariadb" => 3306,
        "postgres" | "postgresql" => 5432,
        _ => return None,
    };
    let authority = rest.split(['/', '?']).next()?;
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.is_empty() {
        return None;
    }
    Some(if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:{default_port}")
    })
}

/// `url` without its password.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::{Level, redact, server, server_addr};
    use crate::db::Backend;

    #[test]
    fn skip_locked_by_server_version() {
        let level = |b, v| server(b, v).level;
        assert_eq!(
            level(Backend::MySql, "10.11.19-MariaDB-0+deb12u1"),
            Level::Ok
        );
        assert_eq!(level(Backend::MySql, "10.5.2-MariaDB"), Level::Error);
        assert_eq!(level(Backend::MySql, "8.0.36"), Level::Ok);
        assert_eq!(level(Backend::MySql, "5.7.44"), Level::Error);
        assert_eq!(level(Backend::Postgres, "15.19"), Level::Ok);
        assert_eq!(level(Backend::Postgres, "9.4.26"), Level::Error);
    }

    #[test]
    fn server_addresses_and_redaction() {
        assert_eq!(
            server_addr("mysql://root@127.0.0.1:3306/test").as_deref(),
            Some("127.0.0.1:3306")
        );
        assert_eq!(
            server_addr("postgres://u:p@db.example/x?sslmode=disable").as_deref(),
            Some("db.example:5432")
        );
        assert_eq!(server_addr("sqlite://data/timeoutd.db"), None);
        assert_eq!(
            redact("mysql://u:secret@h:3306/d"),
            "mysql://u:***@h:3306/d"
        );
        assert_eq!(redact("mysql://u@h/d"), "mysql://u@h/d");
    }
}
