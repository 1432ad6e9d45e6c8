-- Switchyard on MySQL 8.0+ / MariaDB 10.6+, schema version 4: what the dashboard and
-- `switchyard job` show beyond a job's state. Times are integer microseconds since the
-- epoch.

-- The payload as published or first run (at most 16 KiB of it), the worker of the
-- latest attempt (host:pid), and when that attempt started. The dashboard's lists by
-- queue and state read the updated_at index newest first and filter: no index of their
-- own, which every status write would pay for.
ALTER TABLE `switchyard_jobs_status`
    ADD COLUMN payload    MEDIUMTEXT   NULL,
    ADD COLUMN worker     VARCHAR(255) NULL,
    ADD COLUMN started_at BIGINT       NULL;

-- Attempts that ended without success, one row each (the attempt that completed, or
-- runs now, is the status row itself). Pruned with the status rows.
CREATE TABLE IF NOT EXISTS `switchyard_jobs_tries` (
    id         VARCHAR(191) NOT NULL,
    attempt    INT          NOT NULL,
    state      VARCHAR(16)  NOT NULL,   -- retrying, failed, dead
    error      TEXT         NULL,
    worker     VARCHAR(255) NULL,
    started_at BIGINT       NULL,
    ended_at   BIGINT       NOT NULL,
    PRIMARY KEY (id, attempt),
    KEY ended_idx (ended_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Running workers, as they report themselves (a heartbeat every 5 s; a row not heard
-- from for 30 s is a worker gone).
CREATE TABLE IF NOT EXISTS `switchyard_jobs_procs` (
    id           VARCHAR(64)  NOT NULL,
    host         VARCHAR(255) NOT NULL,
    pid          BIGINT       NOT NULL,
    queue        VARCHAR(191) NOT NULL,
    concurrency  INT          NOT NULL,
    started_at   BIGINT       NOT NULL,
    heartbeat_at BIGINT       NOT NULL,
    jobs_done    BIGINT       NOT NULL DEFAULT 0,
    PRIMARY KEY (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
