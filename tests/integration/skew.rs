//! F19: version skew (issue 49, part 4): a daemon of this build beside a schema a newer build has
//! migrated — inside its compatibility window it starts and keeps closing a burst exactly once
//! beside another daemon; outside it, or with a migration half-applied, start-up refuses with one
//! line and `timeoutd run` exits 78 ([`timeoutd::cli::EXIT_SCHEMA`]) — and DDL that gives up a
//! lock quickly and retries instead of queueing the order service behind it.
//!
//! An older binary cannot be built here, so the newer build is simulated in this one: after
//! migrating, the test does what a newer build's migration would (an additive column, its row
//! in `_sqlx_migrations`, the window in `timeoutd_schema`).

use std::time::{Duration, Instant};

use sqlx::Row;
use timeoutd::clock::Clock;
use timeoutd::daemon::{Daemon, StartError};
use timeoutd::db::migrate::SchemaError;
use timeoutd::db::{Backend, Db};

use crate::support::{Env, MerchantSpec, each_backend, order};

const SINGLE: &[MerchantSpec<'static>] = &[("acme", "builtin:single-phase", &[])];

async fn exec(db: &Db, sql: &str) {
    sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
        .execute(db.pool())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn int(db: &Db, sql: &str) -> i64 {
    sqlx::query(sqlx::AssertSqlSafe(sql.to_string()))
        .fetch_one(db.pool())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .get::<i64, _>(0)
}

/// What a newer build's additive migration `version` does: a nullable column, its row in
/// `_sqlx_migrations`, and the window it records (`compatible_from`).
async fn newer_build_migrates(env: &Env, version: i64, compatible_from: i64) {
    exec(
        &env.db,
        "ALTER TABLE orders ADD COLUMN future_note VARCHAR(64) NULL",
    )
    .await;
    env.db
        .backend()
        .query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
             VALUES (?, 'future note', TRUE, ?, 0)",
        )
        .bind(version)
        .bind(vec![7u8; 48])
        .execute(env.db.pool())
        .await
        .unwrap();
    set_window(env, version, compatible_from).await;
}

async fn set_window(env: &Env, version: i64, compatible_from: i64) {
    env.db
        .backend()
        .query(
            "UPDATE timeoutd_schema SET version = ?, compatible_from = ?, \
             written_by = '0.2.0 (simulated newer build)' WHERE id = 1",
        )
        .bind(version)
        .bind(compatible_from)
        .execute(env.db.pool())
        .await
        .unwrap();
}

/// `n` overdue orders named `{prefix}-{i}`, each with its phase-0 outbox row.
async fn burst(env: &Env, prefix: &str, n: usize) {
    let past = env.db.now_ms().await.unwrap() - 1_000;
    for i in 0..n {
        env.create(&order(&format!("{prefix}-{i}"), "acme", past))
            .await;
    }
}

/// A config file for the `timeoutd` binary on `env`'s database (no admin or HTTP port).
fn config_file(env: &Env) -> std::path::PathBuf {
    env.single_phase_config_file("skew.toml")
}

/// `timeoutd run` on `env`'s database, expected to refuse at once: its exit code and stderr.
async fn run_binary(env: &Env) -> (Option<i32>, String) {
    let file = config_file(env);
    let started = Instant::now();
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(crate::support::timeoutd_bin())
            .args(["run", "--config"])
            .arg(&file)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("a refused start exits at once")
    .unwrap();
    eprintln!(
        "timeoutd run exited {:?} after {:?}",
        out.status.code(),
        started.elapsed()
    );
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The one line `timeoutd run` printed on refusing.
fn refusal_line(stderr: &str) -> &str {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("cannot start"))
        .collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    eprintln!("{}", lines[0]);
    lines[0]
}

async fn doctor(env: &Env) -> (Option<i32>, String) {
    let file = env.dir.path().join("doctor.toml");
    std::fs::write(
        &file,
        format!(
            "[database]\nurl = \"{}\"\n[merchants.acme]\nplugin = \"builtin:single-phase\"\n",
            env.url
        ),
    )
    .unwrap();
    crate::support::doctor(file).await
}

each_backend! {
    /// A rolling upgrade and a rollback with two daemons under load. A newer build migrates
    /// (an additive migration, the window kept at this build) while a daemon of this build
    /// closes a burst; a second daemon of this build then starts beside the newer schema
    /// without applying anything, and the two close another burst — each order closed once,
    /// stock exact. When the newer build's window moves past this build, start-up refuses with
    /// one line naming both versions (`StartError::Schema`, exit 78); a half-applied migration
    /// is refused the same way and is an error in `doctor`, and the documented recovery clears it.
    async fn an_older_build_runs_beside_a_newer_schema_inside_its_window_and_refuses_outside(env) {
        let latest = timeoutd::db::latest_schema_version(env.db.backend());
        let future = latest + 1;
        let n = 60;
        env.stock_up(&[("sku-a", 10_000), ("sku-b", 10_000)]).await;
        let config = env.config(SINGLE, "[sweep]\ninterval = \"200ms\"\ngrace = \"1s\"\n");

        // Rolling upgrade: the newer build migrates while this build's daemon is closing.
        let a = Daemon::start(&config, Clock::Database).await.unwrap();
        burst(env, "up", n).await;
        newer_build_migrates(env, future, latest).await;
        // Rollback: a daemon of this build (re)started beside the newer schema.
        let rows_before = int(&env.db, "SELECT COUNT(*) FROM _sqlx_migrations").await;
        let b = Daemon::start(&config, Clock::Database)
            .await
            .expect("inside its window this build starts beside the newer schema");
        assert_eq!(int(&env.db, "SELECT COUNT(*) FROM _sqlx_migrations").await, rows_before, "nothing applied");
        assert_eq!(int(&env.db, "SELECT version FROM timeoutd_schema WHERE id = 1").await, future, "the newer build's window stands");
        // The same from the command line: one warning naming both versions, then it runs.
        let log = env.dir.path().join("inside.log");
        let mut third = crate::support::started_daemon(&config_file(env), &[], &log).await;
        let said = std::fs::read_to_string(&log).unwrap();
        let warned: Vec<&str> = said.lines().filter(|l| l.contains("newer than this build's")).collect();
        assert_eq!(warned.len(), 1, "{said}");
        eprintln!("{}", warned[0]);
        assert!(
            warned[0].contains(&format!("database schema version {future}")) && warned[0].contains(&format!("this build's {latest}")),
            "{said}"
        );
        crate::support::sigterm(&mut third, Duration::from_secs(10)).await;
        burst(env, "down", n).await;
        crate::support::eventually(Duration::from_secs(60), "both bursts closed", || async {
            env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "CLOSED").await == 2 * n as i64
        })
        .await;
        a.stop().await;
        b.stop().await;
        assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE outcome = ?", "closed").await, 2 * n as i64, "each order closed once");
        assert_eq!(
            int(&env.db, "SELECT COUNT(*) FROM (SELECT order_id FROM decision_log WHERE outcome = 'closed' GROUP BY order_id HAVING COUNT(*) > 1) twice").await,
            0
        );
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (10_000, 10_000), "stock exact");
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE kind = ?", "restore-stock").await, 4 * n as i64);

        // Outside the window: the newer build's migration is declared breaking.
        set_window(env, future, future).await;
        let refused = Daemon::start(&config, Clock::Database).await;
        let Err(StartError::Schema(e @ SchemaError::TooNew { .. })) = refused else {
            panic!("outside its window start-up must refuse: {:?}", refused.err());
        };
        let said = e.to_string();
        for part in [format!("schema version {future}"), format!("at least {future}"), format!("this build's is {latest}"), "upgrade this daemon".to_string()] {
            assert!(said.contains(&part), "missing `{part}` in: {said}");
        }
        // A daemon that does not migrate (database.migrate = false) checks the window too.
        let mut not_migrating = config.clone();
        not_migrating.database.migrate = false;
        let refused = Daemon::start(&not_migrating, Clock::Database).await;
        assert!(
            matches!(refused, Err(StartError::Schema(SchemaError::TooNew { .. }))),
            "{:?}",
            refused.err()
        );
        let (code, stderr) = run_binary(env).await;
        assert_eq!(code, Some(78), "{stderr}");
        let line = refusal_line(&stderr);
        assert!(line.contains(&format!("schema version {future}")) && line.contains(&format!("this build's is {latest}")), "{line}");
        let (code, report) = doctor(env).await;
        assert_eq!(code, Some(1), "{report}");
        assert!(report.contains(&format!("error database.schema: database schema version {future}")), "{report}");

        // Half-applied: the newer build's migration recorded success = 0.
        set_window(env, future, latest).await;
        env.db.backend().query("UPDATE _sqlx_migrations SET success = FALSE WHERE version = ?")
            .bind(future).execute(env.db.pool()).await.unwrap();
        let refused = Daemon::start(&config, Clock::Database).await;
        let Err(StartError::Schema(e @ SchemaError::HalfApplied { .. })) = refused else {
            panic!("a half-applied migration must stop start-up: {:?}", refused.err());
        };
        assert!(e.to_string().contains(&format!("migration {future} (future note) is half-applied")), "{e}");
        let (code, stderr) = run_binary(env).await;
        assert_eq!(code, Some(78), "{stderr}");
        let line = refusal_line(&stderr);
        assert!(line.contains(&format!("DELETE FROM _sqlx_migrations WHERE version = {future}")), "{line}");
        let (code, report) = doctor(env).await;
        assert_eq!(code, Some(1), "{report}");
        assert!(report.contains(&format!("error database.schema: migration {future} (future note) is half-applied")), "{report}");
        assert!(report.contains("fix: compare host/timeoutd/migrations/"), "{report}");
        assert!(!report.contains("as this build expects"), "{report}");

        // The recovery the line names: the column is harmless (revert it or not), drop the row.
        env.db.backend().query("DELETE FROM _sqlx_migrations WHERE version = ?")
            .bind(future).execute(env.db.pool()).await.unwrap();
        let again = Daemon::start(&config, Clock::Database).await.expect("starts after the recovery");
        again.stop().await;
        assert_eq!(int(&env.db, "SELECT version FROM timeoutd_schema WHERE id = 1").await, latest, "this build's window again");
        let (code, report) = doctor(env).await;
        assert!(report.contains(&format!("ok    database.schema: version {latest}, as this build expects")), "{code:?} {report}");
    }
}

/// Migration 10 made pending again on a migrated database: its DDL reverted, its row deleted.
async fn unapply_migration_10(env: &Env) {
    let on = |table: &str| match env.db.backend() {
        Backend::MySql => format!(" ON {table}"),
        _ => String::new(),
    };
    exec(&env.db, "DROP TABLE maintenance_lease").await;
    for (index, table) in [
        ("decision_log_decided", "decision_log"),
        ("effect_ledger_status_updated", "effect_ledger"),
        ("order_timeout_msg_status_processed", "order_timeout_msg"),
        ("order_timeout_msg_claim", "order_timeout_msg"),
    ] {
        exec(&env.db, &format!("DROP INDEX {index}{}", on(table))).await;
    }
    exec(&env.db, "DELETE FROM _sqlx_migrations WHERE version = 10").await;
}

/// A long transaction holds `order_timeout_msg` (as the order service's would) while migration
/// 10 needs to index it. The migration waits at most the short lock wait at a time and retries:
/// the order service's INSERTs into that table are held up in separate waves (one per try),
/// never for much more than one wait, and the migration is still running after three waits'
/// worth; once the transaction ends, it completes.
async fn ddl_gives_up_a_held_lock_quickly_and_retries(backend: Backend) {
    let env = Env::new(backend).await;
    unapply_migration_10(&env).await;
    let holder = Db::connect(&env.url, 1).await.unwrap();
    let mut long = holder.pool().begin().await.unwrap();
    sqlx::query("UPDATE order_timeout_msg SET due_ms = due_ms WHERE id = -1")
        .execute(&mut *long)
        .await
        .unwrap();

    let migrator = Db::connect(&env.url, 2).await.unwrap();
    let service = Db::connect(&env.url, 1).await.unwrap();
    let wait = timeoutd::db::migrate::DDL_LOCK_WAIT;
    let started = Instant::now();
    let applied_after = std::sync::Mutex::new(None::<Duration>);
    let migration = async {
        let migrated = migrator.migrate().await;
        *applied_after.lock().unwrap() = Some(started.elapsed());
        migrated
    };
    // The order service keeps inserting its rows: how long does each wait?
    let order_service = async {
        let mut longest = Duration::ZERO;
        // When each insert that was held up (≥ 300 ms) began: one wave per try of the DDL.
        let mut held: Vec<Duration> = Vec::new();
        let mut i = 0;
        while started.elapsed() < wait * 3 + Duration::from_millis(500) {
            let t = Instant::now();
            let insert = service
                .backend()
                .query("INSERT INTO order_timeout_msg (order_id, due_ms, phase, status) VALUES (?, ?, 0, 'PENDING')")
                .bind(format!("svc-{i}"))
                .bind(i64::MAX / 2)
                .execute(service.pool());
            // Bounded, so a DDL that queues the inserts indefinitely fails the test, not hangs it.
            if let Ok(inserted) = tokio::time::timeout(Duration::from_secs(10), insert).await {
                inserted.unwrap();
            }
            longest = longest.max(t.elapsed());
            if t.elapsed() >= Duration::from_millis(300) {
                held.push(t - started);
            }
            i += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Inserts held by one try of the DDL begin within its wait; the next try's, after its
        // backoff.
        let waves = 1 + held.windows(2).filter(|w| w[1] - w[0] > wait / 2).count();
        eprintln!(
            "{backend:?}: {i} inserts while the lock was held; the longest waited {longest:?}; \
             held in {waves} waves, beginning at {held:?}"
        );
        assert!(waves >= 2, "the DDL gave up and tried again: {held:?}");
        assert!(
            applied_after.lock().unwrap().is_none(),
            "still retrying after three lock waits: {:?}",
            started.elapsed()
        );
        assert!(
            longest >= Duration::from_millis(300),
            "the DDL really queued the inserts ({longest:?}): the test holds the lock it needs"
        );
        assert!(
            longest <= wait + Duration::from_millis(1_500),
            "an insert waited {longest:?} behind the DDL (lock wait {wait:?})"
        );
        assert_eq!(
            int(
                &env.db,
                "SELECT COUNT(*) FROM _sqlx_migrations WHERE version = 10 AND success = TRUE"
            )
            .await,
            0,
            "not applied while the lock is held"
        );
        long.rollback().await.unwrap();
    };
    let (done, ()) = tokio::time::timeout(Duration::from_secs(40), async {
        tokio::join!(migration, order_service)
    })
    .await
    .expect("the migration completes once the transaction ends");
    done.expect("migration 10 applied");
    let released_to_applied = applied_after.lock().unwrap().unwrap();
    eprintln!("{backend:?}: migration 10 applied {released_to_applied:?} after it started");
    assert_eq!(
        int(
            &env.db,
            "SELECT COUNT(*) FROM _sqlx_migrations WHERE version = 10 AND success = TRUE"
        )
        .await,
        1
    );
    assert_eq!(
        int(&env.db, "SELECT COUNT(*) FROM maintenance_lease").await,
        0,
        "its table is there"
    );
    let indexed = match backend {
        Backend::MySql => {
            "SELECT COUNT(*) FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = DATABASE() AND INDEX_NAME = 'order_timeout_msg_claim'"
        }
        _ => "SELECT COUNT(*) FROM pg_indexes WHERE indexname = 'order_timeout_msg_claim'",
    };
    assert_eq!(
        int(&env.db, indexed).await,
        1,
        "the held table got its index"
    );
    for db in [holder, migrator, service] {
        db.close().await;
    }
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ddl_gives_up_a_held_lock_quickly_and_retries_mariadb() {
    ddl_gives_up_a_held_lock_quickly_and_retries(Backend::MySql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ddl_gives_up_a_held_lock_quickly_and_retries_postgres() {
    ddl_gives_up_a_held_lock_quickly_and_retries(Backend::Postgres).await;
}

/// MariaDB: a lock held longer than all the tries. Migration 10's first three statements apply,
/// the fourth (an index on the held table) waits; a start cancelled then leaves the row saying
/// where to resume, and the next one resumes there, gives up after every try and fails with a
/// transient error (exit 1, not 78) naming the statement. Once the transaction ends, the next
/// migration resumes at that statement instead of refusing the half-applied row or re-running
/// the first three.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_migration_that_gives_up_on_a_lock_resumes_where_it_stopped_mariadb() {
    use timeoutd::db::DbError;
    let env = Env::new(Backend::MySql).await;
    unapply_migration_10(&env).await;
    let holder = Db::connect(&env.url, 1).await.unwrap();
    let mut long = holder.pool().begin().await.unwrap();
    sqlx::query("UPDATE order_timeout_msg SET due_ms = due_ms WHERE id = -1")
        .execute(&mut *long)
        .await
        .unwrap();
    let migrator = Db::connect(&env.url, 2).await.unwrap();
    // A start cancelled while the migration waits (as a shard's start is after its lease):
    // the row already says where to resume.
    assert!(
        tokio::time::timeout(Duration::from_secs(3), migrator.migrate())
            .await
            .is_err()
    );
    let state = timeoutd::db::migrate::schema_state(&env.db)
        .await
        .unwrap()
        .unwrap();
    let half = state
        .half_applied
        .expect("migration 10 is recorded half-applied");
    assert_eq!((half.version, half.resume_at), (10, Some(3)));
    let started = Instant::now();
    let gave_up = tokio::time::timeout(Duration::from_secs(90), migrator.migrate())
        .await
        .expect("the tries are bounded");
    eprintln!("gave up after {:?}: {gave_up:?}", started.elapsed());
    let Err(DbError::Schema(e @ SchemaError::LockWait { .. })) = gave_up else {
        panic!("a lock held past every try fails the migration: {gave_up:?}");
    };
    assert!(!e.needs_operator(), "transient: systemd may restart it");
    let said = e.to_string();
    for part in [
        "migration 10 statement 4",
        "6 times",
        "statements 1–3 are applied; the next start resumes at 4",
    ] {
        assert!(said.contains(part), "missing `{part}` in: {said}");
    }
    let state = timeoutd::db::migrate::schema_state(&env.db)
        .await
        .unwrap()
        .unwrap();
    let half = state
        .half_applied
        .expect("migration 10 is recorded half-applied");
    assert_eq!((half.version, half.resume_at), (10, Some(3)));
    assert_eq!(
        int(&env.db, "SELECT COUNT(*) FROM maintenance_lease").await,
        0,
        "statement 1 applied"
    );

    long.rollback().await.unwrap();
    migrator
        .migrate()
        .await
        .expect("resumed once the lock is free");
    assert_eq!(
        int(
            &env.db,
            "SELECT COUNT(*) FROM _sqlx_migrations WHERE version = 10 AND success = TRUE"
        )
        .await,
        1
    );
    assert_eq!(
        int(
            &env.db,
            "SELECT COUNT(DISTINCT INDEX_NAME) FROM information_schema.STATISTICS \
             WHERE TABLE_SCHEMA = DATABASE() AND INDEX_NAME IN ('decision_log_decided', \
             'effect_ledger_status_updated', 'order_timeout_msg_status_processed', \
             'order_timeout_msg_claim')"
        )
        .await,
        4,
        "every index of migration 10, each made once"
    );
    for db in [holder, migrator] {
        db.close().await;
    }
    env.cleanup().await;
}
