//! Production edges (issue #49), each a failure reported in public for systems of our kind:
//! peers that hang or trickle one byte a second cost only their own work (sampling, the gauges,
//! other receivers and SIGTERM go on), a redirect is never a delivered effect, a 429's
//! `Retry-After` is honoured. SQLite: the sinks' behaviour does not depend on the backend.

use std::time::Duration;

use timeoutd::clock::Clock;
use timeoutd::db::Backend;
use timeoutd::dispatch::Outcome;

use crate::fakes::{BadPeer, Misbehaviour, Provider, Receiver, SEE_OTHER};
use crate::support::{Env, MerchantSpec, T0, free_port, order};

const TOKEN: &str = "edges-token-0123456789";

/// A sink a daemon sends to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sink {
    Webhook,
    Provider,
    Alerts,
    Otlp,
    Redis,
}

/// `GET /v1/backlog`: (`sampled_at_ms`, overdue-but-open orders over all merchants).
async fn backlog(port: u16) -> (i64, i64) {
    let answer: serde_json::Value = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/v1/backlog"))
        .bearer_auth(TOKEN)
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .expect("the admin API answers while a sink hangs")
        .json()
        .await
        .unwrap();
    let overdue = answer["overdue_open"]
        .as_array()
        .map_or(0, |a| a.iter().map(|p| p[1].as_i64().unwrap_or(0)).sum());
    (answer["sampled_at_ms"].as_i64().unwrap_or(0), overdue)
}

/// One daemon (the `timeoutd` binary, SQLite) with `sink` pointed at a peer that misbehaves
/// `how`, every other sink healthy. Checks that the orders close, the backlog keeps being
/// sampled (fresh `sampled_at_ms`, newly overdue orders counted), a healthy alert receiver gets
/// its notice, the bad peer was really called, the effects it owed are left for retry with
/// the reason, and SIGTERM stops the daemon within 5 s. Returns what failed, with the log.
async fn sink_case(sink: Sink, how: Misbehaviour) -> Result<(), String> {
    let case = format!("{sink:?} × {how:?}");
    let env = Env::new(Backend::Sqlite).await;
    env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
    let bad = BadPeer::start(how).await;
    let healthy = Receiver::start().await;
    let provider = Provider::start().await;
    let port = free_port();
    let pick = |mine: Sink, good: &str, path: &str| {
        if sink == mine {
            format!("{}{path}", bad.base)
        } else {
            good.to_string()
        }
    };
    let mut toml = format!(
        "[database]\nurl = \"{url}\"\n[sweep]\nenabled = false\n\
         [admin]\nlisten = \"127.0.0.1:{port}\"\nsample_interval = \"100ms\"\noverdue_margin = \"1ms\"\n\
         [admin.tokens]\nops = \"{TOKEN}\"\n\
         [alerts]\nwebhook = \"{alerts}\"\ninterval = \"100ms\"\ntimeout = \"500ms\"\n\
         [[alerts.rules]]\nname = \"dead-letters\"\nsignal = \"dead_letters_open\"\nabove = 0\n\
         [notify.channels.hook]\nkind = \"webhook\"\nurl = \"{hook}\"\ntimeout = \"500ms\"\n\
         [payment]\nbase_url = \"{pay}\"\ntimeout = \"500ms\"\nattempts = 1\non_unknown = \"close\"\n\
         [effects]\nretry_initial = \"30s\"\n\
         [merchants.acme]\nplugin = \"builtin:two-phase\"\n[merchants.acme.settings]\nchannel = \"hook\"\ngrace = \"1s\"\n",
        url = env.url,
        alerts = pick(Sink::Alerts, &healthy.url, "/alerts"),
        hook = pick(Sink::Webhook, &healthy.url, "/hook"),
        pay = pick(Sink::Provider, &provider.base_url, ""),
    );
    if sink == Sink::Otlp {
        toml += &format!("[tracing]\notlp_endpoint = \"{}/v1/traces\"\n", bad.base);
    }
    if sink == Sink::Redis {
        toml += &format!(
            "[redis]\nurl = \"{}\"\n",
            bad.base.replace("http://", "redis://")
        );
    }
    let file = env.dir.path().join("edges.toml");
    std::fs::write(&file, toml).unwrap();
    let now = env.db.now_ms().await.unwrap();
    for i in 0..3 {
        let mut o = order(&format!("due-{i}"), "acme", now - 1_000);
        if sink == Sink::Redis {
            o.flash_activity = Some(format!("edges-{:012x}", fastrand::u64(..) >> 16));
        }
        env.create(&o).await;
    }
    // No plugin for `nobody`: dead-lettered, open past its deadline (overdue), and an alert.
    env.create(&order("unowned-0", "nobody", now - 1_000)).await;
    let log = env.dir.path().join("timeoutd.log");
    let mut daemon = crate::support::started_daemon(&file, &[], &log).await;
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let result = async {
        let fail = |what: String| Err::<(), String>(format!("{case}: {what}"));
        for i in 0..3 {
            let id = format!("due-{i}");
            let mut closed = false;
            for _ in 0..100 {
                if env.status(&id).await == "CLOSED" {
                    closed = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if !closed {
                return fail(format!("{id} not closed within 10 s"));
            }
        }
        // The sink was really called, and is misbehaving now (the OTLP exporter sends its
        // batches every 5 s, and at the latest at exit: checked after the stop).
        for _ in 0..100 {
            if sink == Sink::Otlp {
                break;
            }
            if bad.connections.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if sink != Sink::Otlp && bad.connections.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            return fail("the bad peer was never called".into());
        }
        // The backlog keeps being sampled while the peer misbehaves, and counts orders that
        // went overdue since (the gauge froze at its old value before).
        let (first, _) = backlog(port).await;
        for i in 1..3 {
            env.create(&order(&format!("unowned-{i}"), "nobody", now - 1_000))
                .await;
        }
        let mut fresh = (0, 0);
        for _ in 0..50 {
            fresh = backlog(port).await;
            if fresh.0 >= first + 1_000 && fresh.1 >= 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if fresh.0 < first + 1_000 || fresh.1 < 3 {
            return fail(format!(
                "sampling stalled: sampled_at {first} then {}, overdue {} (want 3)",
                fresh.0, fresh.1
            ));
        }
        // A healthy alert receiver is not held up by another sink.
        if sink != Sink::Alerts {
            let mut got = false;
            for _ in 0..50 {
                got = healthy.received.lock().unwrap().iter().any(|(_, b)| {
                    b["rule"] == "dead-letters" && b["status"] == "firing"
                });
                if got {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if !got {
                return fail("the healthy alert receiver got no notice".into());
            }
        }
        // What the bad peer owed is left PENDING for a retry, with the reason.
        let kind = match sink {
            Sink::Webhook => Some("notify"),
            Sink::Provider => Some("close-payment"),
            Sink::Redis => Some("restore-flash-stock"),
            Sink::Alerts | Sink::Otlp => None,
        };
        if let Some(kind) = kind {
            let sql = "SELECT COUNT(*) FROM effect_ledger WHERE status = 'PENDING' AND attempts >= 1 AND last_error IS NOT NULL AND kind = ?";
            let mut owed = 0;
            for _ in 0..50 {
                owed = env.int(sql, kind).await;
                if owed >= 3 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let all = env.int("SELECT COUNT(*) FROM effect_ledger WHERE kind = ?", kind).await;
            if owed < 3 || owed != all {
                return fail(format!("{owed} of {all} {kind} rows (3 or more) left for retry"));
            }
        }
        Ok(())
    }
    .await;
    let term = std::time::Instant::now();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &daemon.id().unwrap().to_string()])
        .status();
    let exit = tokio::time::timeout(Duration::from_secs(5), daemon.wait()).await;
    let waited = term.elapsed();
    let stopped = match exit {
        Ok(Ok(status)) if status.success() && read().contains("timeoutd stopped") => Ok(()),
        Ok(other) => Err(format!("{case}: exit {other:?} after {waited:?}")),
        Err(_) => Err(format!("{case}: still running 5 s after SIGTERM")),
    };
    let _ = daemon.kill().await;
    let called = if bad.connections.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        Err(format!("{case}: the bad peer was never called"))
    } else {
        Ok(())
    };
    let outcome = result
        .and(stopped)
        .and(called)
        .map_err(|e| format!("{e}\nlog:\n{}", read()));
    env.cleanup().await;
    outcome
}

async fn every_sink(how: Misbehaviour) {
    let cases = [
        Sink::Webhook,
        Sink::Provider,
        Sink::Alerts,
        Sink::Otlp,
        Sink::Redis,
    ]
    .map(|s| sink_case(s, how));
    let failures: Vec<String> = futures_util::future::join_all(cases)
        .await
        .into_iter()
        .filter_map(Result::err)
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// F16: each sink — webhook, payment provider, alert receiver, OTLP collector, Redis — pointed at a peer
/// that accepts and never answers: the orders close, `/v1/backlog` stays fresh and counts new
/// overdue orders (it stopped for 135 s behind a hung alert receiver), a healthy receiver gets
/// its alert, the owed effects wait for a retry, and SIGTERM stops the daemon within 5 s (it
/// did not within 40 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peer_that_never_answers_costs_only_its_own_work() {
    every_sink(Misbehaviour::Hang).await;
}

/// F16, with a peer answering one byte a second: a deadline covers the whole exchange,
/// not each read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peer_answering_a_byte_a_second_costs_only_its_own_work() {
    every_sink(Misbehaviour::Trickle).await;
}

const SHOPS: &[MerchantSpec<'static>] = &[
    ("acme", "builtin:single-phase", &[("channel", "login-wall")]),
    ("busy", "builtin:single-phase", &[("channel", "throttled")]),
];

/// F17: a webhook answering `302 /login` and a provider answering `303` to the payment: the notices
/// and payment closes are not delivered (they were marked DONE after a body-less GET of the
/// redirect's target), nothing follows the redirect, each row waits for a retry naming the
/// `Location`, and `timeoutd doctor` warns about both. A webhook answering `429` with
/// `Retry-After: 120` is retried no sooner than 120 s later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_is_never_a_delivered_effect_and_retry_after_is_honoured() {
    let env = Env::new(Backend::Sqlite).await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    env.create(&order("walled", "acme", T0)).await;
    env.create(&order("throttled", "busy", T0)).await;
    let wall = BadPeer::start(Misbehaviour::Redirect302).await;
    let see_other = BadPeer::start(Misbehaviour::Redirect303).await;
    let throttle = BadPeer::start(Misbehaviour::Throttle).await;
    let extra = format!(
        "[notify.channels.login-wall]\nkind = \"webhook\"\nurl = \"{}/hook\"\n\
         [notify.channels.throttled]\nkind = \"webhook\"\nurl = \"{}/hook\"\n\
         [payment]\nbase_url = \"{}\"\nquery_before_close = false\nattempts = 1\n\
         [effects]\nretry_initial = \"1s\"\nretry_max = \"10s\"\n",
        wall.base, throttle.base, see_other.base
    );
    let config = env.config(SHOPS, &extra);
    let (clock, _) = Clock::manual(T0);
    let d = env.dispatcher(&config, clock).await;
    let outcomes = env.process(&d, T0).await;
    assert!(
        outcomes.iter().all(|o| matches!(o, Outcome::Closed { .. })),
        "{outcomes:?}"
    );
    let row = |kind: &'static str, order: &'static str| {
        let env = &env;
        async move {
            let sql = format!(
                "SELECT status, attempts, COALESCE(last_error, ''), next_attempt_ms FROM effect_ledger WHERE kind = '{kind}' AND order_id = ?"
            );
            let r = env
                .db
                .backend()
                .query_owned(sql)
                .bind(order)
                .fetch_one(env.db.pool())
                .await
                .unwrap();
            use sqlx::Row;
            (
                r.try_get::<String, _>(0).unwrap(),
                r.try_get::<i64, _>(1).unwrap(),
                r.try_get::<String, _>(2).unwrap(),
                r.try_get::<i64, _>(3).unwrap(),
            )
        }
    };
    let (status, attempts, error, _) = row("notify", "walled").await;
    assert_eq!((status.as_str(), attempts), ("PENDING", 1), "{error}");
    assert!(
        error.contains("302") && error.contains("redirect to /login"),
        "{error}"
    );
    let (status, attempts, error, _) = row("close-payment", "walled").await;
    assert_eq!((status.as_str(), attempts), ("PENDING", 1), "{error}");
    assert!(
        error.contains("303") && error.contains(&format!("redirect to {SEE_OTHER}")),
        "{error}"
    );
    assert_eq!(
        wall.gets() + see_other.gets(),
        0,
        "a redirect was followed: {:?} {:?}",
        wall.requests,
        see_other.requests
    );
    assert!(
        wall.requests
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.starts_with("POST /hook"))
    );
    // The 429's Retry-After (120 s) outweighs the ledger's 1 s backoff.
    let (status, attempts, error, next) = row("notify", "throttled").await;
    assert_eq!((status.as_str(), attempts), ("PENDING", 1), "{error}");
    assert!(error.contains("429"), "{error}");
    assert!(
        next >= T0 + 120_000,
        "next attempt at {next}, {} ms after the first",
        next - T0
    );
    // The doctor warns about both redirecting endpoints, naming where they point.
    let file = env.dir.path().join("redirects.toml");
    std::fs::write(
        &file,
        format!(
            "[database]\nurl = \"{}\"\n{extra}[merchants.acme]\nplugin = \"builtin:single-phase\"\n",
            env.url
        ),
    )
    .unwrap();
    let (_, report) = crate::support::doctor(file).await;
    assert!(
        report.contains("redirects (HTTP 302) to /login"),
        "{report}"
    );
    assert!(
        report.contains(&format!("redirects (HTTP 303) to {SEE_OTHER}")),
        "{report}"
    );
    env.cleanup().await;
}
