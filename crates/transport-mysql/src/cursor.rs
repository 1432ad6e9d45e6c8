//! Where a skip-locked claim may start instead of the head of its queue's claim order.
//!
//! InnoDB leaves an index entry that a claim moved in place, delete-marked, until purge
//! removes it, and under a steady drain purge runs thousands of entries behind. They sit
//! at the head of the queue's claim order, and a claim from the head steps over every
//! one of them: in a drain at concurrency 8 that was about a third of the server's time.
//! While a queue has a backlog (the last claim came back full), the next claim starts
//! where that one ended, among the rows of the same priority. Rows that became ready
//! before that position (due messages promoted, higher priorities published, claims of
//! other processes rolled back) are taken by a claim from the head: at the latest
//! [`CURSOR_TTL`] after the cursor was first set, after a claim that was not full, and at
//! once after this transport promoted due rows, replayed dead letters or published a
//! higher priority.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long claims may start from a cursor before one starts from the head again.
pub(crate) const CURSOR_TTL: Duration = Duration::from_millis(100);

/// A position in the claim order `(prio_rank, visible_at, seq)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClaimCursor {
    pub(crate) prio_rank: i32,
    pub(crate) visible_at: i64,
    pub(crate) seq: i64,
    set_at: Instant,
}

/// One cursor per queue with a backlog.
#[derive(Debug, Default)]
pub(crate) struct ClaimCursors(Mutex<HashMap<String, ClaimCursor>>);

impl ClaimCursors {
    /// The queue's cursor, unless it is older than [`CURSOR_TTL`].
    pub(crate) fn get(&self, queue: &str) -> Option<ClaimCursor> {
        self.get_at(queue, Instant::now())
    }

    fn get_at(&self, queue: &str, now: Instant) -> Option<ClaimCursor> {
        let cursors = self.0.lock().ok()?;
        cursors.get(queue).copied().filter(|c| c.fresh(now))
    }

    /// After a committed claim of `locked` rows `(seq, prio_rank, visible_at)` in claim
    /// order, out of `max` asked for: a full claim leaves the cursor at its last row
    /// (keeping the time the cursor was first set, so that the head is read again within
    /// the TTL however long the backlog lasts); a short one forgets the queue's cursor.
    pub(crate) fn after_claim(&self, queue: &str, locked: &[(i64, i32, i64)], max: usize) {
        self.after_claim_at(queue, locked, max, Instant::now());
    }

    fn after_claim_at(&self, queue: &str, locked: &[(i64, i32, i64)], max: usize, now: Instant) {
        let Ok(mut cursors) = self.0.lock() else {
            return;
        };
        match locked.last() {
            Some(&(seq, prio_rank, visible_at)) if locked.len() >= max => {
                let set_at = cursors
                    .get(queue)
                    .filter(|c| c.fresh(now))
                    .map_or(now, |c| c.set_at);
                cursors.insert(
                    queue.to_owned(),
                    ClaimCursor {
                        prio_rank,
                        visible_at,
                        seq,
                        set_at,
                    },
                );
            }
            _ => {
                cursors.remove(queue);
            }
        }
    }

    /// Forgets the queue's cursor when a message of a higher priority (a lower
    /// `prio_rank`) was published: it lies before the cursor.
    pub(crate) fn forget_outranked(&self, queue: &str, prio_rank: i32) {
        if let Ok(mut cursors) = self.0.lock() {
            if cursors.get(queue).is_some_and(|c| prio_rank < c.prio_rank) {
                cursors.remove(queue);
            }
        }
    }

    /// Forgets the queue's cursor: a message handed its ordering key may lie before it.
    pub(crate) fn forget(&self, queue: &str) {
        if let Ok(mut cursors) = self.0.lock() {
            cursors.remove(queue);
        }
    }

    /// Forgets every cursor: promoted rows keep their due times, which may lie before.
    pub(crate) fn clear(&self) {
        if let Ok(mut cursors) = self.0.lock() {
            cursors.clear();
        }
    }
}

impl ClaimCursor {
    fn fresh(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.set_at) < CURSOR_TTL
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_claim_sets_the_cursor_at_its_last_row() {
        let c = ClaimCursors::default();
        c.after_claim("q", &[(1, 0, 10), (2, 0, 11)], 2);
        let at = c.get("q").expect("a cursor");
        assert_eq!((at.prio_rank, at.visible_at, at.seq), (0, 11, 2));
        assert!(c.get("other").is_none());
    }

    #[test]
    fn a_short_or_empty_claim_forgets_the_cursor() {
        let c = ClaimCursors::default();
        c.after_claim("q", &[(1, 0, 10)], 1);
        c.after_claim("q", &[(2, 0, 11)], 5);
        assert!(c.get("q").is_none());
        c.after_claim("q", &[(1, 0, 10)], 1);
        c.after_claim("q", &[], 5);
        assert!(c.get("q").is_none());
    }

    #[test]
    fn a_promotion_forgets_every_cursor() {
        let c = ClaimCursors::default();
        c.after_claim("a", &[(1, 0, 10)], 1);
        c.after_claim("b", &[(2, 0, 10)], 1);
        c.clear();
        assert!(c.get("a").is_none() && c.get("b").is_none());
    }

    #[test]
    fn a_higher_priority_published_forgets_the_cursor() {
        let c = ClaimCursors::default();
        c.after_claim("q", &[(1, 0, 10)], 1);
        c.forget_outranked("q", 0);
        c.forget_outranked("q", 3);
        assert!(
            c.get("q").is_some(),
            "the same or a lower priority lies after it"
        );
        c.forget_outranked("q", -1);
        assert!(c.get("q").is_none());
    }

    #[test]
    fn the_head_is_read_again_within_the_ttl_of_the_first_cursor() {
        let c = ClaimCursors::default();
        let t0 = Instant::now();
        c.after_claim_at("q", &[(1, 0, 10)], 1, t0);
        // A later full claim moves the cursor but keeps its age.
        let half = t0 + CURSOR_TTL / 2;
        c.after_claim_at("q", &[(2, 0, 11)], 1, half);
        assert_eq!(c.get_at("q", half).map(|at| at.seq), Some(2));
        let expired = t0 + CURSOR_TTL;
        assert!(
            c.get_at("q", expired).is_none(),
            "expired with the first cursor's age"
        );
        // After it expired, a full claim starts a new cursor.
        c.after_claim_at("q", &[(3, 0, 12)], 1, expired);
        assert_eq!(c.get_at("q", expired).map(|at| at.seq), Some(3));
        assert_eq!(
            c.get_at("q", expired + CURSOR_TTL / 2).map(|at| at.seq),
            Some(3)
        );
    }
}
