-- Switchyard on PostgreSQL, schema version 6: ordering keys.

-- Messages of one queue with the same ordering key are handled one at a time, in
-- publish order. Only the key's oldest message (its head) is ever claimable; the others
-- wait out of the claim index with `visible_at = 'infinity'` (never due, never
-- promoted), and the head's ack or dead letter hands the key to the next in the same
-- transaction. Publishers and those hand-overs of one key are serialised by a
-- transaction-scoped advisory lock on the key. Dead letters keep the key, so that a
-- replay goes back in line behind the key's messages.
ALTER TABLE "switchyard_jobs" ADD COLUMN IF NOT EXISTS ordering_key text COLLATE "C";
ALTER TABLE "switchyard_jobs_dead" ADD COLUMN IF NOT EXISTS ordering_key text COLLATE "C";

-- A key's messages in publish order: the head, and its next when the head leaves.
CREATE INDEX IF NOT EXISTS switchyard_jobs_keys
    ON "switchyard_jobs" (queue, ordering_key, seq) WHERE ordering_key IS NOT NULL;
