//! The delay planner: how a timeout due at an exact millisecond travels through a broker that
//! only knows 18 fixed delay levels, or timer messages with a maximum delay.
//!
//! A delay is carried as a chain of hops. The message carries the absolute due time (property
//! [`super::codec::PROP_DUE_MS`]); each time a hop arrives, the consumer asks [`next_hop`] again
//! with the current time, so lateness of one hop never accumulates. The last hop is aimed
//! [`Planner::lead`] before the due time, and what is left when it arrives (the lead, and the
//! sub-second rest no level can express) is waited out locally ([`Hop::Now`] with a wait; the
//! consumer holds the message, [`super::hold`]): a broker releasing a burst late or a second
//! off (its timer slot) then still hands the message over before the due time.
//!
//! Levels are RocketMQ's default `messageDelayLevel` (`1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m
//! 10m 20m 30m 1h 2h`, broker config `messageDelayLevel`, level 1 = 1 s); chains use the fewest
//! hops ([`level_hops`]: a coin-change over whole seconds, exact for any delay; the last hop
//! may land anywhere in the lead's window, whichever whole-second delay takes fewest hops).

use std::time::Duration;

use crate::config::DelayMode;

/// RocketMQ's default delay levels, seconds; level `n` (1-based) is `LEVELS_S[n - 1]`.
pub const LEVELS_S: [u64; 18] = [
    1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
];

/// The longest single level, seconds (2 h).
pub const MAX_LEVEL_S: u64 = 7200;

/// One hop of a delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hop {
    /// Send with delay level `level` (1-based), arriving after [`LEVELS_S`]`[level - 1]` s.
    Level(u8),
    /// Send as a timer message delivered at this epoch ms.
    Timer(i64),
    /// Due within the lead (plus the sub-second rest no level can express): handle it after
    /// waiting `wait_ms`, less than [`Planner::lead`] + 1 s.
    Now {
        /// Milliseconds to wait locally first.
        wait_ms: u64,
    },
}

/// What the planner knows about the transport.
#[derive(Debug, Clone, Copy)]
pub struct Planner {
    /// `levels`, `timer` or `auto` (the caller resolves `auto`; see [`Planner::timers`]).
    pub mode: DelayMode,
    /// Longest delay of one timer message.
    pub timer_max: Duration,
    /// How early the last hop is aimed (`rocketmq.timer_lead`); a message due within it plus
    /// one second is waited out locally.
    pub lead: Duration,
}

impl Planner {
    /// Whether hops are timer messages (`timer`, or `auto` while the broker accepts them).
    pub fn timers(&self, timer_refused: bool) -> bool {
        match self.mode {
            DelayMode::Levels => false,
            DelayMode::Timer => true,
            DelayMode::Auto => !timer_refused,
        }
    }

    /// The next hop towards `due_ms` at `now_ms`, aimed [`Planner::lead`] early. Never fails: a
    /// delay past the transport's maximum becomes a chain (F8), a due time within the lead plus
    /// one second (or in the past) is [`Hop::Now`].
    pub fn next_hop(&self, now_ms: i64, due_ms: i64, timer_refused: bool) -> Hop {
        let rest_ms = due_ms.saturating_sub(now_ms);
        let lead_ms = millis(self.lead);
        let travel_ms = rest_ms.saturating_sub(lead_ms);
        if travel_ms < 1000 {
            return Hop::Now {
                wait_ms: rest_ms.max(0) as u64,
            };
        }
        if self.timers(timer_refused) {
            return Hop::Timer(now_ms + travel_ms.min(millis(self.timer_max)));
        }
        // Whole seconds only: any delay that lands between just under a second before the aim
        // and `min(lead, 1 s)` before the due time will do, so take the one with the fewest
        // hops (the earliest of those). With no lead that is the aim itself.
        let first = (travel_ms / 1000) as u64;
        let last = ((rest_ms - lead_ms.min(1000)) / 1000) as u64;
        let hops = (first..=last.max(first))
            .map(level_hops)
            .min_by_key(Vec::len)
            .unwrap_or_default();
        match hops.first() {
            Some(&level) => Hop::Level(level),
            None => Hop::Now { wait_ms: 0 },
        }
    }
}

/// `d` in whole milliseconds, saturating at `i64::MAX`.
fn millis(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}

/// The fewest delay levels summing to exactly `seconds` (order: longest first). Whole 2 h hops
/// cover what lies beyond 2 h; the rest (< 2 h) is an exact minimum-hop coin change.
pub fn level_hops(seconds: u64) -> Vec<u8> {
    let mut hops = Vec::new();
    let mut rest = seconds;
    // Beyond the table, whole 2 h hops; keep at least one table's worth for the exact part.
    while rest >= 2 * MAX_LEVEL_S {
        hops.push(LEVELS_S.len() as u8);
        rest -= MAX_LEVEL_S;
    }
    let best = min_hops_table();
    let mut at = rest as usize;
    let mut tail = Vec::new();
    while at > 0 {
        let level = best[at].1;
        tail.push(level);
        at -= LEVELS_S[level as usize - 1] as usize;
    }
    tail.sort_unstable_by(|a, b| b.cmp(a));
    hops.extend(tail);
    hops
}

/// `table[s] = (hops, a level of an optimal first hop)` for every `s < 4 h`, computed once;
/// level 1 (1 s) makes every amount reachable.
fn min_hops_table() -> &'static [(u32, u8)] {
    static TABLE: std::sync::OnceLock<Vec<(u32, u8)>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| build_table(2 * MAX_LEVEL_S as usize - 1))
}

fn build_table(upto: usize) -> Vec<(u32, u8)> {
    let mut table = vec![(0u32, 0u8); upto + 1];
    for s in 1..=upto {
        let mut best = (u32::MAX, 0u8);
        // Longest levels first so ties prefer the longer hop.
        for (i, &len) in LEVELS_S.iter().enumerate().rev() {
            let len = len as usize;
            if len <= s && table[s - len].0 + 1 < best.0 {
                best = (table[s - len].0 + 1, (i + 1) as u8);
            }
        }
        table[s] = best;
    }
    table
}

/// The seconds a level delays.
pub fn level_seconds(level: u8) -> u64 {
    LEVELS_S[usize::from(level).clamp(1, LEVELS_S.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seconds_of(hops: &[u8]) -> Vec<u64> {
        hops.iter().map(|&l| level_seconds(l)).collect()
    }

    #[test]
    fn fifteen_minutes_is_ten_then_five() {
        assert_eq!(seconds_of(&level_hops(15 * 60)), vec![600, 300]);
    }

    #[test]
    fn seventeen_minutes_twenty_three_seconds_takes_seven_hops_or_fewer() {
        let hops = seconds_of(&level_hops(17 * 60 + 23));
        assert_eq!(hops.iter().sum::<u64>(), 17 * 60 + 23);
        assert_eq!(hops, vec![600, 420, 10, 10, 1, 1, 1]);
    }

    #[test]
    fn twelve_seconds_is_ten_one_one() {
        assert_eq!(seconds_of(&level_hops(12)), vec![10, 1, 1]);
    }

    #[test]
    fn every_delay_up_to_five_hours_is_exact() {
        for s in (0..5 * 3600).step_by(7) {
            assert_eq!(
                level_hops(s).iter().map(|&l| level_seconds(l)).sum::<u64>(),
                s
            );
        }
    }

    #[test]
    fn every_delay_under_four_hours_takes_the_fewest_levels() {
        // An independent count: breadth-first over amounts, one level per step.
        let upto = 4 * 3600;
        let mut fewest = vec![u32::MAX; upto + 1];
        fewest[0] = 0;
        let mut frontier = vec![0usize];
        while !frontier.is_empty() {
            let mut next = Vec::new();
            for at in frontier {
                for &len in LEVELS_S.iter() {
                    let to = at + len as usize;
                    if to <= upto && fewest[to] == u32::MAX {
                        fewest[to] = fewest[at] + 1;
                        next.push(to);
                    }
                }
            }
            frontier = next;
        }
        for s in (0..upto).step_by(13) {
            assert_eq!(level_hops(s as u64).len() as u32, fewest[s], "{s} s");
        }
    }

    #[test]
    fn forty_eight_hours_chains_two_hour_levels() {
        let hops = level_hops(48 * 3600);
        assert_eq!(hops.len(), 24);
        assert!(hops.iter().all(|&l| level_seconds(l) == 7200));
    }

    #[test]
    fn under_a_second_is_waited_out_and_a_second_is_a_hop() {
        let levels = Planner {
            mode: DelayMode::Levels,
            timer_max: Duration::from_secs(86_400),
            lead: Duration::ZERO,
        };
        assert_eq!(levels.next_hop(0, 999, false), Hop::Now { wait_ms: 999 });
        assert_eq!(levels.next_hop(0, 1_000, false), Hop::Level(1));
    }

    #[test]
    fn the_last_hop_is_aimed_the_lead_early_and_the_rest_is_waited_out() {
        let timer = Planner {
            mode: DelayMode::Timer,
            timer_max: Duration::from_secs(86_400),
            lead: Duration::from_secs(2),
        };
        // Due in 12.4 s: the timer is due back 2 s early, then 2 s are waited out.
        assert_eq!(timer.next_hop(0, 12_400, false), Hop::Timer(10_400));
        assert_eq!(
            timer.next_hop(10_400, 12_400, false),
            Hop::Now { wait_ms: 2_000 }
        );
        // A timer released a second late still arrives before the due time.
        assert_eq!(
            timer.next_hop(11_400, 12_400, false),
            Hop::Now { wait_ms: 1_000 }
        );
        // Within the lead plus one second nothing is sent; past the due time nothing waits.
        assert_eq!(
            timer.next_hop(9_500, 12_400, false),
            Hop::Now { wait_ms: 2_900 }
        );
        assert_eq!(timer.next_hop(9_400, 12_400, false), Hop::Timer(10_400));
        assert_eq!(
            timer.next_hop(13_000, 12_400, false),
            Hop::Now { wait_ms: 0 }
        );
        // A chain past the timer maximum aims only its last hop early.
        let short = Planner {
            timer_max: Duration::from_secs(4),
            ..timer
        };
        assert_eq!(short.next_hop(0, 12_400, false), Hop::Timer(4_000));
        assert_eq!(short.next_hop(8_000, 12_400, false), Hop::Timer(10_400));
        // Levels: 12.4 s with a 2 s lead is one 10 s level, then 2.4 s held.
        let levels = Planner {
            mode: DelayMode::Levels,
            ..timer
        };
        assert_eq!(levels.next_hop(0, 12_400, false), Hop::Level(3));
        assert_eq!(
            levels.next_hop(10_000, 12_400, false),
            Hop::Now { wait_ms: 2_400 }
        );
        // 11.75 s: 9 s would be five hops (5 + 1 + 1 + 1 + 1); 10 s, landing 1.75 s early, is one.
        assert_eq!(levels.next_hop(650, 12_400, false), Hop::Level(3));
        assert_eq!(
            levels.next_hop(10_650, 12_400, false),
            Hop::Now { wait_ms: 1_750 }
        );
    }

    #[test]
    fn next_hop_by_mode() {
        let levels = Planner {
            mode: DelayMode::Levels,
            timer_max: Duration::from_secs(3 * 86_400),
            lead: Duration::ZERO,
        };
        assert_eq!(levels.next_hop(0, 12_400, false), Hop::Level(3));
        // 1.4 s left: one more 1 s level; then 0.9 s is waited out locally.
        assert_eq!(levels.next_hop(11_000, 12_400, false), Hop::Level(1));
        assert_eq!(
            levels.next_hop(11_500, 12_400, false),
            Hop::Now { wait_ms: 900 }
        );
        assert_eq!(
            levels.next_hop(13_000, 12_400, false),
            Hop::Now { wait_ms: 0 }
        );
        let timer = Planner {
            mode: DelayMode::Timer,
            timer_max: Duration::from_secs(86_400),
            lead: Duration::ZERO,
        };
        assert_eq!(timer.next_hop(0, 12_400, false), Hop::Timer(12_400));
        // 48 h with a 1-day maximum: the first hop stops at the maximum (F8).
        assert_eq!(
            timer.next_hop(0, 48 * 3_600_000, false),
            Hop::Timer(86_400_000)
        );
        let auto = Planner {
            mode: DelayMode::Auto,
            timer_max: Duration::from_secs(86_400),
            lead: Duration::ZERO,
        };
        assert_eq!(auto.next_hop(0, 5_000, false), Hop::Timer(5_000));
        assert_eq!(auto.next_hop(0, 5_000, true), Hop::Level(2));
    }
}
