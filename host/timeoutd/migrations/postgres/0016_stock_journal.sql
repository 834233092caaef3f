-- The stock journal (`[dispatch.stock] mode = "journal"`, `db::stock_journal`): a close appends
-- the units it gives back, one row per SKU per close transaction, instead of updating the SKU's
-- `sku_stock` row, and a fold adds them to `sku_stock` a moment later, one statement per SKU
-- for many closes. A flash sale's closes all give back the same one or few SKUs: with the
-- update in the close, every group close queued for that row lock behind the previous one's
-- commit and behind the order service's creates (docs/performance.md, "one hot SKU"). An
-- insert takes no lock another close waits for. A row is deleted by the fold that adds its
-- units, in the same transaction, so each unit comes back once. Additive: older builds of the
-- window ignore it (and with the mode's default, `direct`, nothing writes it).
CREATE TABLE stock_journal (
    id            BIGSERIAL PRIMARY KEY,
    sku           TEXT   NOT NULL,
    units         BIGINT NOT NULL,
    orders        BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL
);
