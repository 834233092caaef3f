//! Trigger → decision → transaction, asserted on rows, on SQLite and on MariaDB alike.

use std::time::Duration;

use timeoutd::clock::Clock;
use timeoutd::dispatch::Outcome;
use timeoutd::sources::sweep;

use crate::support::{MerchantSpec, T0, each_backend, order};

const SINGLE: &[MerchantSpec<'static>] = &[("acme", "builtin:single-phase", &[])];

each_backend! {
    async fn paid_order_is_never_closed(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let o = order("o-paid", "acme", T0);
        env.create(&o).await;
        assert!(env.pay("o-paid", T0 - 1).await);
        let (clock, _) = Clock::manual(T0 + 60_000);
        let d = env.dispatcher(&env.config(SINGLE, ""), clock).await;
        let outcomes = env.process(&d, T0 + 60_000).await;
        assert!(matches!(&outcomes[..], [Outcome::NoOp { .. }]), "{outcomes:?}");
        assert_eq!(env.status("o-paid").await, "PAID");
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (8, 9));
        assert_eq!(env.coupon("cpn-o-paid").await, "USED");
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE order_id = ?", "o-paid").await, 0);
        assert_eq!(env.text("SELECT status FROM order_timeout_msg WHERE order_id = ?", "o-paid").await, "PROCESSED");
    }
}

each_backend! {
    async fn unpaid_order_closes_once_at_or_after_its_deadline(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("o1", "acme", T0)).await;
        assert_eq!((env.stock("sku-a").await, env.coupon("cpn-o1").await.as_str()), (8, "LOCKED"));
        let (clock, now) = Clock::manual(T0);
        let d = env.dispatcher(&env.config(SINGLE, ""), clock).await;
        let outcomes = env.process(&d, T0).await;
        assert_eq!(outcomes, vec![Outcome::Closed { lateness_ms: 0 }]);
        assert_eq!(env.status("o1").await, "CLOSED");
        assert!(env.int("SELECT closed_at_ms FROM orders WHERE id = ?", "o1").await >= T0);
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (10, 10));
        assert_eq!(env.coupon("cpn-o1").await, "AVAILABLE");
        // restore ×2, coupon, payment, notice — each one ledger row with its idempotency key.
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE order_id = ?", "o1").await, 5);
        assert_eq!(env.text("SELECT status FROM effect_ledger WHERE kind = 'notify' AND order_id = ?", "o1").await, "DONE");
        assert_eq!(env.text("SELECT status FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?", "o1").await, "PENDING");
        assert_eq!(env.text("SELECT idempotency_key FROM effect_ledger WHERE effect_index = 0 AND order_id = ?", "o1").await, "acme/o1/0/0");
        // What the close applied is DONE with nothing to note.
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE kind IN ('restore-stock', 'release-coupon') AND status = 'DONE' AND last_error IS NULL AND order_id = ?", "o1").await, 3);
        // The same trigger again (a redelivery) is a no-op.
        now.store(T0 + 5_000, std::sync::atomic::Ordering::SeqCst);
        env.db.backend().query("UPDATE order_timeout_msg SET status = 'PENDING' WHERE order_id = 'o1'").execute(env.db.pool()).await.unwrap();
        let again = env.process(&d, T0 + 5_000).await;
        assert!(matches!(&again[..], [Outcome::NoOp { .. }]), "{again:?}");
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (10, 10));
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE order_id = ?", "o1").await, 5);
    }
}

each_backend! {
    /// F9: the same trigger handled by two daemons at once.
    async fn duplicate_trigger_processed_concurrently_restores_stock_once(env) {
        env.stock_up(&[("sku-a", 1_000), ("sku-b", 1_000)]).await;
        let orders = 20;
        for n in 0..orders {
            env.create(&order(&format!("dup-{n}"), "acme", T0)).await;
        }
        let config = env.config(SINGLE, "");
        let (clock, _) = Clock::manual(T0 + 1);
        let (a, b) = (env.dispatcher(&config, clock.clone()).await, env.dispatcher(&config, clock).await);
        let triggers = env.claim(T0 + 1).await;
        assert_eq!(triggers.len(), orders);
        let mut tasks = Vec::new();
        for t in triggers {
            for d in [a.clone(), b.clone()] {
                let t = t.clone();
                tasks.push(tokio::spawn(async move { d.handle(&t).await }));
            }
        }
        let mut closed = 0;
        for task in tasks {
            match task.await.unwrap() {
                Outcome::Closed { .. } => closed += 1,
                Outcome::NoOp { .. } => {}
                other => panic!("unexpected outcome {other:?}"),
            }
        }
        assert_eq!(closed, orders);
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (1_000, 1_000));
        assert_eq!(env.int("SELECT COUNT(*) FROM coupons WHERE status = ?", "AVAILABLE").await, orders as i64);
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE kind = ?", "restore-stock").await, 2 * orders as i64);
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE kind = ? AND status = 'DONE'", "notify").await, orders as i64);
        assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE outcome = ?", "closed").await, orders as i64);
    }
}

each_backend! {
    /// F12: a payment commits between the host's read and its compare-and-set.
    async fn payment_committed_between_read_and_close_leaves_no_effect(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        // A merchant of this run alone, so its decision counter counts only this order.
        let merchant = format!("f12-{:08x}", fastrand::u32(..));
        env.create(&order("race", &merchant, T0)).await;
        let (clock, _) = Clock::manual(T0 + 10);
        let d = env.dispatcher(&env.config(&[(merchant.as_str(), "builtin:single-phase", &[])], ""), clock).await;
        let trigger = env.claim(T0 + 10).await.remove(0);
        let decided = format!("timeoutd_decisions_total{{merchant=\"{merchant}\",decision=\"cancel\"}}");
        let recorder = timeoutd::events::metrics_handle();
        // The payment is under way (row locked, not committed) while the host reads and decides.
        let mut payment = env.db.begin().await.unwrap();
        env.db.backend().query("UPDATE orders SET status = 'PAID', paid_at_ms = ? WHERE id = 'race' AND status = 'PENDING'")
            .bind(T0 + 5)
            .execute(&mut *payment)
            .await
            .unwrap();
        let handling = tokio::spawn(async move { d.handle(&trigger).await });
        // The host has read the order (PENDING) and its plugin decided to cancel: commit the
        // payment now, before (or while it waits on the lock for) the compare-and-set.
        let started = std::time::Instant::now();
        while crate::support::sample(&recorder.render(), &decided).is_none() {
            assert!(started.elapsed() < Duration::from_secs(30), "the plugin never decided");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        payment.commit().await.unwrap();
        let outcome = handling.await.unwrap();
        assert!(matches!(outcome, Outcome::NoOp { .. }), "{outcome:?}");
        // The plugin did decide to cancel; the compare-and-set refused it.
        assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE decision = 'cancel' AND outcome = 'noop' AND order_id = ?", "race").await, 1);
        // Its detail says why nothing was applied (what `timeoutd plugin replay` and the order's
        // timeline show), and so does its outbox row.
        let detail: serde_json::Value = serde_json::from_str(&env.text("SELECT detail FROM decision_log WHERE order_id = ?", "race").await).unwrap();
        assert_eq!(detail["decision"], "cancel");
        assert!(detail["noop"].as_str().unwrap_or_default().contains("compare-and-set lost"), "{detail}");
        assert!(env.text("SELECT last_error FROM order_timeout_msg WHERE order_id = ?", "race").await.contains("compare-and-set lost"));
        assert_eq!(env.status("race").await, "PAID");
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (8, 9));
        assert_eq!(env.coupon("cpn-race").await, "LOCKED");
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE order_id = ?", "race").await, 0);
    }
}

each_backend! {
    /// F2: a trigger one second early is deferred to the deadline, then closes on time.
    async fn trigger_one_second_early_is_deferred(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("early", "acme", T0)).await;
        env.db.backend().query("UPDATE order_timeout_msg SET due_ms = ? WHERE order_id = 'early'")
            .bind(T0 - 1_000)
            .execute(env.db.pool())
            .await
            .unwrap();
        let (clock, now) = Clock::manual(T0 - 1_000);
        let d = env.dispatcher(&env.config(SINGLE, ""), clock).await;
        assert_eq!(env.process(&d, T0 - 1_000).await, vec![Outcome::Deferred { until_ms: T0 }]);
        assert_eq!(env.status("early").await, "PENDING");
        assert_eq!(env.int("SELECT due_ms FROM order_timeout_msg WHERE order_id = ? AND status = 'PENDING'", "early").await, T0);
        assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE order_id = ?", "early").await, 0);
        assert!(env.claim(T0 - 1).await.is_empty(), "not claimable before the deadline");
        now.store(T0, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(env.process(&d, T0).await, vec![Outcome::Closed { lateness_ms: 0 }]);
        assert_eq!(env.stock("sku-a").await, 10);
    }
}

each_backend! {
    /// F3: the order's outbox row never arrived; the sweep re-arms it and it closes once.
    async fn lost_outbox_row_is_caught_by_the_sweep(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("lost", "acme", T0)).await;
        env.create(&order("fresh", "acme", T0 + 60_000)).await;
        env.db.backend().query("DELETE FROM order_timeout_msg").execute(env.db.pool()).await.unwrap();
        let config = env.config(SINGLE, "[sweep]\ngrace = \"10s\"\n");
        let (clock, _) = Clock::manual(T0 + 5_000);
        assert_eq!(sweep::sweep_once(&env.db, &clock, &config.sweep).await.unwrap().rearmed, 0, "within grace");
        let (clock, _) = Clock::manual(T0 + 11_000);
        assert_eq!(sweep::sweep_once(&env.db, &clock, &config.sweep).await.unwrap().rearmed, 1);
        assert_eq!(sweep::sweep_once(&env.db, &clock, &config.sweep).await.unwrap().rearmed, 0, "a live re-armed row is not re-armed again");
        let d = env.dispatcher(&config, clock).await;
        assert_eq!(env.process(&d, T0 + 11_000).await, vec![Outcome::Closed { lateness_ms: 11_000 }]);
        assert_eq!(env.text("SELECT closed_by FROM orders WHERE id = ?", "lost").await, "sweep");
        assert_eq!(env.status("fresh").await, "PENDING");
        assert_eq!(env.stock("sku-a").await, 8, "only the lost order's 2 units came back");
    }
}

each_backend! {
    /// A sweep's batch is re-armed together (multi-row statements, one transaction), and each
    /// orphan still gets what it alone would: `lost` (no row) a row inserted at its deadline;
    /// `stuck-0` and `stuck-1` (SENT rows of phases 0 and 1, whose messages were lost) re-opened
    /// with their past due times; `leased` (a live lease) and `paid` (paid since it was found)
    /// left as they were.
    async fn a_sweep_batch_re_arms_each_orphan_as_it_alone_would_be(env) {
        use timeoutd::db::outbox::{self, Orphan};
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        for id in ["lost", "stuck-0", "stuck-1", "leased", "paid"] {
            env.create(&order(id, "acme", T0)).await;
        }
        let sql = |s: &'static str| env.db.backend().query(s);
        sql("DELETE FROM order_timeout_msg WHERE order_id = 'lost'").execute(env.db.pool()).await.unwrap();
        sql("UPDATE order_timeout_msg SET status = 'SENT', due_ms = ?, claim_token = 'm1', claim_until_ms = ? WHERE order_id IN ('stuck-0', 'stuck-1', 'paid')")
            .bind(T0 - 500).bind(T0 + 1_000).execute(env.db.pool()).await.unwrap();
        sql("UPDATE order_timeout_msg SET phase = 1 WHERE order_id = 'stuck-1'").execute(env.db.pool()).await.unwrap();
        sql("UPDATE order_timeout_msg SET claim_token = 'live', claim_until_ms = ? WHERE order_id = 'leased'")
            .bind(T0 + 60_000).execute(env.db.pool()).await.unwrap();
        assert!(env.pay("paid", T0 + 100).await);
        sql("UPDATE order_timeout_msg SET status = 'PROCESSED' WHERE order_id = 'paid'").execute(env.db.pool()).await.unwrap();
        let now = T0 + 20_000;
        let orphan = |id: &str, phase: u32| Orphan { order_id: id.to_string(), phase, deadline_ms: T0 };
        let batch = [orphan("lost", 0), orphan("stuck-0", 0), orphan("stuck-1", 1), orphan("leased", 0), orphan("paid", 0)];
        outbox::rearm(&env.db, &batch, now).await.unwrap();
        let row = |id: &'static str| async move {
            let r = env.db.backend()
                .query("SELECT status, source, due_ms, phase, COALESCE(claim_token, '-') FROM order_timeout_msg WHERE order_id = ?")
                .bind(id).fetch_all(env.db.pool()).await.unwrap();
            assert_eq!(r.len(), 1, "{id}: one row");
            use sqlx::Row;
            (r[0].get::<String, _>(0), r[0].get::<String, _>(1), r[0].get::<i64, _>(2), r[0].get::<i64, _>(3), r[0].get::<String, _>(4))
        };
        assert_eq!(row("lost").await, ("PENDING".into(), "sweep".into(), T0, 0, "-".into()));
        assert_eq!(row("stuck-0").await, ("PENDING".into(), "sweep".into(), T0 - 500, 0, "-".into()));
        assert_eq!(row("stuck-1").await, ("PENDING".into(), "sweep".into(), T0 - 500, 1, "-".into()));
        assert_eq!(row("leased").await.0, "PENDING");
        assert_eq!(row("leased").await.4, "live", "a live lease is left alone");
        assert_eq!(row("paid").await.0, "PROCESSED", "an order paid since it was found is left alone");
        // Each re-armed order closes once.
        let config = env.config(SINGLE, "");
        let (clock, _) = Clock::manual(now);
        let d = env.dispatcher(&config, clock).await;
        let outcomes = env.process(&d, now).await;
        assert_eq!(outcomes.iter().filter(|o| matches!(o, Outcome::Closed { .. })).count(), 3, "{outcomes:?}");
        for id in ["lost", "stuck-0", "stuck-1"] {
            assert_eq!(env.status(id).await, "CLOSED", "{id}");
            assert_eq!(env.text("SELECT closed_by FROM orders WHERE id = ?", id).await, "sweep", "{id}");
        }
        assert_eq!(env.status("leased").await, "PENDING");
    }
}

each_backend! {
    async fn decision_restoring_more_than_the_order_held_is_refused(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("greedy", "evil", T0)).await;
        let config = env.config(&[("evil", "hostile", &[("mode", "exceed")])], "");
        let (clock, _) = Clock::manual(T0 + 1);
        let d = env.dispatcher(&config, clock).await;
        let outcomes = env.process(&d, T0 + 1).await;
        let [Outcome::Refused { reason }] = &outcomes[..] else { panic!("{outcomes:?}") };
        assert!(reason.contains("effects[0] restore-stock(sku-a, 1000)"), "{reason}");
        assert!(reason.contains("coupon `someone-elses-coupon`"), "{reason}");
        assert_eq!(env.status("greedy").await, "PENDING");
        assert_eq!(env.stock("sku-a").await, 8);
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE order_id = ?", "greedy").await, 0);
        assert!(env.text("SELECT reason FROM dead_letter WHERE order_id = ?", "greedy").await.contains("restore-stock"));
        assert_eq!(env.text("SELECT outcome FROM decision_log WHERE order_id = ?", "greedy").await, "refused");
        let (late, _) = Clock::manual(T0 + 3_600_000);
        assert_eq!(sweep::sweep_once(&env.db, &late, &config.sweep).await.unwrap().rearmed, 0, "left to an operator");
    }
}

each_backend! {
    /// A plugin that waits `u64::MAX` ms is refused by the guard's bound (a wait ends at most
    /// 24 h past the deadline): dead-lettered naming the rule, no phase row parked at the end
    /// of time, the order left open for an operator (the overdue alert's to find).
    async fn a_wait_past_a_day_after_the_deadline_is_refused_and_left_to_an_operator(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("forever", "evil", T0)).await;
        let config = env.config(&[("evil", "hostile", &[("mode", "forever")])], "");
        let (clock, _) = Clock::manual(T0 + 1);
        let d = env.dispatcher(&config, clock).await;
        let outcomes = env.process(&d, T0 + 1).await;
        let [Outcome::Refused { reason }] = &outcomes[..] else { panic!("{outcomes:?}") };
        assert!(reason.contains("wait of 18446744073709551615 ms"), "{reason}");
        assert!(reason.contains("at most 86400000 ms (24 h) past the order's deadline"), "{reason}");
        assert_eq!(env.status("forever").await, "PENDING");
        assert_eq!(env.int("SELECT COUNT(*) FROM order_timeout_msg WHERE phase > 0 AND order_id = ?", "forever").await, 0);
        assert!(env.text("SELECT reason FROM dead_letter WHERE order_id = ?", "forever").await.contains("24 h"));
        assert_eq!(env.text("SELECT outcome FROM decision_log WHERE order_id = ?", "forever").await, "refused");
    }
}

each_backend! {
    async fn two_phase_reminds_then_closes_releasing_the_flash_sale(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let mut o = order("fs1", "flashy", T0);
        o.flash_activity = Some("act-1".into());
        env.create(&o).await;
        let config = env.config(&[("flashy", "builtin:two-phase", &[("grace", "5m")])], "");
        let (clock, now) = Clock::manual(T0 + 200);
        let d = env.dispatcher(&config, clock).await;
        let five_min = 5 * 60_000;
        assert_eq!(env.process(&d, T0 + 200).await, vec![Outcome::Waiting { next_phase: 1, due_ms: T0 + five_min }]);
        // The wait's decision log says what was decided (what replay and the timeline show).
        let detail: serde_json::Value = serde_json::from_str(&env.text("SELECT detail FROM decision_log WHERE decision = 'wait' AND order_id = ?", "fs1").await).unwrap();
        assert_eq!((detail["after_ms"].as_i64(), detail["next_phase"].as_i64()), (Some(five_min - 200), Some(1)), "{detail}");
        assert_eq!(detail["reminder"]["template"], "order-closing-soon", "{detail}");
        assert_eq!(env.text("SELECT status FROM effect_ledger WHERE kind = 'remind' AND order_id = ?", "fs1").await, "DONE");
        assert!(env.text("SELECT payload FROM effect_ledger WHERE kind = 'remind' AND order_id = ?", "fs1").await.contains("order-closing-soon"));
        assert_eq!(env.int("SELECT due_ms FROM order_timeout_msg WHERE phase = 1 AND order_id = ?", "fs1").await, T0 + five_min);
        now.store(T0 + five_min + 30, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(env.process(&d, T0 + five_min + 30).await, vec![Outcome::Closed { lateness_ms: 30 }]);
        assert_eq!(env.stock("sku-a").await, 10);
        assert_eq!(env.text("SELECT payload FROM effect_ledger WHERE kind = 'restore-flash-stock' AND order_id = ?", "fs1").await, r#"{"kind":"restore-flash-stock","activity":"act-1","quantity":3}"#);
        assert_eq!(env.text("SELECT status FROM effect_ledger WHERE kind = 'release-flash-slot' AND order_id = ?", "fs1").await, "PENDING");
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE kind = 'remind' AND order_id = ?", "fs1").await, 1, "one reminder");
    }
}

each_backend! {
    /// F4: reminder-phase triggers are lost, and each loss is tolerated. `unreminded` loses its
    /// phase-0 row: swept within the grace, it is reminded late. `reminded` loses its close-phase
    /// row after its reminder: swept, its phase 0 runs again and the reminder is not sent twice.
    /// `expired` loses its row and is swept after its grace: it closes with no reminder. The
    /// sweep re-arms each (`source = sweep`) and each closes once, releasing everything.
    async fn lost_reminder_phase_triggers_are_swept_and_each_order_closes_once(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let five_min = 5 * 60_000;
        env.create(&order("unreminded", "flashy", T0)).await;
        env.create(&order("reminded", "flashy", T0)).await;
        env.create(&order("expired", "flashy", T0 - 2 * five_min)).await;
        let config = env.config(&[("flashy", "builtin:two-phase", &[("grace", "5m")])], "[sweep]\ngrace = \"10s\"\n");
        let delete = "DELETE FROM order_timeout_msg WHERE order_id = ? AND phase >= 0";
        for id in ["unreminded", "expired"] {
            env.db.backend().query(delete).bind(id).execute(env.db.pool()).await.unwrap();
        }
        let (clock, now) = Clock::manual(T0 + 200);
        let d = env.dispatcher(&config, clock.clone()).await;
        assert_eq!(env.process(&d, T0 + 200).await, vec![Outcome::Waiting { next_phase: 1, due_ms: T0 + five_min }]);
        env.db.backend().query("DELETE FROM order_timeout_msg WHERE order_id = ? AND phase = 1").bind("reminded").execute(env.db.pool()).await.unwrap();
        let swept_at = T0 + 60_000;
        now.store(swept_at, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(sweep::sweep_once(&env.db, &clock, &config.sweep).await.unwrap().rearmed, 3);
        for id in ["unreminded", "reminded", "expired"] {
            assert_eq!(env.text("SELECT source FROM order_timeout_msg WHERE status = 'PENDING' AND order_id = ?", id).await, "sweep", "{id}");
        }
        let mut outcomes = env.process(&d, swept_at).await;
        outcomes.sort_by_key(|o| format!("{o:?}"));
        assert_eq!(outcomes.len(), 3, "{outcomes:?}");
        assert!(matches!(outcomes[0], Outcome::Closed { .. }), "expired closes at once: {outcomes:?}");
        assert!(outcomes[1..].iter().all(|o| *o == Outcome::Waiting { next_phase: 1, due_ms: T0 + five_min }), "{outcomes:?}");
        let close_at = T0 + five_min + 30;
        now.store(close_at, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(env.process(&d, close_at).await.len(), 2);
        for (id, reminders) in [("unreminded", 1), ("reminded", 1), ("expired", 0)] {
            assert_eq!(env.status(id).await, "CLOSED", "{id}");
            assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE outcome = 'closed' AND order_id = ?", id).await, 1, "{id}");
            assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE kind = 'remind' AND order_id = ?", id).await, reminders, "{id}");
            assert_eq!(env.coupon(&format!("cpn-{id}")).await, "AVAILABLE");
        }
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (10, 10));
    }
}

each_backend! {
    /// The close applies what the database holds and says what it could not: a restore of a
    /// SKU with no stock row is recorded FAILED with the reason (the order still closes, the
    /// other SKU comes back), and a coupon no longer locked by the order is left alone, noted.
    async fn a_restore_without_a_stock_row_fails_with_its_reason_and_a_coupon_not_held_is_left_alone(env) {
        env.stock_up(&[("sku-a", 10)]).await;
        env.create(&order("partial", "acme", T0)).await;
        env.db.backend().query("UPDATE coupons SET status = 'AVAILABLE' WHERE id = ?").bind("cpn-partial").execute(env.db.pool()).await.unwrap();
        let (clock, _) = Clock::manual(T0 + 1);
        let d = env.dispatcher(&env.config(SINGLE, ""), clock).await;
        assert!(matches!(env.process(&d, T0 + 1).await[..], [Outcome::Closed { .. }]));
        let row = |sql: &'static str| async move { env.text(sql, "partial").await };
        assert_eq!(env.stock("sku-a").await, 10, "sku-a's 2 units came back");
        assert_eq!(row("SELECT status FROM effect_ledger WHERE kind = 'restore-stock' AND payload LIKE '%sku-b%' AND order_id = ?").await, "FAILED");
        assert_eq!(row("SELECT last_error FROM effect_ledger WHERE kind = 'restore-stock' AND payload LIKE '%sku-b%' AND order_id = ?").await, "no sku_stock row for `sku-b`");
        assert_eq!(row("SELECT status FROM effect_ledger WHERE kind = 'restore-stock' AND payload LIKE '%sku-a%' AND order_id = ?").await, "DONE");
        assert_eq!(row("SELECT MAX(last_error) FROM effect_ledger WHERE kind = 'restore-stock' AND payload LIKE '%sku-a%' AND order_id = ?").await, "");
        assert_eq!(row("SELECT status FROM effect_ledger WHERE kind = 'release-coupon' AND order_id = ?").await, "DONE");
        assert!(row("SELECT last_error FROM effect_ledger WHERE kind = 'release-coupon' AND order_id = ?").await.contains("left alone"));
        assert_eq!(env.coupon("cpn-partial").await, "AVAILABLE");
    }
}

each_backend! {
    /// An order whose effects are all outside the database (no items, no coupon: only the
    /// notice) has them carried out after its commit, not left for a later round.
    async fn an_order_with_only_external_effects_has_them_carried_out_after_its_commit(env) {
        let mut o = order("bare", "acme", T0);
        o.items.clear();
        o.coupon = None;
        o.payment_ref = None;
        o.total_cents = 0;
        env.create(&o).await;
        let (clock, _) = Clock::manual(T0 + 1);
        let d = env.dispatcher(&env.config(SINGLE, ""), clock).await;
        assert!(matches!(env.process(&d, T0 + 1).await[..], [Outcome::Closed { .. }]));
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE order_id = ?", "bare").await, 1, "only the notice");
        assert_eq!(env.text("SELECT status FROM effect_ledger WHERE kind = 'notify' AND order_id = ?", "bare").await, "DONE");
    }
}

each_backend! {
    async fn trapping_plugin_is_retried_with_backoff_then_dead_lettered(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("boom", "evil", T0)).await;
        let config = env.config(&[("evil", "hostile", &[("mode", "panic")])], "[dispatch]\nmax_attempts = 2\nretry_initial = \"1s\"\n");
        let (clock, now) = Clock::manual(T0);
        let d = env.dispatcher(&config, clock).await;
        let first = env.process(&d, T0).await;
        let [Outcome::Retry { due_ms, error }] = &first[..] else { panic!("{first:?}") };
        assert_eq!(*due_ms, T0 + 1_000);
        assert!(error.contains("trapped (fault)"), "{error}");
        assert_eq!(env.int("SELECT attempts FROM order_timeout_msg WHERE order_id = ?", "boom").await, 1);
        assert!(env.claim(T0 + 999).await.is_empty(), "backing off");
        now.store(T0 + 1_000, std::sync::atomic::Ordering::SeqCst);
        let second = env.process(&d, T0 + 1_000).await;
        assert!(matches!(&second[..], [Outcome::DeadLettered { .. }]), "{second:?}");
        assert_eq!(env.status("boom").await, "PENDING");
        assert!(env.text("SELECT reason FROM dead_letter WHERE order_id = ?", "boom").await.contains("gave up after 2 attempt(s)"));
        assert_eq!(env.text("SELECT status FROM order_timeout_msg WHERE order_id = ?", "boom").await, "PROCESSED");
    }
}

each_backend! {
    async fn trigger_for_a_missing_order_or_unknown_merchant_is_dead_lettered(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("stranger", "nobody", T0)).await;
        env.db.backend().query("INSERT INTO order_timeout_msg (order_id, due_ms, phase, status) VALUES ('ghost', ?, 0, 'PENDING')")
            .bind(T0)
            .execute(env.db.pool())
            .await
            .unwrap();
        let (clock, _) = Clock::manual(T0);
        let d = env.dispatcher(&env.config(SINGLE, ""), clock).await;
        let outcomes = env.process(&d, T0).await;
        assert_eq!(outcomes.len(), 2);
        assert!(outcomes.iter().all(|o| matches!(o, Outcome::DeadLettered { .. })), "{outcomes:?}");
        assert!(env.text("SELECT reason FROM dead_letter WHERE order_id = ?", "ghost").await.contains("does not exist"));
        assert!(env.text("SELECT reason FROM dead_letter WHERE order_id = ?", "stranger").await.contains("merchant `nobody`"));
    }
}

each_backend! {
    /// The real daemon on the database clock: an order written by plain SQL is closed by the
    /// outbox timer (not the sweep, 30 s + 10 s away), never before its deadline. Lateness is
    /// printed, not asserted: it is a bench figure, and this machine is busy.
    async fn daemon_closes_an_order_written_by_plain_sql_on_time(env) {
        env.stock_up(&[("sku-a", 10)]).await;
        let config = env.config(SINGLE, "");
        let daemon = timeoutd::daemon::Daemon::start(&config, Clock::Database).await.unwrap();
        let deadline = env.db.now_ms().await.unwrap() + 700;
        let pool = env.db.pool();
        env.db.backend().query("INSERT INTO orders (id, merchant_id, user_id, status, created_at_ms, deadline_ms, total_cents) VALUES ('plain', 'acme', 'u', 'PENDING', ?, ?, 500)")
            .bind(deadline - 60_000).bind(deadline).execute(pool).await.unwrap();
        env.db.backend().query("INSERT INTO order_items (order_id, line_no, sku, quantity, unit_price_cents) VALUES ('plain', 0, 'sku-a', 1, 500)")
            .execute(pool).await.unwrap();
        env.db.backend().query("UPDATE sku_stock SET available = available - 1 WHERE sku = 'sku-a'").execute(pool).await.unwrap();
        env.db.backend().query("INSERT INTO order_timeout_msg (order_id, due_ms, phase, status) VALUES ('plain', ?, 0, 'PENDING')")
            .bind(deadline).execute(pool).await.unwrap();
        let started = std::time::Instant::now();
        while env.status("plain").await != "CLOSED" {
            assert!(started.elapsed() < Duration::from_secs(20), "not closed within 20 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        daemon.stop().await;
        let closed_at = env.int("SELECT closed_at_ms FROM orders WHERE id = ?", "plain").await;
        assert!(closed_at >= deadline, "closed at {closed_at}, deadline {deadline}");
        assert_eq!(env.text("SELECT closed_by FROM orders WHERE id = ?", "plain").await, "outbox");
        assert_eq!(env.stock("sku-a").await, 10);
        eprintln!("closed {} ms after the deadline", closed_at - deadline);
    }
}

each_backend! {
    /// A daemon that claimed rows and died holds them only until its lease lapses; then another
    /// daemon closes the order (F10, killed before the commit).
    async fn rows_claimed_by_a_dead_daemon_are_reclaimed_after_the_lease(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("orphaned", "acme", T0)).await;
        let claimed = timeoutd::db::outbox::claim_due(&env.db, T0, 10, 30_000).await.unwrap();
        assert_eq!(claimed.len(), 1, "the first daemon claims the row, then dies");
        assert!(env.claim(T0 + 29_000).await.is_empty(), "held while the lease lasts");
        let (clock, _) = Clock::manual(T0 + 30_001);
        let d = env.dispatcher(&env.config(SINGLE, ""), clock).await;
        assert_eq!(env.process(&d, T0 + 30_001).await, vec![Outcome::Closed { lateness_ms: 30_001 }]);
        assert_eq!((env.stock("sku-a").await, env.coupon("cpn-orphaned").await.as_str()), (10, "AVAILABLE"));
    }
}

each_backend! {
    /// A notice recorded by a close whose daemon died before sending it is sent once by the
    /// ledger backlog after restart.
    async fn notice_left_pending_by_a_crash_is_sent_once_after_restart(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("crashed", "acme", T0)).await;
        let (clock, now) = Clock::manual(T0);
        let d = env.dispatcher(&env.config(SINGLE, ""), clock.clone()).await;
        assert_eq!(env.process(&d, T0).await, vec![Outcome::Closed { lateness_ms: 0 }]);
        // Put the notice back as the crash would have left it: recorded, not sent.
        env.db.backend().query("UPDATE effect_ledger SET status = 'PENDING', attempts = 0 WHERE kind = 'notify'")
            .execute(env.db.pool())
            .await
            .unwrap();
        let runner = timeoutd::effects::EffectRunner::new(env.db.clone(), clock);
        now.store(T0 + 1_000, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(runner.run_backlog(5_000).await.unwrap(), 0, "too fresh: its own daemon may still send it");
        now.store(T0 + 10_000, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(runner.run_backlog(5_000).await.unwrap(), 1);
        assert_eq!(runner.run_backlog(5_000).await.unwrap(), 0, "settled once");
        assert_eq!(env.int("SELECT attempts FROM effect_ledger WHERE kind = 'notify' AND order_id = ?", "crashed").await, 1);
        assert_eq!(env.text("SELECT status FROM effect_ledger WHERE kind = 'notify' AND order_id = ?", "crashed").await, "DONE");
    }
}

each_backend! {
    /// F11: two daemons sweep the same overdue orders (none has an outbox row) at once; each
    /// order is closed once and exactly its units come back.
    async fn two_daemons_sweeping_the_same_orders_close_each_once(env) {
        let n = 120;
        env.stock_up(&[("sku-a", 10_000), ("sku-b", 10_000)]).await;
        let past = env.db.now_ms().await.unwrap() - 60_000;
        for i in 0..n {
            env.create(&order(&format!("sw-{i}"), "acme", past)).await;
        }
        env.db.backend().query("DELETE FROM order_timeout_msg").execute(env.db.pool()).await.unwrap();
        let config = env.config(SINGLE, "[sweep]\ninterval = \"100ms\"\ngrace = \"1s\"\n");
        let a = timeoutd::daemon::Daemon::start(&config, Clock::Database).await.unwrap();
        let b = timeoutd::daemon::Daemon::start(&config, Clock::Database).await.unwrap();
        for _ in 0..150 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "CLOSED").await == n {
                break;
            }
        }
        a.stop().await;
        b.stop().await;
        assert_eq!(env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "CLOSED").await, n);
        assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE outcome = ?", "closed").await, n);
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (10_000, 10_000));
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE kind = ?", "restore-stock").await, 2 * n);
    }
}

each_backend! {
    /// F11: two sweepers re-arm the same batch at once, found in opposite orders (their queries
    /// break deadline ties as they like). Neither fails on a deadlock: both re-arms succeed and
    /// converge on one row per order.
    async fn two_sweepers_re_arming_one_batch_in_opposite_orders_both_succeed(env) {
        use timeoutd::db::outbox::{self, Orphan};
        let n = 400;
        env.stock_up(&[("sku-a", 10_000), ("sku-b", 10_000)]).await;
        for i in 0..n {
            env.create(&order(&format!("race-{i:03}"), "acme", T0)).await;
        }
        let orphans: Vec<Orphan> = (0..n)
            .map(|i| Orphan { order_id: format!("race-{i:03}"), phase: 0, deadline_ms: T0 })
            .collect();
        let reversed: Vec<Orphan> = orphans.iter().rev().cloned().collect();
        for round in 0..5 {
            env.db.backend().query("DELETE FROM order_timeout_msg").execute(env.db.pool()).await.unwrap();
            let (a, b) = (env.db.clone(), env.db.clone());
            let (forward, backward) = (orphans.clone(), reversed.clone());
            let one = tokio::spawn(async move { outbox::rearm(&a, &forward, T0 + 20_000).await });
            let two = tokio::spawn(async move { outbox::rearm(&b, &backward, T0 + 20_000).await });
            let (one, two) = (one.await.unwrap(), two.await.unwrap());
            assert!(one.is_ok() && two.is_ok(), "round {round}: {one:?} / {two:?}");
            assert_eq!(env.int("SELECT COUNT(*) FROM order_timeout_msg WHERE source = ?", "sweep").await, n, "round {round}");
        }
    }
}

each_backend! {
    /// An ignored order is asked again later with backoff — not dropped, and not re-swept (and
    /// re-logged) every sweep interval, where it could crowd out orders the sweep must rescue.
    async fn ignored_order_is_asked_again_with_backoff_not_every_sweep(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("shrug", "lazy", T0)).await;
        let config = env.config(&[("lazy", "hostile", &[("mode", "clock")])], "[sweep]\ngrace = \"1s\"\n");
        let (clock, now) = Clock::manual(T0);
        let d = env.dispatcher(&config, clock).await;
        assert_eq!(env.process(&d, T0).await, vec![Outcome::Ignored]);
        assert_eq!(env.text("SELECT status FROM order_timeout_msg WHERE order_id = ?", "shrug").await, "PENDING");
        assert_eq!(env.int("SELECT due_ms FROM order_timeout_msg WHERE order_id = ?", "shrug").await, T0 + 1_000);
        let (late, _) = Clock::manual(T0 + 500);
        assert_eq!(sweep::sweep_once(&env.db, &late, &config.sweep).await.unwrap().rearmed, 0, "it has a live trigger");
        now.store(T0 + 1_000, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(env.process(&d, T0 + 1_000).await, vec![Outcome::Ignored]);
        assert_eq!(env.int("SELECT due_ms FROM order_timeout_msg WHERE order_id = ?", "shrug").await, T0 + 3_000, "backing off");
        assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE order_id = ?", "shrug").await, 2);
    }
}

each_backend! {
    async fn outbox_row_with_a_phase_out_of_range_is_dead_lettered(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("badphase", "acme", T0)).await;
        env.db.backend().query("UPDATE order_timeout_msg SET phase = -3 WHERE order_id = 'badphase'").execute(env.db.pool()).await.unwrap();
        // Through the daemon's own outbox timer, which must check the row before dispatching it.
        let (clock, _) = Clock::manual(T0);
        let config = env.config(SINGLE, "[sweep]\nenabled = false\n");
        let daemon = timeoutd::daemon::Daemon::start(&config, clock).await.unwrap();
        let started = std::time::Instant::now();
        while env.int("SELECT COUNT(*) FROM dead_letter WHERE order_id = ?", "badphase").await == 0 {
            assert!(started.elapsed() < Duration::from_secs(30), "the bad row was never dead-lettered");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        daemon.stop().await;
        assert!(env.text("SELECT reason FROM dead_letter WHERE order_id = ?", "badphase").await.contains("phase -3"));
        assert_eq!(env.status("badphase").await, "PENDING");
        assert_eq!(env.stock("sku-a").await, 8, "nothing was released");
        assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE order_id = ?", "badphase").await, 0, "no plugin was asked");
    }
}

each_backend! {
    /// A plugin that keeps failing is tripped: its triggers wait out the trip instead of being
    /// retried in a loop.
    async fn a_plugin_failing_repeatedly_is_tripped_and_not_called(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("tripwire", "evil", T0)).await;
        let config = env.config(
            &[("evil", "hostile", &[("mode", "panic")])],
            "[runtime]\ntrip_after = 2\ntrip_for = \"30s\"\n[dispatch]\nmax_attempts = 10\nretry_initial = \"1s\"\n",
        );
        let (clock, now) = Clock::manual(T0);
        let d = env.dispatcher(&config, clock).await;
        assert!(matches!(env.process(&d, T0).await[..], [Outcome::Retry { .. }]));
        now.store(T0 + 1_000, std::sync::atomic::Ordering::SeqCst);
        assert!(matches!(env.process(&d, T0 + 1_000).await[..], [Outcome::Retry { .. }]));
        now.store(T0 + 3_000, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(env.process(&d, T0 + 3_000).await, vec![Outcome::Tripped { until_ms: T0 + 31_000 }]);
        assert_eq!(env.int("SELECT due_ms FROM order_timeout_msg WHERE order_id = ?", "tripwire").await, T0 + 31_000);
        assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE order_id = ?", "tripwire").await, 2, "not called while tripped");
        assert_eq!(env.status("tripwire").await, "PENDING");
    }
}

each_backend! {
    /// `on_plugin_error = "fallback"`: a trapping plugin's order is closed by the built-in
    /// close-at-deadline policy, releasing everything it holds, in the one close transaction.
    async fn failing_plugin_with_fallback_closes_at_the_deadline_releasing_everything(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("fb", "evil", T0)).await;
        let config = env.config_for(&[("evil", "hostile", &[("mode", "panic")])], "on_plugin_error = \"fallback\"", "");
        let (clock, _) = Clock::manual(T0 + 5);
        let d = env.dispatcher(&config, clock).await;
        assert_eq!(env.process(&d, T0 + 5).await, vec![Outcome::Closed { lateness_ms: 5 }]);
        assert_eq!(env.status("fb").await, "CLOSED");
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (10, 10));
        assert_eq!(env.coupon("cpn-fb").await, "AVAILABLE");
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?", "fb").await, 1);
        assert_eq!(env.text("SELECT outcome FROM decision_log WHERE order_id = ?", "fb").await, "closed");
        assert!(env.text("SELECT detail FROM decision_log WHERE order_id = ?", "fb").await.contains("fallback close at the deadline; the plugin failed"));
        assert!(env.text("SELECT answer FROM decision_log WHERE order_id = ?", "fb").await.contains("trapped (fault)"));
    }
}

each_backend! {
    /// `on_plugin_error = "dead_letter"`: the first failure dead-letters, no retry.
    async fn failing_plugin_with_dead_letter_gives_up_at_once(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("dl", "evil", T0)).await;
        let config = env.config_for(&[("evil", "hostile", &[("mode", "error")])], "on_plugin_error = \"dead_letter\"", "");
        let (clock, _) = Clock::manual(T0);
        let d = env.dispatcher(&config, clock).await;
        let outcomes = env.process(&d, T0).await;
        let [Outcome::DeadLettered { reason }] = &outcomes[..] else { panic!("{outcomes:?}") };
        assert!(reason.contains("on_plugin_error = dead_letter") && reason.contains("hostile plugin refuses"), "{reason}");
        assert_eq!(env.status("dl").await, "PENDING");
        assert_eq!(env.int("SELECT COUNT(*) FROM dead_letter WHERE order_id = ?", "dl").await, 1);
        assert_eq!(env.text("SELECT status FROM order_timeout_msg WHERE order_id = ?", "dl").await, "PROCESSED");
        assert_eq!(env.text("SELECT outcome FROM decision_log WHERE order_id = ?", "dl").await, "dead-lettered");
    }
}

each_backend! {
    /// A merchant that granted no `close-payment`: a cancel asking for one is refused, typed
    /// like an effect beyond the order, and nothing is applied.
    async fn effect_of_a_kind_the_merchant_did_not_grant_is_refused(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("ng", "acme", T0)).await;
        let config = env.config_for(
            &[("acme", "builtin:single-phase", &[])],
            "granted_effects = [\"restore-stock\", \"release-coupon\", \"notify\"]",
            "",
        );
        let (clock, _) = Clock::manual(T0 + 1);
        let d = env.dispatcher(&config, clock).await;
        let outcomes = env.process(&d, T0 + 1).await;
        let [Outcome::Refused { reason }] = &outcomes[..] else { panic!("{outcomes:?}") };
        assert!(reason.contains("close-payment(pay-ng): effect kind `close-payment` is not granted"), "{reason}");
        assert_eq!(env.status("ng").await, "PENDING");
        assert_eq!(env.stock("sku-a").await, 8);
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE order_id = ?", "ng").await, 0);
        assert_eq!(env.text("SELECT outcome FROM decision_log WHERE order_id = ?", "ng").await, "refused");
    }
}

each_backend! {
    /// A plugin releasing another order's coupon is refused; that coupon stays locked.
    async fn releasing_another_orders_coupon_is_refused(env) {
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&order("mine", "evil", T0)).await;
        env.create(&order("other", "evil", T0 + 3_600_000)).await;
        let config = env.config(&[("evil", "hostile", &[("mode", "coupon")])], "");
        let (clock, _) = Clock::manual(T0 + 1);
        let d = env.dispatcher(&config, clock).await;
        let outcomes = env.process(&d, T0 + 1).await;
        let [Outcome::Refused { reason }] = &outcomes[..] else { panic!("{outcomes:?}") };
        assert!(reason.contains("coupon `cpn-other` is not held by order `mine`"), "{reason}");
        assert_eq!(env.status("mine").await, "PENDING");
        assert_eq!(env.coupon("cpn-other").await, "LOCKED");
        assert_eq!(env.coupon("cpn-mine").await, "LOCKED");
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (6, 8), "nothing released");
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE order_id = ?", "mine").await, 0);
    }
}

each_backend! {
    /// Hot reload under load: the merchant's plugin file is swapped and reloaded while four
    /// workers are deciding; no decision fails, every order closes once, and each
    /// `decision_log` row names the digest of the version it ran on (both appear).
    async fn plugin_swapped_while_decisions_flow_fails_none_and_logs_each_digest(env) {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        use timeoutd::db::Db;
        use timeoutd::dispatch::Dispatcher;
        use timeoutd::effects::EffectRunner;

        const ORDERS: usize = 80;
        const WORKERS: usize = 4;
        env.stock_up(&[("sku-a", 1_000), ("sku-b", 1_000)]).await;
        for i in 0..ORDERS {
            env.create(&order(&format!("hr{i}"), "swap", T0)).await;
        }
        let path = env.dir.path().join("swap.wasm");
        std::fs::write(&path, timeoutd::policies::builtin("single-phase").unwrap()).unwrap();
        let config = env.config(&[("swap", path.to_str().unwrap(), &[])], "");
        let policies = timeoutd::policies::load(&config).unwrap();
        let old = policies.get("swap").unwrap().plugin.digest().to_string();
        let (clock, _) = Clock::manual(T0 + 1);
        let db = Db::connect(&env.url, 8).await.unwrap();
        let effects = EffectRunner::from_config(db.clone(), clock.clone(), &config).await.unwrap();
        let d = Arc::new(Dispatcher::new(db, clock, policies.clone(), config.dispatch.clone(), Arc::new(effects)));
        let triggers = env.claim(T0 + 1).await;
        assert_eq!(triggers.len(), ORDERS);
        // Each worker decides its share; its last 5 wait for the swap, so both versions serve.
        let swapped = Arc::new(AtomicBool::new(false));
        let mut workers = tokio::task::JoinSet::new();
        for share in triggers.chunks(ORDERS / WORKERS) {
            let (d, share, swapped) = (d.clone(), share.to_vec(), swapped.clone());
            workers.spawn(async move {
                let mut outcomes = Vec::new();
                for (i, t) in share.iter().enumerate() {
                    while i + 5 >= share.len() && !swapped.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    outcomes.push(d.handle(t).await);
                }
                outcomes
            });
        }
        while env.int("SELECT COUNT(*) FROM decision_log WHERE merchant_id = ?", "swap").await < 10 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // The new version: `hostile` in its default mode closes releasing everything.
        std::fs::write(&path, crate::support::HOSTILE_WASM).unwrap();
        let reloader = policies.clone();
        let report = tokio::task::spawn_blocking(move || reloader.reload(true)).await.unwrap();
        assert!(report[0].changed && report[0].refused.is_none(), "{report:?}");
        let new = report[0].digest.clone();
        swapped.store(true, Ordering::SeqCst);
        let mut outcomes = Vec::new();
        while let Some(done) = workers.join_next().await {
            outcomes.extend(done.unwrap());
        }
        assert_eq!(outcomes.len(), ORDERS);
        let failed: Vec<_> = outcomes.iter().filter(|o| !matches!(o, Outcome::Closed { .. })).collect();
        assert!(failed.is_empty(), "{failed:?}");
        let on_old = env.int("SELECT COUNT(*) FROM decision_log WHERE plugin_digest = ?", &old).await;
        let on_new = env.int("SELECT COUNT(*) FROM decision_log WHERE plugin_digest = ?", &new).await;
        assert!(on_old >= 10 && on_new >= (WORKERS * 5) as i64, "old {on_old}, new {on_new}");
        assert_eq!(on_old + on_new, ORDERS as i64, "every row names one of the two versions");
        assert_eq!(env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "CLOSED").await, ORDERS as i64);
        assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE outcome <> ?", "closed").await, 0);
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (1_000, 1_000));
    }
}
