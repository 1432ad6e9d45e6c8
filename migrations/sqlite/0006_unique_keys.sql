-- Switchyard on SQLite, schema version 6: unique keys.
--
-- One row per queue and unique key, naming the job that last took the key. Whether that
-- job still holds it is read from the job's own row when a publish meets the key
-- (waiting, claimed, or gone), so nothing has to clear a key when its job ends and a
-- crash cannot leave one held. `hold_until` keeps a key held whatever its job's state:
-- a throttle's ttl from the publish, or a `done` scope's period from the ack. Publishes
-- run under SQLite's write lock, so publishers of one key are serialised already.
-- The same table keeps the keys of RabbitMQ's messages when this database is the
-- broker's control store: the transport frees them as their jobs end, and
-- `gone_after` says when a broker's job counts as gone (its publish was never
-- confirmed, it expired, or it ended). Publishes and acks of messages without
-- unique keys never touch this table; claims delete the rows that hold nothing once a
-- minute.
CREATE TABLE IF NOT EXISTS "switchyard_jobs_unique" (
    queue      TEXT    NOT NULL,
    unique_key TEXT    NOT NULL,
    id         TEXT    NOT NULL,  -- the job that took the key
    scope      TEXT    NOT NULL,  -- pending, active or done
    hold_until INTEGER,           -- held at least until then (µs), whatever the job's state
    first_at   INTEGER NOT NULL,  -- when the job took the key (a debounce's max_wait counts from it)
    gone_after INTEGER,           -- a broker's job: gone from then on (µs)
    PRIMARY KEY (queue, unique_key)
) WITHOUT ROWID;
