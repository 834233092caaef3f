//! `timeoutd plugin new NAME [--lang rust|js|python] [--dir DIR]`: a plugin project that builds
//! and passes its cases on first run, needing nothing but this binary and the language's own
//! tools — for Rust the guest SDK (with its WIT) is written into the project from the copy
//! embedded here; for JavaScript and Python the WIT itself, and the pinned component builder.

use std::path::Path;
use std::process::ExitCode;

/// The language of a new plugin project.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// Rust with the vendored guest SDK (`cargo build --target wasm32-wasip2`).
    Rust,
    /// JavaScript, built by componentize-js (Node.js 20+ and npm).
    Js,
    /// Python, built by componentize-py (CPython 3.10+).
    Python,
}
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
        "src/prelude.rs",
        include_str!("../../../../plugins/sdk/src/prelude.rs"),
    ),
    (
        "src/without_std.rs",
        include_str!("../../../../plugins/sdk/src/without_std.rs"),
    ),
    (
        "wit/policy.wit",
        include_str!("../../../../plugins/sdk/wit/policy.wit"),
    ),
];

/// The released WIT, for projects that bind it themselves (JavaScript, Python).
const WIT: &str = include_str!("../../../../wit/v0.2.0/policy.wit");

/// The cases every scaffold starts with; `{{build}}`, `{{test_flags}}` and `{{wasm}}` say how.
const CASES: &str = include_str!("new/CASES.toml.tmpl");

/// A language's project: its own files (`{{name}}` and `{{crate}}` filled in), the build
/// command, the component it makes and the `plugin test` flags it needs.
struct Project {
    files: &'static [(&'static str, &'static str)],
    build: &'static [&'static str],
    wasm: &'static str,
    test_flags: &'static str,
}

const RUST: Project = Project {
    files: &[
        ("Cargo.toml", include_str!("new/rust/Cargo.toml.tmpl")),
        ("src/lib.rs", include_str!("new/rust/lib.rs.tmpl")),
        ("README.md", include_str!("new/rust/README.md.tmpl")),
    ],
    build: &[
        "rustup target add wasm32-wasip2",
        "cargo build --release --target wasm32-wasip2",
    ],
    wasm: "target/wasm32-wasip2/release/{{crate}}.wasm",
    test_flags: "",
};

const JS: Project = Project {
    files: &[
        ("package.json", include_str!("new/js/package.json.tmpl")),
        ("src/policy.js", include_str!("new/js/policy.js.tmpl")),
        ("README.md", include_str!("new/js/README.md.tmpl")),
        ("wit/policy.wit", WIT),
    ],
    build: &["npm install", "npm run build"],
    wasm: "{{name}}.wasm",
    test_flags: "--deadline 250ms ",
};

const PYTHON: Project = Project {
    files: &[
        ("app.py", include_str!("new/python/app.py.tmpl")),
        ("build.sh", include_str!("new/python/build.sh.tmpl")),
        (
            "requirements.txt",
            include_str!("new/python/requirements.txt.tmpl"),
        ),
        ("README.md", include_str!("new/python/README.md.tmpl")),
        ("wit/policy.wit", WIT),
    ],
    build: &["./build.sh"],
    wasm: "{{name}}.wasm",
    test_flags: "--deadline 250ms ",
};

pub(super) fn run(name: &str, lang: Lang, dir: Option<&Path>) -> ExitCode {
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
    let project = match lang {
        Lang::Rust => &RUST,
        Lang::Js => &JS,
        Lang::Python => &PYTHON,
    };
    let fill = |text: &str| {
        text.replace("{{name}}", name)
            .replace("{{crate}}", &crate_name)
    };
    let wasm = fill(project.wasm);
    let cases = fill(CASES)
        .replace("{{build}}", &project.build.join(" && "))
        .replace("{{test_flags}}", project.test_flags)
        .replace("{{wasm}}", &wasm);
    let sdk = SDK
        .iter()
        .filter(|_| lang == Lang::Rust)
        .map(|(path, text)| {
            (
                root.join("timeoutd-policy-sdk").join(path),
                text.to_string(),
            )
        });
    let files = project
        .files
        .iter()
        .map(|(path, text)| (root.join(path), fill(text)))
        .chain([(root.join("CASES.toml"), cases)])
        .chain(sdk);
    for (path, text) in files {
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&path, text));
        let written = written.and_then(|()| executable_if_script(&path));
        if let Err(e) = written {
            eprintln!("plugin new: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    println!(
        "made {}: a plugin on timeout:policy@0.2.0 with its cases{}\nnext:\n  cd {}\n  {}\n  timeoutd plugin test {}{wasm} CASES.toml",
        root.display(),
        if lang == Lang::Rust {
            " and the SDK vendored"
        } else {
            " and the WIT"
        },
        root.display(),
        project.build.join("\n  "),
        project.test_flags,
    );
    ExitCode::SUCCESS
}

/// Makes a `.sh` file executable (rwxr-xr-x), as a script the README says to run.
fn executable_if_script(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if path.extension().is_some_and(|e| e == "sh") {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}
