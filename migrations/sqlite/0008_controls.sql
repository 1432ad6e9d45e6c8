-- Switchyard on SQLite, schema version 8: paused queues and cancelled jobs.
--
-- An operator's controls, read by every worker four times a second: a row per paused
-- queue (kind '') or paused kind of a queue, and a row per job marked cancelled until a
-- worker ends it `cancelled` (a job not started is then never run; a running one has
-- its handler cancelled). Times are µs since the epoch.
CREATE TABLE IF NOT EXISTS "switchyard_jobs_paused" (
    queue     TEXT    NOT NULL,
    kind      TEXT    NOT NULL,  -- '': the whole queue
    paused_at INTEGER NOT NULL,
    PRIMARY KEY (queue, kind)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS "switchyard_jobs_cancel" (
    id        TEXT    NOT NULL PRIMARY KEY,
    marked_at INTEGER NOT NULL
) WITHOUT ROWID;
