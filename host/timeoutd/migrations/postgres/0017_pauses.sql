-- Pauses (`db::pauses`, docs/operators.md "Pausing a merchant or an order"): an operator holds a
-- merchant's orders, or one order, back from every close and reminder until resumed. One row
-- per paused merchant (`scope` 'merchant', `target` the merchant's id) or order (`scope`
-- 'order', `target` the order's id as text); resuming deletes the row (the admin API's calls
-- and the CLI's are kept in `admin_audit`). A trigger of a paused order is held, not dropped:
-- its outbox row is deferred and comes back when resumed. Additive: older builds of the window
-- ignore it (they do not honour a pause; `timeoutd_schema`'s window is unchanged).
CREATE TABLE pauses (
    scope        TEXT   NOT NULL,
    target       TEXT   NOT NULL,
    paused_at_ms BIGINT NOT NULL,
    paused_by    TEXT   NOT NULL,
    reason       TEXT   NOT NULL,
    PRIMARY KEY (scope, target)
);
