-- The ledger executor claims a chunk of PENDING effects in one statement and reads back which
-- rows it got by this token (as the outbox timer does with order_timeout_msg.claim_token).
ALTER TABLE effect_ledger ADD COLUMN claim_token TEXT NULL;
