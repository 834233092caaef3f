//! Semantic checks of a parsed [`Config`]; every problem is collected before giving up.

use std::fmt;

use super::{Config, PluginSource};
use timeoutd_runtime::model::EffectKind;

/// Everything wrong with a configuration, each with the key path (or line) it concerns.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ConfigProblems {
    /// `(where, what)` pairs, in the order found.
    pub problems: Vec<(String, String)>,
}

impl ConfigProblems {
    /// A single problem.
    pub fn one(at: impl Into<String>, what: impl Into<String>) -> Self {
        ConfigProblems {
            problems: vec![(at.into(), what.into())],
        }
    }

    /// Records a problem.
    pub fn push(&mut self, at: impl Into<String>, what: impl Into<String>) {
        self.problems.push((at.into(), what.into()));
    }

    /// `Ok(value)` when nothing was recorded.
    ///
    /// # Errors
    /// `self` when any problem was recorded.
    pub fn into_result<T>(self, value: T) -> Result<T, ConfigProblems> {
        if self.problems.is_empty() {
            Ok(value)
        } else {
            Err(self)
        }
    }
}

impl fmt::Display for ConfigProblems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} problem(s) in the configuration:",
            self.problems.len()
        )?;
        for (at, what) in &self.problems {
            writeln!(f, "  - {at}: {what}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigProblems {}

/// Built-in plugin names accepted after `builtin:`.
pub const BUILTIN_PLUGINS: &[&str] = &["single-phase", "two-phase"];

/// `[database]`: one URL, or shards each with a URL and a unique name; every URL names a
/// supported backend and (for a server) a database.
fn database(c: &Config, p: &mut ConfigProblems) {
    let d = &c.database;
    if d.shop.is_some() {
        shop(c, p);
    }
    if let Err(e) = crate::db::names::check_prefix(&d.table_prefix) {
        p.push("database.table_prefix", e);
    }
    match (d.url.is_empty(), d.shards.is_empty()) {
        (true, true) => p.push(
            "database.url",
            "missing: give the database's URL, or list [[database.shards]]",
        ),
        (false, false) => p.push(
            "database.shards",
            "give either database.url or database.shards, not both",
        ),
        (false, true) => {
            url(&d.url, "database.url", p);
            migrate_url(d, &d.url, d.migrate_url.as_deref(), "database", p);
        }
        (true, false) => {
            if d.migrate_url.is_some() {
                p.push(
                    "database.migrate_url",
                    "give each shard its own migrate_url ([[database.shards]])",
                );
            }
            let mut names = std::collections::BTreeSet::new();
            let mut urls = std::collections::BTreeSet::new();
            for (i, shard) in d.shards.iter().enumerate() {
                if !urls.insert(shard.url.as_str()) {
                    p.push(
                        format!("database.shards[{i}].url"),
                        "names the same database as an earlier shard",
                    );
                }
                let at = format!("database.shards[{i}]");
                if shard.name.trim().is_empty() {
                    p.push(format!("{at}.name"), "must not be empty");
                } else if !names.insert(shard.name.as_str()) {
                    p.push(
                        format!("{at}.name"),
                        format!("`{}` names two shards", shard.name),
                    );
                }
                url(&shard.url, &format!("{at}.url"), p);
                migrate_url(d, &shard.url, shard.migrate_url.as_deref(), &at, p);
            }
            if d.shard_lease < std::time::Duration::from_secs(1) {
                p.push("database.shard_lease", "must be at least 1s");
            }
            for (key, set) in [
                ("admin", c.admin.is_some()),
                ("alerts", c.alerts.is_some()),
                ("rocketmq", c.rocketmq.is_some()),
            ] {
                if set {
                    p.push(
                        key,
                        format!(
                            "[{key}] is not available with database.shards yet: run a daemon per \
                             shard database (database.url) for it (docs/scaling.md)"
                        ),
                    );
                }
            }
        }
    }
}

/// `[database.shop]`: the profile compiled for the database (or for each shard, its problems
/// keyed by the shard), and the merchant a fixed-merchant profile names configured.
fn shop(c: &Config, p: &mut ConfigProblems) {
    use crate::db::shop::profile::MerchantSpec;
    let schemas: Vec<(String, Result<_, _>)> = match c.database.shards.is_empty() {
        true => vec![("database.shop".to_string(), c.schema())],
        false => c
            .database
            .shards
            .iter()
            .map(|s| (format!("database.shards.{}", s.name), c.shard_schema(s)))
            .collect(),
    };
    let mut fixed = None;
    for (at, schema) in schemas {
        match schema {
            Err(problems) => {
                for problem in problems {
                    p.push(at.clone(), problem);
                }
            }
            Ok(schema) => {
                if let Some(MerchantSpec::Fixed(name)) =
                    schema.mapped().map(|m| m.profile().orders.merchant.clone())
                {
                    fixed = Some(name);
                }
            }
        }
    }
    if let Some(name) = fixed.filter(|n| !c.merchants.contains_key(n)) {
        p.push(
            "database.shop",
            format!(
                "the profile gives every order to merchant `{name}`, which has no \
                 [merchants.{name}] table"
            ),
        );
    }
}

/// `pool_mode` and `migrate_url` of the database at `url` (`at`: `database` or
/// `database.shards[i]`): a transaction-mode pool on PostgreSQL migrates through a URL of its
/// own, a valid one of the same backend.
fn migrate_url(
    d: &super::DatabaseConfig,
    db_url: &str,
    migrate_url: Option<&str>,
    at: &str,
    p: &mut ConfigProblems,
) {
    let backend = crate::db::Backend::of_url(db_url).ok();
    let transaction = d.pool_mode == crate::db::PoolMode::Transaction;
    if transaction && backend.is_some_and(|b| b != crate::db::Backend::Postgres) {
        p.push(
            "database.pool_mode",
            "\"transaction\" is for PostgreSQL behind a pooler (PgBouncer); this database is not PostgreSQL",
        );
    }
    match migrate_url {
        None if transaction && d.migrate && backend == Some(crate::db::Backend::Postgres) => p
            .push(
                format!("{at}.migrate_url"),
                "required with database.pool_mode = \"transaction\" and database.migrate = true: a \
             direct (or session-mode) URL of the same database, for the migrations, which hold a \
             session-level lock; or set database.migrate = false and migrate by hand",
            ),
        None => {}
        Some(m) => {
            let key = format!("{at}.migrate_url");
            url(m, &key, p);
            if let (Ok(mb), Some(b)) = (crate::db::Backend::of_url(m), backend)
                && mb != b
            {
                p.push(
                    key,
                    "must name the same kind of database as the URL it migrates",
                );
            }
        }
    }
}

/// A database URL at `at`: a supported scheme, and for a server a database name.
fn url(url: &str, at: &str, p: &mut ConfigProblems) {
    match crate::db::Backend::of_url(url) {
        Err(e) => p.push(at, e.to_string()),
        Ok(crate::db::Backend::Sqlite) => {}
        Ok(_) => {
            let path = url.split_once("://").map_or("", |(_, rest)| rest);
            let database = path
                .split_once('/')
                .map_or("", |(_, db)| db.split('?').next().unwrap_or(""));
            if database.is_empty() {
                p.push(at, format!("`{url}` names no database (…/DBNAME)"));
            }
        }
    }
}

/// `[dispatch]`: a paused trigger is held for some time; `[dispatch.stock]`: the journal folds
/// at some pace, and only into timeoutd's own `sku_stock` (a schema profile's lock release is
/// guarded per close: `lock_stock >= units`).
fn dispatch(c: &Config, p: &mut ConfigProblems) {
    if c.dispatch.pause_recheck.is_zero() {
        p.push(
            "dispatch.pause_recheck",
            "must be longer than 0ms (a held trigger would be looked at again at once, forever)",
        );
    }
    let st = &c.dispatch.stock;
    if st.mode != super::StockMode::Journal {
        return;
    }
    if st.fold_interval.is_zero() {
        p.push("dispatch.stock.fold_interval", "must be longer than 0ms");
    }
    if st.fold_batch == 0 {
        p.push(
            "dispatch.stock.fold_batch",
            "must be at least 1 (rows per fold)",
        );
    }
    if c.database.shop.is_some() {
        p.push(
            "dispatch.stock.mode",
            "\"journal\" gives units back to timeoutd's own sku_stock only; with [database.shop] \
             a close releases the shop's stock itself, each line guarded in its own transaction \
             (use \"direct\")",
        );
    }
}

/// `[caps]` and each `[merchants.<m>.caps]`: known cap names, rates of at least 1, a channel
/// cap on a channel that exists, and Redis for a shared store.
fn caps(c: &Config, p: &mut ConfigProblems) {
    let tables = std::iter::once(("caps.per_second".to_string(), &c.caps.per_second)).chain(
        c.merchants
            .iter()
            .map(|(id, m)| (format!("merchants.{id}.caps"), &m.caps)),
    );
    for (at, table) in tables {
        for (name, rate) in table {
            let key = format!("{at}.\"{name}\"");
            if let Some(problem) = crate::kinds::cap_name_problem(name) {
                p.push(key.clone(), problem);
            } else if let Some(channel) = name.strip_prefix("notify.")
                && channel != "log"
                && !c.notify.channels.contains_key(channel)
            {
                p.push(
                    key.clone(),
                    format!("`{channel}` is not a channel of [notify.channels] (nor `log`)"),
                );
            }
            if *rate == 0 {
                p.push(
                    key,
                    "must be at least 1 (effects a second; leave the cap out for none)",
                );
            }
        }
    }
    if c.caps.store == super::CapStore::Redis && c.redis.is_none() {
        p.push(
            "caps.store",
            "\"redis\" shares the caps through [redis], which is not configured",
        );
    }
}

pub(super) fn validate(c: &Config) -> Result<(), ConfigProblems> {
    let mut p = ConfigProblems::default();
    database(c, &mut p);
    caps(c, &mut p);
    if c.database.max_connections == Some(0) {
        p.push("database.max_connections", "must be at least 1");
    }
    for (key, value) in [
        ("outbox.batch", c.outbox.batch),
        ("outbox.concurrency", c.outbox.concurrency),
        ("outbox.group_commit", c.outbox.group_commit),
        ("effects.concurrency", c.effects.concurrency),
        ("sweep.batch", c.sweep.batch),
        ("dispatch.max_attempts", c.dispatch.max_attempts),
        ("runtime.max_memory_mib", c.runtime.max_memory_mib),
        ("runtime.warm_max_calls", c.runtime.warm_max_calls),
    ] {
        if value == 0 {
            p.push(key, "must be at least 1");
        }
    }
    if c.runtime.trip_after == 0 {
        p.push("runtime.trip_after", "must be at least 1");
    }
    if c.outbox.lease.is_zero() {
        p.push("outbox.lease", "must be longer than 0s");
    }
    if c.outbox.idle_recheck.is_zero() {
        p.push("outbox.idle_recheck", "must be longer than 0s");
    }
    if c.sweep.interval.is_zero() {
        p.push("sweep.interval", "must be longer than 0s");
    }
    if c.runtime.deadline.is_zero() {
        p.push("runtime.deadline", "must be longer than 0ms");
    }
    if c.dispatch.retry_initial > c.dispatch.retry_max {
        p.push(
            "dispatch.retry_initial",
            "is longer than dispatch.retry_max",
        );
    }
    dispatch(c, &mut p);
    if c.sweep.enabled && !c.outbox.enabled {
        p.push(
            "sweep.enabled",
            "the sweep re-arms orders as outbox rows, so it needs outbox.enabled = true",
        );
    }
    if let Some(r) = &c.redis {
        match (&r.url, r.cluster.is_empty()) {
            (None, true) => p.push("redis", "give `url` (one Redis) or `cluster` (seed nodes)"),
            (Some(_), false) => p.push("redis", "give `url` or `cluster`, not both"),
            _ => {}
        }
        for (i, u) in r.url.iter().chain(&r.cluster).enumerate() {
            if !u.starts_with("redis://") && !u.starts_with("rediss://") {
                p.push(
                    format!("redis.url[{i}]"),
                    format!("`{u}` is not a redis:// URL"),
                );
            }
        }
    }
    super::payment::validate(c, &mut p);
    if let Some(r) = &c.redis
        && c.retention.enabled
        && c.retention.ledger < r.marker_ttl
    {
        p.push(
            "retention.ledger",
            format!(
                "{} is shorter than redis.marker_ttl ({}): a replay within the marker window must still find its ledger row",
                humantime::format_duration(c.retention.ledger),
                humantime::format_duration(r.marker_ttl)
            ),
        );
    }
    if let Some(t) = &c.tracing
        && !(t.otlp_endpoint.starts_with("http://") || t.otlp_endpoint.starts_with("https://"))
    {
        p.push(
            "tracing.otlp_endpoint",
            format!(
                "`{}` is not an http(s) URL (OTLP/HTTP, e.g. http://127.0.0.1:4318/v1/traces)",
                t.otlp_endpoint
            ),
        );
    }
    if c.retention.batch == 0 {
        p.push("retention.batch", "must be at least 1 (rows per statement)");
    }
    if let Some(pay) = &c.payment {
        for (key, rate) in [
            ("payment.max_queries_per_second", pay.max_queries_per_second),
            ("payment.max_calls_per_second", pay.max_calls_per_second),
        ] {
            if rate == 0 {
                p.push(key, "must be at least 1 (requests a second per merchant)");
            }
        }
    }
    for (name, channel) in &c.notify.channels {
        if let super::ChannelConfig::Webhook { url, .. } = channel
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            p.push(
                format!("notify.channels.{name}.url"),
                format!("`{url}` is not an http(s) URL"),
            );
        }
    }
    if let Some(r) = &c.rocketmq {
        r.validate(&mut p);
    }
    for (name, channel) in &c.notify.channels {
        if matches!(channel, super::ChannelConfig::Rocketmq) && c.rocketmq.is_none() {
            p.push(
                format!("notify.channels.{name}"),
                "kind = \"rocketmq\" needs a [rocketmq] section",
            );
        }
    }
    if let Some(payment) = &c.payment
        && payment.paid_channel != "log"
        && !c.notify.channels.contains_key(&payment.paid_channel)
    {
        p.push(
            "payment.paid_channel",
            format!(
                "`{}` is not a channel of [notify.channels] (nor `log`)",
                payment.paid_channel
            ),
        );
    }
    for (id, merchant) in &c.merchants {
        for (i, kind) in merchant.granted_effects.iter().flatten().enumerate() {
            if EffectKind::parse(kind).is_none() {
                p.push(
                    format!("merchants.{id}.granted_effects[{i}]"),
                    format!(
                        "`{kind}` is not an effect kind (one of {})",
                        EffectKind::names()
                    ),
                );
            }
        }
    }
    if let Some(admin) = &c.admin {
        if admin.tokens.values().all(String::is_empty) && admin.token_file.is_none() {
            p.push(
                "admin.tokens",
                "no token: give at least one, e.g. ops = \"${TIMEOUTD_ADMIN_TOKEN}\", or admin.token_file",
            );
        }
        for (name, token) in &admin.tokens {
            if !token.is_empty() && token.len() < 16 {
                p.push(format!("admin.tokens.{name}"), "shorter than 16 characters");
            }
        }
    }
    if let Some(alerts) = &c.alerts {
        if !(alerts.webhook.starts_with("http://") || alerts.webhook.starts_with("https://")) {
            p.push(
                "alerts.webhook",
                format!("`{}` is not an http(s) URL", alerts.webhook),
            );
        }
        if alerts.timeout.is_zero()
            || alerts.timeout > alerts.interval.max(std::time::Duration::from_secs(30))
        {
            p.push(
                "alerts.timeout",
                "must be longer than 0s and at most 30s (or alerts.interval, when longer): a notice slower than that is retried at the next evaluation",
            );
        }
        let mut seen = std::collections::HashSet::new();
        for (i, rule) in alerts.rules.iter().enumerate() {
            if !seen.insert(rule.name.as_str()) {
                p.push(
                    format!("alerts.rules[{i}].name"),
                    format!("`{}` is used twice", rule.name),
                );
            }
        }
    }
    if let Some(admin) = &c.admin
        && admin.sample_interval < std::time::Duration::from_millis(100)
    {
        p.push(
            "admin.sample_interval",
            "must be at least 100ms (each sample queries the database)",
        );
    }
    if let Some(alerts) = &c.alerts
        && alerts.interval < std::time::Duration::from_millis(100)
    {
        p.push(
            "alerts.interval",
            "must be at least 100ms (each evaluation queries the database)",
        );
    }
    if c.effects.retry_initial > c.effects.retry_max {
        p.push("effects.retry_initial", "is longer than effects.retry_max");
    }
    if c.effects.lease.is_zero() {
        p.push("effects.lease", "must be longer than 0s");
    }
    if let Some(r) = &c.redis {
        // The ledger may replay an effect as late as its last retry: every attempt waiting up
        // to retry_max, plus a lease's worth for the one running. A marker gone by then lets
        // the replay apply the Redis change twice.
        let horizon = c.effects.retry_max * c.effects.max_attempts.max(1) + c.effects.lease;
        let floor = horizon.max(std::time::Duration::from_secs(3600));
        if r.marker_ttl < floor {
            p.push(
                "redis.marker_ttl",
                format!(
                    "is {}, shorter than the ledger's replay horizon ({}: effects.max_attempts {} × \
                     effects.retry_max {} + effects.lease {}, and at least 1h): a retried effect \
                     could find its idempotency marker expired and apply twice; make it at least {}",
                    humantime::format_duration(r.marker_ttl),
                    humantime::format_duration(horizon),
                    c.effects.max_attempts,
                    humantime::format_duration(c.effects.retry_max),
                    humantime::format_duration(c.effects.lease),
                    humantime::format_duration(floor),
                ),
            );
        }
    }
    if c.runtime.deadline > std::time::Duration::from_secs(10) {
        p.push(
            "runtime.deadline",
            "must be at most 10s (a decision holds a worker thread)",
        );
    }
    if c.runtime.max_memory_mib > 4096 {
        p.push(
            "runtime.max_memory_mib",
            "must be at most 4096 (the engine reserves 4 GiB per memory)",
        );
    }
    if c.effects.max_attempts == 0 {
        p.push("effects.max_attempts", "must be at least 1");
    }
    if let Some(slots) = c.effects.merchant_slots
        && (slots == 0 || slots > c.effects.concurrency)
    {
        p.push(
            "effects.merchant_slots",
            format!(
                "must be 1 to effects.concurrency ({}): the most slots one merchant holds",
                c.effects.concurrency
            ),
        );
    }
    if c.merchants.is_empty() {
        p.push(
            "merchants",
            "no merchant is configured; add a [merchants.<id>] table",
        );
    }
    for (id, m) in &c.merchants {
        if let Some(shadow) = &m.shadow {
            plugin_exists(
                c.source_of(&shadow.plugin),
                format!("merchants.{id}.shadow.plugin"),
                &mut p,
            );
            if !(shadow.sample > 0.0 && shadow.sample <= 1.0) {
                p.push(
                    format!("merchants.{id}.shadow.sample"),
                    format!(
                        "{} is not a share of triggers: more than 0, at most 1 (0.1 is one in ten)",
                        shadow.sample
                    ),
                );
            }
        }
        plugin_exists(c.plugin_source(m), format!("merchants.{id}.plugin"), &mut p);
        for (key, template) in [
            ("flash_stock_key", &m.flash_stock_key),
            ("flash_users_key", &m.flash_users_key),
        ] {
            if !template.contains("<activity>") {
                p.push(
                    format!("merchants.{id}.{key}"),
                    format!("`{template}` has no `<activity>` placeholder"),
                );
            }
        }
        if let Some(d) = m.plugin_deadline
            && (d.is_zero() || d > std::time::Duration::from_secs(10))
        {
            p.push(
                format!("merchants.{id}.plugin_deadline"),
                "must be longer than 0ms and at most 10s (a decision holds a worker thread)",
            );
        }
        if let Some(mib) = m.plugin_max_memory_mib
            && !(1..=4096).contains(&mib)
        {
            p.push(
                format!("merchants.{id}.plugin_max_memory_mib"),
                "must be 1 to 4096 (the engine reserves 4 GiB per memory)",
            );
        }
        if !(1..=1000).contains(&m.weight) {
            p.push(
                format!("merchants.{id}.weight"),
                "must be 1 to 1000 (its share of the effect executor's slots against the others')",
            );
        }
        if m.payment_window.is_some_and(|w| w.is_zero()) {
            p.push(
                format!("merchants.{id}.payment_window"),
                "must be longer than 0s",
            );
        }
    }
    p.into_result(())
}

/// A plugin at `at` that is one of the built-ins or a file that exists.
fn plugin_exists(source: PluginSource, at: String, p: &mut ConfigProblems) {
    match source {
        PluginSource::Builtin(name) if !BUILTIN_PLUGINS.contains(&name.as_str()) => p.push(
            at,
            format!(
                "unknown built-in plugin `{name}` (have: {})",
                BUILTIN_PLUGINS.join(", ")
            ),
        ),
        PluginSource::File(path) if !path.is_file() => {
            p.push(at, format!("no plugin file at {}", path.display()))
        }
        _ => {}
    }
}
