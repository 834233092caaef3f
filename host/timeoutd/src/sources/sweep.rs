//! The sweep: every `sweep.interval`, PENDING orders past deadline + grace with no live trigger
//! (their outbox row was lost, never written, or stuck) are re-armed as outbox rows due now with
//! source `sweep`, so they go through the same claim and the same close as everything else.
//! Several daemons sweeping at once converge on the same rows; the close's compare-and-set does
//! the rest (F3, F11).

use tokio::sync::watch;

use crate::clock::{Clock, Stopwatch};
use crate::config::SweepConfig;
use crate::context::Context;
use crate::db::{Db, DbError, outbox};
use crate::events::{Event, emit};

/// Sweeps of this process that failed in a row (0 after a success).
static CONSECUTIVE_FAILURES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Sweeps of this process that failed in a row.
pub fn consecutive_failures() -> u64 {
    CONSECUTIVE_FAILURES.load(std::sync::atomic::Ordering::Relaxed)
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SweepReport {
    /// Orders re-armed.
    pub rearmed: usize,
    /// Time taken, ms.
    pub duration_ms: i64,
}

/// One sweep.
///
/// # Errors
/// [`DbError`] when the database fails; nothing is half-done (a sweep's re-arms are one
/// transaction).
pub async fn sweep_once(
    db: &Db,
    clock: &Clock,
    config: &SweepConfig,
) -> Result<SweepReport, DbError> {
    let watch = Stopwatch::start();
    let now_ms = clock.now_ms(db).await?;
    let orphans =
        outbox::find_orphans(db, now_ms, config.grace.as_millis() as i64, config.batch).await?;
    outbox::rearm(db, &orphans, now_ms).await?;
    for orphan in &orphans {
        tracing::warn!(order = %orphan.order_id, phase = orphan.phase, "sweep re-armed an overdue order with no live trigger");
    }
    Ok(SweepReport {
        rearmed: orphans.len(),
        duration_ms: watch.elapsed_ms(),
    })
}

/// The sweep's knobs that operators may turn at run time (`PUT /v1/sweep`): sweep more often
/// during a promotion without a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SweepTuning {
    /// Time between sweeps, ms.
    pub interval_ms: u64,
    /// Orders re-armed per sweep.
    pub batch: u32,
}

impl SweepTuning {
    /// The tuning a config starts with.
    pub fn of(config: &SweepConfig) -> Self {
        SweepTuning {
            interval_ms: config.interval.as_millis() as u64,
            batch: config.batch,
        }
    }
}

/// Sweeps `ctx`'s database at start and then every interval until `ctx.shutdown` turns true; a sweep that re-armed a
/// full batch is followed at once by the next. A change of `tuning` takes effect at once (the
/// current wait is cut short).
pub async fn run(ctx: Context, config: SweepConfig, mut tuning: watch::Receiver<SweepTuning>) {
    let Context {
        db,
        clock,
        waker,
        mut shutdown,
        ..
    } = ctx;
    loop {
        let now_tuning = *tuning.borrow_and_update();
        let config = SweepConfig {
            batch: now_tuning.batch,
            interval: std::time::Duration::from_millis(now_tuning.interval_ms),
            ..config.clone()
        };
        let result = sweep_once(&db, &clock, &config).await;
        match &result {
            Ok(_) => CONSECUTIVE_FAILURES.store(0, std::sync::atomic::Ordering::Relaxed),
            Err(_) => {
                CONSECUTIVE_FAILURES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let error = result.as_ref().err().map(ToString::to_string);
        emit(Event::Sweep {
            rearmed: result.as_ref().map_or(0, |r| r.rearmed),
            duration_ms: result.as_ref().map_or(0, |r| r.duration_ms),
            error: error.as_deref(),
        });
        if result.as_ref().is_ok_and(|r| r.rearmed > 0) {
            waker.notify_one();
        }
        // A sweep that filled its batch has more orphans waiting (a lost burst): sweep again at
        // once instead of leaving them an interval later each.
        let full = result
            .as_ref()
            .is_ok_and(|r| r.rearmed >= config.batch as usize);
        if full && !crate::shutdown::is_stopping(&shutdown) {
            tokio::task::yield_now().await;
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(config.interval) => {}
            _ = crate::shutdown::changed_or_never(&mut tuning) => {
                tracing::info!(tuning = ?*tuning.borrow(), "sweep retuned");
            }
            _ = crate::shutdown::stopping(&mut shutdown) => {}
        }
        if crate::shutdown::is_stopping(&shutdown) {
            break;
        }
    }
    tracing::info!("sweep stopped");
}
