//! `two-phase`: when the payment window lapses, keep the order open a little longer and remind
//! the buyer ("closes in 5 minutes"); when that grace lapses too, close it — restore stock,
//! release the coupon, close the payment, and for a flash-sale order also give the units back to
//! the activity and free the buyer's slot.
//!
//! Settings:
//! - `grace` (required) — how long to keep waiting after the payment window, e.g. `5m`;
//! - `channel` — notification sink, default `log`;
//! - `reminder_template` — default `order-closing-soon`;
//! - `closed_template` — default `order-closed`;
//! - `max_checks` — check-backs answered `unknown` before committing, default 3.

#![no_std]

use timeoutd_policy_sdk::prelude::*;
use timeoutd_policy_sdk::{
    Cancel, CheckVerdict, Context, Decision, Guest, Level, Notice, Order, OrderStatus, PolicyError,
    Settings, Wait, log, release_everything, standard_check,
};

struct TwoPhase;

impl Guest for TwoPhase {
    fn decide(order: Order, ctx: Context) -> Result<Decision, PolicyError> {
        if order.status != OrderStatus::Pending {
            return Ok(Decision::Ignore(format!("order is {:?}", order.status)));
        }
        let settings = Settings(&ctx.settings);
        let grace_ms = settings.duration_ms("grace")?;
        let channel = settings.text("channel", "log").to_string();
        let close_at = order.deadline_ms.saturating_add(grace_ms as i64);
        if ctx.now_ms >= close_at {
            let notice = Notice {
                channel,
                template: settings.text("closed_template", "order-closed").to_string(),
                params: vec![("total_cents".into(), order.total_cents.to_string())],
            };
            return Ok(Decision::Cancel(Cancel {
                reason: "payment window and grace lapsed".to_string(),
                effects: release_everything(&order, true, Some(notice)),
            }));
        }
        let remaining = (close_at - ctx.now_ms.max(order.deadline_ms)) as u64;
        // Remind once: on the first phase that finds the window lapsed.
        let reminder = (ctx.phase == 0 && ctx.now_ms >= order.deadline_ms).then(|| Notice {
            channel,
            template: settings
                .text("reminder_template", "order-closing-soon")
                .to_string(),
            params: vec![
                ("closes_in".into(), human(remaining)),
                ("closes_at_ms".into(), close_at.to_string()),
            ],
        });
        if reminder.is_some() {
            log(
                Level::Debug,
                &format!("reminding; closing in {}", human(remaining)),
            );
        }
        Ok(Decision::Wait(Wait {
            after_ms: (close_at - ctx.now_ms) as u64,
            next_phase: ctx.phase + 1,
            reminder,
        }))
    }

    fn check(order: Order, ctx: Context) -> CheckVerdict {
        let max_checks = Settings(&ctx.settings).number("max_checks", 3).unwrap_or(3);
        standard_check(&order, &ctx, max_checks)
    }
}

/// "5 minutes", "30 seconds", "1500 ms".
fn human(ms: u64) -> String {
    match ms {
        m if m >= 60_000 && m % 60_000 == 0 => format!("{} minutes", m / 60_000),
        m if m >= 1_000 => format!("{} seconds", m.div_ceil(1_000)),
        m => format!("{m} ms"),
    }
}

timeoutd_policy_sdk::export_policy!(TwoPhase with_types_in timeoutd_policy_sdk::bindings);
