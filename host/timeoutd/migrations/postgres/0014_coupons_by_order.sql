-- A payment marks its order's locked coupon used by the order's id
-- (`UPDATE coupons SET status = 'USED' WHERE order_id = ? AND status = 'LOCKED'`,
-- `db::orders::pay`). Without an index on `order_id` that statement read the whole
-- `coupons` table: in the soak (scripts/soak, 2026-12-06) every payment scanned every coupon
-- ever issued, MariaDB's rows read by full scans grew past a million a second within 20 minutes
-- and lateness p99 went from 0.17 s to 17 s. Additive: older builds of the window ignore it.
CREATE INDEX coupons_order ON coupons (order_id);
