-- The effect executor finds the rows it claimed by their claim token
-- (`SELECT id FROM effect_ledger WHERE claim_token = ? AND status = 'PENDING'`) and renews
-- their lease the same way (`UPDATE effect_ledger SET claim_until_ms = ? WHERE claim_token = ?
-- AND status = 'PENDING'`, `db::ledger`). With no index on `claim_token` they went through
-- `effect_ledger_status`, fine while few rows are PENDING; in the soak of 2026-12-07 (150
-- orders/s) a backlog of 48,000 PENDING effects among 335,000 rows made MariaDB's optimizer
-- read the whole ledger instead, 7 times a second (2 million rows/s read by full scans at
-- minute 24, the machine 98 % busy): each scan slowed the executor, which grew the backlog,
-- which made the next scan certain. The backlog gauge's count of PENDING effects and their
-- oldest `created_at_ms` (`db::backlog::LEDGER_PENDING`) scanned the same way; its index
-- holds both columns, so the count reads the index alone. Additive: older builds of the
-- window ignore them.
CREATE INDEX effect_ledger_claim ON effect_ledger (claim_token);
CREATE INDEX effect_ledger_status_created ON effect_ledger (status, created_at_ms);
