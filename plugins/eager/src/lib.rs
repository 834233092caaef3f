//! `eager` (API 0.2.0): answers the same at every look, as a merchant's bug would, so the
//! tests can see what the host does with a cancel or an ignore asked for before the deadline.
//! A 0.2.0 plugin is asked when the daemon first sees an order's row; only a `wait` may take
//! effect then, and the host holds any other answer until the deadline, when it asks again.
//!
//! Setting `answer`: `cancel` (default; releases everything the order holds) or `ignore`.
//! An order that is no longer pending is ignored.

use timeoutd_policy_sdk::{
    Context, Decision, EffectKind, Manifest, Order, OrderStatus, Policy, PolicyError, Setting,
    Settings, cancel, export_policy, release_everything,
};

struct Eager;

impl Policy for Eager {
    fn describe() -> Manifest {
        Manifest {
            effects: vec![
                EffectKind::RestoreStock,
                EffectKind::ReleaseCoupon,
                EffectKind::RestoreFlashStock,
                EffectKind::ReleaseFlashSlot,
                EffectKind::ClosePayment,
            ],
            settings: vec![Setting::text(
                "answer",
                Some("cancel"),
                "what to answer at every look: cancel or ignore",
            )],
        }
    }

    fn decide(order: Order, ctx: Context) -> Result<Decision, PolicyError> {
        if order.status != OrderStatus::Pending {
            return Ok(Decision::Ignore(format!("order is {:?}", order.status)));
        }
        let settings = Settings::new(&ctx.settings, Self::describe().settings);
        match settings.text("answer")? {
            "ignore" => Ok(Decision::Ignore("eager: ignored at first sight".into())),
            _ => Ok(cancel(
                "eager: cancelled at first sight",
                release_everything(&order, true, None),
            )),
        }
    }
}

export_policy!(Eager);
