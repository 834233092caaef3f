//! Version-independent shapes of what a plugin sees and answers.
//!
//! Every WIT version's bindings convert into and out of these types (see `bindings/`), so the
//! daemon never depends on one API version. Field meanings and units are those of
//! `wit/v0.1.0/policy.wit`: times are epoch milliseconds, amounts are cents.

use serde::{Deserialize, Serialize};

/// Lifecycle state of an order (`orders.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OrderStatus {
    /// Created and unpaid; the only state a close starts from.
    Pending,
    /// Paid.
    Paid,
    /// Closed by a timeout or an operator.
    Closed,
}

impl OrderStatus {
    /// The status as stored in the database: `PENDING`, `PAID` or `CLOSED`.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Pending => "PENDING",
            OrderStatus::Paid => "PAID",
            OrderStatus::Closed => "CLOSED",
        }
    }

    /// Parses a stored status; `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "PENDING" => Some(OrderStatus::Pending),
            "PAID" => Some(OrderStatus::Paid),
            "CLOSED" => Some(OrderStatus::Closed),
            _ => None,
        }
    }
}

/// One line of an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderItem {
    /// Stock-keeping unit.
    pub sku: String,
    /// Units the order locked.
    pub quantity: u32,
    /// Price of one unit, cents.
    pub unit_price_cents: i64,
}

/// An order as loaded from the database.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    /// Order id.
    pub id: String,
    /// Owning merchant.
    pub merchant: String,
    /// Buyer.
    pub user: String,
    /// Current status.
    pub status: OrderStatus,
    /// Creation time, epoch ms.
    pub created_at_ms: i64,
    /// End of the payment window, epoch ms.
    pub deadline_ms: i64,
    /// Total, cents.
    pub total_cents: i64,
    /// Lines, in a stable order.
    pub items: Vec<OrderItem>,
    /// Coupon locked by the order.
    pub coupon: Option<String>,
    /// Flash-sale activity.
    pub flash_activity: Option<String>,
    /// Payment reference at the provider.
    pub payment_ref: Option<String>,
}

/// What made the host ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TriggerKind {
    /// RocketMQ delay-level or timer message.
    DelayMessage,
    /// A due outbox row (`order_timeout_msg`).
    Outbox,
    /// The periodic sweep.
    Sweep,
    /// A transactional check-back.
    CheckBack,
    /// An operator.
    Manual,
}

impl TriggerKind {
    /// Kebab-case name, as stored in `decision_log.trigger_kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerKind::DelayMessage => "delay-message",
            TriggerKind::Outbox => "outbox",
            TriggerKind::Sweep => "sweep",
            TriggerKind::CheckBack => "check-back",
            TriggerKind::Manual => "manual",
        }
    }
}

/// The circumstances of one call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Context {
    /// Now, epoch ms, from the database clock. Also what the plugin's WASI wall clock reads.
    pub now_ms: i64,
    /// What made the host ask.
    pub trigger: TriggerKind,
    /// Phase being decided (0 first).
    pub phase: u32,
    /// Earlier attempts of this phase.
    pub attempt: u32,
    /// The merchant's settings, key/value, in config order.
    pub settings: Vec<(String, String)>,
}

/// A message for the buyer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notice {
    /// Sink name.
    pub channel: String,
    /// Template name.
    pub template: String,
    /// Template parameters.
    pub params: Vec<(String, String)>,
}

/// One side effect of a cancel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Effect {
    /// Return `quantity` units of `sku` to stock.
    RestoreStock {
        /// Stock-keeping unit.
        sku: String,
        /// Units.
        quantity: u32,
    },
    /// Return `quantity` units to a flash-sale activity's stock.
    RestoreFlashStock {
        /// Activity id.
        activity: String,
        /// Units.
        quantity: u32,
    },
    /// Free a buyer's slot in a flash-sale activity.
    ReleaseFlashSlot {
        /// Activity id.
        activity: String,
        /// Buyer.
        user: String,
    },
    /// Make a coupon available again.
    ReleaseCoupon {
        /// Coupon id.
        coupon: String,
    },
    /// Close the payment at the provider.
    ClosePayment {
        /// Payment reference.
        payment_ref: String,
    },
    /// Tell the buyer.
    Notify(Notice),
}

impl Effect {
    /// Kebab-case kind, as stored in `effect_ledger.kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Effect::RestoreStock { .. } => "restore-stock",
            Effect::RestoreFlashStock { .. } => "restore-flash-stock",
            Effect::ReleaseFlashSlot { .. } => "release-flash-slot",
            Effect::ReleaseCoupon { .. } => "release-coupon",
            Effect::ClosePayment { .. } => "close-payment",
            Effect::Notify(_) => "notify",
        }
    }
}

/// A plugin's answer to `decide`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision", rename_all = "kebab-case")]
pub enum Decision {
    /// Keep waiting `after_ms`, then decide `next_phase`; optionally remind now.
    Wait {
        /// Delay before the next call, ms.
        after_ms: u64,
        /// Next phase number.
        next_phase: u32,
        /// Reminder to send now.
        reminder: Option<Notice>,
    },
    /// Close the order with these effects.
    Cancel {
        /// Why.
        reason: String,
        /// Effects, in order.
        effects: Vec<Effect>,
    },
    /// Do nothing.
    Ignore {
        /// Why.
        reason: String,
    },
}

impl Decision {
    /// `wait`, `cancel` or `ignore`, as stored in `decision_log.decision`.
    pub fn kind(&self) -> &'static str {
        match self {
            Decision::Wait { .. } => "wait",
            Decision::Cancel { .. } => "cancel",
            Decision::Ignore { .. } => "ignore",
        }
    }
}

/// Why a plugin could not decide (the guest's domain error).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "error", rename_all = "kebab-case")]
pub enum PolicyError {
    /// A setting is missing or malformed.
    #[error("bad setting `{key}`: {problem}")]
    BadSetting {
        /// Setting key.
        key: String,
        /// What is wrong.
        problem: String,
    },
    /// The plugin cannot decide this order.
    #[error("unsupported order: {0}")]
    UnsupportedOrder(String),
    /// Anything else.
    #[error("internal plugin error: {0}")]
    Internal(String),
}

/// A plugin's answer to the transactional check-back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckVerdict {
    /// Commit the half message.
    Commit,
    /// Roll it back.
    Rollback,
    /// Ask again later.
    Unknown,
}
