//! A partition consumer's key gate: at most one message of each ordering key out at a
//! time, the rest held back in delivery order.
//!
//! A partition queue has a single active consumer, so its messages reach one process in
//! queue order; the gate keeps that order per key within the process, where a worker
//! handles many messages at once. A message of a key whose head is out (with a handler,
//! or waiting to be retried) is parked, unacknowledged, until the head is settled. A
//! retried head is not published again (that would put it behind its key's later
//! messages) but kept, and handed out again when due. Everything parked or waiting is
//! an unacknowledged delivery of the consumer's channel: should the process die, the
//! broker returns them all to the partition in the order they were delivered, and the
//! next consumer starts from the key's head.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

use queue_core::Reservation;

use crate::error::lock;

/// The keys out and the messages held back, of one partition consumer.
#[derive(Default)]
pub(crate) struct KeyGate {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Keys whose head is out: with a handler, or waiting for its retry.
    busy: HashSet<String>,
    /// Per key, the messages that arrived behind its head, in delivery order.
    parked: HashMap<String, VecDeque<Reservation>>,
    /// Heads that failed, to hand out again when due.
    retries: Vec<(Instant, Reservation)>,
}

fn key(r: &Reservation) -> String {
    r.envelope.ordering_key.clone().unwrap_or_default()
}

impl KeyGate {
    /// Hands `r` out unless its key's head is out or others of its key wait before it;
    /// parks it otherwise.
    pub(crate) fn offer(&self, r: Reservation) -> Option<Reservation> {
        let k = key(&r);
        let mut g = lock(&self.inner);
        if g.busy.contains(&k) || g.parked.get(&k).is_some_and(|q| !q.is_empty()) {
            g.parked.entry(k).or_default().push_back(r);
            return None;
        }
        g.busy.insert(k);
        Some(r)
    }

    /// Up to `max` messages that may go out now: heads whose retry is due, then the
    /// oldest parked message of each free key, oldest deliveries first.
    pub(crate) fn ready(&self, max: usize) -> Vec<Reservation> {
        let mut g = lock(&self.inner);
        let now = Instant::now();
        let mut out = Vec::new();
        let mut i = 0;
        while i < g.retries.len() && out.len() < max {
            if g.retries[i].0 <= now {
                out.push(g.retries.swap_remove(i).1);
            } else {
                i += 1;
            }
        }
        let mut free: Vec<(u64, String)> = g
            .parked
            .iter()
            .filter(|(k, q)| !q.is_empty() && !g.busy.contains(*k))
            .filter_map(|(k, q)| q.front().map(|r| (r.receipt.tag(), k.clone())))
            .collect();
        free.sort_unstable();
        for (_, k) in free {
            if out.len() >= max {
                break;
            }
            let next = g.parked.get_mut(&k).and_then(VecDeque::pop_front);
            if let Some(r) = next {
                if g.parked.get(&k).is_some_and(VecDeque::is_empty) {
                    g.parked.remove(&k);
                }
                g.busy.insert(k);
                out.push(r);
            }
        }
        out
    }

    /// `key`'s head is settled (acknowledged or dead-lettered): its next may go out.
    pub(crate) fn release(&self, key: &str) {
        lock(&self.inner).busy.remove(key);
    }

    /// The head `r` failed and goes out again at `due`, keeping its key.
    pub(crate) fn retry(&self, r: Reservation, due: Instant) {
        lock(&self.inner).retries.push((due, r));
    }

    /// The head `r` was given back before it started: it goes out first again.
    pub(crate) fn put_back(&self, r: Reservation) {
        let k = key(&r);
        let mut g = lock(&self.inner);
        g.busy.remove(&k);
        g.parked.entry(k).or_default().push_front(r);
    }

    /// Messages parked behind their key's head, and heads waiting for their retry.
    pub(crate) fn counts(&self) -> (u64, u64) {
        let g = lock(&self.inner);
        (
            g.parked.values().map(|q| q.len() as u64).sum(),
            g.retries.len() as u64,
        )
    }
}
