//! Slow statements, counted and summarised instead of logged one by one.
//!
//! sqlx logs every statement slower than its threshold (`database.slow_statement`, 1 s by
//! default) as a WARN line of its own, target `sqlx::query`. During a 20,000-order burst on one
//! hot SKU that was one line per waiting `UPDATE sku_stock`: 26 lines in 3 s, a log flood on the
//! busiest day of the year, and it grows with the burst. Here each such event is
//!   - recorded in the histogram `timeoutd_slow_statement_seconds{statement}` (the statement's
//!     summary as sqlx gives it, e.g. `UPDATE sku_stock SET …`), and
//!   - summarised in at most one WARN line per [`crate::events::SUMMARY_INTERVAL`] ([`flush`],
//!     run by the daemon's command): how many, and the slowest with its time.
//!
//! [`Layer`] does the counting; the log's own layers leave sqlx's slow-statement events out
//! ([`is_slow_statement`]). Statements sqlx logs at other levels (`RUST_LOG=sqlx::query=debug`)
//! still print as they are.

use std::sync::Mutex;
use std::time::Duration;

use tracing::field::{Field, Visit};

/// sqlx's logging target for statements.
const TARGET: &str = "sqlx::query";

/// The slow-statement threshold, ms (`database.slow_statement`), read by every pool opened
/// after it is set ([`set_threshold`]); sqlx's own default until then.
static THRESHOLD_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1_000);

/// Sets the threshold over which a statement counts as slow, for the pools opened from now on
/// (the process's log is one, as its subscriber is).
pub fn set_threshold(threshold: Duration) {
    THRESHOLD_MS.store(
        threshold.as_millis().min(u128::from(u64::MAX)) as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// The threshold [`set_threshold`] set (1 s unless set).
pub fn threshold() -> Duration {
    Duration::from_millis(THRESHOLD_MS.load(std::sync::atomic::Ordering::Relaxed))
}

/// What has been seen since the last [`flush`].
#[derive(Debug, Default)]
struct Seen {
    count: u64,
    slowest_secs: f64,
    slowest: String,
}

static SEEN: Mutex<Seen> = Mutex::new(Seen {
    count: 0,
    slowest_secs: 0.0,
    slowest: String::new(),
});

/// Whether `meta` is one of sqlx's slow-statement events (WARN on `sqlx::query`): the log's
/// layers filter these out, [`Layer`] counts them.
pub fn is_slow_statement(meta: &tracing::Metadata<'_>) -> bool {
    meta.target() == TARGET && *meta.level() == tracing::Level::WARN
}

/// The tracing layer that counts slow statements into the histogram and the summary.
#[derive(Debug, Default, Clone, Copy)]
pub struct Layer;

#[derive(Default)]
struct Fields {
    summary: String,
    elapsed_secs: f64,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "summary" {
            self.summary = value.to_string();
        }
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        if field.name() == "elapsed_secs" {
            self.elapsed_secs = value;
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "summary" && self.summary.is_empty() {
            self.summary = format!("{value:?}").trim_matches('"').to_string();
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Layer {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        if !is_slow_statement(event.metadata()) {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        record(&fields.summary, fields.elapsed_secs);
    }
}

/// Counts one slow statement (`summary`, its time in seconds).
fn record(summary: &str, elapsed_secs: f64) {
    metrics::histogram!("timeoutd_slow_statement_seconds", "statement" => summary.to_string())
        .record(elapsed_secs);
    let mut seen = SEEN.lock().expect("slow statements lock poisoned");
    seen.count += 1;
    if elapsed_secs > seen.slowest_secs {
        seen.slowest_secs = elapsed_secs;
        seen.slowest = summary.to_string();
    }
}

/// Writes one WARN line for the slow statements seen since the last call, if any, and starts
/// counting afresh. Returns how many there were.
pub fn flush() -> u64 {
    let seen = std::mem::take(&mut *SEEN.lock().expect("slow statements lock poisoned"));
    if seen.count > 0 {
        tracing::warn!(
            count = seen.count,
            slowest_secs = seen.slowest_secs,
            slowest = %seen.slowest,
            "slow statements (over database.slow_statement) since the last summary; timeoutd_slow_statement_seconds has each"
        );
    }
    seen.count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_slow_statements_make_one_line_naming_the_slowest() {
        flush();
        for i in 0..1000 {
            record("UPDATE sku_stock SET …", 1.0 + f64::from(i) / 1000.0);
        }
        record("SELECT 1", 0.5);
        let seen = SEEN.lock().unwrap();
        assert_eq!(seen.count, 1001);
        assert_eq!(seen.slowest, "UPDATE sku_stock SET …");
        drop(seen);
        assert_eq!(flush(), 1001);
        assert_eq!(flush(), 0, "counted afresh");
    }
}
