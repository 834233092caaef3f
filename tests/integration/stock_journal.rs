//! The stock journal (`[dispatch.stock] mode = "journal"`, `db::stock_journal`): a close appends
//! the units it gives back instead of updating the hot `sku_stock` row, and a fold adds them
//! later, each unit once.

use std::time::Duration;

use sqlx::Row;
use timeoutd::clock::Clock;
use timeoutd::db::Backend;
use timeoutd::db::stock_journal;
use timeoutd::dispatch::Outcome;

use crate::support::{Env, MerchantSpec, T0, each_backend, order};

const SINGLE: &[MerchantSpec<'static>] = &[("acme", "builtin:single-phase", &[])];

/// The `[dispatch.stock]` table of a journal-mode daemon folding every `interval`.
fn journal(interval: &str) -> String {
    format!("[dispatch.stock]\nmode = \"journal\"\nfold_interval = \"{interval}\"\n")
}

/// The journal's rows, `(sku, units, orders)` by SKU.
async fn journal_rows(env: &Env) -> Vec<(String, i64, i64)> {
    env.db
        .backend()
        .query("SELECT sku, units, orders FROM stock_journal ORDER BY sku")
        .fetch_all(env.db.pool())
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

fn closed(outcomes: &[Outcome]) -> usize {
    outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Closed { .. }))
        .count()
}

each_backend! {
    /// Three orders closed together leave `sku_stock` as it was and put one journal row per SKU
    /// (units summed, three orders each); the fold gives every unit back, and a second fold
    /// changes nothing. A SKU whose stock row is gone by the fold is dead-lettered with its
    /// units, not lost.
    async fn a_journal_close_gives_stock_back_at_the_fold_and_only_once(env) {
        env.stock_up(&[("sku-a", 100), ("sku-b", 100), ("sku-c", 100)]).await;
        for i in 0..3 {
            env.create(&order(&format!("j-{i}"), "acme", T0)).await;
        }
        // Each order locked 2 × sku-a and 1 × sku-b.
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (94, 97));
        let (clock, _) = Clock::manual(T0 + 1);
        let d = env.dispatcher(&env.config(SINGLE, &journal("1h")), clock).await;
        let triggers = env.claim(T0 + 1).await;
        assert_eq!(closed(&d.handle_group(&triggers).await), 3);
        for i in 0..3 {
            assert_eq!(env.status(&format!("j-{i}")).await, "CLOSED");
        }
        assert_eq!(
            (env.stock("sku-a").await, env.stock("sku-b").await),
            (94, 97),
            "the close did not touch sku_stock"
        );
        assert_eq!(
            journal_rows(env).await,
            [("sku-a".to_string(), 6, 3), ("sku-b".to_string(), 3, 3)]
        );
        assert_eq!(stock_journal::units_pending(&env.db, Some("sku-a")).await.unwrap(), 6);
        assert_eq!(
            env.int("SELECT COUNT(*) FROM effect_ledger WHERE kind = ? AND status = 'DONE'", "restore-stock").await,
            6,
            "each order's stock effects are recorded done at the close"
        );

        let folded = stock_journal::fold(&env.db, T0 + 50, 2000).await.unwrap();
        assert_eq!((folded.rows, folded.units, folded.oldest_ms), (2, 9, Some(T0 + 1)));
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (100, 100));
        assert!(journal_rows(env).await.is_empty());
        let again = stock_journal::fold(&env.db, T0 + 60, 2000).await.unwrap();
        assert_eq!(again.rows, 0);
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (100, 100));

        // sku-c's row is deleted between a close and the fold.
        let mut tx = env.db.begin().await.unwrap();
        let release = |sku, units| stock_journal::Release { sku, units, orders: 1 };
        let missing = stock_journal::append(&mut tx, &[release("sku-a", 1), release("sku-c", 4), release("sku-x", 2)], T0 + 70)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        assert_eq!(missing, ["sku-x"].into_iter().collect(), "a SKU without a stock row is not appended");
        env.db.backend().query("DELETE FROM sku_stock WHERE sku = ?").bind("sku-c").execute(env.db.pool()).await.unwrap();
        let folded = stock_journal::fold(&env.db, T0 + 80, 2000).await.unwrap();
        assert_eq!((folded.rows, folded.units), (2, 1));
        assert_eq!(folded.missing, [("sku-c".to_string(), 4)]);
        assert_eq!(env.stock("sku-a").await, 101);
        assert_eq!(
            env.text("SELECT reason FROM dead_letter WHERE source = ?", "stock-journal").await,
            "no sku_stock row for `sku-c`: 4 units of the stock journal could not be given back"
        );
        assert!(journal_rows(env).await.is_empty(), "folded or dead-lettered: nothing left behind");
    }
}

/// A close in journal mode commits while another transaction holds the SKU's stock row (a
/// create queued on the hot row): it waits for no stock lock. The fold then waits for that row;
/// a second fold running at the same time skips the journal rows the first holds and gives back
/// the other SKU's, and every unit comes back once when the row is free.
async fn a_journal_close_does_not_wait_for_a_held_stock_row(env: &Env) {
    env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
    for i in 0..3 {
        env.create(&order(&format!("h-{i}"), "acme", T0)).await;
    }
    let (clock, _) = Clock::manual(T0 + 1);
    let d = env
        .dispatcher(&env.config(SINGLE, &journal("1h")), clock)
        .await;
    let triggers = env.claim(T0 + 1).await;
    let mut other = env.db.pool().begin().await.unwrap();
    env.db
        .backend()
        .query("UPDATE sku_stock SET available = available WHERE sku = ?")
        .bind("sku-a")
        .execute(&mut *other)
        .await
        .unwrap();
    let outcomes = tokio::time::timeout(Duration::from_secs(20), d.handle_group(&triggers))
        .await
        .expect("the close waited for the held stock row");
    assert_eq!(closed(&outcomes), 3);
    assert_eq!(
        env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "CLOSED")
            .await,
        3,
        "committed while the row was held"
    );
    let db = env.db.clone();
    let first = tokio::spawn(async move { stock_journal::fold(&db, T0 + 50, 2000).await });
    env.until_waiting_on_a_lock().await;
    // A fold takes one SKU per transaction: the waiting fold holds sku-a's journal row, so a
    // second fold skips it and gives back sku-b's, whose row is free.
    let second = stock_journal::fold(&env.db, T0 + 51, 2000).await.unwrap();
    assert_eq!(
        (second.rows, second.units),
        (1, 3),
        "sku-b's row, not the held sku-a's"
    );
    assert_eq!(
        env.stock("sku-b").await,
        100,
        "back while sku-a's row is held"
    );
    other.rollback().await.unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!((first.rows, first.units), (1, 6), "sku-a's, once");
    assert_eq!(
        (env.stock("sku-a").await, env.stock("sku-b").await),
        (100, 100)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_journal_close_does_not_wait_for_a_held_stock_row_mariadb() {
    let env = Env::new(Backend::MySql).await;
    a_journal_close_does_not_wait_for_a_held_stock_row(&env).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_journal_close_does_not_wait_for_a_held_stock_row_postgres() {
    let env = Env::new(Backend::Postgres).await;
    a_journal_close_does_not_wait_for_a_held_stock_row(&env).await;
    env.cleanup().await;
}

/// A journal-mode daemon folds on its own: 40 lapsed orders on one SKU close, their units come
/// back to `sku_stock` with the journal empty, and the fold's metric counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_journal_mode_daemon_folds_the_stock_back_by_itself() {
    let env = Env::new(Backend::MySql).await;
    env.stock_up(&[("sku-a", 1_000), ("sku-b", 1_000)]).await;
    let now = env.db.now_ms().await.unwrap();
    for i in 0..40 {
        env.create(&order(&format!("fd-{i}"), "acme", now - 1_000))
            .await;
    }
    let recorder = timeoutd::events::metrics_handle();
    let series = "timeoutd_stock_folded_units_total";
    let before = crate::support::sample(&recorder.render(), series).unwrap_or(0.0);
    let config = env.config(SINGLE, &journal("50ms"));
    let daemon = timeoutd::daemon::Daemon::start(&config, Clock::Database)
        .await
        .unwrap();
    crate::support::eventually(
        Duration::from_secs(30),
        "every order closed and its stock folded back",
        || async {
            env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "CLOSED")
                .await
                == 40
                && env.stock("sku-a").await == 1_000
                && env.stock("sku-b").await == 1_000
        },
    )
    .await;
    daemon.stop().await;
    assert!(journal_rows(&env).await.is_empty());
    let after = crate::support::sample(&recorder.render(), series).unwrap_or(0.0);
    assert!(after - before >= 120.0, "{series}: {before} → {after}");
    env.cleanup().await;
}
