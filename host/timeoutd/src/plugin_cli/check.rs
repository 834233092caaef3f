//! `timeoutd plugin check FILE.wasm`.

use std::path::Path;
use std::process::ExitCode;
use timeoutd_runtime::{LoadError, RuntimeLimits, SUPPORTED_API_VERSIONS, inspect};

/// Reads the file, inspects it without compiling, then loads it (compile + link against the
/// world) and prints what it found. Exit 1 when it would not load in the daemon.
pub(super) fn run(file: &Path, limits: &RuntimeLimits) -> ExitCode {
    let name = super::plugin_name(file);
    let bytes = match std::fs::read(file) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{}: cannot read: {e}", file.display());
            return ExitCode::FAILURE;
        }
    };
    println!("file:        {}", file.display());
    println!(
        "size:        {} bytes ({:.1} KiB)",
        bytes.len(),
        bytes.len() as f64 / 1024.0
    );
    let inspection = match inspect(name, &bytes) {
        Ok(i) => i,
        Err(e) => {
            println!("component:   no");
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "component:   yes ({} core module(s))",
        inspection.core_modules
    );
    let wasi = inspection
        .imports
        .iter()
        .filter(|i| i.starts_with("wasi:"))
        .count();
    println!(
        "imports:     {}{}",
        if inspection.imports.is_empty() {
            "nothing".to_string()
        } else {
            inspection.imports.join(", ")
        },
        if wasi > 0 {
            format!(
                "\n             ({wasi} WASI interfaces, set up for every fresh instance; a Rust \
                 plugin built without `std` imports none and decides faster)"
            )
        } else {
            String::new()
        }
    );
    println!(
        "api stamp:   {}",
        inspection.stamped_api_version.as_deref().map_or_else(
            || "none (not built with the SDK; the version is read from its imports)".to_string(),
            |v| format!("timeout:policy@{v}")
        )
    );
    println!(
        "host runs:   timeout:policy@{}",
        SUPPORTED_API_VERSIONS.join(", @")
    );
    let engine = match super::engine(limits) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let watch = crate::clock::Stopwatch::start();
    let loaded = engine.load(name, &bytes);
    let compile_ms = watch.elapsed_us() as f64 / 1000.0;
    match loaded {
        Ok(plugin) => {
            println!(
                "world:       timeout:policy@{} `policy` (decide, check): exported",
                plugin.api_version()
            );
            println!("compile:     {compile_ms:.1} ms (compile and link, no cache)");
            println!("sha256:      {}", plugin.digest());
            match plugin.manifest() {
                None => println!("manifest:    none (API 0.1.0 plugins declare nothing)"),
                Some(m) => {
                    let kinds: Vec<&str> = m.effects.iter().map(|k| k.as_str()).collect();
                    println!("effects:     {}", kinds.join(", "));
                    for s in &m.settings {
                        println!(
                            "setting:     {} ({}, {}): {}",
                            s.name,
                            s.value_type.as_str(),
                            s.default
                                .as_deref()
                                .map_or("required".to_string(), |d| format!("default {d}")),
                            s.doc
                        );
                    }
                }
            }
            println!("ok");
            ExitCode::SUCCESS
        }
        Err(e @ (LoadError::UnsupportedVersion { .. } | LoadError::Malformed { .. }))
            if inspection.stamped_api_version.is_some() =>
        {
            println!("compile:     not attempted (refused before compiling)");
            eprintln!("{e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            println!("compile:     failed after {compile_ms:.1} ms");
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
