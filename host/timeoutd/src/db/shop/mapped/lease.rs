//! Payment leases of orders in the shop's own tables (seed 002's aggregated payment on a
//! schema profile). A shop's order table has no column for a lease, so the lease lives in
//! timeoutd's own `payment_leases` (migration 13), keyed by the order's id as text.
//!
//! One rule makes a lease and a close exclusive: **both hold the shop's order row locked while
//! they look at the lease.**
//! - A payment attempt locks the order row (`FOR UPDATE`), checks it is pending, live and not
//!   past its deadline, and only then writes the lease, in one transaction.
//! - A close locks its orders' rows first ([`Mapped::lock_pending`]), then reads their leases
//!   with a *locking* read (`LOCK IN SHARE MODE`, PostgreSQL's `FOR SHARE`), which reads the
//!   latest committed row whatever the isolation level. timeoutd's sessions run at READ
//!   COMMITTED, where a plain read started after the row lock would see the lease too; at
//!   REPEATABLE READ (a server or pooler that resets the session) a plain read would use the
//!   snapshot InnoDB took at the transaction's first plain read, before the close waited for
//!   the row lock, and miss a lease committed during that wait.
//!
//! A lease taken first keeps the order open until it lapses (the close is deferred to then);
//! a close taken first makes the attempt find the order closed and refuse.

use std::collections::HashMap;

use sqlx::{AnyConnection, Row};
use timeoutd_runtime::model::OrderStatus;

use super::{Bind, Mapped};
use crate::db::{Backend, DbError};

/// What a payment attempt found on a shop's order ([`Mapped::take_payment_lease`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// The order's status as the profile reads it.
    pub status: OrderStatus,
    /// Its deadline, epoch ms (created time plus the window, or the deadline column).
    pub deadline_ms: i64,
    /// When the lease now held lapses (epoch ms); `None` when the attempt was refused (the
    /// order is not pending, or its deadline has passed).
    pub held_until_ms: Option<i64>,
}

impl Mapped {
    /// A payment attempt on `id` at `now_ms`: when the order is pending, live and not past its
    /// deadline, holds it until `until_ms` (a live lease is extended, never shortened). Locks
    /// the shop's order row for the caller's transaction, which must commit for the lease to
    /// hold. `None` when there is no such live order (or `id` cannot be one of its ids).
    ///
    /// # Errors
    /// [`DbError::BadRow`] for an order row the profile cannot read; [`DbError::Sql`] on query
    /// failure.
    pub async fn take_payment_lease(
        &self,
        conn: &mut AnyConnection,
        id: &str,
        now_ms: i64,
        until_ms: i64,
    ) -> Result<Option<Found>, DbError> {
        let Some(key) = self.id_bind(id) else {
            return Ok(None);
        };
        let window = self.window_ms(conn).await?;
        let mut s = self.stmt(format!(
            "SELECT {} FROM {} a WHERE {} = ",
            self.order_columns(),
            self.orders,
            self.col(&self.profile.orders.id)
        ));
        s.bind(key);
        self.live(&mut s);
        s.push(" FOR UPDATE");
        let Some(row) = s.query().fetch_optional(&mut *conn).await? else {
            return Ok(None);
        };
        let order = self.order_of(&row, window)?;
        let mut found = Found {
            status: order.status,
            deadline_ms: order.deadline_ms,
            held_until_ms: None,
        };
        if order.status != OrderStatus::Pending || order.deadline_ms <= now_ms {
            return Ok(Some(found));
        }
        let mut s =
            self.stmt("INSERT INTO payment_leases (order_id, until_ms) VALUES (".to_string());
        s.bind(Bind::Text(order.id.clone()))
            .push(", ")
            .bind(until_ms)
            .push(match self.backend {
                Backend::Postgres => {
                    ") ON CONFLICT (order_id) DO UPDATE SET until_ms = \
                     GREATEST(payment_leases.until_ms, EXCLUDED.until_ms)"
                }
                Backend::MySql | Backend::Sqlite => {
                    ") ON DUPLICATE KEY UPDATE until_ms = GREATEST(until_ms, VALUES(until_ms))"
                }
            });
        s.query().execute(&mut *conn).await?;
        let mut s = self.stmt("SELECT until_ms FROM payment_leases WHERE order_id = ".to_string());
        s.bind(Bind::Text(order.id));
        found.held_until_ms = Some(s.query().fetch_one(&mut *conn).await?.try_get(0)?);
        Ok(Some(found))
    }

    /// The leases among `ids` live at `now_ms`, with when each lapses (epoch ms), read with a
    /// locking read (`LOCK IN SHARE MODE`): call it with the orders' rows already locked, so a
    /// lease committed while the caller waited for those locks is seen (the module's rule).
    ///
    /// # Errors
    /// [`DbError::Sql`] on query failure.
    pub async fn locked_leases(
        &self,
        conn: &mut AnyConnection,
        ids: &[&str],
        now_ms: i64,
    ) -> Result<HashMap<String, i64>, DbError> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let mut s = self.stmt("SELECT order_id, until_ms FROM payment_leases WHERE order_id IN ");
        s.bind_list(ids.iter().map(|id| Bind::Text(id.to_string())));
        s.push(" AND until_ms > ").bind(now_ms);
        s.push(match self.backend {
            Backend::Postgres => " FOR SHARE",
            Backend::MySql | Backend::Sqlite => " LOCK IN SHARE MODE",
        });
        let rows = s.query().fetch_all(&mut *conn).await?;
        rows.iter()
            .map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<i64, _>(1)?)))
            .collect()
    }

    /// The pending, live orders among `ids` that a payment attempt holds at `now_ms`, with when
    /// each lease lapses (epoch ms): the closes they lost are deferred until then. A lease of
    /// an order paid or closed meanwhile is not one (its trigger has nothing left to do).
    ///
    /// # Errors
    /// [`DbError::Sql`] on query failure.
    pub async fn live_leases(
        &self,
        conn: &mut AnyConnection,
        ids: &[&str],
        now_ms: i64,
    ) -> Result<HashMap<String, i64>, DbError> {
        let mut leases = self.locked_leases(conn, ids, now_ms).await?;
        if leases.is_empty() {
            return Ok(leases);
        }
        let held: Vec<&str> = leases.keys().map(String::as_str).collect();
        let mut s = self.stmt(format!(
            "SELECT {} FROM {} a WHERE 1 = 1",
            self.id_text(),
            self.orders
        ));
        self.id_in(&mut s, &held);
        self.pending(&mut s);
        let pending: Vec<String> = s
            .query()
            .fetch_all(&mut *conn)
            .await?
            .iter()
            .map(|r| r.try_get::<String, _>(0))
            .collect::<Result<_, _>>()?;
        leases.retain(|id, _| pending.contains(id));
        Ok(leases)
    }
}
