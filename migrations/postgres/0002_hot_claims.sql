-- Switchyard on PostgreSQL, schema version 2: claims become HOT updates.
--
-- In version 1 a claim moved its row out of the claim index (ready = false, visible_at =
-- lease end), so every claimed row cost a new heap tuple and an entry in every index:
-- about 16 buffer touches per row, most of the drain's server time. Now a claim writes
-- only columns no index covers (token, lease_until, started, attempts, claimed_at), and
-- with room left on each page PostgreSQL updates the row in place (a heap-only tuple):
-- no index entry is written and the claim index needs no cleanup afterwards.
--
-- A claimed row stays in the claim index with `lease_until` in the future; the claim
-- skips it, and takes it again as soon as its lease has run out (no promotion step).
-- Rows held for long (a heartbeat or a start mark renewed their lease) leave the claim
-- index for the due index, as every claimed row did in version 1, so claims only ever
-- step over the messages that workers hold in their prefetch buffers.
--
-- The upgrade takes an exclusive lock on the table while it rebuilds the claim index
-- (about a second per million queued rows). It gives up after 10 s of waiting for that
-- lock, behind a long transaction say, rather than stall every session queued behind it;
-- the next connect or `switchyard migrate` tries again.

SET LOCAL lock_timeout = '10s';

ALTER TABLE "switchyard_jobs" ADD COLUMN IF NOT EXISTS lease_until timestamptz; -- lease end while reserved

-- Rows leased under version 1 were moved out of the claim index with their lease end in
-- visible_at.
UPDATE "switchyard_jobs" SET lease_until = visible_at WHERE token IS NOT NULL AND NOT ready;

-- A worker of version 1 still running against this table would claim rows that
-- version-2 workers hold, because it knows nothing of lease_until. Renaming a column its
-- claims write makes them fail loudly instead (its publishes and acks still work), until
-- it is stopped or upgraded.
ALTER TABLE "switchyard_jobs" RENAME COLUMN reserved_at TO claimed_at;

-- Inserts leave 60% of each page free for the claimed versions of its rows (a claim
-- writes some 40 bytes more per row: token, lease end, claimed_at); without room on the
-- same page an update cannot be heap-only. Queue rows are short-lived, so the space is
-- reused as soon as they are acknowledged.
ALTER TABLE "switchyard_jobs" SET (fillfactor = 40);

-- Ids and queue names are compared byte for byte: under a linguistic collation (a
-- database created with en_US.UTF-8, say) every comparison in the id and claim indexes
-- would call the locale's strcoll. Both are identifiers, so byte order is also the
-- right order. The indexes on them are rebuilt.
ALTER TABLE "switchyard_jobs"
    ALTER COLUMN id TYPE text COLLATE "C",
    ALTER COLUMN queue TYPE text COLLATE "C";
ALTER TABLE "switchyard_jobs_dead"
    ALTER COLUMN id TYPE text COLLATE "C",
    ALTER COLUMN queue TYPE text COLLATE "C";

-- Claim order is now the due time, which a claim never changes (a lease runs in
-- lease_until): a message whose lease lapsed is taken again from its place in line.
DROP INDEX IF EXISTS "switchyard_jobs_claim";
CREATE INDEX IF NOT EXISTS switchyard_jobs_claim
    ON "switchyard_jobs" (queue, priority DESC, available_at, seq) WHERE ready;
