//! Threshold alerts: each rule watches one signal of the backlog sample; it fires once when the
//! signal has been above its threshold for the rule's `for`, and resolves once when it drops —
//! a notice is sent on each change, never repeated while the state holds. A notice that cannot
//! be delivered is tried again at the next evaluation (the state only changes once delivered).
//!
//! The rules run in a task of their own ([`Alerts::spawn`]), fed the latest sample: a receiver
//! that hangs holds up its own notices (each bounded by `alerts.timeout`, then retried at the
//! next evaluation) and never the sampling loop, the gauges, `/v1/backlog` or shutdown. A
//! sample taken while a notice is in flight replaces any not yet evaluated: the rules always
//! judge the newest one.

use std::collections::HashMap;

use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::config::{AlertRule, AlertSignal, AlertsConfig};
use crate::gauges::{Sample, Watcher};

#[derive(Debug, Default, Clone)]
struct RuleState {
    /// Since when the condition holds, epoch ms.
    since_ms: Option<i64>,
    firing: bool,
}

/// The rules and their state.
pub struct Alerts {
    config: AlertsConfig,
    state: HashMap<String, RuleState>,
    client: reqwest::Client,
}

impl Alerts {
    /// Alerts as configured; notices time out after `alerts.timeout` and never follow a
    /// redirect ([`crate::outbound`]).
    ///
    /// # Errors
    /// When the HTTP client cannot be built.
    pub fn new(config: AlertsConfig) -> Result<Self, String> {
        let client = crate::outbound::client("alerts", config.timeout)?;
        Ok(Alerts {
            config,
            state: HashMap::new(),
            client,
        })
    }

    /// Runs the rules in a task of `tasks` until `shutdown` (a notice in flight is abandoned
    /// then), evaluating each sample the returned feed is given; the task's id comes with it.
    pub fn spawn(
        self,
        tasks: &mut JoinSet<()>,
        shutdown: watch::Receiver<bool>,
    ) -> (AlertFeed, tokio::task::Id) {
        let (feed, samples) = watch::channel(None);
        let task = tasks.spawn(self.run(samples, shutdown));
        (AlertFeed(feed), task.id())
    }

    async fn run(
        mut self,
        mut samples: watch::Receiver<Option<Sample>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            tokio::select! {
                _ = crate::shutdown::stopping(&mut shutdown) => return,
                changed = samples.changed() => if changed.is_err() { return },
            }
            let Some(sample) = samples.borrow_and_update().clone() else {
                continue;
            };
            tokio::select! {
                _ = crate::shutdown::stopping(&mut shutdown) => {
                    tracing::info!("shutdown: an alert notice in flight was abandoned");
                    return;
                }
                () = self.evaluate(&sample, sample.sampled_at_ms) => {}
            }
        }
    }

    /// Evaluates every rule against `sample` at `now_ms`, sending firing/resolved notices.
    pub async fn evaluate(&mut self, sample: &Sample, now_ms: i64) {
        for rule in self.config.rules.clone() {
            let value = signal(sample, rule.signal);
            let holds = value > rule.above;
            let state = self.state.entry(rule.name.clone()).or_default().clone();
            let since = if holds {
                Some(state.since_ms.unwrap_or(now_ms))
            } else {
                None
            };
            let held_ms = since.map_or(0, |s| now_ms - s);
            let due_ms = rule.for_.map_or(0, |d| d.as_millis() as i64);
            let want_firing = holds && held_ms >= due_ms;
            let mut firing = state.firing;
            if want_firing != state.firing && (want_firing || !holds) {
                let status = if want_firing { "firing" } else { "resolved" };
                if self.send(&rule, status, value).await {
                    firing = want_firing;
                }
            }
            self.state.insert(
                rule.name.clone(),
                RuleState {
                    since_ms: since,
                    firing,
                },
            );
        }
    }

    async fn send(&self, rule: &AlertRule, status: &str, value: f64) -> bool {
        let text = format!(
            "[{}] timeoutd {}: {:?} = {value} (threshold {})",
            status.to_uppercase(),
            rule.name,
            rule.signal,
            rule.above
        );
        let body = json!({
            "status": status, "rule": rule.name, "signal": format!("{:?}", rule.signal),
            "value": value, "threshold": rule.above, "text": text,
        });
        let mut request = self.client.post(&self.config.webhook).json(&body);
        if let Some(auth) = &self.config.authorization {
            request = request.header("Authorization", auth);
        }
        match request.send().await {
            Ok(r) => match crate::outbound::judge(&self.config.webhook, r.status(), r.headers()) {
                crate::outbound::Verdict::Delivered => {
                    tracing::warn!(rule = %rule.name, status, value, "alert");
                    true
                }
                crate::outbound::Verdict::Retry { reason, .. }
                | crate::outbound::Verdict::Refused(reason) => {
                    tracing::error!(rule = %rule.name, %reason, "alert webhook did not take the notice; tried again at the next evaluation");
                    false
                }
            },
            Err(e) => {
                tracing::error!(rule = %rule.name, error = %e, "alert webhook unreachable");
                false
            }
        }
    }
}

/// What the sampling loop holds of the alert rules ([`Alerts::spawn`]): handing it a sample
/// returns at once.
pub struct AlertFeed(watch::Sender<Option<Sample>>);

impl Watcher for AlertFeed {
    async fn watch(&mut self, sample: &Sample) {
        self.0.send_replace(Some(sample.clone()));
    }
}

fn signal(s: &Sample, signal: AlertSignal) -> f64 {
    match signal {
        AlertSignal::OverdueOpenOrders => s.overdue_total() as f64,
        AlertSignal::DeadLettersOpen => s.dead_letters_open as f64,
        AlertSignal::LedgerOldestPendingSeconds => s.ledger_oldest_pending_ms as f64 / 1e3,
        AlertSignal::OutboxOldestDueSeconds => s.outbox_oldest_due_ms as f64 / 1e3,
        AlertSignal::SweepConsecutiveFailures => s.sweep_consecutive_failures as f64,
        AlertSignal::PluginsTripped => s.plugins_tripped.len() as f64,
    }
}
