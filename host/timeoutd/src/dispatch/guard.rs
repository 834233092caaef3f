//! The host's check of a plugin's effects against the order. The rule itself lives in the
//! runtime crate ([`timeoutd_runtime::guard`]) so the merchant test harness applies the very same
//! rule; it is re-exported here where dispatch uses it.

pub use timeoutd_runtime::guard::{Review, check, check_granted, describe, review};
