//! The demo's results, read back from the database, and its conservation checks.

use std::path::Path;

use serde::Serialize;

use crate::db::{Db, DbError, demo};

/// Orders by status.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Counts {
    pub total: i64,
    pub pending: i64,
    pub paid: i64,
    pub closed: i64,
}

pub(super) async fn counts(db: &Db) -> Result<Counts, DbError> {
    let rows = demo::orders_by_status(db).await?;
    let mut c = Counts::default();
    for (status, n) in rows {
        c.total += n;
        match status.as_str() {
            "PENDING" => c.pending = n,
            "PAID" => c.paid = n,
            "CLOSED" => c.closed = n,
            _ => {}
        }
    }
    Ok(c)
}

pub(super) async fn open_orders(db: &Db) -> Result<Vec<String>, DbError> {
    demo::first_open_orders(db).await
}

/// Close lateness (close time − due time), ms.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Lateness {
    /// Median.
    pub p50: i64,
    /// 99th percentile.
    pub p99: i64,
    /// Largest.
    pub max: i64,
}

/// What the demo did, and whether everything was conserved.
#[derive(Debug, Clone, Serialize)]
pub struct DemoReport {
    /// Orders created.
    pub orders: i64,
    /// Orders paid.
    pub paid: i64,
    /// Orders closed by timeoutd.
    pub closed: i64,
    /// Orders still open (0 when the demo finished).
    pub open: i64,
    /// Orders that were sent a reminder.
    pub reminded: i64,
    /// Close lateness against each close's due time.
    pub lateness_ms: Lateness,
    /// Closes that happened before the order's deadline (must be 0).
    pub closed_before_deadline: i64,
    /// Stock units at the start.
    pub initial_stock_units: i64,
    /// Stock units available at the end.
    pub final_stock_units: i64,
    /// Units held by paid orders.
    pub paid_units: i64,
    /// `restore-stock` ledger rows minus the lines of closed orders (must be 0: each once).
    pub duplicate_restores: i64,
    /// Coupons still LOCKED at the end (must be 0).
    pub coupons_locked: i64,
    /// Coupons of paid orders not marked USED, plus coupons of closed orders not AVAILABLE
    /// (must be 0).
    pub coupons_misplaced: i64,
    /// Plugin decisions made.
    pub decisions: i64,
    /// Open dead letters (must be 0).
    pub dead_letters: i64,
    /// External effects carried out (notices).
    pub effects_done: i64,
    /// External effects waiting for an executor the demo does not configure (Redis, payment).
    pub effects_waiting: i64,
    /// The SQLite database, for a look with `sqlite3`.
    pub db_path: String,
}

impl DemoReport {
    pub(super) async fn gather(
        db: &Db,
        orders: u32,
        initial_stock_units: i64,
        db_path: &Path,
    ) -> Result<DemoReport, DbError> {
        let c = counts(db).await?;
        let mut lateness = demo::close_lateness_ms(db).await?;
        lateness.sort_unstable();
        let rank = |q: f64| crate::lateness::nearest_rank(&lateness, q);
        let t = demo::tallies(db).await?;
        Ok(DemoReport {
            orders: i64::from(orders),
            paid: c.paid,
            closed: c.closed,
            open: c.pending,
            reminded: t.reminded,
            lateness_ms: Lateness {
                p50: rank(0.50),
                p99: rank(0.99),
                max: lateness.last().copied().unwrap_or(0),
            },
            closed_before_deadline: t.closed_before_deadline,
            initial_stock_units,
            final_stock_units: t.stock_units,
            paid_units: t.paid_units,
            duplicate_restores: t.restores - t.closed_lines,
            coupons_locked: t.coupons_locked,
            coupons_misplaced: t.coupons_misplaced,
            decisions: t.decisions,
            dead_letters: t.dead_letters,
            effects_done: t.effects_done,
            effects_waiting: t.effects_waiting,
            db_path: db_path.display().to_string(),
        })
    }

    /// Every order ended PAID or CLOSED, none closed early, stock and coupons exactly conserved,
    /// every effect once, nothing dead-lettered.
    pub fn conserved(&self) -> bool {
        self.open == 0
            && self.paid + self.closed == self.orders
            && self.closed_before_deadline == 0
            && self.final_stock_units + self.paid_units == self.initial_stock_units
            && self.duplicate_restores == 0
            && self.coupons_locked == 0
            && self.coupons_misplaced == 0
            && self.dead_letters == 0
    }

    /// A readable summary.
    pub fn summary(&self) -> String {
        let ok = |b: bool| if b { "ok" } else { "VIOLATED" };
        format!(
            "timeoutd demo: {orders} orders → {paid} paid, {closed} closed by timeout, {open} open\n\
             \x20 reminders sent:        {reminded}\n\
             \x20 close lateness (ms):   p50 {p50}, p99 {p99}, max {max}\n\
             \x20 closed before deadline: {early} ({early_ok})\n\
             \x20 stock:                 {initial} at start = {final_units} available + {paid_units} held by paid orders ({stock_ok})\n\
             \x20 effects applied once:  {dup_ok}\n\
             \x20 coupons:               {locked} still locked, {misplaced} misplaced ({coupon_ok})\n\
             \x20 decisions logged:      {decisions}; dead letters: {dead}\n\
             \x20 external effects:      {done} notices sent; {waiting} waiting in the ledger for Redis/payment (not configured in the demo)\n\
             \x20 database:              {db}",
            orders = self.orders,
            paid = self.paid,
            closed = self.closed,
            open = self.open,
            reminded = self.reminded,
            p50 = self.lateness_ms.p50,
            p99 = self.lateness_ms.p99,
            max = self.lateness_ms.max,
            early = self.closed_before_deadline,
            early_ok = ok(self.closed_before_deadline == 0),
            initial = self.initial_stock_units,
            final_units = self.final_stock_units,
            paid_units = self.paid_units,
            stock_ok = ok(self.final_stock_units + self.paid_units == self.initial_stock_units),
            dup_ok = ok(self.duplicate_restores == 0),
            locked = self.coupons_locked,
            misplaced = self.coupons_misplaced,
            coupon_ok = ok(self.coupons_locked == 0 && self.coupons_misplaced == 0),
            decisions = self.decisions,
            dead = self.dead_letters,
            done = self.effects_done,
            waiting = self.effects_waiting,
            db = self.db_path,
        )
    }
}
