//! Embedded schema migrations, one set per backend, applied with sqlx's migrator.

use std::borrow::Cow;

use sqlx::SqlSafeStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};

use super::{Backend, Db, DbError};

/// `(version, description, sql)` per backend, in order.
const SQLITE: &[(i64, &str, &str)] = &[
    (
        1,
        "schema",
        include_str!("../../migrations/sqlite/0001_schema.sql"),
    ),
    (
        2,
        "external effects",
        include_str!("../../migrations/sqlite/0002_external_effects.sql"),
    ),
    (
        3,
        "admin audit",
        include_str!("../../migrations/sqlite/0003_admin_audit.sql"),
    ),
    (
        4,
        "rocketmq",
        include_str!("../../migrations/sqlite/0004_rocketmq.sql"),
    ),
    (
        5,
        "decision input",
        include_str!("../../migrations/sqlite/0005_decision_input.sql"),
    ),
    (
        6,
        "ledger claim token",
        include_str!("../../migrations/sqlite/0006_ledger_claim_token.sql"),
    ),
    (
        7,
        "phase state",
        include_str!("../../migrations/sqlite/0007_phase_state.sql"),
    ),
    (
        8,
        "payment lease",
        include_str!("../../migrations/sqlite/0008_payment_lease.sql"),
    ),
    (
        10,
        "retention",
        include_str!("../../migrations/sqlite/0010_retention.sql"),
    ),
];
const MYSQL: &[(i64, &str, &str)] = &[
    (
        1,
        "schema",
        include_str!("../../migrations/mysql/0001_schema.sql"),
    ),
    (
        2,
        "external effects",
        include_str!("../../migrations/mysql/0002_external_effects.sql"),
    ),
    (
        3,
        "admin audit",
        include_str!("../../migrations/mysql/0003_admin_audit.sql"),
    ),
    (
        4,
        "rocketmq",
        include_str!("../../migrations/mysql/0004_rocketmq.sql"),
    ),
    (
        5,
        "decision input",
        include_str!("../../migrations/mysql/0005_decision_input.sql"),
    ),
    (
        6,
        "ledger claim token",
        include_str!("../../migrations/mysql/0006_ledger_claim_token.sql"),
    ),
    (
        7,
        "phase state",
        include_str!("../../migrations/mysql/0007_phase_state.sql"),
    ),
    (
        8,
        "payment lease",
        include_str!("../../migrations/mysql/0008_payment_lease.sql"),
    ),
    (
        9,
        "utf8mb4",
        include_str!("../../migrations/mysql/0009_utf8mb4.sql"),
    ),
    (
        10,
        "retention",
        include_str!("../../migrations/mysql/0010_retention.sql"),
    ),
];
const POSTGRES: &[(i64, &str, &str)] = &[
    (
        1,
        "schema",
        include_str!("../../migrations/postgres/0001_schema.sql"),
    ),
    (
        2,
        "external effects",
        include_str!("../../migrations/postgres/0002_external_effects.sql"),
    ),
    (
        3,
        "admin audit",
        include_str!("../../migrations/postgres/0003_admin_audit.sql"),
    ),
    (
        4,
        "rocketmq",
        include_str!("../../migrations/postgres/0004_rocketmq.sql"),
    ),
    (
        5,
        "decision input",
        include_str!("../../migrations/postgres/0005_decision_input.sql"),
    ),
    (
        6,
        "ledger claim token",
        include_str!("../../migrations/postgres/0006_ledger_claim_token.sql"),
    ),
    (
        7,
        "phase state",
        include_str!("../../migrations/postgres/0007_phase_state.sql"),
    ),
    (
        8,
        "payment lease",
        include_str!("../../migrations/postgres/0008_payment_lease.sql"),
    ),
    (
        10,
        "retention",
        include_str!("../../migrations/postgres/0010_retention.sql"),
    ),
];

/// The schema version this build migrates `backend` to (its newest migration).
pub fn latest(backend: Backend) -> i64 {
    let set = match backend {
        Backend::Sqlite => SQLITE,
        Backend::MySql => MYSQL,
        Backend::Postgres => POSTGRES,
    };
    set.last().map_or(0, |&(version, _, _)| version)
}

pub(super) async fn run(db: &Db) -> Result<(), DbError> {
    let set = match db.backend() {
        Backend::Sqlite => SQLITE,
        Backend::MySql => MYSQL,
        Backend::Postgres => POSTGRES,
    };
    let migrations = set
        .iter()
        .map(|&(version, description, sql)| {
            Migration::new(
                version,
                Cow::Borrowed(description),
                MigrationType::Simple,
                sql.into_sql_str(),
                false,
            )
        })
        .collect();
    Migrator::with_migrations(migrations).run(db.pool()).await?;
    Ok(())
}
