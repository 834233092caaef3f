-- The RocketMQ transport. The outbox relay publishes PENDING rows as delay/timer messages and
-- marks them SENT; a send that fails leaves the row PENDING, counted, and not retried before
-- relay_after_ms (backoff). The outbox timer takes a SENT row back once it is overdue by
-- rocketmq.fallback_after, so the broker is never needed for a close.
ALTER TABLE order_timeout_msg ADD COLUMN relay_attempts BIGINT NOT NULL DEFAULT 0;
ALTER TABLE order_timeout_msg ADD COLUMN relay_after_ms BIGINT NULL;
ALTER TABLE order_timeout_msg ADD COLUMN sent_at_ms BIGINT NULL;
ALTER TABLE order_timeout_msg ADD COLUMN message_id TEXT NULL;

-- A dead-lettered broker message is recorded once, however often it is redelivered: its
-- message id (the broker's unique client id) is unique here; rows from other sources leave it
-- NULL.
ALTER TABLE dead_letter ADD COLUMN message_id TEXT NULL;
CREATE UNIQUE INDEX dead_letter_message ON dead_letter (message_id);
