//! What the database server under the daemon is, and whether timeoutd can run on it safely.
//! Read once at start-up, which refuses what cannot be run safely ([`Engine::refusals`]), and
//! by `timeoutd doctor`. The one place for these rules (docs/scaling.md, "Distributed engines").
//!
//! timeoutd relies on three things of its database: `SELECT … FOR UPDATE SKIP LOCKED` claims
//! whose row locks hold until commit, a single-row compare-and-set inside a transaction that
//! also writes the stock, coupon and ledger rows atomically, and one clock read in that
//! transaction. What breaks them:
//!
//! - **TiDB** (`…-TiDB-v…`) has no `SKIP LOCKED` lock type; **Vitess** (`…-vitess`) refused
//!   the clause (docs/scaling.md cites their trackers).
//! - **MariaDB Spider**: a table of the `SPIDER` engine is a link to tables on backend servers
//!   (measured on MariaDB 10.11: docs/scaling.md, "MariaDB Spider"). Spider drops `SKIP LOCKED` (and
//!   `NOWAIT`) when it sends a claim to the shards, so concurrent daemons block on each other's
//!   claims and fail with lock-wait timeouts instead of skipping; a close touching rows on two
//!   shards commits on each separately (atomic only with `spider_internal_xa`), so a crash
//!   between them leaves an order CLOSED with its stock not given back; and `NOW()` in a
//!   pushed-down write is evaluated on the front and shipped as a literal that the backends
//!   read in UTC, shifting a database-clock deadline by the front's time-zone offset. Only the
//!   single-row compare-and-set itself holds. Run timeoutd on each backend (shard) instead.
//! - Any MySQL table of another engine than InnoDB (MyISAM, Aria, MEMORY, …) has no
//!   transactions or row locks: a close would not be one atomic step.
//!
//! **MariaDB Galera** is supported. Its row locks are local to a node, so daemons on two nodes
//! can claim the same row; certification then lets one commit and aborts the other with
//! `ER_LOCK_DEADLOCK` (1213) at commit, which timeoutd treats as any deadlock: the claim or
//! group is retried, and a retried close finds the order no longer PENDING. What Galera needs of
//! the client is causal reads: a node applies other nodes' commits a moment after they are
//! certified, so a check-back asked right after the order service committed on another node
//! could read "no such order" and roll the half message back. Every connection to a Galera node
//! therefore sets `wsrep_sync_wait = 1` (reads wait until the node has applied what the cluster
//! committed before them; MariaDB KB, "wsrep_sync_wait").

use sqlx::Row;

use super::{Backend, Db, DbError};

/// What the server is.
#[derive(Debug, Clone, Default)]
pub struct Engine {
    /// The server's version string (`10.11.19-MariaDB-…`, `15.19 (Debian …)`, `3.46.0`).
    pub version: String,
    /// MySQL/MariaDB: the storage engine of each of timeoutd's tables ([`super::names::TABLES`],
    /// but sqlx's bookkeeping) present that is not InnoDB, as
    /// (table, engine). Empty on the other backends.
    pub foreign_tables: Vec<(String, String)>,
    /// Set when the server is a MariaDB Galera node with replication on (`wsrep_on = ON`).
    pub galera: Option<Galera>,
}

/// A Galera node's state as this session sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Galera {
    /// Nodes in the node's component (`wsrep_cluster_size`).
    pub cluster_size: u32,
    /// `Synced`, `Donor/Desynced`, `Joining`, … (`wsrep_local_state_comment`).
    pub state: String,
    /// `Primary` when the node is in the component with quorum (`wsrep_cluster_status`).
    pub status: String,
    /// This session's `wsrep_sync_wait` bitmask (1: reads are causal).
    pub sync_wait: u32,
}

/// Reads what the server is.
///
/// # Errors
/// [`DbError::Sql`] when the version or `information_schema` cannot be read.
pub async fn inspect(db: &Db) -> Result<Engine, DbError> {
    let sql = match db.backend() {
        Backend::Sqlite => "SELECT sqlite_version()",
        Backend::MySql => "SELECT VERSION()",
        Backend::Postgres => "SELECT current_setting('server_version')",
    };
    let version = db
        .backend()
        .query(sql)
        .fetch_one(db.pool())
        .await?
        .try_get::<String, _>(0)?;
    let mut engine = Engine {
        version,
        ..Engine::default()
    };
    if db.backend() != Backend::MySql {
        return Ok(engine);
    }
    let mut conn = db.pool().acquire().await?;
    let listed = super::names::TABLES
        .iter()
        .filter(|t| **t != "_sqlx_migrations")
        .map(|t| format!("'{}'", super::names::table(t)))
        .collect::<Vec<_>>()
        .join(", ");
    engine.foreign_tables = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT TABLE_NAME, COALESCE(ENGINE, '') FROM information_schema.TABLES \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_TYPE = 'BASE TABLE' \
         AND TABLE_NAME IN ({listed}) AND UPPER(COALESCE(ENGINE, '')) <> 'INNODB' \
         ORDER BY TABLE_NAME"
    )))
    .fetch_all(&mut *conn)
    .await?
    .iter()
    .map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<String, _>(1)?)))
    .collect::<Result<_, DbError>>()?;
    if galera_on(&mut conn).await? {
        let cluster_size = global_status(&mut conn, "wsrep_cluster_size")
            .await?
            .parse()
            .unwrap_or(0);
        let state = global_status(&mut conn, "wsrep_local_state_comment").await?;
        let status = global_status(&mut conn, "wsrep_cluster_status").await?;
        let sync_wait = sqlx::query("SELECT CAST(@@SESSION.wsrep_sync_wait AS SIGNED)")
            .fetch_one(&mut *conn)
            .await?
            .try_get::<i64, _>(0)?;
        engine.galera = Some(Galera {
            cluster_size,
            state,
            status,
            sync_wait: u32::try_from(sync_wait).unwrap_or(0),
        });
    }
    Ok(engine)
}

/// A global status variable (`SHOW GLOBAL STATUS LIKE …`, which MariaDB, MySQL and Percona
/// XtraDB Cluster all answer), empty when absent.
async fn global_status(conn: &mut sqlx::AnyConnection, name: &str) -> Result<String, DbError> {
    Ok(
        // Text protocol: not every server prepares SHOW statements.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "SHOW GLOBAL STATUS LIKE '{name}'"
        )))
        .fetch_optional(conn)
        .await?
        .map(|r| r.try_get::<String, _>(1))
        .transpose()?
        .unwrap_or_default(),
    )
}

/// Whether this MySQL-protocol connection is to a Galera node with replication on:
/// `SHOW GLOBAL VARIABLES LIKE 'wsrep_on'`, which a node not yet synced or outside the primary
/// component still answers, and MySQL (no such variable) answers with no row. `false` also on
/// a MariaDB built with wsrep but not clustered (`OFF`).
///
/// # Errors
/// The query's failure (the connection is then not used).
pub(crate) async fn galera_on(conn: &mut sqlx::AnyConnection) -> Result<bool, sqlx::Error> {
    Ok(sqlx::raw_sql("SHOW GLOBAL VARIABLES LIKE 'wsrep_on'")
        .fetch_optional(conn)
        .await?
        .and_then(|r| r.try_get::<String, _>(1).ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("ON")))
}

/// The session setting every connection to a Galera node gets: causal reads.
pub(crate) const GALERA_SESSION: &str = "SET SESSION wsrep_sync_wait = 1";

impl Engine {
    /// What makes this server unsafe for timeoutd, one line each naming the table or version
    /// and what to do instead; empty when it is safe. The daemon refuses to start on any.
    pub fn refusals(&self) -> Vec<String> {
        let mut out = Vec::new();
        let lower = self.version.to_ascii_lowercase();
        if lower.contains("tidb") || lower.contains("vitess") {
            out.push(format!(
                "{}: a MySQL-compatible engine without SELECT … FOR UPDATE SKIP LOCKED as timeoutd \
                 uses it; run timeoutd on MariaDB 10.6+, MySQL 8.0.1+ or PostgreSQL 9.5+ (one per \
                 shard; docs/scaling.md)",
                self.version
            ));
        }
        for (table, engine) in &self.foreign_tables {
            if engine.eq_ignore_ascii_case("spider") {
                out.push(format!(
                    "table `{table}` is a Spider table (engine SPIDER): Spider drops SKIP LOCKED \
                     from claims, commits a close on each shard separately, and evaluates NOW() \
                     on the front, so a close is neither one atomic step nor timed by one clock; \
                     run timeoutd against each backend shard's database instead (docs/scaling.md, \
                     \"MariaDB Spider\")"
                ));
            } else {
                out.push(format!(
                    "table `{table}` uses the {} engine: it has no transactions or row locks, so \
                     a close would not be one atomic compare-and-set; ALTER TABLE {table} \
                     ENGINE = InnoDB",
                    if engine.is_empty() {
                        "(unknown)"
                    } else {
                        engine
                    }
                ));
            }
        }
        out
    }

    /// What is worth a warning but not a refusal: a Galera node that is not synced or not in the
    /// primary component, or a session whose reads are not causal.
    pub fn warnings(&self) -> Vec<String> {
        let Some(g) = &self.galera else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if g.status != "Primary" || g.state != "Synced" {
            out.push(format!(
                "this Galera node is {} and {} (cluster of {}): it refuses writes until it \
                 rejoins the primary component",
                g.state, g.status, g.cluster_size
            ));
        }
        if g.sync_wait & 1 == 0 {
            out.push(format!(
                "wsrep_sync_wait = {} on this Galera session: reads may miss another node's \
                 commits (timeoutd sets 1 on every connection)",
                g.sync_wait
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(version: &str, foreign: &[(&str, &str)]) -> Engine {
        Engine {
            version: version.to_string(),
            foreign_tables: foreign
                .iter()
                .map(|(t, e)| (t.to_string(), e.to_string()))
                .collect(),
            galera: None,
        }
    }

    #[test]
    fn distributed_engines_without_skip_locked_are_refused_by_version() {
        assert_eq!(engine("8.0.11-TiDB-v7.5.1", &[]).refusals().len(), 1);
        assert_eq!(engine("8.0.31-vitess", &[]).refusals().len(), 1);
        assert!(
            engine("10.11.19-MariaDB-0+deb12u1", &[])
                .refusals()
                .is_empty()
        );
    }

    #[test]
    fn a_spider_or_non_transactional_table_is_refused_by_name() {
        let refusals = engine(
            "10.11.19-MariaDB",
            &[("orders", "SPIDER"), ("coupons", "MyISAM")],
        )
        .refusals();
        assert_eq!(refusals.len(), 2);
        assert!(
            refusals[0].contains("`orders` is a Spider table"),
            "{refusals:?}"
        );
        assert!(
            refusals[1].contains("`coupons` uses the MyISAM engine"),
            "{refusals:?}"
        );
    }

    #[test]
    fn a_galera_node_out_of_the_primary_component_is_a_warning() {
        let mut e = engine("10.11.19-MariaDB", &[]);
        e.galera = Some(Galera {
            cluster_size: 1,
            state: "Initialized".into(),
            status: "non-Primary".into(),
            sync_wait: 1,
        });
        assert_eq!(e.warnings().len(), 1);
        assert!(e.refusals().is_empty());
    }
}
