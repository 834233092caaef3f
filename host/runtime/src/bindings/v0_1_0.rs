//! Bindings for `timeout:policy@0.1.0` (`wit/v0.1.0`), and their conversions to the model.

use wasmtime::Store;
use wasmtime::component::{HasSelf, Linker};

use crate::model;
use crate::state::CallState;

wasmtime::component::bindgen!({
    path: "../../wit/v0.1.0",
    world: "policy",
});

pub(crate) use self::Policy as World;
use self::timeout::policy::types as wit;

/// The version string of this module's package.
pub(crate) const VERSION: &str = "0.1.0";

/// 0.1.0 plugins are not asked before the deadline: the daemon defers an early trigger to it.
pub(crate) const ASKS_BEFORE_DEADLINE: bool = false;

/// 0.1.0 has no `describe`: the plugin declares nothing.
pub(crate) fn describe(
    _instance: &World,
    _store: &mut Store<CallState>,
) -> wasmtime::Result<Option<model::Manifest>> {
    Ok(None)
}

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
            state: Vec::new(),
            poll_payment: false,
        },
        wit::Decision::Cancel(c) => model::Decision::Cancel {
            reason: c.reason,
            effects: c.effects.into_iter().map(effect_out).collect(),
        },
        wit::Decision::Ignore(reason) => model::Decision::Ignore { reason },
    }
}

fn effect_out(e: wit::Effect) -> model::Effect {
    match e {
        wit::Effect::RestoreStock((sku, quantity)) => model::Effect::RestoreStock { sku, quantity },
        wit::Effect::RestoreFlashStock((activity, quantity)) => {
            model::Effect::RestoreFlashStock { activity, quantity }
        }
        wit::Effect::ReleaseFlashSlot((activity, user)) => {
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
