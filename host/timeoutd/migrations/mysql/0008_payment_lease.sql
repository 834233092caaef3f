-- Seed 002's aggregated payment: a payment attempt holds a short lease on its PENDING order
-- (`POST /v1/orders/{id}/payment-attempts`), and the close's compare-and-set waits for it to
-- lapse, so nobody pays into a closed order. NULL: no attempt in progress.
ALTER TABLE orders ADD COLUMN payment_lease_until_ms BIGINT NULL;
