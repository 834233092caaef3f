//! Notice delivery latency (#46 part 6): the bench points the merchant's notices at a
//! loopback webhook of its own (`[notify.channels.bench-notices]`, the merchant's `channel`
//! setting) and measures, for each notice of the burst, the time from its order's close (the
//! `closed_at_ms` stamp, database clock) to the receiver's 2xx (a monotonic instant, put on
//! the database clock by one reading of both when the receiver starts). The figure is the effect executor's: commit, wake,
//! claim, the HTTP round trip. Convoy reports p95 0.12 s at 50–200 events/s on PostgreSQL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::db::Db;

/// The channel name the bench gives its receiver.
pub const CHANNEL: &str = "bench-notices";

/// Notice latency percentiles, ms: close stamp to the receiver's 2xx.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct NoticeLatency {
    /// Notices received for the burst's orders (each idempotency key once).
    pub notices: usize,
    /// Notices the burst's closes recorded (`notify` and `remind` ledger rows).
    pub expected: i64,
    /// Median.
    pub p50: i64,
    /// 95th percentile (the target's percentile).
    pub p95: i64,
    /// 99th percentile.
    pub p99: i64,
    /// Largest.
    pub max: i64,
}

/// A loopback webhook recording when each idempotency key first arrived.
pub struct Receiver {
    /// `http://127.0.0.1:PORT/notices`.
    pub url: String,
    arrived: Arc<Mutex<HashMap<String, Instant>>>,
    /// An instant and the database clock's reading (epoch ms) taken side by side.
    base: (Instant, i64),
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    /// Starts one on a free loopback port, its instants put on `db`'s clock.
    ///
    /// # Errors
    /// The port cannot be bound, or the database clock cannot be read.
    pub async fn start(db: &Db) -> anyhow::Result<Receiver> {
        let base = (Instant::now(), db.now_ms().await?);
        let arrived: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let record = arrived.clone();
        let app = axum::Router::new().route(
            "/notices",
            axum::routing::post(move |headers: axum::http::HeaderMap| {
                let record = record.clone();
                async move {
                    let at = Instant::now();
                    if let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok())
                    {
                        record
                            .lock()
                            .expect("receiver lock poisoned")
                            .entry(key.to_string())
                            .or_insert(at);
                    }
                    axum::http::StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}/notices", listener.local_addr()?);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Receiver {
            url,
            arrived,
            base,
            task,
        })
    }

    /// Waits until every notice the burst's closes recorded has arrived (or `limit` passed),
    /// then measures each against its order's close stamp.
    ///
    /// # Errors
    /// A query fails.
    pub async fn measure(&self, db: &Db, limit: Duration) -> anyhow::Result<NoticeLatency> {
        let started = std::time::Instant::now();
        let (closed, expected) = loop {
            let (closed, expected) = crate::db::bench::daemon_notices(db).await?;
            let arrived = self.burst_arrivals(&closed).len() as i64;
            if arrived >= expected || started.elapsed() >= limit {
                break (closed, expected);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let mut latency: Vec<i64> = self
            .burst_arrivals(&closed)
            .into_iter()
            .map(|(order, at)| at - closed[&order])
            .collect();
        latency.sort_unstable();
        let pick = |q: f64| crate::lateness::nearest_rank(&latency, q);
        Ok(NoticeLatency {
            notices: latency.len(),
            expected,
            p50: pick(0.50),
            p95: pick(0.95),
            p99: pick(0.99),
            max: latency.last().copied().unwrap_or(0),
        })
    }

    /// The arrivals of notices of `closed` orders: (order id, epoch ms by the database clock).
    /// The idempotency key is `merchant/order/phase/index`.
    fn burst_arrivals(&self, closed: &HashMap<String, i64>) -> Vec<(String, i64)> {
        self.arrived
            .lock()
            .expect("receiver lock poisoned")
            .iter()
            .filter_map(|(key, at)| {
                let order = key.split('/').nth(1)?;
                let ms = self.base.1 + at.duration_since(self.base.0).as_millis() as i64;
                closed.contains_key(order).then(|| (order.to_string(), ms))
            })
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}
