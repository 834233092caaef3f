//! The `wechatpay` provider: WeChat Pay API v3 for a directly connected merchant (直连商户). An
//! order's `payment_ref` is its transaction's `out_trade_no` (6–32 of `0-9a-zA-Z_-|*`).
//!
//! - Every request carries `Authorization: WECHATPAY2-SHA256-RSA2048 mchid=…,nonce_str=…,
//!   timestamp=…,serial_no=…,signature=…`: SHA256withRSA with the merchant's API key over
//!   `METHOD\nURL\nTIMESTAMP\nNONCE\nBODY\n` ([`request_message`]; URL is the path and query,
//!   BODY the JSON sent, empty for a GET).
//! - Every answer is believed only once its `Wechatpay-Signature` verifies with the platform's
//!   public key over `TIMESTAMP\nNONCE\nBODY\n` from its `Wechatpay-Timestamp` and
//!   `Wechatpay-Nonce` headers and its exact body ([`answer_message`]), and its
//!   `Wechatpay-Serial` is the configured key's id (when one is given). An unsigned or
//!   unverifiable success, or "no such order", is retried like a provider that did not answer,
//!   never acted on; an unsigned refusal (401 `SIGN_ERROR`: WeChat Pay did not believe us) is
//!   refused.
//! - Answers: 429, 5xx and the codes `SYSTEM_ERROR`, `FREQUENCY_LIMITED`, `BANKERROR`,
//!   `NOT_ENOUGH` are retried; 404 `ORDER_NOT_EXIST` is not found (for a close: nothing to
//!   close); other errors refused with WeChat Pay's `code` and `message`.
//! - Query (`GET /v3/pay/transactions/out-trade-no/{out_trade_no}?mchid=`): `SUCCESS` and
//!   `REFUND` (paid, then refunded in part or whole) paid, `amount.total` in fen (the cents
//!   timeoutd keeps), `success_time` as the time paid; `NOTPAY` and `PAYERROR` unpaid;
//!   `CLOSED` and `REVOKED` closed; `USERPAYING` (the buyer is entering a password) not known
//!   yet: retried.
//! - Close (`POST …/{out_trade_no}/close`, `{"mchid"}`): 204 is closed; a refusal is read
//!   through a query — paid → already paid (paid-after-close, then refund or review); closed
//!   or gone → nothing to close; `NOTPAY`/`USERPAYING` → retried.
//! - Refund (`POST /v3/refund/domestic/refunds`): the transaction's `amount.total` (asked
//!   first, as WeChat Pay states it) refunded in full under `out_refund_no` = the ledger row's
//!   key ([`out_refund_no`]), which WeChat Pay makes idempotent: a repeat answers the refund
//!   it has. `SUCCESS` and `PROCESSING` are done; `ABNORMAL` and `CLOSED` refused (the money
//!   did not reach the buyer: the operator settles it on the merchant platform).
//! - Notifications ([`verify_notice`]): the signature and `Wechatpay-Timestamp` window as for
//!   answers, then the `resource` decrypted with the APIv3 key (AEAD_AES_256_GCM, its `nonce`
//!   and `associated_data`); `crate::http` serves the endpoint.

use std::path::Path;
use std::time::Duration;

use base64::Engine;
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use ring::aead;
use serde_json::{Value, json};
use timeoutd_runtime::model::{Payment, PaymentStatus};

use super::rsa::{PrivateKey, PublicKey};
use super::{CloseOutcome, GatewayFuture, PaymentGateway, Refusal, rsa};
use crate::config::{PaymentConfig, Secret};
use crate::effects::EffectError;
use crate::retry::Backoff;

/// The only signature scheme timeoutd speaks (WeChat Pay's SM2 scheme is not supported).
const SCHEME: &str = "WECHATPAY2-SHA256-RSA2048";

/// The WeChat Pay adapter.
pub struct WechatpayGateway {
    client: reqwest::Client,
    base_url: String,
    mchid: String,
    serial_no: String,
    merchant_key: PrivateKey,
    platform: Platform,
    attempts: u32,
}

/// What verifies WeChat Pay's answers and notifications: its public key and that key's id.
pub struct Platform {
    /// The platform's public key.
    pub key: PublicKey,
    /// Its id (`PUB_KEY_ID_…`, or a certificate's serial); `None` accepts any serial.
    pub key_id: Option<String>,
}

/// What a signed answer or notification's headers say (`Wechatpay-*`).
#[derive(Debug, Clone, Default)]
pub struct SignedHeaders<'a> {
    /// `Wechatpay-Timestamp`: epoch seconds, as text.
    pub timestamp: Option<&'a str>,
    /// `Wechatpay-Nonce`.
    pub nonce: Option<&'a str>,
    /// `Wechatpay-Signature`: base64.
    pub signature: Option<&'a str>,
    /// `Wechatpay-Serial`: the signing key's id.
    pub serial: Option<&'a str>,
    /// `Wechatpay-Signature-Type`, when sent.
    pub signature_type: Option<&'a str>,
}

impl<'a> SignedHeaders<'a> {
    /// The `Wechatpay-*` headers of `headers`.
    pub fn of(headers: &'a HeaderMap) -> Self {
        let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        SignedHeaders {
            timestamp: get("wechatpay-timestamp"),
            nonce: get("wechatpay-nonce"),
            signature: get("wechatpay-signature"),
            serial: get("wechatpay-serial"),
            signature_type: get("wechatpay-signature-type"),
        }
    }
}

impl Platform {
    /// Checks `headers`' signature over `body`; returns the signed timestamp (epoch seconds).
    ///
    /// # Errors
    /// [`Refusal::Unsigned`] (a header missing, or a timestamp that is no number),
    /// [`Refusal::Signature`] (another key's serial, another scheme, or a signature that does
    /// not verify: forged or altered).
    pub fn verify(&self, headers: &SignedHeaders<'_>, body: &[u8]) -> Result<i64, Refusal> {
        let (Some(timestamp), Some(nonce), Some(signature)) =
            (headers.timestamp, headers.nonce, headers.signature)
        else {
            return Err(Refusal::Unsigned);
        };
        let at: i64 = timestamp.parse().map_err(|_| Refusal::Unsigned)?;
        if headers.signature_type.is_some_and(|t| t != SCHEME)
            || self
                .key_id
                .as_deref()
                .is_some_and(|id| headers.serial != Some(id))
        {
            return Err(Refusal::Signature);
        }
        if !self
            .key
            .verifies(&answer_message(timestamp, nonce, body), signature)
        {
            return Err(Refusal::Signature);
        }
        Ok(at)
    }

    /// The platform `[payment.wechatpay]` names.
    ///
    /// # Errors
    /// A key that cannot be read or is no RSA public key; the message names the key, never
    /// its content.
    pub fn from_config(
        w: &crate::config::WechatpayConfig,
        base_dir: &Path,
    ) -> Result<Platform, String> {
        let key = w
            .platform_public_key
            .resolve(base_dir)
            .and_then(|s| rsa::public_key(&s))
            .map_err(|e| format!("payment.wechatpay.platform_public_key: {e}"))?;
        Ok(Platform {
            key,
            key_id: w.platform_public_key_id.clone(),
        })
    }
}

/// The text a request's signature covers: `METHOD\nURL\nTIMESTAMP\nNONCE\nBODY\n`.
pub fn request_message(method: &str, url: &str, timestamp: i64, nonce: &str, body: &str) -> String {
    format!("{method}\n{url}\n{timestamp}\n{nonce}\n{body}\n")
}

/// The text an answer's or notification's signature covers: `TIMESTAMP\nNONCE\nBODY\n`.
pub fn answer_message(timestamp: &str, nonce: &str, body: &[u8]) -> Vec<u8> {
    let mut message = format!("{timestamp}\n{nonce}\n").into_bytes();
    message.extend_from_slice(body);
    message.push(b'\n');
    message
}

/// An answer from WeChat Pay: its status, its JSON body (`Null` when empty or not JSON), and
/// whether its signature verified.
struct Answer {
    status: StatusCode,
    body: Value,
    believed: bool,
}

impl Answer {
    fn code(&self) -> &str {
        self.body["code"].as_str().unwrap_or_default()
    }

    /// `HTTP 400 CODE: message`, for an error.
    fn described(&self) -> String {
        format!(
            "HTTP {} {}: {}",
            self.status.as_u16(),
            self.code(),
            self.body["message"].as_str().unwrap_or_default()
        )
    }

    /// This answer if it is believed; else retried.
    fn believed(self, what: &str) -> Result<Answer, EffectError> {
        if self.believed {
            Ok(self)
        } else {
            Err(EffectError::Transient(format!(
                "{what}: {}, unsigned or not verifying with payment.wechatpay.platform_public_key; not believed",
                self.described()
            )))
        }
    }

    fn refused(&self, what: &str) -> EffectError {
        EffectError::Permanent(format!(
            "{what}: refused by WeChat Pay: {}",
            self.described()
        ))
    }

    fn is_not_found(&self) -> bool {
        self.status == StatusCode::NOT_FOUND || self.code() == "ORDER_NOT_EXIST"
    }
}

/// Codes WeChat Pay answers for a failure worth another try.
const RETRYABLE: &[&str] = &[
    "SYSTEM_ERROR",
    "FREQUENCY_LIMITED",
    "BANKERROR",
    "NOT_ENOUGH",
];

impl WechatpayGateway {
    /// The adapter `[payment.wechatpay]` describes (`base_dir`: the config file's folder).
    ///
    /// # Errors
    /// No `[payment.wechatpay]`, a key that cannot be read or is no RSA key of the kind needed,
    /// or no HTTP client. The message names the key, never its content.
    pub fn from_config(payment: &PaymentConfig, base_dir: &Path) -> Result<Self, String> {
        let w = payment
            .wechatpay
            .as_ref()
            .ok_or("payment.wechatpay: missing, and a merchant uses provider `wechatpay`")?;
        let merchant_key = w
            .merchant_private_key
            .resolve(base_dir)
            .and_then(|s| rsa::private_key(&s))
            .map_err(|e| format!("payment.wechatpay.merchant_private_key: {e}"))?;
        Ok(WechatpayGateway {
            client: crate::outbound::client("payment.wechatpay", payment.timeout)?,
            base_url: w.base_url.trim_end_matches('/').to_string(),
            mchid: w.mchid.clone(),
            serial_no: w.merchant_serial_no.clone(),
            merchant_key,
            platform: Platform::from_config(w, base_dir)?,
            attempts: payment.attempts.max(1),
        })
    }

    /// The `Authorization` header of one request.
    fn authorization(&self, method: &Method, url: &str, body: &str, now_s: i64) -> String {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).expect("the system's random source");
        let nonce = hex::encode_upper(bytes);
        let message = request_message(method.as_str(), url, now_s, &nonce, body);
        let signature = self.merchant_key.sign(message.as_bytes());
        format!(
            "{SCHEME} mchid=\"{}\",nonce_str=\"{nonce}\",timestamp=\"{now_s}\",serial_no=\"{}\",signature=\"{signature}\"",
            self.mchid, self.serial_no
        )
    }

    /// One call, retrying transient failures a few times quickly (the ledger or the caller
    /// retries beyond that). Returns a 2xx or 4xx answer, its signature checked; 429, 5xx and
    /// retryable codes are errors, as are transport failures.
    async fn call(
        &self,
        method: Method,
        url: &str,
        body: Option<&Value>,
    ) -> Result<Answer, EffectError> {
        let backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        let text = body.map(Value::to_string).unwrap_or_default();
        let mut failures = 0;
        loop {
            let auth = self.authorization(&method, url, &text, crate::clock::wall_ms() / 1000);
            let mut request = self
                .client
                .request(method.clone(), format!("{}{url}", self.base_url))
                .header("Authorization", auth)
                .header("Accept", "application/json")
                .header(
                    "User-Agent",
                    concat!("timeoutd/", env!("CARGO_PKG_VERSION")),
                );
            if body.is_some() {
                request = request
                    .header("Content-Type", "application/json")
                    .body(text.clone());
            }
            let result = match request.send().await {
                Ok(response) => self.read(url, response).await,
                Err(e) => Err(EffectError::Transient(format!("{url}: {e}"))),
            };
            match result {
                Err(EffectError::Transient(e)) if failures + 1 < self.attempts => {
                    failures += 1;
                    tracing::debug!(error = %e, failures, "wechatpay call failed; retrying");
                    tokio::time::sleep(backoff.delay(failures)).await;
                }
                other => return other,
            }
        }
    }

    /// The answer of `response`, classified.
    async fn read(&self, url: &str, response: reqwest::Response) -> Result<Answer, EffectError> {
        let status = response.status();
        let headers = response.headers().clone();
        let judged = EffectError::of_answer(url, status, &headers);
        let raw = response.bytes().await.map_err(|e| {
            EffectError::Transient(format!("{url}: HTTP {status}, body not read: {e}"))
        })?;
        let answer = Answer {
            status,
            body: serde_json::from_slice(&raw).unwrap_or(Value::Null),
            believed: self
                .platform
                .verify(&SignedHeaders::of(&headers), &raw)
                .is_ok(),
        };
        if RETRYABLE.contains(&answer.code()) {
            return Err(EffectError::Transient(format!(
                "{url}: WeChat Pay answered a retryable error: {}",
                answer.described()
            )));
        }
        match judged {
            Ok(()) => Ok(answer),
            Err(EffectError::Permanent(_)) if status.is_client_error() => Ok(answer),
            Err(e) => Err(e),
        }
    }

    /// The transaction `out_trade_no` as WeChat Pay answers a query (believed).
    async fn transaction(&self, out_trade_no: &str) -> Result<Answer, EffectError> {
        let url = format!(
            "/v3/pay/transactions/out-trade-no/{}?mchid={}",
            segment(out_trade_no)?,
            self.mchid
        );
        let what = format!("query {out_trade_no}");
        let answer = self.call(Method::GET, &url, None).await?;
        if !answer.status.is_success() && !answer.is_not_found() {
            return Err(answer.refused(&what));
        }
        let answer = answer.believed(&what)?;
        if answer.status.is_success()
            && (answer.body["out_trade_no"] != out_trade_no || answer.body["mchid"] != self.mchid)
        {
            return Err(EffectError::Transient(format!(
                "{what}: the answer is about transaction {} of merchant {}; not believed",
                answer.body["out_trade_no"], answer.body["mchid"]
            )));
        }
        Ok(answer)
    }
}

/// An `out_trade_no` as a path segment: WeChat Pay's are 6–32 of `0-9a-zA-Z_-|*`; anything
/// else is refused before it reaches a URL.
fn segment(out_trade_no: &str) -> Result<&str, EffectError> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"_-|*".contains(&b);
    if (6..=32).contains(&out_trade_no.len()) && out_trade_no.bytes().all(allowed) {
        Ok(out_trade_no)
    } else {
        Err(EffectError::Permanent(format!(
            "`{out_trade_no}` is not a WeChat Pay out_trade_no (6 to 32 of 0-9a-zA-Z_-|*)"
        )))
    }
}

/// The `out_refund_no` of a refund under ledger key `key`: the key with `/` as `|` when that
/// is a valid `out_refund_no` (at most 64 of `0-9a-zA-Z_-|*@`) and the key has no `|` of its
/// own (so two keys never meet); else the key's SHA-256 in hex (64 characters).
pub fn out_refund_no(key: &str) -> String {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"_-|*@".contains(&b);
    let readable = key.replace('/', "|");
    if !key.contains('|') && readable.len() <= 64 && readable.bytes().all(allowed) {
        readable
    } else {
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(key.as_bytes()))
    }
}

/// What a transaction's state (a believed query answer, or a notification's resource) means
/// for timeoutd.
fn payment_of(transaction: &Value) -> Result<Payment, EffectError> {
    let no = &transaction["out_trade_no"];
    let status = match transaction["trade_state"].as_str() {
        Some("SUCCESS" | "REFUND") => PaymentStatus::Paid,
        Some("NOTPAY" | "PAYERROR") => PaymentStatus::Unpaid,
        Some("CLOSED" | "REVOKED") => PaymentStatus::Closed,
        Some("USERPAYING") => {
            return Err(EffectError::Transient(format!(
                "transaction {no} is USERPAYING (the buyer is entering a password): paid or not is not known yet"
            )));
        }
        other => {
            return Err(EffectError::Permanent(format!(
                "transaction {no}: unknown trade_state {other:?}"
            )));
        }
    };
    if status != PaymentStatus::Paid {
        return Ok(Payment {
            status,
            ..Payment::default()
        });
    }
    let fen = transaction["amount"]["total"].as_i64().filter(|f| *f > 0);
    if fen.is_none() {
        return Err(EffectError::Permanent(format!(
            "transaction {no}: amount.total {} is not an amount in fen",
            transaction["amount"]["total"]
        )));
    }
    Ok(Payment {
        status,
        queried_at_ms: None,
        paid_at_ms: transaction["success_time"]
            .as_str()
            .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.timestamp_millis()),
        paid_cents: fen,
    })
}

impl PaymentGateway for WechatpayGateway {
    fn query<'a>(&'a self, payment_ref: &'a str) -> GatewayFuture<'a, Payment> {
        Box::pin(async move {
            let answer = self.transaction(payment_ref).await?;
            if answer.is_not_found() {
                return Ok(Payment {
                    status: PaymentStatus::NotFound,
                    ..Payment::default()
                });
            }
            payment_of(&answer.body)
        })
    }

    fn close<'a>(&'a self, payment_ref: &'a str, _key: &'a str) -> GatewayFuture<'a, CloseOutcome> {
        Box::pin(async move {
            let url = format!(
                "/v3/pay/transactions/out-trade-no/{}/close",
                segment(payment_ref)?
            );
            let what = format!("close {payment_ref}");
            let answer = self
                .call(Method::POST, &url, Some(&json!({ "mchid": self.mchid })))
                .await?;
            if answer.status.is_success() {
                answer.believed(&what)?;
                return Ok(CloseOutcome::Closed);
            }
            if answer.is_not_found() {
                answer.believed(&what)?;
                return Ok(CloseOutcome::NothingToClose);
            }
            if matches!(answer.status.as_u16(), 401 | 403) {
                return Err(answer.refused(&what));
            }
            // Refused (paid, closed already, …): the transaction's state says which.
            match self.query(payment_ref).await?.status {
                PaymentStatus::Paid => Ok(CloseOutcome::AlreadyPaid),
                PaymentStatus::Closed | PaymentStatus::NotFound => Ok(CloseOutcome::NothingToClose),
                PaymentStatus::Unpaid | PaymentStatus::Unknown => {
                    Err(EffectError::Transient(format!(
                        "{what}: WeChat Pay refused the close ({}) of a transaction it reports unpaid; asked again later",
                        answer.described()
                    )))
                }
            }
        })
    }

    fn refund<'a>(&'a self, payment_ref: &'a str, key: &'a str) -> GatewayFuture<'a, ()> {
        Box::pin(async move {
            let what = format!("refund {payment_ref}");
            // The amount WeChat Pay took, as it states it: refunded in full.
            let transaction = self.transaction(payment_ref).await?;
            let total = transaction.body["amount"]["total"]
                .as_i64()
                .filter(|t| *t > 0)
                .ok_or_else(|| {
                    EffectError::Permanent(format!(
                        "{what}: the transaction has no amount.total to refund ({})",
                        transaction.body["trade_state"]
                    ))
                })?;
            let currency = transaction.body["amount"]["currency"]
                .as_str()
                .unwrap_or("CNY");
            let body = json!({
                "out_trade_no": payment_ref,
                "out_refund_no": out_refund_no(key),
                "amount": { "refund": total, "total": total, "currency": currency },
            });
            let answer = self
                .call(Method::POST, "/v3/refund/domestic/refunds", Some(&body))
                .await?;
            if !answer.status.is_success() {
                return Err(answer.refused(&what));
            }
            let answer = answer.believed(&what)?;
            match answer.body["status"].as_str() {
                Some("SUCCESS" | "PROCESSING") => Ok(()),
                other => Err(EffectError::Permanent(format!(
                    "{what}: refund {} is {other:?}: settle it on the merchant platform",
                    answer.body["out_refund_no"]
                ))),
            }
        })
    }
}

/// A verified notification: its event type and its decrypted resource.
#[derive(Debug, Clone)]
pub struct Notice {
    /// `event_type`, e.g. `TRANSACTION.SUCCESS`.
    pub event_type: String,
    /// The decrypted `resource` (for a payment: the transaction, as a query answers it).
    pub resource: Value,
}

impl Notice {
    /// What the transaction of a `TRANSACTION.SUCCESS` notice says: `(mchid, appid,
    /// out_trade_no, amount.total in fen)`; `Ok(None)` for another event or trade state.
    ///
    /// # Errors
    /// [`Refusal::Malformed`] for a paid transaction without those fields.
    pub fn paid(&self) -> Result<Option<PaidTransaction>, Refusal> {
        let t = &self.resource;
        if self.event_type != "TRANSACTION.SUCCESS" || t["trade_state"] != "SUCCESS" {
            return Ok(None);
        }
        let text = |k: &str| t[k].as_str().map(str::to_string).ok_or(Refusal::Malformed);
        Ok(Some(PaidTransaction {
            mchid: text("mchid")?,
            appid: t["appid"].as_str().map(str::to_string),
            out_trade_no: text("out_trade_no")?,
            fen: Some(
                payment_of(t)
                    .map_err(|_| Refusal::Malformed)?
                    .paid_cents
                    .ok_or(Refusal::Malformed)?,
            ),
        }))
    }
}

/// A paid transaction a notification speaks of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaidTransaction {
    /// `mchid`: the merchant paid.
    pub mchid: String,
    /// `appid`: the app paid in.
    pub appid: Option<String>,
    /// `out_trade_no` (the order's `payment_ref`).
    pub out_trade_no: String,
    /// `amount.total`, fen.
    pub fen: Option<i64>,
}

/// A notification (`headers`, raw `body`), once its signature verifies with `platform`, its
/// `Wechatpay-Timestamp` is within `tolerance_s` of `now_s`, and its resource decrypts with
/// `apiv3_key`.
///
/// # Errors
/// [`Refusal::Unsigned`], [`Refusal::Signature`], [`Refusal::Stale`], [`Refusal::Malformed`]
/// (not an `encrypt-resource` notification of AEAD_AES_256_GCM), [`Refusal::Undecryptable`].
pub fn verify_notice(
    headers: &SignedHeaders<'_>,
    body: &[u8],
    platform: &Platform,
    apiv3_key: &Secret,
    now_s: i64,
    tolerance_s: i64,
) -> Result<Notice, Refusal> {
    let at = platform.verify(headers, body)?;
    if (now_s - at).abs() > tolerance_s {
        return Err(Refusal::Stale);
    }
    let notice: Value = serde_json::from_slice(body).map_err(|_| Refusal::Malformed)?;
    let resource = &notice["resource"];
    if resource["algorithm"] != "AEAD_AES_256_GCM" {
        return Err(Refusal::Malformed);
    }
    let text = |k: &str| resource[k].as_str().ok_or(Refusal::Malformed);
    let plain = decrypt(
        apiv3_key,
        text("nonce")?,
        resource["associated_data"].as_str().unwrap_or_default(),
        text("ciphertext")?,
    )?;
    Ok(Notice {
        event_type: notice["event_type"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        resource: serde_json::from_slice(&plain).map_err(|_| Refusal::Malformed)?,
    })
}

/// AEAD_AES_256_GCM decryption as WeChat Pay encrypts: the APIv3 key's 32 bytes as the key,
/// the `nonce` text's bytes (12) as the nonce, `associated_data` as the AAD, `ciphertext`
/// base64 with the 16-byte tag at its end.
///
/// # Errors
/// [`Refusal::Malformed`] for a nonce or ciphertext of the wrong shape,
/// [`Refusal::Undecryptable`] when the key or the tag does not match.
pub fn decrypt(
    apiv3_key: &Secret,
    nonce: &str,
    associated_data: &str,
    ciphertext: &str,
) -> Result<Vec<u8>, Refusal> {
    let key = aead::UnboundKey::new(&aead::AES_256_GCM, apiv3_key.expose().as_bytes())
        .map_err(|_| Refusal::Undecryptable)?;
    let nonce =
        aead::Nonce::try_assume_unique_for_key(nonce.as_bytes()).map_err(|_| Refusal::Malformed)?;
    let mut data = base64::engine::general_purpose::STANDARD
        .decode(ciphertext)
        .map_err(|_| Refusal::Malformed)?;
    let plain = aead::LessSafeKey::new(key)
        .open_in_place(
            nonce,
            aead::Aad::from(associated_data.as_bytes()),
            &mut data,
        )
        .map_err(|_| Refusal::Undecryptable)?;
    Ok(plain.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signed_texts_are_as_wechat_pay_documents() {
        assert_eq!(
            request_message(
                "GET",
                "/v3/pay/transactions/out-trade-no/1217752501201407033233368018?mchid=1230000109",
                1554208460,
                "593BEC0C930BF1AFEB40B4A08C8FB242",
                ""
            ),
            "GET\n/v3/pay/transactions/out-trade-no/1217752501201407033233368018?mchid=1230000109\n1554208460\n593BEC0C930BF1AFEB40B4A08C8FB242\n\n"
        );
        assert_eq!(
            answer_message("1554209980", "c5ac7061fccab6bf3e254dcf98995b8c", b"{}"),
            b"1554209980\nc5ac7061fccab6bf3e254dcf98995b8c\n{}\n"
        );
    }

    #[test]
    fn refund_numbers_are_the_key_where_wechat_allows_it_else_its_hash() {
        assert_eq!(out_refund_no("acme/late/refund"), "acme|late|refund");
        let hashed = out_refund_no("acme/a|b/refund");
        assert_eq!(hashed.len(), 64);
        assert_ne!(hashed, out_refund_no("acme/a/b/refund"));
        assert_eq!(out_refund_no(&"x".repeat(65)).len(), 64);
        assert_eq!(out_refund_no("商户/1/refund").len(), 64);
    }

    #[test]
    fn trade_states_map_onto_timeoutd_outcomes() {
        let state = |s: &str| {
            payment_of(
                &json!({ "out_trade_no": "T1", "trade_state": s, "amount": { "total": 3490 },
                "success_time": "2026-11-29T18:00:00+08:00" }),
            )
        };
        let paid = state("SUCCESS").unwrap();
        assert_eq!(
            (paid.status, paid.paid_cents, paid.paid_at_ms),
            (PaymentStatus::Paid, Some(3490), Some(1_795_946_400_000))
        );
        assert_eq!(state("REFUND").unwrap().status, PaymentStatus::Paid);
        for (s, want) in [
            ("NOTPAY", PaymentStatus::Unpaid),
            ("PAYERROR", PaymentStatus::Unpaid),
            ("CLOSED", PaymentStatus::Closed),
            ("REVOKED", PaymentStatus::Closed),
        ] {
            assert_eq!(state(s).unwrap().status, want, "{s}");
        }
        assert!(matches!(
            state("USERPAYING"),
            Err(EffectError::Transient(_))
        ));
        assert!(matches!(state("NEW"), Err(EffectError::Permanent(_))));
    }

    #[test]
    fn a_resource_decrypts_only_with_its_key_nonce_and_associated_data() {
        let key = Secret::for_tests("0123456789abcdef0123456789abcdef");
        let sealing = aead::LessSafeKey::new(
            aead::UnboundKey::new(&aead::AES_256_GCM, key.expose().as_bytes()).unwrap(),
        );
        let mut data = br#"{"trade_state":"SUCCESS"}"#.to_vec();
        sealing
            .seal_in_place_append_tag(
                aead::Nonce::try_assume_unique_for_key(b"abcdefghijkl").unwrap(),
                aead::Aad::from(b"transaction"),
                &mut data,
            )
            .unwrap();
        let ciphertext = base64::engine::general_purpose::STANDARD.encode(&data);
        assert_eq!(
            decrypt(&key, "abcdefghijkl", "transaction", &ciphertext).unwrap(),
            br#"{"trade_state":"SUCCESS"}"#
        );
        assert_eq!(
            decrypt(&key, "abcdefghijkl", "certificate", &ciphertext),
            Err(Refusal::Undecryptable)
        );
        let other = Secret::for_tests("fedcba9876543210fedcba9876543210");
        assert_eq!(
            decrypt(&other, "abcdefghijkl", "transaction", &ciphertext),
            Err(Refusal::Undecryptable)
        );
        assert_eq!(
            decrypt(&key, "short", "transaction", &ciphertext),
            Err(Refusal::Malformed)
        );
    }
}
