//! F18: PostgreSQL behind a connection pooler: Debian's PgBouncer, started by each test on loopback
//! (a private process on a free port, never the machine's service), in front of the test
//! PostgreSQL server. In `pool_mode = transaction` with `database.pool_mode = "transaction"`,
//! three daemons started together close a burst exactly once; in session mode the defaults
//! work; in transaction mode undeclared, start-up refuses with one line naming `pool_mode`
//! (exit 76 from `timeoutd run`) and `timeoutd doctor` reports it.
//!
//! Needs `pgbouncer` (scripts/test installs Debian's and sets `TIMEOUTD_TEST_PGBOUNCER`); run
//! outside scripts/test without it, the tests say so and pass.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::time::Duration;

use timeoutd::clock::Clock;
use timeoutd::config::Config;
use timeoutd::daemon::{Daemon, StartError};
use timeoutd::db::pooler::{self, Sharing};
use timeoutd::db::{Backend, Db, PoolMode};

use crate::support::{Env, MerchantSpec, eventually, order};

const SINGLE: &[MerchantSpec<'static>] = &[("acme", "builtin:single-phase", &[])];

/// The `pgbouncer` to run: `$TIMEOUTD_TEST_PGBOUNCER` (scripts/test sets it: then it must be
/// there), else one on `PATH` or Debian's `/usr/sbin/pgbouncer`; `None` (with a message) when
/// there is none outside scripts/test.
fn pgbouncer_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TIMEOUTD_TEST_PGBOUNCER") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "TIMEOUTD_TEST_PGBOUNCER={} is missing: scripts/test installs Debian's pgbouncer",
            p.display()
        );
        return Some(p);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join("pgbouncer"))
        .find(|p| p.is_file());
    if on_path.is_none() {
        eprintln!(
            "skipped: pgbouncer is not installed (apt-get install pgbouncer; scripts/test installs it)"
        );
    }
    on_path
}

/// A private PgBouncer in front of the test PostgreSQL server; stopped when dropped.
struct PgBouncer {
    child: std::process::Child,
    port: u16,
    user: String,
    dir: tempfile::TempDir,
}

impl PgBouncer {
    /// Starts `bin` in `mode` (`transaction` or `session`) with `server_pool` server connections
    /// per database, and waits until it listens. It accepts the driver's `extra_float_digits`
    /// start-up parameter, as operators configure it ([`PgBouncer::start_strict`]: not).
    async fn start(bin: &std::path::Path, mode: &str, server_pool: u32) -> PgBouncer {
        Self::start_with(
            bin,
            mode,
            server_pool,
            "ignore_startup_parameters = extra_float_digits",
        )
        .await
    }

    /// As [`PgBouncer::start`], with PgBouncer's default: every start-up parameter it does not
    /// track refused.
    async fn start_strict(bin: &std::path::Path, mode: &str) -> PgBouncer {
        Self::start_with(bin, mode, 2, "").await
    }

    async fn start_with(
        bin: &std::path::Path,
        mode: &str,
        server_pool: u32,
        extra: &str,
    ) -> PgBouncer {
        let server = crate::support::postgres_server_url();
        let authority = server.split_once("://").map_or("", |(_, r)| r);
        let authority = authority.split('/').next().unwrap_or_default();
        let (user, host) = authority
            .rsplit_once('@')
            .unwrap_or(("postgres", authority));
        let user = user.split(':').next().unwrap_or("postgres").to_string();
        let (host, port) = host.rsplit_once(':').unwrap_or((host, "5432"));
        let dir = tempfile::tempdir().unwrap();
        let listen = crate::support::free_port();
        std::fs::write(dir.path().join("users.txt"), format!("\"{user}\" \"\"\n")).unwrap();
        std::fs::write(
            dir.path().join("pgbouncer.ini"),
            format!(
                "[databases]\n* = host={host} port={port}\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\n\
                 listen_port = {listen}\nunix_socket_dir =\nauth_type = trust\nauth_file = {}\n\
                 pool_mode = {mode}\ndefault_pool_size = {server_pool}\nmax_client_conn = 500\n{extra}\n",
                dir.path().join("users.txt").display()
            ),
        )
        .unwrap();
        // PgBouncer refuses to run as root: then it runs as the PostgreSQL server's user, which
        // must read its files.
        let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
        let mut cmd = std::process::Command::new(bin);
        if root {
            for f in ["", "users.txt", "pgbouncer.ini"] {
                let path = dir.path().join(f);
                let mode = if f.is_empty() { 0o755 } else { 0o644 };
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            }
            cmd.args(["-u", "postgres"]);
        }
        let log = std::fs::File::create(dir.path().join("pgbouncer.log")).unwrap();
        let child = cmd
            .arg(dir.path().join("pgbouncer.ini"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let bouncer = PgBouncer {
            child,
            port: listen,
            user,
            dir,
        };
        let addr = format!("127.0.0.1:{listen}");
        let log = bouncer.dir.path().join("pgbouncer.log");
        eventually(Duration::from_secs(10), "pgbouncer listens", || {
            let addr = addr.clone();
            async move { tokio::net::TcpStream::connect(addr).await.is_ok() }
        })
        .await;
        assert!(
            !std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("FATAL"),
            "{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        bouncer
    }

    /// The URL of `database` through this PgBouncer.
    fn url(&self, database: &str) -> String {
        format!(
            "postgres://{}@127.0.0.1:{}/{database}",
            self.user, self.port
        )
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The test database's name, from its URL.
fn database_of(env: &Env) -> String {
    env.url.rsplit('/').next().unwrap().to_string()
}

/// `env`'s config with the database reached through `url`, as `mode` says, and a sweep every
/// 200 ms (the orders [`burst_closes_exactly_once`] leaves without an outbox row).
fn through(env: &Env, url: &str, mode: PoolMode, migrate_url: Option<&str>) -> Config {
    let mut config = env.config(SINGLE, "[sweep]\ninterval = \"200ms\"\ngrace = \"300ms\"\n");
    config.database.url = url.to_string();
    config.database.pool_mode = mode;
    config.database.migrate_url = migrate_url.map(str::to_string);
    config
}

/// Three daemons started through `url`, two together and a third after them (one migrating,
/// two only checking the schema), and a burst of `n` orders lapsing over one
/// second while they run (a quarter paid first, a tenth without an outbox row, left to the
/// sweep): each unpaid order closed once, the paid ones untouched, stock, coupons and the
/// ledger exact, asserted in the rows.
async fn burst_closes_exactly_once(env: &Env, config: &Config, n: usize) {
    env.stock_up(&[("sku-a", 100_000), ("sku-b", 100_000)])
        .await;
    let first = env.db.now_ms().await.unwrap() + 2_000;
    for i in 0..n {
        let deadline = first + (i as i64 % 10) * 100;
        env.create(&order(&format!("pool-{i:03}"), "acme", deadline))
            .await;
    }
    let paid = (0..n).step_by(4).count();
    for i in (0..n).step_by(4) {
        assert!(env.pay(&format!("pool-{i:03}"), first - 1_000).await);
    }
    // Ids ending in 5 (never paid): their rows lost, as an order service that skips them.
    let orphans = env
        .db
        .backend()
        .query("DELETE FROM order_timeout_msg WHERE order_id LIKE ?")
        .bind("pool-%5")
        .execute(env.db.pool())
        .await
        .unwrap()
        .rows_affected();
    assert_eq!(orphans, n as u64 / 10);
    // Two started together, a third once they run (as the operator did). Two do not
    // migrate: they only check the schema, through the pool they work on.
    let mut checking = config.clone();
    checking.database.migrate = false;
    let (a, b) = tokio::join!(
        Daemon::start(config, Clock::Database),
        Daemon::start(&checking, Clock::Database),
    );
    let c = Daemon::start(&checking, Clock::Database).await;
    let daemons = [a.unwrap(), b.unwrap(), c.unwrap()];
    let unpaid = (n - paid) as i64;
    eventually(
        Duration::from_secs(30),
        "every unpaid order closed",
        || async {
            env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "CLOSED")
                .await
                == unpaid
                && env
                    .int(
                        "SELECT COUNT(*) FROM effect_ledger WHERE kind = 'notify' AND status = ?",
                        "DONE",
                    )
                    .await
                    == unpaid
        },
    )
    .await;
    for d in daemons {
        d.stop().await;
    }
    let late = env.ints("SELECT closed_at_ms - deadline_ms FROM orders WHERE status = 'CLOSED' AND id LIKE ? ORDER BY 1", "pool-%").await;
    eprintln!(
        "{} closes through {}: lateness p50 {} ms, p99 {} ms, max {} ms",
        late.len(),
        config.database.url,
        late[late.len() / 2],
        late[late.len() * 99 / 100],
        late[late.len() - 1]
    );
    assert_eq!(
        env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "CLOSED")
            .await,
        unpaid
    );
    assert_eq!(
        env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "PAID")
            .await,
        paid as i64
    );
    assert_eq!(
        env.int("SELECT COUNT(*) FROM orders WHERE status = 'CLOSED' AND closed_at_ms < deadline_ms AND id LIKE ?", "pool-%").await,
        0,
        "none closed before its deadline"
    );
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM decision_log WHERE outcome = ?",
            "closed"
        )
        .await,
        unpaid,
        "one close per order"
    );
    assert_eq!(
        env.int(
            "SELECT COUNT(DISTINCT order_id) FROM decision_log WHERE outcome = ?",
            "closed"
        )
        .await,
        unpaid
    );
    assert_eq!(
        env.stock("sku-a").await,
        100_000 - 2 * paid as i64,
        "the closed orders' units back once"
    );
    assert_eq!(env.stock("sku-b").await, 100_000 - paid as i64);
    assert_eq!(
        env.int("SELECT COUNT(*) FROM coupons WHERE status = ?", "AVAILABLE")
            .await,
        unpaid
    );
    assert_eq!(
        env.int("SELECT COUNT(*) FROM coupons WHERE status = ?", "USED")
            .await,
        paid as i64
    );
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM effect_ledger WHERE kind = ?",
            "restore-stock"
        )
        .await,
        2 * unpaid
    );
    assert_eq!(
        env.int(
            "SELECT COUNT(DISTINCT idempotency_key) FROM effect_ledger WHERE kind = ?",
            "restore-stock"
        )
        .await,
        2 * unpaid
    );
    // Five rows per close (two lines, the coupon, the payment, the notice), none failed.
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM effect_ledger WHERE status <> ?",
            "FAILED"
        )
        .await,
        5 * unpaid
    );
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM order_timeout_msg WHERE status <> ?",
            "PROCESSED"
        )
        .await,
        0
    );
    // Each orphan re-armed by a sweep, and once only though three daemons sweep. (Rows that
    // lag more than the grace behind their due time are re-armed too: on a loaded machine the
    // burst's own rows can, so only the orphans are counted.)
    for (sql, what) in [
        (
            "SELECT COUNT(*) FROM order_timeout_msg WHERE source = 'sweep' AND order_id LIKE ?",
            "each orphan re-armed by a sweep",
        ),
        (
            "SELECT COUNT(*) FROM order_timeout_msg WHERE order_id LIKE ?",
            "one row per orphan though three daemons sweep",
        ),
    ] {
        assert_eq!(env.int(sql, "pool-%5").await, orphans as i64, "{what}");
    }
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM dead_letter WHERE order_id LIKE ?",
            "pool-%"
        )
        .await,
        0
    );
}

/// PgBouncer in `pool_mode = transaction` with 4 server connections under three daemons of 8
/// client connections each, `database.pool_mode = "transaction"` and a direct `migrate_url`:
/// the three start together (migrating through the direct URL) and close a burst of 300 orders
/// exactly once. The URL really shares server connections (the probe says so).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_daemons_behind_pgbouncer_in_transaction_mode_close_a_burst_exactly_once() {
    let Some(bin) = pgbouncer_bin() else { return };
    let env = Env::new(Backend::Postgres).await;
    let bouncer = PgBouncer::start(&bin, "transaction", 4).await;
    let url = bouncer.url(&database_of(&env));
    let config = through(&env, &url, PoolMode::Transaction, Some(&env.url));
    burst_closes_exactly_once(&env, &config, 300).await;
    let pooled = Db::connect(&url, 1).await.unwrap();
    assert!(
        matches!(pooler::probe(&pooled).await.unwrap(), Sharing::Shared(_)),
        "the daemons' URL shares server connections"
    );
    pooled.close().await;
    drop(bouncer);
    env.cleanup().await;
}

/// PgBouncer in `pool_mode = session`: the defaults (named statements, migrations through the
/// same URL) work, three daemons, a burst, exactly once; the probe sees no sharing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_daemons_behind_pgbouncer_in_session_mode_close_a_burst_exactly_once() {
    let Some(bin) = pgbouncer_bin() else { return };
    let env = Env::new(Backend::Postgres).await;
    let bouncer = PgBouncer::start(&bin, "session", 30).await;
    let url = bouncer.url(&database_of(&env));
    let config = through(&env, &url, PoolMode::Session, None);
    burst_closes_exactly_once(&env, &config, 300).await;
    let pooled = Db::connect(&url, 1).await.unwrap();
    assert_eq!(pooler::probe(&pooled).await.unwrap(), Sharing::Private);
    pooled.close().await;
    drop(bouncer);
    env.cleanup().await;
}

/// PgBouncer in `pool_mode = transaction` with `database.pool_mode` left at `"session"`: two
/// daemons started together are both refused with one line naming `pool_mode` and what to set
/// (never sqlx's `prepared statement "sqlx_s_1" already exists`), `timeoutd run` exits 76,
/// `timeoutd doctor` exits 1 with an error finding naming `database.pool_mode`, and with
/// `pool_mode = "transaction"` (and a direct `migrate_url`) the doctor's finding is ok. The
/// overdue order is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_undeclared_transaction_mode_pooler_is_refused_at_start_and_named_by_doctor() {
    let Some(bin) = pgbouncer_bin() else { return };
    let env = Env::new(Backend::Postgres).await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    let past = env.db.now_ms().await.unwrap() - 60_000;
    env.create(&order("overdue", "acme", past)).await;
    let bouncer = PgBouncer::start(&bin, "transaction", 2).await;
    let url = bouncer.url(&database_of(&env));
    let config = through(&env, &url, PoolMode::Session, None);
    let (a, b) = tokio::join!(
        Daemon::start(&config, Clock::Database),
        Daemon::start(&config, Clock::Database)
    );
    for refused in [a, b] {
        let Err(e @ StartError::Pooler(_)) = refused else {
            panic!(
                "started, or refused for another reason: {:?}",
                refused.err()
            );
        };
        let line = e.to_string();
        assert!(
            !line.contains('\n')
                && line.contains("database.pool_mode = \"transaction\"")
                && line.contains("migrate_url"),
            "{line}"
        );
        assert!(!line.contains("sqlx_s_"), "{line}");
    }
    // The binary: one line on stderr, exit 76; doctor: exit 1 naming database.pool_mode.
    let file = env.dir.path().join("pooled.toml");
    std::fs::write(
        &file,
        format!(
            "[database]\nurl = \"{url}\"\n[merchants.acme]\nplugin = \"builtin:single-phase\"\n"
        ),
    )
    .unwrap();
    let run = tokio::process::Command::new(crate::support::timeoutd_bin())
        .args(["run", "--config"])
        .arg(&file)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("refused at once")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(76), "{stderr}");
    assert!(
        stderr.contains("timeoutd: cannot start: database.url is behind a pooler")
            && stderr.contains("database.pool_mode"),
        "{stderr}"
    );
    let (code, report) = crate::support::doctor(file.clone()).await;
    assert_eq!(code, Some(1), "{report}");
    assert!(
        report.contains("error database.pool_mode: \"session\", but server connections are shared"),
        "{report}"
    );
    assert!(
        report.contains("fix: set database.pool_mode = \"transaction\" and database.migrate_url"),
        "{report}"
    );
    std::fs::write(
        &file,
        format!(
            "[database]\nurl = \"{url}\"\npool_mode = \"transaction\"\nmigrate_url = \"{}\"\n\
             [merchants.acme]\nplugin = \"builtin:single-phase\"\n",
            env.url
        ),
    )
    .unwrap();
    let (code, report) = crate::support::doctor(file).await;
    assert!(
        report.contains("ok    database.pool_mode: \"transaction\": server connections are shared"),
        "{report}"
    );
    assert!(report.contains("ok    database.migrate_url:"), "{report}");
    assert!(!report.contains("error database"), "{report}");
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(
        env.status("overdue").await,
        "PENDING",
        "nothing was closed by a refused daemon"
    );
    drop(bouncer);
    env.cleanup().await;
}

/// `pool_mode` and `migrate_url` are checked offline, each problem with its key path: a
/// transaction-mode pool that migrates needs a `migrate_url` (per shard when sharded), which
/// must be a URL of the same kind; `"transaction"` is for PostgreSQL only. Left out, the mode
/// is `"session"` and nothing else is asked.
#[test]
fn a_transaction_mode_pool_that_migrates_needs_a_migrate_url_by_key_path() {
    let load = |database: &str| {
        Config::from_toml(
            &format!("{database}\n[merchants.acme]\nplugin = \"builtin:single-phase\"\n"),
            std::path::Path::new("."),
            &|_| None,
        )
    };
    let keys = |database: &str| -> Vec<String> {
        let problems = load(database).unwrap_err();
        problems.problems.iter().map(|(k, _)| k.clone()).collect()
    };
    let pg = "postgres://app@pgbouncer:6432/shop";
    assert_eq!(
        keys(&format!(
            "[database]\nurl = \"{pg}\"\npool_mode = \"transaction\"\n"
        )),
        ["database.migrate_url"]
    );
    let problems = load(&format!(
        "[database]\nurl = \"{pg}\"\npool_mode = \"transaction\"\n"
    ))
    .unwrap_err()
    .to_string();
    assert!(
        problems.contains("database.pool_mode = \"transaction\"")
            && problems.contains("session-level lock"),
        "{problems}"
    );
    assert_eq!(
        keys(&format!(
            "[database]\nurl = \"{pg}\"\npool_mode = \"transaction\"\nmigrate_url = \"mysql://root@db/shop\"\n"
        )),
        ["database.migrate_url"]
    );
    assert_eq!(
        keys(
            "[database]\nurl = \"mysql://root@db/shop\"\npool_mode = \"transaction\"\nmigrate = false\n"
        ),
        ["database.pool_mode"]
    );
    assert_eq!(
        keys(&format!(
            "[database]\npool_mode = \"transaction\"\n[[database.shards]]\nname = \"ds_0\"\nurl = \"{pg}\"\n\
             migrate_url = \"postgres://app@db0:5432/shop\"\n[[database.shards]]\nname = \"ds_1\"\nurl = \"postgres://app@pgbouncer:6432/shop1\"\n"
        )),
        ["database.shards[1].migrate_url"]
    );
    let declared = load(&format!(
        "[database]\nurl = \"{pg}\"\npool_mode = \"transaction\"\nmigrate_url = \"postgres://app@db:5432/shop\"\n"
    ))
    .unwrap();
    assert_eq!(
        (
            declared.database.pool_mode,
            declared.database.migrate_url.as_deref()
        ),
        (PoolMode::Transaction, Some("postgres://app@db:5432/shop"))
    );
    assert_eq!(
        load(&format!(
            "[database]\nurl = \"{pg}\"\npool_mode = \"transaction\"\nmigrate = false\n"
        ))
        .unwrap()
        .database
        .pool_mode,
        PoolMode::Transaction
    );
    assert_eq!(
        load(&format!("[database]\nurl = \"{pg}\"\n"))
            .unwrap()
            .database
            .pool_mode,
        PoolMode::Session
    );
    assert!(
        load(&format!(
            "[database]\nurl = \"{pg}\"\npool_mode = \"statement\"\n"
        ))
        .is_err(),
        "statement pooling is not a mode timeoutd runs in"
    );
}

/// A PgBouncer with its default `ignore_startup_parameters` refuses the driver's
/// `extra_float_digits`: start-up is refused with one line naming the setting to add to
/// pgbouncer.ini (a pooler refusal, exit 76), not the driver's "unsupported startup parameter".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooler_refusing_the_drivers_startup_parameter_is_named_at_start() {
    let Some(bin) = pgbouncer_bin() else { return };
    let env = Env::new(Backend::Postgres).await;
    let bouncer = PgBouncer::start_strict(&bin, "transaction").await;
    let url = bouncer.url(&database_of(&env));
    let config = through(&env, &url, PoolMode::Transaction, Some(&env.url));
    let Err(e @ StartError::Pooler(_)) = Daemon::start(&config, Clock::Database).await else {
        panic!("started, or refused for another reason");
    };
    assert_eq!(
        e.to_string(),
        "database.url: the pooler refuses the driver's start-up parameter extra_float_digits: \
         add `ignore_startup_parameters = extra_float_digits` to pgbouncer.ini ([pgbouncer] \
         section) and reload it"
    );
    drop(bouncer);
    env.cleanup().await;
}

/// Daemons that do not migrate read the schema's state through the pool they work on: behind a
/// transaction-mode PgBouncer with one server connection, one started after another both start
/// (the reads are unnamed; named, the second would find the first's `sqlx_s_1` on the shared
/// server connection: 42P05).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemons_that_only_check_the_schema_start_one_after_another_on_one_server_connection() {
    let Some(bin) = pgbouncer_bin() else { return };
    let env = Env::new(Backend::Postgres).await;
    let bouncer = PgBouncer::start(&bin, "transaction", 1).await;
    let url = bouncer.url(&database_of(&env));
    let mut config = through(&env, &url, PoolMode::Transaction, None);
    config.database.migrate = false;
    let first = Daemon::start(&config, Clock::Database).await.unwrap();
    let second = Daemon::start(&config, Clock::Database).await;
    first.stop().await;
    second.expect("the second daemon starts").stop().await;
    drop(bouncer);
    env.cleanup().await;
}
