//! Shutdown on SIGTERM and SIGINT, shared by the long-running commands.

use switchyard::{CancellationToken, Result};

/// The first SIGTERM or SIGINT starts a graceful shutdown; a second one cuts the grace
/// period short.
pub(crate) fn spawn_signal_handler(
    shutdown: CancellationToken,
    abort: CancellationToken,
) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let io = |e| switchyard::Error::io("cannot listen for signals", e);
    let mut term = signal(SignalKind::terminate()).map_err(io)?;
    let mut int = signal(SignalKind::interrupt()).map_err(io)?;
    tokio::spawn(async move {
        for token in [shutdown, abort] {
            tokio::select! {
                _ = term.recv() => tracing::warn!("SIGTERM: stopping"),
                _ = int.recv() => tracing::warn!("SIGINT: stopping"),
            }
            token.cancel();
        }
    });
    Ok(())
}
