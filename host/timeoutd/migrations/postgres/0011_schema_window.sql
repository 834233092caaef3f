-- The compatibility window (host/timeoutd/src/db/migrate.rs): one row, written by the newest
-- build that migrated this database. `version` is its schema version; `compatible_from` the
-- oldest schema version a build may have as its newest and still run here (every migration
-- after it is additive). An older build inside the window starts without migrating; one outside
-- it refuses with one line naming both versions. Builds before this migration do not read it.
CREATE TABLE timeoutd_schema (
    id              INTEGER      NOT NULL PRIMARY KEY,
    version         BIGINT       NOT NULL,
    compatible_from BIGINT       NOT NULL,
    written_by      VARCHAR(255) NOT NULL,
    updated_at_ms   BIGINT       NOT NULL
);
INSERT INTO timeoutd_schema (id, version, compatible_from, written_by, updated_at_ms)
VALUES (1, 11, 11, 'migration 0011', 0);
