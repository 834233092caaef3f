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
