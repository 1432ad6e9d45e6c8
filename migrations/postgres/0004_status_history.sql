-- Switchyard on PostgreSQL, schema version 4: what the dashboard and `switchyard job`
-- show beyond a job's state.

-- The payload as published or first run (at most 16 KiB of it), the worker of the
-- latest attempt (host:pid), and when that attempt started.
ALTER TABLE "switchyard_jobs_status" ADD COLUMN IF NOT EXISTS payload text;
ALTER TABLE "switchyard_jobs_status" ADD COLUMN IF NOT EXISTS worker text;
ALTER TABLE "switchyard_jobs_status" ADD COLUMN IF NOT EXISTS started_at timestamptz;

-- The dashboard's lists by queue and state read the updated_at index newest first and
-- filter: no index of their own, which every status write would pay for.

-- Attempts that ended without success, one row each (the attempt that completed, or
-- runs now, is the status row itself). Pruned with the status rows.
CREATE TABLE IF NOT EXISTS "switchyard_jobs_tries" (
    id         text COLLATE "C" NOT NULL,
    attempt    integer     NOT NULL,
    state      text        NOT NULL,  -- retrying, failed, dead
    error      text,
    worker     text,
    started_at timestamptz,
    ended_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, attempt)
);

-- Running workers, as they report themselves (a heartbeat every 5 s; a row not heard
-- from for 30 s is a worker gone).
CREATE TABLE IF NOT EXISTS "switchyard_jobs_procs" (
    id           text        PRIMARY KEY,
    host         text        NOT NULL,
    pid          integer     NOT NULL,
    queue        text        NOT NULL,
    concurrency  integer     NOT NULL,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    jobs_done    bigint      NOT NULL DEFAULT 0
);
