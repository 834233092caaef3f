//! Payment alignment (seeds 002, 003) on every backend, against a real HTTP provider stub:
//! before an order with a payment reference is decided at its deadline, the provider is asked.
//! A payment whose notification was lost aligns the order to PAID (no close, no refund, stock
//! with the buyer, a forward `order-paid` notice); an unknown payment closes as usual and its
//! close-payment is "nothing to close", DONE without an alert; a provider that does not answer
//! holds the order at most `payment.unknown_max_wait`.

use std::sync::atomic::Ordering;

use timeoutd::clock::Clock;
use timeoutd::dispatch::Outcome;

use crate::fakes::Provider;
use crate::support::{MerchantSpec, T0, each_backend, order};

const SHOPS: &[MerchantSpec<'static>] = &[("acme", "builtin:single-phase", &[])];

fn provider_config(provider: &Provider, payment_keys: &str) -> String {
    format!(
        "[payment]\nbase_url = \"{}\"\nattempts = 2\ntimeout = \"1s\"\n{payment_keys}\n",
        provider.base_url
    )
}

each_backend! {
    async fn a_payment_whose_notification_was_lost_is_aligned_to_paid_not_closed(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("lost", "acme", T0)).await;
        let provider = Provider::start().await;
        {
            let mut books = provider.books.lock().unwrap();
            books.paid.insert("pay-lost".into());
            books.paid_at_ms.insert("pay-lost".into(), T0 - 30_000);
        }
        let config = env.config(SHOPS, &provider_config(&provider, ""));
        let (clock, _) = Clock::manual(T0 + 1_000);
        let d = env.dispatcher(&config, clock).await;
        let outcomes = env.process(&d, T0 + 1_000).await;
        assert_eq!(outcomes, vec![Outcome::Aligned { paid_at_ms: T0 - 30_000 }]);
        assert_eq!(env.status("lost").await, "PAID");
        assert_eq!(env.int("SELECT paid_at_ms FROM orders WHERE id = ?", "lost").await, T0 - 30_000);
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (8, 9), "the buyer keeps the goods");
        assert_eq!(env.coupon("cpn-lost").await, "USED");
        assert_eq!(env.int("SELECT COUNT(*) FROM paid_after_close WHERE order_id = ?", "lost").await, 0);
        // One ledger row: the forward notice, DONE on the log channel.
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE order_id = ?", "lost").await, 1);
        assert_eq!(env.text("SELECT idempotency_key FROM effect_ledger WHERE order_id = ?", "lost").await, "acme/lost/0/10001");
        assert!(env.text("SELECT payload FROM effect_ledger WHERE order_id = ?", "lost").await.contains("order-paid"));
        assert_eq!(env.text("SELECT status FROM effect_ledger WHERE order_id = ?", "lost").await, "DONE");
        assert_eq!(env.text("SELECT decision FROM decision_log WHERE order_id = ?", "lost").await, "align");
        assert_eq!(env.text("SELECT status FROM order_timeout_msg WHERE order_id = ?", "lost").await, "PROCESSED");
        let books = provider.books.lock().unwrap();
        assert_eq!(books.calls_for("query", "pay-lost"), 1);
        assert_eq!(books.calls_for("close", "pay-lost"), 0, "nothing closed at the provider");
        assert!(books.refunds.is_empty(), "no refund");
    }
}

each_backend! {
    async fn an_unknown_payment_closes_and_its_close_is_nothing_to_close(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("never-opened", "acme", T0)).await;
        env.create(&order("unpaid", "acme", T0)).await;
        let provider = Provider::start().await;
        provider.books.lock().unwrap().unknown.insert("pay-never-opened".into());
        let config = env.config(SHOPS, &provider_config(&provider, ""));
        let (clock, _) = Clock::manual(T0);
        let d = env.dispatcher(&config, clock).await;
        let outcomes = env.process(&d, T0).await;
        assert!(outcomes.iter().all(|o| matches!(o, Outcome::Closed { .. })), "{outcomes:?}");
        let close = "SELECT status FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?";
        assert_eq!(env.text(close, "never-opened").await, "DONE", "a 404 is not a failure");
        assert!(env.text("SELECT last_error FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?", "never-opened").await.contains("nothing to close"));
        assert_eq!(env.text(close, "unpaid").await, "DONE");
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE status = 'FAILED' AND order_id <> ?", "").await, 0);
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (10, 10));
        let books = provider.books.lock().unwrap();
        assert_eq!((books.calls_for("query", "pay-unpaid"), books.calls_for("close", "pay-unpaid")), (1, 1));
    }
}

each_backend! {
    async fn a_provider_that_does_not_answer_holds_the_order_at_most_the_maximum_wait(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("dark", "acme", T0)).await;
        let provider = Provider::start().await;
        provider.books.lock().unwrap().down_for = 1_000;
        let config = env.config(SHOPS, &provider_config(&provider, "unknown_max_wait = \"60s\""));
        let (clock, now) = Clock::manual(T0);
        let d = env.dispatcher(&config, clock).await;
        let first = env.process(&d, T0).await;
        assert!(matches!(&first[..], [Outcome::Retry { error, .. }] if error.contains("payment provider")), "{first:?}");
        assert_eq!(env.status("dark").await, "PENDING");
        // Retried with backoff while the provider is dark, never past deadline + 60 s.
        let mut at = T0;
        let mut rounds = 0;
        while env.status("dark").await == "PENDING" {
            rounds += 1;
            assert!(rounds < 50, "the wait is bounded");
            let due = env.int("SELECT due_ms FROM order_timeout_msg WHERE order_id = ?", "dark").await;
            assert!(due <= T0 + 60_000, "due {due} is past the maximum wait");
            at = at.max(due);
            now.store(at, Ordering::SeqCst);
            env.process(&d, at).await;
        }
        assert_eq!(env.status("dark").await, "CLOSED", "decided as unknown once the wait ran out");
        assert!(at <= T0 + 60_000 + 1, "closed at {at}");
        assert_eq!(env.text("SELECT status FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?", "dark").await, "PENDING", "close-payment waits for the provider in the ledger");
    }
}

each_backend! {
    async fn on_unknown_close_decides_at_once(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("dark-close", "acme", T0)).await;
        let provider = Provider::start().await;
        provider.books.lock().unwrap().down_for = 1_000;
        let config = env.config(SHOPS, &provider_config(&provider, "on_unknown = \"close\""));
        let (clock, _) = Clock::manual(T0);
        let d = env.dispatcher(&config, clock).await;
        assert_eq!(env.process(&d, T0).await, vec![Outcome::Closed { lateness_ms: 0 }]);
        assert_eq!(env.status("dark-close").await, "CLOSED");
    }
}

each_backend! {
    /// Seed 002's check-back as the poller: each check asks the provider; paid → rollback
    /// (nothing to arm), unpaid → unknown until the plugin's maximum of checks, then commit;
    /// and a check-back writes nothing.
    async fn the_check_back_asks_the_provider_at_each_check_and_commits_at_the_maximum(env) {
        use timeoutd::rocketmq::arming::ArmListener;
        use timeoutd_runtime::model::CheckVerdict;
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let now = env.db.now_ms().await.unwrap();
        env.create(&order("cb-paid", "acme", now + 600_000)).await;
        env.create(&order("cb-unpaid", "acme", now + 600_000)).await;
        let provider = Provider::start().await;
        provider.books.lock().unwrap().paid.insert("pay-cb-paid".into());
        let config = env.config(SHOPS, &provider_config(&provider, ""));
        let d = env.dispatcher(&config, Clock::Database).await;
        let listener = ArmListener::new(
            tokio::runtime::Handle::current(),
            env.db.clone(),
            Clock::Database,
            timeoutd::policies::load(&config).unwrap(),
        )
        .with_payments(d.payment_query());
        let before = env.dump().await;
        assert_eq!(listener.check_back("cb-paid", 0).await, CheckVerdict::Rollback);
        let mut verdicts = Vec::new();
        for checks in 0..4 {
            verdicts.push(listener.check_back("cb-unpaid", checks).await);
        }
        assert_eq!(
            verdicts,
            [CheckVerdict::Unknown, CheckVerdict::Unknown, CheckVerdict::Unknown, CheckVerdict::Commit],
            "single-phase's check: unknown until max_checks (3)"
        );
        assert_eq!(env.dump().await, before, "a check-back writes nothing");
        let books = provider.books.lock().unwrap();
        assert_eq!(books.calls_for("query", "pay-cb-unpaid"), 4, "each check asked the provider");
        assert_eq!(books.calls_for("query", "pay-cb-paid"), 1);
    }
}

each_backend! {
    /// Seed 002's aggregated payment: a payment attempt holds a PENDING order against its close
    /// for the lease; the close waits (its row deferred to the lease's end), then happens; an
    /// attempt on a closed order, or past the deadline, is refused with the order's state.
    async fn a_payment_attempt_holds_the_close_until_its_lease_lapses(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("held", "acme", T0)).await;
        env.create(&order("held-2", "acme", T0)).await;
        env.create(&order("late", "acme", T0 - 20_000)).await;
        let config = env.config(SHOPS, "[http]\nlisten = \"127.0.0.1:0\"\ncallback_token = \"cb-secret\"\npayment_lease = \"90s\"\n");
        let (clock, now) = Clock::manual(T0 - 10_000);
        let runner = env.runner(&config, clock.clone()).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let state = timeoutd::http::HttpState::new(env.db.clone(), runner, &config);
        let server = tokio::spawn(timeoutd::http::serve(listener, state, stopped));
        let client = reqwest::Client::new();
        let attempt = |id: &str| client.post(format!("http://{addr}/v1/orders/{id}/payment-attempts")).bearer_auth("cb-secret").send();
        let held = attempt("held").await.unwrap();
        assert_eq!(held.status(), 200);
        assert_eq!(held.json::<serde_json::Value>().await.unwrap()["lease_until_ms"], T0 + 80_000);
        assert_eq!(attempt("held-2").await.unwrap().status(), 200);
        let late = attempt("late").await.unwrap();
        assert_eq!(late.status(), 409, "past its deadline");
        let body = late.json::<serde_json::Value>().await.unwrap();
        assert_eq!((body["status"].as_str(), body["deadline_ms"].as_i64()), (Some("PENDING"), Some(T0 - 20_000)));
        assert_eq!(attempt("nobody").await.unwrap().status(), 404);
        assert_eq!(client.post(format!("http://{addr}/v1/orders/held/payment-attempts")).send().await.unwrap().status(), 401);

        // At the deadline the close waits for the lease (both alone and as a group).
        now.store(T0, Ordering::SeqCst);
        let d = env.dispatcher(&config, clock).await;
        let outcomes = env.process(&d, T0).await;
        assert!(outcomes.iter().all(|o| *o == Outcome::Deferred { until_ms: T0 + 80_000 } || matches!(o, Outcome::Closed { .. })), "{outcomes:?}");
        let triggers = env.claim(T0).await;
        assert!(triggers.is_empty(), "the held orders' rows wait for the lease: {triggers:?}");
        assert_eq!(env.status("held").await, "PENDING");
        assert_eq!(env.status("late").await, "CLOSED");
        assert_eq!(env.int("SELECT due_ms FROM order_timeout_msg WHERE order_id = ?", "held").await, T0 + 80_000);
        assert_eq!(attempt("late").await.unwrap().status(), 409, "a closed order cannot be paid");

        // The lease lapses without a payment: the orders close, once.
        now.store(T0 + 80_000, Ordering::SeqCst);
        let mut group = env.claim(T0 + 80_000).await;
        group.sort_by(|a, b| a.order_id.cmp(&b.order_id));
        let outcomes = d.handle_group(&group).await;
        assert!(outcomes.iter().all(|o| matches!(o, Outcome::Closed { .. })), "{outcomes:?}");
        assert_eq!((env.status("held").await, env.status("held-2").await), ("CLOSED".into(), "CLOSED".into()));
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (10, 10));
        stop.send(true).unwrap();
        server.await.unwrap();
    }
}

each_backend! {
    /// The lease in a group close: one order of the group held by a payment attempt waits, the
    /// others close in the same transaction.
    async fn a_held_order_in_a_group_waits_while_the_rest_close(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        for id in ["g-1", "g-2", "g-3"] {
            env.create(&order(id, "acme", T0)).await;
        }
        let config = env.config(SHOPS, "");
        let mut conn = env.db.pool().acquire().await.unwrap();
        let held = timeoutd::db::orders::take_payment_lease(&mut conn, &timeoutd::db::shop::Schema::Canonical, "g-2", T0 - 1_000, T0 + 30_000).await.unwrap();
        assert_eq!(held, timeoutd::db::orders::Attempt::Held { until_ms: T0 + 30_000 });
        drop(conn);
        let (clock, _) = Clock::manual(T0);
        let d = env.dispatcher(&config, clock).await;
        let mut group = env.claim(T0).await;
        group.sort_by(|a, b| a.order_id.cmp(&b.order_id));
        let outcomes = d.handle_group(&group).await;
        assert!(matches!(outcomes[0], Outcome::Closed { .. }), "{outcomes:?}");
        assert_eq!(outcomes[1], Outcome::Deferred { until_ms: T0 + 30_000 });
        assert!(matches!(outcomes[2], Outcome::Closed { .. }), "{outcomes:?}");
        assert_eq!(env.status("g-2").await, "PENDING");
        assert_eq!(env.text("SELECT status FROM order_timeout_msg WHERE order_id = ?", "g-2").await, "PENDING");
        assert_eq!(env.text("SELECT outcome FROM decision_log WHERE order_id = ?", "g-2").await, "deferred");
    }
}

each_backend! {
    /// Polling during the window (seed 002) by a 0.2.0 plugin: its waits ask for the provider
    /// to be polled, so a payment whose notification was lost is aligned before the deadline;
    /// the polls of a burst stay under the merchant's query cap; a 0.1.0 merchant beside it is
    /// not asked before its deadline.
    async fn a_polling_plugin_finds_a_lost_payment_before_the_deadline_within_the_query_cap(env) {
        env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
        let tea: &[MerchantSpec<'static>] = &[
            ("tea", "tea-house", &[("poll_every", "30s")]),
            ("acme", "builtin:single-phase", &[]),
        ];
        for id in ["poll-1", "poll-2", "poll-3", "poll-4"] {
            env.create(&order(id, "tea", T0)).await;
        }
        env.create(&order("old-api", "acme", T0)).await;
        let provider = Provider::start().await;
        let config = env.config(tea, &provider_config(&provider, "max_queries_per_second = 2"));
        let created = T0 - 15 * 60_000;
        let (clock, now) = Clock::manual(created);
        let d = env.dispatcher(&config, clock).await;
        // The first look: each tea order waits 30 s, polling.
        for row in timeoutd::db::outbox::claim_unseen(&env.db, created, 100, 30_000).await.unwrap() {
            let t = timeoutd::sources::outbox::trigger_of(&row).unwrap();
            d.handle(&t).await;
        }
        assert_eq!(env.int("SELECT COUNT(*) FROM order_timeout_msg WHERE source = 'wait-poll' AND order_id <> ?", "").await, 4);
        // The buyer of poll-1 pays; the notification is lost.
        provider.books.lock().unwrap().paid.insert("pay-poll-1".into());
        now.store(created + 30_000, Ordering::SeqCst);
        let outcomes = env.process(&d, created + 30_000).await;
        assert_eq!(outcomes.len(), 4, "{outcomes:?}");
        let queries = provider.books.lock().unwrap().calls.iter().filter(|(a, _, _)| a == "query").count();
        assert_eq!(queries, 2, "the cap (2 a second, a burst of 2) held the polls of the burst");
        // The order service records the others' payments; poll-1's buyer paid but its
        // notification is lost: polling finds it, at the first poll that asks for it.
        for id in ["poll-2", "poll-3", "poll-4"] {
            assert!(env.pay(id, created + 40_000).await);
        }
        let mut at = created + 30_000;
        while env.status("poll-1").await == "PENDING" {
            at += 30_000;
            assert!(at < T0 - 2 * 60_000, "found while polling, before the reminder");
            now.store(at, Ordering::SeqCst);
            env.process(&d, at).await;
        }
        assert_eq!(env.status("poll-1").await, "PAID");
        assert!(at < T0, "aligned before the deadline");
        assert_eq!(env.status("old-api").await, "PENDING");
        assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE order_id = ?", "old-api").await, 0, "the 0.1.0 plugin is not asked early");
        assert_eq!(provider.books.lock().unwrap().calls_for("query", "pay-old-api"), 0);
    }
}

each_backend! {
    /// The provider's load from close-payment is capped per merchant too: twelve orders lapse
    /// at once under `max_calls_per_second = 5`; five closes go out at once, the other seven
    /// are deferred to the slots they booked (200 ms apart, no attempt counted, the reason on
    /// the row), and each is made exactly once when its slot comes.
    async fn close_payment_requests_keep_to_the_merchants_call_cap(env) {
        env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
        let ids: Vec<String> = (0..12).map(|i| format!("cap-{i:02}")).collect();
        for id in &ids {
            env.create(&order(id, "acme", T0)).await;
        }
        let provider = Provider::start().await;
        let config = env.config(SHOPS, &provider_config(&provider, "query_before_close = false\nmax_calls_per_second = 5"));
        let (clock, now) = Clock::manual(T0);
        let runner = env.runner(&config, clock.clone()).await;
        let d = timeoutd::dispatch::Dispatcher::new(
            timeoutd::db::Db::connect(&env.url, 8).await.unwrap(),
            clock,
            timeoutd::policies::load(&config).unwrap(),
            config.dispatch.clone(),
            std::sync::Arc::new(runner.clone()),
        );
        let outcomes = env.process(&d, T0).await;
        assert!(outcomes.iter().all(|o| matches!(o, Outcome::Closed { .. })), "{outcomes:?}");
        let closes = || provider.books.lock().unwrap().calls.iter().filter(|(a, _, _)| a == "close").count();
        assert_eq!(closes(), 5, "a burst of the cap at once");
        let waiting = "SELECT COUNT(*) FROM effect_ledger WHERE kind = 'close-payment' AND status = 'PENDING' \
                       AND attempts = 0 AND last_error LIKE '%max_calls_per_second%' AND merchant_id = ?";
        assert_eq!(env.int(waiting, "acme").await, 7, "the rest deferred, not failed, no attempt counted");
        let slots = env.ints("SELECT next_attempt_ms FROM effect_ledger WHERE kind = 'close-payment' AND status = 'PENDING' AND merchant_id = ? ORDER BY next_attempt_ms", "acme").await;
        assert_eq!(slots, (1..=7).map(|k| T0 + 200 * k).collect::<Vec<_>>(), "booked 200 ms apart (5 a second)");
        // Half-way: the slots due by then, and no more.
        now.store(T0 + 700, Ordering::SeqCst);
        runner.run_fresh().await.unwrap();
        assert_eq!(closes(), 8, "slots at +200, +400 and +600 ms");
        now.store(T0 + 1_400, Ordering::SeqCst);
        runner.run_fresh().await.unwrap();
        assert_eq!(closes(), 12);
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE kind = 'close-payment' AND status = 'DONE' AND attempts = 1 AND merchant_id = ?", "acme").await, 12);
        let books = provider.books.lock().unwrap();
        for id in &ids {
            assert_eq!(books.calls_for("close", &format!("pay-{id}")), 1, "{id} closed at the provider once");
        }
    }
}

each_backend! {
    /// A paid callback whose client gives up mid-request (here: the order row is locked by the
    /// order service, and the client times out after 300 ms) still runs its database work to
    /// the end once the lock is released: the order ends PAID, and no pooled connection is left
    /// inside a transaction (the next callbacks answer; PostgreSQL shows no session idle in
    /// one).
    async fn a_callback_whose_client_disconnects_still_runs_to_its_end(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("locked", "acme", T0)).await;
        env.create(&order("after", "acme", T0)).await;
        let config = env.config(SHOPS, "[http]\nlisten = \"127.0.0.1:0\"\n");
        let (clock, _) = Clock::manual(T0 - 10_000);
        let runner = env.runner(&config, clock).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let pool = timeoutd::db::Db::connect(&env.url, 2).await.unwrap();
        let state = timeoutd::http::HttpState::new(pool.clone(), runner, &config);
        let server = tokio::spawn(timeoutd::http::serve(listener, state, stopped));
        // The order service holds the order's row (SQLite: the database's write lock).
        let holder = timeoutd::db::Db::connect(&env.url, 1).await.unwrap();
        let mut lock = holder.begin().await.unwrap();
        holder.backend().query("UPDATE orders SET user_id = user_id WHERE id = ?").bind("locked").execute(&mut *lock).await.unwrap();
        let client = reqwest::Client::new();
        let gave_up = client.post(format!("http://{addr}/v1/payments/locked/paid"))
            .timeout(std::time::Duration::from_millis(300)).send().await;
        assert!(gave_up.is_err(), "the client gave up before the answer: {gave_up:?}");
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        assert_eq!(env.status("locked").await, "PENDING");
        lock.commit().await.unwrap();
        holder.pool().close().await;
        crate::support::eventually(std::time::Duration::from_secs(10), "the abandoned callback's work completes", || async {
            env.status("locked").await == "PAID"
        }).await;
        assert_eq!(env.coupon("cpn-locked").await, "USED");
        // Both pooled connections still work outside any transaction.
        for _ in 0..3 {
            let ok = client.post(format!("http://{addr}/v1/payments/after/paid")).send().await.unwrap();
            assert_eq!(ok.status(), 200);
        }
        assert_eq!(env.status("after").await, "PAID");
        if env.db.backend() == timeoutd::db::Backend::Postgres {
            let idle = env.int("SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%' AND query <> ?", "").await;
            assert_eq!(idle, 0, "no session left inside a transaction");
        }
        stop.send(true).unwrap();
        server.await.unwrap();
        pool.pool().close().await;
    }
}

/// A measurement, not a check (run by hand: `integration payments::measure --ignored
/// --nocapture`): the provider's load when 10,000 orders with payment references lapse at one
/// instant on MariaDB, with the default cap of 50 queries a second per merchant. Prints the
/// queries made, the busiest second, and how fast the burst closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "a measurement: run by hand"]
async fn measure_the_provider_load_of_a_10000_order_flash_sale() {
    const N: usize = 10_000;
    let env = crate::support::Env::new(timeoutd::db::Backend::MySql).await;
    env.stock_up(&[("sku-a", 10 * N as i64), ("sku-b", 10 * N as i64)])
        .await;
    let provider = Provider::start().await;
    let config = env.config(
        SHOPS,
        &format!(
            "{}\n[sweep]\nenabled = false\n",
            provider_config(&provider, "")
        ),
    );
    let deadline = env.db.now_ms().await.unwrap() + 30_000;
    for i in 0..N {
        env.create(&order(&format!("fs-{i:05}"), "acme", deadline))
            .await;
    }
    let daemon = timeoutd::daemon::Daemon::start(&config, Clock::Database)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    crate::support::eventually(
        std::time::Duration::from_secs(600),
        "the burst closes",
        || async {
            env.int(
                "SELECT COUNT(*) FROM orders WHERE status = 'PENDING' AND id <> ?",
                "",
            )
            .await
                == 0
        },
    )
    .await;
    let closed_in = started.elapsed();
    daemon.stop().await;
    let lateness = env
        .int("SELECT MAX(closed_at_ms) FROM orders WHERE id <> ?", "")
        .await
        - deadline;
    {
        let books = provider.books.lock().unwrap();
        let times = &books.query_times;
        let busiest = times
            .iter()
            .map(|t| {
                times
                    .iter()
                    .filter(|u| **u >= *t && u.duration_since(*t).as_secs_f64() < 1.0)
                    .count()
            })
            .max()
            .unwrap_or(0);
        let span = match (times.first(), times.last()) {
            (Some(a), Some(b)) => b.duration_since(*a).as_secs_f64(),
            _ => 0.0,
        };
        let closes = books.calls.iter().filter(|(a, _, _)| a == "close").count();
        eprintln!(
            "provider load: {N} orders lapsing at once; {} status queries over {span:.1} s, the \
             busiest second {busiest} (cap 50/s); the burst closed {:.1} s after the daemon started, \
             the last close {lateness} ms after the deadline; {closes} close-payment requests",
            times.len(),
            closed_in.as_secs_f64(),
        );
    }
    env.cleanup().await;
}

/// A payment marks its order's coupon used through the `coupons_order` index (migration 14),
/// on MariaDB and PostgreSQL, with 5,000 coupons in the table: the plan of the statement the
/// payment runs ([`timeoutd::db::orders::COUPON_USED`], with an order id bound) names the
/// index. Without it each payment read every coupon ever issued; the soak found the scan
/// (docs/performance.md, "the soak").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_finds_its_coupon_by_index() {
    for backend in [
        timeoutd::db::Backend::MySql,
        timeoutd::db::Backend::Postgres,
    ] {
        let env = crate::support::Env::new(backend).await;
        let pool = env.db.pool();
        for chunk in 0..10 {
            let values: Vec<String> = (0..500)
                .map(|i| {
                    let n = chunk * 500 + i;
                    format!("('c-{n}', 'u-{n}', 'LOCKED', 'o-{n}')")
                })
                .collect();
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO coupons (id, user_id, status, order_id) VALUES {}",
                values.join(", ")
            )))
            .execute(pool)
            .await
            .unwrap();
        }
        sqlx::query("ANALYZE TABLE coupons")
            .execute(pool)
            .await
            .ok();
        if backend == timeoutd::db::Backend::Postgres {
            sqlx::query("ANALYZE coupons").execute(pool).await.unwrap();
        }
        let plan: Vec<String> = env
            .db
            .backend()
            // The dialect's placeholders are rewritten from a `&'static str`.
            .query(Box::leak(
                format!("EXPLAIN {}", timeoutd::db::orders::COUPON_USED).into_boxed_str(),
            ))
            .bind("o-2500")
            .fetch_all(pool)
            .await
            .unwrap()
            .iter()
            .map(plan_line)
            .collect();
        assert!(
            plan.iter().any(|line| line.contains("coupons_order")),
            "{backend:?}: the payment's coupon update does not use coupons_order: {plan:?}"
        );
        env.cleanup().await;
    }
}

/// The effect executor finds and renews the rows it claimed through the `effect_ledger_claim`
/// index (migration 15), on MariaDB and PostgreSQL, with a backlog of 3,000 PENDING effects
/// among 6,000 rows: the plans of [`timeoutd::db::ledger::CLAIMED`] and
/// [`timeoutd::db::ledger::RENEW`] name the index, and on MariaDB the backlog gauge's count
/// ([`timeoutd::db::backlog::LEDGER_PENDING`]) reads `effect_ledger_status_created`. Without
/// them, a backlog that large made MariaDB read the whole ledger for each, 7 times a second;
/// the soak of 2026-12-07 found it (docs/performance.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_effect_executor_finds_its_claim_by_index_under_a_backlog() {
    for backend in [
        timeoutd::db::Backend::MySql,
        timeoutd::db::Backend::Postgres,
    ] {
        let env = crate::support::Env::new(backend).await;
        let pool = env.db.pool();
        for chunk in 0..12 {
            let values: Vec<String> = (0..500)
                .map(|i| {
                    let n = chunk * 500 + i;
                    let (status, token) = if n % 2 == 0 {
                        ("PENDING", format!("'t-{}'", n / 100))
                    } else {
                        ("DONE", "NULL".to_string())
                    };
                    format!(
                        "('k-{n}', 'o-{n}', 'm', 0, 0, 'notify', '{{}}', '{status}', 0, 0, {token})"
                    )
                })
                .collect();
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO effect_ledger (idempotency_key, order_id, merchant_id, phase, \
                 effect_index, kind, payload, status, created_at_ms, updated_at_ms, claim_token) \
                 VALUES {}",
                values.join(", ")
            )))
            .execute(pool)
            .await
            .unwrap();
        }
        let analyze = match backend {
            timeoutd::db::Backend::Postgres => "ANALYZE effect_ledger",
            _ => "ANALYZE TABLE effect_ledger",
        };
        sqlx::query(analyze).execute(pool).await.unwrap();
        let mut statements = vec![
            (
                "CLAIMED",
                timeoutd::db::ledger::CLAIMED,
                1,
                "effect_ledger_claim",
            ),
            (
                "RENEW",
                timeoutd::db::ledger::RENEW,
                2,
                "effect_ledger_claim",
            ),
        ];
        // The backlog gauge: half the rows match, where PostgreSQL rightly reads the table.
        if backend == timeoutd::db::Backend::MySql {
            statements.push((
                "LEDGER_PENDING",
                timeoutd::db::backlog::LEDGER_PENDING,
                1,
                "effect_ledger_status_created",
            ));
        }
        for (name, sql, binds, index) in statements {
            let mut explain = env
                .db
                .backend()
                // The dialect's placeholders are rewritten from a `&'static str`.
                .query(Box::leak(format!("EXPLAIN {sql}").into_boxed_str()));
            explain = match (name, binds) {
                ("LEDGER_PENDING", _) => explain.bind(1_i64),
                (_, 2) => explain.bind(1_i64).bind("t-7"),
                _ => explain.bind("t-7"),
            };
            let plan: Vec<String> = explain
                .fetch_all(pool)
                .await
                .unwrap()
                .iter()
                .map(plan_line)
                .collect();
            assert!(
                plan.iter().any(|line| line.contains(index)),
                "{backend:?}: {name} does not use {index}: {plan:?}"
            );
        }
        env.cleanup().await;
    }
}

/// One `EXPLAIN` row as one line: its columns' text joined by spaces (NULLs empty).
fn plan_line(row: &sqlx::any::AnyRow) -> String {
    (0..sqlx::Row::len(row))
        .map(|i| {
            sqlx::Row::try_get::<Option<String>, _>(row, i)
                .ok()
                .flatten()
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join(" ")
}
