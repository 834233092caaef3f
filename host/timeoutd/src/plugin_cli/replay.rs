//! `timeoutd plugin replay FILE.wasm --config CONFIG [--merchant M] [--limit N] [--setting K=V]…`.
//!
//! Re-runs a plugin over the calls recorded in `decision_log`, newest first, and prints each
//! one where it answers differently from what was recorded. The input of a call is the row's
//! `input` (the order and context exactly as given, migration 0005); rows written before that
//! migration are reconstructed from the `orders` row (as PENDING, the only state the daemon asks
//! about), the row's trigger, phase, attempt and time, and the merchant's settings in today's
//! config, and are marked `reconstructed`. `--setting` replaces (or adds) merchant settings in
//! every replayed call: the differences are then what the new settings would have changed.

use std::path::Path;
use std::process::ExitCode;

use serde::Deserialize;
use timeoutd_plugin_harness::cases::summary;
use timeoutd_runtime::model::{Context, Decision, Order, OrderStatus, TriggerKind};
use timeoutd_runtime::{DecideError, Plugin, PolicyEngine};

use crate::config::Config;
use crate::db::replay::{RecordedCall, recorded_calls};
use crate::db::{Db, DbError, orders};
use crate::policies;

/// A recorded call's input (`decision_log.input`).
#[derive(Deserialize)]
pub(super) struct Input {
    pub(super) order: Order,
    pub(super) context: Context,
}

/// What the recorded call answered, comparable with a new answer.
#[derive(Debug, PartialEq)]
enum Answer {
    Decision(Decision),
    Error(String),
}

impl Answer {
    fn of(result: &Result<Decision, DecideError>) -> Answer {
        match result {
            Ok(d) => Answer::Decision(d.clone()),
            Err(e) => Answer::Error(e.to_string()),
        }
    }

    fn same_as(&self, other: &Answer) -> bool {
        match (self, other) {
            (Answer::Decision(a), Answer::Decision(b)) => a == b,
            // Error texts carry engine detail (backtraces, plugin names); the tier is what counts.
            (Answer::Error(_), Answer::Error(_)) => true,
            _ => false,
        }
    }

    fn describe(&self) -> String {
        match self {
            Answer::Decision(d) => summary(d),
            Answer::Error(e) => format!("error: {}", e.lines().next().unwrap_or_default()),
        }
    }
}

pub(super) async fn run(
    file: &Path,
    config: &Path,
    merchant: Option<&str>,
    limit: u32,
    changed: &[(String, String)],
) -> ExitCode {
    let config = match Config::load(config) {
        Ok(c) => c,
        Err(problems) => {
            eprintln!("{}: {problems}", config.display());
            return ExitCode::from(super::EXIT_BAD_INPUT);
        }
    };
    // The tables that config's daemon uses (`database.table_prefix`).
    if let Err(e) = crate::db::names::serve(&config.database.table_prefix) {
        eprintln!("timeoutd plugin replay: {e}");
        return ExitCode::from(super::EXIT_BAD_INPUT);
    }
    let engine = match PolicyEngine::new(policies::limits(&config), None) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("timeoutd plugin replay: cannot create the policy engine: {e}");
            return ExitCode::FAILURE;
        }
    };
    let plugin = match engine.load_file(super::plugin_name(file), file) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    match replay(&config, &plugin, merchant, limit, changed).await {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("timeoutd plugin replay: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Replays and prints; returns how many calls were answered differently.
async fn replay(
    config: &Config,
    plugin: &Plugin,
    merchant: Option<&str>,
    limit: u32,
    changed: &[(String, String)],
) -> Result<usize, DbError> {
    let db = Db::connect_with(&config.database.url, 2, config.database.pool_mode).await?;
    let rows = recorded_calls(&db, merchant, limit).await?;
    let (mut same, mut differ, mut skipped, mut reconstructed) = (0, 0, 0, 0);
    for row in &rows {
        let (order, mut ctx, rebuilt) = match input_of(&db, config, row).await? {
            Ok(found) => found,
            Err(why) => {
                println!(
                    "skip  decision_log#{} order {}: {why}",
                    row.id, row.order_id
                );
                skipped += 1;
                continue;
            }
        };
        reconstructed += usize::from(rebuilt);
        for (key, value) in changed {
            match ctx.settings.iter_mut().find(|(k, _)| k == key) {
                Some(setting) => setting.1 = value.clone(),
                None => ctx.settings.push((key.clone(), value.clone())),
            }
        }
        let Some(was) = recorded_answer(row) else {
            println!(
                "skip  decision_log#{} order {}: the recorded answer cannot be read",
                row.id, row.order_id
            );
            skipped += 1;
            continue;
        };
        let now = Answer::of(&plugin.decide(&order, &ctx));
        if was.same_as(&now) {
            same += 1;
            continue;
        }
        differ += 1;
        println!(
            "DIFF  decision_log#{} merchant {} order {} phase {} ({}, attempt {}, at {} ms{}), \
             recorded with plugin {}:\n        was: {}\n        now: {}",
            row.id,
            row.merchant_id,
            row.order_id,
            ctx.phase,
            ctx.trigger.as_str(),
            ctx.attempt,
            ctx.now_ms,
            if rebuilt { ", input reconstructed" } else { "" },
            &row.plugin_digest[..row.plugin_digest.len().min(12)],
            was.describe(),
            now.describe(),
        );
    }
    let with: Vec<String> = changed.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!(
        "replayed {} decision(s) with {} ({}{}): {same} same, {differ} different, {skipped} skipped, \
         {reconstructed} with reconstructed input",
        rows.len() - skipped,
        plugin.name(),
        &plugin.digest()[..12],
        if with.is_empty() {
            String::new()
        } else {
            format!("; settings changed: {}", with.join(", "))
        },
    );
    db.close().await;
    Ok(differ)
}

/// The call's input: recorded, or reconstructed (`true`) for rows older than migration 0005.
/// `Ok(Err(why))` when neither is possible.
async fn input_of(
    db: &Db,
    config: &Config,
    row: &RecordedCall,
) -> Result<Result<(Order, Context, bool), String>, DbError> {
    if let Some(input) = &row.input {
        return Ok(serde_json::from_str::<Input>(input)
            .map(|i| (i.order, i.context, false))
            .map_err(|e| format!("unreadable recorded input: {e}")));
    }
    let mut conn = db.pool().acquire().await?;
    let Some(mut order) = orders::load(&mut conn, db.schema(), &row.order_id).await? else {
        return Ok(Err("the order no longer exists".into()));
    };
    order.status = OrderStatus::Pending;
    let Some(trigger) = trigger_kind(&row.trigger_kind) else {
        return Ok(Err(format!("unknown trigger kind `{}`", row.trigger_kind)));
    };
    let settings = config
        .merchants
        .get(&row.merchant_id)
        .map(|m| {
            m.settings
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    let ctx = Context {
        now_ms: row.decided_at_ms,
        trigger,
        phase: row.phase,
        attempt: row.attempt,
        settings,
        state: Vec::new(),
        payment: None,
    };
    Ok(Ok((order, ctx, true)))
}

/// The recorded answer: the `answer` column, or for older rows the decision in `detail`.
fn recorded_answer(row: &RecordedCall) -> Option<Answer> {
    if let Some(answer) = &row.answer {
        let value: serde_json::Value = serde_json::from_str(answer).ok()?;
        if let Some(error) = value.get("error").and_then(|e| e.as_str()) {
            return Some(Answer::Error(error.to_string()));
        }
        return serde_json::from_value(value).ok().map(Answer::Decision);
    }
    if row.decision == "error" {
        return Some(Answer::Error(row.detail.clone()));
    }
    let detail: serde_json::Value = serde_json::from_str(&row.detail).ok()?;
    // A refused decision is nested under "decision"; the others are the decision itself.
    let decision = match detail.get("decision") {
        Some(inner @ serde_json::Value::Object(_)) => inner.clone(),
        _ => detail,
    };
    serde_json::from_value(decision).ok().map(Answer::Decision)
}

fn trigger_kind(s: &str) -> Option<TriggerKind> {
    [
        TriggerKind::DelayMessage,
        TriggerKind::Outbox,
        TriggerKind::Sweep,
        TriggerKind::CheckBack,
        TriggerKind::Manual,
    ]
    .into_iter()
    .find(|k| k.as_str() == s)
}
