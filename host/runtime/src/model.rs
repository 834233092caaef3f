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
    /// What the previous `wait` returned as its state; empty at phase 0 (API 0.2.0 on; a 0.1.0
    /// plugin never sees it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state: Vec<u8>,
    /// The payment as the host last knew it; `None` without a payment reference (API 0.2.0 on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment: Option<Payment>,
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

/// Declares [`EffectKind`] and its list from one table, so the list cannot miss a kind.
macro_rules! effect_kinds {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)*) => {
        /// The kind of an [`Effect`], without its arguments: what `granted_effects` lists, what
        /// `effect_ledger.kind` stores, what the harness's `effect_kinds` expects.
        ///
        /// This table is the one list of kinds. The guard, the config's validation, the
        /// harness and the fallback derive theirs from [`EffectKind::ALL`]; where each kind is
        /// carried out is the daemon's `effects::home` (an exhaustive match, so a new kind does
        /// not compile until it has a home).
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
        )]
        #[serde(rename_all = "kebab-case")]
        pub enum EffectKind {
            $($(#[$doc])* $variant,)*
        }

        impl EffectKind {
            /// Every kind, in declaration order.
            pub const ALL: &'static [EffectKind] = &[$(EffectKind::$variant,)*];

            /// The kebab-case name (`restore-stock`, …).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(EffectKind::$variant => $name,)*
                }
            }
        }
    };
}

effect_kinds! {
    /// [`Effect::RestoreStock`].
    RestoreStock = "restore-stock",
    /// [`Effect::ReleaseCoupon`].
    ReleaseCoupon = "release-coupon",
    /// [`Effect::RestoreFlashStock`].
    RestoreFlashStock = "restore-flash-stock",
    /// [`Effect::ReleaseFlashSlot`].
    ReleaseFlashSlot = "release-flash-slot",
    /// [`Effect::ClosePayment`].
    ClosePayment = "close-payment",
    /// [`Effect::Notify`].
    Notify = "notify",
}

impl EffectKind {
    /// The kind named `name`; `None` for a name no kind has.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|k| k.as_str() == name)
    }

    /// Every kind's name, comma-separated, for error messages (`restore-stock, …, notify`).
    pub fn names() -> String {
        Self::ALL
            .iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl std::fmt::Display for EffectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Effect {
    /// The effect's kind; `kind().as_str()` is what `effect_ledger.kind` stores.
    pub fn kind(&self) -> EffectKind {
        match self {
            Effect::RestoreStock { .. } => EffectKind::RestoreStock,
            Effect::RestoreFlashStock { .. } => EffectKind::RestoreFlashStock,
            Effect::ReleaseFlashSlot { .. } => EffectKind::ReleaseFlashSlot,
            Effect::ReleaseCoupon { .. } => EffectKind::ReleaseCoupon,
            Effect::ClosePayment { .. } => EffectKind::ClosePayment,
            Effect::Notify(_) => EffectKind::Notify,
        }
    }

    /// Everything `order` holds, given back: each line's stock, its coupon, its flash-sale
    /// units (the sum of its lines) and the buyer's slot when it is in an activity, and its
    /// payment closed. What the built-in fallback policy does at the deadline, and the
    /// reference for the SDK's `release_everything` (a test holds the two together). No
    /// notice: which channel to tell the buyer on is the merchant's choice.
    pub fn release_everything(order: &Order) -> Vec<Effect> {
        let mut effects = Vec::new();
        for kind in EffectKind::ALL {
            // Exhaustive, so a new kind is placed here (or deliberately left out) when added.
            match kind {
                EffectKind::RestoreStock => {
                    effects.extend(order.items.iter().map(|i| Effect::RestoreStock {
                        sku: i.sku.clone(),
                        quantity: i.quantity,
                    }))
                }
                EffectKind::ReleaseCoupon => effects.extend(
                    order
                        .coupon
                        .iter()
                        .map(|c| Effect::ReleaseCoupon { coupon: c.clone() }),
                ),
                EffectKind::RestoreFlashStock => effects.extend(order.flash_activity.iter().map(
                    |a| Effect::RestoreFlashStock {
                        activity: a.clone(),
                        quantity: order.items.iter().map(|i| i.quantity).sum(),
                    },
                )),
                EffectKind::ReleaseFlashSlot => effects.extend(order.flash_activity.iter().map(
                    |a| Effect::ReleaseFlashSlot {
                        activity: a.clone(),
                        user: order.user.clone(),
                    },
                )),
                EffectKind::ClosePayment => {
                    effects.extend(order.payment_ref.iter().map(|p| Effect::ClosePayment {
                        payment_ref: p.clone(),
                    }))
                }
                EffectKind::Notify => {}
            }
        }
        effects
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
        /// Handed back as the next phase's `Context::state` (API 0.2.0 on; at most
        /// [`crate::guard::MAX_STATE_BYTES`]).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        state: Vec<u8>,
        /// Asks the host to query the payment provider before the next phase (API 0.2.0 on).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        poll_payment: bool,
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

/// Severity of a plugin's `log` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LogLevel {
    /// Finest detail.
    Trace,
    /// Detail.
    Debug,
    /// Normal.
    Info,
    /// Something looks wrong.
    Warn,
    /// Something is wrong.
    Error,
}

/// What the payment provider last said about an order's payment (API 0.2.0 on).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PaymentStatus {
    /// Not asked yet, or the answer is not known.
    #[default]
    Unknown,
    /// Opened, not paid.
    Unpaid,
    /// Paid at the provider.
    Paid,
    /// Closed at the provider.
    Closed,
    /// The provider has no such payment.
    NotFound,
}

/// An order's payment as the host last knew it (API 0.2.0 on).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Payment {
    /// The provider's last answer.
    pub status: PaymentStatus,
    /// When the host asked, epoch ms (database clock); `None` when it never did.
    pub queried_at_ms: Option<i64>,
    /// When the buyer paid, epoch ms; only when paid.
    pub paid_at_ms: Option<i64>,
    /// What the buyer paid, cents; only when paid.
    pub paid_cents: Option<i64>,
}

/// The type of a setting's value, as written in the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SettingType {
    /// A duration with a unit: `90s`, `10m`, `1h`, `500ms`.
    Duration,
    /// A whole number.
    Integer,
    /// An amount in cents, a whole number.
    Cents,
    /// `true` or `false`.
    Boolean,
    /// Any text.
    Text,
}

impl SettingType {
    /// The name used in messages (`duration`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            SettingType::Duration => "duration",
            SettingType::Integer => "integer",
            SettingType::Cents => "cents",
            SettingType::Boolean => "boolean",
            SettingType::Text => "text",
        }
    }

    /// Checks `value` against this type.
    ///
    /// # Errors
    /// What is wrong, e.g. ``"15" has no unit (write it as `15m`, `900s` or `900000ms`)``.
    pub fn check(self, value: &str) -> Result<(), String> {
        match self {
            SettingType::Duration => crate::duration::parse_ms(value).map(drop),
            SettingType::Integer | SettingType::Cents => value
                .trim()
                .parse::<i64>()
                .map(drop)
                .map_err(|_| format!("`{value}` is not a whole number")),
            SettingType::Boolean => match value.trim() {
                "true" | "false" => Ok(()),
                _ => Err(format!("`{value}` is not `true` or `false`")),
            },
            SettingType::Text => Ok(()),
        }
    }
}

/// One setting a plugin reads (API 0.2.0 on).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SettingSpec {
    /// Key, as in `[merchants.<id>.settings]`.
    pub name: String,
    /// Type of its value.
    pub value_type: SettingType,
    /// The value used when unset; `None` when the setting is required.
    pub default: Option<String>,
    /// What it means, with its unit.
    pub doc: String,
}

/// What a plugin declares about itself (`describe`, API 0.2.0 on): the effect kinds its
/// decisions may hold and the settings it reads.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Manifest {
    /// Every effect kind it may ask for (a reminder counts as `notify`).
    pub effects: Vec<EffectKind>,
    /// Every setting it reads.
    pub settings: Vec<SettingSpec>,
}

impl Manifest {
    /// Checks the manifest against a merchant's config: every declared kind is in `granted`
    /// (when the merchant narrows its grants), every required setting is set, every set value
    /// has its declared type, and no setting is set that the plugin does not read.
    ///
    /// # Errors
    /// Every problem, each naming the setting or kind, e.g. `settings.grace: "ten" is not a
    /// duration: …` or `granted_effects: the plugin may ask for close-payment, not granted`.
    pub fn check_config(
        &self,
        granted: Option<&[String]>,
        settings: &[(String, String)],
    ) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        if let Some(granted) = granted {
            let missing: Vec<&str> = self
                .effects
                .iter()
                .map(|k| k.as_str())
                .filter(|k| !granted.iter().any(|g| g == k))
                .collect();
            if !missing.is_empty() {
                problems.push(format!(
                    "granted_effects: the plugin declares it may ask for {}, which the merchant \
                     does not grant (grant them, or use a plugin that does not ask for them)",
                    missing.join(", ")
                ));
            }
        }
        for spec in &self.settings {
            match settings.iter().find(|(k, _)| *k == spec.name) {
                Some((_, value)) => {
                    if let Err(e) = spec.value_type.check(value) {
                        problems.push(format!(
                            "settings.{}: {e} (the plugin reads it as a {}: {})",
                            spec.name,
                            spec.value_type.as_str(),
                            spec.doc
                        ));
                    }
                }
                None if spec.default.is_none() => problems.push(format!(
                    "settings.{}: required by the plugin ({}: {})",
                    spec.name,
                    spec.value_type.as_str(),
                    spec.doc
                )),
                None => {}
            }
        }
        for (key, _) in settings {
            if !self.settings.iter().any(|s| s.name == *key) {
                let known: Vec<&str> = self.settings.iter().map(|s| s.name.as_str()).collect();
                problems.push(format!(
                    "settings.{key}: the plugin does not read this setting (it reads: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}
