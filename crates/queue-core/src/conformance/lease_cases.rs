//! Cases of leases: expiry and reclaim, start marks, fencing, extension.

use std::sync::Arc;
use std::time::Duration;

use super::case_support::{
    applies, fresh_queue, message, open, reserve_within, stats_of, with_lease,
};
use super::harness::Harness;
use crate::{reason, Claim, Error, Result, TransportExt};

/// A lease that runs out makes the message reservable again, and that counts an attempt.
pub async fn expired_lease_is_reclaimed_and_counts_an_attempt(h: Arc<dyn Harness>) -> Result<()> {
    let store = h.store().await?;
    let t = store.open(with_lease(Duration::from_secs(1))).await?;
    if !applies(t.as_ref(), "lease_expiry", t.capabilities().lease_expiry) {
        return Ok(());
    }
    let q = fresh_queue();
    t.publish(message(&q, "crashy")).await?;
    let first = t.reserve(&q).await?.expect("a message");
    assert!(
        t.reserve(&q).await?.is_none(),
        "claimed twice while the lease held"
    );
    let second = reserve_within(t.as_ref(), &q, Duration::from_secs(10))
        .await?
        .expect("reclaimed after the lease ran out");
    assert_eq!(second.id(), first.id());
    assert_ne!(second.token(), first.token());
    assert_eq!(
        second.envelope.attempts, 1,
        "a reclaim counts as an attempt"
    );
    t.ack(&second).await
}

/// A fast worker's claim marks started only messages without attempts: after a lapsed
/// lease the fresh one is charged an attempt and the one that already had one (a
/// possible poison, to be started alone) is not; a plain prefetch charges neither.
pub async fn claims_start_only_fresh_messages_and_prefetches_none(
    h: Arc<dyn Harness>,
) -> Result<()> {
    let store = h.store().await?;
    let t = store.open(with_lease(Duration::from_secs(1))).await?;
    if !applies(t.as_ref(), "exact_claims", t.capabilities().exact_claims) {
        return Ok(());
    }
    let q = fresh_queue();
    let one = message(&q, "one");
    let two = message(&q, "two");
    t.publish_batch(vec![one.clone(), two.clone()]).await?;
    // The suspect is whichever comes first (the first published, where order is exact):
    // its first delivery lapses, and it comes back with one attempt.
    let first = t.reserve(&q).await?.expect("the suspect");
    let (suspect, fresh) = if first.id() == one.id {
        (one, two)
    } else {
        (two, one)
    };
    if t.capabilities().exact_fifo {
        assert_eq!(first.id(), suspect.id);
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await;

    let mut claimed = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while claimed.len() < 2 && tokio::time::Instant::now() < deadline {
        claimed.extend(t.claim(&q, Claim::prefetch_starting_fresh(10)).await?);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let started = |id| claimed.iter().find(|r| r.id() == id).map(|r| r.started);
    assert_eq!(
        started(suspect.id),
        Some(false),
        "the suspect was started by its claim"
    );
    assert!(
        started(fresh.id).is_some(),
        "the fresh message was not claimed"
    );
    // Whether fresh messages start at their claim is the backend's choice; what it
    // reports must be what it charges.
    let starts_at_claim = started(fresh.id) == Some(true);
    // Both leases lapse: only what was started is charged.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let mut attempts = std::collections::HashMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while attempts.len() < 2 && tokio::time::Instant::now() < deadline {
        for r in t.prefetch_batch(&q, 10).await? {
            attempts.insert(r.id(), r.envelope.attempts);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        attempts.get(&suspect.id),
        Some(&1),
        "the suspect was charged again: {attempts:?}"
    );
    let expected_fresh = u32::from(starts_at_claim);
    assert_eq!(
        attempts.get(&fresh.id),
        Some(&expected_fresh),
        "{attempts:?}"
    );
    // A plain prefetch charges nothing.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let again = reserve_within(t.as_ref(), &q, Duration::from_secs(10))
        .await?
        .expect("reclaimed");
    let expected = if again.id() == suspect.id {
        1
    } else {
        expected_fresh
    };
    assert_eq!(again.envelope.attempts, expected, "a prefetch was charged");
    Ok(())
}

/// After a lease was lost and the message re-reserved, the old token can neither ack,
/// release, dead-letter nor extend, and nothing changes.
pub async fn stale_token_is_fenced_with_lease_lost(h: Arc<dyn Harness>) -> Result<()> {
    let store = h.store().await?;
    let t = store.open(with_lease(Duration::from_secs(1))).await?;
    if !applies(t.as_ref(), "lease_expiry", t.capabilities().lease_expiry) {
        return Ok(());
    }
    let q = fresh_queue();
    t.publish(message(&q, "fenced")).await?;
    let stale = t.reserve(&q).await?.expect("a message");
    let fresh = reserve_within(t.as_ref(), &q, Duration::from_secs(10))
        .await?
        .expect("reclaimed");
    t.extend(&fresh, Duration::from_secs(60)).await?;

    let lost = |r: Result<()>| matches!(r, Err(Error::LeaseLost { .. }));
    assert!(lost(t.ack(&stale).await), "stale ack");
    assert!(
        lost(t.release(&stale, Duration::ZERO, Some("stale")).await),
        "stale release"
    );
    assert!(
        lost(t.extend(&stale, Duration::from_secs(60)).await),
        "stale extend"
    );
    assert!(lost(t.snooze(&stale, Duration::ZERO).await), "stale snooze");
    assert!(
        lost(t.dead_letter(&stale, reason::FAILED, None).await),
        "stale dead_letter"
    );
    let report = t.ack_batch(std::slice::from_ref(&stale)).await?;
    assert_eq!(report.lost, vec![stale.id()]);

    let s = stats_of(t.as_ref(), &q).await?;
    assert_eq!(
        (s.ready, s.delayed, s.reserved, s.dead),
        (0, 0, 1, 0),
        "{s:?}"
    );
    assert!(
        t.reserve(&q).await?.is_none(),
        "a stale call freed the message"
    );
    t.ack(&fresh).await?;
    assert!(t.reserve(&q).await?.is_none());
    Ok(())
}

/// Extending the lease keeps a long job reserved past the visibility timeout.
pub async fn extend_keeps_a_long_job_leased(h: Arc<dyn Harness>) -> Result<()> {
    let lease = Duration::from_secs(2);
    let store = h.store().await?;
    let t = store.open(with_lease(lease)).await?;
    if !t.capabilities().lease_extension {
        return Ok(());
    }
    let other = store.open(with_lease(lease)).await?;
    let q = fresh_queue();
    t.publish(message(&q, "long")).await?;
    let r = t.reserve(&q).await?.expect("a message");
    // Three seconds in all, past the two-second lease, renewed every half second.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        t.extend(&r, lease).await?;
        assert!(
            other.reserve(&q).await?.is_none(),
            "claimed while the lease was extended"
        );
    }
    t.ack(&r).await?;
    assert!(matches!(
        t.extend(&r, lease).await,
        Err(Error::LeaseLost { .. })
    ));
    Ok(())
}

/// A lease that lapsed but was extended before anyone reclaimed the message is held
/// again: no rival can reserve it afterwards.
pub async fn extending_a_lapsed_lease_before_a_reclaim_holds_it_again(
    h: Arc<dyn Harness>,
) -> Result<()> {
    let store = h.store().await?;
    let t = store.open(with_lease(Duration::from_secs(1))).await?;
    let caps = t.capabilities();
    if !applies(t.as_ref(), "lease_expiry", caps.lease_expiry)
        || !applies(t.as_ref(), "lease_extension", caps.lease_extension)
    {
        return Ok(());
    }
    let q = fresh_queue();
    t.publish(message(&q, "slow")).await?;
    let r = t.reserve(&q).await?.expect("a message");
    tokio::time::sleep(Duration::from_millis(1300)).await;
    // Any reserve, even on another queue, may move lapsed leases back into play.
    assert!(t.reserve(&fresh_queue()).await?.is_none());
    t.extend(&r, Duration::from_secs(30)).await?;
    assert!(
        t.reserve(&q).await?.is_none(),
        "a rival reserved a message whose lease was renewed"
    );
    t.ack(&r).await
}

/// A snooze gives a message back for a while without counting an attempt (a retry
/// counts one): it comes back after the delay with its attempts and last error as
/// they were.
pub async fn a_snooze_comes_back_later_without_counting_an_attempt(
    h: Arc<dyn Harness>,
) -> Result<()> {
    let (_store, t) = open(&h).await?;
    let q = fresh_queue();
    t.publish(message(&q, "waits")).await?;
    let r = t.reserve(&q).await?.expect("a message");
    t.release(&r, Duration::ZERO, Some("first failure")).await?;
    let r = reserve_within(t.as_ref(), &q, Duration::from_secs(5))
        .await?
        .expect("the retry");
    assert_eq!(r.envelope.attempts, 1);
    let snoozed = std::time::Instant::now();
    t.snooze(&r, Duration::from_millis(600)).await?;
    if t.capabilities().exact_delays {
        assert!(
            t.reserve(&q).await?.is_none(),
            "a snoozed message came back at once"
        );
    }
    let back = reserve_within(t.as_ref(), &q, Duration::from_secs(10))
        .await?
        .expect("back after the snooze");
    let waited = snoozed.elapsed();
    assert!(
        waited >= Duration::from_millis(550),
        "back after {waited:?}"
    );
    assert_eq!(back.id(), r.id());
    assert_eq!(back.envelope.attempts, 1, "a snooze counted an attempt");
    assert_eq!(back.envelope.last_error.as_deref(), Some("first failure"));
    t.ack(&back).await?;
    if !t.capabilities().exact_delays {
        return Ok(());
    }
    // A message that expires while snoozed is dead-lettered with its attempts as they
    // were: neither the snooze nor the earlier start is counted again.
    let brief = crate::Envelope::builder(q.as_str(), "brief")
        .expires_in(Duration::from_millis(800))
        .build()?;
    t.publish(brief.clone()).await?;
    let r = t.reserve(&q).await?.expect("the brief message");
    t.snooze(&r, Duration::from_secs(5)).await?;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let dead = loop {
        // A claim sweeps expired messages (at most once a second).
        let _ = t.reserve(&q).await?;
        let dead = t.dead_list(Some(&q), 10).await?;
        if !dead.is_empty() || std::time::Instant::now() > deadline {
            break dead;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(dead.len(), 1, "the snoozed message never expired");
    assert_eq!(dead[0].reason, reason::EXPIRED);
    assert_eq!(
        dead[0].attempts, 0,
        "an expired snoozed message was charged"
    );
    Ok(())
}
