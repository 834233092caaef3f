//! Shadow policies (`[merchants.<id>.shadow]`, `timeoutd::shadow`): a merchant's candidate
//! plugin is asked on exactly the live plugin's input and never acts. Each comparison is
//! recorded (`shadow_decisions`) and shown (`GET /v1/merchants/{merchant}/shadow`); a shadow
//! that differs, traps on every call or asks for effects beyond the order changes nothing of
//! the live closes.

use std::time::Duration;

use timeoutd::clock::Clock;
use timeoutd::daemon::Daemon;

use crate::admin::{ACME, Api, admin_config};
use crate::support::{Env, each_backend, eventually, order};

/// `merchant`'s shadow comparisons by outcome, as `(outcome, count)` in outcome order.
async fn outcomes(env: &Env, merchant: &str) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    for outcome in ["agree", "differ", "error", "refused", "timeout", "trap"] {
        let sql = "SELECT COUNT(*) FROM shadow_decisions WHERE merchant_id = ? AND outcome = ?";
        let n: i64 = sqlx::Row::get(
            &env.db
                .backend()
                .query(sql)
                .bind(merchant)
                .bind(outcome)
                .fetch_one(env.db.pool())
                .await
                .unwrap(),
            0,
        );
        if n > 0 {
            out.push((outcome.to_string(), n));
        }
    }
    out
}

each_backend! {
    async fn shadows_are_compared_recorded_and_shown_and_never_change_the_live_close(env) {
        let hostile = env.hostile_wasm().display().to_string();
        // Each merchant closes with the single-phase plugin; their shadows: the two-phase
        // plugin (it waits and reminds at the deadline: differs in kind), the hostile plugin
        // panicking on every call, the hostile plugin restoring 1000 units and another order's
        // coupon (the guard refuses it), the live plugin itself (agrees), and the live plugin
        // on half the orders.
        let merchants = format!(
            "{ACME}[merchants.acme.shadow]\nplugin = \"builtin:two-phase\"\nsettings = {{ grace = \"5m\" }}\n\
             [merchants.trappy]\nplugin = \"builtin:single-phase\"\n[merchants.trappy.shadow]\nplugin = \"{hostile}\"\nsettings = {{ mode = \"panic\" }}\n\
             [merchants.greedy]\nplugin = \"builtin:single-phase\"\n[merchants.greedy.shadow]\nplugin = \"{hostile}\"\nsettings = {{ mode = \"exceed\" }}\n\
             [merchants.same]\nplugin = \"builtin:single-phase\"\n[merchants.same.shadow]\nplugin = \"builtin:single-phase\"\n\
             [merchants.half]\nplugin = \"builtin:single-phase\"\n[merchants.half.shadow]\nplugin = \"builtin:single-phase\"\nsample = 0.5\n"
        );
        let config = admin_config(env, &merchants);
        env.stock_up(&[("sku-a", 1_000), ("sku-b", 1_000)]).await;
        let now = env.db.now_ms().await.unwrap();
        let mut ids = Vec::new();
        for merchant in ["acme", "trappy", "greedy", "same"] {
            for k in 0..2 {
                ids.push((format!("{merchant}-{k}"), merchant));
            }
        }
        for k in 0..12 {
            ids.push((format!("half-{k}"), "half"));
        }
        for (id, merchant) in &ids {
            env.create(&order(id, merchant, now - 1_000)).await;
        }
        let daemon = Daemon::start(&config, Clock::Database).await.unwrap();
        for (id, _) in &ids {
            eventually(Duration::from_secs(30), "every order closes", || async {
                env.status(id).await == "CLOSED"
            })
            .await;
        }
        let half_sampled = ids
            .iter()
            .filter(|(id, m)| *m == "half" && timeoutd::shadow::sampled(id, 0.5))
            .count() as i64;
        assert!((1..12).contains(&half_sampled), "the fixture's ids sample some, not all: {half_sampled}");
        let expected = [
            ("acme", vec![("differ".to_string(), 2)]),
            ("trappy", vec![("trap".to_string(), 2)]),
            ("greedy", vec![("refused".to_string(), 2)]),
            ("same", vec![("agree".to_string(), 2)]),
            ("half", vec![("agree".to_string(), half_sampled)]),
        ];
        for (merchant, want) in &expected {
            eventually(Duration::from_secs(30), "each shadow's comparisons are recorded", || async {
                outcomes(env, merchant).await == *want
            })
            .await;
        }
        // The live closes are the live plugin's alone: one decision each, closed, stock back.
        for (id, _) in &ids {
            assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE order_id = ?", id).await, 1, "{id}");
            assert_eq!(
                env.int("SELECT COUNT(*) FROM effect_ledger WHERE order_id = ? AND kind = 'restore-stock'", id).await,
                2,
                "{id}: its two lines, nothing the greedy shadow asked for"
            );
        }
        eventually(Duration::from_secs(30), "the stock is back once", || async {
            env.stock("sku-a").await == 1_000 && env.stock("sku-b").await == 1_000
        })
        .await;
        assert_eq!(env.int("SELECT COUNT(*) FROM dead_letter WHERE order_id LIKE ?", "%-%").await, 0);

        // A trigger alone (a group of one takes the single path) is shadowed too.
        let now = env.db.now_ms().await.unwrap();
        env.create(&order("acme-alone", "acme", now - 1_000)).await;
        eventually(Duration::from_secs(30), "the lone order closes and is shadowed", || async {
            env.status("acme-alone").await == "CLOSED"
                && outcomes(env, "acme").await == [("differ".to_string(), 3)]
        })
        .await;

        // Where operators look.
        let api = Api::of(&daemon);
        let (status, acme) = api.call("GET", "/v1/merchants/acme/shadow", None).await;
        assert_eq!(status, 200, "{acme}");
        assert_eq!((acme["outcomes"]["differ"].as_i64(), acme["differences"]["kind"].as_i64()), (Some(3), Some(3)), "{acme}");
        assert_eq!(acme["shadow"]["plugin"].as_str(), Some("builtin:two-phase"), "{acme}");
        let first = &acme["latest"][0];
        assert_eq!(
            (first["live"]["decision"].as_str(), first["shadow"]["decision"].as_str(), first["differences"][0].as_str()),
            (Some("cancel"), Some("wait"), Some("kind")),
            "both answers side by side: {first}"
        );
        let minutes = acme["minutes"].as_array().unwrap();
        assert_eq!(minutes.iter().map(|m| m["differ"].as_i64().unwrap()).sum::<i64>(), 3, "{acme}");
        let (_, greedy) = api.call("GET", "/v1/merchants/greedy/shadow", None).await;
        let refused = greedy["latest"][0]["shadow"]["refused"].as_array().unwrap();
        assert!(!refused.is_empty(), "the guard's reasons are shown: {greedy}");
        let (_, trappy) = api.call("GET", "/v1/merchants/trappy/shadow", None).await;
        assert!(trappy["latest"][0]["shadow"]["error"].as_str().unwrap().contains("trapped"), "{trappy}");
        let (status, none) = api.call("GET", "/v1/merchants/nobody/shadow", None).await;
        assert!(status == 404 && none["error"].as_str().unwrap().contains("nobody"), "{status} {none}");
        let (status, bad) = api.call("GET", "/v1/merchants/acme/shadow?since=1", None).await;
        assert_eq!(status, 400, "an unknown parameter is refused: {bad}");
        let (_, plugins) = api.call("GET", "/v1/plugins", None).await;
        let listed = plugins["plugins"].as_array().unwrap().iter().find(|p| p["merchant"] == "half").unwrap();
        assert_eq!(listed["shadow"]["sample"].as_f64(), Some(0.5), "{plugins}");
        daemon.stop().await;
    }
}

/// A shadow's problems are named by their keys with the others, and a shadow file that does
/// not load is refused by `validate` (the daemon runs the merchant without it).
#[test]
fn bad_shadows_are_named_by_their_keys() {
    let dir = tempfile::tempdir().unwrap();
    let toml = "[database]\nurl = \"sqlite://x.db\"\n\
                [merchants.a]\nplugin = \"builtin:single-phase\"\n[merchants.a.shadow]\nplugin = \"builtin:nope\"\nsample = 0\n\
                [merchants.b]\nplugin = \"builtin:single-phase\"\n[merchants.b.shadow]\nplugin = \"missing.wasm\"\nsample = 1.5\n";
    let problems = timeoutd::config::Config::from_toml(toml, dir.path(), &|_| None)
        .unwrap_err()
        .to_string();
    // A good shadow is listed by `validate`.
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "[database]\nurl = \"sqlite://x.db\"\n[merchants.a]\nplugin = \"builtin:single-phase\"\n\
         [merchants.a.shadow]\nplugin = \"builtin:two-phase\"\nsettings = { grace = \"5m\" }\nsample = 0.25\n",
    )
    .unwrap();
    let out = std::process::Command::new(crate::support::timeoutd_bin())
        .args(["validate", "--config"])
        .arg(&good)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{listed}");
    assert!(
        listed.contains("merchant a: shadow builtin:two-phase")
            && listed.contains("asked on 25 % of orders"),
        "{listed}"
    );
    for needle in [
        "merchants.a.shadow.plugin",
        "unknown built-in plugin `nope`",
        "merchants.a.shadow.sample",
        "merchants.b.shadow.plugin",
        "no plugin file at",
        "merchants.b.shadow.sample",
        "1.5 is not a share",
    ] {
        assert!(problems.contains(needle), "{needle} in:\n{problems}");
    }
}

/// The console's shadow section in headless Chromium (as `admin::console_closes_…`): a
/// merchant whose shadow waits where its live plugin closes shows the comparisons counted
/// (`differ`, in `kind`), a chart bar for the differing minute, and the order's two answers
/// side by side. `TIMEOUTD_CONSOLE_SCREENSHOT=path.png` saves the section.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_a_shadows_comparisons_in_headless_chromium() {
    let dir = crate::support::repo_root().join("tests/console");
    assert!(
        dir.join("node_modules/playwright-core").is_dir(),
        "run `npm ci --prefix tests/console` and install Debian's chromium first (scripts/test does)"
    );
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
    let merchants = format!(
        "{ACME}[merchants.acme.shadow]\nplugin = \"builtin:two-phase\"\nsettings = {{ grace = \"5m\" }}\n"
    );
    let now = env.db.now_ms().await.unwrap();
    for id in ["shadowed-1", "shadowed-2", "shadowed-3"] {
        env.create(&order(id, "acme", now - 1_000)).await;
    }
    let daemon = Daemon::start(&admin_config(&env, &merchants), Clock::Database)
        .await
        .unwrap();
    eventually(
        Duration::from_secs(30),
        "three comparisons recorded",
        || async { outcomes(&env, "acme").await == [("differ".to_string(), 3)] },
    )
    .await;
    let base = format!("http://{}", daemon.admin_addr().unwrap());
    let mut args = vec![
        base,
        crate::admin::TOKEN.to_string(),
        "acme".to_string(),
        "shadowed-3".to_string(),
    ];
    if let Ok(path) = std::env::var("TIMEOUTD_CONSOLE_SCREENSHOT") {
        args.push(path);
    }
    let run = tokio::process::Command::new("node")
        .arg("shadow.test.mjs")
        .args(&args)
        .current_dir(&dir)
        .output()
        .await
        .expect("node");
    daemon.stop().await;
    assert!(
        run.status.success(),
        "console shadow test failed:\n{}\n{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    env.cleanup().await;
}

/// A shadow file that does not load at start leaves its merchant served without a shadow,
/// and the next reload that finds a good file takes it; a shadow file swapped on disk is
/// taken by the next reload (the watcher's or `POST /v1/plugins/reload`) as a live plugin
/// is, reported with `shadow: true`; a broken one is refused and the old shadow is asked on.
#[test]
fn a_shadow_file_is_taken_by_a_reload_and_a_broken_one_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("candidate.wasm");
    let single = timeoutd::policies::builtin("single-phase").unwrap();
    std::fs::write(&file, b"a truncated upload").unwrap();
    let toml = format!(
        "[database]\nurl = \"sqlite://x.db\"\n[merchants.acme]\nplugin = \"builtin:single-phase\"\n\
         [merchants.acme.shadow]\nplugin = \"{}\"\nsettings = {{ grace = \"5m\" }}\n",
        file.display()
    );
    let config = timeoutd::config::Config::from_toml(&toml, dir.path(), &|_| None).unwrap();
    // The daemon's loader serves the merchant without the shadow that did not load…
    assert!(
        timeoutd::policies::load(&config).is_err(),
        "validate refuses it"
    );
    let (policies, held) = timeoutd::policies::load_serving(&config).unwrap();
    assert!(held.is_empty(), "the live plugin is not held: {held:?}");
    assert!(policies.shadow("acme").is_none());
    // …and a reload that finds a good file takes it.
    std::fs::write(&file, single).unwrap();
    let report = policies.reload(false);
    let shadow = report
        .iter()
        .find(|r| r.merchant == "acme" && r.shadow)
        .unwrap();
    assert!(shadow.changed && shadow.refused.is_none(), "{report:?}");
    let before = policies.shadow("acme").unwrap().plugin.digest().to_string();
    // A different file, with a different size (the watcher compares time and size).
    std::fs::write(&file, timeoutd::policies::builtin("two-phase").unwrap()).unwrap();
    let report = policies.reload(false);
    let shadow = report
        .iter()
        .find(|r| r.merchant == "acme" && r.shadow)
        .unwrap();
    assert!(shadow.changed && shadow.refused.is_none(), "{report:?}");
    let after = policies.shadow("acme").unwrap().plugin.digest().to_string();
    assert_ne!(before, after);
    assert_eq!(shadow.digest, after);
    let live = report
        .iter()
        .find(|r| r.merchant == "acme" && !r.shadow)
        .unwrap();
    assert!(!live.changed, "the live plugin is untouched: {report:?}");
    std::fs::write(&file, b"a truncated upload").unwrap();
    let report = policies.reload(false);
    let shadow = report
        .iter()
        .find(|r| r.merchant == "acme" && r.shadow)
        .unwrap();
    assert!(!shadow.changed && shadow.refused.is_some(), "{report:?}");
    assert_eq!(
        policies.shadow("acme").unwrap().plugin.digest(),
        after,
        "the old shadow is asked on"
    );
}
