//! Every statement of the transport, written for the default table name and specialised
//! once per transport for its validated table name. Identifiers are quoted.

/// SQLite's clock in integer microseconds since the epoch: the one clock every time
/// comparison uses. `'now'` is stable within one statement.
pub(crate) const NOW: &str = "CAST(unixepoch('subsec') * 1000000 AS INTEGER)";

pub(crate) const SELECT_NOW: &str = "SELECT {NOW}";

/// The `visible_at` of a message that waits for its ordering key: never due.
const PARKED: &str = "9223372036854775807";

/// The started flag a claim sets from its mode parameter (0 no, 1 yes, 2 only when the
/// message comes with no attempts); SET expressions see the row's old values.
const STARTED: &str =
    "started = CASE ?N WHEN 2 THEN (attempts + (token IS NOT NULL AND started = 1)) = 0 ELSE ?N END";

/// Columns returned by every claim, in the order `transport::claimed_row` reads them.
/// Values are cast so that a row written by another program with odd types or bytes is
/// still read, and then quarantined rather than failing the whole claim.
const CLAIM_RETURNING: &str = "RETURNING seq, CAST(id AS BLOB), CAST(priority AS INTEGER), \
    CAST(attempts AS INTEGER), CAST(available_at AS INTEGER), CAST(last_error AS BLOB), \
    CAST(envelope AS BLOB), started";

/// Whether any waiting row (delayed, or leased) has become claimable: a read on the
/// reader pool, so an idle poll takes no write lock.
pub(crate) const ANY_DUE: &str =
    "SELECT EXISTS (SELECT 1 FROM \"switchyard_jobs\" WHERE ready = 0 AND visible_at <= {NOW})";

/// Moves waiting rows whose time has come into the claim index: due delayed messages and
/// messages whose lease ran out (they keep their old token, so their reclaim counts an
/// attempt).
pub(crate) const PROMOTE_DUE: &str =
    "UPDATE \"switchyard_jobs\" SET ready = 1 WHERE ready = 0 AND visible_at <= {NOW}";

/// Claims up to ?4 ready rows of queue ?3 in one atomic statement under SQLite's
/// single-writer lock: the equivalent of `FOR UPDATE SKIP LOCKED`. A reclaim (the old
/// token is still there) counts an attempt only if the message had been started; ?5 says
/// whether this claim starts it (a plain reserve) or only claims it ahead (a prefetch).
pub(crate) const CLAIM_SKIP_LOCKED: &str = "
UPDATE \"switchyard_jobs\"
   SET token = ?1, reserved_at = {NOW}, visible_at = {NOW} + ?2, ready = 0, {STARTED5},
       attempts = attempts + (token IS NOT NULL AND started = 1), claimed_by = ?6
 WHERE seq IN (SELECT seq FROM \"switchyard_jobs\"
                WHERE queue = ?3 AND ready = 1
                  AND (expires_at IS NULL OR expires_at > {NOW}) {LABELS}
                ORDER BY priority DESC, visible_at, seq
                LIMIT ?4)
{RETURNING}";

/// Claims up to ?4 rows of queue ?3 that no worker holds, due or not, for a move to
/// another backend: not started, and visible again (should the mover die) at the later
/// of their due time and the lease's end.
pub(crate) const CLAIM_FOR_MOVE: &str = "
UPDATE \"switchyard_jobs\"
   SET token = ?1, reserved_at = {NOW}, visible_at = MAX(available_at, {NOW} + ?2), ready = 0,
       started = 0, attempts = attempts + (token IS NOT NULL AND started = 1), claimed_by = ?5
 WHERE seq IN (SELECT seq FROM \"switchyard_jobs\"
                WHERE queue = ?3 AND (ready = 1 OR token IS NULL OR visible_at <= {NOW})
                  AND visible_at <> {PARKED}
                ORDER BY seq
                LIMIT ?4)
{RETURNING}";

/// Stores a dead letter moved from another backend.
pub(crate) const INSERT_DEAD: &str = "INSERT OR REPLACE INTO \"switchyard_jobs_dead\"
    (id, queue, kind, priority, attempts, expires_at, reason, last_error, dead_at, envelope, labels,
     ordering_key)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)";

/// A claim's label filter: `{NEEDLES}` is the parameter holding a JSON array of
/// `,label,` needles, any of which matches; checked on each row as the claim walks the
/// claim index. `{LABELS}` is empty in the claims that take any label.
const LABEL_FILTER: &str =
    "AND EXISTS (SELECT 1 FROM json_each({NEEDLES}) AS n WHERE instr(labels, n.value) > 0)";

/// The candidates of an optimistic claim, in delivery order.
pub(crate) const CLAIM_CANDIDATES: &str = "
SELECT seq FROM \"switchyard_jobs\"
 WHERE queue = ?1 AND ready = 1
   AND (expires_at IS NULL OR expires_at > {NOW}) {LABELS}
 ORDER BY priority DESC, visible_at, seq
 LIMIT ?2";

/// Compare-and-set on a set of candidates (a JSON array of seqs in ?3) of queue ?4: claims
/// up to ?5 of those that are still ready, in one statement and one commit.
/// The batched form of the portable `UPDATE … WHERE id = ? AND (not leased)`: a
/// candidate a competitor took is skipped instead of fought over.
pub(crate) const CLAIM_OPTIMISTIC: &str = "
UPDATE \"switchyard_jobs\"
   SET token = ?1, reserved_at = {NOW}, visible_at = {NOW} + ?2, ready = 0, {STARTED6},
       attempts = attempts + (token IS NOT NULL AND started = 1), claimed_by = ?7
 WHERE seq IN (SELECT seq FROM \"switchyard_jobs\"
                WHERE seq IN (SELECT value FROM json_each(?3)) AND queue = ?4 AND ready = 1
                  AND (expires_at IS NULL OR expires_at > {NOW})
                ORDER BY priority DESC, visible_at, seq
                LIMIT ?5)
{RETURNING}";

/// Start of a multi-row publish: the rows come as `VALUES (…), (…)` appended by the
/// caller (id, queue, kind, priority, attempts, ready, due and expiry offsets in µs,
/// last error, envelope, labels, ordering key; a new row is visible when due), and are
/// filtered so that an id that is dead stores nothing new either. `{NOW}` is evaluated
/// once per statement, in `n` (a subquery without `FROM`, never flattened into the
/// rows), instead of four times per row: the same value, as `'now'` is stable within a
/// statement's step, and the rows are plain parameters. Batched publishes ran 1.09
/// times as fast.
pub(crate) const INSERT_JOBS_HEAD: &str = "INSERT INTO \"switchyard_jobs\" \
    (id, queue, kind, priority, attempts, ready, available_at, visible_at, expires_at, last_error, created_at, envelope, labels, ordering_key) \
    SELECT v.column1, v.column2, v.column3, v.column4, v.column5, v.column6, \
           n.now + v.column7, n.now + v.column7, n.now + v.column8, v.column9, n.now, \
           v.column10, v.column11, v.column12 \
      FROM (SELECT {NOW} AS now) AS n, (";

/// End of a multi-row publish: a stored id (live or dead) stores nothing new.
pub(crate) const INSERT_JOBS_TAIL: &str = ") AS v \
    WHERE v.column1 NOT IN (SELECT id FROM \"switchyard_jobs_dead\") \
    ON CONFLICT (id) DO NOTHING";

/// Acks a batch in one statement: ?1 is a JSON array of `[id, token]` pairs; the join is
/// driven from the pairs and looks each row up by id, so it never scans the table.
pub(crate) const ACK_BATCH: &str = "
DELETE FROM \"switchyard_jobs\"
 WHERE seq IN (SELECT j.seq FROM json_each(?1) AS p
                 JOIN \"switchyard_jobs\" AS j
                   ON j.id = p.value ->> 0 AND j.token = p.value ->> 1)
RETURNING id, token";

/// Gives a leased row back: due after ?1 µs, and ready at once when ?1 is 0.
pub(crate) const RELEASE: &str = "
UPDATE \"switchyard_jobs\"
   SET token = NULL, reserved_at = NULL, claimed_by = NULL, attempts = attempts + 1, started = 0,
       available_at = {NOW} + ?1, visible_at = {NOW} + ?1, ready = (?1 <= 0),
       last_error = COALESCE(?2, last_error)
 WHERE id = ?3 AND token = ?4";

/// Gives a leased row back without counting an attempt (the handler snoozed, or a rate
/// limit said to wait): due after ?1 µs, and ready at once when ?1 is 0; its last error
/// is kept.
pub(crate) const SNOOZE: &str = "
UPDATE \"switchyard_jobs\"
   SET token = NULL, reserved_at = NULL, claimed_by = NULL, started = 0,
       available_at = {NOW} + ?1, visible_at = {NOW} + ?1, ready = (?1 <= 0)
 WHERE id = ?2 AND token = ?3";

/// Gives back a row that was claimed but never handled: ready at once, and no attempt
/// counted (the token is cleared, so the next claim is not a reclaim).
pub(crate) const ABANDON: &str = "
UPDATE \"switchyard_jobs\"
   SET token = NULL, reserved_at = NULL, claimed_by = NULL, started = 0, visible_at = {NOW},
       ready = 1
 WHERE id = ?1 AND token = ?2";

/// Renews a lease. A lapsed lease may already have been promoted into the claim index;
/// while the token still matches nobody has reclaimed it, so it is hidden again.
pub(crate) const EXTEND: &str =
    "UPDATE \"switchyard_jobs\" SET visible_at = {NOW} + ?1, ready = 0 WHERE id = ?2 AND token = ?3";

/// Marks a batch as started (?1: JSON `[id, token]` pairs) and renews their leases by ?2:
/// from now on a lapsed lease counts an attempt.
pub(crate) const START_BATCH: &str = "
UPDATE \"switchyard_jobs\" SET started = 1, ready = 0, visible_at = {NOW} + ?2
 WHERE seq IN (SELECT j.seq FROM json_each(?1) AS p
                 JOIN \"switchyard_jobs\" AS j
                   ON j.id = p.value ->> 0 AND j.token = p.value ->> 1)
RETURNING id, token";

/// Copies a leased row, byte for byte, into the dead table (the delivery that ends here
/// counts as an attempt if a handler started it)…
pub(crate) const COPY_LEASED_TO_DEAD: &str = "
INSERT OR REPLACE INTO \"switchyard_jobs_dead\"
    (id, queue, kind, priority, attempts, expires_at, reason, last_error, dead_at, envelope, labels,
     ordering_key)
SELECT id, queue, kind, priority, attempts + started, expires_at, ?3, COALESCE(?4, last_error), {NOW},
       envelope, labels, ordering_key
  FROM \"switchyard_jobs\"
 WHERE seq = ?1 AND token = ?2";

/// …then deletes it (same transaction).
pub(crate) const DELETE_LEASED: &str =
    "DELETE FROM \"switchyard_jobs\" WHERE seq = ?1 AND token = ?2";

/// Copies unleased rows that expired by ?1 into the dead table…
pub(crate) const COPY_EXPIRED: &str = "
INSERT OR REPLACE INTO \"switchyard_jobs_dead\"
    (id, queue, kind, priority, attempts, expires_at, reason, last_error, dead_at, envelope, labels,
     ordering_key)
SELECT id, queue, kind, priority, attempts + started, expires_at, 'expired', last_error, ?1,
       envelope, labels, ordering_key
  FROM \"switchyard_jobs\"
 WHERE expires_at <= ?1 AND visible_at <= ?1";

/// …then deletes exactly those rows (same cutoff, same transaction).
pub(crate) const DELETE_EXPIRED: &str =
    "DELETE FROM \"switchyard_jobs\" WHERE expires_at <= ?1 AND visible_at <= ?1";

pub(crate) const STATS_JOBS: &str = "
SELECT CAST(queue AS BLOB),
       SUM(visible_at <= ?2),
       SUM(token IS NULL AND visible_at > ?2),
       SUM(token IS NOT NULL AND visible_at > ?2),
       MIN(CASE WHEN visible_at <= ?2 AND (expires_at IS NULL OR expires_at > ?2)
                THEN available_at END)
  FROM \"switchyard_jobs\"
 WHERE ?1 IS NULL OR queue = ?1
 GROUP BY queue";

pub(crate) const STATS_DEAD: &str = "
SELECT CAST(queue AS BLOB), COUNT(*) FROM \"switchyard_jobs_dead\"
 WHERE ?1 IS NULL OR queue = ?1
 GROUP BY queue";

pub(crate) const LIST_DEAD: &str = "
SELECT CAST(id AS BLOB), CAST(queue AS BLOB), CAST(kind AS BLOB), CAST(attempts AS INTEGER),
       CAST(reason AS BLOB), CAST(last_error AS BLOB), CAST(dead_at AS INTEGER),
       CAST(envelope AS BLOB)
  FROM \"switchyard_jobs_dead\"
 WHERE ?1 IS NULL OR queue = ?1
 ORDER BY dead_at, id
 LIMIT ?2";

/// Messages held under a lease that has not run out: queue ?1 and id ?2 when given, at
/// most ?3, longest held first (a range of the due index).
pub(crate) const HELD: &str = "
SELECT CAST(id AS BLOB), CAST(queue AS BLOB), CAST(kind AS BLOB), CAST(claimed_by AS BLOB),
       CAST(reserved_at AS INTEGER), CAST(visible_at AS INTEGER), started, CAST(attempts AS INTEGER)
  FROM \"switchyard_jobs\"
 WHERE ready = 0 AND visible_at > {NOW} AND token IS NOT NULL
   AND (?1 IS NULL OR queue = ?1) AND (?2 IS NULL OR id = ?2)
 ORDER BY reserved_at, seq
 LIMIT ?3";

pub(crate) const DEAD_EXISTS: &str =
    "SELECT EXISTS (SELECT 1 FROM \"switchyard_jobs_dead\" WHERE id = ?1)";

/// The selection of a replay or purge: queue ?1, id ?2, dead before ?3 (each optional).
const DEAD_SELECTION: &str =
    "(?1 IS NULL OR queue = ?1) AND (?2 IS NULL OR id = ?2) AND (?3 IS NULL OR dead_at <= ?3)";

/// The newest row's seq: where a keyed claim's parking starts, and the publish watch's
/// mark.
pub(crate) const MAX_SEQ: &str = "SELECT COALESCE(MAX(seq), 0) FROM \"switchyard_jobs\"";

/// Puts the selected dead letters back, byte for byte, ready now with attempts reset and
/// no expiry (an operator who replays wants the message handled). An id that is live
/// again is left alone: its dead copy stays where it is, never lost.
pub(crate) const REPLAY_DEAD: &str = "
INSERT INTO \"switchyard_jobs\"
    (id, queue, kind, priority, attempts, ready, available_at, visible_at, expires_at, last_error, created_at,
     envelope, labels, ordering_key)
SELECT id, queue, kind, priority, 0, 1, {NOW}, {NOW}, NULL, last_error, {NOW}, envelope, labels,
       ordering_key
  FROM \"switchyard_jobs_dead\"
 WHERE {DEAD_SELECTION} AND id NOT IN (SELECT id FROM \"switchyard_jobs\")
 ORDER BY dead_at, id";

/// Deletes the dead letters that the replay just inserted (seq never goes back, so they
/// are the rows above the old maximum).
pub(crate) const DELETE_REPLAYED: &str = "
DELETE FROM \"switchyard_jobs_dead\"
 WHERE {DEAD_SELECTION} AND id IN (SELECT id FROM \"switchyard_jobs\" WHERE seq > ?4)";

pub(crate) const PURGE_DEAD: &str = "DELETE FROM \"switchyard_jobs_dead\" WHERE {DEAD_SELECTION}";

/// Parks the keyed rows above seq ?1 (just published or replayed) that have an older
/// message of their key: they wait, out of the claim index, for the key. The head of a
/// key (nothing older) stays as published.
pub(crate) const PARK_NEW: &str = "
UPDATE \"switchyard_jobs\" AS j SET ready = 0, visible_at = {PARKED}
 WHERE j.seq > ?1 AND j.ordering_key IS NOT NULL AND j.token IS NULL
   AND EXISTS (SELECT 1 FROM \"switchyard_jobs\" e
                WHERE e.queue = j.queue AND e.ordering_key = j.ordering_key AND e.seq < j.seq)";

/// Hands each key of ?1 (a JSON array of `[queue, key]`, heads that just left) to its
/// oldest message, if that one is parked: ready when due, else due at its time.
pub(crate) const HAND_ON: &str = "
UPDATE \"switchyard_jobs\" SET ready = (available_at <= {NOW}), visible_at = available_at
 WHERE visible_at = {PARKED}
   AND seq IN (SELECT (SELECT n.seq FROM \"switchyard_jobs\" n
                        WHERE n.queue = p.value ->> 0 AND n.ordering_key = p.value ->> 1
                        ORDER BY n.seq LIMIT 1)
                 FROM json_each(?1) AS p)
RETURNING CAST(queue AS BLOB), ready";

/// Hands keys whose head left without handing them on (an expired head, a quarantined
/// one) to their oldest message: a parked message with nothing before it in its key.
pub(crate) const REPAIR_KEYS: &str = "
UPDATE \"switchyard_jobs\" SET ready = (available_at <= {NOW}), visible_at = available_at
 WHERE seq IN (SELECT p.seq FROM \"switchyard_jobs\" p
                WHERE p.ordering_key IS NOT NULL AND p.visible_at = {PARKED}
                  AND NOT EXISTS (SELECT 1 FROM \"switchyard_jobs\" e
                                   WHERE e.queue = p.queue AND e.ordering_key = p.ordering_key
                                     AND e.seq < p.seq)
                LIMIT 1000)";

/// The queues of the rows published after one seq, up to another (a primary-key range).
pub(crate) const QUEUES_BETWEEN: &str =
    "SELECT DISTINCT CAST(queue AS BLOB) FROM \"switchyard_jobs\"
 WHERE seq > ?1 AND seq <= ?2";

/// The statements specialised for one table.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) select_now: String,
    pub(crate) queues_between: String,
    pub(crate) any_due: String,
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
    pub(crate) insert_jobs_head: String,
    pub(crate) insert_jobs_tail: String,
    pub(crate) ack_batch: String,
    pub(crate) release: String,
    pub(crate) snooze: String,
    pub(crate) extend: String,
    pub(crate) abandon: String,
    pub(crate) start_batch: String,
    pub(crate) copy_leased_to_dead: String,
    pub(crate) delete_leased: String,
    pub(crate) copy_expired: String,
    pub(crate) delete_expired: String,
    pub(crate) stats_jobs: String,
    pub(crate) stats_dead: String,
    pub(crate) list_dead: String,
    pub(crate) dead_exists: String,
    pub(crate) held: String,
    pub(crate) max_seq: String,
    pub(crate) replay_dead: String,
    pub(crate) delete_replayed: String,
    pub(crate) purge_dead: String,
    pub(crate) park_new: String,
    pub(crate) hand_on: String,
    pub(crate) repair_keys: String,
}

/// Replaces the default table name with `table` (a validated identifier) and expands the
/// shared fragments.
pub(crate) fn specialise(sql: &str, table: &str) -> String {
    sql.replace("{STARTED5}", &STARTED.replace("?N", "?5"))
        .replace("{STARTED6}", &STARTED.replace("?N", "?6"))
        .replace("{RETURNING}", CLAIM_RETURNING)
        .replace("{DEAD_SELECTION}", DEAD_SELECTION)
        .replace("{NOW}", NOW)
        .replace("{PARKED}", PARKED)
        .replace("switchyard_jobs", table)
}

impl Statements {
    pub(crate) fn new(table: &str) -> Self {
        let s = |sql: &str| specialise(sql, table);
        let filtered = |sql: &str, needles: &str| {
            let filter = if needles.is_empty() { "" } else { LABEL_FILTER };
            s(sql)
                .replace("{LABELS}", filter)
                .replace("{NEEDLES}", needles)
        };
        Statements {
            select_now: s(SELECT_NOW),
            any_due: s(ANY_DUE),
            queues_between: s(QUEUES_BETWEEN),
            promote_due: s(PROMOTE_DUE),
            claim_skip_locked: filtered(CLAIM_SKIP_LOCKED, ""),
            claim_skip_locked_labels: filtered(CLAIM_SKIP_LOCKED, "?7"),
            claim_for_move: s(CLAIM_FOR_MOVE),
            insert_dead: s(INSERT_DEAD),
            claim_candidates: filtered(CLAIM_CANDIDATES, ""),
            claim_candidates_labels: filtered(CLAIM_CANDIDATES, "?3"),
            claim_optimistic: s(CLAIM_OPTIMISTIC),
            insert_jobs_head: s(INSERT_JOBS_HEAD),
            insert_jobs_tail: s(INSERT_JOBS_TAIL),
            ack_batch: s(ACK_BATCH),
            release: s(RELEASE),
            snooze: s(SNOOZE),
            extend: s(EXTEND),
            abandon: s(ABANDON),
            start_batch: s(START_BATCH),
            copy_leased_to_dead: s(COPY_LEASED_TO_DEAD),
            delete_leased: s(DELETE_LEASED),
            copy_expired: s(COPY_EXPIRED),
            delete_expired: s(DELETE_EXPIRED),
            stats_jobs: s(STATS_JOBS),
            stats_dead: s(STATS_DEAD),
            list_dead: s(LIST_DEAD),
            dead_exists: s(DEAD_EXISTS),
            held: s(HELD),
            max_seq: s(MAX_SEQ),
            replay_dead: s(REPLAY_DEAD),
            delete_replayed: s(DELETE_REPLAYED),
            purge_dead: s(PURGE_DEAD),
            park_new: s(PARK_NEW),
            hand_on: s(HAND_ON),
            repair_keys: s(REPAIR_KEYS),
        }
    }

    /// The multi-row publish of `rows` rows: [`INSERT_JOBS_HEAD`]'s 12 values a row.
    pub(crate) fn insert_jobs(&self, rows: usize) -> String {
        const ROW: &str = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
        let (head, tail) = (&self.insert_jobs_head, &self.insert_jobs_tail);
        let mut sql = String::with_capacity(head.len() + tail.len() + rows * (ROW.len() + 2));
        sql.push_str(head);
        sql.push_str("VALUES ");
        for n in 0..rows {
            if n > 0 {
                sql.push_str(", ");
            }
            sql.push_str(ROW);
        }
        sql.push_str(tail);
        sql
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publish_has_a_placeholder_for_each_value_its_head_reads() {
        let sql = Statements::new("jobs");
        let per_row = (1..)
            .take_while(|n| {
                INSERT_JOBS_HEAD.contains(&format!("v.column{n},"))
                    || INSERT_JOBS_HEAD.contains(&format!("v.column{n} "))
            })
            .count();
        assert_eq!(per_row, 12);
        for rows in [1, 2, 100] {
            let text = sql.insert_jobs(rows);
            assert_eq!(text.matches('?').count(), rows * per_row, "{rows} rows");
            assert!(text.contains(") AS v"), "{text}");
        }
    }
}
