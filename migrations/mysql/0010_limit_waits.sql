-- Switchyard on MySQL/MariaDB, schema version 10: jobs parked by a concurrency limit.
--
-- A job that finds every slot of a key taken is parked: its row leaves the claim index
-- (not ready, due only at a late backstop) and a row here names it, oldest first. The
-- release of a slot of that key wakes the oldest waiters (makes their rows due now) in
-- its own transaction, under the key's lock, so a saturated key costs a claim per freed
-- slot, not a claim per waiting job per retry. Times are µs since the epoch.
CREATE TABLE IF NOT EXISTS `switchyard_jobs_waits` (
    queue     VARCHAR(191) NOT NULL,
    limit_key VARCHAR(191) NOT NULL,
    id        VARCHAR(64)  NOT NULL,  -- the parked job
    since     BIGINT       NOT NULL,  -- when it first parked under the key
    PRIMARY KEY (queue, limit_key, id),
    KEY wfifo (queue, limit_key, since)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
