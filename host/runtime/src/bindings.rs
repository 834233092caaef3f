//! Generated bindings, one module per released WIT version, and the one dispatch point.
//!
//! Each version module (`v0_1_0.rs`, …) is generated from its frozen folder under `wit/` and
//! converts its types into and out of [`crate::model`]; only the model carries logic. Every
//! version module has the same items: `VERSION`, `add_to_linker`, `PolicyPre`, `World`,
//! `instantiate`, `decide`, `check`.
//!
//! Adding an API version is a frozen `wit/vX.Y.Z/`, one `vX_Y_Z.rs` here and one line in the
//! [`api_versions!`] table below. The list of supported versions
//! ([`crate::SUPPORTED_API_VERSIONS`]), the version a plugin is linked against (picked by its
//! stamp, see [`link`]) and the dispatch of each call all come from that table. Older plugins
//! keep running through their own module. (Zed's extension host keeps one bindings module per
//! `zed:extension` version the same way.)

pub(crate) mod v0_1_0;
pub(crate) mod v0_2_0;

use wasmtime::Store;
use wasmtime::component::{Component, Linker};

use crate::model::{CheckVerdict, Context, Decision, Manifest, Order, PolicyError};
use crate::state::CallState;

/// Declares, from one table of `module => Variant`, oldest first: the supported versions,
/// the linked and instantiated plugin of each version, and the calls' dispatch.
macro_rules! api_versions {
    ($($module:ident => $variant:ident,)+) => {
        /// The WIT API versions this host runs, oldest first.
        pub(crate) const SUPPORTED: &[&str] = &[$($module::VERSION,)+];

        /// A linked, ready-to-instantiate plugin of some supported API version.
        #[derive(Clone)]
        pub(crate) enum VersionedPre {
            $(
                #[doc = concat!("Built against `", stringify!($module), "`.")]
                $variant($module::PolicyPre<CallState>),
            )+
        }

        /// An instance of a plugin of some supported API version, living in one `Store`.
        pub(crate) enum VersionedInstance {
            $(
                #[doc = concat!("Built against `", stringify!($module), "`.")]
                $variant($module::World),
            )+
        }

        impl VersionedPre {
            /// The WIT version this plugin was built against.
            pub(crate) fn api_version(&self) -> &'static str {
                match self {
                    $(VersionedPre::$variant(_) => $module::VERSION,)+
                }
            }

            /// Whether plugins of this version are asked before the order's deadline (0.2.0 on);
            /// a 0.1.0 plugin's early trigger is deferred to the deadline without asking.
            pub(crate) fn asks_before_deadline(&self) -> bool {
                match self {
                    $(VersionedPre::$variant(_) => $module::ASKS_BEFORE_DEADLINE,)+
                }
            }

            /// Instantiates the plugin into `store`.
            pub(crate) fn instantiate(
                &self,
                store: &mut Store<CallState>,
            ) -> wasmtime::Result<VersionedInstance> {
                match self {
                    $(VersionedPre::$variant(pre) => {
                        $module::instantiate(pre, store).map(VersionedInstance::$variant)
                    })+
                }
            }
        }

        impl VersionedInstance {
            /// Calls `describe`; `None` for a version without it (0.1.0).
            pub(crate) fn describe(
                &self,
                store: &mut Store<CallState>,
            ) -> wasmtime::Result<Option<Manifest>> {
                match self {
                    $(VersionedInstance::$variant(i) => $module::describe(i, store),)+
                }
            }

            /// Calls `decide`.
            pub(crate) fn decide(
                &self,
                store: &mut Store<CallState>,
                order: &Order,
                ctx: &Context,
            ) -> wasmtime::Result<Result<Decision, PolicyError>> {
                match self {
                    $(VersionedInstance::$variant(i) => $module::decide(i, store, order, ctx),)+
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
                    $(VersionedInstance::$variant(i) => $module::check(i, store, order, ctx),)+
                }
            }
        }

        /// Links `component` as a plugin of API `version` (one of [`SUPPORTED`]): that version's
        /// imports are added to `linker` (which already has WASI), and its world's exports are
        /// looked up.
        ///
        /// # Errors
        /// `(stage, reason)`: `"link"` when an import is missing or mistyped or the component
        /// does not export the version's world; `"version"` for a version not in [`SUPPORTED`]
        /// (the caller checks first, so that one is a bug).
        pub(crate) fn link(
            version: &str,
            mut linker: Linker<CallState>,
            component: &Component,
        ) -> Result<VersionedPre, (&'static str, String)> {
            $(
                if version == $module::VERSION {
                    $module::add_to_linker(&mut linker).map_err(|e| ("link", format!("{e:?}")))?;
                    let instance_pre = linker
                        .instantiate_pre(component)
                        .map_err(|e| ("link", format!("{e:?}")))?;
                    let pre = $module::PolicyPre::new(instance_pre).map_err(|e| {
                        (
                            "link",
                            format!(
                                "does not export the timeout:policy@{} world: {e:?}",
                                $module::VERSION
                            ),
                        )
                    })?;
                    return Ok(VersionedPre::$variant(pre));
                }
            )+
            Err(("version", format!("no bindings for timeout:policy@{version}")))
        }
    };
}

api_versions! {
    v0_1_0 => V0_1_0,
    v0_2_0 => V0_2_0,
}

/// The newest version this host runs: what a component that names no version (no stamp, no
/// `timeout:policy` import) is tried as.
pub(crate) fn latest() -> &'static str {
    SUPPORTED[SUPPORTED.len() - 1]
}
