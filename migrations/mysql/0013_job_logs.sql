-- Switchyard on MySQL 8.0+ / MariaDB 10.6+, schema version 13: job logs.
--
-- A row per job and attempt: the last lines (at most 16 KiB) its handler wrote with
-- `ctx.log`, or its exec command on stderr, kept after the job completes so that
-- `switchyard job ID` and the dashboard show them. `updated_at` is µs since the epoch,
-- by the workers' clocks; `switchyard prune` removes rows older than its window.
CREATE TABLE IF NOT EXISTS `switchyard_jobs_logs` (
    id         VARCHAR(191) NOT NULL,
    attempt    BIGINT       NOT NULL,
    body       MEDIUMTEXT   NOT NULL,
    updated_at BIGINT       NOT NULL,
    PRIMARY KEY (id, attempt)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
