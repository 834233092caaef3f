//! The harness against a misbehaving plugin (`plugins/hostile`, built here for wasm32-wasip2):
//! the timeline follows the daemon's retry and refusal rules, and failed assertions say what the
//! plugin did instead.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use timeoutd_plugin_harness::{Harness, RuntimeLimits, TrapKind, order};

fn hostile() -> Harness {
    static BUILT: OnceLock<std::path::PathBuf> = OnceLock::new();
    let wasm = BUILT.get_or_init(|| {
        timeoutd_plugin_harness::build_crate(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../hostile"),
        )
        .unwrap()
    });
    // A generous deadline: a loaded CI machine can deschedule a healthy call past 50 ms.
    let limits = RuntimeLimits {
        deadline: Duration::from_millis(500),
        ..RuntimeLimits::default()
    };
    Harness::load_with(wasm, &limits).unwrap()
}

#[test]
fn a_cancel_beyond_the_order_leaves_the_timeline_stuck_naming_the_effect() {
    let harness = hostile().setting("mode", "exceed");
    let o = order("o-1").coupon("cpn-1").build();
    let mut timeline = harness.timeline(o);
    let steps = timeline.run_to_end(3);
    assert_eq!(steps.len(), 1);
    let problems = steps[0].decided.expect_refused_cancel();
    assert!(
        problems[0].starts_with("effects[0] restore-stock(sku-a, 1000)"),
        "{problems:?}"
    );
    assert!(!timeline.closed());
    assert!(timeline.stuck().unwrap().contains("someone-elses-coupon"));
}

#[test]
fn a_failing_plugin_is_retried_with_the_daemons_backoff_then_given_up() {
    let harness = hostile().setting("mode", "error");
    let o = order("o-2").build();
    let deadline = o.deadline_ms - o.created_at_ms;
    let mut timeline = harness.timeline(o);
    let steps = timeline.run_to_end(10);
    assert_eq!(steps.len(), 8, "dispatch.max_attempts");
    let offsets: Vec<i64> = steps.iter().map(|s| s.at_ms - deadline).collect();
    assert_eq!(
        offsets,
        [0, 1_000, 3_000, 7_000, 15_000, 31_000, 63_000, 127_000]
    );
    assert_eq!(steps[7].decided.context.attempt, 7);
    assert!(
        timeline
            .stuck()
            .unwrap()
            .starts_with("gave up after 8 attempt(s)")
    );
}

#[test]
fn a_wait_that_does_not_move_on_is_refused() {
    let harness = hostile().setting("mode", "stall");
    let mut timeline = harness.timeline(order("o-3").build());
    timeline.run_to_end(3);
    assert!(
        timeline
            .stuck()
            .unwrap()
            .contains("wait must name a later phase")
    );
}

#[test]
fn traps_are_reported_by_kind() {
    let harness = hostile().setting("mode", "panic");
    let o = order("o-4").build();
    let message = harness
        .decide(&o, o.deadline_ms, 0)
        .expect_trap(TrapKind::Fault)
        .to_string();
    // A panic aborts the guest (its message goes to a stderr the sandbox does not connect):
    // what is left is the engine's trap with the guest's wasm backtrace.
    assert!(message.contains("wasm backtrace"), "{message}");
}

#[test]
#[should_panic(expected = "expected a wait, got a trap (fault)")]
fn a_failed_expectation_names_what_the_plugin_did_instead() {
    let harness = hostile().setting("mode", "panic");
    let o = order("o-5").build();
    harness.decide(&o, o.deadline_ms, 0).expect_wait();
}

#[test]
#[should_panic(
    expected = "with effects the daemon would refuse:\n  effects[0] restore-stock(sku-a, 1000)"
)]
fn expecting_a_cancel_beyond_the_order_fails_naming_the_effect() {
    let harness = hostile().setting("mode", "exceed");
    let o = order("o-6").build();
    harness.decide(&o, o.deadline_ms, 0).expect_cancel();
}
