//! `timeoutd close-orders` and `timeoutd rearm-orders`: every PENDING order a filter matches,
//! handed to the running daemons' outbox timer a page at a time (`crate::bulk::orders`), or
//! listed with `--dry-run`. Resumable with `--after-id` (an order id: each page's line on
//! stderr names the cursor it reached); audited in `admin_audit` by `cli:<$USER>`.

use std::path::Path;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Args;

use super::bulk::{PaceArgs, finish, open, pages};
use crate::bulk::orders::{self, Done, Filter, Op, Skip};
use crate::config::Config;

/// The filter of `close-orders` and `rearm-orders`.
#[derive(Debug, Args)]
pub struct OrdersArgs {
    /// Only this merchant's orders.
    #[arg(long)]
    pub merchant: Option<String>,
    /// Only this order (repeat for several, at most 1000).
    #[arg(long = "order")]
    pub orders: Vec<String>,
    /// Only orders due this long before now or later (`30m`, `2h`, `7d`).
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "deadline_from")]
    pub since: Option<std::time::Duration>,
    /// Only orders due at or after this time (RFC 3339, `2026-12-07T10:00:00Z`).
    #[arg(long, value_parser = rfc3339_ms)]
    pub deadline_from: Option<i64>,
    /// Only orders due before this time (RFC 3339).
    #[arg(long, value_parser = rfc3339_ms)]
    pub deadline_to: Option<i64>,
    /// Start after this order id (a stopped run's last cursor).
    #[arg(long, default_value = "")]
    pub after_id: String,
    /// Pages, pace, dry run.
    #[command(flatten)]
    pub pace: PaceArgs,
}

/// An RFC 3339 time as epoch ms.
fn rfc3339_ms(text: &str) -> Result<i64, String> {
    let at = humantime::parse_rfc3339_weak(text)
        .map_err(|e| format!("`{text}` is no RFC 3339 time ({e})"))?;
    at.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .map_err(|_| format!("`{text}` is before 1970"))
}

/// `timeoutd close-orders` (`op` close) or `timeoutd rearm-orders` (re-arm): one line per
/// matched order on stdout (`order merchant deadline trigger outcome`, tab-separated), the last
/// line the totals. Exits 0; 64 when the filter is refused; 1 when the database fails (naming
/// the cursor to resume from).
pub async fn run(path: &Path, config: &Config, args: &OrdersArgs, op: Op) -> ExitCode {
    let Some((db, now)) = open(path, config).await else {
        return ExitCode::FAILURE;
    };
    let filter = Filter {
        merchant: args.merchant.clone(),
        order_ids: (!args.orders.is_empty()).then(|| args.orders.clone()),
        deadline_from_ms: args
            .since
            .map(|d| now - d.as_millis() as i64)
            .or(args.deadline_from),
        deadline_to_ms: args.deadline_to,
    };
    if let Some(problem) = filter.problem() {
        eprintln!("timeoutd {}-orders: {problem}", op.as_str());
        return ExitCode::from(64);
    }
    let filter_text = serde_json::to_string(&filter).expect("a filter serialises");
    let pace = args.pace.pace();
    let (db, filter) = (&db, &filter);
    let run = pages(
        db,
        &format!("{} orders", op.as_str()),
        &filter_text,
        &args.pace,
        args.after_id.clone(),
        move |after_id: String| async move {
            let after = Some(after_id.as_str()).filter(|a| !a.is_empty());
            let page = orders::page(db, op, filter, after, pace, || db.now_ms()).await?;
            for (o, done) in page.matched.iter().zip(&page.done) {
                let trigger = o.trigger.as_ref().map_or("-".to_string(), |t| {
                    format!("phase {} {} {}", t.phase, t.status, t.source)
                });
                println!(
                    "{}\t{}\t{}\t{trigger}\t{}",
                    o.id,
                    o.merchant,
                    rfc3339(o.deadline_ms),
                    outcome(done, pace.dry_run)
                );
            }
            // On a dry run: what would change, and nothing attempted (no audit row).
            let changed = page.done.iter().filter(|d| d.changed()).count();
            Ok((
                page.matched.len(),
                if pace.dry_run { 0 } else { changed },
                changed,
                page.next_after_id,
            ))
        },
    )
    .await;
    let (verb, would) = match op {
        Op::Close => ("queued to close", "would queue"),
        Op::Rearm => ("re-armed", "would re-arm"),
    };
    finish(run, "pending order(s)", (verb, would), args.pace.dry_run)
}

/// What one line says an order came to.
fn outcome(done: &Done, dry_run: bool) -> String {
    match done {
        Done::Queued { due_ms, .. } if dry_run => format!("would queue (due {})", rfc3339(*due_ms)),
        Done::Queued { .. } => "queued: the daemon decides it now".to_string(),
        Done::Rearmed { due_ms, .. } if dry_run => {
            format!("would re-arm (due {})", rfc3339(*due_ms))
        }
        Done::Rearmed { due_ms, .. } => format!("re-armed, due {}", rfc3339(*due_ms)),
        Done::Skipped { why, .. } => format!(
            "skipped: {}",
            match why {
                Skip::DeadLettered => "it has an OPEN dead letter; re-drive it (timeoutd redrive)",
                Skip::Busy => "a daemon is deciding it now",
                Skip::Paused => "paused; resume first",
                Skip::NotDue => "its deadline has not passed",
                Skip::AlreadyQueued => "already queued",
                Skip::AlreadyArmed => "it has a live trigger",
                Skip::Changed => "it changed meanwhile (taken, paid or closed)",
            }
        ),
    }
}

/// Epoch ms as an RFC 3339 time (UTC, whole seconds).
fn rfc3339(ms: i64) -> String {
    let at: SystemTime = UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_seconds(at).to_string()
}
