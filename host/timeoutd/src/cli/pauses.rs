//! `timeoutd pause`, `timeoutd resume`, `timeoutd pauses`: the admin API's pause and resume
//! from a shell on the database's host, with no daemon running (`db::pauses`). Each change is
//! audited in `admin_audit` like an API call, by `cli:<$USER>`.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use crate::config::Config;
use crate::db::DbError;
use crate::db::pauses::{self, Scope};

/// What a pause or a resume is about: a merchant, or one order.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct Target {
    /// A merchant of the configuration: all its orders.
    #[arg(long)]
    pub merchant: Option<String>,
    /// One order, by id.
    #[arg(long)]
    pub order: Option<String>,
}

impl Target {
    fn scope(&self) -> (Scope, &str) {
        match (&self.merchant, &self.order) {
            (Some(m), _) => (Scope::Merchant, m),
            (None, Some(o)) => (Scope::Order, o),
            (None, None) => unreachable!("clap requires one of --merchant, --order"),
        }
    }
}

/// `timeoutd pause`: exits 0 when paused (or paused already: the first pause stands, and is
/// shown), 1 when the target cannot be paused (an unknown merchant, an order that does not
/// exist or is not PENDING) or the database fails.
pub async fn pause(path: &Path, config: &Config, target: &Target, reason: &str) -> ExitCode {
    let (scope, id) = target.scope();
    if scope == Scope::Merchant && !config.merchants.contains_key(id) {
        let known: Vec<&str> = config.merchants.keys().map(String::as_str).collect();
        eprintln!(
            "timeoutd pause: merchant `{id}` is not in {} (merchants: {})",
            path.display(),
            known.join(", ")
        );
        return ExitCode::FAILURE;
    }
    let Some(db) = super::open_database(path, config).await else {
        return ExitCode::FAILURE;
    };
    let made = async {
        if scope == Scope::Order
            && let Err(why) = pauses::pausable_order(&db, id).await?
        {
            return Ok(Err(format!("order `{id}` {why}")));
        }
        let now = db.now_ms().await?;
        let (pause, new) = pauses::pause(&db, scope, id, now, &super::actor(), reason).await?;
        if new {
            super::audit(&db, now, &format!("pause {} {id}", scope.as_str())).await?;
        }
        Ok::<_, DbError>(Ok((pause, new)))
    };
    match made.await {
        Ok(Ok((pause, new))) => {
            let was = if new { "paused" } else { "already paused" };
            println!(
                "{} `{}` {was} (at {} ms by {}{})",
                pause.scope.as_str(),
                pause.target,
                pause.paused_at_ms,
                pause.paused_by,
                if pause.reason.is_empty() {
                    String::new()
                } else {
                    format!(": {}", pause.reason)
                }
            );
            ExitCode::SUCCESS
        }
        Ok(Err(refused)) => {
            eprintln!("timeoutd pause: {refused}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("timeoutd pause: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `timeoutd resume`: exits 0 when resumed (printing how many held triggers were woken), 1
/// when the target was not paused or the database fails.
pub async fn resume(path: &Path, config: &Config, target: &Target) -> ExitCode {
    let (scope, id) = target.scope();
    let Some(db) = super::open_database(path, config).await else {
        return ExitCode::FAILURE;
    };
    let done = async {
        let now = db.now_ms().await?;
        let woken = pauses::resume(&db, scope, id, now).await?;
        if woken.is_some() {
            super::audit(&db, now, &format!("resume {} {id}", scope.as_str())).await?;
        }
        Ok::<_, DbError>(woken)
    };
    match done.await {
        Ok(Some(woken)) => {
            println!(
                "{} `{id}` resumed; {woken} held trigger(s) due now",
                scope.as_str()
            );
            ExitCode::SUCCESS
        }
        Ok(None) => {
            eprintln!("timeoutd resume: {} `{id}` is not paused", scope.as_str());
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("timeoutd resume: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `timeoutd pauses`: one line per pause in force (`scope target paused_at_ms paused_by
/// reason`, tab-separated), nothing when none.
pub async fn list(path: &Path, config: &Config) -> ExitCode {
    let Some(db) = super::open_database(path, config).await else {
        return ExitCode::FAILURE;
    };
    match pauses::list(&db).await {
        Ok(all) => {
            for p in all {
                println!(
                    "{}\t{}\t{}\t{}\t{}",
                    p.scope.as_str(),
                    p.target,
                    p.paused_at_ms,
                    p.paused_by,
                    p.reason
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("timeoutd pauses: {e}");
            ExitCode::FAILURE
        }
    }
}
