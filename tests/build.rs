//! Compiles the test plugins for the sandbox and version tests: `plugins/hostile` (misbehaves on
//! request), `plugins/future-api` (stamped timeout:policy@9.0.0) and `plugins/tea-house` (the
//! 0.2.0 example, run in the daemon beside 0.1.0 plugins), `plugins/eager` (0.2.0, cancels or
//! ignores at its first look, before the deadline); and `hostile` again without Rust's
//! `std`, so its misbehaviour also tests the SDK's own allocator and panic handler.

fn main() {
    timeoutd_plugin_build::build(&["hostile", "future-api", "tea-house", "eager"]);
    timeoutd_plugin_build::build_without_std(&["hostile"]);
}
