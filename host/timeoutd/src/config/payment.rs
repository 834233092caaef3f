//! `[payment]`'s providers: which adapter speaks to the provider (`provider`, per merchant
//! `payment_provider`), each provider's own table (`[payment.stripe]`, `[payment.alipay]`,
//! `[payment.wechatpay]`), and the credentials they read from files or the environment — never
//! from the config text.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use super::{Config, ConfigProblems, duration};

/// `payment.provider`, `merchants.<id>.payment_provider`: the adapter that speaks to the
/// provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// timeoutd's own REST shape (`GET {base_url}/v1/payments/{ref}`, `…/close`, `…/refund`),
    /// for a shop's translating service.
    #[default]
    Rest,
    /// Stripe PaymentIntents (`[payment.stripe]`).
    Stripe,
    /// Alipay's OpenAPI gateway, the `alipay.trade.*` methods (`[payment.alipay]`).
    Alipay,
    /// WeChat Pay API v3 (`[payment.wechatpay]`).
    Wechatpay,
}

impl ProviderKind {
    /// `rest`, `stripe`, `alipay` or `wechatpay`, as written in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Rest => "rest",
            ProviderKind::Stripe => "stripe",
            ProviderKind::Alipay => "alipay",
            ProviderKind::Wechatpay => "wechatpay",
        }
    }
}

/// `[payment.stripe]`: Stripe's API and its webhooks.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StripeConfig {
    /// The API's base URL (default `https://api.stripe.com`; a test points it at a fake).
    #[serde(default = "stripe_base_url")]
    pub base_url: String,
    /// The secret API key (`sk_…`, or a restricted `rk_…` key allowed to read and cancel
    /// PaymentIntents and create refunds): `{ secret_env = "STRIPE_SECRET_KEY" }` or
    /// `{ secret_file = "/etc/timeoutd/stripe.key" }`.
    pub api_key: SecretRef,
    /// The webhook endpoint's signing secret (`whsec_…`), as `api_key`. With it (and `[http]`),
    /// `POST /v1/providers/stripe/webhook` takes `payment_intent.succeeded` events; without it
    /// that route is not served.
    #[serde(default)]
    pub webhook_secret: Option<SecretRef>,
    /// How far an event's signed timestamp may be from the database clock (default 5m, as
    /// Stripe's own libraries): an older one is a replay and refused.
    #[serde(default = "five_minutes", with = "duration")]
    pub webhook_tolerance: Duration,
    /// `cancellation_reason` sent with a cancel (default `abandoned`); `""` sends none (the
    /// fake server `localstripe` refuses the parameter).
    #[serde(default = "abandoned")]
    pub cancellation_reason: String,
}

/// `[payment.alipay]`: Alipay's OpenAPI gateway (`alipay.trade.query`, `.close`, `.refund`)
/// and its asynchronous notifications.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlipayConfig {
    /// The gateway (default `https://openapi.alipay.com/gateway.do`; the sandbox is
    /// `https://openapi-sandbox.dl.alipaydev.com/gateway.do`; a test points it at a stub).
    #[serde(default = "alipay_gateway")]
    pub gateway: String,
    /// The app's id (`app_id`) on the Alipay open platform: sent with every request, and a
    /// notification for another app is refused.
    pub app_id: String,
    /// The app's RSA private key (RSA2: 2048 bits or more), PEM or the bare base64 Alipay's key
    /// tool writes, PKCS#8 or PKCS#1: `{ secret_file = "/etc/timeoutd/alipay-app.key" }` or
    /// `{ secret_env = "ALIPAY_APP_PRIVATE_KEY" }`. Signs every request.
    pub app_private_key: SecretRef,
    /// Alipay's public key (支付宝公钥, shown beside the app's key on the open platform), PEM
    /// or bare base64, as `app_private_key`: every answer and notification is verified with
    /// it before it is believed.
    pub alipay_public_key: SecretRef,
    /// The seller's Alipay user id (`2088…`); when given, a notification naming another
    /// seller is refused.
    #[serde(default)]
    pub seller_id: Option<String>,
}

/// `[payment.wechatpay]`: WeChat Pay API v3 (直连商户): query by `out_trade_no`, close, domestic
/// refunds, and the payment notifications (支付通知).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WechatpayConfig {
    /// The API's base URL (default `https://api.mch.weixin.qq.com`; a test points it at a
    /// stub).
    #[serde(default = "wechatpay_base_url")]
    pub base_url: String,
    /// The merchant's id (`mchid`, 商户号): sent with every request and in every
    /// `Authorization`; a notification for another merchant is refused.
    pub mchid: String,
    /// The app the payments are made in (`appid`); when given, a notification for another app
    /// is refused.
    #[serde(default)]
    pub appid: Option<String>,
    /// The serial number of the merchant's API certificate (商户API证书序列号, `serial_no` in
    /// the `Authorization` header): `openssl x509 -in apiclient_cert.pem -noout -serial`.
    pub merchant_serial_no: String,
    /// The merchant's API private key (`apiclient_key.pem`, RSA 2048, PKCS#8 or PKCS#1):
    /// `{ secret_file = "/etc/timeoutd/apiclient_key.pem" }` or `{ secret_env = "…" }`. Signs
    /// every request.
    pub merchant_private_key: SecretRef,
    /// WeChat Pay's public key (微信支付公钥, `pub_key.pem`) or a platform certificate (平台证书,
    /// PEM), as `merchant_private_key`: every answer and notification is verified with it
    /// before it is believed.
    pub platform_public_key: SecretRef,
    /// The id of that key (`PUB_KEY_ID_…`) or the certificate's serial: when given, an answer
    /// or notification whose `Wechatpay-Serial` names another key is not believed (the
    /// platform rotated its key: give the new one).
    #[serde(default)]
    pub platform_public_key_id: Option<String>,
    /// The APIv3 key (APIv3密钥, 32 characters, set on the merchant platform), as
    /// `merchant_private_key`: notifications' resources are decrypted with it
    /// (AEAD_AES_256_GCM).
    pub apiv3_key: SecretRef,
    /// How far a notification's `Wechatpay-Timestamp` may be from the database clock (default
    /// 5m): an older one is a replay and refused.
    #[serde(default = "five_minutes", with = "duration")]
    pub notify_tolerance: Duration,
}

fn wechatpay_base_url() -> String {
    "https://api.mch.weixin.qq.com".into()
}

fn alipay_gateway() -> String {
    "https://openapi.alipay.com/gateway.do".into()
}

fn stripe_base_url() -> String {
    "https://api.stripe.com".into()
}
fn five_minutes() -> Duration {
    Duration::from_secs(300)
}
fn abandoned() -> String {
    "abandoned".into()
}

/// Where a secret is read from: a file (relative to the config file's folder; surrounding
/// whitespace trimmed) or an environment variable. A secret written into the config itself is
/// refused, and the refusal does not repeat it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretRef {
    /// `{ secret_file = "PATH" }`.
    File(PathBuf),
    /// `{ secret_env = "NAME" }`.
    Env(String),
}

impl<'de> Deserialize<'de> for SecretRef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        const HOW: &str = "give { secret_file = \"PATH\" } or { secret_env = \"NAME\" }";
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = SecretRef;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(
                    f,
                    "{{ secret_file = \"PATH\" }} or {{ secret_env = \"NAME\" }}"
                )
            }
            // The value is never echoed: it may be the secret itself.
            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<SecretRef, E> {
                Err(E::custom(format!(
                    "a secret is never written in the config (it would be in every copy and \
                     backup of the file); {HOW}"
                )))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<SecretRef, A::Error> {
                let mut found = None;
                while let Some(key) = map.next_key::<String>()? {
                    let value: String = map.next_value()?;
                    let this = match key.as_str() {
                        "secret_file" => SecretRef::File(PathBuf::from(value)),
                        "secret_env" => SecretRef::Env(value),
                        other => {
                            return Err(serde::de::Error::custom(format!(
                                "unknown key `{other}`; {HOW}"
                            )));
                        }
                    };
                    if found.replace(this).is_some() {
                        return Err(serde::de::Error::custom(format!("give one source; {HOW}")));
                    }
                }
                found.ok_or_else(|| serde::de::Error::custom(HOW))
            }
        }
        d.deserialize_any(Visit)
    }
}

/// A secret's value. Its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// A secret given in code (unit tests).
    #[cfg(test)]
    pub fn for_tests(value: &str) -> Self {
        Secret(value.to_string())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl SecretRef {
    /// Reads the secret (`base_dir`: the config file's folder, for a relative file).
    ///
    /// # Errors
    /// What is wrong — unreadable file, unset or empty variable — never the value.
    pub fn resolve(&self, base_dir: &Path) -> Result<Secret, String> {
        let value = match self {
            SecretRef::File(path) => {
                let path = base_dir.join(path);
                std::fs::read_to_string(&path)
                    .map_err(|e| format!("cannot read secret_file {}: {e}", path.display()))?
            }
            SecretRef::Env(name) => std::env::var(name)
                .map_err(|_| format!("secret_env `{name}` is not set in timeoutd's environment"))?,
        };
        let value = value.trim();
        if value.is_empty() {
            return Err(match self {
                SecretRef::File(p) => format!("secret_file {} is empty", p.display()),
                SecretRef::Env(n) => format!("secret_env `{n}` is empty"),
            });
        }
        Ok(Secret(value.to_string()))
    }
}

impl Config {
    /// The adapter that speaks for `merchant`'s payments: its `payment_provider`, else
    /// `payment.provider`.
    pub fn payment_provider_of(&self, merchant: &str) -> ProviderKind {
        self.merchants
            .get(merchant)
            .and_then(|m| m.payment_provider)
            .or(self.payment.as_ref().map(|p| p.provider))
            .unwrap_or_default()
    }

    /// Every provider some merchant (or the default) uses.
    pub fn payment_providers(&self) -> Vec<ProviderKind> {
        let mut kinds: Vec<ProviderKind> = self
            .payment
            .iter()
            .map(|p| p.provider)
            .chain(self.merchants.values().filter_map(|m| m.payment_provider))
            .collect();
        kinds.sort_by_key(|k| k.as_str());
        kinds.dedup();
        kinds
    }
}

fn http_url(url: &str, at: &str, p: &mut ConfigProblems) {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        p.push(at, format!("`{url}` is not an http(s) URL"));
    }
}

/// `[payment]`'s providers: each one used is configured, and its credentials can be read.
pub(super) fn validate(c: &Config, p: &mut ConfigProblems) {
    let Some(pay) = &c.payment else {
        for (id, m) in &c.merchants {
            if m.payment_provider.is_some() {
                p.push(
                    format!("merchants.{id}.payment_provider"),
                    "needs a [payment] section",
                );
            }
        }
        return;
    };
    let used = c.payment_providers();
    if used.contains(&ProviderKind::Rest) {
        if pay.base_url.is_empty() {
            p.push(
                "payment.base_url",
                "missing: the `rest` provider (payment.provider, or a merchant's payment_provider) needs it",
            );
        } else {
            http_url(&pay.base_url, "payment.base_url", p);
        }
    }
    match (&pay.stripe, used.contains(&ProviderKind::Stripe)) {
        (None, true) => p.push(
            "payment.stripe",
            "missing: provider `stripe` is used, so give [payment.stripe] with api_key",
        ),
        (Some(s), _) => {
            http_url(&s.base_url, "payment.stripe.base_url", p);
            if let Err(e) = s.api_key.resolve(&c.base_dir) {
                p.push("payment.stripe.api_key", e);
            }
            if let Some(w) = &s.webhook_secret {
                if let Err(e) = w.resolve(&c.base_dir) {
                    p.push("payment.stripe.webhook_secret", e);
                }
                if c.http.is_none() {
                    p.push(
                        "payment.stripe.webhook_secret",
                        "webhooks arrive on the [http] listener, which is not configured",
                    );
                }
            }
            if s.webhook_tolerance < Duration::from_secs(1) {
                p.push("payment.stripe.webhook_tolerance", "must be at least 1s");
            }
            const REASONS: &[&str] = &[
                "",
                "abandoned",
                "duplicate",
                "fraudulent",
                "requested_by_customer",
            ];
            if !REASONS.contains(&s.cancellation_reason.as_str()) {
                p.push(
                    "payment.stripe.cancellation_reason",
                    format!(
                        "`{}` is not one of Stripe's: abandoned, duplicate, fraudulent, requested_by_customer (or \"\")",
                        s.cancellation_reason
                    ),
                );
            }
        }
        (None, false) => {}
    }
    match (&pay.alipay, used.contains(&ProviderKind::Alipay)) {
        (None, true) => p.push(
            "payment.alipay",
            "missing: provider `alipay` is used, so give [payment.alipay] with app_id, \
             app_private_key and alipay_public_key",
        ),
        (Some(a), _) => {
            http_url(&a.gateway, "payment.alipay.gateway", p);
            if a.app_id.trim().is_empty() {
                p.push("payment.alipay.app_id", "empty: give the app's id (app_id)");
            }
            if let Err(e) = a.app_private_key.resolve(&c.base_dir) {
                p.push("payment.alipay.app_private_key", e);
            }
            if let Err(e) = a.alipay_public_key.resolve(&c.base_dir) {
                p.push("payment.alipay.alipay_public_key", e);
            }
            if a.seller_id.as_deref().is_some_and(|s| s.trim().is_empty()) {
                p.push(
                    "payment.alipay.seller_id",
                    "empty: give the seller's id or leave it out",
                );
            }
        }
        (None, false) => {}
    }
    match (&pay.wechatpay, used.contains(&ProviderKind::Wechatpay)) {
        (None, true) => p.push(
            "payment.wechatpay",
            "missing: provider `wechatpay` is used, so give [payment.wechatpay] with mchid, \
             merchant_serial_no, merchant_private_key, platform_public_key and apiv3_key",
        ),
        (Some(w), _) => validate_wechatpay(w, c, p),
        (None, false) => {}
    }
}

fn validate_wechatpay(w: &WechatpayConfig, c: &Config, p: &mut ConfigProblems) {
    http_url(&w.base_url, "payment.wechatpay.base_url", p);
    for (key, value, what) in [
        ("mchid", Some(&w.mchid), "the merchant's id (商户号)"),
        (
            "merchant_serial_no",
            Some(&w.merchant_serial_no),
            "the merchant API certificate's serial number",
        ),
        ("appid", w.appid.as_ref(), "the app's id, or leave it out"),
        (
            "platform_public_key_id",
            w.platform_public_key_id.as_ref(),
            "the key's id (PUB_KEY_ID_…) or leave it out",
        ),
    ] {
        if value.is_some_and(|v| v.trim().is_empty()) {
            p.push(
                format!("payment.wechatpay.{key}"),
                format!("empty: give {what}"),
            );
        }
    }
    for (key, secret) in [
        ("merchant_private_key", &w.merchant_private_key),
        ("platform_public_key", &w.platform_public_key),
    ] {
        if let Err(e) = secret.resolve(&c.base_dir) {
            p.push(format!("payment.wechatpay.{key}"), e);
        }
    }
    match w.apiv3_key.resolve(&c.base_dir) {
        Err(e) => p.push("payment.wechatpay.apiv3_key", e),
        // Its length only: the key itself is never written anywhere.
        Ok(k) if k.expose().len() != 32 => p.push(
            "payment.wechatpay.apiv3_key",
            format!(
                "{} bytes long; an APIv3 key is 32 characters (AES-256)",
                k.expose().len()
            ),
        ),
        Ok(_) => {}
    }
    if w.notify_tolerance < Duration::from_secs(1) {
        p.push("payment.wechatpay.notify_tolerance", "must be at least 1s");
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;

    fn load(extra: &str) -> Result<Config, String> {
        let toml = format!(
            "[database]\nurl = \"sqlite://x.db\"\n[merchants.acme]\nplugin = \"builtin:single-phase\"\n{extra}"
        );
        Config::from_toml(&toml, std::path::Path::new("/nonexistent"), &|_| None)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_secret_written_in_the_config_is_refused_without_repeating_it() {
        let e = load(
            "[payment]\nprovider = \"stripe\"\n[payment.stripe]\napi_key = \"sk_live_TOPSECRET\"\n",
        )
        .unwrap_err();
        assert!(e.contains("payment.stripe.api_key"), "{e}");
        assert!(!e.contains("TOPSECRET"), "{e}");
    }

    #[test]
    fn every_provider_problem_is_listed_with_its_key() {
        let e = load(
            "payment_provider = \"rest\"\n[payment]\nprovider = \"stripe\"\n\
             [payment.stripe]\napi_key = { secret_env = \"TIMEOUTD_TEST_UNSET_KEY\" }\n\
             webhook_secret = { secret_file = \"missing\" }\ncancellation_reason = \"bored\"\n",
        )
        .unwrap_err();
        for key in [
            "payment.base_url",
            "payment.stripe.api_key",
            "payment.stripe.webhook_secret",
            "payment.stripe.cancellation_reason",
        ] {
            assert!(e.contains(key), "{key} in {e}");
        }
        let e = load("payment_provider = \"stripe\"\n").unwrap_err();
        assert!(e.contains("merchants.acme.payment_provider"), "{e}");
    }

    #[test]
    fn alipay_keys_come_from_files_or_env_and_every_problem_is_named_by_its_key() {
        let e = load("[payment]\nprovider = \"alipay\"\n").unwrap_err();
        assert!(e.contains("payment.alipay"), "{e}");
        let e = load(
            "[payment]\nprovider = \"alipay\"\n[payment.alipay]\napp_id = \"2021\"\n\
             app_private_key = \"MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC\"\n\
             alipay_public_key = { secret_file = \"alipay.pub\" }\n",
        )
        .unwrap_err();
        assert!(e.contains("payment.alipay.app_private_key"), "{e}");
        assert!(!e.contains("MIIEvQ"), "the key is never repeated: {e}");
        let e = load(
            "[payment]\nprovider = \"alipay\"\n[payment.alipay]\napp_id = \" \"\n\
             gateway = \"openapi.alipay.com\"\nseller_id = \"\"\n\
             app_private_key = { secret_env = \"TIMEOUTD_TEST_UNSET_ALIPAY_KEY\" }\n\
             alipay_public_key = { secret_file = \"missing\" }\n",
        )
        .unwrap_err();
        for key in [
            "payment.alipay.gateway",
            "payment.alipay.app_id",
            "payment.alipay.seller_id",
            "payment.alipay.app_private_key",
            "payment.alipay.alipay_public_key",
        ] {
            assert!(e.contains(key), "{key} in {e}");
        }
    }

    #[test]
    fn wechatpay_keys_come_from_files_or_env_and_every_problem_is_named_by_its_key() {
        let e = load("[payment]\nprovider = \"wechatpay\"\n").unwrap_err();
        assert!(e.contains("payment.wechatpay"), "{e}");
        let e = load(
            "[payment]\nprovider = \"wechatpay\"\n[payment.wechatpay]\nmchid = \" \"\n\
             merchant_serial_no = \"\"\nbase_url = \"api.mch.weixin.qq.com\"\nappid = \"\"\n\
             merchant_private_key = { secret_file = \"missing.key\" }\n\
             platform_public_key = { secret_file = \"missing.pem\" }\n\
             apiv3_key = { secret_env = \"TIMEOUTD_TEST_UNSET_APIV3_KEY\" }\n\
             notify_tolerance = \"0s\"\n",
        )
        .unwrap_err();
        for key in [
            "payment.wechatpay.base_url",
            "payment.wechatpay.mchid",
            "payment.wechatpay.merchant_serial_no",
            "payment.wechatpay.appid",
            "payment.wechatpay.merchant_private_key",
            "payment.wechatpay.platform_public_key",
            "payment.wechatpay.apiv3_key",
            "payment.wechatpay.notify_tolerance",
        ] {
            assert!(e.contains(key), "{key} in {e}");
        }
        let e = load(
            "[merchants.wx]\nplugin = \"builtin:single-phase\"\npayment_provider = \"wechatpay\"\n\
             [payment]\nbase_url = \"http://pay\"\n",
        )
        .unwrap_err();
        assert!(
            e.contains("payment.wechatpay: missing"),
            "per merchant: {e}"
        );
        let e = load(
            "[payment]\nprovider = \"wechatpay\"\n[payment.wechatpay]\nmchid = \"1900000109\"\n\
             merchant_serial_no = \"5157F09EFDC096DE15EBE81A47057A72\"\n\
             merchant_private_key = { secret_file = \"k\" }\n\
             platform_public_key = { secret_file = \"p\" }\n\
             apiv3_key = \"0123456789abcdefTOPSECRET0123456\"\n",
        )
        .unwrap_err();
        assert!(e.contains("payment.wechatpay.apiv3_key"), "{e}");
        assert!(!e.contains("TOPSECRET"), "the key is never repeated: {e}");
    }
}
