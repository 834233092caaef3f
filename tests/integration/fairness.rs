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

/// A merchant whose plugin file is broken when the daemon starts does not stop the others
/// (#46): `validate`'s loader refuses the config, the daemon's (`load_serving`) holds the
/// merchant — its trigger deferred and PENDING with the reason, never dead-lettered, the
/// merchant listed as tripped for the alert — and decides the other merchant's order. Once a
/// good file is in place the next reload takes it and the held order closes, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_merchant_whose_plugin_file_is_broken_at_start_is_held_and_the_others_are_served() {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use timeoutd::db::{Backend, Db};
    use timeoutd::dispatch::{Dispatcher, Outcome};
    use timeoutd::effects::EffectRunner;

    let env = crate::support::Env::new(Backend::Sqlite).await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    let path = env.dir.path().join("broken.wasm");
    std::fs::write(&path, b"not a component: a truncated upload").unwrap();
    let plugin = path.display().to_string();
    let merchants: &[MerchantSpec<'_>] = &[
        ("broken", plugin.as_str(), &[]),
        ("fine", "builtin:single-phase", &[]),
    ];
    let config = env.config(merchants, "");
    let strict = timeoutd::policies::load(&config).unwrap_err().to_string();
    assert!(strict.contains("merchants.broken.plugin"), "{strict}");

    let (policies, held) = timeoutd::policies::load_serving(&config).unwrap();
    assert_eq!(held.len(), 1, "{held:?}");
    assert!(held[0].starts_with("merchants.broken.plugin: "), "{held:?}");
    assert_eq!(policies.tripped(T0), vec!["broken".to_string()]);
    // Listed where operators look (`GET /v1/plugins`, the console): held, with its reason.
    let listed = policies.held_merchants();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        (listed[0].0.as_str(), listed[0].1.as_str()),
        ("broken", plugin.as_str())
    );
    assert!(
        held[0].ends_with(&listed[0].2),
        "the same reason: {listed:?} {held:?}"
    );
    let (clock, now) = Clock::manual(T0);
    let db = Db::connect(&env.url, 8).await.unwrap();
    let effects = EffectRunner::from_config(db.clone(), clock.clone(), &config)
        .await
        .unwrap();
    let d = Dispatcher::new(
        db,
        clock,
        policies.clone(),
        config.dispatch.clone(),
        Arc::new(effects),
    );
    env.create(&order("b-1", "broken", T0)).await;
    env.create(&order("f-1", "fine", T0)).await;
    let mut outcomes = env.process(&d, T0).await;
    outcomes.sort_by_key(|o| format!("{o:?}"));
    let trip_ms = config.runtime.trip_for.as_millis() as i64;
    assert_eq!(
        outcomes,
        vec![
            Outcome::Closed { lateness_ms: 0 },
            Outcome::Tripped {
                until_ms: T0 + trip_ms
            }
        ]
    );
    assert_eq!(
        env.text("SELECT status FROM orders WHERE id = ?", "f-1")
            .await,
        "CLOSED"
    );
    assert_eq!(
        env.text("SELECT status FROM orders WHERE id = ?", "b-1")
            .await,
        "PENDING"
    );
    assert_eq!(
        env.text(
            "SELECT status FROM order_timeout_msg WHERE order_id = ?",
            "b-1"
        )
        .await,
        "PENDING"
    );
    let why = env
        .text(
            "SELECT last_error FROM order_timeout_msg WHERE order_id = ?",
            "b-1",
        )
        .await;
    assert!(
        why.starts_with("held: the merchant's plugin did not load: "),
        "{why}"
    );
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM dead_letter WHERE order_id LIKE ?",
            "%"
        )
        .await,
        0
    );

    std::fs::write(&path, timeoutd::policies::builtin("single-phase").unwrap()).unwrap();
    let report = policies.reload(false);
    let taken = report.iter().find(|r| r.merchant == "broken").unwrap();
    assert!(taken.changed && taken.refused.is_none(), "{report:?}");
    assert!(policies.tripped(T0).is_empty());
    assert!(policies.held_merchants().is_empty(), "taken by the reload");
    now.store(T0 + trip_ms, Ordering::SeqCst);
    let outcomes = env.process(&d, T0 + trip_ms).await;
    assert!(
        matches!(outcomes[..], [Outcome::Closed { .. }]),
        "{outcomes:?}"
    );
    assert_eq!(
        env.text("SELECT status FROM orders WHERE id = ?", "b-1")
            .await,
        "CLOSED"
    );
    assert_eq!(
        env.stock("sku-a").await,
        10,
        "both orders' units back, once each"
    );
}
