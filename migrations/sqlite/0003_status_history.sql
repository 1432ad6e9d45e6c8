-- Switchyard on SQLite, schema version 3: what the dashboard and `switchyard job` show
-- beyond a job's state. Times are integer microseconds since the Unix epoch.

-- The payload as published or first run (at most 16 KiB of it), the worker of the
-- latest attempt (host:pid), and when that attempt started.
ALTER TABLE "switchyard_jobs_status" ADD COLUMN payload TEXT;
ALTER TABLE "switchyard_jobs_status" ADD COLUMN worker TEXT;
ALTER TABLE "switchyard_jobs_status" ADD COLUMN started_at INTEGER;

-- The dashboard's lists by queue and state read the updated_at index newest first and
-- filter: no index of their own, which every status write would pay for.

-- Attempts that ended without success, one row each (the attempt that completed, or
-- runs now, is the status row itself). Pruned with the status rows.
CREATE TABLE IF NOT EXISTS "switchyard_jobs_tries" (
    id         TEXT    NOT NULL,
    attempt    INTEGER NOT NULL,
    state      TEXT    NOT NULL,  -- retrying, failed, dead
    error      TEXT,
    worker     TEXT,
    started_at INTEGER,
    ended_at   INTEGER NOT NULL,
    PRIMARY KEY (id, attempt)
);

-- Running workers, as they report themselves (a heartbeat every 5 s; a row not heard
-- from for 30 s is a worker gone).
CREATE TABLE IF NOT EXISTS "switchyard_jobs_procs" (
    id           TEXT    PRIMARY KEY NOT NULL,
    host         TEXT    NOT NULL,
    pid          INTEGER NOT NULL,
    queue        TEXT    NOT NULL,
    concurrency  INTEGER NOT NULL,
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    jobs_done    INTEGER NOT NULL DEFAULT 0
);
