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
#[derive(Clone)]
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

    /// Instantiates the plugin into `store`.
    pub(crate) fn instantiate(
        &self,
        store: &mut Store<CallState>,
    ) -> wasmtime::Result<VersionedInstance> {
        match self {
            VersionedPre::V0_1_0(pre) => {
                v0_1_0::instantiate(pre, store).map(VersionedInstance::V0_1_0)
            }
        }
    }
}

/// An instance of a plugin of some supported API version, living in one `Store`.
pub(crate) enum VersionedInstance {
    /// `timeout:policy@0.1.0`.
    V0_1_0(v0_1_0::World),
}

impl VersionedInstance {
    /// Calls `decide`.
    pub(crate) fn decide(
        &self,
        store: &mut Store<CallState>,
        order: &Order,
        ctx: &Context,
    ) -> wasmtime::Result<Result<Decision, PolicyError>> {
        match self {
            VersionedInstance::V0_1_0(i) => v0_1_0::decide(i, store, order, ctx),
        }
    }

    /// Calls `check`.
    pub(crate) fn check(
        &self,
        store: &mut Store<CallState>,
        order: &Order,
        ctx: &Context,
    ) -> wasmtime::Result<CheckVerdict> {
        match self {
            VersionedInstance::V0_1_0(i) => v0_1_0::check(i, store, order, ctx),
        }
    }
}
