//! The bench's figures, read back from the database after the burst, and the exactly-once
//! audit; printed as a table and one JSON line.

use serde::Serialize;

use super::BenchPath;
use super::baseline::Baseline;
use super::bottleneck::Bottleneck;
use super::counters::{PerClose, peak_rss_mib};
use super::seed::Shape;
use crate::db::{Backend, Db};

/// Everything one bench run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `sqlite`, `mysql` or `postgres`.
    pub backend: String,
    /// Trigger path.
    pub path: BenchPath,
    /// Orders in the burst.
    pub orders: u32,
    /// SKUs their lines draw on (1: a flash sale on one stock row).
    pub skus: u32,
    /// Daemons that drained it together.
    pub daemons: u32,
    /// How the closes gave stock back (`[dispatch.stock] mode`).
    pub stock: crate::config::StockMode,
    /// `journal`: when the last journal row had been folded (every unit back in
    /// `sku_stock.available`), ms after the (first) deadline, as polled every 20 ms after the
    /// drain. `None` in `direct` mode (the units are back at each close's commit).
    pub stock_back_ms: Option<i64>,
    /// Deadlines this far apart, ms (0: one shared instant).
    pub spread_ms: i64,
    /// PAID/CLOSED orders of the past in the tables besides the burst.
    pub history: u32,
    /// The sweep's query ([`crate::db::outbox::find_orphans`]) after the burst, median of 5, ms.
    pub sweep_query_ms: f64,
    /// The daemon's drain rate: orders ÷ (last close − first deadline), per second.
    pub closes_per_s: f64,
    /// The baseline's rate, per second.
    pub baseline_closes_per_s: f64,
    /// `closes_per_s ÷ baseline_closes_per_s`.
    pub ratio: f64,
    /// The set-based baseline's rate (the database's limit for the same writes, one statement
    /// per table per group), per second.
    pub set_based_closes_per_s: f64,
    /// `closes_per_s ÷ set_based_closes_per_s`: how near the daemon comes to the database's
    /// own limit (#48's targets are stated against it).
    pub set_based_ratio: f64,
    /// Lateness `closed_at_ms − deadline_ms` (database clock), ms: by the close's stamp (see
    /// [`Report::visible`] for when it was committed).
    pub lateness_ms: Lateness,
    /// Notice delivery: each burst order's close to its notice's 2xx at the bench's loopback
    /// webhook, ms ([`super::notices`]).
    pub notice_latency_ms: super::notices::NoticeLatency,
    /// 0.99 × orders ÷ closes/s, ms: the best p99 this rate allows when the orders share one
    /// deadline (`None` with a spread).
    pub drain_floor_p99_ms: Option<f64>,
    /// When the closes became visible to another connection (committed), as the bench's
    /// polling saw them; `closed_at_ms` is read inside the close's transaction, so the commit
    /// that ends it is seen a little later. `None` with a spread (the polls would measure the
    /// spread).
    pub visible: Option<Visible>,
    /// Daemon CPU seconds per 1,000 closes (this process from the daemons' start to the end of
    /// the drain, less the watching group's threads on the broker paths).
    pub cpu_s_per_1000: f64,
    /// Broker paths: CPU seconds per 1,000 closes of the bench's watching consumer group (its
    /// own client, threads `bench-watcher`), already taken out of `cpu_s_per_1000`.
    pub watcher_cpu_s_per_1000: Option<f64>,
    /// Peak RSS of the process over the whole run (seeding and baseline included), MiB.
    pub peak_rss_mib: f64,
    /// Peak RSS from the daemons' start to the end of the drain, MiB: the daemon's figure,
    /// an upper bound (the bench's own seed and baseline memory still held counts too).
    /// `None` where the peak cannot be reset (not Linux).
    pub daemon_peak_rss_mib: Option<f64>,
    /// Where the CPU went during the drain (deadline to last close) and what bounded it.
    pub bottleneck: Bottleneck,
    /// The daemon's commits and statements per close.
    pub daemon: PerClose,
    /// The baseline's commits and statements per close.
    pub baseline: PerClose,
    /// Baseline details.
    pub baseline_run: Baseline,
    /// The set-based baseline's details.
    pub set_based_run: Baseline,
    /// The set-based baseline's commits and statements per close.
    pub set_based: PerClose,
    /// Orders per set-based group (`outbox.group_commit`, as the daemon groups).
    pub set_based_group: u32,
    /// The exactly-once audit.
    pub audit: Audit,
    /// `EXPLAIN` of the hot queries (MariaDB and PostgreSQL), one line each.
    pub plans: Vec<(String, String)>,
    /// Path `broker`: when the broker released the messages, against their due time (host
    /// clock; a second consumer group watched), ms, and how many rows they woke (a message may
    /// wake several: `rocketmq.rows_per_message`), each against its own due time. Negative:
    /// before the due time (the last hop is aimed `rocketmq.timer_lead` early).
    pub broker_release_ms: Option<Lateness>,
    /// Path `broker`: rows woken by released messages ÷ (last release − first release), per
    /// second.
    pub broker_releases_per_s: Option<f64>,
    /// Closes by trigger kind (`outbox`, `delay-message`, `sweep`): who closed them.
    pub closed_by: Vec<(String, i64)>,
    /// The bench's database, kept for a look.
    pub database: String,
}

/// Lateness percentiles, ms.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Lateness {
    /// Median.
    pub p50: i64,
    /// 99th percentile.
    pub p99: i64,
    /// Largest.
    pub max: i64,
    /// Smallest (negative would be a close before the deadline).
    pub min: i64,
}

impl Lateness {
    /// The percentiles of `sorted` (nearest rank); all 0 when it is empty.
    pub fn of(sorted: &[i64]) -> Lateness {
        let pick = |q: f64| crate::lateness::nearest_rank(sorted, q);
        Lateness {
            p50: pick(0.50),
            p99: pick(0.99),
            max: sorted.last().copied().unwrap_or(0),
            min: sorted.first().copied().unwrap_or(0),
        }
    }
}

/// When a share of the burst was first seen committed, ms after the (first) deadline by the
/// database clock: the bench polls the open count every 100 ms, so each is an upper bound, at
/// most one poll (100 ms and the poll's own query) late.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Visible {
    /// Half the orders seen closed.
    pub p50_ms: i64,
    /// 99 % seen closed.
    pub p99_ms: i64,
    /// Every order seen closed (0: never seen).
    pub all_ms: i64,
    /// Orders ÷ `all_ms`, per second: the drain rate as a reader sees it (a lower bound; 0
    /// when never all seen).
    pub closes_per_s: f64,
}

impl Visible {
    /// From the polls: (ms after the deadline, orders closed by then), in poll order.
    pub fn of(polls: &[(i64, u64)], orders: u32) -> Visible {
        let n = u64::from(orders);
        // The first poll that saw `percent` % of the orders closed (0 when none did).
        let first = |percent: u64| {
            let want = (n * percent).div_ceil(100);
            polls
                .iter()
                .find(|(_, closed)| *closed >= want)
                .map_or(0, |(ms, _)| *ms)
        };
        let all_ms = first(100);
        Visible {
            p50_ms: first(50),
            p99_ms: first(99),
            all_ms,
            closes_per_s: if all_ms > 0 {
                f64::from(orders) * 1000.0 / all_ms as f64
            } else {
                0.0
            },
        }
    }
}

/// The audit: each must hold for the run to count.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Audit {
    /// Every problem found; empty when exactly-once held.
    pub problems: Vec<String>,
    /// Ledger rows per daemon close.
    pub ledger_rows_per_close: f64,
}

impl Report {
    /// Whether the audit found nothing wrong.
    pub fn passed(&self) -> bool {
        self.audit.problems.is_empty()
    }

    /// The readable table.
    pub fn table(&self) -> String {
        let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        let mut out = String::new();
        let due = if self.spread_ms == 0 {
            "sharing one deadline".to_string()
        } else {
            format!("due {} ms apart", self.spread_ms)
        };
        out.push_str(&format!(
            "timeoutd bench · {} · path {:?} · {} orders {due} on {} SKU(s) · {} daemon(s)\n",
            self.backend, self.path, self.orders, self.skus, self.daemons
        ));
        out.push_str(&format!(
            "  stock               {:?}{}\n",
            self.stock,
            self.stock_back_ms.map_or(String::new(), |ms| format!(
                " · every unit folded back {:.2} s after the deadline",
                ms as f64 / 1e3
            ))
        ));
        out.push_str(&format!(
            "  closes/s            {:>10.0}   baseline {:>8.0}   ratio {:.2}\n",
            self.closes_per_s, self.baseline_closes_per_s, self.ratio
        ));
        out.push_str(&format!(
            "  set-based limit     {:>10.0}   (groups of {}, {} connection(s))   ratio {:.2}\n",
            self.set_based_closes_per_s,
            self.set_based_group,
            self.set_based_run.connections,
            self.set_based_ratio
        ));
        out.push_str(&format!(
            "  lateness ms         p50 {} · p99 {} · max {} · min {}{}\n",
            self.lateness_ms.p50,
            self.lateness_ms.p99,
            self.lateness_ms.max,
            self.lateness_ms.min,
            self.drain_floor_p99_ms
                .map_or(String::new(), |f| format!("   (drain floor p99 {f:.0})"))
        ));
        let n = &self.notice_latency_ms;
        out.push_str(&format!(
            "  notices ms          p50 {} · p95 {} · p99 {} · max {}   ({} of {} delivered; close to the receiver's 2xx)\n",
            n.p50, n.p95, n.p99, n.max, n.notices, n.expected
        ));
        if let Some(v) = &self.visible {
            out.push_str(&format!(
                "  seen committed ms   p50 ≤ {} · p99 ≤ {} · all ≤ {}   ({:.0} closes/s as a reader sees them)\n",
                v.p50_ms, v.p99_ms, v.all_ms, v.closes_per_s
            ));
        }
        out.push_str(&format!(
            "  commits/close       daemon {} · baseline {} · set-based {}\n",
            opt(self.daemon.commits),
            opt(self.baseline.commits),
            opt(self.set_based.commits)
        ));
        out.push_str(&format!(
            "  statements/close    daemon {} · baseline {} · set-based {}\n",
            opt(self.daemon.statements),
            opt(self.baseline.statements),
            opt(self.set_based.statements)
        ));
        if self.daemon.lock_waits.is_some() {
            let waits = |w: Option<super::counters::LockWaits>| {
                w.map_or("-".to_string(), |w| {
                    format!("{} ({} ms)", w.waits, w.wait_ms)
                })
            };
            out.push_str(&format!(
                "  row lock waits      daemon {} · baseline {} · set-based {}\n",
                waits(self.daemon.lock_waits),
                waits(self.baseline.lock_waits),
                waits(self.set_based.lock_waits)
            ));
        }
        out.push_str(&format!(
            "  cpu s / 1000 closes {:.3}   peak RSS {:.0} MiB (daemon phase {})   ledger rows/close {:.2}\n",
            self.cpu_s_per_1000,
            self.peak_rss_mib,
            self.daemon_peak_rss_mib
                .map_or("unknown".to_string(), |m| format!("{m:.0} MiB")),
            self.audit.ledger_rows_per_close
        ));
        if let Some(w) = self.watcher_cpu_s_per_1000 {
            out.push_str(&format!(
                "  watcher cpu         {w:.3} s / 1000 closes (the bench's watching group, not counted above)\n"
            ));
        }
        out.push_str(&format!(
            "  bottleneck          {}\n",
            self.bottleneck.verdict
        ));
        let by: Vec<String> = self
            .closed_by
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        out.push_str(&format!("  closed by           {}\n", by.join(" · ")));
        if let (Some(r), Some(rate)) = (self.broker_release_ms, self.broker_releases_per_s) {
            out.push_str(&format!(
                "  broker released     {rate:.0}/s · release − due time p50 {} · p99 {} · max {} ms\n",
                r.p50, r.p99, r.max
            ));
        }
        out.push_str(&format!(
            "  sweep query         {:.2} ms over {} orders of the past\n",
            self.sweep_query_ms, self.history
        ));
        for (name, plan) in &self.plans {
            out.push_str(&format!("  plan {name}: {plan}\n"));
        }
        if self.passed() {
            out.push_str("  audit               ok: every order closed once, none early, stock and coupons exact\n");
        } else {
            for p in &self.audit.problems {
                out.push_str(&format!("  audit FAILED        {p}\n"));
            }
        }
        out
    }
}

/// What the run hands to [`collect`].
pub(super) struct Inputs {
    pub backend: Backend,
    pub path: BenchPath,
    pub daemons: u32,
    pub orders: u32,
    pub skus: u32,
    pub stock: crate::config::StockMode,
    pub stock_back_ms: Option<i64>,
    pub deadline_ms: i64,
    pub spread_ms: i64,
    pub history: u32,
    pub baseline: Baseline,
    pub baseline_counts: PerClose,
    pub set_based: Baseline,
    pub set_based_counts: PerClose,
    pub set_based_group: u32,
    pub daemon_counts: PerClose,
    pub cpu_s: f64,
    /// The watching group's CPU seconds over the same span (broker paths).
    pub watcher_cpu_s: Option<f64>,
    /// Peak RSS before the daemons started (seeding, baseline), MiB.
    pub setup_peak_rss_mib: f64,
    /// Peak RSS from the daemons' start to the drain's end, MiB, where it could be reset.
    pub daemon_peak_rss_mib: Option<f64>,
    /// CPU during the drain and the verdict.
    pub bottleneck: Bottleneck,
    /// The notices' delivery latency.
    pub notice_latency: super::notices::NoticeLatency,
    /// The polls' (ms after the deadline, orders closed).
    pub polls: Vec<(i64, u64)>,
    pub released: Option<Vec<i64>>,
    pub shape: Shape,
    pub database: String,
}

/// The daemon's closes of one run, read back once for the report and the plot.
pub(super) struct Closes {
    /// Each close's `closed_at_ms` minus the (first) deadline, ms, in no particular order.
    pub since_ms: Vec<i64>,
    /// Each close's lateness `closed_at_ms − deadline_ms` (its own deadline), ms, sorted.
    pub lateness_ms: Vec<i64>,
}

impl Closes {
    /// Reads the CLOSED daemon orders (`d-…`), `deadline_ms` being the first deadline.
    ///
    /// # Errors
    /// The query fails.
    pub(super) async fn read(db: &Db, deadline_ms: i64) -> anyhow::Result<Closes> {
        let rows = crate::db::bench::daemon_closes(db).await?;
        let mut closes = Closes {
            since_ms: Vec::with_capacity(rows.len()),
            lateness_ms: Vec::with_capacity(rows.len()),
        };
        for (closed_at_ms, lateness_ms) in rows {
            closes.since_ms.push(closed_at_ms - deadline_ms);
            closes.lateness_ms.push(lateness_ms);
        }
        closes.lateness_ms.sort_unstable();
        Ok(closes)
    }
}

/// Reads the audit back from the database and puts the figures together.
///
/// # Errors
/// A query fails.
pub(super) async fn collect(db: &Db, closes: &Closes, i: Inputs) -> anyhow::Result<Report> {
    let late = Lateness::of(&closes.lateness_ms);
    let release = i.released.as_deref().map(Lateness::of);
    let releases_per_s = i.released.as_ref().map(|r| {
        let span = r.last().copied().unwrap_or(0) - r.first().copied().unwrap_or(0);
        r.len() as f64 * 1000.0 / span.max(1) as f64
    });
    let drain_ms = closes.since_ms.iter().copied().max().unwrap_or(0).max(1) as f64;
    let closes_per_s = f64::from(i.orders) * 1000.0 / drain_ms;
    let sweep_query_ms = sweep_query_ms(db).await?;
    let audit = audit(db, &i).await?;
    Ok(Report {
        backend: format!("{:?}", i.backend).to_lowercase(),
        path: i.path,
        daemons: i.daemons,
        orders: i.orders,
        skus: i.skus,
        stock: i.stock,
        stock_back_ms: i.stock_back_ms,
        spread_ms: i.spread_ms,
        history: i.history,
        sweep_query_ms,
        closes_per_s,
        baseline_closes_per_s: i.baseline.closes_per_s,
        ratio: closes_per_s / i.baseline.closes_per_s.max(f64::MIN_POSITIVE),
        set_based_closes_per_s: i.set_based.closes_per_s,
        set_based_ratio: closes_per_s / i.set_based.closes_per_s.max(f64::MIN_POSITIVE),
        set_based_group: i.set_based_group,
        lateness_ms: late,
        notice_latency_ms: i.notice_latency,
        drain_floor_p99_ms: (i.spread_ms == 0)
            .then(|| 0.99 * f64::from(i.orders) * 1000.0 / closes_per_s),
        visible: (i.spread_ms == 0).then(|| Visible::of(&i.polls, i.orders)),
        cpu_s_per_1000: i.cpu_s * 1000.0 / f64::from(i.orders.max(1)),
        watcher_cpu_s_per_1000: i
            .watcher_cpu_s
            .map(|w| w * 1000.0 / f64::from(i.orders.max(1))),
        peak_rss_mib: peak_rss_mib().max(i.setup_peak_rss_mib),
        daemon_peak_rss_mib: i.daemon_peak_rss_mib,
        bottleneck: i.bottleneck,
        daemon: i.daemon_counts,
        baseline: i.baseline_counts,
        baseline_run: i.baseline,
        set_based_run: i.set_based,
        set_based: i.set_based_counts,
        audit,
        plans: crate::db::bench::explain_hot_queries(db, i.deadline_ms).await,
        closed_by: crate::db::bench::closed_by(db).await?,
        broker_release_ms: release,
        broker_releases_per_s: releases_per_s,
        database: i.database,
    })
}

/// The sweep's own query, as the daemon runs it (grace 0, its default batch), median of 5, ms.
async fn sweep_query_ms(db: &Db) -> anyhow::Result<f64> {
    let now_ms = db.now_ms().await?;
    let mut times = Vec::new();
    for _ in 0..5 {
        let started = std::time::Instant::now();
        crate::db::outbox::find_orphans(db, now_ms, 0, 500).await?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[2])
}

async fn audit(db: &Db, i: &Inputs) -> anyhow::Result<Audit> {
    let c = crate::db::bench::audit_counts(db).await?;
    let mut problems = Vec::new();
    let n = i64::from(i.orders);
    if c.closed != 3 * n {
        problems.push(format!("{} orders CLOSED, want {}", c.closed, 3 * n));
    }
    if c.closed_early != 0 {
        problems.push(format!(
            "{} orders closed before their deadline",
            c.closed_early
        ));
    }
    if c.closed_decisions != n {
        problems.push(format!(
            "{} closed decisions for {n} orders",
            c.closed_decisions
        ));
    }
    if c.stock_units != i.shape.initial_units {
        problems.push(format!(
            "stock {} units after every close, want {}",
            c.stock_units, i.shape.initial_units
        ));
    }
    if c.coupons_held != 0 {
        problems.push(format!("{} coupons still held", c.coupons_held));
    }
    let per_close = c.ledger_rows as f64 / n.max(1) as f64;
    if c.ledger_rows < n {
        problems.push(format!("{} ledger rows for {n} closes", c.ledger_rows));
    }
    if c.outbox_unsettled != 0 {
        problems.push(format!("{} outbox rows not PROCESSED", c.outbox_unsettled));
    }
    Ok(Audit {
        problems,
        ledger_rows_per_close: per_close,
    })
}

#[cfg(test)]
mod tests {
    use super::Visible;

    #[test]
    fn each_share_is_the_first_poll_that_saw_it_committed() {
        let polls = [
            (-40, 0),
            (60, 0),
            (160, 400),
            (260, 990),
            (360, 999),
            (460, 1000),
        ];
        let v = Visible::of(&polls, 1000);
        assert_eq!((v.p50_ms, v.p99_ms, v.all_ms), (260, 260, 460));
        assert!((v.closes_per_s - 1000.0 * 1000.0 / 460.0).abs() < 1e-9);
        // Never all seen (the drain failed): 0, not a made-up figure.
        let unseen = Visible::of(&polls[..3], 1000);
        assert_eq!((unseen.all_ms, unseen.closes_per_s), (0, 0.0));
    }
}
