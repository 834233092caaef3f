//! The outbox timer's prefetch (#13): rows due within `outbox.prefetch` are claimed and their
//! orders loaded before the deadline, held in memory and decided when due. Nothing closes
//! early, a payment landing while its row is held still wins, and a daemon stopping gives the
//! rows it held back at once.

use std::time::Duration;

use timeoutd::clock::Clock;
use timeoutd::daemon::Daemon;

use crate::support::{Env, MerchantSpec, each_backend, eventually, order};

const SHOPS: &[MerchantSpec<'static>] = &[("acme", "builtin:single-phase", &[])];
const ORDERS: usize = 20;

fn ids() -> Vec<String> {
    (0..ORDERS).map(|i| format!("pre-{i:02}")).collect()
}

/// Rows claimed under a prefetch claim (`pre-` token), of the orders `ids`.
async fn prefetched(env: &Env) -> i64 {
    env.int(
        "SELECT COUNT(*) FROM order_timeout_msg WHERE claim_token LIKE ? AND status = 'PENDING'",
        "pre-%",
    )
    .await
}

fn config(env: &Env, prefetch: &str) -> timeoutd::config::Config {
    env.config(
        SHOPS,
        &format!("[outbox]\nprefetch = \"{prefetch}\"\n[sweep]\nenabled = false\n"),
    )
}

/// A daemon prefetching `prefetch` ahead, and [`ORDERS`] orders sharing a deadline `lead_ms`
/// from now, once every row is claimed under a prefetch claim (within `lead_ms` − 1 s).
async fn burst_prefetched(env: &Env, prefetch: &str, lead_ms: i64) -> (Daemon, i64) {
    env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
    let daemon = Daemon::start(&config(env, prefetch), Clock::Database)
        .await
        .unwrap();
    let deadline = env.db.now_ms().await.unwrap() + lead_ms;
    for id in ids() {
        env.create(&order(&id, "acme", deadline)).await;
    }
    let within = Duration::from_millis(lead_ms as u64 - 1_000);
    eventually(within, "every row is prefetched", || async {
        prefetched(env).await == ORDERS as i64
    })
    .await;
    (daemon, deadline)
}

each_backend! {
    /// Twenty orders share a deadline 4 s ahead; the daemon prefetches 3 s ahead. Before the
    /// deadline every row is claimed under a prefetch claim and every order is still PENDING;
    /// one is paid while held. At the deadline the other 19 close, none before it; the paid one
    /// stays PAID with its stock and coupon untouched and nothing in the ledger.
    async fn prefetched_rows_close_at_their_deadline_and_a_payment_while_held_wins(env) {
        let (daemon, deadline) = burst_prefetched(env, "3s", 4_000).await;
        assert!(env.db.now_ms().await.unwrap() < deadline, "prefetched before the deadline");
        let open = env.int("SELECT COUNT(*) FROM orders WHERE status = ? ", "PENDING").await;
        assert_eq!(open, ORDERS as i64, "nothing decided before the deadline");
        assert!(env.pay("pre-07", deadline - 1_000).await, "paid while its row is held");

        eventually(Duration::from_secs(15), "the unpaid orders close", || async {
            env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "CLOSED").await == ORDERS as i64 - 1
        })
        .await;
        let early = env
            .int("SELECT COUNT(*) FROM orders WHERE status = 'CLOSED' AND closed_at_ms < deadline_ms AND id LIKE ?", "pre-%")
            .await;
        assert_eq!(early, 0, "none closed before its deadline");
        assert_eq!(env.status("pre-07").await, "PAID");
        assert_eq!(env.coupon("cpn-pre-07").await, "USED", "the paid order keeps its coupon");
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE order_id = ?", "pre-07").await, 0);
        // 100 at first, 3 units locked per order (2 + 1), the 19 closed ones given back.
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (100 - 2, 100 - 1));
        for id in ids() {
            let rows = env.text("SELECT status FROM order_timeout_msg WHERE order_id = ?", &id).await;
            assert_eq!(rows, "PROCESSED", "{id}: its row finished");
        }
        daemon.stop().await;
    }
}

each_backend! {
    /// Rows prefetched 5 s ahead of a deadline 6 s away: the daemon stops while holding them,
    /// gives their claims back (so any daemon takes them at once, not a lease later), and
    /// decided nothing. A daemon started afterwards closes them at the deadline.
    async fn a_stopping_daemon_gives_back_the_rows_it_prefetched(env) {
        let (daemon, deadline) = burst_prefetched(env, "5s", 6_000).await;
        daemon.stop().await;
        assert!(env.db.now_ms().await.unwrap() < deadline, "stopped before the deadline");
        let held = env
            .int("SELECT COUNT(*) FROM order_timeout_msg WHERE claim_token IS NOT NULL AND order_id LIKE ?", "pre-%")
            .await;
        assert_eq!(held, 0, "every prefetched claim given back");
        assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE order_id LIKE ?", "pre-%").await, 0);

        let next = Daemon::start(&config(env, "5s"), Clock::Database).await.unwrap();
        eventually(Duration::from_secs(15), "the next daemon closes them", || async {
            env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "CLOSED").await == ORDERS as i64
        })
        .await;
        next.stop().await;
        assert_eq!(
            env.int("SELECT COUNT(*) FROM decision_log WHERE order_id LIKE ?", "pre-%").await,
            ORDERS as i64,
            "one decision per order"
        );
    }
}
