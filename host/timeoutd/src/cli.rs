//! The `timeoutd` command line: `run`, `validate`, `demo`, `arm`, `pause`, `resume`, `pauses`
//! ([`pauses`]), `redrive`, `retry-effects` ([`bulk`]), `close-orders`, `rearm-orders`
//! ([`orders`]), `plugin` (see [`crate::plugin_cli`]).

pub mod bulk;
pub mod orders;
pub mod pauses;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::bulk::orders::Op;
use crate::clock::Clock;
use crate::config::Config;
pub use crate::config::EXIT_BAD_CONFIG;

/// Exit status of `timeoutd run` when the database's schema is one this build will not run on
/// — migrated past its compatibility window, or a migration half-applied — which only an
/// operator can fix (`EX_CONFIG` of sysexits.h: the installation is configured wrong). The
/// systemd unit does not restart on it (`RestartPreventExitStatus=64 76 78`), as it does not on
/// [`EXIT_BAD_CONFIG`]; its one line on stderr names the versions and what to run.
pub const EXIT_SCHEMA: u8 = 78;
use crate::daemon::{self, Daemon};

/// timeoutd closes unpaid orders when their payment window lapses, exactly once, under each
/// merchant's WebAssembly policy plugin.
#[derive(Debug, Parser)]
#[command(name = "timeoutd", version = version(), about)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

pub use crate::build_info::version;

/// Log line format.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    /// Human-readable.
    Text,
    /// One JSON object per line.
    Json,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon until SIGINT or SIGTERM. Exits 64 on a bad configuration, 78 when the
    /// database's schema is one this build will not run on (it says what to run), 1 otherwise.
    Run {
        /// Configuration file.
        #[arg(long, default_value = "config/timeoutd.toml")]
        config: PathBuf,
    },
    /// Check a configuration offline (including compiling every plugin) and list every problem.
    /// Exits 64 when it does not validate.
    Validate {
        /// Configuration file.
        #[arg(long, default_value = "config/timeoutd.toml")]
        config: PathBuf,
    },
    /// Check what operators get wrong — the database (reachable, version, schema, privileges,
    /// character sets, clock), Redis, the broker, the plugins, the payment and webhook
    /// endpoints — each finding with how to fix it. Exits 1 when any is an error, 64 when the
    /// configuration itself does not load.
    Doctor {
        /// Configuration file.
        #[arg(long, default_value = "config/timeoutd.toml")]
        config: PathBuf,
    },
    /// Arm orders through RocketMQ transactional messages (`[rocketmq]` required): for each
    /// order, a half message, the local transaction (its phase-0 outbox row), then commit or
    /// rollback. Prints one line per order; exits 1 if any could not be armed.
    Arm {
        /// Configuration file.
        #[arg(long, default_value = "config/rocketmq.toml")]
        config: PathBuf,
        /// Order ids.
        #[arg(required = true)]
        orders: Vec<String>,
    },
    /// The embedded default end to end: SQLite, two merchants (one per example plugin), N
    /// orders lapsing over a few seconds, some paid, some paid right at the deadline; runs the
    /// daemon until every order is PAID or CLOSED and prints a summary.
    Demo {
        /// Orders to create.
        #[arg(long, default_value_t = 500)]
        orders: u32,
        /// Directory for the SQLite database (a fresh temporary directory when absent).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// Print one JSON object with the results as the last line.
        #[arg(long)]
        json: bool,
    },
    /// A flash-sale burst through the real daemon path on a fresh database of the config's
    /// server, against that server's one-order-per-commit baseline taken in the same run:
    /// prints closes/s, the ratio, lateness p50/p99/max, commits and statements per close, CPU
    /// and RSS as a table and one JSON line, and audits exactly-once (exit 1 when it fails).
    Bench {
        /// Configuration file (its database URL names the server; its merchants decide).
        #[arg(long, default_value = "config/timeoutd.toml")]
        config: PathBuf,
        /// Trigger path.
        #[arg(long, value_enum, default_value_t = crate::bench::BenchPath::Outbox)]
        path: crate::bench::BenchPath,
        /// Orders in the burst (the baseline closes as many again).
        #[arg(long, default_value_t = 10_000)]
        orders: u32,
        /// SKUs the orders' lines draw on, round robin: their stock rows are what every group
        /// close updates. `--skus 1` is a flash sale (every order on one stock row).
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
        skus: u32,
        /// How the daemon's closes give stock back (`[dispatch.stock] mode`; default: the
        /// config's): `direct` updates `sku_stock` in each close, `journal` appends to the stock
        /// journal and folds it (the report says when every unit was back).
        #[arg(long, value_enum)]
        stock: Option<crate::config::StockMode>,
        /// How far ahead the shared deadline is put once the daemon runs (path `broker`: at
        /// least 15 s, and 4 ms per order, so the broker has every message in its timer wheel).
        #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
        lead: std::time::Duration,
        /// Merchant whose plugin decides (default: the config's first); its plugin must close
        /// at the deadline, like `builtin:single-phase`.
        #[arg(long)]
        merchant: Option<String>,
        /// Daemons draining the burst together (scale-out on one database).
        #[arg(long, default_value_t = 1)]
        daemons: u32,
        /// Deadlines this far apart instead of one shared instant (order k at deadline + k ×
        /// spread): `--orders 100 --spread 200ms` measures single orders on an idle daemon.
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        spread: std::time::Duration,
        /// PAID and CLOSED orders (with their PROCESSED outbox rows) put in the tables first,
        /// as months of trade leave them: the report times the sweep's query over them.
        #[arg(long, default_value_t = 0)]
        history: u32,
        /// Runs a retention pass over that history while the burst drains (its rows are 90
        /// days old): the report's lateness is then measured under the cleaning.
        #[arg(long)]
        clean_history: bool,
        /// Also draws the run as an SVG: closes per 100 ms against time from the deadline, and
        /// the lateness distribution.
        #[arg(long)]
        plot: Option<PathBuf>,
    },
    /// Does one merchant's trouble stay that merchant's? Merchant B's orders fall due alone,
    /// then beside merchant A's burst while A's webhook hangs (or answers 503): prints B's
    /// close lateness, notice latency and Redis stock back (p50 / p99 / max) in both phases and
    /// the ratio of the p99s, as a table and one JSON line. Exit 1 when B's orders were not all
    /// closed, notified and given their stock back.
    BenchFairness {
        /// Configuration file (its database URL names the server; both merchants run
        /// `builtin:two-phase` with no grace, with the rest of its first merchant's table).
        #[arg(long, default_value = "config/timeoutd.toml")]
        config: PathBuf,
        /// Merchant A's orders in the busy phase.
        #[arg(long, default_value_t = 10_000)]
        busy_orders: u32,
        /// Merchant B's orders in each phase.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
        quiet_orders: u32,
        /// How A's webhook fails.
        #[arg(long, value_enum, default_value_t = crate::bench::fairness::Fault::Hang)]
        fault: crate::bench::fairness::Fault,
        /// How far ahead of the daemon's start the shared deadline is put.
        #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
        lead: std::time::Duration,
        /// The Redis the flash-sale stock lives in.
        #[arg(long, default_value = "redis://127.0.0.1:6379")]
        redis: String,
    },
    /// Pause a merchant's orders, or one order: no close and no reminder until resumed; their
    /// triggers are held, not dropped, and paid notices still apply. Takes effect at once on
    /// every daemon of the database. Exits 1 when the target cannot be paused.
    Pause {
        /// Configuration file (its database, and its merchants).
        #[arg(long, default_value = "config/timeoutd.toml")]
        config: PathBuf,
        /// What to pause.
        #[command(flatten)]
        target: pauses::Target,
        /// Why, kept with the pause and shown by `pauses` and the console.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// End a pause: the held triggers are due at once and decided again against the database
    /// clock (an order paid meanwhile is left alone). Exits 1 when the target is not paused.
    Resume {
        /// Configuration file.
        #[arg(long, default_value = "config/timeoutd.toml")]
        config: PathBuf,
        /// What to resume.
        #[command(flatten)]
        target: pauses::Target,
    },
    /// Re-drive every OPEN dead letter a filter matches (their orders re-armed as `manual`
    /// triggers, paced), a page at a time; `--dry-run` lists them. Re-driving the same set
    /// again changes nothing: a letter is re-driven once.
    Redrive {
        /// Configuration file.
        #[arg(long, default_value = "config/timeoutd.toml")]
        config: PathBuf,
        /// The filter and the pace.
        #[command(flatten)]
        args: bulk::RedriveArgs,
    },
    /// Retry every FAILED ledger effect a filter matches (back to PENDING with a fresh attempt
    /// budget, paced; the daemon's effect executor runs them under their original idempotency
    /// keys), a page at a time; `--dry-run` lists them. An effect applied in the close (stock,
    /// coupon) is never retried: it is listed as skipped.
    RetryEffects {
        /// Configuration file.
        #[arg(long, default_value = "config/timeoutd.toml")]
        config: PathBuf,
        /// The filter and the pace.
        #[command(flatten)]
        args: bulk::RetryArgs,
    },
    /// Close every PENDING order past its deadline a filter matches: each gets an operator's
    /// trigger due at once (paced), which the running daemon decides through the merchant's
    /// plugin, a page at a time; `--dry-run` lists them and what would happen. Asking for the
    /// same set again changes nothing: an order already queued is skipped, a closed one is no
    /// longer PENDING.
    CloseOrders {
        /// Configuration file.
        #[arg(long, default_value = "config/timeoutd.toml")]
        config: PathBuf,
        /// The filter and the pace.
        #[command(flatten)]
        args: orders::OrdersArgs,
    },
    /// Re-arm every PENDING order a filter matches that has no live trigger (its broker
    /// message lost, its row given up): its row back, due at its deadline (paced), a page at a
    /// time; `--dry-run` lists them. Re-arming the same set again changes nothing.
    RearmOrders {
        /// Configuration file.
        #[arg(long, default_value = "config/timeoutd.toml")]
        config: PathBuf,
        /// The filter and the pace.
        #[command(flatten)]
        args: orders::OrdersArgs,
    },
    /// List the pauses in force, one per line.
    Pauses {
        /// Configuration file.
        #[arg(long, default_value = "config/timeoutd.toml")]
        config: PathBuf,
    },
    /// A merchant's tools for a plugin file: `check`, `test` (a CASES.toml file), `replay`
    /// (over the recorded decisions).
    Plugin {
        /// What to do with the plugin.
        #[command(subcommand)]
        command: crate::plugin_cli::PluginCommand,
    },
}

/// Parses the command line and runs it.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // Without RUST_LOG: our own crates at info, every library at warn (the RocketMQ client logs
    // hundreds of info lines a minute about routes and rebalancing).
    let default_level = match cli.command {
        Command::Demo { .. }
        | Command::Plugin { .. }
        | Command::Bench { .. }
        | Command::BenchFairness { .. }
        | Command::Doctor { .. }
        | Command::Pause { .. }
        | Command::Resume { .. }
        | Command::Pauses { .. }
        | Command::Redrive { .. }
        | Command::RetryEffects { .. }
        | Command::CloseOrders { .. }
        | Command::RearmOrders { .. } => "warn",
        _ => "warn,timeoutd=info,timeoutd_runtime=info",
    };
    // `run` loads its config before logging starts: its [tracing] decides where spans go.
    let mut run_config = match &cli.command {
        Command::Run { config } => Some(load(config)),
        _ => None,
    };
    let tracing_config = run_config
        .as_ref()
        .and_then(|loaded| loaded.as_ref().ok())
        .and_then(|c| c.tracing.as_ref());
    let _traces = match init_logging(cli.log_format, default_level, tracing_config) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("timeoutd: {e}");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = runtime.block_on(async move {
        match cli.command {
            Command::Validate { config } => validate(&config),
            Command::Doctor { config } => match load(&config) {
                Ok(loaded) => doctor(&config, &loaded).await,
                Err(code) => code,
            },
            Command::Run { config } => match run_config.take().expect("loaded above") {
                Ok(loaded) => run(&config, &loaded).await,
                Err(code) => code,
            },
            Command::Arm { config, orders } => match load(&config) {
                Ok(loaded) => arm(&config, &loaded, &orders).await,
                Err(code) => code,
            },
            Command::Plugin { command } => crate::plugin_cli::run(command).await,
            Command::Pause {
                config,
                target,
                reason,
            } => match load(&config) {
                Ok(loaded) => pauses::pause(&config, &loaded, &target, &reason).await,
                Err(code) => code,
            },
            Command::Resume { config, target } => match load(&config) {
                Ok(loaded) => pauses::resume(&config, &loaded, &target).await,
                Err(code) => code,
            },
            Command::Redrive { config, args } => match load(&config) {
                Ok(loaded) => bulk::redrive(&config, &loaded, &args).await,
                Err(code) => code,
            },
            Command::RetryEffects { config, args } => match load(&config) {
                Ok(loaded) => bulk::retry_effects(&config, &loaded, &args).await,
                Err(code) => code,
            },
            Command::CloseOrders { config, args } => match load(&config) {
                Ok(loaded) => orders::run(&config, &loaded, &args, Op::Close).await,
                Err(code) => code,
            },
            Command::RearmOrders { config, args } => match load(&config) {
                Ok(loaded) => orders::run(&config, &loaded, &args, Op::Rearm).await,
                Err(code) => code,
            },
            Command::Pauses { config } => match load(&config) {
                Ok(loaded) => pauses::list(&config, &loaded).await,
                Err(code) => code,
            },
            Command::Bench {
                config,
                path,
                orders,
                skus,
                stock,
                lead,
                merchant,
                daemons,
                spread,
                history,
                clean_history,
                plot,
            } => match load(&config) {
                Ok(config) => {
                    bench(crate::bench::BenchArgs {
                        config,
                        path,
                        orders,
                        skus,
                        stock,
                        lead_ms: lead.as_millis() as i64,
                        merchant,
                        daemons,
                        spread_ms: spread.as_millis() as i64,
                        history,
                        clean_history,
                        plot,
                    })
                    .await
                }
                Err(code) => code,
            },
            Command::BenchFairness {
                config,
                busy_orders,
                quiet_orders,
                fault,
                lead,
                redis,
            } => match load(&config) {
                Ok(config) => {
                    fairness(crate::bench::fairness::FairnessArgs {
                        config,
                        busy_orders,
                        quiet_orders,
                        fault,
                        lead_ms: lead.as_millis() as i64,
                        redis_url: redis,
                    })
                    .await
                }
                Err(code) => code,
            },
            Command::Demo {
                orders,
                data_dir,
                json,
            } => match crate::demo::run(orders, data_dir, json).await {
                Ok(report) if report.conserved() => ExitCode::SUCCESS,
                Ok(_) => {
                    eprintln!("demo: stock or coupons were not conserved");
                    ExitCode::FAILURE
                }
                Err(e) => {
                    eprintln!("demo failed: {e:#}");
                    ExitCode::FAILURE
                }
            },
        }
    });
    // Blocking work that cannot be aborted (a plugin call ends at its own deadline; a client
    // thread stuck on a hung peer) is not waited for past this: SIGTERM stops within 5 s.
    runtime.shutdown_timeout(crate::shutdown::RUNTIME_EXIT);
    code
}

/// Logs to stderr in `format` (filtered by `RUST_LOG`, else `default_level`), and with
/// `traces` also exports spans over OTLP ([`crate::telemetry`]); the guard flushes them at exit.
fn init_logging(
    format: LogFormat,
    default_level: &str,
    traces: Option<&crate::config::TracingConfig>,
) -> Result<Option<crate::telemetry::Guard>, String> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    // Colours only on a terminal: a log file or journal gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // sqlx's one line per slow statement is counted and summarised instead (crate::db::slowlog).
    let not_slow = || {
        tracing_subscriber::filter::filter_fn(|meta| !crate::db::slowlog::is_slow_statement(meta))
    };
    let (text, json) = match format {
        LogFormat::Text => (
            Some(
                tracing_subscriber::fmt::layer()
                    .with_ansi(ansi)
                    .with_writer(std::io::stderr)
                    .with_filter(not_slow()),
            ),
            None,
        ),
        LogFormat::Json => (
            None,
            Some(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(std::io::stderr)
                    .with_filter(not_slow()),
            ),
        ),
    };
    let (otel, guard) = match traces {
        Some(t) => {
            let (layer, guard) = crate::telemetry::layer(t)?;
            (Some(layer), Some(guard))
        }
        None => (None, None),
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(text)
        .with(json)
        .with(otel)
        .with(crate::db::slowlog::Layer)
        .init();
    Ok(guard)
}

/// The config at `path`, its table prefix made this process's ([`crate::db::names::serve`]:
/// every command's SQL then names the tables that config's daemon uses).
fn load(path: &std::path::Path) -> Result<Config, ExitCode> {
    let config = Config::load(path).map_err(|problems| {
        eprintln!("{}: {problems}", path.display());
        ExitCode::from(EXIT_BAD_CONFIG)
    })?;
    if let Err(e) = crate::db::names::serve(&config.database.table_prefix) {
        eprintln!("{}: {e}", path.display());
        return Err(ExitCode::from(EXIT_BAD_CONFIG));
    }
    Ok(config)
}

async fn doctor(path: &std::path::Path, config: &Config) -> ExitCode {
    println!("timeoutd {} — doctor for {}", version(), path.display());
    let findings = crate::doctor::examine(config).await;
    for finding in &findings {
        println!("{finding}");
    }
    let count = |level| findings.iter().filter(|f| f.level == level).count();
    let (errors, warnings) = (
        count(crate::doctor::Level::Error),
        count(crate::doctor::Level::Warn),
    );
    println!("{errors} error(s), {warnings} warning(s)");
    if errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn validate(path: &std::path::Path) -> ExitCode {
    let config = match load(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match crate::policies::load(&config) {
        Ok(policies) => {
            for p in policies.all() {
                println!(
                    "merchant {}: plugin {} (timeout:policy@{}, sha256 {})",
                    p.merchant,
                    p.plugin.name(),
                    p.plugin.api_version(),
                    p.plugin.digest()
                );
                if let Some(shadow) = policies.shadow(&p.merchant) {
                    println!(
                        "merchant {}: shadow {} (timeout:policy@{}, sha256 {}, asked on {} % of orders)",
                        p.merchant,
                        shadow.plugin.name(),
                        shadow.plugin.api_version(),
                        shadow.plugin.digest(),
                        shadow.sample * 100.0
                    );
                }
            }
            for warning in crate::effects::unexecuted(&config) {
                println!("warning: {warning}");
            }
            println!("{}: ok", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            ExitCode::from(EXIT_BAD_CONFIG)
        }
    }
}

/// Exit status of `timeoutd run` refused by a pooler in front of the database
/// ([`daemon::StartError::Pooler`]): server connections shared between clients while
/// `database.pool_mode` says `"session"`, or a start-up parameter the pooler refuses
/// (`EX_PROTOCOL` of sysexits.h: the pooler does not keep the protocol's session as the
/// configuration expects). Restarting cannot help; the unit does not
/// (`RestartPreventExitStatus=64 76 78`).
pub const EXIT_POOLER: u8 = 76;

/// The line and exit status of a command that could not start (`run`, `arm`): bad plugins
/// are the config's fault ([`EXIT_BAD_CONFIG`]), an undeclared pooler [`EXIT_POOLER`], a schema
/// outside this build's window [`EXIT_SCHEMA`], anything else 1.
fn cannot_start(command: &str, path: &std::path::Path, e: daemon::StartError) -> ExitCode {
    match e {
        e @ daemon::StartError::Policies(crate::policies::SetupError::Plugins(_)) => {
            eprintln!("{}: {e}", path.display());
            ExitCode::from(EXIT_BAD_CONFIG)
        }
        e @ daemon::StartError::Shop(_) => {
            eprintln!("{command}: cannot start: {e}");
            ExitCode::from(EXIT_BAD_CONFIG)
        }
        e @ daemon::StartError::Pooler(_) => {
            eprintln!("{command}: cannot start: {e}");
            ExitCode::from(EXIT_POOLER)
        }
        daemon::StartError::Schema(e) if e.needs_operator() => {
            eprintln!("{command}: cannot start: {e}");
            ExitCode::from(EXIT_SCHEMA)
        }
        e => {
            eprintln!("{command}: cannot start: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(path: &std::path::Path, config: &Config) -> ExitCode {
    crate::db::slowlog::set_threshold(config.database.slow_statement);
    // One database, or a sharded one ([`crate::shards`]).
    enum Running {
        One(Daemon),
        Sharded(crate::shards::Sharded),
    }
    let started = if config.database.shards.is_empty() {
        Daemon::start(config, Clock::Database)
            .await
            .map(Running::One)
    } else {
        crate::shards::Sharded::start(config, Clock::Database)
            .await
            .map(Running::Sharded)
    };
    let running = match started {
        Ok(r) => r,
        Err(e) => return cannot_start("timeoutd", path, e),
    };
    let (summary_stop, summary_shutdown) = tokio::sync::watch::channel(false);
    let summary = tokio::spawn(summarise(summary_shutdown));
    wait_for_signal().await;
    tracing::info!("signal received; draining");
    match running {
        Running::One(d) => d.stop().await,
        Running::Sharded(s) => s.stop().await,
    }
    let _ = summary_stop.send(true);
    let _ = summary.await;
    ExitCode::SUCCESS
}

async fn bench(args: crate::bench::BenchArgs) -> ExitCode {
    let report = crate::bench::run(args).await;
    print_report("bench", report, |r| (r.table(), r.passed()))
}

async fn fairness(args: crate::bench::fairness::FairnessArgs) -> ExitCode {
    let report = crate::bench::fairness::run(args).await;
    print_report("bench-fairness", report, |r| (r.table(), r.complete()))
}

/// A bench's report as a table and one JSON line on stdout, exit 1 when `judged` says it did
/// not pass; a run that stopped, its error on stderr under `timeoutd COMMAND:`.
fn print_report<R: serde::Serialize>(
    command: &str,
    report: anyhow::Result<R>,
    judged: impl Fn(&R) -> (String, bool),
) -> ExitCode {
    match report {
        Ok(report) => {
            let (table, passed) = judged(&report);
            print!("{table}");
            println!(
                "{}",
                serde_json::to_string(&report).expect("the report serialises")
            );
            if passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("timeoutd {command}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn arm(path: &std::path::Path, config: &Config, orders: &[String]) -> ExitCode {
    // The daemon's own start: the engine, pooler and schema checks cannot be skipped here.
    let db = match crate::daemon::open_database(config).await {
        Ok(db) => db,
        Err(e) => return cannot_start("timeoutd arm", path, e),
    };
    match crate::rocketmq::arming::arm_orders(config, db, orders).await {
        Ok(results) => {
            let mut ok = true;
            for (order, armed) in results {
                println!("{order}: {armed:?}");
                ok &= armed != crate::rocketmq::arming::Armed::Unknown;
            }
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("timeoutd arm: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The database of `config` as the daemon opens it (engine, pooler and schema checks,
/// migrations), for the operator commands that change rows (`pause`, `resume`, `redrive`,
/// `retry-effects`); `None` after saying why on stderr.
async fn open_database(path: &std::path::Path, config: &Config) -> Option<crate::db::Db> {
    match crate::daemon::open_database(config).await {
        Ok(db) => Some(db),
        Err(e) => {
            eprintln!("{}: cannot open the database: {e}", path.display());
            None
        }
    }
}

/// Who the operator commands audit a change as: `cli:<$USER>` (`cli:unknown` without `USER`).
fn actor() -> String {
    format!(
        "cli:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".to_string())
    )
}

/// One `admin_audit` row, at `now_ms`, for a change an operator command made: by [`actor`],
/// method `CLI`, `what` as the path, status 200.
async fn audit(db: &crate::db::Db, now_ms: i64, what: &str) -> Result<(), crate::db::DbError> {
    crate::db::audit::record(db, now_ms, &actor(), "CLI", what, 200).await
}

async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("install SIGTERM handler");
    tokio::select! {
        interrupted = tokio::signal::ctrl_c() => {
            if let Err(e) = interrupted {
                // No SIGINT handler: wait for SIGTERM alone rather than stop at once.
                tracing::warn!(error = %e, "cannot listen for SIGINT; stop with SIGTERM");
                term.recv().await;
            }
        }
        _ = term.recv() => {}
    }
}

/// The log's summaries instead of a line per event, so a burst of any size writes a few lines:
/// every [`crate::events::SUMMARY_INTERVAL`] the closes ([`crate::events::flush_closes`]) and
/// the slow statements ([`crate::db::slowlog::flush`]) since the last, until `shutdown`, and
/// once more then.
async fn summarise(mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let flush = || {
        crate::events::flush_closes();
        crate::db::slowlog::flush();
    };
    while !crate::shutdown::sleep_or_shutdown(crate::events::SUMMARY_INTERVAL, &mut shutdown).await
    {
        flush();
    }
    flush();
}
