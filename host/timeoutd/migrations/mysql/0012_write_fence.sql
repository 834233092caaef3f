-- The write fence (host/timeoutd/src/db/fence.rs): every write transaction inserts one row
-- with a random token first and deletes it just before its commit, which goes ahead only if
-- the delete found the row. A transaction the server aborted without its error reaching the
-- client has lost its row, so what was sent after the abort is rolled back instead of
-- committing statement by statement. Every row is deleted by the transaction that wrote it:
-- the table stays empty. InnoDB, like every table of timeoutd's (engine.rs checks).
CREATE TABLE write_fence (
    token BIGINT NOT NULL PRIMARY KEY
) ENGINE = InnoDB;
