//! Compiles the example plugins so the binary can embed them (`builtin:<name>`, `timeoutd demo`).

fn main() {
    timeoutd_plugin_build::build(&["single-phase", "two-phase"]);
}
