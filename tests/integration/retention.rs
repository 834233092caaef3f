//! Retention (#17, item 7), on every backend: settled rows older than their table's age are
//! deleted in bounded batches by the one daemon holding the retention lease; live rows, and
//! every row of an order still PENDING, are never touched.

use timeoutd::clock::Clock;

use crate::support::{MerchantSpec, T0, each_backend, order};

const SHOPS: &[MerchantSpec<'static>] = &[("acme", "builtin:single-phase", &[])];
const DAY: i64 = 86_400_000;

each_backend! {
    async fn settled_old_rows_are_deleted_and_live_ones_kept(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        for id in ["old", "young", "reopened"] {
            env.create(&order(id, "acme", T0)).await;
        }
        let config = env.config(SHOPS, "[retention]\nbatch = 1\npause = \"1ms\"\n");
        let (clock, _) = Clock::manual(T0);
        let d = env.dispatcher(&config, clock.clone()).await;
        assert_eq!(env.process(&d, T0).await.len(), 3);
        let sql = |s: &'static str| env.db.backend().query(s);
        // Age the rows: `old` and `reopened` by 100 days, `young` by one; `reopened` is PENDING
        // again (an order the shop reopened), so its rows stay whatever their age.
        for (id, age) in [("old", 100 * DAY), ("reopened", 100 * DAY), ("young", DAY)] {
            sql("UPDATE order_timeout_msg SET processed_at_ms = ? WHERE order_id = ?").bind(T0 - age).bind(id).execute(env.db.pool()).await.unwrap();
            sql("UPDATE effect_ledger SET updated_at_ms = ? WHERE order_id = ?").bind(T0 - age).bind(id).execute(env.db.pool()).await.unwrap();
            sql("UPDATE decision_log SET decided_at_ms = ? WHERE order_id = ?").bind(T0 - age).bind(id).execute(env.db.pool()).await.unwrap();
        }
        sql("UPDATE orders SET status = 'PENDING', closed_at_ms = NULL WHERE id = ?").bind("reopened").execute(env.db.pool()).await.unwrap();
        // `old`'s close-payment failed (an operator's to look at): kept. Its notice is DONE.
        sql("UPDATE effect_ledger SET status = 'FAILED' WHERE order_id = ? AND kind = 'close-payment'").bind("old").execute(env.db.pool()).await.unwrap();
        for (status, age) in [("REDRIVEN", 100 * DAY), ("OPEN", 100 * DAY), ("DISMISSED", DAY)] {
            sql("INSERT INTO dead_letter (source, order_id, reason, payload, attempts, status, created_at_ms) VALUES ('outbox', NULL, 'r', '{}', 1, ?, ?)")
                .bind(status).bind(T0 - age).execute(env.db.pool()).await.unwrap();
        }
        for age in [100 * DAY, DAY] {
            sql("INSERT INTO admin_audit (at_ms, actor, method, path, status) VALUES (?, 'ops', 'GET', '/v1/backlog', 200)")
                .bind(T0 - age).execute(env.db.pool()).await.unwrap();
        }
        let count = |table: &'static str, id: &'static str| {
            let q = match table {
                "order_timeout_msg" => "SELECT COUNT(*) FROM order_timeout_msg WHERE order_id = ?",
                "effect_ledger" => "SELECT COUNT(*) FROM effect_ledger WHERE order_id = ?",
                _ => "SELECT COUNT(*) FROM decision_log WHERE order_id = ?",
            };
            env.int(q, id)
        };
        let before = (count("effect_ledger", "old").await, count("effect_ledger", "young").await, count("effect_ledger", "reopened").await);
        assert!(before.0 >= 2, "old has a notice and a close-payment: {before:?}");

        // Another daemon holds the lease: this one does nothing.
        let db = &env.db;
        assert!(timeoutd::db::maintenance_lease::take_lease(db, "retention", "other-daemon", T0, T0 + 60_000).await.unwrap());
        assert_eq!(timeoutd::retention::pass(db, &clock, &config.retention, "me", None).await.unwrap(), None);
        assert_eq!(count("order_timeout_msg", "old").await, 1, "nothing deleted without the lease");
        timeoutd::db::maintenance_lease::release_lease(db, "retention", "other-daemon").await.unwrap();

        let deleted = timeoutd::retention::pass(db, &clock, &config.retention, "me", None).await.unwrap().expect("the lease was free");
        let of = |t: &str| deleted.iter().find(|(table, _)| *table == t).unwrap().1;
        assert_eq!(of("order_timeout_msg"), 1);
        assert_eq!(of("effect_ledger"), before.0 as u64 - 1, "old's DONE rows; its FAILED one kept");
        assert_eq!(of("decision_log"), 1);
        assert_eq!(of("dead_letter"), 1, "the old REDRIVEN one; OPEN kept whatever its age");
        assert_eq!(of("admin_audit"), 1);
        assert_eq!(count("order_timeout_msg", "old").await, 0);
        assert_eq!(count("decision_log", "old").await, 0);
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE status = 'FAILED' AND order_id = ?", "old").await, 1);
        for id in ["young", "reopened"] {
            assert_eq!(count("order_timeout_msg", id).await, 1, "{id}'s row kept");
            assert_eq!(count("decision_log", id).await, 1, "{id}'s decision kept");
        }
        assert_eq!((count("effect_ledger", "young").await, count("effect_ledger", "reopened").await), (before.1, before.2));
        assert_eq!(env.int("SELECT COUNT(*) FROM dead_letter WHERE status = ?", "OPEN").await, 1);
        assert_eq!(env.int("SELECT COUNT(*) FROM dead_letter WHERE status = ?", "DISMISSED").await, 1);
        assert_eq!(env.int("SELECT COUNT(*) FROM admin_audit WHERE actor = ?", "ops").await, 1);
        assert_eq!(env.status("old").await, "CLOSED", "orders themselves are the shop's: never deleted");
        // A second pass finds nothing more.
        let again = timeoutd::retention::pass(db, &clock, &config.retention, "me", None).await.unwrap().unwrap();
        assert!(again.iter().all(|(_, n)| *n == 0), "{again:?}");
    }
}

each_backend! {
    /// `retention.batch` bounds each statement: a pass told to stop deletes one batch per table
    /// and no more (25 deletable dead letters, batch 10: 10 gone, 15 left). The daemon's own
    /// retention loop (`[retention] interval = "1s"`) then deletes the rest, and keeps an OPEN
    /// dead letter of the same age.
    async fn each_statement_deletes_one_batch_and_the_daemons_own_loop_the_rest(env) {
        let now = env.db.now_ms().await.unwrap();
        let insert = "INSERT INTO dead_letter (source, order_id, reason, payload, attempts, status, created_at_ms) \
                      VALUES ('outbox', NULL, 'r', '{}', 1, ?, ?)";
        for k in 0..26 {
            let status = if k == 25 { "OPEN" } else { "REDRIVEN" };
            env.db.backend().query(insert).bind(status).bind(now - 100 * DAY).execute(env.db.pool()).await.unwrap();
        }
        let config = env.config(
            SHOPS,
            "[retention]\nbatch = 10\npause = \"1ms\"\ninterval = \"1s\"\n[outbox]\nenabled = false\n[sweep]\nenabled = false\n",
        );
        let (stop, stopping) = tokio::sync::watch::channel(true);
        let deleted = timeoutd::retention::pass(&env.db, &Clock::Database, &config.retention, "me", Some(&stopping))
            .await
            .unwrap()
            .expect("the lease was free");
        drop(stop);
        let of = |t: &str| deleted.iter().find(|(table, _)| *table == t).unwrap().1;
        assert_eq!(of("dead_letter"), 10, "one statement deletes one batch");
        let left = "SELECT COUNT(*) FROM dead_letter WHERE status = ?";
        assert_eq!(env.int(left, "REDRIVEN").await, 15);

        let daemon = timeoutd::daemon::Daemon::start(&config, Clock::Database).await.unwrap();
        crate::support::eventually(std::time::Duration::from_secs(20), "the daemon's retention pass", || async {
            env.int(left, "REDRIVEN").await == 0
        })
        .await;
        daemon.stop().await;
        assert_eq!(env.int(left, "OPEN").await, 1, "an OPEN dead letter is kept whatever its age");
    }
}
