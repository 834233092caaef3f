//! Caps per effect kind and channel per merchant: how many external effects a second each
//! merchant may send to each receiver, so that one merchant's 10,000-order burst neither floods
//! its SMS provider nor uses up a receiver the merchant shares with nobody else's budget.
//!
//! A cap is named for what it protects ([`names`]):
//! - `notify`: every notice and reminder of the merchant, whatever the channel;
//! - `notify.<channel>`: the notices on one channel (`notify.sms`, `notify.webhook`);
//! - `redis`: the flash-sale effects (stock back to an activity, a buyer's slot freed);
//! - `payment`: close and refund requests to the payment provider (default
//!   `payment.max_calls_per_second`).
//!
//! Each is the generic cell rate algorithm ([`crate::ratecap`], GCRA): `rate` a second per
//! merchant, bursts of up to `rate`. An effect over a cap is not run and not failed: it is
//! deferred to the slot it booked ([`EffectError::Deferred`], no attempt counted, its
//! `last_error` beginning [`DEFERRED`]), so a burst reaches the receiver at the cap's rate, in
//! ledger order. A row that comes back at its slot runs without booking again, whichever
//! daemon takes it.
//!
//! Where the caps' state lives (`caps.store`): `process`, each daemon its own (the default), or
//! `redis`, one budget per merchant and cap shared by every daemon on the same Redis, for caps
//! that are the receiver's (an SMS provider's 10 a second is 10 for three daemons together,
//! not 30). The shared state is one key per merchant and cap (`timeoutd:cap:<merchant>:<cap>`,
//! its theoretical arrival time in µs, expiring a minute after its last booked slot), moved by
//! one Lua script, timed by the database clock every daemon shares. When Redis does not answer, the process's own caps
//! take over for the next 5 s (`timeoutd_effect_cap_fallbacks_total` counts each effect so
//! capped), so a Redis outage slows nothing down that was not capped before, and no effect
//! waits for Redis' timeout while it lasts.

use std::collections::{BTreeMap, HashMap};

use super::executor::{EffectError, Job};
use super::flash::FlashSale;
use super::work::{self, NotifyWork, Work};
use crate::config::{CapStore, Config};
use crate::events::{Event, emit};
use crate::ratecap::RateCap;

/// The cap names an effect's work counts against, broadest first (the forms
/// [`crate::kinds::cap_name_problem`] accepts).
pub fn names(work: &Work) -> Vec<String> {
    match work {
        Work::Notify(NotifyWork::Notify(n) | NotifyWork::Remind(n)) => {
            vec!["notify".to_string(), format!("notify.{}", n.channel)]
        }
        Work::Redis(_) => vec!["redis".to_string()],
        Work::Payment(_) => vec!["payment".to_string()],
        Work::InTransaction => Vec::new(),
    }
}

/// The Lua script of the shared store: GCRA's reserve on one key, in µs. `KEYS[1]` the cap's
/// key; `ARGV` now, the interval between two effects at the sustained rate, the tolerance
/// (`(burst − 1) × interval`). Books the next slot and answers it (now while the burst lasts).
/// The key lives a minute past its last booked slot.
const RESERVE: &str = r"
local now = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local tolerance = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local after = tat + interval
redis.call('SET', KEYS[1], string.format('%.0f', after), 'PX', math.floor((after - now) / 1000) + 60000)
local slot = tat - tolerance
if slot < now then slot = now end
return slot
";

/// Every merchant's caps and where their state lives.
pub struct Caps {
    /// `caps.per_second`: every merchant's, unless its own says otherwise, each with the
    /// configuration key that set it (`caps.per_second`, `payment.max_calls_per_second`).
    defaults: BTreeMap<String, (u32, &'static str)>,
    /// `merchants.<m>.caps`, over the defaults.
    merchants: HashMap<String, BTreeMap<String, u32>>,
    /// The process's own caps, one per rate (each keeps one budget per `merchant/cap` key).
    local: HashMap<u32, RateCap>,
    /// The shared store, with `caps.store = "redis"`.
    shared: Option<(FlashSale, redis::Script)>,
    /// Until when (epoch ms, the runner's clock) the shared store is not asked after it failed
    /// to answer: [`SHARED_PAUSE_MS`] of this process's own caps, instead of every effect
    /// waiting for Redis' timeout in turn.
    shared_down_until: std::sync::atomic::AtomicI64,
}

/// How the `last_error` of a row a cap deferred begins (the cap's name follows, then a
/// backquote): the row comes back at its booked slot (its `next_attempt_ms`) and does not book
/// that cap again, whichever daemon takes it then, and after a restart too.
pub const DEFERRED: &str = "deferred: cap `";

/// How long the shared store is left alone after it failed to answer (ms): the process's own
/// caps serve meanwhile.
const SHARED_PAUSE_MS: i64 = 5_000;

impl std::fmt::Debug for Caps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caps")
            .field("defaults", &self.defaults)
            .field("merchants", &self.merchants)
            .field("shared", &self.shared.is_some())
            .finish()
    }
}

impl Caps {
    /// The caps `config` sets (`[caps]`, each `[merchants.<m>.caps]`, and `payment` from
    /// `payment.max_calls_per_second` unless set there); `None` when there are none. With
    /// `caps.store = "redis"`, connected to `[redis]` on first use.
    ///
    /// # Errors
    /// A message naming the Redis configuration that cannot be used.
    pub async fn from_config(config: &Config) -> Result<Option<Caps>, String> {
        let mut defaults: BTreeMap<String, (u32, &'static str)> = config
            .caps
            .per_second
            .iter()
            .map(|(name, rate)| (name.clone(), (*rate, "caps.per_second")))
            .collect();
        if let Some(p) = &config.payment {
            defaults
                .entry("payment".to_string())
                .or_insert((p.max_calls_per_second, "payment.max_calls_per_second"));
        }
        let merchants: HashMap<String, BTreeMap<String, u32>> = config
            .merchants
            .iter()
            .filter(|(_, m)| !m.caps.is_empty())
            .map(|(name, m)| (name.clone(), m.caps.clone()))
            .collect();
        if defaults.is_empty() && merchants.is_empty() {
            return Ok(None);
        }
        let shared = match (config.caps.store, &config.redis) {
            (CapStore::Redis, Some(redis)) => Some((
                FlashSale::connect(redis).await?,
                redis::Script::new(RESERVE),
            )),
            (CapStore::Redis, None) => {
                return Err("caps.store = \"redis\" needs [redis]".to_string());
            }
            (CapStore::Process, _) => None,
        };
        let local = defaults
            .values()
            .map(|(rate, _)| rate)
            .chain(merchants.values().flat_map(BTreeMap::values))
            .map(|rate| (*rate, RateCap::new(*rate)))
            .collect();
        Ok(Some(Caps {
            defaults,
            merchants,
            local,
            shared,
            shared_down_until: std::sync::atomic::AtomicI64::new(i64::MIN),
        }))
    }

    /// `merchant`'s cap `name`, a second: its own, else the default; with where it was set
    /// (`merchants.<m>.caps`, `caps.per_second`, `payment.max_calls_per_second`).
    pub fn rate(&self, merchant: &str, name: &str) -> Option<(u32, String)> {
        match self.merchants.get(merchant).and_then(|caps| caps.get(name)) {
            Some(rate) => Some((*rate, format!("merchants.{merchant}.caps"))),
            None => self
                .defaults
                .get(name)
                .map(|(rate, from)| (*rate, (*from).to_string())),
        }
    }

    /// Admits `job` now, or defers it to the slot the first spent cap books for it. The caps
    /// are asked narrowest first (`notify.sms`, then `notify`), and a broader one only once the
    /// narrower admits the effect: an SMS waiting for its channel's slot does not hold a slot
    /// of `notify` meanwhile, so 10,000 SMS at 10 a second leave the merchant's webhook notices
    /// their share of `notify`. A row a cap deferred before ([`DEFERRED`], naming the cap) has
    /// come back at its booked slot: that cap and the narrower ones are not asked again, the
    /// broader ones are. An effect no cap names, and a reminder of an order no longer PENDING
    /// (its executor sends nothing), run at once.
    ///
    /// # Errors
    /// [`EffectError::Deferred`] to the booked slot, naming the cap that was spent.
    pub async fn admit(&self, job: &Job<'_>) -> Result<(), EffectError> {
        let Some(work) = work::read(job.kind, &job.row.payload) else {
            return Ok(()); // the executor fails it as unreadable
        };
        if matches!(work, Work::Notify(NotifyWork::Remind(_)))
            && job.order_status != Some("PENDING")
        {
            return Ok(());
        }
        let mut narrow_first: Vec<String> = names(&work).into_iter().rev().collect();
        let booked = job
            .row
            .last_error
            .as_deref()
            .and_then(|e| e.strip_prefix(DEFERRED))
            .and_then(|rest| rest.split('`').next());
        if let Some(booked) = booked {
            match narrow_first.iter().position(|n| n == booked) {
                Some(i) => {
                    narrow_first.drain(..=i);
                }
                None => return Ok(()),
            }
        }
        let (now, merchant) = (job.now_ms, job.row.merchant_id.as_str());
        for name in narrow_first {
            let Some((rate, from)) = self.rate(merchant, &name) else {
                continue;
            };
            let slot = self.reserve(merchant, &name, rate, now).await;
            if slot > now {
                emit(Event::EffectCapped {
                    merchant,
                    cap: &name,
                });
                return Err(EffectError::Deferred {
                    until_ms: slot,
                    reason: format!(
                        "{DEFERRED}{name}` of merchant `{merchant}` ({rate}/s, {from}) spent"
                    ),
                });
            }
        }
        Ok(())
    }

    /// Books `merchant`'s next slot of cap `name` (`rate` a second) at or after `now_ms` (epoch
    /// ms), in the shared store when there is one and it answers, else in this process.
    async fn reserve(&self, merchant: &str, name: &str, rate: u32, now_ms: i64) -> i64 {
        let key = format!("{merchant}/{name}");
        let down_until = &self.shared_down_until;
        if let Some((redis, script)) = &self.shared
            && now_ms >= down_until.load(std::sync::atomic::Ordering::Relaxed)
        {
            let interval_us = 1_000_000 / i64::from(rate.max(1));
            let tolerance_us = i64::from(rate.max(1) - 1) * interval_us;
            let mut call = script.prepare_invoke();
            call.key(format!("timeoutd:cap:{merchant}:{name}"))
                .arg(now_ms * 1_000)
                .arg(interval_us)
                .arg(tolerance_us);
            match redis.invoke::<i64>(&call).await {
                Ok(slot_us) => return (slot_us + 999) / 1_000,
                Err(e) => {
                    tracing::warn!(merchant, cap = name, error = %e, pause_ms = SHARED_PAUSE_MS, "the shared cap store does not answer; this process's own caps apply meanwhile");
                    down_until.store(
                        now_ms + SHARED_PAUSE_MS,
                        std::sync::atomic::Ordering::Relaxed,
                    );
                }
            }
        }
        if self.shared.is_some() {
            emit(Event::EffectCapFallback { cap: name });
        }
        self.local
            .get(&rate)
            .map_or(now_ms, |cap| cap.reserve(&key, now_ms))
    }
}

#[cfg(test)]
mod tests {
    use timeoutd_runtime::model::Notice;

    use super::*;
    use crate::effects::work::{PaymentWork, RedisWork};

    #[test]
    fn each_work_counts_against_its_kinds_cap_and_a_notice_against_its_channels_too() {
        let notice = Notice {
            channel: "sms".into(),
            template: "t".into(),
            params: Vec::new(),
        };
        assert_eq!(
            names(&Work::Notify(NotifyWork::Remind(notice))),
            ["notify", "notify.sms"]
        );
        let slot = Work::Redis(RedisWork::ReleaseSlot {
            activity: "a".into(),
            user: "u".into(),
        });
        assert_eq!(names(&slot), ["redis"]);
        let close = Work::Payment(PaymentWork::Close {
            payment_ref: "p".into(),
        });
        assert_eq!(names(&close), ["payment"]);
        assert!(names(&Work::InTransaction).is_empty());
    }
}
