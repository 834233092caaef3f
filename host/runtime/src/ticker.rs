//! The epoch ticker: the one thread that advances the engine's epoch, which is what makes a
//! plugin call's deadline trap (wasmtime's epoch interruption: a `Store` traps once the epoch
//! passes its deadline, see `Store::set_epoch_deadline`).
//!
//! It ticks every [`crate::RuntimeLimits::epoch_tick`] while plugin code runs and for
//! [`IDLE_LINGER`] after the last call ends, then sleeps until the next call begins. An idle
//! daemon's ticker had woken 1,000 times a second for nothing: about 70 % of the idle process's
//! CPU (docs/performance.md). A call marks itself running with [`EpochTicker::enter`] before
//! its `Store` gets a deadline, so a sleeping ticker is woken before the deadline starts to
//! count, and the deadline still counts whole ticks from there.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::Thread;
use std::time::{Duration, Instant};

use wasmtime::Engine;

/// How long the ticker keeps ticking after the last call ended before it sleeps: a burst's
/// calls, microseconds apart, never wake it; a daemon idle for longer does not pay for it.
pub(crate) const IDLE_LINGER: Duration = Duration::from_millis(100);

/// Handle to the ticker thread; stops it when dropped.
pub(crate) struct EpochTicker {
    shared: Arc<Shared>,
    thread: Thread,
}

/// What the ticker and the calls share.
struct Shared {
    /// Plugin calls (and loads' `describe`) running now.
    running: AtomicUsize,
    /// The ticker is asleep (or about to be) and must be unparked by the next call.
    asleep: AtomicBool,
    stop: AtomicBool,
    /// Epoch increments so far.
    ticks: AtomicU64,
}

/// Marks one call running while it lives; see [`EpochTicker::enter`].
pub(crate) struct Running<'a>(&'a Shared);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

impl EpochTicker {
    /// Starts the ticker thread (`timeoutd-epoch`) for `engine`, ticking every `tick`.
    ///
    /// # Panics
    /// When the thread cannot be spawned (the process is out of threads).
    pub(crate) fn spawn(engine: Engine, tick: Duration) -> Self {
        let shared = Arc::new(Shared {
            running: AtomicUsize::new(0),
            asleep: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            ticks: AtomicU64::new(0),
        });
        let s = shared.clone();
        let handle = std::thread::Builder::new()
            .name("timeoutd-epoch".into())
            .spawn(move || run(&engine, tick, &s))
            .expect("spawn epoch ticker thread");
        EpochTicker {
            shared,
            thread: handle.thread().clone(),
        }
    }

    /// Marks a call running until the returned guard drops, waking the ticker if it sleeps.
    /// Call it before the call's `Store` gets its epoch deadline.
    pub(crate) fn enter(&self) -> Running<'_> {
        self.shared.running.fetch_add(1, Ordering::SeqCst);
        // Pairs with the ticker's store to `asleep` and load of `running` (both SeqCst): either
        // this load sees it asleep and unparks it, or the ticker sees this call and stays up.
        if self.shared.asleep.load(Ordering::SeqCst) {
            self.thread.unpark();
        }
        Running(&self.shared)
    }

    /// Epoch increments so far: still while the engine is idle, one per tick while calls run.
    pub(crate) fn ticks(&self) -> u64 {
        self.shared.ticks.load(Ordering::Relaxed)
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.thread.unpark();
    }
}

fn run(engine: &Engine, tick: Duration, shared: &Shared) {
    let mut last_busy = Instant::now();
    while !shared.stop.load(Ordering::Relaxed) {
        std::thread::sleep(tick);
        engine.increment_epoch();
        shared.ticks.fetch_add(1, Ordering::Relaxed);
        if shared.running.load(Ordering::SeqCst) > 0 {
            last_busy = Instant::now();
            continue;
        }
        if last_busy.elapsed() < IDLE_LINGER {
            continue;
        }
        shared.asleep.store(true, Ordering::SeqCst);
        // `park` may return spuriously, and an `unpark` from before it makes it return at once.
        while shared.running.load(Ordering::SeqCst) == 0 && !shared.stop.load(Ordering::SeqCst) {
            std::thread::park();
        }
        shared.asleep.store(false, Ordering::SeqCst);
        last_busy = Instant::now();
    }
}
