//! Build-script helper: compiles workspace policy plugins (crates under `plugins/`) into
//! wasm32-wasip2 components and copies them into the calling crate's `OUT_DIR` as
//! `<crate_name>.wasm` (dashes become underscores), ready for `include_bytes!`.
//!
//! The plugins are built by a nested cargo with the workspace's `plugin` profile into their own
//! target directory, `<target>/plugins-wasm` (or `$TIMEOUTD_PLUGIN_TARGET_DIR`; builds without
//! `std` in `<target>/plugins-wasm-no-std` or `$TIMEOUTD_PLUGIN_TARGET_DIR/no-std`), so the outer
//! build's flags, wrappers (clippy) and target never leak into the guest build and repeated
//! builds are incremental.

use std::path::PathBuf;
use std::process::Command;

/// Builds `plugins` (package names) and copies each component to `OUT_DIR`.
///
/// # Panics
/// When the nested build fails — typically because the `wasm32-wasip2` target is not installed
/// (the message says how to add it) — or a built component cannot be copied. Build scripts
/// report failure by panicking.
pub fn build(plugins: &[&str]) {
    build_variant(plugins, Variant::Default);
}

/// Builds `plugins` with `--no-default-features` (for plugins whose default feature `std`
/// switches Rust's `std` on, as `hostile`'s does) and copies each component to `OUT_DIR` as
/// `<crate_name>_no_std.wasm`. Their own target directory, `<target>/plugins-wasm-no-std`,
/// keeps them from overwriting the default build's files.
///
/// # Panics
/// As [`build`].
pub fn build_without_std(plugins: &[&str]) {
    build_variant(plugins, Variant::WithoutStd);
}

/// Which features a nested build selects.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// The plugins' default features.
    Default,
    /// `--no-default-features`.
    WithoutStd,
}

fn build_variant(plugins: &[&str], variant: Variant) {
    let (dir_name, suffix) = match variant {
        Variant::Default => ("plugins-wasm", ""),
        Variant::WithoutStd => ("plugins-wasm-no-std", "_no_std"),
    };
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("run from build.rs"));
    let root = workspace_root(&manifest);
    println!("cargo:rerun-if-changed={}", root.join("wit").display());
    // The `plugin` profile lives in the workspace manifest.
    println!(
        "cargo:rerun-if-changed={}",
        root.join("Cargo.toml").display()
    );
    for sdk in ["plugins/sdk", "plugins/sdk-0.1"] {
        println!("cargo:rerun-if-changed={}", root.join(sdk).display());
    }
    for p in plugins {
        println!(
            "cargo:rerun-if-changed={}",
            root.join("plugins").join(p).display()
        );
    }
    println!("cargo:rerun-if-env-changed=TIMEOUTD_PLUGIN_TARGET_DIR");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("run from build.rs"));
    // OUT_DIR is <target>/<profile>/build/<pkg>-<hash>/out: one plugin build per target dir.
    let target_dir = match std::env::var_os("TIMEOUTD_PLUGIN_TARGET_DIR") {
        Some(dir) if variant == Variant::Default => PathBuf::from(dir),
        Some(dir) => PathBuf::from(dir).join("no-std"),
        None => out.ancestors().nth(4).unwrap_or(&out).join(dir_name),
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "--profile", "plugin", "--target", "wasm32-wasip2"])
        .arg("--target-dir")
        .arg(&target_dir);
    for p in plugins {
        cmd.args(["-p", p]);
    }
    if variant == Variant::WithoutStd {
        cmd.arg("--no-default-features");
    }
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
    let status = cmd.status().expect("run cargo for the policy plugins");
    assert!(
        status.success(),
        "building policy plugins {plugins:?} for wasm32-wasip2 failed; if the target is missing, \
         run `rustup target add wasm32-wasip2`"
    );
    for p in plugins {
        let file = format!("{}.wasm", p.replace('-', "_"));
        let built = target_dir.join("wasm32-wasip2/plugin").join(&file);
        let copied = format!("{}{suffix}.wasm", p.replace('-', "_"));
        std::fs::copy(&built, out.join(&copied))
            .unwrap_or_else(|e| panic!("copy {} into OUT_DIR: {e}", built.display()));
    }
}

fn workspace_root(manifest: &std::path::Path) -> PathBuf {
    manifest
        .ancestors()
        .find(|dir| dir.join("wit").is_dir() && dir.join("plugins").is_dir())
        .expect("crate lives inside the timeoutd workspace")
        .to_path_buf()
}
