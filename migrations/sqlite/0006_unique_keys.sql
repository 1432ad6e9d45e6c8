-- Switchyard on SQLite, schema version 6: unique keys.
--
-- One row per queue and unique key, naming the job that last took the key. Whether that
-- job still holds it is read from the job's own row when a publish meets the key
-- (waiting, claimed, or gone), so nothing has to clear a key when its job ends and a
-- crash cannot leave one held. `hold_until` keeps a key held whatever its job's state:
-- a throttle's ttl from the publish, or a `done` scope's period from the ack. Publishes
-- run under SQLite's write lock, so publishers of one key are serialised already.
-- The same table keeps the keys of RabbitMQ's messages when this database is the
-- broker's control store: their jobs' state is then read from the status table, and
-- `gone_after` says when a message that has no status yet counts as gone (its publish
-- was never confirmed, or it expired on the broker). Nothing else touches this table,
-- so messages without unique keys cost nothing.
CREATE TABLE IF NOT EXISTS "switchyard_jobs_unique" (
    queue      TEXT    NOT NULL,
    unique_key TEXT    NOT NULL,
    id         TEXT    NOT NULL,  -- the job that took the key
    scope      TEXT    NOT NULL,  -- pending, active or done
    hold_until INTEGER,           -- held at least until then (µs), whatever the job's state
    first_at   INTEGER NOT NULL,  -- when the job took the key (a debounce's max_wait counts from it)
    gone_after INTEGER,           -- a broker's message: gone from then on (µs) unless its status says otherwise
    PRIMARY KEY (queue, unique_key)
) WITHOUT ROWID;
