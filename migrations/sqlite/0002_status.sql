-- Switchyard on SQLite, schema version 2: job status and results.
--
-- One row per message id, written by workers in batches (see queue_core::status): where
-- the job is, its progress, result and last error. Rows of finished jobs are removed by
-- `switchyard prune --older-than`. Times are integer microseconds since the Unix epoch.

CREATE TABLE IF NOT EXISTS "switchyard_jobs_status" (
    id               TEXT    PRIMARY KEY NOT NULL,
    queue            TEXT    NOT NULL,
    kind             TEXT    NOT NULL,
    state            TEXT    NOT NULL,  -- pending, running, completed, retrying, failed, dead
    attempts         INTEGER NOT NULL DEFAULT 0,
    progress         INTEGER,           -- NULL reads as 0; a write of NULL keeps the old value
    progress_message TEXT,
    result           TEXT,              -- JSON
    last_error       TEXT,
    runs             INTEGER NOT NULL DEFAULT 0, -- starts of attempt 1: 1, or more once replayed or published again
    version          INTEGER NOT NULL DEFAULT 1, -- bumped by every change: followers read changes in order
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    finished_at      INTEGER            -- set in a final state: completed, failed, dead
);

-- Pruning and the throughput chart read finished rows by time.
CREATE INDEX IF NOT EXISTS "switchyard_jobs_sfin"
    ON "switchyard_jobs_status" (finished_at) WHERE finished_at IS NOT NULL;

-- The dashboard's list of recent jobs.
CREATE INDEX IF NOT EXISTS "switchyard_jobs_supd"
    ON "switchyard_jobs_status" (updated_at);
