//! Wake-ups for idle workers: `LISTEN` on the transport's channel, and in-process
//! signals for publishes made by this very transport. A hint only; polling stays the
//! truth, so a dropped listener costs latency, never a message.

use std::sync::Arc;
use std::time::Duration;

use queue_core::sql::Wakers;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio_util::sync::CancellationToken;

/// The `NOTIFY` channel of a store: `schema.table`, or a stable hash of it when that is
/// longer than PostgreSQL's 63-byte identifiers. Every process computes the same name.
pub(crate) fn channel(schema: Option<&str>, table: &str) -> String {
    let name = match schema {
        Some(s) => format!("{s}.{table}"),
        None => table.to_owned(),
    };
    if name.len() <= 63 {
        return name;
    }
    // FNV-1a: stable across builds, unlike std's hasher.
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("switchyard_{hash:016x}")
}

/// Listens on `channel` until `stop` fires, waking the queue each notification names.
/// Reconnects by itself with backoff; after every (re)connect it wakes every queue,
/// since notifications sent while it was away are lost.
pub(crate) async fn listen(
    connect: PgConnectOptions,
    channel: String,
    wakers: Arc<Wakers>,
    stop: CancellationToken,
) {
    let on_notify = move |payload: Option<&str>| match payload {
        Some(queue) => wakers.wake(queue),
        None => wakers.wake_all(),
    };
    listen_with(connect, channel, on_notify, stop).await;
}

/// Listens on `channel` until `stop` fires, handing each notification's payload to
/// `on_notify`, and `None` whenever notifications may have been missed (after every
/// (re)connect). Reconnects by itself with backoff.
pub(crate) async fn listen_with(
    connect: PgConnectOptions,
    channel: String,
    on_notify: impl Fn(Option<&str>) + Send + 'static,
    stop: CancellationToken,
) {
    const BACKOFF_MIN: Duration = Duration::from_millis(100);
    const BACKOFF_MAX: Duration = Duration::from_secs(5);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(connect);
    let mut backoff = BACKOFF_MIN;
    loop {
        let mut connected = false;
        let session = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(&channel).await?;
            connected = true;
            tracing::debug!(channel, "listening");
            on_notify(None);
            loop {
                match listener.try_recv().await? {
                    Some(n) => on_notify(Some(n.payload())),
                    // The connection dropped; the next try_recv reconnects and listens
                    // again. Whatever was sent in between is lost: look now.
                    None => {
                        tracing::debug!(channel, "listen connection lost; reconnecting");
                        on_notify(None);
                    }
                }
            }
            #[allow(unreachable_code)]
            Ok::<(), sqlx::Error>(())
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            outcome = session => {
                if let Err(err) = outcome {
                    tracing::warn!(channel, error = %err, retry_in = ?backoff, "LISTEN failed; idle workers poll until it is back");
                }
            }
        }
        on_notify(None);
        if connected {
            backoff = BACKOFF_MIN;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_names_fit_postgres_identifiers() {
        assert_eq!(channel(None, "jobs"), "jobs");
        assert_eq!(channel(Some("tenant"), "jobs"), "tenant.jobs");
        let long = channel(Some(&"s".repeat(40)), &"t".repeat(40));
        assert!(
            long.len() <= 63 && long.starts_with("switchyard_"),
            "{long}"
        );
        assert_eq!(long, channel(Some(&"s".repeat(40)), &"t".repeat(40)));
    }
}
