-- Switchyard on MySQL 8.0+ / MariaDB 10.6+, schema version 7: unique keys.
--
-- One row per queue and unique key, naming the job that last took the key. Whether that
-- job still holds it is read from the job's own row when a publish meets the key
-- (waiting, claimed, or gone: acked, a tombstone, moved), so nothing has to clear a key
-- when its job ends and a crash cannot leave one held. `hold_until` keeps a key held
-- whatever its job's state: a throttle's ttl from the publish, or a `done` scope's
-- period from the ack. Publishers of one key serialise on its row (a locking read at
-- READ COMMITTED, where InnoDB takes no gap locks). The same table keeps the keys of
-- RabbitMQ's messages when this database is the broker's control store: their jobs'
-- state is then read from the status table, and `gone_after` says when a message that
-- has no status yet counts as gone (its publish was never confirmed, or it expired on
-- the broker). Nothing else touches this table, so messages without unique keys cost
-- nothing: the jobs table gets no column and no index.
CREATE TABLE IF NOT EXISTS `switchyard_jobs_unique` (
    queue      VARCHAR(191) NOT NULL,
    unique_key VARCHAR(255) NOT NULL,
    id         VARCHAR(191) NOT NULL,  -- the job that took the key
    scope      VARCHAR(8)   NOT NULL,  -- pending, active or done
    hold_until BIGINT       NULL,      -- held at least until then (µs), whatever the job's state
    first_at   BIGINT       NOT NULL,  -- when the job took the key (a debounce's max_wait counts from it)
    gone_after BIGINT       NULL,      -- a broker's message: gone from then on (µs) unless its status says otherwise
    PRIMARY KEY (queue, unique_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
