//! `timeoutd plugin test FILE.wasm CASES.toml`.

use std::path::Path;
use std::process::ExitCode;

use timeoutd_plugin_harness::cases::CasesFile;
use timeoutd_runtime::RuntimeLimits;

/// Loads the cases (exit 64 listing every problem) and the plugin (exit 1), runs every case
/// and prints the report; exit 1 when any case fails.
pub(super) fn run(file: &Path, cases: &Path, limits: &RuntimeLimits) -> ExitCode {
    let cases = match CasesFile::load(cases) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(super::EXIT_BAD_INPUT);
        }
    };
    let plugin = match super::load(file, limits) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let report = cases.run(&plugin);
    println!("{report}");
    if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
