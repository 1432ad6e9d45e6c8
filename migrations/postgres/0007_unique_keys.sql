-- Switchyard on PostgreSQL, schema version 7: unique keys.
--
-- One row per queue and unique key, naming the job that last took the key. Whether that
-- job still holds it is read from the job's own row when a publish meets the key
-- (waiting, claimed, or gone), so nothing has to clear a key when its job ends and a
-- crash cannot leave one held. `hold_until` keeps a key held whatever its job's state:
-- a throttle's ttl from the publish, or a `done` scope's period from the ack. Publishers
-- of one key serialise on its row (`SELECT … FOR UPDATE`); publishes and acks of
-- messages without unique keys never touch this table; claims delete the rows that hold
-- nothing once a minute.
--
-- The same table keeps the keys of RabbitMQ's messages when this database is the
-- broker's control store: the transport frees them as their jobs end, and
-- `gone_after` says when a broker's job counts as gone (its publish was never
-- confirmed, it expired, or it ended).
CREATE TABLE IF NOT EXISTS "switchyard_jobs_unique" (
    queue      text COLLATE "C" NOT NULL,
    unique_key text COLLATE "C" NOT NULL,
    id         text COLLATE "C" NOT NULL,  -- the job that took the key
    scope      text        NOT NULL,       -- pending, active or done
    hold_until timestamptz,                -- held at least until then, whatever the job's state
    first_at   timestamptz NOT NULL,       -- when the job took the key (a debounce's max_wait counts from it)
    gone_after timestamptz,                -- a broker's job: gone from then on
    PRIMARY KEY (queue, unique_key)
);
