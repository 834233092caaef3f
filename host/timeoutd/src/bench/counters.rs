//! What the server and this process counted: commits and statements (MariaDB/MySQL `SHOW GLOBAL
//! STATUS` `Com_commit` and `Questions`; PostgreSQL `pg_stat_database.xact_commit`, which counts
//! every transaction including single-statement ones), row lock waits (MariaDB/MySQL
//! `Innodb_row_lock_waits` and `Innodb_row_lock_time`), CPU seconds and peak RSS (`/proc/self`).

use crate::db::Db;
use crate::db::bench::server_counters;

/// A reading of the server's counters; `None` where the backend has none.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Counters {
    commits: Option<i64>,
    statements: Option<i64>,
    lock_waits: Option<(i64, i64)>,
}

/// Counts over a stretch of the run, per close.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct PerClose {
    /// Commits per close (MariaDB: explicit COMMITs; PostgreSQL: every transaction).
    pub commits: Option<f64>,
    /// Statements per close (MariaDB `Questions`; not counted on PostgreSQL and SQLite).
    pub statements: Option<f64>,
    /// Row lock waits over the whole stretch, not per close: how many, and the milliseconds
    /// spent in them (MariaDB; the server's total, so anything else it served meanwhile counts
    /// too). `None` on PostgreSQL and SQLite.
    pub lock_waits: Option<LockWaits>,
}

/// Row lock waits over a stretch of the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LockWaits {
    /// Waits for a row lock.
    pub waits: i64,
    /// Time spent in them, ms.
    pub wait_ms: i64,
}

impl Counters {
    /// Reads the counters; a backend or server without them reads as `None`.
    pub(super) async fn read(db: &Db) -> Counters {
        let c = server_counters(db).await.unwrap_or_default();
        Counters {
            commits: c.commits,
            statements: c.statements,
            lock_waits: c.lock_waits,
        }
    }

    /// `self − before`, per close over `closes`.
    pub(super) fn since(&self, before: &Counters, closes: u32) -> PerClose {
        let per =
            |a: Option<i64>, b: Option<i64>| Some((a? - b?) as f64 / f64::from(closes.max(1)));
        let lock_waits = match (self.lock_waits, before.lock_waits) {
            (Some((waits, ms)), Some((waits_before, ms_before))) => Some(LockWaits {
                waits: waits - waits_before,
                wait_ms: ms - ms_before,
            }),
            _ => None,
        };
        PerClose {
            commits: per(self.commits, before.commits),
            statements: per(self.statements, before.statements),
            lock_waits,
        }
    }
}

/// CPU seconds (user + system) this process has used so far; 0 where `/proc` cannot tell.
pub(super) fn cpu_seconds() -> f64 {
    // /proc/self/stat fields 14 and 15 (utime, stime) in clock ticks of USER_HZ = 100 on Linux.
    std::fs::read_to_string("/proc/self/stat").map_or(0.0, |stat| stat_cpu_ticks(&stat) / 100.0)
}

/// CPU seconds (user + system) used so far by this process's live threads named `name`
/// (`/proc/self/task/*/comm`, which keeps 15 bytes); 0 where `/proc` cannot tell. A thread that
/// has exited no longer counts here, though the process total keeps it.
pub(super) fn thread_cpu_seconds(name: &str) -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let comm_name = &name[..name.len().min(15)];
    let mut ticks = 0.0;
    for task in tasks.flatten() {
        let path = task.path();
        let named = std::fs::read_to_string(path.join("comm"))
            .is_ok_and(|comm| comm.trim_end() == comm_name);
        if let (true, Ok(stat)) = (named, std::fs::read_to_string(path.join("stat"))) {
            ticks += stat_cpu_ticks(&stat);
        }
    }
    ticks / 100.0
}

/// utime + stime of a `/proc/.../stat` line, clock ticks (USER_HZ = 100 on Linux).
pub(super) fn stat_cpu_ticks(stat: &str) -> f64 {
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let tick = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // After the `(comm)` field, utime is the 12th field and stime the 13th (0-based 11, 12).
    tick(11) + tick(12)
}

/// Resets the process's peak resident set (`VmHWM`) to its current size, so a later
/// [`peak_rss_mib`] covers only what follows. Linux: writing `5` to `/proc/self/clear_refs`
/// (proc(5)). False where that is refused or unknown.
pub(super) fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The process's peak resident set, MiB (`VmHWM`); 0 where `/proc` cannot tell.
pub(super) fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}
