//! The admin API against a running daemon: auth and audit, manual close through the plugin and
//! the ledger, dead-letter re-drive, metrics, sweep tuning, and the OpenAPI document.

use std::time::Duration;

use serde_json::Value;
use timeoutd::clock::Clock;
use timeoutd::daemon::Daemon;

use crate::support::{Env, each_backend, order};

const TOKEN: &str = "test-token-0123456789";

fn admin_config(env: &Env, merchants: &str) -> timeoutd::config::Config {
    admin_config_with_sweep(env, merchants, "enabled = false")
}

/// [`admin_config`] with `sweep` as the `[sweep]` section's body.
fn admin_config_with_sweep(env: &Env, merchants: &str, sweep: &str) -> timeoutd::config::Config {
    let toml = format!(
        "[redis]\nurl = \"redis://127.0.0.1:6379\"\n[admin]\nlisten = \"127.0.0.1:0\"\nsample_interval = \"100ms\"\noverdue_margin = \"1s\"\n[admin.tokens]\nops = \"{TOKEN}\"\n\
         [sweep]\n{sweep}\n[runtime]\ndeadline = \"2s\"\n[database]\nurl = \"{}\"\n{merchants}",
        env.url
    );
    timeoutd::config::Config::from_toml(&toml, env.dir.path(), &|_| None).unwrap()
}

const ACME: &str = "[merchants.acme]\nplugin = \"builtin:single-phase\"\n";

struct Api {
    base: String,
    client: reqwest::Client,
}

impl Api {
    fn of(daemon: &Daemon) -> Api {
        Api {
            base: format!("http://{}", daemon.admin_addr().unwrap()),
            client: reqwest::Client::new(),
        }
    }
    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
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
        // Every documented route is served (a missing one answers 404 without a JSON error, or 405).
        for (method, path) in timeoutd::admin::ROUTES {
            let path = path.replace("{id}", "1");
            let body = (*method == "put").then(|| serde_json::json!({ "interval_ms": 1000, "batch": 10 }));
            let (status, answer) = api.call(&method.to_uppercase(), &path, body).await;
            assert_ne!(status, 405, "{method} {path}");
            assert!(status != 404 || answer.get("error").is_some(), "{method} {path} is not routed");
        }
        daemon.stop().await;
        assert_eq!(env.int("SELECT COUNT(*) FROM admin_audit WHERE actor <> ?", "ops").await, 0, "refused calls are logged, not written");
        assert!(env.int("SELECT COUNT(*) FROM admin_audit WHERE actor = ?", "ops").await >= 13);
    }
}

each_backend! {
    async fn manual_close_goes_through_the_plugin_and_the_ledger(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        overdue_order(env, "stuck", "acme").await;
        env.create(&order("future", "acme", env.db.now_ms().await.unwrap() + 600_000)).await;
        let daemon = Daemon::start(&admin_config(env, ACME), Clock::Database).await.unwrap();
        let api = Api::of(&daemon);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (status, overdue) = api.call("GET", "/v1/orders/overdue", None).await;
        assert_eq!(status, 200);
        assert_eq!(overdue["orders"].as_array().unwrap().len(), 1, "{overdue}");
        assert_eq!(overdue["orders"][0]["id"], "stuck");
        let (status, outcome) = api.call("POST", "/v1/orders/stuck/close", None).await;
        assert_eq!((status, outcome["outcome"].as_str()), (200, Some("closed")), "{outcome}");
        assert_eq!(env.text("SELECT closed_by FROM orders WHERE id = ?", "stuck").await, "manual");
        assert_eq!((env.stock("sku-a").await, env.coupon("cpn-stuck").await.as_str()), (8, "AVAILABLE"));
        assert_eq!(env.text("SELECT trigger_kind FROM decision_log WHERE order_id = ?", "stuck").await, "manual");
        assert_eq!(api.call("POST", "/v1/orders/stuck/close", None).await.0, 409, "already CLOSED");
        assert_eq!(api.call("POST", "/v1/orders/future/close", None).await.0, 409, "not due");
        assert_eq!(api.call("POST", "/v1/orders/nope/close", None).await.0, 404);
        let (_, timeline) = api.call("GET", "/v1/orders/stuck", None).await;
        assert_eq!(timeline["order"]["status"], "CLOSED");
        assert_eq!(timeline["decisions"][0]["outcome"], "closed");
        assert_eq!(timeline["effects"].as_array().unwrap().len(), 5);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let metrics = reqwest::get(format!("{}/metrics", api.base)).await.unwrap().text().await.unwrap();
        for needle in [
            "timeoutd_closes_total{source=\"manual\"}",
            "timeoutd_decisions_total{merchant=\"acme\",decision=\"cancel\"}",
            "timeoutd_plugin_decision_seconds_bucket",
            "timeoutd_overdue_open_orders{merchant=\"acme\"}",
            "timeoutd_dead_letters_open",
        ] {
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
        second.stop().await;
        assert_eq!(env.status("orphan").await, "CLOSED");
        assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE outcome = 'closed' AND order_id = ?", "orphan").await, 1);
        assert_eq!(env.stock("sku-a").await, 10);
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

#[test]
fn the_openapi_document_matches_the_routes() {
    let doc: Value = serde_json::from_str(timeoutd::admin::OPENAPI).unwrap();
    let mut documented: Vec<(String, String)> = Vec::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
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
    assert_eq!(documented, routes);
}

each_backend! {
    /// An alert fires once while its rule holds and resolves once when it stops holding.
    async fn alert_rules_fire_once_and_resolve_once(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let receiver = crate::fakes::Receiver::start().await;
        let config = timeoutd::config::Config::from_toml(
            &format!(
                "[database]\nurl = \"{}\"\n[alerts]\nwebhook = \"{}\"\ninterval = \"100ms\"\n\
                 [[alerts.rules]]\nname = \"dead-letters\"\nsignal = \"dead_letters_open\"\nabove = 0\n\
                 [[alerts.rules]]\nname = \"overdue-for-an-hour\"\nsignal = \"overdue_open_orders\"\nabove = 0\nfor = \"1h\"\n{ACME}",
                env.url, receiver.url
            ),
            env.dir.path(),
            &|_| None,
        )
        .unwrap();
        let past = env.db.now_ms().await.unwrap() - 1_000;
        env.create(&order("unowned", "nobody", past)).await;
        let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        env.db.backend().query("UPDATE dead_letter SET status = 'DISMISSED'").execute(env.db.pool()).await.unwrap();
        tokio::time::sleep(Duration::from_millis(800)).await;
        daemon.stop().await;
        let notices: Vec<(String, String)> = receiver
            .received
            .lock()
            .unwrap()
            .iter()
            .map(|(_, body)| (body["rule"].as_str().unwrap().to_string(), body["status"].as_str().unwrap().to_string()))
            .collect();
        assert_eq!(notices, vec![
            ("dead-letters".to_string(), "firing".to_string()),
            ("dead-letters".to_string(), "resolved".to_string()),
        ]);
    }
}

/// The console end to end in headless Chromium (Debian's /usr/bin/chromium, driven by
/// playwright-core from `tests/console`): load, sign in, find the overdue order, close it, see it
/// CLOSED — and the database agrees.
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
        .args([&base, TOKEN, "console-1"])
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
    assert_eq!(
        env.text("SELECT closed_by FROM orders WHERE id = ?", "console-1")
            .await,
        "manual"
    );
    env.cleanup().await;
}
