-- Retention (tables that only grow): the daemon deletes what is settled and old, in bounded
-- batches, one daemon at a time. `maintenance_lease` is that one daemon's lease; the indexes let
-- each table's old rows be found without a scan of the young ones.
CREATE TABLE maintenance_lease (
    name     VARCHAR(64)  NOT NULL PRIMARY KEY,
    holder   VARCHAR(128) NOT NULL,
    until_ms BIGINT       NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE INDEX decision_log_decided ON decision_log (decided_at_ms);
CREATE INDEX effect_ledger_status_updated ON effect_ledger (status, updated_at_ms);
CREATE INDEX order_timeout_msg_status_processed ON order_timeout_msg (status, processed_at_ms);
-- A claim reads its rows back by token, and a holder renews its lease by token: without this
-- index each of those read the whole table (10^6 PROCESSED rows of history made a 10,000-order
-- burst close at a sixth of its rate).
CREATE INDEX order_timeout_msg_claim ON order_timeout_msg (claim_token);
