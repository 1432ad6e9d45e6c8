//! The optimistic claim, the portable one: candidates read without locks, then a
//! compare-and-set that takes those still claimable.
//!
//! Claims that race each other read the same candidates. Were each to set the oldest
//! ones, all but the first would wait on its row locks and then find those rows taken:
//! a wasted round trip each. So a claim takes the slice of the candidates after those
//! of this transport's claims already in flight (a worker runs two at once under a
//! backlog), which together are the oldest; and while claims of other processes take
//! rows from under it (a loss in the last second), a slice at random among the first
//! few of a wider window. Priority and FIFO order then hold to within those few
//! batches. Where the backend can, a round reads and compare-and-sets in one statement;
//! elsewhere one read serves several compare-and-sets, until it runs out or a
//! compare-and-set finds every row of its slice taken.

use super::backend::SqlBackend;
use super::claimed::{ClaimBy, ClaimedRow, OptimisticSlice, StartMode};
use crate::names::QueueName;
use crate::reservation::LeaseToken;
use crate::{Error, Result};

/// How many compare-and-sets (or one-statement rounds) one optimistic claim runs at
/// most.
const TAKES: usize = 6;

/// How many candidate reads one optimistic claim runs at most.
const READS: usize = 3;

/// Slices a contended claim chooses among, at random.
const SPREAD: usize = 8;

/// Claims up to `max` rows of `queue` optimistically, in rounds of one statement where
/// the backend has them, else of a read and compare-and-sets. Each round commits on its
/// own, so rows of earlier rounds are returned even when a later round fails.
pub(super) async fn claim_optimistic<B: SqlBackend + ?Sized>(
    claims: &B,
    queue: &QueueName,
    max: usize,
    token: LeaseToken,
    start: StartMode,
    by: &ClaimBy<'_>,
) -> Result<Vec<ClaimedRow>> {
    let tally = &claims.engine().claims;
    let in_flight = tally.enter();
    let mut claimed = Vec::new();
    for round in 0..TAKES {
        let want = max.saturating_sub(claimed.len());
        let contended = tally.lost_lately();
        let slice = OptimisticSlice {
            window: window(want, contended, in_flight.rank),
            want,
            slot: slot(contended, in_flight.rank),
        };
        let (seen, rows) = match claims
            .optimistic_round(queue, slice, token, start, by)
            .await
        {
            Ok(Some(done)) => done,
            Ok(None) if round == 0 => {
                return read_and_take(claims, queue, max, token, start, by, in_flight.rank).await
            }
            Ok(None) => break,
            Err(err) => return after_failure(err, claimed),
        };
        tally.round(slice.len(seen), rows.len());
        claimed.extend(rows);
        // Done when full, or when the slice was the whole window: every claimable row
        // was tried, and what was lost is another claim's.
        if claimed.len() >= max || seen <= want {
            break;
        }
    }
    Ok(claimed)
}

/// What a claim whose round failed returns: the error when it has claimed nothing yet;
/// else the rows of its earlier rounds, which are committed and must not be dropped.
fn after_failure(err: Error, claimed: Vec<ClaimedRow>) -> Result<Vec<ClaimedRow>> {
    if claimed.is_empty() {
        return Err(err);
    }
    tracing::warn!(error = %err, "a later claim round failed; returning what was claimed");
    Ok(claimed)
}

/// How many candidates a claim reads: its own slice and those of the claims of this
/// transport ahead of it, or a wide window while other processes take rows from under
/// it.
fn window(want: usize, contended: bool, rank: usize) -> usize {
    let slices = if contended { SPREAD } else { rank + 2 };
    want.saturating_mul(slices).clamp(64, 4096)
}

/// Which slice of its candidates a claim takes (see the module's docs).
fn slot(contended: bool, rank: usize) -> usize {
    if contended {
        fastrand::usize(0..SPREAD)
    } else {
        rank
    }
}

/// The optimistic claim of a backend without one-statement rounds: one read of
/// candidates serves several compare-and-sets, until it runs out or a compare-and-set
/// finds every row of its slice taken.
async fn read_and_take<B: SqlBackend + ?Sized>(
    claims: &B,
    queue: &QueueName,
    max: usize,
    token: LeaseToken,
    start: StartMode,
    by: &ClaimBy<'_>,
    rank: usize,
) -> Result<Vec<ClaimedRow>> {
    let tally = &claims.engine().claims;
    let mut claimed = Vec::new();
    let mut pool: Vec<i64> = Vec::new();
    // Whether the last read saw every claimable row (fewer than its window).
    let mut seen_all = false;
    let mut reads = 0;
    for _ in 0..TAKES {
        let want = max.saturating_sub(claimed.len());
        let contended = tally.lost_lately();
        if pool.is_empty() {
            if seen_all || reads == READS {
                break;
            }
            let window = window(want, contended, rank);
            reads += 1;
            pool = match claims.optimistic_candidates(queue, window, by).await {
                Ok(pool) => pool,
                Err(err) => return after_failure(err, claimed),
            };
            seen_all = pool.len() < window;
            if pool.is_empty() {
                break;
            }
        }
        let slice = pick(&mut pool, want, slot(contended, rank));
        match claims
            .optimistic_take(queue, &slice, token, start, by)
            .await
        {
            Ok(rows) => {
                tally.round(slice.len(), rows.len());
                if rows.is_empty() {
                    // Every row of the slice was taken: the rest of the read is stale too.
                    pool.clear();
                    seen_all = false;
                }
                claimed.extend(rows);
            }
            Err(err) => return after_failure(err, claimed),
        }
        if claimed.len() >= max {
            break;
        }
    }
    Ok(claimed)
}

/// Takes up to `want` candidates out of `pool` (in delivery order): the `slot`th run of
/// `want`, or the last whole one when the pool is shorter.
fn pick(pool: &mut Vec<i64>, want: usize, slot: usize) -> Vec<i64> {
    let slice = OptimisticSlice {
        window: pool.len(),
        want,
        slot,
    };
    let from = slice.first(pool.len());
    pool.drain(from..from + slice.len(pool.len())).collect()
}

#[cfg(test)]
mod tests {
    use super::pick;

    #[test]
    fn the_first_slot_is_the_oldest() {
        let mut pool: Vec<i64> = (1..=10).collect();
        assert_eq!(pick(&mut pool, 3, 0), vec![1, 2, 3]);
        assert_eq!(pool, vec![4, 5, 6, 7, 8, 9, 10]);
    }

    #[test]
    fn a_later_slot_takes_the_run_after_the_earlier_ones() {
        let mut pool: Vec<i64> = (1..=10).collect();
        assert_eq!(pick(&mut pool, 3, 1), vec![4, 5, 6]);
        assert_eq!(pool, vec![1, 2, 3, 7, 8, 9, 10]);
    }

    #[test]
    fn a_slot_past_the_pool_takes_its_last_whole_run() {
        let mut pool: Vec<i64> = (1..=10).collect();
        assert_eq!(pick(&mut pool, 3, 7), vec![7, 8, 9]);
        assert_eq!(pool, vec![1, 2, 3, 4, 5, 6, 10]);
    }

    #[test]
    fn a_short_pool_is_taken_whole() {
        let mut pool: Vec<i64> = vec![7, 8];
        assert_eq!(pick(&mut pool, 5, 3), vec![7, 8]);
        assert!(pool.is_empty());
    }
}
