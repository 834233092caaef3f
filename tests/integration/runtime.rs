//! Plugins through the production engine and limits: decisions, the three failure tiers, and
//! the locked-down sandbox.

use std::time::Duration;

use timeoutd::policies::builtin;
use timeoutd_runtime::model::{Context, Decision, Effect, PolicyError, TriggerKind};
use timeoutd_runtime::{
    API_VERSION_SECTION, DecideError, LoadError, Plugin, PolicyEngine, RuntimeLimits, TrapKind,
    inspect,
};

use crate::support::{FUTURE_API_WASM, HOSTILE_NO_STD_WASM, HOSTILE_WASM, T0, order};

fn engine() -> PolicyEngine {
    let limits = RuntimeLimits {
        deadline: Duration::from_millis(200),
        max_memory_bytes: 32 << 20,
        ..RuntimeLimits::default()
    };
    PolicyEngine::new(limits, None).unwrap()
}

fn ctx(now_ms: i64, phase: u32, settings: &[(&str, &str)]) -> Context {
    Context {
        now_ms,
        trigger: TriggerKind::Outbox,
        phase,
        attempt: 0,
        settings: settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        state: Vec::new(),
        payment: None,
    }
}

fn hostile(engine: &PolicyEngine) -> Plugin {
    engine.load("hostile", HOSTILE_WASM).unwrap()
}

#[test]
fn single_phase_cancels_releasing_everything_the_order_locked() {
    let engine = engine();
    let plugin = engine
        .load("single-phase", builtin("single-phase").unwrap())
        .unwrap();
    assert_eq!(plugin.api_version(), "0.1.0");
    let o = order("o1", "acme", T0);
    let Decision::Cancel { effects, .. } = plugin
        .decide(&o, &ctx(T0, 0, &[("closed_template", "bye")]))
        .unwrap()
    else {
        panic!("expected a cancel")
    };
    assert_eq!(
        &effects[..4],
        &[
            Effect::RestoreStock {
                sku: "sku-a".into(),
                quantity: 2
            },
            Effect::RestoreStock {
                sku: "sku-b".into(),
                quantity: 1
            },
            Effect::ReleaseCoupon {
                coupon: "cpn-o1".into()
            },
            Effect::ClosePayment {
                payment_ref: "pay-o1".into()
            },
        ]
    );
    let Effect::Notify(notice) = &effects[4] else {
        panic!("{effects:?}")
    };
    assert_eq!(notice.template, "bye");
}

#[test]
fn two_phase_waits_and_reminds_then_cancels_with_the_flash_sale() {
    let engine = engine();
    let plugin = engine
        .load("two-phase", builtin("two-phase").unwrap())
        .unwrap();
    let mut o = order("o2", "flashy", T0);
    o.flash_activity = Some("act".into());
    let settings = [("grace", "5m")];
    let Decision::Wait {
        after_ms,
        next_phase,
        reminder,
        ..
    } = plugin.decide(&o, &ctx(T0, 0, &settings)).unwrap()
    else {
        panic!("expected a wait")
    };
    assert_eq!((after_ms, next_phase), (300_000, 1));
    let reminder = reminder.expect("a reminder");
    assert!(
        reminder
            .params
            .contains(&("closes_in".into(), "5 minutes".into())),
        "{reminder:?}"
    );
    let Decision::Cancel { effects, .. } =
        plugin.decide(&o, &ctx(T0 + 300_000, 1, &settings)).unwrap()
    else {
        panic!("expected a cancel")
    };
    assert!(effects.contains(&Effect::RestoreFlashStock {
        activity: "act".into(),
        quantity: 3
    }));
    assert!(effects.contains(&Effect::ReleaseFlashSlot {
        activity: "act".into(),
        user: "user-of-o2".into()
    }));
}

#[test]
fn a_missing_setting_is_a_policy_error_naming_the_key() {
    let engine = engine();
    let plugin = engine
        .load("two-phase", builtin("two-phase").unwrap())
        .unwrap();
    match plugin.decide(&order("o3", "flashy", T0), &ctx(T0, 0, &[])) {
        Err(DecideError::Policy {
            plugin,
            error: PolicyError::BadSetting { key, .. },
        }) => {
            assert_eq!((plugin.as_str(), key.as_str()), ("two-phase", "grace"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn traps_are_classified_and_discard_only_their_store() {
    let engine = engine();
    let o = order("o4", "evil", T0);
    // Built with `std` and without it (the SDK's own allocator and panic handler).
    for (variant, bytes) in [("std", HOSTILE_WASM), ("no std", HOSTILE_NO_STD_WASM)] {
        let plugin = engine.load("hostile", bytes).unwrap();
        for (mode, want) in [
            ("spin", TrapKind::Deadline),
            ("grow", TrapKind::Memory),
            ("panic", TrapKind::Fault),
            ("recurse", TrapKind::Fault),
        ] {
            match plugin.decide(&o, &ctx(T0, 0, &[("mode", mode)])) {
                Err(DecideError::Trap { kind, plugin, .. }) => {
                    assert_eq!(kind, want, "{variant}, mode {mode}");
                    assert_eq!(plugin, "hostile");
                }
                other => panic!("{variant}, mode {mode}: {other:?}"),
            }
            // The same plugin keeps serving.
            let ok = plugin.decide(&o, &ctx(T0, 0, &[("mode", "ok")])).unwrap();
            assert_eq!(ok.kind(), "cancel", "{variant}");
        }
    }
}

/// The epoch ticker sleeps while no plugin runs (it had woken 1,000 times a second on an idle
/// daemon), and a call after a long idle wakes it: a spinning plugin still traps at its
/// deadline (200 ms here), counted in whole ticks from the call's start.
#[test]
fn an_idle_engine_stops_ticking_and_a_spin_after_the_idle_still_traps_at_its_deadline() {
    let engine = engine();
    let plugin = hostile(&engine);
    // The load's `describe` woke the ticker; 100 ms after it the ticks stand still.
    let start = std::time::Instant::now();
    loop {
        let before = engine.epoch_ticks();
        std::thread::sleep(Duration::from_millis(300));
        if engine.epoch_ticks() == before {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the epoch kept ticking on an idle engine"
        );
    }
    let idle_ticks = engine.epoch_ticks();
    let o = order("o-idle", "evil", T0);
    let started = std::time::Instant::now();
    match plugin.decide(&o, &ctx(T0, 0, &[("mode", "spin")])) {
        Err(DecideError::Trap {
            kind: TrapKind::Deadline,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(150) && took < Duration::from_secs(10),
        "a 200 ms deadline took {took:?}"
    );
    let ticked = engine.epoch_ticks() - idle_ticks;
    assert!(ticked >= 199, "{ticked} ticks for a 200-tick deadline");
    let ok = plugin.decide(&o, &ctx(T0, 0, &[("mode", "ok")])).unwrap();
    assert_eq!(ok.kind(), "cancel");
}

/// Without `std`, the SDK's panic handler writes the panic's message to the daemon's log
/// through the host (tagged with the plugin and the order) before trapping.
#[test]
fn a_plugin_without_std_logs_its_panic_through_the_host() {
    let engine = engine();
    let plugin = engine.load("hostile", HOSTILE_NO_STD_WASM).unwrap();
    let log = crate::support::LogCapture::default();
    let answer = tracing::subscriber::with_default(log.subscriber(), || {
        plugin.decide(
            &order("o-panics", "evil", T0),
            &ctx(T0, 0, &[("mode", "panic")]),
        )
    });
    assert!(
        matches!(
            answer,
            Err(DecideError::Trap {
                kind: TrapKind::Fault,
                ..
            })
        ),
        "{answer:?}"
    );
    let text = log.text();
    assert!(
        text.contains("ERROR")
            && text.contains("plugin panicked: panicked at")
            && text.contains("hostile plugin panics on order o-panics")
            && text.contains("plugin=\"hostile\"")
            && text.contains("order=\"o-panics\""),
        "{text}"
    );
}

#[test]
fn oversized_answers_are_refused() {
    let engine = engine();
    match hostile(&engine).decide(&order("o5", "evil", T0), &ctx(T0, 0, &[("mode", "flood")])) {
        Err(DecideError::Oversized { reason, .. }) => {
            assert!(reason.contains("10000 effects"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn wasi_is_locked_down_and_its_clock_reads_the_decision_time() {
    let engine = engine();
    let plugin = hostile(&engine);
    let o = order("o6", "evil", T0);
    let Decision::Ignore { reason } = plugin
        .decide(&o, &ctx(T0 + 42, 0, &[("mode", "clock")]))
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(reason, (T0 + 42).to_string());
    let Decision::Ignore { reason } = plugin
        .decide(&o, &ctx(T0, 0, &[("mode", "snoop")]))
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(reason, "env=0 fs=false tcp=false");
}

#[test]
fn non_components_are_refused_with_the_reason() {
    let engine = engine();
    let core_module = b"\0asm\x01\0\0\0";
    assert!(
        matches!(engine.load("core", core_module), Err(LoadError::NotAComponent { detail, .. }) if detail == "a core module")
    );
    assert!(matches!(
        engine.load("text", b"hello world"),
        Err(LoadError::NotAComponent { .. })
    ));
}

#[test]
fn the_sdk_stamps_its_api_version_into_every_plugin() {
    for name in ["single-phase", "two-phase"] {
        let found = inspect(name, builtin(name).unwrap()).unwrap();
        assert_eq!(
            found.stamped_api_version.as_deref(),
            Some("0.1.0"),
            "{name}"
        );
        assert!(found.core_modules >= 1, "{name}: {found:?}");
    }
    assert_eq!(API_VERSION_SECTION, "timeout:policy-api");
}

/// The example plugins are built without Rust's `std`: their components import nothing but
/// `timeout:policy`, so a fresh instance sets up no WASI; the same SDK's plugin built with `std`
/// imports two dozen WASI interfaces. The inspection sees the difference.
#[test]
fn the_example_plugins_import_no_wasi() {
    let with_std = inspect("hostile", HOSTILE_WASM).unwrap();
    let without = inspect("hostile", HOSTILE_NO_STD_WASM).unwrap();
    assert!(
        with_std.imports.iter().any(|i| i.starts_with("wasi:")),
        "{:?}",
        with_std.imports
    );
    assert!(
        without
            .imports
            .iter()
            .all(|i| i.starts_with("timeout:policy/")),
        "{:?}",
        without.imports
    );
    for name in ["single-phase", "two-phase"] {
        let found = inspect(name, builtin(name).unwrap()).unwrap();
        assert!(
            !found.imports.is_empty()
                && found
                    .imports
                    .iter()
                    .all(|i| i.starts_with("timeout:policy/")),
            "{name}: {:?}",
            found.imports
        );
    }
}

#[test]
fn a_plugin_stamped_with_an_unsupported_version_is_refused_before_compilation() {
    let cache = tempfile::tempdir().unwrap();
    let engine = PolicyEngine::new(RuntimeLimits::default(), Some(cache.path())).unwrap();
    let err = engine.load("future", FUTURE_API_WASM).unwrap_err();
    match &err {
        LoadError::UnsupportedVersion {
            plugin,
            found,
            supported,
        } => assert_eq!(
            (plugin.as_str(), found.as_str(), supported.as_str()),
            (
                "future",
                "9.0.0",
                timeoutd_runtime::SUPPORTED_API_VERSIONS.join(", ").as_str()
            )
        ),
        other => panic!("{other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains("timeout:policy@9.0.0")
            && message.contains(&format!(
                "supports {}",
                timeoutd_runtime::SUPPORTED_API_VERSIONS.join(", ")
            )),
        "{message}"
    );
    // Nothing was compiled: a compile would have left its artifact in the cache.
    assert!(walk(cache.path()).is_empty(), "{:?}", walk(cache.path()));
}

#[test]
fn a_truncated_component_is_malformed_naming_the_offset() {
    let engine = engine();
    let bytes = builtin("two-phase").unwrap();
    let cut = &bytes[..bytes.len() / 2];
    match engine.load("cut", cut) {
        Err(LoadError::Malformed {
            plugin,
            offset,
            reason,
        }) => {
            assert_eq!(plugin, "cut");
            assert!(offset > 0 && offset <= cut.len(), "{offset}");
            assert!(!reason.is_empty());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_core_module_with_code_is_refused_as_not_a_component() {
    // (module (func (export "decide") (result i32) i32.const 0))
    let core: &[u8] = &[
        0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, 0x01, 0x05, 0x01, 0x60, 0x00, 0x01, 0x7f,
        0x03, 0x02, 0x01, 0x00, 0x07, 0x0a, 0x01, 0x06, b'd', b'e', b'c', b'i', b'd', b'e', 0x00,
        0x00, 0x0a, 0x06, 0x01, 0x04, 0x00, 0x41, 0x00, 0x0b,
    ];
    let err = engine().load("core", core).unwrap_err();
    assert!(
        matches!(&err, LoadError::NotAComponent { detail, .. } if detail == "a core module"),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("build it for wasm32-wasip2"),
        "{err}"
    );
}

#[test]
fn compiled_components_are_cached_on_disk_by_engine_hash_and_digest() {
    let dir = tempfile::tempdir().unwrap();
    let engine = PolicyEngine::new(RuntimeLimits::default(), Some(dir.path())).unwrap();
    let first = engine
        .load("single-phase", builtin("single-phase").unwrap())
        .unwrap();
    let artifacts: Vec<_> = walk(dir.path());
    assert_eq!(artifacts.len(), 1, "{artifacts:?}");
    assert!(artifacts[0].ends_with(&format!("{}.cwasm", first.digest())));
    // A second engine loads from the cache and decides the same.
    let again = PolicyEngine::new(RuntimeLimits::default(), Some(dir.path())).unwrap();
    let second = again
        .load("single-phase", builtin("single-phase").unwrap())
        .unwrap();
    let o = order("o7", "acme", T0);
    assert_eq!(
        first.decide(&o, &ctx(T0, 0, &[])).unwrap(),
        second.decide(&o, &ctx(T0, 0, &[])).unwrap()
    );
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path.display().to_string());
        }
    }
    out
}

/// A new plugin version on disk replaces the old one; a broken one is refused and the old one
/// keeps serving.
#[test]
fn plugin_files_are_hot_reloaded_and_a_bad_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.wasm");
    std::fs::write(&path, builtin("single-phase").unwrap()).unwrap();
    let toml = format!(
        "[database]\nurl = \"sqlite://{}/x.db\"\n[merchants.m]\nplugin = \"{}\"\n",
        dir.path().display(),
        path.display()
    );
    let config = timeoutd::config::Config::from_toml(&toml, dir.path(), &|_| None).unwrap();
    let policies = timeoutd::policies::load(&config).unwrap();
    let first = policies.get("m").unwrap().plugin.digest().to_string();
    assert!(
        !policies.reload(false)[0].changed,
        "nothing changed on disk"
    );
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&path, builtin("two-phase").unwrap()).unwrap();
    let report = policies.reload(false);
    assert!(report[0].changed, "{report:?}");
    let second = policies.get("m").unwrap().plugin.digest().to_string();
    assert_ne!(first, second);
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&path, b"not wasm at all").unwrap();
    let report = policies.reload(false);
    assert!(
        report[0]
            .refused
            .as_deref()
            .unwrap()
            .contains("not a WebAssembly component"),
        "{report:?}"
    );
    assert_eq!(
        policies.get("m").unwrap().plugin.digest(),
        second,
        "the old version keeps serving"
    );
}
