//! The one wasmtime [`Engine`] of a process, its limits and its epoch ticker.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::error::LoadError;
use crate::plugin::Plugin;

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
        }
    }
}

/// The shared engine: cheap to clone, one per process.
#[derive(Clone)]
pub struct PolicyEngine {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    limits: RuntimeLimits,
    cache_dir: Option<PathBuf>,
    ticker_stop: Arc<AtomicBool>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
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
            .max_memory_size(limits.max_memory_bytes)
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
        let engine = Engine::new(&config).map_err(|e| e.to_string())?;
        if let Some(dir) = cache_dir {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create plugin cache {}: {e}", dir.display()))?;
        }
        let ticker_stop = Arc::new(AtomicBool::new(false));
        spawn_epoch_ticker(engine.clone(), limits.epoch_tick, ticker_stop.clone());
        Ok(PolicyEngine {
            inner: Arc::new(Inner {
                engine,
                limits,
                cache_dir: cache_dir.map(Path::to_path_buf),
                ticker_stop,
            }),
        })
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

    /// Deadline in epoch ticks (at least 1).
    pub(crate) fn deadline_ticks(&self) -> u64 {
        let l = &self.inner.limits;
        let tick = l.epoch_tick.as_nanos().max(1);
        (l.deadline.as_nanos().div_ceil(tick) as u64).max(1)
    }

    /// Loads a plugin from bytes: version check, compile (or cache hit), link.
    ///
    /// # Errors
    /// [`LoadError`] naming the plugin and what was wrong.
    pub fn load(&self, name: &str, bytes: &[u8]) -> Result<Plugin, LoadError> {
        Plugin::load(self.clone(), name, bytes)
    }

    /// Loads a plugin from a file.
    ///
    /// # Errors
    /// [`LoadError::Read`] when the file cannot be read, else as [`PolicyEngine::load`].
    pub fn load_file(&self, name: &str, path: &Path) -> Result<Plugin, LoadError> {
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            plugin: name.to_string(),
            path: path.display().to_string(),
            source,
        })?;
        self.load(name, &bytes)
    }
}

fn spawn_epoch_ticker(engine: Engine, tick: Duration, stop: Arc<AtomicBool>) {
    std::thread::Builder::new()
        .name("timeoutd-epoch".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(tick);
                engine.increment_epoch();
            }
        })
        .expect("spawn epoch ticker thread");
}
