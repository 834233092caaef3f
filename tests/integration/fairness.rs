//! #46 part 1: one merchant's trouble stays that merchant's in the effect executor — its slots
//! shared by weight, a finished order's slot refilled at once, a page read in turns across
//! merchants — on SQLite, MariaDB and PostgreSQL.

use std::collections::HashSet;
use std::time::Duration;

use timeoutd::clock::Clock;

use crate::fakes::Receiver;
use crate::support::{MerchantSpec, T0, each_backend, order};

/// Two merchants closing at the deadline: `slow`'s notices to the `held` channel, `quick`'s
/// to `sms`.
const TWO: &[MerchantSpec<'static>] = &[
    ("slow", "builtin:single-phase", &[("channel", "held")]),
    ("quick", "builtin:single-phase", &[("channel", "sms")]),
];

/// The `held` and `sms` webhook channels.
fn channels(held: &Receiver, sms: &Receiver) -> String {
    format!(
        "[notify.channels.held]\nkind = \"webhook\"\nurl = \"{}\"\ntimeout = \"60s\"\n\
         [notify.channels.sms]\nkind = \"webhook\"\nurl = \"{}\"\n",
        held.url, sms.url
    )
}

/// Waits up to `limit` for `receiver` to hold `n` requests; returns how many it holds.
async fn received(receiver: &Receiver, n: usize, limit: Duration) -> usize {
    let started = std::time::Instant::now();
    loop {
        let got = receiver.received.lock().unwrap().len();
        if got >= n || started.elapsed() >= limit {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

each_backend! {
    /// Merchant `slow`'s webhook holds every call, and `slow` has twice as many orders as the
    /// executor has slots, recorded first. Merchant `quick`'s notices are still all delivered
    /// while every one of `slow`'s calls is held: `slow` holds at most `effects.merchant_slots`
    /// (3 of 4) and each slot `quick` frees goes back to `quick`. Before, a chunk of four of
    /// `slow`'s rows held all four slots until its webhook timed out. Once the webhook lets
    /// go, `slow`'s notices arrive, each once, and every notice row is DONE.
    async fn a_merchant_whose_webhook_hangs_does_not_hold_up_another_merchants_notices(env) {
        env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
        let slow: Vec<String> = (0..8).map(|k| format!("slow-{k}")).collect();
        let quick: Vec<String> = (0..4).map(|k| format!("quick-{k}")).collect();
        for id in &slow {
            env.create(&order(id, "slow", T0)).await;
        }
        for id in &quick {
            env.create(&order(id, "quick", T0)).await;
        }
        // Closed with both channels answering (the dispatcher runs its effects inline), then
        // the notices put back PENDING as a crash before they ran leaves them.
        let answering = Receiver::start().await;
        let config = env.config(TWO, &channels(&answering, &answering));
        let (clock, _) = Clock::manual(T0);
        let d = env.dispatcher(&config, clock.clone()).await;
        assert_eq!(env.process(&d, T0).await.len(), 12);
        env.db
            .backend()
            .query("UPDATE effect_ledger SET status = 'PENDING', attempts = 0, updated_at_ms = 0, claim_until_ms = NULL, claim_token = NULL WHERE kind = 'notify'")
            .execute(env.db.pool())
            .await
            .unwrap();

        let (held, sms) = (Receiver::start_holding().await, Receiver::start().await);
        let config = env.config(TWO, &format!("{}[effects]\nconcurrency = 4\n", channels(&held, &sms)));
        let runner = env.runner(&config, clock).await;
        let run = tokio::spawn(async move { runner.run_fresh().await });
        assert_eq!(received(&sms, 4, Duration::from_secs(30)).await, 4, "quick's notices delivered while slow's are held");
        let pending = "SELECT COUNT(*) FROM effect_ledger WHERE kind = 'notify' AND status = 'PENDING' AND order_id LIKE ?";
        let started = std::time::Instant::now();
        while env.int(pending, "quick-%").await > 0 && started.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(env.int(pending, "quick-%").await, 0, "quick's rows settled while slow's calls hang");
        assert_eq!(received(&held, 3, Duration::from_secs(30)).await, 3);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(held.received.lock().unwrap().len(), 3, "slow holds 3 of the 4 slots, no more");
        assert_eq!(env.int(pending, "slow-%").await, 8, "none of slow's settled yet");

        held.let_go();
        assert_eq!(run.await.unwrap().unwrap(), 12, "every row settled once slow's webhook answers");
        let keys: Vec<String> = held.received.lock().unwrap().iter().map(|(k, _)| k.clone()).collect();
        assert_eq!(keys.len(), 8, "each of slow's notices sent once: {keys:?}");
        assert_eq!(keys.iter().collect::<HashSet<_>>().len(), 8);
        let done = "SELECT COUNT(*) FROM effect_ledger WHERE kind = 'notify' AND status = 'DONE' AND order_id LIKE ?";
        assert_eq!(env.int(done, "slow-%").await + env.int(done, "quick-%").await, 12);
    }
}
