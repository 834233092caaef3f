//! External effects from the ledger, against real Redis, a loopback payment provider and a
//! webhook receiver — on SQLite, MariaDB and PostgreSQL.

use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::AsyncCommands;
use timeoutd::clock::Clock;
use timeoutd::dispatch::Outcome;

use crate::fakes::{Provider, Receiver};
use crate::support::{Env, MerchantSpec, T0, each_backend, order};

const REDIS: &str = "redis://127.0.0.1:6379";

async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open(REDIS)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("Redis on 127.0.0.1:6379")
}

/// A flash-sale order of `merchant` in a fresh activity; returns the activity id.
async fn flash_order(env: &Env, id: &str, merchant: &str) -> String {
    let activity = format!("act-{:012x}", fastrand::u64(..) >> 16);
    let mut o = order(id, merchant, T0);
    o.flash_activity = Some(activity.clone());
    env.create(&o).await;
    let mut r = redis().await;
    let _: () = r
        .set(format!("activity:{{{activity}}}:stock"), 5)
        .await
        .unwrap();
    let _: () = r
        .sadd(
            format!("activity:{{{activity}}}:users"),
            &[o.user.as_str(), "someone-else"],
        )
        .await
        .unwrap();
    activity
}

async fn flash_state(activity: &str) -> (i64, Vec<String>) {
    let mut r = redis().await;
    let stock: i64 = r
        .get(format!("activity:{{{activity}}}:stock"))
        .await
        .unwrap();
    let mut users: Vec<String> = r
        .smembers(format!("activity:{{{activity}}}:users"))
        .await
        .unwrap();
    users.sort();
    (stock, users)
}

/// Puts effects of `kinds` back as a crash between doing and settling them leaves them.
async fn unsettle(env: &Env, kinds: &'static str) {
    env.db
        .backend()
        .query_owned(format!(
            "UPDATE effect_ledger SET status = 'PENDING', attempts = 0, updated_at_ms = 0, claim_until_ms = NULL WHERE kind IN ({kinds})"
        ))
        .execute(env.db.pool())
        .await
        .unwrap();
}

const FLASH: &[MerchantSpec<'static>] = &[("flashy", "builtin:two-phase", &[("grace", "1s")])];

/// [`FLASH`] with its notices on the `sms` channel ([`sms_webhook`]).
const FLASH_SMS: &[MerchantSpec<'static>] = &[(
    "flashy",
    "builtin:two-phase",
    &[("grace", "1s"), ("channel", "sms")],
)];

/// A `[notify.channels.sms]` section sending to `receiver`'s webhook.
fn sms_webhook(receiver: &Receiver) -> String {
    format!(
        "[notify.channels.sms]\nkind = \"webhook\"\nurl = \"{}\"\n",
        receiver.url
    )
}

each_backend! {
    /// A lapsed flash-sale order gives its units back to the activity and frees the buyer's slot
    /// exactly once: not again when replayed after a crash, not twice when two executors race.
    async fn flash_sale_close_restores_redis_stock_and_slot_once(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let activity = flash_order(env, "fs", "flashy").await;
        let config = env.config(FLASH, &format!("[redis]\nurl = \"{REDIS}\"\n"));
        let (clock, now) = Clock::manual(T0);
        let d = env.dispatcher(&config, clock.clone()).await;
        assert!(matches!(env.process(&d, T0).await[..], [Outcome::Waiting { .. }]));
        now.store(T0 + 1_000, Ordering::SeqCst);
        assert_eq!(env.process(&d, T0 + 1_000).await, vec![Outcome::Closed { lateness_ms: 0 }]);
        let buyer = "user-of-fs".to_string();
        assert_eq!(flash_state(&activity).await, (8, vec!["someone-else".to_string()]));
        assert_eq!(env.text("SELECT status FROM effect_ledger WHERE kind = 'release-flash-slot' AND order_id = ?", "fs").await, "DONE");
        // Replay after a crash between the Redis change and settling the row.
        unsettle(env, "'restore-flash-stock', 'release-flash-slot'").await;
        let _: () = redis().await.sadd(format!("activity:{{{activity}}}:users"), &buyer).await.unwrap();
        let runner = env.runner(&config, clock.clone()).await;
        assert_eq!(runner.run_backlog(0).await.unwrap(), 2);
        assert_eq!(flash_state(&activity).await.0, 8, "stock restored once");
        assert!(flash_state(&activity).await.1.contains(&buyer), "a replay does not touch the set again");
        assert!(env.text("SELECT last_error FROM effect_ledger WHERE kind = 'restore-flash-stock' AND order_id = ?", "fs").await.contains("already applied"));
        // Two executors racing over the same rows.
        unsettle(env, "'restore-flash-stock'").await;
        let (a, b) = (env.runner(&config, clock.clone()).await, env.runner(&config, clock).await);
        let (ra, rb) = tokio::join!(a.run_backlog(0), b.run_backlog(0));
        assert_eq!(ra.unwrap() + rb.unwrap(), 1, "one settles it, the other finds it taken");
        assert_eq!(flash_state(&activity).await.0, 8);
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (10, 10), "database stock once too");
    }
}

each_backend! {
    /// An effect older than its marker window is parked for review, not re-run blindly (#17):
    /// a flash-sale effect that was claimed (and perhaps applied) and is found PENDING 8 days
    /// later — past `redis.marker_ttl` (7 days), so its marker may be gone — is marked FAILED
    /// with the reason and Redis is not touched; an operator's retry then runs it (its marker,
    /// still there in this test, keeps it from applying twice).
    async fn an_effect_older_than_its_marker_window_is_parked_for_review(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let activity = flash_order(env, "aged", "flashy").await;
        let config = env.config(FLASH, &format!("[redis]\nurl = \"{REDIS}\"\n"));
        let (clock, now) = Clock::manual(T0);
        let d = env.dispatcher(&config, clock.clone()).await;
        env.process(&d, T0).await;
        now.store(T0 + 1_000, Ordering::SeqCst);
        assert_eq!(env.process(&d, T0 + 1_000).await, vec![Outcome::Closed { lateness_ms: 0 }]);
        assert_eq!(flash_state(&activity).await.0, 8);
        // A crash between the Redis change and settling the rows, found 8 days later.
        unsettle(env, "'restore-flash-stock', 'release-flash-slot'").await;
        now.store(T0 + 8 * 86_400_000, Ordering::SeqCst);
        let runner = env.runner(&config, clock.clone()).await;
        runner.run_backlog(0).await.unwrap();
        let status = "SELECT status FROM effect_ledger WHERE kind = 'restore-flash-stock' AND order_id = ?";
        let reason = "SELECT last_error FROM effect_ledger WHERE kind = 'restore-flash-stock' AND order_id = ?";
        assert_eq!(env.text(status, "aged").await, "FAILED", "parked, not run");
        let why = env.text(reason, "aged").await;
        assert!(why.starts_with("parked for review") && why.contains("marker_ttl"), "{why}");
        assert_eq!(flash_state(&activity).await.0, 8, "Redis untouched");
        // The operator checked the key and retries: it runs now.
        let id = env.int("SELECT id FROM effect_ledger WHERE kind = 'restore-flash-stock' AND order_id = ?", "aged").await;
        let mut tx = env.db.begin().await.unwrap();
        assert!(timeoutd::db::ledger::retry_failed(&mut tx, id).await.unwrap());
        tx.commit().await.unwrap();
        runner.run_backlog(0).await.unwrap();
        assert_eq!(env.text(status, "aged").await, "DONE");
        assert!(env.text(reason, "aged").await.contains("already applied"));
        assert_eq!(flash_state(&activity).await.0, 8, "applied once");
    }
}

fn pay_config(provider: &Provider, extra: &str) -> String {
    pay_config_with(provider, "", extra)
}

/// As [`pay_config`], with `payment_keys` (lines of `[payment]`) added.
fn pay_config_with(provider: &Provider, payment_keys: &str, extra: &str) -> String {
    format!(
        "[payment]\nbase_url = \"{}\"\nauthorization = \"Bearer test\"\nattempts = 3\n{payment_keys}\n[effects]\nretry_initial = \"10s\"\n{extra}",
        provider.base_url
    )
}

const SHOPS: &[MerchantSpec<'static>] = &[("acme", "builtin:single-phase", &[])];

each_backend! {
    /// F13: the buyer pays between the status query (unpaid) and the close, so the provider
    /// answers "already paid" to close-payment → paid-after-close recorded, one refund, stock
    /// not restored twice; a paid callback afterwards changes nothing more.
    async fn already_paid_at_the_provider_records_paid_after_close_and_refunds_once(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("late-pay", "acme", T0)).await;
        env.create(&order("callback", "acme", T0)).await;
        let provider = Provider::start().await;
        provider.books.lock().unwrap().pays_during_close.insert("pay-late-pay".into());
        let config = env.config(SHOPS, &pay_config(&provider, "[http]\nlisten = \"127.0.0.1:0\"\ncallback_token = \"cb-secret\"\n"));
        let (clock, _) = Clock::manual(T0);
        let d = env.dispatcher(&config, clock.clone()).await;
        assert_eq!(env.process(&d, T0).await.len(), 2);
        assert_eq!(env.text("SELECT resolution FROM paid_after_close WHERE order_id = ?", "late-pay").await, "refund");
        assert_eq!(env.text("SELECT source FROM paid_after_close WHERE order_id = ?", "late-pay").await, "close-payment");
        assert_eq!(env.text("SELECT status FROM effect_ledger WHERE kind = 'refund-payment' AND order_id = ?", "late-pay").await, "DONE");
        assert_eq!(env.text("SELECT idempotency_key FROM effect_ledger WHERE kind = 'refund-payment' AND order_id = ?", "late-pay").await, "acme/late-pay/refund");
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (10, 10));
        {
            let books = provider.books.lock().unwrap();
            assert_eq!(books.refunds, vec![("pay-late-pay".to_string(), "acme/late-pay/refund".to_string())]);
            assert_eq!(books.calls_for("refund", "pay-late-pay"), 1, "one refund request, not one per retry: {:?}", books.calls);
            assert_eq!(books.calls_for("close", "pay-late-pay"), 1, "{:?}", books.calls);
            assert_eq!(books.closes.len(), 1, "only the other order's payment closed");
        }
        // Paid callbacks through the daemon's endpoint.
        let runner = env.runner(&config, clock).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let state = timeoutd::http::HttpState::new(env.db.clone(), runner, &config);
        let server = tokio::spawn(timeoutd::http::serve(listener, state, stopped));
        let client = reqwest::Client::new();
        let post = |order: &str| client.post(format!("http://{addr}/v1/payments/{order}/paid")).bearer_auth("cb-secret").send();
        // `http.callback_token`: a callback without it, or with another, is refused and recorded
        // nowhere.
        let anonymous = client.post(format!("http://{addr}/v1/payments/callback/paid")).send().await.unwrap();
        assert_eq!(anonymous.status(), 401);
        let forged = client.post(format!("http://{addr}/v1/payments/callback/paid")).bearer_auth("guess").send().await.unwrap();
        assert_eq!(forged.status(), 401);
        assert_eq!(env.int("SELECT COUNT(*) FROM paid_after_close WHERE order_id = ?", "callback").await, 0);
        let again = post("late-pay").await.unwrap();
        assert_eq!(again.status(), 202);
        assert_eq!(again.json::<serde_json::Value>().await.unwrap()["new"], false);
        let fresh = post("callback").await.unwrap();
        assert_eq!(fresh.status(), 202);
        assert_eq!(post("nope").await.unwrap().status(), 404);
        assert_eq!(env.text("SELECT source FROM paid_after_close WHERE order_id = ?", "callback").await, "callback");
        assert_eq!(provider.books.lock().unwrap().refunds.len(), 2, "one refund per paid-after-close order");
        assert_eq!(provider.books.lock().unwrap().calls_for("refund", "pay-late-pay"), 1, "the late callback sent no second refund");
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (10, 10), "stock never touched again");
        stop.send(true).unwrap();
        server.await.unwrap();
    }
}

each_backend! {
    async fn manual_review_merchants_get_no_refund(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("review", "careful", T0)).await;
        let provider = Provider::start().await;
        provider.books.lock().unwrap().pays_during_close.insert("pay-review".into());
        let mut config = env.config(&[("careful", "builtin:single-phase", &[])], &pay_config(&provider, ""));
        config.merchants.get_mut("careful").unwrap().on_paid_after_close = timeoutd::config::PaidAfterClose::ManualReview;
        let (clock, _) = Clock::manual(T0);
        let d = env.dispatcher(&config, clock).await;
        env.process(&d, T0).await;
        assert_eq!(env.text("SELECT resolution FROM paid_after_close WHERE order_id = ?", "review").await, "manual-review");
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE kind = 'refund-payment' AND order_id = ?", "review").await, 0);
        assert!(provider.books.lock().unwrap().refunds.is_empty());
    }
}

each_backend! {
    /// The provider is down for a while: close-payment stays PENDING, is retried with backoff,
    /// and completes once when the provider returns.
    async fn provider_down_for_a_while_completes_once_when_it_returns(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("outage", "acme", T0)).await;
        let provider = Provider::start().await;
        provider.books.lock().unwrap().down_for = 5;
        // The status query before the close is `payment_alignment`'s; here only close-payment.
        let config = env.config(SHOPS, &pay_config_with(&provider, "query_before_close = false", ""));
        let (clock, now) = Clock::manual(T0);
        let d = env.dispatcher(&config, clock.clone()).await;
        assert_eq!(env.process(&d, T0).await, vec![Outcome::Closed { lateness_ms: 0 }]);
        let status = "SELECT status FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?";
        assert_eq!(env.text(status, "outage").await, "PENDING");
        assert_eq!(env.int("SELECT next_attempt_ms FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?", "outage").await, T0 + 10_000);
        assert!(env.text("SELECT last_error FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?", "outage").await.contains("503"));
        let runner = env.runner(&config, clock).await;
        now.store(T0 + 9_999, Ordering::SeqCst);
        assert_eq!(runner.run_backlog(0).await.unwrap(), 0, "backing off");
        now.store(T0 + 10_000, Ordering::SeqCst);
        assert_eq!(runner.run_backlog(0).await.unwrap(), 1);
        assert_eq!(env.text(status, "outage").await, "DONE");
        assert_eq!(env.int("SELECT attempts FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?", "outage").await, 2);
        let books = provider.books.lock().unwrap();
        assert_eq!(books.closes, vec![("pay-outage".to_string(), "acme/outage/0/3".to_string())]);
        assert_eq!(books.requests, 6, "5 answered 503, then one close");
    }
}

/// `[payment]`'s `timeout` and `idempotency_header` are honoured: a request that hangs past the
/// timeout is abandoned and tried again within the same execution (`attempts`), carrying the
/// effect's key in the configured header; the provider closes the trade once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn payment_requests_time_out_and_carry_the_key_in_the_configured_header() {
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    env.create(&order("hung", "acme", T0)).await;
    let provider = Provider::start().await;
    {
        let mut books = provider.books.lock().unwrap();
        books.key_header = Some("x-request-id".into());
        books.hang_for = 1;
    }
    let config = env.config(
        SHOPS,
        &pay_config_with(&provider, "query_before_close = false", "").replace(
            "attempts = 3\n",
            "attempts = 3\ntimeout = \"500ms\"\nidempotency_header = \"X-Request-Id\"\n",
        ),
    );
    let (clock, _) = Clock::manual(T0);
    let d = env.dispatcher(&config, clock).await;
    let started = std::time::Instant::now();
    assert_eq!(
        env.process(&d, T0).await,
        vec![Outcome::Closed { lateness_ms: 0 }]
    );
    let status = "SELECT status FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?";
    assert_eq!(env.text(status, "hung").await, "DONE");
    {
        let books = provider.books.lock().unwrap();
        // The hung request is recorded when it wakes (3 s later): only the retry is in by now.
        assert!(
            books.calls_for("close", "pay-hung") >= 1 && started.elapsed() < Duration::from_secs(3),
            "the hung request was not abandoned after the 500 ms timeout: {:?} after {:?}",
            books.calls,
            started.elapsed()
        );
        assert_eq!(
            books.closes,
            vec![("pay-hung".to_string(), "acme/hung/0/3".to_string())],
            "the key came in X-Request-Id (the provider refuses a request without it)"
        );
    }
    env.cleanup().await;
}

each_backend! {
    /// The webhook channel receives one reminder and one closed notice per order, each with its
    /// stable idempotency key.
    async fn webhook_gets_one_reminder_and_one_closed_notice_per_order(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("hooked", "flashy", T0)).await;
        let receiver = Receiver::start().await;
        let extra = sms_webhook(&receiver);
        let config = env.config(FLASH_SMS, &extra);
        let (clock, now) = Clock::manual(T0);
        let d = env.dispatcher(&config, clock).await;
        env.process(&d, T0).await;
        now.store(T0 + 1_000, Ordering::SeqCst);
        env.process(&d, T0 + 1_000).await;
        let received = receiver.received.lock().unwrap().clone();
        let summary: Vec<(String, String, String)> = received
            .iter()
            .map(|(key, body)| (key.clone(), body["kind"].as_str().unwrap().to_string(), body["template"].as_str().unwrap().to_string()))
            .collect();
        assert_eq!(summary, vec![
            ("flashy/hooked/0/0".to_string(), "remind".to_string(), "order-closing-soon".to_string()),
            ("flashy/hooked/1/4".to_string(), "notify".to_string(), "order-closed".to_string()),
        ]);
        assert_eq!(received[1].1["user"], "user-of-hooked");
        assert_eq!(received[1].1["idempotency_key"], "flashy/hooked/1/4");
    }
}

each_backend! {
    /// A stopping daemon's ledger executor claims no further chunk once shutdown is signalled:
    /// a burst's notices are left PENDING and unclaimed for the next executor (not sent into a
    /// transport that is shutting down); unstopped, the same executor sends each once.
    async fn a_stopping_executor_leaves_its_backlog_pending_and_unclaimed(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let ids: Vec<String> = (0..6).map(|k| format!("stop-{k}")).collect();
        for id in &ids {
            env.create(&order(id, "flashy", T0)).await;
        }
        let receiver = Receiver::start().await;
        let extra = format!("{}[effects]\nconcurrency = 2\n", sms_webhook(&receiver));
        let config = env.config(FLASH_SMS, &extra);
        let (clock, now) = Clock::manual(T0);
        let d = env.dispatcher(&config, clock.clone()).await;
        env.process(&d, T0).await;
        now.store(T0 + 1_000, Ordering::SeqCst);
        env.process(&d, T0 + 1_000).await;
        let sent = receiver.received.lock().unwrap().len();
        assert_eq!(sent, 12, "a reminder and a closed notice per order");
        receiver.received.lock().unwrap().clear();
        // The closed notices, as a crash before they ran leaves them (reminders of a closed
        // order are not sent again, so they are left settled).
        unsettle(env, "'notify'").await;

        let runner = env.runner(&config, clock).await;
        let (stop, stopping) = tokio::sync::watch::channel(false);
        stop.send(true).unwrap();
        assert_eq!(runner.run_fresh_until(Some(&stopping)).await.unwrap(), 0);
        assert!(receiver.received.lock().unwrap().is_empty(), "nothing sent after shutdown");
        let left = "SELECT COUNT(*) FROM effect_ledger WHERE kind = 'notify' AND status = 'PENDING' AND claim_until_ms IS NULL AND order_id LIKE ?";
        assert_eq!(env.int(left, "stop-%").await, 6, "left PENDING and unclaimed");

        let (_running, running) = tokio::sync::watch::channel(false);
        assert_eq!(runner.run_fresh_until(Some(&running)).await.unwrap(), 6);
        assert_eq!(receiver.received.lock().unwrap().len(), 6, "each sent once");
        let done = "SELECT COUNT(*) FROM effect_ledger WHERE kind = 'notify' AND status = 'DONE' AND order_id LIKE ?";
        assert_eq!(env.int(done, "stop-%").await, 6);
    }
}

each_backend! {
    /// F9 for the effects outside the database: the same closing trigger handled twice at once
    /// by two daemons restores the Redis flash stock once, frees the buyer's slot once and sends
    /// one closed notice (counted as requests the webhook received), also after both daemons'
    /// ledger executors have run their backlogs.
    async fn a_duplicate_trigger_restores_redis_once_and_notifies_once(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let activity = flash_order(env, "dup-fs", "flashy").await;
        let receiver = Receiver::start().await;
        let extra = format!("[redis]\nurl = \"{REDIS}\"\n{}", sms_webhook(&receiver));
        let config = env.config(FLASH_SMS, &extra);
        let (clock, now) = Clock::manual(T0);
        let (a, b) = (env.dispatcher(&config, clock.clone()).await, env.dispatcher(&config, clock.clone()).await);
        assert!(matches!(env.process(&a, T0).await[..], [Outcome::Waiting { .. }]));
        now.store(T0 + 1_000, Ordering::SeqCst);
        let trigger = env.claim(T0 + 1_000).await.remove(0);
        let (ra, rb) = tokio::join!(a.handle(&trigger), b.handle(&trigger));
        let closed = [&ra, &rb].iter().filter(|o| matches!(o, Outcome::Closed { .. })).count();
        assert_eq!(closed, 1, "{ra:?} {rb:?}");
        for runner in [env.runner(&config, clock.clone()).await, env.runner(&config, clock).await] {
            runner.run_backlog(0).await.unwrap();
        }
        assert_eq!(flash_state(&activity).await, (8, vec!["someone-else".to_string()]), "3 units back once");
        let received = receiver.received.lock().unwrap().clone();
        let closed_notices = received.iter().filter(|(_, body)| body["template"] == "order-closed").count();
        assert_eq!(closed_notices, 1, "{received:?}");
        assert_eq!(received.len(), 2, "one reminder, one closed notice: {received:?}");
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (10, 10));
    }
}

/// Three `redis-server` processes made into a Redis Cluster for one test; killed on drop.
struct LocalCluster {
    nodes: Vec<std::process::Child>,
    urls: Vec<String>,
    _dir: tempfile::TempDir,
}

impl LocalCluster {
    /// Three nodes on free-looking ports: a few tries, each on a fresh random base that keeps
    /// clear of the test broker's ports (20909–20914), since a port taken by another process
    /// fails `--cluster create`.
    fn start() -> LocalCluster {
        let mut failures = Vec::new();
        for _ in 0..3 {
            let base = loop {
                let base = 20_000 + fastrand::u16(0..9_000) / 3 * 3;
                if !(20_900..=20_920).contains(&base) {
                    break base;
                }
            };
            match LocalCluster::try_start(base) {
                Ok(cluster) => return cluster,
                Err(why) => failures.push(why),
            }
        }
        panic!("no Redis Cluster after 3 tries: {failures:#?}");
    }

    fn try_start(base: u16) -> Result<LocalCluster, String> {
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<u16> = (base..base + 3).collect();
        let nodes = ports
            .iter()
            .map(|port| {
                std::process::Command::new("redis-server")
                    .args([
                        "--port",
                        &port.to_string(),
                        "--bind",
                        "127.0.0.1",
                        "--cluster-enabled",
                        "yes",
                    ])
                    .args([
                        "--cluster-config-file",
                        &format!("nodes-{port}.conf"),
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                    ])
                    .arg("--dir")
                    .arg(dir.path())
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .expect("redis-server")
            })
            .collect();
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        for addr in &addrs {
            let port = addr.rsplit(':').next().unwrap();
            for _ in 0..50 {
                let ping = std::process::Command::new("redis-cli")
                    .args(["-p", port, "ping"])
                    .output()
                    .unwrap();
                if String::from_utf8_lossy(&ping.stdout).trim() == "PONG" {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        // Owned from here: a failed start drops it, which kills the nodes.
        let cluster = LocalCluster {
            nodes,
            urls: addrs.iter().map(|a| format!("redis://{a}")).collect(),
            _dir: dir,
        };
        let create = std::process::Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap();
        if !create.status.success() {
            return Err(format!(
                "ports {base}..{}: {}{}",
                base + 2,
                String::from_utf8_lossy(&create.stdout),
                String::from_utf8_lossy(&create.stderr)
            ));
        }
        for _ in 0..100 {
            let info = std::process::Command::new("redis-cli")
                .args(["-p", &ports[0].to_string(), "cluster", "info"])
                .output()
                .unwrap();
            if String::from_utf8_lossy(&info.stdout).contains("cluster_state:ok") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Ok(cluster)
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.kill();
            let _ = node.wait();
        }
    }
}

/// On a real three-node Redis Cluster, an effect and its marker land on one slot (the
/// activity's hash tag), so the script runs, and a replay is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_routes_effect_and_marker_to_one_slot() {
    let cluster = LocalCluster::start();
    let config = timeoutd::config::RedisConfig {
        url: None,
        cluster: cluster.urls.clone(),
        marker_ttl: std::time::Duration::from_secs(60),
    };
    let flash = timeoutd::effects::FlashSale::connect(&config)
        .await
        .unwrap();
    let client = redis::cluster::ClusterClient::new(cluster.urls.clone()).unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    let mut activities = Vec::new();
    for n in 0..8 {
        // Eight activities spread over the cluster's slots, each with two buyers holding slots.
        let stock_key = format!("activity:{{act-{n}}}:stock");
        let users_key = format!("activity:{{act-{n}}}:users");
        let _: () = conn.sadd(&users_key, &["u", "other"]).await.unwrap();
        assert_eq!(
            flash
                .restore_stock(&stock_key, 3, &format!("m/o{n}/0/0"))
                .await
                .unwrap()
                .note,
            None
        );
        assert!(
            flash
                .restore_stock(&stock_key, 3, &format!("m/o{n}/0/0"))
                .await
                .unwrap()
                .note
                .is_some(),
            "replay refused"
        );
        assert_eq!(
            flash
                .release_slot(&users_key, "u", &format!("m/o{n}/0/1"))
                .await
                .unwrap()
                .note,
            None
        );
        let freed: bool = conn.sismember(&users_key, "u").await.unwrap();
        assert!(!freed, "{users_key}: the closed order's buyer is freed");
        // A replayed release is refused by its marker even after the buyer bought again.
        let _: () = conn.sadd(&users_key, "u").await.unwrap();
        assert!(
            flash
                .release_slot(&users_key, "u", &format!("m/o{n}/0/1"))
                .await
                .unwrap()
                .note
                .is_some(),
            "replayed release refused"
        );
        let _: () = conn.srem(&users_key, "u").await.unwrap();
        activities.push((stock_key, users_key));
    }
    for (stock_key, users_key) in activities {
        let stock: i64 = conn.get(&stock_key).await.unwrap();
        assert_eq!(stock, 3, "{stock_key}: restored once");
        let users: Vec<String> = conn.smembers(&users_key).await.unwrap();
        assert_eq!(
            users,
            vec!["other".to_string()],
            "{users_key}: only the closed order's buyer freed"
        );
    }
}

/// Redis during a failover: the daemon's Redis is a replica (READONLY to writes, as a master
/// demoted by a failover is). The flash-sale effects stay PENDING and are retried with
/// backoff — never FAILED, so the stock is given back once a master takes writes — and
/// `/readyz`'s Redis check says it is not writable, which a PING alone would not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_only_replica_leaves_flash_effects_pending_and_is_reported_not_writable() {
    // A replica of a master that does not exist: it refuses every write with READONLY.
    let replica = ScratchRedis::start(&["--replicaof", "127.0.0.1", "1"]).await;
    let url = replica.url.clone();
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    flash_order(&env, "failover", "flashy").await;
    let config = env.config(FLASH, &format!("[redis]\nurl = \"{url}\"\n"));
    let (clock, now) = Clock::manual(T0);
    let d = env.dispatcher(&config, clock.clone()).await;
    env.process(&d, T0).await;
    now.store(T0 + 1_000, Ordering::SeqCst);
    assert_eq!(
        env.process(&d, T0 + 1_000).await,
        vec![Outcome::Closed { lateness_ms: 0 }]
    );
    for kind in ["restore-flash-stock", "release-flash-slot"] {
        let row = |col: &str| {
            format!("SELECT {col} FROM effect_ledger WHERE kind = '{kind}' AND order_id = ?")
        };
        let status = env
            .text(Box::leak(row("status").into_boxed_str()), "failover")
            .await;
        assert_eq!(status, "PENDING", "{kind}: retried, not FAILED");
        let error = env
            .text(Box::leak(row("last_error").into_boxed_str()), "failover")
            .await;
        assert!(
            error.to_ascii_uppercase().contains("READONLY") || error.contains("ReadOnly"),
            "{kind}: {error}"
        );
        assert_eq!(
            env.int(Box::leak(row("attempts").into_boxed_str()), "failover")
                .await,
            1
        );
    }
    let runner = env.runner(&config, clock).await;
    let ready = runner.redis_ready().await.expect("[redis] is configured");
    assert!(
        ready
            .as_ref()
            .is_err_and(|e| e.contains("not writable") && e.to_ascii_uppercase().contains("READ")),
        "{ready:?}"
    );
    env.cleanup().await;
}

/// Start-up warns when Redis may evict the idempotency markers: a server with `maxmemory` and
/// an evicting policy gets the warning naming both; the shared test Redis (no `maxmemory`)
/// none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_may_evict_the_markers_is_warned_about() {
    let lru =
        ScratchRedis::start(&["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"]).await;
    let config = |url: String| timeoutd::config::RedisConfig {
        url: Some(url),
        cluster: Vec::new(),
        marker_ttl: Duration::from_secs(7 * 24 * 3600),
    };
    let flash = timeoutd::effects::FlashSale::connect(&config(lru.url.clone()))
        .await
        .ok();
    let warning = flash
        .expect("the LRU Redis answers")
        .eviction_warning()
        .await;
    let warning = warning.expect("a warning for allkeys-lru with maxmemory");
    assert!(
        warning
            .starts_with("redis: maxmemory-policy is allkeys-lru with maxmemory 104857600 bytes"),
        "{warning}"
    );
    let shared = timeoutd::effects::FlashSale::connect(&config(REDIS.to_string()))
        .await
        .unwrap();
    assert_eq!(
        shared.eviction_warning().await,
        None,
        "the test Redis has no maxmemory"
    );
}

/// A `redis-server` of one test's own on a free port, started with `args` (no persistence),
/// answering PING before `start` returns; killed on drop.
struct ScratchRedis {
    url: String,
    _server: tokio::process::Child,
    _dir: tempfile::TempDir,
}

impl ScratchRedis {
    async fn start(args: &[&str]) -> ScratchRedis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let server = tokio::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(args)
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(dir.path())
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server (Debian's redis package) on PATH");
        let url = format!("redis://127.0.0.1:{port}");
        let client = redis::Client::open(url.as_str()).unwrap();
        crate::support::eventually(
            Duration::from_secs(10),
            "the scratch Redis answers",
            || async {
                match client.get_multiplexed_async_connection().await {
                    Ok(mut c) => redis::cmd("PING")
                        .query_async::<String>(&mut c)
                        .await
                        .is_ok(),
                    Err(_) => false,
                }
            },
        )
        .await;
        ScratchRedis {
            url,
            _server: server,
            _dir: dir,
        }
    }
}

/// After Redis restarts, the daemon's connection comes back by itself: a request that meets the
/// dead connection fails as transient (its effect is retried), the next one lands, and the
/// idempotency marker written before the restart still refuses a replay. Found by
/// scripts/chaos: a plain multiplexed connection stayed broken ("broken pipe") for the life of
/// the process, and flash-sale stock and slots were never given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_is_survived_without_restarting_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = crate::redis_server::PrivateRedis::start(dir.path()).await;
    let config = timeoutd::config::RedisConfig {
        url: Some(server.url()),
        cluster: Vec::new(),
        marker_ttl: Duration::from_secs(60),
    };
    let flash = timeoutd::effects::FlashSale::connect(&config)
        .await
        .unwrap();
    let key = "activity:{act-r}:stock";
    let first = flash.restore_stock(key, 2, "m/r1/0/0").await.unwrap();
    assert_eq!(first.note, None);
    server.restart().await;
    let mut landed = None;
    for _ in 0..30 {
        match flash.restore_stock(key, 3, "m/r2/0/0").await {
            Ok(done) => {
                landed = Some(done);
                break;
            }
            Err(e) => {
                assert!(
                    matches!(e, timeoutd::effects::EffectError::Transient(_)),
                    "{e:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let landed = landed.expect("Redis is back, but the effect never reached it");
    assert_eq!(landed.note, None);
    let stock: i64 = server.conn().await.get(key).await.unwrap();
    assert_eq!(stock, 5, "both restores applied once");
    let replay = flash.restore_stock(key, 2, "m/r1/0/0").await.unwrap();
    assert!(replay.note.is_some(), "the marker survived the restart");
}
