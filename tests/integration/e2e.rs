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
    assert!(
        String::from_utf8_lossy(&good.stdout)
            .contains("merchant flashy: plugin builtin:two-phase (timeout:policy@0.1.0")
    );
}
