//! The group close on a three-node MariaDB Galera cluster (ignored in the normal suite: start
//! one with `scripts/galera start DIR`, then `cargo test -p timeoutd-tests --test integration --
//! galera:: --ignored`). Node N answers SQL on 127.0.0.1:341N. What these pin is docs/scaling.md's
//! "The Galera double close of 2026-12-02": why a close racing another node's close commits
//! once, whichever statement the group close uses, and the one thing that would break it.

use std::sync::Arc;

use futures_util::future::join_all;
use timeoutd::clock::Clock;
use timeoutd::db::orders::{self, CloseStamp};
use timeoutd::db::shop::Schema;
use timeoutd::db::{Backend, Db, DbError, journal};
use timeoutd::dispatch::Dispatcher;

use crate::support::{Env, MerchantSpec, T0, closed_record, order};

/// The nodes' SQL addresses (`scripts/galera`).
const NODES: [&str; 3] = ["127.0.0.1:3411", "127.0.0.1:3412", "127.0.0.1:3413"];

const SINGLE: &[MerchantSpec<'static>] = &[("acme", "builtin:single-phase", &[])];

/// A fresh migrated database on node 1 (replicated to the others).
async fn on_cluster() -> Env {
    Env::new_on(
        Backend::MySql,
        &format!("mysql://root@{}/test", NODES[0]),
        "",
    )
    .await
}

/// `env`'s database as node `n` (0-based) serves it.
async fn node(env: &Env, n: usize) -> Db {
    Db::connect(&env.url.replacen(NODES[0], NODES[n], 1), 4)
        .await
        .unwrap_or_else(|e| panic!("node {} must answer: {e}", n + 1))
}

fn stamp(closed_by: &str) -> CloseStamp<'_> {
    CloseStamp {
        now_ms: T0,
        due_ms: T0 - 1_000,
        closed_by,
        reason: "unpaid",
    }
}

/// The group close's compare-and-set as commit 2969229 wrote it on MariaDB (the stamps joined
/// through a derived table), the statement of the run that audited 106 orders closed twice.
async fn derived_table_close(
    conn: &mut sqlx::AnyConnection,
    closes: &[(&str, CloseStamp<'_>)],
    now_ms: i64,
) -> Result<u64, DbError> {
    let rest = " UNION ALL SELECT ?, ?, ?, ?".repeat(closes.len() - 1);
    let mut q = Backend::MySql.query_owned(format!(
        "UPDATE orders JOIN (SELECT ? AS id, ? AS due_ms, ? AS closed_by, ? AS reason{rest}) v \
         ON orders.id = v.id \
         SET orders.status = 'CLOSED', orders.closed_at_ms = ?, \
         orders.close_due_ms = v.due_ms, orders.closed_by = v.closed_by, \
         orders.close_reason = v.reason \
         WHERE COALESCE(orders.status, '') = 'PENDING' AND orders.deadline_ms + 0 <= ?"
    ));
    for (id, s) in closes {
        q = q
            .bind(id.to_string())
            .bind(s.due_ms)
            .bind(s.closed_by.to_string())
            .bind(s.reason.to_string());
    }
    Ok(q.bind(now_ms)
        .bind(now_ms)
        .execute(&mut *conn)
        .await?
        .rows_affected())
}

/// Whether `e` is Galera's answer to a transaction it aborted: `1213 Deadlock found`.
fn is_abort(e: &DbError) -> bool {
    matches!(e, DbError::Sql(sqlx::Error::Database(d)) if d.code().as_deref() == Some("40001"))
}

/// The deterministic interleaving of the chaos run's double close: a group close on node 2
/// holds two orders (`FOR UPDATE`, as `lock_pending` does), node 1 closes one of them and
/// commits; applying that commit, node 2 aborts the group's transaction. The group's
/// compare-and-set then fails with 1213 — with the CASE lists and with the derived-table join
/// alike — and the group wrote nothing: the order is closed once, by node 1, and its partner is
/// still PENDING for its own trigger.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Galera cluster: scripts/galera start DIR"]
async fn a_group_close_aborted_by_another_nodes_close_fails_with_either_statement_and_writes_nothing()
 {
    let env = on_cluster().await;
    env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
    let node2 = node(&env, 1).await;
    for form in ["case", "derived"] {
        let (a, b) = (format!("{form}-a"), format!("{form}-b"));
        env.create(&order(&a, "acme", T0 - 1_000)).await;
        env.create(&order(&b, "acme", T0 - 1_000)).await;
        let mut group = node2.begin().await.unwrap();
        let locked = orders::lock_pending(
            &mut group,
            &Schema::Canonical,
            &[a.as_str(), b.as_str()],
            Some(T0),
        )
        .await
        .unwrap();
        assert_eq!(locked, vec![a.clone(), b.clone()], "{form}");
        let mut single = env.db.begin().await.unwrap();
        assert!(
            orders::compare_and_close(&mut single, &a, &stamp("sweep"))
                .await
                .unwrap()
        );
        single.commit().await.unwrap();
        // A causal read on node 2 returns once node 2 has applied node 1's close, which it can
        // only do after aborting the group holding the row.
        let seen = orders::status_of(&mut node2.pool().acquire().await.unwrap(), &a)
            .await
            .unwrap();
        assert_eq!(seen.as_deref(), Some("CLOSED"), "{form}");
        let closes = [(a.as_str(), stamp("outbox")), (b.as_str(), stamp("outbox"))];
        let cas = match form {
            "case" => orders::close_many(&mut group, &Schema::Canonical, &closes, T0).await,
            _ => derived_table_close(&mut group, &closes, T0).await,
        };
        let e = cas.expect_err("the aborted group's compare-and-set must fail");
        assert!(is_abort(&e), "{form}: {e}");
        drop(group);
        assert_eq!(
            env.text("SELECT closed_by FROM orders WHERE id = ?", &a)
                .await,
            "sweep",
            "{form}"
        );
        assert_eq!(env.status(&b).await, "PENDING", "{form}");
    }
    node2.close().await;
    env.cleanup().await;
}

/// The chaos run's symptom, and the fence that makes it impossible (`db/fence.rs`). Once
/// Galera has aborted a transaction the session is outside any transaction: in a plain `BEGIN`
/// transaction (autocommit on) a statement a client sends anyway commits by itself, so a close
/// record says the order was closed by a transaction that closed nothing — decided closed by
/// the outbox, still PENDING, later closed by the sweep. Through [`Db::begin`] the same stray
/// statement opens a new transaction instead, and the commit finds its fence gone, rolls it
/// back and fails: one close record, the sweep's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Galera cluster: scripts/galera start DIR"]
async fn after_galera_aborts_a_close_a_statement_sent_anyway_commits_alone_unless_fenced() {
    let env = on_cluster().await;
    env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
    let node2 = node(&env, 1).await;
    for fenced in [false, true] {
        let id = if fenced { "fenced" } else { "plain" };
        env.create(&order(id, "acme", T0 - 1_000)).await;
        let mut plain: Option<sqlx::Transaction<'static, sqlx::Any>> = None;
        let mut fence: Option<timeoutd::db::WriteTx> = None;
        let group: &mut sqlx::AnyConnection = if fenced {
            fence.insert(node2.begin().await.unwrap())
        } else {
            plain.insert(node2.pool().begin().await.unwrap())
        };
        orders::lock_pending(&mut *group, &Schema::Canonical, &[id], Some(T0))
            .await
            .unwrap();
        let mut single = env.db.begin().await.unwrap();
        assert!(
            orders::compare_and_close(&mut single, id, &stamp("sweep"))
                .await
                .unwrap()
        );
        journal::log_decision(&mut single, &closed_record(id, "sweep"))
            .await
            .unwrap();
        single.commit().await.unwrap();
        orders::status_of(&mut node2.pool().acquire().await.unwrap(), id)
            .await
            .unwrap();
        let e = orders::close_many(
            &mut *group,
            &Schema::Canonical,
            &[(id, stamp("outbox"))],
            T0,
        )
        .await
        .expect_err("aborted");
        assert!(is_abort(&e), "{e}");
        // What a daemon would do had the error never reached it: carry on, then commit.
        journal::log_decision(group, &closed_record(id, "outbox"))
            .await
            .expect("the server takes a statement after the abort");
        let records = if let Some(tx) = fence {
            let e = tx
                .commit()
                .await
                .expect_err("the fence is gone with the aborted transaction");
            assert!(matches!(e, DbError::Aborted { .. }), "{e}");
            1
        } else {
            plain.unwrap().commit().await.unwrap();
            2
        };
        assert_eq!(
            env.int(
                "SELECT COUNT(*) FROM decision_log WHERE order_id = ? AND outcome = 'closed'",
                id
            )
            .await,
            records,
            "{id}: close records"
        );
    }
    assert_eq!(
        env.int("SELECT COUNT(*) FROM write_fence WHERE token <> ?", "0")
            .await,
        0
    );
    node2.close().await;
    env.cleanup().await;
}

/// F9 across nodes: three daemons, one per node, handle the same 90 claimed triggers (every
/// fifth order paid first) as shuffled groups of 15 at the same time. Certification aborts the
/// losers of each race (their groups split, their single closes retried); every unpaid order
/// ends closed exactly once, with one close record, and the stock comes back exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs a Galera cluster: scripts/galera start DIR"]
async fn three_daemons_on_three_nodes_racing_through_one_burst_close_each_order_once() {
    let env = on_cluster().await;
    env.stock_up(&[("sku-a", 10_000), ("sku-b", 10_000)]).await;
    let n = 90;
    let ids: Vec<String> = (0..n).map(|i| format!("race-{i:03}")).collect();
    for id in &ids {
        env.create(&order(id, "acme", T0)).await;
    }
    for id in ids.iter().step_by(5) {
        assert!(env.pay(id, T0 - 10).await);
    }
    let paid = n / 5;
    let config = env.config(SINGLE, "");
    let (clock, now) = Clock::manual(T0 + 1);
    let mut daemons: Vec<Arc<Dispatcher>> = Vec::new();
    for node in NODES {
        let url = env.url.replacen(NODES[0], node, 1);
        daemons.push(env.dispatcher_on(&url, &config, clock.clone()).await);
    }
    let triggers = env.claim(T0 + 1).await;
    assert_eq!(triggers.len(), n);
    join_all(daemons.iter().map(|d| {
        let mut mine = triggers.clone();
        fastrand::shuffle(&mut mine);
        async move {
            for group in mine.chunks(15) {
                d.handle_group(group).await;
            }
        }
    }))
    .await;
    // Triggers whose every attempt lost a certification conflict come back after their
    // backoff; daemon 1 takes them then.
    for round in 1..=5 {
        let later = T0 + 1 + round * 3_600_000;
        now.store(later, std::sync::atomic::Ordering::SeqCst);
        if env.process(&daemons[0], later).await.is_empty() {
            break;
        }
    }
    let unpaid = (n - paid) as i64;
    assert_eq!(
        env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "CLOSED")
            .await,
        unpaid
    );
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM (SELECT order_id FROM decision_log WHERE outcome = ? \
             GROUP BY order_id HAVING COUNT(*) > 1) d",
            "closed"
        )
        .await,
        0,
        "an order closed twice"
    );
    assert_eq!(
        env.int(
            "SELECT COUNT(DISTINCT order_id) FROM decision_log WHERE outcome = ?",
            "closed"
        )
        .await,
        unpaid
    );
    // Each order took 2 × sku-a and 1 × sku-b; the closed ones gave theirs back, once.
    assert_eq!(
        (env.stock("sku-a").await, env.stock("sku-b").await),
        (10_000 - 2 * paid as i64, 10_000 - paid as i64)
    );
    env.cleanup().await;
}
