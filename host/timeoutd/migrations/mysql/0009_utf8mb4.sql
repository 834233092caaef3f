-- Text is utf8mb4 whatever the database's default: on a database created latin1 (a common
-- default) a close whose reason was `超时未支付⏰` failed with error 1366, was retried and
-- dead-lettered, and the order stayed PENDING with its stock held. utf8mb4_bin stores CJK and
-- emoji exactly and compares ids byte for byte. (A one-time rebuild of each table.)
ALTER DATABASE CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
ALTER TABLE orders CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
ALTER TABLE order_items CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
ALTER TABLE sku_stock CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
ALTER TABLE coupons CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
ALTER TABLE order_timeout_msg CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
ALTER TABLE effect_ledger CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
ALTER TABLE decision_log CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
ALTER TABLE dead_letter CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
ALTER TABLE paid_after_close CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
ALTER TABLE admin_audit CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
