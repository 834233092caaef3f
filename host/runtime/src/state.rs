//! The data of a call's `Store`: a locked-down WASI context, memory limits, and who is asking.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use wasmtime::component::ResourceTable;
use wasmtime::{StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::{HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::model::LogLevel;

/// Store data. A fresh instance gets its own and drops it with its `Store`; a warm instance
/// (see `warm.rs`) keeps it across calls and [`CallState::begin_call`] resets what is per call.
pub(crate) struct CallState {
    /// Built on the plugin's first WASI call: a pure decider makes none, and building a WASI
    /// context costs more than the whole decision.
    wasi: Option<WasiCtx>,
    /// The decision's `now`, read by the frozen wall clock; shared with it so a warm instance's
    /// clock follows each call.
    now_ms: Arc<AtomicI64>,
    table: ResourceTable,
    pub(crate) limits: StoreLimits,
    pub(crate) plugin: Arc<str>,
    pub(crate) order_id: String,
}

/// A wall clock frozen at the decision's `now`: a plugin reading the time sees the same instant
/// the host decides against (the database clock), and tests are deterministic.
struct FrozenClock(Arc<AtomicI64>);

impl HostWallClock for FrozenClock {
    fn resolution(&self) -> Duration {
        Duration::from_millis(1)
    }
    fn now(&self) -> Duration {
        Duration::from_millis(self.0.load(Ordering::Relaxed).max(0) as u64)
    }
}

impl CallState {
    /// State for a call deciding `order_id` at `now_ms`, memory capped at `max_memory_bytes`.
    pub(crate) fn new(
        plugin: Arc<str>,
        order_id: String,
        now_ms: i64,
        max_memory_bytes: usize,
    ) -> Self {
        CallState {
            wasi: None,
            now_ms: Arc::new(AtomicI64::new(now_ms)),
            table: ResourceTable::new(),
            limits: store_limits(max_memory_bytes),
            plugin,
            order_id,
        }
    }

    /// Points a warm instance's state at the next call: its order (for log lines) and its `now`
    /// (for the clock). The WASI context is rebuilt on the call's first WASI use, so
    /// `wasi:random` restarts from its seed and each call sees what a fresh instance would. The
    /// memory cap stays the one the instance was created under.
    pub(crate) fn begin_call(&mut self, order_id: &str, now_ms: i64) {
        self.order_id.clear();
        self.order_id.push_str(order_id);
        self.now_ms.store(now_ms, Ordering::Relaxed);
        self.wasi = None;
    }
}

/// Most bytes of one `log` line kept; the rest is cut.
const MAX_LOG_LINE: usize = 4096;

impl CallState {
    /// A plugin's `host.log` line (every API version's): cut to [`MAX_LOG_LINE`] bytes at a
    /// character boundary and written to the daemon's log, tagged with the plugin and the order.
    pub(crate) fn log(&mut self, level: LogLevel, mut message: String) {
        if message.len() > MAX_LOG_LINE {
            let mut cut = MAX_LOG_LINE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        let (plugin, order) = (&*self.plugin, self.order_id.as_str());
        match level {
            LogLevel::Trace => tracing::trace!(plugin, order, "{message}"),
            LogLevel::Debug => tracing::debug!(plugin, order, "{message}"),
            LogLevel::Info => tracing::info!(plugin, order, "{message}"),
            LogLevel::Warn => tracing::warn!(plugin, order, "{message}"),
            LogLevel::Error => tracing::error!(plugin, order, "{message}"),
        }
    }
}

fn store_limits(max_memory_bytes: usize) -> StoreLimits {
    // Core instances: a Rust component has a handful; a componentize-py one about a dozen.
    StoreLimitsBuilder::new()
        .memory_size(max_memory_bytes)
        .instances(64)
        .trap_on_grow_failure(true)
        .build()
}

/// Fixed seed of `wasi:random`: a policy is a pure function of its arguments, so the same
/// inputs must give the same decision (and a language runtime seeding its hash tables from
/// `wasi:random` still works).
const RANDOM_SEED: u64 = 0x7469_6d65_6f75_7464; // "timeoutd"

/// WASI with nothing granted: no environment, arguments, preopened directories, sockets or
/// name lookup; stdio goes nowhere; the wall clock reads the call's `now`; `wasi:random`
/// (secure and insecure) is a deterministic generator with a fixed seed.
fn locked_down_wasi(now_ms: Arc<AtomicI64>) -> WasiCtx {
    WasiCtxBuilder::new()
        .wall_clock(FrozenClock(now_ms))
        .secure_random(StdRng::seed_from_u64(RANDOM_SEED))
        .insecure_random(StdRng::seed_from_u64(RANDOM_SEED ^ 1))
        .insecure_random_seed(u128::from(RANDOM_SEED))
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .build()
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let now_ms = &self.now_ms;
        WasiCtxView {
            ctx: self
                .wasi
                .get_or_insert_with(|| locked_down_wasi(now_ms.clone())),
            table: &mut self.table,
        }
    }
}
