//! The built-in close-at-deadline policy a merchant with `on_plugin_error = "fallback"` falls
//! back on when its plugin fails.

use timeoutd_runtime::DecideError;
use timeoutd_runtime::model::{Decision, Effect, Order};

/// Decides `order` at `now_ms` for `phase` without the plugin: before the deadline, wait until
/// it (next phase); at or after it, cancel releasing everything the order holds — each line's
/// stock, the coupon, the flash-sale units and the buyer's slot when the order is in an
/// activity, and the payment. `error` (the plugin's failure) is named in the reason.
pub fn decide(order: &Order, now_ms: i64, phase: u32, error: &DecideError) -> Decision {
    if now_ms < order.deadline_ms {
        return Decision::Wait {
            after_ms: u64::try_from(order.deadline_ms - now_ms)
                .unwrap_or(1)
                .max(1),
            next_phase: phase + 1,
            reminder: None,
            state: Vec::new(),
            poll_payment: false,
        };
    }
    let effects = Effect::release_everything(order);
    let first_line = error.to_string();
    let first_line = first_line.lines().next().unwrap_or_default();
    Decision::Cancel {
        reason: format!("fallback close at the deadline; the plugin failed: {first_line}"),
        effects,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use timeoutd_runtime::model::{OrderItem, OrderStatus};

    fn order() -> Order {
        Order {
            id: "o1".into(),
            merchant: "m".into(),
            user: "u1".into(),
            status: OrderStatus::Pending,
            created_at_ms: 0,
            deadline_ms: 1_000,
            total_cents: 300,
            items: vec![OrderItem {
                sku: "a".into(),
                quantity: 3,
                unit_price_cents: 100,
            }],
            coupon: Some("c1".into()),
            flash_activity: Some("fs".into()),
            payment_ref: Some("p1".into()),
        }
    }

    fn error() -> DecideError {
        DecideError::Host {
            plugin: "p".into(),
            reason: "boom\nmore".into(),
        }
    }

    #[test]
    fn at_the_deadline_it_releases_everything_and_passes_the_guard() {
        let Decision::Cancel { reason, effects } = decide(&order(), 1_000, 0, &error()) else {
            panic!()
        };
        assert!(
            reason.ends_with("could not be instantiated: boom"),
            "{reason}"
        );
        let kinds: Vec<&str> = effects.iter().map(|e| e.kind().as_str()).collect();
        assert_eq!(
            kinds,
            [
                "restore-stock",
                "release-coupon",
                "restore-flash-stock",
                "release-flash-slot",
                "close-payment"
            ]
        );
        assert_eq!(timeoutd_runtime::guard::check(&order(), &effects), Ok(()));
    }

    #[test]
    fn before_the_deadline_it_waits_for_it() {
        assert_eq!(
            decide(&order(), 400, 2, &error()),
            Decision::Wait {
                after_ms: 600,
                next_phase: 3,
                reminder: None,
                state: Vec::new(),
                poll_payment: false,
            }
        );
    }
}
