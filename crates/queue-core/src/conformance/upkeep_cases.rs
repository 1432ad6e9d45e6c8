//! The transport's upkeep and the worker that calls for it: expired messages still end
//! dead-lettered while the worker's claims leave the upkeep to it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::case_support::applies;
use super::harness::Harness;
use super::worker_support::{fast, fresh_queue, open};
use crate::worker::{handler_fn, JobContext, Worker};
use crate::{reason, Envelope, Error, QueueName, Result, Transport, TransportExt};

/// A store and its transport, which keeps upkeep; a queue to claim from; another queue,
/// and a message for it that expires 300 ms after it is built.
type Expiring = (
    Box<dyn super::harness::Store>,
    Arc<dyn Transport>,
    QueueName,
    QueueName,
    Envelope,
);

/// See [`Expiring`]; `None` (saying why) where the transport keeps no upkeep.
async fn expiring_elsewhere(h: &Arc<dyn Harness>) -> Result<Option<Expiring>> {
    let (store, t) = open(h, Duration::from_secs(30)).await?;
    if !applies(t.as_ref(), "upkeep", t.capabilities().upkeep) {
        return Ok(None);
    }
    let (q, elsewhere) = (fresh_queue(), fresh_queue());
    let soon = Envelope::builder(elsewhere.as_str(), "soon")
        .expires_in(Duration::from_millis(300))
        .build()?;
    Ok(Some((store, t, q, elsewhere, soon)))
}

/// While a worker runs, what expires is moved to the dead-letter store, in any queue,
/// though the worker's claims leave that to its upkeep.
pub async fn a_workers_upkeep_dead_letters_what_expires(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, t, q, elsewhere, soon)) = expiring_elsewhere(&h).await? else {
        return Ok(());
    };
    t.publish(soon.clone()).await?;
    let stop = CancellationToken::new();
    let worker = Worker::new(t.clone(), q, fast().with_drain(false))
        .handle("job", handler_fn(|_ctx: JobContext| async { Ok(()) }));
    let running = tokio::spawn(worker.run(stop.clone()));
    let deadline = Instant::now() + Duration::from_secs(10);
    let dead = loop {
        let dead = t.dead_list(Some(&elsewhere), 10).await?;
        if !dead.is_empty() || Instant::now() > deadline {
            break dead;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    stop.cancel();
    running
        .await
        .map_err(|e| Error::InvalidInput(format!("the worker panicked: {e}")))??;
    assert_eq!(dead.len(), 1, "the expired message was not dead-lettered");
    assert_eq!(dead[0].id, soon.id.to_string());
    assert_eq!(dead[0].reason, reason::EXPIRED);
    Ok(())
}

/// Once a worker calls for the upkeep, claims leave it to the workers, so that none waits
/// for it; a few seconds after the calls stop, claims do it again.
pub async fn claims_leave_the_upkeep_to_a_worker_calling_for_it(h: Arc<dyn Harness>) -> Result<()> {
    let Some((_store, t, q, elsewhere, soon)) = expiring_elsewhere(&h).await? else {
        return Ok(());
    };
    // The call first, so that it cannot sweep the message itself.
    t.maintain().await?;
    let called = Instant::now();
    t.publish(soon).await?;
    // Past the expiry and the sweep's one-second pace: only the hand-over keeps this
    // claim from sweeping.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(t.reserve(&q).await?.is_none());
    assert!(
        t.dead_list(Some(&elsewhere), 10).await?.is_empty(),
        "a claim swept although a worker had taken the upkeep over"
    );
    // Past the hand-over (5 s after the call), claims sweep again.
    tokio::time::sleep(
        (called + Duration::from_millis(5500)).saturating_duration_since(Instant::now()),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let _ = t.reserve(&q).await?;
        let dead = t.dead_list(Some(&elsewhere), 10).await?;
        if let Some(d) = dead.first() {
            assert_eq!(d.reason, reason::EXPIRED);
            return Ok(());
        }
        assert!(
            Instant::now() < deadline,
            "claims did not take the upkeep back once the calls stopped"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
