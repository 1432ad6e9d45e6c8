//! Every statement of the transport, written for the default table name and specialised
//! once per transport for its validated database and table. `{IN}` marks where a list
//! of `?` placeholders goes, one per bound value.

/// The server's clock in integer microseconds since the epoch; constant within a
/// statement (both functions read the statement's start time). Sessions run with
/// `time_zone = '+00:00'`, so no DST fold can shift it. Integer arithmetic throughout:
/// `UNIX_TIMESTAMP(NOW(6)) * 1000000` is a DECIMAL, about six times as slow, and a
/// publish evaluates this three times per row.
const NOW: &str = "(UNIX_TIMESTAMP() * 1000000 + MICROSECOND(NOW(6)))";

pub(crate) const SELECT_NOW: &str = "SELECT {NOW}";

/// The `visible_at` of a message that waits for its ordering key: never due.
const PARKED: &str = "9223372036854775807";

/// `{KEYS}` of [`KEYS_IN_USE`] and [`NEXT_OF_KEYS`] for `n` keys.
pub(crate) fn key_terms(sql: &str, n: usize) -> String {
    sql.replace(
        "{KEYS}",
        &vec!["(queue = ? AND ordering_key = ?)"; n.max(1)].join(" OR "),
    )
}

/// Whether any waiting row (delayed, or leased) has become claimable: one step down the
/// due index.
pub(crate) const ANY_DUE: &str = "SELECT COALESCE((
    SELECT visible_at <= {NOW} FROM `switchyard_jobs`
     WHERE ready = 0 ORDER BY visible_at LIMIT 1), 0)";

/// Moves waiting rows whose time has come into the claim order.
pub(crate) const PROMOTE_DUE: &str = "UPDATE `switchyard_jobs` SET ready = 1
 WHERE ready = 0 AND visible_at <= {NOW} ORDER BY visible_at LIMIT 10000";

/// The rows a skip-locked claim takes, locked; rows other claims hold are skipped.
pub(crate) const CLAIM_LOCK: &str =
    "SELECT seq, prio_rank, visible_at FROM `switchyard_jobs` FORCE INDEX (claim_idx)
 WHERE queue = ? AND ready = 1 AND (expires_at IS NULL OR expires_at > {NOW}) {LABELS}
 ORDER BY prio_rank, visible_at, seq
 LIMIT ?
 FOR UPDATE SKIP LOCKED";

/// [`CLAIM_LOCK`] from a position in the claim order on: the rows of the same priority
/// after (`visible_at`, `seq`).
pub(crate) const CLAIM_LOCK_AFTER: &str = "SELECT seq, prio_rank, visible_at FROM `switchyard_jobs` FORCE INDEX (claim_idx)
 WHERE queue = ? AND ready = 1 AND prio_rank = ? AND (visible_at > ? OR (visible_at = ? AND seq > ?))
   AND (expires_at IS NULL OR expires_at > {NOW})
 ORDER BY prio_rank, visible_at, seq
 LIMIT ?
 FOR UPDATE SKIP LOCKED";

/// The rows of a queue that no worker holds, due or not, locked for a move to another
/// backend (tombstones excluded).
/// Read along the claim index's `(queue, ready)` prefix, in no particular order (a move
/// needs none), so that the locking read stops at the limit; `SKIP LOCKED` where the
/// server has it.
pub(crate) const CLAIM_LOCK_MOVE: &str = "SELECT seq FROM `switchyard_jobs` FORCE INDEX (claim_idx)
 WHERE queue = ? AND ready < 2 AND (ready = 1 OR token IS NULL OR visible_at <= {NOW})
   AND visible_at <> {PARKED}
 LIMIT ?
 FOR UPDATE {SKIP}";

/// Claims the locked rows of a move, not started, visible again (should the mover die)
/// at the later of their due time and the lease's end. Assigned left to right, as in
/// [`CLAIM_SET`].
pub(crate) const CLAIM_MOVE_LOCKED: &str = "UPDATE `switchyard_jobs`
   SET attempts = attempts + (token IS NOT NULL AND started = 1), started = 0,
       token = ?, reserved_at = {NOW}, visible_at = GREATEST(available_at, {NOW} + ?), ready = 0,
       claimed_by = ?
 WHERE seq IN ({IN})";

/// Stores a dead letter moved from another backend…
pub(crate) const INSERT_DEAD: &str = "REPLACE INTO `switchyard_jobs_dead`
    (id, queue, kind, priority, attempts, expires_at, reason, last_error, dead_at, envelope, labels,
     ordering_key)
    VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";

/// …with its tombstone in the jobs table, which keeps a republished id out (a live row of
/// the same id is left alone).
pub(crate) const INSERT_TOMBSTONE: &str = "INSERT IGNORE INTO `switchyard_jobs`
    (id, queue, kind, priority, prio_rank, attempts, ready, available_at, visible_at, created_at, envelope)
    VALUES (?, ?, ?, 0, 0, 0, 2, {NOW}, {NOW}, {NOW}, '')";

/// The candidates of an optimistic claim, read without locks.
pub(crate) const CLAIM_CANDIDATES: &str =
    "SELECT seq FROM `switchyard_jobs` FORCE INDEX (claim_idx)
 WHERE queue = ? AND ready = 1 AND (expires_at IS NULL OR expires_at > {NOW}) {LABELS}
 ORDER BY prio_rank, visible_at, seq
 LIMIT ?";

/// The lease a claim sets. Sessions run without `SIMULTANEOUS_ASSIGNMENT`, so MySQL and
/// MariaDB both assign left to right: `attempts` sees the old token and started flag (a
/// reclaim of a started message counts an attempt), `started` sees the new attempts
/// (mode 2 starts only messages without attempts), and the token changes last.
const CLAIM_SET: &str = "UPDATE `switchyard_jobs`
   SET attempts = attempts + (token IS NOT NULL AND started = 1),
       started = CASE ? WHEN 2 THEN attempts = 0 ELSE ? END,
       token = ?, reserved_at = {NOW}, visible_at = {NOW} + ?, ready = 0, claimed_by = ?";

/// A claim's label filter: the `,label,` needles, any of which matches, always
/// [`queue_core::labels::MAX_LABELS`] placeholders (the last needle repeated), so that
/// one prepared statement serves every filter.
const LABEL_FILTER: &str = "AND (LOCATE(?, labels) > 0 OR LOCATE(?, labels) > 0
   OR LOCATE(?, labels) > 0 OR LOCATE(?, labels) > 0 OR LOCATE(?, labels) > 0
   OR LOCATE(?, labels) > 0 OR LOCATE(?, labels) > 0 OR LOCATE(?, labels) > 0)";

/// Claims the locked rows of a skip-locked claim (same transaction).
pub(crate) const CLAIM_LOCKED: &str = "{CLAIM_SET} WHERE seq IN ({IN})";

/// Compare-and-set on candidates: claims those still ready. Walked by primary key in
/// `seq` order (one probe per candidate, never the claim index from its start), so two
/// claims given overlapping candidates lock them in one order.
pub(crate) const CLAIM_OPTIMISTIC: &str = "{CLAIM_SET}
 WHERE queue = ? AND ready = 1 AND (expires_at IS NULL OR expires_at > {NOW}) AND seq IN ({IN})
 ORDER BY seq
 LIMIT ?";

/// The rows a claim took, read back (MySQL has no `UPDATE … RETURNING`).
pub(crate) const CLAIMED: &str = "SELECT seq, id, priority, attempts, available_at, last_error,
       CAST(envelope AS BINARY), started
  FROM `switchyard_jobs` WHERE token = ? AND seq IN ({IN})";

/// One row of a multi-row publish (`visible_at` takes the value just given to
/// `available_at`).
pub(crate) const PUBLISH_ROW: &str =
    "(?, ?, ?, ?, ?, ?, ?, {NOW} + ?, available_at, {NOW} + ?, ?, {NOW}, ?, ?)";

/// One row of a publish with ordering keys: as [`PUBLISH_ROW`], then whether it is
/// parked (waits for its key, `visible_at` never due) and its key.
pub(crate) const PUBLISH_ROW_KEYED: &str =
    "(?, ?, ?, ?, ?, ?, ?, {NOW} + ?, IF(?, {PARKED}, available_at), {NOW} + ?, ?, {NOW}, ?, ?, ?)";

/// A publish: the rows come as [`PUBLISH_ROW`]s in `{ROWS}`. An id already stored, live
/// or dead (its tombstone), stores nothing new.
pub(crate) const PUBLISH: &str = "INSERT INTO `switchyard_jobs`
    (id, queue, kind, priority, prio_rank, attempts, ready, available_at, visible_at,
     expires_at, last_error, created_at, envelope, labels{KEY_COLUMN})
VALUES {ROWS}
ON DUPLICATE KEY UPDATE seq = seq";

/// Locks the rows of the keys in `{ROWS}` (`(?, ?)` each: queue, key; in one order),
/// creating them: publishers and hand-overs of a key wait for each other here.
pub(crate) const LOCK_KEYS: &str = "INSERT INTO `switchyard_jobs_keys` (queue, okey) VALUES {ROWS}
ON DUPLICATE KEY UPDATE okey = okey";

/// Which of the keys in `{KEYS}` (`(queue = ? AND ordering_key = ?)` each) have a live
/// message stored: a message published for one of them is parked behind it. Read after
/// the keys' locks, at READ COMMITTED (an outbox publish in a transaction at another
/// level is refused), so that it sees every commit made before them.
pub(crate) const KEYS_IN_USE: &str =
    "SELECT DISTINCT CAST(queue AS BINARY), CAST(ordering_key AS BINARY)
  FROM `switchyard_jobs` FORCE INDEX (keys_idx)
 WHERE ready < 2 AND ({KEYS})";

/// The oldest live message of each key in `{KEYS}`: after its head left, the next.
pub(crate) const NEXT_OF_KEYS: &str = "SELECT MIN(seq)
  FROM `switchyard_jobs` FORCE INDEX (keys_idx)
 WHERE ready < 2 AND ({KEYS})
 GROUP BY queue, ordering_key";

/// Hands keys to the rows of `{IN}` that are parked: ready when due (ahead of the claim
/// cursor, whose order is by the time a message became claimable), else due at their
/// time.
pub(crate) const HAND_ON: &str = "UPDATE `switchyard_jobs`
   SET ready = (available_at <= {NOW}), visible_at = GREATEST(available_at, {NOW})
 WHERE seq IN ({IN}) AND visible_at = {PARKED} AND ready = 0";

/// Parks the keyed rows above seq `?` (just replayed, under their keys' locks) that have
/// an older live message of their key.
pub(crate) const PARK_NEW: &str = "UPDATE `switchyard_jobs` j
  JOIN (SELECT DISTINCT p.seq FROM `switchyard_jobs` p
         WHERE p.seq > ? AND p.ordering_key IS NOT NULL AND p.ready < 2 AND p.token IS NULL
           AND EXISTS (SELECT 1 FROM `switchyard_jobs` e FORCE INDEX (keys_idx)
                        WHERE e.queue = p.queue AND e.ordering_key = p.ordering_key
                          AND e.seq < p.seq AND e.ready < 2)) x ON j.seq = x.seq
   SET j.ready = 0, j.visible_at = {PARKED}";

/// Parked messages with nothing live before them in their key: keys whose head left
/// without handing them on (an expired head, a quarantined one, a mover that died).
/// Both indexes are forced: on a table just filled, stale statistics made MariaDB look
/// for an older message of the key along the primary key, once per parked message (a
/// drain of 20,000 keyed messages stalled for minutes behind it).
pub(crate) const ORPHANED_HEADS: &str =
    "SELECT p.seq FROM `switchyard_jobs` p FORCE INDEX (due_idx)
 WHERE p.ready = 0 AND p.visible_at = {PARKED} AND p.ordering_key IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM `switchyard_jobs` e FORCE INDEX (keys_idx)
                    WHERE e.queue = p.queue AND e.ordering_key = p.ordering_key
                      AND e.seq < p.seq AND e.ready < 2)
 LIMIT 1000";

/// Forgets the key rows of keys without live messages.
pub(crate) const PRUNE_KEYS: &str = "DELETE FROM `switchyard_jobs_keys`
 WHERE NOT EXISTS (SELECT 1 FROM `switchyard_jobs` j FORCE INDEX (keys_idx)
                    WHERE j.queue = `switchyard_jobs_keys`.queue
                      AND j.ordering_key = `switchyard_jobs_keys`.okey AND j.ready < 2)
 LIMIT 1000";

/// The rows of a batch, locked, to match them against their tokens.
pub(crate) const LOCK_BY_IDS: &str =
    "SELECT seq, id, token FROM `switchyard_jobs` WHERE id IN ({IN}) FOR UPDATE";

pub(crate) const DELETE_BY_SEQS: &str = "DELETE FROM `switchyard_jobs` WHERE seq IN ({IN})";

/// What a row becomes once its message is in the dead table: a tombstone that keeps its
/// id taken (ready = 2: no claim, promotion, expiry or count ever sees it).
const TOMBSTONE: &str = "UPDATE `switchyard_jobs`
   SET ready = 2, token = NULL, reserved_at = NULL, started = 0, expires_at = NULL, ordering_key = NULL,
       last_error = NULL, envelope = '', visible_at = {NOW}";

/// Leaves tombstones of expired rows that were copied to the dead table (same
/// transaction).
pub(crate) const BURY_BY_SEQS: &str = "{TOMBSTONE} WHERE seq IN ({IN})";

/// Marks rows started and renews their leases.
pub(crate) const START_BY_SEQS: &str = "UPDATE `switchyard_jobs`
   SET started = 1, ready = 0, visible_at = {NOW} + ? WHERE seq IN ({IN})";

/// Gives a leased row back: due after `?` µs, ready at once when that is 0.
pub(crate) const RELEASE: &str = "UPDATE `switchyard_jobs`
   SET attempts = attempts + 1, started = 0, available_at = {NOW} + ?,
       visible_at = {NOW} + ?, ready = (? <= 0), last_error = COALESCE(?, last_error),
       reserved_at = NULL, claimed_by = NULL, token = NULL
 WHERE id = ? AND token = ?";

/// Gives a leased row back without counting an attempt (the handler snoozed, or a rate
/// limit said to wait): due after some µs, and ready at once when that is 0; its last
/// error is kept.
pub(crate) const SNOOZE: &str = "UPDATE `switchyard_jobs`
   SET started = 0, available_at = {NOW} + ?, visible_at = {NOW} + ?, ready = (? <= 0),
       reserved_at = NULL, claimed_by = NULL, token = NULL
 WHERE id = ? AND token = ?";

/// Gives back a row that was claimed but never handled: ready at once, no attempt.
pub(crate) const ABANDON: &str = "UPDATE `switchyard_jobs`
   SET started = 0, visible_at = {NOW}, ready = 1, reserved_at = NULL, claimed_by = NULL, token = NULL
 WHERE id = ? AND token = ?";

/// Renews a lease (and hides a lapsed, promoted one again while nobody reclaimed it).
pub(crate) const EXTEND: &str = "UPDATE `switchyard_jobs`
   SET visible_at = {NOW} + ?, ready = 0 WHERE id = ? AND token = ?";

/// Locks a leased row while its lease holds, before it moves to the dead table (the copy
/// below reads without locks at READ COMMITTED).
pub(crate) const LOCK_LEASED: &str =
    "SELECT seq FROM `switchyard_jobs` WHERE seq = ? AND token = ? FOR UPDATE";

/// Copies a leased row, byte for byte, into the dead table (the delivery that ends here
/// counts as an attempt if a handler started it)…
pub(crate) const COPY_LEASED_TO_DEAD: &str = "REPLACE INTO `switchyard_jobs_dead`
    (id, queue, kind, priority, attempts, expires_at, reason, last_error, dead_at, envelope, labels,
     ordering_key)
SELECT id, queue, kind, priority, attempts + started, expires_at, ?, COALESCE(?, last_error),
       {NOW}, envelope, labels, ordering_key
  FROM `switchyard_jobs` WHERE seq = ? AND token = ?";

/// …then leaves its tombstone (same transaction).
pub(crate) const BURY_LEASED: &str = "{TOMBSTONE} WHERE seq = ? AND token = ?";

/// Whether any row has expired (one step down the expiry index).
pub(crate) const ANY_EXPIRED: &str = "SELECT COALESCE((
    SELECT expires_at <= {NOW} FROM `switchyard_jobs`
     WHERE expires_at IS NOT NULL ORDER BY expires_at LIMIT 1), 0)";

/// Unleased rows that expired, locked (up to 1,000).
pub(crate) const LOCK_EXPIRED: &str = "SELECT seq FROM `switchyard_jobs`
 WHERE expires_at <= {NOW} AND visible_at <= {NOW}
 ORDER BY expires_at LIMIT 1000 FOR UPDATE {SKIP}";

pub(crate) const COPY_EXPIRED: &str = "REPLACE INTO `switchyard_jobs_dead`
    (id, queue, kind, priority, attempts, expires_at, reason, last_error, dead_at, envelope, labels,
     ordering_key)
SELECT id, queue, kind, priority, attempts + started, expires_at, 'expired', last_error, {NOW},
       envelope, labels, ordering_key
  FROM `switchyard_jobs` WHERE seq IN ({IN})";

pub(crate) const STATS_JOBS: &str = "SELECT CAST(queue AS BINARY),
       CAST(SUM(visible_at <= ?) AS SIGNED),
       CAST(SUM(token IS NULL AND visible_at > ?) AS SIGNED),
       CAST(SUM(token IS NOT NULL AND visible_at > ?) AS SIGNED),
       MIN(CASE WHEN visible_at <= ? AND (expires_at IS NULL OR expires_at > ?)
                THEN available_at END)
  FROM `switchyard_jobs`
 WHERE (? IS NULL OR queue = ?) AND ready < 2
 GROUP BY queue";

pub(crate) const STATS_DEAD: &str = "SELECT CAST(queue AS BINARY), COUNT(*)
  FROM `switchyard_jobs_dead` WHERE ? IS NULL OR queue = ? GROUP BY queue";

pub(crate) const LIST_DEAD: &str = "SELECT CAST(id AS BINARY), CAST(queue AS BINARY),
       CAST(kind AS BINARY), attempts, CAST(reason AS BINARY), CAST(last_error AS BINARY),
       dead_at, CAST(envelope AS BINARY)
  FROM `switchyard_jobs_dead`
 WHERE ? IS NULL OR queue = ?
 ORDER BY dead_at, id
 LIMIT ?";

/// Messages held under a lease that has not run out (queue and id each bound twice,
/// then the limit), longest held first: a range of the due index.
pub(crate) const HELD: &str = "SELECT CAST(id AS BINARY), CAST(queue AS BINARY),
       CAST(kind AS BINARY), CAST(claimed_by AS BINARY), reserved_at, visible_at, started, attempts
  FROM `switchyard_jobs`
 WHERE ready = 0 AND visible_at > {NOW} AND token IS NOT NULL
   AND (? IS NULL OR queue = ?) AND (? IS NULL OR id = ?)
 ORDER BY reserved_at, seq
 LIMIT ?";

pub(crate) const DEAD_EXISTS: &str =
    "SELECT EXISTS (SELECT 1 FROM `switchyard_jobs_dead` WHERE id = ?)";

/// The selection of a replay or purge: queue, id, dead before (each bound twice).
const DEAD_SELECTION: &str = "(? IS NULL OR d.queue = ?) AND (? IS NULL OR d.id = ?)
   AND (? IS NULL OR d.dead_at <= ?)";

pub(crate) const MAX_SEQ: &str = "SELECT COALESCE(MAX(seq), 0) FROM `switchyard_jobs`";

/// The queues of the rows published after one seq, up to another (a primary-key range).
pub(crate) const QUEUES_BETWEEN: &str =
    "SELECT DISTINCT CAST(queue AS BINARY) FROM `switchyard_jobs`
 WHERE seq > ? AND seq <= ?";

/// Puts the selected dead letters back, byte for byte, ready now with attempts reset and
/// no expiry. An id that is live again is left alone.
pub(crate) const REPLAY_DEAD: &str = "INSERT INTO `switchyard_jobs`
    (id, queue, kind, priority, prio_rank, attempts, ready, available_at, visible_at,
     expires_at, last_error, created_at, envelope, labels, ordering_key)
SELECT id, queue, kind, priority, -priority, 0, 1, {NOW}, {NOW}, NULL, last_error, {NOW}, envelope,
       labels, ordering_key
  FROM `switchyard_jobs_dead` d
 WHERE d.id IN ({IN})
   AND NOT EXISTS (SELECT 1 FROM `switchyard_jobs` j WHERE j.id = d.id)
 ORDER BY dead_at, id";

/// Deletes the dead letters the replay just inserted (rows above the old maximum seq).
pub(crate) const DELETE_REPLAYED: &str = "DELETE d FROM `switchyard_jobs_dead` d
  JOIN `switchyard_jobs` j ON j.id = d.id AND j.seq > ?
 WHERE d.id IN ({IN})";

/// The dead letters a replay selects, locked, with their keys: the replay takes the
/// keys' locks and then moves exactly these, so that the key's messages it sees are all
/// there are and its rows' seqs come after them.
pub(crate) const SELECT_REPLAYED: &str = "SELECT CAST(d.id AS BINARY), CAST(d.queue AS BINARY),
       CAST(d.ordering_key AS BINARY)
  FROM `switchyard_jobs_dead` d
 WHERE {DEAD_SELECTION} ORDER BY d.dead_at, d.id FOR UPDATE";

/// The ids of up to 4,096 selected dead letters, locked: a purge deletes exactly these
/// and their tombstones, whatever is dead-lettered meanwhile.
pub(crate) const LOCK_DEAD: &str = "SELECT CAST(d.id AS BINARY) FROM `switchyard_jobs_dead` d
 WHERE {DEAD_SELECTION} ORDER BY d.id LIMIT 4096 FOR UPDATE";

pub(crate) const DELETE_DEAD_BY_IDS: &str = "DELETE FROM `switchyard_jobs_dead` WHERE id IN ({IN})";

pub(crate) const DELETE_TOMBSTONES_BY_IDS: &str =
    "DELETE FROM `switchyard_jobs` WHERE ready = 2 AND id IN ({IN})";

/// Tombstones whose dead letter is gone (left by a version-1 purge during an upgrade):
/// their ids are free again.
pub(crate) const DELETE_ORPHAN_TOMBSTONES: &str = "DELETE j FROM `switchyard_jobs` j
 WHERE j.ready = 2 AND NOT EXISTS (SELECT 1 FROM `switchyard_jobs_dead` d WHERE d.id = j.id)";

/// The statements specialised for one database and table.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) select_now: String,
    pub(crate) any_due: String,
    pub(crate) promote_due: String,
    pub(crate) claim_lock: String,
    /// [`CLAIM_LOCK`] with the label filter.
    pub(crate) claim_lock_labels: String,
    pub(crate) claim_lock_move: String,
    pub(crate) claim_move_locked: String,
    pub(crate) insert_dead: String,
    pub(crate) insert_tombstone: String,
    pub(crate) claim_lock_after: String,
    pub(crate) claim_candidates: String,
    /// [`CLAIM_CANDIDATES`] with the label filter.
    pub(crate) claim_candidates_labels: String,
    pub(crate) claim_locked: String,
    pub(crate) claim_optimistic: String,
    pub(crate) claimed: String,
    pub(crate) publish_row: String,
    pub(crate) publish: String,
    pub(crate) publish_keyed: String,
    pub(crate) publish_row_keyed: String,
    pub(crate) lock_keys: String,
    pub(crate) keys_in_use: String,
    pub(crate) next_of_keys: String,
    pub(crate) hand_on: String,
    pub(crate) park_new: String,
    pub(crate) orphaned_heads: String,
    pub(crate) prune_keys: String,
    pub(crate) select_replayed: String,
    pub(crate) lock_by_ids: String,
    pub(crate) delete_by_seqs: String,
    pub(crate) start_by_seqs: String,
    pub(crate) release: String,
    pub(crate) snooze: String,
    pub(crate) abandon: String,
    pub(crate) extend: String,
    pub(crate) lock_leased: String,
    pub(crate) copy_leased_to_dead: String,
    pub(crate) bury_leased: String,
    pub(crate) bury_by_seqs: String,
    pub(crate) any_expired: String,
    pub(crate) lock_expired: String,
    pub(crate) copy_expired: String,
    pub(crate) stats_jobs: String,
    pub(crate) stats_dead: String,
    pub(crate) list_dead: String,
    pub(crate) dead_exists: String,
    pub(crate) held: String,
    pub(crate) max_seq: String,
    pub(crate) queues_between: String,
    pub(crate) replay_dead: String,
    pub(crate) delete_replayed: String,
    pub(crate) lock_dead: String,
    pub(crate) delete_dead_by_ids: String,
    pub(crate) delete_tombstones_by_ids: String,
    pub(crate) delete_orphan_tombstones: String,
}

/// Rewrites SQL written for the default table: `` `switchyard_jobs…` `` (a table
/// reference) becomes the database-qualified name, and a bare `switchyard_jobs…` (an
/// index name) the bare table name. Both names are validated identifiers.
pub(crate) fn specialise(sql: &str, schema: Option<&str>, table: &str) -> String {
    let qualified = match schema {
        Some(schema) => format!("`{schema}`.`{table}"),
        None => format!("`{table}"),
    };
    sql.replace("{CLAIM_SET}", CLAIM_SET)
        .replace("{TOMBSTONE}", TOMBSTONE)
        .replace("{DEAD_SELECTION}", DEAD_SELECTION)
        .replace("{NOW}", NOW)
        .replace("{PARKED}", PARKED)
        .replace("`switchyard_jobs", "\u{0}")
        .replace("switchyard_jobs", table)
        .replace('\u{0}', &qualified)
}

/// `sql` with `{IN}` replaced by placeholders for `n` values, rounded up to a power of
/// two so that a connection prepares a handful of statements, not one per batch size;
/// bind the values through [`padded`].
pub(crate) fn with_list(sql: &str, n: usize) -> String {
    let list = vec!["?"; n.max(1).next_power_of_two()].join(", ");
    sql.replace("{IN}", &list)
}

/// A label filter's needles as its [`MAX_LABELS`](queue_core::labels::MAX_LABELS)
/// parameters: the last one repeated (a repeated needle changes nothing in an `OR`).
pub(crate) fn label_params(needles: &[String]) -> impl Iterator<Item = &str> + '_ {
    let last = needles.last().map_or("", String::as_str);
    (0..queue_core::labels::MAX_LABELS).map(move |i| needles.get(i).map_or(last, String::as_str))
}

/// `values` repeated at the end up to the list length of [`with_list`] (a repeated value
/// changes nothing in an `IN` list).
pub(crate) fn padded<T: Clone>(values: &[T]) -> impl Iterator<Item = T> + '_ {
    let n = values.len().max(1).next_power_of_two();
    values
        .iter()
        .cloned()
        .chain(std::iter::repeat_n(values.last().cloned(), n - values.len()).flatten())
}

impl Statements {
    pub(crate) fn new(schema: Option<&str>, table: &str, skip_locked: bool) -> Self {
        let s = |sql: &str| specialise(sql, schema, table);
        let skip = if skip_locked { "SKIP LOCKED" } else { "" };
        Statements {
            select_now: s(SELECT_NOW),
            any_due: s(ANY_DUE),
            promote_due: s(PROMOTE_DUE),
            claim_lock: s(CLAIM_LOCK).replace("{LABELS}", ""),
            claim_lock_labels: s(CLAIM_LOCK).replace("{LABELS}", LABEL_FILTER),
            claim_lock_move: s(CLAIM_LOCK_MOVE).replace("{SKIP}", skip),
            claim_move_locked: s(CLAIM_MOVE_LOCKED),
            insert_dead: s(INSERT_DEAD),
            insert_tombstone: s(INSERT_TOMBSTONE),
            claim_lock_after: s(CLAIM_LOCK_AFTER),
            claim_candidates: s(CLAIM_CANDIDATES).replace("{LABELS}", ""),
            claim_candidates_labels: s(CLAIM_CANDIDATES).replace("{LABELS}", LABEL_FILTER),
            claim_locked: s(CLAIM_LOCKED),
            claim_optimistic: s(CLAIM_OPTIMISTIC),
            claimed: s(CLAIMED),
            publish_row: s(PUBLISH_ROW),
            publish: s(&PUBLISH.replace("{KEY_COLUMN}", "")),
            publish_keyed: s(&PUBLISH.replace("{KEY_COLUMN}", ", ordering_key")),
            publish_row_keyed: s(PUBLISH_ROW_KEYED),
            lock_keys: s(LOCK_KEYS),
            keys_in_use: s(KEYS_IN_USE),
            next_of_keys: s(NEXT_OF_KEYS),
            hand_on: s(HAND_ON),
            park_new: s(PARK_NEW),
            orphaned_heads: s(ORPHANED_HEADS),
            prune_keys: s(PRUNE_KEYS),
            select_replayed: s(SELECT_REPLAYED),
            lock_by_ids: s(LOCK_BY_IDS),
            delete_by_seqs: s(DELETE_BY_SEQS),
            start_by_seqs: s(START_BY_SEQS),
            release: s(RELEASE),
            snooze: s(SNOOZE),
            abandon: s(ABANDON),
            extend: s(EXTEND),
            lock_leased: s(LOCK_LEASED),
            copy_leased_to_dead: s(COPY_LEASED_TO_DEAD),
            bury_leased: s(BURY_LEASED),
            bury_by_seqs: s(BURY_BY_SEQS),
            any_expired: s(ANY_EXPIRED),
            lock_expired: s(LOCK_EXPIRED).replace("{SKIP}", skip),
            copy_expired: s(COPY_EXPIRED),
            stats_jobs: s(STATS_JOBS),
            stats_dead: s(STATS_DEAD),
            list_dead: s(LIST_DEAD),
            dead_exists: s(DEAD_EXISTS),
            held: s(HELD),
            max_seq: s(MAX_SEQ),
            queues_between: s(QUEUES_BETWEEN),
            replay_dead: s(REPLAY_DEAD),
            delete_replayed: s(DELETE_REPLAYED),
            lock_dead: s(LOCK_DEAD),
            delete_dead_by_ids: s(DELETE_DEAD_BY_IDS),
            delete_tombstones_by_ids: s(DELETE_TOMBSTONES_BY_IDS),
            delete_orphan_tombstones: s(DELETE_ORPHAN_TOMBSTONES),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specialise_qualifies_tables_and_keeps_index_names_bare() {
        let sql = "KEY switchyard_jobs_claim (q); SELECT 1 FROM `switchyard_jobs_dead`";
        assert_eq!(
            specialise(sql, Some("tenant_a"), "jobs"),
            "KEY jobs_claim (q); SELECT 1 FROM `tenant_a`.`jobs_dead`"
        );
        assert_eq!(with_list("IN ({IN})", 3), "IN (?, ?, ?, ?)");
        assert_eq!(padded(&[1, 2, 3]).collect::<Vec<_>>(), [1, 2, 3, 3]);
    }
}
