//! `timeoutd plugin whatif FILE.wasm --config CONFIG --merchant M [--since 7d] [--setting K=V]…
//! [--out DIR]`: what a candidate plugin would have done to a merchant's recorded orders.
//!
//! Every decision the merchant's live plugin made in the period (`decision_log`, whose `input`
//! is the order and context exactly as given) is decided again by the candidate, streamed a
//! page at a time (memory bounded by the page, whatever the period), on every core. The
//! comparison is the shadow's ([`crate::shadow::compare`]); the totals are what a merchant
//! asks before a change:
//! - closes that would become waits (or ignores), and waits that would become closes;
//! - stock units and coupons released earlier or later, and by how much, counted once per
//!   order at its first decision at or after its deadline (phase 0, first attempt) — a lower
//!   bound: a close turned into a wait releases at least that wait later; a wait turned into a
//!   close releases at least the wait earlier; two waits of different lengths move the order's
//!   release by their difference; a close turned into an ignore may never release. Later
//!   phases count in the decision totals only: the candidate might never have reached them;
//! - reminders added or dropped;
//! - answers the guard would refuse, and calls that failed.
//!
//! Writes `whatif.json` (the totals, for scripts) and `whatif.html` (self-contained: the
//! totals and the charts, drawn by the console's own chart code, `assets/chart.js`).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use serde::Serialize;
use timeoutd_runtime::guard::{Review, review};
use timeoutd_runtime::model::{Decision, Effect, Order};
use timeoutd_runtime::{Plugin, PolicyEngine};

use super::replay::Input;
use crate::config::Config;
use crate::db::replay::{RecordedInput, inputs_since};
use crate::db::{Db, DbError};
use crate::policies;
use crate::shadow::compare::differences;

/// Recorded decisions read per page.
const PAGE: u32 = 4_096;

/// The chart code the console draws with: one file, included by both.
const CHART_JS: &str = include_str!("../../assets/chart.js");

/// How far releases move, by bucket: the upper bound of each bucket, ms, and its label.
const SHIFT_BUCKETS: &[(u64, &str)] = &[
    (60_000, "< 1 min"),
    (5 * 60_000, "1–5 min"),
    (15 * 60_000, "5–15 min"),
    (60 * 60_000, "15–60 min"),
    (24 * 60 * 60_000, "1–24 h"),
    (u64::MAX, "> 24 h"),
];

/// What a candidate would have changed: `whatif.json`.
#[derive(Debug, Default, Serialize)]
pub struct WhatIf {
    /// Merchant.
    pub merchant: String,
    /// The candidate's file name and SHA-256.
    pub candidate: (String, String),
    /// The period, epoch ms: decisions decided at or after `since_ms`.
    pub since_ms: i64,
    /// Settings changed for every call (`--setting`).
    pub settings_changed: Vec<(String, String)>,
    /// Decisions decided again.
    pub decisions: u64,
    /// Decisions skipped: no recorded input or answer (older than migration 5), or a live call
    /// that failed.
    pub skipped: u64,
    /// The candidate answered the same.
    pub same: u64,
    /// The candidate answered differently (refused and failed answers included).
    pub different: u64,
    /// Changes of kind, `live→candidate` (`cancel→wait`, `wait→cancel`, …).
    pub transitions: BTreeMap<String, u64>,
    /// Decisions by part that differs (`kind`, `wait`, `phase`, `reminder`, `effects`).
    pub differences: BTreeMap<String, u64>,
    /// Stock units the orders' releases move (restore-stock quantities).
    pub stock_units: Shift,
    /// Coupons the orders' releases move.
    pub coupons: Shift,
    /// Orders whose release moves, by how far: `(bucket, earlier, later)`.
    pub shift: Vec<(String, u64, u64)>,
    /// Closes that would never release by this call: the candidate ignores.
    pub closes_to_ignores: u64,
    /// Reminders the candidate adds (a wait with one where the live wait had none) and drops.
    pub reminders_added: u64,
    /// Reminders the candidate drops.
    pub reminders_dropped: u64,
    /// Answers the guard would refuse (the daemon would dead-letter them).
    pub refused: u64,
    /// Calls of the candidate that failed (trap, deadline, its own error).
    pub failed: u64,
    /// The first differing decisions: `(decision_log id, order, live, candidate)`.
    pub examples: Vec<(i64, String, String, String)>,
    /// Wall time of the run, ms, and decisions per second over it.
    pub elapsed_ms: u64,
    /// Decisions decided again per second.
    pub per_second: f64,
}

/// Units or coupons released earlier and later.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct Shift {
    /// Released earlier by the candidate.
    pub earlier: u64,
    /// Released later (or never) by the candidate.
    pub later: u64,
}

/// At most this many examples are kept.
const EXAMPLES: usize = 20;

pub(super) async fn run(
    file: &Path,
    config_path: &Path,
    merchant: &str,
    since: std::time::Duration,
    changed: &[(String, String)],
    out: &Path,
) -> ExitCode {
    let config = match Config::load(config_path) {
        Ok(c) => c,
        Err(problems) => {
            eprintln!("{}: {problems}", config_path.display());
            return ExitCode::from(super::EXIT_BAD_INPUT);
        }
    };
    if let Err(e) = crate::db::names::serve(&config.database.table_prefix) {
        eprintln!("timeoutd plugin whatif: {e}");
        return ExitCode::from(super::EXIT_BAD_INPUT);
    }
    let Some(merchant_config) = config.merchants.get(merchant) else {
        eprintln!(
            "timeoutd plugin whatif: no merchant `{merchant}` in {}",
            config_path.display()
        );
        return ExitCode::from(super::EXIT_BAD_INPUT);
    };
    let engine = match PolicyEngine::new(policies::limits(&config), None) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("timeoutd plugin whatif: cannot create the policy engine: {e}");
            return ExitCode::FAILURE;
        }
    };
    let limits = policies::merchant_limits(&config, merchant_config);
    let plugin = match engine.load_file_with(super::plugin_name(file), file, limits) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let granted = merchant_config.granted_effects.clone();
    let result = whatif(&config, &plugin, merchant, since, changed, granted).await;
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("timeoutd plugin whatif: {e}");
            return ExitCode::FAILURE;
        }
    };
    print(&report);
    if let Err(e) = write(&report, out) {
        eprintln!("timeoutd plugin whatif: {}: {e}", out.display());
        return ExitCode::FAILURE;
    }
    println!(
        "wrote {} and {}",
        out.join("whatif.json").display(),
        out.join("whatif.html").display()
    );
    ExitCode::SUCCESS
}

/// Streams the merchant's decisions since `since` ago through the candidate, on every core.
async fn whatif(
    config: &Config,
    plugin: &Plugin,
    merchant: &str,
    since: std::time::Duration,
    changed: &[(String, String)],
    granted: Option<Vec<String>>,
) -> Result<WhatIf, DbError> {
    let started = Instant::now();
    let db = Db::connect_with(&config.database.url, 2, config.database.pool_mode).await?;
    let now = db.now_ms().await?;
    let since_ms = now - i64::try_from(since.as_millis()).unwrap_or(i64::MAX);
    let mut total = WhatIf {
        merchant: merchant.to_string(),
        candidate: (plugin.name().to_string(), plugin.digest().to_string()),
        since_ms,
        settings_changed: changed.to_vec(),
        shift: SHIFT_BUCKETS
            .iter()
            .map(|(_, label)| (label.to_string(), 0, 0))
            .collect(),
        ..WhatIf::default()
    };
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    // Pages are read by a task of their own while the last one is decided (two in hand at
    // most: memory stays two pages whatever the period).
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Vec<RecordedInput>, DbError>>(1);
    let reader = {
        let (db, merchant) = (db.clone(), merchant.to_string());
        tokio::spawn(async move {
            let mut after = 0;
            loop {
                match inputs_since(&db, &merchant, since_ms, after, PAGE).await {
                    Ok(page) if page.is_empty() => return,
                    Ok(page) => {
                        after = page.last().map_or(after, |c| c.id);
                        if tx.send(Ok(page)).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
        })
    };
    while let Some(page) = rx.recv().await {
        let page = page?;
        let (plugin, changed, granted) = (plugin.clone(), changed.to_vec(), granted.clone());
        let decided = tokio::task::spawn_blocking(move || {
            let chunk = page.len().div_ceil(cores);
            std::thread::scope(|scope| {
                let handles: Vec<_> = page
                    .chunks(chunk)
                    .map(|calls| {
                        let (plugin, changed, granted) = (&plugin, &changed, granted.as_deref());
                        scope.spawn(move || {
                            let mut part = WhatIf {
                                shift: SHIFT_BUCKETS
                                    .iter()
                                    .map(|(_, l)| (l.to_string(), 0, 0))
                                    .collect(),
                                ..WhatIf::default()
                            };
                            for call in calls {
                                decide_again(&mut part, plugin, call, changed, granted);
                            }
                            part
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("a what-if thread panicked"))
                    .collect::<Vec<_>>()
            })
        })
        .await
        .expect("the what-if pool panicked");
        for part in decided {
            merge(&mut total, part);
        }
    }
    let _ = reader.await;
    db.close().await;
    total.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    total.per_second = total.decisions as f64 / started.elapsed().as_secs_f64().max(1e-9);
    Ok(total)
}

/// Decides `call` again and counts what changed into `part`.
fn decide_again(
    part: &mut WhatIf,
    plugin: &Plugin,
    call: &RecordedInput,
    changed: &[(String, String)],
    granted: Option<&[String]>,
) {
    let input = call
        .input
        .as_deref()
        .and_then(|i| serde_json::from_str::<Input>(i).ok());
    // A live call that failed recorded `{"error": …}`, which is no decision: skipped.
    let live = call
        .answer
        .as_deref()
        .and_then(|a| serde_json::from_str::<Decision>(a).ok());
    let (Some(Input { order, mut context }), Some(live)) = (input, live) else {
        part.skipped += 1;
        return;
    };
    for (key, value) in changed {
        match context.settings.iter_mut().find(|(k, _)| k == key) {
            Some(setting) => setting.1 = value.clone(),
            None => context.settings.push((key.clone(), value.clone())),
        }
    }
    part.decisions += 1;
    let candidate = match plugin.decide(&order, &context) {
        Ok(d) => d,
        Err(e) => {
            part.failed += 1;
            part.different += 1;
            example(part, call, &live, &format!("error: {e}"));
            return;
        }
    };
    let refused = review(
        &candidate,
        Review {
            order: &order,
            phase: context.phase,
            now_ms: context.now_ms,
            granted,
            manifest: plugin.manifest(),
        },
    )
    .is_err();
    part.refused += u64::from(refused);
    let parts = differences(&live, &candidate);
    if parts.is_empty() && !refused {
        part.same += 1;
        return;
    }
    part.different += 1;
    for p in &parts {
        *part.differences.entry((*p).to_string()).or_default() += 1;
    }
    if parts.contains(&"kind") {
        *part
            .transitions
            .entry(format!("{}→{}", live.kind(), candidate.kind()))
            .or_default() += 1;
    }
    let reminds = |d: &Decision| {
        matches!(
            d,
            Decision::Wait {
                reminder: Some(_),
                ..
            }
        )
    };
    match (reminds(&live), reminds(&candidate)) {
        (false, true) => part.reminders_added += 1,
        (true, false) => part.reminders_dropped += 1,
        _ => {}
    }
    // Releases are counted once per order, at its first decision at or after its deadline
    // (phase 0, first attempt): later phases the candidate might never have reached, and an
    // early look (API 0.2.0) is held until the deadline anyway.
    if context.phase == 0 && context.attempt == 0 && context.now_ms >= order.deadline_ms {
        shift(part, &order, &live, &candidate);
    }
    example(
        part,
        call,
        &live,
        &serde_json::to_string(&candidate).expect("a decision serialises"),
    );
}

/// How the order's release moves from `live` to `candidate` (a lower bound, as the module says).
fn shift(part: &mut WhatIf, order: &Order, live: &Decision, candidate: &Decision) {
    // What a release gives back: a cancel's effects, or (for two waits) the order's lines.
    let released = |effects: Option<&[Effect]>| -> (u64, u64) {
        match effects {
            Some(effects) => effects.iter().fold((0, 0), |(units, coupons), e| match e {
                Effect::RestoreStock { quantity, .. } => (units + u64::from(*quantity), coupons),
                Effect::ReleaseCoupon { .. } => (units, coupons + 1),
                _ => (units, coupons),
            }),
            None => (
                order.items.iter().map(|i| u64::from(i.quantity)).sum(),
                u64::from(order.coupon.is_some()),
            ),
        }
    };
    let (earlier, by_ms, (units, coupons)) = match (live, candidate) {
        (Decision::Cancel { effects, .. }, Decision::Wait { after_ms, .. }) => {
            (false, *after_ms, released(Some(effects)))
        }
        (Decision::Wait { after_ms, .. }, Decision::Cancel { effects, .. }) => {
            (true, *after_ms, released(Some(effects)))
        }
        (Decision::Wait { after_ms: a, .. }, Decision::Wait { after_ms: b, .. }) if a != b => {
            (b < a, a.abs_diff(*b), released(None))
        }
        (Decision::Cancel { effects, .. }, Decision::Ignore { .. }) => {
            part.closes_to_ignores += 1;
            (false, u64::MAX, released(Some(effects)))
        }
        _ => return,
    };
    let bucket = SHIFT_BUCKETS
        .iter()
        .position(|(upper, _)| by_ms < *upper)
        .unwrap_or(SHIFT_BUCKETS.len() - 1);
    let (target, count) = if earlier {
        (&mut part.stock_units.earlier, &mut part.shift[bucket].1)
    } else {
        (&mut part.stock_units.later, &mut part.shift[bucket].2)
    };
    *target += units;
    *count += 1;
    if earlier {
        part.coupons.earlier += coupons;
    } else {
        part.coupons.later += coupons;
    }
}

fn example(part: &mut WhatIf, call: &RecordedInput, live: &Decision, candidate: &str) {
    if part.examples.len() < EXAMPLES {
        part.examples.push((
            call.id,
            call.order_id.clone(),
            serde_json::to_string(live).expect("a decision serialises"),
            candidate.to_string(),
        ));
    }
}

/// Adds `part`'s counts to `total`.
fn merge(total: &mut WhatIf, part: WhatIf) {
    total.decisions += part.decisions;
    total.skipped += part.skipped;
    total.same += part.same;
    total.different += part.different;
    for (k, n) in part.transitions {
        *total.transitions.entry(k).or_default() += n;
    }
    for (k, n) in part.differences {
        *total.differences.entry(k).or_default() += n;
    }
    total.stock_units.earlier += part.stock_units.earlier;
    total.stock_units.later += part.stock_units.later;
    total.coupons.earlier += part.coupons.earlier;
    total.coupons.later += part.coupons.later;
    for (t, p) in total.shift.iter_mut().zip(part.shift) {
        t.1 += p.1;
        t.2 += p.2;
    }
    total.closes_to_ignores += part.closes_to_ignores;
    total.reminders_added += part.reminders_added;
    total.reminders_dropped += part.reminders_dropped;
    total.refused += part.refused;
    total.failed += part.failed;
    let room = EXAMPLES.saturating_sub(total.examples.len());
    total.examples.extend(part.examples.into_iter().take(room));
}

/// The totals on stdout.
fn print(r: &WhatIf) {
    println!(
        "what if {} ({}) had decided merchant {}'s {} decision(s) since {} ms ({} skipped):",
        r.candidate.0,
        &r.candidate.1[..r.candidate.1.len().min(12)],
        r.merchant,
        r.decisions,
        r.since_ms,
        r.skipped
    );
    println!("  same {} · different {}", r.same, r.different);
    for (t, n) in &r.transitions {
        println!("  {t}: {n}");
    }
    let parts: Vec<String> = r
        .differences
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    println!(
        "  differing in: {}",
        if parts.is_empty() {
            "nothing".into()
        } else {
            parts.join(" · ")
        }
    );
    println!(
        "  stock units released earlier {} · later {}; coupons earlier {} · later {}; closes never released (ignored) {}",
        r.stock_units.earlier,
        r.stock_units.later,
        r.coupons.earlier,
        r.coupons.later,
        r.closes_to_ignores
    );
    for (bucket, earlier, later) in r.shift.iter().filter(|(_, e, l)| e + l > 0) {
        println!("    moved {bucket}: {earlier} earlier, {later} later");
    }
    println!(
        "  reminders added {} · dropped {}; refused by the guard {}; failed {}",
        r.reminders_added, r.reminders_dropped, r.refused, r.failed
    );
    println!(
        "  {} decisions in {} ms: {:.0} a second",
        r.decisions, r.elapsed_ms, r.per_second
    );
}

/// `whatif.json` and `whatif.html` in `out` (made if missing).
fn write(r: &WhatIf, out: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(out)?;
    let json = serde_json::to_string_pretty(r).expect("the totals serialise");
    std::fs::write(out.join("whatif.json"), &json)?;
    // No `<` at all in the script: `</script>` or `<!--` in a reason or an order id would
    // end or derail it. JSON reads `\u003c` as the same character.
    let data = json.replace('<', "\\u003c");
    let html = include_str!("whatif.html")
        .replace("/*CHART*/", CHART_JS)
        .replace("/*DATA*/null", &data);
    std::fs::write(out.join("whatif.html"), html)
}
