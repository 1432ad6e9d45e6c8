-- Switchyard on MySQL 8.0+ / MariaDB 10.6+, schema version 5: who holds a message, and
-- labels.

-- The holder a claim records (`host:pid`, then `/name` for a named worker), for
-- `stats --held`, `switchyard job` and the dashboard; and a message's labels as `,a,b,`
-- (NULL for none), which a claim that selects labels searches while it walks the claim
-- index. Dead letters keep the labels, so that a replayed message is still selected by
-- them. Nullable columns at the end of the table: MySQL 8 and MariaDB add them in place.
ALTER TABLE `switchyard_jobs`
    ADD COLUMN claimed_by VARCHAR(255) NULL,
    ADD COLUMN labels     VARCHAR(600) NULL;

ALTER TABLE `switchyard_jobs_dead`
    ADD COLUMN labels VARCHAR(600) NULL;
