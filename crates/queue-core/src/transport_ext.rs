//! Conveniences over [`Transport`], for every transport: backends never implement them.

use std::time::Duration;

use async_trait::async_trait;

use crate::envelope::Envelope;
use crate::error::{Error, Result};
use crate::names::QueueName;
use crate::published::Published;
use crate::reservation::Reservation;
use crate::transport::{Claim, GiveBack, Transport};

/// The calls most code makes, each in terms of [`Transport`]'s own.
#[async_trait]
pub trait TransportExt: Transport {
    /// Stores one message; the outcome says when its unique key was held by another
    /// job.
    async fn publish(&self, envelope: Envelope) -> Result<Published> {
        self.publish_batch(vec![envelope]).await
    }

    /// Reserves the next due message of `queue`, started, or `None` at once when there
    /// is none.
    async fn reserve(&self, queue: &QueueName) -> Result<Option<Reservation>> {
        Ok(self.reserve_batch(queue, 1).await?.into_iter().next())
    }

    /// Reserves up to `max` due messages of `queue`, each started.
    async fn reserve_batch(&self, queue: &QueueName, max: usize) -> Result<Vec<Reservation>> {
        self.claim(queue, Claim::reserve(max)).await
    }

    /// Claims up to `max` due messages ahead of use, none started.
    async fn prefetch_batch(&self, queue: &QueueName, max: usize) -> Result<Vec<Reservation>> {
        self.claim(queue, Claim::prefetch(max)).await
    }

    /// Claims up to `max` messages of `queue` for a move, due or not.
    async fn claim_for_move(&self, queue: &QueueName, max: usize) -> Result<Vec<Reservation>> {
        self.claim(queue, Claim::for_move(max)).await
    }

    /// Removes a processed message; [`Error::LeaseLost`] and nothing changed when the
    /// lease was lost.
    async fn ack(&self, reservation: &Reservation) -> Result<()> {
        let report = self.ack_batch(std::slice::from_ref(reservation)).await?;
        if report.lost.is_empty() {
            Ok(())
        } else {
            Err(Error::LeaseLost {
                message_id: reservation.id(),
            })
        }
    }

    /// Gives a message back for a retry after `delay`, with `error` as its last error.
    async fn release(
        &self,
        reservation: &Reservation,
        delay: Duration,
        error: Option<&str>,
    ) -> Result<()> {
        self.give_back(reservation, GiveBack::Retry { delay, error })
            .await
    }

    /// Gives a message back for `delay` without counting an attempt (a snooze, a rate
    /// limit).
    async fn snooze(&self, reservation: &Reservation, delay: Duration) -> Result<()> {
        self.give_back(reservation, GiveBack::Snooze { delay })
            .await
    }

    /// Gives back a message that no handler started.
    async fn abandon(&self, reservation: &Reservation) -> Result<()> {
        self.give_back(reservation, GiveBack::Unstarted).await
    }
}

impl<T: Transport + ?Sized> TransportExt for T {}
