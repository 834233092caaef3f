//! What a ledger row asks its executor to do, read once from its kind and payload.
//!
//! Every match here is exhaustive over the plugin's [`Effect`]s and the host's own kinds, and
//! each executor matches exhaustively over its section's work: a new kind of effect does not
//! compile until it is given a section here and an arm in that section's executor.

use serde::Deserialize;
use timeoutd_runtime::model::{Effect, Notice};

use super::{EffectError, Job};
use crate::kinds::LedgerKind;

/// The Redis flash-sale section's work (`[redis]`, `flash.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisWork {
    /// `quantity` units back to `activity`'s flash-sale stock.
    RestoreStock {
        /// Activity id.
        activity: String,
        /// Units.
        quantity: u32,
    },
    /// `user`'s slot in `activity` freed.
    ReleaseSlot {
        /// Activity id.
        activity: String,
        /// Buyer.
        user: String,
    },
}

/// The payment section's work (`[payment]`, `payment.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PaymentWork {
    /// Close `payment_ref` at the provider (a plugin's `close-payment`).
    Close {
        /// The provider's reference.
        payment_ref: String,
    },
    /// Refund `payment_ref`, which succeeded after its order closed (`refund-payment`).
    Refund {
        /// The provider's reference.
        payment_ref: String,
    },
}

/// The notice section's work (`[notify]`, `notify.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotifyWork {
    /// A plugin's `notify`, sent whatever the order's status.
    Notify(Notice),
    /// A `wait`'s reminder, sent only while the order is still PENDING.
    Remind(Notice),
}

/// A ledger row's work, by section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Work {
    /// For the Redis executor.
    Redis(RedisWork),
    /// For the payment executor.
    Payment(PaymentWork),
    /// For the notice executor.
    Notify(NotifyWork),
    /// Applied inside the close transaction (stock, coupons, points): never an executor's.
    InTransaction,
}

/// The payload of a `refund-payment` row: `{"kind": "refund-payment", "payment_ref": "…"}`.
#[derive(Deserialize)]
struct RefundPayload {
    payment_ref: String,
}

/// The work a row of `kind` with `payload` (JSON) stands for; `None` when the payload is not
/// that kind's.
pub fn read(kind: LedgerKind, payload: &str) -> Option<Work> {
    match kind {
        LedgerKind::Remind => serde_json::from_str(payload)
            .ok()
            .map(|n| Work::Notify(NotifyWork::Remind(n))),
        LedgerKind::Refund => serde_json::from_str::<RefundPayload>(payload)
            .ok()
            .map(|r| {
                Work::Payment(PaymentWork::Refund {
                    payment_ref: r.payment_ref,
                })
            }),
        LedgerKind::Effect(expected) => {
            let effect: Effect = serde_json::from_str(payload).ok()?;
            (effect.kind() == expected).then(|| of_effect(effect))
        }
        LedgerKind::ReturnPoints => Some(Work::InTransaction),
    }
}

/// The work of a plugin's effect.
fn of_effect(effect: Effect) -> Work {
    match effect {
        Effect::RestoreFlashStock { activity, quantity } => {
            Work::Redis(RedisWork::RestoreStock { activity, quantity })
        }
        Effect::ReleaseFlashSlot { activity, user } => {
            Work::Redis(RedisWork::ReleaseSlot { activity, user })
        }
        Effect::ClosePayment { payment_ref } => Work::Payment(PaymentWork::Close { payment_ref }),
        Effect::Notify(notice) => Work::Notify(NotifyWork::Notify(notice)),
        Effect::RestoreStock { .. } | Effect::ReleaseCoupon { .. } => Work::InTransaction,
    }
}

impl Job<'_> {
    /// The row's work ([`read`]).
    fn work(&self) -> Result<Work, EffectError> {
        read(self.kind, &self.row.payload).ok_or_else(|| self.unreadable())
    }

    /// The row's Redis work. The runner hands each executor only its section's rows
    /// ([`crate::kinds::home`]), so another section's row is a routing fault, failed like an
    /// unreadable one.
    ///
    /// # Errors
    /// [`EffectError::Permanent`] naming the kind and payload.
    pub fn redis_work(&self) -> Result<RedisWork, EffectError> {
        match self.work()? {
            Work::Redis(work) => Ok(work),
            Work::Payment(_) | Work::Notify(_) | Work::InTransaction => Err(self.misrouted()),
        }
    }

    /// The row's payment work ([`Job::redis_work`]'s rule).
    ///
    /// # Errors
    /// [`EffectError::Permanent`] naming the kind and payload.
    pub fn payment_work(&self) -> Result<PaymentWork, EffectError> {
        match self.work()? {
            Work::Payment(work) => Ok(work),
            Work::Redis(_) | Work::Notify(_) | Work::InTransaction => Err(self.misrouted()),
        }
    }

    /// The row's notice work ([`Job::redis_work`]'s rule).
    ///
    /// # Errors
    /// [`EffectError::Permanent`] naming the kind and payload.
    pub fn notify_work(&self) -> Result<NotifyWork, EffectError> {
        match self.work()? {
            Work::Notify(work) => Ok(work),
            Work::Redis(_) | Work::Payment(_) | Work::InTransaction => Err(self.misrouted()),
        }
    }

    fn misrouted(&self) -> EffectError {
        EffectError::Permanent(format!(
            "a {} row reached the wrong executor (its home is {:?})",
            self.kind.as_str(),
            self.kind.home()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::{Home, Section};

    /// A payload of each kind, as the close and the paid-after-close path write them.
    fn payload(kind: LedgerKind) -> String {
        use timeoutd_runtime::model::EffectKind as E;
        let notice = Notice {
            channel: "log".into(),
            template: "t".into(),
            params: Vec::new(),
        };
        let effect = match kind {
            LedgerKind::Remind => return serde_json::to_string(&notice).unwrap(),
            LedgerKind::Refund => {
                return r#"{"kind":"refund-payment","payment_ref":"pay-1"}"#.to_string();
            }
            LedgerKind::ReturnPoints => {
                return r#"{"kind":"return-points","member":"7","points":40}"#.to_string();
            }
            LedgerKind::Effect(E::RestoreStock) => Effect::RestoreStock {
                sku: "s".into(),
                quantity: 1,
            },
            LedgerKind::Effect(E::RestoreFlashStock) => Effect::RestoreFlashStock {
                activity: "a".into(),
                quantity: 1,
            },
            LedgerKind::Effect(E::ReleaseFlashSlot) => Effect::ReleaseFlashSlot {
                activity: "a".into(),
                user: "u".into(),
            },
            LedgerKind::Effect(E::ReleaseCoupon) => Effect::ReleaseCoupon { coupon: "c".into() },
            LedgerKind::Effect(E::ClosePayment) => Effect::ClosePayment {
                payment_ref: "pay-1".into(),
            },
            LedgerKind::Effect(E::Notify) => Effect::Notify(notice),
        };
        serde_json::to_string(&effect).unwrap()
    }

    #[test]
    fn every_kind_is_read_as_work_of_its_home_section() {
        for kind in LedgerKind::all() {
            let work = read(kind, &payload(kind)).unwrap_or_else(|| panic!("{kind:?} unread"));
            let section = match work {
                Work::Redis(_) => Home::Executor(Section::Redis),
                Work::Payment(_) => Home::Executor(Section::Payment),
                Work::Notify(_) => Home::Executor(Section::Notify),
                Work::InTransaction => Home::CloseTransaction,
            };
            assert_eq!(section, kind.home(), "{kind:?}");
        }
    }

    #[test]
    fn a_payload_of_another_kind_is_unreadable() {
        let close = payload(LedgerKind::Effect(
            timeoutd_runtime::model::EffectKind::ClosePayment,
        ));
        let notify = LedgerKind::Effect(timeoutd_runtime::model::EffectKind::Notify);
        assert_eq!(read(notify, &close), None);
        assert_eq!(read(LedgerKind::Refund, "not json"), None);
    }
}
