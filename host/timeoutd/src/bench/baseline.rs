//! The baselines, this machine's own limits for the writes a close makes, taken in the same run
//! as the daemon:
//! - **client loop** ([`run`]): the simplest client closes the baseline orders (`b-…`) with
//!   exactly the writes the daemon makes for a close — through the daemon's own statement
//!   functions — one transaction per order, no plugin, no dispatch. The one-order-per-commit
//!   limit.
//! - **set-based** ([`run_set_based`]): the `s-…` orders closed in groups, one transaction per
//!   group, with the statements of the daemon's group close (`dispatch/close.rs`): the orders
//!   locked, one stock update per SKU, one compare-and-set for the group, the coupons in one
//!   statement, the ledger and the decision log in multi-row inserts, the outbox rows finished
//!   in one. No plugin, no dispatch, no waiting for a group to fill: what the database itself
//!   allows for these writes, which the daemon can approach but not pass.
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use timeoutd_runtime::model::{Effect, Notice};
use tokio::task::JoinSet;

use super::seed::{coupon_of, lines_of, sku_name};
use crate::clock::Stopwatch;
use crate::db::{Db, journal, ledger, lock_order, orders, outbox};

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
    drive(Way::ClientLoop, db, merchant, n, skus, connections).await
}

/// How a baseline closes its orders.
#[derive(Debug, Clone, Copy)]
enum Way {
    /// One transaction per order (`b-…`).
    ClientLoop,
    /// One transaction per group of this many (`s-…`).
    SetBased(u32),
}

impl Way {
    fn prefix(self) -> &'static str {
        match self {
            Way::ClientLoop => "b-",
            Way::SetBased(_) => "s-",
        }
    }

    fn step(self) -> u32 {
        match self {
            Way::ClientLoop => 1,
            Way::SetBased(group) => group.max(1),
        }
    }
}

/// Closes the `n` orders of `way` over `connections` concurrent loops, each taking the next
/// `way.step()` numbers at a time, and times it.
async fn drive(
    way: Way,
    db: &Db,
    merchant: &str,
    n: u32,
    skus: u32,
    connections: u32,
) -> anyhow::Result<Baseline> {
    let rows = Arc::new(crate::db::bench::baseline_outbox_rows(db, way.prefix()).await?);
    let next = Arc::new(AtomicU32::new(0));
    let watch = Stopwatch::start();
    let mut loops = JoinSet::new();
    for _ in 0..connections {
        let (db, rows, next, merchant) =
            (db.clone(), rows.clone(), next.clone(), merchant.to_string());
        loops.spawn(async move {
            loop {
                let first = next.fetch_add(way.step(), Ordering::Relaxed);
                if first >= n {
                    return anyhow::Ok(());
                }
                let numbers = first..(first + way.step()).min(n);
                match way {
                    Way::ClientLoop => close_one(&db, &merchant, first, skus, &rows).await?,
                    Way::SetBased(_) => close_group(&db, &merchant, numbers, skus, &rows).await?,
                }
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
    let effects = effects_of(&id, i, skus);
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
    for effect in &effects {
        match effect {
            Effect::RestoreStock { sku, quantity } => {
                orders::restore_stock(&mut tx, sku, *quantity).await?;
            }
            Effect::ReleaseCoupon { coupon } => {
                orders::release_coupon(&mut tx, coupon, &id).await?;
            }
            _ => {}
        }
    }
    for entry in ledger_entries(&id, merchant, &effects) {
        ledger::record(&mut tx, backend, &entry, now_ms).await?;
    }
    let detail = detail_of(&effects);
    journal::log_decision(
        &mut tx,
        &decision(&id, merchant, "bench-baseline", &detail, now_ms),
    )
    .await?;
    if let Some(row) = rows.get(&id) {
        outbox::finish(&mut tx, outbox::RowRef::unclaimed(*row), now_ms, None).await?;
    }
    tx.commit().await?;
    Ok(())
}

/// The cancel the bench's plugin decides for order `id` (number `i`): its lines' stock back, its
/// coupon, the payment closed and the buyer told.
fn effects_of(id: &str, i: u32, skus: u32) -> Vec<Effect> {
    let lines = lines_of(i, skus);
    let coupon = coupon_of(id, i);
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
    effects
}

/// The ledger rows of a close of `id` with `effects`: those inside the database DONE, the
/// others PENDING for the executor (as the daemon records them).
fn ledger_entries<'a>(
    id: &'a str,
    merchant: &'a str,
    effects: &[Effect],
) -> Vec<ledger::NewEntry<'a>> {
    effects
        .iter()
        .enumerate()
        .map(|(index, effect)| {
            let in_tx = matches!(
                effect,
                Effect::RestoreStock { .. } | Effect::ReleaseCoupon { .. }
            );
            ledger::NewEntry {
                order_id: id,
                merchant_id: merchant,
                phase: 0,
                index: index as u32,
                kind: effect.kind().as_str(),
                payload: serde_json::to_string(effect).expect("effect serialises"),
                status: if in_tx { ledger::DONE } else { ledger::PENDING },
                note: None,
                key: None,
            }
        })
        .collect()
}

/// The decision's detail (its input and answer too, as the daemon logs them).
fn detail_of(effects: &[Effect]) -> String {
    serde_json::json!({ "decision": "cancel", "effects": effects }).to_string()
}

/// The `decision_log` row of a close of `id` by `plugin`.
fn decision<'a>(
    id: &'a str,
    merchant: &'a str,
    plugin: &'a str,
    detail: &'a str,
    now_ms: i64,
) -> journal::DecisionRecord<'a> {
    journal::DecisionRecord {
        order_id: id,
        merchant_id: merchant,
        plugin,
        plugin_digest: "-",
        trigger_kind: "outbox",
        phase: 0,
        attempt: 0,
        decision: "cancel",
        outcome: "closed",
        detail: detail.to_string(),
        latency_us: 0,
        decided_at_ms: now_ms,
        input: Some(detail),
        answer: Some(detail),
    }
}

/// Closes the `n` set-based orders (`s-…`) in groups of `group`, one transaction per group,
/// over `connections` concurrent loops (the module's second baseline).
///
/// # Errors
/// A statement fails, or a group's compare-and-set did not close every order of it.
pub(super) async fn run_set_based(
    db: &Db,
    merchant: &str,
    n: u32,
    skus: u32,
    connections: u32,
    group: u32,
) -> anyhow::Result<Baseline> {
    drive(Way::SetBased(group), db, merchant, n, skus, connections).await
}

async fn close_group(
    db: &Db,
    merchant: &str,
    numbers: std::ops::Range<u32>,
    skus: u32,
    rows: &HashMap<String, i64>,
) -> anyhow::Result<()> {
    let orders_of: Vec<(String, String, Vec<Effect>)> = numbers
        .map(|i| {
            let id = format!("s-{i:07}");
            let effects = effects_of(&id, i, skus);
            (id, format!("u-{i}"), effects)
        })
        .collect();
    let ids: Vec<&str> = orders_of.iter().map(|(id, _, _)| id.as_str()).collect();
    let schema = db.schema();
    let mut tx = db.begin().await?;
    let now_ms = db.now_ms_on(&mut tx).await?;
    let locked = orders::lock_pending(&mut tx, schema, &ids, Some(now_ms)).await?;
    anyhow::ensure!(
        locked.len() == ids.len(),
        "{} of {} set-based orders were PENDING and due",
        locked.len(),
        ids.len()
    );
    let mut stock: Vec<(&str, i64)> = Vec::new();
    let mut coupons: Vec<(&str, &str, &str)> = Vec::new();
    for (id, user, effects) in &orders_of {
        for effect in effects {
            match effect {
                Effect::RestoreStock { sku, quantity } => stock.push((sku, i64::from(*quantity))),
                Effect::ReleaseCoupon { coupon } => coupons.push((coupon, id, user)),
                _ => {}
            }
        }
    }
    for (sku, units) in lock_order::units_per_sku(stock) {
        anyhow::ensure!(
            orders::restore_units(&mut tx, schema, sku, units).await?,
            "no stock row for {sku}"
        );
    }
    let stamps: Vec<(&str, orders::CloseStamp<'_>)> = ids
        .iter()
        .map(|id| {
            let stamp = orders::CloseStamp {
                now_ms,
                due_ms: now_ms,
                closed_by: "bench-set-based",
                reason: "payment window lapsed",
            };
            (*id, stamp)
        })
        .collect();
    let changed = orders::close_many(&mut tx, schema, &stamps, now_ms).await?;
    anyhow::ensure!(
        changed == ids.len() as u64,
        "the group's compare-and-set closed {changed} of {}",
        ids.len()
    );
    orders::release_coupons(&mut tx, schema, &coupons).await?;
    let entries: Vec<ledger::NewEntry<'_>> = orders_of
        .iter()
        .flat_map(|(id, _, effects)| ledger_entries(id, merchant, effects))
        .collect();
    ledger::record_many(&mut tx, db.backend(), &entries, now_ms).await?;
    let details: Vec<String> = orders_of.iter().map(|(_, _, e)| detail_of(e)).collect();
    let records: Vec<journal::DecisionRecord<'_>> = orders_of
        .iter()
        .zip(&details)
        .map(|((id, _, _), detail)| decision(id, merchant, "bench-set-based", detail, now_ms))
        .collect();
    journal::log_decisions(&mut tx, &records).await?;
    let finished: Vec<outbox::RowRef<'_>> = ids
        .iter()
        .filter_map(|id| rows.get(*id))
        .map(|row| outbox::RowRef::unclaimed(*row))
        .collect();
    outbox::finish_many(&mut tx, &finished, now_ms, None).await?;
    tx.commit().await?;
    Ok(())
}
