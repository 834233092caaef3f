//! Notice sinks: the log, and webhooks. A channel name in a plugin's notice picks the sink.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use timeoutd_runtime::model::Notice;

use futures_util::future::BoxFuture;

use super::executor::{Done, EffectError, Executor, Job};
use super::work::NotifyWork;
use crate::config::{ChannelConfig, NotifyConfig};
use crate::kinds::Section;

#[derive(Debug, Clone)]
enum Sink {
    Log,
    Webhook {
        url: String,
        authorization: Option<String>,
        timeout: Duration,
    },
    Rocketmq,
}

/// Sends notices. Cheap to clone.
#[derive(Clone)]
pub struct Notifier {
    channels: Arc<HashMap<String, Sink>>,
    client: reqwest::Client,
    rocketmq: Option<Arc<crate::rocketmq::Transport>>,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("channels", &self.channels)
            .field("rocketmq", &self.rocketmq.is_some())
            .finish()
    }
}

impl Notifier {
    /// Only the `log` channel.
    pub fn log_only() -> Self {
        Self::from_config(&NotifyConfig::default()).expect("log channel")
    }

    /// The channels of `[notify.channels]`, plus `log`.
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn from_config(config: &NotifyConfig) -> Result<Self, String> {
        let mut channels: HashMap<String, Sink> = HashMap::from([("log".to_string(), Sink::Log)]);
        for (name, channel) in &config.channels {
            let sink = match channel {
                ChannelConfig::Log => Sink::Log,
                ChannelConfig::Webhook {
                    url,
                    authorization,
                    timeout,
                } => Sink::Webhook {
                    url: url.clone(),
                    authorization: authorization.clone(),
                    timeout: *timeout,
                },
                ChannelConfig::Rocketmq => Sink::Rocketmq,
            };
            channels.insert(name.clone(), sink);
        }
        // Each webhook request carries its channel's own deadline (`timeout`); this one bounds
        // whatever does not set one.
        let client = crate::outbound::client("notify", crate::config::defaults::http_timeout())?;
        Ok(Notifier {
            channels: Arc::new(channels),
            client,
            rocketmq: None,
        })
    }

    /// The broker's state for `/readyz`: `None` without one, else whether its last send worked.
    pub fn broker_ready(&self) -> Option<bool> {
        self.rocketmq.as_ref().map(|t| t.healthy())
    }

    /// Publishes `kind = "rocketmq"` channels' notices through `transport`.
    pub fn with_rocketmq(mut self, transport: Arc<crate::rocketmq::Transport>) -> Self {
        self.rocketmq = Some(transport);
        self
    }

    /// Sends `notice` (a `remind` or a `notify` effect) for `order`; the host adds the order id,
    /// merchant and user. Webhooks get the idempotency key in `Idempotency-Key`, so a notice
    /// re-sent after a crash can be recognised.
    ///
    /// # Errors
    /// Transient for timeouts, connection errors, redirects (never followed: the 3xx names its
    /// `Location`), 408, 429 (honouring `Retry-After`) and 5xx; permanent for an unknown
    /// channel and other 4xx answers ([`crate::outbound`]).
    pub async fn send(
        &self,
        idempotency_key: &str,
        kind: &str,
        order: &str,
        merchant: &str,
        user: &str,
        notice: &Notice,
    ) -> Result<(), EffectError> {
        let sink = self.channels.get(&notice.channel).ok_or_else(|| {
            EffectError::Permanent(format!(
                "no notification channel `{}` is configured",
                notice.channel
            ))
        })?;
        let params: serde_json::Map<String, Value> = notice
            .params
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        match sink {
            Sink::Log => {
                let params = Value::Object(params);
                tracing::info!(
                    target: "timeoutd::notice",
                    idempotency_key, kind, order, merchant, user,
                    channel = %notice.channel, template = %notice.template, %params,
                    "notice"
                );
                Ok(())
            }
            Sink::Webhook {
                url,
                authorization,
                timeout,
            } => {
                let body = json!({
                    "idempotency_key": idempotency_key, "kind": kind, "order": order,
                    "merchant": merchant, "user": user, "channel": notice.channel,
                    "template": notice.template, "params": params,
                });
                let mut request = self
                    .client
                    .post(url)
                    .timeout(*timeout)
                    .header("Idempotency-Key", idempotency_key)
                    .json(&body);
                if let Some(auth) = authorization {
                    request = request.header("Authorization", auth);
                }
                let response = request
                    .send()
                    .await
                    .map_err(|e| EffectError::Transient(format!("webhook {url}: {e}")))?;
                EffectError::of_answer(url, response.status(), response.headers())
            }
            Sink::Rocketmq => {
                let transport = self.rocketmq.as_ref().ok_or_else(|| {
                    EffectError::Transient("the rocketmq transport is not running".into())
                })?;
                let body = json!({
                    "idempotency_key": idempotency_key, "kind": kind, "order": order,
                    "merchant": merchant, "user": user, "channel": notice.channel,
                    "template": notice.template, "params": params,
                });
                transport
                    .publish_notice(idempotency_key, &notice.template, body.to_string())
                    .await
                    .map(drop)
                    .map_err(|e| EffectError::Transient(e.to_string()))
            }
        }
    }
}

/// Notices: `notify` effects, and `remind` rows — a reminder is not sent once its order has
/// left PENDING (paid or closed since the wait), and the row is noted so.
impl Executor for Notifier {
    fn section(&self) -> Section {
        Section::Notify
    }

    fn execute<'a>(&'a self, job: Job<'a>) -> BoxFuture<'a, Result<Done, EffectError>> {
        Box::pin(async move {
            let notice: Notice = match job.notify_work()? {
                NotifyWork::Remind(notice) => {
                    if let Some(status) = job.order_status
                        && status != "PENDING"
                    {
                        return Ok(Done::noted(format!("not sent: order is {status}")));
                    }
                    notice
                }
                NotifyWork::Notify(notice) => notice,
            };
            let row = job.row;
            self.send(
                &row.key,
                job.kind.as_str(),
                &row.order_id,
                &row.merchant_id,
                job.user,
                &notice,
            )
            .await
            .map(|()| Done::plain())
        })
    }
}
