-- Every call to the admin API: who (the token's name), what, and how it ended.
CREATE TABLE admin_audit (
    id     BIGSERIAL PRIMARY KEY,
    at_ms  BIGINT NOT NULL,
    actor  TEXT NOT NULL,
    method TEXT NOT NULL,
    path   TEXT NOT NULL,
    status BIGINT NOT NULL
);
