//! The `alipay` payment provider against a stub of Alipay's OpenAPI gateway whose signing and
//! verification are done by Alipay's own Python SDK (PyPI `alipay-sdk-python`, code nobody here
//! wrote; `tests/data/alipay/stub.py`, run by the interpreter of the venv scripts/test installs:
//! `TIMEOUTD_ALIPAY_PYTHON`), started per test on loopback with key pairs made per run by
//! `openssl` (the app's, "Alipay's", and a forger's). The stub refuses any request whose RSA2
//! signature the SDK does not verify, so a canonicalization mistake on our side fails here.
//!
//! Seed 002 (macrozheng/mall, face-to-face payment) end to end on MariaDB: pre-orders created at
//! the stub; a paid trade whose notification was lost is aligned by `alipay.trade.query` at the
//! deadline; an unpaid one is closed here and `alipay.trade.close`d there; a pre-order the
//! buyer scans only after the close is paid-after-close on its notification and refunded once
//! under the ledger key. Forged, altered, misaddressed and unknown-order notifications are
//! refused with a 4xx, record nothing and are counted by reason, and a genuine one then applies.
//! An answer altered after Alipay signed it is never believed.

use std::time::Duration;

use serde_json::{Value, json};
use timeoutd::clock::Clock;
use timeoutd::db::Backend;
use timeoutd::dispatch::Outcome;

use crate::provider_fakes as fakes;
use crate::support::{Env, MerchantSpec, T0, eventually, order};

const SHOPS: &[MerchantSpec<'static>] = &[("acme", "builtin:single-phase", &[])];
const APP_ID: &str = "2021004100000001";

/// A stub Alipay gateway of this test's own; killed when dropped.
struct Stub {
    url: String,
    _child: tokio::process::Child,
    http: reqwest::Client,
}

impl Stub {
    /// Makes the three key pairs in `env`'s scratch directory and starts the stub with them.
    async fn start(env: &Env) -> Stub {
        let python = fakes::python("TIMEOUTD_ALIPAY_PYTHON", "alipay", "alipay");
        let dir = env.dir.path();
        fakes::key_pair(dir, "app", false);
        fakes::key_pair(dir, "alipay", true);
        fakes::key_pair(dir, "forger", true);
        // Alipay's public key as the open platform shows it: bare base64, no PEM lines.
        let pem = std::fs::read_to_string(dir.join("alipay.pub")).unwrap();
        let bare: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        std::fs::write(dir.join("alipay.pub.txt"), bare).unwrap();
        let (url, child) = fakes::spawn(
            &python,
            &crate::support::repo_root().join("tests/data/alipay/stub.py"),
            &[
                std::ffi::OsStr::new(APP_ID),
                dir.join("app.pub").as_os_str(),
                dir.join("alipay.key").as_os_str(),
                dir.join("forger.key").as_os_str(),
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
        self.http
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// The shop's pre-order (`alipay.trade.precreate`) of `yuan`; `scanned`: the buyer has
    /// scanned its code, so Alipay has the trade (WAIT_BUYER_PAY).
    async fn pre_order(&self, out_trade_no: &str, yuan: &str, scanned: bool) {
        self.post(
            "/_test/trades",
            json!({ "out_trade_no": out_trade_no, "total_amount": yuan, "scanned": scanned }),
        )
        .await;
    }

    /// The buyer pays (TRADE_SUCCESS); the notification is not sent.
    async fn pay(&self, out_trade_no: &str) {
        self.post("/_test/pay", json!({ "out_trade_no": out_trade_no }))
            .await;
    }

    async fn trade(&self, out_trade_no: &str) -> Value {
        self.get(&format!("/_test/trades/{out_trade_no}")).await
    }

    /// The notification of `out_trade_no`'s payment with `set` signed in, signed by
    /// `signer`'s key through the SDK (`alipay` or `forger`): its parameters.
    async fn notice(&self, out_trade_no: &str, set: Value, signer: &str) -> Vec<(String, String)> {
        let answer = self
            .post(
                "/_test/notice",
                json!({ "out_trade_no": out_trade_no, "set": set, "signer": signer }),
            )
            .await;
        answer["params"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .collect()
    }

    /// Alipay (the stub, through the SDK) posts the genuine notification of `out_trade_no`'s
    /// payment to `url`: the daemon's status and body.
    async fn deliver(&self, out_trade_no: &str, url: &str) -> (u16, String) {
        let answer = self
            .post(
                "/_test/notice",
                json!({ "out_trade_no": out_trade_no, "url": url }),
            )
            .await;
        (
            answer["status"].as_u64().unwrap() as u16,
            answer["body"].as_str().unwrap().to_string(),
        )
    }

    /// Every gateway request the stub had, with whether the SDK verified its signature.
    async fn log(&self) -> Vec<Value> {
        self.get("/_test/log").await.as_array().unwrap().clone()
    }
}

/// `[payment]` on Alipay at `stub`, the keys in files of `env`'s scratch directory; `extra`
/// lines go into `[payment]`.
fn alipay_config(stub: &Stub, extra: &str) -> String {
    format!(
        "[payment]\nprovider = \"alipay\"\nattempts = 2\ntimeout = \"5s\"\n{extra}\n\
         [payment.alipay]\ngateway = \"{}/gateway.do\"\napp_id = \"{APP_ID}\"\n\
         app_private_key = {{ secret_file = \"app.key\" }}\n\
         alipay_public_key = {{ secret_file = \"alipay.pub.txt\" }}\n",
        stub.url
    )
}

/// The `[http]` listener of `config`: the base of its Alipay notify URLs.
async fn listen(env: &Env, config: &timeoutd::config::Config) -> String {
    format!(
        "{}/v1/providers/alipay/notify",
        fakes::listen(env, config).await
    )
}

/// Every request reached the stub signed as Alipay's SDK expects.
async fn all_verified(stub: &Stub) {
    let log = stub.log().await;
    assert!(!log.is_empty());
    for request in &log {
        assert_eq!(request["verified"], true, "refused by the SDK: {request}");
    }
}

async fn seed_002_end_to_end(env: &Env) {
    let stub = Stub::start(env).await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    // Paid at Alipay, its notification lost.
    let mut lost = order("lost", "acme", T0);
    lost.payment_ref = Some("202611290001".into());
    stub.pre_order("202611290001", "34.90", true).await;
    stub.pay("202611290001").await;
    env.create(&lost).await;
    // Scanned, never paid.
    let mut unpaid = order("unpaid", "acme", T0);
    unpaid.payment_ref = Some("202611290002".into());
    stub.pre_order("202611290002", "34.90", true).await;
    env.create(&unpaid).await;
    // Pre-ordered, its code scanned only after the deadline.
    let mut late = order("late", "acme", T0);
    late.payment_ref = Some("202611290003".into());
    stub.pre_order("202611290003", "34.90", false).await;
    env.create(&late).await;

    let config = env.config(
        SHOPS,
        &format!(
            "[http]\nlisten = \"127.0.0.1:0\"\n{}",
            alipay_config(&stub, "")
        ),
    );
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
    assert!(
        detail.contains("\"amount_cents\":3490"),
        "Alipay's yuan as cents: {detail}"
    );
    assert_eq!(env.status("unpaid").await, "CLOSED");
    assert_eq!(env.status("late").await, "CLOSED");
    assert_eq!(
        (env.stock("sku-a").await, env.stock("sku-b").await),
        (8, 9),
        "the paid order's buyer keeps the goods, the others' are back"
    );
    let close = "SELECT status FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?";
    let note = "SELECT last_error FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?";
    eventually(Duration::from_secs(20), "both closes DONE", || async {
        env.text(close, "unpaid").await == "DONE" && env.text(close, "late").await == "DONE"
    })
    .await;
    let closed = stub.trade("202611290002").await;
    assert_eq!(
        closed["status"], "TRADE_CLOSED",
        "closed at Alipay: {closed}"
    );
    assert_eq!(closed["closes"], 1);
    assert!(
        env.text(note, "late").await.contains("nothing to close"),
        "no trade at Alipay before the scan"
    );
    let paid = stub.trade("202611290001").await;
    assert_eq!(paid["status"], "TRADE_SUCCESS", "nothing closed: {paid}");
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?",
            "lost"
        )
        .await,
        0
    );

    // The buyer scans the late pre-order's code and pays; Alipay's notification arrives.
    let notify = listen(env, &config).await;
    stub.pay("202611290003").await;
    let (status, body) = stub
        .deliver("202611290003", &format!("{notify}/late"))
        .await;
    assert_eq!((status, body.as_str()), (200, "success"));
    assert_eq!(
        env.text(
            "SELECT source FROM paid_after_close WHERE order_id = ?",
            "late"
        )
        .await,
        "alipay-notify"
    );
    let refund = "SELECT status FROM effect_ledger WHERE kind = 'refund-payment' AND order_id = ?";
    eventually(Duration::from_secs(20), "the refund is DONE", || async {
        env.text(refund, "late").await == "DONE"
    })
    .await;
    assert_eq!(
        env.text(
            "SELECT idempotency_key FROM effect_ledger WHERE kind = 'refund-payment' AND order_id = ?",
            "late"
        )
        .await,
        "acme/late/refund"
    );
    // Alipay retries a notification it thinks was lost: a no-op, still `success`.
    let (status, body) = stub
        .deliver("202611290003", &format!("{notify}/late"))
        .await;
    assert_eq!((status, body.as_str()), (200, "success"));
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM paid_after_close WHERE order_id = ?",
            "late"
        )
        .await,
        1
    );
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM effect_ledger WHERE kind = 'refund-payment' AND order_id = ?",
            "late"
        )
        .await,
        1
    );
    let refunded = stub.trade("202611290003").await;
    assert_eq!(
        refunded["refunds"],
        json!({ "acme/late/refund": "34.90" }),
        "refunded once at Alipay, in full, under the ledger key: {refunded}"
    );
    all_verified(&stub).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn seed_002_a_lost_notification_is_aligned_by_query_an_unpaid_trade_closed_at_alipay_and_a_late_payment_refunded_once_mariadb()
 {
    let env = Env::new(Backend::MySql).await;
    seed_002_end_to_end(&env).await;
    env.cleanup().await;
}

fn refused(reason: &str) -> u64 {
    fakes::refused("alipay", reason)
}

/// A notification's parameters.
type Form = Vec<(String, String)>;

const REASONS: [&str; 5] = [
    "unsigned",
    "signature",
    "unknown_order",
    "misaddressed",
    "amount",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_altered_and_misaddressed_notifications_are_refused_and_counted_then_a_genuine_one_applies_mariadb()
 {
    let env = Env::new(Backend::MySql).await;
    let stub = Stub::start(&env).await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    let mut hooked = order("hooked", "acme", T0 + 3_600_000);
    hooked.payment_ref = Some("202611290010".into());
    stub.pre_order("202611290010", "34.90", true).await;
    env.create(&hooked).await;
    let mut other = order("other", "acme", T0 + 3_600_000);
    other.payment_ref = Some("202611290011".into());
    env.create(&other).await;
    let config = env.config(
        SHOPS,
        &format!(
            "[http]\nlisten = \"127.0.0.1:0\"\n{}",
            alipay_config(&stub, "")
        ),
    );
    let notify = listen(&env, &config).await;
    let client = reqwest::Client::new();
    let send = |order_id: &str, params: &[(String, String)]| {
        client
            .post(format!("{notify}/{order_id}"))
            .form(params)
            .send()
    };
    stub.pay("202611290010").await;
    let genuine = stub.notice("202611290010", json!({}), "alipay").await;
    let with = |params: &[(String, String)], key: &str, value: Option<&str>| {
        let mut changed: Vec<(String, String)> =
            params.iter().filter(|(k, _)| k != key).cloned().collect();
        if let Some(v) = value {
            changed.push((key.to_string(), v.to_string()));
        }
        changed
    };
    // (reason, order in the URL, the form, status)
    let cases: Vec<(&str, &str, Form, u16)> = vec![
        ("unsigned", "hooked", with(&genuine, "sign", None), 400),
        (
            "signature",
            "hooked",
            stub.notice("202611290010", json!({}), "forger").await,
            400,
        ),
        (
            "signature",
            "hooked",
            with(&genuine, "total_amount", Some("0.01")),
            400,
        ),
        (
            "signature",
            "hooked",
            with(&genuine, "sign_type", Some("RSA")),
            400,
        ),
        (
            "misaddressed",
            "hooked",
            stub.notice(
                "202611290010",
                json!({ "app_id": "2021009999999999" }),
                "alipay",
            )
            .await,
            409,
        ),
        ("misaddressed", "other", genuine.clone(), 409),
        ("unknown_order", "nobody", genuine.clone(), 404),
        (
            "amount",
            "hooked",
            stub.notice("202611290010", json!({ "total_amount": "0.01" }), "alipay")
                .await,
            409,
        ),
    ];
    let before = env.dump().await;
    let start: Vec<u64> = REASONS.iter().map(|r| refused(r)).collect();
    for (reason, order_id, params, status) in cases {
        let r = send(order_id, &params).await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{reason}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["reason"], reason, "{body}");
    }
    assert_eq!(env.dump().await, before, "a refused notice records nothing");
    let delta: Vec<u64> = REASONS
        .iter()
        .zip(&start)
        .map(|(r, s)| refused(r) - s)
        .collect();
    assert_eq!(
        delta,
        vec![1, 3, 1, 2, 1],
        "each refusal counted by its reason"
    );
    assert_eq!(env.status("hooked").await, "PENDING");

    // Alipay's genuine notification is believed, and a repeat is a no-op.
    let (status, body) = stub
        .deliver("202611290010", &format!("{notify}/hooked"))
        .await;
    assert_eq!((status, body.as_str()), (200, "success"));
    assert_eq!(env.status("hooked").await, "PAID");
    let r = send("hooked", &genuine).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "success");
    assert_eq!(env.status("other").await, "PENDING");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_answer_altered_after_alipay_signed_it_is_never_believed() {
    let env = Env::new(Backend::Sqlite).await;
    let stub = Stub::start(&env).await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    let mut unpaid = order("unpaid", "acme", T0);
    unpaid.payment_ref = Some("202611290020".into());
    stub.pre_order("202611290020", "34.90", true).await;
    env.create(&unpaid).await;
    // Both quick tries of the query come back saying TRADE_SUCCESS, under Alipay's signature
    // of WAIT_BUYER_PAY.
    stub.post("/_test/tamper", json!({ "times": 2 })).await;
    let config = env.config(SHOPS, &alipay_config(&stub, ""));
    let (clock, now) = Clock::manual(T0);
    let d = env.dispatcher(&config, clock).await;
    let outcomes = env.process(&d, T0).await;
    let [Outcome::Retry { due_ms, error }] = &outcomes[..] else {
        panic!("not aligned on an unverifiable answer, but asked again: {outcomes:?}");
    };
    assert!(error.contains("does not verify"), "{error}");
    assert_eq!(env.status("unpaid").await, "PENDING");
    // Asked again, the genuine answer (WAIT_BUYER_PAY) is believed: closed here and there.
    now.store(*due_ms, std::sync::atomic::Ordering::SeqCst);
    let outcomes = env.process(&d, *due_ms).await;
    assert!(
        matches!(&outcomes[..], [Outcome::Closed { .. }]),
        "{outcomes:?}"
    );
    assert_eq!(env.status("unpaid").await, "CLOSED");
    let close = "SELECT status FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?";
    eventually(Duration::from_secs(20), "the close is DONE", || async {
        env.text(close, "unpaid").await == "DONE"
    })
    .await;
    assert_eq!(stub.trade("202611290020").await["status"], "TRADE_CLOSED");
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_close_refused_for_a_paid_trade_is_paid_after_close_and_refunded_once() {
    let env = Env::new(Backend::Sqlite).await;
    let stub = Stub::start(&env).await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    let mut raced = order("raced", "acme", T0);
    raced.payment_ref = Some("202611290030".into());
    stub.pre_order("202611290030", "34.90", true).await;
    env.create(&raced).await;
    // The buyer pays between the query and the close: modelled by not querying first.
    stub.pay("202611290030").await;
    let config = env.config(SHOPS, &alipay_config(&stub, "query_before_close = false"));
    let (clock, _) = Clock::manual(T0);
    let d = env.dispatcher(&config, clock).await;
    let outcomes = env.process(&d, T0).await;
    assert!(
        matches!(&outcomes[..], [Outcome::Closed { .. }]),
        "{outcomes:?}"
    );
    let refund = "SELECT status FROM effect_ledger WHERE kind = 'refund-payment' AND order_id = ?";
    eventually(Duration::from_secs(20), "the refund is DONE", || async {
        env.int(
            "SELECT COUNT(*) FROM effect_ledger WHERE kind = 'refund-payment' AND order_id = ?",
            "raced",
        )
        .await
            == 1
            && env.text(refund, "raced").await == "DONE"
    })
    .await;
    assert_eq!(
        env.text(
            "SELECT source FROM paid_after_close WHERE order_id = ?",
            "raced"
        )
        .await,
        "close-payment"
    );
    assert_eq!(
        stub.trade("202611290030").await["refunds"],
        json!({ "acme/raced/refund": "34.90" })
    );
    all_verified(&stub).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn doctor_finds_an_app_key_alipay_rejects_and_an_alipay_key_that_verifies_nothing() {
    let env = Env::new(Backend::Sqlite).await;
    let stub = Stub::start(&env).await;
    let dir = env.dir.path();
    let secrets = [dir.join("app.key"), dir.join("forger.key")];
    let secrets: Vec<&std::path::Path> = secrets.iter().map(|p| p.as_path()).collect();
    let findings = |config: String| {
        let config = env.config(SHOPS, &config);
        let secrets = &secrets;
        async move { fakes::doctor_findings(&config, "alipay", secrets).await }
    };
    let right = findings(alipay_config(&stub, "")).await;
    assert!(
        right.iter().all(|f| f.level == timeoutd::doctor::Level::Ok)
            && right.iter().any(|f| f.found.contains("\"not found\"")),
        "{right:?}"
    );
    for (wrong, says) in [
        (
            "app_private_key = { secret_file = \"app.key\" }",
            "app_private_key = { secret_file = \"forger.key\" }",
        ),
        (
            "alipay_public_key = { secret_file = \"alipay.pub.txt\" }",
            "alipay_public_key = { secret_file = \"forger.pub\" }",
        ),
    ]
    .map(|(from, to)| (alipay_config(&stub, "").replace(from, to), to))
    {
        let found = findings(wrong).await;
        assert!(
            found
                .iter()
                .any(|f| f.level == timeoutd::doctor::Level::Error),
            "{says}: {found:?}"
        );
    }
    env.cleanup().await;
}
