-- Switchyard on MySQL 8.0+ / MariaDB 10.6+, schema version 6: ordering keys.

-- Messages of one queue with the same ordering key are handled one at a time, in
-- publish order. Only the key's oldest message (its head) is ever claimable; the others
-- wait parked (ready = 0, visible_at at the largest BIGINT: never due, never promoted),
-- and the head's ack or dead letter hands the key to the next in the same transaction.
-- Dead letters keep the key, so that a replay goes back in line behind it; a tombstone
-- drops it.
ALTER TABLE `switchyard_jobs`
    ADD COLUMN ordering_key VARCHAR(255) NULL,
    ADD KEY keys_idx (queue, ordering_key, seq);

ALTER TABLE `switchyard_jobs_dead`
    ADD COLUMN ordering_key VARCHAR(255) NULL;

-- One row per key that has had messages. Publishers of a key and the hand-overs of that
-- key lock its row first (an upsert), so that at READ COMMITTED, where InnoDB takes no
-- gap locks, two publishers never both find a key free, and a publisher never parks a
-- message behind a head whose hand-over already looked for the next one. Rows of keys
-- without messages are deleted by the key repair.
CREATE TABLE IF NOT EXISTS `switchyard_jobs_keys` (
    queue VARCHAR(191) NOT NULL,
    okey  VARCHAR(255) NOT NULL,
    PRIMARY KEY (queue, okey)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
