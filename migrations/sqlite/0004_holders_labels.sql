-- Switchyard on SQLite, schema version 4: who holds a message, and labels.

-- The holder a claim records (`host:pid`, then `/name` for a named worker), for
-- `stats --held`, `switchyard job` and the dashboard.
ALTER TABLE "switchyard_jobs" ADD COLUMN claimed_by TEXT;

-- A message's labels as `,a,b,` (NULL for none): a claim that selects labels looks for
-- `,a,` in it while it walks the claim index in delivery order. Dead letters keep them,
-- so that a replayed message is still selected by its labels.
ALTER TABLE "switchyard_jobs" ADD COLUMN labels TEXT;
ALTER TABLE "switchyard_jobs_dead" ADD COLUMN labels TEXT;
