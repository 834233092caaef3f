//! `timeoutd plugin …`: the merchant's tools for a plugin file, off-line or against the
//! decisions a daemon recorded.
//!
//! - `check FILE.wasm` — is it a component, which API version, does it export the world,
//!   how long it takes to compile, how big it is ([`check`]);
//! - `test FILE.wasm CASES.toml` — runs a cases file ([`timeoutd_plugin_harness::cases`]) and
//!   prints pass/fail per case ([`test`]);
//! - `replay FILE.wasm --config CONFIG` — re-runs the plugin over `decision_log` and prints where
//!   it decides differently ([`replay`]);
//! - `whatif FILE.wasm --config CONFIG --merchant M --since 7d` — the totals a merchant asks
//!   before a change, over every recorded decision of the period, with a report ([`whatif`]);
//! - `run FILE.wasm --order ORDER.json` — one ad-hoc call: the decision, the guard's verdict and
//!   the plugin's log lines ([`run`]).
//!
//! Exit statuses: 0 success; 1 a plugin that does not load, a failing case or a differing
//! decision; 64 a bad cases file or configuration.

mod check;
mod new;
mod replay;
mod run;
mod test;
mod whatif;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use timeoutd_runtime::{PolicyEngine, RuntimeLimits};

/// `timeoutd plugin` subcommands.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Inspect a plugin file: component or not, API version, exported world, compile time, size.
    Check {
        /// The plugin (a wasm32-wasip2 component).
        file: PathBuf,
        /// Limits it is loaded under.
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Make a new plugin project NAME (or at `--dir`) in Rust, JavaScript or Python: the
    /// policy, its cases and the API (the guest SDK for Rust, the WIT otherwise), so it builds
    /// and passes `plugin test` on first run.
    New {
        /// The project's name, e.g. `my-shop-policy`.
        name: String,
        /// The plugin's language.
        #[arg(long, value_enum, default_value = "rust")]
        lang: new::Lang,
        /// Where to make it (default: ./NAME; must not exist).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Run a CASES.toml file against a plugin; one line per case, exit 1 if any fails.
    Test {
        /// The plugin (a wasm32-wasip2 component).
        file: PathBuf,
        /// The cases file (format: plugins/README.md, "Cases files").
        cases: PathBuf,
        /// Limits it runs under.
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Call a plugin once with an order from a JSON file and print its decision, the guard's
    /// verdict and its log lines; exit 1 when the decision is refused or the plugin fails.
    Run {
        /// The plugin (a wasm32-wasip2 component).
        file: PathBuf,
        /// What to call it with.
        #[command(flatten)]
        args: RunArgs,
    },
    /// Re-run a plugin over the decisions recorded in `decision_log` and print where it decides
    /// differently; exit 1 if any does.
    Replay {
        /// The new plugin version.
        file: PathBuf,
        /// The daemon's configuration (its database and merchant settings).
        #[arg(long)]
        config: PathBuf,
        /// Only this merchant's decisions.
        #[arg(long)]
        merchant: Option<String>,
        /// At most this many decisions, newest first.
        #[arg(long, default_value_t = 1000)]
        limit: u32,
        /// Replay with this merchant setting changed or added, `KEY=VALUE` (repeat it): what
        /// the recorded orders would have got under the new settings.
        #[arg(long)]
        setting: Vec<String>,
    },
    /// What a candidate version would have done to a merchant's recorded orders: every decision
    /// of the period decided again, streamed; prints the totals (closes that become waits and
    /// the reverse, stock and coupons released earlier or later and by how much, reminders
    /// added or dropped, answers the guard would refuse) and writes `whatif.json` and a
    /// self-contained `whatif.html` with the charts.
    Whatif {
        /// The candidate plugin.
        file: PathBuf,
        /// The daemon's configuration (its database; the merchant's limits and grants).
        #[arg(long)]
        config: PathBuf,
        /// The merchant whose decisions are decided again.
        #[arg(long)]
        merchant: String,
        /// How far back: decisions decided in the last `7d`, `12h`, …
        #[arg(long, default_value = "7d", value_parser = humantime::parse_duration)]
        since: Duration,
        /// Decide with this merchant setting changed or added, `KEY=VALUE` (repeat it).
        #[arg(long)]
        setting: Vec<String>,
        /// Where `whatif.json` and `whatif.html` go (made if missing).
        #[arg(long, default_value = ".")]
        out: PathBuf,
    },
}

/// What `timeoutd plugin run` calls the plugin with.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The order, as JSON: `{"id", "merchant", "user", "status": "PENDING", "created_at_ms",
    /// "deadline_ms", "total_cents", "items": [{"sku", "quantity", "unit_price_cents"}],
    /// "coupon", "flash_activity", "payment_ref"}` (the last three may be null).
    #[arg(long)]
    pub order: PathBuf,
    /// A merchant setting, `KEY=VALUE` (repeat it).
    #[arg(long)]
    pub setting: Vec<String>,
    /// Now, epoch ms (default: the order's deadline).
    #[arg(long)]
    pub now: Option<i64>,
    /// The phase asked (default 0).
    #[arg(long, default_value_t = 0)]
    pub phase: u32,
    /// The state the previous phase's wait handed on, hex (API 0.2.0).
    #[arg(long, default_value = "")]
    pub state: String,
    /// Limits it runs under.
    #[command(flatten)]
    pub limits: LimitArgs,
}

/// The per-call limits, as `[runtime]` in the config (defaults: the config's defaults).
#[derive(Debug, Clone, Args)]
pub struct LimitArgs {
    /// Deadline of one call (`runtime.deadline`), e.g. `50ms`, `2s`.
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
    pub deadline: Duration,
    /// Memory cap of one call, MiB (`runtime.max_memory_mib`).
    #[arg(long, default_value_t = 64)]
    pub max_memory_mib: u32,
}

impl LimitArgs {
    fn limits(&self) -> RuntimeLimits {
        RuntimeLimits {
            deadline: self.deadline,
            max_memory_bytes: self.max_memory_mib as usize * (1 << 20),
            ..RuntimeLimits::default()
        }
    }
}

/// Exit status of a bad cases file or configuration.
const EXIT_BAD_INPUT: u8 = crate::config::EXIT_BAD_CONFIG;

/// Runs a `timeoutd plugin` subcommand.
pub async fn run(command: PluginCommand) -> ExitCode {
    match command {
        PluginCommand::Check { file, limits } => check::run(&file, &limits.limits()),
        PluginCommand::New { name, lang, dir } => new::run(&name, lang, dir.as_deref()),
        PluginCommand::Test {
            file,
            cases,
            limits,
        } => test::run(&file, &cases, &limits.limits()),
        PluginCommand::Run { file, args } => run::run(&file, &args),
        PluginCommand::Replay {
            file,
            config,
            merchant,
            limit,
            setting,
        } => match parse_settings(&setting) {
            Ok(changed) => replay::run(&file, &config, merchant.as_deref(), limit, &changed).await,
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(EXIT_BAD_INPUT)
            }
        },
        PluginCommand::Whatif {
            file,
            config,
            merchant,
            since,
            setting,
            out,
        } => match parse_settings(&setting) {
            Ok(changed) => whatif::run(&file, &config, &merchant, since, &changed, &out).await,
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(EXIT_BAD_INPUT)
            }
        },
    }
}

/// `--setting KEY=VALUE` arguments as (key, value) pairs, in order.
///
/// # Errors
/// The first argument without `=`, named.
fn parse_settings(args: &[String]) -> Result<Vec<(String, String)>, String> {
    args.iter()
        .map(|s| match s.split_once('=') {
            Some((k, v)) => Ok((k.trim().to_string(), v.to_string())),
            None => Err(format!("--setting `{s}`: write it as KEY=VALUE")),
        })
        .collect()
}

/// An engine without a compile cache: these commands measure and judge the file itself.
fn engine(limits: &RuntimeLimits) -> Result<PolicyEngine, ExitCode> {
    PolicyEngine::new(limits.clone(), None).map_err(|e| {
        eprintln!("timeoutd plugin: cannot create the policy engine: {e}");
        ExitCode::FAILURE
    })
}

/// Loads the plugin `file` under `limits` into an engine of its own ([`engine`]); the error is
/// printed and becomes the exit status (1).
fn load(file: &Path, limits: &RuntimeLimits) -> Result<timeoutd_runtime::Plugin, ExitCode> {
    let engine = engine(limits)?;
    engine.load_file(plugin_name(file), file).map_err(|e| {
        eprintln!("{e}");
        ExitCode::FAILURE
    })
}

/// The name a plugin file is loaded under: its file stem.
fn plugin_name(file: &Path) -> &str {
    file.file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("plugin")
}
