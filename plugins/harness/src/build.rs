//! Building a plugin crate for wasm32-wasip2 from its tests.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// Why a plugin crate could not be built.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BuildError {
    /// The crate's `Cargo.toml` could not be read or has no `[package] name`.
    #[error("cannot read the plugin crate's manifest {path}: {reason}")]
    Manifest {
        /// The manifest's path.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// Cargo failed; its output says why (a missing `wasm32-wasip2` target: run
    /// `rustup target add wasm32-wasip2`).
    #[error(
        "building {package} for wasm32-wasip2 failed (`rustup target add wasm32-wasip2` if the target is missing):\n{output}"
    )]
    Cargo {
        /// Package name.
        package: String,
        /// Cargo's stderr.
        output: String,
    },
}

/// Builds the plugin crate whose `Cargo.toml` is in `manifest_dir` for `wasm32-wasip2` and
/// returns the path of the component (`<target>/wasm32-wasip2/<profile>/<crate>.wasm`).
///
/// The profile is `plugin` when the workspace defines `[profile.plugin]` (as timeoutd's does),
/// else `release`. The target directory is `$TIMEOUTD_PLUGIN_TARGET_DIR`, else
/// `<the test binary's target dir>/plugins-wasm` (the directory `host/plugin-build` uses, so the
/// build is usually already done), else `<manifest_dir>/target/plugins-wasm`. Each crate is
/// built once per process; cargo makes repeated runs incremental.
///
/// # Errors
/// [`BuildError`] with cargo's output.
pub fn build_crate(manifest_dir: &Path) -> Result<PathBuf, BuildError> {
    static BUILT: OnceLock<Mutex<HashMap<PathBuf, Result<PathBuf, BuildError>>>> = OnceLock::new();
    let mut built = BUILT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    built
        .entry(manifest_dir.to_path_buf())
        .or_insert_with(|| build_uncached(manifest_dir))
        .clone()
}

fn build_uncached(manifest_dir: &Path) -> Result<PathBuf, BuildError> {
    let manifest = manifest_dir.join("Cargo.toml");
    let package = package_name(&manifest)?;
    let profile = if workspace_has_plugin_profile(manifest_dir) {
        "plugin"
    } else {
        "release"
    };
    let target_dir = target_dir(manifest_dir);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(manifest_dir)
        .args([
            "build",
            "--quiet",
            "--target",
            "wasm32-wasip2",
            "--profile",
            profile,
        ])
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir);
    // As host/plugin-build: the outer build's flags and wrappers never reach the guest build.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CLIPPY_ARGS",
    ] {
        cmd.env_remove(var);
    }
    let output = cmd.output().map_err(|e| BuildError::Cargo {
        package: package.clone(),
        output: format!("cannot run cargo: {e}"),
    })?;
    if !output.status.success() {
        return Err(BuildError::Cargo {
            package,
            output: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(target_dir
        .join("wasm32-wasip2")
        .join(profile)
        .join(format!("{}.wasm", package.replace('-', "_"))))
}

fn package_name(manifest: &Path) -> Result<String, BuildError> {
    let bad = |reason: String| BuildError::Manifest {
        path: manifest.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(manifest).map_err(|e| bad(e.to_string()))?;
    let doc: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| bad(e.to_string()))?;
    doc.get("package")
        .and_then(|p| p.get("name"))
        .and_then(|n| n.as_str())
        .map(str::to_string)
        .ok_or_else(|| bad("no [package] name".into()))
}

/// Whether the nearest workspace manifest above `dir` defines `[profile.plugin]`.
fn workspace_has_plugin_profile(dir: &Path) -> bool {
    dir.ancestors()
        .filter_map(|d| std::fs::read_to_string(d.join("Cargo.toml")).ok())
        .filter_map(|text| text.parse::<toml::Table>().ok())
        .find(|doc| doc.contains_key("workspace") || doc.contains_key("profile"))
        .is_some_and(|doc| doc.get("profile").and_then(|p| p.get("plugin")).is_some())
}

fn target_dir(manifest_dir: &Path) -> PathBuf {
    if let Some(dir) = std::env::var_os("TIMEOUTD_PLUGIN_TARGET_DIR") {
        return PathBuf::from(dir);
    }
    // A test binary runs from <target>/<profile>/deps/<name>-<hash>.
    let from_exe = std::env::current_exe().ok().and_then(|exe| {
        let deps = exe.parent()?;
        (deps.file_name()? == "deps").then(|| deps.parent()?.parent().map(Path::to_path_buf))?
    });
    from_exe
        .unwrap_or_else(|| manifest_dir.join("target"))
        .join("plugins-wasm")
}
