//! The admin API against a running daemon: auth and audit, manual close through the plugin and
//! the ledger, dead-letter re-drive, metrics, sweep tuning, and the OpenAPI document.

use std::time::Duration;

use serde_json::Value;
use timeoutd::clock::Clock;
use timeoutd::daemon::Daemon;

use crate::support::{Env, each_backend, eventually, order};

/// The ops token every admin test config grants.
pub(crate) const TOKEN: &str = "test-token-0123456789";

pub(crate) fn admin_config(env: &Env, merchants: &str) -> timeoutd::config::Config {
    admin_config_with_sweep(env, merchants, "enabled = false")
}

/// [`admin_config`] with `sweep` as the `[sweep]` section's body.
fn admin_config_with_sweep(env: &Env, merchants: &str, sweep: &str) -> timeoutd::config::Config {
    let toml = format!(
        "[redis]\nurl = \"redis://127.0.0.1:6379\"\n[admin]\nlisten = \"127.0.0.1:0\"\nsample_interval = \"100ms\"\noverdue_margin = \"1s\"\n[admin.tokens]\nops = \"{TOKEN}\"\n\
         [sweep]\n{sweep}\n[runtime]\ndeadline = \"2s\"\n[database]\nurl = \"{}\"\ntable_prefix = \"{}\"\n{merchants}",
        env.url,
        crate::support::table_prefix()
    );
    timeoutd::config::Config::from_toml(&toml, env.dir.path(), &|_| None).unwrap()
}

pub(crate) const ACME: &str = "[merchants.acme]\nplugin = \"builtin:single-phase\"\n";

/// The admin API of a running daemon, called with the ops token.
pub(crate) struct Api {
    pub(crate) base: String,
    client: reqwest::Client,
}

impl Api {
    /// The API of `daemon` (which must have `[admin]`).
    pub(crate) fn of(daemon: &Daemon) -> Api {
        Api {
            base: format!("http://{}", daemon.admin_addr().unwrap()),
            client: reqwest::Client::new(),
        }
    }
    /// `method path` with `body`: the status and the JSON answer (text as a JSON string).
    pub(crate) async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self
            .client
            .request(method.parse().unwrap(), format!("{}{path}", self.base))
            .bearer_auth(TOKEN);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }
}

/// An order past its deadline with no outbox row (so only an operator acts on it).
async fn overdue_order(env: &Env, id: &str, merchant: &str) {
    let past = env.db.now_ms().await.unwrap() - 60_000;
    env.create(&order(id, merchant, past)).await;
    env.db
        .backend()
        .query("DELETE FROM order_timeout_msg WHERE order_id = ?")
        .bind(id)
        .execute(env.db.pool())
        .await
        .unwrap();
}

each_backend! {
    async fn unauthenticated_calls_are_refused_and_authenticated_calls_are_audited(env) {
        let daemon = Daemon::start(&admin_config(env, ACME), Clock::Database).await.unwrap();
        let api = Api::of(&daemon);
        let anonymous = reqwest::get(format!("{}/v1/plugins", api.base)).await.unwrap();
        assert_eq!(anonymous.status(), 401);
        let (status, plugins) = api.call("GET", "/v1/plugins", None).await;
        assert_eq!(status, 200);
        assert_eq!(plugins["plugins"][0]["api_version"], "0.1.0");
        assert_eq!(reqwest::get(format!("{}/healthz", api.base)).await.unwrap().status(), 200);
        let ready: Value = reqwest::get(format!("{}/readyz", api.base)).await.unwrap().json().await.unwrap();
        assert_eq!((ready["ready"].as_bool(), ready["database"].as_str(), ready["redis"].as_str()), (Some(true), Some("ok"), Some("ok")), "{ready}");
        // Every documented route is served (a missing one answers 404 "no route for …", or 405).
        for (method, path) in timeoutd::admin::ROUTES {
            let path = path.replace("{id}", "1");
            let body = (*method == "put").then(|| serde_json::json!({ "interval_ms": 1000, "batch": 10 }));
            let (status, answer) = api.call(&method.to_uppercase(), &path, body).await;
            assert_ne!(status, 405, "{method} {path}");
            let unrouted = answer["error"].as_str().is_some_and(|e| e.starts_with("no route"));
            assert!(status != 404 || !unrouted, "{method} {path} is not routed");
        }
        // Every error is JSON, axum's own rejections included.
        let client = reqwest::Client::new();
        for (method, path, want) in [
            ("GET", "/v1/dead-letters/not-a-number", 400),
            ("GET", "/v1/no-such-thing", 404),
            ("POST", "/healthz", 405),
            ("PUT", "/v1/sweep", 400),
        ] {
            let answer = client
                .request(method.parse().unwrap(), format!("{}{path}", api.base))
                .bearer_auth(TOKEN)
                .header("content-type", "application/json")
                .body("{not json")
                .send()
                .await
                .unwrap();
            assert_eq!(answer.status(), want, "{method} {path}");
            let body: Value = answer.json().await.unwrap_or_else(|e| panic!("{method} {path}: not JSON: {e}"));
            assert!(body["error"].as_str().is_some_and(|e| !e.is_empty()), "{method} {path}: {body}");
        }
        daemon.stop().await;
        assert_eq!(env.int("SELECT COUNT(*) FROM admin_audit WHERE actor <> ?", "ops").await, 0, "refused calls are logged, not written");
        assert!(env.int("SELECT COUNT(*) FROM admin_audit WHERE actor = ?", "ops").await >= 13);
    }
}

each_backend! {
    async fn manual_close_goes_through_the_plugin_and_the_ledger(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        // A merchant of this run alone: its series on this process's shared recorder are this
        // test's own, so their values can be checked.
        let m = format!("manual-{:08x}", fastrand::u32(..));
        overdue_order(env, "stuck", &m).await;
        env.create(&order("future", &m, env.db.now_ms().await.unwrap() + 600_000)).await;
        let merchants = format!("[merchants.{m}]\nplugin = \"builtin:single-phase\"\n");
        let daemon = Daemon::start(&admin_config(env, &merchants), Clock::Database).await.unwrap();
        let api = Api::of(&daemon);
        let metric = |name: &'static str| {
            let (base, m) = (api.base.clone(), m.clone());
            async move {
                let page = reqwest::get(format!("{base}/metrics")).await.unwrap().text().await.unwrap();
                crate::support::sample(&page, &name.replace("{m}", &m))
            }
        };
        let overdue_gauge = "timeoutd_overdue_open_orders{merchant=\"{m}\"}";
        crate::support::eventually(Duration::from_secs(30), "the overdue gauge counts the stuck order", || async {
            metric(overdue_gauge).await == Some(1.0)
        })
        .await;
        let (status, overdue) = api.call("GET", "/v1/orders/overdue", None).await;
        assert_eq!(status, 200);
        assert_eq!(overdue["orders"].as_array().unwrap().len(), 1, "{overdue}");
        assert_eq!(overdue["orders"][0]["id"], "stuck");
        let (status, outcome) = api.call("POST", "/v1/orders/stuck/close", None).await;
        assert_eq!((status, outcome["outcome"].as_str()), (200, Some("closed")), "{outcome}");
        assert_eq!(env.text("SELECT closed_by FROM orders WHERE id = ?", "stuck").await, "manual");
        assert_eq!((env.stock("sku-a").await, env.coupon("cpn-stuck").await.as_str()), (8, "AVAILABLE"));
        assert_eq!(env.text("SELECT trigger_kind FROM decision_log WHERE order_id = ?", "stuck").await, "manual");
        // A trigger like the others: its row, re-armed as `manual`, claimed and finished.
        assert_eq!(env.text("SELECT source FROM order_timeout_msg WHERE order_id = ?", "stuck").await, "manual");
        assert_eq!(env.text("SELECT status FROM order_timeout_msg WHERE order_id = ?", "stuck").await, "PROCESSED");
        assert_eq!(api.call("POST", "/v1/orders/stuck/close", None).await.0, 409, "already CLOSED");
        assert_eq!(api.call("POST", "/v1/orders/future/close", None).await.0, 409, "not due");
        assert_eq!(api.call("POST", "/v1/orders/nope/close", None).await.0, 404);
        let (_, timeline) = api.call("GET", "/v1/orders/stuck", None).await;
        assert_eq!(timeline["order"]["status"], "CLOSED");
        assert_eq!(timeline["decisions"][0]["outcome"], "closed");
        assert_eq!(timeline["effects"].as_array().unwrap().len(), 5);
        // This merchant's series by value: one cancel decided, and the gauge back to 0 with the
        // next backlog sample. The rest by name: this process's recorder is shared by every
        // test's daemon (values are checked on a daemon of its own,
        // `e2e::a_daemons_metric_values_agree_with_its_rows…`).
        assert_eq!(metric("timeoutd_decisions_total{merchant=\"{m}\",decision=\"cancel\"}").await, Some(1.0));
        crate::support::eventually(Duration::from_secs(30), "the overdue gauge returns to 0", || async {
            metric(overdue_gauge).await == Some(0.0)
        })
        .await;
        let needles = [
            "timeoutd_closes_total{source=\"manual\"}",
            "timeoutd_plugin_decision_seconds_bucket",
            "timeoutd_dead_letters_open",
        ];
        let started = std::time::Instant::now();
        let metrics = loop {
            let page = reqwest::get(format!("{}/metrics", api.base)).await.unwrap().text().await.unwrap();
            if needles.iter().all(|n| page.contains(n)) || started.elapsed() > Duration::from_secs(30) {
                break page;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        for needle in needles {
            assert!(metrics.contains(needle), "{needle} missing from /metrics:\n{metrics}");
        }
        daemon.stop().await;
    }
}

each_backend! {
    async fn redriving_a_dead_letter_closes_its_order_once(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let past = env.db.now_ms().await.unwrap() - 1_000;
        env.create(&order("orphan", "newshop", past)).await;
        // The first daemon has no plugin for `newshop`: the trigger is dead-lettered.
        let first = Daemon::start(&admin_config(env, ACME), Clock::Database).await.unwrap();
        for _ in 0..50 {
            if env.int("SELECT COUNT(*) FROM dead_letter WHERE order_id = ?", "orphan").await == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        first.stop().await;
        // Configured now; an operator re-drives.
        let second = Daemon::start(&admin_config(env, &format!("{ACME}[merchants.newshop]\nplugin = \"builtin:single-phase\"\n")), Clock::Database).await.unwrap();
        let api = Api::of(&second);
        let (_, letters) = api.call("GET", "/v1/dead-letters", None).await;
        let id = letters["dead_letters"][0]["id"].as_i64().expect("an open dead letter");
        assert!(letters["dead_letters"][0]["reason"].as_str().unwrap().contains("newshop"));
        let (status, redriven) = api.call("POST", &format!("/v1/dead-letters/{id}/redrive"), None).await;
        assert_eq!(status, 200, "{redriven}");
        assert_eq!(api.call("POST", &format!("/v1/dead-letters/{id}/redrive"), None).await.0, 409);
        for _ in 0..50 {
            if env.status("orphan").await == "CLOSED" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // A letter about a message (a poison body) naming an order not yet due: its re-drive
        // leaves the order to its own row at the deadline (a manual trigger is not held for it).
        let deadline = env.db.now_ms().await.unwrap() + 600_000;
        env.create(&order("later", "acme", deadline)).await;
        env.db.backend()
            .query("INSERT INTO dead_letter (source, order_id, reason, payload, attempts, status, created_at_ms) VALUES ('rocketmq', ?, 'body is not a timeout JSON', '{', 1, 'OPEN', ?)")
            .bind("later").bind(deadline - 600_000).execute(env.db.pool()).await.unwrap();
        let later = env.int("SELECT id FROM dead_letter WHERE order_id = ?", "later").await;
        let (status, redriven) = api.call("POST", &format!("/v1/dead-letters/{later}/redrive"), None).await;
        assert_eq!((status, redriven["rearmed"].as_bool(), redriven["due_ms"].as_i64()), (200, Some(false), Some(deadline)), "{redriven}");
        assert_eq!(env.int("SELECT COUNT(*) FROM order_timeout_msg WHERE source = 'manual' AND order_id = ?", "later").await, 0);
        assert_eq!(env.int("SELECT MIN(due_ms) FROM order_timeout_msg WHERE order_id = ?", "later").await, deadline);
        assert_eq!(env.text("SELECT status FROM dead_letter WHERE order_id = ?", "later").await, "REDRIVEN");
        second.stop().await;
        assert_eq!(env.status("later").await, "PENDING", "not closed before its deadline");
        assert_eq!(env.status("orphan").await, "CLOSED");
        assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE outcome = 'closed' AND order_id = ?", "orphan").await, 1);
        assert_eq!(env.stock("sku-a").await, 8, "orphan's units back; later still holds its 2");
        assert_eq!(env.text("SELECT status FROM dead_letter WHERE order_id = ?", "orphan").await, "REDRIVEN");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_is_retuned_at_run_time_and_bad_values_are_refused() {
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    // A sweep every hour: after the one at start, nothing is swept unless the retune works.
    let config = admin_config_with_sweep(&env, ACME, "interval = \"1h\"\ngrace = \"1s\"");
    let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
    let api = Api::of(&daemon);
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    // An order with no trigger that only becomes sweepable (deadline + grace) 3 s from now,
    // after the sweep at start-up, however slow that one is to run.
    let now_ms = env.db.now_ms().await.unwrap();
    env.create(&order("orphan", "acme", now_ms + 2_000)).await;
    env.db
        .backend()
        .query("DELETE FROM order_timeout_msg WHERE order_id = ?")
        .bind("orphan")
        .execute(env.db.pool())
        .await
        .unwrap();
    while env.db.now_ms().await.unwrap() < now_ms + 4_000 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        env.status("orphan").await,
        "PENDING",
        "swept before the retune"
    );
    let (status, now) = api
        .call(
            "PUT",
            "/v1/sweep",
            Some(serde_json::json!({ "interval_ms": 500, "batch": 50 })),
        )
        .await;
    assert_eq!((status, now["interval_ms"].as_u64()), (200, Some(500)));
    assert_eq!(api.call("GET", "/v1/sweep", None).await.1["batch"], 50);
    // The running sweep took the new interval at once: the orphan is re-armed and closed.
    let started = std::time::Instant::now();
    while env.status("orphan").await != "CLOSED" {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the retuned sweep never ran"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        env.text("SELECT closed_by FROM orders WHERE id = ?", "orphan")
            .await,
        "sweep"
    );
    assert_eq!(
        (env.stock("sku-a").await, env.stock("sku-b").await),
        (10, 10)
    );
    let (status, error) = api
        .call(
            "PUT",
            "/v1/sweep",
            Some(serde_json::json!({ "interval_ms": 5, "batch": 50 })),
        )
        .await;
    assert_eq!(status, 422, "{error}");
    assert!(error["error"].as_str().unwrap().contains("interval_ms"));
    daemon.stop().await;
    env.cleanup().await;
}

each_backend! {
    /// An effect the provider refuses for good ends FAILED; `/v1/ledger/failed` lists it,
    /// `/v1/ledger/{id}/retry` puts it back with a fresh budget (409 for an effect the close
    /// transaction applies, 404 for no row), and the executor completes it under its original
    /// key once the provider accepts: the trade is closed once, after one refused request.
    async fn a_failed_effect_is_listed_and_an_operators_retry_completes_it_once(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let provider = crate::fakes::Provider::start().await;
        let key = "acme/refused/0/3";
        provider.books.lock().unwrap().answers.insert(key.into(), (400, serde_json::json!({ "error": "unknown reference" })));
        let toml = format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n[admin.tokens]\nops = \"{TOKEN}\"\n[sweep]\nenabled = false\n\
             [runtime]\ndeadline = \"2s\"\n[payment]\nbase_url = \"{}\"\nattempts = 1\n[database]\nurl = \"{}\"\n{ACME}",
            provider.base_url, env.url
        );
        let config = timeoutd::config::Config::from_toml(&toml, env.dir.path(), &|_| None).unwrap();
        env.create(&order("refused", "acme", env.db.now_ms().await.unwrap() - 1_000)).await;
        let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
        let api = Api::of(&daemon);
        let status = "SELECT MIN(status) FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?";
        eventually(Duration::from_secs(30), "close-payment ends FAILED", || async { env.text(status, "refused").await == "FAILED" }).await;
        let (code, failed) = api.call("GET", "/v1/ledger/failed", None).await;
        assert_eq!(code, 200, "{failed}");
        let listed = failed["effects"].as_array().unwrap();
        assert_eq!(listed.len(), 1, "{failed}");
        assert_eq!((listed[0]["kind"].as_str(), listed[0]["order_id"].as_str()), (Some("close-payment"), Some("refused")), "{failed}");
        assert!(listed[0]["reason"].as_str().unwrap_or_default().contains("400"), "{failed}");
        let id = listed[0]["id"].as_i64().unwrap();
        let stock_row = env.int("SELECT id FROM effect_ledger WHERE kind = 'restore-stock' AND order_id = ?", "refused").await;
        assert_eq!(api.call("POST", &format!("/v1/ledger/{stock_row}/retry"), None).await.0, 409, "applied in the close transaction");
        assert_eq!(api.call("POST", "/v1/ledger/999999/retry", None).await.0, 404);
        // The provider accepts the reference now; the operator retries.
        provider.books.lock().unwrap().answers.remove(key);
        let (code, answer) = api.call("POST", &format!("/v1/ledger/{id}/retry"), None).await;
        assert_eq!((code, answer["retrying"].as_i64()), (200, Some(id)), "{answer}");
        eventually(Duration::from_secs(30), "the retried effect completes", || async { env.text(status, "refused").await == "DONE" }).await;
        assert_eq!(api.call("POST", &format!("/v1/ledger/{id}/retry"), None).await.0, 409, "DONE is not FAILED");
        assert_eq!(api.call("GET", "/v1/ledger/failed", None).await.1["effects"].as_array().unwrap().len(), 0);
        daemon.stop().await;
        let books = provider.books.lock().unwrap();
        assert_eq!(books.calls_for("close", "pay-refused"), 2, "one refused, one accepted: {:?}", books.calls);
        assert_eq!(books.closes, vec![("pay-refused".to_string(), key.to_string())], "closed once, under the original key");
    }
}

/// A plugin file swapped on disk: `/v1/plugins/reload` refuses a broken version (the old keeps
/// serving and deciding) and takes a good one, whose digest `/v1/plugins` then shows and the
/// next decision records. The served `/v1/openapi.json` documents exactly the routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plugins_reload_refusing_a_broken_file_and_the_served_openapi_lists_every_route() {
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    let path = env.dir.path().join("swap.wasm");
    std::fs::write(&path, timeoutd::policies::builtin("single-phase").unwrap()).unwrap();
    let daemon = Daemon::start(
        &admin_config(
            &env,
            &format!("[merchants.swap]\nplugin = \"{}\"\n", path.display()),
        ),
        Clock::Database,
    )
    .await
    .unwrap();
    let api = Api::of(&daemon);
    let digest = |plugins: &Value| {
        plugins["plugins"][0]["digest"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let old = digest(&api.call("GET", "/v1/plugins", None).await.1);
    let decided_with = |id: &'static str| digest_of_close(&env, id);
    std::fs::write(&path, b"not a component").unwrap();
    let (code, report) = api.call("POST", "/v1/plugins/reload", None).await;
    assert_eq!(code, 200, "{report}");
    assert!(
        report["plugins"][0]["refused"]
            .as_str()
            .is_some_and(|r| !r.is_empty()),
        "{report}"
    );
    assert_eq!(
        digest(&api.call("GET", "/v1/plugins", None).await.1),
        old,
        "the old version keeps serving"
    );
    env.create(&order(
        "before",
        "swap",
        env.db.now_ms().await.unwrap() - 1_000,
    ))
    .await;
    assert_eq!(decided_with("before").await, old);
    std::fs::write(&path, crate::support::HOSTILE_WASM).unwrap();
    let (code, report) = api.call("POST", "/v1/plugins/reload", None).await;
    assert_eq!(
        (code, report["plugins"][0]["changed"].as_bool()),
        (200, Some(true)),
        "{report}"
    );
    let new = digest(&api.call("GET", "/v1/plugins", None).await.1);
    assert_ne!(new, old);
    assert_eq!(report["plugins"][0]["digest"].as_str(), Some(new.as_str()));
    env.create(&order(
        "after",
        "swap",
        env.db.now_ms().await.unwrap() - 1_000,
    ))
    .await;
    assert_eq!(
        decided_with("after").await,
        new,
        "the next decision is the new version's"
    );
    // The document the daemon serves, not the compiled-in constant.
    let (code, served) = api.call("GET", "/v1/openapi.json", None).await;
    assert_eq!(code, 200, "{served}");
    let mut documented: Vec<(String, String)> = Vec::new();
    for (path, ops) in served["paths"].as_object().unwrap() {
        for method in ops.as_object().unwrap().keys() {
            documented.push((method.clone(), path.clone()));
        }
    }
    documented.sort();
    let mut routes: Vec<(String, String)> = timeoutd::admin::ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    routes.sort();
    assert_eq!(
        documented, routes,
        "every served route documented, nothing documented that is not served"
    );
    daemon.stop().await;
    env.cleanup().await;
}

/// `(rule, status)` of every alert notice the receiver got, in order.
fn notices(receiver: &crate::fakes::Receiver) -> Vec<(String, String)> {
    receiver
        .received
        .lock()
        .unwrap()
        .iter()
        .map(|(_, body)| {
            (
                body["rule"].as_str().unwrap().to_string(),
                body["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// When the daemon last sampled its backlog (and evaluated its alert rules), epoch ms.
async fn sampled_at(api: &Api) -> i64 {
    let (code, backlog) = api.call("GET", "/v1/backlog", None).await;
    assert_eq!(code, 200, "{backlog}");
    backlog["sampled_at_ms"]
        .as_i64()
        .unwrap_or_else(|| panic!("no sampled_at_ms: {backlog}"))
}

each_backend! {
    /// Each alert signal fires once while its condition holds and resolves once when it stops
    /// holding — open dead letters, orders open past their deadline (F3), a ledger effect no
    /// executor runs, an outbox row held by a dead daemon's lease, a tripped plugin — and a rule
    /// with `for = "1h"` never fires. "Once"
    /// is checked over ten more evaluations after the last change (`sampled_at_ms`).
    async fn each_alert_signal_fires_once_and_resolves_once(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let receiver = crate::fakes::Receiver::start().await;
        // The ages have thresholds: a row due a moment ago (the tripped order's retry, when its
        // trip ends) is not stuck, and must not fire a second time.
        let rules = [
            ("dead-letters", "dead_letters_open", 0, ""),
            ("overdue", "overdue_open_orders", 0, ""),
            ("overdue-for-an-hour", "overdue_open_orders", 0, "for = \"1h\"\n"),
            ("ledger-stuck", "ledger_oldest_pending_seconds", 1, ""),
            ("outbox-stuck", "outbox_oldest_due_seconds", 2, ""),
            ("plugin-tripped", "plugins_tripped", 0, ""),
        ]
        .iter()
        .map(|(name, signal, above, extra)| format!("[[alerts.rules]]\nname = \"{name}\"\nsignal = \"{signal}\"\nabove = {above}\n{extra}"))
        .collect::<String>();
        let hostile = env.hostile_wasm();
        let config = timeoutd::config::Config::from_toml(
            &format!(
                "[database]\nurl = \"{}\"\n[admin]\nlisten = \"127.0.0.1:0\"\nsample_interval = \"100ms\"\noverdue_margin = \"1s\"\n[admin.tokens]\nops = \"{TOKEN}\"\n\
                 [sweep]\nenabled = false\n[runtime]\ndeadline = \"2s\"\ntrip_after = 1\ntrip_for = \"4s\"\n[dispatch]\nmax_attempts = 100\n\
                 [alerts]\nwebhook = \"{}\"\ninterval = \"100ms\"\n{rules}{ACME}\
                 [merchants.evil]\nplugin = \"{}\"\n[merchants.evil.settings]\nmode = \"panic\"\n",
                env.url, receiver.url, hostile.display()
            ),
            env.dir.path(),
            &|_| None,
        )
        .unwrap();
        let now = env.db.now_ms().await.unwrap();
        // No plugin for `nobody`: dead-lettered. acme's close leaves its close-payment PENDING (no
        // [payment]). `held`'s row is leased by a daemon that died. evil's plugin panics: tripped
        // (and retried, never dead-lettered: max_attempts 100).
        env.create(&order("unowned", "nobody", now - 1_000)).await;
        env.create(&order("closes", "acme", now - 1_000)).await;
        env.create(&order("held", "acme", now - 1_000)).await;
        env.create(&order("trips", "evil", now - 1_000)).await;
        env.db
            .backend()
            .query("UPDATE order_timeout_msg SET claim_token = 'dead-daemon', claim_until_ms = ? WHERE order_id = ?")
            .bind(now + 3_600_000)
            .bind("held")
            .execute(env.db.pool())
            .await
            .unwrap();
        let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
        let api = Api::of(&daemon);
        let firing = |rule: &str| (rule.to_string(), "firing".to_string());
        let resolved = |rule: &str| (rule.to_string(), "resolved".to_string());
        let live = ["dead-letters", "overdue", "ledger-stuck", "outbox-stuck", "plugin-tripped"];
        // The tripped plugin's order is paid as soon as the trip is reported: when the trip
        // lapses (4 s), the retry finds nothing to decide, so it does not trip again.
        eventually(Duration::from_secs(30), "the tripped plugin is reported", || async { notices(&receiver).contains(&firing("plugin-tripped")) }).await;
        assert!(env.pay("trips", now).await);
        eventually(Duration::from_secs(30), "every live rule fires", || async {
            let n = notices(&receiver);
            live.iter().all(|r| n.contains(&firing(r)))
        })
        .await;
        // The other conditions end: the dead letter is dismissed, the dead daemon's lease
        // cleared (its row then closes `held`), and the effects no executor runs finished by hand.
        let exec = |sql: &'static str, id: &'static str| async move {
            env.db.backend().query(sql).bind(id).execute(env.db.pool()).await.unwrap();
        };
        exec("UPDATE dead_letter SET status = 'DISMISSED' WHERE order_id = ?", "unowned").await;
        // (The unowned order, open past its deadline, is paid at last: nothing is overdue then.)
        assert!(env.pay("unowned", now).await);
        exec("UPDATE order_timeout_msg SET claim_token = NULL, claim_until_ms = NULL WHERE order_id = ?", "held").await;
        eventually(Duration::from_secs(30), "the released row closes its order", || async { env.status("held").await == "CLOSED" }).await;
        exec("UPDATE effect_ledger SET status = 'DONE' WHERE status = ?", "PENDING").await;
        eventually(Duration::from_secs(30), "every live rule resolves", || async {
            let n = notices(&receiver);
            live.iter().all(|r| n.contains(&resolved(r)))
        })
        .await;
        let last_change = sampled_at(&api).await;
        eventually(Duration::from_secs(30), "ten more evaluations", || async { sampled_at(&api).await >= last_change + 1_000 }).await;
        daemon.stop().await;
        let got = notices(&receiver);
        for rule in live {
            let mine: Vec<_> = got.iter().filter(|(r, _)| r == rule).cloned().collect();
            assert_eq!(mine, vec![firing(rule), resolved(rule)], "{rule}: {got:?}");
        }
        assert!(!got.iter().any(|(r, _)| r == "overdue-for-an-hour"), "`for` holds it back: {got:?}");
    }
}

/// The console end to end in headless Chromium (Debian's /usr/bin/chromium, driven by
/// playwright-core from `tests/console`): load, sign in, find the overdue order, pause its
/// merchant (the order shows as paused, its Close button disabled), resume, close it, see it
/// CLOSED — and the database agrees, the pause and the resume audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_closes_an_overdue_order_in_headless_chromium() {
    let dir = crate::support::repo_root().join("tests/console");
    assert!(
        dir.join("node_modules/playwright-core").is_dir(),
        "run `npm ci --prefix tests/console` and install Debian's chromium first (scripts/test does)"
    );
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    overdue_order(&env, "console-1", "acme").await;
    let daemon = Daemon::start(&admin_config(&env, ACME), Clock::Database)
        .await
        .unwrap();
    let base = format!("http://{}", daemon.admin_addr().unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let run = tokio::process::Command::new("node")
        .arg("console.test.mjs")
        .args([&base, TOKEN, "console-1", "acme"])
        .current_dir(&dir)
        .output()
        .await
        .expect("node");
    daemon.stop().await;
    assert!(
        run.status.success(),
        "console test failed:\n{}\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(env.status("console-1").await, "CLOSED");
    for path in ["/v1/merchants/acme/pause", "/v1/merchants/acme/resume"] {
        assert_eq!(
            env.int(
                "SELECT COUNT(*) FROM admin_audit WHERE status = 200 AND path = ?",
                path
            )
            .await,
            1,
            "{path}"
        );
    }
    assert_eq!(
        env.text("SELECT closed_by FROM orders WHERE id = ?", "console-1")
            .await,
        "manual"
    );
    env.cleanup().await;
}

/// A listen address that is taken stops start-up naming the key it came from — `http.listen`
/// or `admin.listen` — the address and the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_listen_address_names_its_key() {
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    for (section, key) in [
        (format!("[http]\nlisten = \"{addr}\"\n"), "http.listen"),
        (
            format!("[admin]\nlisten = \"{addr}\"\n[admin.tokens]\nops = \"{TOKEN}\"\n"),
            "admin.listen",
        ),
    ] {
        let toml = format!("{section}[database]\nurl = \"{}\"\n{ACME}", env.url);
        let config = timeoutd::config::Config::from_toml(&toml, env.dir.path(), &|_| None).unwrap();
        let err = match Daemon::start(&config, Clock::Database).await {
            Ok(_) => panic!("{key}: started on a taken address"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.starts_with(&format!("{key} {addr}: ")) && err.contains("in use"),
            "{err}"
        );
    }
    drop(taken);
    env.cleanup().await;
}

/// The file watcher (`runtime.watch_plugins`), with no reload call: a plugin file swapped for a
/// broken one is looked at and refused (`timeoutd_plugin_reloads_total{outcome="refused"}`)
/// while the old version keeps deciding; swapped for a good one, it is taken
/// (`outcome="taken"`) and the next decision records the new version's digest.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_file_watcher_refuses_a_broken_plugin_and_takes_a_good_one_unasked() {
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    // A merchant of this run alone, its counters read on this process's shared recorder
    // (installed before the daemon emits anything).
    let m = format!("watched-{:08x}", fastrand::u32(..));
    let recorder = timeoutd::events::metrics_handle();
    let reloads = |outcome: &str| {
        let series =
            format!("timeoutd_plugin_reloads_total{{merchant=\"{m}\",outcome=\"{outcome}\"}}");
        crate::support::sample(&recorder.render(), &series)
    };
    let path = env.dir.path().join("watched.wasm");
    std::fs::write(&path, timeoutd::policies::builtin("single-phase").unwrap()).unwrap();
    let config = env.config(
        &[],
        &format!(
            "[runtime]\nwatch_plugins = \"100ms\"\n[merchants.{m}]\nplugin = \"{}\"\n",
            path.display()
        ),
    );
    let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
    let decided_with = |id: &'static str| {
        let (env, m) = (&env, m.clone());
        async move {
            env.create(&order(id, &m, env.db.now_ms().await.unwrap() - 1_000))
                .await;
            digest_of_close(env, id).await
        }
    };
    let old = decided_with("first").await;
    replace_file(&path, b"not a component");
    eventually(
        Duration::from_secs(30),
        "the watcher refuses the broken file",
        || async { reloads("refused") == Some(1.0) },
    )
    .await;
    assert_eq!(
        decided_with("during").await,
        old,
        "the old version keeps deciding"
    );
    replace_file(&path, crate::support::HOSTILE_WASM);
    eventually(
        Duration::from_secs(30),
        "the watcher takes the good file",
        || async { reloads("taken") == Some(1.0) },
    )
    .await;
    let new = decided_with("after").await;
    assert_ne!(new, old, "the next decision is the new version's");
    assert_eq!(
        reloads("refused"),
        Some(1.0),
        "a bad file is refused once, not on every look"
    );
    daemon.stop().await;
    env.cleanup().await;
}

/// The sweep-failure alert (`sweep_consecutive_failures`), on a daemon of its own (the count is
/// its process's): while the database refuses the sweep's re-arming (a trigger raising an
/// error), the rule fires once; when the trigger is dropped, the next sweep re-arms the order,
/// it closes, and the rule resolves once. `GET /v1/backlog` says the same in its body: the
/// failures counted and the order overdue, then 0 and nothing overdue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_failure_alert_fires_while_the_sweep_fails_and_resolves_when_it_works() {
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    overdue_order(&env, "swept", "acme").await;
    let sql = |s: &'static str| {
        let pool = env.db.pool().clone();
        async move {
            sqlx::raw_sql(s).execute(&pool).await.unwrap();
        }
    };
    sql(
        "CREATE TRIGGER refuse_sweep BEFORE INSERT ON order_timeout_msg WHEN NEW.source = 'sweep' \
         BEGIN SELECT RAISE(ABORT, 'the sweep is refused'); END",
    )
    .await;
    let receiver = crate::fakes::Receiver::start().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let file = env.dir.path().join("sweep-alert.toml");
    std::fs::write(
        &file,
        format!(
            "[database]\nurl = \"{}\"\n[sweep]\ninterval = \"100ms\"\ngrace = \"100ms\"\n\
             [admin]\nlisten = \"127.0.0.1:{port}\"\nsample_interval = \"100ms\"\noverdue_margin = \"1s\"\n[admin.tokens]\nops = \"{TOKEN}\"\n\
             [alerts]\nwebhook = \"{}\"\ninterval = \"100ms\"\n\
             [[alerts.rules]]\nname = \"sweep-failing\"\nsignal = \"sweep_consecutive_failures\"\nabove = 2\n{ACME}",
            env.url, receiver.url
        ),
    )
    .unwrap();
    let log = env.dir.path().join("timeoutd.log");
    let mut daemon = crate::support::started_daemon(&file, &[], &log).await;
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let rule = |status: &str| ("sweep-failing".to_string(), status.to_string());
    eventually(
        Duration::from_secs(30),
        "the sweep-failure alert fires",
        || async { notices(&receiver).contains(&rule("firing")) },
    )
    .await;
    assert_eq!(env.status("swept").await, "PENDING", "nothing re-armed it");
    let backlog = || async move {
        let answer = reqwest::Client::new()
            .get(format!("http://127.0.0.1:{port}/v1/backlog"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        answer.json::<Value>().await.unwrap()
    };
    let failing = backlog().await;
    assert!(
        failing["sweep_consecutive_failures"]
            .as_u64()
            .is_some_and(|n| n >= 3),
        "{failing}"
    );
    assert_eq!(
        failing["overdue_open"],
        serde_json::json!([["acme", 1]]),
        "{failing}"
    );
    assert_eq!(
        (
            failing["dead_letters_open"].as_i64(),
            failing["outbox_due"].as_i64()
        ),
        (Some(0), Some(0)),
        "{failing}"
    );
    assert!(
        failing["sampled_at_ms"].as_i64().is_some()
            && failing["plugins_tripped"] == serde_json::json!([]),
        "{failing}"
    );
    sql("DROP TRIGGER refuse_sweep").await;
    eventually(
        Duration::from_secs(30),
        "the sweep works again and the alert resolves",
        || async {
            notices(&receiver).contains(&rule("resolved")) && env.status("swept").await == "CLOSED"
        },
    )
    .await;
    eventually(Duration::from_secs(30), "the backlog shows it", || async {
        let now = backlog().await;
        now["sweep_consecutive_failures"] == 0 && now["overdue_open"] == serde_json::json!([])
    })
    .await;
    let exit = crate::support::sigterm(&mut daemon, Duration::from_secs(10)).await;
    assert!(exit.success(), "{exit:?}\n{}", read());
    assert_eq!(
        notices(&receiver),
        vec![rule("firing"), rule("resolved")],
        "once each"
    );
    assert_eq!(
        env.text("SELECT closed_by FROM orders WHERE id = ?", "swept")
            .await,
        "sweep"
    );
    env.cleanup().await;
}

/// Waits until order `id` is closed; the digest of the plugin version that decided it.
async fn digest_of_close(env: &Env, id: &str) -> String {
    eventually(Duration::from_secs(30), "the order closes", || async {
        env.status(id).await == "CLOSED"
    })
    .await;
    env.text(
        "SELECT plugin_digest FROM decision_log WHERE order_id = ?",
        id,
    )
    .await
}

/// Replaces the file at `path` whole (written beside it, then renamed over it), as a deploy
/// does: a watcher never sees it half written.
fn replace_file(path: &std::path::Path, bytes: &[u8]) {
    let next = path.with_extension("next");
    std::fs::write(&next, bytes).unwrap();
    std::fs::rename(&next, path).unwrap();
}
