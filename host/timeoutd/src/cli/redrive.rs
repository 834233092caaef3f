//! `timeoutd redrive`: every OPEN dead letter a filter matches, re-driven a page at a time with
//! no daemon needed (`crate::redrive`), or listed with `--dry-run`. Resumable with `--after-id`
//! (each page's line names the cursor it reached); audited in `admin_audit` by `cli:<$USER>`.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use crate::config::Config;
use crate::redrive::{self, Filter, Pace, Redriven};

/// What `timeoutd redrive` takes.
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
    /// Only letters dead-lettered within this long before now (`30m`, `2h`, `7d`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub since: Option<std::time::Duration>,
    /// Start after this letter id (a stopped run's last cursor).
    #[arg(long, default_value_t = 0)]
    pub after_id: i64,
    /// Letters read per page (1–1000).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub page: u32,
    /// Re-drives per second at most.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub per_second: u32,
    /// List what would be re-driven; change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Runs pages until the last; prints one line per matched letter (`id order merchant source
/// reason`, tab-separated, with its outcome unless a dry run) and one summary line per page.
/// Exits 0, or 1 when the database fails (the summary names the cursor to resume from).
pub async fn run(path: &Path, config: &Config, args: &RedriveArgs) -> ExitCode {
    let db = match crate::daemon::open_database(config).await {
        Ok(db) => db,
        Err(e) => {
            eprintln!("{}: cannot open the database: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    let now = match db.now_ms().await {
        Ok(now) => now,
        Err(e) => {
            eprintln!("timeoutd redrive: {e}");
            return ExitCode::FAILURE;
        }
    };
    let filter = Filter {
        merchant: args.merchant.clone(),
        source: args.source.clone(),
        reason_contains: args.reason_contains.clone(),
        since_ms: args.since.map(|d| now - d.as_millis() as i64),
        until_ms: None,
    };
    let pace = Pace {
        limit: args.page,
        per_second: args.per_second,
        dry_run: args.dry_run,
    };
    let actor = super::pauses::actor();
    let (mut after_id, mut matched, mut rearmed) = (args.after_id, 0, 0);
    loop {
        let page = match redrive::page(&db, &filter, after_id, pace, || db.now_ms()).await {
            Ok(page) => page,
            Err(e) => {
                eprintln!("timeoutd redrive: {e}; resume with --after-id {after_id}");
                return ExitCode::FAILURE;
            }
        };
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
        matched += page.matched.len();
        rearmed += page
            .redriven
            .iter()
            .filter(|r| matches!(r, Redriven::Rearmed { .. }))
            .count();
        if !args.dry_run && !page.redriven.is_empty() {
            let what = format!(
                "redrive dead letters filter={} after_id={after_id} redriven={}",
                serde_json::to_string(&filter).expect("a filter serialises"),
                page.redriven.len()
            );
            let at = db.now_ms().await.unwrap_or(now);
            if let Err(e) = crate::db::audit::record(&db, at, &actor, "CLI", &what, 200).await {
                eprintln!("timeoutd redrive: not audited: {e}");
            }
        }
        match page.next_after_id {
            Some(next) => {
                eprintln!("page done: {} matched so far; cursor {next}", matched);
                after_id = next;
            }
            None => break,
        }
    }
    let verb = if args.dry_run {
        "would re-drive"
    } else {
        "re-armed"
    };
    println!(
        "{matched} dead letter(s) matched; {verb} {}",
        if args.dry_run { matched } else { rearmed }
    );
    ExitCode::SUCCESS
}
