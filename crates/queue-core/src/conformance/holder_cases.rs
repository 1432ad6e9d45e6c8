//! Cases of holders: every claim records who holds the message and until when.

use std::sync::Arc;
use std::time::Duration;

use super::case_support::{applies, fresh_queue, message, with_lease};
use super::harness::Harness;
use crate::{Claim, Error, HeldSelection, Result};

/// A claim records its holder; the holdings list it with its lease's end, by queue and
/// by id, until the ack; a lease that ran out is no longer held.
pub async fn claims_record_their_holder_and_lease_end(h: Arc<dyn Harness>) -> Result<()> {
    let store = h.store().await?;
    let t = store.open(with_lease(Duration::from_secs(2))).await?;
    let q = fresh_queue();
    if !applies(t.as_ref(), "holders", t.capabilities().holders) {
        let refused = t.held(HeldSelection::Queue(Some(&q)), 10).await;
        assert!(
            matches!(refused, Err(Error::NotSupported(_))),
            "{refused:?}"
        );
        return Ok(());
    }
    t.publish_batch(vec![message(&q, "one"), message(&q, "two")])
        .await?;
    let before = chrono::Utc::now() - chrono::TimeDelta::seconds(5);
    let held = t
        .claim(&q, Claim::reserve(1).by("box-7:4242/invoices"))
        .await?;
    let other = t.claim(&q, Claim::prefetch(1)).await?;
    assert_eq!((held.len(), other.len()), (1, 1));
    let list = t.held(HeldSelection::Queue(Some(&q)), 10).await?;
    assert_eq!(list.len(), 2, "{list:?}");
    // Which message each claim took is the backend's order (a router's is not FIFO).
    let (mine_id, theirs_id) = (held[0].id().to_string(), other[0].id().to_string());
    let mine = list
        .iter()
        .find(|h| h.id == mine_id)
        .expect("the first claim");
    assert_eq!(mine.holder.as_deref(), Some("box-7:4242/invoices"));
    assert_eq!(mine.queue.as_str(), q.as_str());
    assert_eq!(mine.kind, held[0].envelope.kind);
    assert!(mine.started, "a plain reserve starts what it claims");
    let lease = mine.lease_until - mine.claimed_at.expect("a claim time");
    assert!(
        (1_500..=2_500).contains(&lease.num_milliseconds()),
        "the lease's end is not the claim plus the lease: {lease:?}"
    );
    assert!(mine.claimed_at.is_some_and(|t| t > before));
    let theirs = list
        .iter()
        .find(|h| h.id == theirs_id)
        .expect("the prefetch");
    assert!(!theirs.started);
    let by_default = theirs.holder.as_deref().unwrap_or_default();
    assert!(
        by_default.ends_with(&format!(":{}", std::process::id())),
        "a claim's default holder is host:pid, got {by_default:?}"
    );
    let by_id = t.held(HeldSelection::Id(&mine_id), 10).await?;
    assert_eq!(by_id.len(), 1);
    t.ack_batch(&held).await?;
    let after_ack = t.held(HeldSelection::Queue(Some(&q)), 10).await?;
    assert_eq!(
        after_ack.len(),
        1,
        "an acked message is still held: {after_ack:?}"
    );
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    let lapsed = t.held(HeldSelection::Queue(Some(&q)), 10).await?;
    assert!(
        lapsed.is_empty(),
        "a lapsed lease is still held: {lapsed:?}"
    );
    Ok(())
}
