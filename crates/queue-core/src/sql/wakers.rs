//! Wake-up signals for idle workers, by queue.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The idle workers' wake-up signals of one transport, by queue: a publish of this
/// process wakes them at once (other processes' by the backend's watch: PostgreSQL's
/// `NOTIFY`, MySQL's and SQLite's publish watch; else by polling).
#[derive(Debug, Default)]
pub struct Wakers {
    by_queue: Mutex<HashMap<String, Arc<Notify>>>,
    /// Queues whose last claim found nothing: their workers may be waiting for a signal.
    idle: Mutex<HashSet<String>>,
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

    /// Notes what a claim on `queue` found: a claim that found nothing leaves its worker
    /// waiting for a signal, one that found work leaves it busy.
    pub fn claimed(&self, queue: &str, found: bool) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if found {
            idle.remove(queue);
        } else if !idle.contains(queue) {
            idle.insert(queue.to_owned());
        }
    }

    /// Whether a worker may be waiting for a signal: a watch of other processes'
    /// publishes has nothing to do while every claim finds work.
    pub fn any_idle(&self) -> bool {
        !self
            .idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// Wakes every queue's workers.
    pub fn wake_all(&self) {
        let map = self.by_queue.lock().unwrap_or_else(|e| e.into_inner());
        map.values().for_each(|n| n.notify_waiters());
    }
}
