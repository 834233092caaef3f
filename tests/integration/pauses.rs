//! Pausing a merchant or an order (`db::pauses`, the admin API's `/pause` and `/resume`, the
//! CLI's `timeoutd pause|resume|pauses`): a paused order is neither closed nor reminded, its
//! triggers are held rather than dropped, the overdue gauge shows it apart, and on resume it
//! is decided again against the database clock, so an order paid meanwhile is left alone.

use std::time::Duration;

use serde_json::{Value, json};
use timeoutd::clock::Clock;
use timeoutd::daemon::Daemon;
use timeoutd::dispatch::Outcome;

use crate::admin::{ACME, Api, admin_config};
use crate::support::{Env, each_backend, eventually, order, sample, timeoutd_bin};

/// `/v1/backlog`'s `field` (`overdue_open` or `overdue_paused`) for `merchant`, 0 when absent.
fn backlog_count(backlog: &Value, field: &str, merchant: &str) -> i64 {
    backlog[field]
        .as_array()
        .into_iter()
        .flatten()
        .find(|pair| pair[0] == merchant)
        .and_then(|pair| pair[1].as_i64())
        .unwrap_or(0)
}

/// The held note's `last_error` of `id`'s outbox row (empty when none).
async fn note_of(env: &Env, id: &str) -> String {
    env.text(
        "SELECT COALESCE(MAX(last_error), '') FROM order_timeout_msg WHERE order_id = ?",
        id,
    )
    .await
}

each_backend! {
    async fn a_paused_merchants_orders_are_held_shown_apart_and_decided_again_on_resume(env) {
        env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
        // A merchant of this run alone: its gauge series on this process's shared recorder are
        // this test's own.
        let m = format!("paused-{:08x}", fastrand::u32(..));
        let merchants = format!("{ACME}[merchants.{m}]\nplugin = \"builtin:single-phase\"\n");
        let daemon = Daemon::start(&admin_config(env, &merchants), Clock::Database).await.unwrap();
        let api = Api::of(&daemon);
        let pause = format!("/v1/merchants/{m}/pause");
        let (status, paused) = api.call("POST", &pause, Some(json!({ "reason": "webhook down" }))).await;
        assert_eq!((status, paused["new"].as_bool(), paused["pause"]["paused_by"].as_str()), (200, Some(true), Some("ops")), "{paused}");
        let (status, again) = api.call("POST", &pause, Some(json!({ "reason": "another" }))).await;
        assert_eq!((status, again["new"].as_bool(), again["pause"]["reason"].as_str()), (200, Some(false), Some("webhook down")), "the first pause stands: {again}");
        let (status, refused) = api.call("POST", "/v1/merchants/nobody/pause", None).await;
        assert!(status == 404 && refused["error"].as_str().unwrap().contains("nobody"), "{status} {refused}");
        let (status, refused) = api.call("POST", &pause, Some(json!({ "why": "typo" }))).await;
        assert!(status == 400 && refused["error"].as_str().unwrap().contains("why"), "{status} {refused}");

        let now = env.db.now_ms().await.unwrap();
        for id in ["held-1", "held-2", "held-3"] {
            env.create(&order(id, &m, now - 5_000)).await;
        }
        env.create(&order("free-1", "acme", now - 5_000)).await;
        // One order of the other merchant, paused alone before its deadline passes.
        env.create(&order("one-held", "acme", now + 1_500)).await;
        let (status, one) = api.call("POST", "/v1/orders/one-held/pause", None).await;
        assert_eq!((status, one["pause"]["scope"].as_str()), (200, Some("order")), "{one}");
        assert_eq!(api.call("POST", "/v1/orders/nope/pause", None).await.0, 404);

        // The other merchant's order closes; the paused ones' triggers reach dispatch and are
        // held, their plugin never asked.
        eventually(Duration::from_secs(30), "acme's free order closes", || async { env.status("free-1").await == "CLOSED" }).await;
        let merchant_note = format!("held: merchant `{m}` is paused");
        for id in ["held-1", "held-2", "held-3"] {
            eventually(Duration::from_secs(30), "the merchant's triggers are held", || async { note_of(env, id).await == merchant_note }).await;
        }
        eventually(Duration::from_secs(30), "the paused order's trigger is held past its deadline", || async {
            note_of(env, "one-held").await == "held: the order is paused"
        })
        .await;
        let now = env.db.now_ms().await.unwrap();
        for id in ["held-1", "held-2", "held-3", "one-held"] {
            assert_eq!(env.status(id).await, "PENDING", "{id}");
            assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE order_id = ?", id).await, 0, "{id}: no plugin asked");
            assert_eq!(env.text("SELECT status FROM order_timeout_msg WHERE order_id = ?", id).await, "PENDING", "{id}: held, not dropped");
            let due = env.int("SELECT due_ms FROM order_timeout_msg WHERE order_id = ?", id).await;
            assert!(due > now + 30_000, "{id}: held by dispatch.pause_recheck (5m), due in {} ms", due - now);
        }
        assert_eq!(env.int("SELECT COUNT(*) FROM dead_letter WHERE order_id LIKE ?", "%held%").await, 0, "held, not dead-lettered");

        // Shown apart: the sample, its gauges, the overdue list; the overdue alert's count
        // leaves them out.
        eventually(Duration::from_secs(30), "the backlog shows the paused orders apart", || async {
            let (_, b) = api.call("GET", "/v1/backlog", None).await;
            backlog_count(&b, "overdue_paused", &m) == 3 && backlog_count(&b, "overdue_open", &m) == 0
                && backlog_count(&b, "overdue_paused", "acme") == 1 && backlog_count(&b, "overdue_open", "acme") == 0
        })
        .await;
        let page = reqwest::get(format!("{}/metrics", api.base)).await.unwrap().text().await.unwrap();
        assert_eq!(sample(&page, &format!("timeoutd_overdue_paused_orders{{merchant=\"{m}\"}}")), Some(3.0));
        assert_eq!(sample(&page, &format!("timeoutd_overdue_open_orders{{merchant=\"{m}\"}}")), Some(0.0));
        assert!(sample(&page, &format!("timeoutd_triggers_paused_total{{merchant=\"{m}\",scope=\"merchant\"}}")).is_some_and(|n| n >= 3.0), "{page}");
        let (_, overdue) = api.call("GET", "/v1/orders/overdue", None).await;
        let paused_as = |id: &str| overdue["orders"].as_array().unwrap().iter().find(|o| o["id"] == id).map(|o| o["paused"].clone());
        assert_eq!((paused_as("held-1"), paused_as("one-held")), (Some(json!("merchant")), Some(json!("order"))), "{overdue}");
        let (status, refused) = api.call("POST", "/v1/orders/held-1/close", None).await;
        assert!(status == 409 && refused["error"].as_str().unwrap().contains("paused"), "a manual close waits too: {status} {refused}");
        let (_, listed) = api.call("GET", "/v1/pauses", None).await;
        assert_eq!(listed["pauses"].as_array().unwrap().len(), 2, "{listed}");

        // A payment while paused applies; on resume the order is decided again and left alone.
        assert!(env.pay("held-2", env.db.now_ms().await.unwrap()).await);
        let (status, resumed) = api.call("POST", &format!("/v1/merchants/{m}/resume"), None).await;
        assert_eq!((status, resumed["woken"].as_u64()), (200, Some(3)), "{resumed}");
        assert_eq!(api.call("POST", &format!("/v1/merchants/{m}/resume"), None).await.0, 409, "not paused any more");
        for id in ["held-1", "held-3"] {
            eventually(Duration::from_secs(30), "the merchant's held orders close once resumed", || async { env.status(id).await == "CLOSED" }).await;
        }
        eventually(Duration::from_secs(30), "the paid order's held trigger finishes", || async {
            env.text("SELECT status FROM order_timeout_msg WHERE order_id = ?", "held-2").await == "PROCESSED"
        })
        .await;
        assert_eq!(env.status("one-held").await, "PENDING", "its own pause still holds it");
        let (status, resumed) = api.call("POST", "/v1/orders/one-held/resume", None).await;
        assert_eq!((status, resumed["woken"].as_u64()), (200, Some(1)), "{resumed}");
        eventually(Duration::from_secs(30), "the paused order closes once resumed", || async { env.status("one-held").await == "CLOSED" }).await;
        daemon.stop().await;

        assert_eq!(env.status("held-2").await, "PAID");
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE order_id = ?", "held-2").await, 0, "nothing released for the paid order");
        for id in ["held-1", "held-3", "free-1", "one-held"] {
            assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE outcome = 'closed' AND order_id = ?", id).await, 1, "{id} closed once");
            assert_eq!(env.coupon(&format!("cpn-{id}")).await, "AVAILABLE", "{id}");
        }
        assert_eq!(env.stock("sku-a").await, 100 - 2, "four closes gave back their units; the paid order keeps its 2");
        assert_eq!(env.int("SELECT COUNT(*) FROM pauses WHERE target <> ?", "").await, 0, "every pause ended");
        let audited = |path: String| async move { env.int("SELECT COUNT(*) FROM admin_audit WHERE actor = 'ops' AND path = ?", &path).await };
        assert_eq!(audited(pause.clone()).await, 3);
        assert_eq!(audited(format!("/v1/merchants/{m}/resume")).await, 2);
        assert_eq!(audited("/v1/orders/one-held/pause".to_string()).await, 1);
    }
}

each_backend! {
    async fn the_cli_pauses_and_resumes_without_a_daemon_and_audits_both(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let file = env.single_phase_config_file("cli.toml");
        let cli = |args: &[&str]| {
            let mut c = tokio::process::Command::new(timeoutd_bin());
            c.args(args).arg("--config").arg(&file).env("USER", "alice");
            c
        };
        let out = crate::support::stdout_of_success(&mut cli(&["pause", "--merchant", "acme", "--reason", "provider outage"])).await;
        assert!(out.contains("merchant `acme` paused") && out.contains("cli:alice"), "{out}");
        let listed = crate::support::stdout_of_success(&mut cli(&["pauses"])).await;
        let fields: Vec<&str> = listed.trim().split('\t').collect();
        assert_eq!((fields[0], fields[1], fields[3], fields[4]), ("merchant", "acme", "cli:alice", "provider outage"), "{listed}");
        for (args, says) in [
            (&["pause", "--merchant", "nobody"][..], "merchant `nobody` is not in"),
            (&["pause", "--order", "nope"][..], "order `nope` does not exist"),
            (&["resume", "--order", "nope"][..], "order `nope` is not paused"),
        ] {
            let out = cli(args).output().await.unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.code() == Some(1) && stderr.contains(says), "{args:?}: {:?} {stderr}", out.status);
        }
        let both = cli(&["pause", "--merchant", "acme", "--order", "x"]).output().await.unwrap();
        assert_eq!(both.status.code(), Some(2), "clap refuses both targets");

        // A dispatcher of this database holds acme's due order while paused and closes it once
        // the CLI resumed.
        let config = env.config(&[("acme", "builtin:single-phase", &[])], "");
        let d = env.dispatcher(&config, Clock::Database).await;
        let now = env.db.now_ms().await.unwrap();
        env.create(&order("o1", "acme", now - 1_000)).await;
        let outcomes = env.process(&d, now).await;
        assert!(matches!(outcomes.as_slice(), [Outcome::Paused { .. }]), "{outcomes:?}");
        assert_eq!(env.status("o1").await, "PENDING");
        assert!(env.process(&d, env.db.now_ms().await.unwrap()).await.is_empty(), "held: not due again until resumed");
        let out = crate::support::stdout_of_success(&mut cli(&["resume", "--merchant", "acme"])).await;
        assert!(out.contains("1 held trigger(s) due now"), "{out}");
        let outcomes = env.process(&d, env.db.now_ms().await.unwrap()).await;
        assert!(matches!(outcomes.as_slice(), [Outcome::Closed { .. }]), "{outcomes:?}");
        assert_eq!((env.status("o1").await, env.stock("sku-a").await), ("CLOSED".to_string(), 10));
        assert_eq!(env.int("SELECT COUNT(*) FROM admin_audit WHERE method = 'CLI' AND actor = ?", "cli:alice").await, 2, "the pause and the resume, not the refusals");
    }
}

#[test]
fn a_zero_pause_recheck_is_refused_by_name() {
    let problems = timeoutd::config::Config::from_toml(
        "[database]\nurl = \"sqlite://x.db\"\n[dispatch]\npause_recheck = \"0s\"\n[merchants.acme]\nplugin = \"builtin:single-phase\"\n",
        std::path::Path::new("."),
        &|_| None,
    )
    .unwrap_err()
    .to_string();
    assert!(problems.contains("dispatch.pause_recheck"), "{problems}");
}

each_backend! {
    async fn a_held_row_the_relay_sent_keeps_its_note_stays_live_for_the_sweep_and_is_woken(env) {
        use timeoutd::db::{outbox, pauses, relay};
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let config = env.config(&[("acme", "builtin:single-phase", &[])], "");
        let d = env.dispatcher(&config, Clock::Database).await;
        let now = env.db.now_ms().await.unwrap();
        pauses::pause(&env.db, pauses::Scope::Merchant, "acme", now, "ops", "").await.unwrap();
        env.create(&order("r1", "acme", now - 60_000)).await;
        let outcomes = env.process(&d, now).await;
        assert!(matches!(outcomes.as_slice(), [Outcome::Paused { .. }]), "{outcomes:?}");
        // Held for minutes, so past `rocketmq.relay_lead`: the relay sends it like any row.
        let (token, rows) = relay::claim_for_relay(&env.db, now, 3_000, 100, 30_000).await.unwrap();
        assert_eq!(rows.len(), 1, "the held row is relayed");
        relay::mark_sent(&env.db, &token, now, &[(rows[0].id, "msg-r1".to_string())]).await.unwrap();
        let note = pauses::held_note(pauses::Scope::Merchant, "acme");
        assert_eq!(env.text("SELECT status FROM order_timeout_msg WHERE order_id = ?", "r1").await, "SENT");
        assert_eq!(note_of(env, "r1").await, note, "the relay keeps a pause's note");
        let orphans = outbox::find_orphans(&env.db, now + 1_000, 0, 100).await.unwrap();
        assert!(orphans.iter().all(|o| o.order_id != "r1"), "a held row stays live for the sweep: {orphans:?}");
        assert_eq!(pauses::resume(&env.db, pauses::Scope::Merchant, "acme", now).await.unwrap(), Some(1));
        assert_eq!(env.text("SELECT status FROM order_timeout_msg WHERE order_id = ?", "r1").await, "PENDING");
        let outcomes = env.process(&d, env.db.now_ms().await.unwrap()).await;
        assert!(matches!(outcomes.as_slice(), [Outcome::Closed { .. }]), "{outcomes:?}");
        assert_eq!((env.status("r1").await, env.stock("sku-a").await), ("CLOSED".to_string(), 10));
        assert_eq!(pauses::resume(&env.db, pauses::Scope::Merchant, "acme", now).await.unwrap(), None, "not paused");
    }
}
