//! Precompiled components on disk, keyed by the engine's compatibility hash and the component's
//! SHA-256, so a daemon restart (or a second daemon on the machine) skips Cranelift.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;

use wasmtime::component::Component;

use crate::engine::PolicyEngine;

/// Compiles `bytes`, or loads the artifact compiled earlier by a compatible engine.
///
/// `digest` is the component's SHA-256 in hex. A corrupt or incompatible cache file is
/// recompiled and replaced, never trusted.
pub(crate) fn compile(
    engine: &PolicyEngine,
    bytes: &[u8],
    digest: &str,
) -> Result<Component, String> {
    let Some(path) = cache_path(engine, digest) else {
        return Component::new(engine.engine(), bytes).map_err(|e| format!("{e:?}"));
    };
    if path.exists() {
        // SAFETY: the file was written by `Component::serialize` of an engine with the same
        // compatibility hash (it is in the path), in a directory only timeoutd writes to.
        // `deserialize_file` still checks the header and refuses a mismatched artifact.
        match unsafe { Component::deserialize_file(engine.engine(), &path) } {
            Ok(component) => return Ok(component),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "discarding unusable cached plugin artifact")
            }
        }
    }
    let component = Component::new(engine.engine(), bytes).map_err(|e| format!("{e:?}"))?;
    match component.serialize() {
        Ok(artifact) => {
            if let Err(e) = write_atomically(&path, &artifact) {
                tracing::warn!(path = %path.display(), error = %e, "cannot cache compiled plugin");
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot serialise compiled plugin"),
    }
    Ok(component)
}

fn cache_path(engine: &PolicyEngine, digest: &str) -> Option<PathBuf> {
    let dir = engine.cache_dir()?;
    let mut hasher = DefaultHasher::new();
    engine
        .engine()
        .precompile_compatibility_hash()
        .hash(&mut hasher);
    Some(
        dir.join(format!("{:016x}", hasher.finish()))
            .join(format!("{digest}.cwasm")),
    )
}

fn write_atomically(path: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().expect("cache path has a parent");
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        std::process::id(),
        path.file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("artifact")
    ));
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, path)
}
