//! Bindings for `timeout:policy@0.2.0` (`wit/v0.2.0`), and their conversions to the model.
//!
//! What 0.2.0 adds: the plugin is asked before the deadline too ([`ASKS_BEFORE_DEADLINE`]),
//! the context carries the state blob of the last `wait` and the payment, and the plugin
//! declares its effect kinds and settings (`describe`).

use wasmtime::Store;
use wasmtime::component::{HasSelf, Linker};

use crate::model;
use crate::state::CallState;

wasmtime::component::bindgen!({
    path: "../../wit/v0.2.0",
    world: "policy",
});

pub(crate) use self::Policy as World;
use self::timeout::policy::types as wit;

/// The version string of this module's package.
pub(crate) const VERSION: &str = "0.2.0";

/// 0.2.0 plugins are asked at every trigger, before the deadline too; only a close waits for it.
pub(crate) const ASKS_BEFORE_DEADLINE: bool = true;

/// Adds this version's imports (`host.log`) to `linker`.
pub(crate) fn add_to_linker(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
    World::add_to_linker::<CallState, HasSelf<CallState>>(linker, |s| s)
}

/// Instantiates the plugin into `store`.
pub(crate) fn instantiate(
    pre: &PolicyPre<CallState>,
    store: &mut Store<CallState>,
) -> wasmtime::Result<World> {
    pre.instantiate(store)
}

/// Calls `describe`.
pub(crate) fn describe(
    instance: &World,
    store: &mut Store<CallState>,
) -> wasmtime::Result<Option<model::Manifest>> {
    let m = instance.call_describe(store)?;
    Ok(Some(model::Manifest {
        effects: m.effects.into_iter().map(effect_kind_out).collect(),
        settings: m
            .settings
            .into_iter()
            .map(|s| model::SettingSpec {
                name: s.name,
                value_type: match s.value_type {
                    wit::SettingType::Duration => model::SettingType::Duration,
                    wit::SettingType::Integer => model::SettingType::Integer,
                    wit::SettingType::Cents => model::SettingType::Cents,
                    wit::SettingType::Boolean => model::SettingType::Boolean,
                    wit::SettingType::Text => model::SettingType::Text,
                },
                default: s.default,
                doc: s.doc,
            })
            .collect(),
    }))
}

/// Calls `decide` on an instance living in `store`.
pub(crate) fn decide(
    instance: &World,
    store: &mut Store<CallState>,
    order: &model::Order,
    ctx: &model::Context,
) -> wasmtime::Result<Result<model::Decision, model::PolicyError>> {
    let answer = instance.call_decide(store, &order_in(order), &context_in(ctx))?;
    Ok(answer.map(decision_out).map_err(error_out))
}

/// Calls `check` on an instance living in `store`.
pub(crate) fn check(
    instance: &World,
    store: &mut Store<CallState>,
    order: &model::Order,
    ctx: &model::Context,
) -> wasmtime::Result<model::CheckVerdict> {
    let verdict = instance.call_check(store, &order_in(order), &context_in(ctx))?;
    Ok(match verdict {
        wit::CheckVerdict::Commit => model::CheckVerdict::Commit,
        wit::CheckVerdict::Rollback => model::CheckVerdict::Rollback,
        wit::CheckVerdict::Unknown => model::CheckVerdict::Unknown,
    })
}

impl wit::Host for CallState {}

impl timeout::policy::host::Host for CallState {
    fn log(&mut self, level: wit::Level, message: String) {
        let level = match level {
            wit::Level::Trace => model::LogLevel::Trace,
            wit::Level::Debug => model::LogLevel::Debug,
            wit::Level::Info => model::LogLevel::Info,
            wit::Level::Warn => model::LogLevel::Warn,
            wit::Level::Error => model::LogLevel::Error,
        };
        self.log(level, message);
    }
}

fn order_in(o: &model::Order) -> wit::Order {
    wit::Order {
        id: o.id.clone(),
        merchant: o.merchant.clone(),
        user: o.user.clone(),
        status: match o.status {
            model::OrderStatus::Pending => wit::OrderStatus::Pending,
            model::OrderStatus::Paid => wit::OrderStatus::Paid,
            model::OrderStatus::Closed => wit::OrderStatus::Closed,
        },
        created_at_ms: o.created_at_ms,
        deadline_ms: o.deadline_ms,
        total_cents: o.total_cents,
        items: o
            .items
            .iter()
            .map(|i| wit::OrderItem {
                sku: i.sku.clone(),
                quantity: i.quantity,
                unit_price_cents: i.unit_price_cents,
            })
            .collect(),
        coupon: o.coupon.clone(),
        flash_activity: o.flash_activity.clone(),
        payment_ref: o.payment_ref.clone(),
    }
}

fn context_in(c: &model::Context) -> wit::Context {
    wit::Context {
        now_ms: c.now_ms,
        trigger: match c.trigger {
            model::TriggerKind::DelayMessage => wit::TriggerKind::DelayMessage,
            model::TriggerKind::Outbox => wit::TriggerKind::Outbox,
            model::TriggerKind::Sweep => wit::TriggerKind::Sweep,
            model::TriggerKind::CheckBack => wit::TriggerKind::CheckBack,
            model::TriggerKind::Manual => wit::TriggerKind::Manual,
        },
        phase: c.phase,
        attempt: c.attempt,
        settings: c.settings.clone(),
        state: c.state.clone(),
        payment: c.payment.as_ref().map(|p| wit::Payment {
            status: match p.status {
                model::PaymentStatus::Unknown => wit::PaymentStatus::Unknown,
                model::PaymentStatus::Unpaid => wit::PaymentStatus::Unpaid,
                model::PaymentStatus::Paid => wit::PaymentStatus::Paid,
                model::PaymentStatus::Closed => wit::PaymentStatus::Closed,
                model::PaymentStatus::NotFound => wit::PaymentStatus::NotFound,
            },
            queried_at_ms: p.queried_at_ms,
            paid_at_ms: p.paid_at_ms,
            paid_cents: p.paid_cents,
        }),
    }
}

fn notice_out(n: wit::Notice) -> model::Notice {
    model::Notice {
        channel: n.channel,
        template: n.template,
        params: n.params,
    }
}

fn decision_out(d: wit::Decision) -> model::Decision {
    match d {
        wit::Decision::Wait(w) => model::Decision::Wait {
            after_ms: w.after_ms,
            next_phase: w.next_phase,
            reminder: w.reminder.map(notice_out),
            state: w.state,
            poll_payment: w.poll_payment,
        },
        wit::Decision::Cancel(c) => model::Decision::Cancel {
            reason: c.reason,
            effects: c.effects.into_iter().map(effect_out).collect(),
        },
        wit::Decision::Ignore(reason) => model::Decision::Ignore { reason },
    }
}

fn effect_kind_out(k: wit::EffectKind) -> model::EffectKind {
    match k {
        wit::EffectKind::RestoreStock => model::EffectKind::RestoreStock,
        wit::EffectKind::RestoreFlashStock => model::EffectKind::RestoreFlashStock,
        wit::EffectKind::ReleaseFlashSlot => model::EffectKind::ReleaseFlashSlot,
        wit::EffectKind::ReleaseCoupon => model::EffectKind::ReleaseCoupon,
        wit::EffectKind::ClosePayment => model::EffectKind::ClosePayment,
        wit::EffectKind::Notify => model::EffectKind::Notify,
    }
}

fn effect_out(e: wit::Effect) -> model::Effect {
    match e {
        wit::Effect::RestoreStock(wit::RestoreStock { sku, quantity }) => {
            model::Effect::RestoreStock { sku, quantity }
        }
        wit::Effect::RestoreFlashStock(wit::RestoreFlashStock { activity, quantity }) => {
            model::Effect::RestoreFlashStock { activity, quantity }
        }
        wit::Effect::ReleaseFlashSlot(wit::ReleaseFlashSlot { activity, user }) => {
            model::Effect::ReleaseFlashSlot { activity, user }
        }
        wit::Effect::ReleaseCoupon(coupon) => model::Effect::ReleaseCoupon { coupon },
        wit::Effect::ClosePayment(payment_ref) => model::Effect::ClosePayment { payment_ref },
        wit::Effect::Notify(n) => model::Effect::Notify(notice_out(n)),
    }
}

fn error_out(e: wit::PolicyError) -> model::PolicyError {
    match e {
        wit::PolicyError::BadSetting((key, problem)) => {
            model::PolicyError::BadSetting { key, problem }
        }
        wit::PolicyError::UnsupportedOrder(s) => model::PolicyError::UnsupportedOrder(s),
        wit::PolicyError::Internal(s) => model::PolicyError::Internal(s),
    }
}
