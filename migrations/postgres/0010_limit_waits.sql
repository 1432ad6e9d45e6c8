-- Switchyard on PostgreSQL, schema version 10: jobs parked by a concurrency limit.
--
-- A job that finds every slot of a key taken is parked: its row leaves the claim index
-- (not ready, due only at a late backstop) and a row here names it, oldest first. The
-- release of a slot of that key wakes the oldest waiters (makes their rows due now) in
-- its own transaction, under the key's lock, so a saturated key costs a claim per freed
-- slot, not a claim per waiting job per retry. Times are µs since the epoch.
CREATE TABLE IF NOT EXISTS "switchyard_jobs_waits" (
    queue     text COLLATE "C" NOT NULL,
    limit_key text COLLATE "C" NOT NULL,
    id        text COLLATE "C" NOT NULL, -- the parked job
    since     bigint NOT NULL,           -- when it first parked under the key
    PRIMARY KEY (queue, limit_key, id)
);
CREATE INDEX IF NOT EXISTS switchyard_jobs_wfifo
    ON "switchyard_jobs_waits" (queue, limit_key, since);
