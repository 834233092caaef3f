-- Shadow decisions (`db::shadow`, docs/plugins.md "Trying a new policy in the shadow"): a
-- merchant's `[merchants.<id>.shadow]` plugin is asked on exactly the input the live plugin
-- decided (order, context, database clock), off the close's path, and never acts; each row
-- is one comparison: `outcome` agree, differ, trap, timeout, error or refused (the guard would
-- refuse the shadow's answer), `differences` the parts that differ (kind, wait, phase,
-- reminder, effects; comma-separated), both answers as JSON. Retention deletes rows older than
-- `retention.decision_log`. Additive: older builds of the window ignore it.
CREATE TABLE shadow_decisions (
    id             BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    merchant_id    VARCHAR(64)  NOT NULL,
    order_id       VARCHAR(64)  NOT NULL,
    phase          BIGINT       NOT NULL,
    trigger_kind   VARCHAR(32)  NOT NULL,
    decided_at_ms  BIGINT       NOT NULL,
    outcome        VARCHAR(16)  NOT NULL,
    differences    VARCHAR(128) NOT NULL,
    live           TEXT         NOT NULL,
    shadow         TEXT         NOT NULL,
    shadow_digest  VARCHAR(80)  NOT NULL,
    latency_us     BIGINT       NOT NULL,
    KEY shadow_decisions_merchant (merchant_id, decided_at_ms),
    KEY shadow_decisions_decided (decided_at_ms)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
