//! The one wasmtime [`Engine`] of a process, its limits and its epoch ticker.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::ticker::{EpochTicker, Running};
use crate::warm::WarmPool;

/// Limits applied to every plugin call.
#[derive(Debug, Clone)]
pub struct RuntimeLimits {
    /// Wall time a single `decide`/`check` may run before it traps (rounded up to whole epoch
    /// ticks of [`RuntimeLimits::epoch_tick`]).
    pub deadline: Duration,
    /// Period of the epoch ticker; the deadline's resolution.
    pub epoch_tick: Duration,
    /// Largest linear memory a plugin may grow to, bytes.
    pub max_memory_bytes: usize,
    /// Instances that may be live at once across all plugins (the pooling allocator's size).
    pub max_concurrent_instances: u32,
    /// Most effects one `cancel` may carry.
    pub max_effects: usize,
    /// Longest string a plugin may return in any field, bytes.
    pub max_string_bytes: usize,
    /// Largest memory cap any one plugin may be given with [`PluginLimits`], bytes: the size of
    /// the pooling allocator's memory slots. Raised to `max_memory_bytes` when smaller.
    pub max_plugin_memory_bytes: usize,
    /// Components of at least this many bytes are *heavy* and run on warm instances (see
    /// [`InstanceMode`]); smaller ones get a fresh instance per call. The default, 2 MiB, puts
    /// Rust plugins (tens to hundreds of KiB, ~10 µs to instantiate) on fresh instances and
    /// JavaScript / Python ones (12–18 MiB: a language runtime, ~0.35 / ~1.4 ms to instantiate) on
    /// warm ones. `usize::MAX` turns warm instances off.
    pub warm_min_component_bytes: usize,
    /// Idle warm instances kept across all plugins; the least recently used goes first.
    pub max_warm_instances: usize,
    /// Calls one warm instance serves before it is dropped and a fresh one takes its place
    /// (bounds whatever a language runtime accumulates, e.g. a fragmented heap).
    pub warm_max_calls: u32,
}

/// The limits of one plugin's calls, when they differ from the engine's defaults
/// ([`PolicyEngine::load_with`]): a JavaScript or Python plugin needs a larger memory cap and
/// deadline than a Rust one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PluginLimits {
    /// Wall time one call may run before it traps.
    pub deadline: std::time::Duration,
    /// Largest linear memory the plugin may grow to, bytes; at most
    /// [`RuntimeLimits::max_plugin_memory_bytes`].
    pub max_memory_bytes: usize,
}

/// How a plugin's calls get their instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceMode {
    /// A fresh instance (and `Store`) per call, dropped after it.
    Fresh,
    /// Warm instances from the engine's bounded pool (heavy components, see
    /// [`RuntimeLimits::warm_min_component_bytes`]).
    Warm,
}

impl Default for RuntimeLimits {
    fn default() -> Self {
        RuntimeLimits {
            deadline: Duration::from_millis(50),
            epoch_tick: Duration::from_millis(1),
            max_memory_bytes: 64 << 20,
            max_concurrent_instances: 256,
            max_effects: 64,
            max_string_bytes: 4096,
            max_plugin_memory_bytes: 64 << 20,
            warm_min_component_bytes: 2 << 20,
            max_warm_instances: 8,
            warm_max_calls: 1000,
        }
    }
}

/// The instance allocator the engine ended up with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allocator {
    /// The pooling allocator: slots reserved at start, instantiation in microseconds.
    Pooling,
    /// The on-demand allocator, because the pool could not reserve its virtual memory
    /// (`ulimit -v`, a small host): each instance maps its own memory.
    OnDemand {
        /// Why the pooling allocator could not be built (wasmtime's message).
        pooling_error: String,
    },
}

/// The shared engine: cheap to clone, one per process.
#[derive(Clone)]
pub struct PolicyEngine {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    allocator: Allocator,
    limits: RuntimeLimits,
    cache_dir: Option<PathBuf>,
    /// Stops its thread when the last clone of the engine drops.
    ticker: EpochTicker,
    warm: WarmPool,
}

impl PolicyEngine {
    /// Builds the engine. `cache_dir`, when given, holds precompiled components (created if
    /// missing); without it every load compiles.
    ///
    /// # Errors
    /// The engine's message when the configuration cannot be honoured on this host.
    pub fn new(limits: RuntimeLimits, cache_dir: Option<&Path>) -> Result<Self, String> {
        let mut pool = PoolingAllocationConfig::default();
        // A component built by wasm32-wasip2 Rust is a few core instances (the program and its
        // adapter shims), one memory and a couple of tables; size the pool for that.
        pool.total_component_instances(limits.max_concurrent_instances)
            .total_core_instances(limits.max_concurrent_instances * 8)
            .total_memories(limits.max_concurrent_instances * 2)
            .total_tables(limits.max_concurrent_instances * 4)
            .max_memory_size(limits.max_memory_bytes.max(limits.max_plugin_memory_bytes))
            // Keep the first pages of a released slot resident and reset them in place instead of
            // unmapping: re-instantiating the same plugin then faults in nothing. A Rust guest's
            // 1 MiB shadow stack sits below its data and heap, so 4 MiB covers what a decision
            // touches (with pagemap scan only dirtied pages are reset, so the size costs little).
            // Untuned, instantiate+decide measured ~25 µs here and got slower with more threads
            // (madvise contention).
            .linear_memory_keep_resident(4 << 20)
            .table_keep_resident(64 << 10)
            // Linux 6.7+: reset only the pages a call dirtied (found by PAGEMAP_SCAN).
            .pagemap_scan(Enabled::Auto);
        let mut config = Config::new();
        config
            .wasm_component_model(true)
            .epoch_interruption(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let (engine, allocator) = match Engine::new(&config) {
            Ok(engine) => (engine, Allocator::Pooling),
            Err(pooling) => {
                // The pool reserves its slots' address space up front (gigabytes per slot);
                // under `ulimit -v` or on a small host that fails. Instances are then
                // allocated on demand, each reserving only its memory cap (bounds-checked
                // accesses instead of guard pages: slower, but it runs).
                let ceiling = limits.max_memory_bytes.max(limits.max_plugin_memory_bytes) as u64;
                config
                    .allocation_strategy(InstanceAllocationStrategy::OnDemand)
                    .memory_reservation(ceiling)
                    .memory_reservation_for_growth(0)
                    .memory_guard_size(64 << 10);
                let engine = Engine::new(&config).map_err(|e| {
                    format!("pooling allocator: {pooling}; on-demand allocator: {e}")
                })?;
                tracing::warn!(
                    error = %format!("{pooling:#}"),
                    "the pooling allocator could not reserve its address space (ulimit -v, a small host?); \
                     plugin instances are allocated on demand instead, slower to instantiate"
                );
                (
                    engine,
                    Allocator::OnDemand {
                        pooling_error: format!("{pooling:#}"),
                    },
                )
            }
        };
        if let Some(dir) = cache_dir {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create plugin cache {}: {e}", dir.display()))?;
        }
        let ticker = EpochTicker::spawn(engine.clone(), limits.epoch_tick);
        Ok(PolicyEngine {
            inner: Arc::new(Inner {
                engine,
                allocator,
                cache_dir: cache_dir.map(Path::to_path_buf),
                ticker,
                warm: WarmPool::new(limits.max_warm_instances),
                limits,
            }),
        })
    }

    /// How instances get their memory: the pooling allocator, or the on-demand one when the
    /// pool's address space could not be reserved (the caller warns with the reason).
    pub fn allocator(&self) -> &Allocator {
        &self.inner.allocator
    }

    /// The wasmtime engine.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The limits every call runs under.
    pub fn limits(&self) -> &RuntimeLimits {
        &self.inner.limits
    }

    pub(crate) fn cache_dir(&self) -> Option<&Path> {
        self.inner.cache_dir.as_deref()
    }

    pub(crate) fn warm(&self) -> &WarmPool {
        &self.inner.warm
    }

    /// Marks a plugin call running (waking the epoch ticker if it sleeps) until the guard
    /// drops; taken before the call's `Store` gets its epoch deadline.
    pub(crate) fn running(&self) -> Running<'_> {
        self.inner.ticker.enter()
    }

    /// Epoch ticks so far. They advance every [`RuntimeLimits::epoch_tick`] while a plugin call
    /// runs and for 100 ms after the last one, and stand still while the engine is idle (the
    /// ticker thread sleeps instead of waking 1,000 times a second).
    pub fn epoch_ticks(&self) -> u64 {
        self.inner.ticker.ticks()
    }

    /// `deadline` in epoch ticks (at least 1).
    pub(crate) fn deadline_ticks(&self, deadline: Duration) -> u64 {
        let tick = self.inner.limits.epoch_tick.as_nanos().max(1);
        (deadline.as_nanos().div_ceil(tick) as u64).max(1)
    }

    /// The engine's default per-plugin limits (`deadline`, `max_memory_bytes`).
    pub fn default_plugin_limits(&self) -> PluginLimits {
        PluginLimits {
            deadline: self.inner.limits.deadline,
            max_memory_bytes: self.inner.limits.max_memory_bytes,
        }
    }

    /// The most memory one plugin may be given, bytes: the larger of the engine's default and
    /// its `max_plugin_memory_bytes`.
    pub(crate) fn plugin_memory_ceiling(&self) -> usize {
        self.inner
            .limits
            .max_memory_bytes
            .max(self.inner.limits.max_plugin_memory_bytes)
    }
}
