//! Wake-up signals for idle workers, by queue.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The idle workers' wake-up signals of one transport, by queue: a publish of this
/// process wakes them at once (other processes' by the backend's watch: PostgreSQL's
/// `NOTIFY`, MySQL's and SQLite's publish watch; else by polling).
#[derive(Debug, Default)]
pub struct Wakers {
    by_queue: Mutex<HashMap<String, Arc<Notify>>>,
}

impl Wakers {
    /// The signal of `queue`.
    pub fn get(&self, queue: &str) -> Arc<Notify> {
        let mut map = self.by_queue.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(queue.to_owned()).or_default().clone()
    }

    /// Wakes the workers of `queue`.
    pub fn wake(&self, queue: &str) {
        let map = self.by_queue.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get(queue) {
            n.notify_waiters();
        }
    }

    /// Wakes the workers of these queues (consecutive repeats are skipped).
    pub fn wake_each<'a>(&self, queues: impl IntoIterator<Item = &'a str>) {
        let map = self.by_queue.lock().unwrap_or_else(|e| e.into_inner());
        if map.is_empty() {
            return;
        }
        let mut last = None;
        for q in queues {
            if last != Some(q) {
                if let Some(n) = map.get(q) {
                    n.notify_waiters();
                }
                last = Some(q);
            }
        }
    }

    /// Wakes every queue's workers.
    pub fn wake_all(&self) {
        let map = self.by_queue.lock().unwrap_or_else(|e| e.into_inner());
        map.values().for_each(|n| n.notify_waiters());
    }
}
