-- Every call to the admin API: who (the token's name), what, and how it ended.
CREATE TABLE admin_audit (
    id     BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at_ms  BIGINT NOT NULL,
    actor  VARCHAR(64) NOT NULL,
    method VARCHAR(64) NOT NULL,
    path   TEXT NOT NULL,
    status BIGINT NOT NULL
) ENGINE = InnoDB;
