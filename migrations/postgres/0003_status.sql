-- Switchyard on PostgreSQL, schema version 3: job status and results.
--
-- One row per message id, written by workers in batches (see queue_core::status): where
-- the job is, its progress, result and last error. Every change is announced with
-- NOTIFY on the channel `<table>_status`, so that `publish --wait` and the dashboard's
-- followers wake at once. Rows of finished jobs are removed by `switchyard prune`.

CREATE TABLE IF NOT EXISTS "switchyard_jobs_status" (
    id               text COLLATE "C" PRIMARY KEY,
    queue            text COLLATE "C" NOT NULL,
    kind             text        NOT NULL,
    state            text        NOT NULL,  -- pending, running, completed, retrying, failed, dead
    attempts         integer     NOT NULL DEFAULT 0,
    progress         smallint,              -- NULL reads as 0; a write of NULL keeps the old value
    progress_message text,
    result           text,                  -- JSON as the handler returned it
    last_error       text,
    runs             integer     NOT NULL DEFAULT 0, -- starts of attempt 1: 1, or more once replayed or published again
    version          bigint      NOT NULL DEFAULT 1, -- bumped by every change: followers read changes in order
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    finished_at      timestamptz            -- set in a final state: completed, failed, dead
);

-- Each job's row is rewritten a few times in a few seconds, so vacuum must keep up.
-- The room left on each page was meant to keep those updates heap-only; they never are,
-- as every write changes updated_at, which is indexed (0 of 1,000 updates were HOT,
-- 2026-11-28). The fill factor stays until an A/B shows what changing it is worth.
ALTER TABLE "switchyard_jobs_status" SET (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);

-- Pruning and the throughput chart read finished rows by time.
CREATE INDEX IF NOT EXISTS switchyard_jobs_sfin
    ON "switchyard_jobs_status" (finished_at) WHERE finished_at IS NOT NULL;

-- The dashboard's list of recent jobs.
CREATE INDEX IF NOT EXISTS switchyard_jobs_supd
    ON "switchyard_jobs_status" (updated_at);
