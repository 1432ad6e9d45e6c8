-- Switchyard on MySQL 8.0+ / MariaDB 10.6+, schema version 9: paused queues and
-- cancelled jobs.
--
-- An operator's controls, read by every worker four times a second: a row per paused
-- queue (kind '') or paused kind of a queue, and a row per job marked cancelled until a
-- worker ends it `cancelled` (a job not started is then never run; a running one has
-- its handler cancelled). Times are µs since the epoch, by the server's clock.
CREATE TABLE IF NOT EXISTS `switchyard_jobs_paused` (
    queue     VARCHAR(191) NOT NULL,
    kind      VARCHAR(255) NOT NULL,  -- '': the whole queue
    paused_at BIGINT       NOT NULL,
    PRIMARY KEY (queue, kind)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TABLE IF NOT EXISTS `switchyard_jobs_cancel` (
    id        VARCHAR(64) NOT NULL PRIMARY KEY,
    marked_at BIGINT      NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
