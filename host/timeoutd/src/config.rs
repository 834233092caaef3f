//! The daemon's configuration file (TOML), its reference documentation and its validation.
//!
//! Loading is three steps, each reporting every problem it finds with its key path:
//! 1. `${VAR}` / `${VAR:-default}` interpolation from the environment ([`interpolate`]);
//! 2. parsing, with unknown keys refused (`deny_unknown_fields`) and durations written with
//!    units (`"500ms"`, `"30s"`, `"15m"`);
//! 3. semantic validation ([`validate`]): plugin files exist, numbers are in range, a URL names a
//!    supported backend.
//!
//! The doc comments on the fields below are the user reference; `config/timeoutd.toml` is the
//! annotated example and is tested to validate.

mod duration;
pub mod interpolate;
mod validate;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use validate::ConfigProblems;

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where orders, the outbox and the ledger live.
    pub database: DatabaseConfig,
    /// The outbox timer (`order_timeout_msg`).
    #[serde(default)]
    pub outbox: OutboxConfig,
    /// The sweep of overdue pending orders, the backstop for lost triggers.
    #[serde(default)]
    pub sweep: SweepConfig,
    /// How triggers are dispatched to plugins.
    #[serde(default)]
    pub dispatch: DispatchConfig,
    /// The plugin sandbox.
    #[serde(default)]
    pub runtime: RuntimeConfig,
    /// Merchants by id: which plugin decides their orders and with which settings.
    pub merchants: BTreeMap<String, MerchantConfig>,
    /// Directory the file was read from; relative plugin paths resolve against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// `[database]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseConfig {
    /// `sqlite://PATH` (created if missing) or `mysql://USER[:PASS]@HOST:PORT/DB` (MySQL or
    /// MariaDB 10.6+, for `SKIP LOCKED`).
    pub url: String,
    /// Pool size. (SQLite has one writer at a time whatever the pool size; extra connections
    /// serve reads.)
    #[serde(default = "defaults::max_connections")]
    pub max_connections: u32,
    /// Apply the schema migrations at start-up.
    #[serde(default = "defaults::yes")]
    pub migrate: bool,
}

/// `[outbox]`: claims due `order_timeout_msg` rows under a lease.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxConfig {
    /// Run the outbox timer.
    #[serde(default = "defaults::yes")]
    pub enabled: bool,
    /// Rows claimed per round.
    #[serde(default = "defaults::outbox_batch")]
    pub batch: u32,
    /// How long a claim is held; a daemon that dies mid-batch frees its rows after this.
    #[serde(default = "defaults::lease", with = "duration")]
    pub lease: Duration,
    /// Longest sleep between looks at the table. The timer sleeps until the next due row (or
    /// until this process writes one); this bounds how late a row inserted by another program
    /// with an earlier due time is seen.
    #[serde(default = "defaults::idle_recheck", with = "duration")]
    pub idle_recheck: Duration,
    /// Triggers handled at once.
    #[serde(default = "defaults::concurrency")]
    pub concurrency: u32,
}

/// `[sweep]`: re-arms PENDING orders past deadline + grace that have no live trigger.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepConfig {
    /// Run the sweep.
    #[serde(default = "defaults::yes")]
    pub enabled: bool,
    /// Time between sweeps.
    #[serde(default = "defaults::sweep_interval", with = "duration")]
    pub interval: Duration,
    /// How overdue an order must be (past its deadline or its pending trigger's due time) before
    /// the sweep takes it over from the timers.
    #[serde(default = "defaults::grace", with = "duration")]
    pub grace: Duration,
    /// Orders re-armed per sweep.
    #[serde(default = "defaults::sweep_batch")]
    pub batch: u32,
}

/// `[dispatch]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DispatchConfig {
    /// Attempts of one trigger (plugin errors, database errors) before it is dead-lettered.
    #[serde(default = "defaults::max_attempts")]
    pub max_attempts: u32,
    /// Delay before the first retry; doubles per attempt up to `retry_max`.
    #[serde(default = "defaults::retry_initial", with = "duration")]
    pub retry_initial: Duration,
    /// Longest delay between retries.
    #[serde(default = "defaults::retry_max", with = "duration")]
    pub retry_max: Duration,
}

/// `[runtime]`: limits of every plugin call.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Wall time one decision may take before the plugin is trapped.
    #[serde(default = "defaults::plugin_deadline", with = "duration")]
    pub deadline: Duration,
    /// Largest memory a plugin may use, MiB.
    #[serde(default = "defaults::max_memory_mib")]
    pub max_memory_mib: u32,
    /// Directory for precompiled plugins, created if missing (a relative path is relative to the
    /// working directory, like a SQLite path); without it every start compiles every plugin.
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
}

/// `[merchants.<id>]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MerchantConfig {
    /// The policy component: a path to a `.wasm` component (relative to this file), or
    /// `builtin:single-phase` / `builtin:two-phase` for the example plugins compiled into the
    /// binary.
    pub plugin: String,
    /// The merchant's payment window, used by `timeoutd demo` when it creates orders (an order
    /// service sets `orders.deadline_ms` itself).
    #[serde(default, with = "duration::option")]
    pub payment_window: Option<Duration>,
    /// Key/value settings handed to the plugin in every context, e.g. `grace = "5m"`.
    #[serde(default)]
    pub settings: BTreeMap<String, String>,
}

impl Config {
    /// Reads, interpolates, parses and validates the file at `path`.
    ///
    /// # Errors
    /// [`ConfigProblems`] listing every problem found, each with its key path.
    pub fn load(path: &Path) -> Result<Config, ConfigProblems> {
        let raw = std::fs::read_to_string(path).map_err(|e| {
            ConfigProblems::one(path.display().to_string(), format!("cannot read: {e}"))
        })?;
        let base = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        Self::from_toml(&raw, &base, &|k| std::env::var(k).ok())
    }

    /// Parses and validates TOML text, resolving `${VAR}` with `env` and relative paths against
    /// `base_dir`.
    ///
    /// # Errors
    /// [`ConfigProblems`] listing every problem found.
    pub fn from_toml(
        raw: &str,
        base_dir: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigProblems> {
        let text = interpolate::interpolate(raw, env)?;
        let mut config: Config = toml::from_str(&text).map_err(|e| {
            let span = e
                .span()
                .map(|s| {
                    let line = text[..s.start].matches('\n').count() + 1;
                    format!("line {line}")
                })
                .unwrap_or_default();
            ConfigProblems::one(span, e.message().to_string())
        })?;
        config.base_dir = base_dir.to_path_buf();
        validate::validate(&config)?;
        Ok(config)
    }

    /// Where a merchant's plugin comes from.
    pub fn plugin_source(&self, merchant: &MerchantConfig) -> PluginSource {
        match merchant.plugin.strip_prefix("builtin:") {
            Some(name) => PluginSource::Builtin(name.to_string()),
            None => PluginSource::File(self.base_dir.join(&merchant.plugin)),
        }
    }
}

/// Where a plugin's bytes come from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PluginSource {
    /// One of the example plugins embedded in the binary.
    Builtin(String),
    /// A component file.
    File(PathBuf),
}

mod defaults {
    use std::time::Duration;

    pub fn yes() -> bool {
        true
    }
    pub fn max_connections() -> u32 {
        8
    }
    pub fn outbox_batch() -> u32 {
        256
    }
    pub fn lease() -> Duration {
        Duration::from_secs(30)
    }
    pub fn idle_recheck() -> Duration {
        Duration::from_millis(250)
    }
    pub fn concurrency() -> u32 {
        16
    }
    pub fn sweep_interval() -> Duration {
        Duration::from_secs(30)
    }
    pub fn grace() -> Duration {
        Duration::from_secs(10)
    }
    pub fn sweep_batch() -> u32 {
        500
    }
    pub fn max_attempts() -> u32 {
        8
    }
    pub fn retry_initial() -> Duration {
        Duration::from_secs(1)
    }
    pub fn retry_max() -> Duration {
        Duration::from_secs(300)
    }
    pub fn plugin_deadline() -> Duration {
        Duration::from_millis(50)
    }
    pub fn max_memory_mib() -> u32 {
        64
    }
}

macro_rules! default_from_serde {
    ($($ty:ty),*) => {$(
        impl Default for $ty {
            fn default() -> Self {
                toml::from_str("").expect("every field has a default")
            }
        }
    )*};
}
default_from_serde!(OutboxConfig, SweepConfig, DispatchConfig, RuntimeConfig);
