//! Database engines beyond one MariaDB or PostgreSQL server: what timeoutd refuses at start-up
//! (a MariaDB Spider front), and what it does on the others. Needs the Spider front that
//! `scripts/spider start` runs (`TIMEOUTD_TEST_SPIDER_URL`, `TIMEOUTD_TEST_SPIDER_BACKEND_URL`;
//! scripts/test sets them). The Galera and Patroni runs are chaos runs (`scripts/chaos
//! --backend galera|patroni`).

use timeoutd::clock::Clock;
use timeoutd::daemon::{Daemon, StartError};
use timeoutd::db::{Backend, Db};

use crate::support::Env;

fn spider_urls() -> (String, String) {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!("{name} is not set: scripts/test starts a Spider front (scripts/spider start; eval \"$(scripts/spider env)\")")
        })
    };
    (
        var("TIMEOUTD_TEST_SPIDER_URL"),
        var("TIMEOUTD_TEST_SPIDER_BACKEND_URL"),
    )
}

async fn exec(db: &Db, sql: String) {
    sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
        .execute(db.pool())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// An order database whose `orders` table is a Spider table over two shards (as a shop that
/// shards with Spider has it) is refused at start-up, naming the table and saying what to run
/// instead; `timeoutd doctor` names it as an error too. Nothing is touched: the overdue order
/// on its shard stays PENDING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spider_orders_table_is_refused_at_start_up_by_name() {
    let (front, backend) = spider_urls();
    let env = Env::new_on(Backend::MySql, &front, "").await;
    let table = format!("orders_{:08x}", fastrand::u32(..));
    let ddl: String = sqlx::Row::get(
        &sqlx::query("SHOW CREATE TABLE orders")
            .fetch_one(env.db.pool())
            .await
            .unwrap(),
        1,
    );
    let shards = Db::connect(&backend, 1).await.unwrap();
    for shard in ["shard0", "shard1"] {
        exec(
            &shards,
            ddl.replacen(
                "CREATE TABLE `orders`",
                &format!("CREATE TABLE {shard}.{table}"),
                1,
            ),
        )
        .await;
    }
    exec(
        &env.db,
        format!(
            "ALTER TABLE orders ENGINE = SPIDER COMMENT = 'wrapper \"mysql\", table \"{table}\"' \
             PARTITION BY KEY (id) (PARTITION p0 COMMENT = 'srv \"s0\"', \
             PARTITION p1 COMMENT = 'srv \"s1\"')"
        ),
    )
    .await;
    // An overdue order and its phase-0 row, written through the front.
    let now = env.db.now_ms().await.unwrap();
    exec(
        &env.db,
        format!(
            "INSERT INTO orders (id, merchant_id, user_id, status, created_at_ms, deadline_ms, \
             total_cents) VALUES ('spider-1', 'acme', 'u1', 'PENDING', {}, {}, 100)",
            now - 60_000,
            now - 30_000
        ),
    )
    .await;
    exec(
        &env.db,
        format!(
            "INSERT INTO order_timeout_msg (order_id, due_ms, phase, status) \
             VALUES ('spider-1', {}, 0, 'PENDING')",
            now - 30_000
        ),
    )
    .await;

    let config = env.config(&[("acme", "builtin:single-phase", &[])], "");
    let refused = Daemon::start(&config, Clock::Database).await;
    let Err(e @ StartError::Unsafe(_)) = refused else {
        panic!("a Spider orders table must be refused at start-up");
    };
    let said = e.to_string();
    for part in [
        "the database cannot run timeoutd safely",
        "table `orders` is a Spider table",
        "drops SKIP LOCKED",
        "each backend shard",
    ] {
        assert!(said.contains(part), "missing `{part}` in: {said}");
    }
    let on_shard: i64 = sqlx::Row::get(
        &sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT (SELECT COUNT(*) FROM shard0.{table} WHERE status = 'PENDING') \
             + (SELECT COUNT(*) FROM shard1.{table} WHERE status = 'PENDING')"
        )))
        .fetch_one(shards.pool())
        .await
        .unwrap(),
        0,
    );
    assert_eq!(on_shard, 1, "the order on its shard is untouched");

    let file = env.dir.path().join("spider.toml");
    std::fs::write(
        &file,
        format!(
            "[database]\nurl = \"{}\"\nmigrate = false\n[merchants.acme]\nplugin = \"builtin:single-phase\"\n",
            env.url
        ),
    )
    .unwrap();
    let (code, report) = crate::support::doctor(file).await;
    assert_eq!(code, Some(1), "{report}");
    assert!(
        report.contains("error database.engine: table `orders` is a Spider table"),
        "{report}"
    );
    for shard in ["shard0", "shard1"] {
        exec(&shards, format!("DROP TABLE {shard}.{table}")).await;
    }
    shards.close().await;
    env.cleanup().await;
}
