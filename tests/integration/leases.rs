//! Leases that run out mid-work (#17, item 5): a holder renews its lease while it works, so a
//! row lock held by the order service or a slow endpoint never lets a second holder take the
//! same row; and a holder that stalled past its lease anyway cannot complete what another now
//! holds — its completion is refused (fenced by the claim token) and its transaction rolls back.

use std::time::Duration;

use sqlx::Row;

use timeoutd::clock::Clock;
use timeoutd::db::{Backend, outbox};
use timeoutd::dispatch::Outcome;

use crate::fakes::Provider;
use crate::support::{Env, MerchantSpec, T0, each_backend, eventually, order};

const SHOPS: &[MerchantSpec<'static>] = &[("acme", "builtin:single-phase", &[])];

fn trigger(row: &outbox::DueRow) -> timeoutd::dispatch::Trigger {
    timeoutd::sources::outbox::trigger_of(row).expect("a valid row")
}

each_backend! {
    /// Holder A claims two rows with a 1 s lease and stalls; after the lease, B claims them.
    /// For `b-first`, B closes first and A's late completion is refused (the row keeps B's
    /// note). For `a-first`, A decides first: its close is refused at its fence and rolls back
    /// whole — the order stays PENDING, its stock held — and B's close then stands. Each order
    /// is closed once, its stock given back once, one decision logged.
    async fn a_stale_holders_completion_is_refused_and_the_new_holders_stands(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("b-first", "acme", T0)).await;
        env.create(&order("a-first", "acme", T0)).await;
        let config = env.config(SHOPS, "");
        let (clock, _) = Clock::manual(T0 + 2_000);
        let d = env.dispatcher(&config, clock).await;
        let a: Vec<_> = outbox::claim_due(&env.db, T0, 10, 1_000).await.unwrap().iter().map(trigger).collect();
        let b: Vec<_> = outbox::claim_due(&env.db, T0 + 2_000, 10, 30_000).await.unwrap().iter().map(trigger).collect();
        assert_eq!((a.len(), b.len()), (2, 2), "B took both rows once A's lease lapsed");
        let of = |ts: &[timeoutd::dispatch::Trigger], id: &str| ts.iter().find(|t| t.order_id == id).unwrap().clone();

        assert!(matches!(d.handle(&of(&b, "b-first")).await, Outcome::Closed { .. }));
        let late = d.handle(&of(&a, "b-first")).await;
        assert!(matches!(&late, Outcome::NoOp { reason } if reason.contains("stale claim")), "{late:?}");
        let note = "SELECT last_error FROM order_timeout_msg WHERE order_id = ?";
        assert_eq!(env.text(note, "b-first").await, "", "A's note did not overwrite B's completion");

        let refused = d.handle(&of(&a, "a-first")).await;
        assert!(matches!(&refused, Outcome::NoOp { reason } if reason.contains("stale claim")), "{refused:?}");
        assert_eq!(env.status("a-first").await, "PENDING", "A's close rolled back whole");
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE order_id = ?", "a-first").await, 0);
        assert_eq!(env.coupon("cpn-a-first").await, "LOCKED");
        assert!(matches!(d.handle(&of(&b, "a-first")).await, Outcome::Closed { .. }));

        for id in ["b-first", "a-first"] {
            assert_eq!(env.status(id).await, "CLOSED");
            assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE order_id = ?", id).await, 1, "{id}: one decision");
            assert_eq!(env.text("SELECT status FROM order_timeout_msg WHERE order_id = ?", id).await, "PROCESSED");
        }
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (10, 10), "stock back once per order");
    }
}

each_backend! {
    /// A close-payment whose provider hangs 3 s under a 1 s ledger lease: the executor renews
    /// its lease while it waits, so a second executor polling meanwhile never takes the row,
    /// and the provider is asked once.
    async fn a_slow_endpoint_keeps_its_lease_and_is_called_once(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let now = env.db.now_ms().await.unwrap();
        env.create(&order("slow", "acme", now - 1_000)).await;
        let provider = Provider::start().await;
        provider.books.lock().unwrap().hang_for = 1;
        let extra = format!(
            "[payment]\nbase_url = \"{}\"\ntimeout = \"5s\"\nattempts = 1\nquery_before_close = false\n[effects]\nlease = \"1s\"\n",
            provider.base_url
        );
        let config = env.config(SHOPS, &extra);
        let closer = env.runner(&config, Clock::Database).await;
        let d = timeoutd::dispatch::Dispatcher::new(
            timeoutd::db::Db::connect(&env.url, 4).await.unwrap(),
            Clock::Database,
            timeoutd::policies::load(&config).unwrap(),
            config.dispatch.clone(),
            std::sync::Arc::new(timeoutd::effects::EffectRunner::new(env.db.clone(), Clock::Database)),
        );
        assert!(matches!(env.process(&d, now).await[..], [Outcome::Closed { .. }]));
        let first = tokio::spawn(async move { closer.run_fresh().await.unwrap() });
        let other = env.runner(&config, Clock::Database).await;
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_millis(3_500) {
            tokio::time::sleep(Duration::from_millis(250)).await;
            other.run_fresh().await.unwrap();
        }
        first.await.unwrap();
        assert_eq!(provider.books.lock().unwrap().calls_for("close", "pay-slow"), 1, "the provider was asked once");
        let row = "SELECT status FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?";
        assert_eq!(env.text(row, "slow").await, "DONE");
        assert_eq!(env.int("SELECT attempts FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?", "slow").await, 1);
    }
}

/// Two daemons with a 1 s outbox lease; the order service holds the order's row
/// `SELECT … FOR UPDATE` for 4 s across its deadline. The daemon that claimed the row renews
/// its lease while it waits for the lock; the other never takes the row. The order is closed
/// once, with one decision, its stock given back once.
async fn two_daemons_and_a_row_lock_longer_than_the_lease(backend: Backend) {
    let env = Env::new(backend).await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    let deadline = env.db.now_ms().await.unwrap() + 1_500;
    env.create(&order("locked", "acme", deadline)).await;
    let config = env.config(
        SHOPS,
        "[outbox]\nlease = \"1s\"\n[sweep]\nenabled = false\n",
    );
    let one = timeoutd::daemon::Daemon::start(&config, Clock::Database)
        .await
        .unwrap();
    let two = timeoutd::daemon::Daemon::start(&config, Clock::Database)
        .await
        .unwrap();
    let holder = timeoutd::db::Db::connect(&env.url, 1).await.unwrap();
    let mut lock = holder.begin().await.unwrap();
    holder
        .backend()
        .query("SELECT id FROM orders WHERE id = ? FOR UPDATE")
        .bind("locked")
        .fetch_all(&mut *lock)
        .await
        .unwrap();
    // While the lock holds (5.5 s, five leases), the row's claim never changes hands and never
    // lapses: its holder renews it (`claim_until_ms` moves on) while it waits.
    let (mut holder_token, mut first_until, mut last_until) = (None::<String>, None, 0);
    let lock_ends = std::time::Instant::now() + Duration::from_millis(5_500);
    while std::time::Instant::now() < lock_ends {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let row = env
            .db
            .backend()
            .query("SELECT claim_token, claim_until_ms FROM order_timeout_msg WHERE order_id = ?")
            .bind("locked")
            .fetch_one(env.db.pool())
            .await
            .unwrap();
        let now = env.db.now_ms().await.unwrap();
        let (Some(token), Some(until)) = (
            row.try_get::<Option<String>, _>(0).unwrap(),
            row.try_get::<Option<i64>, _>(1).unwrap(),
        ) else {
            assert!(
                holder_token.is_none(),
                "the claim was dropped while the lock held"
            );
            continue;
        };
        match &holder_token {
            None => holder_token = Some(token),
            Some(held) => assert_eq!(held, &token, "the claim changed hands during the lock"),
        }
        assert!(
            until > now,
            "the lease lapsed during the lock: until {until}, now {now}"
        );
        first_until.get_or_insert(until);
        last_until = until;
    }
    assert!(
        holder_token.is_some(),
        "the row was claimed at its deadline"
    );
    assert!(
        last_until >= first_until.unwrap() + 2_000,
        "the lease was renewed while its holder waited ({first_until:?} → {last_until})"
    );
    assert_eq!(env.status("locked").await, "PENDING", "held by the lock");
    lock.commit().await.unwrap();
    holder.pool().close().await;
    eventually(Duration::from_secs(10), "the order closes", || async {
        env.status("locked").await == "CLOSED"
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    one.stop().await;
    two.stop().await;
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM decision_log WHERE order_id = ?",
            "locked"
        )
        .await,
        1,
        "one decision, by one holder"
    );
    assert_eq!(
        env.text(
            "SELECT last_error FROM order_timeout_msg WHERE order_id = ?",
            "locked"
        )
        .await,
        "",
        "no second holder's note"
    );
    assert_eq!(
        (env.stock("sku-a").await, env.stock("sku-b").await),
        (10, 10)
    );
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM effect_ledger WHERE order_id = ?",
            "locked"
        )
        .await,
        env.int(
            "SELECT COUNT(DISTINCT idempotency_key) FROM effect_ledger WHERE order_id = ?",
            "locked"
        )
        .await
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_daemons_and_a_row_lock_longer_than_the_lease_mariadb() {
    two_daemons_and_a_row_lock_longer_than_the_lease(Backend::MySql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_daemons_and_a_row_lock_longer_than_the_lease_postgres() {
    two_daemons_and_a_row_lock_longer_than_the_lease(Backend::Postgres).await;
}

/// A claim locks only the rows it returns (#48), on the servers where claimers run side by
/// side: among 2,000 due rows, a claim of 256 held open in one transaction leaves a second
/// claimer 256 others, and the daemon's own claim, made meanwhile, takes 256 more, none of them
/// held. (The earlier single `OR` over PENDING and SENT rows made MariaDB read and lock every
/// due row for its filesort: the second claim found none.)
async fn a_claim_locks_only_the_rows_it_returns(env: &Env) {
    let rows: Vec<(String, i64)> = (0..2_000)
        .map(|k| (format!("o-{k:05}"), T0 - 60_000 + k))
        .collect();
    let mut tx = env.db.begin().await.unwrap();
    timeoutd::db::fixtures::insert_pending_outbox_rows(&mut tx, &rows)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let candidates = format!("{} FOR UPDATE SKIP LOCKED", outbox::PENDING_DUE);
    let backend = env.db.backend();
    let mut first = env.db.begin().await.unwrap();
    let mut second = env.db.begin().await.unwrap();
    let mut held = Vec::new();
    for tx in [&mut first, &mut second] {
        let ids: Vec<i64> = backend
            .query_owned(candidates.clone())
            .bind(T0)
            .bind(T0)
            .bind(256i64)
            .fetch_all(&mut **tx)
            .await
            .unwrap()
            .iter()
            .map(|r| r.try_get(0).unwrap())
            .collect();
        assert_eq!(ids.len(), 256, "a claimer found {} free rows", ids.len());
        held.extend(ids);
    }
    let claimed = outbox::claim_due(&env.db, T0, 256, 30_000).await.unwrap();
    assert_eq!(claimed.len(), 256);
    held.extend(claimed.iter().map(|r| r.id));
    let distinct: std::collections::HashSet<i64> = held.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        3 * 256,
        "the three claims took disjoint rows"
    );
    // Earliest first: the daemon's claim took the next due rows after the two held ones.
    let due: Vec<i64> = claimed.iter().map(|r| r.due_ms).collect();
    assert!(due.windows(2).all(|w| w[0] <= w[1]), "{due:?}");
    assert_eq!(due[0], T0 - 60_000 + 512);
    drop((first, second));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_locks_only_the_rows_it_returns_mariadb() {
    let env = Env::new(Backend::MySql).await;
    a_claim_locks_only_the_rows_it_returns(&env).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_locks_only_the_rows_it_returns_postgres() {
    let env = Env::new(Backend::Postgres).await;
    a_claim_locks_only_the_rows_it_returns(&env).await;
    env.cleanup().await;
}
