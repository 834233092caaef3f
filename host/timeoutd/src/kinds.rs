//! Every kind of `effect_ledger` row, and where each is carried out: the one table the close,
//! the executor, the admin API and the config warnings read.
//!
//! A plugin's effect kinds come from [`EffectKind`] (the runtime's table); the host adds three
//! of its own, the reminder of a `wait` ([`LedgerKind::Remind`]), the refund of a payment
//! that landed after its close ([`LedgerKind::Refund`]) and, on a shop's schema, the points a
//! closed order spent ([`LedgerKind::ReturnPoints`]). [`home`] is an exhaustive match: a
//! new kind does not compile until it is given a home, and its executor (or the close
//! transaction) is then the one place that carries it out.

use timeoutd_runtime::model::EffectKind;

/// One kind of ledger row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LedgerKind {
    /// An effect a plugin asked for.
    Effect(EffectKind),
    /// The reminder sent with a `wait` (`remind`); its payload is a notice.
    Remind,
    /// The refund of a payment that succeeded after its order closed (`refund-payment`); its
    /// payload is `{"kind": "refund-payment", "payment_ref": "…"}`.
    Refund,
    /// The points a closed order spent, given back to its buyer on a shop's schema with
    /// `[points]` (`return-points`, what mall's own cancel does); its payload is
    /// `{"kind": "return-points", "member": "…", "points": N}`. Bounded by the order: the
    /// amount is read from the order row under the close's lock, never from a plugin.
    ReturnPoints,
}

/// Where rows of a kind are carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Home {
    /// Inside the close transaction, beside the compare-and-set (`db::orders`): recorded DONE
    /// (or FAILED, with the reason) when the order closes, never run again.
    CloseTransaction,
    /// By the ledger executor after the commit, with retries: the executor for this section.
    Executor(Section),
}

/// The executor a ledger row needs, named by the config section that sets it up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Section {
    /// Notices and reminders (`[notify]`, always present: the `log` channel exists unset).
    Notify,
    /// The Redis flash-sale effects (`[redis]`).
    Redis,
    /// Payment close and refunds (`[payment]`).
    Payment,
}

impl Section {
    /// Every section (a new one is added here and in `as_str`'s match).
    pub const ALL: [Section; 3] = [Section::Notify, Section::Redis, Section::Payment];

    /// The config section's name, as in `[redis]`.
    pub fn as_str(self) -> &'static str {
        match self {
            Section::Notify => "notify",
            Section::Redis => "redis",
            Section::Payment => "payment",
        }
    }
}

/// Where `kind` is carried out. The one place this rule lives.
pub fn home(kind: LedgerKind) -> Home {
    use EffectKind as E;
    match kind {
        LedgerKind::Effect(E::RestoreStock | E::ReleaseCoupon) | LedgerKind::ReturnPoints => {
            Home::CloseTransaction
        }
        LedgerKind::Effect(E::RestoreFlashStock | E::ReleaseFlashSlot) => {
            Home::Executor(Section::Redis)
        }
        LedgerKind::Effect(E::ClosePayment) | LedgerKind::Refund => {
            Home::Executor(Section::Payment)
        }
        LedgerKind::Effect(E::Notify) | LedgerKind::Remind => Home::Executor(Section::Notify),
    }
}

impl LedgerKind {
    /// Every ledger kind: the plugin's, then the host's own.
    pub fn all() -> impl Iterator<Item = LedgerKind> {
        EffectKind::ALL
            .iter()
            .copied()
            .map(LedgerKind::Effect)
            .chain([
                LedgerKind::Remind,
                LedgerKind::Refund,
                LedgerKind::ReturnPoints,
            ])
    }

    /// The name stored in `effect_ledger.kind`.
    pub const fn as_str(self) -> &'static str {
        match self {
            LedgerKind::Effect(kind) => kind.as_str(),
            LedgerKind::Remind => "remind",
            LedgerKind::Refund => "refund-payment",
            LedgerKind::ReturnPoints => "return-points",
        }
    }

    /// The kind stored as `name`; `None` for a name no kind has.
    pub fn parse(name: &str) -> Option<Self> {
        Self::all().find(|k| k.as_str() == name)
    }

    /// Where this kind is carried out ([`home`]).
    pub fn home(self) -> Home {
        home(self)
    }

    /// Whether the ledger executor carries it out (after the commit), rather than the close
    /// transaction.
    pub fn is_external(self) -> bool {
        matches!(self.home(), Home::Executor(_))
    }
}

/// What is wrong with `name` as the name of a cap per effect kind and channel (`[caps]`,
/// `effects::caps`): `None` for `notify`, `notify.<channel>`, `redis` and `payment`, else the
/// message saying which names there are.
pub fn cap_name_problem(name: &str) -> Option<String> {
    match name.split_once('.') {
        None if ["notify", "redis", "payment"].contains(&name) => None,
        Some(("notify", channel)) if !channel.is_empty() => None,
        _ => Some(format!(
            "`{name}` is no cap: use `notify`, `notify.<channel>`, `redis` or `payment`"
        )),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_named_caps_are_caps() {
        for good in ["notify", "notify.sms", "redis", "payment"] {
            assert_eq!(super::cap_name_problem(good), None, "{good}");
        }
        for bad in ["notify.", "sms", "payment.stripe", "redis.x", ""] {
            let problem = super::cap_name_problem(bad).unwrap();
            assert!(problem.contains(&format!("`{bad}`")), "{bad}: {problem}");
        }
    }

    use super::*;

    #[test]
    fn every_kind_has_a_distinct_name_that_parses_back() {
        let names: Vec<&str> = LedgerKind::all().map(LedgerKind::as_str).collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        for kind in LedgerKind::all() {
            assert_eq!(LedgerKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(LedgerKind::parse("mint-stock"), None);
    }

    #[test]
    fn only_stock_coupons_and_points_are_applied_in_the_close_transaction() {
        let inside: Vec<&str> = LedgerKind::all()
            .filter(|k| !k.is_external())
            .map(LedgerKind::as_str)
            .collect();
        assert_eq!(inside, ["restore-stock", "release-coupon", "return-points"]);
        assert_eq!(LedgerKind::Refund.home(), Home::Executor(Section::Payment));
        assert_eq!(LedgerKind::Remind.home(), Home::Executor(Section::Notify));
    }
}
