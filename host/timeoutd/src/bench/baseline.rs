//! The baseline: this machine's one-order-per-commit limit. The simplest client loop closes the
//! baseline orders (`b-…`) with exactly the writes the daemon makes for a close — through the
//! daemon's own statement functions — one transaction per order, no plugin, no dispatch.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use timeoutd_runtime::model::{Effect, Notice};
use tokio::task::JoinSet;

use super::seed::{coupon_of, lines_of, sku_name};
use crate::clock::Stopwatch;
use crate::db::{Db, journal, ledger, orders, outbox};

/// What the baseline measured.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Baseline {
    /// Orders closed.
    pub closes: u32,
    /// Connections (concurrent client loops) used.
    pub connections: u32,
    /// Wall time, ms.
    pub elapsed_ms: i64,
    /// Closes per second.
    pub closes_per_s: f64,
}

/// Closes the `n` baseline orders over `connections` concurrent loops.
///
/// # Errors
/// A statement fails, or an order was not closed by its compare-and-set.
pub(super) async fn run(
    db: &Db,
    merchant: &str,
    n: u32,
    skus: u32,
    connections: u32,
) -> anyhow::Result<Baseline> {
    let rows: HashMap<String, i64> = crate::db::bench::baseline_outbox_rows(db).await?;
    let rows = Arc::new(rows);
    let next = Arc::new(AtomicU32::new(0));
    let watch = Stopwatch::start();
    let mut loops = JoinSet::new();
    for _ in 0..connections {
        let (db, rows, next, merchant) =
            (db.clone(), rows.clone(), next.clone(), merchant.to_string());
        loops.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return anyhow::Ok(());
                }
                close_one(&db, &merchant, i, skus, &rows).await?;
            }
        });
    }
    while let Some(done) = loops.join_next().await {
        done??;
    }
    let elapsed_ms = watch.elapsed_ms().max(1);
    Ok(Baseline {
        closes: n,
        connections,
        elapsed_ms,
        closes_per_s: f64::from(n) * 1000.0 / elapsed_ms as f64,
    })
}

async fn close_one(
    db: &Db,
    merchant: &str,
    i: u32,
    skus: u32,
    rows: &HashMap<String, i64>,
) -> anyhow::Result<()> {
    let id = format!("b-{i:07}");
    let backend = db.backend();
    let lines = lines_of(i, skus);
    let coupon = coupon_of(&id, i);
    let mut effects: Vec<Effect> = lines
        .iter()
        .map(|(sku, qty)| Effect::RestoreStock {
            sku: sku_name(*sku),
            quantity: *qty as u32,
        })
        .collect();
    if let Some(c) = &coupon {
        effects.push(Effect::ReleaseCoupon { coupon: c.clone() });
    }
    effects.push(Effect::ClosePayment {
        payment_ref: format!("pay-{id}"),
    });
    effects.push(Effect::Notify(Notice {
        channel: "log".into(),
        template: "order-closed".into(),
        params: vec![("total_cents".into(), "1990".into())],
    }));
    let mut tx = db.begin().await?;
    let now_ms = db.now_ms_on(&mut tx).await?;
    let stamp = orders::CloseStamp {
        now_ms,
        due_ms: now_ms,
        closed_by: "bench-baseline",
        reason: "payment window lapsed",
    };
    anyhow::ensure!(
        orders::compare_and_close(&mut tx, &id, &stamp).await?,
        "baseline order {id} was not PENDING"
    );
    for (index, effect) in effects.iter().enumerate() {
        match effect {
            Effect::RestoreStock { sku, quantity } => {
                orders::restore_stock(&mut tx, sku, *quantity).await?;
            }
            Effect::ReleaseCoupon { coupon } => {
                orders::release_coupon(&mut tx, coupon, &id).await?;
            }
            _ => {}
        }
        let in_tx = matches!(
            effect,
            Effect::RestoreStock { .. } | Effect::ReleaseCoupon { .. }
        );
        let entry = ledger::NewEntry {
            order_id: &id,
            merchant_id: merchant,
            phase: 0,
            index: index as u32,
            kind: effect.kind().as_str(),
            payload: serde_json::to_string(effect).expect("effect serialises"),
            status: if in_tx { ledger::DONE } else { ledger::PENDING },
            note: None,
            key: None,
        };
        ledger::record(&mut tx, backend, &entry, now_ms).await?;
    }
    let detail = serde_json::json!({ "decision": "cancel", "effects": &effects }).to_string();
    journal::log_decision(
        &mut tx,
        &journal::DecisionRecord {
            order_id: &id,
            merchant_id: merchant,
            plugin: "bench-baseline",
            plugin_digest: "-",
            trigger_kind: "outbox",
            phase: 0,
            attempt: 0,
            decision: "cancel",
            outcome: "closed",
            detail: detail.clone(),
            latency_us: 0,
            decided_at_ms: now_ms,
            input: Some(&detail),
            answer: Some(&detail),
        },
    )
    .await?;
    if let Some(row) = rows.get(&id) {
        outbox::finish(&mut tx, outbox::RowRef::unclaimed(*row), now_ms, None).await?;
    }
    tx.commit().await?;
    Ok(())
}
