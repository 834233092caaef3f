-- What each plugin call was given and what it answered, so `timeoutd plugin replay` can re-run a
-- new plugin version on exactly the same input: `input` is JSON {"order": …, "context": …}
-- (the order as loaded, the context with the merchant's settings), `answer` is the plugin's
-- decision as JSON ({"decision": "wait" | "cancel" | "ignore", …}) or {"error": "…"}.
-- NULL in rows written before this migration.
ALTER TABLE decision_log ADD COLUMN input TEXT NULL;
ALTER TABLE decision_log ADD COLUMN answer TEXT NULL;
