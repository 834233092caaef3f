//! Typed internal events: one [`emit`] writes the log line and updates the metrics together,
//! so the two never disagree (the Vector model). Call sites do not log these events themselves. Metric names are `timeoutd_*`, with units in
//! the name; they are exported in Prometheus text format by [`metrics_handle`].

use std::sync::OnceLock;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Something that happened, worth a log line and a metric.
#[derive(Debug, Clone)]
pub enum Event<'a> {
    /// A trigger reached the dispatcher (`source`: outbox, sweep, manual, …).
    TriggerReceived {
        /// Trigger kind.
        source: &'a str,
    },
    /// A plugin answered (or failed to).
    Decided {
        /// Merchant.
        merchant: &'a str,
        /// `wait`, `cancel`, `ignore` or `error`.
        decision: &'a str,
        /// Time in the plugin, µs.
        latency_us: i64,
    },
    /// A plugin call trapped.
    PluginTrap {
        /// Plugin name.
        plugin: &'a str,
        /// `deadline`, `memory` or `fault`.
        kind: &'a str,
    },
    /// A merchant's shadow plugin was asked beside the live one and the answers compared
    /// ([`crate::shadow`]; `timeoutd_shadow_decisions_total{merchant, outcome}` and, per part
    /// that differs, `timeoutd_shadow_differences_total{merchant, difference}`).
    ShadowCompared {
        /// Merchant.
        merchant: &'a str,
        /// `agree`, `differ`, `refused`, `timeout`, `trap` or `error`.
        outcome: &'a str,
        /// The parts that differ, comma-separated (empty when none).
        differences: &'a str,
    },
    /// A trigger was not shadowed (`timeoutd_shadow_skipped_total{merchant, why}`): `busy`,
    /// the shadow worker's queue full; `stopped`, the worker gone.
    ShadowSkipped {
        /// Merchant.
        merchant: &'a str,
        /// Why.
        why: &'static str,
    },
    /// A changed plugin file was looked at by a reload (the file watcher's or
    /// `POST /v1/plugins/reload`; `timeoutd_plugin_reloads_total{merchant, outcome}`): `taken`
    /// (the new version serves) or `refused` (the old one keeps serving; worth an alert).
    PluginReloaded {
        /// Merchant.
        merchant: &'a str,
        /// `taken` or `refused`.
        outcome: &'static str,
    },
    /// A trigger of a paused order was held, its plugin not asked
    /// (`timeoutd_triggers_paused_total{merchant, scope}`; `scope` is `merchant` or `order`).
    TriggerPaused {
        /// Merchant.
        merchant: &'a str,
        /// Which pause held it: `merchant` or `order`.
        scope: &'static str,
    },
    /// A merchant's plugin was tripped by its circuit breaker.
    PluginTripped {
        /// Merchant.
        merchant: &'a str,
        /// Plugin name.
        plugin: &'a str,
    },
    /// An order was closed (`timeoutd_close_lateness_seconds{source}`: close time − the
    /// order's own deadline, both by the database clock, however late its trigger was written;
    /// `timeoutd_trigger_lateness_seconds{source}`: close time − the closing trigger's due
    /// time, i.e. how late the trigger itself was handled).
    Closed {
        /// Trigger kind that closed it.
        source: &'a str,
        /// Close time − the order's deadline, ms.
        lateness_ms: i64,
        /// Close time − the closing trigger's due time (or the deadline, if later), ms.
        trigger_lateness_ms: i64,
        /// Effects recorded.
        effects: usize,
    },
    /// A trigger was dead-lettered.
    DeadLettered {
        /// Where it came from.
        source: &'a str,
        /// Why.
        reason: &'a str,
    },
    /// An external effect was deferred because a cap of its merchant was spent
    /// (`timeoutd_effects_capped_total{merchant, cap}`; `effects::caps`).
    EffectCapped {
        /// Merchant.
        merchant: &'a str,
        /// The cap that was spent (`notify`, `notify.sms`, `redis`, `payment`).
        cap: &'a str,
    },
    /// The shared cap store (`caps.store = "redis"`) did not answer and this process's own cap
    /// applied instead (`timeoutd_effect_cap_fallbacks_total{cap}`).
    EffectCapFallback {
        /// The cap.
        cap: &'a str,
    },
    /// A ledger effect was settled or rescheduled.
    Effect {
        /// Effect kind.
        kind: &'a str,
        /// `done`, `failed`, `retry` or `waiting`.
        outcome: &'a str,
    },
    /// A sweep ran.
    Sweep {
        /// Orders re-armed.
        rearmed: usize,
        /// Duration, ms.
        duration_ms: i64,
        /// Why it failed, if it did.
        error: Option<&'a str>,
    },
    /// A broker message was consumed: counted per row it wakes (a rows message of the relay's
    /// counts each of its rows' `handled`, `held`, `duplicate`, `busy` and, after its claim,
    /// `later`), and once per message for `hop`, `poison` and a `later` before any row is taken
    /// (the clock could not be read, a hop could not be re-sent).
    Consumed {
        /// `handled`, `hop` (re-sent towards its due time), `held` (its row claimed and its
        /// order loaded ahead, acknowledged, and decided at its due time through the
        /// prefetch, [`crate::sources::prefetch`]: counted once, when held; an early message,
        /// or a due one in a burst of at least `rocketmq.consume_batch`),
        /// `duplicate` (its row was processed), `busy` (another handler holds its row), `poison`
        /// or `later` (reconsumed later).
        outcome: &'a str,
    },
    /// The outbox relay published a row (`sent`) or failed to (`failed`, with the error).
    Relayed {
        /// `sent` or `failed`.
        outcome: &'a str,
        /// The send error, if any.
        error: Option<&'a str>,
    },
    /// A retention pass finished a table (`timeoutd_retention_deleted_total{table}`, gauge
    /// `timeoutd_table_rows{table}`).
    Retained {
        /// Table.
        table: &'static str,
        /// Rows deleted in this pass.
        deleted: u64,
        /// Rows left.
        rows: i64,
    },
    /// An order's times could not be believed (a deadline before creation, a window past
    /// `dispatch.max_window`, a row due before creation): quarantined, dead-lettered, nothing
    /// closed (`timeoutd_quarantined_total{field}`; the dead letter raises the usual alert).
    Quarantined {
        /// The field whose value was implausible, e.g. `orders.deadline_ms`.
        field: &'static str,
    },
    /// A completion under a claim token was refused: the row's lease had lapsed and another
    /// holder had taken it (`timeoutd_stale_completions_total{table}`).
    StaleClaim {
        /// `order_timeout_msg` or `effect_ledger`.
        table: &'static str,
    },
    /// A group's shared transaction lost a lock conflict ([`crate::db::DbError::is_lock_conflict`]:
    /// a deadlock, a lock wait timeout, a Galera certification failure) and rolled back
    /// (`timeoutd_group_conflicts_total{group, outcome}`): `retried` (the group runs again
    /// whole after a jittered pause) or `split` (its retries spent, each order goes alone).
    GroupConflict {
        /// `close` or `wait`.
        group: &'static str,
        /// `retried` or `split`.
        outcome: &'static str,
        /// Orders in the group.
        orders: usize,
        /// The server's error.
        error: &'a str,
    },
    /// A fold of the stock journal committed ([`crate::db::stock_journal::fold`]):
    /// `timeoutd_stock_folded_units_total` and `timeoutd_stock_folded_rows_total` count what it
    /// gave back to `sku_stock`; `timeoutd_stock_fold_lag_seconds` is how long its oldest row
    /// waited (the longest a reader of `available` saw those units missing after the close).
    StockFolded {
        /// Journal rows folded.
        rows: u64,
        /// Units given back, over all SKUs.
        units: i64,
        /// The fold's commit time − its oldest row's `created_at_ms` (the close's), ms.
        lag_ms: i64,
    },
    /// An order the provider said was paid was aligned to PAID instead of closed
    /// (`timeoutd_payments_aligned_total`).
    Aligned,
    /// A paid notice was applied ([`crate::paid::apply`]; `timeoutd_paid_notices_total{merchant,
    /// source, outcome}`), so a repeat shows as consumed though it changed nothing.
    PaidNotice {
        /// The order's merchant (empty for an order that does not exist).
        merchant: &'a str,
        /// `callback` (the HTTP paid callback), `paid-message` (the paid topic), or a
        /// provider's notice: `alipay-notify`, `wechatpay-notify`, `stripe-webhook`.
        source: &'a str,
        /// `aligned` (PENDING → paid), `duplicate` (already paid), `after-close` (a
        /// paid-after-close recorded), `after-close-repeat` (recorded before) or `missing`.
        outcome: &'static str,
    },
    /// The payment provider could not say whether an order was paid
    /// (`timeoutd_payment_unknown_total{outcome}`): `wait` (the trigger retries), `decide`, or
    /// `capped` (not asked: the merchant's `payment.max_queries_per_second` was spent).
    PaymentUnknown {
        /// `wait`, `decide` or `capped`.
        outcome: &'static str,
    },
    /// A provider's payment notice (a Stripe webhook, an Alipay notification) was refused with
    /// a 4xx and nothing recorded (`timeoutd_payment_notices_refused_total{provider, reason}`).
    NoticeRefused {
        /// `stripe`, `alipay` or `wechatpay`.
        provider: &'static str,
        /// `unsigned`, `signature`, `stale`, `undecryptable`, `malformed`, `unknown_order`,
        /// `misaddressed` or `amount`.
        reason: &'static str,
    },
    /// A transactional arming ended ([`crate::rocketmq::arming::Arming::arm`]).
    Armed {
        /// `committed`, `rolled_back`, `unknown` (the outcome did not reach the broker: the
        /// half message waits for a check-back, and the broker discards it after its
        /// `transactionCheckMax` unanswered checks — FAILURES.md F6; the outbox row, when the
        /// local transaction committed it, or the sweep closes the order anyway) or `failed`
        /// (the half message was not sent; nothing was armed).
        outcome: &'a str,
    },
    /// The broker asked whether a half message's transaction committed.
    CheckBack {
        /// `commit`, `rollback` or `unknown`.
        verdict: &'a str,
    },
}

/// Writes `event`'s log line (inside the current span: the trigger's order and phase) and
/// updates its metrics.
pub fn emit(event: Event<'_>) {
    match event {
        Event::TriggerReceived { source } => {
            tracing::debug!(source, "trigger received");
            counter!("timeoutd_triggers_total", "source" => source.to_string()).increment(1)
        }
        Event::Decided {
            merchant,
            decision,
            latency_us,
        } => {
            tracing::debug!(merchant, decision, latency_us, "plugin decided");
            counter!("timeoutd_decisions_total", "merchant" => merchant.to_string(), "decision" => decision.to_string())
                .increment(1);
            histogram!("timeoutd_plugin_decision_seconds", "merchant" => merchant.to_string())
                .record(latency_us as f64 / 1e6);
        }
        Event::PluginTrap { plugin, kind } => {
            tracing::warn!(plugin, kind, "plugin trapped");
            counter!("timeoutd_plugin_traps_total", "plugin" => plugin.to_string(), "kind" => kind.to_string())
                .increment(1);
        }
        Event::ShadowCompared {
            merchant,
            outcome,
            differences,
        } => {
            counter!("timeoutd_shadow_decisions_total", "merchant" => merchant.to_string(), "outcome" => outcome.to_string())
                .increment(1);
            for difference in differences.split(',').filter(|d| !d.is_empty()) {
                counter!("timeoutd_shadow_differences_total", "merchant" => merchant.to_string(), "difference" => difference.to_string())
                    .increment(1);
            }
        }
        Event::ShadowSkipped { merchant, why } => {
            counter!("timeoutd_shadow_skipped_total", "merchant" => merchant.to_string(), "why" => why)
                .increment(1);
        }
        Event::PluginReloaded { merchant, outcome } => {
            counter!("timeoutd_plugin_reloads_total", "merchant" => merchant.to_string(), "outcome" => outcome)
                .increment(1);
        }
        Event::TriggerPaused { merchant, scope } => {
            counter!("timeoutd_triggers_paused_total", "merchant" => merchant.to_string(), "scope" => scope)
                .increment(1);
        }
        Event::PluginTripped { merchant, plugin } => {
            tracing::error!(
                merchant,
                plugin,
                "plugin tripped after failing repeatedly; its triggers wait until the trip ends"
            );
            counter!("timeoutd_plugin_trips_total", "merchant" => merchant.to_string()).increment(1)
        }
        Event::Closed {
            source,
            lateness_ms,
            trigger_lateness_ms,
            effects,
        } => {
            // A line per close is DEBUG: a burst's closes are summed up in one INFO line per
            // interval ([`flush_closes`]); the decision log has each close.
            CLOSED_SINCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::debug!(
                source,
                lateness_ms,
                trigger_lateness_ms,
                effects,
                "order closed"
            );
            counter!("timeoutd_closes_total", "source" => source.to_string()).increment(1);
            histogram!("timeoutd_close_lateness_seconds", "source" => source.to_string())
                .record(lateness_ms.max(0) as f64 / 1e3);
            histogram!("timeoutd_trigger_lateness_seconds", "source" => source.to_string())
                .record(trigger_lateness_ms.max(0) as f64 / 1e3);
        }
        Event::DeadLettered { source, reason } => {
            tracing::error!(source, reason, "trigger dead-lettered");
            counter!("timeoutd_dead_letters_total", "source" => source.to_string()).increment(1)
        }
        Event::EffectCapped { merchant, cap } => {
            tracing::debug!(merchant, cap, "effect deferred: cap spent");
            counter!("timeoutd_effects_capped_total", "merchant" => merchant.to_string(), "cap" => cap.to_string())
                .increment(1);
        }
        Event::EffectCapFallback { cap } => {
            counter!("timeoutd_effect_cap_fallbacks_total", "cap" => cap.to_string()).increment(1);
        }
        Event::Effect { kind, outcome } => {
            tracing::debug!(kind, outcome, "effect settled");
            counter!("timeoutd_effects_total", "kind" => kind.to_string(), "outcome" => outcome.to_string())
                .increment(1);
        }
        Event::Sweep {
            rearmed,
            duration_ms,
            error,
        } => {
            match error {
                Some(error) => tracing::warn!(error, "sweep failed"),
                None if rearmed > 0 => {
                    tracing::info!(rearmed, duration_ms, "sweep re-armed orders")
                }
                None => tracing::debug!(duration_ms, "sweep found nothing"),
            }
            let result = if error.is_some() { "failed" } else { "ok" };
            counter!("timeoutd_sweep_runs_total", "result" => result).increment(1);
            counter!("timeoutd_sweep_rearmed_total").increment(rearmed as u64);
            histogram!("timeoutd_sweep_duration_seconds").record(duration_ms as f64 / 1e3);
        }
        Event::Consumed { outcome } => {
            tracing::debug!(outcome, "broker message consumed");
            counter!("timeoutd_broker_messages_total", "outcome" => outcome.to_string())
                .increment(1);
        }
        Event::Relayed { outcome, error } => {
            match error {
                Some(error) => {
                    tracing::warn!(error, "outbox relay send failed; the row stays PENDING")
                }
                None => tracing::debug!("outbox row relayed to the broker"),
            }
            counter!("timeoutd_relay_total", "outcome" => outcome.to_string()).increment(1);
        }
        Event::Retained {
            table,
            deleted,
            rows,
        } => {
            counter!("timeoutd_retention_deleted_total", "table" => table).increment(deleted);
            gauge!("timeoutd_table_rows", "table" => table).set(rows as f64);
        }
        Event::Quarantined { field } => {
            counter!("timeoutd_quarantined_total", "field" => field).increment(1);
        }
        Event::StaleClaim { table } => {
            counter!("timeoutd_stale_completions_total", "table" => table).increment(1);
        }
        Event::GroupConflict {
            group,
            outcome,
            orders,
            error,
        } => {
            if outcome == "split" {
                tracing::warn!(
                    group,
                    orders,
                    error,
                    "group transaction kept losing lock conflicts; carrying out each decision alone"
                );
            } else {
                tracing::debug!(
                    group,
                    orders,
                    error,
                    "group transaction lost a lock conflict; running it again"
                );
            }
            counter!("timeoutd_group_conflicts_total", "group" => group, "outcome" => outcome)
                .increment(1);
        }
        Event::StockFolded {
            rows,
            units,
            lag_ms,
        } => {
            tracing::debug!(rows, units, lag_ms, "stock journal folded");
            counter!("timeoutd_stock_folded_rows_total").increment(rows);
            counter!("timeoutd_stock_folded_units_total").increment(units.max(0) as u64);
            histogram!("timeoutd_stock_fold_lag_seconds").record(lag_ms.max(0) as f64 / 1e3);
        }
        Event::Aligned => {
            counter!("timeoutd_payments_aligned_total").increment(1);
        }
        Event::PaidNotice {
            merchant,
            source,
            outcome,
        } => {
            tracing::debug!(merchant, source, outcome, "paid notice applied");
            counter!("timeoutd_paid_notices_total", "merchant" => merchant.to_string(), "source" => source.to_string(), "outcome" => outcome)
                .increment(1);
        }
        Event::PaymentUnknown { outcome } => {
            counter!("timeoutd_payment_unknown_total", "outcome" => outcome).increment(1);
        }
        Event::NoticeRefused { provider, reason } => {
            tracing::warn!(provider, reason, "payment notice refused; nothing recorded");
            counter!("timeoutd_payment_notices_refused_total", "provider" => provider, "reason" => reason)
                .increment(1);
        }
        Event::Armed { outcome } => {
            if outcome == "unknown" {
                tracing::warn!(
                    outcome,
                    "arming's outcome did not reach the broker; it will check back, and discard the half message if no check-back resolves it"
                );
            } else {
                tracing::debug!(outcome, "order armed");
            }
            counter!("timeoutd_arms_total", "outcome" => outcome.to_string()).increment(1);
        }
        Event::CheckBack { verdict } => {
            tracing::info!(verdict, "transaction check-back answered");
            counter!("timeoutd_check_backs_total", "verdict" => verdict.to_string()).increment(1);
        }
    }
}

/// Puts the counters that alert on rare events (`deploy/prometheus/timeoutd-alerts.yml`) in
/// `/metrics` at 0 from the start, so `increase()` has a series to work on before the first
/// event: stale completions per table, quarantines per field.
pub fn zero_series() {
    for table in ["order_timeout_msg", "effect_ledger"] {
        counter!("timeoutd_stale_completions_total", "table" => table).increment(0);
    }
    for field in [
        "orders.deadline_ms",
        "orders.created_at_ms",
        "order_timeout_msg.due_ms",
    ] {
        counter!("timeoutd_quarantined_total", "field" => field).increment(0);
    }
}

/// Sets a gauge (the periodic [`crate::gauges`] sample).
pub fn gauge_set(name: &'static str, labels: &[(&'static str, String)], value: f64) {
    let labels: Vec<(&'static str, String)> = labels.to_vec();
    gauge!(name, &labels).set(value);
}

/// The process's Prometheus recorder, installed on first use.
pub fn metrics_handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .set_buckets(&[
                0.000_01, 0.000_05, 0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5,
                1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
            ])
            .expect("static buckets")
            .install_recorder()
            .expect("the only metrics recorder of the process")
    })
}

/// Closes since the last [`flush_closes`].
static CLOSED_SINCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Writes one INFO line for the orders closed since the last call, if any. Returns how many.
pub fn flush_closes() -> u64 {
    let closed = CLOSED_SINCE.swap(0, std::sync::atomic::Ordering::Relaxed);
    if closed > 0 {
        tracing::info!(closed, "orders closed since the last summary");
    }
    closed
}

/// How often the daemon writes its summary lines ([`flush_closes`],
/// the slow statements' flush in `db::slowlog`; `cli`'s `summarise` runs them).
pub const SUMMARY_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
