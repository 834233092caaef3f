//! Group commit: triggers decided together, closes sharing one transaction — each order still
//! its own compare-and-set, one bad order never holding the others back, and every trigger the
//! outcome it would have had alone. On SQLite, MariaDB and PostgreSQL.

use sqlx::Row;
use timeoutd::clock::Clock;
use timeoutd::db::Backend;
use timeoutd::db::relay::{self, RowClaim};
use timeoutd::db::shop::Schema;
use timeoutd::dispatch::{Outcome, Trigger};
use timeoutd_runtime::model::TriggerKind;

use crate::support::{Env, MerchantSpec, T0, each_backend, order};

const SINGLE: &[MerchantSpec<'static>] = &[("acme", "builtin:single-phase", &[])];

/// Closed and no-op outcomes among `outcomes`; panics on any other.
fn tally(outcomes: &[Outcome]) -> (usize, usize) {
    let mut closed_noop = (0, 0);
    for o in outcomes {
        match o {
            Outcome::Closed { .. } => closed_noop.0 += 1,
            Outcome::NoOp { .. } => closed_noop.1 += 1,
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    closed_noop
}

/// On PostgreSQL, how many transactions wrote the CLOSED orders (each row's `xmin` is the
/// transaction that last updated it); `None` on the other backends, which do not tell.
async fn closing_transactions(env: &Env) -> Option<i64> {
    if env.db.backend() != Backend::Postgres {
        return None;
    }
    Some(
        env.int(
            "SELECT COUNT(DISTINCT CAST(CAST(xmin AS TEXT) AS BIGINT)) FROM orders WHERE status = ?",
            "CLOSED",
        )
        .await,
    )
}

each_backend! {
    /// F1 and F9 at once: 120 orders share one deadline, 30 of them paid first; two daemons
    /// handle the same claimed triggers as groups of 40 at the same time.
    async fn a_burst_sharing_one_deadline_closes_each_unpaid_order_once_in_shared_transactions(env) {
        env.stock_up(&[("sku-a", 100_000), ("sku-b", 100_000)]).await;
        let n = 120;
        for i in 0..n {
            env.create(&order(&format!("burst-{i:03}"), "acme", T0)).await;
        }
        for i in (0..n).step_by(4) {
            assert!(env.pay(&format!("burst-{i:03}"), T0 - 10).await);
        }
        let paid = n / 4;
        let config = env.config(SINGLE, "");
        let (clock, _) = Clock::manual(T0 + 1);
        let (a, b) = (env.dispatcher(&config, clock.clone()).await, env.dispatcher(&config, clock).await);
        let triggers = env.claim(T0 + 1).await;
        assert_eq!(triggers.len(), n);
        let mut tasks = Vec::new();
        for chunk in triggers.chunks(40) {
            for d in [a.clone(), b.clone()] {
                let chunk = chunk.to_vec();
                tasks.push(tokio::spawn(async move { d.handle_group(&chunk).await }));
            }
        }
        let mut outcomes = Vec::new();
        for t in tasks {
            outcomes.extend(t.await.unwrap());
        }
        let (closed, noop) = tally(&outcomes);
        assert_eq!((closed, noop), (n - paid, n + paid), "each unpaid order closed by exactly one of the two");
        let unpaid = (n - paid) as i64;
        assert_eq!(env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "CLOSED").await, unpaid);
        assert_eq!(env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "PAID").await, paid as i64);
        assert_eq!(
            env.int("SELECT COUNT(*) FROM orders WHERE status = 'CLOSED' AND (closed_at_ms < deadline_ms OR closed_by <> ?)", "outbox").await,
            0,
            "none closed before its deadline, each by its outbox trigger"
        );
        // One closed decision per closed order, none for a paid one.
        assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE outcome = ?", "closed").await, unpaid);
        assert_eq!(env.int("SELECT COUNT(DISTINCT order_id) FROM decision_log WHERE outcome = ?", "closed").await, unpaid);
        assert_eq!(
            env.int("SELECT COUNT(*) FROM decision_log d JOIN orders o ON o.id = d.order_id WHERE d.outcome = 'closed' AND o.status = ?", "PAID").await,
            0
        );
        // Stock: the paid orders keep theirs (2 × sku-a, 1 × sku-b each); the rest came back once.
        assert_eq!(env.stock("sku-a").await, 100_000 - 2 * paid as i64);
        assert_eq!(env.stock("sku-b").await, 100_000 - paid as i64);
        assert_eq!(env.int("SELECT COUNT(*) FROM coupons WHERE status = ?", "AVAILABLE").await, unpaid);
        assert_eq!(env.int("SELECT COUNT(*) FROM coupons WHERE status = ?", "USED").await, paid as i64);
        // Five ledger rows per close (two lines, the coupon, the payment, the notice), each once.
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE status <> ?", "FAILED").await, 5 * unpaid);
        assert_eq!(env.int("SELECT COUNT(DISTINCT idempotency_key) FROM effect_ledger WHERE kind = ?", "restore-stock").await, 2 * unpaid);
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE kind = 'notify' AND status = ?", "DONE").await, unpaid);
        assert_eq!(env.int("SELECT COUNT(*) FROM order_timeout_msg WHERE status <> ?", "PROCESSED").await, 0);
        if let Some(txs) = closing_transactions(env).await {
            // Six groups were handled; one transaction per close would be 90.
            assert!(txs <= 6, "{unpaid} closes written by {txs} transactions");
        }
    }
}

/// Makes the database refuse to close order `poison` (a trigger raising an error), so a group
/// holding it fails as a whole.
async fn poison(env: &Env) {
    let sql = match env.db.backend() {
        Backend::Sqlite => {
            "CREATE TRIGGER poison BEFORE UPDATE OF status ON orders \
             WHEN NEW.id = 'poison' AND NEW.status = 'CLOSED' \
             BEGIN SELECT RAISE(ABORT, 'poisoned order'); END"
        }
        Backend::MySql => {
            "CREATE TRIGGER poison BEFORE UPDATE ON orders FOR EACH ROW \
             IF NEW.id = 'poison' AND NEW.status = 'CLOSED' THEN \
             SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'poisoned order'; END IF"
        }
        Backend::Postgres => {
            "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             IF NEW.id = 'poison' AND NEW.status = 'CLOSED' THEN RAISE EXCEPTION 'poisoned order'; \
             END IF; RETURN NEW; END $$; \
             CREATE TRIGGER poison BEFORE UPDATE ON orders FOR EACH ROW EXECUTE FUNCTION poison()"
        }
    };
    sqlx::raw_sql(sql).execute(env.db.pool()).await.unwrap();
}

each_backend! {
    async fn one_order_the_database_refuses_to_close_never_holds_its_group_back(env) {
        env.stock_up(&[("sku-a", 1_000), ("sku-b", 1_000)]).await;
        for i in 0..9 {
            env.create(&order(&format!("g-{i}"), "acme", T0)).await;
        }
        env.create(&order("poison", "acme", T0)).await;
        poison(env).await;
        let (clock, _) = Clock::manual(T0 + 1);
        let d = env.dispatcher(&env.config(SINGLE, ""), clock).await;
        let triggers = env.claim(T0 + 1).await;
        assert_eq!(triggers.len(), 10);
        let outcomes = d.handle_group(&triggers).await;
        for (t, o) in triggers.iter().zip(&outcomes) {
            if t.order_id == "poison" {
                assert!(matches!(o, Outcome::Retry { .. }), "{o:?}");
            } else {
                assert!(matches!(o, Outcome::Closed { .. }), "{}: {o:?}", t.order_id);
            }
        }
        assert_eq!(env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "CLOSED").await, 9);
        assert_eq!(env.status("poison").await, "PENDING");
        // The nine gave back theirs; the poisoned order still holds its 2 + 1 units and coupon.
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (998, 999));
        assert_eq!(env.coupon("cpn-poison").await, "LOCKED");
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE order_id = ?", "poison").await, 0);
        assert_eq!(env.int("SELECT attempts FROM order_timeout_msg WHERE order_id = ?", "poison").await, 1);
        assert_eq!(env.text("SELECT status FROM order_timeout_msg WHERE order_id = ?", "poison").await, "PENDING");
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE status <> ?", "FAILED").await, 45);
    }
}

each_backend! {
    async fn a_group_gives_every_trigger_the_outcome_it_would_have_alone(env) {
        env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
        env.create(&order("due", "acme", T0)).await;
        env.create(&order("paid", "acme", T0)).await;
        assert!(env.pay("paid", T0 - 5).await);
        env.create(&order("early", "acme", T0 + 60_000)).await;
        let (clock, _) = Clock::manual(T0 + 1);
        let d = env.dispatcher(&env.config(SINGLE, ""), clock).await;
        let mut triggers = env.claim(T0 + 60_000).await;
        assert_eq!(triggers.len(), 3);
        // A second trigger for `due` in the same group (a duplicate message) and one for an order
        // that does not exist.
        let due = triggers.iter().find(|t| t.order_id == "due").unwrap().clone();
        triggers.push(timeoutd::dispatch::Trigger { row_id: None, ..due });
        let mut ghost = triggers[0].clone();
        ghost.order_id = "ghost".into();
        ghost.row_id = None;
        triggers.push(ghost);
        let outcomes = d.handle_group(&triggers).await;
        let of = |id: &str| -> Vec<&Outcome> {
            triggers.iter().zip(&outcomes).filter(|(t, _)| t.order_id == id).map(|(_, o)| o).collect()
        };
        let due = of("due");
        assert_eq!(tally(&due.iter().map(|o| (*o).clone()).collect::<Vec<_>>()), (1, 1), "{due:?}");
        assert!(matches!(of("paid")[..], [Outcome::NoOp { .. }]), "{:?}", of("paid"));
        assert!(matches!(of("early")[..], [Outcome::Deferred { until_ms }] if *until_ms == T0 + 60_000), "{:?}", of("early"));
        assert!(matches!(of("ghost")[..], [Outcome::DeadLettered { .. }]), "{:?}", of("ghost"));
        assert_eq!(env.status("due").await, "CLOSED");
        assert_eq!(env.status("paid").await, "PAID");
        assert_eq!(env.status("early").await, "PENDING");
        assert_eq!(env.text("SELECT last_error FROM order_timeout_msg WHERE order_id = ?", "paid").await, "order is PAID");
        assert_eq!(env.text("SELECT status FROM order_timeout_msg WHERE order_id = ?", "early").await, "PENDING");
        assert_eq!(env.int("SELECT due_ms FROM order_timeout_msg WHERE order_id = ?", "early").await, T0 + 60_000);
        assert_eq!(env.int("SELECT COUNT(*) FROM dead_letter WHERE order_id = ?", "ghost").await, 1);
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (100 - 4, 100 - 2));
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE order_id = ?", "due").await, 5);
        assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE order_id = ? AND outcome = 'closed'", "due").await, 1);
    }
}

each_backend! {
    /// The group's compare-and-set writes each order its own stamp (due time, trigger kind,
    /// reason), and closes only those still PENDING and due: one statement for the group.
    async fn one_compare_and_set_stamps_each_order_of_a_group_with_its_own_close(env) {
        use timeoutd::db::orders::{self, CloseStamp};
        env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
        let ids = ["s-1", "s-2", "s-3", "s-paid", "s-early"];
        for (k, id) in ids.iter().enumerate() {
            let deadline = if *id == "s-early" { T0 + 60_000 } else { T0 - 1_000 * k as i64 };
            env.create(&order(id, "acme", deadline)).await;
        }
        assert!(env.pay("s-paid", T0 - 10_000).await);
        let stamp = |due_ms, closed_by, reason| CloseStamp { now_ms: T0, due_ms, closed_by, reason };
        let closes = [
            ("s-1", stamp(T0 - 11, "outbox", "unpaid")),
            ("s-2", stamp(T0 - 22, "sweep", "window lapsed")),
            ("s-3", stamp(T0 - 33, "manual", "operator")),
            ("s-paid", stamp(T0 - 44, "outbox", "unpaid")),
            ("s-early", stamp(T0 - 55, "outbox", "unpaid")),
        ];
        let mut tx = env.db.begin().await.unwrap();
        let changed = orders::close_many(&mut tx, &timeoutd::db::shop::Schema::Canonical, &closes, T0).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(changed, 3, "the paid order and the one not yet due are left alone");
        for (id, due, by, reason) in [
            ("s-1", T0 - 11, "outbox", "unpaid"),
            ("s-2", T0 - 22, "sweep", "window lapsed"),
            ("s-3", T0 - 33, "manual", "operator"),
        ] {
            let row = env
                .db
                .backend()
                .query("SELECT status, closed_at_ms, close_due_ms, closed_by, close_reason FROM orders WHERE id = ?")
                .bind(id)
            .fetch_one(env.db.pool())
            .await
            .unwrap();
            let got: (String, i64, i64, String, String) = (
                row.try_get(0).unwrap(),
                row.try_get(1).unwrap(),
                row.try_get(2).unwrap(),
                row.try_get(3).unwrap(),
                row.try_get(4).unwrap(),
            );
            assert_eq!(got, ("CLOSED".into(), T0, due, by.into(), reason.into()), "{id}");
        }
        assert_eq!(env.status("s-paid").await, "PAID");
        assert_eq!(env.status("s-early").await, "PENDING");
        assert_eq!(
            env.int("SELECT COUNT(*) FROM orders WHERE close_due_ms IS NOT NULL AND status <> ?", "CLOSED").await,
            0
        );
    }
}

const TWO_PHASE: &[MerchantSpec<'static>] = &[("flashy", "builtin:two-phase", &[("grace", "60s")])];

each_backend! {
    /// Seed 001's two phases as a burst: the reminders of 30 orders sharing one deadline are
    /// scheduled in one transaction, a paid order among them is left alone, and the second phase
    /// closes the rest.
    async fn a_group_of_waits_schedules_each_next_phase_and_reminder_once(env) {
        env.stock_up(&[("sku-a", 1_000), ("sku-b", 1_000)]).await;
        for i in 0..30 {
            env.create(&order(&format!("w-{i:02}"), "flashy", T0)).await;
        }
        assert!(env.pay("w-07", T0 - 1).await);
        let config = env.config(TWO_PHASE, "");
        let (clock, now) = Clock::manual(T0 + 1);
        let d = env.dispatcher(&config, clock).await;
        let triggers = env.claim(T0 + 1).await;
        assert_eq!(triggers.len(), 30);
        let outcomes = d.handle_group(&triggers).await;
        for (t, o) in triggers.iter().zip(&outcomes) {
            match t.order_id.as_str() {
                "w-07" => assert!(matches!(o, Outcome::NoOp { .. }), "{o:?}"),
                id => assert!(matches!(o, Outcome::Waiting { next_phase: 1, due_ms } if *due_ms == T0 + 60_000), "{id}: {o:?}"),
            }
        }
        assert_eq!(env.int("SELECT COUNT(*) FROM order_timeout_msg WHERE phase = 1 AND status = 'PENDING' AND source = ?", "wait").await, 29);
        assert_eq!(env.int("SELECT COUNT(*) FROM order_timeout_msg WHERE phase = 1 AND order_id = ?", "w-07").await, 0);
        assert_eq!(env.int("SELECT COUNT(*) FROM order_timeout_msg WHERE phase = 0 AND status <> ?", "PROCESSED").await, 0);
        assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE kind = ?", "remind").await, 29);
        assert_eq!(env.int("SELECT COUNT(DISTINCT idempotency_key) FROM effect_ledger WHERE kind = ?", "remind").await, 29);
        assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE outcome = ?", "waiting").await, 29);
        assert_eq!(env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "PENDING").await, 29);
        // The same phase-0 triggers again (redelivered) schedule nothing twice.
        let again = d.handle_group(&triggers).await;
        assert!(again.iter().all(|o| matches!(o, Outcome::NoOp { .. } | Outcome::Waiting { .. })), "{again:?}");
        assert_eq!(env.int("SELECT COUNT(*) FROM order_timeout_msg WHERE phase = 1 AND source = ?", "wait").await, 29);
        // The grace lapses: the second phase closes the 29, each once.
        now.store(T0 + 60_000, std::sync::atomic::Ordering::SeqCst);
        let closing = env.claim(T0 + 60_000).await;
        assert_eq!(closing.len(), 29);
        let closed = d.handle_group(&closing).await;
        assert_eq!(tally(&closed), (29, 0));
        assert_eq!(env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "CLOSED").await, 29);
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (1_000 - 2, 1_000 - 1));
    }
}

each_backend! {
    /// A burst's decisions are made a chunk per core on shared blocking calls, not one call each:
    /// each answer still reaches its own order. 40 orders of one plugin, every third past the
    /// window and its grace (closed), the rest just past the window (their reminder phase): a
    /// pattern no shift by a chunk's length maps onto itself.
    async fn a_groups_decisions_made_on_shared_calls_each_reach_their_own_order(env) {
        env.stock_up(&[("sku-a", 1_000), ("sku-b", 1_000)]).await;
        for i in 0..40u32 {
            let deadline_ms = if i.is_multiple_of(3) { T0 - 60_000 } else { T0 };
            env.create(&order(&format!("m-{i:02}"), "flashy", deadline_ms)).await;
        }
        let (clock, _) = Clock::manual(T0 + 1);
        let d = env.dispatcher(&env.config(TWO_PHASE, ""), clock).await;
        let triggers = env.claim(T0 + 1).await;
        assert_eq!(triggers.len(), 40);
        let outcomes = d.handle_group(&triggers).await;
        for (t, o) in triggers.iter().zip(&outcomes) {
            let i: u32 = t.order_id[2..].parse().unwrap();
            if i.is_multiple_of(3) {
                assert!(matches!(o, Outcome::Closed { .. }), "{}: {o:?}", t.order_id);
                assert_eq!(env.status(&t.order_id).await, "CLOSED", "{}", t.order_id);
            } else {
                assert!(matches!(o, Outcome::Waiting { next_phase: 1, due_ms } if *due_ms == T0 + 60_000), "{}: {o:?}", t.order_id);
                assert_eq!(env.status(&t.order_id).await, "PENDING", "{}", t.order_id);
                assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE kind = 'remind' AND order_id = ?", &t.order_id).await, 1);
            }
        }
        assert_eq!(env.int("SELECT COUNT(*) FROM order_timeout_msg WHERE phase = 0 AND status <> ?", "PROCESSED").await, 0);
        assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE outcome = ?", "closed").await, 14);
        assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE outcome = ?", "waiting").await, 26);
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (1_000 - 26 * 2, 1_000 - 26));
    }
}

/// Waits until `n` transactions of this test's database are blocked on a row lock (the group
/// waiting for the payment's lock): PostgreSQL `pg_stat_activity`, MariaDB's process list.
async fn until_blocked_on_a_lock(env: &Env, n: i64) {
    let database = env.url.rsplit('/').next().unwrap().to_string();
    let sql = match env.db.backend() {
        Backend::Postgres => {
            "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = ?"
        }
        // The blocked locking reads, counted in the process list (`INNODB_TRX` is a cache
        // InnoDB refreshes only when unread for 100 ms: `Env::until_waiting_on_a_lock`).
        _ => {
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE INFO LIKE 'SELECT id FROM orders WHERE id IN %FOR UPDATE' AND DB = ?"
        }
    };
    let started = std::time::Instant::now();
    while env.int(sql, &database).await < n {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "the group never waited on the payment's lock"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// F12 for groups: payments commit while the group waits on their lock — after the orders were
/// read and decided. The paid close and the paid wait are left alone; the others go through.
/// (MariaDB and PostgreSQL: SQLite's single writer cannot interleave a payment there.)
async fn payments_committed_while_a_group_waits_on_their_lock_are_left_alone(env: &Env) {
    env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
    for i in 0..4 {
        env.create(&order(&format!("c-{i}"), "acme", T0)).await;
        env.create(&order(&format!("w-{i}"), "flashy", T0)).await;
    }
    let merchants = [SINGLE[0], TWO_PHASE[0]];
    let (clock, _) = Clock::manual(T0 + 1);
    let d = env.dispatcher(&env.config(&merchants, ""), clock).await;
    let triggers = env.claim(T0 + 1).await;
    assert_eq!(triggers.len(), 8);
    let mut payment = env.db.begin().await.unwrap();
    env.db
        .backend()
        .query("UPDATE orders SET status = 'PAID', paid_at_ms = ? WHERE id IN ('c-1', 'w-1') AND status = 'PENDING'")
        .bind(T0)
        .execute(&mut *payment)
        .await
        .unwrap();
    let group = {
        let (d, triggers) = (d.clone(), triggers.clone());
        tokio::spawn(async move { d.handle_group(&triggers).await })
    };
    until_blocked_on_a_lock(env, 1).await;
    assert!(
        !group.is_finished(),
        "the group went past the payment's lock"
    );
    payment.commit().await.unwrap();
    let outcomes = group.await.unwrap();
    for (t, o) in triggers.iter().zip(&outcomes) {
        match t.order_id.as_str() {
            "c-1" | "w-1" => assert!(matches!(o, Outcome::NoOp { .. }), "{}: {o:?}", t.order_id),
            id if id.starts_with('c') => {
                assert!(matches!(o, Outcome::Closed { .. }), "{id}: {o:?}")
            }
            id => assert!(matches!(o, Outcome::Waiting { .. }), "{id}: {o:?}"),
        }
    }
    for paid in ["c-1", "w-1"] {
        assert_eq!(env.status(paid).await, "PAID");
        assert_eq!(
            env.int(
                "SELECT COUNT(*) FROM effect_ledger WHERE order_id = ?",
                paid
            )
            .await,
            0
        );
        assert_eq!(
            env.int(
                "SELECT COUNT(*) FROM order_timeout_msg WHERE phase = 1 AND order_id = ?",
                paid
            )
            .await,
            0
        );
        assert_eq!(
            env.text(
                "SELECT status FROM order_timeout_msg WHERE phase = 0 AND order_id = ?",
                paid
            )
            .await,
            "PROCESSED"
        );
    }
    assert_eq!(
        env.int("SELECT COUNT(*) FROM orders WHERE status = ?", "CLOSED")
            .await,
        3
    );
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM order_timeout_msg WHERE phase = 1 AND source = ?",
            "wait"
        )
        .await,
        3
    );
    // Three closes gave back 2 + 1 units each; the five others hold theirs.
    assert_eq!(
        (env.stock("sku-a").await, env.stock("sku-b").await),
        (100 - 10, 100 - 5)
    );
}

/// F12, the sweep and the message path racing on one order: both triggers are decided and
/// reach the order's row lock at the same time (another transaction holds it until both are
/// seen waiting there). When it is let go, one compare-and-set closes the order and the other
/// finds it closed: one transition, stamped by the winner, one close record, stock and coupon
/// given back once.
async fn the_sweep_and_a_message_racing_on_one_order_close_it_once(env: &Env) {
    env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
    env.create(&order("raced", "acme", T0)).await;
    let (clock, _) = Clock::manual(T0 + 1);
    let d = env.dispatcher(&env.config(SINGLE, ""), clock).await;
    let mut holder = env.db.begin().await.unwrap();
    timeoutd::db::orders::lock_pending(&mut holder, &Schema::Canonical, &["raced"], None)
        .await
        .unwrap();
    let race: Vec<_> = [TriggerKind::DelayMessage, TriggerKind::Sweep]
        .into_iter()
        .map(|kind| {
            let (d, trigger) = (d.clone(), crate::support::trigger("raced", kind));
            tokio::spawn(async move { d.handle(&trigger).await })
        })
        .collect();
    until_blocked_on_a_lock(env, 2).await;
    holder.rollback().await.unwrap();
    let mut outcomes = Vec::new();
    for path in race {
        outcomes.push(path.await.unwrap());
    }
    assert_eq!(tally(&outcomes), (1, 1), "{outcomes:?}");
    assert!(
        outcomes.iter().any(
            |o| matches!(o, Outcome::NoOp { reason } if reason.contains("compare-and-set lost"))
        ),
        "{outcomes:?}"
    );
    assert_eq!(env.status("raced").await, "CLOSED");
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM decision_log WHERE outcome = 'closed' AND order_id = ?",
            "raced"
        )
        .await,
        1
    );
    assert_eq!(
        (env.stock("sku-a").await, env.stock("sku-b").await),
        (100, 100)
    );
    assert_eq!(env.coupon("cpn-raced").await, "AVAILABLE");
    assert_eq!(
        env.text("SELECT closed_by FROM orders WHERE id = ?", "raced")
            .await,
        if matches!(outcomes[0], Outcome::Closed { .. }) {
            "delay-message"
        } else {
            "sweep"
        },
        "stamped by the path that won"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sweep_and_a_message_racing_on_one_order_close_it_once_mariadb() {
    let env = Env::new(Backend::MySql).await;
    the_sweep_and_a_message_racing_on_one_order_close_it_once(&env).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sweep_and_a_message_racing_on_one_order_close_it_once_postgres() {
    let env = Env::new(Backend::Postgres).await;
    the_sweep_and_a_message_racing_on_one_order_close_it_once(&env).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn payments_committed_while_a_group_waits_on_their_lock_are_left_alone_mariadb() {
    let env = Env::new(Backend::MySql).await;
    payments_committed_while_a_group_waits_on_their_lock_are_left_alone(&env).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn payments_committed_while_a_group_waits_on_their_lock_are_left_alone_postgres() {
    let env = Env::new(Backend::Postgres).await;
    payments_committed_while_a_group_waits_on_their_lock_are_left_alone(&env).await;
    env.cleanup().await;
}

/// A group close that loses a deadlock on the hot stock rows runs again whole, not one order at
/// a time (the soak of 2026-12-07: each deadlocked group split into one transaction per order,
/// more transactions on the rows that deadlocked, until the shop fell behind). The group holds
/// `sku-a` and waits for `sku-b`, which another transaction holds; that one then asks for
/// `sku-a`. The group is the victim: on MariaDB because the other side changed more rows (InnoDB
/// rolls back the lighter), on PostgreSQL because the group waited first (its deadlock check,
/// `deadlock_timeout` after its wait began, finds the circle). Every order closes once, in one
/// transaction after the pause, and the stock is back exactly.
async fn a_group_close_that_loses_a_deadlock_runs_again_whole(env: &Env) {
    env.stock_up(&[("sku-a", 1_000), ("sku-b", 1_000)]).await;
    for i in 0..3 {
        env.create(&order(&format!("dl-{i}"), "acme", T0)).await;
    }
    let (clock, _) = Clock::manual(T0 + 1);
    let d = env.dispatcher(&env.config(SINGLE, ""), clock).await;
    let triggers = env.claim(T0 + 1).await;
    assert_eq!(triggers.len(), 3);
    let recorder = timeoutd::events::metrics_handle();
    let retried = "timeoutd_group_conflicts_total{group=\"close\",outcome=\"retried\"}";
    let before = crate::support::sample(&recorder.render(), retried).unwrap_or(0.0);
    let mut other = env.db.pool().begin().await.unwrap();
    // Heavier than the group: 200 rows changed (rolled back at the end).
    let filler: Vec<String> = (0..200).map(|i| format!("('filler-{i:03}', 1)")).collect();
    env.db
        .backend()
        .query_owned(format!(
            "INSERT INTO sku_stock (sku, available) VALUES {}",
            filler.join(", ")
        ))
        .execute(&mut *other)
        .await
        .unwrap();
    let hold = "UPDATE sku_stock SET available = available WHERE sku = ?";
    env.db
        .backend()
        .query(hold)
        .bind("sku-b")
        .execute(&mut *other)
        .await
        .unwrap();
    let group = tokio::spawn(async move { d.handle_group(&triggers).await });
    // The group has given back sku-a's stock and waits for sku-b's row.
    env.until_waiting_on_a_lock().await;
    env.db
        .backend()
        .query(hold)
        .bind("sku-a")
        .execute(&mut *other)
        .await
        .unwrap();
    other.rollback().await.unwrap();
    let (closed, noop) = tally(&group.await.unwrap());
    assert_eq!((closed, noop), (3, 0));
    assert!(
        crate::support::sample(&recorder.render(), retried).unwrap_or(0.0) > before,
        "the deadlocked group was run again whole ({retried})"
    );
    if let Some(transactions) = closing_transactions(env).await {
        assert_eq!(
            transactions, 1,
            "the three closes committed in one transaction, not split"
        );
    }
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM effect_ledger WHERE kind = ?",
            "restore-stock"
        )
        .await,
        6,
        "one stock release per order and SKU"
    );
    assert_eq!(
        (env.stock("sku-a").await, env.stock("sku-b").await),
        (1_000, 1_000)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_close_that_loses_a_deadlock_runs_again_whole_mariadb() {
    let env = Env::new(Backend::MySql).await;
    a_group_close_that_loses_a_deadlock_runs_again_whole(&env).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_close_that_loses_a_deadlock_runs_again_whole_postgres() {
    let env = Env::new(Backend::Postgres).await;
    a_group_close_that_loses_a_deadlock_runs_again_whole(&env).await;
    env.cleanup().await;
}

each_backend! {
    /// The broker consumer's claim of a group's rows (`relay::claim_rows`): one statement takes
    /// every open row nobody holds; each position gets its own answer — a row listed twice is
    /// taken once, a PROCESSED row is a duplicate, a held row is busy, an unknown id missing —
    /// and the rows taken carry the claim's lease in the table.
    async fn the_consumers_group_claim_takes_each_open_row_once(env) {
        for id in ["r-open", "r-other", "r-done", "r-held"] {
            env.create(&order(id, "acme", T0)).await;
        }
        let row = |id: &'static str| async move {
            env.int("SELECT id FROM order_timeout_msg WHERE order_id = ?", id).await
        };
        let (open, other, done, held) =
            (row("r-open").await, row("r-other").await, row("r-done").await, row("r-held").await);
        env.db.backend()
            .query("UPDATE order_timeout_msg SET status = 'PROCESSED' WHERE id = ?")
            .bind(done)
            .execute(env.db.pool())
            .await
            .unwrap();
        // Another handler holds r-held until T0 + 60 s.
        env.db.backend()
            .query("UPDATE order_timeout_msg SET claim_token = 'someone', claim_until_ms = ? WHERE id = ?")
            .bind(T0 + 60_000)
            .bind(held)
            .execute(env.db.pool())
            .await
            .unwrap();
        let missing = open + other + done + held + 1_000;
        let ids = [open, open, other, done, held, missing];
        let claims = relay::claim_rows(&env.db, &ids, T0 + 10, 30_000).await.unwrap();
        let shape: Vec<&str> = claims
            .iter()
            .map(|c| match c {
                RowClaim::Claimed(_) => "claimed",
                RowClaim::Busy => "busy",
                RowClaim::Processed => "processed",
                RowClaim::Missing => "missing",
            })
            .collect();
        assert_eq!(shape, ["claimed", "busy", "claimed", "processed", "busy", "missing"]);
        let RowClaim::Claimed(first) = &claims[0] else { unreachable!() };
        assert_eq!((first.id, first.order_id.as_str(), first.phase), (open, "r-open", 0));
        // Both taken rows hold one token and the lease; the held row kept its holder.
        let leased: Vec<(String, i64)> = env.db.backend()
            .query("SELECT claim_token, claim_until_ms FROM order_timeout_msg WHERE order_id IN ('r-open', 'r-other')")
            .fetch_all(env.db.pool())
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(leased.len(), 2);
        assert!(leased.iter().all(|l| *l == (leased[0].0.clone(), T0 + 30_010)), "{leased:?}");
        assert_eq!(env.text("SELECT claim_token FROM order_timeout_msg WHERE order_id = ?", "r-held").await, "someone");
        // While the lease runs, nobody else takes them; once it lapses, they can be taken again.
        let again = relay::claim_rows(&env.db, &[open, other], T0 + 20, 30_000).await.unwrap();
        assert_eq!(again, [RowClaim::Busy, RowClaim::Busy]);
        let lapsed = relay::claim_rows(&env.db, &[open], T0 + 40_000, 30_000).await.unwrap();
        assert!(matches!(lapsed[..], [RowClaim::Claimed(_)]), "{lapsed:?}");
    }
}

each_backend! {
    /// A broker burst's held rows reach a group from many claims (each listener call claims its
    /// own). The group closes them in one transaction and finishes their rows in one statement,
    /// each row fenced by its own claim: a row whose claim another holder took meanwhile is
    /// neither finished nor closed by this group, and the other orders still close once.
    async fn a_group_of_rows_from_several_claims_finishes_each_row_under_its_own_claim(env) {
        env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
        let ids: Vec<String> = (0..6).map(|i| format!("mix-{i}")).collect();
        for id in &ids {
            env.create(&order(id, "acme", T0)).await;
        }
        let mut rows = Vec::new();
        for pair in ids.chunks(2) {
            let mut row_ids = Vec::new();
            for id in pair {
                row_ids.push(env.int("SELECT id FROM order_timeout_msg WHERE order_id = ?", id).await);
            }
            for claim in relay::claim_rows(&env.db, &row_ids, T0 - 500, 30_000).await.unwrap() {
                let RowClaim::Claimed(row) = claim else { panic!("{claim:?}") };
                rows.push(row);
            }
        }
        let tokens: std::collections::HashSet<_> = rows.iter().map(|r| r.claim_token.clone()).collect();
        assert_eq!(tokens.len(), 3, "three claims");
        // mix-3's claim lapsed and another daemon holds its row now.
        env.db.backend()
            .query("UPDATE order_timeout_msg SET claim_token = 'thief', claim_until_ms = ? WHERE order_id = ?")
            .bind(T0 + 60_000)
            .bind("mix-3")
            .execute(env.db.pool())
            .await
            .unwrap();
        let triggers: Vec<Trigger> = rows
            .iter()
            .map(|r| Trigger::of_row(r, TriggerKind::DelayMessage).unwrap())
            .collect();
        let config = env.config(SINGLE, "");
        let (clock, _) = Clock::manual(T0 + 1);
        env.dispatcher(&config, clock).await.handle_group(&triggers).await;
        for id in &ids {
            let (status, row) = (
                env.status(id).await,
                env.text("SELECT status FROM order_timeout_msg WHERE order_id = ?", id).await,
            );
            if id == "mix-3" {
                assert_eq!((status.as_str(), row.as_str()), ("PENDING", "PENDING"), "{id}: its new holder's");
            } else {
                assert_eq!((status.as_str(), row.as_str()), ("CLOSED", "PROCESSED"), "{id}");
            }
        }
        assert_eq!(
            env.text("SELECT claim_token FROM order_timeout_msg WHERE order_id = ?", "mix-3").await,
            "thief"
        );
        // 100 at first, 2 + 1 units locked per order, the five closed ones given back.
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (100 - 2, 100 - 1));

        // Without a thief, rows of three claims close in one transaction.
        let ids: Vec<String> = (0..6).map(|i| format!("mix2-{i}")).collect();
        let mut rows = Vec::new();
        for pair in ids.chunks(2) {
            let mut row_ids = Vec::new();
            for id in pair {
                env.create(&order(id, "acme", T0)).await;
                row_ids.push(env.int("SELECT id FROM order_timeout_msg WHERE order_id = ?", id).await);
            }
            for claim in relay::claim_rows(&env.db, &row_ids, T0 - 500, 30_000).await.unwrap() {
                let RowClaim::Claimed(row) = claim else { panic!("{claim:?}") };
                rows.push(row);
            }
        }
        let triggers: Vec<Trigger> = rows
            .iter()
            .map(|r| Trigger::of_row(r, TriggerKind::DelayMessage).unwrap())
            .collect();
        let before = closing_transactions(env).await;
        let (clock, _) = Clock::manual(T0 + 1);
        let outcomes = env.dispatcher(&config, clock).await.handle_group(&triggers).await;
        assert_eq!(tally(&outcomes), (6, 0));
        for id in &ids {
            assert_eq!(env.text("SELECT status FROM order_timeout_msg WHERE order_id = ?", id).await, "PROCESSED");
        }
        if let (Some(before), Some(after)) = (before, closing_transactions(env).await) {
            assert_eq!(after - before, 1, "one transaction closed the six");
        }
    }
}

each_backend! {
    /// A group decided at the deadline that then waits (another transaction holds a SKU's row
    /// on MariaDB and PostgreSQL, the database's write lock on SQLite) is stamped when it is
    /// written: `closed_at_ms` is the clock after the wait, not the one it was decided by. On
    /// SQLite the wait is at `BEGIN IMMEDIATE`, before any statement; on the servers it is at
    /// the stock statement, so there the test also holds the stock-before-close order.
    async fn a_group_that_waits_for_a_lock_is_stamped_when_written_not_when_decided(env) {
        env.stock_up(&[("sku-a", 1_000), ("sku-b", 1_000)]).await;
        // A merchant of this run alone, so its decision counter counts only these orders.
        let merchant = format!("stamp-{:08x}", fastrand::u32(..));
        for i in 0..3 {
            env.create(&order(&format!("wait-{i}"), &merchant, T0)).await;
        }
        let config = env.config(&[(merchant.as_str(), "builtin:single-phase", &[])], "");
        let (clock, now) = Clock::manual(T0 + 1);
        let dispatcher = env.dispatcher(&config, clock).await;
        let triggers = env.claim(T0 + 1).await;
        assert_eq!(triggers.len(), 3);
        // Another writer holds the hot SKU's row (and on SQLite the write lock).
        let mut holder = env.db.pool().begin().await.unwrap();
        env.db
            .backend()
            .query("UPDATE sku_stock SET available = available WHERE sku = ?")
            .bind("sku-a")
            .execute(&mut *holder)
            .await
            .unwrap();
        // (This process's recorder, installed before the group decides anything.)
        let recorder = timeoutd::events::metrics_handle();
        let group = tokio::spawn(async move { dispatcher.handle_group(&triggers).await });
        // The group is decided at T0 + 1 (all three decisions counted), then waits for the row:
        // on the servers until it is seen blocked in the server's own lock view.
        let decided = format!("timeoutd_decisions_total{{merchant=\"{merchant}\",decision=\"cancel\"}}");
        let started = std::time::Instant::now();
        while crate::support::sample(&recorder.render(), &decided) != Some(3.0) {
            assert!(started.elapsed() < std::time::Duration::from_secs(30), "the group was never decided");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        if env.db.backend() != Backend::Sqlite {
            env.until_waiting_on_a_lock().await;
        }
        assert!(!group.is_finished(), "the group waits for the held row");
        now.store(T0 + 5_000, std::sync::atomic::Ordering::SeqCst);
        holder.rollback().await.unwrap();
        let (closed, noop) = tally(&group.await.unwrap());
        assert_eq!((closed, noop), (3, 0));
        for sql in [
            "SELECT MIN(closed_at_ms) FROM orders WHERE status = ?",
            "SELECT MAX(closed_at_ms) FROM orders WHERE status = ?",
            "SELECT MIN(created_at_ms) FROM effect_ledger WHERE order_id IN (SELECT id FROM orders WHERE status = ?)",
            "SELECT MAX(processed_at_ms) FROM order_timeout_msg WHERE order_id IN (SELECT id FROM orders WHERE status = ?)",
        ] {
            assert_eq!(
                env.int(sql, "CLOSED").await,
                T0 + 5_000,
                "each close, its ledger rows and its outbox row stamped with the clock they were written at, after the wait: {sql}"
            );
        }
        assert_eq!(
            env.int("SELECT MAX(decided_at_ms) FROM decision_log WHERE outcome = ?", "closed").await,
            T0 + 1,
            "decided before the wait, by the clock then"
        );
        assert_eq!(env.stock("sku-a").await, 1_000, "stock back once the row was free");
    }
}
