//! Guest SDK for timeoutd policy plugins.
//!
//! A plugin implements [`Guest`] (`decide` and `check` of the `timeout:policy@0.1.0` world) and
//! registers it with [`export_policy!`]:
//!
//! ```ignore
//! struct MyPolicy;
//! impl timeoutd_policy_sdk::Guest for MyPolicy { /* decide, check */ }
//! timeoutd_policy_sdk::export_policy!(MyPolicy with_types_in timeoutd_policy_sdk::bindings);
//! ```
//!
//! Build with `cargo build --target wasm32-wasip2 --release`; the output `.wasm` is a component.
//! The SDK stamps the API version its bindings were generated from ([`API_VERSION`]) into the
//! component as the custom section `timeout:policy-api`; the host reads it before compiling and
//! refuses a version it does not run, naming both.
//! Plugins are pure: they see the order and the context (whose `now-ms` is the database clock)
//! and return a decision. The host checks every effect against the order.
//!
//! **Without `std`.** With `default-features = false` a plugin builds without Rust's `std` on
//! `wasm32-wasip2`, as with the 0.2 SDK (whose file this SDK includes): it declares
//! `#![no_std]`, takes `String`, `Vec`, `format!`, `vec!` from [`prelude`], and its component
//! imports no WASI.

#![cfg_attr(all(target_family = "wasm", not(feature = "std")), no_std)]
#![warn(missing_docs)]

extern crate alloc;

// The allocator, `cabi_realloc` and panic handler of a plugin without `std`: one file for both
// SDKs, kept in the 0.2 SDK.
#[cfg(all(target_family = "wasm", not(feature = "std")))]
#[path = "../../sdk/src/without_std.rs"]
mod without_std;

#[path = "../../sdk/src/prelude.rs"]
pub mod prelude;
use prelude::*;

/// Bindings generated from `wit/v0.1.0` (they carry the WIT's own documentation).
#[allow(missing_docs)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit/v0.1.0",
        world: "policy",
        pub_export_macro: true,
        export_macro_name: "export_policy",
        default_bindings_module: "timeoutd_policy_sdk::bindings",
    });
}

/// The `timeout:policy` version these bindings were generated from (`wit/v0.1.0`).
pub const API_VERSION: &str = "0.1.0";

/// The API-version stamp: a custom section `timeout:policy-api` holding [`API_VERSION`],
/// kept by the linker (`#[used]`) in every plugin built with this SDK.
#[cfg(target_family = "wasm")]
#[used]
#[unsafe(link_section = "timeout:policy-api")]
static API_VERSION_STAMP: [u8; API_VERSION.len()] = *b"0.1.0";

pub use bindings::timeout::policy::host::log;
pub use bindings::timeout::policy::types::*;
pub use bindings::{Guest, export_policy};

mod settings;
pub use settings::{Settings, parse_duration_ms};

/// The standard effects of closing `order`: give back each line's stock, release the coupon,
/// close the payment, and — when `flash_sale` and the order belongs to an activity — restore the
/// activity's stock and free the buyer's slot; then `notice`, if any.
pub fn release_everything(order: &Order, flash_sale: bool, notice: Option<Notice>) -> Vec<Effect> {
    let mut effects: Vec<Effect> = order
        .items
        .iter()
        .map(|i| Effect::RestoreStock((i.sku.clone(), i.quantity)))
        .collect();
    if let Some(coupon) = &order.coupon {
        effects.push(Effect::ReleaseCoupon(coupon.clone()));
    }
    if flash_sale && let Some(activity) = &order.flash_activity {
        let units = order.items.iter().map(|i| i.quantity).sum();
        effects.push(Effect::RestoreFlashStock((activity.clone(), units)));
        effects.push(Effect::ReleaseFlashSlot((
            activity.clone(),
            order.user.clone(),
        )));
    }
    if let Some(payment) = &order.payment_ref {
        effects.push(Effect::ClosePayment(payment.clone()));
    }
    effects.extend(notice.map(Effect::Notify));
    effects
}

/// The seed-002 check-back answer: a paid or closed order rolls back (nothing to arm); a pending
/// one commits once its deadline has passed or the broker has asked `max_checks` times, and is
/// unknown before that.
pub fn standard_check(order: &Order, ctx: &Context, max_checks: u32) -> CheckVerdict {
    match order.status {
        OrderStatus::Paid | OrderStatus::Closed => CheckVerdict::Rollback,
        OrderStatus::Pending if ctx.now_ms >= order.deadline_ms || ctx.attempt >= max_checks => {
            CheckVerdict::Commit
        }
        OrderStatus::Pending => CheckVerdict::Unknown,
    }
}
