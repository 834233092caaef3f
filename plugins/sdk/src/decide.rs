//! Building decisions: waits to an instant, cancels, the standard effects of a close.

use crate::prelude::*;
use crate::{
    Cancel, Context, Decision, Effect, Notice, Order, ReleaseFlashSlot, RestoreFlashStock,
    RestoreStock, Wait,
};

/// A wait until `at_ms` (epoch ms; at least 1 ms from now), moving to the next phase and
/// keeping the current state. Chain [`Wait::remind`], [`Wait::with_state`] or
/// [`Wait::poll`], then `.into()` a [`Decision`].
pub fn wait_until(ctx: &Context, at_ms: i64) -> Wait {
    Wait {
        after_ms: u64::try_from(at_ms.saturating_sub(ctx.now_ms))
            .unwrap_or(0)
            .max(1),
        next_phase: ctx.phase + 1,
        reminder: None,
        state: ctx.state.clone(),
        poll_payment: false,
    }
}

impl Wait {
    /// Sends `notice` now, with the wait.
    pub fn remind(mut self, notice: Notice) -> Self {
        self.reminder = Some(notice);
        self
    }

    /// Hands `state` to the next phase (`context.state`; at most 1024 bytes).
    pub fn with_state(mut self, state: Vec<u8>) -> Self {
        self.state = state;
        self
    }

    /// Asks the host to query the payment provider before the next phase.
    pub fn poll(mut self) -> Self {
        self.poll_payment = true;
        self
    }
}

impl From<Wait> for Decision {
    fn from(w: Wait) -> Self {
        Decision::Wait(w)
    }
}

/// Close the order now (before the deadline, the host holds it until then) with `effects`.
pub fn cancel(reason: impl Into<String>, effects: Vec<Effect>) -> Decision {
    Decision::Cancel(Cancel {
        reason: reason.into(),
        effects,
    })
}

/// The standard effects of closing `order`: give back each line's stock, release the coupon,
/// and — when `flash_sale` and the order belongs to an activity — restore the activity's stock
/// (the order's units) and free the buyer's slot; close the payment; then `notice`, if any.
/// The same list, in the same order, as the host's built-in fallback (a test holds them
/// together).
pub fn release_everything(order: &Order, flash_sale: bool, notice: Option<Notice>) -> Vec<Effect> {
    let mut effects: Vec<Effect> = order
        .items
        .iter()
        .map(|i| {
            Effect::RestoreStock(RestoreStock {
                sku: i.sku.clone(),
                quantity: i.quantity,
            })
        })
        .collect();
    if let Some(coupon) = &order.coupon {
        effects.push(Effect::ReleaseCoupon(coupon.clone()));
    }
    if flash_sale && let Some(activity) = &order.flash_activity {
        effects.push(Effect::RestoreFlashStock(RestoreFlashStock {
            activity: activity.clone(),
            quantity: order.items.iter().map(|i| i.quantity).sum(),
        }));
        effects.push(Effect::ReleaseFlashSlot(ReleaseFlashSlot {
            activity: activity.clone(),
            user: order.user.clone(),
        }));
    }
    if let Some(payment) = &order.payment_ref {
        effects.push(Effect::ClosePayment(payment.clone()));
    }
    effects.extend(notice.map(Effect::Notify));
    effects
}
