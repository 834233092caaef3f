//! What real order services send, on every backend: times in the wrong unit are quarantined —
//! dead-lettered naming the field and its value, never closed, stock untouched — and the sweep
//! does not re-arm them.

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
        let (clock, _) = Clock::manual(T0);
        let d = env.dispatcher(&config, clock).await;
        let outcomes = env.process(&d, T0).await;
        assert_eq!(outcomes.len(), 3, "{outcomes:?}");
        assert!(outcomes.iter().all(|o| matches!(o, Outcome::DeadLettered { .. })), "{outcomes:?}");
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
        let r = reason("due-in-seconds").await;
        assert!(r.starts_with(&format!("order_timeout_msg.due_ms = {}", T0 / 1_000)), "{r}");
        // The sweep leaves quarantined orders to the operator.
        let (an_hour_later, _) = Clock::manual(T0 + 3_600_000);
        let swept = sweep::sweep_once(&env.db, &an_hour_later, &config.sweep).await.unwrap();
        assert_eq!(swept.rearmed, 0, "nothing re-armed");
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE order_id <> ?", "").await, 0);
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
