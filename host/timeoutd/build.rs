//! Compiles the example plugins so the binary can embed them (`builtin:<name>`, `timeoutd demo`),
//! and stamps the git commit for `timeoutd --version`.

fn main() {
    timeoutd_plugin_build::build(&["single-phase", "two-phase"]);
    stamp_commit();
}

/// `TIMEOUTD_GIT_COMMIT`: the checkout's commit (`unknown` outside a git checkout).
fn stamp_commit() {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=TIMEOUTD_GIT_COMMIT={commit}");
    let git = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.git");
    for watched in ["HEAD", "refs/heads", "packed-refs"] {
        println!("cargo:rerun-if-changed={}", git.join(watched).display());
    }
}
