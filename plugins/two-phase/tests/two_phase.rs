//! The two-phase policy under the production runtime, through the plugin harness: its timeline
//! as the daemon plays it, and the shared cases file every implementation must pass.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use timeoutd_plugin_harness::cases::CasesFile;
use timeoutd_plugin_harness::model::{Effect, OrderStatus, PolicyError};
use timeoutd_plugin_harness::{Harness, order};

const MIN: u64 = 60;

fn minutes(n: u64) -> Duration {
    Duration::from_secs(n * MIN)
}

/// This crate, built for wasm32-wasip2 once per test binary.
fn plugin() -> Harness {
    static BUILT: OnceLock<Harness> = OnceLock::new();
    BUILT
        .get_or_init(|| Harness::build_crate(env!("CARGO_MANIFEST_DIR")).unwrap())
        .clone()
        .setting("grace", "5m")
}

#[test]
fn the_timeline_reminds_at_the_deadline_and_closes_after_the_grace() {
    let harness = plugin();
    let o = order("o-1")
        .item("sku-a", 2, 1_250)
        .coupon("cpn-1")
        .payment_ref("pay-1")
        .build();
    let mut timeline = harness.timeline(o);
    assert!(
        timeline.advance_to(minutes(10)).is_empty(),
        "nothing is asked before the deadline"
    );
    let steps = timeline.advance_to(minutes(15));
    assert_eq!(steps.len(), 1);
    steps[0]
        .decided
        .expect_wait()
        .after(minutes(5))
        .next_phase(1)
        .reminds_with("order-closing-soon");
    assert_eq!(timeline.next_due(), Some((20 * 60_000, 1)));
    assert!(timeline.advance_to(minutes(19)).is_empty());
    let steps = timeline.advance_to(minutes(20));
    assert_eq!(steps[0].at_ms, 20 * 60_000);
    steps[0]
        .decided
        .expect_cancel()
        .kinds(&["restore-stock", "release-coupon", "close-payment", "notify"])
        .includes(&Effect::RestoreStock {
            sku: "sku-a".into(),
            quantity: 2,
        })
        .reason_contains("grace lapsed");
    assert!(timeline.closed());
}

#[test]
fn a_flash_sale_order_gives_back_the_activity_units_and_the_slot() {
    let o = order("o-2")
        .item("sku-a", 2, 100)
        .item("sku-b", 1, 100)
        .flash_activity("act-9")
        .build();
    let steps = plugin().timeline(o).run_to_end(5);
    assert_eq!(steps.len(), 2, "wait then cancel");
    steps[1]
        .decided
        .expect_cancel()
        .includes(&Effect::RestoreFlashStock {
            activity: "act-9".into(),
            quantity: 3,
        })
        .includes(&Effect::ReleaseFlashSlot {
            activity: "act-9".into(),
            user: "u-1".into(),
        });
}

#[test]
fn a_paid_order_is_ignored_and_a_missing_grace_names_the_setting() {
    let harness = plugin();
    let paid = order("o-3").status(OrderStatus::Paid).build();
    let reason = harness
        .decide(&paid, paid.deadline_ms, 0)
        .expect_ignore()
        .to_string();
    assert!(reason.contains("Paid"), "{reason}");

    let bare = Harness::from_plugin(harness.plugin().clone());
    let o = order("o-4").build();
    match bare.decide(&o, o.deadline_ms, 0).expect_policy_error() {
        PolicyError::BadSetting { key, .. } => assert_eq!(key, "grace"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_shared_cases_pass() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../cases/two-phase.toml");
    let cases = CasesFile::load(&path).unwrap();
    let report = cases.run(plugin().plugin());
    assert!(report.passed(), "{report}");
    assert_eq!(report.results.len(), cases.cases.len());
}

/// A failed expectation points at the test's own line, not into the harness.
#[test]
fn a_failed_expectation_points_at_the_tests_own_line() {
    let harness = plugin();
    let o = order("o-where").item("sku-a", 1, 100).build();
    let at = std::sync::Arc::new(std::sync::Mutex::new(None));
    let seen = at.clone();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        *seen.lock().unwrap() = info.location().map(|l| (l.file().to_string(), l.line()));
    }));
    let decided = harness.decide(&o, o.deadline_ms, 0);
    let line = line!() + 2; // the `expect_ignore` two lines down
    let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        decided.expect_ignore().to_string()
    }));
    std::panic::set_hook(previous);
    assert!(
        failed.is_err(),
        "the plugin waits at the deadline, it does not ignore"
    );
    let (file, at_line) = at.lock().unwrap().clone().expect("a panic location");
    assert!(file.ends_with("two_phase.rs"), "points at {file}");
    assert_eq!(at_line, line, "points at the line of the expectation");
}
