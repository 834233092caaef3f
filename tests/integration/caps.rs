//! Caps per effect kind and channel per merchant (`[caps]`, `timeoutd::effects::caps`): a
//! merchant's burst of notices reaches its receiver at the cap's rate, deferred and never
//! failed, each notice once, while another merchant's is not slowed at all; with
//! `caps.store = "redis"` two daemons share one budget. Timed by a manual clock, so every slot
//! is exact.

use std::sync::atomic::Ordering;

use timeoutd::clock::Clock;
use timeoutd::config::Config;
use timeoutd::db::Backend;
use timeoutd::db::ledger::{self, NewEntry};
use timeoutd::effects::EffectRunner;
use timeoutd_runtime::model::{Effect, Notice};

use crate::fakes::Receiver;
use crate::support::{Env, T0};

/// PENDING `notify` rows on channel `sms` for `merchant`'s orders `<merchant>-0` … `-(n-1)`.
async fn notices(env: &Env, merchant: &str, n: usize) {
    notices_on(env, merchant, "sms", n).await;
}

/// PENDING `notify` rows on `channel` (template `<channel>-t`) for `merchant`'s orders
/// `<merchant>-<channel>-0` … (order ids `<merchant>-<i>` on `sms`).
async fn notices_on(env: &Env, merchant: &str, channel: &str, n: usize) {
    let payload = serde_json::to_string(&Effect::Notify(Notice {
        channel: channel.into(),
        template: format!("{channel}-t"),
        params: Vec::new(),
    }))
    .unwrap();
    let ids: Vec<String> = (0..n)
        .map(|i| match channel {
            "sms" => format!("{merchant}-{i}"),
            _ => format!("{merchant}-{channel}-{i}"),
        })
        .collect();
    let entries: Vec<NewEntry<'_>> = ids
        .iter()
        .map(|id| NewEntry {
            order_id: id,
            merchant_id: merchant,
            phase: 0,
            index: 0,
            kind: "notify",
            payload: payload.clone(),
            status: "PENDING",
            note: None,
            key: None,
        })
        .collect();
    let mut conn = env.db.pool().acquire().await.unwrap();
    ledger::record_many(&mut conn, env.db.backend(), &entries, T0)
        .await
        .unwrap();
}

/// Notices `receiver` got for `merchant`'s orders, and whether any came twice.
fn sent(receiver: &Receiver, merchant: &str) -> (usize, bool) {
    let received = receiver.received.lock().unwrap();
    let mut keys: Vec<&str> = received
        .iter()
        .map(|(key, _)| key.as_str())
        .filter(|key| key.starts_with(&format!("{merchant}/")))
        .collect();
    let n = keys.len();
    keys.sort_unstable();
    keys.dedup();
    (n, keys.len() != n)
}

/// A config sending channels `sms` and `mail` to `receiver`, merchant `capped` with `caps`
/// (TOML lines), merchant `free` uncapped, the caps kept in `store`.
fn config_with(env: &Env, receiver: &Receiver, capped: &str, caps: &str, store: &str) -> Config {
    let toml = format!(
        "[database]\nurl = \"{}\"\n[redis]\nurl = \"redis://127.0.0.1:6379\"\n[caps]\nstore = \"{store}\"\n\
         [effects]\nconcurrency = 4\n[notify.channels.sms]\nkind = \"webhook\"\nurl = \"{url}\"\n\
         [notify.channels.mail]\nkind = \"webhook\"\nurl = \"{url}\"\n\
         [merchants.{capped}]\nplugin = \"builtin:single-phase\"\n[merchants.{capped}.caps]\n{caps}\n\
         [merchants.free]\nplugin = \"builtin:single-phase\"\n",
        env.url,
        url = receiver.url
    );
    Config::from_toml(&toml, env.dir.path(), &|_| None).unwrap()
}

/// [`config_with`]: `capped` at 5 notices a second on channel `sms`.
fn config(env: &Env, receiver: &Receiver, capped: &str, store: &str) -> Config {
    config_with(env, receiver, capped, "\"notify.sms\" = 5", store)
}

/// Twelve notices each for a merchant capped at 5 a second and one uncapped, all due at T0:
/// the uncapped twelve go at once; the capped merchant's burst of 5 goes and the other 7 wait,
/// PENDING with no attempt counted and the spent cap named, for their slots 200 ms apart
/// (T0 + 200 … + 1400). Each notice arrives once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merchants_channel_cap_spaces_its_burst_and_never_slows_another_merchant() {
    let env = Env::new(Backend::Sqlite).await;
    let receiver = Receiver::start().await;
    notices(&env, "capped", 12).await;
    notices(&env, "free", 12).await;
    let (clock, now) = Clock::manual(T0);
    let runner = EffectRunner::from_config(
        env.db.clone(),
        clock,
        &config(&env, &receiver, "capped", "process"),
    )
    .await
    .unwrap();
    runner.run_fresh().await.unwrap();
    assert_eq!(
        sent(&receiver, "free"),
        (12, false),
        "uncapped: all at once"
    );
    assert_eq!(
        sent(&receiver, "capped"),
        (5, false),
        "the burst of the cap"
    );
    let waiting = "SELECT COUNT(*) FROM effect_ledger WHERE status = 'PENDING' AND attempts = 0 AND merchant_id = ?";
    assert_eq!(
        env.int(waiting, "capped").await,
        7,
        "deferred, no attempt counted"
    );
    let why = env
        .text(
            "SELECT last_error FROM effect_ledger WHERE status = 'PENDING' AND merchant_id = ? LIMIT 1",
            "capped",
        )
        .await;
    assert!(
        why.contains("cap `notify.sms` of merchant `capped` (5/s, merchants.capped.caps) spent"),
        "{why}"
    );
    for (at, expected) in [(199, 5), (200, 6), (600, 8), (1_399, 11), (1_400, 12)] {
        now.store(T0 + at, Ordering::SeqCst);
        runner.run_fresh().await.unwrap();
        assert_eq!(
            sent(&receiver, "capped"),
            (expected, false),
            "at T0 + {at} ms"
        );
    }
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM effect_ledger WHERE status = 'DONE' AND attempts = 1 AND merchant_id = ?",
            "capped"
        )
        .await,
        12,
        "each done on its one attempt"
    );
}

/// Two daemons with `caps.store = "redis"` share the merchant's budget: at T0 the first sends
/// 5 of its 6 notices and the second none of its 6 (10 between them with each process's own
/// cap). Run side by side afterwards, every notice arrives once, and never faster than the
/// cap: at T0 + t, at most 5 + 5 t / 1 s have arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_share_a_cap_kept_in_redis() {
    let env = Env::new(Backend::Sqlite).await;
    let receiver = Receiver::start().await;
    // A merchant of its own: the budget lives in Redis, shared with any other run.
    let capped = format!("capped{:08x}", fastrand::u32(..));
    notices(&env, &capped, 12).await;
    let (clock, now) = Clock::manual(T0);
    let config = config(&env, &receiver, &capped, "redis");
    let a = EffectRunner::from_config(env.db.clone(), clock.clone(), &config)
        .await
        .unwrap();
    let b = EffectRunner::from_config(env.db.clone(), clock, &config)
        .await
        .unwrap();
    for i in 0..6 {
        a.run_for_order(&format!("{capped}-{i}")).await;
    }
    assert_eq!(sent(&receiver, &capped), (5, false), "a's burst");
    for i in 6..12 {
        b.run_for_order(&format!("{capped}-{i}")).await;
    }
    assert_eq!(
        sent(&receiver, &capped),
        (5, false),
        "b finds the budget spent"
    );
    let mut at = 0;
    while sent(&receiver, &capped).0 < 12 {
        at += 100;
        // The 7 deferred run at their slots (T0 + 200 … + 1400), whichever daemon takes them:
        // a row booked by one and booked again by the other would come later.
        assert!(at <= 1_400, "every notice sent by its booked slot");
        now.store(T0 + at, Ordering::SeqCst);
        a.run_fresh().await.unwrap();
        b.run_fresh().await.unwrap();
        let (n, twice) = sent(&receiver, &capped);
        assert!(!twice, "a notice sent twice");
        assert!(
            n as i64 <= 5 + 5 * at / 1_000,
            "{n} sent by T0 + {at} ms: faster than 5 a second"
        );
    }
}

/// With the shared store down (`[redis]` on a port nobody listens on), the process's own cap
/// applies: the burst of 5 goes, the rest waits for its slots, and nothing fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_caps_apply_while_the_shared_store_is_down() {
    let env = Env::new(Backend::Sqlite).await;
    let receiver = Receiver::start().await;
    notices(&env, "capped", 12).await;
    let dead = crate::support::free_port();
    let mut config = config(&env, &receiver, "capped", "redis");
    config.redis.as_mut().unwrap().url = Some(format!("redis://127.0.0.1:{dead}"));
    let (clock, now) = Clock::manual(T0);
    let runner = EffectRunner::from_config(env.db.clone(), clock, &config)
        .await
        .unwrap();
    runner.run_fresh().await.unwrap();
    assert_eq!(
        sent(&receiver, "capped"),
        (5, false),
        "the process's own burst"
    );
    now.store(T0 + 1_400, Ordering::SeqCst);
    runner.run_fresh().await.unwrap();
    assert_eq!(sent(&receiver, "capped"), (12, false));
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM effect_ledger WHERE status = 'DONE' AND merchant_id = ?",
            "capped"
        )
        .await,
        12
    );
}

/// Caps on one channel and on every notice: `notify.sms` = 2, `notify` = 5. Six SMS and four
/// mails at T0: two SMS go (the channel's burst) and the other four wait for the channel's
/// slots without holding any of `notify`'s, so three mails still go at T0 on `notify`'s burst
/// (2 + 3 = 5). Booked on both caps at once, the waiting SMS would have spent `notify`'s burst
/// and held every mail back. Each SMS back at its channel slot asks `notify` then, and all ten
/// go once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_cap_is_asked_first_and_holds_no_slot_of_the_broad_cap() {
    let env = Env::new(Backend::Sqlite).await;
    let receiver = Receiver::start().await;
    notices_on(&env, "capped", "sms", 6).await;
    notices_on(&env, "capped", "mail", 4).await;
    let config = config_with(
        &env,
        &receiver,
        "capped",
        "notify = 5\n\"notify.sms\" = 2",
        "process",
    );
    let (clock, now) = Clock::manual(T0);
    let runner = EffectRunner::from_config(env.db.clone(), clock, &config)
        .await
        .unwrap();
    runner.run_fresh().await.unwrap();
    let by_template = |template: &str| {
        receiver
            .received
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, body)| body["template"] == template)
            .count()
    };
    assert_eq!(by_template("sms-t"), 2, "the channel's burst");
    assert_eq!(
        by_template("mail-t"),
        3,
        "notify's burst, less the two SMS sent"
    );
    for at in (100..=4_000).step_by(100) {
        now.store(T0 + at, Ordering::SeqCst);
        runner.run_fresh().await.unwrap();
    }
    assert_eq!((by_template("sms-t"), by_template("mail-t")), (6, 4));
    assert_eq!(sent(&receiver, "capped"), (10, false), "each once");
}
