//! Every statement of the transport, written for the default table name and specialised
//! once per transport for its validated schema and table. Times travel as microsecond
//! offsets from the server's `now()`, so no client clock ever enters a comparison.

/// A dead letter that is dead-lettered again (replayed, then failed again) replaces its
/// old copy.
const ON_CONFLICT_REPLACE: &str = "
    ON CONFLICT (id) DO UPDATE SET
       queue = EXCLUDED.queue, kind = EXCLUDED.kind, priority = EXCLUDED.priority,
       attempts = EXCLUDED.attempts, expires_at = EXCLUDED.expires_at, reason = EXCLUDED.reason,
       last_error = EXCLUDED.last_error, dead_at = EXCLUDED.dead_at, envelope = EXCLUDED.envelope,
       labels = EXCLUDED.labels, ordering_key = EXCLUDED.ordering_key";

/// What a claim writes: only columns no index covers, so that the update is heap-only.
/// `{HOLDER}` is the holder's parameter, which differs between claims.
const CLAIM_SET: &str = "token = $1, claimed_at = now(), lease_until = now() + $2 {US},
       claimed_by = {HOLDER},
       {STARTED}, attempts = j.attempts + (j.token IS NOT NULL AND j.started)::int";

/// A claim's label filter (`{NEEDLES}`: the parameter of `,label,` needles, any of which
/// matches), checked on each row as the claim walks the claim index; `{LABELS}` is empty
/// in the claims that take any label.
const LABEL_FILTER: &str =
    "AND EXISTS (SELECT 1 FROM UNNEST({NEEDLES}::text[]) AS n(x) WHERE strpos(labels, n.x) > 0)";

/// The started flag a claim sets from its mode ($5: 0 no, 1 yes, 2 only when the message
/// comes with no attempts); SET expressions see the row's old values.
const STARTED: &str = "started = CASE $5::int
           WHEN 2 THEN j.attempts + (j.token IS NOT NULL AND j.started)::int = 0
           ELSE $5::int = 1 END";

/// A duration in microseconds (a bigint parameter) as an interval.
const US: &str = "* interval '1 microsecond'";

/// Columns returned by every claim, in the order `transport::claimed_row` reads them.
const CLAIM_RETURNING: &str = "RETURNING j.seq, j.id, j.priority, j.attempts, \
    floor(extract(epoch FROM j.available_at) * 1000000)::bigint, j.last_error, j.envelope, j.started";

/// Not held under a lease (never leased, given back, or the lease ran out).
const FREE: &str = "(lease_until IS NULL OR lease_until <= now())";

/// The claim's filter and order: the claim index `(queue, priority DESC, available_at,
/// seq) WHERE ready`, walked in order and cut at the limit. Rows claimed briefly stay in
/// that index under their lease and are stepped over.
const CLAIMABLE: &str =
    "queue = $3 AND ready AND {FREE} AND (expires_at IS NULL OR expires_at > now()) {LABELS}
   ORDER BY priority DESC, available_at, seq";

/// Whether any waiting row (delayed, or held long under a lease) has become claimable. Written as "the
/// earliest waiting row" rather than `EXISTS`: with stale statistics the planner may
/// expect `EXISTS` to hit a match early in a sequential scan, whereas an ordered
/// `LIMIT 1` is one step down the due index whatever the estimates say.
pub(crate) const ANY_DUE: &str = "SELECT COALESCE((
    SELECT visible_at <= now() FROM \"switchyard_jobs\"
     WHERE NOT ready ORDER BY visible_at LIMIT 1), false)";

/// Whether any row has expired (one step down the expiry index, as above).
pub(crate) const ANY_EXPIRED: &str = "SELECT COALESCE((
    SELECT expires_at <= now() FROM \"switchyard_jobs\"
     WHERE expires_at IS NOT NULL ORDER BY expires_at LIMIT 1), false)";

/// Moves waiting rows whose time has come into the claim index: due delayed messages and
/// messages whose long lease ran out (they keep their old token, so their reclaim counts
/// an attempt). Rows another transaction holds are left for the next round.
pub(crate) const PROMOTE_DUE: &str = "
WITH due AS (
    SELECT seq FROM \"switchyard_jobs\"
     WHERE NOT ready AND visible_at <= now()
     ORDER BY visible_at
     LIMIT 10000
       FOR UPDATE SKIP LOCKED)
UPDATE \"switchyard_jobs\" j SET ready = true FROM due WHERE j.seq = due.seq";

/// Claims up to $4 ready rows of queue $3: the CTE locks exactly the rows it returns
/// (skipping rows other claims hold) and the UPDATE touches only those, so the planner can
/// never claim more than the limit. The UPDATE writes no indexed column, so it is a
/// heap-only update. (It finds the locked rows by `seq`, not by `ctid`: a row that changed
/// after the statement's snapshot and still qualifies is locked in its newest version,
/// whose `ctid` the UPDATE cannot see, and would come back unclaimed.) A reclaim (the
/// old token is still there) counts an attempt only if a handler had started the
/// message; $5 says whether this claim starts it (1, a plain reserve), only claims it
/// ahead (0, a prefetch), or starts it only if it comes with no attempts (2, a fast
/// worker's prefetch).
pub(crate) const CLAIM_SKIP_LOCKED: &str = "
WITH c AS (
    SELECT seq FROM \"switchyard_jobs\"
     WHERE {CLAIMABLE}
     LIMIT $4
       FOR UPDATE SKIP LOCKED)
UPDATE \"switchyard_jobs\" j
   SET {CLAIM_SET}
  FROM c
 WHERE j.seq = c.seq
{RETURNING}";

/// Claims up to $4 rows of queue $3 that no worker holds, due or not, for a move to
/// another backend ($5 is 0: not started); a message waiting for its ordering key is
/// moved once its key is handed to it (the move acks its head first). A delayed row keeps `ready` false and its
/// due time, so should the mover die it comes back when both its lease and its delay
/// have run out.
pub(crate) const CLAIM_FOR_MOVE: &str = "
WITH c AS (
    SELECT seq FROM \"switchyard_jobs\"
     WHERE queue = $3 AND {FREE} AND visible_at <> 'infinity'
     ORDER BY seq
     LIMIT $4
       FOR UPDATE SKIP LOCKED)
UPDATE \"switchyard_jobs\" j
   SET {CLAIM_SET}
  FROM c
 WHERE j.seq = c.seq
{RETURNING}";

/// Stores a dead letter moved from another backend (times in microseconds).
pub(crate) const INSERT_DEAD: &str = "INSERT INTO \"switchyard_jobs_dead\"
    (id, queue, kind, priority, attempts, expires_at, reason, last_error, dead_at, envelope, labels,
     ordering_key)
    VALUES ($1, $2, $3, $4, $5, to_timestamp($6::float8 / 1000000), $7, $8,
            to_timestamp($9::float8 / 1000000), $10, $11, $12)
{ON_CONFLICT_REPLACE}";

/// The candidates of an optimistic claim, in delivery order, read without locks ($3: the
/// label filter's needles, when it has one).
pub(crate) const CLAIM_CANDIDATES: &str = "
SELECT seq FROM \"switchyard_jobs\"
 WHERE queue = $1 AND ready AND {FREE} AND (expires_at IS NULL OR expires_at > now()) {LABELS}
 ORDER BY priority DESC, available_at, seq
 LIMIT $2";

/// Compare-and-set on candidates ($6: seqs) of queue $3: claims those still free. The
/// candidates drive the lookup (one primary-key probe each), so the plan cannot turn
/// into a walk of the queue's claim index at any depth. The rows are locked in `seq`
/// order, so two claims given overlapping candidates wait for each other instead of
/// deadlocking (which PostgreSQL takes a second to detect); a row a competitor is
/// claiming is waited for and then, leased, skipped (`FOR UPDATE` checks the condition
/// again on the row's newest version; the outer `UPDATE` needs no check of its own, the
/// rows being locked).
pub(crate) const CLAIM_OPTIMISTIC: &str = "
WITH c AS (
    SELECT j.seq FROM UNNEST($6::bigint[]) AS u(seq)
      JOIN \"switchyard_jobs\" j ON j.seq = u.seq
     WHERE j.queue = $3 AND j.ready AND {FREE} AND (j.expires_at IS NULL OR j.expires_at > now())
     ORDER BY j.seq
     LIMIT $4
       FOR UPDATE OF j)
UPDATE \"switchyard_jobs\" j
   SET {CLAIM_SET}
  FROM c
 WHERE j.seq = c.seq
{RETURNING}";

/// One optimistic round in one statement: the candidates read without locks (the first
/// $7 claimable rows in delivery order), the run of $4 of them from rank $8 × $4 (the
/// window's last whole run when it holds fewer), and the compare-and-set of
/// [`CLAIM_OPTIMISTIC`] on that run. Each row claimed carries how many candidates the
/// window held (`seen`); when none is, one row with a null `seq` carries it.
pub(crate) const CLAIM_OPTIMISTIC_ROUND: &str = "
WITH w AS MATERIALIZED (
    SELECT seq, row_number() OVER (ORDER BY priority DESC, available_at, seq) - 1 AS rk
      FROM \"switchyard_jobs\"
     WHERE queue = $3 AND ready AND {FREE} AND (expires_at IS NULL OR expires_at > now()) {LABELS}
     ORDER BY priority DESC, available_at, seq
     LIMIT $7),
total AS (SELECT count(*) AS seen FROM w),
s AS (SELECT LEAST($8::bigint, GREATEST(total.seen / GREATEST($4, 1) - 1, 0)) * $4 AS first FROM total),
c AS (
    SELECT j.seq FROM w
      JOIN s ON w.rk >= s.first AND w.rk < s.first + $4
      JOIN \"switchyard_jobs\" j ON j.seq = w.seq
     WHERE j.queue = $3 AND j.ready AND {FREE} AND (j.expires_at IS NULL OR j.expires_at > now())
     ORDER BY j.seq
       FOR UPDATE OF j),
u AS (
    UPDATE \"switchyard_jobs\" j
       SET {CLAIM_SET}
      FROM c
     WHERE j.seq = c.seq
    {RETURNING})
SELECT u.*, total.seen FROM u RIGHT JOIN total ON true";

/// Publishes a batch given as parallel arrays, in their order. An id already stored, live
/// or dead, stores nothing new. One `NOTIFY` per queue that got a ready message ($10:
/// the channel); PostgreSQL delivers it at commit, so a rolled-back outbox publish wakes
/// nobody. Returns how many queues were notified and how many rows were stored.
pub(crate) const PUBLISH: &str = "
WITH v AS (
    SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int[], $5::int[],
                         $6::bigint[], $7::bigint[], $8::text[], $9::text[], $12::text[]{KEY_ARRAYS})
           WITH ORDINALITY
           AS v(id, queue, kind, priority, attempts, due_us, expires_us, last_error, envelope, labels{KEY_NAMES}, ord)),
ins AS (
    INSERT INTO \"switchyard_jobs\"
        (id, queue, kind, priority, attempts, ready, available_at, visible_at, expires_at, last_error,
         envelope, labels{KEY_COLUMN})
    SELECT v.id, v.queue, v.kind, v.priority, v.attempts, {READY},
           now() + v.due_us {US}, {VISIBLE}, now() + v.expires_us {US},
           v.last_error, v.envelope, v.labels{KEY_VALUE}
      FROM v
     WHERE NOT EXISTS (SELECT 1 FROM \"switchyard_jobs_dead\" d WHERE d.id = v.id)
     ORDER BY v.ord
        {ON_CONFLICT}
    RETURNING queue, ready)
SELECT (SELECT count(*) FROM (SELECT queue, pg_notify($10, queue) FROM ins WHERE ready AND $11 GROUP BY queue) n),
       (SELECT count(*) FROM ins)";

/// What [`PUBLISH`] writes for messages without ordering keys.
const UNKEYED: [(&str, &str); 6] = [
    ("{KEY_ARRAYS}", ""),
    ("{KEY_NAMES}", ""),
    ("{KEY_COLUMN}", ""),
    ("{KEY_VALUE}", ""),
    ("{READY}", "v.due_us <= 0"),
    ("{VISIBLE}", "now() + v.due_us {US}"),
];

/// What [`PUBLISH`] writes for a batch with ordering keys ($13: the keys, $14: whether a
/// message follows one of its key earlier in the batch). A message whose key has a
/// message stored, or that follows one in the batch, waits parked (`visible_at` at
/// infinity) until the key is handed to it; the publisher holds the keys' locks.
const KEYED: [(&str, &str); 6] = [
    ("{KEY_ARRAYS}", ", $13::text[], $14::bool[]"),
    ("{KEY_NAMES}", ", okey, follows"),
    ("{KEY_COLUMN}", ", ordering_key"),
    ("{KEY_VALUE}", ", v.okey"),
    ("{READY}", "NOT {PARKED} AND v.due_us <= 0"),
    (
        "{VISIBLE}",
        "CASE WHEN {PARKED} THEN 'infinity'::timestamptz ELSE now() + v.due_us {US} END",
    ),
];

/// Whether a keyed message waits for its key.
const PARKED: &str = "(v.okey IS NOT NULL AND (v.follows OR EXISTS (
    SELECT 1 FROM \"switchyard_jobs\" e WHERE e.queue = v.queue AND e.ordering_key = v.okey)))";

/// How [`PUBLISH`] skips an id already stored.
const SKIP_STORED: &str = "ON CONFLICT (id) DO NOTHING";

/// Acks a batch in one statement: $1/$2 are the rows' seqs and tokens (a step down the
/// primary key each); only rows still held under their token are deleted.
pub(crate) const ACK_BATCH: &str = "
DELETE FROM \"switchyard_jobs\" j
 USING UNNEST($1::bigint[], $2::uuid[]) AS p(seq, token)
 WHERE j.seq = p.seq AND j.token = p.token
RETURNING j.id, j.token";

/// Marks a batch as started and renews the leases by $3 µs: from now on a lapsed lease
/// counts an attempt. Slow handlers get their messages this way, so the rows leave the
/// claim index for the due index, where claims need not step over them.
pub(crate) const START_BATCH: &str = "
UPDATE \"switchyard_jobs\" j
   SET started = true, ready = false, visible_at = now() + $3 {US}, lease_until = now() + $3 {US}
  FROM UNNEST($1::bigint[], $2::uuid[]) AS p(seq, token)
 WHERE j.seq = p.seq AND j.token = p.token
RETURNING j.id, j.token";

/// Gives a leased row back: due after $1 µs, and ready at once when $1 is 0.
pub(crate) const RELEASE: &str = "
UPDATE \"switchyard_jobs\"
   SET token = NULL, claimed_at = NULL, claimed_by = NULL, lease_until = NULL, attempts = attempts + 1, started = false,
       available_at = now() + $1 {US}, visible_at = now() + $1 {US}, ready = ($1 <= 0),
       last_error = COALESCE($2, last_error)
 WHERE id = $3 AND token = $4";

/// Gives a leased row back without counting an attempt (the handler snoozed, or a rate
/// limit said to wait): due after $1 µs, and ready at once when $1 is 0; its last error
/// is kept.
pub(crate) const SNOOZE: &str = "
UPDATE \"switchyard_jobs\"
   SET token = NULL, claimed_at = NULL, claimed_by = NULL, lease_until = NULL, started = false,
       available_at = now() + $1 {US}, visible_at = now() + $1 {US}, ready = ($1 <= 0)
 WHERE id = $2 AND token = $3";

/// Gives back a row that was claimed but never handled: ready at once, in its old place
/// in line, and no attempt counted (the token is cleared, so the next claim is not a
/// reclaim). A row still in the claim index keeps its indexed columns (a heap-only
/// update).
pub(crate) const ABANDON: &str = "
UPDATE \"switchyard_jobs\"
   SET token = NULL, claimed_at = NULL, claimed_by = NULL, lease_until = NULL, started = false,
       visible_at = CASE WHEN ready THEN visible_at ELSE now() END, ready = true
 WHERE id = $1 AND token = $2";

/// Renews a lease, and moves a row still in the claim index out to the due index: a
/// message held this long would otherwise be stepped over by every claim. While the token
/// matches nobody has reclaimed it, even if the lease lapsed.
pub(crate) const EXTEND: &str = "
UPDATE \"switchyard_jobs\" SET visible_at = now() + $1 {US}, lease_until = now() + $1 {US}, ready = false
 WHERE id = $2 AND token = $3";

/// Moves a leased row, byte for byte, into the dead table in one statement (the delivery
/// that ends here counts as an attempt if a handler started it).
pub(crate) const MOVE_LEASED_TO_DEAD: &str = "
WITH moved AS (
    DELETE FROM \"switchyard_jobs\" WHERE seq = $1 AND token = $2 RETURNING *)
INSERT INTO \"switchyard_jobs_dead\"
    (id, queue, kind, priority, attempts, expires_at, reason, last_error, dead_at, envelope, labels,
     ordering_key)
SELECT id, queue, kind, priority, attempts + started::int, expires_at, $3,
       COALESCE($4, last_error), now(), envelope, labels, ordering_key
  FROM moved
{ON_CONFLICT_REPLACE}";

/// [`MOVE_LEASED_TO_DEAD`] of a message with an ordering key, which hands the key to
/// the next message of the key ($5: the wake-up channel); run under the key's lock.
pub(crate) const MOVE_KEYED_TO_DEAD: &str = "
WITH gone AS (
    DELETE FROM \"switchyard_jobs\" WHERE seq = $1 AND token = $2 RETURNING *),
dead AS (
    INSERT INTO \"switchyard_jobs_dead\"
        (id, queue, kind, priority, attempts, expires_at, reason, last_error, dead_at, envelope,
         labels, ordering_key)
    SELECT id, queue, kind, priority, attempts + started::int, expires_at, $3,
           COALESCE($4, last_error), now(), envelope, labels, ordering_key
      FROM gone
    {ON_CONFLICT_REPLACE}
    RETURNING 1),
{HAND_ON}
SELECT (SELECT count(*) FROM dead), (SELECT n FROM woken)";

/// Hands the keys of the rows in `gone` (heads that left) to their next messages, and
/// wakes the queues of those that are due at once (on the channel `{CHANNEL}`, unless it
/// is NULL). A statement sees the
/// table as it was when it began, the heads included, so the next message is the first
/// after the head; the key's lock, taken by an earlier statement, makes sure every
/// message published before it is seen.
const HAND_ON: &str = "next AS (
    SELECT (SELECT n.seq FROM \"switchyard_jobs\" n
             WHERE n.queue = g.queue AND n.ordering_key = g.ordering_key AND n.seq > g.seq
             ORDER BY n.seq LIMIT 1) AS seq
      FROM gone g WHERE g.ordering_key IS NOT NULL),
handed AS (
    UPDATE \"switchyard_jobs\" u
       SET ready = u.available_at <= now(), visible_at = u.available_at
      FROM next
     WHERE u.seq = next.seq AND u.visible_at = 'infinity' AND {FREE_U}
    RETURNING u.queue, u.ready),
woken AS (
    SELECT count(pg_notify({CHANNEL}, q.queue)) AS n
      FROM (SELECT DISTINCT queue FROM handed WHERE ready AND {CHANNEL}::text IS NOT NULL) q)";

/// Acks keyed messages ($1/$2: seqs and tokens, as [`ACK_BATCH`]) and hands their keys
/// on ($3: the wake-up channel), under the keys' locks.
pub(crate) const ACK_KEYED: &str = "
WITH gone AS (
    DELETE FROM \"switchyard_jobs\" j
     USING UNNEST($1::bigint[], $2::uuid[]) AS p(seq, token)
     WHERE j.seq = p.seq AND j.token = p.token
    RETURNING j.id, j.token, j.seq, j.queue, j.ordering_key),
{HAND_ON}
SELECT g.id, g.token FROM gone g, woken";

/// Hands each key of $1/$2 (queues, keys) whose oldest message is parked to that
/// message ($3: the wake-up channel): run after a publish in which a message stored
/// nothing (its id was stored already, live or dead), so held no key, while a later
/// message of its key in the batch was parked behind it. A head that is gone at seq 0
/// makes [`HAND_ON`]'s next message the key's oldest.
pub(crate) const HAND_ON_SKIPPED: &str = "
WITH gone AS (
    SELECT DISTINCT g.queue, g.ordering_key, 0::bigint AS seq
      FROM UNNEST($1::text[], $2::text[]) AS g(queue, ordering_key)),
{HAND_ON}
SELECT n FROM woken";

/// Takes the transaction-scoped lock of each key ($1: `queue` U+001F `key`), in one
/// order, so that two transactions never wait for each other's keys. Keys share 256
/// locks by hash: a batch of many keys then holds at most 256 of the server's lock
/// slots (64 per connection by default), at the price of sometimes waiting for another
/// key's publish or hand-over.
pub(crate) const LOCK_KEYS: &str = "
SELECT count(pg_advisory_xact_lock(21337, h))
  FROM (SELECT DISTINCT hashtext(k) & 255 AS h FROM UNNEST($1::text[]) AS k ORDER BY h) AS s";

/// Hands keys whose head left without handing them on (an expired head, a quarantined
/// one, a mover that died) to their oldest message: a parked message with nothing
/// before it in its key.
pub(crate) const REPAIR_KEYS: &str = "
WITH heads AS (
    SELECT p.seq FROM \"switchyard_jobs\" p
     WHERE p.ordering_key IS NOT NULL AND p.visible_at = 'infinity' AND {FREE_P}
       AND NOT EXISTS (SELECT 1 FROM \"switchyard_jobs\" e
                        WHERE e.queue = p.queue AND e.ordering_key = p.ordering_key AND e.seq < p.seq)
     LIMIT 1000
       FOR UPDATE SKIP LOCKED)
UPDATE \"switchyard_jobs\" u
   SET ready = u.available_at <= now(), visible_at = u.available_at
  FROM heads
 WHERE u.seq = heads.seq AND u.visible_at = 'infinity'";

/// Moves up to 1,000 unleased rows that expired into the dead table, in one statement.
pub(crate) const MOVE_EXPIRED: &str = "
WITH moved AS (
    DELETE FROM \"switchyard_jobs\" WHERE seq IN (
        SELECT seq FROM \"switchyard_jobs\"
         WHERE expires_at <= now() AND visible_at <= now() AND {FREE}
         ORDER BY expires_at
         LIMIT 1000
           FOR UPDATE SKIP LOCKED)
    RETURNING *)
INSERT INTO \"switchyard_jobs_dead\"
    (id, queue, kind, priority, attempts, expires_at, reason, last_error, dead_at, envelope, labels,
     ordering_key)
SELECT id, queue, kind, priority, attempts + started::int, expires_at, 'expired', last_error, now(),
       envelope, labels, ordering_key
  FROM moved
{ON_CONFLICT_REPLACE}";

pub(crate) const STATS_JOBS: &str = "
SELECT queue,
       count(*) FILTER (WHERE visible_at <= now() AND {FREE}),
       count(*) FILTER (WHERE token IS NULL AND visible_at > now()),
       count(*) FILTER (WHERE token IS NOT NULL AND lease_until > now()),
       floor(extract(epoch FROM now() - min(available_at) FILTER (
           WHERE visible_at <= now() AND {FREE} AND (expires_at IS NULL OR expires_at > now()))) * 1000000)::bigint
  FROM \"switchyard_jobs\"
 WHERE $1::text IS NULL OR queue = $1
 GROUP BY queue";

pub(crate) const STATS_DEAD: &str = "
SELECT queue, count(*) FROM \"switchyard_jobs_dead\"
 WHERE $1::text IS NULL OR queue = $1
 GROUP BY queue";

pub(crate) const LIST_DEAD: &str = "
SELECT id, queue, kind, attempts, reason, last_error,
       floor(extract(epoch FROM dead_at) * 1000000)::bigint, envelope
  FROM \"switchyard_jobs_dead\"
 WHERE $1::text IS NULL OR queue = $1
 ORDER BY dead_at, id
 LIMIT $2";

/// Messages held under a lease that has not run out: queue $1 and id $2 when given, at
/// most $3, longest held first. Held rows are few beside the queue, so the scan of the
/// table is an operator's price, never a worker's.
pub(crate) const HELD: &str = "
SELECT id, queue, kind, claimed_by, floor(extract(epoch FROM claimed_at) * 1000000)::bigint,
       floor(extract(epoch FROM lease_until) * 1000000)::bigint, started, attempts
  FROM \"switchyard_jobs\"
 WHERE token IS NOT NULL AND lease_until > now()
   AND ($1::text IS NULL OR queue = $1) AND ($2::text IS NULL OR id = $2)
 ORDER BY claimed_at, seq
 LIMIT $3";

pub(crate) const DEAD_EXISTS: &str =
    "SELECT EXISTS (SELECT 1 FROM \"switchyard_jobs_dead\" WHERE id = $1)";

/// The selection of a replay or purge: queue $1, id $2, dead at least $3 µs ago (each
/// optional).
const DEAD_SELECTION: &str =
    "($1::text IS NULL OR d.queue = $1) AND ($2::text IS NULL OR d.id = $2)
   AND ($3::bigint IS NULL OR d.dead_at <= now() - $3 {US})";

/// Puts the selected dead letters back, byte for byte, ready now with attempts reset and
/// no expiry, in one statement. An id that is live again is left alone: its dead copy
/// stays where it is. Returns the queues that got messages, to wake their workers.
pub(crate) const REPLAY_DEAD: &str = "
WITH moved AS (
    DELETE FROM \"switchyard_jobs_dead\" d
     WHERE {DEAD_SELECTION} AND d.id = ANY($4::text[])
       AND NOT EXISTS (SELECT 1 FROM \"switchyard_jobs\" j WHERE j.id = d.id)
    RETURNING d.*),
keyed AS (
    SELECT m.*, m.ordering_key IS NOT NULL AND (
               row_number() OVER (PARTITION BY m.queue, m.ordering_key ORDER BY m.dead_at, m.id) > 1
               OR EXISTS (SELECT 1 FROM \"switchyard_jobs\" e
                           WHERE e.queue = m.queue AND e.ordering_key = m.ordering_key)) AS parked
      FROM moved m),
ins AS (
    INSERT INTO \"switchyard_jobs\"
        (id, queue, kind, priority, attempts, ready, available_at, visible_at, expires_at, last_error,
         envelope, labels, ordering_key)
    SELECT id, queue, kind, priority, 0, NOT parked, now(),
           CASE WHEN parked THEN 'infinity'::timestamptz ELSE now() END, NULL, last_error, envelope,
           labels, ordering_key
      FROM keyed
     ORDER BY dead_at, id
    RETURNING queue, id, ordering_key)
SELECT queue, id, ordering_key FROM ins";

/// The dead letters a replay selects, locked, with their keys' lock names: the replay
/// takes those locks and then moves exactly these ($4 of [`REPLAY_DEAD`]), so that the
/// key's messages it sees are all there are and its rows' seqs come after them.
pub(crate) const SELECT_REPLAYED: &str = "
SELECT d.id, CASE WHEN d.ordering_key IS NULL THEN NULL ELSE d.queue || chr(31) || d.ordering_key END
  FROM \"switchyard_jobs_dead\" d
 WHERE {DEAD_SELECTION}
   FOR UPDATE";

pub(crate) const PURGE_DEAD: &str = "DELETE FROM \"switchyard_jobs_dead\" d WHERE {DEAD_SELECTION}";

/// Sends one notification per queue ($2) on channel $1.
pub(crate) const NOTIFY_QUEUES: &str =
    "SELECT count(pg_notify($1, q)) FROM UNNEST($2::text[]) AS q";

/// The plan of the skip-locked claim, for tests and the benchmark.
pub(crate) const EXPLAIN_CLAIM: &str = "EXPLAIN (COSTS OFF) {CLAIM}";

/// The statements specialised for one schema and table.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) any_due: String,
    pub(crate) any_expired: String,
    pub(crate) promote_due: String,
    pub(crate) claim_skip_locked: String,
    /// [`CLAIM_SKIP_LOCKED`] with the label filter.
    pub(crate) claim_skip_locked_labels: String,
    pub(crate) claim_for_move: String,
    pub(crate) insert_dead: String,
    pub(crate) claim_candidates: String,
    /// [`CLAIM_CANDIDATES`] with the label filter.
    pub(crate) claim_candidates_labels: String,
    pub(crate) claim_optimistic: String,
    pub(crate) claim_optimistic_round: String,
    pub(crate) claim_optimistic_round_labels: String,
    pub(crate) publish: String,
    /// [`PUBLISH`] for ids that are not stored yet, as nearly all are: a plain insert,
    /// whose unique index still refuses a duplicate (SQLSTATE 23505), and then the caller
    /// runs `publish`. `ON CONFLICT` costs a speculative insertion per row (a pre-check of
    /// the id index, a lock, and a second WAL record to confirm the row), about 12% of the
    /// server's time for a batch.
    pub(crate) publish_fresh: String,
    /// [`PUBLISH`] of a batch with ordering keys.
    pub(crate) publish_keyed: String,
    /// [`PUBLISH`] of a batch with ordering keys, for ids not stored yet.
    pub(crate) publish_keyed_fresh: String,
    pub(crate) ack_batch: String,
    pub(crate) start_batch: String,
    pub(crate) release: String,
    pub(crate) snooze: String,
    pub(crate) abandon: String,
    pub(crate) extend: String,
    pub(crate) move_leased_to_dead: String,
    pub(crate) move_expired: String,
    pub(crate) stats_jobs: String,
    pub(crate) stats_dead: String,
    pub(crate) list_dead: String,
    pub(crate) dead_exists: String,
    pub(crate) held: String,
    pub(crate) replay_dead: String,
    pub(crate) select_replayed: String,
    pub(crate) move_keyed_to_dead: String,
    pub(crate) ack_keyed: String,
    pub(crate) hand_on_skipped: String,
    pub(crate) lock_keys: String,
    pub(crate) repair_keys: String,
    pub(crate) purge_dead: String,
    pub(crate) notify_queues: String,
    pub(crate) explain_claim: String,
    /// [`EXPLAIN_CLAIM`] of the claim with the label filter.
    pub(crate) explain_claim_labels: String,
}

/// [`PUBLISH`] with its key fragments and its way with stored ids.
fn publish(fragments: [(&str, &str); 6], on_conflict: &str) -> String {
    fragments
        .iter()
        .fold(PUBLISH.to_owned(), |sql, (from, to)| sql.replace(from, to))
        .replace("{PARKED}", PARKED)
        .replace("{ON_CONFLICT}", on_conflict)
}

/// Rewrites SQL written for the default table: `"switchyard_jobs…"` (a table reference)
/// becomes the schema-qualified, quoted name, and a bare `switchyard_jobs…` (an index name,
/// which PostgreSQL places in the table's schema) the bare table name. Both names are
/// validated identifiers.
pub(crate) fn specialise(sql: &str, schema: Option<&str>, table: &str) -> String {
    let qualified = match schema {
        Some(schema) => format!("\"{schema}\".\"{table}"),
        None => format!("\"{table}"),
    };
    sql.replace("{CLAIM}", CLAIM_SKIP_LOCKED)
        .replace("{CLAIM_SET}", CLAIM_SET)
        .replace("{RETURNING}", CLAIM_RETURNING)
        .replace("{STARTED}", STARTED)
        .replace("{CLAIMABLE}", CLAIMABLE)
        .replace("{FREE}", FREE)
        .replace("{FREE_U}", &FREE.replace("lease_until", "u.lease_until"))
        .replace("{FREE_P}", &FREE.replace("lease_until", "p.lease_until"))
        .replace("{DEAD_SELECTION}", DEAD_SELECTION)
        .replace("{ON_CONFLICT_REPLACE}", ON_CONFLICT_REPLACE)
        .replace("{US}", US)
        .replace("\"switchyard_jobs", "\u{0}")
        .replace("switchyard_jobs", table)
        .replace('\u{0}', &qualified)
}

impl Statements {
    pub(crate) fn new(schema: Option<&str>, table: &str) -> Self {
        let s = |sql: &str| specialise(sql, schema, table);
        // A claim statement with its holder's parameter, and the label filter's when
        // it filters (none: the filter is left out).
        let claim = |sql: &str, holder: &str, needles: &str| {
            let filter = if needles.is_empty() { "" } else { LABEL_FILTER };
            s(sql)
                .replace("{LABELS}", filter)
                .replace("{NEEDLES}", needles)
                .replace("{HOLDER}", holder)
        };
        Statements {
            any_due: s(ANY_DUE),
            any_expired: s(ANY_EXPIRED),
            promote_due: s(PROMOTE_DUE),
            claim_skip_locked: claim(CLAIM_SKIP_LOCKED, "$6", ""),
            claim_skip_locked_labels: claim(CLAIM_SKIP_LOCKED, "$6", "$7"),
            claim_for_move: claim(CLAIM_FOR_MOVE, "$6", ""),
            insert_dead: s(INSERT_DEAD),
            claim_candidates: claim(CLAIM_CANDIDATES, "", ""),
            claim_candidates_labels: claim(CLAIM_CANDIDATES, "", "$3"),
            claim_optimistic: claim(CLAIM_OPTIMISTIC, "$7", ""),
            claim_optimistic_round: claim(CLAIM_OPTIMISTIC_ROUND, "$6", ""),
            claim_optimistic_round_labels: claim(CLAIM_OPTIMISTIC_ROUND, "$6", "$9"),
            publish: s(&publish(UNKEYED, SKIP_STORED)),
            publish_fresh: s(&publish(UNKEYED, "")),
            publish_keyed: s(&publish(KEYED, SKIP_STORED)),
            publish_keyed_fresh: s(&publish(KEYED, "")),
            ack_batch: s(ACK_BATCH),
            start_batch: s(START_BATCH),
            release: s(RELEASE),
            snooze: s(SNOOZE),
            abandon: s(ABANDON),
            extend: s(EXTEND),
            move_leased_to_dead: s(MOVE_LEASED_TO_DEAD),
            move_expired: s(MOVE_EXPIRED),
            stats_jobs: s(STATS_JOBS),
            stats_dead: s(STATS_DEAD),
            list_dead: s(LIST_DEAD),
            dead_exists: s(DEAD_EXISTS),
            held: s(HELD),
            replay_dead: s(REPLAY_DEAD),
            select_replayed: s(SELECT_REPLAYED),
            move_keyed_to_dead: s(&MOVE_KEYED_TO_DEAD
                .replace("{HAND_ON}", HAND_ON)
                .replace("{CHANNEL}", "$5")),
            ack_keyed: s(&ACK_KEYED
                .replace("{HAND_ON}", HAND_ON)
                .replace("{CHANNEL}", "$3")),
            hand_on_skipped: s(&HAND_ON_SKIPPED
                .replace("{HAND_ON}", HAND_ON)
                .replace("{CHANNEL}", "$3")),
            lock_keys: s(LOCK_KEYS),
            repair_keys: s(REPAIR_KEYS),
            purge_dead: s(PURGE_DEAD),
            notify_queues: s(NOTIFY_QUEUES),
            explain_claim: claim(EXPLAIN_CLAIM, "$6", ""),
            explain_claim_labels: claim(EXPLAIN_CLAIM, "$6", "$7"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specialise_qualifies_tables_and_keeps_index_names_bare() {
        let sql = "CREATE INDEX IF NOT EXISTS switchyard_jobs_claim ON \"switchyard_jobs\" (q); \
                   SELECT 1 FROM \"switchyard_jobs_dead\"";
        assert_eq!(
            specialise(sql, Some("tenant_a"), "jobs"),
            "CREATE INDEX IF NOT EXISTS jobs_claim ON \"tenant_a\".\"jobs\" (q); \
             SELECT 1 FROM \"tenant_a\".\"jobs_dead\""
        );
        assert_eq!(
            specialise(sql, None, "jobs"),
            "CREATE INDEX IF NOT EXISTS jobs_claim ON \"jobs\" (q); SELECT 1 FROM \"jobs_dead\""
        );
    }
}
