//! The doctor's payment-provider checks, for each provider table configured (`[payment.stripe]`,
//! `[payment.alipay]`, `[payment.wechatpay]`): its keys are read and parse (the adapter is built
//! as the daemon builds it), and the provider, asked about a reference that cannot exist, answers
//! "not found" — a signed, verified answer to a signed request — so a wrong key, a wrong
//! platform key or a wrong gateway is found before a sale, not at the first close. No secret is
//! ever written into a finding: the adapters' errors name keys, never their content.

use timeoutd_runtime::model::PaymentStatus;

use super::{Finding, Level, bad, ok};
use crate::config::{Config, ProviderKind};

/// The findings of every provider table in `config`'s `[payment]`.
pub(super) async fn check(config: &Config) -> Vec<Finding> {
    let Some(payment) = &config.payment else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (kind, configured) in [
        (ProviderKind::Stripe, payment.stripe.is_some()),
        (ProviderKind::Alipay, payment.alipay.is_some()),
        (ProviderKind::Wechatpay, payment.wechatpay.is_some()),
    ] {
        if configured {
            out.extend(one(config, kind).await);
        }
    }
    out
}

/// A reference `kind` cannot have issued: the provider's own shape, with a random part.
fn impossible_ref(kind: ProviderKind) -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the system's random source");
    let random = hex::encode(bytes);
    match kind {
        ProviderKind::Stripe => format!("pi_timeoutddoctor{random}"),
        _ => format!("doctor{random}"),
    }
}

/// What to check when the provider did not answer "not found".
fn fix_for(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::Stripe => {
            "check payment.stripe.api_key (a secret or restricted key of this account, allowed to read PaymentIntents) and payment.stripe.base_url"
        }
        ProviderKind::Alipay => {
            "check payment.alipay.app_id, app_private_key (the app's key whose public half is uploaded to the open platform), alipay_public_key (Alipay's, not the app's) and gateway"
        }
        ProviderKind::Wechatpay => {
            "check payment.wechatpay.mchid, merchant_serial_no and merchant_private_key (the API certificate's), platform_public_key and platform_public_key_id (WeChat Pay's), and base_url"
        }
        ProviderKind::Rest => "check [payment]",
    }
}

async fn one(config: &Config, kind: ProviderKind) -> Vec<Finding> {
    let what = format!("payment.{}", kind.as_str());
    let payment = config.payment.as_ref().expect("checked by the caller");
    let gateway = match crate::effects::gateway_of(kind, payment, &config.base_dir) {
        Ok(gateway) => gateway,
        Err(e) => {
            return vec![bad(
                Level::Error,
                &what,
                format!("keys: {e}"),
                "give the key named, readable by timeoutd, in the form its provider issues (timeoutd validate lists every such problem)",
            )];
        }
    };
    let mut out = vec![ok(&what, "keys read and parsed")];
    if kind == ProviderKind::Wechatpay {
        out.extend(apiv3_key(config));
    }
    let reference = impossible_ref(kind);
    out.push(match gateway.query(&reference).await {
        Ok(p) if p.status == PaymentStatus::NotFound => ok(
            &what,
            format!("asked for `{reference}`, which cannot exist: \"not found\", a verified answer (keys and endpoint right)"),
        ),
        Ok(p) => bad(
            Level::Warn,
            &what,
            format!("asked for `{reference}`, which cannot exist: answered {:?}, not \"not found\"", p.status),
            "check the endpoint is the provider's (a test double or proxy answering everything would say this)",
        ),
        Err(e) => bad(
            Level::Error,
            &what,
            format!("asked for `{reference}`, which cannot exist: {e}"),
            fix_for(kind),
        ),
    });
    out
}

/// WeChat Pay's APIv3 key: 32 characters (only a notification proves it is the merchant
/// platform's; its length is all that can be checked here).
fn apiv3_key(config: &Config) -> Option<Finding> {
    let w = config.payment.as_ref()?.wechatpay.as_ref()?;
    let what = "payment.wechatpay.apiv3_key";
    Some(match w.apiv3_key.resolve(&config.base_dir) {
        Ok(k) if k.expose().len() == 32 => ok(what, "32 characters, as an APIv3 key is"),
        Ok(k) => bad(
            Level::Error,
            what,
            format!("{} bytes long, not 32", k.expose().len()),
            "give the APIv3 key set on the merchant platform (账户中心 › API安全)",
        ),
        Err(e) => bad(
            Level::Error,
            what,
            e,
            "give the APIv3 key set on the merchant platform (账户中心 › API安全)",
        ),
    })
}
