-- Switchyard on SQLite, schema version 7: limits.
--
-- Workers declare limits (at most N running, at most N starts per period) per queue,
-- kind or key; these two tables are what every worker shares to keep them. One row per
-- queue and key, holding the key's token bucket and the limits a worker last declared
-- for it; a starting job takes a slot or a token under SQLite's write lock. One row per
-- job holding a slot, naming its lease's token and counting while `held_until` is ahead
-- (the heartbeat renews it; the ack, release or dead letter of that lease deletes it; a
-- dead worker's runs out with its lease), or per job booked a later start by an empty
-- bucket (no token; `run_at`). Times are µs since the epoch. Jobs without limits never
-- touch these tables.
CREATE TABLE IF NOT EXISTS "switchyard_jobs_limits" (
    queue           TEXT    NOT NULL,
    limit_key       TEXT    NOT NULL,
    concurrency     INTEGER,          -- as last declared
    rate_per_second REAL,             -- as last declared
    tokens          REAL,             -- the bucket; NULL: never used (full)
    refilled_at     INTEGER NOT NULL,
    PRIMARY KEY (queue, limit_key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS "switchyard_jobs_holds" (
    queue      TEXT    NOT NULL,
    limit_key  TEXT    NOT NULL,
    id         TEXT    NOT NULL,  -- the job
    token      TEXT,              -- the lease holding a slot; NULL: a booked start
    run_at     INTEGER,           -- a booked start's time
    held_until INTEGER NOT NULL,  -- counts until then
    PRIMARY KEY (queue, limit_key, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS "switchyard_jobs_hjob"
    ON "switchyard_jobs_holds" (queue, id);
