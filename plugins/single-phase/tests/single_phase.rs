//! The single-phase policy under the production runtime, through the plugin harness.

use std::time::Duration;

use timeoutd_plugin_harness::model::{Effect, TriggerKind};
use timeoutd_plugin_harness::{Harness, context, order};

fn plugin() -> Harness {
    Harness::build_crate(env!("CARGO_MANIFEST_DIR")).unwrap()
}

#[test]
fn at_the_deadline_it_closes_releasing_everything_in_one_step() {
    let o = order("o-1")
        .item("sku-a", 2, 1_250)
        .coupon("cpn-1")
        .payment_ref("pay-1")
        .build();
    let harness = plugin().setting("closed_template", "bye");
    let mut timeline = harness.timeline(o);
    let steps = timeline.advance_to(Duration::from_secs(15 * 60));
    assert_eq!(steps.len(), 1);
    let cancel = steps[0].decided.expect_cancel().kinds(&[
        "restore-stock",
        "release-coupon",
        "close-payment",
        "notify",
    ]);
    let Some(Effect::Notify(notice)) = cancel.effects.last() else {
        panic!("{:?}", cancel.effects)
    };
    assert_eq!(notice.template, "bye");
    assert!(timeline.closed());
}

#[test]
fn an_early_manual_trigger_waits_for_the_deadline() {
    let harness = plugin();
    let o = order("o-2").build();
    let ctx = context()
        .after_creation(&o, Duration::from_secs(60))
        .trigger(TriggerKind::Manual)
        .build();
    harness
        .decide_with(&o, &ctx)
        .expect_wait()
        .after(Duration::from_secs(14 * 60))
        .next_phase(1)
        .silent();
}
