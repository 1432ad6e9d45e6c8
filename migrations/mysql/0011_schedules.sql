-- Switchyard on MySQL 8.0+ / MariaDB 10.6+, schema version 11: schedules.
--
-- A row per schedule: its definition (JSON, as `schedule apply` and `Schedule::new`
-- write it), when it was paused (0: it is not), and its cursor: the slot time up to
-- which its slots were fired or counted missed. Workers move the cursor by
-- compare-and-set; a slot's job is made unique by its id and unique key, not by this
-- row. Times are µs since the epoch, by the workers' clocks.
CREATE TABLE IF NOT EXISTS `switchyard_jobs_sched` (
    name          VARCHAR(100) NOT NULL PRIMARY KEY,
    spec          MEDIUMTEXT   NOT NULL,
    paused_at     BIGINT       NOT NULL,
    fired_through BIGINT       NOT NULL,
    updated_at    BIGINT       NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
