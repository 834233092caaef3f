//! Where the drain's time went, so a figure comes with its reason: the machine's CPU
//! (`/proc/stat`), this process's (the daemons, `/proc/self/stat`), the database server's and
//! the broker's (`/proc/<pid>/stat` of the processes so named), read when the deadline falls
//! and when the last order is closed, and a verdict naming the bottleneck.
//!
//! Linux only; elsewhere every reading is 0 and the verdict says it could not tell.

use std::time::Instant;

use serde::Serialize;

/// Process names (`/proc/<pid>/comm`) of database servers: MariaDB, MySQL, PostgreSQL (every
/// backend and connection process of PostgreSQL carries the name).
const DATABASE_SERVERS: [&str; 3] = ["mariadbd", "mysqld", "postgres"];

/// Prefix of the RocketMQ name server's and broker's process names.
const BROKER_PREFIX: &str = "rocketmq";

/// Above this share of all cores busy, the machine's CPU is the bottleneck.
const CPU_BOUND: f64 = 0.85;

/// Above this share of all cores' time waiting for I/O, the disk is.
const IO_BOUND: f64 = 0.20;

/// A process using this many cores or more, with cores to spare, is running one serial stage
/// flat out.
const SERIAL_BOUND: f64 = 0.85;

/// CPU readings at one instant.
#[derive(Debug, Clone, Copy)]
pub(super) struct Snapshot {
    at: Instant,
    /// The machine: (busy, idle, iowait) clock ticks summed over every core.
    machine: (f64, f64, f64),
    /// The machine's cores (`cpuN` lines of `/proc/stat`, the cores those ticks cover).
    cores: usize,
    /// CPU seconds of this process.
    process_s: f64,
    /// CPU seconds of the database server's processes; `None` when none runs here.
    database_s: Option<f64>,
    /// CPU seconds of the broker's processes.
    broker_s: f64,
}

impl Snapshot {
    /// Reads everything now.
    pub(super) fn take() -> Snapshot {
        let (database_s, broker_s) = servers_cpu_seconds();
        let (machine, cores) = machine_ticks();
        Snapshot {
            at: Instant::now(),
            machine,
            cores,
            process_s: super::counters::cpu_seconds(),
            database_s,
            broker_s,
        }
    }
}

/// Where the CPU went between the deadline and the last close, in cores (1.0 = one core busy
/// the whole drain), and what held the drain back.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Bottleneck {
    /// The machine's cores.
    pub cores: usize,
    /// Share of all cores' time busy (user, system, interrupts, steal), 0–1.
    pub machine_busy: f64,
    /// Share of all cores' time idle while waiting for I/O, 0–1.
    pub iowait: f64,
    /// This process: the daemons (the bench's polling and, on the broker paths, its watching
    /// group are a small part of it).
    pub daemon_cores: f64,
    /// The database server's processes; `None` on SQLite (it runs inside the daemon) and when
    /// no server process runs on this machine (a remote database).
    pub database_cores: Option<f64>,
    /// The RocketMQ processes on this machine (name server, broker).
    pub broker_cores: f64,
    /// Everything else on the machine.
    pub other_cores: f64,
    /// One sentence: what bounded the drain.
    pub verdict: String,
}

impl Bottleneck {
    /// What happened between `start` and `end`; `in_process_database` on SQLite.
    pub(super) fn between(start: &Snapshot, end: &Snapshot, in_process_database: bool) -> Self {
        let seconds = end.at.duration_since(start.at).as_secs_f64();
        let cores = end.cores.max(1);
        let (busy, idle, iowait) = (
            end.machine.0 - start.machine.0,
            end.machine.1 - start.machine.1,
            end.machine.2 - start.machine.2,
        );
        let total = busy + idle + iowait;
        if total <= 0.0 || seconds <= 0.0 {
            return Bottleneck {
                cores,
                verdict: "unknown: /proc/stat could not be read or the drain took no time".into(),
                ..Bottleneck::default()
            };
        }
        let per_second = |s: f64| s / seconds;
        let machine_busy = busy / total;
        let daemon_cores = per_second(end.process_s - start.process_s);
        // A server process that exits during the drain takes its CPU with it: never below 0.
        let database_cores = match (in_process_database, start.database_s, end.database_s) {
            (false, Some(a), Some(b)) => Some(per_second(b - a).max(0.0)),
            _ => None,
        };
        let broker_cores = per_second(end.broker_s - start.broker_s).max(0.0);
        let other_cores = (machine_busy * cores as f64
            - daemon_cores
            - database_cores.unwrap_or(0.0)
            - broker_cores)
            .max(0.0);
        let mut b = Bottleneck {
            cores,
            machine_busy,
            iowait: iowait / total,
            daemon_cores,
            database_cores,
            broker_cores,
            other_cores,
            verdict: String::new(),
        };
        b.verdict = b.judge();
        b
    }

    /// The verdict: CPU when the cores were nearly all busy (naming who used them); one serial
    /// stage when a process kept about one core busy while others sat idle (SQLite's single
    /// writer inside the daemon, or one database server thread); the disk when much time went
    /// to I/O wait; otherwise waiting (round trips, commits, locks).
    fn judge(&self) -> String {
        let split = self.split();
        let spare = self.cores as f64 * (1.0 - self.machine_busy);
        if self.machine_busy >= CPU_BOUND {
            format!(
                "the machine's CPU: its {} cores were {:.0} % busy ({split}); more daemons on \
                 these cores only share them",
                self.cores,
                self.machine_busy * 100.0
            )
        } else if self.database_cores.is_none() && self.daemon_cores >= SERIAL_BOUND && spare >= 0.5
        {
            format!(
                "one serial stage in the daemon: about one core busy while {spare:.1} sat idle \
                 ({split}); SQLite takes one writer at a time"
            )
        } else if self.database_cores.is_some_and(|d| d >= SERIAL_BOUND) && spare >= 0.5 {
            format!(
                "the database server: about one core busy while {spare:.1} sat idle ({split}), \
                 a serial stage in the server (its commit or log writer)"
            )
        } else if self.iowait >= IO_BOUND {
            format!(
                "the disk: {:.0} % of the cores' time waited for I/O, the commits' flushes \
                 ({split})",
                self.iowait * 100.0
            )
        } else {
            format!(
                "waiting, not CPU or disk: the cores were {:.0} % busy ({split}); the time went \
                 to round trips and the database's commits and locks",
                self.machine_busy * 100.0
            )
        }
    }

    /// `daemons 0.8 · database 1.0 · broker 0.0 · other 0.1 cores`.
    fn split(&self) -> String {
        let database = self
            .database_cores
            .map_or("in the daemon or elsewhere".to_string(), |d| {
                format!("{d:.2}")
            });
        format!(
            "daemons {:.2} · database {database} · broker {:.2} · other {:.2} cores",
            self.daemon_cores, self.broker_cores, self.other_cores
        )
    }
}

/// `/proc/stat`'s first line: (busy, idle, iowait) ticks over all cores, and how many cores
/// (`cpuN` lines) it sums; zeros where unreadable.
fn machine_ticks() -> ((f64, f64, f64), usize) {
    std::fs::read_to_string("/proc/stat").map_or(((0.0, 0.0, 0.0), 0), |s| {
        (parse_machine(&s), count_cores(&s))
    })
}

/// The `cpuN` lines of `/proc/stat`.
fn count_cores(stat: &str) -> usize {
    stat.lines()
        .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
        .count()
}

/// Parses `cpu  user nice system idle iowait irq softirq steal …` (proc(5)); guest time is
/// already inside user and nice.
fn parse_machine(stat: &str) -> (f64, f64, f64) {
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return (0.0, 0.0, 0.0);
    };
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    let at = |i: usize| f.get(i).copied().unwrap_or(0.0);
    let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    (busy, at(3), at(4))
}

/// CPU seconds so far of the database server's processes (`None` when none runs here) and of
/// the broker's.
fn servers_cpu_seconds() -> (Option<f64>, f64) {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return (None, 0.0);
    };
    let (mut database, mut broker) = (None::<f64>, 0.0);
    for entry in procs.flatten() {
        let path = entry.path();
        let numeric = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
        if !numeric {
            continue;
        }
        let Ok(comm) = std::fs::read_to_string(path.join("comm")) else {
            continue;
        };
        let comm = comm.trim_end();
        let slot = if DATABASE_SERVERS.contains(&comm) {
            database.get_or_insert(0.0)
        } else if comm.starts_with(BROKER_PREFIX) {
            &mut broker
        } else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(path.join("stat")) {
            *slot += super::counters::stat_cpu_ticks(&stat) / 100.0;
        }
    }
    (database, broker)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CORES: usize = 2;

    fn snapshot(secs: u64, machine: (f64, f64, f64), process_s: f64, database_s: f64) -> Snapshot {
        Snapshot {
            at: Instant::now() + std::time::Duration::from_secs(secs),
            machine,
            cores: CORES,
            process_s,
            database_s: Some(database_s),
            broker_s: 0.0,
        }
    }

    #[test]
    fn proc_stat_first_line_splits_into_busy_idle_and_iowait() {
        let stat = "cpu  100 5 50 800 40 3 2 0 0 0\ncpu0 50 2 25 400 20 1 1 0 0 0\n";
        assert_eq!(parse_machine(stat), (160.0, 800.0, 40.0));
        assert_eq!(parse_machine("nothing"), (0.0, 0.0, 0.0));
        assert_eq!(count_cores(stat), 1);
    }

    #[test]
    fn busy_cores_make_the_cpu_the_bottleneck_and_name_who_used_them() {
        let cores = CORES as f64;
        // 10 s, every core busy: daemons 0.5 core, the database server the rest but 0.1.
        let start = snapshot(0, (0.0, 0.0, 0.0), 0.0, 0.0);
        let end = snapshot(10, (1000.0 * cores, 0.0, 0.0), 5.0, 10.0 * (cores - 0.6));
        let b = Bottleneck::between(&start, &end, false);
        assert!((b.machine_busy - 1.0).abs() < 1e-9);
        assert!(b.verdict.starts_with("the machine's CPU"), "{}", b.verdict);
        assert!(b.verdict.contains("daemons 0.50"), "{}", b.verdict);
        assert!((b.other_cores - 0.1).abs() < 0.01, "{}", b.other_cores);
    }

    #[test]
    fn idle_cores_with_io_wait_blame_the_disk_and_otherwise_the_waiting() {
        let start = snapshot(0, (0.0, 0.0, 0.0), 0.0, 0.0);
        let disk = Bottleneck::between(
            &start,
            &snapshot(10, (300.0, 400.0, 300.0), 1.0, 1.0),
            false,
        );
        assert!(disk.verdict.starts_with("the disk"), "{}", disk.verdict);
        let wait = Bottleneck::between(&start, &snapshot(10, (300.0, 690.0, 10.0), 1.0, 1.0), true);
        assert!(wait.verdict.starts_with("waiting"), "{}", wait.verdict);
        // SQLite with the daemon at one core of two: its one writer.
        let serial =
            Bottleneck::between(&start, &snapshot(10, (1000.0, 1000.0, 0.0), 9.5, 0.0), true);
        assert!(
            serial.verdict.starts_with("one serial stage"),
            "{}",
            serial.verdict
        );
        assert_eq!(wait.database_cores, None);
        assert!(
            wait.verdict.contains("database in the daemon"),
            "{}",
            wait.verdict
        );
    }
}
