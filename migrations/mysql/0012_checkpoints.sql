-- Switchyard on MySQL 8.0+ / MariaDB 10.6+, schema version 12: checkpoints.
--
-- A row per job that stored a checkpoint: a small JSON cursor its next delivery resumes
-- from. A worker writes it only while its lease token is still the job row's (an
-- INSERT … SELECT from that row), removes it once the job completes, and keeps it when
-- the job is dead-lettered, so that a replay resumes. `updated_at` is µs since the
-- epoch, by the workers' clocks; `switchyard prune` removes rows older than its window.
CREATE TABLE IF NOT EXISTS `switchyard_jobs_ckpt` (
    id         VARCHAR(191) NOT NULL PRIMARY KEY,
    value      MEDIUMTEXT   NOT NULL,
    updated_at BIGINT       NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
