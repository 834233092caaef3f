-- Shadow decisions (`db::shadow`, docs/plugins.md "Trying a new policy in the shadow"): a
-- merchant's `[merchants.<id>.shadow]` plugin is asked on exactly the input the live plugin
-- decided (order, context, database clock), off the close's path, and never acts; each row
-- is one comparison: `outcome` agree, differ, trap, timeout, error or refused (the guard would
-- refuse the shadow's answer), `differences` the parts that differ (kind, wait, phase,
-- reminder, effects; comma-separated), both answers as JSON. Retention deletes rows older than
-- `retention.decision_log`. Additive: older builds of the window ignore it.
CREATE TABLE shadow_decisions (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    merchant_id    TEXT    NOT NULL,
    order_id       TEXT    NOT NULL,
    phase          BIGINT  NOT NULL,
    trigger_kind   TEXT    NOT NULL,
    decided_at_ms  BIGINT  NOT NULL,
    outcome        TEXT    NOT NULL,
    differences    TEXT    NOT NULL,
    live           TEXT    NOT NULL,
    shadow         TEXT    NOT NULL,
    shadow_digest  TEXT    NOT NULL,
    latency_us     BIGINT  NOT NULL
);
CREATE INDEX shadow_decisions_merchant ON shadow_decisions (merchant_id, decided_at_ms);
-- Retention deletes by age across merchants.
CREATE INDEX shadow_decisions_decided ON shadow_decisions (decided_at_ms);
