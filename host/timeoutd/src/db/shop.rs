//! Whose tables hold the orders: timeoutd's own canonical tables, or a shop's existing order
//! database described by a schema profile (`[database.shop]`, `config/profiles/mall.toml`).
//!
//! [`Schema`] is carried by every [`super::Db`]; `db::orders` asks it which statements to run,
//! so the close path (`dispatch/close.rs`) stays one path whatever the tables look like:
//! - [`Schema::Canonical`]: `orders`, `order_items`, `sku_stock`, `coupons`, created by
//!   timeoutd's migrations (string statuses, epoch ms, cents, a `deadline_ms` column). The
//!   embedded default and the demo's, with its burst-tuned statements in `db::orders`.
//! - [`Schema::Mapped`]: the shop's own tables, read and written through a [`Profile`]
//!   ([`profile`]) compiled once into [`Mapped`] ([`mapped`]): ids `BIGINT` or strings, status
//!   values as sets, times as `DATETIME` in a named zone or epoch seconds/ms, money as `DECIMAL`
//!   yuan or cents, the deadline as a column or the created time plus a window (fixed, or read
//!   from a settings table), a soft-delete filter, and the merchant from a column or fixed.
//!
//! timeoutd never changes a shop table's definition: its migrations create only its own tables,
//! in the database `database.url` names; the profile's tables are addressed through
//! `[database.shop] database` (another database on the same MariaDB/MySQL server, or another
//! schema on PostgreSQL), so the close stays one local transaction across both.

pub mod check;
pub mod convert;
pub mod mapped;
pub mod profile;

use std::sync::Arc;

pub use mapped::Mapped;
pub use profile::Profile;

/// The order tables a database's orders live in.
#[derive(Debug, Clone, Default)]
pub enum Schema {
    /// timeoutd's own `orders`, `order_items`, `sku_stock`, `coupons`.
    #[default]
    Canonical,
    /// A shop's own tables, through a compiled profile.
    Mapped(Arc<Mapped>),
}

impl Schema {
    /// The profile, when the orders are a shop's own.
    pub fn mapped(&self) -> Option<&Mapped> {
        match self {
            Schema::Canonical => None,
            Schema::Mapped(m) => Some(m),
        }
    }

    /// The profile's name (`canonical` for timeoutd's own tables), for logs and `doctor`.
    pub fn name(&self) -> &str {
        match self {
            Schema::Canonical => "canonical",
            Schema::Mapped(m) => m.name(),
        }
    }
}

/// What a page of a bulk order operation reads (`db::views::open_orders_after`, and
/// [`Mapped::open_orders_after`] on a schema profile): every field but `limit` narrows, none
/// given is every PENDING order.
#[derive(Debug, Clone, Copy)]
pub struct OpenOrderQuery<'a> {
    /// The cursor: orders after this id, in the id order of the orders table (the shop's
    /// table's own order on a schema profile, numeric for a `BIGINT` id).
    pub after: Option<&'a str>,
    /// Only this merchant's orders.
    pub merchant: Option<&'a str>,
    /// Only these orders.
    pub ids: Option<&'a [&'a str]>,
    /// Only orders due at or after this time, epoch ms.
    pub deadline_from_ms: Option<i64>,
    /// Only orders due before this time, epoch ms.
    pub deadline_to_ms: Option<i64>,
    /// Orders read at most.
    pub limit: i64,
}
