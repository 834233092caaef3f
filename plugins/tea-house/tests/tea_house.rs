//! The tea-house policy (API 0.2.0) under the production runtime, through the plugin harness:
//! its timeline as the daemon plays it — asked when the order is first seen, a reminder before
//! the deadline, the close at it, and the VIP grace with its second reminder.

use std::sync::OnceLock;
use std::time::Duration;

use timeoutd_plugin_harness::model::{Decision, EffectKind, OrderStatus};
use timeoutd_plugin_harness::{Harness, order};

fn minutes(n: u64) -> Duration {
    Duration::from_secs(n * 60)
}

/// This crate, built for wasm32-wasip2 once per test binary.
fn plugin() -> Harness {
    static BUILT: OnceLock<Harness> = OnceLock::new();
    BUILT
        .get_or_init(|| Harness::build_crate(env!("CARGO_MANIFEST_DIR")).unwrap())
        .clone()
}

fn reminder_template(decision: &Decision) -> Option<&str> {
    match decision {
        Decision::Wait { reminder, .. } => reminder.as_ref().map(|n| n.template.as_str()),
        _ => None,
    }
}

#[test]
fn it_declares_its_effects_and_settings() {
    let harness = plugin();
    assert_eq!(harness.plugin().api_version(), "0.2.0");
    assert!(harness.plugin().asks_before_deadline());
    let manifest = harness
        .plugin()
        .manifest()
        .expect("a 0.2.0 plugin declares itself");
    assert!(manifest.effects.contains(&EffectKind::Notify));
    let names: Vec<&str> = manifest.settings.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "remind_before",
            "vip_cents",
            "vip_grace",
            "channel",
            "poll_every"
        ]
    );
    assert_eq!(
        manifest.check_config(None, &[]),
        Ok(()),
        "every setting has a default"
    );
    let bad = manifest
        .check_config(None, &[("vip_grace".into(), "10".into())])
        .unwrap_err();
    assert!(
        bad[0].starts_with("settings.vip_grace: `10` has no unit"),
        "{bad:?}"
    );
}

#[test]
fn a_small_order_is_reminded_two_minutes_before_its_deadline_and_closed_at_it() {
    let harness = plugin();
    // Created at 0, deadline at 15 minutes.
    let o = order("small").item("tea", 1, 3_000).build();
    let mut timeline = harness.timeline(o);
    let first = timeline.advance_to(minutes(0));
    assert_eq!(first.len(), 1, "asked as soon as the order is seen");
    assert_eq!(
        reminder_template(first[0].decided.result.as_ref().unwrap()),
        None
    );
    assert_eq!(timeline.next_due(), Some((13 * 60_000, 1)));
    let reminded = timeline.advance_to(minutes(13));
    assert_eq!(reminded.len(), 1);
    assert_eq!(
        reminder_template(reminded[0].decided.result.as_ref().unwrap()),
        Some("order-closing-soon")
    );
    assert!(
        timeline
            .advance_to(Duration::from_secs(15 * 60 - 1))
            .is_empty()
    );
    let closed = timeline.advance_to(minutes(15));
    assert_eq!(closed.len(), 1);
    assert!(timeline.closed(), "closed at the deadline");
    closed[0]
        .decided
        .expect_cancel()
        .kinds(&["restore-stock", "notify"]);
}

#[test]
fn a_vip_order_gets_a_second_reminder_and_ten_more_minutes() {
    let harness = plugin();
    let o = order("vip").item("pu-erh", 2, 60_000).build();
    let mut timeline = harness.timeline(o.clone());
    let steps = timeline.run_to_end(10);
    let at: Vec<i64> = steps.iter().map(|s| s.at_ms / 60_000).collect();
    assert_eq!(
        at,
        [0, 13, 15, 25],
        "first look, reminder, second reminder, close"
    );
    let templates: Vec<Option<&str>> = steps
        .iter()
        .map(|s| s.decided.result.as_ref().ok().and_then(reminder_template))
        .collect();
    assert_eq!(
        templates,
        [None, Some("order-closing-soon"), Some("order-held"), None]
    );
    assert!(timeline.closed());
    assert_eq!(o.status, OrderStatus::Pending);
}
