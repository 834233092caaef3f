//! What real order services send, on every backend: times in the wrong unit are quarantined —
//! dead-lettered naming the field and its value, never closed on them, stock untouched — and
//! the sweep does not re-arm such an order. A producer clock that is merely skewed is not
//! corruption: an order whose own times are believable closes at its deadline whatever its
//! trigger rows say (issue #49, case 5).

use timeoutd::clock::Clock;
use timeoutd::dispatch::Outcome;
use timeoutd::sources::sweep;

use crate::support::{MerchantSpec, T0, each_backend, order};

const SHOPS: &[MerchantSpec<'static>] = &[("acme", "builtin:single-phase", &[])];

each_backend! {
    async fn times_in_the_wrong_unit_are_quarantined_and_close_nothing(env) {
        env.stock_up(&[("sku-a", 20), ("sku-b", 20)]).await;
        // A deadline in seconds for an order created in milliseconds (closes "6 ms after insert").
        let mut seconds = order("in-seconds", "acme", T0);
        seconds.deadline_ms = T0 / 1_000;
        env.create(&seconds).await;
        // A creation time in seconds: the window looks like 56 years.
        let mut far = order("far", "acme", T0);
        far.created_at_ms = (T0 - 15 * 60_000) / 1_000;
        env.create(&far).await;
        // A good order whose outbox row is due in seconds.
        env.create(&order("due-in-seconds", "acme", T0 + 60_000)).await;
        env.db
            .backend()
            .query("UPDATE order_timeout_msg SET due_ms = ? WHERE order_id = ?")
            .bind(T0 / 1_000)
            .bind("due-in-seconds")
            .execute(env.db.pool())
            .await
            .unwrap();
        let config = env.config(SHOPS, "");
        let (clock, now) = Clock::manual(T0);
        let d = env.dispatcher(&config, clock).await;
        let outcomes = env.process(&d, T0).await;
        assert_eq!(outcomes.len(), 3, "{outcomes:?}");
        let dead = outcomes.iter().filter(|o| matches!(o, Outcome::DeadLettered { .. })).count();
        let held = outcomes.iter().filter(|o| matches!(o, Outcome::Deferred { until_ms } if *until_ms == T0 + 60_000)).count();
        assert_eq!((dead, held), (2, 1), "the two orders quarantined, the row held to its order's deadline: {outcomes:?}");
        for id in ["in-seconds", "far", "due-in-seconds"] {
            assert_eq!(env.status(id).await, "PENDING", "{id} is not closed");
            assert_eq!(env.coupon(&format!("cpn-{id}")).await, "LOCKED", "{id}'s coupon stays locked");
        }
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (14, 17), "stock untouched");
        let reason = |id: &'static str| env.text("SELECT reason FROM dead_letter WHERE order_id = ?", id);
        let r = reason("in-seconds").await;
        assert!(r.starts_with(&format!("orders.deadline_ms = {} of order `in-seconds` is before its created_at_ms", T0 / 1_000)), "{r}");
        assert!(r.contains("looks like seconds"), "{r}");
        let r = reason("far").await;
        assert!(r.contains("more than dispatch.max_window") && r.contains("looks like seconds"), "{r}");
        // The row's value is set aside for an operator, naming it; its order keeps its deadline.
        let r = reason("due-in-seconds").await;
        assert!(r.starts_with(&format!("order_timeout_msg.due_ms = {}", T0 / 1_000)), "{r}");
        assert!(r.contains("looks like seconds") && r.contains(&format!("held to its own deadline_ms = {}", T0 + 60_000)), "{r}");
        assert_eq!(env.text("SELECT source FROM dead_letter WHERE order_id = ?", "due-in-seconds").await, "quarantined-row");
        assert_eq!(env.int("SELECT due_ms FROM order_timeout_msg WHERE order_id = ?", "due-in-seconds").await, T0 + 60_000);
        // Nothing before the deadline; at it, the order closes once.
        assert!(env.process(&d, T0 + 59_999).await.is_empty());
        now.store(T0 + 60_000, std::sync::atomic::Ordering::SeqCst);
        let outcomes = env.process(&d, T0 + 60_000).await;
        assert!(matches!(outcomes.as_slice(), [Outcome::Closed { .. }]), "{outcomes:?}");
        assert_eq!(env.status("due-in-seconds").await, "CLOSED");
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (16, 18), "its stock back, once");
        // The sweep leaves quarantined orders to the operator.
        let (an_hour_later, _) = Clock::manual(T0 + 3_600_000);
        let swept = sweep::sweep_once(&env.db, &an_hour_later, &config.sweep).await.unwrap();
        assert_eq!(swept.rearmed, 0, "nothing re-armed");
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE order_id <> ? AND order_id <> 'due-in-seconds'", "").await, 0);
    }
}

each_backend! {
    async fn a_skewed_producer_clock_is_not_corruption_and_the_order_closes_at_its_own_deadline(env) {
        env.stock_up(&[("sku-a", 20), ("sku-b", 20)]).await;
        let grace = 60_000;
        let config = env.config(SHOPS, "[sweep]\ngrace = \"60s\"\n");
        // Clock behind: the order service wrote its phase-0 row due a minute before the order's
        // own creation (it was dead-lettered as "due before creation, looks like seconds", and
        // the order stayed PENDING past its deadline with its stock held).
        let behind = order("behind", "acme", T0);
        env.create(&behind).await;
        let due_behind = behind.created_at_ms - 60_000;
        env.db.backend().query("UPDATE order_timeout_msg SET due_ms = ? WHERE order_id = ?")
            .bind(due_behind).bind("behind").execute(env.db.pool()).await.unwrap();
        // Clock ahead: its phase-0 row is due ten minutes after the deadline (not dead-lettered
        // either).
        env.create(&order("ahead", "acme", T0)).await;
        env.db.backend().query("UPDATE order_timeout_msg SET due_ms = ? WHERE order_id = ?")
            .bind(T0 + 600_000).bind("ahead").execute(env.db.pool()).await.unwrap();
        // Both times in seconds: a window of 900 "ms" in January 1970 is no clock's reading.
        let mut both = order("both-in-seconds", "acme", T0);
        both.created_at_ms = (T0 - 900_000) / 1_000;
        both.deadline_ms = T0 / 1_000;
        env.create(&both).await;
        let (clock, now) = Clock::manual(due_behind);
        let d = env.dispatcher(&config, clock).await;
        // The early row is taken as it is: held to its order's deadline, nothing dead-lettered.
        let outcomes = env.process(&d, due_behind).await;
        assert!(outcomes.iter().any(|o| matches!(o, Outcome::Deferred { until_ms } if *until_ms == T0)), "{outcomes:?}");
        assert_eq!(env.int("SELECT COUNT(*) FROM dead_letter WHERE order_id = ?", "behind").await, 0);
        assert_eq!(env.status("both-in-seconds").await, "PENDING");
        let r = env.text("SELECT reason FROM dead_letter WHERE order_id = ?", "both-in-seconds").await;
        assert!(r.starts_with("orders.created_at_ms = ") && r.contains("no clock's reading") && r.contains("looks like seconds"), "{r}");
        // At the deadline: `behind` closes on time; `ahead`'s row is not due yet.
        now.store(T0, std::sync::atomic::Ordering::SeqCst);
        let outcomes = env.process(&d, T0).await;
        assert!(matches!(outcomes.as_slice(), [Outcome::Closed { .. }]), "{outcomes:?}");
        assert_eq!(env.status("behind").await, "CLOSED");
        assert_eq!(env.status("ahead").await, "PENDING");
        // Past its deadline and the grace, the sweep takes `ahead` though its row says later
        // (the order service wrote it so; timeoutd never deferred it), and it closes once, nine
        // minutes before its row would have come due.
        let (swept_at, _) = Clock::manual(T0 + grace + 1);
        let swept = sweep::sweep_once(&env.db, &swept_at, &config.sweep).await.unwrap();
        assert_eq!(swept.rearmed, 1, "the late row's order re-armed, the quarantined one not");
        now.store(T0 + grace + 1, std::sync::atomic::Ordering::SeqCst);
        let outcomes = env.process(&d, T0 + grace + 1).await;
        assert!(matches!(outcomes.as_slice(), [Outcome::Closed { .. }]), "{outcomes:?}");
        assert_eq!(env.status("ahead").await, "CLOSED");
        assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE order_id = ? AND decision = 'cancel'", "ahead").await, 1);
        assert_eq!(env.int("SELECT COUNT(*) FROM dead_letter WHERE order_id = ?", "ahead").await, 0);
        // A row timeoutd deferred itself past the deadline (a tripped plugin, a payment lease)
        // keeps its time: the sweep does not take it over.
        env.create(&order("held-by-us", "acme", T0)).await;
        env.db.backend().query("UPDATE order_timeout_msg SET due_ms = ?, last_error = ? WHERE order_id = ?")
            .bind(T0 + 600_000).bind("held: the merchant's plugin is tripped").bind("held-by-us").execute(env.db.pool()).await.unwrap();
        let swept = sweep::sweep_once(&env.db, &swept_at, &config.sweep).await.unwrap();
        assert_eq!(swept.rearmed, 0, "a row timeoutd deferred is live");
        assert_eq!(env.status("held-by-us").await, "PENDING");
        // Stock: the two skewed orders gave theirs back once each; the quarantined one and
        // held-by-us hold theirs.
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (16, 18));
        assert_eq!(env.coupon("cpn-both-in-seconds").await, "LOCKED");
    }
}

/// A MariaDB database created latin1 (a common default): the schema is utf8mb4 anyway, so a
/// close whose reason is `超时未支付⏰` for a buyer `买家⏰` on SKU `茶-⏰` closes once and stores
/// every character exactly (it failed with error 1366 and dead-lettered, stock held).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_latin1_mariadb_database_stores_cjk_and_emoji_exactly() {
    let env = crate::support::Env::new_with(
        timeoutd::db::Backend::MySql,
        " CHARACTER SET latin1 COLLATE latin1_swedish_ci",
    )
    .await;
    let reason = "超时未支付⏰";
    env.stock_up(&[("茶-⏰", 10), ("sku-b", 10)]).await;
    let mut o = order("订单-⏰-1", "acme", T0);
    o.user = "买家⏰".into();
    o.items[0].sku = "茶-⏰".into();
    env.create(&o).await;
    let shops: &[MerchantSpec<'_>] = &[("acme", "builtin:single-phase", &[("reason", reason)])];
    let config = env.config(shops, "");
    let (clock, _) = Clock::manual(T0);
    let d = env.dispatcher(&config, clock).await;
    assert_eq!(
        env.process(&d, T0).await,
        vec![Outcome::Closed { lateness_ms: 0 }]
    );
    assert_eq!(
        env.text("SELECT close_reason FROM orders WHERE id = ?", "订单-⏰-1")
            .await,
        reason
    );
    assert_eq!(
        env.text("SELECT user_id FROM orders WHERE id = ?", "订单-⏰-1")
            .await,
        "买家⏰"
    );
    assert_eq!(
        env.stock("茶-⏰").await,
        10,
        "the stock came back to the emoji SKU"
    );
    assert!(
        env.text(
            "SELECT detail FROM decision_log WHERE order_id = ?",
            "订单-⏰-1"
        )
        .await
        .contains(reason)
    );
    assert_eq!(
        env.text("SELECT table_collation FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?", "orders").await,
        "utf8mb4_bin"
    );
    env.cleanup().await;
}
