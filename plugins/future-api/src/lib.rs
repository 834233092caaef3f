//! `future-api`: a plugin that says it was built against `timeout:policy@9.0.0`, a version this
//! host does not run. It is built without the SDK (whose stamp says 0.1.0) from the 0.1.0 WIT, so
//! only its stamp tells the host the version: the host must refuse it from the stamp, before
//! compiling, naming both versions.

#[allow(missing_docs)]
mod bindings {
    wit_bindgen::generate!({ path: "../../wit/v0.1.0", world: "policy" });
}

use bindings::timeout::policy::types::{CheckVerdict, Context, Decision, Order, PolicyError};

/// The stamp a 9.0.0 SDK would write (section `timeout:policy-api`).
#[cfg(target_family = "wasm")]
#[used]
#[unsafe(link_section = "timeout:policy-api")]
static API_VERSION_STAMP: [u8; 5] = *b"9.0.0";

struct Future;

impl bindings::Guest for Future {
    fn decide(_order: Order, _ctx: Context) -> Result<Decision, PolicyError> {
        Ok(Decision::Ignore("a 9.0.0 plugin".into()))
    }

    fn check(_order: Order, _ctx: Context) -> CheckVerdict {
        CheckVerdict::Unknown
    }
}

bindings::export!(Future with_types_in bindings);
