//! Decision latency per plugin language — the two-phase policy in Rust (`builtin:two-phase`),
//! JavaScript and Python (`scripts/build-polyglot-plugins` builds those into
//! `<target>/plugins-wasm/`) — each on a fresh instance per call and on warm instances.
//!
//! `scripts/build-polyglot-plugins && cargo bench -p timeoutd --bench polyglot`
//!
//! Criterion measures each case; a summary of medians (and p90) over 200 single calls is printed
//! at the end.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use timeoutd::policies::builtin;
use timeoutd_runtime::model::{Context, Order, OrderItem, OrderStatus, TriggerKind};
use timeoutd_runtime::{Plugin, PluginLimits, PolicyEngine, RuntimeLimits};

const DEADLINE: i64 = 1_795_946_400_000;

fn order() -> Order {
    Order {
        id: "bench-order".into(),
        merchant: "bench".into(),
        user: "bench-user".into(),
        status: OrderStatus::Pending,
        created_at_ms: DEADLINE - 900_000,
        deadline_ms: DEADLINE,
        total_cents: 4_490,
        items: vec![
            OrderItem {
                sku: "sku-a".into(),
                quantity: 2,
                unit_price_cents: 1_250,
            },
            OrderItem {
                sku: "sku-b".into(),
                quantity: 1,
                unit_price_cents: 1_990,
            },
        ],
        coupon: Some("cpn-1".into()),
        flash_activity: Some("act-1".into()),
        payment_ref: Some("pay-1".into()),
    }
}

fn context() -> Context {
    Context {
        now_ms: DEADLINE + 300_000,
        trigger: TriggerKind::Outbox,
        phase: 1,
        attempt: 0,
        settings: vec![("grace".into(), "5m".into())],
        state: Vec::new(),
        payment: None,
    }
}

/// `<target>/plugins-wasm/<name>.wasm`: `$CARGO_TARGET_DIR`, else from this binary's path
/// (`<target>/<profile>/deps/`).
fn polyglot_wasm(name: &str) -> Vec<u8> {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let exe = std::env::current_exe().expect("bench path");
            exe.ancestors().nth(3).expect("target dir").to_path_buf()
        })
        .join("plugins-wasm");
    let path = dir.join(format!("{name}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; build it with scripts/build-polyglot-plugins",
            path.display()
        )
    })
}

/// The three two-phase plugins on an engine; `warm` decides whether heavy ones stay warm.
fn plugins(warm: bool) -> Vec<(&'static str, Plugin)> {
    let engine = PolicyEngine::new(
        RuntimeLimits {
            max_plugin_memory_bytes: 128 << 20,
            warm_min_component_bytes: if warm { 0 } else { usize::MAX },
            ..RuntimeLimits::default()
        },
        None,
    )
    .expect("engine");
    let heavy = PluginLimits {
        deadline: Duration::from_secs(2),
        max_memory_bytes: 128 << 20,
    };
    let load =
        |name: &str, bytes: &[u8], limits| engine.load_with(name, bytes, limits).expect("load");
    vec![
        (
            "rust",
            load(
                "two-phase",
                builtin("two-phase").unwrap(),
                engine.default_plugin_limits(),
            ),
        ),
        (
            "js",
            load("two-phase-js", &polyglot_wasm("two-phase-js"), heavy),
        ),
        (
            "python",
            load("two-phase-py", &polyglot_wasm("two-phase-py"), heavy),
        ),
    ]
}

fn decide(c: &mut Criterion) {
    let (order, ctx) = (order(), context());
    let mut summary = Vec::new();
    for (instances, warm) in [("fresh", false), ("warm", true)] {
        let mut group = c.benchmark_group(format!("two_phase_cancel_{instances}"));
        group
            .measurement_time(Duration::from_secs(4))
            .sample_size(30);
        for (language, plugin) in plugins(warm) {
            group.bench_function(language, |b| {
                b.iter(|| std::hint::black_box(plugin.decide(&order, &ctx).expect("decide")))
            });
            let mut times: Vec<Duration> = (0..200)
                .map(|_| {
                    let start = Instant::now();
                    std::hint::black_box(plugin.decide(&order, &ctx).expect("decide"));
                    start.elapsed()
                })
                .collect();
            times.sort();
            summary.push((language, instances, times[100], times[180]));
        }
        group.finish();
    }
    println!("\ndecision latency, two-phase cancel (200 calls each):");
    println!(
        "{:<8} {:<6} {:>12} {:>12}",
        "language", "inst", "median", "p90"
    );
    for (language, instances, median, p90) in summary {
        println!("{language:<8} {instances:<6} {median:>12.1?} {p90:>12.1?}");
    }
}

criterion_group!(benches, decide);
criterion_main!(benches);
