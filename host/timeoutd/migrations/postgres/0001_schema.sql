-- timeoutd canonical schema, PostgreSQL dialect. Times are epoch milliseconds (*_ms), money is cents.

-- Orders as the order service writes them; timeoutd only ever moves PENDING -> CLOSED (one
-- compare-and-set) and fills the close columns.
CREATE TABLE orders (
    id            TEXT    NOT NULL PRIMARY KEY,
    merchant_id   TEXT    NOT NULL,
    user_id       TEXT    NOT NULL,
    status        TEXT    NOT NULL CHECK (status IN ('PENDING', 'PAID', 'CLOSED')),
    created_at_ms BIGINT  NOT NULL,
    deadline_ms   BIGINT  NOT NULL,
    total_cents   BIGINT  NOT NULL,
    coupon_id     TEXT    NULL,
    activity_id   TEXT    NULL,
    payment_ref   TEXT    NULL,
    paid_at_ms    BIGINT  NULL,
    closed_at_ms  BIGINT  NULL,
    close_due_ms  BIGINT  NULL,   -- when the close was due (deadline or the closing phase's due)
    closed_by     TEXT    NULL,   -- trigger kind that closed it
    close_reason  TEXT    NULL
);
-- The sweep and the overdue-but-open gauge read open orders by deadline.
CREATE INDEX orders_status_deadline ON orders (status, deadline_ms);

CREATE TABLE order_items (
    order_id         TEXT   NOT NULL,
    line_no          BIGINT NOT NULL,
    sku              TEXT   NOT NULL,
    quantity         BIGINT NOT NULL CHECK (quantity > 0),
    unit_price_cents BIGINT NOT NULL,
    PRIMARY KEY (order_id, line_no)
);

-- Creating an order subtracts from `available`; closing one gives the units back.
CREATE TABLE sku_stock (
    sku       TEXT   NOT NULL PRIMARY KEY,
    available BIGINT NOT NULL
);

CREATE TABLE coupons (
    id       TEXT NOT NULL PRIMARY KEY,
    user_id  TEXT NOT NULL,
    status   TEXT NOT NULL CHECK (status IN ('AVAILABLE', 'LOCKED', 'USED')),
    order_id TEXT NULL
);

-- The local message table (outbox). The order service inserts phase 0, due at the deadline, in
-- the transaction that creates the order; `wait` decisions add later phases; the sweep re-arms
-- orders whose rows were lost. `claim_token`/`claim_until_ms` are the outbox timer's lease.
CREATE TABLE order_timeout_msg (
    id              BIGSERIAL PRIMARY KEY,
    order_id        TEXT   NOT NULL,
    due_ms          BIGINT NOT NULL,
    phase           BIGINT NOT NULL DEFAULT 0,
    status          TEXT   NOT NULL DEFAULT 'PENDING' CHECK (status IN ('PENDING', 'SENT', 'PROCESSED')),
    attempts        BIGINT NOT NULL DEFAULT 0,
    last_error      TEXT   NULL,
    source          TEXT   NOT NULL DEFAULT 'order-service',
    claim_token     TEXT   NULL,
    claim_until_ms  BIGINT NULL,
    processed_at_ms BIGINT NULL,
    UNIQUE (order_id, phase)
);
CREATE INDEX order_timeout_msg_status_due ON order_timeout_msg (status, due_ms);

-- One row per effect of a decision. The idempotency key is derived from the trigger and the
-- decision only (merchant, order, phase, effect index), never from wall time.
CREATE TABLE effect_ledger (
    id              BIGSERIAL PRIMARY KEY,
    idempotency_key TEXT   NOT NULL UNIQUE,
    order_id        TEXT   NOT NULL,
    merchant_id     TEXT   NOT NULL,
    phase           BIGINT NOT NULL,
    effect_index    BIGINT NOT NULL,
    kind            TEXT   NOT NULL,
    payload         TEXT   NOT NULL,
    status          TEXT   NOT NULL CHECK (status IN ('PENDING', 'DONE', 'FAILED')),
    attempts        BIGINT NOT NULL DEFAULT 0,
    last_error      TEXT   NULL,
    created_at_ms   BIGINT NOT NULL,
    updated_at_ms   BIGINT NOT NULL,
    UNIQUE (order_id, phase, effect_index)
);
CREATE INDEX effect_ledger_status ON effect_ledger (status, id);

-- Every plugin decision and what the host made of it.
CREATE TABLE decision_log (
    id            BIGSERIAL PRIMARY KEY,
    order_id      TEXT   NOT NULL,
    merchant_id   TEXT   NOT NULL,
    plugin        TEXT   NOT NULL,
    plugin_digest TEXT   NOT NULL,
    trigger_kind  TEXT   NOT NULL,
    phase         BIGINT NOT NULL,
    attempt       BIGINT NOT NULL,
    decision      TEXT   NOT NULL,
    outcome       TEXT   NOT NULL,
    detail        TEXT   NOT NULL,
    latency_us    BIGINT NOT NULL,
    decided_at_ms BIGINT NOT NULL
);
CREATE INDEX decision_log_order ON decision_log (order_id);

-- Triggers that can never succeed as they are, with the reason; nothing is dropped.
CREATE TABLE dead_letter (
    id            BIGSERIAL PRIMARY KEY,
    source        TEXT   NOT NULL,
    order_id      TEXT   NULL,
    reason        TEXT   NOT NULL,
    payload       TEXT   NOT NULL,
    attempts      BIGINT NOT NULL,
    status        TEXT   NOT NULL CHECK (status IN ('OPEN', 'REDRIVEN', 'DISMISSED')),
    created_at_ms BIGINT NOT NULL
);
CREATE INDEX dead_letter_order ON dead_letter (order_id, status);
