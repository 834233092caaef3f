//! One decision through the policy runtime, with a fresh instance (and `Store`) per call, as the
//! daemon makes it: instantiate from the `InstancePre` on the pooling allocator, call `decide`,
//! convert the answer, drop the store. Target: ≤ 10 µs median on the 2-core CI machine.
//!
//! `cargo bench -p timeoutd --bench decide`

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use timeoutd::policies::builtin;
use timeoutd_runtime::model::{Context, Order, OrderItem, OrderStatus, TriggerKind};
use timeoutd_runtime::{PolicyEngine, RuntimeLimits};

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

fn context(now_ms: i64, phase: u32) -> Context {
    Context {
        now_ms,
        trigger: TriggerKind::Outbox,
        phase,
        attempt: 0,
        settings: vec![
            ("grace".into(), "5m".into()),
            ("channel".into(), "log".into()),
            ("closed_template".into(), "order-closed".into()),
        ],
        state: Vec::new(),
        payment: None,
    }
}

fn decide(c: &mut Criterion) {
    let engine = PolicyEngine::new(RuntimeLimits::default(), None).expect("engine");
    let order = order();
    let mut group = c.benchmark_group("decide_fresh_instance");
    group.measurement_time(Duration::from_secs(5));
    for (name, now, phase) in [
        ("single-phase/cancel", DEADLINE, 0),
        ("two-phase/wait+remind", DEADLINE + 10, 0),
        ("two-phase/cancel", DEADLINE + 300_000, 1),
    ] {
        let plugin_name = name.split('/').next().unwrap();
        let plugin = engine
            .load(plugin_name, builtin(plugin_name).unwrap())
            .expect("load");
        let ctx = context(now, phase);
        group.bench_function(name, |b| {
            b.iter(|| std::hint::black_box(plugin.decide(&order, &ctx).expect("decide")))
        });
    }
    group.finish();
}

criterion_group!(benches, decide);
criterion_main!(benches);
