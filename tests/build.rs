//! Compiles the test plugins for the sandbox and version tests: `plugins/hostile` (misbehaves on
//! request) and `plugins/future-api` (stamped timeout:policy@0.2.0).

fn main() {
    timeoutd_plugin_build::build(&["hostile", "future-api"]);
}
