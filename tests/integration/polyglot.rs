//! The two-phase policy in JavaScript and Python (`plugins/two-phase-js`, `plugins/two-phase-py`,
//! built by `scripts/build-polyglot-plugins`) through the production engine: the same inputs
//! give the same decisions and verdicts as the Rust plugin; heavy components run on warm
//! instances that are recycled after a failure or N calls and leak nothing between orders.

use std::path::PathBuf;
use std::time::Duration;

use timeoutd::policies::builtin;
use timeoutd_runtime::model::{Context, Decision, Order, OrderStatus, TriggerKind};
use timeoutd_runtime::{
    DecideError, InstanceMode, Plugin, PluginLimits, PolicyEngine, RuntimeLimits, TrapKind,
};

use crate::support::{HOSTILE_WASM, T0, order};

/// Where `scripts/build-polyglot-plugins` put the components: `$TIMEOUTD_POLYGLOT_DIR`, else
/// `<cargo target dir>/plugins-wasm` (the target dir taken from `$CARGO_TARGET_DIR` or from this
/// test binary's path, `<target>/<profile>/deps/`).
pub fn polyglot_wasm(name: &str) -> PathBuf {
    let path = polyglot_dir().join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: build it with `scripts/build-polyglot-plugins` (scripts/test does)",
        path.display()
    );
    path
}

/// Compiled components, shared by the tests' engines: a 12–18 MB component takes seconds to
/// compile with the debug-built compiler, and every test here builds its own engine.
pub fn cwasm_cache() -> PathBuf {
    polyglot_dir().join("cwasm-cache")
}

fn polyglot_dir() -> PathBuf {
    std::env::var_os("TIMEOUTD_POLYGLOT_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR").map(|t| PathBuf::from(t).join("plugins-wasm"))
        })
        .unwrap_or_else(|| {
            let exe = std::env::current_exe().unwrap();
            exe.ancestors().nth(3).unwrap().join("plugins-wasm")
        })
}

/// Limits for the JavaScript and Python components: a language runtime needs more memory than
/// a Rust plugin, and the suite runs debug builds on two busy cores.
pub const POLYGLOT_LIMITS: PluginLimits = PluginLimits {
    deadline: Duration::from_secs(2),
    max_memory_bytes: 128 << 20,
};

fn engine(tweak: impl FnOnce(&mut RuntimeLimits)) -> PolicyEngine {
    let mut limits = RuntimeLimits {
        deadline: Duration::from_secs(2),
        max_plugin_memory_bytes: 128 << 20,
        ..RuntimeLimits::default()
    };
    tweak(&mut limits);
    PolicyEngine::new(limits, Some(&cwasm_cache())).unwrap()
}

/// The Rust, JavaScript and Python two-phase plugins, in that order.
fn three(engine: &PolicyEngine) -> [Plugin; 3] {
    let rust = engine
        .load("two-phase", builtin("two-phase").unwrap())
        .unwrap();
    let load = |name: &str| {
        engine
            .load_file_with(name, &polyglot_wasm(name), POLYGLOT_LIMITS)
            .unwrap_or_else(|e| panic!("{e}"))
    };
    [rust, load("two-phase-js"), load("two-phase-py")]
}

fn ctx(now_ms: i64, phase: u32, attempt: u32, settings: &[(&str, &str)]) -> Context {
    Context {
        now_ms,
        trigger: TriggerKind::Outbox,
        phase,
        attempt,
        settings: settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        state: Vec::new(),
        payment: None,
    }
}

/// Orders covering every branch of `release_everything`: coupon / payment / flash activity
/// present or not, statuses, several lines.
fn orders() -> Vec<Order> {
    let plain = order("o-plain", "acme", T0);
    let mut flash = order("o-flash", "acme", T0);
    flash.flash_activity = Some("act-9".into());
    let mut bare = order("o-bare", "acme", T0);
    bare.coupon = None;
    bare.payment_ref = None;
    let mut paid = order("o-paid", "acme", T0);
    paid.status = OrderStatus::Paid;
    let mut closed = flash.clone();
    closed.id = "o-closed".into();
    closed.status = OrderStatus::Closed;
    vec![plain, flash, bare, paid, closed]
}

/// Settings covering defaults, overrides and every way `grace` / `max_checks` can be wrong.
const SETTINGS: &[&[(&str, &str)]] = &[
    &[("grace", "5m")],
    &[
        ("grace", "90s"),
        ("channel", "sms"),
        ("reminder_template", "hurry"),
        ("closed_template", "bye"),
    ],
    &[("grace", "1500ms"), ("max_checks", "5")],
    &[("grace", " 2h "), ("max_checks", "x")],
    &[("grace", "0ms"), ("channel", "")],
    &[("grace", "61s")],
    &[],
    &[("grace", "5")],
    &[("grace", "ten")],
    &[("grace", "3w")],
    &[("grace", "99999999999999999999ms")],
    &[("grace", "999999999999999d")],
];

/// Moments relative to the deadline `T0` and the phases they are asked in.
const MOMENTS: &[(i64, u32)] = &[
    (-600_000, 0),
    (-1, 0),
    (0, 0),
    (1, 0),
    (59_999, 0),
    (60_000, 1),
    (89_999, 1),
    (90_000, 1),
    (299_999, 0),
    (300_000, 1),
    (7_200_000, 0),
    (10_800_000, 2),
];

#[test]
fn js_and_python_two_phase_decide_and_check_exactly_like_the_rust_plugin() {
    let engine = engine(|_| {});
    let [rust, js, py] = three(&engine);
    assert_eq!(
        (rust.instance_mode(), js.instance_mode(), py.instance_mode()),
        (InstanceMode::Fresh, InstanceMode::Warm, InstanceMode::Warm)
    );
    let (mut compared, mut kinds) = (0, std::collections::BTreeSet::new());
    for o in orders() {
        for settings in SETTINGS {
            for &(offset, phase) in MOMENTS {
                for attempt in [0, 3, 5] {
                    let c = ctx(T0 + offset, phase, attempt, settings);
                    let want = rust.decide(&o, &c);
                    kinds.insert(match &want {
                        Ok(d) => d.kind().to_string(),
                        Err(e) => format!("{e:?}")
                            .split_whitespace()
                            .next()
                            .unwrap()
                            .to_string(),
                    });
                    let want_check = rust.check(&o, &c).unwrap();
                    for p in [&js, &py] {
                        let got = p.decide(&o, &c);
                        let same = match (&want, &got) {
                            (Ok(a), Ok(b)) => a == b,
                            (
                                Err(DecideError::Policy { error: a, .. }),
                                Err(DecideError::Policy { error: b, .. }),
                            ) => a == b,
                            _ => false,
                        };
                        assert!(
                            same,
                            "{} on {} {c:?}:\n want {want:?}\n got  {got:?}",
                            p.name(),
                            o.id
                        );
                        assert_eq!(
                            p.check(&o, &c).unwrap(),
                            want_check,
                            "{} check on {} {c:?}",
                            p.name(),
                            o.id
                        );
                        compared += 1;
                    }
                }
            }
        }
    }
    // Every kind of answer was among the compared ones.
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        ["Policy", "cancel", "ignore", "wait"],
    );
    assert_eq!(compared, 2 * 5 * SETTINGS.len() * MOMENTS.len() * 3);
}

#[test]
fn js_and_python_two_phase_pass_the_shared_cases_file() {
    let cases = timeoutd_plugin_harness::cases::CasesFile::load(
        &crate::support::repo_root().join("plugins/cases/two-phase.toml"),
    )
    .unwrap();
    assert!(cases.cases.len() >= 18, "{} cases", cases.cases.len());
    let engine = engine(|_| {});
    for plugin in three(&engine) {
        let report = cases.run(&plugin);
        assert!(report.passed(), "{}:\n{report}", plugin.name());
        assert_eq!(report.failed(), 0);
    }
}

/// What a merchant runs: `timeoutd plugin test` with the limits the component needs — the
/// two-phase (0.1.0) and tea-house (0.2.0) components in JavaScript and Python, and the Rust
/// tea-house, each on its policy's shared cases file.
#[test]
fn timeoutd_plugin_test_passes_the_js_and_python_components_on_the_shared_cases() {
    let dir = tempfile::tempdir().unwrap();
    let rust_tea_house = dir.path().join("tea-house.wasm");
    std::fs::write(&rust_tea_house, crate::support::TEA_HOUSE_WASM).unwrap();
    let runs = [
        (
            "two-phase",
            polyglot_wasm("two-phase-js"),
            "a flash-sale order also gives the units back",
        ),
        (
            "two-phase",
            polyglot_wasm("two-phase-py"),
            "a flash-sale order also gives the units back",
        ),
        (
            "tea-house",
            rust_tea_house,
            "a VIP order at the deadline gets a second reminder",
        ),
        (
            "tea-house",
            polyglot_wasm("tea-house-js"),
            "a VIP order at the deadline gets a second reminder",
        ),
        (
            "tea-house",
            polyglot_wasm("tea-house-py"),
            "a VIP order at the deadline gets a second reminder",
        ),
    ];
    for (policy, wasm, a_case) in runs {
        let cases = crate::support::repo_root().join(format!("plugins/cases/{policy}.toml"));
        let name = wasm.display().to_string();
        let out = std::process::Command::new(crate::support::timeoutd_bin())
            .args([
                "plugin",
                "test",
                "--deadline",
                "2s",
                "--max-memory-mib",
                "128",
            ])
            .arg(&wasm)
            .arg(&cases)
            .output()
            .unwrap();
        let all = format!(
            "{name}: exit {:?}\n{}{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(0), "{all}");
        assert!(all.contains(" 0 failed"), "{all}");
        assert!(all.contains(&format!("ok    {a_case}")), "{all}");
    }
}

#[test]
fn a_warm_instance_decides_the_next_order_as_a_fresh_one_would() {
    let warm = engine(|_| {});
    let fresh = engine(|l| l.warm_min_component_bytes = usize::MAX);
    let [_, wjs, wpy] = three(&warm);
    let [_, fjs, fpy] = three(&fresh);
    assert_eq!(fjs.instance_mode(), InstanceMode::Fresh);
    let mut a = order("o-a", "acme", T0);
    a.flash_activity = Some("act-1".into());
    let b = order("o-b", "acme", T0 + 60_000);
    let ca = ctx(T0 + 10_000, 0, 0, &[("grace", "5m"), ("channel", "sms")]);
    let cb = ctx(T0 + 60_000, 0, 0, &[("grace", "1m")]);
    for (w, f) in [(&wjs, &fjs), (&wpy, &fpy)] {
        // A, then B, then A again on one warm instance; each as a fresh instance decides it.
        for (o, c) in [(&a, &ca), (&b, &cb), (&a, &ca)] {
            assert_eq!(
                w.decide(o, c).unwrap(),
                f.decide(o, c).unwrap(),
                "{}",
                w.name()
            );
        }
        assert_eq!(
            w.instantiations(),
            1,
            "{}: one warm instance served all three",
            w.name()
        );
        assert_eq!(w.warm_instances(), 1);
        assert_eq!(f.instantiations(), 3);
        assert_eq!(f.warm_instances(), 0);
    }
}

/// The hostile test plugin forced onto warm instances.
fn warm_hostile(tweak: impl FnOnce(&mut RuntimeLimits)) -> (PolicyEngine, Plugin) {
    let engine = engine(|l| {
        l.warm_min_component_bytes = 0;
        l.max_memory_bytes = 32 << 20;
        l.deadline = Duration::from_millis(300);
        tweak(l);
    });
    let plugin = engine.load("hostile", HOSTILE_WASM).unwrap();
    assert_eq!(plugin.instance_mode(), InstanceMode::Warm);
    (engine, plugin)
}

#[test]
fn a_trap_or_an_error_discards_the_warm_instance() {
    let (_engine, plugin) = warm_hostile(|_| {});
    let o = order("o-t", "evil", T0);
    let ok = ctx(T0, 0, 0, &[("mode", "ok")]);
    assert_eq!(plugin.decide(&o, &ok).unwrap().kind(), "cancel");
    assert_eq!((plugin.instantiations(), plugin.warm_instances()), (1, 1));
    let mut made = 1;
    for (mode, want) in [
        ("panic", Some(TrapKind::Fault)),
        ("spin", Some(TrapKind::Deadline)),
        ("grow", Some(TrapKind::Memory)),
        ("error", None),
    ] {
        match (plugin.decide(&o, &ctx(T0, 0, 0, &[("mode", mode)])), want) {
            (Err(DecideError::Trap { kind, .. }), Some(want)) => assert_eq!(kind, want, "{mode}"),
            (Err(DecideError::Policy { .. }), None) => {}
            (other, _) => panic!("mode {mode}: {other:?}"),
        }
        // The failed call ran on the warm instance, which is gone; the next call makes a new one.
        assert_eq!(plugin.warm_instances(), 0, "after {mode}");
        assert_eq!(plugin.decide(&o, &ok).unwrap().kind(), "cancel");
        made += 1;
        assert_eq!(
            (plugin.instantiations(), plugin.warm_instances()),
            (made, 1),
            "after {mode}"
        );
    }
}

#[test]
fn a_warm_instance_is_recycled_after_n_calls_and_its_clock_follows_each_call() {
    let (_engine, plugin) = warm_hostile(|l| l.warm_max_calls = 3);
    let o = order("o-n", "evil", T0);
    for n in 0..7_i64 {
        let Decision::Ignore { reason } = plugin
            .decide(&o, &ctx(T0 + n * 1_000, 0, 0, &[("mode", "clock")]))
            .unwrap()
        else {
            panic!("expected an ignore")
        };
        assert_eq!(reason, (T0 + n * 1_000).to_string(), "call {n}");
    }
    // Calls 1–3 on the first instance, 4–6 on the second, 7 on the third.
    assert_eq!(plugin.instantiations(), 3);
    assert_eq!(plugin.warm_instances(), 1);
}

#[test]
fn the_warm_pool_is_bounded_and_drops_the_least_recently_used() {
    let engine = engine(|l| {
        l.warm_min_component_bytes = 0;
        l.max_warm_instances = 1;
    });
    let a = engine.load("hostile-a", HOSTILE_WASM).unwrap();
    let b = engine.load("hostile-b", HOSTILE_WASM).unwrap();
    let (o, c) = (order("o-l", "evil", T0), ctx(T0, 0, 0, &[]));
    a.decide(&o, &c).unwrap();
    assert_eq!((a.warm_instances(), b.warm_instances()), (1, 0));
    b.decide(&o, &c).unwrap();
    assert_eq!(
        (a.warm_instances(), b.warm_instances()),
        (0, 1),
        "a's instance was evicted"
    );
    a.decide(&o, &c).unwrap();
    assert_eq!(a.instantiations(), 2);
    // A dropped plugin's idle instances leave the pool with it.
    drop(a);
    assert_eq!(b.warm_instances(), 0, "b's was evicted by a's");
}

#[test]
fn a_plugin_cannot_be_given_more_memory_than_the_engine_pool_holds() {
    let engine = engine(|_| {});
    let limits = PluginLimits {
        deadline: Duration::from_secs(1),
        max_memory_bytes: 512 << 20,
    };
    match engine.load_with("big", HOSTILE_WASM, limits) {
        Err(e) => assert!(
            e.to_string()
                .contains("exceeds the engine's max_plugin_memory_bytes"),
            "{e}"
        ),
        Ok(_) => panic!("a 512 MiB cap was accepted by a 128 MiB pool"),
    }
}

/// A config whose merchants `shop-js` and `shop-py` use the JavaScript and Python two-phase
/// components by file path, with their own deadline and memory cap (grace 1 s).
fn polyglot_config(env: &crate::support::Env) -> timeoutd::config::Config {
    let mut toml = format!(
        "[database]\nurl = \"{}\"\n[runtime]\ndeadline = \"2s\"\ncache_dir = \"{}\"\n",
        env.url,
        cwasm_cache().display()
    );
    for (id, name) in [("shop-js", "two-phase-js"), ("shop-py", "two-phase-py")] {
        toml += &format!(
            "[merchants.{id}]\nplugin = \"{}\"\nplugin_deadline = \"2s\"\nplugin_max_memory_mib = 128\n\
             [merchants.{id}.settings]\ngrace = \"1s\"\nclosed_template = \"{id}-closed\"\n",
            polyglot_wasm(name).display()
        );
    }
    timeoutd::config::Config::from_toml(&toml, env.dir.path(), &|_| None).unwrap()
}

crate::support::each_backend! {
    async fn js_and_python_plugins_remind_then_close_real_orders_in_the_daemon(env) {
        use timeoutd::clock::Clock;
        use timeoutd::dispatch::Outcome;
        env.stock_up(&[("sku-a", 10), ("sku-b", 10)]).await;
        let config = polyglot_config(env);
        let (clock, now) = Clock::manual(T0);
        let d = env.dispatcher(&config, clock).await;
        for shop in ["shop-js", "shop-py"] {
            env.create(&order(&format!("o-{shop}"), shop, T0)).await;
        }
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (6, 8));
        // At the deadline both plugins wait the 1 s grace and remind the buyer.
        let outcomes = env.process(&d, T0).await;
        assert_eq!(outcomes, vec![Outcome::Waiting { next_phase: 1, due_ms: T0 + 1_000 }; 2]);
        for shop in ["shop-js", "shop-py"] {
            let id = format!("o-{shop}");
            assert_eq!(env.status(&id).await, "PENDING");
            assert_eq!(env.int("SELECT COUNT(*) FROM decision_log WHERE decision = 'wait' AND order_id = ?", &id).await, 1);
        }
        // When the grace lapses they close the orders: stock and coupon back, payment and notice
        // in the ledger.
        now.store(T0 + 1_000, std::sync::atomic::Ordering::SeqCst);
        let outcomes = env.process(&d, T0 + 1_000).await;
        assert_eq!(outcomes, vec![Outcome::Closed { lateness_ms: 0 }; 2]);
        assert_eq!((env.stock("sku-a").await, env.stock("sku-b").await), (10, 10));
        for (shop, file) in [("shop-js", "two-phase-js"), ("shop-py", "two-phase-py")] {
            let id = format!("o-{shop}");
            assert_eq!(env.status(&id).await, "CLOSED");
            assert_eq!(env.coupon(&format!("cpn-{id}")).await, "AVAILABLE");
            assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE kind = 'close-payment' AND order_id = ?", &id).await, 1);
            assert_eq!(env.int("SELECT COUNT(*) FROM effect_ledger WHERE kind = 'restore-stock' AND order_id = ?", &id).await, 2);
            let plugin = env.text("SELECT plugin FROM decision_log WHERE decision = 'cancel' AND order_id = ?", &id).await;
            assert!(plugin.ends_with(&format!("{file}.wasm")), "{shop} decided with {plugin}");
        }
    }
}

/// Two merchants on the same plugin file with the same limits, for each language: compiled once,
/// but each merchant owns its warm instances. The components cache the first `tag` setting they
/// see in module-level state (Rust `static`: `plugins/hostile` mode `remember`; JavaScript module
/// variable and Python global: `tests/data/module-state/`); interleaved orders of both merchants
/// must each be closed with their own merchant's tag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warm_instances_never_carry_one_merchants_module_state_into_anothers_orders() {
    use timeoutd::clock::Clock;
    let env = crate::support::Env::new(timeoutd::db::Backend::Sqlite).await;
    let files = [
        ("rs", env.hostile_wasm()),
        ("js", polyglot_wasm("module-state-js")),
        ("py", polyglot_wasm("module-state-py")),
    ];
    // Every component runs warm (the threshold is 0 KiB), as JavaScript and Python do anyway.
    let mut toml = format!(
        "[database]\nurl = \"{}\"\n[runtime]\ndeadline = \"2s\"\nwarm_min_component_kib = 0\n\
         cache_dir = \"{}\"\n",
        env.url,
        cwasm_cache().display()
    );
    let mut merchants = Vec::new();
    for (lang, file) in &files {
        for tag in ["A", "B"] {
            let id = format!("{lang}-{tag}");
            toml += &format!(
                "[merchants.{id}]\nplugin = \"{}\"\nplugin_deadline = \"2s\"\n\
                 plugin_max_memory_mib = 128\n[merchants.{id}.settings]\nmode = \"remember\"\n\
                 tag = \"{tag}\"\n",
                file.display()
            );
            merchants.push((id, tag));
        }
    }
    let config = timeoutd::config::Config::from_toml(&toml, env.dir.path(), &|_| None).unwrap();
    env.stock_up(&[("sku-a", 1000), ("sku-b", 1000)]).await;
    let mut orders = Vec::new();
    for round in 0..6 {
        for (n, (merchant, tag)) in merchants.iter().enumerate() {
            let id = format!("{merchant}-{round}");
            env.create(&order(&id, merchant, T0 + (round * 10 + n) as i64))
                .await;
            orders.push((id, merchant.clone(), *tag));
        }
    }
    let (clock, _) = Clock::manual(T0 + 1_000);
    let d = env.dispatcher(&config, clock).await;
    let outcomes = env.process(&d, T0 + 1_000).await;
    assert_eq!(outcomes.len(), orders.len(), "{outcomes:?}");
    let mut wrong = Vec::new();
    for (id, merchant, tag) in &orders {
        let reason = env
            .text("SELECT close_reason FROM orders WHERE id = ?", id)
            .await;
        if reason != format!("tag={tag}") {
            wrong.push(format!("{id} of {merchant} closed with `{reason}`"));
        }
    }
    assert!(
        wrong.is_empty(),
        "another merchant's state decided:\n{}",
        wrong.join("\n")
    );
    let policies = timeoutd::policies::load(&config).unwrap();
    for (lang, _) in &files {
        let (a, b) = (
            policies.get(&format!("{lang}-A")).unwrap(),
            policies.get(&format!("{lang}-B")).unwrap(),
        );
        assert_eq!(a.plugin.digest(), b.plugin.digest(), "{lang}: one file");
        assert_eq!(a.plugin.instance_mode(), InstanceMode::Warm, "{lang}");
    }
    env.cleanup().await;
}
