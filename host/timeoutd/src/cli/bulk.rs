//! `timeoutd redrive` and `timeoutd retry-effects`: every OPEN dead letter, or every FAILED
//! ledger effect, a filter matches, changed a page at a time with no daemon needed
//! (`crate::bulk`), or listed with `--dry-run`. Resumable with `--after-id` (each page's line on
//! stderr names the cursor it reached); audited in `admin_audit` by `cli:<$USER>`.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use crate::bulk::dead_letters::{self, Redriven};
use crate::bulk::effects::{self, Retried};
use crate::bulk::{PAGE_MAX, Pace};
use crate::config::Config;
use crate::db::{Db, DbError};

/// What `redrive` and `retry-effects` take besides their filter.
#[derive(Debug, Args)]
pub struct PageArgs {
    /// Only rows of this long before now (`30m`, `2h`, `7d`): dead-lettered, or failed.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub since: Option<std::time::Duration>,
    /// Start after this id (a stopped run's last cursor).
    #[arg(long, default_value_t = 0)]
    pub after_id: i64,
    /// Pages, pace, dry run.
    #[command(flatten)]
    pub pace: PaceArgs,
}

/// How every bulk command pages and paces.
#[derive(Debug, Args)]
pub struct PaceArgs {
    /// Rows read per page (1–1000).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=i64::from(PAGE_MAX)))]
    pub page: u32,
    /// Changes per second at most.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub per_second: u32,
    /// List what would change; change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

impl PaceArgs {
    pub(super) fn pace(&self) -> Pace {
        Pace {
            limit: self.page,
            per_second: self.per_second,
            dry_run: self.dry_run,
        }
    }
}

/// `timeoutd redrive`'s filter.
#[derive(Debug, Args)]
pub struct RedriveArgs {
    /// Only letters of this merchant's orders.
    #[arg(long)]
    pub merchant: Option<String>,
    /// Only letters of this source (`outbox`, `rocketmq`, `quarantined-row`, …).
    #[arg(long)]
    pub source: Option<String>,
    /// Only letters whose reason contains this text (case-sensitive).
    #[arg(long)]
    pub reason_contains: Option<String>,
    /// Pages, pace, dry run.
    #[command(flatten)]
    pub page: PageArgs,
}

/// `timeoutd retry-effects`'s filter.
#[derive(Debug, Args)]
pub struct RetryArgs {
    /// Only this merchant's effects.
    #[arg(long)]
    pub merchant: Option<String>,
    /// Only effects of this kind (`notify`, `close-payment`, …).
    #[arg(long)]
    pub kind: Option<String>,
    /// Only effects whose last error contains this text (case-sensitive).
    #[arg(long)]
    pub reason_contains: Option<String>,
    /// Pages, pace, dry run.
    #[command(flatten)]
    pub page: PageArgs,
}

/// `timeoutd redrive`: one line per matched letter on stdout (`id order merchant source reason
/// outcome`, tab-separated), the last line the totals. Exits 0, or 1 when the database fails
/// (naming the cursor to resume from).
pub async fn redrive(path: &Path, config: &Config, args: &RedriveArgs) -> ExitCode {
    let Some((db, now)) = open(path, config).await else {
        return ExitCode::FAILURE;
    };
    let filter = dead_letters::Filter {
        merchant: args.merchant.clone(),
        source: args.source.clone(),
        reason_contains: args.reason_contains.clone(),
        since_ms: args.page.since.map(|d| now - d.as_millis() as i64),
        until_ms: None,
    };
    let filter_text = serde_json::to_string(&filter).expect("a filter serialises");
    let pace = args.page.pace.pace();
    let (db, filter) = (&db, &filter);
    let run = pages(
        db,
        "redrive",
        &filter_text,
        &args.page.pace,
        args.page.after_id,
        move |after_id| async move {
            let page = dead_letters::page(db, filter, after_id, pace, || db.now_ms()).await?;
            for (m, outcome) in page.matched.iter().zip(
                page.redriven
                    .iter()
                    .map(Some)
                    .chain(std::iter::repeat(None)),
            ) {
                let outcome = match outcome {
                    None => "would re-drive",
                    Some(Redriven::Rearmed { .. }) => "re-armed",
                    Some(Redriven::LeftToDeadline { .. }) => "left to its deadline",
                    Some(Redriven::NoOrder { .. }) => "skipped: names no order",
                    Some(Redriven::NotOpen { .. }) => "skipped: no longer OPEN",
                };
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{outcome}",
                    m.id,
                    m.order_id.as_deref().unwrap_or("-"),
                    m.merchant.as_deref().unwrap_or("-"),
                    m.source,
                    m.reason
                );
            }
            let redriven = page.redriven.iter().filter(|r| r.changed()).count();
            Ok((
                page.matched.len(),
                page.redriven.len(),
                if pace.dry_run {
                    page.matched.len()
                } else {
                    redriven
                },
                page.next_after_id,
            ))
        },
    )
    .await;
    finish(
        run,
        "dead letter(s)",
        ("re-driven", "would re-drive"),
        args.page.pace.dry_run,
    )
}

/// `timeoutd retry-effects`: one line per matched effect on stdout (`id order merchant kind
/// attempts reason outcome`, tab-separated), the last line the totals. Exits as `redrive`.
pub async fn retry_effects(path: &Path, config: &Config, args: &RetryArgs) -> ExitCode {
    let Some((db, now)) = open(path, config).await else {
        return ExitCode::FAILURE;
    };
    let filter = effects::Filter {
        merchant: args.merchant.clone(),
        kind: args.kind.clone(),
        reason_contains: args.reason_contains.clone(),
        since_ms: args.page.since.map(|d| now - d.as_millis() as i64),
        until_ms: None,
    };
    let filter_text = serde_json::to_string(&filter).expect("a filter serialises");
    let pace = args.page.pace.pace();
    let (db, filter) = (&db, &filter);
    let run = pages(
        db,
        "retry failed effects",
        &filter_text,
        &args.page.pace,
        args.page.after_id,
        move |after_id| async move {
            let page = effects::page(db, filter, after_id, pace).await?;
            for (e, outcome) in page
                .matched
                .iter()
                .zip(page.retried.iter().map(Some).chain(std::iter::repeat(None)))
            {
                let outcome = match outcome {
                    None => "would retry",
                    Some(Retried::Retrying { .. }) => "retrying",
                    Some(Retried::InTransaction { .. }) => {
                        "skipped: applied in the close; fix by hand"
                    }
                    Some(Retried::NotFailed { .. }) => "skipped: no longer FAILED",
                };
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{outcome}",
                    e.id,
                    e.order_id,
                    e.merchant,
                    e.kind,
                    e.attempts,
                    e.reason.as_deref().unwrap_or("")
                );
            }
            let retrying = page
                .retried
                .iter()
                .filter(|r| matches!(r, Retried::Retrying { .. }))
                .count();
            Ok((
                page.matched.len(),
                page.retried.len(),
                if pace.dry_run {
                    page.matched.len()
                } else {
                    retrying
                },
                page.next_after_id,
            ))
        },
    )
    .await;
    finish(
        run,
        "failed effect(s)",
        ("retrying", "would retry"),
        args.page.pace.dry_run,
    )
}

/// Totals of a run: rows matched, rows changed (the operation's success), or the failure and
/// the cursor to resume from (a row id, or an order id).
pub(super) type Run<C = i64> = Result<(usize, usize), (DbError, C)>;

/// Runs `one_page` from cursor `start` until the last page, auditing each page that attempted
/// a change, and keeping the pace across pages (one gap before a page that follows one that
/// attempted changes). `one_page` answers (matched, attempted, changed, next cursor).
pub(super) async fn pages<C, F, Fut>(
    db: &Db,
    operation: &str,
    filter: &str,
    args: &PaceArgs,
    start: C,
    one_page: F,
) -> Run<C>
where
    C: Clone + std::fmt::Display,
    F: Fn(C) -> Fut,
    Fut: Future<Output = Result<(usize, usize, usize, Option<C>), DbError>>,
{
    let (mut after_id, mut matched, mut changed) = (start, 0, 0);
    loop {
        let (m, attempted, c, next) = match one_page(after_id.clone()).await {
            Ok(page) => page,
            Err(e) => return Err((e, after_id)),
        };
        matched += m;
        changed += c;
        if attempted > 0 {
            let what = format!("{operation} filter={filter} after_id={after_id} changed={c}");
            let audited = match db.now_ms().await {
                Ok(at) => super::audit(db, at, &what).await,
                Err(e) => Err(e),
            };
            if let Err(e) = audited {
                return Err((e, after_id));
            }
        }
        match next {
            Some(next) => {
                eprintln!("page done: {matched} matched so far; cursor {next}");
                if attempted > 0 {
                    args.pace().wait_turn(1).await;
                }
                after_id = next;
            }
            None => return Ok((matched, changed)),
        }
    }
}

/// Prints the totals (`N <what> matched; <done> M`, or `<would> M` on a dry run, M what the
/// pages changed or would change) and gives the exit code.
pub(super) fn finish<C: std::fmt::Display>(
    run: Run<C>,
    what: &str,
    (done_verb, would): (&str, &str),
    dry_run: bool,
) -> ExitCode {
    match run {
        Ok((matched, done)) => {
            if dry_run {
                println!("{matched} {what} matched; {would} {done}");
            } else {
                println!("{matched} {what} matched; {done_verb} {done}");
            }
            ExitCode::SUCCESS
        }
        Err((e, after_id)) => {
            eprintln!("{e}; resume with --after-id {after_id}");
            ExitCode::FAILURE
        }
    }
}

/// The database as the daemon opens it ([`super::open_database`]), and its clock's reading.
pub(super) async fn open(path: &Path, config: &Config) -> Option<(Db, i64)> {
    let db = super::open_database(path, config).await?;
    match db.now_ms().await {
        Ok(now) => Some((db, now)),
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            None
        }
    }
}
