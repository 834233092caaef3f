//! Test harness for timeoutd policy plugins.
//!
//! Plugins run here exactly as in the daemon: the same `timeoutd-runtime` engine, limits, locked
//! down WASI and the same guard over effects (a cancel may only give back what the order holds).
//!
//! ```no_run
//! use std::time::Duration;
//! use timeoutd_plugin_harness::{Harness, order};
//!
//! // Build this crate for wasm32-wasip2 (cached) and load it; or `Harness::load(path)`.
//! let harness = Harness::build_crate(env!("CARGO_MANIFEST_DIR"))
//!     .unwrap()
//!     .setting("grace", "5m");
//! // Play the daemon's timeline: phase 0 at the deadline, then whatever each `wait` asks for.
//! let mut timeline = harness.timeline(order("o-1").coupon("cpn-1").build());
//! let steps = timeline.advance_to(Duration::from_secs(15 * 60)); // created + 15 min
//! steps[0].decided.expect_wait().after(Duration::from_secs(300)).reminds();
//! let steps = timeline.advance_to(Duration::from_secs(20 * 60));
//! steps[0].decided.expect_cancel().kinds(&["restore-stock", "release-coupon", "notify"]);
//! ```
//!
//! Parts: [`Harness`] (load or build a plugin, call it), [`order`] / [`context`] builders,
//! [`Decided`] (assertions with readable failures), [`Timeline`] (the daemon's sequence of
//! triggers), [`cases`] (the declarative `CASES.toml` format that `timeoutd plugin test` runs).

#![warn(missing_docs)]

mod build;
mod builders;
pub mod cases;
mod decided;
mod timeline;

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

pub use build::{BuildError, build_crate};
pub use builders::{ContextBuilder, DEFAULT_CREATED_AT_MS, OrderBuilder, context, order};
pub use decided::{CancelView, Decided, WaitView};
pub use timeline::{Step, Timeline};
pub use timeoutd_runtime::model;
pub use timeoutd_runtime::{DecideError, LoadError, Plugin, PolicyEngine, RuntimeLimits, TrapKind};

use model::{CheckVerdict, Context, Order};

/// Why a harness could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The plugin did not load (not a component, unsupported API version, bad exports…).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// Building the crate under test for wasm32-wasip2 failed.
    #[error(transparent)]
    Build(#[from] BuildError),
    /// The engine could not be created with these limits.
    #[error("cannot create the policy engine: {0}")]
    Engine(String),
}

/// A plugin loaded into the production runtime, with the merchant settings it is called with.
#[derive(Clone, Debug)]
pub struct Harness {
    plugin: Plugin,
    settings: Vec<(String, String)>,
}

/// One engine per limits for the process: engines own an epoch thread and an instance pool.
fn shared_engine(limits: &RuntimeLimits) -> Result<PolicyEngine, HarnessError> {
    static DEFAULT: OnceLock<Result<PolicyEngine, String>> = OnceLock::new();
    if format!("{limits:?}") == format!("{:?}", RuntimeLimits::default()) {
        return DEFAULT
            .get_or_init(|| PolicyEngine::new(RuntimeLimits::default(), None))
            .clone()
            .map_err(HarnessError::Engine);
    }
    PolicyEngine::new(limits.clone(), None).map_err(HarnessError::Engine)
}

impl Harness {
    /// Loads the component at `path` under the production default [`RuntimeLimits`].
    ///
    /// # Errors
    /// [`HarnessError::Load`] naming the file and what was wrong with it.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, HarnessError> {
        Self::load_with(path, &RuntimeLimits::default())
    }

    /// Loads the component at `path` under `limits` (use your config's `runtime.deadline` and
    /// `runtime.max_memory_mib`).
    ///
    /// # Errors
    /// As [`Harness::load`].
    pub fn load_with(path: impl AsRef<Path>, limits: &RuntimeLimits) -> Result<Self, HarnessError> {
        let path = path.as_ref();
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("plugin");
        let plugin = shared_engine(limits)?.load_file(name, path)?;
        Ok(Self::from_plugin(plugin))
    }

    /// Loads a component from bytes, under the production default limits.
    ///
    /// # Errors
    /// [`HarnessError::Load`].
    pub fn from_bytes(name: &str, bytes: &[u8]) -> Result<Self, HarnessError> {
        let plugin = shared_engine(&RuntimeLimits::default())?.load(name, bytes)?;
        Ok(Self::from_plugin(plugin))
    }

    /// Wraps an already loaded plugin.
    pub fn from_plugin(plugin: Plugin) -> Self {
        Harness {
            plugin,
            settings: Vec::new(),
        }
    }

    /// Builds the plugin crate at `manifest_dir` for wasm32-wasip2 (see [`build_crate`]; built
    /// once per process, incrementally across runs) and loads it under the default limits.
    /// In a plugin's own tests: `Harness::build_crate(env!("CARGO_MANIFEST_DIR"))`.
    ///
    /// # Errors
    /// [`HarnessError::Build`] with cargo's output, or [`HarnessError::Load`].
    pub fn build_crate(manifest_dir: impl AsRef<Path>) -> Result<Self, HarnessError> {
        let wasm = build_crate(manifest_dir.as_ref())?;
        Self::load(wasm)
    }

    /// Adds (or replaces) a merchant setting every call is made with, as in
    /// `[merchants.<id>.settings]`.
    pub fn setting(mut self, key: &str, value: &str) -> Self {
        set(&mut self.settings, key, value);
        self
    }

    /// The loaded plugin (name, digest, API version).
    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    /// The settings calls are made with.
    pub fn settings(&self) -> &[(String, String)] {
        &self.settings
    }

    /// Calls `decide` with `ctx` as given (its settings are used, not the harness's).
    pub fn decide_with(&self, order: &Order, ctx: &Context) -> Decided {
        Decided {
            plugin: self.plugin.name().to_string(),
            order: order.clone(),
            context: ctx.clone(),
            result: self.plugin.decide(order, ctx),
        }
    }

    /// Calls `decide` at `now_ms` for `phase` (outbox trigger, attempt 0) with the harness's
    /// settings.
    pub fn decide(&self, order: &Order, now_ms: i64, phase: u32) -> Decided {
        let ctx = context()
            .now_ms(now_ms)
            .phase(phase)
            .settings(&self.settings)
            .build();
        self.decide_with(order, &ctx)
    }

    /// Calls `check` (the transactional check-back) with `ctx` as given.
    ///
    /// # Errors
    /// A trap or host failure, as in the daemon.
    pub fn check_with(&self, order: &Order, ctx: &Context) -> Result<CheckVerdict, DecideError> {
        self.plugin.check(order, ctx)
    }

    /// A timeline for `order` as the daemon would play it (see [`Timeline`]).
    pub fn timeline(&self, order: Order) -> Timeline<'_> {
        Timeline::new(self, order)
    }
}

/// Sets `key` to `value` in a settings list, keeping the first position of an existing key.
fn set(settings: &mut Vec<(String, String)>, key: &str, value: &str) {
    match settings.iter_mut().find(|(k, _)| k == key) {
        Some(entry) => entry.1 = value.to_string(),
        None => settings.push((key.to_string(), value.to_string())),
    }
}

/// `d` in milliseconds, saturating.
pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
