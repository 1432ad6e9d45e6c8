-- Switchyard on PostgreSQL, schema version 11: schedules.
--
-- A row per schedule: its definition (JSON, as `schedule apply` and `Schedule::new`
-- write it), when it was paused (0: it is not), and its cursor: the slot time up to
-- which its slots were fired or counted missed. Workers move the cursor by
-- compare-and-set; a slot's job is made unique by its id and unique key, not by this
-- row. Times are µs since the epoch, by the workers' clocks.
CREATE TABLE IF NOT EXISTS "switchyard_jobs_sched" (
    name          text COLLATE "C" NOT NULL PRIMARY KEY,
    spec          text   NOT NULL,
    paused_at     bigint NOT NULL,
    fired_through bigint NOT NULL,
    updated_at    bigint NOT NULL
);
