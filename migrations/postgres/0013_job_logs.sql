-- Switchyard on PostgreSQL, schema version 13: job logs.
--
-- A row per job and attempt: the last lines (at most 16 KiB) its handler wrote with
-- `ctx.log`, or its exec command on stderr, kept after the job completes so that
-- `switchyard job ID` and the dashboard show them. `updated_at` is µs since the epoch,
-- by the workers' clocks; `switchyard prune` removes rows older than its window.
CREATE TABLE IF NOT EXISTS "switchyard_jobs_logs" (
    id         text COLLATE "C" NOT NULL,
    attempt    bigint  NOT NULL,
    body       text    NOT NULL,
    updated_at bigint  NOT NULL,
    PRIMARY KEY (id, attempt)
);
