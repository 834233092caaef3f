-- External effects: the ledger executor's retry schedule and lease, and payments that succeeded
-- after their order was closed.

-- When a PENDING effect may next be attempted (epoch ms; 0 = now), and the executor's lease.
ALTER TABLE effect_ledger ADD COLUMN next_attempt_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE effect_ledger ADD COLUMN claim_until_ms BIGINT NULL;

-- An order closed by timeoutd whose payment nevertheless succeeded (the provider answered
-- "already paid" to close-payment, or a paid callback arrived). One row per order; operators
-- see it, and a refund is raised through the ledger or the case waits for manual review.
CREATE TABLE paid_after_close (
    order_id       VARCHAR(64) NOT NULL PRIMARY KEY,
    merchant_id    VARCHAR(64) NOT NULL,
    payment_ref    VARCHAR(64) NULL,
    source         VARCHAR(16) NOT NULL,   -- close-payment | callback
    resolution     VARCHAR(16) NOT NULL CHECK (resolution IN ('refund', 'manual-review')),
    detected_at_ms BIGINT NOT NULL
) ENGINE = InnoDB;
