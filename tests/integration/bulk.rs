//! Operations on a filtered set (`timeoutd::bulk`): dead letters re-driven
//! (`POST /v1/dead-letters/redrive`, `timeoutd redrive`), FAILED effects retried
//! (`POST /v1/ledger/retry`, `timeoutd retry-effects`), PENDING orders closed or re-armed
//! (`POST /v1/orders/close|rearm`, `timeoutd close-orders|rearm-orders`): a filter, a dry run,
//! pages with a cursor, a pace, an audit row, and exactly once — the same set twice changes
//! nothing the second time.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use timeoutd::clock::Clock;
use timeoutd::daemon::Daemon;

use crate::admin::{ACME, Api, TOKEN, admin_config};
use crate::support::{Env, each_backend, eventually, order, timeoutd_bin};

/// Dead-letters `ids` (orders of `merchant`, due a minute ago): a dispatcher with no plugin
/// for `merchant` handles their rows.
async fn dead_lettered(env: &Env, merchant: &str, ids: &[&str]) {
    let now = env.db.now_ms().await.unwrap();
    for id in ids {
        env.create(&order(id, merchant, now - 60_000)).await;
    }
    let nobody = env.config(&[("someone-else", "builtin:single-phase", &[])], "");
    let d = env.dispatcher(&nobody, Clock::Database).await;
    env.process(&d, now).await;
    for id in ids {
        assert_eq!(
            env.int(
                "SELECT COUNT(*) FROM dead_letter WHERE status = 'OPEN' AND order_id = ?",
                id
            )
            .await,
            1,
            "{id} dead-lettered"
        );
    }
}

/// The letter ids of `page`'s `field` (`matched` or `redriven`).
fn ids(page: &Value, field: &str) -> Vec<i64> {
    page[field]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["id"].as_i64().unwrap())
        .collect()
}

each_backend! {
    async fn a_filtered_bulk_redrive_dry_runs_pages_paces_and_redrives_each_letter_once(env) {
        env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
        dead_lettered(env, "m1", &["a-1", "a-2", "a-3"]).await;
        dead_lettered(env, "m2", &["b-1", "b-2"]).await;
        // A poison message's letter, naming no order: never matched by a merchant filter.
        env.db.backend()
            .query("INSERT INTO dead_letter (source, order_id, reason, payload, attempts, status, created_at_ms) VALUES ('rocketmq', NULL, 'body is not a timeout JSON', '{', 1, 'OPEN', 0)")
            .execute(env.db.pool()).await.unwrap();
        let merchants = format!("{ACME}[merchants.m1]\nplugin = \"builtin:single-phase\"\n[merchants.m2]\nplugin = \"builtin:single-phase\"\n");
        let daemon = Daemon::start(&admin_config(env, &merchants), Clock::Database).await.unwrap();
        let api = Api::of(&daemon);
        let path = "/v1/dead-letters/redrive";
        let open = || async { env.int("SELECT COUNT(*) FROM dead_letter WHERE status = ?", "OPEN").await };

        // A dry run, a page of two at a time: every m1 letter once, nothing changed.
        let (mut after, mut seen, mut pages) = (0, Vec::new(), 0);
        loop {
            let (status, page) = api.call("POST", path, Some(json!({ "filter": { "merchant": "m1" }, "after_id": after, "limit": 2, "dry_run": true }))).await;
            assert_eq!(status, 200, "{page}");
            assert!(page["redriven"].as_array().unwrap().is_empty(), "{page}");
            seen.extend(ids(&page, "matched"));
            pages += 1;
            match page["next_after_id"].as_i64() {
                Some(next) => after = next,
                None => break,
            }
        }
        assert_eq!((seen.len(), pages), (3, 4), "6 OPEN letters, 2 a page, then an empty last page: {seen:?}");
        assert_eq!(open().await, 6, "a dry run changes nothing");

        // Bad requests name what is wrong.
        for (body, says) in [
            (json!({ "filter": { "merchnt": "m1" } }), "merchnt"),
            (json!({ "limit": 0 }), "limit"),
            (json!({ "per_second": 0 }), "per_second"),
        ] {
            let (status, answer) = api.call("POST", path, Some(body.clone())).await;
            assert!(status == 400 && answer["error"].as_str().unwrap().contains(says), "{body}: {status} {answer}");
        }

        // The run, paced at 20 a second: three re-drives take at least two gaps of 50 ms.
        let started = Instant::now();
        let (status, page) = api.call("POST", path, Some(json!({ "filter": { "merchant": "m1" }, "per_second": 20 }))).await;
        assert!(started.elapsed() >= Duration::from_millis(100), "paced: {:?}", started.elapsed());
        assert_eq!((status, ids(&page, "redriven").len()), (200, 3), "{page}");
        assert!(page["redriven"].as_array().unwrap().iter().all(|r| r["outcome"] == "rearmed"), "{page}");
        for id in ["a-1", "a-2", "a-3"] {
            eventually(Duration::from_secs(30), "a re-driven order closes", || async { env.status(id).await == "CLOSED" }).await;
        }
        // The same set again: nothing is OPEN any more, nothing changes.
        let (status, again) = api.call("POST", path, Some(json!({ "filter": { "merchant": "m1" } }))).await;
        assert_eq!((status, ids(&again, "matched").len(), ids(&again, "redriven").len()), (200, 0, 0), "{again}");
        // Another filter: by reason, the other merchant's; the poison letter is left OPEN.
        let (_, by_reason) = api.call("POST", path, Some(json!({ "filter": { "reason_contains": "`m2`", "source": "outbox" } }))).await;
        assert_eq!(ids(&by_reason, "redriven").len(), 2, "{by_reason}");
        for id in ["b-1", "b-2"] {
            eventually(Duration::from_secs(30), "m2's re-driven order closes", || async { env.status(id).await == "CLOSED" }).await;
        }
        daemon.stop().await;

        assert_eq!(open().await, 1, "only the poison letter stays OPEN");
        for id in ["a-1", "a-2", "a-3", "b-1", "b-2"] {
            assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE outcome = 'closed' AND order_id = ?", id).await, 1, "{id} closed once");
            assert_eq!(env.text("SELECT status FROM dead_letter WHERE order_id = ?", id).await, "REDRIVEN");
        }
        assert_eq!(env.stock("sku-a").await, 100, "every unit back once");
        assert_eq!(env.int("SELECT COUNT(*) FROM admin_audit WHERE method = 'BULK' AND actor = ?", "ops").await, 7, "what each page did (dry runs too), audited");
    }
}

each_backend! {
    async fn the_cli_redrives_a_merchants_dead_letters_once_and_lists_them_on_a_dry_run(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        dead_lettered(env, "acme", &["c-1", "c-2"]).await;
        let file = env.single_phase_config_file("cli.toml");
        let cli = |args: &[&str]| {
            let mut c = tokio::process::Command::new(timeoutd_bin());
            c.arg("redrive").args(args).arg("--config").arg(&file).env("USER", "bob");
            c
        };
        let listed = crate::support::stdout_of_success(&mut cli(&["--merchant", "acme", "--dry-run", "--page", "1"])).await;
        assert!(listed.contains("c-1\tacme\toutbox") && listed.contains("would re-drive"), "{listed}");
        assert!(listed.trim_end().ends_with("2 dead letter(s) matched; would re-drive 2"), "{listed}");
        assert_eq!(env.int("SELECT COUNT(*) FROM dead_letter WHERE status = ?", "OPEN").await, 2);
        let done = crate::support::stdout_of_success(&mut cli(&["--merchant", "acme", "--since", "1h", "--per-second", "100"])).await;
        assert!(done.trim_end().ends_with("2 dead letter(s) matched; re-driven 2"), "{done}");
        let again = crate::support::stdout_of_success(&mut cli(&["--merchant", "acme"])).await;
        assert!(again.trim_end().ends_with("0 dead letter(s) matched; re-driven 0"), "{again}");
        let refused = cli(&["--page", "0"]).output().await.unwrap();
        assert_eq!(refused.status.code(), Some(2), "clap refuses a page of 0");

        let config = env.config(&[("acme", "builtin:single-phase", &[])], "");
        let d = env.dispatcher(&config, Clock::Database).await;
        env.process(&d, env.db.now_ms().await.unwrap()).await;
        assert_eq!((env.status("c-1").await, env.status("c-2").await, env.stock("sku-a").await), ("CLOSED".to_string(), "CLOSED".to_string(), 10));
        assert_eq!(env.int("SELECT COUNT(*) FROM admin_audit WHERE method = 'CLI' AND actor = ?", "cli:bob").await, 1, "one page re-driven, audited");
    }
}

each_backend! {
    /// Payment closes the provider refused for good, for two merchants, and a stock release
    /// that failed in the close (its SKU has no stock row): a bulk retry of one merchant's
    /// close-payment effects lists them on a dry run, retries them once the provider accepts,
    /// closes each trade once under its original key, leaves the other merchant's FAILED, and
    /// never retries the stock release (applied in the close). The same set again matches
    /// nothing; the CLI does the same for the other merchant.
    async fn a_bulk_retry_of_failed_effects_retries_each_once_and_never_an_in_close_effect(env) {
        env.stock_up(&[("sku-a", 10)]).await;
        let provider = crate::fakes::Provider::start().await;
        let orders = [("acme", "p-1"), ("acme", "p-2"), ("m2", "p-3")];
        for (merchant, id) in orders {
            let key = format!("{merchant}/{id}/0/3");
            provider.books.lock().unwrap().answers.insert(key, (400, json!({ "error": "unknown reference" })));
        }
        let toml = format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n[admin.tokens]\nops = \"{TOKEN}\"\n[sweep]\nenabled = false\n\
             [runtime]\ndeadline = \"2s\"\n[payment]\nbase_url = \"{}\"\nattempts = 1\n[database]\nurl = \"{}\"\n{ACME}\
             [merchants.m2]\nplugin = \"builtin:single-phase\"\n",
            provider.base_url, env.url
        );
        let config = timeoutd::config::Config::from_toml(&toml, env.dir.path(), &|_| None).unwrap();
        let now = env.db.now_ms().await.unwrap();
        for (merchant, id) in orders {
            env.create(&order(id, merchant, now - 1_000)).await;
        }
        let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
        let api = Api::of(&daemon);
        let failed = |kind: &'static str| async move {
            env.int("SELECT COUNT(*) FROM effect_ledger WHERE status = 'FAILED' AND kind = ?", kind).await
        };
        let done = || async { env.int("SELECT COUNT(*) FROM effect_ledger WHERE status = 'DONE' AND kind = ?", "close-payment").await };
        eventually(Duration::from_secs(30), "every close-payment ends FAILED", || async { failed("close-payment").await == 3 }).await;
        assert_eq!(failed("restore-stock").await, 3, "sku-b has no stock row: failed in each close");
        let path = "/v1/ledger/retry";
        let acme = json!({ "filter": { "merchant": "acme" }, "dry_run": true });
        let (status, dry) = api.call("POST", path, Some(acme)).await;
        assert_eq!((status, ids(&dry, "matched").len(), ids(&dry, "retried").len()), (200, 4, 0), "acme's 2 payments and 2 stock releases: {dry}");
        assert_eq!(failed("close-payment").await, 3, "a dry run changes nothing");
        let (status, refused) = api.call("POST", path, Some(json!({ "filter": { "status": "FAILED" } }))).await;
        assert!(status == 400 && refused["error"].as_str().unwrap().contains("status"), "{status} {refused}");

        // The provider accepts now; the operator retries acme's FAILED effects.
        provider.books.lock().unwrap().answers.clear();
        let (status, page) = api.call("POST", path, Some(json!({ "filter": { "merchant": "acme" } }))).await;
        assert_eq!(status, 200, "{page}");
        let outcomes: Vec<&str> = page["retried"].as_array().unwrap().iter().map(|r| r["outcome"].as_str().unwrap()).collect();
        assert_eq!(outcomes.iter().filter(|o| **o == "retrying").count(), 2, "{page}");
        assert_eq!(outcomes.iter().filter(|o| **o == "in-transaction").count(), 2, "{page}");
        eventually(Duration::from_secs(30), "acme's retried closes complete", || async { done().await == 2 }).await;
        assert_eq!(failed("close-payment").await, 1, "the other merchant's stays FAILED");
        let (_, again) = api.call("POST", path, Some(json!({ "filter": { "merchant": "acme", "kind": "close-payment" } }))).await;
        assert_eq!(ids(&again, "matched").len(), 0, "the same set again matches nothing: {again}");

        // The other merchant's, from the CLI.
        let file = env.dir.path().join("bulk.toml");
        std::fs::write(&file, &toml).unwrap();
        let mut cli = tokio::process::Command::new(timeoutd_bin());
        cli.args(["retry-effects", "--merchant", "m2", "--kind", "close-payment", "--reason-contains", "400", "--config"]).arg(&file).env("USER", "carol");
        let out = crate::support::stdout_of_success(&mut cli).await;
        assert!(out.contains("p-3\tm2\tclose-payment") && out.trim_end().ends_with("1 failed effect(s) matched; retrying 1"), "{out}");
        eventually(Duration::from_secs(30), "m2's retried close completes", || async { done().await == 3 }).await;
        daemon.stop().await;

        assert_eq!(failed("restore-stock").await, 3, "never retried: applied in the close");
        let closes = provider.books.lock().unwrap().closes.clone();
        for (merchant, id) in orders {
            let key = format!("{merchant}/{id}/0/3");
            assert_eq!(closes.iter().filter(|(_, k)| *k == key).count(), 1, "{id} closed once under its original key: {closes:?}");
        }
        assert_eq!(env.int("SELECT COUNT(*) FROM admin_audit WHERE method = 'BULK' AND actor = ?", "ops").await, 3);
        assert_eq!(env.int("SELECT COUNT(*) FROM admin_audit WHERE method = 'CLI' AND actor = ?", "cli:carol").await, 1);
    }
}

/// Runs `sql` on the test database.
async fn exec(env: &Env, sql: String) {
    env.db
        .backend()
        .query_owned(sql)
        .execute(env.db.pool())
        .await
        .unwrap();
}

/// The `done` outcomes of an order page, as `order:outcome[:why]`.
fn outcomes(page: &Value) -> Vec<String> {
    page["done"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| match d["why"].as_str() {
            Some(why) => format!(
                "{}:{}:{why}",
                d["order_id"].as_str().unwrap(),
                d["outcome"].as_str().unwrap()
            ),
            None => format!(
                "{}:{}",
                d["order_id"].as_str().unwrap(),
                d["outcome"].as_str().unwrap()
            ),
        })
        .collect()
}

each_backend! {
    /// Overdue orders whose triggers were lost (or pushed an hour out by a wait): a bulk close
    /// of one merchant's dry-runs page by page, then queues each overdue order once and the
    /// daemon's outbox timer closes them through the plugin; a paused order, a dead-lettered
    /// one and one not due are left as they are, the other merchant's untouched until named by
    /// id. The same set again changes nothing.
    async fn a_bulk_close_queues_each_overdue_order_once_and_leaves_paused_dead_lettered_and_not_due(env) {
        env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
        dead_lettered(env, "acme", &["x-dl"]).await;
        let now = env.db.now_ms().await.unwrap();
        for id in ["x-1", "x-2", "x-3", "x-paused"] {
            env.create(&order(id, "acme", now - 60_000)).await;
        }
        env.create(&order("x-later", "acme", now + 600_000)).await;
        env.create(&order("y-1", "m2", now - 60_000)).await;
        // Triggers lost, save x-3's, which a plugin's wait pushed an hour out.
        exec(env, "DELETE FROM order_timeout_msg WHERE order_id IN ('x-1', 'x-2', 'x-paused', 'y-1')".into()).await;
        exec(env, format!("UPDATE order_timeout_msg SET due_ms = {}, source = 'wait' WHERE order_id = 'x-3'", now + 3_600_000)).await;
        let merchants = format!("{ACME}[merchants.m2]\nplugin = \"builtin:single-phase\"\n");
        let daemon = Daemon::start(&admin_config(env, &merchants), Clock::Database).await.unwrap();
        let api = Api::of(&daemon);
        assert_eq!(api.call("POST", "/v1/orders/x-paused/pause", None).await.0, 200);
        let path = "/v1/orders/close";
        let manual = || async { env.int("SELECT COUNT(*) FROM order_timeout_msg WHERE source = ?", "manual").await };

        // A dry run, two a page: acme's five overdue orders once each, in id order, with what
        // would happen; nothing changed.
        let (mut after, mut seen, mut pages) = (Value::Null, Vec::new(), 0);
        loop {
            let (status, page) = api.call("POST", path, Some(json!({ "filter": { "merchant": "acme" }, "after_id": after, "limit": 2, "dry_run": true }))).await;
            assert_eq!((status, page["dry_run"].as_bool()), (200, Some(true)), "{page}");
            seen.extend(outcomes(&page));
            pages += 1;
            match &page["next_after_id"] {
                Value::Null => break,
                next => after = next.clone(),
            }
        }
        assert_eq!(seen, ["x-1:queued", "x-2:queued", "x-3:queued", "x-dl:skipped:dead-lettered", "x-paused:skipped:paused"], "{pages} pages");
        assert_eq!(pages, 3);
        assert_eq!(manual().await, 0, "a dry run changes nothing");

        for (body, says) in [
            (json!({ "filter": { "merchnt": "acme" } }), "merchnt"),
            (json!({ "filter": { "deadline_from_ms": 5, "deadline_to_ms": 5 } }), "deadline_from_ms"),
            (json!({ "filter": { "order_ids": vec!["o"; 1001] } }), "order_ids"),
            (json!({ "per_second": 0 }), "per_second"),
        ] {
            let (status, answer) = api.call("POST", path, Some(body.clone())).await;
            assert!(status == 400 && answer["error"].as_str().unwrap().contains(says), "{status} {answer}");
        }

        // The run, paced at 20 a second: three queued, at least two gaps of 50 ms.
        let started = Instant::now();
        let (status, page) = api.call("POST", path, Some(json!({ "filter": { "merchant": "acme" }, "per_second": 20 }))).await;
        assert!(started.elapsed() >= Duration::from_millis(100), "paced: {:?}", started.elapsed());
        assert_eq!(status, 200, "{page}");
        assert_eq!(outcomes(&page), ["x-1:queued", "x-2:queued", "x-3:queued", "x-dl:skipped:dead-lettered", "x-paused:skipped:paused"]);
        for id in ["x-1", "x-2", "x-3"] {
            eventually(Duration::from_secs(30), "a queued order closes", || async { env.status(id).await == "CLOSED" }).await;
        }
        // The same set again: only the two left as they were, nothing queued.
        let (_, again) = api.call("POST", path, Some(json!({ "filter": { "merchant": "acme" } }))).await;
        assert_eq!(outcomes(&again), ["x-dl:skipped:dead-lettered", "x-paused:skipped:paused"]);
        // The other merchant's, by id; a not-yet-due id is not matched at all.
        let (_, by_id) = api.call("POST", path, Some(json!({ "filter": { "order_ids": ["y-1", "x-later"] } }))).await;
        assert_eq!(outcomes(&by_id), ["y-1:queued"]);
        eventually(Duration::from_secs(30), "y-1 closes", || async { env.status("y-1").await == "CLOSED" }).await;
        daemon.stop().await;

        for id in ["x-1", "x-2", "x-3", "y-1"] {
            assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE outcome = 'closed' AND order_id = ?", id).await, 1, "{id} closed once");
        }
        for id in ["x-later", "x-paused", "x-dl"] {
            assert_eq!(env.status(id).await, "PENDING", "{id} left as it was");
        }
        assert_eq!(env.stock("sku-a").await, 100 - 2 * 3, "each closed order's units back once; the three open ones keep theirs");
        assert_eq!(env.int("SELECT COUNT(*) FROM admin_audit WHERE method = 'BULK' AND actor = ?", "ops").await, 6, "every page, dry runs too");
        assert!(env.text("SELECT path FROM admin_audit WHERE method = 'BULK' AND path LIKE ? ORDER BY id DESC LIMIT 1", "close orders%").await.contains("changed=1"));
    }
}

each_backend! {
    /// Orders whose triggers were lost: `timeoutd rearm-orders` lists them on a dry run, gives
    /// each its row back due at its deadline (one not yet due is held until then, not closed
    /// early), skips one with a live trigger, and changes nothing the second time;
    /// `timeoutd close-orders` does not match an order not yet due.
    async fn rearm_orders_gives_lost_triggers_back_at_their_deadlines_once(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let now = env.db.now_ms().await.unwrap();
        let soon = now + 3_000;
        env.create(&order("r-over", "acme", now - 60_000)).await;
        env.create(&order("r-soon", "acme", soon)).await;
        env.create(&order("r-live", "acme", now + 600_000)).await;
        env.create(&order("r-done", "acme", now - 60_000)).await;
        exec(env, "DELETE FROM order_timeout_msg WHERE order_id IN ('r-over', 'r-soon')".into()).await;
        // A row handled without closing its order (a plugin that ignored it): re-armed in place.
        exec(env, "UPDATE order_timeout_msg SET status = 'PROCESSED' WHERE order_id = 'r-done'".into()).await;
        let file = env.single_phase_config_file("rearm.toml");
        let cli = |command: &str, args: &[&str]| {
            let mut c = tokio::process::Command::new(timeoutd_bin());
            c.arg(command).args(args).arg("--config").arg(&file).env("USER", "dave");
            c
        };
        let listed = crate::support::stdout_of_success(&mut cli("rearm-orders", &["--merchant", "acme", "--dry-run", "--page", "2"])).await;
        assert!(listed.contains("r-over\tacme\t") && listed.contains("would re-arm"), "{listed}");
        assert!(listed.contains("r-live\tacme\t") && listed.contains("phase 0 PENDING order-service\tskipped: it has a live trigger"), "{listed}");
        assert!(listed.trim_end().ends_with("4 pending order(s) matched; would re-arm 3"), "{listed}");
        assert_eq!(env.int("SELECT COUNT(*) FROM order_timeout_msg WHERE order_id LIKE ? AND status = 'PENDING'", "r-%").await, 1, "a dry run writes nothing");

        let done = crate::support::stdout_of_success(&mut cli("rearm-orders", &["--merchant", "acme", "--per-second", "100"])).await;
        assert!(done.trim_end().ends_with("4 pending order(s) matched; re-armed 3"), "{done}");
        for (id, due) in [("r-over", now - 60_000), ("r-soon", soon), ("r-done", now - 60_000)] {
            assert_eq!(env.int("SELECT due_ms FROM order_timeout_msg WHERE status = 'PENDING' AND phase = 0 AND order_id = ?", id).await, due, "{id} due at its deadline");
        }
        let again = crate::support::stdout_of_success(&mut cli("rearm-orders", &["--merchant", "acme"])).await;
        assert!(again.trim_end().ends_with("4 pending order(s) matched; re-armed 0"), "{again}");
        let close = crate::support::stdout_of_success(&mut cli("close-orders", &["--order", "r-live", "--order", "r-soon"])).await;
        assert!(close.trim_end().ends_with("0 pending order(s) matched; queued to close 0"), "not due, not matched: {close}");

        let config = env.config(&[("acme", "builtin:single-phase", &[])], "");
        let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
        for id in ["r-over", "r-done"] {
            eventually(Duration::from_secs(30), "an overdue re-armed order closes", || async { env.status(id).await == "CLOSED" }).await;
        }
        if env.db.now_ms().await.unwrap() < soon - 500 {
            assert_eq!(env.status("r-soon").await, "PENDING", "not closed before its deadline");
        }
        eventually(Duration::from_secs(30), "the re-armed order closes at its deadline", || async { env.status("r-soon").await == "CLOSED" }).await;
        daemon.stop().await;
        let closed_at = env.int("SELECT decided_at_ms FROM decision_log WHERE outcome = 'closed' AND order_id = ?", "r-soon").await;
        assert!(closed_at >= soon, "decided at {closed_at}, due {soon}");
        assert_eq!(env.status("r-live").await, "PENDING");
        assert_eq!(env.int("SELECT COUNT(*) FROM admin_audit WHERE method = 'CLI' AND actor = ?", "cli:dave").await, 1, "the one page that changed rows, audited");
    }
}

/// A bulk close and re-arm on macrozheng/mall's own tables through the shipped profile
/// (`oms_order`, a `BIGINT` id, the window from `oms_order_setting`): pages follow the table's
/// numeric id order (9, 10, 100, not the text order 10, 100, 9); a re-armed order not yet due
/// gets its row due at `create_time` plus the window (mall writes no outbox rows, so only the
/// sweep would find it, after its grace); the queued closes close each overdue order once.
async fn bulk_orders_on_malls_tables(backend: timeoutd::db::Backend) {
    use timeoutd::bulk::Pace;
    use timeoutd::bulk::orders::{self, Done, Filter, Op};

    use crate::shop::{Mall, Placed, WINDOW_MS};

    let mall = Mall::on(backend).await;
    let now = mall.env.db.now_ms().await.unwrap() / 1_000 * 1_000;
    mall.stock_up(&[401], 100).await;
    mall.member(41, 0, &[]).await;
    let fresh = now - 60_000;
    for (id, created_ms) in [
        (9, now - WINDOW_MS - 60_000),
        (10, now - WINDOW_MS - 60_000),
        (100, now - WINDOW_MS - 60_000),
        (11, fresh),
    ] {
        mall.place(&Placed {
            id,
            member: 41,
            coupon: None,
            points: None,
            lines: &[(401, 1, "1.00")],
            created_ms,
            status: 0,
            deleted: 0,
        })
        .await;
    }
    let config = mall.config("");
    let db = mall.mapped(&config);
    let pace = |limit, dry_run| Pace {
        limit,
        per_second: 1_000,
        dry_run,
    };
    let (mut after, mut seen) = (None::<String>, Vec::new());
    loop {
        let page = orders::page(
            &db,
            Op::Close,
            &Filter::default(),
            after.as_deref(),
            pace(1, true),
            || db.now_ms(),
        )
        .await
        .unwrap();
        seen.extend(page.matched.iter().map(|o| o.id.clone()));
        match page.next_after_id {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(
        seen,
        ["9", "10", "100"],
        "the overdue ones, in the table's numeric order"
    );

    let only_11 = Filter {
        order_ids: Some(vec!["11".into()]),
        ..Filter::default()
    };
    let page = orders::page(&db, Op::Rearm, &only_11, None, pace(100, false), || {
        db.now_ms()
    })
    .await
    .unwrap();
    assert!(
        matches!(&page.done[..], [Done::Rearmed { due_ms, .. }] if *due_ms == fresh + WINDOW_MS),
        "{:?}",
        page.done
    );
    let again = orders::page(&db, Op::Rearm, &only_11, None, pace(100, false), || {
        db.now_ms()
    })
    .await
    .unwrap();
    assert!(!again.done[0].changed(), "re-armed once: {:?}", again.done);

    let page = orders::page(
        &db,
        Op::Close,
        &Filter {
            merchant: Some("mall".into()),
            ..Filter::default()
        },
        None,
        pace(100, false),
        || db.now_ms(),
    )
    .await
    .unwrap();
    assert_eq!(
        page.done.iter().filter(|d| d.changed()).count(),
        3,
        "{:?}",
        page.done
    );
    let d = mall.env.dispatcher(&config, Clock::Database).await;
    mall.env.process(&d, db.now_ms().await.unwrap()).await;
    for id in [9, 10, 100] {
        assert_eq!(mall.status(id).await, 4, "{id} closed as mall closes");
    }
    assert_eq!(
        mall.status(11).await,
        0,
        "not due: left to its re-armed row"
    );
    assert_eq!(
        mall.locked(401).await,
        1,
        "three locks released once, 11's kept"
    );
    let none = orders::page(
        &db,
        Op::Close,
        &Filter::default(),
        None,
        pace(100, false),
        || db.now_ms(),
    )
    .await
    .unwrap();
    assert!(
        none.matched.is_empty(),
        "closed orders are no longer pending: {:?}",
        none.matched
    );
    mall.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_orders_page_and_arm_malls_own_orders() {
    bulk_orders_on_malls_tables(timeoutd::db::Backend::MySql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_orders_page_and_arm_malls_own_orders_on_postgresql() {
    bulk_orders_on_malls_tables(timeoutd::db::Backend::Postgres).await;
}
