//! Compiles the misbehaving test plugin (`plugins/hostile`) for the sandbox tests.

fn main() {
    timeoutd_plugin_build::build(&["hostile"]);
}
