//! What this build is: its version, the commit it was built from, the policy API versions it
//! serves. Read by `timeoutd --version`, `doctor`, and the schema window's `written_by`.

/// `timeoutd --version`: the version, the git commit it was built from and the policy API
/// (WIT) versions it serves, e.g. `0.1.0 (commit 3f2a9c1d0b7e; policy API 0.1.0, 0.2.0)`.
pub fn version() -> &'static str {
    static LINE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    LINE.get_or_init(|| {
        format!(
            "{} (commit {}; policy API {})",
            env!("CARGO_PKG_VERSION"),
            env!("TIMEOUTD_GIT_COMMIT"),
            timeoutd_runtime::SUPPORTED_API_VERSIONS.join(", ")
        )
    })
}
