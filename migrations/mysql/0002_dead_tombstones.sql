-- Switchyard on MySQL / MariaDB, schema version 2: a dead letter leaves a tombstone.
--
-- Publishing an id that is dead must store nothing new. In version 1 every publish
-- first looked its ids up in the dead table, a round trip of its own that cost a fifth
-- of the batched enqueue rate. Now moving a message to the dead table leaves its row in
-- the jobs table as a tombstone (ready = 2, no lease, no envelope), so the jobs table's
-- unique id index refuses a republished dead id within the insert itself. Claims
-- (ready = 1), promotion (ready = 0), expiry and stats never see tombstones; a replay or
-- a purge removes them with their dead letters.
--
-- Dead letters moved under version 1 get their tombstones here (an id that is live
-- again is left alone). Stop version-1 processes before the upgrade: while they run, a
-- message they move to the dead table leaves no tombstone (its id could be published
-- again), their stats count tombstones as ready messages, and their replay takes a
-- tombstone for a live message. A tombstone whose dead letter a version-1 purge removed
-- is freed by the next `dead purge --all`.

INSERT INTO `switchyard_jobs`
    (id, queue, kind, priority, prio_rank, attempts, ready, available_at, visible_at,
     expires_at, last_error, created_at, envelope)
SELECT d.id, d.queue, d.kind, d.priority, -d.priority, d.attempts, 2, d.dead_at, d.dead_at,
       NULL, NULL, d.dead_at, ''
  FROM `switchyard_jobs_dead` d
 WHERE NOT EXISTS (SELECT 1 FROM `switchyard_jobs` j WHERE j.id = d.id)
    ON DUPLICATE KEY UPDATE seq = `switchyard_jobs`.seq;
