-- Switchyard on PostgreSQL, schema version 8: limits.
--
-- Workers declare limits (at most N running, at most N starts per period) per queue,
-- kind or key; these two tables are what every worker shares to keep them. One row per
-- queue and key, locked (`SELECT … FOR UPDATE`) while a starting job takes a slot or a
-- token, holding the key's token bucket and the limits a worker last declared for it.
-- One row per job holding a slot, naming its lease's token and counting while
-- `held_until` is ahead (the heartbeat renews it; the ack, release or dead letter of that
-- lease deletes it; a dead worker's runs out with its lease), or per job booked a later
-- start by an empty bucket (no token; `run_at`). Times are µs since the epoch, by the
-- server's clock. Jobs without limits never touch these tables.
CREATE TABLE IF NOT EXISTS "switchyard_jobs_limits" (
    queue           text COLLATE "C" NOT NULL,
    limit_key       text COLLATE "C" NOT NULL,
    concurrency     integer,          -- as last declared
    rate_per_second double precision, -- as last declared
    tokens          double precision, -- the bucket; NULL: never used (full)
    refilled_at     bigint NOT NULL,  -- when the bucket was last refilled
    PRIMARY KEY (queue, limit_key)
);
CREATE TABLE IF NOT EXISTS "switchyard_jobs_holds" (
    queue      text COLLATE "C" NOT NULL,
    limit_key  text COLLATE "C" NOT NULL,
    id         text COLLATE "C" NOT NULL, -- the job
    token      text COLLATE "C",          -- the lease holding a slot; NULL: a booked start
    run_at     bigint,                    -- a booked start's time
    held_until bigint NOT NULL,           -- counts until then
    PRIMARY KEY (queue, limit_key, id)
);
CREATE INDEX IF NOT EXISTS switchyard_jobs_hjob
    ON "switchyard_jobs_holds" (queue, id);
