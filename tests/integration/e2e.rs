//! The `timeoutd` binary as an operator runs it.

use std::process::{Command, Stdio};
use std::time::Duration;

use timeoutd::db::Backend;

use crate::support::{Env, repo_root, timeoutd_bin};

/// Orders written by another program (the `mariadb` client) are closed by `timeoutd run`: one
/// through its outbox row, one that has no outbox row at all through the sweep. SIGTERM drains
/// and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeoutd_run_closes_orders_inserted_by_plain_sql_into_mariadb() {
    let env = Env::new(Backend::MySql).await;
    let database = env.url.rsplit('/').next().unwrap().to_string();
    let log = env.dir.path().join("timeoutd.log");
    let mut daemon = Command::new(timeoutd_bin())
        .args(["run", "--config"])
        .arg(repo_root().join("config/mariadb.toml"))
        .env("TIMEOUTD_MYSQL_URL", &env.url)
        .env("TIMEOUTD_SWEEP_INTERVAL", "500ms")
        .env("TIMEOUTD_SWEEP_GRACE", "1s")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let sql = "SET @now = CAST(UNIX_TIMESTAMP(CURRENT_TIMESTAMP(3)) * 1000 AS SIGNED);
        INSERT INTO sku_stock (sku, available) VALUES ('sku-e2e', 10);
        INSERT INTO orders (id, merchant_id, user_id, status, created_at_ms, deadline_ms, total_cents)
            VALUES ('e2e-outbox', 'acme', 'u1', 'PENDING', @now, @now + 1000, 500),
                   ('e2e-no-row', 'acme', 'u2', 'PENDING', @now, @now + 1000, 500);
        INSERT INTO order_items (order_id, line_no, sku, quantity, unit_price_cents)
            VALUES ('e2e-outbox', 0, 'sku-e2e', 2, 250), ('e2e-no-row', 0, 'sku-e2e', 3, 250);
        UPDATE sku_stock SET available = available - 5 WHERE sku = 'sku-e2e';
        INSERT INTO order_timeout_msg (order_id, due_ms, phase, status) VALUES ('e2e-outbox', @now + 1000, 0, 'PENDING');";
    let client = Command::new("mariadb")
        .args([
            "-h",
            "127.0.0.1",
            "-P",
            "3306",
            "-u",
            "root",
            &database,
            "-e",
            sql,
        ])
        .output()
        .expect("the `mariadb` client");
    assert!(
        client.status.success(),
        "mariadb: {}",
        String::from_utf8_lossy(&client.stderr)
    );
    let mut closed = false;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if env.status("e2e-outbox").await == "CLOSED" && env.status("e2e-no-row").await == "CLOSED"
        {
            closed = true;
            break;
        }
    }
    let _ = Command::new("kill")
        .args(["-TERM", &daemon.id().to_string()])
        .status();
    let exit = daemon.wait().unwrap();
    let log_text = std::fs::read_to_string(&log).unwrap();
    assert!(
        closed,
        "orders not closed within 10 s; daemon log:\n{log_text}"
    );
    assert!(exit.success(), "exit {exit:?}; log:\n{log_text}");
    assert!(log_text.contains("timeoutd stopped"), "{log_text}");
    assert_eq!(env.stock("sku-e2e").await, 10);
    assert_eq!(
        env.text("SELECT closed_by FROM orders WHERE id = ?", "e2e-outbox")
            .await,
        "outbox"
    );
    assert_eq!(
        env.text("SELECT closed_by FROM orders WHERE id = ?", "e2e-no-row")
            .await,
        "sweep"
    );
    env.cleanup().await;
}

#[test]
fn validate_lists_every_problem_and_exits_64() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[database]\nurl = \"oracle://x\"\n[outbox]\nbatch = 0\n[merchants.a]\nplugin = \"nope.wasm\"\n").unwrap();
    let out = Command::new(timeoutd_bin())
        .args(["validate", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    for key in ["database.url", "outbox.batch", "merchants.a.plugin"] {
        assert!(stderr.contains(key), "{key} missing from:\n{stderr}");
    }
    let good = Command::new(timeoutd_bin())
        .args(["validate", "--config"])
        .arg(repo_root().join("config/timeoutd.toml"))
        .output()
        .unwrap();
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
    let stdout = String::from_utf8_lossy(&good.stdout);
    assert!(stdout.contains("merchant flashy: plugin builtin:two-phase (timeout:policy@0.1.0"));
    // No [redis] and no [payment]: the effects only those run are named, per merchant.
    assert!(
        stdout.contains(
            "warning: merchants.flashy: its plugin may ask for restore-flash-stock, \
             release-flash-slot, but [redis] is not configured"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("warning: merchants.acme: its plugin may ask for close-payment, but [payment] is not configured"),
        "{stdout}"
    );
    // A merchant granted only what the database does itself gets no warning.
    let narrow = dir.path().join("narrow.toml");
    std::fs::write(
        &narrow,
        "[database]\nurl = \"sqlite://x.db\"\n[merchants.a]\nplugin = \"builtin:single-phase\"\n\
         granted_effects = [\"restore-stock\", \"release-coupon\", \"notify\"]\n",
    )
    .unwrap();
    let out = Command::new(timeoutd_bin())
        .args(["validate", "--config"])
        .arg(&narrow)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && !stdout.contains("warning"),
        "{stdout}"
    );
}

/// The value of the sample `series` (name and labels exactly as exported) in a Prometheus text
/// page; 0 when absent.
fn metric(page: &str, series: &str) -> f64 {
    crate::support::sample(page, series).unwrap_or(0.0)
}

/// A daemon in its own process (so its metrics recorder counts only its own work) serves
/// metric values that agree with what it wrote: closes, their lateness (count, and a sum equal
/// to `closed_at_ms − deadline_ms` over the closed orders), decisions, triggers, dead letters,
/// effects by outcome, and the backlog gauges. SIGINT stops it like SIGTERM: exit 0, drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemons_metric_values_agree_with_its_rows_and_sigint_stops_it() {
    let env = Env::new(Backend::Sqlite).await;
    env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let file = env.dir.path().join("metrics.toml");
    std::fs::write(
        &file,
        format!(
            "[database]\nurl = \"{}\"\n[admin]\nlisten = \"127.0.0.1:{port}\"\nsample_interval = \"100ms\"\n\
             [admin.tokens]\nops = \"metrics-token-0123456789\"\n[runtime]\ndeadline = \"2s\"\n\
             [sweep]\ngrace = \"1h\"\n[merchants.acme]\nplugin = \"builtin:single-phase\"\n",
            env.url
        ),
    )
    .unwrap();
    let now = env.db.now_ms().await.unwrap();
    for i in 0..4 {
        env.create(&crate::support::order(
            &format!("m{i}"),
            "acme",
            now + 1_500,
        ))
        .await;
    }
    env.create(&crate::support::order("ghost", "nobody", now - 1_000))
        .await;
    // An order service that wrote its outbox row 40 s after the deadline, due when written:
    // its close is 40 s late against the deadline however promptly the row is handled.
    env.create(&crate::support::order("late-row", "acme", now - 40_000))
        .await;
    env.db
        .backend()
        .query("UPDATE order_timeout_msg SET due_ms = ? WHERE order_id = ?")
        .bind(now)
        .bind("late-row")
        .execute(env.db.pool())
        .await
        .unwrap();
    // An order past its deadline (by more than the overdue margin, 1 min) whose trigger row
    // says "later": the overdue gauge counts it by its deadline, whatever the row says. (The
    // sweep would close it at deadline + grace, whatever the row says: its grace is an hour
    // here, so the order stays open for the gauge.)
    env.create(&crate::support::order("row-later", "acme", now - 120_000))
        .await;
    env.db
        .backend()
        .query("UPDATE order_timeout_msg SET due_ms = ? WHERE order_id = ?")
        .bind(now + 600_000)
        .bind("row-later")
        .execute(env.db.pool())
        .await
        .unwrap();
    // An order service that wrote its deadline in seconds: quarantined, not closed.
    let mut in_seconds = crate::support::order("in-seconds", "acme", now + 1_500);
    in_seconds.deadline_ms = (now + 1_500) / 1_000;
    env.create(&in_seconds).await;
    env.create(&crate::support::order("paid", "acme", now + 600_000))
        .await;
    assert!(env.pay("paid", now).await);
    let log = env.dir.path().join("timeoutd.log");
    let mut daemon = tokio::process::Command::new(timeoutd_bin())
        .args(["run", "--config"])
        .arg(&file)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let url = format!("http://127.0.0.1:{port}/metrics");
    let started = std::time::Instant::now();
    let page = loop {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "orders not closed, or no sample; log:\n{}",
            read()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let closed = env
            .int("SELECT COUNT(*) FROM orders WHERE status = ?", "CLOSED")
            .await;
        if closed < 5 {
            continue;
        }
        let Ok(response) = reqwest::get(&url).await else {
            continue;
        };
        let page = response.text().await.unwrap();
        // A backlog sample taken after the last close's commit (its close-payment rows wait,
        // with no [payment]) and the dead letter.
        if metric(&page, "timeoutd_dead_letters_open") == 2.0
            && metric(&page, "timeoutd_ledger_pending") == 5.0
        {
            break page;
        }
    };
    let lateness_ms: i64 = {
        let mut sum = 0;
        for id in ["m0", "m1", "m2", "m3", "late-row"] {
            sum += env
                .int(
                    "SELECT closed_at_ms - deadline_ms FROM orders WHERE id = ?",
                    id,
                )
                .await;
        }
        sum
    };
    assert!(
        lateness_ms >= 40_000,
        "late-row alone was 40 s late: {lateness_ms} ms"
    );
    // Seven triggers: the four orders, late-row, ghost and in-seconds. The sweep runs at
    // start-up beside the outbox timer's first claim, and may re-arm a row long past due (ghost
    // or in-seconds) before the timer claims it; that trigger then counts as the sweep's, and
    // so does its dead letter. Which source took it is read from the rows.
    let swept = env
        .int(
            "SELECT COUNT(*) FROM order_timeout_msg WHERE source = ?",
            "sweep",
        )
        .await as f64;
    let dead_swept = env
        .int("SELECT COUNT(*) FROM dead_letter WHERE source = ?", "sweep")
        .await as f64;
    let expect = [
        ("timeoutd_closes_total{source=\"outbox\"}", 5.0),
        (
            "timeoutd_close_lateness_seconds_count{source=\"outbox\"}",
            5.0,
        ),
        (
            "timeoutd_trigger_lateness_seconds_count{source=\"outbox\"}",
            5.0,
        ),
        (
            "timeoutd_decisions_total{merchant=\"acme\",decision=\"cancel\"}",
            5.0,
        ),
        ("timeoutd_triggers_total{source=\"outbox\"}", 7.0 - swept),
        ("timeoutd_triggers_total{source=\"sweep\"}", swept),
        (
            "timeoutd_dead_letters_total{source=\"outbox\"}",
            2.0 - dead_swept,
        ),
        ("timeoutd_dead_letters_total{source=\"sweep\"}", dead_swept),
        ("timeoutd_dead_letters_open", 2.0),
        (
            "timeoutd_quarantined_total{field=\"orders.deadline_ms\"}",
            1.0,
        ),
        // Open past their deadlines: row-later (its row due in 10 min) and the quarantined
        // order (an implausible deadline).
        ("timeoutd_overdue_open_orders{merchant=\"acme\"}", 2.0),
    ];
    // Every timeoutd metric the shipped dashboard and alert rules name is served.
    for file in [
        "deploy/prometheus/timeoutd-alerts.yml",
        "deploy/grafana/timeoutd.json",
    ] {
        let text = std::fs::read_to_string(repo_root().join(file)).unwrap();
        let names: std::collections::BTreeSet<&str> = text
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("timeoutd_") && !w.ends_with('_'))
            .collect();
        assert!(names.len() >= 8, "{file} names {names:?}");
        let missing: Vec<&&str> = names
            .iter()
            .filter(|name| {
                !page.lines().any(|line| {
                    line.strip_prefix(**name)
                        .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
                })
            })
            .collect();
        assert!(
            missing.is_empty(),
            "{file} names metrics /metrics does not serve: {missing:?}\n{page}"
        );
    }
    let wrong: Vec<String> = expect
        .iter()
        .filter(|(series, want)| metric(&page, series) != *want)
        .map(|(series, want)| format!("{series} = {} (want {want})", metric(&page, series)))
        .collect();
    assert!(wrong.is_empty(), "{wrong:?}\n{page}");
    let sum = metric(
        &page,
        "timeoutd_close_lateness_seconds_sum{source=\"outbox\"}",
    );
    assert!(
        (sum - lateness_ms as f64 / 1e3).abs() < 0.005,
        "lateness sum {sum} s, rows say {lateness_ms} ms"
    );
    // How late the triggers themselves were handled: late-row's row was handled promptly.
    let trigger_sum = metric(
        &page,
        "timeoutd_trigger_lateness_seconds_sum{source=\"outbox\"}",
    );
    assert!(
        trigger_sum < sum - 39.0,
        "trigger lateness {trigger_sum} s against {sum} s against the deadlines"
    );
    // Notices (channel `log`) are carried out; close-payment, with no [payment], waits.
    let notified = env
        .int(
            "SELECT COUNT(*) FROM effect_ledger WHERE status = 'DONE' AND kind = ?",
            "notify",
        )
        .await;
    assert_eq!(notified, 5);
    assert_eq!(
        metric(
            &page,
            "timeoutd_effects_total{kind=\"notify\",outcome=\"done\"}"
        ),
        5.0,
        "{page}"
    );
    let pending = env
        .int(
            "SELECT COUNT(*) FROM effect_ledger WHERE status = ?",
            "PENDING",
        )
        .await;
    assert_eq!(
        pending, 5,
        "one close-payment per closed order, as the gauge said"
    );
    assert_eq!(
        env.status("in-seconds").await,
        "PENDING",
        "quarantined, not closed"
    );
    assert_eq!(env.coupon("cpn-in-seconds").await, "LOCKED");
    let pid = daemon.id().unwrap();
    let _ = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status();
    let exit = tokio::time::timeout(Duration::from_secs(5), daemon.wait())
        .await
        .expect("stopped within 5 s of SIGINT")
        .unwrap();
    assert!(exit.success(), "exit {exit:?}; log:\n{}", read());
    assert!(read().contains("timeoutd stopped"), "{}", read());
    env.cleanup().await;
}

/// The README's main job, `timeoutd demo`, on the embedded default: exit 0, and its report's
/// conservation figures agree with the rows of the SQLite database it leaves (counted here
/// independently): every order PAID or CLOSED, none closed early, stock and coupons exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_reports_figures_its_database_agrees_with() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("demo");
    let stdout = crate::support::stdout_of_success(
        tokio::process::Command::new(timeoutd_bin())
            .args(["demo", "--orders", "200", "--json", "--data-dir"])
            .arg(&data),
    )
    .await;
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let db = timeoutd::db::Db::connect(
        &format!("sqlite://{}", data.join("timeoutd.db").display()),
        1,
    )
    .await
    .unwrap();
    let count = |sql: &'static str| {
        let db = db.clone();
        async move {
            let row = db.backend().query(sql).fetch_one(db.pool()).await.unwrap();
            sqlx::Row::try_get::<Option<i64>, _>(&row, 0)
                .unwrap()
                .unwrap_or(0)
        }
    };
    let orders = count("SELECT COUNT(*) FROM orders").await;
    let paid = count("SELECT COUNT(*) FROM orders WHERE status = 'PAID'").await;
    let closed = count("SELECT COUNT(*) FROM orders WHERE status = 'CLOSED'").await;
    let early =
        count("SELECT COUNT(*) FROM orders WHERE status = 'CLOSED' AND closed_at_ms < deadline_ms")
            .await;
    let available = count("SELECT SUM(available) FROM sku_stock").await;
    let held = count(
        "SELECT SUM(i.quantity) FROM order_items i JOIN orders o ON o.id = i.order_id WHERE o.status = 'PAID'",
    )
    .await;
    let locked = count("SELECT COUNT(*) FROM coupons WHERE status = 'LOCKED'").await;
    let closes = count("SELECT COUNT(*) FROM decision_log WHERE outcome = 'closed'").await;
    db.close().await;
    assert_eq!(
        (orders, paid + closed, early, locked),
        (200, 200, 0, 0),
        "{report}"
    );
    assert_eq!(closes, closed, "each order closed once");
    assert_eq!(report["orders"], orders);
    assert_eq!(report["paid"], paid);
    assert_eq!(report["closed"], closed);
    assert_eq!(report["open"], 0);
    assert_eq!(report["closed_before_deadline"], early);
    assert_eq!(report["final_stock_units"], available);
    assert_eq!(report["paid_units"], held);
    assert_eq!(
        report["initial_stock_units"].as_i64().unwrap(),
        available + held,
        "stock conserved"
    );
    assert_eq!(
        (
            report["duplicate_restores"].as_i64(),
            report["coupons_locked"].as_i64(),
            report["dead_letters"].as_i64()
        ),
        (Some(0), Some(0), Some(0))
    );
    assert!(
        stdout.contains("stock:") && !stdout.contains("VIOLATED"),
        "{stdout}"
    );
}

/// CPU time (user + system) of process `pid` so far, from `/proc/<pid>/stat`, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let per_second = Command::new("getconf").arg("CLK_TCK").output().ok();
    let per_second: f64 = per_second
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0);
    ticks as f64 / per_second
}

/// What one shipped config did as a daemon on an empty database.
struct Idle {
    config: String,
    ready_s: f64,
    idle_cpu_s: f64,
    log_lines: usize,
    stop_s: f64,
    exit: std::process::ExitStatus,
    log: String,
}

/// Runs `timeoutd run --config config/<file>` against a fresh database of the backend it
/// names: waits until ready ("timeoutd started"), idles 10 s, then SIGTERM.
async fn idle(file: std::path::PathBuf) -> Idle {
    let text = std::fs::read_to_string(&file).unwrap();
    let backend = if text.contains("TIMEOUTD_MYSQL_URL") || text.contains("TIMEOUTD_MALL_URL") {
        Backend::MySql
    } else if text.contains("TIMEOUTD_POSTGRES_URL") {
        Backend::Postgres
    } else {
        Backend::Sqlite
    };
    let env = Env::new(backend).await;
    // A config closing a shop's own tables (`[database.shop]`, mall's profile) gets mall's
    // tables in a database of their own beside the test's.
    let shop = match text.contains("[database.shop]") {
        true => Some(crate::shop::shop_database(&env).await),
        false => None,
    };
    let log = env.dir.path().join("timeoutd.log");
    let admin_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = std::time::Instant::now();
    let mut daemon = tokio::process::Command::new(timeoutd_bin())
        .args(["run", "--config"])
        .arg(&file)
        .current_dir(env.dir.path())
        .env("TIMEOUTD_ADMIN_LISTEN", format!("127.0.0.1:{admin_port}"))
        .env_remove("TIMEOUTD_ADMIN_TOKEN")
        .env("TIMEOUTD_MYSQL_URL", &env.url)
        .env("TIMEOUTD_POSTGRES_URL", &env.url)
        .env("TIMEOUTD_DATA_DIR", env.dir.path())
        .env(
            "TIMEOUTD_SHOP_DATABASE",
            shop.as_ref().map_or("", |(name, _)| name.as_str()),
        )
        // A config sharing mall's database (a table prefix) is pointed at mall's.
        .env(
            "TIMEOUTD_MALL_URL",
            shop.as_ref().map_or(String::new(), |(name, _)| {
                format!("{}/{name}", env.url.rsplit_once('/').unwrap().0)
            }),
        )
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = daemon.id().unwrap();
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let mut ready_s = f64::NAN;
    while started.elapsed() < Duration::from_secs(120) {
        if read().contains("timeoutd started") {
            ready_s = started.elapsed().as_secs_f64();
            break;
        }
        if let Ok(Some(exit)) = daemon.try_wait() {
            panic!(
                "{} exited {exit:?} before it was ready:\n{}",
                file.display(),
                read()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if text.contains("[admin]") && !ready_s.is_nan() {
        // A config with [admin] shows itself: probes and metrics on loopback, and the console
        // behind the token of the generated file whose path the log names.
        let base = format!("http://127.0.0.1:{admin_port}");
        for path in ["/healthz", "/readyz", "/metrics", "/console"] {
            let status = reqwest::get(format!("{base}{path}"))
                .await
                .unwrap()
                .status();
            assert_eq!(status, 200, "{}: GET {path}", file.display());
        }
        if text.contains("token_file") {
            let token_file = env.dir.path().join("admin-token");
            let token = std::fs::read_to_string(&token_file).unwrap();
            assert!(
                read().contains(&token_file.display().to_string()),
                "the log names the token file:\n{}",
                read()
            );
            let client = reqwest::Client::new();
            let with = client
                .get(format!("{base}/v1/backlog"))
                .bearer_auth(token.trim())
                .send()
                .await
                .unwrap();
            assert_eq!(with.status(), 200, "the generated token opens the API");
            let without = client
                .get(format!("{base}/v1/backlog"))
                .send()
                .await
                .unwrap();
            assert_eq!(without.status(), 401);
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "only its owner reads the token file");
        }
    }
    let cpu_at_ready = cpu_seconds(pid);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let idle_cpu_s = cpu_seconds(pid) - cpu_at_ready;
    let term = std::time::Instant::now();
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let exit = match tokio::time::timeout(Duration::from_secs(60), daemon.wait()).await {
        Ok(exit) => exit.unwrap(),
        Err(_) => {
            let _ = daemon.kill().await;
            daemon.wait().await.unwrap()
        }
    };
    let stop_s = term.elapsed().as_secs_f64();
    let log_text = read();
    if let Some((name, db)) = shop {
        crate::shop::drop_shop_database(&env, &name, db).await;
    }
    env.cleanup().await;
    Idle {
        config: file.file_name().unwrap().to_string_lossy().into_owned(),
        ready_s,
        idle_cpu_s,
        log_lines: log_text.lines().count(),
        stop_s,
        exit,
        log: log_text,
    }
}

/// Every daemon config we ship (each `config/*.toml`, listed from the folder, so a config added
/// later is covered) idles quietly on an empty database: ready, at most 0.5 CPU-seconds over
/// 10 s of idling, at most 50 log lines, and gone within 5 s of SIGTERM with exit 0.
/// (`config/rocketmq/` holds the broker's own files, not daemon configs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shipped_config_idles_quietly_and_stops_promptly() {
    let files = crate::support::shipped_configs();
    // The broker tests stop the broker for a while; a config with [rocketmq] waits its turn.
    let _broker = crate::rocketmq::broker().await;
    let mut runs = tokio::task::JoinSet::new();
    for file in files {
        runs.spawn(idle(file));
    }
    let mut problems = Vec::new();
    while let Some(run) = runs.join_next().await {
        let r = run.unwrap();
        eprintln!(
            "{}: ready in {:.1} s, {:.2} CPU-s idle over 10 s, {} log lines, stopped in {:.2} s ({:?})",
            r.config, r.ready_s, r.idle_cpu_s, r.log_lines, r.stop_s, r.exit
        );
        let mut wrong = Vec::new();
        if r.ready_s.is_nan() {
            wrong.push("never ready".to_string());
        }
        if r.idle_cpu_s > 0.5 {
            wrong.push(format!("{:.2} CPU-seconds idling", r.idle_cpu_s));
        }
        if r.log_lines > 50 {
            wrong.push(format!("{} log lines", r.log_lines));
        }
        if r.stop_s > 5.0 || !r.exit.success() {
            wrong.push(format!("stop took {:.1} s, exit {:?}", r.stop_s, r.exit));
        }
        if !wrong.is_empty() {
            let head: String = r.log.lines().take(60).collect::<Vec<_>>().join("\n");
            problems.push(format!("{}: {}\n{head}", r.config, wrong.join("; ")));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

/// SIGTERM in the middle of a burst (F10's graceful half): `timeoutd run` stops within 5 s with
/// exit 0, nothing it closed is closed again by the next daemon, and the next daemon closes the
/// rest: every order closed exactly once, stock exact, one ledger row per effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_burst_loses_and_doubles_nothing() {
    const ORDERS: usize = 1_000;
    let env = Env::new(Backend::MySql).await;
    env.stock_up(&[("sku-a", 10 * ORDERS as i64), ("sku-b", 10 * ORDERS as i64)])
        .await;
    let now = env.db.now_ms().await.unwrap();
    let ids: Vec<String> = (0..ORDERS).map(|i| format!("burst-{i:04}")).collect();
    for id in &ids {
        env.create(&crate::support::order(id, "acme", now - 1_000))
            .await;
    }
    // The shipped MariaDB config with small groups and few of them in flight, so SIGTERM lands
    // while most of the burst is still waiting (the defaults drain 1,000 orders in well under
    // a second, all of them in flight at once).
    let shipped = std::fs::read_to_string(repo_root().join("config/mariadb.toml")).unwrap();
    let config = env.dir.path().join("mariadb-small-groups.toml");
    let small = shipped
        .replace("batch = 1024\n", "batch = 32\n")
        .replace("group_commit = 512\n", "group_commit = 8\n")
        .replace("concurrency = 16\n", "concurrency = 2\n");
    assert!(
        small.contains("group_commit = 8") && small.contains("concurrency = 2"),
        "{small}"
    );
    std::fs::write(&config, small).unwrap();
    let start = |log: &std::path::Path| {
        Command::new(timeoutd_bin())
            .args(["run", "--config"])
            .arg(&config)
            .env("TIMEOUTD_MYSQL_URL", &env.url)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap()
    };
    let closed = || async {
        env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "CLOSED")
            .await
    };
    let first_log = env.dir.path().join("first.log");
    let mut first = start(&first_log);
    let started = std::time::Instant::now();
    while closed().await == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no close at all"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = Command::new("kill")
        .args(["-TERM", &first.id().to_string()])
        .status();
    let term = std::time::Instant::now();
    let exit = first.wait().unwrap();
    let stop_s = term.elapsed().as_secs_f64();
    let log = std::fs::read_to_string(&first_log).unwrap();
    assert!(
        exit.success() && stop_s <= 5.0,
        "exit {exit:?} after {stop_s:.1} s:\n{log}"
    );
    let closed_by_first = closed().await;
    assert!(
        (closed_by_first as usize) < ORDERS,
        "the burst was over before SIGTERM ({closed_by_first} closed): not a mid-burst stop"
    );
    let second_log = env.dir.path().join("second.log");
    let mut second = start(&second_log);
    let started = std::time::Instant::now();
    while (closed().await as usize) < ORDERS {
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "the second daemon did not finish"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = Command::new("kill")
        .args(["-TERM", &second.id().to_string()])
        .status();
    assert!(second.wait().unwrap().success());
    // Exactly once: one 'closed' decision per order, restore-stock rows = 2 lines per order,
    // stock back to where it started.
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM decision_log WHERE outcome = ?",
            "closed"
        )
        .await,
        ORDERS as i64
    );
    assert_eq!(
        env.int(
            "SELECT COUNT(DISTINCT order_id) FROM decision_log WHERE outcome = ?",
            "closed"
        )
        .await,
        ORDERS as i64
    );
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM effect_ledger WHERE kind = ?",
            "restore-stock"
        )
        .await,
        2 * ORDERS as i64
    );
    assert_eq!(env.stock("sku-a").await, 10 * ORDERS as i64);
    assert_eq!(env.stock("sku-b").await, 10 * ORDERS as i64);
    eprintln!("SIGTERM after {closed_by_first} of {ORDERS} closes; stopped in {stop_s:.2} s");
    env.cleanup().await;
}

/// `timeoutd bench` on the embedded default: a small burst through the real daemon path, its
/// baseline, and an audit that passes, read from its JSON line; every order closed by the
/// outbox, none before the deadline.
#[test]
fn bench_runs_a_burst_against_its_baseline_and_audits_it() {
    let data = tempfile::tempdir().unwrap();
    let out = Command::new(timeoutd_bin())
        .args(["bench", "--orders", "300", "--lead", "1s", "--config"])
        .arg(repo_root().join("config/timeoutd.toml"))
        .env("TIMEOUTD_DATA_DIR", data.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(json["backend"], "sqlite");
    assert_eq!(json["orders"], 300);
    assert!(
        json["audit"]["problems"].as_array().unwrap().is_empty(),
        "{json}"
    );
    assert!(json["closes_per_s"].as_f64().unwrap() > 0.0);
    assert!(json["baseline_closes_per_s"].as_f64().unwrap() > 0.0);
    assert!(json["set_based_closes_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(json["set_based_run"]["closes"], 300);
    assert!(stdout.contains("set-based limit"), "{stdout}");
    assert!(
        json["lateness_ms"]["min"].as_i64().unwrap() >= 0,
        "closed before the deadline: {json}"
    );
    assert_eq!(json["closed_by"], serde_json::json!([["outbox", 300]]));
    assert!(stdout.contains("audit               ok"), "{stdout}");
}

/// F1 at scale, audited by the test itself rather than by the bench: `timeoutd bench` on
/// MariaDB puts 10,000 orders (lines over 8 SKUs, coupons, flash-sale activities) at one
/// deadline and closes them through the daemon; then the bench's database (`timeoutd_bench`,
/// kept after the run) is read here. Every order closed once by its outbox row, none before its
/// deadline, one decision each, every stock unit and coupon back, each ledger effect under one
/// key, no outbox row left open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_thousand_order_burst_on_mariadb_closes_each_order_once_by_its_own_audit() {
    const N: i64 = 10_000;
    crate::support::stdout_of_success(
        tokio::process::Command::new(timeoutd_bin())
            .args([
                "bench",
                "--orders",
                &N.to_string(),
                "--skus",
                "8",
                "--config",
            ])
            .arg(repo_root().join("config/mariadb.toml"))
            .env("TIMEOUTD_MYSQL_URL", crate::support::mysql_server_url()),
    )
    .await;
    let server = crate::support::mysql_server_url();
    let url = format!("{}/timeoutd_bench", &server[..server.rfind('/').unwrap()]);
    let db = timeoutd::db::Db::connect(&url, 2).await.unwrap();
    let int = |sql: &'static str| {
        let db = db.clone();
        async move {
            let row = db.backend().query(sql).fetch_one(db.pool()).await.unwrap();
            sqlx::Row::try_get::<i64, _>(&row, 0).unwrap()
        }
    };
    // The daemon's orders are `d-…`; the baselines' `b-…` and `s-…` were closed by the client
    // loop and by the set-based groups.
    assert_eq!(
        int("SELECT COUNT(*) FROM orders WHERE id LIKE 'd-%' AND status = 'CLOSED'").await,
        N
    );
    assert_eq!(
        int("SELECT COUNT(*) FROM orders WHERE id LIKE 's-%' AND closed_by = 'bench-set-based'")
            .await,
        N
    );
    assert_eq!(
        int("SELECT COUNT(*) FROM orders WHERE status <> 'CLOSED'").await,
        0
    );
    assert_eq!(
        int("SELECT COUNT(*) FROM orders WHERE id LIKE 'd-%' AND (closed_at_ms < deadline_ms OR closed_by <> 'outbox')").await,
        0,
        "none before its deadline, each by its outbox row"
    );
    assert_eq!(
        int("SELECT COUNT(*) FROM decision_log WHERE order_id LIKE 'd-%' AND outcome = 'closed'")
            .await,
        N
    );
    assert_eq!(
        int("SELECT COUNT(DISTINCT order_id) FROM decision_log WHERE order_id LIKE 'd-%'").await,
        N
    );
    assert_eq!(
        int("SELECT CAST(SUM(available) AS SIGNED) FROM sku_stock").await,
        8 * 10_000_000,
        "every unit every order locked is back, once"
    );
    assert_eq!(
        int("SELECT COUNT(*) FROM coupons WHERE status <> 'AVAILABLE'").await,
        0
    );
    assert_eq!(
        int("SELECT COUNT(*) FROM effect_ledger").await,
        int("SELECT COUNT(DISTINCT idempotency_key) FROM effect_ledger").await,
        "no effect under two keys"
    );
    assert_eq!(
        int("SELECT COUNT(*) FROM effect_ledger WHERE order_id LIKE 'd-%' AND kind = 'restore-stock'").await,
        int("SELECT COUNT(*) FROM order_items WHERE order_id LIKE 'd-%'").await,
        "one stock effect per line"
    );
    assert_eq!(
        int("SELECT COUNT(*) FROM order_timeout_msg WHERE status <> 'PROCESSED'").await,
        0
    );
    db.pool().close().await;
}

/// A small host (`ulimit -v` 4 GB, below the pooling allocator's reservation of about 2 TiB):
/// the demo still runs, on the on-demand allocator, says so once at start, and closes every
/// lapsed order exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_address_space_falls_back_to_the_on_demand_allocator() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("demo");
    let out = tokio::process::Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 4000000 && exec \"$0\" demo --orders 40 --json --data-dir \"$1\"")
        .arg(timeoutd_bin())
        .arg(&data)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(
        stderr.matches("allocated on demand").count(),
        1,
        "one warning naming the fallback: {stderr}"
    );
    assert!(
        stderr.contains("Cannot allocate memory") || stderr.contains("mmap"),
        "{stderr}"
    );
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(report["open"], 0, "{report}");
    assert_eq!(report["closed_before_deadline"], 0, "{report}");
    assert!(report["closed"].as_i64().unwrap() > 0, "{report}");
}

/// `timeoutd doctor` on a migrated MariaDB database: what is right says ok, and each thing an
/// operator got wrong — Redis on a port where nothing listens, a payment provider that cannot
/// be reached — is an error with how to fix it, and the exit status is 1. Fixed, it exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_names_what_is_wrong_and_how_to_fix_it() {
    doctor_names_what_is_wrong(Backend::MySql).await;
}

/// The same on PostgreSQL: its server version, schema, write probe and encoding checked, the
/// same two errors named with their fixes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_names_what_is_wrong_on_postgresql() {
    doctor_names_what_is_wrong(Backend::Postgres).await;
}

async fn doctor_names_what_is_wrong(backend: Backend) {
    let env = Env::new(backend).await;
    let receiver = crate::fakes::Receiver::start().await;
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let write = |name: &str, extra: &str| {
        let file = env.dir.path().join(name);
        std::fs::write(
            &file,
            format!(
                "[database]\nurl = \"{}\"\n{extra}\n[notify.channels.sms]\nkind = \"webhook\"\nurl = \"{}\"\n\
                 [merchants.acme]\nplugin = \"builtin:single-phase\"\n",
                env.url, receiver.url
            ),
        )
        .unwrap();
        file
    };
    let broken = write(
        "broken.toml",
        &format!(
            "[redis]\nurl = \"redis://127.0.0.1:{closed_port}\"\n[payment]\nbase_url = \"http://127.0.0.1:{closed_port}\"\n"
        ),
    );
    let run = crate::support::doctor;
    let (code, report) = run(broken).await;
    assert_eq!(code, Some(1), "{report}");
    let server = crate::support::server_url(backend);
    let database = format!("ok    database: {}/", server.rsplit_once('/').unwrap().0);
    let schema = format!(
        "ok    database.schema: version {}",
        timeoutd::db::latest_schema_version(backend)
    );
    for line in [
        database.as_str(),
        "(SKIP LOCKED: yes)",
        schema.as_str(),
        "ok    database.privileges",
        match backend {
            Backend::MySql => "ok    database.charset: utf8mb4",
            Backend::Postgres | Backend::Sqlite => "ok    database.charset: UTF-8",
        },
        "ok    clock",
        "ok    merchants.acme: plugin builtin:single-phase loads, timeout:policy@0.1.0 accepted",
        "ok    notify.channels.sms.url",
        "error redis",
        "error payment.base_url",
        "2 error(s)",
    ] {
        assert!(report.contains(line), "missing `{line}` in:\n{report}");
    }
    assert_eq!(
        report.matches("fix: ").count(),
        2,
        "each error says how to fix it:\n{report}"
    );
    let fixed = write("fixed.toml", "[redis]\nurl = \"redis://127.0.0.1:6379\"\n");
    let (code, report) = run(fixed).await;
    assert_eq!(code, Some(0), "{report}");
    assert!(report.contains("ok    redis: writable"), "{report}");
    assert!(report.contains("0 error(s)"), "{report}");
    env.cleanup().await;
}

/// SIGTERM stops a daemon whose database has been dropped under it (once, by hand, such a
/// daemon ignored SIGTERM for 6 s and needed SIGKILL): it exits within 5 s, inside the systemd
/// unit's `TimeoutStopSec`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_a_daemon_whose_database_is_gone() {
    let env = Env::new(Backend::MySql).await;
    let database = env.url.rsplit('/').next().unwrap().to_string();
    let log = env.dir.path().join("timeoutd.log");
    let mut daemon = crate::support::started_daemon(
        &repo_root().join("config/mariadb.toml"),
        &[
            ("TIMEOUTD_MYSQL_URL", env.url.as_str()),
            ("TIMEOUTD_SWEEP_INTERVAL", "500ms"),
        ],
        &log,
    )
    .await;
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let admin = timeoutd::db::Db::connect(&crate::support::server_url(Backend::MySql), 1)
        .await
        .unwrap();
    let exec = |sql: String| {
        let admin = admin.clone();
        async move {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(admin.pool())
                .await
                .unwrap();
        }
    };
    exec(format!("DROP DATABASE {database}")).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let term = std::time::Instant::now();
    let _ = Command::new("kill")
        .args(["-TERM", &daemon.id().unwrap().to_string()])
        .status();
    let exit = tokio::time::timeout(Duration::from_secs(5), daemon.wait()).await;
    let waited = term.elapsed();
    // Put the database back for the cleanup to drop.
    exec(format!("CREATE DATABASE {database}")).await;
    admin.close().await;
    let exit = exit
        .unwrap_or_else(|_| panic!("still running 5 s after SIGTERM; log:\n{}", read()))
        .unwrap();
    assert!(
        exit.success(),
        "exit {exit:?} after {waited:?}; log:\n{}",
        read()
    );
    assert!(read().contains("timeoutd stopped"), "{}", read());
    env.cleanup().await;
}

/// `[tracing]`: the daemon exports its spans over OTLP/HTTP to a collector (here a recording
/// HTTP server inside the test), and an operator's request carrying a W3C `traceparent`
/// continues that trace: the request's span and the trigger's span under it reach the
/// collector with the caller's trace id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_otlp_collector_in_the_callers_trace() {
    let collector = crate::fakes::Collector::start().await;
    let env = Env::new(Backend::Sqlite).await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    let past = env.db.now_ms().await.unwrap() - 60_000;
    env.create(&crate::support::order("traced", "acme", past))
        .await;
    env.db
        .backend()
        .query("DELETE FROM order_timeout_msg WHERE order_id = ?")
        .bind("traced")
        .execute(env.db.pool())
        .await
        .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let file = env.dir.path().join("traced.toml");
    std::fs::write(
        &file,
        format!(
            "[database]\nurl = \"{}\"\n[sweep]\nenabled = false\n[admin]\nlisten = \"127.0.0.1:{port}\"\n\
             [admin.tokens]\nops = \"trace-token-0123456789\"\n[tracing]\notlp_endpoint = \"{}\"\n\
             [merchants.acme]\nplugin = \"builtin:single-phase\"\n",
            env.url, collector.url
        ),
    )
    .unwrap();
    let log = env.dir.path().join("timeoutd.log");
    let mut daemon = crate::support::started_daemon(&file, &[], &log).await;
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let closed = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/orders/traced/close"))
        .bearer_auth("trace-token-0123456789")
        .header("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(closed.status(), 200, "{}", closed.text().await.unwrap());
    assert_eq!(env.status("traced").await, "CLOSED");
    let exit = crate::support::sigterm(&mut daemon, Duration::from_secs(10)).await;
    assert!(exit.success(), "{exit:?}\n{}", read());
    let spans = collector.spans(trace_id);
    let caller = "00f067aa0ba902b7";
    // The request's span is a child of the caller's (in the caller's trace, not a new root),
    // and the trigger's span descends from it.
    let request = spans
        .iter()
        .find(|s| s.parent_span_id == caller)
        .unwrap_or_else(|| {
            panic!(
                "no exported span is a child of the caller's: {spans:#?}\nlog:\n{}",
                read()
            )
        });
    let trigger = spans
        .iter()
        .find(|s| s.name.contains("trigger"))
        .unwrap_or_else(|| panic!("no trigger span in the caller's trace: {spans:#?}"));
    let mut at = trigger;
    while at.span_id != request.span_id {
        at = spans
            .iter()
            .find(|s| s.span_id == at.parent_span_id)
            .unwrap_or_else(|| {
                panic!(
                    "`{}` does not descend from the request's span: {spans:#?}",
                    trigger.name
                )
            });
    }
    env.cleanup().await;
}

/// `--log-format json`: every line the daemon writes on stderr, from start-up through a close
/// to its stop, is one JSON object with a timestamp, a level, a target and a message — a log
/// shipper parses each line, and none is plain text.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_json_log_format_writes_every_line_as_one_json_object() {
    let env = Env::new(Backend::Sqlite).await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    env.create(&crate::support::order("logged", "acme", crate::support::T0))
        .await;
    let file = env.single_phase_config_file("json.toml");
    let log = env.dir.path().join("timeoutd.log");
    let mut daemon =
        crate::support::started_daemon_with(&["--log-format", "json"], &file, &[], &log).await;
    crate::support::eventually(Duration::from_secs(30), "the due order closes", || async {
        env.status("logged").await == "CLOSED"
    })
    .await;
    let exit = crate::support::sigterm(&mut daemon, Duration::from_secs(10)).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(exit.success(), "{exit:?}\n{text}");
    let mut messages = Vec::new();
    for (n, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("line {}: not JSON ({e}): {line}", n + 1));
        for field in ["timestamp", "level", "target"] {
            assert!(v[field].is_string(), "line {}: no `{field}`: {line}", n + 1);
        }
        let message = v["fields"]["message"].as_str();
        assert!(
            message.is_some(),
            "line {}: no fields.message: {line}",
            n + 1
        );
        messages.push(message.unwrap().to_string());
    }
    assert!(
        messages.iter().any(|m| m.contains("timeoutd started")),
        "{messages:#?}"
    );
    assert!(
        messages.len() >= 2,
        "start-up and stop at least: {messages:#?}"
    );
    env.cleanup().await;
}

/// A burst is no log flood (#48): with `database.slow_statement = "1ms"` nearly every
/// statement of a 2,000-order burst counts as slow — sqlx wrote a WARN line for each, and the
/// daemon an INFO line per close (2,024 lines) — yet the daemon's log stays a few lines: a
/// summary names how many statements were slow and the slowest, another how many orders
/// closed, and `/metrics` has each slow statement in
/// `timeoutd_slow_statement_seconds{statement}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_slow_statements_is_summarised_not_a_log_flood() {
    let env = Env::new(Backend::Sqlite).await;
    env.stock_up(&[("sku-a", 10_000), ("sku-b", 10_000)]).await;
    let port = crate::support::free_port();
    let file = env.dir.path().join("slow.toml");
    std::fs::write(
        &file,
        format!(
            "[database]\nurl = \"{}\"\nslow_statement = \"1ms\"\n[admin]\nlisten = \"127.0.0.1:{port}\"\n\
             [admin.tokens]\nops = \"slow-token-0123456789\"\n\
             [merchants.acme]\nplugin = \"builtin:single-phase\"\n",
            env.url
        ),
    )
    .unwrap();
    let orders = 2_000;
    let now = env.db.now_ms().await.unwrap();
    let mut tx = env.db.begin().await.unwrap();
    for i in 0..orders {
        timeoutd::db::orders::create(
            &mut tx,
            &crate::support::order(&format!("s{i}"), "acme", now + 3_000),
        )
        .await
        .unwrap();
    }
    tx.commit().await.unwrap();
    let log = env.dir.path().join("timeoutd.log");
    let mut daemon = crate::support::started_daemon(&file, &[], &log).await;
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    crate::support::eventually(Duration::from_secs(60), "the burst closes", || async {
        env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "CLOSED")
            .await
            == orders
    })
    .await;
    let page = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let exit = crate::support::sigterm(&mut daemon, Duration::from_secs(10)).await;
    assert!(exit.success(), "{exit:?}\n{}", read());
    let text = read();
    let counted: f64 = page
        .lines()
        .filter(|l| l.starts_with("timeoutd_slow_statement_seconds_count{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(counted >= 10.0, "slow statements were not counted:\n{page}");
    assert!(
        !text.contains("slow statement: execution time exceeded"),
        "sqlx's own line per statement reached the log:\n{text}"
    );
    let summaries = text
        .lines()
        .filter(|l| l.contains("slow statements (over database.slow_statement)"))
        .count();
    assert!(summaries >= 1, "no summary line:\n{text}");
    // The closes are summed up too (the `log` notice channel is a sink, not diagnostics: its
    // lines are the notices themselves).
    let closed: u64 = text
        .lines()
        .filter(|l| l.contains("orders closed since the last summary"))
        .filter_map(|l| {
            l.split("closed=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert_eq!(
        closed, orders as u64,
        "the summaries count every close:\n{text}"
    );
    let lines = text
        .lines()
        .filter(|l| !l.contains("timeoutd::notice"))
        .count();
    assert!(
        lines <= 30,
        "{lines} log lines for a {orders}-order burst:\n{text}"
    );
    env.cleanup().await;
}

/// F10, deterministically: a daemon is SIGKILLed after its close committed and its notice
/// reached the webhook, before the answer came back and the ledger row was marked DONE (the
/// receiver records the request and never answers it). The next daemon finds the row PENDING,
/// takes it once its lease lapses and sends the notice again under the same idempotency key:
/// two deliveries, one key, the row DONE, the order closed once and its stock given back once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_between_an_effects_delivery_and_its_ledger_row_resends_it_under_the_same_key() {
    let env = Env::new(Backend::MySql).await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    env.create(&crate::support::order(
        "killed",
        "acme",
        env.db.now_ms().await.unwrap() - 1_000,
    ))
    .await;
    let receiver = crate::fakes::Receiver::start_hanging_first().await;
    let file = env.dir.path().join("f10.toml");
    std::fs::write(
        &file,
        format!(
            "[database]\nurl = \"{}\"\n[effects]\nlease = \"1s\"\n\
             [notify.channels.hook]\nkind = \"webhook\"\nurl = \"{}\"\ntimeout = \"30s\"\n\
             [merchants.acme]\nplugin = \"builtin:single-phase\"\n[merchants.acme.settings]\nchannel = \"hook\"\n",
            env.url, receiver.url
        ),
    )
    .unwrap();
    let log = env.dir.path().join("timeoutd.log");
    let mut first = crate::support::started_daemon(&file, &[], &log).await;
    crate::support::eventually(
        Duration::from_secs(30),
        "the notice reaches the webhook",
        || async { !receiver.received.lock().unwrap().is_empty() },
    )
    .await;
    first.kill().await.unwrap();
    first.wait().await.unwrap();
    let notice = "SELECT status FROM effect_ledger WHERE kind = 'notify' AND order_id = ?";
    assert_eq!(
        env.status("killed").await,
        "CLOSED",
        "the close had committed"
    );
    assert_eq!(
        env.text(notice, "killed").await,
        "PENDING",
        "killed before the row was settled"
    );
    let mut second = crate::support::started_daemon(&file, &[], &log).await;
    crate::support::eventually(
        Duration::from_secs(30),
        "the next daemon settles the notice",
        || async { env.text(notice, "killed").await == "DONE" },
    )
    .await;
    let exit = crate::support::sigterm(&mut second, Duration::from_secs(10)).await;
    assert!(exit.success(), "{exit:?}");
    let got = receiver.received.lock().unwrap().clone();
    assert_eq!(got.len(), 2, "delivered again after the kill: {got:?}");
    let key = env
        .text(
            "SELECT idempotency_key FROM effect_ledger WHERE kind = 'notify' AND order_id = ?",
            "killed",
        )
        .await;
    assert!(
        got.iter().all(|(k, _)| *k == key),
        "both under the ledger row's key {key}: {got:?}"
    );
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM decision_log WHERE order_id = ?",
            "killed"
        )
        .await,
        1
    );
    assert_eq!(
        (env.stock("sku-a").await, env.stock("sku-b").await),
        (10, 10)
    );
    env.cleanup().await;
}
