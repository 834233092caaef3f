//! `single-phase`: when the payment window lapses, close the order — restore each line's stock,
//! release the coupon, close the payment and tell the buyer.
//!
//! Settings (all optional):
//! - `channel` — notification sink, default `log`;
//! - `closed_template` — template of the closed notice, default `order-closed`;
//! - `reason` — close reason recorded with the order, default `payment window lapsed`;
//! - `max_checks` — check-backs answered `unknown` before committing, default 3.

#![no_std]

use timeoutd_policy_sdk::prelude::*;
use timeoutd_policy_sdk::{
    CheckVerdict, Context, Decision, Guest, Notice, Order, OrderStatus, PolicyError, Settings,
    Wait, release_everything, standard_check,
};

struct SinglePhase;

impl Guest for SinglePhase {
    fn decide(order: Order, ctx: Context) -> Result<Decision, PolicyError> {
        if order.status != OrderStatus::Pending {
            return Ok(Decision::Ignore(format!("order is {:?}", order.status)));
        }
        if ctx.now_ms < order.deadline_ms {
            // The host defers early triggers itself; answer consistently if asked anyway.
            return Ok(Decision::Wait(Wait {
                after_ms: (order.deadline_ms - ctx.now_ms) as u64,
                next_phase: ctx.phase + 1,
                reminder: None,
            }));
        }
        let settings = Settings(&ctx.settings);
        let notice = Notice {
            channel: settings.text("channel", "log").to_string(),
            template: settings.text("closed_template", "order-closed").to_string(),
            params: vec![("total_cents".into(), order.total_cents.to_string())],
        };
        Ok(Decision::Cancel(timeoutd_policy_sdk::Cancel {
            reason: settings.text("reason", "payment window lapsed").to_string(),
            effects: release_everything(&order, false, Some(notice)),
        }))
    }

    fn check(order: Order, ctx: Context) -> CheckVerdict {
        let max_checks = Settings(&ctx.settings).number("max_checks", 3).unwrap_or(3);
        standard_check(&order, &ctx, max_checks)
    }
}

timeoutd_policy_sdk::export_policy!(SinglePhase with_types_in timeoutd_policy_sdk::bindings);
