//! `tea-house` (API 0.2.0): remind the buyer `remind_before` ahead of the deadline and close at
//! the deadline; an order of `vip_cents` or more gets a second reminder when the window lapses
//! and `vip_grace` more before it closes.
//!
//! Phases, each a `wait` to an instant (the state byte counts reminders sent):
//! - first look (as soon as the daemon sees the order): wait until `deadline - remind_before`
//!   (with `poll_every` set, in steps of it, asking the host to poll the payment provider);
//! - then: remind ("closes in 2 minutes"), wait until the deadline (VIP) or the close;
//! - VIP at the deadline: second reminder ("held 10 more minutes"), wait until the close;
//! - at the close: cancel, releasing everything the order holds, and tell the buyer.

use timeoutd_policy_sdk::{
    Context, Decision, EffectKind, Level, Manifest, Notice, Order, OrderStatus, Policy,
    PolicyError, Setting, Settings, cancel, export_policy, log, release_everything, wait_until,
};

struct TeaHouse;

/// Reminders sent so far, carried in the wait's state.
fn reminders_sent(ctx: &Context) -> u8 {
    ctx.state.first().copied().unwrap_or(0)
}

fn notice(channel: &str, template: &str, params: &[(&str, String)]) -> Notice {
    Notice {
        channel: channel.to_string(),
        template: template.to_string(),
        params: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    }
}

impl Policy for TeaHouse {
    fn describe() -> Manifest {
        Manifest {
            effects: vec![
                EffectKind::RestoreStock,
                EffectKind::ReleaseCoupon,
                EffectKind::RestoreFlashStock,
                EffectKind::ReleaseFlashSlot,
                EffectKind::ClosePayment,
                EffectKind::Notify,
            ],
            settings: vec![
                Setting::duration(
                    "remind_before",
                    Some("2m"),
                    "how long before the deadline the buyer is reminded",
                ),
                Setting::cents(
                    "vip_cents",
                    Some("100000"),
                    "order total, in cents, from which an order gets the VIP grace",
                ),
                Setting::duration(
                    "vip_grace",
                    Some("10m"),
                    "how much longer a VIP order stays open after its deadline",
                ),
                Setting::text("channel", Some("log"), "notification channel"),
                Setting::duration(
                    "poll_every",
                    Some("0s"),
                    "how often the payment provider is asked until the reminder; 0s: not at all",
                ),
            ],
        }
    }

    fn decide(order: Order, ctx: Context) -> Result<Decision, PolicyError> {
        if order.status != OrderStatus::Pending {
            return Ok(Decision::Ignore(format!("order is {:?}", order.status)));
        }
        let settings = Settings::new(&ctx.settings, Self::describe().settings);
        let remind_at = order
            .deadline_ms
            .saturating_sub(settings.duration_ms("remind_before")? as i64);
        let vip = order.total_cents >= settings.integer("vip_cents")?;
        let grace = if vip {
            settings.duration_ms("vip_grace")? as i64
        } else {
            0
        };
        let close_at = order.deadline_ms.saturating_add(grace);
        let channel = settings.text("channel")?;
        let sent = reminders_sent(&ctx);
        if ctx.now_ms >= close_at {
            let closed = notice(
                channel,
                "order-closed",
                &[("total_cents", order.total_cents.to_string())],
            );
            return Ok(cancel(
                "payment window lapsed",
                release_everything(&order, true, Some(closed)),
            ));
        }
        let minutes = |ms: i64| format!("{} minutes", (ms.max(0) + 59_999) / 60_000);
        let poll_every = settings.duration_ms("poll_every")? as i64;
        let wait = match sent {
            // Polling the provider until the reminder (seed 002): a payment it knows of is
            // aligned at once, before the deadline.
            0 if ctx.now_ms < remind_at && poll_every > 0 => {
                wait_until(&ctx, (ctx.now_ms + poll_every).min(remind_at)).poll()
            }
            0 if ctx.now_ms < remind_at => wait_until(&ctx, remind_at),
            0 => {
                log(
                    Level::Info,
                    &format!(
                        "reminding {} before the deadline",
                        minutes(order.deadline_ms - ctx.now_ms)
                    ),
                );
                let next = if vip { order.deadline_ms } else { close_at };
                wait_until(&ctx, next)
                    .remind(notice(
                        channel,
                        "order-closing-soon",
                        &[("closes_in", minutes(order.deadline_ms - ctx.now_ms))],
                    ))
                    .with_state(vec![1])
            }
            1 if vip && ctx.now_ms >= order.deadline_ms => wait_until(&ctx, close_at)
                .remind(notice(
                    channel,
                    "order-held",
                    &[("closes_in", minutes(close_at - ctx.now_ms))],
                ))
                .with_state(vec![2]),
            1 if vip => wait_until(&ctx, order.deadline_ms),
            _ => wait_until(&ctx, close_at),
        };
        Ok(wait.into())
    }
}

export_policy!(TeaHouse);
