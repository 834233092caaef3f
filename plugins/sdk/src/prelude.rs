//! What a `#![no_std]` plugin takes from `alloc` that `std`'s prelude would give it:
//! `use timeoutd_policy_sdk::prelude::*;`. Shared by both SDKs.

pub use alloc::borrow::ToOwned;
pub use alloc::boxed::Box;
pub use alloc::string::{String, ToString};
pub use alloc::vec::Vec;
pub use alloc::{format, vec};
