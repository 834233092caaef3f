//! The `stripe` payment provider against localstripe (PyPI: a stateful fake Stripe server,
//! code nobody here wrote), started per test on loopback (`tests/data/localstripe/serve.py`,
//! the interpreter of the venv scripts/test installs: `TIMEOUTD_LOCALSTRIPE_PYTHON`).
//! PaymentIntents are created and paid at localstripe as a shop's checkout would, and read back
//! from it: an unpaid intent at the deadline is canceled there and its order closed; a
//! succeeded intent whose notice was lost aligns its order to PAID with nothing canceled; an
//! intent that succeeds after the close is refunded once; and localstripe's own signed
//! `payment_intent.succeeded` webhook is believed, while forged, altered, stale, misaddressed
//! and unknown-order notices are refused with a 4xx, record nothing and are counted by reason.

use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use serde_json::Value;
use timeoutd::clock::Clock;
use timeoutd::db::Backend;
use timeoutd::dispatch::Outcome;
use tokio::io::AsyncBufReadExt;

use crate::support::{Env, MerchantSpec, T0, eventually, order};

const SHOPS: &[MerchantSpec<'static>] = &[("acme", "builtin:single-phase", &[])];

/// A localstripe server of this test's own; killed when dropped.
struct LocalStripe {
    base_url: String,
    _child: tokio::process::Child,
    http: reqwest::Client,
}

const API_KEY: &str = "sk_test_timeoutd";

impl LocalStripe {
    async fn start() -> LocalStripe {
        let python = crate::provider_fakes::python(
            "TIMEOUTD_LOCALSTRIPE_PYTHON",
            "localstripe",
            "localstripe",
        );
        let mut child = tokio::process::Command::new(&python)
            .arg(crate::support::repo_root().join("tests/data/localstripe/serve.py"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start localstripe");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let port = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("localstripe printed its port")
            .unwrap()
            .expect("a port line");
        let base_url = format!("http://127.0.0.1:{}", port.trim());
        let http = reqwest::Client::new();
        // Ready when it answers.
        for _ in 0..100 {
            if http
                .get(format!("{base_url}/v1/payment_intents"))
                .bearer_auth(API_KEY)
                .send()
                .await
                .is_ok()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        LocalStripe {
            base_url,
            _child: child,
            http,
        }
    }

    async fn post(&self, path: &str, form: &[(&str, &str)]) -> Value {
        let r = self
            .http
            .post(format!("{}{path}", self.base_url))
            .bearer_auth(API_KEY)
            .form(form)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap();
        assert!(status.is_success(), "{path}: {status} {body}");
        body
    }

    async fn get(&self, path: &str) -> Value {
        self.http
            .get(format!("{}{path}", self.base_url))
            .bearer_auth(API_KEY)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// A PaymentIntent for `order_id` of `amount` minor units, unpaid.
    async fn intent(&self, order_id: &str, amount: i64, currency: &str) -> String {
        let amount = amount.to_string();
        let pi = self
            .post(
                "/v1/payment_intents",
                &[
                    ("amount", &amount),
                    ("currency", currency),
                    ("metadata[order_id]", order_id),
                ],
            )
            .await;
        assert_eq!(pi["status"], "requires_payment_method");
        pi["id"].as_str().unwrap().to_string()
    }

    /// The buyer pays intent `id` with a test card (localstripe charges it at once).
    async fn pay(&self, id: &str) {
        let pm = self
            .post(
                "/v1/payment_methods",
                &[
                    ("type", "card"),
                    ("card[number]", "4242424242424242"),
                    ("card[exp_month]", "12"),
                    ("card[exp_year]", "2030"),
                    ("card[cvc]", "123"),
                ],
            )
            .await;
        self.post(
            &format!("/v1/payment_intents/{id}"),
            &[("payment_method", pm["id"].as_str().unwrap())],
        )
        .await;
        let pi = self
            .post(&format!("/v1/payment_intents/{id}/confirm"), &[])
            .await;
        assert_eq!(pi["status"], "succeeded", "{pi}");
    }

    async fn status(&self, id: &str) -> String {
        self.get(&format!("/v1/payment_intents/{id}")).await["status"]
            .as_str()
            .unwrap_or("?")
            .to_string()
    }
}

/// `[payment]` on Stripe at `stripe`, the key in a file of `env`'s scratch directory; `extra`
/// lines go into `[payment]`, `stripe_extra` into `[payment.stripe]`.
fn stripe_config(env: &Env, stripe: &LocalStripe, extra: &str, stripe_extra: &str) -> String {
    std::fs::write(env.dir.path().join("stripe.key"), format!("{API_KEY}\n")).unwrap();
    format!(
        "[payment]\nprovider = \"stripe\"\nattempts = 2\ntimeout = \"5s\"\n{extra}\n\
         [payment.stripe]\nbase_url = \"{}\"\napi_key = {{ secret_file = \"stripe.key\" }}\n\
         cancellation_reason = \"\"\n{stripe_extra}\n",
        stripe.base_url
    )
}

async fn unpaid_intent_is_canceled_and_its_order_closed(env: &Env) {
    let stripe = LocalStripe::start().await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    let mut unpaid = order("unpaid", "acme", T0);
    let pi_unpaid = stripe.intent("unpaid", unpaid.total_cents, "usd").await;
    unpaid.payment_ref = Some(pi_unpaid.clone());
    env.create(&unpaid).await;
    // Canceled already (the shop gave up on it): the close is nothing to close.
    let mut gone = order("gone", "acme", T0);
    let pi_gone = stripe.intent("gone", gone.total_cents, "usd").await;
    stripe
        .post(&format!("/v1/payment_intents/{pi_gone}/cancel"), &[])
        .await;
    gone.payment_ref = Some(pi_gone.clone());
    env.create(&gone).await;
    // An intent Stripe never had.
    let mut never = order("never", "acme", T0);
    never.payment_ref = Some("pi_neverexisted".into());
    env.create(&never).await;

    let config = env.config(SHOPS, &stripe_config(env, &stripe, "", ""));
    let (clock, _) = Clock::manual(T0);
    let d = env.dispatcher(&config, clock).await;
    let outcomes = env.process(&d, T0).await;
    assert!(
        outcomes.iter().all(|o| matches!(o, Outcome::Closed { .. })),
        "{outcomes:?}"
    );
    for id in ["unpaid", "gone", "never"] {
        assert_eq!(env.status(id).await, "CLOSED", "{id}");
    }
    assert_eq!(
        (env.stock("sku-a").await, env.stock("sku-b").await),
        (10, 10)
    );
    let close = "SELECT status FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?";
    let note = "SELECT last_error FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?";
    assert_eq!(env.text(close, "unpaid").await, "DONE");
    assert_eq!(
        stripe.status(&pi_unpaid).await,
        "canceled",
        "canceled at Stripe, read back"
    );
    for id in ["gone", "never"] {
        assert_eq!(env.text(close, id).await, "DONE", "{id}");
        assert!(
            env.text(note, id).await.contains("nothing to close"),
            "{id}"
        );
    }
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM paid_after_close WHERE order_id <> ?",
            ""
        )
        .await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unpaid_intent_at_the_deadline_is_canceled_at_stripe_and_its_order_closed() {
    let env = Env::new(Backend::Sqlite).await;
    unpaid_intent_is_canceled_and_its_order_closed(&env).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unpaid_intent_at_the_deadline_is_canceled_at_stripe_and_its_order_closed_mariadb() {
    let env = Env::new(Backend::MySql).await;
    unpaid_intent_is_canceled_and_its_order_closed(&env).await;
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_succeeded_intent_whose_notice_was_lost_is_aligned_to_paid_and_nothing_canceled() {
    let env = Env::new(Backend::Sqlite).await;
    let stripe = LocalStripe::start().await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    let mut lost = order("lost", "acme", T0);
    let pi = stripe.intent("lost", lost.total_cents, "usd").await;
    stripe.pay(&pi).await;
    lost.payment_ref = Some(pi.clone());
    env.create(&lost).await;
    let config = env.config(SHOPS, &stripe_config(&env, &stripe, "", ""));
    let (clock, _) = Clock::manual(T0 + 1_000);
    let d = env.dispatcher(&config, clock).await;
    let outcomes = env.process(&d, T0 + 1_000).await;
    assert!(
        matches!(&outcomes[..], [Outcome::Aligned { .. }]),
        "{outcomes:?}"
    );
    assert_eq!(env.status("lost").await, "PAID");
    assert_eq!(
        (env.stock("sku-a").await, env.stock("sku-b").await),
        (8, 9),
        "the buyer keeps the goods"
    );
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?",
            "lost"
        )
        .await,
        0
    );
    let detail = env
        .text("SELECT detail FROM decision_log WHERE order_id = ?", "lost")
        .await;
    assert!(
        detail.contains("\"amount_cents\":3490"),
        "Stripe's minor units as cents: {detail}"
    );
    assert_eq!(
        stripe.status(&pi).await,
        "succeeded",
        "nothing canceled at Stripe"
    );
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_intent_that_succeeds_after_the_close_is_refunded_once_under_the_ledger_key() {
    let env = Env::new(Backend::Sqlite).await;
    let stripe = LocalStripe::start().await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    let mut late = order("late", "acme", T0);
    let pi = stripe.intent("late", late.total_cents, "usd").await;
    late.payment_ref = Some(pi.clone());
    env.create(&late).await;
    // The buyer pays between the query and the cancel: modelled by not querying first.
    stripe.pay(&pi).await;
    let config = env.config(
        SHOPS,
        &stripe_config(&env, &stripe, "query_before_close = false", ""),
    );
    let (clock, _) = Clock::manual(T0);
    let d = env.dispatcher(&config, clock).await;
    let outcomes = env.process(&d, T0).await;
    assert!(
        matches!(&outcomes[..], [Outcome::Closed { .. }]),
        "{outcomes:?}"
    );
    // The cancel was refused by Stripe (succeeded): already paid → paid-after-close → refund.
    assert_eq!(
        env.int(
            "SELECT COUNT(*) FROM paid_after_close WHERE order_id = ?",
            "late"
        )
        .await,
        1
    );
    assert_eq!(
        env.text(
            "SELECT source FROM paid_after_close WHERE order_id = ?",
            "late"
        )
        .await,
        "close-payment"
    );
    let refund = "SELECT status FROM effect_ledger WHERE kind = 'refund-payment' AND order_id = ?";
    eventually(Duration::from_secs(20), "the refund is DONE", || async {
        env.text(refund, "late").await == "DONE"
    })
    .await;
    assert_eq!(
        env.text("SELECT idempotency_key FROM effect_ledger WHERE kind = 'refund-payment' AND order_id = ?", "late").await,
        "acme/late/refund"
    );
    let refunds = stripe
        .get(&format!("/v1/refunds?payment_intent={pi}"))
        .await;
    let list = refunds["data"].as_array().expect("a list of refunds");
    assert_eq!(list.len(), 1, "refunded once at Stripe: {refunds}");
    assert_eq!(list[0]["amount"], 3490);
    env.cleanup().await;
}

fn sign(secret: &str, t: i64, body: &str) -> String {
    let mut mac = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{t}.{body}").as_bytes());
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

fn refused(reason: &str) -> u64 {
    crate::provider_fakes::refused("stripe", reason)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn only_a_genuinely_signed_webhook_is_applied_and_each_refusal_is_counted() {
    let env = Env::new(Backend::Sqlite).await;
    let stripe = LocalStripe::start().await;
    env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
    let mut paid = order("hooked", "acme", T0 + 3_600_000);
    let pi = stripe.intent("hooked", paid.total_cents, "usd").await;
    paid.payment_ref = Some(pi.clone());
    env.create(&paid).await;
    let mut other = order("other", "acme", T0 + 3_600_000);
    other.payment_ref = Some("pi_someoneelse".into());
    env.create(&other).await;

    // A signing secret made for this run, in a file.
    let secret = format!(
        "whsec_{}",
        (0..32)
            .map(|_| fastrand::alphanumeric())
            .collect::<String>()
    );
    std::fs::write(env.dir.path().join("whsec"), &secret).unwrap();
    let config = env.config(
        SHOPS,
        &format!(
            "[http]\nlisten = \"127.0.0.1:0\"\n{}",
            stripe_config(
                &env,
                &stripe,
                "",
                "webhook_secret = { secret_file = \"whsec\" }"
            )
        ),
    );
    let runner = env.runner(&config, Clock::Database).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    let state = timeoutd::http::HttpState::new(env.db.clone(), runner, &config);
    let _server = tokio::spawn(timeoutd::http::serve(listener, state, stopped));
    let url = format!("http://{addr}/v1/providers/stripe/webhook");
    let client = reqwest::Client::new();
    let send = |body: String, signature: Option<String>| {
        let mut r = client
            .post(&url)
            .header("content-type", "application/json")
            .body(body);
        if let Some(s) = signature {
            r = r.header("Stripe-Signature", s);
        }
        r.send()
    };

    // Notices as an attacker would send them: the intent's real shape, paid.
    let now_s = env.db.now_ms().await.unwrap() / 1000;
    let event = |order_id: &str, intent: &str, amount: i64| {
        serde_json::json!({
            "id": "evt_1", "object": "event", "type": "payment_intent.succeeded", "created": now_s,
            "data": { "object": {
                "id": intent, "object": "payment_intent", "status": "succeeded", "amount": amount,
                "amount_received": amount, "currency": "usd", "metadata": { "order_id": order_id }
            } }
        })
        .to_string()
    };
    let genuine = event("hooked", &pi, 3490);
    let before = env.dump().await;
    let counts = |r: &str| refused(r);
    let start: Vec<u64> = [
        "unsigned",
        "signature",
        "stale",
        "unknown_order",
        "misaddressed",
        "amount",
    ]
    .iter()
    .map(|r| counts(r))
    .collect();
    let cases: Vec<(&str, String, Option<String>, u16)> = vec![
        ("unsigned", genuine.clone(), None, 400),
        (
            "signature",
            genuine.clone(),
            Some(sign("whsec_forged", now_s, &genuine)),
            400,
        ),
        (
            "signature",
            genuine.replace("3490", "1"),
            Some(sign(&secret, now_s, &genuine)),
            400,
        ),
        (
            "stale",
            genuine.clone(),
            Some(sign(&secret, now_s - 301, &genuine)),
            400,
        ),
        (
            "unknown_order",
            event("nobody", &pi, 3490),
            Some(sign(&secret, now_s, &event("nobody", &pi, 3490))),
            404,
        ),
        (
            "misaddressed",
            event("other", &pi, 3490),
            Some(sign(&secret, now_s, &event("other", &pi, 3490))),
            409,
        ),
        (
            "amount",
            event("hooked", &pi, 1),
            Some(sign(&secret, now_s, &event("hooked", &pi, 1))),
            409,
        ),
    ];
    for (reason, body, signature, status) in cases {
        let r = send(body, signature).await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{reason}");
        let answer: Value = r.json().await.unwrap();
        assert_eq!(answer["reason"], reason);
        assert!(
            !answer.to_string().contains(&secret),
            "the secret is never in an answer"
        );
    }
    assert_eq!(env.dump().await, before, "a refused notice records nothing");
    let end: Vec<u64> = [
        "unsigned",
        "signature",
        "stale",
        "unknown_order",
        "misaddressed",
        "amount",
    ]
    .iter()
    .map(|r| counts(r))
    .collect();
    let delta: Vec<u64> = end.iter().zip(&start).map(|(e, s)| e - s).collect();
    assert_eq!(
        delta,
        vec![1, 2, 1, 1, 1, 1],
        "each refusal counted by its reason"
    );
    assert_eq!(env.status("hooked").await, "PENDING");

    // Stripe's own (localstripe's) signed event for the paid intent is believed.
    let registered = client
        .post(format!("{}/_config/webhooks/timeoutd", stripe.base_url))
        .form(&[
            ("url", url.as_str()),
            ("secret", secret.as_str()),
            ("events[]", "payment_intent.succeeded"),
        ])
        .send()
        .await
        .unwrap();
    assert!(registered.status().is_success(), "{}", registered.status());
    stripe.pay(&pi).await;
    eventually(
        Duration::from_secs(20),
        "localstripe's webhook aligned the order",
        || async { env.status("hooked").await == "PAID" },
    )
    .await;
    assert_eq!(env.status("other").await, "PENDING");
    // A repeat is a no-op.
    let again = send(genuine.clone(), Some(sign(&secret, now_s, &genuine)))
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(again.json::<Value>().await.unwrap()["new"], false);
    env.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn doctor_finds_a_publishable_key_given_for_the_secret_one() {
    let env = Env::new(Backend::Sqlite).await;
    let stripe = LocalStripe::start().await;
    let config = env.config(SHOPS, &stripe_config(&env, &stripe, "", ""));
    let key = env.dir.path().join("stripe.key");
    let right = crate::provider_fakes::doctor_findings(&config, "stripe", &[&key]).await;
    assert!(
        right.iter().all(|f| f.level == timeoutd::doctor::Level::Ok)
            && right.iter().any(|f| f.found.contains("\"not found\"")),
        "{right:?}"
    );
    // A publishable key where the secret one belongs: Stripe (localstripe) answers 401.
    std::fs::write(&key, "pk_test_TIMEOUTDpublishable0001\n").unwrap();
    let wrong = crate::provider_fakes::doctor_findings(&config, "stripe", &[&key]).await;
    assert!(
        wrong
            .iter()
            .any(|f| f.level == timeoutd::doctor::Level::Error && f.found.contains("401")),
        "{wrong:?}"
    );
    env.cleanup().await;
}
