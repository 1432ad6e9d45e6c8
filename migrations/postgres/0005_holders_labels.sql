-- Switchyard on PostgreSQL, schema version 5: who holds a message, and labels.

-- The holder a claim records (`host:pid`, then `/name` for a named worker), for
-- `stats --held`, `switchyard job` and the dashboard. No index covers it, so a claim
-- stays a heap-only update.
ALTER TABLE "switchyard_jobs" ADD COLUMN IF NOT EXISTS claimed_by text;

-- A message's labels as `,a,b,` (NULL for none): a claim that selects labels looks for
-- `,a,` in it while it walks the claim index in delivery order. Dead letters keep them,
-- so that a replayed message is still selected by its labels.
ALTER TABLE "switchyard_jobs" ADD COLUMN IF NOT EXISTS labels text COLLATE "C";
ALTER TABLE "switchyard_jobs_dead" ADD COLUMN IF NOT EXISTS labels text COLLATE "C";
