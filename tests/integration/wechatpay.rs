//! The `wechatpay` payment provider against a stub of WeChat Pay API v3 whose signing,
//! verification and encryption are done by WeChat Pay's Python SDK (PyPI `wechatpayv3`, code
//! nobody here wrote, and `cryptography`'s AES-GCM, which it decrypts with;
//! `tests/data/wechatpay/stub.py`, run by the interpreter of the venv scripts/test installs:
//! `TIMEOUTD_WECHATPAY_PYTHON`), started per test on loopback with key pairs made per run by
//! `openssl` (the merchant's, the platform's and a forger's) and a random APIv3 key. The stub
//! believes a request only when the SDK, signing the same request with the merchant's key,
//! makes the same signature, so a canonicalization mistake on our side fails here; every
//! notification it sends is first accepted by the SDK's own `decrypt_callback`.
//!
//! On MariaDB: a paid transaction whose notification was lost is aligned by a query at the
//! deadline; an unpaid one is closed here and at WeChat Pay (204); a payment made only after
//! the close is paid-after-close on its notification and refunded once under `out_refund_no`.
//! Forged, altered, replayed, misaddressed and unknown-order notifications are refused with a
//! 4xx, record nothing and are counted by reason, and a genuine one then applies. `doctor`
//! tells a key WeChat Pay rejects, or a platform key that does not verify its answers, from
//! the right ones.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};
use timeoutd::clock::Clock;
use timeoutd::db::Backend;
use timeoutd::dispatch::Outcome;
use timeoutd::doctor::Level;

use crate::provider_fakes as fakes;
use crate::support::{Env, MerchantSpec, T0, eventually, order};

const SHOPS: &[MerchantSpec<'static>] = &[("acme", "builtin:single-phase", &[])];
const MCHID: &str = "1900000109";
const APPID: &str = "wxd678efh567hg6787";
const SERIAL: &str = "5157F09EFDC096DE15EBE81A47057A72";
const KEY_ID: &str = "PUB_KEY_ID_0119000001202411010000000000";

/// A stub WeChat Pay of this test's own; killed when dropped.
struct Stub {
    url: String,
    _child: tokio::process::Child,
    http: reqwest::Client,
}

/// A notification as WeChat Pay sends it: its headers and body.
type Notification = (HashMap<String, String>, String);

impl Stub {
    /// Makes the key pairs and the APIv3 key in `env`'s scratch directory and starts the stub.
    async fn start(env: &Env) -> Stub {
        let python = fakes::python("TIMEOUTD_WECHATPAY_PYTHON", "wechatpay", "wechatpay");
        let dir = env.dir.path();
        for name in ["merchant", "platform", "forger"] {
            fakes::key_pair(dir, name, false);
        }
        let apiv3_key: String = (0..32).map(|_| fastrand::alphanumeric()).collect();
        std::fs::write(dir.join("apiv3.key"), apiv3_key).unwrap();
        let file = |name: &str| dir.join(name).into_os_string();
        let (url, child) = fakes::spawn(
            &python,
            &crate::support::repo_root().join("tests/data/wechatpay/stub.py"),
            &[
                std::ffi::OsStr::new(MCHID),
                std::ffi::OsStr::new(APPID),
                std::ffi::OsStr::new(SERIAL),
                file("merchant.key").as_os_str(),
                file("platform.key").as_os_str(),
                file("platform.pub").as_os_str(),
                std::ffi::OsStr::new(KEY_ID),
                file("apiv3.key").as_os_str(),
                file("forger.key").as_os_str(),
            ],
        )
        .await;
        Stub {
            url,
            _child: child,
            http: reqwest::Client::new(),
        }
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let r = self
            .http
            .post(format!("{}{path}", self.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
        r.json().await.unwrap()
    }

    async fn get(&self, path: &str) -> Value {
        let r = self.http.get(format!("{}{path}", self.url)).send();
        r.await.unwrap().json().await.unwrap()
    }

    /// The shop's pre-order of `fen` (NOTPAY).
    async fn pre_order(&self, out_trade_no: &str, fen: i64) {
        let body = json!({ "out_trade_no": out_trade_no, "total": fen });
        self.post("/_test/transactions", body).await;
    }

    /// The buyer pays (SUCCESS); no notification is sent.
    async fn pay(&self, out_trade_no: &str) {
        self.post("/_test/pay", json!({ "out_trade_no": out_trade_no }))
            .await;
    }

    async fn transaction(&self, out_trade_no: &str) -> Value {
        self.get(&format!("/_test/transactions/{out_trade_no}"))
            .await
    }

    /// The notification of `out_trade_no`'s payment, `set` in its resource, signed by
    /// `signer` (`platform` or `forger`) with a timestamp `age` seconds old.
    async fn notice(&self, out_trade_no: &str, set: Value, signer: &str, age: u64) -> Notification {
        let n = self
            .post(
                "/_test/notice",
                json!({ "out_trade_no": out_trade_no, "set": set, "signer": signer, "age": age }),
            )
            .await;
        let headers = n["headers"].as_object().unwrap().iter();
        let headers = headers.map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()));
        (headers.collect(), n["notice"].as_str().unwrap().to_string())
    }

    /// WeChat Pay (the stub) posts the genuine notification of `out_trade_no` to `url`: the
    /// daemon's status and body.
    async fn deliver(&self, out_trade_no: &str, url: &str) -> (u16, Value) {
        let answer = self
            .post(
                "/_test/notice",
                json!({ "out_trade_no": out_trade_no, "url": url }),
            )
            .await;
        let body = answer["body"].as_str().unwrap();
        (
            answer["status"].as_u64().unwrap() as u16,
            serde_json::from_str(body).unwrap_or(Value::Null),
        )
    }

    /// Every API request the stub had, with whether the SDK verified its signature.
    async fn log(&self) -> Vec<Value> {
        self.get("/_test/log").await.as_array().unwrap().clone()
    }
}

/// `[payment]` on WeChat Pay at `stub`; `keys` overrides lines of `[payment.wechatpay]`.
fn wechatpay_config(stub: &Stub, keys: &str) -> String {
    let mut table: Vec<String> = vec![
        format!("base_url = \"{}\"", stub.url),
        format!("mchid = \"{MCHID}\""),
        format!("appid = \"{APPID}\""),
        format!("merchant_serial_no = \"{SERIAL}\""),
        "merchant_private_key = { secret_file = \"merchant.key\" }".into(),
        "platform_public_key = { secret_file = \"platform.pub\" }".into(),
        format!("platform_public_key_id = \"{KEY_ID}\""),
        "apiv3_key = { secret_file = \"apiv3.key\" }".into(),
    ];
    for line in keys.lines() {
        let name = line.split('=').next().unwrap().trim();
        table.retain(|l| l.split('=').next().unwrap().trim() != name);
        table.push(line.to_string());
    }
    format!(
        "[http]\nlisten = \"127.0.0.1:0\"\n[payment]\nprovider = \"wechatpay\"\nattempts = 2\n\
         timeout = \"5s\"\n[payment.wechatpay]\n{}\n",
        table.join("\n")
    )
}

/// Every request reached the stub signed as the SDK signs it.
async fn all_verified(stub: &Stub) -> Vec<Value> {
    let log = stub.log().await;
    assert!(!log.is_empty());
    for request in &log {
        assert_eq!(request["verified"], true, "refused by the SDK: {request}");
    }
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_notification_is_aligned_by_query_an_unpaid_order_closed_at_wechat_pay_and_a_late_payment_refunded_once_mariadb()
 {
    let env = Env::new(Backend::MySql).await;
    let stub = Stub::start(&env).await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    // Paid at WeChat Pay, its notification lost.
    let mut lost = order("lost", "acme", T0);
    lost.payment_ref = Some("wx202611290001".into());
    stub.pre_order("wx202611290001", 3490).await;
    stub.pay("wx202611290001").await;
    env.create(&lost).await;
    // Pre-ordered, never paid.
    let mut unpaid = order("unpaid", "acme", T0);
    unpaid.payment_ref = Some("wx202611290002".into());
    stub.pre_order("wx202611290002", 3490).await;
    env.create(&unpaid).await;
    // Pre-ordered at WeChat Pay only when the buyer comes back, after the deadline.
    let mut late = order("late", "acme", T0);
    late.payment_ref = Some("wx202611290003".into());
    env.create(&late).await;

    let config = env.config(SHOPS, &wechatpay_config(&stub, ""));
    let (clock, _) = Clock::manual(T0);
    let d = env.dispatcher(&config, clock).await;
    let mut outcomes = Vec::new();
    for t in env.claim(T0).await {
        outcomes.push((t.order_id.clone(), d.handle(&t).await));
    }
    outcomes.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        matches!(
            &outcomes[..],
            [
                (_, Outcome::Closed { .. }),
                (_, Outcome::Aligned { .. }),
                (_, Outcome::Closed { .. })
            ]
        ),
        "late closed, lost aligned, unpaid closed: {outcomes:?}"
    );
    assert_eq!(env.status("lost").await, "PAID");
    let detail = env
        .text("SELECT detail FROM decision_log WHERE order_id = ?", "lost")
        .await;
    assert!(detail.contains("\"amount_cents\":3490"), "fen: {detail}");
    assert_eq!(
        (env.status("unpaid").await, env.status("late").await),
        ("CLOSED".to_string(), "CLOSED".to_string())
    );
    assert_eq!(
        (env.stock("sku-a").await, env.stock("sku-b").await),
        (8, 9),
        "the paid order's buyer keeps the goods, the others' are back"
    );
    let close = "SELECT status FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?";
    let note = "SELECT COALESCE(last_error, '') FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?";
    eventually(Duration::from_secs(20), "both closes DONE", || async {
        env.text(close, "unpaid").await == "DONE" && env.text(close, "late").await == "DONE"
    })
    .await;
    let closed = stub.transaction("wx202611290002").await;
    assert_eq!(
        (&closed["trade_state"], &closed["closes"]),
        (&json!("CLOSED"), &json!(1)),
        "closed at WeChat Pay (204): {closed}"
    );
    assert!(
        !env.text(note, "unpaid").await.contains("nothing to close"),
        "a 204 is a close"
    );
    assert!(
        env.text(note, "late").await.contains("nothing to close"),
        "ORDER_NOT_EXIST before the pre-order"
    );
    assert_eq!(
        stub.transaction("wx202611290001").await["trade_state"],
        "SUCCESS"
    );

    // The buyer comes back, pre-orders and pays; WeChat Pay's notification arrives.
    let notify = format!(
        "{}/v1/providers/wechatpay/notify",
        fakes::listen(&env, &config).await
    );
    stub.pre_order("wx202611290003", 3490).await;
    stub.pay("wx202611290003").await;
    let success = (200, json!({ "code": "SUCCESS", "message": "成功" }));
    assert_eq!(
        stub.deliver("wx202611290003", &format!("{notify}/late"))
            .await,
        success
    );
    assert_eq!(
        env.text(
            "SELECT source FROM paid_after_close WHERE order_id = ?",
            "late"
        )
        .await,
        "wechatpay-notify"
    );
    let refund = "SELECT status FROM effect_ledger WHERE kind = 'refund-payment' AND order_id = ?";
    eventually(Duration::from_secs(20), "the refund is DONE", || async {
        env.text(refund, "late").await == "DONE"
    })
    .await;
    // WeChat Pay retries a notification it thinks was lost: a no-op, still SUCCESS.
    assert_eq!(
        stub.deliver("wx202611290003", &format!("{notify}/late"))
            .await,
        success
    );
    for table in [
        "SELECT COUNT(*) FROM paid_after_close WHERE order_id = ?",
        "SELECT COUNT(*) FROM effect_ledger WHERE kind = 'refund-payment' AND order_id = ?",
    ] {
        assert_eq!(env.int(table, "late").await, 1, "{table}");
    }
    let refunded = stub.transaction("wx202611290003").await;
    assert_eq!(
        (&refunded["refunds"], &refunded["trade_state"]),
        (&json!({ "acme|late|refund": 3490 }), &json!("REFUND")),
        "refunded once, in full, under the ledger key: {refunded}"
    );
    let log = all_verified(&stub).await;
    let refunds: Vec<&Value> = log
        .iter()
        .filter(|r| r["path"] == "/v3/refund/domestic/refunds")
        .collect();
    assert_eq!(refunds.len(), 1, "one refund request: {refunds:?}");
    assert_eq!(
        refunds[0]["body"],
        json!({ "out_trade_no": "wx202611290003", "out_refund_no": "acme|late|refund",
                "amount": { "refund": 3490, "total": 3490, "currency": "CNY" } })
    );
    let closes: Vec<&Value> = log
        .iter()
        .filter(|r| r["path"].as_str().unwrap().ends_with("/close"))
        .collect();
    assert_eq!(closes.len(), 2, "{closes:?}");
    assert!(
        closes
            .iter()
            .all(|r| r["body"] == json!({ "mchid": MCHID }))
    );
    env.cleanup().await;
}

const REASONS: [&str; 6] = [
    "unsigned",
    "signature",
    "stale",
    "unknown_order",
    "misaddressed",
    "amount",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_altered_replayed_and_misaddressed_notifications_are_refused_and_counted_then_a_genuine_one_applies_mariadb()
 {
    let env = Env::new(Backend::MySql).await;
    let stub = Stub::start(&env).await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    let mut hooked = order("hooked", "acme", T0 + 3_600_000);
    hooked.payment_ref = Some("wx202611290010".into());
    stub.pre_order("wx202611290010", 3490).await;
    env.create(&hooked).await;
    let mut other = order("other", "acme", T0 + 3_600_000);
    other.payment_ref = Some("wx202611290011".into());
    env.create(&other).await;
    let config = env.config(SHOPS, &wechatpay_config(&stub, ""));
    let notify = format!(
        "{}/v1/providers/wechatpay/notify",
        fakes::listen(&env, &config).await
    );
    let client = reqwest::Client::new();
    let send = |order_id: &str, (headers, body): &Notification| {
        let mut r = client
            .post(format!("{notify}/{order_id}"))
            .header("content-type", "application/json")
            .body(body.clone());
        for (k, v) in headers {
            r = r.header(k, v);
        }
        r.send()
    };
    stub.pay("wx202611290010").await;
    let genuine = stub
        .notice("wx202611290010", json!({}), "platform", 0)
        .await;
    let unsigned = {
        let (mut headers, body) = genuine.clone();
        headers.remove("Wechatpay-Signature");
        (headers, body)
    };
    let altered = (genuine.0.clone(), genuine.1.replace("支付成功", "支付失败"));
    let mut other_key = genuine.0.clone();
    other_key.insert("Wechatpay-Serial".into(), "PUB_KEY_ID_OTHER".into());
    // (reason, order in the URL, the notification, status)
    let cases: Vec<(&str, &str, Notification, u16)> = vec![
        ("unsigned", "hooked", unsigned, 400),
        (
            "signature",
            "hooked",
            stub.notice("wx202611290010", json!({}), "forger", 0).await,
            400,
        ),
        ("signature", "hooked", altered, 400),
        ("signature", "hooked", (other_key, genuine.1.clone()), 400),
        (
            "stale",
            "hooked",
            stub.notice("wx202611290010", json!({}), "platform", 600)
                .await,
            400,
        ),
        (
            "misaddressed",
            "hooked",
            stub.notice(
                "wx202611290010",
                json!({ "mchid": "1900000999" }),
                "platform",
                0,
            )
            .await,
            409,
        ),
        (
            "misaddressed",
            "hooked",
            stub.notice(
                "wx202611290010",
                json!({ "appid": "wx0000000000000000" }),
                "platform",
                0,
            )
            .await,
            409,
        ),
        ("misaddressed", "other", genuine.clone(), 409),
        ("unknown_order", "nobody", genuine.clone(), 404),
        (
            "amount",
            "hooked",
            stub.notice(
                "wx202611290010",
                json!({ "amount": { "total": 1, "payer_total": 1, "currency": "CNY" } }),
                "platform",
                0,
            )
            .await,
            409,
        ),
    ];
    let before = env.dump().await;
    let refused = |r: &str| fakes::refused("wechatpay", r);
    let start: Vec<u64> = REASONS.iter().map(|r| refused(r)).collect();
    for (reason, order_id, notification, status) in &cases {
        let r = send(order_id, notification).await.unwrap();
        assert_eq!(r.status().as_u16(), *status, "{reason}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(
            (&body["code"], &body["reason"]),
            (&json!("FAIL"), &json!(reason)),
            "{body}"
        );
    }
    assert_eq!(env.dump().await, before, "a refused notice records nothing");
    let delta: Vec<u64> = REASONS
        .iter()
        .zip(&start)
        .map(|(r, s)| refused(r) - s)
        .collect();
    assert_eq!(
        delta,
        vec![1, 3, 1, 1, 3, 1],
        "each refusal counted by its reason"
    );
    assert_eq!(env.status("hooked").await, "PENDING");

    // WeChat Pay's genuine notification is believed, and a repeat is a no-op.
    let (status, body) = stub
        .deliver("wx202611290010", &format!("{notify}/hooked"))
        .await;
    assert_eq!((status, &body["code"]), (200, &json!("SUCCESS")), "{body}");
    assert_eq!(env.status("hooked").await, "PAID");
    let r = send("hooked", &genuine).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(env.status("other").await, "PENDING");
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM paid_after_close WHERE order_id = ?",
            "hooked"
        )
        .await,
        0
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn doctor_finds_a_key_wechat_pay_rejects_and_a_platform_key_that_does_not_verify() {
    let env = Env::new(Backend::Sqlite).await;
    let stub = Stub::start(&env).await;
    let dir = env.dir.path();
    // The platform's key as a certificate, as merchants of the platform-certificate era have it.
    let cert = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-new",
            "-days",
            "1",
            "-subj",
            "/CN=Tenpay",
            "-key",
        ])
        .arg(dir.join("platform.key"))
        .arg("-out")
        .arg(dir.join("platform.crt"))
        .output()
        .unwrap();
    assert!(cert.status.success(), "{cert:?}");
    let secrets = ["merchant.key", "forger.key", "apiv3.key"].map(|f| dir.join(f));
    let secrets: Vec<&std::path::Path> = secrets.iter().map(|p| p.as_path()).collect();
    let secrets = &secrets;
    let findings = |keys: &'static str| {
        let config = env.config(SHOPS, &wechatpay_config(&stub, keys));
        async move { fakes::doctor_findings(&config, "wechatpay", secrets).await }
    };
    let right = findings("platform_public_key = { secret_file = \"platform.crt\" }").await;
    assert!(
        right.iter().all(|f| f.level == Level::Ok),
        "the right keys: {right:?}"
    );
    assert!(
        right.iter().any(|f| f.found.contains("\"not found\"")),
        "{right:?}"
    );
    let rejected = findings("merchant_private_key = { secret_file = \"forger.key\" }").await;
    let error = rejected
        .iter()
        .find(|f| f.level == Level::Error)
        .unwrap_or_else(|| panic!("a key WeChat Pay rejects: {rejected:?}"));
    assert!(error.found.contains("SIGN_ERROR"), "{error:?}");
    let unverified = findings("platform_public_key = { secret_file = \"forger.pub\" }").await;
    let error = unverified
        .iter()
        .find(|f| f.level == Level::Error)
        .unwrap_or_else(|| panic!("a platform key that verifies nothing: {unverified:?}"));
    assert!(error.found.contains("not believed"), "{error:?}");
    let garbage = findings("merchant_private_key = { secret_file = \"apiv3.key\" }").await;
    assert!(
        garbage
            .iter()
            .any(|f| f.level == Level::Error && f.found.contains("merchant_private_key")),
        "{garbage:?}"
    );
    env.cleanup().await;
}
