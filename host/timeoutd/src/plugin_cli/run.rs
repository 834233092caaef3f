//! `timeoutd plugin run FILE.wasm --order ORDER.json`: one ad-hoc call, as the daemon would make
//! it — the decision, the guard's review of it (the plugin's manifest included), and the
//! plugin's log lines (on stderr, through the same log as the daemon's).

use std::path::Path;
use std::process::ExitCode;

use timeoutd_runtime::guard;
use timeoutd_runtime::model::{Context, Order, TriggerKind};

use super::RunArgs;

/// Loads the plugin and the order, calls `decide` once and prints the decision as JSON and the
/// guard's verdict. Exit 0 when the decision would be carried out, 1 when it is refused or the
/// plugin fails, 64 for an unreadable order or setting.
pub(super) fn run(file: &Path, args: &RunArgs) -> ExitCode {
    let bad_input = || ExitCode::from(super::EXIT_BAD_INPUT);
    let order: Order = match std::fs::read_to_string(&args.order)
        .map_err(|e| e.to_string())
        .and_then(|text| serde_json::from_str(&text).map_err(|e| e.to_string()))
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "{}: not an order ({e}); see plugins/README.md for its fields",
                args.order.display()
            );
            return bad_input();
        }
    };
    let settings = match super::parse_settings(&args.setting) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return bad_input();
        }
    };
    let state = match hex::decode(&args.state) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("--state `{}`: not hex ({e})", args.state);
            return bad_input();
        }
    };
    let plugin = match super::load(file, &args.limits.limits()) {
        Ok(p) => p,
        Err(code) => return code,
    };
    if let Some(manifest) = plugin.manifest()
        && let Err(problems) = manifest.check_config(None, &settings)
    {
        for p in &problems {
            eprintln!("warning: {p}");
        }
    }
    let ctx = Context {
        now_ms: args.now.unwrap_or(order.deadline_ms),
        trigger: TriggerKind::Manual,
        phase: args.phase,
        attempt: 0,
        settings,
        state,
        payment: order.payment_ref.as_ref().map(|_| Default::default()),
    };
    println!(
        "plugin:   {} (timeout:policy@{}, sha256 {})",
        plugin.name(),
        plugin.api_version(),
        plugin.digest()
    );
    println!(
        "asked:    phase {} at {} ms ({} ms from the deadline)",
        ctx.phase,
        ctx.now_ms,
        ctx.now_ms - order.deadline_ms
    );
    match plugin.decide(&order, &ctx) {
        Ok(decision) => {
            println!(
                "decision: {}",
                serde_json::to_string(&decision).expect("a decision serialises")
            );
            let review = guard::Review {
                order: &order,
                phase: ctx.phase,
                now_ms: ctx.now_ms,
                granted: None,
                manifest: plugin.manifest(),
            };
            let early = ctx.now_ms < order.deadline_ms
                && !matches!(decision, timeoutd_runtime::model::Decision::Wait { .. });
            match guard::review(&decision, review) {
                Ok(()) if early => {
                    println!(
                        "guard:    permitted; before the deadline the daemon holds it until then"
                    );
                    ExitCode::SUCCESS
                }
                Ok(()) => {
                    println!("guard:    permitted");
                    ExitCode::SUCCESS
                }
                Err(problems) => {
                    println!("guard:    refused");
                    for p in problems {
                        println!("  - {p}");
                    }
                    ExitCode::FAILURE
                }
            }
        }
        Err(e) => {
            println!("decision: failed");
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
