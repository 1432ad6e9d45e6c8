-- Switchyard on MySQL 8.0+ / MariaDB 10.6+, schema version 7: unique keys.
--
-- One row per queue and unique key, naming the job that last took the key. Whether that
-- job still holds it is read from the job's own row when a publish meets the key
-- (waiting, claimed, or gone: acked, a tombstone, moved), so nothing has to clear a key
-- when its job ends and a crash cannot leave one held. `hold_until` keeps a key held
-- whatever its job's state: a throttle's ttl from the publish, or a `done` scope's
-- period from the ack. Publishers of one key serialise on its row (a locking read at
-- READ COMMITTED, where InnoDB takes no gap locks). Publishes and acks of messages
-- without unique keys never touch this table, and the jobs table gets no column and no
-- index; claims delete the rows that hold nothing once a minute.
--
-- The same table keeps the keys of RabbitMQ's messages when this database is the
-- broker's control store: the transport frees them as their jobs end, and `gone_after`
-- says when a broker's job counts as gone (its publish was never confirmed, it
-- expired, or it ended).
CREATE TABLE IF NOT EXISTS `switchyard_jobs_unique` (
    queue      VARCHAR(191) NOT NULL,
    unique_key VARCHAR(255) NOT NULL,
    id         VARCHAR(191) NOT NULL,  -- the job that took the key
    scope      VARCHAR(8)   NOT NULL,  -- pending, active or done
    hold_until BIGINT       NULL,      -- held at least until then (µs), whatever the job's state
    first_at   BIGINT       NOT NULL,  -- when the job took the key (a debounce's max_wait counts from it)
    gone_after BIGINT       NULL,      -- a broker's job: gone from then on (µs)
    PRIMARY KEY (queue, unique_key)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
