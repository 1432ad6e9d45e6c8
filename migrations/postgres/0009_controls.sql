-- Switchyard on PostgreSQL, schema version 9: paused queues and cancelled jobs.
--
-- An operator's controls, read by every worker four times a second: a row per paused
-- queue (kind '') or paused kind of a queue, and a row per job marked cancelled until a
-- worker ends it `cancelled` (a job not started is then never run; a running one has
-- its handler cancelled). Times are µs since the epoch, by the server's clock.
CREATE TABLE IF NOT EXISTS "switchyard_jobs_paused" (
    queue     text COLLATE "C" NOT NULL,
    kind      text COLLATE "C" NOT NULL,  -- '': the whole queue
    paused_at bigint NOT NULL,
    PRIMARY KEY (queue, kind)
);
CREATE TABLE IF NOT EXISTS "switchyard_jobs_cancel" (
    id        text COLLATE "C" NOT NULL PRIMARY KEY,
    marked_at bigint NOT NULL
);
