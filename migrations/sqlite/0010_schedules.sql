-- Switchyard on SQLite, schema version 10: schedules.
--
-- A row per schedule: its definition (JSON, as `schedule apply` and `Schedule::new`
-- write it), when it was paused (0: it is not), and its cursor: the slot time up to
-- which its slots were fired or counted missed. Workers move the cursor by
-- compare-and-set; a slot's job is made unique by its id and unique key, not by this
-- row. Times are µs since the epoch, by the workers' clocks.
CREATE TABLE IF NOT EXISTS "switchyard_jobs_sched" (
    name          TEXT    NOT NULL PRIMARY KEY,
    spec          TEXT    NOT NULL,
    paused_at     INTEGER NOT NULL,
    fired_through INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
) WITHOUT ROWID;
