-- Switchyard on SQLite, schema version 5: ordering keys.

-- Messages of one queue with the same ordering key are handled one at a time, in
-- publish order. Only the key's oldest message (its head) is ever claimable; the others
-- wait out of the claim index, parked with `visible_at` at the largest integer (never
-- due, never promoted), and the head's ack or dead letter hands the key to the next in
-- the same transaction; SQLite's one writer at a time keeps publishers and hand-overs
-- apart. Dead letters keep the key, so that a replay goes back in line behind it.
ALTER TABLE "switchyard_jobs" ADD COLUMN ordering_key TEXT;
ALTER TABLE "switchyard_jobs_dead" ADD COLUMN ordering_key TEXT;

-- A key's messages in publish order: the head, and its next when the head leaves.
CREATE INDEX IF NOT EXISTS "switchyard_jobs_keys"
    ON "switchyard_jobs" (queue, ordering_key, seq) WHERE ordering_key IS NOT NULL;
