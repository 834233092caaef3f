//! The demo's shop: seeds stock and coupons, creates orders through the reference order
//! service, and pays a share of them.

use std::time::Duration;

use timeoutd_runtime::model::{Order, OrderItem, OrderStatus};
use tokio::task::JoinSet;

use crate::config::Config;
use crate::db::{Db, fixtures, orders};
use crate::sources::outbox::Waker;

/// SKUs seeded.
const SKUS: u32 = 40;
/// Units of each SKU at the start.
const UNITS_PER_SKU: i64 = 100_000;
/// Orders are created evenly over this long.
const CREATION_SPREAD_MS: u64 = 3_000;
/// The flash-sale activity of the two-phase merchant's orders.
const FLASH_ACTIVITY: &str = "flash-2026-11";

/// What the shopper does with an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Pays at a random moment inside the window.
    PayEarly,
    /// Pays right at the deadline, racing the close.
    PayAtDeadline,
    /// Never pays.
    Abandon,
}

pub(super) struct Shop {
    db: Db,
    merchants: Vec<(String, i64, i64)>,
    orders: u32,
}

impl Shop {
    /// Seeds `sku_stock` and returns the shop. Merchants come from the config, each with its
    /// payment window and, for the two-phase plugin, its `grace` setting.
    pub(super) async fn open(db: Db, config: &Config, orders: u32) -> anyhow::Result<Shop> {
        let mut tx = db.begin().await?;
        for n in 0..SKUS {
            fixtures::add_stock(&mut tx, &format!("sku-{n:03}"), UNITS_PER_SKU).await?;
        }
        tx.commit().await?;
        let merchants = config
            .merchants
            .iter()
            .map(|(id, m)| {
                let window = m
                    .payment_window
                    .unwrap_or(Duration::from_secs(3))
                    .as_millis() as i64;
                let grace = m
                    .settings
                    .get("grace")
                    .and_then(|g| humantime::parse_duration(g).ok())
                    .map_or(0, |g| g.as_millis() as i64);
                (id.clone(), window, grace)
            })
            .collect();
        Ok(Shop {
            db,
            merchants,
            orders,
        })
    }

    pub(super) fn initial_stock_units(&self) -> i64 {
        i64::from(SKUS) * UNITS_PER_SKU
    }

    /// Longest time from the first order's creation to the last possible close, ms.
    pub(super) fn longest_close_ms(&self) -> i64 {
        let longest = self
            .merchants
            .iter()
            .map(|(_, w, g)| w + g)
            .max()
            .unwrap_or(0);
        CREATION_SPREAD_MS as i64 + longest
    }

    /// Creates every order, evenly over a few seconds, and pays the ones fated to be paid.
    pub(super) async fn run(self, waker: Waker) -> anyhow::Result<()> {
        let mut payments = JoinSet::new();
        let gap = Duration::from_micros(CREATION_SPREAD_MS * 1000 / u64::from(self.orders.max(1)));
        let mut next = tokio::time::Instant::now();
        for n in 0..self.orders {
            tokio::time::sleep_until(next).await;
            next += gap;
            let now = self.db.now_ms().await?;
            let (merchant, window, grace) = &self.merchants[n as usize % self.merchants.len()];
            let order = self
                .new_order(n, merchant, now, now + window, *grace > 0)
                .await?;
            let mut tx = self.db.begin().await?;
            orders::create(&mut tx, &order).await?;
            tx.commit().await?;
            waker.notify_one();
            let pay_at = match fate() {
                Fate::Abandon => continue,
                Fate::PayEarly => now + fastrand::i64(1..(*window - 100).max(2)),
                Fate::PayAtDeadline => order.deadline_ms + fastrand::i64(-20..=20),
            };
            let db = self.db.clone();
            payments.spawn(async move {
                let wait = (pay_at - now).max(0) as u64;
                tokio::time::sleep(Duration::from_millis(wait)).await;
                let paid_at = db.now_ms().await?;
                let mut tx = db.begin().await?;
                orders::pay(
                    &mut tx,
                    &crate::db::shop::Schema::Canonical,
                    &order.id,
                    paid_at,
                    paid_at,
                )
                .await?;
                tx.commit().await?;
                anyhow::Ok(())
            });
        }
        while let Some(done) = payments.join_next().await {
            done??;
        }
        Ok(())
    }

    async fn new_order(
        &self,
        n: u32,
        merchant: &str,
        now: i64,
        deadline: i64,
        flash: bool,
    ) -> anyhow::Result<Order> {
        let id = format!("ord-{n:06}");
        let user = format!("user-{:04}", fastrand::u32(0..2_000));
        let items: Vec<OrderItem> = (0..fastrand::u32(1..=3))
            .map(|_| OrderItem {
                sku: format!("sku-{:03}", fastrand::u32(0..SKUS)),
                quantity: fastrand::u32(1..=3),
                unit_price_cents: fastrand::i64(100..=5_000),
            })
            .collect();
        let coupon = if fastrand::u8(0..10) < 3 {
            let coupon = format!("cpn-{n:06}");
            fixtures::add_coupon(&self.db, &coupon, &user).await?;
            Some(coupon)
        } else {
            None
        };
        Ok(Order {
            total_cents: items
                .iter()
                .map(|i| i.unit_price_cents * i64::from(i.quantity))
                .sum(),
            id: id.clone(),
            merchant: merchant.to_string(),
            user,
            status: OrderStatus::Pending,
            created_at_ms: now,
            deadline_ms: deadline,
            items,
            coupon,
            flash_activity: flash.then(|| FLASH_ACTIVITY.to_string()),
            payment_ref: Some(format!("pay-{id}")),
        })
    }
}

/// 35% pay inside the window, 10% right at the deadline, the rest never.
fn fate() -> Fate {
    match fastrand::u8(0..100) {
        0..35 => Fate::PayEarly,
        35..45 => Fate::PayAtDeadline,
        _ => Fate::Abandon,
    }
}
