//! The SQL claim: pacing the promotion of due rows, the skip-locked or optimistic claim,
//! decoding, and quarantine of malformed rows, for every SQL backend.

use std::time::Duration;

use super::backend::SqlBackend;
use super::claimed::{ClaimBy, ClaimedRow, StartMode};
use crate::config::ClaimStrategy;
use crate::names::QueueName;
use crate::reservation::{LeaseToken, Receipt, Reservation};
use crate::transport::Claim;
use crate::{reason, Result};

/// How many rounds one reserve spends skipping malformed rows before it returns.
const QUARANTINE_ROUNDS: usize = 16;

/// Claims up to `claim.max` messages under a lease of `lease`: claims rows, decodes
/// them, quarantines the malformed ones (and claims again in their place, a bounded
/// number of times), and returns the reservations in delivery order.
pub(super) async fn reserve_rows<B: SqlBackend + ?Sized>(
    claims: &B,
    queue: &QueueName,
    claim: Claim<'_>,
    lease: Duration,
) -> Result<Vec<Reservation>> {
    let (max, start) = (claim.max, StartMode::of(&claim));
    let by = ClaimBy::of(&claim)?;
    if start == StartMode::Move && !by.needles.is_empty() {
        return Err(crate::Error::InvalidInput(
            "a claim for a move takes every message of the queue: it cannot select labels".into(),
        ));
    }
    let mut out = Vec::with_capacity(max.min(1024));
    for _ in 0..QUARANTINE_ROUNDS {
        if out.len() >= max {
            break;
        }
        let token = LeaseToken::generate();
        let mut rows = match claim_rows(claims, queue, max - out.len(), token, start, &by).await {
            Ok(rows) => rows,
            // What was claimed in an earlier round is returned, never left leased.
            Err(err) if !out.is_empty() => {
                tracing::warn!(error = %err, "a later claim round failed; returning what was claimed");
                break;
            }
            Err(err) => return Err(err),
        };
        if rows.is_empty() {
            break;
        }
        rows.sort_by_key(|r| (std::cmp::Reverse(r.priority), r.available_at, r.seq));
        let mut quarantined = 0;
        for row in rows {
            match row.decode() {
                Ok(envelope) => {
                    let receipt =
                        Receipt::new(envelope.id, token, u64::try_from(row.seq).unwrap_or(0));
                    out.push(Reservation::new(envelope, receipt, lease, row.started));
                }
                Err(why) => {
                    tracing::warn!(queue = %queue, message_id = %row.id, error = %why, "malformed message quarantined");
                    // If the move fails the row stays leased and is quarantined again
                    // when its lease runs out; the good rows are still returned.
                    match claims
                        .move_to_dead(row.seq, token, reason::MALFORMED, Some(&why), None)
                        .await
                    {
                        Ok(_) => quarantined += 1,
                        Err(err) => {
                            tracing::warn!(error = %err, "quarantine failed; retrying after the lease")
                        }
                    }
                }
            }
        }
        if quarantined == 0 {
            break;
        }
    }
    Ok(out)
}

/// Claims up to `max` rows. Promotion runs before the claim unless it ran in the last
/// few milliseconds or the last claim came back empty (every empty claim promotes, before
/// or after it); after the claim only when that comes back empty. So a busy drain does not
/// pay for it on every batch, an idle queue still sees due rows at once, and a claim woken
/// by a publish takes the message that woke it without a round trip first: rows that fell
/// due while the queue was idle are promoted by the next claim (a worker with room makes
/// it at once), and may come after that message.
async fn claim_rows<B: SqlBackend + ?Sized>(
    claims: &B,
    queue: &QueueName,
    max: usize,
    token: LeaseToken,
    start: StartMode,
    by: &ClaimBy<'_>,
) -> Result<Vec<ClaimedRow>> {
    let pacer = &claims.engine().pacer;
    let after_idle = pacer.take_idle();
    let promoted_first = !pacer.recent() && !after_idle;
    if promoted_first {
        promote(claims).await?;
    }
    let mut rows = claim_ready(claims, queue, max, token, start, by).await?;
    if rows.is_empty() && !promoted_first {
        rows = match promote(claims).await? {
            0 => Vec::new(),
            _ => claim_ready(claims, queue, max, token, start, by).await?,
        };
    }
    pacer.set_idle(rows.is_empty());
    Ok(rows)
}

/// Promotes due rows, noting the time first so that concurrent claims skip it.
async fn promote<B: SqlBackend + ?Sized>(claims: &B) -> Result<u64> {
    claims.engine().pacer.mark();
    claims.promote_due().await
}

/// Claims up to `max` ready rows of `queue`: a move's claim and a skip-locked claim are
/// one statement (or transaction) of the backend's; an optimistic claim runs rounds of
/// candidates and compare-and-set (see `optimistic`).
async fn claim_ready<B: SqlBackend + ?Sized>(
    claims: &B,
    queue: &QueueName,
    max: usize,
    token: LeaseToken,
    start: StartMode,
    by: &ClaimBy<'_>,
) -> Result<Vec<ClaimedRow>> {
    match (start, claims.claim_strategy()) {
        (StartMode::Move, _) | (_, ClaimStrategy::SkipLocked) => {
            claims.claim_locked(queue, max, token, start, by).await
        }
        // Optimistic claims are the portable fallback; the type is matched exhaustively
        // in queue-core, so a new strategy lands here until handled.
        _ => super::optimistic::claim_optimistic(claims, queue, max, token, start, by).await,
    }
}
