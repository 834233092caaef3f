//! Guest SDK for timeoutd policy plugins, API `timeout:policy@0.2.0`.
//!
//! A plugin is a type implementing [`Policy`], registered with [`export_policy!`]:
//!
//! ```ignore
//! use timeoutd_policy_sdk::*;
//!
//! struct Mine;
//! impl Policy for Mine {
//!     fn describe() -> Manifest { /* its effect kinds and settings */ }
//!     fn decide(order: Order, ctx: Context) -> Result<Decision, PolicyError> { /* … */ }
//!     // `check` has a default: `standard_check(.., DEFAULT_MAX_CHECKS)`.
//! }
//! export_policy!(Mine);
//! ```
//!
//! Build with `cargo build --target wasm32-wasip2 --release`; the `.wasm` is a component. The
//! SDK stamps [`API_VERSION`] into it (custom section `timeout:policy-api`); the host reads the
//! stamp before compiling and refuses a version it does not run, naming both.
//!
//! What the host does with a plugin of this version (the rules the harness plays too):
//! - it calls `describe` once at load and refuses the plugin when its merchant's config does
//!   not fit the manifest (a declared effect kind not granted, a required setting missing, a
//!   value of the wrong type, a setting the plugin does not read);
//! - it asks `decide` at every trigger of an order, the first as soon as it sees the order's
//!   row (so a phase can come before the deadline), and refuses an effect of a kind the
//!   manifest does not declare;
//! - a `cancel` (or an `ignore`) before the deadline is held until the deadline, when the
//!   plugin is asked again: only the close is bound to the deadline, by the database clock;
//! - a `wait`'s `state` comes back as the next phase's `context.state` (at most 1024 bytes).
//!
//! Plugins are pure: they see the order and the context (whose `now-ms` is the database clock)
//! and return a decision. The host checks every effect against the order and owns every side
//! effect.
//!
//! This crate is standalone (its WIT is vendored in `wit/`): depend on it by path or git from
//! outside the timeoutd repository.
//!
//! **Without `std`.** With `default-features = false` the SDK builds without Rust's `std` on
//! `wasm32-wasip2` and brings what a plugin then needs: an allocator (wasi-libc's `malloc`), the
//! canonical ABI's `cabi_realloc`, and a panic handler that logs the panic through the host
//! before trapping. The plugin declares `#![no_std]` and takes `String`, `Vec`, `format!`, `vec!`
//! from [`prelude`]. Its component then imports no WASI at all, and a fresh-instance decision
//! costs about a fifth less (timeoutd's `plugins/README.md`). Every crate in the plugin's build
//! must do without `std`; natively (tests, clippy) the SDK keeps `std` either way.

#![cfg_attr(all(target_family = "wasm", not(feature = "std")), no_std)]
#![warn(missing_docs)]

extern crate alloc;

#[cfg(all(target_family = "wasm", not(feature = "std")))]
mod without_std;

pub mod prelude;

/// Bindings generated from `wit/policy.wit` (`timeout:policy@0.2.0`; they carry the WIT's own
/// documentation).
#[allow(missing_docs)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "policy",
        pub_export_macro: true,
        export_macro_name: "__export_policy_world",
        default_bindings_module: "timeoutd_policy_sdk::bindings",
    });
}

/// The `timeout:policy` version these bindings were generated from.
pub const API_VERSION: &str = "0.2.0";

/// The API-version stamp: a custom section `timeout:policy-api` holding [`API_VERSION`],
/// kept by the linker (`#[used]`) in every plugin built with this SDK.
#[cfg(target_family = "wasm")]
#[used]
#[unsafe(link_section = "timeout:policy-api")]
static API_VERSION_STAMP: [u8; API_VERSION.len()] = *b"0.2.0";

pub use bindings::timeout::policy::host::log;
pub use bindings::timeout::policy::types::*;

mod decide;
mod settings;
pub use decide::{cancel, release_everything, wait_until};
use prelude::*;
pub use settings::{Settings, parse_duration_ms};

/// Check-backs answered `unknown` before [`standard_check`] commits a pending order whose
/// deadline has not passed: RocketMQ asks a transactional half message back up to
/// `transactionCheckMax` times (15 by default), so 3 leaves the broker room to ask again.
pub const DEFAULT_MAX_CHECKS: u32 = 3;

/// A policy plugin. Implement it on a unit type and register it with [`export_policy!`].
pub trait Policy {
    /// What this plugin does: every effect kind its decisions may hold and every setting it
    /// reads (with type, default and meaning). Called once, when the host loads the plugin.
    fn describe() -> Manifest;

    /// What happens to `order` now (`ctx.now_ms`, the database clock), before or after its
    /// deadline. Return a [`Wait`] (with [`wait_until`]), a cancel ([`cancel`]) or an ignore.
    ///
    /// # Errors
    /// A [`PolicyError`] the host answers with the merchant's `on_plugin_error` rule.
    fn decide(order: Order, ctx: Context) -> Result<Decision, PolicyError>;

    /// The answer to a transactional half message's check-back. The default is
    /// [`standard_check`] with [`DEFAULT_MAX_CHECKS`].
    fn check(order: Order, ctx: Context) -> CheckVerdict {
        standard_check(&order, &ctx, DEFAULT_MAX_CHECKS)
    }
}

/// Registers a [`Policy`] as the component's exports: `export_policy!(MyPolicy);` once, at the
/// crate's top level.
#[macro_export]
macro_rules! export_policy {
    ($policy:ty) => {
        #[doc(hidden)]
        pub struct __TimeoutdPolicyExport;

        impl $crate::bindings::Guest for __TimeoutdPolicyExport {
            fn describe() -> $crate::Manifest {
                <$policy as $crate::Policy>::describe()
            }
            fn decide(
                order: $crate::Order,
                ctx: $crate::Context,
            ) -> ::core::result::Result<$crate::Decision, $crate::PolicyError> {
                <$policy as $crate::Policy>::decide(order, ctx)
            }
            fn check(order: $crate::Order, ctx: $crate::Context) -> $crate::CheckVerdict {
                <$policy as $crate::Policy>::check(order, ctx)
            }
        }

        $crate::bindings::__export_policy_world!(
            __TimeoutdPolicyExport with_types_in $crate::bindings
        );
    };
}

/// The seed-002 check-back answer: a paid or closed order — or one the provider says is paid
/// (`ctx.payment`) — rolls back (nothing to arm); a pending one commits once its deadline has
/// passed or the broker has asked `max_checks` times (`ctx.attempt` counts the broker's
/// checks), and is unknown before that.
pub fn standard_check(order: &Order, ctx: &Context, max_checks: u32) -> CheckVerdict {
    let paid_at_provider = ctx
        .payment
        .as_ref()
        .is_some_and(|p| p.status == PaymentStatus::Paid);
    match order.status {
        OrderStatus::Paid | OrderStatus::Closed => CheckVerdict::Rollback,
        OrderStatus::Pending if paid_at_provider => CheckVerdict::Rollback,
        OrderStatus::Pending if ctx.now_ms >= order.deadline_ms || ctx.attempt >= max_checks => {
            CheckVerdict::Commit
        }
        OrderStatus::Pending => CheckVerdict::Unknown,
    }
}

impl Setting {
    /// A setting of `value_type`; `default` `None` makes it required.
    pub fn new(name: &str, value_type: SettingType, default: Option<&str>, doc: &str) -> Self {
        Setting {
            name: name.to_string(),
            value_type,
            default: default.map(str::to_string),
            doc: doc.to_string(),
        }
    }

    /// A duration setting (`"90s"`, `"10m"`), read with [`Settings::duration_ms`].
    pub fn duration(name: &str, default: Option<&str>, doc: &str) -> Self {
        Self::new(name, SettingType::Duration, default, doc)
    }

    /// An amount in cents, read with [`Settings::integer`].
    pub fn cents(name: &str, default: Option<&str>, doc: &str) -> Self {
        Self::new(name, SettingType::Cents, default, doc)
    }

    /// A whole number, read with [`Settings::integer`].
    pub fn integer(name: &str, default: Option<&str>, doc: &str) -> Self {
        Self::new(name, SettingType::Integer, default, doc)
    }

    /// Text, read with [`Settings::text`].
    pub fn text(name: &str, default: Option<&str>, doc: &str) -> Self {
        Self::new(name, SettingType::Text, default, doc)
    }
}
