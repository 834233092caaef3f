//! Builds the example policy plugins (`plugins/single-phase`, `plugins/two-phase`) as
//! wasm32-wasip2 components so the `timeoutd` binary can embed them (`builtin:<name>` in the
//! config, and `timeoutd demo`). They are compiled by a nested cargo into their own target
//! directory (`<target>/plugins-wasm`), with the workspace's `plugin` profile.

use std::path::{Path, PathBuf};
use std::process::Command;

const PLUGINS: &[&str] = &["single-phase", "two-phase"];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.join("../..").canonicalize().unwrap();
    for watched in ["wit", "plugins/sdk", "plugins/single-phase", "plugins/two-phase"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    println!("cargo:rerun-if-env-changed=TIMEOUTD_PLUGIN_TARGET_DIR");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out; share one plugin build per target dir.
    let target_dir = std::env::var_os("TIMEOUTD_PLUGIN_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| out.ancestors().nth(4).unwrap_or(&out).join("plugins-wasm"));
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "--profile", "plugin", "--target", "wasm32-wasip2"])
        .arg("--target-dir")
        .arg(&target_dir);
    for p in PLUGINS {
        cmd.args(["-p", p]);
    }
    // The outer build's flags and wrappers (clippy, coverage) are not for the guest.
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
    let status = cmd.status().expect("run cargo for the example plugins");
    if !status.success() {
        panic!(
            "building the example plugins for wasm32-wasip2 failed; is the target installed? \
             Run `rustup target add wasm32-wasip2`."
        );
    }
    for p in PLUGINS {
        let file = format!("{}.wasm", p.replace('-', "_"));
        let built = target_dir.join("wasm32-wasip2/plugin").join(&file);
        copy(&built, &out.join(&file));
    }
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("copy {} to {}: {e}", from.display(), to.display()));
}
