-- Switchyard on MySQL 8.0+ / MariaDB 10.6+, schema version 8: limits.
--
-- Workers declare limits (at most N running, at most N starts per period) per queue,
-- kind or key; these two tables are what every worker shares to keep them. One row per
-- queue and key, locked (a locking read) while a starting job takes a slot or a token,
-- holding the key's token bucket and the limits a worker last declared for it. One row
-- per job holding a slot, naming its lease's token and counting while `held_until` is
-- ahead (the heartbeat renews it; the ack, release or dead letter of that lease deletes
-- it; a dead worker's runs out with its lease), or per job booked a later start by an
-- empty bucket (no token; `run_at`). Times are µs since the epoch, by the server's
-- clock. Jobs without limits never touch these tables.
CREATE TABLE IF NOT EXISTS `switchyard_jobs_limits` (
    queue           VARCHAR(191) NOT NULL,
    limit_key       VARCHAR(191) NOT NULL,
    concurrency     INT          NULL,  -- as last declared
    rate_per_second DOUBLE       NULL,  -- as last declared
    tokens          DOUBLE       NULL,  -- the bucket; NULL: never used (full)
    refilled_at     BIGINT       NOT NULL,
    PRIMARY KEY (queue, limit_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE TABLE IF NOT EXISTS `switchyard_jobs_holds` (
    queue      VARCHAR(191) NOT NULL,
    limit_key  VARCHAR(191) NOT NULL,
    id         VARCHAR(64)  NOT NULL,  -- the job
    token      VARCHAR(64)  NULL,      -- the lease holding a slot; NULL: a booked start
    run_at     BIGINT       NULL,      -- a booked start's time
    held_until BIGINT       NOT NULL,  -- counts until then
    PRIMARY KEY (queue, limit_key, id),
    KEY by_job (queue, id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
