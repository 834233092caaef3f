-- Payment leases of orders in a shop's own tables (schema profiles, docs/adoption.md). A shop's
-- order table has no column for the lease that timeoutd's own `orders.payment_lease_until_ms`
-- holds (migration 8), so a payment attempt on a mapped order (`POST /v1/orders/{id}/
-- payment-attempts`) writes its lease here, keyed by the order's id as text, while it holds the
-- shop's order row locked; the close reads it with a locking read under the same row lock
-- (host/timeoutd/src/db/shop/mapped/lease.rs). `id` is the row's own, for retention's batches,
-- which delete lapsed leases (`retention.payment_leases`).
CREATE TABLE payment_leases (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    order_id VARCHAR(64) NOT NULL,
    until_ms BIGINT NOT NULL,
    UNIQUE KEY payment_leases_order (order_id),
    KEY payment_leases_until (until_ms)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
