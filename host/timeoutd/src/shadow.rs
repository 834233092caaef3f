//! Shadow decisions: a merchant's candidate policy (`[merchants.<id>.shadow]`) asked on
//! exactly the input its live plugin decided — the order as loaded, the context, the database
//! clock's `now_ms` — and never acting. The two answers are compared ([`compare`]) and the
//! comparison recorded in `shadow_decisions` ([`crate::db::shadow`]) and counted
//! (`timeoutd_shadow_decisions_total{merchant, outcome}`,
//! `timeoutd_shadow_differences_total{merchant, difference}`).
//!
//! Bounded cost, by construction:
//! - it runs off the close's path: [`Shadows::offer`] returns at once, handing the live
//!   answer and its input to one worker per dispatcher, which asks the shadows in batches (up
//!   to [`BATCH`], on one blocking call) and records each batch in one insert;
//! - at most [`QUEUE`] offers wait for the worker; an offer that finds the queue full is not
//!   shadowed (`timeoutd_shadow_skipped_total{merchant, why="busy"}`), never awaited, so a
//!   shadow that runs to its deadline on every call costs a thread and dropped comparisons,
//!   not a wait on the live path. It does cost CPU, a blocking thread and instances of the
//!   engine's warm pool beside the live calls: on a 2-core machine a shadow on every trigger
//!   (`sample = 1`) took about 7 % off a burst's closes a second (docs/performance.md); the
//!   sample is the knob;
//! - the shadow's time and memory are limited like the live plugin's (the merchant's
//!   `plugin_deadline` and `plugin_max_memory_mib`);
//! - a trap, timeout, error or refused answer in the shadow is recorded and counted, and
//!   changes nothing of the live decision: the live answer was taken before the shadow was
//!   asked;
//! - `shadow.sample` caps the share of orders shadowed, chosen by the order id's hash
//!   ([`sampled`]) so an order is shadowed on all its phases or none.

pub mod compare;

use std::sync::{Arc, OnceLock};

use timeoutd_runtime::DecideError;
use timeoutd_runtime::guard::{Review, review};
use timeoutd_runtime::model::{Context, Decision, Order};
use tokio::sync::mpsc;

pub use compare::Outcome;

use crate::clock::Stopwatch;
use crate::db::Db;
use crate::db::shadow::ShadowRow;
use crate::events::{Event, emit};
use crate::policies::ShadowPolicy;

/// Offers waiting for the worker, at most; beyond it an offer is dropped and counted.
pub const QUEUE: usize = 1024;

/// Shadow calls made on one blocking call and recorded in one insert, at most.
pub const BATCH: usize = 64;

/// Asks merchants' shadows beside the live decisions of one dispatcher.
#[derive(Debug)]
pub struct Shadows {
    db: Db,
    /// The worker's queue, started by the first offer (inside the runtime).
    queue: OnceLock<mpsc::Sender<Job>>,
}

/// One live decision offered to its merchant's shadow.
pub struct Offer<'a> {
    /// The order as the live plugin saw it.
    pub order: &'a Order,
    /// The live call's context (the shadow gets it with its own settings).
    pub ctx: &'a Context,
    /// The trigger's kind, as `decision_log.trigger_kind`.
    pub trigger_kind: &'a str,
    /// The live plugin's answer.
    pub live: &'a Result<Decision, DecideError>,
}

/// An offer taken: what the worker needs to ask the shadow and judge its answer.
#[derive(Debug)]
struct Job {
    shadow: Arc<ShadowPolicy>,
    order: Order,
    ctx: Context,
    trigger_kind: String,
    live: Decision,
}

impl Shadows {
    /// Shadows recording into `db`.
    pub fn new(db: Db) -> Shadows {
        Shadows {
            db,
            queue: OnceLock::new(),
        }
    }

    /// Offers one live decision to `shadow`; returns at once. Not shadowed: an order outside
    /// the sample, a live call that gave no answer (nothing to compare), or a full queue
    /// (counted).
    pub fn offer(&self, shadow: &Arc<ShadowPolicy>, offer: Offer<'_>) {
        let Ok(live) = offer.live else {
            return;
        };
        if !sampled(&offer.order.id, shadow.sample) {
            return;
        }
        let mut ctx = offer.ctx.clone();
        ctx.settings = shadow.settings.clone();
        let job = Job {
            shadow: shadow.clone(),
            order: offer.order.clone(),
            ctx,
            trigger_kind: offer.trigger_kind.to_string(),
            live: live.clone(),
        };
        let queue = self.queue.get_or_init(|| {
            let (tx, rx) = mpsc::channel(QUEUE);
            tokio::spawn(work(self.db.clone(), rx));
            tx
        });
        if let Err(e) = queue.try_send(job) {
            emit(Event::ShadowSkipped {
                merchant: &shadow.merchant,
                why: match e {
                    mpsc::error::TrySendError::Full(_) => "busy",
                    mpsc::error::TrySendError::Closed(_) => "stopped",
                },
            });
        }
    }
}

/// The worker: takes what is queued, up to [`BATCH`] at a time, asks each shadow on one
/// blocking call, records the batch in one insert. Ends when its dispatcher is dropped and
/// the queue is empty.
async fn work(db: Db, mut rx: mpsc::Receiver<Job>) {
    let mut jobs = Vec::with_capacity(BATCH);
    while rx.recv_many(&mut jobs, BATCH).await > 0 {
        let batch = std::mem::take(&mut jobs);
        let Ok(rows) = tokio::task::spawn_blocking(move || {
            batch
                .into_iter()
                .map(|job| {
                    let watch = Stopwatch::start();
                    let answer = job.shadow.plugin.decide(&job.order, &job.ctx);
                    judge(job, answer, watch.elapsed_us())
                })
                .collect::<Vec<_>>()
        })
        .await
        else {
            continue;
        };
        for row in &rows {
            emit(Event::ShadowCompared {
                merchant: &row.merchant,
                outcome: &row.outcome,
                differences: &row.differences,
            });
        }
        if let Err(e) = crate::db::shadow::record(&db, &rows).await {
            tracing::warn!(rows = rows.len(), error = %e, "shadow comparisons could not be recorded");
        }
    }
}

/// The comparison of the shadow's `answer` with the `live` decision, as recorded.
fn judge(job: Job, answer: Result<Decision, DecideError>, latency_us: i64) -> ShadowRow {
    let Job {
        shadow,
        order,
        ctx,
        trigger_kind,
        live,
    } = job;
    let (order, ctx, live) = (&order, &ctx, &live);
    let json = |d: &Decision| serde_json::to_string(d).expect("a decision serialises");
    let (outcome, differences, shadow_json) = match &answer {
        Err(e) => (
            Outcome::of_error(e),
            Vec::new(),
            serde_json::json!({ "error": e.to_string() }).to_string(),
        ),
        Ok(decision) => {
            let differences = compare::differences(live, decision);
            let refused = review(
                decision,
                Review {
                    order,
                    phase: ctx.phase,
                    now_ms: ctx.now_ms,
                    granted: shadow.granted_effects.as_deref(),
                    manifest: shadow.plugin.manifest(),
                },
            );
            match refused {
                Err(problems) => {
                    let mut answer = serde_json::to_value(decision).expect("a decision serialises");
                    answer["refused"] = serde_json::json!(problems);
                    (Outcome::Refused, differences, answer.to_string())
                }
                Ok(()) if differences.is_empty() => (Outcome::Agree, differences, json(decision)),
                Ok(()) => (Outcome::Differ, differences, json(decision)),
            }
        }
    };
    ShadowRow {
        merchant: shadow.merchant.clone(),
        order_id: order.id.clone(),
        phase: ctx.phase,
        trigger_kind,
        decided_at_ms: ctx.now_ms,
        outcome: outcome.as_str().to_string(),
        differences: differences.join(","),
        live: json(live),
        shadow: shadow_json,
        shadow_digest: shadow.plugin.digest().to_string(),
        latency_us,
    }
}

/// Whether order `id` is in a sample of `share` (0, 1] of orders: its FNV-1a hash, taken
/// modulo a million, below `share` × 10⁶. Stable across processes and restarts, so every
/// daemon shadows the same orders, each on all its phases.
pub fn sampled(id: &str, share: f64) -> bool {
    if share >= 1.0 {
        return true;
    }
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    ((hash % 1_000_000) as f64) < share * 1_000_000.0
}

#[cfg(test)]
mod tests {
    use super::sampled;

    #[test]
    fn a_sample_is_about_its_share_and_stable() {
        let ids: Vec<String> = (0..20_000).map(|i| format!("o-{i}")).collect();
        let tenth = ids.iter().filter(|id| sampled(id, 0.1)).count();
        assert!((1_700..=2_300).contains(&tenth), "{tenth} of 20,000");
        assert!(ids.iter().all(|id| sampled(id, 1.0)));
        assert_eq!(
            ids.iter().filter(|id| sampled(id, 0.1)).count(),
            tenth,
            "the same orders every time"
        );
    }
}
