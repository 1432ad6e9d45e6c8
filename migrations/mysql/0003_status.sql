-- Switchyard on MySQL 8.0+ / MariaDB 10.6+, schema version 3: job status and results.
--
-- One row per message id, written by workers in batches (see queue_core::status): where
-- the job is, its progress, result and last error. Rows of finished jobs are removed by
-- `switchyard prune`. Times are integer microseconds since the epoch.

CREATE TABLE IF NOT EXISTS `switchyard_jobs_status` (
    id               VARCHAR(191) NOT NULL,
    queue            VARCHAR(191) NOT NULL,
    kind             VARCHAR(255) NOT NULL,
    state            VARCHAR(16)  NOT NULL,   -- pending, running, completed, retrying, failed, dead
    attempts         INT          NOT NULL DEFAULT 0,
    progress         SMALLINT     NULL,       -- NULL reads as 0; a write of NULL keeps the old value
    progress_message TEXT         NULL,
    result           LONGTEXT     NULL,       -- JSON as the handler returned it
    last_error       TEXT         NULL,
    runs             INT          NOT NULL DEFAULT 0, -- starts of attempt 1: 1, or more once replayed or published again
    version          BIGINT       NOT NULL DEFAULT 1, -- bumped by every change: followers read changes in order
    created_at       BIGINT       NOT NULL,
    updated_at       BIGINT       NOT NULL,
    finished_at      BIGINT       NULL,       -- set in a final state: completed, failed, dead
    PRIMARY KEY (id),
    -- Pruning and the throughput chart read finished rows by time.
    KEY finished_idx (finished_at),
    -- The dashboard's list of recent jobs.
    KEY updated_idx (updated_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
