//! The write fence (`host/timeoutd/src/db/fence.rs`) on a single MariaDB server: a write
//! transaction the server ended on its own commits nothing, whatever its client sends after.
//! The Galera form of the same proof is `galera::after_galera_aborts_a_close_…` (ignored
//! there: it needs a cluster); here the abort is a deadlock, which ends a transaction the same
//! way.

use timeoutd::db::orders;
use timeoutd::db::shop::Schema;
use timeoutd::db::{Backend, DbError, journal};

use crate::support::{Env, T0, closed_record, order};

/// Whether `e` is the server's `1213 Deadlock found` (SQLSTATE 40001).
fn is_deadlock(e: &DbError) -> bool {
    matches!(e, DbError::Sql(sqlx::Error::Database(d)) if d.code().as_deref() == Some("40001"))
}

/// A close is made the victim of a deadlock (the server rolls it back whole) and carries on as
/// if the error had never reached it: it writes its close record and commits. The stray record
/// must not be kept — on a plain `BEGIN` transaction it would commit by itself — and the commit
/// must fail naming the abort. The other close, the deadlock's survivor, commits as usual, and
/// `write_fence` is empty after both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deadlock_victim_that_carries_on_commits_nothing_and_its_commit_names_the_abort() {
    let env = Env::new(Backend::MySql).await;
    env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
    for id in ["v", "w"] {
        env.create(&order(id, "acme", T0 - 1_000)).await;
    }
    // The victim: one row locked, nothing else written but its fence.
    let mut victim = env.db.begin().await.unwrap();
    orders::lock_pending(&mut victim, &Schema::Canonical, &["v"], Some(T0))
        .await
        .unwrap();
    // The survivor has written more (InnoDB rolls back the transaction that wrote least).
    let mut survivor = env.db.begin().await.unwrap();
    orders::lock_pending(&mut survivor, &Schema::Canonical, &["w"], Some(T0))
        .await
        .unwrap();
    for k in 0..20 {
        let other = format!("filler-{k}");
        journal::log_decision(&mut survivor, &closed_record(&other, "sweep"))
            .await
            .unwrap();
    }
    let survivor = tokio::spawn(async move {
        orders::lock_pending(&mut survivor, &Schema::Canonical, &["v"], Some(T0)).await?;
        survivor.commit().await
    });
    env.until_waiting_on_a_lock().await;
    let e = orders::lock_pending(&mut victim, &Schema::Canonical, &["w"], Some(T0))
        .await
        .expect_err("the victim of the deadlock");
    assert!(is_deadlock(&e), "{e}");
    survivor.await.unwrap().expect("the survivor commits");
    // What a close would do had the error been lost on its way: carry on, then commit.
    journal::log_decision(&mut victim, &closed_record("v", "outbox"))
        .await
        .expect("the server takes a statement after the abort");
    let e = victim
        .commit()
        .await
        .expect_err("the fence went with the aborted transaction");
    assert!(matches!(e, DbError::Aborted { .. }), "{e}");
    assert!(e.to_string().contains("write fence"), "{e}");
    assert_eq!(
        env.int("SELECT COUNT(*) FROM decision_log WHERE order_id = ?", "v")
            .await,
        0,
        "the record sent after the abort was rolled back, not committed by itself"
    );
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM decision_log WHERE order_id LIKE ?",
            "filler-%"
        )
        .await,
        20,
        "the survivor's writes stand"
    );
    assert_eq!(
        env.int("SELECT COUNT(*) FROM write_fence WHERE token <> ?", "0")
            .await,
        0
    );
    // Every connection went back to the pool in autocommit: all eight of the pool, held at
    // once, say so (a connection left with autocommit off would keep whatever it wrote next
    // uncommitted).
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(env.db.pool().acquire().await.unwrap());
    }
    for conn in &mut held {
        let on: i64 = sqlx::Row::get(
            &Backend::MySql
                .query("SELECT CAST(@@autocommit AS SIGNED)")
                .fetch_one(&mut **conn)
                .await
                .unwrap(),
            0,
        );
        assert_eq!(on, 1);
    }
    drop(held);
    env.cleanup().await;
}
