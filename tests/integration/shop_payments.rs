//! Payments on a shop's own tables (the profile's `[paid]`, #42): a payment timeoutd learns of
//! — a provider's notice, the paid topic, a lost notification found by alignment — is recorded
//! in mall's tables as mall's own `paySuccess` records it (status 0 → 1, `payment_time`,
//! `pay_type`, each line's locked units sold from `stock`), once, and never beside a close.

use std::collections::HashMap;

use timeoutd::clock::Clock;
use timeoutd::db::{Backend, DbError};
use timeoutd::dispatch::Outcome;
use timeoutd::paid::{self, Applied};

use crate::fakes::Provider;
use crate::shop::{Line, Mall, Placed, profile_path};

/// mall's payment window (the fixture's `normal_order_overtime`), ms.
const WINDOW_MS: i64 = 15 * 60_000;

/// What a paid notice may change in mall's tables for one order: its status, payment time,
/// pay type, the SKUs' `stock` and `lock_stock`, the member's coupon rows and points.
async fn shop_state(mall: &Mall, id: i64, member: i64, skus: &[i64]) -> Vec<String> {
    let mut state = vec![
        mall.status(id).await.to_string(),
        payment_time(mall, id).await,
        mall.int(
            "SELECT CAST(pay_type AS SIGNED) FROM oms_order WHERE id = ?",
            id,
        )
        .await
        .to_string(),
        mall.points(member).await.to_string(),
        mall.int(
            "SELECT CAST(SUM(use_status) AS SIGNED) FROM sms_coupon_history WHERE member_id = ?",
            member,
        )
        .await
        .to_string(),
    ];
    for sku in skus {
        state.push(format!(
            "{}/{}",
            on_hand(mall, *sku).await,
            mall.locked(*sku).await
        ));
    }
    state
}

/// `pms_sku_stock.stock` of `sku`.
async fn on_hand(mall: &Mall, sku: i64) -> i64 {
    mall.int(
        "SELECT CAST(stock AS SIGNED) FROM pms_sku_stock WHERE id = ?",
        sku,
    )
    .await
}

/// `oms_order.payment_time` of `id` as mall's wall time text, or "" when unset.
async fn payment_time(mall: &Mall, id: i64) -> String {
    mall.text(
        "SELECT CAST(payment_time AS CHAR) FROM oms_order WHERE id = ?",
        id,
    )
    .await
}

/// mall's order `id` of `member`, created at `created_ms`, with `lines`, coupon 5 and 40 points.
async fn place(mall: &Mall, id: i64, member: i64, lines: &[Line], created_ms: i64) {
    mall.place(&Placed {
        id,
        member,
        coupon: Some(5),
        points: Some(40),
        lines,
        created_ms,
        status: 0,
        deleted: 0,
    })
    .await;
}

/// A paid notice for a pending mall order records what `paySuccess` would: status 1, the
/// payment time in Shanghai wall time, `pay_type` 1, each line's units sold (`stock` and
/// `lock_stock` both lowered), the coupon kept used and the points kept spent. A repeat changes
/// nothing. A notice for an order closed first is a paid-after-close, mall's tables untouched.
/// A line whose lock holds fewer units than it sells fails the payment whole (named, nothing
/// written). A profile without `[paid]` leaves payments to the shop: refused, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paid_notice_records_the_payment_as_malls_pay_success_would() {
    paid_notice_as_malls_pay_success_would(Backend::MySql).await;
}

/// The same on PostgreSQL (mall's tables in a schema of their own).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paid_notice_records_the_payment_on_postgresql() {
    paid_notice_as_malls_pay_success_would(Backend::Postgres).await;
}

async fn paid_notice_as_malls_pay_success_would(backend: Backend) {
    let mall = Mall::on(backend).await;
    let now = mall.env.db.now_ms().await.unwrap();
    mall.stock_up(&[201, 202, 203], 100).await;
    for member in [9, 10, 11] {
        mall.member(member, 100, &[5]).await;
    }
    place(
        &mall,
        2001,
        9,
        &[(201, 2, "12.50"), (202, 1, "9.90")],
        now - 60_000,
    )
    .await;
    place(
        &mall,
        2002,
        10,
        &[(201, 1, "12.50")],
        now - WINDOW_MS - 60_000,
    )
    .await;
    place(&mall, 2003, 11, &[(203, 3, "1.00")], now - 60_000).await;
    let config = mall.config("");
    let db = mall.mapped(&config);
    let (resolutions, clock) = (HashMap::new(), Clock::Database);
    let apply = |id: &'static str| paid::apply(&db, &clock, &resolutions, id, "callback");

    let before = mall.env.db.now_ms().await.unwrap();
    assert_eq!(apply("2001").await.unwrap(), Applied::Aligned);
    let after = mall.env.db.now_ms().await.unwrap();
    let paid_at = payment_time(&mall, 2001).await;
    assert!(
        mall.local(before - 1_000) <= paid_at && paid_at <= mall.local(after + 1_000),
        "payment_time {paid_at} is the notice's time in Shanghai ({} – {})",
        mall.local(before),
        mall.local(after)
    );
    let paid = shop_state(&mall, 2001, 9, &[201, 202]).await;
    assert_eq!(
        paid[2..],
        ["1", "60", "1", "98/1", "99/0"].map(String::from),
        "pay_type 1; points and coupon kept; 2 + 1 units sold (2002 still locks one of 201)"
    );
    assert_eq!(paid[0], "1");
    assert_eq!(apply("2001").await.unwrap(), Applied::AlreadyPaid);
    assert_eq!(
        shop_state(&mall, 2001, 9, &[201, 202]).await,
        paid,
        "a repeat changes nothing"
    );

    // 2002 is closed at its deadline first; its payment lands after.
    let d = mall.env.dispatcher(&config, Clock::Database).await;
    let closed = d
        .handle(&crate::support::trigger(
            "2002",
            timeoutd_runtime::model::TriggerKind::Sweep,
        ))
        .await;
    assert!(matches!(closed, Outcome::Closed { .. }), "{closed:?}");
    let closed_state = shop_state(&mall, 2002, 10, &[201]).await;
    assert_eq!(closed_state[0], "4");
    // The payment's compare-and-set itself refuses an order no longer pending, whoever asks.
    let mut conn = db.pool().acquire().await.unwrap();
    let paid_closed = timeoutd::db::orders::pay(&mut conn, db.schema(), "2002", now, now).await;
    assert!(!paid_closed.unwrap(), "a closed order was moved to paid");
    drop(conn);
    assert_eq!(shop_state(&mall, 2002, 10, &[201]).await, closed_state);
    assert!(matches!(
        apply("2002").await.unwrap(),
        Applied::AfterClose { new: true, .. }
    ));
    assert_eq!(
        shop_state(&mall, 2002, 10, &[201]).await,
        closed_state,
        "mall's tables untouched"
    );
    assert_eq!(
        mall.env
            .int(
                "SELECT COUNT(*) FROM paid_after_close WHERE order_id = ?",
                "2002"
            )
            .await,
        1
    );

    // Someone took 203's lock down to 1: its 3 units cannot be sold from it.
    mall.exec(
        "UPDATE pms_sku_stock SET lock_stock = 1 WHERE id = ?",
        &[203],
    )
    .await;
    let unsold = shop_state(&mall, 2003, 11, &[203]).await;
    match apply("2003").await {
        Err(DbError::BadRow { detail, .. }) => {
            assert!(detail.contains("SKU `203` cannot sell 3 units"), "{detail}")
        }
        other => panic!("a payment whose units cannot be sold was {other:?}"),
    }
    assert_eq!(
        shop_state(&mall, 2003, 11, &[203]).await,
        unsold,
        "nothing written, status 0 kept"
    );

    // The same shop with payments left to its own service.
    let text = std::fs::read_to_string(profile_path()).unwrap();
    let without = std::env::temp_dir().join(format!("mall-no-paid-{}.toml", std::process::id()));
    std::fs::write(&without, &text[..text.find("[paid]").unwrap()]).unwrap();
    let config = mall.config_with(&without, "");
    let db = mall.mapped(&config);
    mall.exec(
        "UPDATE pms_sku_stock SET lock_stock = 3 WHERE id = ?",
        &[203],
    )
    .await;
    let held = shop_state(&mall, 2003, 11, &[203]).await;
    match paid::apply(&db, &clock, &resolutions, "2003", "callback").await {
        Err(DbError::Config(m)) => assert!(m.contains("add `[paid]` to the profile"), "{m}"),
        other => panic!("a profile without [paid] recorded a payment: {other:?}"),
    }
    assert_eq!(shop_state(&mall, 2003, 11, &[203]).await, held);
    std::fs::remove_file(&without).unwrap();
    mall.cleanup().await;
}

/// Seed 002 on mall's tables: a buyer paid at Alipay but the notification was lost. At the
/// deadline the provider is asked, says paid (at its own time), and the order is aligned as
/// `paySuccess` would have done it: status 1, `payment_time` the provider's, units sold, coupon
/// and points kept, an `order-paid` notice, decision `align`; nothing closed anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_payment_notification_is_aligned_on_malls_own_tables() {
    let mall = Mall::new().await;
    mall.stock_up(&[301], 100).await;
    let now = mall
        .place_due(1, (3_001, 30), 5, 40, (301, 2, "17.45"))
        .await;
    let provider = Provider::start().await;
    let reference = "2026120601003001"; // mall's order_sn: its out_trade_no at Alipay
    let paid_at = now - 120_000;
    provider.books.lock().unwrap().pay(reference, paid_at);
    let config = mall.config(&format!(
        "[payment]\nbase_url = \"{}\"\nattempts = 2\ntimeout = \"1s\"\n",
        provider.base_url
    ));
    let db = mall.mapped(&config);
    let (clock, _) = Clock::manual(now);
    let swept = timeoutd::sources::sweep::sweep_once(&db, &clock, &config.sweep)
        .await
        .unwrap();
    assert_eq!(swept.rearmed, 1);
    let d = mall.env.dispatcher(&config, clock).await;
    let outcomes = mall.env.process(&d, now).await;
    assert_eq!(
        outcomes,
        vec![Outcome::Aligned {
            paid_at_ms: paid_at
        }]
    );
    assert_eq!(
        shop_state(&mall, 3_001, 30, &[301]).await,
        ["1", &mall.local(paid_at), "1", "10", "1", "98/0"].map(String::from),
        "paid at the provider's time, units sold, coupon and points kept"
    );
    let env = &mall.env;
    assert_eq!(
        env.text(
            "SELECT decision FROM decision_log WHERE order_id = ?",
            "3001"
        )
        .await,
        "align"
    );
    assert!(
        env.text(
            "SELECT payload FROM effect_ledger WHERE order_id = ?",
            "3001"
        )
        .await
        .contains("order-paid")
    );
    let (closes, refunds) = {
        let books = provider.books.lock().unwrap();
        (books.calls_for("close", reference), books.refunds.len())
    };
    assert_eq!(
        (closes, refunds),
        (0, 0),
        "nothing closed or refunded at the provider"
    );
    mall.cleanup().await;
}

/// F12 with timeoutd recording both sides: paid notices for 40 due mall orders race their
/// closes. Each order ends paid (its units sold, coupon and points kept) or closed (all given
/// back, and a late notice recorded as paid-after-close): never both. Nothing stays locked,
/// and `stock` fell by exactly the paid orders' units.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paid_notices_racing_the_closes_sell_or_release_each_order_once() {
    const N: i64 = 40;
    let mall = Mall::new().await;
    mall.stock_up(&[401], 1_000).await;
    let now = mall
        .place_due(N, (4_000, 2_000), 9, 10, (401, 2, "5.00"))
        .await;
    let d = mall.swept(now, N).await;
    let config = mall.config("");
    let db = mall.mapped(&config);
    let payer = tokio::spawn(async move {
        let mut applied = Vec::new();
        for k in (0..N).rev() {
            let id = (4_000 + k).to_string();
            let a = paid::apply(&db, &Clock::Database, &HashMap::new(), &id, "paid-message").await;
            applied.push((4_000 + k, a.unwrap()));
        }
        applied
    });
    let outcomes = crate::shop::process(&mall.env, &d, now).await;
    let applied = payer.await.unwrap();
    let paid: Vec<i64> = applied
        .iter()
        .filter(|(_, a)| *a == Applied::Aligned)
        .map(|(id, _)| *id)
        .collect();
    let late = applied
        .iter()
        .filter(|(_, a)| matches!(a, Applied::AfterClose { new: true, .. }))
        .count() as i64;
    let closed = outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Closed { .. }))
        .count() as i64;
    assert_eq!(closed + paid.len() as i64, N, "{outcomes:?}");
    assert_eq!(
        late, closed,
        "every closed order's notice came after its close"
    );
    for k in 0..N {
        let (id, member) = (4_000 + k, 2_000 + k);
        let state = shop_state(&mall, id, member, &[]).await;
        let want: [&str; 3] = if paid.contains(&id) {
            ["1", "40", "1"]
        } else {
            ["4", "50", "0"]
        };
        assert_eq!(
            [&state[0], &state[3], &state[4]],
            want.map(String::from).each_ref(),
            "{id}"
        );
    }
    assert_eq!(mall.locked(401).await, 0, "every lock sold or released");
    assert_eq!(on_hand(&mall, 401).await, 1_000 - 2 * paid.len() as i64);
    assert_eq!(
        mall.env
            .int(
                "SELECT COUNT(*) FROM paid_after_close WHERE order_id <> ?",
                ""
            )
            .await,
        closed
    );
    eprintln!("race: {} paid first, {closed} closed first", paid.len());
    mall.cleanup().await;
}

/// `POST /v1/orders/{id}/payment-attempts` on mall's orders (seed 002's aggregated payment, as
/// mall's `tradeQrCode` would call it before asking Alipay): a pending order not yet due is
/// held for `http.payment_lease` (a row of timeoutd's `payment_leases`); one past its deadline,
/// a paid one and a closed one are refused with their state; no order is 404. Past the deadline
/// the held orders' closes, in one group with an unheld order that closes, are deferred to the
/// lease's end with their locks kept. One of them is paid meanwhile. When the lease lapses the
/// other closes, once, and the paid one is left paid. Retention then deletes the lapsed leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_attempt_holds_a_mall_order_against_its_close_until_the_lease_lapses() {
    let mall = Mall::new().await;
    // Whole seconds: mall's DATETIMEs hold no more.
    let now = mall.env.db.now_ms().await.unwrap() / 1_000 * 1_000;
    mall.stock_up(&[501, 502, 503], 100).await;
    for member in [51, 52, 53, 54] {
        mall.member(member, 100, &[5]).await;
    }
    let due_ms = now + 30_000;
    place(&mall, 5001, 51, &[(501, 2, "5.00")], due_ms - WINDOW_MS).await;
    place(&mall, 5002, 52, &[(502, 1, "5.00")], due_ms - WINDOW_MS).await;
    place(
        &mall,
        5003,
        53,
        &[(501, 1, "5.00")],
        now - WINDOW_MS - 60_000,
    )
    .await;
    mall.place(&Placed {
        id: 5004,
        member: 54,
        coupon: None,
        points: None,
        lines: &[(503, 1, "5.00")],
        created_ms: now - 60_000,
        status: 1,
        deleted: 0,
    })
    .await;
    let config = mall.config(
        "[http]\nlisten = \"127.0.0.1:0\"\ncallback_token = \"cb-secret\"\npayment_lease = \"90s\"\n",
    );
    let db = mall.mapped(&config);
    let (clock, at) = Clock::manual(now);
    let runner = mall.env.runner(&config, clock.clone()).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let state = timeoutd::http::HttpState::new(db.clone(), runner, &config);
    let server = tokio::spawn(timeoutd::http::serve(listener, state, stopped));
    let client = reqwest::Client::new();
    let attempt = |id: &str| {
        let request = client
            .post(format!("http://{addr}/v1/orders/{id}/payment-attempts"))
            .bearer_auth("cb-secret");
        async move {
            let answer = request.send().await.unwrap();
            let status = answer.status().as_u16();
            (status, answer.json::<serde_json::Value>().await.unwrap())
        }
    };
    let lease_end = now + 90_000;
    for id in ["5001", "5002"] {
        let (status, body) = attempt(id).await;
        assert_eq!(
            (status, body["lease_until_ms"].as_i64()),
            (200, Some(lease_end)),
            "{id}: {body}"
        );
    }
    let refused = |state: &str, deadline: i64| (409, Some(state.to_string()), Some(deadline));
    let read = |(status, body): (u16, serde_json::Value)| {
        (
            status,
            body["status"].as_str().map(String::from),
            body["deadline_ms"].as_i64(),
        )
    };
    assert_eq!(
        read(attempt("5003").await),
        refused("PENDING", now - 60_000),
        "past its deadline"
    );
    assert_eq!(
        read(attempt("5004").await),
        refused("PAID", now - 60_000 + WINDOW_MS)
    );
    assert_eq!(attempt("5999").await.0, 404);
    assert_eq!(attempt("not-a-mall-id").await.0, 404);
    let leases = |sql: &'static str| {
        let pool = mall.env.db.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert_eq!(leases("SELECT COUNT(*) FROM payment_leases").await, 2);
    assert_eq!(
        leases("SELECT MIN(until_ms) FROM payment_leases WHERE order_id IN ('5001', '5002')").await,
        lease_end
    );

    // Past the deadline, inside the lease: the sweep re-arms the three pending orders, and
    // their group close leaves the held two, deferred to the lease's end.
    let past = due_ms + 20_000;
    at.store(past, std::sync::atomic::Ordering::SeqCst);
    let swept = timeoutd::sources::sweep::sweep_once(&db, &clock, &config.sweep)
        .await
        .unwrap();
    assert_eq!(swept.rearmed, 3);
    let d = mall.env.dispatcher(&config, clock.clone()).await;
    let mut group = mall.env.claim(past).await;
    group.sort_by(|a, b| a.order_id.cmp(&b.order_id));
    let outcomes = d.handle_group(&group).await;
    let deferred = Outcome::Deferred {
        until_ms: lease_end,
    };
    assert_eq!(outcomes[..2], [deferred.clone(), deferred], "{outcomes:?}");
    assert!(
        matches!(outcomes[2], Outcome::Closed { .. }),
        "{outcomes:?}"
    );
    assert_eq!(
        [
            mall.status(5001).await,
            mall.status(5002).await,
            mall.status(5003).await
        ],
        [0, 0, 4]
    );
    assert_eq!(
        (mall.locked(501).await, mall.locked(502).await),
        (2, 1),
        "the held orders' locks kept"
    );
    assert_eq!(
        mall.env
            .int(
                "SELECT due_ms FROM order_timeout_msg WHERE order_id = ?",
                "5001"
            )
            .await,
        lease_end
    );
    assert_eq!(
        read(attempt("5003").await),
        refused("CLOSED", now - 60_000),
        "a closed order cannot be paid"
    );

    // The buyer of 5002 pays within the lease; 5001's lease lapses unpaid.
    let applied = paid::apply(&db, &clock, &HashMap::new(), "5002", "callback").await;
    assert_eq!(applied.unwrap(), Applied::Aligned);
    at.store(lease_end, std::sync::atomic::Ordering::SeqCst);
    let mut group = mall.env.claim(lease_end).await;
    group.sort_by(|a, b| a.order_id.cmp(&b.order_id));
    let outcomes = d.handle_group(&group).await;
    assert!(
        matches!(outcomes[0], Outcome::Closed { .. }),
        "{outcomes:?}"
    );
    assert!(matches!(outcomes[1], Outcome::NoOp { .. }), "{outcomes:?}");
    assert_eq!([mall.status(5001).await, mall.status(5002).await], [4, 1]);
    assert_eq!(
        (mall.locked(501).await, mall.locked(502).await),
        (0, 0),
        "released once, sold once"
    );
    assert_eq!(on_hand(&mall, 502).await, 99, "5002's unit sold");
    assert_eq!(read(attempt("5001").await), refused("CLOSED", due_ms));
    assert_eq!(
        leases("SELECT COUNT(*) FROM decision_log WHERE outcome = 'deferred'").await,
        2
    );

    // A day and a second later, retention deletes the lapsed leases.
    let (later, _) = Clock::manual(lease_end + 86_401_000);
    timeoutd::retention::pass(&db, &later, &config.retention, "test", None)
        .await
        .unwrap()
        .expect("the retention lease was free");
    assert_eq!(leases("SELECT COUNT(*) FROM payment_leases").await, 0);
    stop.send(true).unwrap();
    server.await.unwrap();
    mall.cleanup().await;
}

/// The race the lease guards, made deterministic: a payment attempt holds mall's order row
/// (its lease written, not yet committed) while a close that found the order due waits for
/// that row. The attempt commits; the close must see the lease and defer to its end, the
/// order and its lock untouched (a close that read the lease before the row was its own would
/// close an order a cashier is taking money for).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_committed_while_the_close_waits_for_the_order_row_holds_the_close() {
    lease_committed_while_the_close_waits(Backend::MySql).await;
}

/// The same on PostgreSQL, where the close reads the lease `FOR SHARE` and the attempt writes
/// it with `ON CONFLICT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_committed_while_the_close_waits_holds_the_close_on_postgresql() {
    lease_committed_while_the_close_waits(Backend::Postgres).await;
}

async fn lease_committed_while_the_close_waits(backend: Backend) {
    let mall = Mall::on(backend).await;
    let now = mall.env.db.now_ms().await.unwrap() / 1_000 * 1_000;
    mall.stock_up(&[601], 100).await;
    mall.member(61, 100, &[5]).await;
    let due_ms = now - 30_000;
    place(&mall, 6001, 61, &[(601, 3, "5.00")], due_ms - WINDOW_MS).await;
    let config = mall.config("");
    let db = mall.mapped(&config);
    let (clock, _) = Clock::manual(now);
    let swept = timeoutd::sources::sweep::sweep_once(&db, &clock, &config.sweep)
        .await
        .unwrap();
    assert_eq!(swept.rearmed, 1);
    let d = mall.env.dispatcher(&config, clock).await;

    // The cashier's attempt, as the HTTP handler makes it, a second before the deadline.
    let mut attempt = db.begin().await.unwrap();
    let held = timeoutd::db::orders::take_payment_lease(
        &mut attempt,
        db.schema(),
        "6001",
        due_ms - 1_000,
        due_ms + 60_000,
    )
    .await
    .unwrap();
    assert_eq!(
        held,
        timeoutd::db::orders::Attempt::Held {
            until_ms: due_ms + 60_000
        }
    );
    let group = mall.env.claim(now).await;
    assert_eq!(group.len(), 1);
    let closing = tokio::spawn(async move { d.handle_group(&group).await });
    mall.env.until_waiting_on_a_lock().await;
    attempt.commit().await.unwrap();
    let outcomes = closing.await.unwrap();
    assert_eq!(
        outcomes,
        [Outcome::Deferred {
            until_ms: due_ms + 60_000
        }]
    );
    assert_eq!((mall.status(6001).await, mall.locked(601).await), (0, 3));
    assert_eq!(
        mall.env
            .int(
                "SELECT due_ms FROM order_timeout_msg WHERE order_id = ?",
                "6001"
            )
            .await,
        due_ms + 60_000
    );
    mall.cleanup().await;
}
