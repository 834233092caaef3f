//! Hostile input by the thousand, as property tests (proptest, stable Rust): what a stranger can
//! hand timeoutd — broker message bodies and properties, config files, merchants' cases files,
//! plugin answers at the WIT boundary, HTTP requests to both of the daemon's listeners. The properties: no panic; a refusal names what is wrong;
//! nothing accepted breaks the rule the parser exists for.
//!
//! Each property runs `TIMEOUTD_PROPTEST_CASES` cases (default 2,000: seconds in CI). By hand,
//! a million each:
//!
//! ```text
//! TIMEOUTD_PROPTEST_CASES=1000000 cargo test -p timeoutd-tests --release --test integration -- hostile_input::
//! ```
//! (not run: it takes minutes per property)

use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::{Config as Cases, TestRunner};
use timeoutd::config::Config;
use timeoutd::rocketmq::codec::{
    self, MAX_ORDER_ID, PROP_DUE_MS, PROP_HOP, PROP_ROW, PROP_ROWS, Wakeup,
};
use timeoutd_plugin_harness::cases::CasesFile;
use timeoutd_runtime::guard::{self, MAX_STATE_BYTES, MAX_WAIT_PAST_DEADLINE_MS, Review};
use timeoutd_runtime::model::{Decision, Effect, Notice, Order, OrderItem, OrderStatus};

use crate::support::repo_root;

/// How many cases each property runs: `TIMEOUTD_PROPTEST_CASES`, else 2,000.
fn runner() -> TestRunner {
    let cases = std::env::var("TIMEOUTD_PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000);
    TestRunner::new(Cases {
        cases,
        failure_persistence: None,
        ..Cases::default()
    })
}

/// Runs `test` over `strategy` with [`runner`], panicking with proptest's minimal failing case.
fn check<S: Strategy>(strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    if let Err(e) = runner().run(&strategy, test) {
        panic!("{e}");
    }
}

/// An order id as JSON: numbers too long for any integer, strings with spaces and control
/// characters, and values of the wrong type.
fn id_json() -> BoxedStrategy<String> {
    prop_oneof![
        "-?[0-9]{0,25}",
        "\"[^\"\\\\]{0,80}\"",
        Just("null".to_string()),
        Just("1e400".to_string()),
        Just("[]".to_string()),
        Just("{}".to_string()),
        "\"[ \\t\\n\\x00-\\x1fa-z]{0,70}\"",
    ]
    .boxed()
}

/// Text near a valid input: the seeds' JSON shapes with hostile values, and raw bytes.
fn message_body() -> impl Strategy<Value = Vec<u8>> {
    let phase = prop_oneof![
        "-?[0-9]{0,22}",
        Just("\"1\"".to_string()),
        Just("null".to_string())
    ];
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..300),
        (id_json(), phase).prop_map(|(id, phase)| {
            format!("{{\"orderId\":{id},\"phase\":{phase}}}").into_bytes()
        }),
        (id_json(), "[a-zA-Z]{0,12}").prop_map(|(id, key)| {
            format!("{{\"{key}\":{id},\"orderId\":{id},\"createTime\":\"2026-13-45 99:99:99\"}}")
                .into_bytes()
        }),
        "[^{]{0,100}".prop_map(String::into_bytes),
        proptest::collection::vec(id_json(), 0..20)
            .prop_map(|ids| format!("[{}]", ids.join(",")).into_bytes()),
    ]
}

/// A property value: numbers, near-numbers and garbage.
fn property_value() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(prop_oneof![
        "-?[0-9]{0,21}",
        "[0-9]{1,3}\\.[0-9]",
        ".{0,20}",
    ])
}

#[test]
fn a_broker_message_decodes_or_names_its_fault() {
    let message = (
        message_body(),
        proptest::option::of(".{0,80}"),
        property_value(),
        property_value(),
        property_value(),
        property_value(),
    );
    check(message, |(body, keys, due, row, hop, rows)| {
        let property = |name: &str| match name {
            PROP_DUE_MS => due.clone(),
            PROP_ROW => row.clone(),
            PROP_HOP => hop.clone(),
            PROP_ROWS => rows.clone(),
            _ => None,
        };
        match codec::decode_wakeup(&body, keys.as_deref(), property) {
            Err(reason) => {
                prop_assert!(!reason.trim().is_empty(), "an empty reason");
                prop_assert!(
                    reason.len() < 1_000,
                    "a reason that quotes too much: {reason}"
                );
            }
            Ok(Wakeup::Order(m)) => {
                prop_assert!(!m.order_id.is_empty() && m.order_id.len() <= MAX_ORDER_ID);
                prop_assert!(
                    !m.order_id
                        .chars()
                        .any(|c| c.is_whitespace() || c.is_control())
                );
                if let Some(keys) = keys.as_deref().filter(|k| !k.trim().is_empty()) {
                    prop_assert!(keys.split(' ').any(|k| k == m.order_id), "keys {keys:?}");
                }
            }
            Ok(Wakeup::Rows { rows, .. }) => {
                for r in rows {
                    prop_assert!(!r.order_id.is_empty() && r.order_id.len() <= MAX_ORDER_ID);
                    prop_assert!(r.row_id.is_some() && r.due_ms.is_some());
                }
            }
        }
        Ok(())
    });
}

/// The text files in `dir` of the repository ending in `ext`.
fn texts(dir: &str, ext: &str) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(repo_root().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    found.sort();
    assert!(!found.is_empty(), "no .{ext} file in {dir}");
    found
}

/// One edit of a line-oriented file.
#[derive(Debug, Clone)]
enum Edit {
    /// Drop line `n` (modulo the line count).
    Drop(usize),
    /// Repeat line `n`.
    Repeat(usize),
    /// Replace what follows `=` on line `n` with the text.
    Value(usize, String),
    /// Insert the text as line `n`.
    Insert(usize, String),
}

/// Values a hand or a template engine gets wrong.
fn hostile_value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("\"\"".to_string()),
        Just("-1".to_string()),
        Just("1e400".to_string()),
        Just("18446744073709551616".to_string()),
        Just("\"99999999999999h\"".to_string()),
        Just("\"0ms\"".to_string()),
        Just("\"${UNSET_VARIABLE}\"".to_string()),
        Just("\"${A:-${B}}\"".to_string()),
        Just("[".to_string()),
        Just("{ x = }".to_string()),
        Just("true".to_string()),
        Just("\"mysql://\"".to_string()),
        Just("\"builtin:nope\"".to_string()),
        "\"[^\"\\\\]{0,40}\"",
        ".{0,30}",
    ]
}

/// Edits of a line-oriented file: up to eight drops, repeats, value swaps and insertions.
fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let edit = prop_oneof![
        any::<usize>().prop_map(Edit::Drop),
        any::<usize>().prop_map(Edit::Repeat),
        (any::<usize>(), hostile_value()).prop_map(|(n, v)| Edit::Value(n, v)),
        (any::<usize>(), "[\\[a-z._\\]]{0,20}( = )?.{0,20}").prop_map(|(n, v)| Edit::Insert(n, v)),
    ];
    proptest::collection::vec(edit, 1..8)
}

/// `text` with `edits` applied, line by line.
fn edited(text: &str, edits: &[Edit]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for edit in edits {
        let at = |n: usize, len: usize| if len == 0 { 0 } else { n % len };
        match edit {
            Edit::Drop(n) if !lines.is_empty() => {
                let i = at(*n, lines.len());
                lines.remove(i);
            }
            Edit::Repeat(n) if !lines.is_empty() => {
                let i = at(*n, lines.len());
                lines.insert(i, lines[i].clone());
            }
            Edit::Value(n, v) if !lines.is_empty() => {
                let i = at(*n, lines.len());
                if let Some((key, _)) = lines[i].split_once('=') {
                    lines[i] = format!("{key}= {v}");
                }
            }
            Edit::Insert(n, v) => {
                let i = at(*n, lines.len() + 1);
                lines.insert(i, v.clone());
            }
            _ => {}
        }
    }
    lines.join("\n")
}

#[test]
fn a_config_file_loads_or_lists_every_problem_by_place() {
    let shipped = texts("config", "toml");
    let case = (0..shipped.len(), edits());
    check(case, |(which, edits)| {
        let text = edited(&shipped[which], &edits);
        match Config::from_toml(&text, Path::new("/nonexistent"), &|_| None) {
            Ok(_) => {}
            Err(problems) => {
                prop_assert!(!problems.problems.is_empty(), "refused with no problem");
                for (_, what) in &problems.problems {
                    prop_assert!(
                        !what.trim().is_empty(),
                        "a problem with no text: {problems:?}"
                    );
                }
            }
        }
        Ok(())
    });
}

#[test]
fn a_cases_file_parses_or_names_what_is_wrong() {
    let shipped = texts("plugins/cases", "toml");
    let case = (0..shipped.len(), edits());
    check(case, |(which, edits)| {
        let text = edited(&shipped[which], &edits);
        if let Err(e) = CasesFile::parse(&text, "hostile.toml") {
            let said = e.to_string();
            prop_assert!(
                said.contains("hostile.toml"),
                "the file is not named: {said}"
            );
        }
        Ok(())
    });
}

/// The order every plugin answer is reviewed against: 2 × `a`, 1 × `b`, coupon `c1`, flash
/// sale `fs`, buyer `u1`, payment `p1`, due at 1,000,000 ms.
fn reviewed_order() -> Order {
    let item = |sku: &str, quantity| OrderItem {
        sku: sku.into(),
        quantity,
        unit_price_cents: 100,
    };
    Order {
        id: "o1".into(),
        merchant: "m".into(),
        user: "u1".into(),
        status: OrderStatus::Pending,
        created_at_ms: 0,
        deadline_ms: 1_000_000,
        total_cents: 300,
        items: vec![item("a", 2), item("b", 1)],
        coupon: Some("c1".into()),
        flash_activity: Some("fs".into()),
        payment_ref: Some("p1".into()),
    }
}

/// Names a plugin might use, the order's own among them.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("a".to_string()),
        Just("b".to_string()),
        Just("c1".to_string()),
        Just("fs".to_string()),
        Just("u1".to_string()),
        Just("p1".to_string()),
        ".{0,12}",
    ]
}

fn effect() -> impl Strategy<Value = Effect> {
    prop_oneof![
        (name(), any::<u32>()).prop_map(|(sku, quantity)| Effect::RestoreStock { sku, quantity }),
        (name(), any::<u32>())
            .prop_map(|(activity, quantity)| Effect::RestoreFlashStock { activity, quantity }),
        (name(), name()).prop_map(|(activity, user)| Effect::ReleaseFlashSlot { activity, user }),
        name().prop_map(|coupon| Effect::ReleaseCoupon { coupon }),
        name().prop_map(|payment_ref| Effect::ClosePayment { payment_ref }),
        (name(), name()).prop_map(|(channel, template)| Effect::Notify(Notice {
            channel,
            template,
            params: Vec::new(),
        })),
    ]
}

fn decision() -> impl Strategy<Value = Decision> {
    let after = prop_oneof![
        any::<u64>(),
        0..2 * MAX_WAIT_PAST_DEADLINE_MS as u64,
        Just(u64::MAX)
    ];
    prop_oneof![
        (
            after,
            any::<u32>(),
            proptest::collection::vec(any::<u8>(), 0..2 * MAX_STATE_BYTES),
            any::<bool>()
        )
            .prop_map(
                |(after_ms, next_phase, state, poll_payment)| Decision::Wait {
                    after_ms,
                    next_phase,
                    reminder: None,
                    state,
                    poll_payment,
                }
            ),
        (".{0,40}", proptest::collection::vec(effect(), 0..300))
            .prop_map(|(reason, effects)| Decision::Cancel { reason, effects }),
        ".{0,40}".prop_map(|reason| Decision::Ignore { reason }),
    ]
}

#[test]
fn a_plugin_answer_beyond_its_order_is_refused_by_name() {
    let order = reviewed_order();
    let case = (decision(), 0u32..4, 0i64..2 * MAX_WAIT_PAST_DEADLINE_MS);
    check(case, |(decision, phase, now_ms)| {
        let review = Review {
            order: &order,
            phase,
            now_ms,
            granted: None,
            manifest: None,
        };
        let verdict = guard::review(&decision, review);
        if let Err(problems) = &verdict {
            prop_assert!(!problems.is_empty());
            for p in problems {
                prop_assert!(!p.trim().is_empty());
            }
        }
        // What is permitted stays within the order and its time, checked here independently.
        if verdict.is_ok() {
            match &decision {
                Decision::Wait {
                    after_ms,
                    next_phase,
                    state,
                    ..
                } => {
                    prop_assert!(*next_phase > phase && *after_ms > 0);
                    prop_assert!(state.len() <= MAX_STATE_BYTES);
                    let ends = i128::from(now_ms) + i128::from(*after_ms);
                    prop_assert!(ends <= i128::from(order.deadline_ms + MAX_WAIT_PAST_DEADLINE_MS));
                }
                Decision::Cancel { effects, .. } => {
                    let mut units = std::collections::HashMap::<&str, u64>::new();
                    for e in effects {
                        match e {
                            Effect::RestoreStock { sku, quantity } => {
                                *units.entry(sku).or_default() += u64::from(*quantity);
                            }
                            Effect::ReleaseCoupon { coupon } => {
                                prop_assert_eq!(coupon.as_str(), "c1");
                            }
                            Effect::ClosePayment { payment_ref } => {
                                prop_assert_eq!(payment_ref.as_str(), "p1");
                            }
                            Effect::ReleaseFlashSlot { activity, user } => {
                                prop_assert_eq!((activity.as_str(), user.as_str()), ("fs", "u1"));
                            }
                            Effect::RestoreFlashStock { activity, .. } => {
                                prop_assert_eq!(activity.as_str(), "fs");
                            }
                            Effect::Notify(_) => {}
                        }
                    }
                    for (sku, n) in units {
                        let ordered = order
                            .items
                            .iter()
                            .find(|i| i.sku == sku)
                            .map(|i| i.quantity);
                        prop_assert!(ordered.is_some_and(|q| n <= u64::from(q)), "{sku}: {n}");
                    }
                }
                Decision::Ignore { .. } => {}
            }
        }
        Ok(())
    });
}

/// What a stranger can send the daemon's two listeners: a method, a path (every route's shape
/// with hostile segments, and paths of no route), a body (bytes or JSON-ish), a content type,
/// and credentials (none, wrong, or — on the admin API only — the operator's).
#[derive(Debug, Clone)]
struct Request {
    admin: bool,
    method: &'static str,
    path: String,
    body: Vec<u8>,
    json: bool,
    token: Option<&'static str>,
}

/// A path segment: plain, percent-encoded, traversal, numbers out of range, the one order that
/// exists, and very long ones.
fn segment() -> BoxedStrategy<String> {
    prop_oneof![
        "[a-zA-Z0-9._~-]{0,40}",
        "(%[0-9A-Fa-f]{2}){1,12}",
        Just("..".to_string()),
        Just("%2e%2e%2f%2e%2e".to_string()),
        Just("%00".to_string()),
        Just("99999999999999999999999".to_string()),
        Just("-1".to_string()),
        Just("o-1".to_string()),
        "[a-z]{300,600}",
    ]
    .boxed()
}

fn request() -> impl Strategy<Value = Request> {
    let http_paths = prop_oneof![
        segment().prop_map(|s| format!("/v1/payments/{s}/paid")),
        segment().prop_map(|s| format!("/v1/orders/{s}/payment-attempts")),
        Just("/v1/providers/stripe/webhook".to_string()),
        segment().prop_map(|s| format!("/v1/providers/alipay/notify/{s}")),
        segment().prop_map(|s| format!("/v1/providers/wechatpay/notify/{s}")),
        (segment(), segment()).prop_map(|(a, b)| format!("/{a}/{b}")),
    ];
    let admin_paths = prop_oneof![
        segment().prop_map(|s| format!("/v1/orders/{s}")),
        segment().prop_map(|s| format!("/v1/orders/{s}/close")),
        segment().prop_map(|s| format!("/v1/dead-letters/{s}")),
        segment().prop_map(|s| format!("/v1/dead-letters/{s}/redrive")),
        segment().prop_map(|s| format!("/v1/ledger/{s}/retry")),
        (segment(), segment())
            .prop_map(|(a, b)| format!("/v1/orders/overdue?limit={a}&offset={b}")),
        (segment(), segment()).prop_map(|(a, b)| format!("/v1/dead-letters?status={a}&limit={b}")),
        Just("/v1/sweep".to_string()),
        Just("/v1/backlog".to_string()),
        Just("/v1/pauses".to_string()),
        Just("/v1/dead-letters/redrive".to_string()),
        Just("/v1/ledger/retry".to_string()),
        segment().prop_map(|s| format!("/v1/merchants/{s}/pause")),
        segment().prop_map(|s| format!("/v1/merchants/{s}/resume")),
        segment().prop_map(|s| format!("/v1/orders/{s}/pause")),
        segment().prop_map(|s| format!("/v1/orders/{s}/resume")),
        (segment(), segment()).prop_map(|(a, b)| format!("/{a}/{b}")),
    ];
    let body = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..2_048),
        (id_json(), "[a-z_]{1,12}", id_json()).prop_map(|(a, k, b)| {
            format!("{{\"orderId\": {a}, \"{k}\": {b}, \"interval\": {b}}}").into_bytes()
        }),
        Just(b"{not json".to_vec()),
    ];
    (
        any::<bool>(),
        prop::sample::select(vec!["GET", "POST", "PUT", "DELETE", "PATCH"]),
        http_paths,
        admin_paths,
        body,
        any::<bool>(),
        prop::sample::select(vec![
            None,
            Some("wrong-token-0123456789"),
            Some(crate::admin::TOKEN),
        ]),
    )
        .prop_map(
            |(admin, method, http_path, admin_path, body, json, token)| {
                // The operator's token only where a call writes nothing the property checks: not
                // the sweep's tuning, not a pause (it holds the fixture's triggers), not a bulk
                // re-drive or retry, not on the payment listener.
                let writes = (admin_path.starts_with("/v1/sweep") && method == "PUT")
                    || (method == "POST"
                        && [
                            "/pause",
                            "/resume",
                            "/v1/dead-letters/redrive",
                            "/v1/ledger/retry",
                        ]
                        .iter()
                        .any(|end| admin_path.ends_with(end)));
                let token = match token {
                    Some(t) if t == crate::admin::TOKEN && (!admin || writes) => {
                        Some("wrong-token-0123456789")
                    }
                    other => other,
                };
                Request {
                    admin,
                    method,
                    path: if admin { admin_path } else { http_path },
                    body,
                    json,
                    token,
                }
            },
        )
}

/// Column `i` of `row` as text, whatever its type.
fn cell(row: &sqlx::any::AnyRow, i: usize) -> String {
    use sqlx::Row;
    if let Ok(v) = row.try_get::<Option<i64>, _>(i) {
        return format!("{v:?}");
    }
    if let Ok(v) = row.try_get::<Option<String>, _>(i) {
        return format!("{v:?}");
    }
    if let Ok(v) = row.try_get::<Option<f64>, _>(i) {
        return format!("{v:?}");
    }
    "(unreadable)".to_string()
}

/// Every table's rows as text, `admin_audit` left out (every call is audited by design).
async fn tables(env: &crate::support::Env) -> Vec<String> {
    let mut all = Vec::new();
    for table in [
        "orders",
        "order_timeout_msg",
        "effect_ledger",
        "decision_log",
        "dead_letter",
        "paid_after_close",
        "coupons",
        "sku_stock",
    ] {
        let rows = env
            .db
            .backend()
            .query_owned(format!("SELECT * FROM {table}"))
            .fetch_all(env.db.pool())
            .await
            .unwrap();
        all.push(format!("{table}: {} rows", rows.len()));
        for row in rows {
            all.push(format!(
                "{table}: {:?}",
                (0..sqlx::Row::len(&row))
                    .map(|i| cell(&row, i))
                    .collect::<Vec<_>>()
            ));
        }
    }
    all
}

/// Every HTTP request a stranger can make of the payment listener (paid callbacks, payment
/// attempts, Stripe, Alipay and WeChat Pay notices) and the admin API (with no token, a wrong
/// one, or the operator's on calls that change no table): never a 5xx or a dropped connection;
/// every 4xx a JSON body naming the error; and afterwards every table as it was (one order,
/// PENDING and not yet due, that the generated paths can name).
#[test]
fn every_http_request_a_stranger_sends_is_answered_and_changes_nothing() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (env, daemon, http, admin) = rt.block_on(async {
        let env = crate::support::Env::new(timeoutd::db::Backend::Sqlite).await;
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        env.create(&crate::support::order("o-1", "acme", env.db.now_ms().await.unwrap() + 3_600_000)).await;
        std::fs::write(env.dir.path().join("stripe.key"), "sk_test_0123456789\n").unwrap();
        std::fs::write(env.dir.path().join("stripe.whsec"), "whsec_0123456789abcdef\n").unwrap();
        let config = env.config(
            &[("acme", "builtin:single-phase", &[])],
            &format!(
                "[http]\nlisten = \"127.0.0.1:0\"\ncallback_token = \"callback-token-0123456789\"\n\
                 [admin]\nlisten = \"127.0.0.1:0\"\n[admin.tokens]\nops = \"{}\"\n[sweep]\nenabled = false\n\
                 [payment]\nprovider = \"stripe\"\n[payment.stripe]\nbase_url = \"http://127.0.0.1:9\"\n\
                 api_key = {{ secret_file = \"stripe.key\" }}\nwebhook_secret = {{ secret_file = \"stripe.whsec\" }}\n",
                crate::admin::TOKEN
            ),
        );
        let daemon = timeoutd::daemon::Daemon::start(&config, timeoutd::clock::Clock::Database).await.unwrap();
        let (http, admin) = (daemon.http_addr().unwrap(), daemon.admin_addr().unwrap());
        (env, daemon, http, admin)
    });
    let before = rt.block_on(tables(&env));
    let client = reqwest::Client::new();
    check(request(), |r| {
        let base = if r.admin { admin } else { http };
        let mut req = client
            .request(
                r.method.parse().unwrap(),
                format!("http://{base}{}", r.path),
            )
            .body(r.body.clone());
        if r.json {
            req = req.header("content-type", "application/json");
        }
        if let Some(t) = r.token {
            req = req.bearer_auth(t);
        }
        let (status, body) = rt.block_on(async {
            let answer = req
                .send()
                .await
                .map_err(|e| TestCaseError::fail(format!("no answer: {e}")))?;
            let status = answer.status();
            Ok::<_, TestCaseError>((status, answer.bytes().await.unwrap_or_default()))
        })?;
        prop_assert!(
            !status.is_server_error(),
            "{status}: {}",
            String::from_utf8_lossy(&body)
        );
        if status.is_client_error() {
            let text = String::from_utf8_lossy(&body);
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            // WeChat Pay's own answer to a notification is {"code": "FAIL", "message": …};
            // Alipay's the text `fail` (anything else and it sends the notification again).
            let wechat = r.path.starts_with("/v1/providers/wechatpay/")
                && v["code"] == "FAIL"
                && v["message"].as_str().is_some_and(|m| !m.is_empty());
            let alipay = r.path.starts_with("/v1/providers/alipay/") && text.trim() == "fail";
            let named = wechat || alipay || v["error"].as_str().is_some_and(|e| !e.is_empty());
            prop_assert!(named, "{status} names no error: {text}");
        }
        Ok(())
    });
    let after = rt.block_on(tables(&env));
    assert_eq!(before, after, "a stranger's request changed a table");
    rt.block_on(async {
        daemon.stop().await;
        env.cleanup().await;
    });
}
