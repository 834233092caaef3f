//! `timeoutd plugin new NAME [--dir DIR]`: a Rust plugin project that builds and passes its
//! cases on first run, needing nothing but this binary and a Rust toolchain — the guest SDK
//! (with its WIT) is written into the project from the copy embedded here.

use std::path::Path;
use std::process::ExitCode;

/// The SDK's files, embedded at build time: (path inside the vendored folder, contents).
const SDK: &[(&str, &str)] = &[
    (
        "Cargo.toml",
        include_str!("../../../../plugins/sdk/Cargo.toml"),
    ),
    (
        "src/lib.rs",
        include_str!("../../../../plugins/sdk/src/lib.rs"),
    ),
    (
        "src/decide.rs",
        include_str!("../../../../plugins/sdk/src/decide.rs"),
    ),
    (
        "src/settings.rs",
        include_str!("../../../../plugins/sdk/src/settings.rs"),
    ),
    (
        "wit/policy.wit",
        include_str!("../../../../plugins/sdk/wit/policy.wit"),
    ),
];

/// The project's own files, `{{name}}` and `{{crate}}` filled in.
const PROJECT: &[(&str, &str)] = &[
    ("Cargo.toml", include_str!("new/Cargo.toml.tmpl")),
    ("src/lib.rs", include_str!("new/lib.rs.tmpl")),
    ("CASES.toml", include_str!("new/CASES.toml.tmpl")),
    ("README.md", include_str!("new/README.md.tmpl")),
];

pub(super) fn run(name: &str, dir: Option<&Path>) -> ExitCode {
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
        && name.starts_with(|c: char| c.is_ascii_lowercase());
    if !valid {
        eprintln!(
            "plugin new: `{name}` is not a crate name (lowercase letters, digits, - and _, starting with a letter)"
        );
        return ExitCode::from(super::EXIT_BAD_INPUT);
    }
    let root = dir.map_or_else(|| Path::new(name).to_path_buf(), Path::to_path_buf);
    if root.exists() {
        eprintln!(
            "plugin new: {} exists already; nothing written",
            root.display()
        );
        return ExitCode::from(super::EXIT_BAD_INPUT);
    }
    let crate_name = name.replace('-', "_");
    let files = PROJECT
        .iter()
        .map(|(path, text)| {
            (
                root.join(path),
                text.replace("{{name}}", name)
                    .replace("{{crate}}", &crate_name),
            )
        })
        .chain(SDK.iter().map(|(path, text)| {
            (
                root.join("timeoutd-policy-sdk").join(path),
                text.to_string(),
            )
        }));
    for (path, text) in files {
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, text));
        if let Err(e) = written {
            eprintln!("plugin new: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    println!(
        "made {}: a plugin on timeout:policy@0.2.0 with its cases and the SDK vendored\n\
         next:\n  cd {}\n  rustup target add wasm32-wasip2\n  cargo build --release --target wasm32-wasip2\n  \
         timeoutd plugin test target/wasm32-wasip2/release/{crate_name}.wasm CASES.toml",
        root.display(),
        root.display()
    );
    ExitCode::SUCCESS
}
