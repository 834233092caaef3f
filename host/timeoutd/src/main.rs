//! The `timeoutd` binary; everything is in the library (`timeoutd::cli`).

fn main() -> std::process::ExitCode {
    timeoutd::cli::main()
}
