//! Builders for the orders and contexts a plugin is called with, with test-friendly defaults.

use std::time::Duration;

use timeoutd_runtime::model::{Context, Order, OrderItem, OrderStatus, TriggerKind};

use crate::ms;

/// Creation time of a built order unless set: 2023-11-14T22:13:20Z, epoch ms.
pub const DEFAULT_CREATED_AT_MS: i64 = 1_700_000_000_000;

/// Starts an order `id`: merchant `acme`, buyer `u-1`, PENDING, created at
/// [`DEFAULT_CREATED_AT_MS`] with a 15-minute payment window, one line `sku-a` × 2 at 1 250
/// cents, no coupon, activity or payment reference. `total_cents` is the lines' sum unless set.
pub fn order(id: &str) -> OrderBuilder {
    OrderBuilder {
        order: Order {
            id: id.to_string(),
            merchant: "acme".into(),
            user: "u-1".into(),
            status: OrderStatus::Pending,
            created_at_ms: DEFAULT_CREATED_AT_MS,
            deadline_ms: DEFAULT_CREATED_AT_MS + 15 * 60_000,
            total_cents: 0,
            items: Vec::new(),
            coupon: None,
            flash_activity: None,
            payment_ref: None,
        },
        total_set: false,
    }
}

/// Builds an [`Order`]; see [`order`] for the defaults.
#[derive(Debug, Clone)]
pub struct OrderBuilder {
    order: Order,
    total_set: bool,
}

impl OrderBuilder {
    /// The owning merchant.
    pub fn merchant(mut self, merchant: &str) -> Self {
        self.order.merchant = merchant.into();
        self
    }

    /// The buyer.
    pub fn user(mut self, user: &str) -> Self {
        self.order.user = user.into();
        self
    }

    /// The status.
    pub fn status(mut self, status: OrderStatus) -> Self {
        self.order.status = status;
        self
    }

    /// Creation time, epoch ms; the deadline moves with it (same window).
    pub fn created_at_ms(mut self, created_at_ms: i64) -> Self {
        let window = self.order.deadline_ms - self.order.created_at_ms;
        self.order.created_at_ms = created_at_ms;
        self.order.deadline_ms = created_at_ms + window;
        self
    }

    /// Payment window: the deadline is this long after creation.
    pub fn window(mut self, window: Duration) -> Self {
        self.order.deadline_ms = self.order.created_at_ms + ms(window);
        self
    }

    /// Adds a line: `quantity` units of `sku` at `unit_price_cents` each.
    pub fn item(mut self, sku: &str, quantity: u32, unit_price_cents: i64) -> Self {
        self.order.items.push(OrderItem {
            sku: sku.into(),
            quantity,
            unit_price_cents,
        });
        self
    }

    /// The order total, cents (otherwise the sum of the lines).
    pub fn total_cents(mut self, total_cents: i64) -> Self {
        self.order.total_cents = total_cents;
        self.total_set = true;
        self
    }

    /// The coupon the order locked.
    pub fn coupon(mut self, coupon: &str) -> Self {
        self.order.coupon = Some(coupon.into());
        self
    }

    /// The flash-sale activity the order was placed in.
    pub fn flash_activity(mut self, activity: &str) -> Self {
        self.order.flash_activity = Some(activity.into());
        self
    }

    /// The payment reference at the provider.
    pub fn payment_ref(mut self, payment_ref: &str) -> Self {
        self.order.payment_ref = Some(payment_ref.into());
        self
    }

    /// The order (one line `sku-a` × 2 at 1 250 cents when no line was added).
    pub fn build(mut self) -> Order {
        if self.order.items.is_empty() {
            self = self.item("sku-a", 2, 1_250);
        }
        if !self.total_set {
            self.order.total_cents = self
                .order
                .items
                .iter()
                .map(|i| i64::from(i.quantity) * i.unit_price_cents)
                .sum();
        }
        self.order
    }
}

/// Starts a context: now = [`DEFAULT_CREATED_AT_MS`] + 15 min (the default order's deadline),
/// outbox trigger, phase 0, attempt 0, no settings.
pub fn context() -> ContextBuilder {
    ContextBuilder {
        context: Context {
            now_ms: DEFAULT_CREATED_AT_MS + 15 * 60_000,
            trigger: TriggerKind::Outbox,
            phase: 0,
            attempt: 0,
            settings: Vec::new(),
            state: Vec::new(),
            payment: None,
        },
    }
}

/// Builds a [`Context`]; see [`context`] for the defaults.
#[derive(Debug, Clone)]
pub struct ContextBuilder {
    context: Context,
}

impl ContextBuilder {
    /// Now, epoch ms (the database clock in the daemon).
    pub fn now_ms(mut self, now_ms: i64) -> Self {
        self.context.now_ms = now_ms;
        self
    }

    /// Now = `order`'s creation + `after`.
    pub fn after_creation(mut self, order: &Order, after: Duration) -> Self {
        self.context.now_ms = order.created_at_ms + ms(after);
        self
    }

    /// What made the host ask.
    pub fn trigger(mut self, trigger: TriggerKind) -> Self {
        self.context.trigger = trigger;
        self
    }

    /// The phase being decided.
    pub fn phase(mut self, phase: u32) -> Self {
        self.context.phase = phase;
        self
    }

    /// Earlier attempts of this phase.
    pub fn attempt(mut self, attempt: u32) -> Self {
        self.context.attempt = attempt;
        self
    }

    /// Adds (or replaces) one merchant setting.
    pub fn setting(mut self, key: &str, value: &str) -> Self {
        crate::set(&mut self.context.settings, key, value);
        self
    }

    /// Adds (or replaces) each of `settings`.
    pub fn settings(mut self, settings: &[(String, String)]) -> Self {
        for (k, v) in settings {
            crate::set(&mut self.context.settings, k, v);
        }
        self
    }

    /// The context.
    pub fn build(self) -> Context {
        self.context
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_order_defaults_to_one_line_and_totals_its_lines() {
        let o = order("o").build();
        assert_eq!(o.items.len(), 1);
        assert_eq!(o.total_cents, 2_500);
        assert_eq!(o.deadline_ms - o.created_at_ms, 15 * 60_000);
        let o = order("o")
            .item("x", 3, 100)
            .created_at_ms(0)
            .window(Duration::from_secs(60))
            .build();
        assert_eq!((o.total_cents, o.deadline_ms), (300, 60_000));
    }

    #[test]
    fn a_setting_set_twice_keeps_one_entry() {
        let c = context()
            .setting("grace", "1m")
            .setting("grace", "5m")
            .build();
        assert_eq!(c.settings, vec![("grace".to_string(), "5m".to_string())]);
    }
}
