//! What a shadow's answer is beside the live one: a pure rule over the two answers, so the
//! runner, the tests and any later tool (a what-if over history) judge alike.

use timeoutd_runtime::model::Decision;
use timeoutd_runtime::{DecideError, TrapKind};

/// How one shadow comparison came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Same kind, and the same wait, phase, reminder and effects.
    Agree,
    /// An answer that differs in at least one part ([`differences`]).
    Differ,
    /// An answer the guard would refuse (effects beyond the order, kinds not granted, a wait
    /// too long): counted apart, since the live path would have dead-lettered it.
    Refused,
    /// The shadow ran past its deadline.
    Timeout,
    /// The shadow trapped (memory, a fault).
    Trap,
    /// The shadow answered with an error of its own or an oversized answer.
    Error,
}

impl Outcome {
    /// `agree`, `differ`, `refused`, `timeout`, `trap` or `error`: the stored and metric name.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Agree => "agree",
            Outcome::Differ => "differ",
            Outcome::Refused => "refused",
            Outcome::Timeout => "timeout",
            Outcome::Trap => "trap",
            Outcome::Error => "error",
        }
    }

    /// The outcome of a shadow call that gave no answer.
    pub fn of_error(e: &DecideError) -> Outcome {
        match e {
            DecideError::Trap {
                kind: TrapKind::Deadline,
                ..
            } => Outcome::Timeout,
            DecideError::Trap { .. } => Outcome::Trap,
            _ => Outcome::Error,
        }
    }
}

/// The parts in which `shadow` differs from `live`, in this order: `kind` (cancel, wait or
/// ignore: nothing else is compared across kinds), then for two waits `wait` (`after_ms`),
/// `phase` (`next_phase`), `reminder` (whether one is sent and what it says), and for two
/// cancels `effects` (the list, in order). Reasons and a wait's opaque state are not
/// compared: they say why, not what happens. Empty: they agree.
pub fn differences(live: &Decision, shadow: &Decision) -> Vec<&'static str> {
    match (live, shadow) {
        (
            Decision::Wait {
                after_ms: a,
                next_phase: pa,
                reminder: ra,
                ..
            },
            Decision::Wait {
                after_ms: b,
                next_phase: pb,
                reminder: rb,
                ..
            },
        ) => [
            ("wait", a != b),
            ("phase", pa != pb),
            ("reminder", ra != rb),
        ]
        .into_iter()
        .filter_map(|(part, differs)| differs.then_some(part))
        .collect(),
        (Decision::Cancel { effects: a, .. }, Decision::Cancel { effects: b, .. }) => {
            if a == b {
                Vec::new()
            } else {
                vec!["effects"]
            }
        }
        (Decision::Ignore { .. }, Decision::Ignore { .. }) => Vec::new(),
        _ => vec!["kind"],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use timeoutd_runtime::model::{Effect, Notice};

    fn wait(after_ms: u64, next_phase: u32, remind: bool) -> Decision {
        Decision::Wait {
            after_ms,
            next_phase,
            reminder: remind.then(|| Notice {
                channel: "sms".into(),
                template: "pay-soon".into(),
                params: Vec::new(),
            }),
            state: Vec::new(),
            poll_payment: false,
        }
    }

    fn cancel(effects: Vec<Effect>, reason: &str) -> Decision {
        Decision::Cancel {
            reason: reason.into(),
            effects,
        }
    }

    #[test]
    fn each_part_is_named_and_reasons_are_not_compared() {
        assert!(differences(&wait(60_000, 1, false), &wait(60_000, 1, false)).is_empty());
        assert_eq!(
            differences(&wait(60_000, 1, false), &wait(30_000, 2, true)),
            ["wait", "phase", "reminder"]
        );
        assert_eq!(
            differences(&wait(60_000, 1, false), &cancel(vec![], "late")),
            ["kind"]
        );
        let coupon = Effect::ReleaseCoupon {
            coupon: "c-1".into(),
        };
        assert!(
            differences(
                &cancel(vec![coupon.clone()], "late"),
                &cancel(vec![coupon.clone()], "timed out")
            )
            .is_empty()
        );
        assert_eq!(
            differences(&cancel(vec![coupon], "late"), &cancel(vec![], "late")),
            ["effects"]
        );
        let ignore = Decision::Ignore { reason: "x".into() };
        assert!(differences(&ignore, &ignore).is_empty());
        assert_eq!(differences(&ignore, &cancel(vec![], "late")), ["kind"]);
    }
}
