//! Connections a SQL transport keeps out of its pool for the hot path.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Connections a transport keeps out of its pool between hot-path statements (claims,
/// acks, publishes). sqlx's pool pings every connection it gets back: one more round
/// trip and two wake-ups per statement, which cost a busy drain about a third of its
/// throughput. A connection whose statement failed must not be kept: it goes back to the
/// pool, whose ping finds out whether it is broken. A connection kept unused for a while
/// goes back too, so that the pool's idle and lifetime limits still apply to it.
#[derive(Debug)]
pub struct KeptConnections<C> {
    kept: Mutex<Kept<C>>,
    most: usize,
}

#[derive(Debug)]
struct Kept<C> {
    conns: Vec<(C, Instant)>,
    closed: bool,
}

/// How long a kept connection may sit unused before it goes back to the pool.
const KEPT_IDLE: Duration = Duration::from_secs(5);

impl<C> KeptConnections<C> {
    /// Keeps at most a third of a pool of `pool_size` connections, and never more than
    /// [`KEPT_CONNECTIONS`]: the rest of the pool stays free for everything else
    /// (heartbeats, releases, stats, the caller's own transactions).
    pub fn for_pool(pool_size: u32) -> Self {
        let third = usize::try_from(pool_size / 3).unwrap_or(KEPT_CONNECTIONS);
        KeptConnections {
            kept: Mutex::new(Kept {
                conns: Vec::new(),
                closed: false,
            }),
            most: third.min(KEPT_CONNECTIONS),
        }
    }

    /// A kept connection, if there is one that was used recently.
    pub fn take(&self) -> Option<C> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        // Stale ones are dropped (back to the pool) after the lock is released.
        let stale = kept
            .conns
            .iter()
            .position(|(_, at)| at.elapsed() < KEPT_IDLE)
            .unwrap_or(kept.conns.len());
        let stale: Vec<(C, Instant)> = kept.conns.drain(..stale).collect();
        let conn = kept.conns.pop().map(|(c, _)| c);
        drop(kept);
        drop(stale);
        conn
    }

    /// A kept connection, or else one from `acquire` (the pool's, awaited only then).
    pub async fn take_or<E>(
        &self,
        acquire: impl std::future::Future<Output = std::result::Result<C, E>>,
    ) -> std::result::Result<C, E> {
        match self.take() {
            Some(conn) => Ok(conn),
            None => acquire.await,
        }
    }

    /// Keeps a connection whose statement succeeded; beyond the limit, or once the
    /// transport is closing, it is dropped (back to the pool).
    pub fn keep(&self, conn: C) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if !kept.closed && kept.conns.len() < self.most {
            kept.conns.push((conn, Instant::now()));
        }
    }

    /// Gives every kept connection back and keeps none from now on: the pool waits for
    /// every connection it lent out before it closes.
    pub fn close(&self) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        kept.closed = true;
        let conns = std::mem::take(&mut kept.conns);
        drop(kept);
        drop(conns);
    }
}

/// The most connections a SQL transport keeps for its hot path: enough for a worker's
/// two overlapping claims and its ack flush.
pub const KEPT_CONNECTIONS: usize = 3;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_connections_leave_most_of_a_small_pool_free_and_none_after_close() {
        assert_eq!(KeptConnections::<u8>::for_pool(1).most, 0);
        assert_eq!(KeptConnections::<u8>::for_pool(4).most, 1);
        assert_eq!(KeptConnections::<u8>::for_pool(10).most, KEPT_CONNECTIONS);
        assert_eq!(KeptConnections::<u8>::for_pool(100).most, KEPT_CONNECTIONS);

        let kept = KeptConnections::for_pool(10);
        for c in 1..=5_u8 {
            kept.keep(c);
        }
        // The newest first; beyond the limit, nothing is kept.
        assert_eq!(kept.take(), Some(3));
        kept.keep(9);
        kept.close();
        assert_eq!(kept.take(), None);
        kept.keep(7);
        assert_eq!(kept.take(), None, "nothing is kept once closing");
    }
}
