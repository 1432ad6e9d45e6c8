//! Publishing what `move` and `relay` take from one store to another: the message
//! always arrives; a unique key goes with it only where the destination can keep it.

use switchyard::{Envelope, Result, Transport};

/// Publishes `envelopes`, forwarded by `what` (the command, for the log), to `dest`. A
/// unique key the destination cannot keep is left behind, and so is one it holds for
/// another job: a message already accepted where it came from is never dropped as a
/// duplicate on its way.
pub(super) async fn publish_forwarded(
    dest: &dyn Transport,
    mut envelopes: Vec<Envelope>,
    what: &str,
) -> Result<()> {
    let caps = dest.capabilities();
    for env in &mut envelopes {
        if env.unique.as_ref().is_some_and(|u| !caps.keeps_unique(u)) {
            env.unique = None;
        }
    }
    let published = dest.publish_batch(envelopes.clone()).await?;
    if !published.duplicates.is_empty() {
        let again: Vec<Envelope> = envelopes
            .into_iter()
            .filter(|e| published.duplicate_of(e.id).is_some())
            .map(|mut e| {
                e.unique = None;
                e
            })
            .collect();
        tracing::warn!(count = again.len(), "{what}: the destination holds these messages' unique keys for other jobs; they go on without their keys");
        dest.publish_batch(again).await?;
    }
    Ok(())
}
