-- Payment leases of orders in a shop's own tables (schema profiles, docs/adoption.md). Schema
-- profiles run on MariaDB/MySQL only in this version; the table is here too so that every
-- backend has the same tables and retention's rules (`retention.payment_leases`) hold on each.
CREATE TABLE payment_leases (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    order_id TEXT    NOT NULL,
    until_ms INTEGER NOT NULL
);
CREATE UNIQUE INDEX payment_leases_order ON payment_leases (order_id);
CREATE INDEX payment_leases_until ON payment_leases (until_ms);
