//! Generated bindings, one module per released WIT version, and the one dispatch point.
//!
//! Each version module converts its generated types into and out of [`crate::model`]; only the
//! model carries logic. A future `timeout:policy@0.2.0` adds `v0_2_0.rs` and a variant to
//! [`VersionedPre`]; older plugins keep running through their own module.

pub(crate) mod v0_1_0;

/// The newest version this host speaks.
pub(crate) use v0_1_0 as latest;

use wasmtime::Store;

use crate::model::{CheckVerdict, Context, Decision, Order, PolicyError};
use crate::state::CallState;

/// A linked, ready-to-instantiate plugin of some supported API version.
pub(crate) enum VersionedPre {
    /// `timeout:policy@0.1.0`.
    V0_1_0(v0_1_0::PolicyPre<CallState>),
}

impl VersionedPre {
    /// The WIT version this plugin was built against.
    pub(crate) fn api_version(&self) -> &'static str {
        match self {
            VersionedPre::V0_1_0(_) => v0_1_0::VERSION,
        }
    }

    /// Instantiates into `store` and calls `decide`.
    pub(crate) fn decide(
        &self,
        store: &mut Store<CallState>,
        order: &Order,
        ctx: &Context,
    ) -> wasmtime::Result<Result<Decision, PolicyError>> {
        match self {
            VersionedPre::V0_1_0(pre) => v0_1_0::decide(pre, store, order, ctx),
        }
    }

    /// Instantiates into `store` and calls `check`.
    pub(crate) fn check(
        &self,
        store: &mut Store<CallState>,
        order: &Order,
        ctx: &Context,
    ) -> wasmtime::Result<CheckVerdict> {
        match self {
            VersionedPre::V0_1_0(pre) => v0_1_0::check(pre, store, order, ctx),
        }
    }
}
