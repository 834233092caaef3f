//! Warm instances of heavy plugins, kept in one bounded least-recently-used pool per engine.
//!
//! A JavaScript or Python component carries its language runtime (12–18 MB of wasm) and takes
//! ~0.35 ms (JavaScript) to ~1.4 ms (Python) to instantiate, far more than its decision. Such a
//! plugin's `Store` and instance are kept after a successful call and reused by the next call of
//! the same plugin; the memory cap keeps applying (the `Store`'s limiter), the epoch deadline is
//! set per call, and the WASI clock and RNG are reset per call ([`CallState::begin_call`]). An
//! instance is dropped — never reused — after a call that failed in any way (trap, guest error,
//! oversized answer), after `RuntimeLimits::warm_max_calls` calls, and when the pool is over
//! `RuntimeLimits::max_warm_instances` (the least recently used one goes, whichever plugin owns
//! it).

use std::collections::VecDeque;
use std::sync::Mutex;

use wasmtime::Store;

use crate::bindings::VersionedInstance;
use crate::state::CallState;

/// One idle warm instance.
pub(crate) struct Warm {
    /// The [`crate::Plugin`] load that created it (a reloaded plugin is another owner).
    pub(crate) owner: u64,
    pub(crate) store: Store<CallState>,
    pub(crate) instance: VersionedInstance,
    /// Calls it has served.
    pub(crate) calls: u32,
}

/// The engine's idle warm instances, least recently used first.
pub(crate) struct WarmPool {
    capacity: usize,
    idle: Mutex<VecDeque<Warm>>,
}

impl WarmPool {
    /// A pool holding at most `capacity` idle instances (0 keeps none).
    pub(crate) fn new(capacity: usize) -> Self {
        WarmPool {
            capacity,
            idle: Mutex::new(VecDeque::with_capacity(capacity)),
        }
    }

    /// Takes the most recently used idle instance of `owner`, if any.
    pub(crate) fn take(&self, owner: u64) -> Option<Warm> {
        let mut idle = self.idle.lock().expect("warm pool lock poisoned");
        let at = idle.iter().rposition(|w| w.owner == owner)?;
        idle.remove(at)
    }

    /// Returns an instance after a successful call; evicts the least recently used idle
    /// instance when the pool is full. Stores are dropped outside the lock.
    pub(crate) fn put(&self, warm: Warm) {
        let evicted = {
            let mut idle = self.idle.lock().expect("warm pool lock poisoned");
            idle.push_back(warm);
            if idle.len() > self.capacity {
                idle.pop_front()
            } else {
                None
            }
        };
        drop(evicted);
    }

    /// Drops every idle instance of `owner` (its plugin is gone).
    pub(crate) fn purge(&self, owner: u64) {
        let dropped: Vec<Warm> = {
            let mut idle = self.idle.lock().expect("warm pool lock poisoned");
            let (gone, kept): (Vec<Warm>, Vec<Warm>) =
                idle.drain(..).partition(|w| w.owner == owner);
            idle.extend(kept);
            gone
        };
        drop(dropped);
    }

    /// Idle instances of `owner`.
    pub(crate) fn idle(&self, owner: u64) -> usize {
        let idle = self.idle.lock().expect("warm pool lock poisoned");
        idle.iter().filter(|w| w.owner == owner).count()
    }
}
