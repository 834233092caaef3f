//! timeoutd's policy host: the wasmtime side of timeoutd.
//!
//! This crate owns everything between a merchant's policy plugin (a WebAssembly component built
//! against the WIT package `timeout:policy`, see `wit/`) and the daemon, and nothing else: it has
//! no database, broker or Redis dependency, so the merchant test harness can reuse it and test
//! plugins under exactly the production engine, limits and WASI settings.
//!
//! Shape of a call:
//! 1. [`PolicyEngine::new`] builds the one [`wasmtime::Engine`] (pooling allocator, epoch
//!    interruption) and starts its epoch ticker, which ticks only while plugin code runs.
//! 2. [`PolicyEngine::load`] checks that the bytes are a component of a supported API version
//!    (the SDK's stamp, read by [`inspect()`] before anything is compiled), compiles it once (cached on disk, keyed by the engine's compatibility hash and the component's
//!    digest) and links it into an `InstancePre`.
//! 3. [`Plugin::decide`] / [`Plugin::check`] instantiate a fresh `Store` per call, with a memory
//!    cap, an epoch deadline and a WASI clock set to the decision's `now`, and convert the answer
//!    into the version-independent types of [`model`]. A trap throws that `Store` away and nothing
//!    else. Heavy components (JavaScript, Python: a language runtime inside) instead reuse warm
//!    instances from a bounded LRU pool, under the same per-call limits ([`InstanceMode`]).
//!
//! Failures come in three tiers, kept apart in [`DecideError`]: the guest's own domain error
//! (`policy-error`), a trap (deadline, memory, panic), and host-side problems.

#![warn(missing_docs)]

mod bindings;
mod cache;
pub mod duration;
mod engine;
mod error;
pub mod guard;
mod inspect;
mod load;
pub mod model;
mod plugin;
pub mod retry;
mod state;
mod ticker;
mod warm;

pub use engine::{Allocator, InstanceMode, PluginLimits, PolicyEngine, RuntimeLimits};
pub use error::{DecideError, LoadError, TrapKind};
pub use inspect::{API_VERSION_SECTION, Inspection, inspect};
pub use plugin::Plugin;

/// The WIT API versions this host can run, oldest first (`timeout:policy@<version>`); derived
/// from the bindings' one table (`bindings.rs`).
pub const SUPPORTED_API_VERSIONS: &[&str] = bindings::SUPPORTED;
