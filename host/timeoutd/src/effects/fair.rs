//! Fair shares of the effect executor's slots among merchants (#46 part 1).
//!
//! The executor carries out `effects.concurrency` orders' rows at once, one order to a slot
//! ([`super::pool`]). When several merchants have rows waiting, each free slot goes to the
//! waiting merchant that holds the fewest slots for its weight (`merchants.<id>.weight`): the
//! least `held / weight`, ties to the oldest waiting row. That is weighted fair queueing over
//! slot time, as a CPU scheduler shares cores: a merchant whose webhook hangs or whose
//! provider answers 503 keeps its slots busy for its timeout, and every slot that frees goes
//! to the others first. A merchant alone uses every slot, up to `effects.merchant_slots`
//! (default ¾ of them), so a slot is free for the next merchant's rows the moment they are
//! read, without waiting out anyone's timeout.
//!
//! Pure bookkeeping, no I/O and no clock: [`Shares::pick`] says who is next, the pool
//! [`Shares::take`]s the slot when it starts the order's rows and [`Shares::give_back`]s it
//! when they are settled.

use std::collections::HashMap;
use std::sync::Arc;

/// Slots held per merchant, and who gets the next one.
#[derive(Debug)]
pub struct Shares {
    slots: usize,
    per_merchant: usize,
    weights: Arc<HashMap<String, u32>>,
    held: HashMap<String, usize>,
    total: usize,
}

impl Shares {
    /// `slots` in all (at least 1), at most `per_merchant` to one merchant (clamped to 1 ..=
    /// `slots`); `weights` per merchant id, 1 for a merchant not named.
    pub fn new(slots: usize, per_merchant: usize, weights: Arc<HashMap<String, u32>>) -> Shares {
        let slots = slots.max(1);
        Shares {
            slots,
            per_merchant: per_merchant.clamp(1, slots),
            weights,
            held: HashMap::new(),
            total: 0,
        }
    }

    /// Slots free now.
    pub fn free(&self) -> usize {
        self.slots - self.total
    }

    /// Slots `merchant` holds now.
    pub fn held(&self, merchant: &str) -> usize {
        self.held.get(merchant).copied().unwrap_or(0)
    }

    fn weight(&self, merchant: &str) -> u64 {
        u64::from(self.weights.get(merchant).copied().unwrap_or(1).max(1))
    }

    /// Which of the `waiting` merchants (each with the id of its oldest waiting row) gets the
    /// next slot: `None` when no slot is free or every waiting merchant holds its
    /// `per_merchant` slots.
    pub fn pick<'a>(&self, waiting: impl IntoIterator<Item = (&'a str, i64)>) -> Option<&'a str> {
        if self.free() == 0 {
            return None;
        }
        waiting
            .into_iter()
            .filter(|(m, _)| self.held(m) < self.per_merchant)
            // held_a / w_a < held_b / w_b  ⇔  held_a · w_b < held_b · w_a
            .min_by(|(a, oldest_a), (b, oldest_b)| {
                let load_a = self.held(a) as u64 * self.weight(b);
                let load_b = self.held(b) as u64 * self.weight(a);
                load_a.cmp(&load_b).then(oldest_a.cmp(oldest_b))
            })
            .map(|(m, _)| m)
    }

    /// `merchant` takes a slot.
    ///
    /// # Panics
    /// When no slot is free (a caller that did not [`Shares::pick`] first).
    pub fn take(&mut self, merchant: &str) {
        assert!(self.free() > 0, "a slot taken when none is free");
        *self.held.entry(merchant.to_string()).or_default() += 1;
        self.total += 1;
    }

    /// `merchant` gives a slot back.
    pub fn give_back(&mut self, merchant: &str) {
        if let Some(held) = self.held.get_mut(merchant)
            && *held > 0
        {
            *held -= 1;
            self.total -= 1;
            if *held == 0 {
                self.held.remove(merchant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shares(slots: usize, per_merchant: usize, weights: &[(&str, u32)]) -> Shares {
        let weights = weights.iter().map(|(m, w)| (m.to_string(), *w)).collect();
        Shares::new(slots, per_merchant, Arc::new(weights))
    }

    /// Hands out `n` slots one at a time to `waiting` (every merchant always has rows), and
    /// returns how many each got.
    fn fill(s: &mut Shares, waiting: &[(&'static str, i64)], n: usize) -> HashMap<String, usize> {
        for _ in 0..n {
            let Some(m) = s.pick(waiting.iter().copied()) else {
                break;
            };
            s.take(m);
        }
        waiting
            .iter()
            .map(|(m, _)| (m.to_string(), s.held(m)))
            .collect()
    }

    #[test]
    fn a_busy_merchant_does_not_take_the_slot_another_is_waiting_for() {
        // A's 10,000-row burst is older than B's rows: the oldest row alone would hand A
        // every slot.
        let mut s = shares(16, 12, &[]);
        let got = fill(&mut s, &[("a", 1), ("b", 10_001)], 16);
        assert_eq!((got["a"], got["b"]), (8, 8));
        // A's slots hang; every one B frees goes back to B.
        for _ in 0..100 {
            s.give_back("b");
            assert_eq!(s.pick([("a", 1), ("b", 10_001)]), Some("b"));
            s.take("b");
        }
    }

    #[test]
    fn weights_split_the_slots_in_proportion() {
        let mut s = shares(16, 16, &[("gold", 3)]);
        let got = fill(&mut s, &[("gold", 5), ("plain", 1)], 16);
        assert_eq!((got["gold"], got["plain"]), (12, 4));
    }

    #[test]
    fn a_merchant_alone_uses_its_cap_and_leaves_the_rest_free() {
        let mut s = shares(16, 12, &[]);
        let got = fill(&mut s, &[("a", 1)], 16);
        assert_eq!(got["a"], 12);
        assert_eq!(s.free(), 4);
        assert_eq!(s.pick([("a", 1)]), None, "A holds its cap");
        assert_eq!(s.pick([("a", 1), ("b", 9)]), Some("b"), "B starts at once");
    }

    #[test]
    fn ties_go_to_the_oldest_row_and_nothing_is_handed_out_past_the_slots() {
        let mut s = shares(2, 2, &[]);
        assert_eq!(s.pick([("a", 7), ("b", 3)]), Some("b"));
        s.take("b");
        s.take("a");
        assert_eq!(s.pick([("a", 7), ("b", 3)]), None);
        s.give_back("a");
        s.give_back("a"); // one too many: ignored
        assert_eq!(s.free(), 1);
        assert_eq!(s.held("a"), 0);
    }
}
