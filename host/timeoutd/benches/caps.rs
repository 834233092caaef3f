//! What a cap costs an effect (`[caps]`, `timeoutd::effects::caps`), against no cap in the same
//! run: the ledger executor carrying out 500 `log` notices of one merchant on SQLite, with no
//! cap, with a cap kept in the process, and with one kept in Redis (127.0.0.1:6379), each cap
//! high enough never to defer, so the figure is the cap's own bookkeeping. Read the three
//! medians as a ratio to the first.
//!
//! `cargo bench -p timeoutd --bench caps`

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use timeoutd::clock::Clock;
use timeoutd::config::Config;
use timeoutd::db::Db;
use timeoutd::db::ledger::{self, NewEntry};
use timeoutd::effects::EffectRunner;

/// Notices per measured run.
const NOTICES: usize = 500;

/// A config on `url` with one merchant capped (or not) as `caps` says.
fn config(url: &str, caps: &str) -> Config {
    let toml = format!(
        "[database]\nurl = \"{url}\"\n[redis]\nurl = \"redis://127.0.0.1:6379\"\n{caps}\n\
         [merchants.bench]\nplugin = \"builtin:single-phase\"\n"
    );
    Config::from_toml(&toml, std::path::Path::new("."), &|_| None).expect("bench config")
}

/// Clears the ledger and records `NOTICES` PENDING notices of merchant `bench`.
async fn notices(db: &Db) {
    db.backend()
        .query("DELETE FROM effect_ledger")
        .execute(db.pool())
        .await
        .expect("clear the ledger");
    let payload = r#"{"kind":"notify","channel":"log","template":"order-closed","params":[]}"#;
    let ids: Vec<String> = (0..NOTICES).map(|i| format!("o-{i}")).collect();
    let entries: Vec<NewEntry<'_>> = ids
        .iter()
        .map(|id| NewEntry {
            order_id: id,
            merchant_id: "bench",
            phase: 0,
            index: 0,
            kind: "notify",
            payload: payload.to_string(),
            status: "PENDING",
            note: None,
            key: None,
        })
        .collect();
    let mut conn = db.pool().acquire().await.expect("a connection");
    ledger::record_many(&mut conn, db.backend(), &entries, 0)
        .await
        .expect("record the notices");
}

fn caps(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}/caps.db", dir.path().display());
    let db = rt.block_on(async {
        let db = Db::connect(&url, 4).await.expect("sqlite");
        db.migrate().await.expect("migrate");
        db
    });
    let mut group = c.benchmark_group("caps");
    group.throughput(Throughput::Elements(NOTICES as u64));
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(8));
    for (name, caps) in [
        ("none", ""),
        (
            "process",
            "[caps.per_second]\nnotify = 1000000\n\"notify.log\" = 1000000",
        ),
        (
            "redis",
            "[caps]\nstore = \"redis\"\n[caps.per_second]\nnotify = 1000000\n\"notify.log\" = 1000000",
        ),
    ] {
        let config = config(&url, caps);
        let runner = rt.block_on(async {
            EffectRunner::from_config(db.clone(), Clock::Database, &config)
                .await
                .expect("runner")
        });
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    rt.block_on(notices(&db));
                    let started = Instant::now();
                    let done = rt.block_on(runner.run_fresh()).expect("run");
                    spent += started.elapsed();
                    assert_eq!(done, NOTICES, "every notice sent, none deferred");
                }
                spent
            });
        });
    }
    group.finish();
}

criterion_group!(benches, caps);
criterion_main!(benches);
