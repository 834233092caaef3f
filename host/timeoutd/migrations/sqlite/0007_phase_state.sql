-- Policy API 0.2.0: the state a `wait` hands to its next phase (hex of at most 1024 bytes;
-- NULL for none), and when the daemon first looked at a row that was not yet due
-- (`seen_at_ms`, NULL until then): a 0.2.0 plugin is asked as soon as its order's phase-0 row
-- is seen, so its first phase can come before the deadline. Only phase-0 rows (the order
-- service's) are looked at early; later phases were timed by the plugin itself.
ALTER TABLE order_timeout_msg ADD COLUMN state TEXT NULL;
ALTER TABLE order_timeout_msg ADD COLUMN seen_at_ms BIGINT NULL;
CREATE INDEX order_timeout_msg_unseen ON order_timeout_msg (seen_at_ms, phase, status);
