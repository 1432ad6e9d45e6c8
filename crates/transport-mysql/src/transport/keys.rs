//! Ordering keys on MySQL and MariaDB: the keys' rows as locks, parking what a key's head
//! holds up, and handing the key on when the head leaves.
//!
//! Only a key's oldest live message is ever claimable; the rest wait parked. Sessions
//! run at READ COMMITTED, where InnoDB takes no gap locks, so "no message of this key
//! yet" cannot be locked by reading: publishers and hand-overs of a key upsert the key's
//! row in `…_keys` first, and each statement after that sees every commit made before.

use std::collections::HashSet;

use super::*;
use crate::sql::key_terms;

/// A key of a queue: (queue, key).
pub(super) type Key = (String, String);

/// The keys of `rows`, sorted and without duplicates (the order the locks are taken in).
pub(super) fn keys_of<'a>(rows: impl Iterator<Item = &'a Envelope>) -> Vec<Key> {
    let mut keys: Vec<Key> = rows
        .filter_map(|e| Some((e.queue.as_str().to_owned(), e.ordering_key.clone()?)))
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

impl MySqlTransport {
    /// Locks `keys` (sorted) for the rest of the transaction on `conn`.
    pub(super) async fn lock_keys(
        &self,
        conn: &mut MySqlConnection,
        keys: &[Key],
    ) -> std::result::Result<(), sqlx::Error> {
        for chunk in keys.chunks(MAX_LIST) {
            let sql = self
                .sql
                .lock_keys
                .replace("{ROWS}", &vec!["(?, ?)"; chunk.len()].join(", "));
            let mut q = sqlx::query(&sql);
            for (queue, key) in chunk {
                q = q.bind(queue).bind(key);
            }
            q.execute(&mut *conn).await?;
        }
        Ok(())
    }

    /// Stores `rows`, some with ordering keys, on the transaction `conn`: under the keys'
    /// locks, a message whose key has a live message stored (or one earlier in the batch)
    /// is parked until the key is handed to it. A message that stores nothing (its id is
    /// stored, live or dead) holds no key, and which did cannot be told from the insert
    /// (`CLIENT_FOUND_ROWS` counts a row found like a row inserted): so a key that had no
    /// live message and has several in the batch is handed on once they are stored, to
    /// the oldest of them, unless that one already holds it.
    pub(super) async fn insert_keyed(
        &self,
        conn: &mut MySqlConnection,
        rows: &[Encoded],
    ) -> std::result::Result<(), sqlx::Error> {
        let keys = keys_of(rows.iter().map(|r| &r.env));
        self.lock_keys(conn, &keys).await?;
        let mut taken: HashSet<Key> = HashSet::new();
        for chunk in keys.chunks(MAX_LIST / 2) {
            let sql = key_terms(&self.sql.keys_in_use, chunk.len());
            let mut q = sqlx::query_as::<_, (Vec<u8>, Vec<u8>)>(&sql);
            for (queue, key) in chunk {
                q = q.bind(queue).bind(key);
            }
            for (queue, key) in q.fetch_all(&mut *conn).await? {
                taken.insert((lossy(queue), lossy(key)));
            }
        }
        let in_use = taken.clone();
        let mut followed: Vec<Key> = Vec::new();
        let parked: Vec<bool> = rows
            .iter()
            .map(|r| {
                let key = (r.env.queue.as_str().to_owned(), r.env.ordering_key.clone()?);
                if taken.insert(key.clone()) {
                    return Some(false);
                }
                if !in_use.contains(&key) {
                    followed.push(key);
                }
                Some(true)
            })
            .map(|parked| parked.unwrap_or(false))
            .collect();
        for (chunk, parked) in rows.chunks(PUBLISH_CHUNK).zip(parked.chunks(PUBLISH_CHUNK)) {
            self.insert_rows(conn, chunk, Some(parked)).await?;
        }
        if !followed.is_empty() {
            followed.sort();
            followed.dedup();
            self.hand_on(conn, &followed).await?;
        }
        Ok(())
    }

    /// Hands each of `keys`, whose heads just left, to its oldest live message if that
    /// one is parked, and then forgets the claim cursors of their queues (the caller
    /// wakes their workers once it has committed).
    pub(super) async fn hand_on(
        &self,
        conn: &mut MySqlConnection,
        keys: &[Key],
    ) -> std::result::Result<(), sqlx::Error> {
        let mut next: Vec<i64> = Vec::new();
        for chunk in keys.chunks(MAX_LIST / 2) {
            let sql = key_terms(&self.sql.next_of_keys, chunk.len());
            let mut q = sqlx::query_scalar::<_, i64>(&sql);
            for (queue, key) in chunk {
                q = q.bind(queue).bind(key);
            }
            next.extend(q.fetch_all(&mut *conn).await?);
        }
        // A row handed the key may sit behind its queue's claim cursor.
        if self.unpark(conn, &next).await? > 0 {
            for (queue, _) in keys {
                self.cursors.forget(queue);
            }
        }
        Ok(())
    }

    /// Wakes this process's workers of the queues of `keys`, handed on by a committed
    /// transaction.
    pub(super) fn wake_keys(&self, keys: &[Key]) {
        self.engine
            .wakers
            .wake_each(keys.iter().map(|(queue, _)| queue.as_str()));
    }

    /// Makes the parked rows among `seqs` claimable (or due at their time).
    async fn unpark(
        &self,
        conn: &mut MySqlConnection,
        seqs: &[i64],
    ) -> std::result::Result<u64, sqlx::Error> {
        let mut handed = 0;
        for chunk in seqs.chunks(MAX_LIST) {
            let sql = with_list(&self.sql.hand_on, chunk.len());
            let mut q = sqlx::query(&sql);
            for s in padded(chunk) {
                q = q.bind(s);
            }
            handed += q.execute(&mut *conn).await?.rows_affected();
        }
        Ok(handed)
    }

    /// Hands keys whose head left without handing them on to their next message, and
    /// forgets the key rows of keys without messages.
    pub(super) async fn repair(&self) -> Result<u64> {
        self.retrying("key repair", || async {
            let mut tx = self.pool.begin().await?;
            let heads: Vec<i64> = sqlx::query_scalar(&self.sql.orphaned_heads)
                .fetch_all(&mut *tx)
                .await?;
            let handed = self.unpark(&mut tx, &heads).await?;
            sqlx::query(&self.sql.prune_keys).execute(&mut *tx).await?;
            tx.commit().await?;
            if handed > 0 {
                self.cursors.clear();
                self.engine.wakers.wake_all();
            }
            Ok(handed)
        })
        .await
    }
}
