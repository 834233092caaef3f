//! Policy API 0.2.0 in the daemon, beside a 0.1.0 plugin: the tea-house plugin — in Rust on
//! every backend, in JavaScript and Python on SQLite — is asked when the daemon first sees the
//! order's row (the early look), reminds before the deadline, hands state from phase to phase,
//! and closes at the deadline — a VIP order after a second reminder and its grace; the 0.1.0
//! merchant's order is not asked before its deadline. And a manifest the merchant's config does
//! not fit stops start-up, naming every problem.

use timeoutd::clock::Clock;
use timeoutd::db::outbox;
use timeoutd::dispatch::{Dispatcher, Outcome};
use timeoutd_runtime::model::Order;

use crate::support::{Env, MerchantSpec, T0, each_backend, order};

const MIN: i64 = 60_000;

/// Merchant `tea` on `plugin` (see [`MerchantSpec`]) beside the 0.1.0 `acme`.
fn merchants(plugin: &str) -> [MerchantSpec<'_>; 2] {
    [("tea", plugin, &[]), ("acme", "builtin:single-phase", &[])]
}

fn tea_order(id: &str, total_cents: i64) -> Order {
    let mut o = order(id, "tea", T0);
    o.total_cents = total_cents;
    o
}

/// The outbox timer's early look at `now_ms`: every row not yet due and never seen, handled.
async fn early_look(env: &Env, d: &Dispatcher, now_ms: i64) -> Vec<(String, Outcome)> {
    let rows = outbox::claim_unseen(&env.db, now_ms, 1000, 30_000)
        .await
        .unwrap();
    let mut outcomes = Vec::new();
    for row in rows {
        let trigger = timeoutd::sources::outbox::trigger_of(&row).unwrap();
        outcomes.push((trigger.order_id.clone(), d.handle(&trigger).await));
    }
    outcomes.sort_by(|a, b| a.0.cmp(&b.0));
    outcomes
}

async fn reminders(env: &Env, id: &str) -> Vec<String> {
    let rows = env
        .db
        .backend()
        .query("SELECT payload FROM effect_ledger WHERE kind = 'remind' AND order_id = ? ORDER BY phase")
        .bind(id.to_string())
        .fetch_all(env.db.pool())
        .await
        .unwrap();
    rows.iter()
        .map(|r| {
            let payload: String = sqlx::Row::get(r, 0);
            let v: serde_json::Value = serde_json::from_str(&payload).unwrap();
            v["template"].as_str().unwrap().to_string()
        })
        .collect()
}

each_backend! {
    async fn a_0_2_0_plugin_reminds_before_the_deadline_and_closes_at_it_beside_a_0_1_0_plugin(env) {
        tea_house_in_the_daemon(env, "tea-house").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_javascript_tea_house_runs_the_same_timeline_in_the_daemon() {
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    tea_house_in_the_daemon(&env, "tea-house-js").await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_python_tea_house_runs_the_same_timeline_in_the_daemon() {
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    tea_house_in_the_daemon(&env, "tea-house-py").await;
    env.cleanup().await;
}

/// The tea-house timeline with merchant `tea` on `plugin` (`tea-house`, or a component built by
/// `scripts/build-polyglot-plugins`), beside the 0.1.0 merchant `acme`.
async fn tea_house_in_the_daemon(env: &Env, plugin: &str) {
    env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
    env.create(&tea_order("t-small", 3_490)).await;
    env.create(&tea_order("t-vip", 120_000)).await;
    env.create(&order("a-old", "acme", T0)).await;
    let created = T0 - 15 * MIN;
    let (clock, now) = Clock::manual(created + 1_000);
    let config = if plugin == "tea-house" {
        env.config(&merchants(plugin), "")
    } else {
        // A component carrying a language runtime: its limits, and the compiled-code cache.
        env.config_for(
            &merchants(plugin),
            "plugin_deadline = \"2s\"\nplugin_max_memory_mib = 128",
            &format!(
                "[runtime]\ncache_dir = \"{}\"\n",
                crate::polyglot::cwasm_cache().display()
            ),
        )
    };
    let d = env.dispatcher(&config, clock).await;
    let at = |ms: i64| now.store(ms, std::sync::atomic::Ordering::SeqCst);

    // The early look, a second after creation: the 0.2.0 plugin decides its first phase
    // now; the 0.1.0 merchant's row is looked at once and left as it was.
    let first = early_look(env, &d, created + 1_000).await;
    assert_eq!(
        first[0],
        ("a-old".into(), Outcome::Deferred { until_ms: T0 })
    );
    assert_eq!(
        first[1],
        (
            "t-small".into(),
            Outcome::Waiting {
                next_phase: 1,
                due_ms: T0 - 2 * MIN
            }
        )
    );
    assert_eq!(
        first[2],
        (
            "t-vip".into(),
            Outcome::Waiting {
                next_phase: 1,
                due_ms: T0 - 2 * MIN
            }
        )
    );
    assert_eq!(
        env.text(
            "SELECT status FROM order_timeout_msg WHERE phase = 0 AND order_id = ?",
            "a-old"
        )
        .await,
        "PENDING"
    );
    assert_eq!(
        env.int(
            "SELECT due_ms FROM order_timeout_msg WHERE phase = 0 AND order_id = ?",
            "a-old"
        )
        .await,
        T0
    );
    assert!(
        early_look(env, &d, created + 2_000).await.is_empty(),
        "each row is looked at once"
    );
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM decision_log WHERE order_id = ?",
            "a-old"
        )
        .await,
        0,
        "the 0.1.0 plugin was not asked"
    );

    // Two minutes before the deadline: both tea orders are reminded, and say so in state.
    at(T0 - 2 * MIN);
    let reminded = env.process(&d, T0 - 2 * MIN).await;
    assert_eq!(reminded.len(), 2, "{reminded:?}");
    assert!(
        reminded
            .iter()
            .all(|o| matches!(o, Outcome::Waiting { .. })),
        "{reminded:?}"
    );
    assert_eq!(reminders(env, "t-small").await, ["order-closing-soon"]);
    assert_eq!(reminders(env, "t-vip").await, ["order-closing-soon"]);
    assert_eq!(
        env.text(
            "SELECT status FROM effect_ledger WHERE kind = 'remind' AND order_id = ?",
            "t-small"
        )
        .await,
        "DONE"
    );
    assert_eq!(
        env.text(
            "SELECT state FROM order_timeout_msg WHERE phase = 2 AND order_id = ?",
            "t-vip"
        )
        .await,
        "01"
    );
    assert_eq!(env.status("t-small").await, "PENDING");

    // At the deadline: the small order and the 0.1.0 order close; the VIP order is held on.
    at(T0);
    let mut at_deadline = Vec::new();
    for t in env.claim(T0).await {
        at_deadline.push((t.order_id.clone(), d.handle(&t).await));
    }
    at_deadline.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        matches!(at_deadline[0], (ref id, Outcome::Closed { .. }) if id == "a-old"),
        "{at_deadline:?}"
    );
    assert!(
        matches!(at_deadline[1], (ref id, Outcome::Closed { .. }) if id == "t-small"),
        "{at_deadline:?}"
    );
    assert_eq!(
        at_deadline[2],
        (
            "t-vip".into(),
            Outcome::Waiting {
                next_phase: 3,
                due_ms: T0 + 10 * MIN
            }
        )
    );
    assert_eq!(
        reminders(env, "t-vip").await,
        ["order-closing-soon", "order-held"]
    );
    assert_eq!(env.status("t-small").await, "CLOSED");
    assert_eq!(env.status("a-old").await, "CLOSED");
    assert_eq!(env.status("t-vip").await, "PENDING");

    // Ten minutes later the VIP order closes, everything it held given back once.
    at(T0 + 10 * MIN);
    let last = env.process(&d, T0 + 10 * MIN).await;
    assert!(matches!(&last[..], [Outcome::Closed { .. }]), "{last:?}");
    assert_eq!(env.status("t-vip").await, "CLOSED");
    assert_eq!(
        (env.stock("sku-a").await, env.stock("sku-b").await),
        (100, 100)
    );
    assert_eq!(env.coupon("cpn-t-vip").await, "AVAILABLE");
    assert_eq!(
        env.int("SELECT closed_at_ms FROM orders WHERE id = ?", "t-vip")
            .await,
        T0 + 10 * MIN
    );
    assert!(
        env.int("SELECT closed_at_ms FROM orders WHERE id = ?", "t-small")
            .await
            >= T0,
        "never before the deadline"
    );
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM order_timeout_msg WHERE status <> 'PROCESSED' AND order_id <> ?",
            ""
        )
        .await,
        0
    );
    let decided_by = env
        .text(
            "SELECT plugin FROM decision_log WHERE decision = 'cancel' AND order_id = ?",
            "t-vip",
        )
        .await;
    assert!(
        decided_by.ends_with(&format!("{plugin}.wasm")),
        "t-vip closed by {decided_by}"
    );
}

#[tokio::test]
async fn a_manifest_the_config_does_not_fit_stops_start_up_naming_every_problem() {
    let env = Env::new(timeoutd::db::Backend::Sqlite).await;
    let narrow: &[MerchantSpec<'_>] = &[(
        "tea",
        "tea-house",
        &[("vip_grace", "10"), ("colour", "green")],
    )];
    let config = env.config_for(
        narrow,
        "granted_effects = [\"restore-stock\", \"notify\"]",
        "",
    );
    let err = timeoutd::policies::load(&config).unwrap_err().to_string();
    for want in [
        "merchants.tea.plugin",
        "does not fit the merchant's config",
        "granted_effects: the plugin declares it may ask for release-coupon, restore-flash-stock, release-flash-slot, close-payment",
        "settings.vip_grace: `10` has no unit",
        "settings.colour: the plugin does not read this setting",
    ] {
        assert!(err.contains(want), "missing `{want}` in\n{err}");
    }
    env.cleanup().await;
}

/// The 0.2 SDK builds standalone from its own copy of the WIT; that copy is the released file.
#[test]
fn the_sdk_vendors_the_released_wit_unchanged() {
    let root = crate::support::repo_root();
    let released = std::fs::read_to_string(root.join("wit/v0.2.0/policy.wit")).unwrap();
    let vendored = std::fs::read_to_string(root.join("plugins/sdk/wit/policy.wit")).unwrap();
    assert!(
        released == vendored,
        "plugins/sdk/wit/policy.wit differs from wit/v0.2.0/policy.wit: copy it again"
    );
}

/// `timeoutd validate` refuses a duration setting exactly when the plugin would: the host's
/// grammar and the SDK's agree on every one of these.
#[test]
fn host_and_sdk_read_setting_durations_alike() {
    for raw in [
        "1500ms",
        "90s",
        "10m",
        "10min",
        " 2h ",
        "1d",
        "0s",
        "10",
        "ten",
        "3w",
        "m",
        "",
        "99999999999999999999d",
        "5 m",
    ] {
        assert_eq!(
            timeoutd_runtime::duration::parse_ms(raw),
            timeoutd_policy_sdk::parse_duration_ms(raw),
            "`{raw}`"
        );
    }
}

/// The SDK's `release_everything` and the host's fallback give back the same things in the
/// same order (so their ledger indices, and idempotency keys, agree).
#[test]
fn the_sdk_releases_everything_as_the_host_fallback_does() {
    use timeoutd_policy_sdk as sdk;
    use timeoutd_runtime::model::Effect;
    let mut o = order("o1", "m", T0);
    o.flash_activity = Some("fs-1".into());
    let guest = sdk::Order {
        id: o.id.clone(),
        merchant: o.merchant.clone(),
        user: o.user.clone(),
        status: sdk::OrderStatus::Pending,
        created_at_ms: o.created_at_ms,
        deadline_ms: o.deadline_ms,
        total_cents: o.total_cents,
        items: o
            .items
            .iter()
            .map(|i| sdk::OrderItem {
                sku: i.sku.clone(),
                quantity: i.quantity,
                unit_price_cents: i.unit_price_cents,
            })
            .collect(),
        coupon: o.coupon.clone(),
        flash_activity: o.flash_activity.clone(),
        payment_ref: o.payment_ref.clone(),
    };
    let from_sdk: Vec<Effect> = sdk::release_everything(&guest, true, None)
        .into_iter()
        .map(|e| match e {
            sdk::Effect::RestoreStock(r) => Effect::RestoreStock {
                sku: r.sku,
                quantity: r.quantity,
            },
            sdk::Effect::RestoreFlashStock(r) => Effect::RestoreFlashStock {
                activity: r.activity,
                quantity: r.quantity,
            },
            sdk::Effect::ReleaseFlashSlot(r) => Effect::ReleaseFlashSlot {
                activity: r.activity,
                user: r.user,
            },
            sdk::Effect::ReleaseCoupon(c) => Effect::ReleaseCoupon { coupon: c },
            sdk::Effect::ClosePayment(p) => Effect::ClosePayment { payment_ref: p },
            sdk::Effect::Notify(_) => unreachable!("no notice asked for"),
        })
        .collect();
    assert_eq!(from_sdk, Effect::release_everything(&o));
}

each_backend! {
    /// A 0.2.0 plugin that cancels (merchant `eager`) or ignores (`lazy`) at its first look,
    /// before the deadline, as a merchant's bug would. Only a wait takes effect before the
    /// deadline: both answers are held, the orders stay PENDING with their stock and coupons
    /// locked, and their rows keep their due time (the deadline). At the deadline the plugin is
    /// asked again: the cancel closes its order, once, giving its stock back; the ignore leaves
    /// its order open.
    async fn an_early_cancel_or_ignore_of_a_0_2_0_plugin_waits_for_the_deadline(env) {
        env.stock_up(&[("sku-a", 100), ("sku-b", 100)]).await;
        env.create(&order("e-cancel", "eager", T0)).await;
        env.create(&order("e-ignore", "lazy", T0)).await;
        let merchants: [MerchantSpec<'_>; 2] = [
            ("eager", "eager", &[("answer", "cancel")]),
            ("lazy", "eager", &[("answer", "ignore")]),
        ];
        let config = env.config(&merchants, "");
        let created = T0 - 15 * MIN;
        let (clock, now) = Clock::manual(created + 1_000);
        let d = env.dispatcher(&config, clock).await;
        let stock = (env.stock("sku-a").await, env.stock("sku-b").await);

        let first = early_look(env, &d, created + 1_000).await;
        let held = Outcome::Deferred { until_ms: T0 };
        assert_eq!(
            first,
            [("e-cancel".into(), held.clone()), ("e-ignore".into(), held)],
            "both answers held until the deadline"
        );
        for id in ["e-cancel", "e-ignore"] {
            assert_eq!(env.status(id).await, "PENDING", "{id}");
            assert_eq!(
                env.int("SELECT due_ms FROM order_timeout_msg WHERE order_id = ?", id).await,
                T0,
                "{id}'s row keeps the deadline"
            );
        }
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), stock);
        assert_eq!(
            env.int("SELECT COUNT(*) FROM decision_log WHERE outcome = ?", "closed").await,
            0
        );
        assert!(
            early_look(env, &d, created + 2_000).await.is_empty(),
            "a row is looked at once"
        );

        // At the deadline the plugin is asked again.
        now.store(T0, std::sync::atomic::Ordering::SeqCst);
        let mut outcomes = Vec::new();
        for row in outbox::claim_due(&env.db, T0, 100, 30_000).await.unwrap() {
            let trigger = timeoutd::sources::outbox::trigger_of(&row).unwrap();
            outcomes.push((trigger.order_id.clone(), d.handle(&trigger).await));
        }
        outcomes.sort_by(|a, b| a.0.cmp(&b.0));
        assert!(matches!(outcomes[0], (ref id, Outcome::Closed { lateness_ms: 0 }) if id == "e-cancel"), "{outcomes:?}");
        assert!(matches!(outcomes[1], (ref id, Outcome::Ignored) if id == "e-ignore"), "{outcomes:?}");
        assert_eq!(
            (env.status("e-cancel").await, env.status("e-ignore").await),
            ("CLOSED".to_string(), "PENDING".to_string())
        );
        assert_eq!(
            (env.stock("sku-a").await, env.stock("sku-b").await),
            (stock.0 + 2, stock.1 + 1),
            "e-cancel's lines back once"
        );
        let coupon = |id: &'static str| env.text("SELECT status FROM coupons WHERE id = ?", id);
        assert_eq!(coupon("cpn-e-cancel").await, "AVAILABLE");
        assert_ne!(coupon("cpn-e-ignore").await, "AVAILABLE", "the ignored order keeps its coupon");
    }
}
