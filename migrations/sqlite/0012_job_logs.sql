-- Switchyard on SQLite, schema version 12: job logs.
--
-- A row per job and attempt: the last lines (at most 16 KiB) its handler wrote with
-- `ctx.log`, or its exec command on stderr, kept after the job completes so that
-- `switchyard job ID` and the dashboard show them. `updated_at` is µs since the epoch,
-- by the workers' clocks; `switchyard prune` removes rows older than its window.
CREATE TABLE IF NOT EXISTS "switchyard_jobs_logs" (
    id         TEXT    NOT NULL,
    attempt    INTEGER NOT NULL,
    body       TEXT    NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (id, attempt)
) WITHOUT ROWID;
