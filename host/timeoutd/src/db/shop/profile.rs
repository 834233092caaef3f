//! The schema profile file: where each thing a close needs lives in a shop's own tables, and in
//! what form. `config/profiles/mall.toml` is the worked example (macrozheng/mall); the field
//! docs below are the reference. Every name is a table or column, checked to be a plain SQL
//! identifier (letters, digits, `_`), and quoted when used: no value is ever spliced into a
//! statement, values are bound.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::convert::{MoneyForm, TimeForm};

/// A whole profile file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Name in logs, `doctor` and metrics (`mall`).
    pub name: String,
    /// The order table.
    pub orders: OrdersTable,
    /// How `orders.created` (and a deadline column) hold time.
    pub time: TimeSpec,
    /// How `orders.total` and `items.unit_price` hold money.
    pub money: MoneySpec,
    /// When an order's payment window lapses.
    pub deadline: DeadlineSpec,
    /// The order lines.
    pub items: ItemsTable,
    /// Where `restore-stock` gives units back.
    pub stock: StockTable,
    /// Where `release-coupon` frees a coupon; without it a `release-coupon` is refused at
    /// validation.
    #[serde(default)]
    pub coupon: Option<CouponTable>,
    /// Where the points an order spent go back on close (`orders.points`).
    #[serde(default)]
    pub points: Option<PointsTable>,
    /// How a payment timeoutd learns of (a provider's notice, the paid topic, alignment by
    /// query) is recorded in the shop's tables. Without it those payments are left to the
    /// shop's own payment service: notices are refused naming the profile.
    #[serde(default)]
    pub paid: Option<PaidTransition>,
}

/// A status value as the shop stores it: a number (`0`) or a string (`"WAIT_PAY"`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum StatusValue {
    /// An integer status.
    Int(i64),
    /// A string status.
    Text(String),
}

impl StatusValue {
    /// The value as the server prints it when cast to text (how statuses are read back).
    pub fn as_text(&self) -> String {
        match self {
            StatusValue::Int(n) => n.to_string(),
            StatusValue::Text(s) => s.clone(),
        }
    }
}

/// `[orders]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrdersTable {
    /// Table name (`oms_order`).
    pub table: String,
    /// Primary key column.
    pub id: String,
    /// `"bigint"` (ids are integers; a trigger's id is read as a decimal integer) or `"text"`.
    #[serde(default)]
    pub id_type: IdType,
    /// The buyer's column (`member_id`), also the key of the coupon holder and the points row.
    pub user: String,
    /// Where the merchant comes from.
    pub merchant: MerchantSpec,
    /// Status column.
    pub status: String,
    /// Values meaning "created, not paid": the only ones a close moves from.
    pub pending: Vec<StatusValue>,
    /// Values meaning paid (and anything after it: shipped, done).
    pub paid: Vec<StatusValue>,
    /// The value a close writes. Any status in none of the three sets (mall's 5, "invalid")
    /// reads as closed: not pending, never closed again.
    pub closed: StatusValue,
    /// When the order was created.
    pub created: String,
    /// The amount due (`pay_amount`).
    pub total: String,
    /// The coupon the order used, if the shop has coupons.
    #[serde(default)]
    pub coupon: Option<String>,
    /// Points the order spent (`use_integration`), returned on close through `[points]`.
    #[serde(default)]
    pub points: Option<String>,
    /// The provider's reference for the payment (`order_sn`: mall's `out_trade_no`).
    #[serde(default)]
    pub payment_ref: Option<String>,
    /// A column the close stamps with its time, in `[time]`'s form (`modify_time`).
    #[serde(default)]
    pub modified: Option<String>,
    /// Rows hidden from the shop (soft-deleted) are never read or closed.
    #[serde(default)]
    pub soft_delete: Option<SoftDelete>,
}

/// `orders.id_type`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdType {
    /// `BIGINT`: ids are bound as integers.
    #[default]
    Bigint,
    /// `VARCHAR` / `TEXT`.
    Text,
}

/// `orders.merchant`: `{ column = "shop_id" }` or `{ fixed = "mall" }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum MerchantSpec {
    /// Read from this column (cast to text).
    Column(String),
    /// Every order of this database belongs to this merchant.
    Fixed(String),
}

/// `orders.soft_delete`: only rows whose `column` equals `live` exist.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SoftDelete {
    /// The flag column (`delete_status`).
    pub column: String,
    /// Its value on a live row (`0`).
    pub live: StatusValue,
}

/// `[time]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeSpec {
    /// `"datetime"` (a wall time in `zone`), `"epoch_s"` or `"epoch_ms"`.
    #[serde(rename = "type")]
    pub kind: TimeKind,
    /// IANA zone of a `datetime` (`Asia/Shanghai`); required for it.
    #[serde(default)]
    pub zone: Option<String>,
}

/// `time.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TimeKind {
    /// `DATETIME` / `TIMESTAMP WITHOUT TIME ZONE` in `time.zone`.
    Datetime,
    /// Epoch seconds.
    EpochS,
    /// Epoch milliseconds.
    EpochMs,
}

/// `[money]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoneySpec {
    /// `"decimal_yuan"` (`DECIMAL(10,2)` in main units) or `"cents"`.
    #[serde(rename = "type")]
    pub kind: MoneyKind,
}

/// `money.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MoneyKind {
    /// Decimal main units (yuan).
    DecimalYuan,
    /// Integer cents.
    Cents,
}

/// `[deadline]`: exactly one of `column`, `window`, `settings`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadlineSpec {
    /// A column of the order holding its deadline, in `[time]`'s form.
    #[serde(default)]
    pub column: Option<String>,
    /// A fixed window after `orders.created` (`"30m"`).
    #[serde(default)]
    pub window: Option<String>,
    /// A window after `orders.created` read from a settings row (mall's
    /// `oms_order_setting.normal_order_overtime`, minutes), read again by every close and sweep,
    /// so a change of the setting applies at once.
    #[serde(default)]
    pub settings: Option<SettingsWindow>,
}

/// `deadline.settings`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingsWindow {
    /// Settings table (`oms_order_setting`).
    pub table: String,
    /// Column holding the window (`normal_order_overtime`).
    pub column: String,
    /// Its unit: `"seconds"`, `"minutes"` or `"hours"`.
    pub unit: WindowUnit,
    /// Key column of the settings row (`id`).
    pub key: String,
    /// Key of the row to read (`1`).
    pub key_value: StatusValue,
}

/// `deadline.settings.unit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WindowUnit {
    /// Seconds.
    Seconds,
    /// Minutes.
    Minutes,
    /// Hours.
    Hours,
}

impl WindowUnit {
    /// Milliseconds in one unit.
    pub fn ms(self) -> i64 {
        match self {
            WindowUnit::Seconds => 1_000,
            WindowUnit::Minutes => 60_000,
            WindowUnit::Hours => 3_600_000,
        }
    }
}

/// `[items]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ItemsTable {
    /// Table (`oms_order_item`).
    pub table: String,
    /// Column holding the order's id.
    pub order: String,
    /// The SKU, matching `stock.sku` (`product_sku_id`).
    pub sku: String,
    /// Units.
    pub quantity: String,
    /// Price of one unit, in `[money]`'s form.
    pub unit_price: String,
    /// Column giving the lines a stable order (`id`).
    pub line: String,
}

/// `[stock]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StockTable {
    /// Table (`pms_sku_stock`).
    pub table: String,
    /// Key column the lines' `sku` names (`id`).
    pub sku: String,
    /// The column a close changes (`lock_stock`, or `available`).
    pub column: String,
    /// What a close does to it.
    pub release: StockRelease,
}

/// `stock.release`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StockRelease {
    /// The order held units in a lock column: `column - units`, never below zero (mall's
    /// `releaseStockBySkuId`). A release that would go below zero changes nothing and its
    /// ledger row is FAILED, naming the SKU.
    Unlock,
    /// The order took units off an available column: `column + units`.
    Add,
}

/// `[coupon]`: a coupon is freed by moving the holder's first row of it from `locked` to
/// `available` (mall's `updateCouponStatus(couponId, memberId, 0)`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CouponTable {
    /// Table (`sms_coupon_history`).
    pub table: String,
    /// Its key column, giving "first" an order (`id`).
    pub row: String,
    /// The coupon's column, matching `orders.coupon`.
    pub coupon: String,
    /// The holder's column, matching `orders.user`.
    pub holder: String,
    /// Status column (`use_status`).
    pub status: String,
    /// Value while the order holds it (`1`, used).
    pub locked: StatusValue,
    /// Value a close writes (`0`, unused).
    pub available: StatusValue,
}

/// `[points]`: the points an order spent go back to its buyer (`column + orders.points`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PointsTable {
    /// Table (`ums_member`).
    pub table: String,
    /// Key column, matching `orders.user` (`id`).
    pub member: String,
    /// Balance column (`integration`).
    pub column: String,
}

/// `[paid]`: a payment as the shop's own payment service records it, for a shop whose payment
/// is a status change plus (optionally) its locked units sold (mall's
/// `OmsPortalOrderServiceImpl.paySuccess`: status 0 → 1, `payment_time`, `pay_type`, then
/// `reduceSkuStock`). Applied as one compare-and-set from a pending status, in the transaction
/// that records the notice, so a payment and a close can never both win.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaidTransition {
    /// The status a payment writes; one of `orders.paid` (mall: `1`).
    pub status: StatusValue,
    /// A column stamped with the payment's time, in `[time]`'s form (mall: `payment_time`).
    /// `orders.modified` is stamped too, when set.
    #[serde(default)]
    pub time: Option<String>,
    /// Order columns set to fixed values (mall: `{ pay_type = 1 }`, Alipay).
    #[serde(default)]
    pub set: std::collections::BTreeMap<String, StatusValue>,
    /// The on-hand column of `[stock]` that a payment sells the order's units from: each line
    /// lowers it and `stock.column` (the lock) by its units, neither below zero (mall:
    /// `stock`, with `lock_stock`). Only with `stock.release = "unlock"`. A line that cannot be
    /// sold fails the whole payment, nothing written, as mall's own `paySuccess` does.
    #[serde(default)]
    pub stock: Option<String>,
}

/// How the deadline is found, checked.
#[derive(Debug, Clone)]
pub enum Deadline {
    /// A column.
    Column(String),
    /// A fixed window after creation, ms.
    Window(i64),
    /// A window read from a settings row.
    Settings(SettingsWindow),
}

impl Profile {
    /// Reads and checks a profile file.
    ///
    /// # Errors
    /// Every problem found, each naming the file and the key.
    pub fn load(path: &Path) -> Result<Profile, Vec<String>> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| vec![format!("schema profile {}: {e}", path.display())])?;
        let profile: Profile = toml::from_str(&text)
            .map_err(|e| vec![format!("schema profile {}: {e}", path.display())])?;
        let problems: Vec<String> = profile
            .problems()
            .into_iter()
            .map(|p| format!("schema profile {}: {p}", path.display()))
            .collect();
        if problems.is_empty() {
            Ok(profile)
        } else {
            Err(problems)
        }
    }

    /// Everything wrong with the profile, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (key, name) in self.identifiers() {
            if !is_identifier(name) {
                problems.push(format!(
                    "`{key}` = `{name}` is not a plain table or column name (letters, digits and _, \
                     not starting with a digit)"
                ));
            }
        }
        if self.orders.pending.is_empty() {
            problems.push("`orders.pending` lists no status: nothing could ever be closed".into());
        }
        let mut seen: Vec<(&str, &StatusValue)> = Vec::new();
        for (set, values) in [
            ("orders.pending", &self.orders.pending),
            ("orders.paid", &self.orders.paid),
            ("orders.closed", &vec![self.orders.closed.clone()]),
        ] {
            for v in values {
                if let Some((other, _)) = seen.iter().find(|(_, w)| *w == v) {
                    problems.push(format!(
                        "status `{}` is in both `{other}` and `{set}`",
                        v.as_text()
                    ));
                }
                seen.push((set, v));
            }
        }
        if let Err(e) = self.time_form() {
            problems.push(e);
        }
        if let Err(e) = self.deadline() {
            problems.push(e);
        }
        match (&self.orders.coupon, &self.coupon) {
            (Some(_), None) => problems.push(
                "`orders.coupon` is set but there is no `[coupon]` table to free it in".into(),
            ),
            (None, Some(_)) => {
                problems.push("`[coupon]` is set but `orders.coupon` names no column".into())
            }
            _ => {}
        }
        match (&self.orders.points, &self.points) {
            (Some(_), None) => problems.push(
                "`orders.points` is set but there is no `[points]` table to return them to".into(),
            ),
            (None, Some(_)) => {
                problems.push("`[points]` is set but `orders.points` names no column".into())
            }
            _ => {}
        }
        if let Some(paid) = &self.paid {
            if !self.orders.paid.contains(&paid.status) {
                problems.push(format!(
                    "`paid.status` = `{}` is not one of `orders.paid`: a payment must leave the \
                     order reading as paid",
                    paid.status.as_text()
                ));
            }
            if paid.stock.is_some() && self.stock.release != StockRelease::Unlock {
                problems.push(
                    "`paid.stock` sells locked units, but `stock.release` is not \"unlock\": \
                     an order of this shop holds no lock to sell from"
                        .into(),
                );
            }
            // A payment writes each of its columns once, and none the compare-and-set reads.
            let o = &self.orders;
            let mut guarded: Vec<(&str, &str)> =
                vec![("orders.id", &o.id), ("orders.status", &o.status)];
            guarded.extend(
                o.soft_delete
                    .as_ref()
                    .map(|d| ("orders.soft_delete.column", d.column.as_str())),
            );
            guarded.extend(o.modified.as_deref().map(|m| ("orders.modified", m)));
            let mut written: Vec<(String, &str)> = Vec::new();
            written.extend(paid.time.as_deref().map(|t| ("paid.time".to_string(), t)));
            written.extend(
                paid.set
                    .keys()
                    .map(|c| (format!("paid.set.{c}"), c.as_str())),
            );
            for (k, (key, column)) in written.iter().enumerate() {
                if let Some((other, _)) =
                    guarded.iter().find(|(_, g)| g.eq_ignore_ascii_case(column))
                {
                    problems.push(format!(
                        "`{key}` = `{column}` is `{other}`, which timeoutd writes or checks itself"
                    ));
                }
                if let Some((other, _)) = written[..k]
                    .iter()
                    .find(|(_, c)| c.eq_ignore_ascii_case(column))
                {
                    problems.push(format!("`{key}` = `{column}` is also `{other}`"));
                }
            }
            if let Some(sold) = &paid.stock
                && (sold.eq_ignore_ascii_case(&self.stock.column)
                    || sold.eq_ignore_ascii_case(&self.stock.sku))
            {
                problems.push(format!(
                    "`paid.stock` = `{sold}` must be the on-hand column, not `stock.column` (the \
                     lock) or `stock.sku`"
                ));
            }
        }
        problems
    }

    /// The profile's time form.
    ///
    /// # Errors
    /// A message naming `time.zone` when it is missing for a datetime or not an IANA zone.
    pub fn time_form(&self) -> Result<TimeForm, String> {
        match (self.time.kind, &self.time.zone) {
            (TimeKind::Datetime, Some(zone)) => zone
                .parse::<chrono_tz::Tz>()
                .map(TimeForm::Local)
                .map_err(|_| format!("`time.zone` = `{zone}` is not an IANA time zone (Asia/Shanghai, UTC)")),
            (TimeKind::Datetime, None) => Err(
                "`time.type = \"datetime\"` needs `time.zone`, the zone the shop writes its wall times in"
                    .into(),
            ),
            (TimeKind::EpochS, _) => Ok(TimeForm::EpochSeconds),
            (TimeKind::EpochMs, _) => Ok(TimeForm::EpochMillis),
        }
    }

    /// The profile's money form.
    pub fn money_form(&self) -> MoneyForm {
        match self.money.kind {
            MoneyKind::DecimalYuan => MoneyForm::DecimalYuan,
            MoneyKind::Cents => MoneyForm::Cents,
        }
    }

    /// How the deadline is found.
    ///
    /// # Errors
    /// A message when `[deadline]` names none or several ways, or a window that is not a
    /// positive duration.
    pub fn deadline(&self) -> Result<Deadline, String> {
        let d = &self.deadline;
        match (&d.column, &d.window, &d.settings) {
            (Some(c), None, None) => Ok(Deadline::Column(c.clone())),
            (None, Some(w), None) => match humantime::parse_duration(w.trim()) {
                Ok(window) if window > Duration::ZERO => {
                    Ok(Deadline::Window(window.as_millis() as i64))
                }
                _ => Err(format!(
                    "`deadline.window` = `{w}` is not a positive duration (15m, 30m, 2h)"
                )),
            },
            (None, None, Some(s)) => Ok(Deadline::Settings(s.clone())),
            _ => Err("`[deadline]` must set exactly one of `column`, `window`, `settings`".into()),
        }
    }

    /// Every table the profile names.
    pub fn tables(&self) -> Vec<&str> {
        let mut tables = vec![
            self.orders.table.as_str(),
            self.items.table.as_str(),
            self.stock.table.as_str(),
        ];
        tables.extend(self.coupon.as_ref().map(|c| c.table.as_str()));
        tables.extend(self.points.as_ref().map(|p| p.table.as_str()));
        tables.extend(self.deadline.settings.as_ref().map(|s| s.table.as_str()));
        tables
    }

    /// Every table and column name with its key.
    fn identifiers(&self) -> Vec<(String, &str)> {
        let o = &self.orders;
        let mut names: Vec<(String, &str)> = vec![
            ("orders.table".into(), &o.table),
            ("orders.id".into(), &o.id),
            ("orders.user".into(), &o.user),
            ("orders.status".into(), &o.status),
            ("orders.created".into(), &o.created),
            ("orders.total".into(), &o.total),
            ("items.table".into(), &self.items.table),
            ("items.order".into(), &self.items.order),
            ("items.sku".into(), &self.items.sku),
            ("items.quantity".into(), &self.items.quantity),
            ("items.unit_price".into(), &self.items.unit_price),
            ("items.line".into(), &self.items.line),
            ("stock.table".into(), &self.stock.table),
            ("stock.sku".into(), &self.stock.sku),
            ("stock.column".into(), &self.stock.column),
        ];
        let optional = [
            ("orders.coupon", &o.coupon),
            ("orders.points", &o.points),
            ("orders.payment_ref", &o.payment_ref),
            ("orders.modified", &o.modified),
            ("deadline.column", &self.deadline.column),
        ];
        for (key, name) in optional {
            if let Some(name) = name {
                names.push((key.into(), name));
            }
        }
        if let MerchantSpec::Column(c) = &o.merchant {
            names.push(("orders.merchant.column".into(), c));
        }
        if let Some(s) = &o.soft_delete {
            names.push(("orders.soft_delete.column".into(), &s.column));
        }
        if let Some(s) = &self.deadline.settings {
            names.push(("deadline.settings.table".into(), &s.table));
            names.push(("deadline.settings.column".into(), &s.column));
            names.push(("deadline.settings.key".into(), &s.key));
        }
        if let Some(c) = &self.coupon {
            for (k, v) in [
                ("table", &c.table),
                ("row", &c.row),
                ("coupon", &c.coupon),
                ("holder", &c.holder),
                ("status", &c.status),
            ] {
                names.push((format!("coupon.{k}"), v));
            }
        }
        if let Some(p) = &self.points {
            for (k, v) in [
                ("table", &p.table),
                ("member", &p.member),
                ("column", &p.column),
            ] {
                names.push((format!("points.{k}"), v));
            }
        }
        if let Some(paid) = &self.paid {
            names.extend(
                paid.time
                    .iter()
                    .map(|c| ("paid.time".to_string(), c.as_str())),
            );
            names.extend(
                paid.stock
                    .iter()
                    .map(|c| ("paid.stock".to_string(), c.as_str())),
            );
            for column in paid.set.keys() {
                names.push((format!("paid.set.{column}"), column));
            }
        }
        names
    }
}

/// Whether `name` is a plain SQL identifier: ASCII letters, digits and `_`, not starting with a
/// digit, at most 64 characters (MySQL's limit).
pub fn is_identifier(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mall() -> Profile {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/profiles/mall.toml");
        Profile::load(&path).unwrap()
    }

    #[test]
    fn the_shipped_mall_profile_is_clean() {
        let p = mall();
        assert_eq!(p.name, "mall");
        assert!(p.problems().is_empty(), "{:?}", p.problems());
        assert!(matches!(p.deadline(), Ok(Deadline::Settings(_))));
    }

    #[test]
    fn a_shop_table_named_like_one_of_timeoutds_needs_a_database_of_its_own() {
        use crate::db::Backend;
        use crate::db::shop::Mapped;
        let mut p = mall();
        p.orders.table = "orders".into();
        let refused = Mapped::compile(p.clone(), None, Backend::MySql).unwrap_err();
        assert!(
            refused[0].contains("the shop's table `orders` has the name of one of timeoutd's own"),
            "{refused:?}"
        );
        assert!(Mapped::compile(p, Some("shop"), Backend::MySql).is_ok());
        assert!(Mapped::compile(mall(), Some("shop"), Backend::Postgres).is_ok());
        let sqlite = Mapped::compile(mall(), Some("shop"), Backend::Sqlite).unwrap_err();
        assert!(
            sqlite[0].contains("MariaDB/MySQL or PostgreSQL; database.url is SQLite"),
            "{sqlite:?}"
        );
    }

    #[test]
    fn a_paid_transition_must_leave_the_order_paid_and_sell_only_locked_units() {
        let mut p = mall();
        let paid = p
            .paid
            .as_mut()
            .expect("the shipped profile records payments");
        paid.status = StatusValue::Int(4);
        paid.set.insert("pay type".into(), StatusValue::Int(1));
        paid.set.insert("status".into(), StatusValue::Int(0));
        paid.set.insert("payment_time".into(), StatusValue::Int(0));
        paid.stock = Some("lock_stock".into());
        p.stock.release = StockRelease::Add;
        let problems = p.problems().join("\n");
        for want in [
            "`paid.status` = `4` is not one of `orders.paid`",
            "`paid.stock` sells locked units, but `stock.release` is not \"unlock\"",
            "`paid.set.pay type` = `pay type` is not a plain table or column name",
            "`paid.set.status` = `status` is `orders.status`, which timeoutd writes or checks itself",
            "`paid.set.payment_time` = `payment_time` is also `paid.time`",
            "`paid.stock` = `lock_stock` must be the on-hand column",
        ] {
            assert!(problems.contains(want), "{want} missing from:\n{problems}");
        }
    }

    #[test]
    fn every_problem_is_named_with_its_key() {
        let mut p = mall();
        p.orders.table = "oms_order; DROP TABLE x".into();
        p.orders.paid.push(StatusValue::Int(0));
        p.time.zone = Some("Mars/Olympus".into());
        p.deadline.window = Some("15m".into());
        p.orders.points = None;
        let problems = p.problems().join("\n");
        for want in [
            "`orders.table`",
            "status `0` is in both `orders.pending` and `orders.paid`",
            "`time.zone` = `Mars/Olympus`",
            "exactly one of",
            "`[points]` is set but `orders.points`",
        ] {
            assert!(problems.contains(want), "{want} missing from:\n{problems}");
        }
    }
}
