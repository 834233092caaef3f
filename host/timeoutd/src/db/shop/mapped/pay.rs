//! A payment recorded in the shop's own tables, as the profile's `[paid]` says (mall's
//! `paySuccess`): one compare-and-set from a pending status to the paid one, with its stamps,
//! then the locked units of its lines sold, per SKU in SKU order. The caller's transaction holds
//! it all: a SKU that cannot be sold fails the payment whole.

use sqlx::{AnyConnection, Row};

use super::Mapped;
use crate::db::DbError;

impl Mapped {
    /// Whether timeoutd records payments in the shop's tables (the profile has `[paid]`).
    pub fn records_payments(&self) -> bool {
        self.profile.paid.is_some()
    }

    /// Records the payment of `id`, made at `paid_at_ms`, at `now_ms` (epoch ms): `status`
    /// pending → `paid.status` where still pending and live, `paid.time` stamped with
    /// `paid_at_ms` and `orders.modified` with `now_ms`, `paid.set` written; then, with
    /// `paid.stock`, each SKU of its lines (in SKU order, as a group close takes them) lowers
    /// that column and `stock.column` by the lines' units. Returns
    /// false when the order was no longer pending (closed or paid first) or is soft-deleted,
    /// or `id` cannot be one of its ids.
    ///
    /// # Errors
    /// [`DbError::Config`] when the profile has no `[paid]` (the shop's payment service records
    /// its payments); [`DbError::BadRow`] naming the SKU when a line cannot be sold (either
    /// column would go below zero): the caller's transaction must roll back, as mall's own
    /// `paySuccess` fails; [`DbError::Sql`] on query failure.
    pub async fn pay(
        &self,
        conn: &mut AnyConnection,
        id: &str,
        paid_at_ms: i64,
        now_ms: i64,
    ) -> Result<bool, DbError> {
        let Some(paid) = &self.profile.paid else {
            return Err(DbError::Config(format!(
                "order `{id}` is in the shop's own tables (schema profile `{}`), whose payments \
                 the shop's payment service records: add `[paid]` to the profile to let timeoutd \
                 record them",
                self.name()
            )));
        };
        let Some(key) = self.id_bind(id) else {
            return Ok(false);
        };
        let o = &self.profile.orders;
        let mut s = self.stmt(format!(
            "UPDATE {} a SET {} = ",
            self.orders,
            self.quote(&o.status)
        ));
        s.bind(&paid.status);
        let stamps = paid.time.iter().map(|c| (c, paid_at_ms));
        for (stamp, at_ms) in stamps.chain(o.modified.iter().map(|c| (c, now_ms))) {
            s.push(&format!(", {} = ", self.quote(stamp)));
            self.bind_time(&mut s, at_ms);
        }
        for (column, value) in &paid.set {
            s.push(&format!(", {} = ", self.quote(column))).bind(value);
        }
        s.push(&format!(" WHERE {} = ", self.col(&o.id)))
            .bind(key.clone());
        self.pending(&mut s);
        if s.query().execute(&mut *conn).await?.rows_affected() != 1 {
            return Ok(false);
        }
        let Some(sold) = &paid.stock else {
            return Ok(true);
        };
        let i = &self.profile.items;
        let mut lines = self.stmt(format!(
            "SELECT {} AS sku, {} AS quantity FROM {} a WHERE {} = ",
            self.text(&self.col(&i.sku)),
            self.int(&self.col(&i.quantity)),
            self.items,
            self.col(&i.order),
        ));
        lines.bind(key);
        // Units per SKU, sold in SKU order: the order a group close takes the same stock rows
        // in (`lock_order::units_per_sku`), so a payment and a close never wait on each other in a
        // circle.
        let mut sold_lines: Vec<(String, i64)> = Vec::new();
        for line in lines.query().fetch_all(&mut *conn).await? {
            let sku: Option<String> = line.try_get("sku")?;
            let units: i64 = line.try_get::<Option<i64>, _>("quantity")?.unwrap_or(0);
            sold_lines.push((sku.unwrap_or_default(), units));
        }
        let per_sku =
            crate::db::lock_order::units_per_sku(sold_lines.iter().map(|(s, u)| (s.as_str(), *u)));
        let st = &self.profile.stock;
        let sku_type = &self.key_types(conn).await?.sku;
        let (set_lock, set_sold) = (self.quote(&st.column), self.quote(sold));
        let (lock, sold) = (self.col(&st.column), self.col(sold));
        for (sku, units) in per_sku {
            let mut s = self.stmt(format!(
                "UPDATE {} a SET {set_lock} = COALESCE({lock}, 0) - ",
                self.stock
            ));
            s.bind(units)
                .push(&format!(", {set_sold} = COALESCE({sold}, 0) - "))
                .bind(units)
                .push(&format!(" WHERE {} = ", self.col(&st.sku)));
            s.bind_as(sku, sku_type);
            s.push(&format!(" AND COALESCE({lock}, 0) >= "))
                .bind(units)
                .push(&format!(" AND COALESCE({sold}, 0) >= "))
                .bind(units);
            if s.query().execute(&mut *conn).await?.rows_affected() != 1 {
                return Err(DbError::BadRow {
                    table: "stock (schema profile)",
                    detail: format!(
                        "order `{id}` was paid, but SKU `{sku}` cannot sell {units} units: its \
                         `{}` or `{}` holds fewer (or there is no such row); nothing recorded",
                        st.column,
                        paid.stock.as_deref().unwrap_or_default()
                    ),
                });
            }
        }
        Ok(true)
    }
}
