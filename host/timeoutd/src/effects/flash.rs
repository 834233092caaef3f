//! Flash-sale effects in Redis: give units back to an activity's stock counter, free a buyer's
//! slot in the activity's buyer set. Each runs as one Lua script together with its idempotency
//! marker, so a replayed effect changes nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use redis::aio::ConnectionManager;
use redis::cluster_async::ClusterConnection;

use super::executor::{Done, EffectError, Executor, Job};
use super::work::RedisWork;
use crate::config::{Config, RedisConfig};
use crate::kinds::Section;

/// `KEYS[1]` the effect's idempotency marker, `KEYS[2]` the key it changes; `ARGV[1]` `incrby`
/// or `srem`, `ARGV[2]` the amount or member, `ARGV[3]` the marker's TTL in seconds. The change
/// is applied only when `SET NX` creates the marker, atomically with it (scripts run whole).
/// Returns 1 when applied, 0 when the marker already existed (a replay).
const APPLY_ONCE: &str = r"
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[3]) then
  if ARGV[1] == 'incrby' then
    redis.call('INCRBY', KEYS[2], ARGV[2])
  else
    redis.call('SREM', KEYS[2], ARGV[2])
  end
  return 1
end
return 0
";

#[derive(Clone)]
enum Connection {
    /// Reconnects by itself after the server restarts or the connection breaks (the request
    /// that met the break fails, and its effect is retried); a plain multiplexed connection
    /// stays broken for the life of the process (found by scripts/chaos: flash-sale effects
    /// stuck on "broken pipe" after a Redis restart).
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// The Redis side of flash sales. Cheap to clone (connections are multiplexed).
#[derive(Clone)]
pub struct FlashSale {
    conn: Connection,
    marker_ttl_secs: u64,
    script: Arc<redis::Script>,
}

/// How long connecting to Redis may take (each attempt).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// How long one Redis command may take: a Redis that accepts and never answers costs each
/// flash-sale effect this, then the effect is retried with backoff (a transient error).
pub const RESPONSE_TIMEOUT: Duration = Duration::from_millis(500);

/// How long one command's whole exchange may take: connecting (lazily, on first use), the
/// client's reconnect attempts, and a script's `EVALSHA` then `EVAL`. The client's own timeouts
/// bound each round trip; this bounds them together (a Redis that accepts and never answers
/// held the ledger executor past the daemon's stop without it).
pub const COMMAND_DEADLINE: Duration = Duration::from_secs(2);

/// `command`, or an I/O timeout error (transient: [`is_transient`]) after [`COMMAND_DEADLINE`].
async fn bounded<T>(command: impl Future<Output = redis::RedisResult<T>>) -> redis::RedisResult<T> {
    tokio::time::timeout(COMMAND_DEADLINE, command)
        .await
        .unwrap_or_else(|_| {
            Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer from Redis within {COMMAND_DEADLINE:?}"),
            )))
        })
}

impl FlashSale {
    /// The single Redis (connected on first use: a Redis down at start-up does not stop the
    /// daemon) or the cluster (connected now) `config` names; every command bounded by
    /// [`RESPONSE_TIMEOUT`], every connection attempt by [`CONNECT_TIMEOUT`].
    ///
    /// # Errors
    /// A message naming the URL when it does not parse or the server refuses.
    pub async fn connect(config: &RedisConfig) -> Result<Self, String> {
        let conn = match &config.url {
            Some(url) => {
                let client = redis::Client::open(url.as_str())
                    .map_err(|e| format!("redis.url `{url}`: {e}"))?;
                // Connected on first use, not here: a Redis that is down or hangs at start-up
                // leaves the flash-sale effects PENDING for retry (like any other outage)
                // instead of stopping the daemon, whose closes do not need Redis.
                let deadlines = redis::aio::ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT));
                Connection::Single(
                    client
                        .get_connection_manager_lazy(deadlines)
                        .map_err(|e| format!("redis `{url}`: {e}"))?,
                )
            }
            None => {
                let client = redis::cluster::ClusterClient::builder(
                    config.cluster.iter().map(String::as_str),
                )
                .connection_timeout(CONNECT_TIMEOUT)
                .response_timeout(RESPONSE_TIMEOUT)
                .build()
                .map_err(|e| format!("redis.cluster: {e}"))?;
                Connection::Cluster(
                    client
                        .get_async_connection()
                        .await
                        .map_err(|e| format!("redis cluster: {e}"))?,
                )
            }
        };
        Ok(FlashSale {
            conn,
            marker_ttl_secs: config.marker_ttl.as_secs().max(1),
            script: Arc::new(redis::Script::new(APPLY_ONCE)),
        })
    }

    /// A warning when Redis may evict the idempotency markers (they carry a TTL, so every
    /// policy but `noeviction` can drop them once `maxmemory` is reached, and a replayed effect
    /// would then apply twice): e.g. `redis: maxmemory-policy is allkeys-lru with maxmemory
    /// 104857600 bytes …`. `None` when it cannot (no `maxmemory`, or `noeviction`) or when
    /// `CONFIG GET` is refused (managed Redis).
    pub async fn eviction_warning(&self) -> Option<String> {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg("maxmemory*");
        let answer: Result<Vec<String>, _> = match &self.conn {
            Connection::Single(c) => bounded(cmd.query_async(&mut c.clone())).await,
            Connection::Cluster(c) => bounded(cmd.query_async(&mut c.clone())).await,
        };
        let pairs = answer.ok()?;
        let get = |name: &str| {
            pairs
                .chunks(2)
                .find(|kv| kv.len() == 2 && kv[0] == name)
                .map(|kv| kv[1].clone())
        };
        let policy = get("maxmemory-policy")?;
        let limit: u64 = get("maxmemory")?.parse().ok()?;
        (limit > 0 && policy != "noeviction").then(|| {
            format!(
                "redis: maxmemory-policy is {policy} with maxmemory {limit} bytes: once Redis is \
                 full it may evict timeoutd's idempotency markers (timeoutd:effect:*, which carry a \
                 TTL), and a replayed flash-sale effect would then apply twice; use noeviction, or \
                 a Redis of its own for the markers"
            )
        })
    }

    /// Whether Redis (or the cluster) takes a write: `SET timeoutd:readyz 1 PX 60000`. A PING
    /// is not enough — a replica left behind by a failover answers it, and refuses every
    /// effect with READONLY.
    ///
    /// # Errors
    /// The client's message when it does not (`READONLY You can't write against a read only
    /// replica.`, a refused connection, …).
    pub async fn ping(&self) -> Result<(), String> {
        let mut cmd = redis::cmd("SET");
        cmd.arg("timeoutd:readyz").arg(1).arg("PX").arg(60_000);
        let ok: Result<String, _> = match &self.conn {
            Connection::Single(c) => bounded(cmd.query_async(&mut c.clone())).await,
            Connection::Cluster(c) => bounded(cmd.query_async(&mut c.clone())).await,
        };
        ok.map(|_| ()).map_err(|e| format!("not writable: {e}"))
    }

    /// Why `row` must be parked for an operator instead of run at `now_ms`, if it must: it was
    /// claimed before (so it may have been applied without being settled, a crash between the
    /// two) and was recorded at least `redis.marker_ttl` ago, so the marker that would make a
    /// replay harmless may have expired. An operator's retry (`POST /v1/ledger/{id}/retry`,
    /// after checking the key) clears the claim, and the row then runs.
    pub fn past_its_marker(
        &self,
        row: &crate::db::ledger::PendingEffect,
        now_ms: i64,
    ) -> Option<String> {
        let ttl_ms = (self.marker_ttl_secs * 1000) as i64;
        let age_ms = now_ms - row.created_at_ms;
        (row.claimed_before && age_ms >= ttl_ms).then(|| {
            format!(
                "parked for review: recorded {} ago and claimed before, so it may have been applied \
                 already and its idempotency marker (redis.marker_ttl = {}) may have expired; check \
                 the Redis key, then retry it (POST /v1/ledger/{}/retry) or leave it",
                humantime::format_duration(std::time::Duration::from_secs((age_ms / 1000).max(0) as u64)),
                humantime::format_duration(std::time::Duration::from_secs(self.marker_ttl_secs)),
                row.id
            )
        })
    }

    /// `INCRBY stock_key quantity`, once per `idempotency_key`.
    ///
    /// # Errors
    /// [`EffectError::Transient`] when Redis is unreachable, else permanent.
    pub async fn restore_stock(
        &self,
        stock_key: &str,
        quantity: u32,
        idempotency_key: &str,
    ) -> Result<Done, EffectError> {
        self.apply(stock_key, "incrby", &quantity.to_string(), idempotency_key)
            .await
    }

    /// `SREM users_key user`, once per `idempotency_key`.
    ///
    /// # Errors
    /// [`EffectError::Transient`] when Redis is unreachable, else permanent.
    pub async fn release_slot(
        &self,
        users_key: &str,
        user: &str,
        idempotency_key: &str,
    ) -> Result<Done, EffectError> {
        self.apply(users_key, "srem", user, idempotency_key).await
    }

    /// Runs a script's `invocation` (its keys and arguments) on this Redis, the whole exchange
    /// bounded by [`COMMAND_DEADLINE`] (the caps' shared store uses it too,
    /// `super::caps`).
    ///
    /// # Errors
    /// The client's error, or an I/O timeout.
    pub async fn invoke<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> redis::RedisResult<T> {
        match &self.conn {
            Connection::Single(c) => bounded(invocation.invoke_async(&mut c.clone())).await,
            Connection::Cluster(c) => bounded(invocation.invoke_async(&mut c.clone())).await,
        }
    }

    async fn apply(
        &self,
        key: &str,
        op: &str,
        arg: &str,
        idempotency_key: &str,
    ) -> Result<Done, EffectError> {
        let marker = marker_key(key, idempotency_key);
        let mut invocation = self.script.prepare_invoke();
        invocation
            .key(&marker)
            .key(key)
            .arg(op)
            .arg(arg)
            .arg(self.marker_ttl_secs);
        let applied: i64 = self.invoke(&invocation).await.map_err(classify)?;
        Ok(if applied == 0 {
            Done::noted(format!("already applied (marker {marker})"))
        } else {
            Done::plain()
        })
    }
}

/// A merchant's Redis keys, `<activity>` standing for the activity id.
#[derive(Debug, Clone)]
struct FlashKeys {
    stock: String,
    users: String,
}

/// The executor of the flash-sale effects (`restore-flash-stock`, `release-flash-slot`): the
/// Redis connection and each merchant's `flash_stock_key` / `flash_users_key`.
#[derive(Clone)]
pub struct FlashEffects {
    sale: FlashSale,
    keys: Arc<HashMap<String, FlashKeys>>,
}

impl FlashEffects {
    /// Connects to `config.redis` and takes each merchant's keys; `None` without `[redis]`.
    ///
    /// # Errors
    /// As [`FlashSale::connect`].
    pub async fn from_config(config: &Config) -> Result<Option<Self>, String> {
        let Some(redis) = &config.redis else {
            return Ok(None);
        };
        let keys = config
            .merchants
            .iter()
            .map(|(id, m)| {
                let keys = FlashKeys {
                    stock: m.flash_stock_key.clone(),
                    users: m.flash_users_key.clone(),
                };
                (id.clone(), keys)
            })
            .collect();
        let sale = FlashSale::connect(redis).await?;
        if let Some(warning) = sale.eviction_warning().await {
            tracing::warn!("{warning}");
        }
        Ok(Some(FlashEffects {
            sale,
            keys: Arc::new(keys),
        }))
    }

    /// Whether Redis answers (`PING`).
    ///
    /// # Errors
    /// The client's message when it does not.
    pub async fn ping(&self) -> Result<(), String> {
        self.sale.ping().await
    }
}

impl Executor for FlashEffects {
    fn section(&self) -> Section {
        Section::Redis
    }

    fn execute<'a>(&'a self, job: Job<'a>) -> BoxFuture<'a, Result<Done, EffectError>> {
        Box::pin(async move {
            let row = job.row;
            if let Some(reason) = self.sale.past_its_marker(row, job.now_ms) {
                return Err(EffectError::Permanent(reason));
            }
            let keys = self.keys.get(&row.merchant_id).ok_or_else(|| {
                EffectError::Permanent(format!("merchant `{}` is not configured", row.merchant_id))
            })?;
            match job.redis_work()? {
                RedisWork::RestoreStock { activity, quantity } => {
                    let key = keys.stock.replace("<activity>", &activity);
                    self.sale.restore_stock(&key, quantity, &row.key).await
                }
                RedisWork::ReleaseSlot { activity, user } => {
                    let key = keys.users.replace("<activity>", &activity);
                    self.sale.release_slot(&key, &user, &row.key).await
                }
            }
        })
    }
}

/// The marker of an effect on `key`: it carries `key`'s hash tag (or `key` itself as one), so
/// marker and key live on the same Redis Cluster slot and one script may touch both.
fn marker_key(key: &str, idempotency_key: &str) -> String {
    let tag = key
        .find('{')
        .and_then(|open| {
            key[open + 1..]
                .find('}')
                .map(|len| &key[open + 1..open + 1 + len])
        })
        .filter(|tag| !tag.is_empty())
        .unwrap_or(key);
    format!("timeoutd:effect:{{{tag}}}:{idempotency_key}")
}

/// Redis error codes that pass with time: a replica that is (or became, in a failover) the
/// target of a write, a server loading its dataset or busy in a script, a master down, a
/// cluster resharding or down, memory full until eviction or a failover frees some. Redis
/// documents them in its error replies (`-READONLY You can't write against a read only
/// replica.`); inside a script they come wrapped in the script's error, so the words of the
/// message are searched too.
const TRANSIENT_CODES: &[&str] = &[
    "READONLY",
    "LOADING",
    "BUSY",
    "MASTERDOWN",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "OOM",
    "NOREPLICAS",
    "MOVED",
    "ASK",
];

/// Whether a Redis failure may pass by retrying (transient: the ledger row stays PENDING and
/// is retried with backoff) or never will (permanent: FAILED with the reason).
fn is_transient(e: &redis::RedisError) -> bool {
    if e.is_io_error() || e.is_timeout() || e.is_connection_refusal() || e.is_connection_dropped() {
        return true;
    }
    if e.code().is_some_and(|c| TRANSIENT_CODES.contains(&c)) {
        return true;
    }
    // The client renders some codes by its own names (`ReadOnly: You can't write against a
    // read only replica. script: …`).
    const RENDERED: &[&str] = &[
        "ReadOnly",
        "BusyLoading",
        "TryAgain",
        "ClusterDown",
        "MasterDown",
    ];
    let text = e.to_string();
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .any(|word| TRANSIENT_CODES.contains(&word) || RENDERED.contains(&word))
}

fn classify(e: redis::RedisError) -> EffectError {
    if is_transient(&e) {
        EffectError::Transient(format!("redis: {e}"))
    } else {
        EffectError::Permanent(format!("redis: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::{is_transient, marker_key};

    #[test]
    fn failover_errors_are_transient_also_inside_a_script() {
        let server = |code: &str, text: &str| {
            redis::RedisError::from((
                redis::ErrorKind::Extension,
                "An error was signalled by the server",
                format!("{code} {text}"),
            ))
        };
        for code in [
            "READONLY",
            "LOADING",
            "BUSY",
            "MASTERDOWN",
            "TRYAGAIN",
            "CLUSTERDOWN",
            "OOM",
        ] {
            assert!(is_transient(&server(code, "try later")), "{code}");
        }
        let wrapped = redis::RedisError::from((
            redis::ErrorKind::Extension,
            "An error was signalled by the server",
            "ERR Error running script (call to f_1): @user_script:2: -READONLY You can't write against a read only replica.".to_string(),
        ));
        assert!(is_transient(&wrapped));
        let wrong = redis::RedisError::from((
            redis::ErrorKind::Extension,
            "An error was signalled by the server",
            "WRONGTYPE Operation against a key holding the wrong kind of value".to_string(),
        ));
        assert!(
            !is_transient(&wrong),
            "a wrong key type will not pass by retrying"
        );
    }

    #[test]
    fn markers_share_the_hash_slot_of_their_key() {
        assert_eq!(
            marker_key("activity:{a1}:stock", "m/o/0/3"),
            "timeoutd:effect:{a1}:m/o/0/3"
        );
        assert_eq!(
            marker_key("plain-key", "k"),
            "timeoutd:effect:{plain-key}:k"
        );
        assert_eq!(
            marker_key("odd:{}:key", "k"),
            "timeoutd:effect:{odd:{}:key}:k"
        );
    }
}
