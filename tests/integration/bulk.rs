//! Operations on a filtered set (`timeoutd::bulk`): dead letters re-driven
//! (`POST /v1/dead-letters/redrive`, `timeoutd redrive`) and FAILED effects retried
//! (`POST /v1/ledger/retry`, `timeoutd retry-effects`): a filter, a dry run, pages with a
//! cursor, a pace, an audit row, and exactly once — the same set twice changes nothing the
//! second time.

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
