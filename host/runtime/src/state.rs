//! The data of one call's `Store`: a locked-down WASI context, memory limits, and who is asking.

use std::time::Duration;

use wasmtime::component::ResourceTable;
use wasmtime::{StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::{HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

/// Per-call store data. Built fresh for every call and dropped with its `Store`.
pub(crate) struct CallState {
    /// Built on the plugin's first WASI call: a pure decider makes none, and building a WASI
    /// context (stdio, RNG seeding) costs more than the whole decision.
    wasi: Option<WasiCtx>,
    now_ms: i64,
    table: ResourceTable,
    pub(crate) limits: StoreLimits,
    pub(crate) plugin: std::sync::Arc<str>,
    pub(crate) order_id: String,
}

/// A wall clock frozen at the decision's `now`: a plugin reading the time sees the same instant
/// the host decides against (the database clock), and tests are deterministic.
struct FrozenClock(Duration);

impl HostWallClock for FrozenClock {
    fn resolution(&self) -> Duration {
        Duration::from_millis(1)
    }
    fn now(&self) -> Duration {
        self.0
    }
}

impl CallState {
    /// State for one call deciding `order_id` at `now_ms`, memory capped at `max_memory_bytes`.
    pub(crate) fn new(
        plugin: std::sync::Arc<str>,
        order_id: String,
        now_ms: i64,
        max_memory_bytes: usize,
    ) -> Self {
        let limits = StoreLimitsBuilder::new()
            .memory_size(max_memory_bytes)
            .instances(16)
            .trap_on_grow_failure(true)
            .build();
        CallState {
            wasi: None,
            now_ms,
            table: ResourceTable::new(),
            limits,
            plugin,
            order_id,
        }
    }
}

/// WASI with nothing granted: no environment, arguments, preopened directories, sockets or
/// name lookup; stdio goes nowhere. The wall clock reads `now_ms`.
fn locked_down_wasi(now_ms: i64) -> WasiCtx {
    WasiCtxBuilder::new()
        .wall_clock(FrozenClock(Duration::from_millis(now_ms.max(0) as u64)))
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .build()
}

impl WasiView for CallState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let now_ms = self.now_ms;
        WasiCtxView {
            ctx: self.wasi.get_or_insert_with(|| locked_down_wasi(now_ms)),
            table: &mut self.table,
        }
    }
}
