//! The host's check of a plugin's effects against the order: a plugin can only give back what
//! the order took. Every problem is reported, each naming the effect by position.
//!
//! A pure rule over [`crate::model`] types, shared by the daemon (which refuses a decision that
//! breaks it) and the merchant test harness (which fails a test on it), so both apply one rule.

use std::collections::HashMap;

use crate::model::{Decision, Effect, Manifest, Order};

/// Most bytes of the state a `wait` hands to its next phase (API 0.2.0 on): it is stored with
/// the outbox row, so it is kept small.
pub const MAX_STATE_BYTES: usize = 1024;

/// How far past the order's deadline a `wait` may end, in ms (24 hours). A wait that would end
/// later — a plugin asking for years, or `u64::MAX` ms — is refused like an effect that exceeds
/// the order: dead-lettered with the reason, the order left open and shown overdue for an
/// operator, never parked where no trigger would come back to it. A merchant whose orders
/// truly need longer gives them a later deadline.
pub const MAX_WAIT_PAST_DEADLINE_MS: i64 = 24 * 60 * 60 * 1000;

/// What a decision is reviewed against, besides its order: the phase it decides, the kinds the
/// merchant granted (`None`: every kind) and what the plugin declared (`None`: a 0.1.0 plugin,
/// which declares nothing).
#[derive(Debug, Clone, Copy)]
pub struct Review<'a> {
    /// The order the decision is about.
    pub order: &'a Order,
    /// The phase being decided.
    pub phase: u32,
    /// When the decision was asked for (the context's `now-ms`, epoch ms): a `wait` runs from
    /// here.
    pub now_ms: i64,
    /// `granted_effects` of the merchant.
    pub granted: Option<&'a [String]>,
    /// The plugin's manifest.
    pub manifest: Option<&'a Manifest>,
}

/// The host's one review of a decision, for the daemon and the harness alike:
/// - a `cancel`'s effects are within the order ([`check`]), of kinds the merchant granted
///   ([`check_granted`]) and of kinds the plugin declared ([`check_declared`]);
/// - a `wait` moves on ([`check_wait`]), ends at most [`MAX_WAIT_PAST_DEADLINE_MS`] past the
///   order's deadline ([`check_wait_end`]), its reminder is granted and declared as `notify`,
///   and its state is at most [`MAX_STATE_BYTES`];
/// - an `ignore` is always permitted.
///
/// # Errors
/// Every problem, each naming the effect by position or the field.
pub fn review(decision: &Decision, r: Review<'_>) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    let kinds = |effects: &[Effect], problems: &mut Vec<String>| {
        if let Some(granted) = r.granted {
            problems.extend(check_granted(effects, granted).err().unwrap_or_default());
        }
        if let Some(manifest) = r.manifest {
            problems.extend(check_declared(effects, manifest).err().unwrap_or_default());
        }
    };
    match decision {
        Decision::Cancel { effects, .. } => {
            problems.extend(check(r.order, effects).err().unwrap_or_default());
            kinds(effects, &mut problems);
        }
        Decision::Wait {
            after_ms,
            next_phase,
            reminder,
            state,
            ..
        } => {
            if let Err(p) = check_wait(r.phase, *after_ms, *next_phase) {
                problems.push(p);
            }
            if let Err(p) = check_wait_end(r.order, r.now_ms, *after_ms) {
                problems.push(p);
            }
            if state.len() > MAX_STATE_BYTES {
                problems.push(format!(
                    "wait.state is {} bytes; at most {MAX_STATE_BYTES}",
                    state.len()
                ));
            }
            let notice: Vec<Effect> = reminder.iter().cloned().map(Effect::Notify).collect();
            let before = problems.len();
            kinds(&notice, &mut problems);
            for p in &mut problems[before..] {
                *p = format!("reminder: {p}");
            }
        }
        Decision::Ignore { .. } => {}
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// Checks that every effect is of a kind the plugin declared in its manifest.
///
/// # Errors
/// Every effect of an undeclared kind, as `effects[i] kind(args): ...`.
pub fn check_declared(effects: &[Effect], manifest: &Manifest) -> Result<(), Vec<String>> {
    let problems: Vec<String> = effects
        .iter()
        .enumerate()
        .filter(|(_, e)| !manifest.effects.contains(&e.kind()))
        .map(|(i, e)| {
            format!(
                "effects[{i}] {}: the plugin did not declare effect kind `{}` in its manifest",
                describe(e),
                e.kind()
            )
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// Checks `effects` against `order`:
/// - `restore-stock`: only the order's SKUs, in total at most each line's quantity;
/// - `restore-flash-stock`: only the order's activity, in total at most the order's units;
/// - `release-flash-slot`: only the order's activity and buyer, once;
/// - `release-coupon`: only the order's coupon, once;
/// - `close-payment`: only the order's payment reference, once.
///
/// # Errors
/// Every violation, as `effects[i] kind(args): problem`.
pub fn check(order: &Order, effects: &[Effect]) -> Result<(), Vec<String>> {
    let mut problems = Vec::new();
    let mut stock_left: HashMap<&str, u64> = HashMap::new();
    for item in &order.items {
        *stock_left.entry(item.sku.as_str()).or_default() += u64::from(item.quantity);
    }
    let mut flash_left: u64 = order.items.iter().map(|i| u64::from(i.quantity)).sum();
    let (mut slot_released, mut coupon_released, mut payment_closed) = (false, false, false);
    for (i, effect) in effects.iter().enumerate() {
        let mut fail =
            |what: String| problems.push(format!("effects[{i}] {}: {what}", describe(effect)));
        match effect {
            Effect::RestoreStock { sku, quantity } => match stock_left.get_mut(sku.as_str()) {
                None => fail(format!("sku `{sku}` is not in order `{}`", order.id)),
                Some(left) if u64::from(*quantity) > *left => fail(format!(
                    "restores {quantity} but the order locked only {left} more of `{sku}`"
                )),
                Some(left) => *left -= u64::from(*quantity),
            },
            Effect::RestoreFlashStock { activity, quantity } => {
                if order.flash_activity.as_deref() != Some(activity) {
                    fail(format!(
                        "order `{}` is not in activity `{activity}`",
                        order.id
                    ));
                } else if u64::from(*quantity) > flash_left {
                    fail(format!(
                        "restores {quantity} but the order holds only {flash_left} more units"
                    ));
                } else {
                    flash_left -= u64::from(*quantity);
                }
            }
            Effect::ReleaseFlashSlot { activity, user } => {
                if order.flash_activity.as_deref() != Some(activity) {
                    fail(format!(
                        "order `{}` is not in activity `{activity}`",
                        order.id
                    ));
                } else if *user != order.user {
                    fail(format!(
                        "the order's buyer is `{}`, not `{user}`",
                        order.user
                    ));
                } else if std::mem::replace(&mut slot_released, true) {
                    fail("the slot is already released by an earlier effect".into());
                }
            }
            Effect::ReleaseCoupon { coupon } => {
                if order.coupon.as_deref() != Some(coupon) {
                    fail(format!(
                        "coupon `{coupon}` is not held by order `{}`",
                        order.id
                    ));
                } else if std::mem::replace(&mut coupon_released, true) {
                    fail("the coupon is already released by an earlier effect".into());
                }
            }
            Effect::ClosePayment { payment_ref } => {
                if order.payment_ref.as_deref() != Some(payment_ref) {
                    fail(format!(
                        "payment `{payment_ref}` is not order `{}`'s",
                        order.id
                    ));
                } else if std::mem::replace(&mut payment_closed, true) {
                    fail("the payment is already closed by an earlier effect".into());
                }
            }
            Effect::Notify(_) => {}
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// Checks that every effect is of a kind the merchant granted its plugin (`granted`, kinds as
/// in [`EffectKind::ALL`]). A reminder sent with a `wait` counts as `notify`.
///
/// # Errors
/// Every effect of an ungranted kind, as `effects[i] kind(args): ...`.
pub fn check_granted(effects: &[Effect], granted: &[String]) -> Result<(), Vec<String>> {
    let problems: Vec<String> = effects
        .iter()
        .enumerate()
        .filter(|(_, e)| !granted.iter().any(|g| g == e.kind().as_str()))
        .map(|(i, e)| {
            format!(
                "effects[{i}] {}: effect kind `{}` is not granted to this merchant's plugin (granted: {})",
                describe(e),
                e.kind(),
                if granted.is_empty() { "none".to_string() } else { granted.join(", ") }
            )
        })
        .collect();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems)
    }
}

/// Checks a `wait` decided for `phase`: it must name a later phase and a positive delay.
///
/// # Errors
/// What is wrong, naming both phases and the delay.
pub fn check_wait(phase: u32, after_ms: u64, next_phase: u32) -> Result<(), String> {
    if next_phase <= phase || after_ms == 0 {
        Err(format!(
            "wait must name a later phase and a positive delay (phase {phase} → {next_phase}, after {after_ms} ms)"
        ))
    } else {
        Ok(())
    }
}

/// Checks that a `wait` of `after_ms` asked for at `now_ms` ends at most
/// [`MAX_WAIT_PAST_DEADLINE_MS`] past `order`'s deadline.
///
/// # Errors
/// The wait, when it ends, and the bound, in ms.
pub fn check_wait_end(order: &Order, now_ms: i64, after_ms: u64) -> Result<(), String> {
    let ends_ms = i64::try_from(after_ms)
        .ok()
        .and_then(|after| now_ms.checked_add(after));
    let bound_ms = order.deadline_ms.saturating_add(MAX_WAIT_PAST_DEADLINE_MS);
    match ends_ms {
        Some(ends) if ends <= bound_ms => Ok(()),
        _ => Err(format!(
            "wait of {after_ms} ms from {now_ms} ends past {bound_ms}: at most \
             {MAX_WAIT_PAST_DEADLINE_MS} ms (24 h) past the order's deadline ({}); give such orders a \
             later deadline",
            order.deadline_ms
        )),
    }
}

/// An effect as `kind(args)`, e.g. `restore-stock(sku-a, 2)`, as the guard's messages name it.
pub fn describe(effect: &Effect) -> String {
    match effect {
        Effect::RestoreStock { sku, quantity } => format!("restore-stock({sku}, {quantity})"),
        Effect::RestoreFlashStock { activity, quantity } => {
            format!("restore-flash-stock({activity}, {quantity})")
        }
        Effect::ReleaseFlashSlot { activity, user } => {
            format!("release-flash-slot({activity}, {user})")
        }
        Effect::ReleaseCoupon { coupon } => format!("release-coupon({coupon})"),
        Effect::ClosePayment { payment_ref } => format!("close-payment({payment_ref})"),
        Effect::Notify(n) => format!("notify({}, {})", n.channel, n.template),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{EffectKind, OrderItem, OrderStatus};

    fn order() -> Order {
        Order {
            id: "o1".into(),
            merchant: "m".into(),
            user: "u1".into(),
            status: OrderStatus::Pending,
            created_at_ms: 0,
            deadline_ms: 10,
            total_cents: 300,
            items: vec![
                OrderItem {
                    sku: "a".into(),
                    quantity: 2,
                    unit_price_cents: 100,
                },
                OrderItem {
                    sku: "b".into(),
                    quantity: 1,
                    unit_price_cents: 100,
                },
            ],
            coupon: Some("c1".into()),
            flash_activity: Some("fs".into()),
            payment_ref: Some("p1".into()),
        }
    }

    #[test]
    fn effects_within_the_order_pass() {
        let effects = vec![
            Effect::RestoreStock {
                sku: "a".into(),
                quantity: 1,
            },
            Effect::RestoreStock {
                sku: "a".into(),
                quantity: 1,
            },
            Effect::RestoreStock {
                sku: "b".into(),
                quantity: 1,
            },
            Effect::RestoreFlashStock {
                activity: "fs".into(),
                quantity: 3,
            },
            Effect::ReleaseFlashSlot {
                activity: "fs".into(),
                user: "u1".into(),
            },
            Effect::ReleaseCoupon {
                coupon: "c1".into(),
            },
            Effect::ClosePayment {
                payment_ref: "p1".into(),
            },
        ];
        assert_eq!(check(&order(), &effects), Ok(()));
    }

    #[test]
    fn an_ungranted_kind_is_named_with_what_was_granted() {
        let effects = vec![
            Effect::RestoreStock {
                sku: "a".into(),
                quantity: 1,
            },
            Effect::ClosePayment {
                payment_ref: "p1".into(),
            },
        ];
        let granted = vec!["restore-stock".to_string(), "notify".to_string()];
        let problems = check_granted(&effects, &granted).unwrap_err();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with(
            "effects[1] close-payment(p1): effect kind `close-payment` is not granted"
        ));
        assert!(problems[0].ends_with("(granted: restore-stock, notify)"));
        let all: Vec<String> = EffectKind::ALL.iter().map(|k| k.to_string()).collect();
        assert_eq!(check_granted(&effects, &all), Ok(()));
    }

    #[test]
    fn every_excess_is_named_by_position() {
        let effects = vec![
            Effect::RestoreStock {
                sku: "a".into(),
                quantity: 3,
            },
            Effect::RestoreStock {
                sku: "zz".into(),
                quantity: 1,
            },
            Effect::ReleaseCoupon {
                coupon: "someone-elses".into(),
            },
            Effect::ReleaseFlashSlot {
                activity: "fs".into(),
                user: "u2".into(),
            },
            Effect::RestoreFlashStock {
                activity: "fs".into(),
                quantity: 4,
            },
            Effect::ClosePayment {
                payment_ref: "p1".into(),
            },
            Effect::ClosePayment {
                payment_ref: "p1".into(),
            },
        ];
        let problems = check(&order(), &effects).unwrap_err();
        assert_eq!(problems.len(), 6, "{problems:#?}");
        assert!(problems[0].starts_with("effects[0] restore-stock(a, 3)"));
        assert!(problems[1].contains("sku `zz` is not in order"));
        assert!(problems[2].contains("coupon `someone-elses`"));
        assert!(problems[3].contains("buyer is `u1`"));
        assert!(problems[4].contains("only 3 more units"));
        assert!(problems[5].starts_with("effects[6]"));
    }

    #[test]
    fn a_wait_ends_at_most_a_day_past_the_deadline() {
        let o = order();
        let day = MAX_WAIT_PAST_DEADLINE_MS;
        assert!(check_wait_end(&o, 0, (10 + day) as u64).is_ok());
        let late = check_wait_end(&o, 0, (11 + day) as u64).unwrap_err();
        assert!(late.contains("at most 86400000 ms (24 h)"), "{late}");
        // Absurd waits are refused, never wrapped into the past.
        for after in [u64::MAX, i64::MAX as u64, (i64::MAX - 5) as u64] {
            assert!(check_wait_end(&o, 5, after).is_err(), "{after}");
        }
        let wait = Decision::Wait {
            after_ms: u64::MAX,
            next_phase: 1,
            reminder: None,
            state: Vec::new(),
            poll_payment: false,
        };
        let review = Review {
            order: &o,
            phase: 0,
            now_ms: 5,
            granted: None,
            manifest: None,
        };
        let problems = review_of(&wait, review);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("wait of 18446744073709551615 ms"));
    }

    fn review_of(decision: &Decision, r: Review<'_>) -> Vec<String> {
        review(decision, r).err().unwrap_or_default()
    }
}
